"""The runtime's store sink: the DuckDB store and the stages fed from it.

It owns the store file (one process at a time, store/lock.py) and is the one part of the
runtime that reads and writes it: on start it rebuilds every stage's state from it and
reads the operator's (`restored`: the typed `store.checkpoint.Restored` the runtime hands
the operator, which never sees the store), and it commits each checkpoint in one transaction:
the operator's closed minutes, open state, dead letters and offsets, every stage's rows
for the same minutes, and what the other sinks added to it (what each Alertmanager has
taken since the last mark, streams/alert_sink.py). Only once every sink has committed is
what the stages raised handed to their outboxes.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl

from tailwatch.store.checkpoint import (Checkpoint, Restored, RestoreScope, StoredMinutes, load_restored,
                                        write_checkpoint)
from tailwatch.store.connection import DEFAULT_STORE, STORE_MEMORY_LIMIT_MIB, StoreBusy, StoreSession, store_failure
from tailwatch.streams.metrics import CpuAccount
from tailwatch.streams.rollup import RollUp, topics_ready
from tailwatch.streams.sink import Sink
from tailwatch.streams.stages import Stage
from tailwatch.store.lock import StoreLock


@dataclass
class StoreSettings:
    """The store sink's share of the worker's settings (streams/tiers.py derives it)."""

    path: str = DEFAULT_STORE
    release_s: float = 20.0  # how often the worker lets go of the DuckDB file for readers
    memory_limit_mib: int = STORE_MEMORY_LIMIT_MIB  # DuckDB's buffer pool for the store, to start with


class StoreSink(Sink):
    name = "store"
    holds_resume_state = True
    held_errors = (StoreBusy,)

    def __init__(self, settings: StoreSettings, stages: list[Stage], cpu: CpuAccount,
                 rollup: RollUp | None = None, on_memory_limit=None, stopping=lambda: False):
        self.settings = settings
        self.path = settings.path
        self.stopping = stopping  # the worker was told to stop: waits for the file are cut short
        self.on_memory_limit = on_memory_limit  # told the store's memory limit in MiB, and each raise
        self.rollup = rollup
        self._rollup_checked_hours: tuple = ()
        self.stages = stages
        self.cpu = cpu
        self._lock = StoreLock(self.path)
        self.session: StoreSession | None = None

    def open(self) -> None:
        """Take the file and rebuild every stage from it."""
        self._lock.acquire()
        try:
            self.session = StoreSession(self.path, self.settings.release_s, self.settings.memory_limit_mib,
                                        self.on_memory_limit, self.stopping)
            self._start(lambda con: [stage.rebuild(con) for stage in self.stages])
        except BaseException:
            self.close()
            raise

    def restored(self, scope: RestoreScope) -> Restored:
        """What the operator's checkpoints left in the store, as far as `scope` names it."""
        return self._start(lambda con: load_restored(con, scope))

    def _start(self, work):
        try:
            return self.session.start(work)
        except duckdb.Error as exc:  # out of memory at the ceiling, a broken file: one line
            raise store_failure(self.path, exc) from None

    @property
    def outboxes(self) -> list:
        """The stages' Alertmanager outboxes (the Alertmanager sink delivers them)."""
        return [s.alerts for s in self.stages if s.alerts is not None]

    def collectors(self) -> list:
        return [c for stage in self.stages for c in stage.collectors()]

    def commit(self, cp: Checkpoint) -> None:
        """Run the stages on the checkpoint's closed minutes and write it all in one
        transaction. A checkpoint of no topics (the delivery marks at exit) is only written."""
        if not cp.topics:
            self._write(cp)
            return
        closed = {t.table: t.closed for t in cp.topics}
        # Minutes close over every partition, so each closed minute is whole: SLOs and
        # detectors run on it whichever partitions this worker owns right now.
        backlogged = frozenset(t.table for t in cp.topics if t.backlogged)
        corrected = self._resolve_late(cp)
        for stage in self.stages:
            began = self.cpu.began()
            # Past minutes first: the windows they correct are those the new minutes are judged on.
            if corrected is not None:
                for table, rows in stage.on_corrected(corrected).items():
                    cp.stage_rows.append((table, rows))
            if any(f.height for f in closed.values()):
                for table, rows in stage.on_closed(closed["sli_minute"], closed["gpu_minute"], backlogged).items():
                    cp.stage_rows.append((table, rows))
            self.cpu.spent(stage.name, began)
        if self.rollup is not None and topics_ready(cp.topics):
            # Old minutes fall due only when a new hour closes in either table (or the last roll
            # stopped at its limit).
            hours = tuple(int(f["window_start"].dt.epoch("s").max()) // 3600 if f.height else None
                          for f in (closed.get("sli_minute"), closed.get("gpu_minute")) if f is not None)
            if hours != self._rollup_checked_hours and any(h is not None for h in hours) or self.rollup.behind:
                self._rollup_checked_hours = hours
                cp.upkeep.append(self.rollup.roll)
        self._write(cp)

    def _write(self, cp: Checkpoint) -> None:
        began = self.cpu.began()
        try:
            self.session.run(lambda con: write_checkpoint(con, cp))
        except duckdb.Error as exc:  # the disk filled, the file broke: one line, not a traceback
            raise store_failure(self.path, exc) from None
        self.cpu.spent("checkpoint_write", began)

    def committed(self, cp: Checkpoint) -> None:
        """The checkpoint is durable: the stages hand out what it raised."""
        for stage in self.stages:
            stage.committed()

    def _resolve_late(self, cp: Checkpoint) -> pl.DataFrame | None:
        """Late events of closed minutes against the store (streams/corrections.py): the
        request rows they add, for the stages, or None."""
        if all(t.late is None for t in cp.topics):
            return None
        began = self.cpu.began()
        delta = None
        try:
            for t in cp.topics:
                if t.late is not None:
                    t.corrected = self.session.run(lambda con: t.late.resolve(StoredMinutes(con), t.seen))
                    if t.table == "sli_minute" and t.corrected.delta.height:
                        delta = t.corrected.delta
        except duckdb.Error as exc:
            raise store_failure(self.path, exc) from None
        self.cpu.spent("corrections", began)
        return delta

    def tick(self, caught_up: bool) -> None:
        """From the loop: let go of the file for readers when due."""
        self.session.release_if_due()

    def memory_holders(self) -> dict[str, object]:
        return {stage.name: stage for stage in self.stages}

    def cache_bytes(self) -> int:
        return self.session.cache_bytes() if self.session is not None else 0

    def describe(self) -> str:
        return f"store {self.path}"

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        self._lock.release()

