"""``python -m trioha``: every bad flag or file is one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioha", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_lists_the_commands() -> None:
    result = run("--help")
    assert result.returncode == 0
    for command in ("master", "slave", "demo", "audit", "namesrv", "status"):
        assert command in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["master"], "a broker needs --store-dir DIR or -c broker.conf"),
        (["master", "--store-dir", "x", "--ha-listen", "nowhere"], "HOST:PORT"),
        (["master", "--store-dir", "x", "--mapped-file-size", "12q"], "not a size"),
        (["slave", "--store-dir", "x"], "a slave needs --master-ha"),
    ],
)
def test_bad_flags_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trioha", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_bad_broker_conf_is_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("haSendHeartBeatInterval=3\n")
    result = run("master", "--store-dir", str(tmp_path / "s"), "-c", str(conf))
    assert result.returncode == 1
    assert "did you mean 'haSendHeartbeatInterval'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_locked_store_is_one_line(tmp_path: Path) -> None:
    from trioha.store import open_store

    with open_store(tmp_path / "s", segment_size=1 << 20):
        result = run(
            "master",
            "--store-dir",
            str(tmp_path / "s"),
            "--ha-listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("trioha master: error:")
    assert "lock" in result.stderr


# --- start-up failures: one line naming the address and the setting ------------------------

import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402

from trioha.store import NewMessage  # noqa: E402


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("command", "flags", "setting"),
    [
        (
            "master",
            ["--listen", "127.0.0.1:{port}", "--ha-listen", "127.0.0.1:0"],
            "(listenPort, --listen)",
        ),
        (
            "master",
            ["--listen", "127.0.0.1:0", "--ha-listen", "127.0.0.1:{port}"],
            "(haListenPort, --ha-listen)",
        ),
        (
            "master",
            [
                "--listen",
                "127.0.0.1:0",
                "--ha-listen",
                "127.0.0.1:0",
                "--embedded-namesrv",
                "--namesrv",
                "127.0.0.1:{port}",
            ],
            "(namesrvAddr, --embedded-namesrv)",
        ),
        (
            "slave",
            ["--listen", "127.0.0.1:{port}", "--master-ha", "127.0.0.1:1"],
            "(listenPort, --listen)",
        ),
        ("namesrv", ["--listen", "127.0.0.1:{port}"], "(--listen)"),
        ("namesrv", ["--set", "listenPort={port}"], "(listenHost/listenPort)"),
    ],
)
def test_a_port_in_use_is_one_line_naming_address_and_setting(
    tmp_path: Path, taken_port: int, command: str, flags: list[str], setting: str
) -> None:
    store = [] if command == "namesrv" else ["--store-dir", str(tmp_path / "s")]
    result = run(command, *store, *[f.format(port=taken_port) for f in flags])
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    what = "for slaves " if "ha-listen" in setting else ""  # the HA port says what it serves
    assert last == (
        f"trioha {command}: error: cannot listen {what}on 127.0.0.1:{taken_port} {setting}: "
        "Address already in use"
    ), result.stderr
    assert "Traceback" not in result.stderr


def test_an_address_not_on_this_host_is_one_line(tmp_path: Path) -> None:
    result = run(
        "master",
        "--store-dir",
        str(tmp_path / "s"),
        "--listen",
        "192.0.2.1:0",
        "--ha-listen",
        "127.0.0.1:0",
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "trioha master: error: cannot listen on 192.0.2.1:0 (listenPort, --listen): "
        "Cannot assign requested address"
    )


def test_broker_conf_alone_starts_a_master_with_its_commit_log_where_it_says(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        f"storePathRootDir={tmp_path / 'store'}\n"
        f"storePathCommitLog={tmp_path / 'other-disk' / 'commitlog'}\n"
        "listenPort=0\nhaListenPort=0\nmappedFileSizeCommitLog=65536\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "trioha", "master", "-c", str(conf)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen.append(line)
            if "ASYNC_MASTER started" in line or not line:
                break
        assert "ASYNC_MASTER started" in seen[-1], "".join(seen)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert (tmp_path / "other-disk" / "commitlog").is_dir()
    assert not (tmp_path / "store" / "commitlog").exists()
    assert (tmp_path / "store" / "checkpoint").exists()


def test_an_os_error_inside_nursery_groups_is_the_one_line() -> None:
    import errno

    from trioha._errors import StorageError
    from trioha.cli._main import _trioha_error, error_line

    bare = PermissionError(errno.EACCES, "Permission denied", "/data/store/lock")
    group = BaseExceptionGroup("nursery", [BaseExceptionGroup("inner", [bare])])
    found = _trioha_error(group)
    assert found is bare
    assert error_line(found) == "Permission denied (/data/store/lock)"
    # A TriohaError wins over a bare OSError, and shows the OSError it was raised from.
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise StorageError("cannot write checkpoint /s/checkpoint") from exc
    except StorageError as wrapped:
        storage = wrapped
    found = _trioha_error(BaseExceptionGroup("nursery", [bare, storage]))
    assert found is storage
    assert error_line(storage) == (
        "cannot write checkpoint /s/checkpoint (caused by: No space left on device)"
    )


def test_truncate_to_master_without_a_recorded_divergence_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    result = run("slave", "--store-dir", str(tmp_path / "s"), "--truncate-to-master")
    assert result.returncode == 1
    assert "records no divergence" in result.stderr
    assert "nothing to cut back" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_truncate_to_master_refuses_a_cut_inside_a_record(tmp_path: Path) -> None:
    from trioha.store import open_store

    root = tmp_path / "s"
    with open_store(root, segment_size=4096) as store:
        first = store.commitlog.append(NewMessage(topic="T", body=b"x" * 100))
        store.commitlog.append(NewMessage(topic="T", body=b"y" * 100))
        end = store.commitlog.max_offset
    inside = first.physical_offset + 10
    (root / "haDiverged").write_text(
        f"master_offset {inside}\nslave_offset {end}\nmaster 127.0.0.1:1\nreason r\n"
    )
    result = run(
        "slave", "--store-dir", str(root), "--mapped-file-size", "4096", "--truncate-to-master"
    )
    assert result.returncode == 1
    assert f"at {inside}: it is not a message boundary" in result.stderr
    assert f"boundaries are 0 and {first.end_offset}" in result.stderr
    assert (root / "haDiverged").exists()  # nothing changed: still to be dealt with
    with open_store(root) as store:
        assert store.commitlog.max_offset == end


def test_truncate_to_cuts_a_store_without_a_recorded_divergence_as_a_java_slave_needs(
    tmp_path: Path,
) -> None:
    """A Java slave refused by a trioha master records nothing; the master's log names the
    offset, and ``--truncate-to`` cuts its stopped store there, consume queues included."""
    import trio

    from trioha import BrokerConfig
    from trioha.broker import open_broker
    from trioha.store import ConsumeQueueStore, open_store

    root = tmp_path / "s"
    config = BrokerConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=4096,
        listen_port=0,
        ha_listen_port=0,
    )

    async def fill() -> list[int]:
        async with open_broker(config) as broker:
            ends = [
                (await broker.put(NewMessage(topic="T", body=b"m%d" % i))).end_offset
                for i in range(6)
            ]
            assert broker.client_side is not None
            await broker.client_side.reput.wait_dispatched(ends[-1])
            return ends

    ends = trio.run(fill)
    (root / "haSentOffset").unlink()  # a Java store keeps no trioha marks
    cut, end = ends[2], ends[-1]
    result = run("slave", "--store-dir", str(root), "--truncate-to", str(cut))
    assert result.returncode == 0, result.stderr
    assert f"back from {end} to {cut}" in result.stdout
    assert any((root / "lost+found").iterdir())
    assert (root / "commitlog" / f"{0:020d}").stat().st_size == 4096  # files keep their size
    with open_store(root) as store:
        assert store.commitlog.max_offset == cut
    queues = ConsumeQueueStore(root)
    queues.load()
    try:
        queue = queues.get("T", 0)
        assert queue is not None
        assert queue.max_offset == 3  # the units of the cut messages are gone
    finally:
        queues.close()
    # Not at a boundary: refused, nothing changed (re-seed it).
    inside = run("slave", "--store-dir", str(root), "--truncate-to", str(cut - 3))
    assert inside.returncode == 1
    assert "not a message boundary" in inside.stderr
    both = run("slave", "--store-dir", str(root), "--truncate-to", "0", "--truncate-to-master")
    assert both.returncode == 1 and "not both" in both.stderr


def test_a_master_on_a_log_damaged_below_its_flushed_mark_refuses_to_start(
    tmp_path: Path,
) -> None:
    from trioha.store import SentOffsets, open_store

    root = tmp_path / "m"
    with open_store(root, segment_size=4096) as store:
        offsets = [
            store.commitlog.append(NewMessage(topic="T", body=b"x" * 100)).physical_offset
            for _ in range(10)
        ]
    SentOffsets.open(root).note_flushed(4096 // 2, now=0.0)
    with (root / "commitlog" / f"{0:020d}").open("r+b") as f:  # a bad magic, mid-log
        f.seek(offsets[3] + 4)
        f.write(b"\xde\xad\xbe\xef")
    args = [
        "master",
        "--store-dir",
        str(root),
        "--mapped-file-size",
        "4096",
        "--ha-listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
    ]
    result = run(*args)
    assert result.returncode == 1
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("trioha master: error: refusing to start as master")
    assert f"ends at {offsets[3]}, below {4096 // 2}" in error
    assert "lost+found" in error
    assert "--accept-damaged-log" in error


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        (
            "serverChannelMaxIdleTimeSecond=300\n",
            [],
            "namesrv.properties:1: unknown key 'serverChannelMaxIdleTimeSecond'; did you mean "
            "'serverChannelMaxIdleTimeSeconds'?",
        ),
        (
            "listenPort=0\n",
            ["--set", "serverChannelMaxIdleTimeSeconds=20"],
            "serverChannelMaxIdleTimeSeconds=20 on the name server is not above the brokers' "
            "registration period (30 s)",
        ),
        ("listenPort=0\n", ["--set", "serverMaxConnections"], "not key=value"),
    ],
)
def test_a_bad_namesrv_properties_or_setting_is_one_line(
    tmp_path: Path, text: str, args: list[str], message: str
) -> None:
    conf = tmp_path / "namesrv.properties"
    conf.write_text(text)
    result = run("namesrv", "-c", str(conf), *args)
    assert result.returncode == (2 if message == "not key=value" else 1)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
