#!/usr/bin/env python3
"""Set up a virtual environment and run trioha's main jobs; needs nothing but Python 3.11+.

    python3 tasks.py demo     # install trioha, run a local master and slave replicating a workload
    python3 tasks.py test     # install trioha with its dev and spark extras (and, as root,
                              # Debian's etcd-server for the failover tests), run ruff (lint
                              # and format check), mypy, and pytest under coverage (the
                              # figures are printed at the end); then the core and store
                              # tests on Python 3.12 and 3.13 too, where those are found
    python3 tasks.py mutate [proto|net|store]  # mutation testing (mutmut), a package at a time
    python3 tasks.py test --compiled|--pure    # the same on the compiled build (made first with
                                               # build-fast) or on the pure-Python modules
    python3 tasks.py build-fast [--clean]      # compile the hot modules with mypyc (needs a C
                                               # compiler and Python's headers; --clean: back to
                                               # pure Python)
    python3 tasks.py nemesis --runs N [--seconds S] [--seed K]  # failover under faults
                              # (etcd, three broker processes, kills and pauses; a summary
                              # line and a table per fault; docs/failover.md, "Nemesis runs")

The environment lives in ``.venv`` and is reinstalled whenever ``pyproject.toml`` changes, so
the two commands work the same on a fresh checkout and on one used for months.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
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
    _say_build(dict(os.environ))
    _run(PY, "-m", "trioha", "demo", *argv)


#: Debian's package of the etcd server; the failover tests start members of their own with it.
ETCD_PACKAGE = "etcd-server"
ETCD_HINT = (
    "etcd not found: install Debian's etcd-server (apt-get install etcd-server) or put an "
    "etcd 3.4+ binary on PATH; the tests that need it are skipped"
)


def _has_etcd() -> bool:
    named = os.environ.get("TRIOHA_ETCD")
    if named:
        return os.access(named, os.X_OK)
    return shutil.which("etcd") is not None or os.access("/usr/bin/etcd", os.X_OK)


def _ensure_etcd() -> None:
    """Install Debian's etcd-server when etcd is missing and this runs as root with apt;
    otherwise say in one line what to install (the tests needing etcd then skip).

    The tests never use a system etcd: they start their own members on free ports. On a
    machine with an init system the package also starts etcd as a service on 127.0.0.1:2379,
    which nothing here touches (docs/etcd.md).
    """
    if _has_etcd():
        return
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if not root or shutil.which("apt-get") is None:
        print(ETCD_HINT, flush=True)
        return
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", ETCD_PACKAGE]
    print(f"+ {' '.join(install)}  (etcd for the failover tests)", flush=True)
    if _apt_get(install) != 0:
        # A fresh machine has no package lists yet: fetch them once, then try again.
        _apt_get(["apt-get", "update", "-qq"])
        _apt_get(install)
    if not _has_etcd():
        print(ETCD_HINT, flush=True)


def _apt_get(command: list[str]) -> int:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=False).returncode


def nemesis(argv: list[str]) -> None:
    _ensure_env("")
    _ensure_etcd()
    if not _has_etcd():
        sys.exit(ETCD_HINT.partition("; ")[0])
    _run(PY, "-m", "bench.nemesis", *argv)


def test(argv: list[str]) -> None:
    _ensure_env("dev,spark")
    _ensure_etcd()
    env = dict(os.environ)
    if argv[:1] == ["--compiled"]:
        argv = argv[1:]
        why = _build_fast()
        if why is not None:
            sys.exit(f"test --compiled: {why}")
        env.pop(PURE_ENV, None)
    elif argv[:1] == ["--pure"]:
        argv = argv[1:]
        env[PURE_ENV] = "1"
    _say_build(env)
    _run(BIN / "ruff", "check", ".")
    _run(BIN / "ruff", "format", "--check", ".")
    _run(BIN / "mypy")
    extra = ["--hypothesis-profile=ci"] if os.environ.get("CI") else []
    data = ROOT / "build" / "coverage"
    data.mkdir(parents=True, exist_ok=True)
    env["COVERAGE_FILE"] = str(data / ".coverage")
    command = [PY, "-m", "coverage", "run", "-m", "pytest", *extra, *argv]
    print("+", " ".join(str(a) for a in command), flush=True)
    tests = subprocess.run([str(a) for a in command], cwd=ROOT, env=env, check=False)
    _report_coverage(data, env)
    portable = 0 if argv else test_other_pythons()
    if tests.returncode != 0:
        sys.exit(tests.returncode)
    if portable != 0:
        sys.exit(portable)


#: The interpreters besides this one that the classifiers promise, and CI checks: the
#: sans-IO core, the store and the configuration run their tests on each.
OTHER_PYTHONS = ("3.12", "3.13")
#: Those tests: pure code (no Spark, no servers in subprocesses), about a minute each.
PORTABLE_TESTS = ("tests/proto", "tests/store", "tests/test_config.py", "tests/test_status.py")
#: What they need of the dev extra (its version bounds are taken from pyproject.toml).
PORTABLE_TEST_DEPS = ("pytest", "pytest-trio", "pytest-timeout", "hypothesis")


def find_python(version: str, home: Path | None = None) -> Path | None:
    """An interpreter of *version* that runs: ``python3.12`` on PATH, else the newest pyenv
    build of that version; None when there is none (a pyenv shim of a version not selected
    fails to run, and is passed over)."""
    builds = ((home or Path.home()) / ".pyenv" / "versions").glob(
        f"{version}.*/bin/python{version}"
    )
    ranked = sorted(builds, key=lambda p: [int(x) for x in re.findall(r"\d+", p.parts[-3])])
    on_path = shutil.which(f"python{version}")
    candidates = [Path(on_path)] if on_path else []
    for candidate in [*candidates, *reversed(ranked)]:
        probe = subprocess.run(
            [str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def portable_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The dev extra's entries for :data:`PORTABLE_TEST_DEPS`, bounds and all."""
    dev = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    return [
        spec
        for spec in dev["dev"]
        if re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0] in PORTABLE_TEST_DEPS
    ]


