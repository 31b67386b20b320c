"""Which build of trioha is running: the pure-Python modules, or the hot ones compiled.

``python3 tasks.py build-fast`` compiles the modules in :data:`COMPILABLE` with mypyc (one
shared library, ``trioha/_compiled__mypyc*.so``, and a small extension beside each module's
``.py``) and writes :data:`MANIFEST` naming each compiled module with a digest of the source it
was compiled from. Python's import system prefers an extension to a ``.py`` file, so from then
on the compiled modules load; both builds behave identically (the test suite runs on each), only
the cost per message differs (docs/performance.md, "Compiling the hot path").

:func:`install` (run once, when ``trioha/__init__`` imports this module first) keeps that
safe and switchable:

* ``TRIOHA_PURE=1`` in the environment loads every module from its ``.py`` file although
  compiled ones are present (to compare, or to rule the build out);
* a source edited since the build makes the whole compiled build stale: compiled modules call
  each other's compiled code directly, so one stale module cannot be swapped out alone. Every
  module then loads from its ``.py``, and a warning names what changed and how to rebuild;
* without a manifest nothing is done: the pure build, as a fresh checkout runs (compiled
  modules found without one, say from an interrupted build, are not loaded either).

:func:`build_info` tells which build runs; ``Broker.statistics()`` carries it (``stats.build``
in the runtime info, so ``trioha status`` shows it), and brokers log it at start.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import attrs

log = logging.getLogger("trioha")

#: The modules ``tasks.py build-fast`` compiles (one mypyc group). Each compiles unchanged and
#: passes its tests compiled; a module some test changes from outside (a module global such as
#: ``os`` swapped for a failing one, a class's method replaced) cannot be compiled until that test
#: injects its fault another way, since compiled code does not look those names up again
#: (docs/performance.md, "Compiling the hot path").
COMPILABLE: tuple[str, ...] = (
    "trioha.proto._buffer",  # the slave's HA receive buffer: frames out of the stream
    "trioha.broker._reput",  # the consume-queue and index builder's loop (ReputMessageService)
)

#: Written by ``tasks.py build-fast`` beside this file: ``{"compiler": ..., "modules": {name:
#: digest}}``; absent in the pure build.
MANIFEST = Path(__file__).with_name("_compiled.json")

#: Set (to anything but ``0`` or empty) to load the pure-Python modules although compiled ones
#: are present.
PURE_ENV = "TRIOHA_PURE"


def source_digest(path: Path) -> str:
    """What the manifest records of a module's source: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def module_source(name: str, root: Path = Path(__file__).parent) -> Path:
    """The ``.py`` file of module *name* (``trioha.x._y``) under the package directory *root*."""
    parts = name.split(".")
    if parts[0] != "trioha":
        raise ValueError(f"{name} is not a trioha module")
    return root.joinpath(*parts[1:]).with_suffix(".py")


@attrs.frozen
class BuildInfo:
    """The running build."""

    #: Modules loaded (or to be loaded) from a compiled extension.
    compiled: tuple[str, ...]
    #: Modules the manifest says were compiled (empty: no fast build in this checkout).
    built: tuple[str, ...]
    #: Why compiled modules present are not used: ``TRIOHA_PURE`` or stale sources (or None).
    bypassed: str | None = None

    @property
    def kind(self) -> str:
        """``pure`` or ``compiled``."""
        return "compiled" if self.compiled else "pure"

    def describe(self) -> str:
        """One line for logs, ``status`` and benchmarks."""
        if self.compiled:
            return f"compiled (mypyc: {len(self.compiled)} modules)"
        if self.bypassed is not None:
            return f"pure Python ({self.bypassed})"
        return "pure Python"


class _SourceOnly(importlib.abc.MetaPathFinder):
    """Finds the named modules in their ``.py`` files, never in a compiled extension."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path or ():
            candidate = Path(entry, f"{leaf}.py")
            if candidate.is_file():
                return importlib.util.spec_from_file_location(fullname, candidate)
        return None


def read_manifest(path: Path = MANIFEST) -> dict[str, str]:
    """The manifest's ``{module: source digest}``; empty if there is none (the pure build)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):  # none, or trioha runs from a zip
        return {}
    except (OSError, ValueError) as exc:
        log.warning("%s is unreadable (%s): loading the pure-Python modules", path, exc)
        return {}
    modules = data.get("modules") if isinstance(data, dict) else None
    if not isinstance(modules, dict):
        log.warning("%s names no modules: loading the pure-Python modules", path)
        return {}
    return {str(k): str(v) for k, v in modules.items()}


def decide(
    built: dict[str, str],
    *,
    pure: bool,
    root: Path = Path(__file__).parent,
    compilable: tuple[str, ...] | None = None,
) -> BuildInfo:
    """Which build loads, given the manifest's modules, ``TRIOHA_PURE`` and the sources
    (*compilable*: :data:`COMPILABLE`, which a test may replace)."""
    names = tuple(built)
    if not built:
        # Extensions without a manifest (an interrupted or hand-made build) are of unknown
        # provenance: never loaded.
        candidates = COMPILABLE if compilable is None else compilable
        strays = tuple(n for n in candidates if _is_extension(module_source(n, root)))
        if strays:
            why = f"compiled modules without {MANIFEST.name}: {', '.join(strays)}"
            return BuildInfo(compiled=(), built=strays, bypassed=why)
        return BuildInfo(compiled=(), built=())
    if pure:
        return BuildInfo(compiled=(), built=names, bypassed=f"{PURE_ENV} is set")
    stale = [n for n, d in built.items() if _digest_or_none(module_source(n, root)) != d]
    if stale:
        why = f"compiled build is stale: {', '.join(stale)} changed since it was built"
        return BuildInfo(compiled=(), built=names, bypassed=why)
    compiled = tuple(n for n in names if _is_extension(module_source(n, root)))
    return BuildInfo(compiled=compiled, built=names)


@functools.cache
def install() -> BuildInfo:
    """Decide, once per process, which build loads (see the module note); returns it."""
    info = decide(read_manifest(), pure=os.environ.get(PURE_ENV, "") not in ("", "0"))
    if info.bypassed is not None:
        if not info.bypassed.startswith(PURE_ENV):
            log.warning(
                "%s; loading the pure-Python modules (`python3 tasks.py build-fast` makes "
                "a current build)",
                info.bypassed,
            )
        loaded = sorted(n for n in info.built if n in sys.modules)
        if loaded:  # too late to choose for these: say so rather than mix silently
            log.warning("already imported before the build was chosen: %s", ", ".join(loaded))
        sys.meta_path.insert(0, _SourceOnly(frozenset(info.built)))
    return info


def _digest_or_none(path: Path) -> str | None:
    try:
        return source_digest(path)
    except OSError:
        return None


def _is_extension(source: Path) -> bool:
    """Whether the import system finds an extension beside *source* (looked up on disk:
    nothing is imported, so asking at ``import trioha`` loads no package)."""
    base = source.with_suffix("")
    return any(
        base.with_name(base.name + suffix).is_file()
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def build_info() -> BuildInfo:
    """The build this process runs (:func:`install` decides it on first import of trioha)."""
    return install()


# Chosen when trioha is first imported (trioha/__init__ imports this module first), before any
# module in COMPILABLE can load.
install()
