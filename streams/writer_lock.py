"""Who writes a store: one process at a time; the others stand by (streams/standby.py).

DuckDB locks its file only while a connection is open, and the worker lets the file go
every `store_release_s` so that readers get in (streams/store.py `StoreSession`): that lock
cannot say who the writer is, and a second worker on the same store would slip in at a
release and write too. This lock can: an exclusive `flock` on `<store>.writer`, taken before
the store is opened and held for the writer's life. The kernel drops it when the process
ends, SIGKILL and OOM kills included, so a standby takes over within its poll interval,
with no lease to expire and no coordinator to ask.

The file also names the writer (pid, and the URL of its HTTP port), which standbys forward
the signal API to. flock holds across processes on one machine, and on a shared filesystem
whose client maps it to POSIX locks (Linux's NFS v4 client does); a store on a disk only
one machine mounts needs nothing more.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import msgspec


class WriterInfo(msgspec.Struct, frozen=True):
    pid: int
    url: str | None = None  # the writer's HTTP port; None while it has none (starting, or --http-port unset)


class StoreWriterLock:
    def __init__(self, store_path: str | Path):
        self.path = Path(f"{store_path}.writer")
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if no live process holds it; never waits."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)  # as the store's own connect does
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        self.advertise(None)
        return True

    def advertise(self, url: str | None) -> None:
        """Name this process, and where it serves HTTP, as the writer."""
        assert self._fd is not None, "only the writer advertises"
        payload = msgspec.json.encode(WriterInfo(os.getpid(), url))
        # Over the old content, then cut: a reader never finds the file empty, at worst
        # mixed for an instant (it then reads no writer and answers 503 once).
        os.pwrite(self._fd, payload, 0)
        os.ftruncate(self._fd, len(payload))

    def writer(self) -> WriterInfo | None:
        """The writer the file names (a dead one's, until a standby takes over)."""
        try:
            return msgspec.json.decode(self.path.read_bytes(), type=WriterInfo)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # standbys see no writer rather than a stale address
        finally:
            os.close(self._fd)  # and with it the lock
            self._fd = None
