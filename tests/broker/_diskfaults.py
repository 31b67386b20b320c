"""Full disks for tests: a real small tmpfs (needs root) or ENOSPC injected at the file layer.

Both give a store root, ``fill()`` and ``free()``. The injected one swaps the ``os`` module seen
by the store's writers (commit log segments, consume queues, metadata files) for
one whose writes fail with ENOSPC while the disk is "full", and whose ``statvfs`` then reports
the partition as used up, so the broker's disk check sees what it would see on a real disk.
"""

from __future__ import annotations

import errno
import os
import subprocess
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from trioha.broker import _metadata
from trioha.store import _commitlog, _consumequeue, _diskspace, _index, _segment, _sent

#: The modules whose file writes the injected disk refuses (``_sent``: the master's marks, a
#: new file renamed into place at every write; ``_index``: its ``posix_fallocate``). Not the
#: store checkpoint's: it is written in place in a file allocated at start, which a full disk
#: still allows.
WRITERS = (_segment, _commitlog, _consumequeue, _metadata, _sent, _index)


def fill_until_full(filler: Path) -> None:
    """Write ``filler`` until its filesystem says ENOSPC."""
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(b"\xab" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return


class RefusingFallocate:
    """An ``os`` module whose ``posix_fallocate`` fails with ENOSPC while ``full`` (for the
    message index's reservations; everything else is the real ``os``)."""

    def __init__(self) -> None:
        self.full = False
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate(fd, offset, length)


class FullDisk:
    """An ``os`` module whose writes under ``root`` fail with ENOSPC while ``full`` is set."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.full = False
        self.refused = 0
        self.module = types.SimpleNamespace(
            **{k: getattr(os, k) for k in dir(os) if not k.startswith("__")}
        )
        # Allocation fails where it does on tmpfs or ext4: at the write (``replace`` stands in
        # for the metadata files' writes, which go through ``open``) or at the reservation
        # (``posix_fallocate``, before the message index writes through its mapping). fsync
        # does not fail.
        for name in ("pwrite", "write", "replace", "posix_fallocate"):
            setattr(self.module, name, self._refusing(getattr(os, name)))
        self.module.statvfs = self._statvfs

    def _on_disk(self, target: Any) -> bool:
        """Whether *target* (a descriptor or a path) lies on this disk."""
        if isinstance(target, int):
            try:
                target = os.readlink(f"/proc/self/fd/{target}")
            except OSError:
                return False
        return str(os.fspath(target)).startswith(self.root)

    def _refusing(self, real: Any) -> Any:
        def call(*args: Any) -> Any:
            if self.full and self._on_disk(args[0]):
                self.refused += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*args)

        return call

    def _statvfs(self, path: Any) -> Any:
        real = os.statvfs(path)
        if not (self.full and self._on_disk(path)):
            return real
        return types.SimpleNamespace(
            f_blocks=real.f_blocks, f_bfree=0, f_bavail=0, f_frsize=real.f_frsize
        )

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for module in (*WRITERS, _diskspace):
            monkeypatch.setattr(module, "os", self.module)


class Disk:
    """A place for a store that can be made full and freed again."""

    def __init__(self, root: Path, injected: FullDisk | None = None) -> None:
        self.root = root
        self.injected = injected
        self._filler = root / "filler"

    def fill(self) -> None:
        if self.injected is not None:
            self.injected.full = True
            return
        fill_until_full(self._filler)

    def free(self) -> None:
        if self.injected is not None:
            self.injected.full = False
        else:
            self._filler.unlink()


@contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) at ``mount`` for the block; skips the test
    where mounting is not allowed (not root, no mount namespace rights)."""
    mount.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the injected disk covers the same ground)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def tmpfs_disk(tmp_path: Path, size: str = "2m", name: str = "tmpfs") -> Iterator[Disk]:
    """A small tmpfs mounted for one test (skips where mounting is not allowed)."""
    with mounted_tmpfs(tmp_path / name, size) as mount:
        yield Disk(mount)


def injected_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Disk:
    root = tmp_path / "disk"
    root.mkdir()
    fake = FullDisk(root)
    fake.install(monkeypatch)
    return Disk(root, fake)
