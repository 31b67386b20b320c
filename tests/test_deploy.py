"""The deployment recipes run what the CLI accepts.

``compose.yaml``'s commands are parsed by trioha's own argument parser, the Dockerfile's entry
point is the CLI, and the systemd unit stops trioha the way it stops cleanly. Building the image
needs a container engine; without one that test skips and says so.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from trioha.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def test_every_compose_command_is_one_the_cli_accepts() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"namesrv", "master", "slave"}
    parser = build_parser()
    commands = {name: parser.parse_args(service["command"]) for name, service in services.items()}
    assert commands["master"].role == "SYNC_MASTER"
    assert commands["slave"].master_ha == commands["master"].ha_listen
    for name in ("master", "slave"):
        assert commands[name].namesrv == commands["namesrv"].listen
        volume = services[name]["volumes"][0].split(":")[1]
        assert str(commands[name].store_dir).startswith(volume)  # the store lives on the volume
    declared = set(compose["volumes"])
    assert {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])} == declared


def test_the_image_runs_the_cli_as_a_non_root_user_with_the_store_on_a_volume() -> None:
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    assert 'ENTRYPOINT ["python", "-m", "trioha"]' in lines
    assert "STOPSIGNAL SIGTERM" in lines
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}
    assert any(line.startswith("VOLUME") and "/var/lib/trioha" in line for line in lines)


def test_the_service_unit_stops_trioha_with_sigterm_and_waits() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(ROOT / "deploy" / "trioha@.service")
    service = unit["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) >= 10
    assert service["ExecStart"].split()[1:3] == ["-m", "trioha"]
    assert service["User"] != "root"
    assert "2" in service["RestartPreventExitStatus"].split()  # a bad flag is not retried


def _engine_available() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on this machine"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "no container engine is running (docker info failed)"
    return None


@pytest.mark.slow
def test_the_image_builds_and_prints_the_cli_help(tmp_path: Path) -> None:
    reason = _engine_available()
    if reason is not None:
        pytest.skip(reason)
    tag = "trioha-test:latest"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ROOT)], check=True, timeout=900)
    out = subprocess.run(
        ["docker", "run", "--rm", tag, "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "master" in out and "slave" in out