def test_other_pythons() -> int:
    """Run :data:`PORTABLE_TESTS` on each of :data:`OTHER_PYTHONS` found; the worst exit code.

    Each gets ``.venv-<version>`` with trioha (editable) and the test dependencies, remade
    when ``pyproject.toml`` changes. A version not installed is said in one line and skipped.
    """
    worst = 0
    for version in OTHER_PYTHONS:
        python = find_python(version)
        if python is None:
            print(f"Python {version} not found (python{version}, pyenv): its tests are skipped")
            continue
        started = time.monotonic()
        env_python = _ensure_other_env(version, python)
        command = [str(env_python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        print(f"+ (Python {version}) pytest {' '.join(PORTABLE_TESTS)}", flush=True)
        result = subprocess.run([*command, *PORTABLE_TESTS], cwd=ROOT, check=False)
        took = time.monotonic() - started
        print(f"Python {version}: exit {result.returncode} in {took:.0f} s", flush=True)
        worst = worst or result.returncode
    return worst


def _ensure_other_env(version: str, python: Path) -> Path:
    root = ROOT / f".venv-{version}"
    env_python = root / "bin" / "python"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = root / f".installed-portable-{digest}"
    if stamp.exists():
        return env_python
    if not env_python.exists():
        _run(python, "-m", "venv", root)
    _run(env_python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    _run(env_python, "-m", "pip", "install", "--quiet", "-e", ".", *portable_requirements())
    stamp.touch()
    return env_python


#: Packages whose coverage ``test`` prints on a line of their own: the sans-IO core, its Trio
#: driver and the store, where a branch no test reaches is a behaviour nobody has checked.
COVERAGE_PACKAGES = ("trioha/proto", "trioha/net", "trioha/store")


def _report_coverage(data: Path, env: dict[str, str]) -> None:
    """Print the line + branch coverage of the pytest process: in total and per package.

    Only the pytest process is measured; the ``python -m trioha`` subprocesses some tests
    start are not (the modules they run are measured through the in-process tests). The full
    per-file table is in ``build/coverage/report.txt``.
    """
    summary = data / "coverage.json"
    table = subprocess.run(
        [str(PY), "-m", "coverage", "report", "--skip-covered", "--show-missing"],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    (data / "report.txt").write_text(table.stdout + table.stderr, encoding="utf-8")
    written = subprocess.run(
        [str(PY), "-m", "coverage", "json", "--quiet", "-o", str(summary)],
        cwd=ROOT,
        env=env,
        check=False,
    )
    if written.returncode != 0 or not summary.exists():
        print("coverage: no data (did pytest start?)", flush=True)
        return
    files = json.loads(summary.read_text(encoding="utf-8"))["files"]
    print(f"\ncoverage (lines + branches; per-file table in {data.relative_to(ROOT)}/report.txt)")
    for package in (*COVERAGE_PACKAGES, ""):
        parts = [
            entry["summary"]
            for name, entry in files.items()
            if Path(name).as_posix().startswith(package)
        ]
        covered = sum(p["covered_lines"] + p.get("covered_branches", 0) for p in parts)
        total = sum(p["num_statements"] + p.get("num_branches", 0) for p in parts)
        label = package or "total"
        percent = 100 * covered / total if total else 100.0
        print(
            f"  {label:<14} {percent:5.1f}%  ({total - covered} of {total} lines+branches missed)"
        )


#: The packages ``mutate`` mutates, each judged by its own tests (mutmut then runs, for each
#: mutant, only the tests that reach the mutated function). docs/testing.md explains the output.
MUTATE = {
    "proto": ["tests/proto"],
    "net": ["tests/net"],
    "store": ["tests/store"],
}
#: Survivors examined and found equivalent (or only changing a message): ``name  reason``.
EQUIVALENT = ROOT / "docs" / "mutation-survivors.txt"


def mutate(argv: list[str]) -> None:
    """Mutation-test the packages in *argv* (default: all), one at a time, niced.

    A target is a package (``net``) or one of its files (``trioha/net/_waiters.py``), which
    is judged by the same tests as its package.
    """
    unknown = [a for a in argv if _package_of(a) not in MUTATE]
    if unknown:
        sys.exit(
            f"unknown target(s) {', '.join(unknown)}; choose from {', '.join(MUTATE)} "
            "or a .py file in one of them"
        )
    _ensure_env("dev")
    totals = [0, 0]
    for target in argv or list(MUTATE):
        killed, total = run_mutation(target, BIN)
        totals[0] += killed
        totals[1] += total
    if len(argv) != 1 and totals[1]:
        score = 100 * totals[0] / totals[1]
        print(f"\nall packages: {totals[0]}/{totals[1]} killed ({score:.1f}%)")


def _package_of(target: str) -> str:
    match = re.fullmatch(r"(?:trioha/)?(\w+)(?:/\w+\.py)?", target)
    return match.group(1) if match else ""


def run_mutation(target: str, bin_dir: Path, root: Path = ROOT) -> tuple[int, int]:
    """Run mutmut over *target* in ``build/mutate/<target>``; (killed, total).

    Each target gets its own copy of the tree (from *root*) with a ``[tool.mutmut]`` section
    naming what to mutate and which tests judge it, so runs never mix and mutmut's cache
    (``mutants/``) lets a second run retest only what changed.
    """
    package = _package_of(target)
    if target == package:
        pattern = f"trioha/{package}/*"
    else:
        pattern = target if target.startswith("trioha/") else f"trioha/{target}"
    work = ROOT / "build" / "mutate" / re.sub(r"\W+", "-", target.removeprefix("trioha/"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("trioha", "tests", "model"):
        shutil.rmtree(work / name, ignore_errors=True)
        shutil.copytree(root / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    section = "\n".join(
        [
            "",
            "[tool.mutmut]",
            'source_paths = ["trioha/"]',
            f"only_mutate = [{json.dumps(pattern)}]",
            # A mutant that hangs a test is caught: pytest-timeout fails it after 150 s. Not
            # less: tests/net's Hypothesis runs and its tests that start real brokers take
            # 15-40 s on a busy machine, and a false timeout would count as a killed mutant.
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "--timeout=150"]',
            f"pytest_add_cli_args_test_selection = {json.dumps(MUTATE[package])}",
            "",
        ]
    )
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    (work / "pyproject.toml").write_text(text + section, encoding="utf-8")
    mutmut = str(bin_dir / "mutmut")
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    # The mutated copy must win over an installed trioha; the directory must exist before
    # mutmut starts, or Python caches its absence on ``sys.path`` for the whole run.
    (work / "mutants").mkdir(exist_ok=True)
    # mutmut re-maps tests to functions only for new tests; an edited test could still count as
    # reaching nothing, so the map is rebuilt every run (one run of the package's tests).
    (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(work / "mutants")}
    print(f"+ mutmut run ({pattern}, tests {' '.join(MUTATE[package])})", flush=True)
    subprocess.run([*nice, mutmut, "run", "--max-children", "1"], cwd=work, env=env, check=False)
    subprocess.run([mutmut, "export-cicd-stats"], cwd=work, env=env, check=True)
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text(encoding="utf-8"))
    listing = subprocess.run(
        [mutmut, "results"], cwd=work, env=env, check=True, capture_output=True, text=True
    ).stdout
    survivors = sorted(
        {
            m.group(1)
            for m in re.finditer(r"^\s*([\w.]+__mutmut_\d+): (survived|no tests)", listing, re.M)
        }
    )
    equivalent = _equivalent_survivors()
    caught = stats["killed"] + stats["timeout"] + stats["segfault"] + stats["suspicious"]
    total = stats["total"] - stats["skipped"]
    explained = [name for name in survivors if name in equivalent]
    unexplained = [name for name in survivors if name not in equivalent]
    print(f"\n{pattern}: {caught}/{total} mutants killed", end="")
    if total:
        raw = 100 * caught / total
        adjusted = 100 * caught / max(1, total - len(explained))
        print(f" ({raw:.1f}% raw; {adjusted:.1f}% with the {len(explained)} equivalent set aside)")
    else:
        print()
    for name in explained:
        print(f"  equivalent  {name}: {equivalent[name]}")
    for name in unexplained:
        print(f"  SURVIVED    {name}   (mutmut show {name}, in {work.relative_to(ROOT)})")
    return caught, total


def _equivalent_survivors() -> dict[str, str]:
    out = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, reason = line.strip().partition(" ")
                out[name] = reason.strip()
    return out


# --- the compiled build ------------------------------------------------------------------------

#: What ``build-fast`` installs into ``.venv`` to compile (mypyc ships with mypy; setuptools
#: drives the C compiler).
FAST_TOOLS = ("mypy>=1.10", "setuptools")
FAST_DIR = ROOT / "build" / "fast"
#: Set (not to ``0``) to load the pure-Python modules although compiled ones are present
#: (``trioha._build.PURE_ENV``).
PURE_ENV = "TRIOHA_PURE"
#: mypycify run from the checkout (so mypy reads pyproject.toml's settings): one group, its
#: shared library ``trioha/_compiled__mypyc*.so``, an extension beside each module. It drives
#: ``build_ext`` through a bare ``Distribution`` rather than ``setup()``, which would also read
#: pyproject.toml's ``[project]`` table (and refuse its license field below setuptools 77).
_FAST_SETUP = """
import sys
from setuptools import Distribution
from mypyc.build import mypycify

temp, *paths = sys.argv[1:]
dist = Distribution(
    {
        "name": "trioha-compiled",
        "ext_modules": mypycify(
            paths, opt_level="3", group_name="trioha._compiled", target_dir=temp
        ),
        "script_args": ["build_ext", "--inplace", "--build-temp", temp + "/temp"],
    }
)
dist.parse_command_line()
dist.run_commands()
"""


def _compiler_missing() -> str | None:
    """Why no C extension can be built here, or None."""
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None and shutil.which("cc") is None:
        return f"no C compiler ({cc})"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        return f"no Python headers ({include}/Python.h; e.g. apt-get install python3-dev)"
    return None


def _fast_modules() -> dict[str, Path]:
    """The modules to compile (``trioha._build.COMPILABLE``), each with its source file."""
    out = subprocess.run(
        [str(PY), "-c", "from trioha._build import COMPILABLE; print(' '.join(COMPILABLE))"],
        cwd=ROOT,
        env={**os.environ, "TRIOHA_PURE": "1"},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {name: ROOT.joinpath(*name.split(".")).with_suffix(".py") for name in out}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]  # trioha._build.source_digest


def _compiled_files() -> list[Path]:
    pkg = ROOT / "trioha"
    return [p for p in pkg.rglob("*.so") if p.is_file()] + [
        p for p in pkg.rglob("*.pyd") if p.is_file()
    ]


def _clean_fast() -> None:
    for path in _compiled_files():
        path.unlink()
    (ROOT / "trioha" / "_compiled.json").unlink(missing_ok=True)


def _build_fast() -> str | None:
    """Compile; None when done (or already current), else why not (pure Python stays)."""
    why = _compiler_missing()
    if why is not None:
        return why
    modules = _fast_modules()
    if not modules:
        return "no module is marked compilable (trioha/_build.py COMPILABLE)"
    manifest_path = ROOT / "trioha" / "_compiled.json"
    wanted = {name: _digest(path) for name, path in modules.items()}
    try:
        current = json.loads(manifest_path.read_text(encoding="utf-8")).get("modules")
    except (OSError, ValueError):
        current = None
    if current == wanted and _compiled_files():
        return None
    _clean_fast()
    FAST_DIR.mkdir(parents=True, exist_ok=True)
    _run(PY, "-m", "pip", "install", "--quiet", *FAST_TOOLS)
    (FAST_DIR / "setup.py").write_text(_FAST_SETUP, encoding="utf-8")
    logfile = FAST_DIR / "build.log"
    print(f"compiling {len(modules)} modules with mypyc (log: {logfile.relative_to(ROOT)})")
    with logfile.open("w", encoding="utf-8") as out:
        done = subprocess.run(
            [str(PY), str(FAST_DIR / "setup.py"), str(FAST_DIR.relative_to(ROOT))]
            + [str(p.relative_to(ROOT)) for p in modules.values()],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        _clean_fast()
        tail = logfile.read_text(encoding="utf-8").splitlines()[-5:]
        return "mypyc failed:\n    " + "\n    ".join(tail)
    version = subprocess.run(
        [str(PY), "-m", "mypy", "--version"], check=False, capture_output=True, text=True
    ).stdout.strip()
    manifest_path.write_text(
        json.dumps({"compiler": f"mypyc ({version})", "modules": wanted}, indent=1) + "\n",
        encoding="utf-8",
    )
    return None


def _say_build(env: dict[str, str]) -> None:
    """Print which build of trioha runs under *env* (``trioha.build_info()``)."""
    which = subprocess.run(
        [str(PY), "-c", "import trioha; print(trioha.build_info().describe())"],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"build: {which or 'unknown (trioha did not import)'}", flush=True)


def build_fast(argv: list[str]) -> None:
    """Compile the hot modules with mypyc, or with ``--clean`` remove the compiled build."""
    _ensure_env("")
    if argv == ["--clean"]:
        _clean_fast()
        print("build: pure Python (compiled modules removed)")
        return
    if argv:
        sys.exit("usage: python3 tasks.py build-fast [--clean]")
    why = _build_fast()
    if why is not None:
        sys.exit(f"build-fast: {why}; trioha stays pure Python")
    _say_build({k: v for k, v in os.environ.items() if k != PURE_ENV})


def main() -> None:
    jobs = {
        "demo": demo,
        "test": test,
        "mutate": mutate,
        "build-fast": build_fast,
        "nemesis": nemesis,
    }
    if len(sys.argv) < 2 or sys.argv[1] not in jobs:
        sys.exit(f"usage: python3 tasks.py {{{'|'.join(jobs)}}} [args...]")
    jobs[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
