"""One process writes a store file, whatever path it is reached by.

DuckDB locks its file only while a connection is open, and the worker lets the file go
every `store_release_s` so that readers get in (store/__init__.py `StoreSession`): a second
worker on the same file would slip in at a release and write too, counting every event
twice. This lock is an exclusive `flock` on the store file itself, taken before the worker
reads anything and held for the process's life. A flock belongs to the file (its device
and inode), not to the name it was opened by, so a symlink, a hard link, a relative path or
a bind mount reach the same lock. The kernel drops it when the process ends, SIGKILL and
OOM kills included, so a restarted worker never finds its own ghost.

Readers (`tailwatch sql`, reports, backtests) open the file read-only through DuckDB and
never take this lock. Replicas for high availability each keep a store of their own
(docs/operating.md); two processes never share one file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tailwatch.store import StoreError, connect


class StoreInUse(StoreError):
    """Another live process writes this store file (one line naming it)."""


class StoreLock:
    def __init__(self, store_path: str | Path):
        self.path = Path(store_path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise StoreInUse naming the process that holds it; never waits."""
        if self._fd is not None:
            return
        if not self.path.exists():
            # DuckDB refuses an empty file as a database: let it create the file first (its own
            # lock orders two processes starting at once; the flock below then picks one).
            connect(self.path).close()
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            st = os.fstat(fd)
            os.close(fd)
            raise StoreInUse(f"store {self.path} is already written by {_holder(st)}; run each replica with a "
                             "--store of its own") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # and with it the lock
            self._fd = None


def _holder(st: os.stat_result) -> str:
    """Who holds a flock on the file `st` describes: its pid and command line from
    /proc/locks (Linux), or a plain phrase where that cannot be seen (another host)."""
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        locks = []
    for line in locks:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[5] == ident:
            pid = parts[4]
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                command = ""
            return f"pid {pid}" + (f" ({command[:160]})" if command else "")
    return "another process (not visible from this host)"
