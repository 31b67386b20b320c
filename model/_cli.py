"""``python -m model``: check a named configuration and print what it found."""

from __future__ import annotations

import argparse
import sys

import attrs

from model._configs import CONFIGS
from model._failover_configs import FAILOVER_CONFIGS
from model._failover_values import FailoverConfig
from model._report import check, render_result
from model._values import Config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model",
        description="Explicit-state model checking of trioha's HA replication and automatic "
        "failover, over the production transition code (trioha.proto, trioha.failover).",
    )
    parser.add_argument("--config", default="smoke", help="configuration to check (--list)")
    parser.add_argument("--list", action="store_true", help="list the configurations and exit")
    parser.add_argument("--dfs", action="store_true", help="depth-first (traces not shortest)")
    parser.add_argument("--max-states", type=int, default=None, help="stop after this many")
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="after a violation, go on and report the first violation of every property",
    )
    parser.add_argument("--no-symmetry", action="store_true", help="do not sort connections")
    args = parser.parse_args(argv)

    every: dict[str, Config | FailoverConfig] = {**CONFIGS, **FAILOVER_CONFIGS}
    if args.list:
        for name, cfg in every.items():
            tag = f"must fail on {cfg.expect}" if cfg.expect else "must pass"
            print(f"{name:<26} {tag}\n    {cfg.doc}")
        return 0
    if args.config not in every:
        parser.error(f"unknown configuration {args.config!r}; choose from {', '.join(every)}")
    config = every[args.config]
    if args.no_symmetry and isinstance(config, Config):
        config = attrs.evolve(config, symmetry=False)
    result = check(
        config,
        strategy="dfs" if args.dfs else "bfs",
        max_states=args.max_states,
        stop_at_first=not args.keep_going,
    )
    print(render_result(config, result))
    # Non-zero whenever a property broke or the run was cut short, known-bad configurations
    # included (their last line says whether the failure was the expected one).
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
