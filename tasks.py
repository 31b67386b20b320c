#!/usr/bin/env python3
"""Set up a virtual environment and run trioha's main jobs; needs nothing but Python 3.11+.

    python3 tasks.py demo     # install trioha, run a local master and slave replicating a workload
    python3 tasks.py test     # install trioha with its dev and spark extras, run ruff, mypy, pytest

The environment lives in ``.venv`` and is reinstalled whenever ``pyproject.toml`` changes, so
the two commands work the same on a fresh checkout and on one used for months.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def _run(*args: str | os.PathLike[str]) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    result = subprocess.run([str(a) for a in args], cwd=ROOT, check=False)
    if result.returncode != 0:
        sys.exit(result.returncode)


def _ensure_env(extras: str) -> None:
    """Create ``.venv`` and install trioha (editable) with *extras*, unless already done."""
    if sys.version_info < (3, 11):  # noqa: UP036 - runs under whatever python3 the user has
        sys.exit(f"trioha needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = VENV / f".installed-{extras or 'base'}-{digest}"
    if stamp.exists():
        return
    if not PY.exists():
        print(f"creating virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    target = f".[{extras}]" if extras else "."
    _run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    _run(PY, "-m", "pip", "install", "--quiet", "-e", target)
    stamp.touch()


def demo(argv: list[str]) -> None:
    _ensure_env("")
    _run(PY, "-m", "trioha", "demo", *argv)


def test(argv: list[str]) -> None:
    _ensure_env("dev,spark")
    _run(BIN / "ruff", "check", ".")
    _run(BIN / "mypy")
    extra = ["--hypothesis-profile=ci"] if os.environ.get("CI") else []
    _run(PY, "-m", "pytest", *extra, *argv)


def main() -> None:
    jobs = {"demo": demo, "test": test}
    if len(sys.argv) < 2 or sys.argv[1] not in jobs:
        sys.exit(f"usage: python3 tasks.py {{{'|'.join(jobs)}}} [args...]")
    jobs[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
