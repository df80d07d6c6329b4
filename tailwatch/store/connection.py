"""Opening the store's file: the one-line errors a user sees, the buffer pool's limit, and
the worker's session that holds the file between checkpoints and lets readers in.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, TypeVar

import duckdb

from tailwatch.store.schema import SCHEMA_VERSION, migrate, schema_version

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_STORE = "data/tailwatch.duckdb"


class StoreError(Exception):
    """The store cannot be opened or written (a one-line message for the user)."""


class StoreBusy(StoreError):
    """Another process holds the store's file (DuckDB's lock) past the wait."""


def _check_not_newer(path: str | Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StoreError(f"store {path} was written by a newer tailwatch (schema {version}; this release reads up to "
                         f"{SCHEMA_VERSION}): upgrade tailwatch, or give this one a --store of its own")


# start-up backlog. A checkpoint that needs more doubles it, at most MEMORY_LIMIT_DOUBLINGS
# times (StoreSession.run).
STORE_MEMORY_LIMIT_MIB = 256
MEMORY_LIMIT_DOUBLINGS = 2


def connect(path: str | Path, read_only: bool = False, wait_s: float = 5.0,
            memory_limit_mib: int = STORE_MEMORY_LIMIT_MIB) -> duckdb.DuckDBPyConnection:
    """Open the store. DuckDB lets one process write a file and nobody read it meanwhile;
    the worker holds it only while it writes a checkpoint, so a lock conflict is retried
    for up to `wait_s` seconds. Any other failure is a StoreError of one line. A writer's
    buffer pool is held to `memory_limit_mib`."""
    path = Path(path)
    if read_only and not path.exists():
        raise StoreError(f"no store at {path}: run `tailwatch worker --store {path}` (or `tailwatch demo`) first")
    if path.is_dir():
        raise StoreError(f"{path} is a directory: --store names the store's file, e.g. {path / 'tailwatch.duckdb'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the folder of store {path}: {exc.strerror or exc}") from None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() >= deadline:
                raise store_failure(path, exc) from None
            time.sleep(0.05)
        except duckdb.Error as exc:
            raise store_failure(path, exc) from None
    try:
        _check_not_newer(path, schema_version(con))
        if not read_only:
            con.execute(f"SET memory_limit = '{int(memory_limit_mib)}MiB'")
            migrate(con, path)
    except duckdb.Error as exc:
        con.close()
        raise store_failure(path, exc) from None
    except StoreError:
        con.close()
        raise
    return con


def store_failure(path: str | Path, exc: BaseException) -> StoreError:
    """What went wrong with a store file, in one line that names the file and the way out."""
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    # A file cut short (a full disk, a copy stopped half-way) fails as a read past its end.
    if ("not a valid DuckDB database" in text or "Corrupt" in text or "checksum" in text.lower() or "Serialization" in text
            or "Could not read enough bytes" in text):
        return StoreError(f"{path} is not a DuckDB store, or is corrupt or truncated ({first[:120]}): move it away and start the "
                          "worker again, which rebuilds the store from Kafka as far back as the topics' retention reaches")
    if isinstance(exc, duckdb.IOException) and "lock" in text.lower():
        return StoreBusy(f"store {path} is held by another process ({first[:200]})")
    if isinstance(exc, duckdb.OutOfMemoryException):
        return StoreError(f"store {path}: DuckDB ran out of its memory limit ({first[:160]}): start the worker with a "
                          "larger --store-memory-limit")
    if "No space left on device" in text or getattr(exc, "errno", None) == 28:
        return StoreError(f"no space left on device for store {path}: free space there (or move --store) and start the "
                          "worker again; it resumes from its last checkpoint")
    return StoreError(f"store {path}: {first[:300]}")


class StoreSession:
    """The worker's connection to its store, let go every `release_every_s` seconds.

    DuckDB gives one process the file at a time. Closing after every checkpoint would
    let readers in at any moment, but each close folds the write-ahead log into the file,
    which measured 3 to 4 times the worker's CPU on a 10-million-event run; so the worker
    keeps the file and releases it periodically, and readers wait for that moment.
    """

    LOCK_WARN_S = 60.0  # while another process holds the file: a warning this often
    STOP_WAIT_S = 10.0  # told to stop while waiting for the file: how much longer to wait

    def __init__(self, path: str | Path, release_every_s: float = 20.0, memory_limit_mib: int = STORE_MEMORY_LIMIT_MIB,
                 on_memory_limit: Callable[[int], None] | None = None, stopping: Callable[[], bool] = lambda: False):
        self.path = path
        self.stopping = stopping
        self.release_every_s = release_every_s
        self.memory_limit_mib = memory_limit_mib
        self.max_memory_limit_mib = memory_limit_mib << MEMORY_LIMIT_DOUBLINGS
        self.on_memory_limit = on_memory_limit  # told each limit in MiB, the first at construction
        self.con: duckdb.DuckDBPyConnection | None = None
        self._opened_at = 0.0
        if on_memory_limit is not None:
            on_memory_limit(memory_limit_mib)

    def __enter__(self) -> duckdb.DuckDBPyConnection:
        if self.con is None:
            self.con = self._take()
            self._opened_at = time.monotonic()
        return self.con

    def _take(self) -> duckdb.DuckDBPyConnection:
        """The file, however long another process holds it: a reader (`tailwatch sql`, a
        report, someone's DuckDB shell) between two releases may take minutes, and the
        worker cannot checkpoint without the file, but giving up would stop it for the
        length of a query. It waits, warning each LOCK_WARN_S; told to stop, it waits
        STOP_WAIT_S more, then raises StoreBusy."""
        began = warned = time.monotonic()
        stop_seen = None
        while True:
            try:
                return connect(self.path, wait_s=1.0, memory_limit_mib=self.memory_limit_mib)
            except StoreBusy as exc:
                now = time.monotonic()
                if self.stopping():
                    stop_seen = stop_seen or now
                    if now - stop_seen >= self.STOP_WAIT_S:
                        raise StoreBusy(f"{exc}: stopping without writing to it; the next start resumes from its "
                                        "last checkpoint") from None
                elif now - warned >= self.LOCK_WARN_S:
                    log.warning("%s for %.0f s: the worker waits for it (no checkpoint meanwhile)", exc, now - began)
                    warned = now

    def run(self, work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """`work(con)`: a transaction that rolls itself back when it fails, or reads. One that
        runs out of DuckDB's memory limit runs again with the limit doubled, up to
        `max_memory_limit_mib`, so that a checkpoint too big for the limit (a long backlog
        at a big fleet) is not a crash at every restart; the raise is logged and kept."""
        while True:
            with self as con:
                try:
                    return work(con)
                except duckdb.OutOfMemoryException:
                    if self.memory_limit_mib >= self.max_memory_limit_mib:
                        raise
                    self.memory_limit_mib *= 2
                    self._tell_limit(con, self.memory_limit_mib)
                    log.warning("store %s: a checkpoint or lookup needed more than DuckDB's memory limit; raised to %d MiB "
                                "(at most %d; --store-memory-limit sets where it starts)", self.path,
                                self.memory_limit_mib, self.max_memory_limit_mib)

    def start(self, work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """Start-up's `work(con)` (restoring the worker's state, rebuilding its stages) with the
        limit at its ceiling: it fills Python state as it reads, so it cannot be run again the
        way `run` runs a checkpoint, and a restart at the same limit would fail the same way.
        Then the limit is back where checkpoints start (the blocks start-up cached are let go)."""
        with self as con:
            self._tell_limit(con, self.max_memory_limit_mib)
            result = work(con)
            try:
                self._tell_limit(con, self.memory_limit_mib)
            except duckdb.OutOfMemoryException:  # pinned by something still open: the next connection sets it
                self.close()
            return result

    def _tell_limit(self, con: duckdb.DuckDBPyConnection, mib: int) -> None:
        con.execute(f"SET memory_limit = '{mib}MiB'")
        if self.on_memory_limit is not None:
            self.on_memory_limit(mib)

    def __exit__(self, *exc) -> None:
        self.release_if_due()

    def release_if_due(self) -> None:
        """Called after each checkpoint and from the idle loop, so an idle worker lets go too."""
        if self.con is not None and time.monotonic() - self._opened_at >= self.release_every_s:
            self.close()

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    def cache_bytes(self) -> int:
        """What DuckDB's buffer pool holds for the open file (0 while it is let go)."""
        if self.con is None:
            return 0
        try:
            return int(self.con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()").fetchone()[0])
        except duckdb.Error:
            return 0
