"""``tasks.py test`` runs the core and store tests on the other Pythons the classifiers name."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

import tasks


def fake_python(path: Path, prints: str, code: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {prints}\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_newest_pyenv_build_that_runs_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions = tmp_path / ".pyenv" / "versions"
    fake_python(versions / "3.12.1" / "bin" / "python3.12", "3.12")
    newest = fake_python(versions / "3.12.10" / "bin" / "python3.12", "3.12")
    fake_python(versions / "3.13.0" / "bin" / "python3.13", "3.13", code=1)  # broken build
    shim = fake_python(tmp_path / "shims" / "python3.13", "pyenv: not selected", code=127)
    monkeypatch.setattr(shutil, "which", lambda name: str(shim) if name == "python3.13" else None)
    assert tasks.find_python("3.12", home=tmp_path) == newest  # 3.12.10 is newer than 3.12.1
    assert tasks.find_python("3.13", home=tmp_path) is None
    assert tasks.find_python("3.14", home=tmp_path) is None


def test_a_missing_python_is_one_line_and_no_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tasks, "find_python", lambda version: None)
    assert tasks.test_other_pythons() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"Python {v} not found (python{v}, pyenv): its tests are skipped"
        for v in tasks.OTHER_PYTHONS
    ]


def test_the_test_dependencies_keep_the_dev_extras_bounds() -> None:
    required = tasks.portable_requirements()
    assert sorted(r.split(">=")[0] for r in required) == sorted(tasks.PORTABLE_TEST_DEPS)
    assert all(">=" in r for r in required)


def test_the_classifiers_name_every_python_that_is_tested() -> None:
    text = (tasks.ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for version in ("3.11", *tasks.OTHER_PYTHONS):
        assert f'"Programming Language :: Python :: {version}"' in text
