"""Which build runs: the manifest of ``tasks.py build-fast``, ``TRIOHA_PURE``, stale sources.

The decisions are checked on a package laid out in a temporary directory (a ``.py`` file, and an
empty file with an extension's suffix standing in for what mypyc would leave beside it); the
import policy is checked in a fresh interpreter, where a real extension-less module must load
from its ``.py`` file when the finder says so.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import trioha
from trioha._build import (
    COMPILABLE,
    BuildInfo,
    decide,
    module_source,
    read_manifest,
    source_digest,
)

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _package(root: Path, *, compiled: bool) -> dict[str, str]:
    """A ``trioha.fast._mod`` source under *root* (and its stand-in extension); its manifest."""
    source = root / "fast" / "_mod.py"
    source.parent.mkdir(parents=True)
    source.write_text("VALUE = 1\n")
    if compiled:
        (root / "fast" / f"_mod{SUFFIX}").write_bytes(b"")
    return {"trioha.fast._mod": source_digest(source)}


def test_no_manifest_is_the_pure_build(tmp_path: Path) -> None:
    assert read_manifest(tmp_path / "_compiled.json") == {}
    info = decide({}, pure=False, root=tmp_path)
    assert info == BuildInfo(compiled=(), built=())
    assert (info.kind, info.describe()) == ("pure", "pure Python")


def test_a_current_build_is_used(tmp_path: Path) -> None:
    built = _package(tmp_path, compiled=True)
    info = decide(built, pure=False, root=tmp_path)
    assert info.compiled == ("trioha.fast._mod",)
    assert (info.kind, info.describe()) == ("compiled", "compiled (mypyc: 1 modules)")


def test_trioha_pure_bypasses_a_current_build(tmp_path: Path) -> None:
    built = _package(tmp_path, compiled=True)
    info = decide(built, pure=True, root=tmp_path)
    assert info.compiled == ()
    assert info.built == ("trioha.fast._mod",)
    assert info.describe() == "pure Python (TRIOHA_PURE is set)"


def test_an_edited_source_makes_the_whole_build_stale(tmp_path: Path) -> None:
    built = _package(tmp_path, compiled=True)
    (tmp_path / "fast" / "_mod.py").write_text("VALUE = 2\n")
    info = decide(built, pure=False, root=tmp_path)
    assert info.compiled == ()
    assert info.describe() == (
        "pure Python (compiled build is stale: trioha.fast._mod changed since it was built)"
    )


def test_extensions_without_a_manifest_are_not_loaded(tmp_path: Path) -> None:
    _package(tmp_path, compiled=True)
    info = decide({}, pure=False, root=tmp_path, compilable=("trioha.fast._mod",))
    assert info.compiled == ()
    assert info.built == ("trioha.fast._mod",)  # the finder will load these from .py
    assert info.describe() == (
        "pure Python (compiled modules without _compiled.json: trioha.fast._mod)"
    )


def test_a_missing_extension_is_not_reported_compiled(tmp_path: Path) -> None:
    built = _package(tmp_path, compiled=False)
    assert decide(built, pure=False, root=tmp_path).compiled == ()


def test_manifest_round_trip_and_bad_manifests(tmp_path: Path) -> None:
    path = tmp_path / "_compiled.json"
    path.write_text(json.dumps({"compiler": "mypyc", "modules": {"trioha.a": "0123"}}))
    assert read_manifest(path) == {"trioha.a": "0123"}
    path.write_text("{not json")
    assert read_manifest(path) == {}
    path.write_text(json.dumps({"compiler": "mypyc"}))
    assert read_manifest(path) == {}


def test_no_manifest_inside_a_zip_is_the_pure_build_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark's executors import trioha from a zip, where the manifest's path runs through a
    file: that is no manifest, not an unreadable one (a warning would fill every task's log)."""
    archive = tmp_path / "trioha-pipeline.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    assert read_manifest(archive / "trioha" / "_compiled.json") == {}
    assert read_manifest(tmp_path / "absent.json") == {}
    assert not caplog.records


def test_module_source_and_the_compilable_list() -> None:
    root = Path(trioha.__file__).parent
    assert module_source("trioha.remoting._codec", root) == root / "remoting" / "_codec.py"
    for name in COMPILABLE:
        assert module_source(name, root).is_file(), name
    assert len(set(COMPILABLE)) == len(COMPILABLE)


def test_this_process_runs_a_described_build() -> None:
    info = trioha.build_info()
    assert info is trioha.build_info()  # decided once per process
    assert info.describe().startswith(("pure Python", "compiled"))


_FINDER_PROBE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from trioha._build import _SourceOnly
    sys.meta_path.insert(0, _SourceOnly(frozenset({"pkg.mod"})))
    import pkg.mod
    print(pkg.mod.__file__)
    """
)


def test_the_source_only_finder_skips_an_extension(tmp_path: Path) -> None:
    """With a broken 'extension' beside it, the module still loads from its ``.py``."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("VALUE = 1\n")
    (package / f"mod{SUFFIX}").write_bytes(b"not an ELF file")
    out = subprocess.run(
        [sys.executable, "-c", _FINDER_PROBE, str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert out == str(package / "mod.py")


_LOADED_PROBE = textwrap.dedent(
    """
    import importlib
    import trioha
    from trioha._build import COMPILABLE
    print(trioha.build_info().kind)
    for name in COMPILABLE:
        print(importlib.import_module(name).__file__)
    """
)


def _loaded(pure: bool) -> tuple[str, list[str]]:
    """The build a fresh interpreter runs in this checkout, and where its compilable modules
    load from."""
    env = {k: v for k, v in os.environ.items() if k != "TRIOHA_PURE"}
    if pure:
        env["TRIOHA_PURE"] = "1"
    kind, *files = subprocess.run(
        [sys.executable, "-c", _LOADED_PROBE],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.split()
    return kind, files


def test_the_build_said_is_the_build_loaded() -> None:
    """Whichever build this checkout has (``tasks.py test --compiled`` or ``--pure``), what
    ``build_info`` says is what the import system loads, and ``TRIOHA_PURE`` loads sources."""
    kind, files = _loaded(pure=False)
    assert len(files) == len(COMPILABLE)
    if kind == "compiled":
        assert not any(f.endswith(".py") for f in files), files
    else:
        assert kind == "pure"
        assert all(f.endswith(".py") for f in files), files
    kind, files = _loaded(pure=True)
    assert kind == "pure"
    assert all(f.endswith(".py") for f in files), files


def test_tasks_writes_the_digests_trioha_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tasks.py build-fast`` records each compilable module's source as ``_build`` reads it,
    or every compiled build would load as stale (or a stale one as current)."""
    import tasks

    monkeypatch.setattr(tasks, "PY", Path(sys.executable))
    modules = tasks._fast_modules()
    assert tuple(modules) == COMPILABLE
    root = Path(trioha.__file__).parent
    for name, path in modules.items():
        assert path == module_source(name, root)
        assert tasks._digest(path) == source_digest(path)
    edited = tmp_path / "mod.py"
    edited.write_text("VALUE = 1\n")
    before = tasks._digest(edited)
    edited.write_text("VALUE = 2\n")
    assert tasks._digest(edited) == source_digest(edited) != before
