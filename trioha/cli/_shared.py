"""What every command of ``python -m trioha`` shares: argument types, ``-c``/``--set``,
``--metrics-listen`` and running Trio so that an error reaches the one-line report whole."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import trio

from trioha._config import parse_address
from trioha._errors import ConfigError

T = TypeVar("T")


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, not the whole usage."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (binary)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1073741824 or 64M)") from None


def address(text: str) -> str:
    """``HOST:PORT``, checked here and kept as text."""
    try:
        parse_address(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"not key=value: {text!r} (a key of the -c file, e.g. --set "
            "serverChannelMaxIdleTimeSeconds=120)"
        )
    return key.strip(), value.strip()


def add_config_options(p: argparse.ArgumentParser, file: str, example: str) -> None:
    """``-c FILE`` and ``--set KEY=VALUE``, as a broker and a name server take them."""
    p.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar=file,
        help=f"a RocketMQ {file} (camelCase keys); flags override it",
    )
    p.add_argument(
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"set any {file} key (camelCase, e.g. --set {example}); repeatable; applied "
        "after -c, the flags above win",
    )


def metrics_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` for ``--metrics-listen``; a bare port listens on 127.0.0.1 only."""
    if ":" not in text:
        text = f"127.0.0.1:{text}"
    try:
        return parse_address(text, what="--metrics-listen")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_metrics_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-listen",
        type=metrics_address,
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default; "
        "127.0.0.1 when no host; needs the metrics extra)",
    )


def require_prometheus_client(args: argparse.Namespace) -> None:
    """Fail before starting anything when ``--metrics-listen`` cannot be honoured."""
    if getattr(args, "metrics_listen", None) is None:
        return
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--metrics-listen needs prometheus-client: pip install 'trioha[metrics]'"
        ) from None


def run(main: Callable[[], Awaitable[T]]) -> T:
    """``trio.run``, with a lone error out of nurseries raised as itself.

    Trio wraps errors leaving a nursery in exception groups; the ``trioha`` command prints a
    TriohaError as one line, so a group holding just one is unwrapped.
    """
    try:
        return trio.run(main)
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
