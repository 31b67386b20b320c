"""``tasks.py test`` brings etcd when it can, and says what to install when it cannot."""

from __future__ import annotations

import os
import shutil

import pytest

import tasks


@pytest.fixture
def no_etcd(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """etcd missing; apt-get calls recorded (and failing the first time: no package lists)."""
    calls: list[list[str]] = []
    installed = [False]

    def apt_get(command: list[str]) -> int:
        calls.append(command)
        if command[1] == "update":
            return 0
        if len(calls) == 1:
            return 100  # "Unable to locate package" before apt-get update
        installed[0] = True
        return 0

    monkeypatch.setattr(tasks, "_apt_get", apt_get)
    monkeypatch.setattr(tasks, "_has_etcd", lambda: installed[0])
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    return calls


def test_as_root_it_installs_etcd_server_fetching_the_lists_once(
    no_etcd: list[list[str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    tasks._ensure_etcd()
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "etcd-server"]
    assert no_etcd == [install, ["apt-get", "update", "-qq"], install]
    assert tasks.ETCD_HINT not in capsys.readouterr().out


def test_not_root_it_says_what_to_install_in_one_line(
    no_etcd: list[list[str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    tasks._ensure_etcd()
    assert no_etcd == []
    assert capsys.readouterr().out == tasks.ETCD_HINT + "\n"
    assert "apt-get install etcd-server" in tasks.ETCD_HINT
