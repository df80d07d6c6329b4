"""The runtime's store sink: the DuckDB store, the stages fed from it, and their pages.

It owns the store file (one process at a time, store/lock.py), rebuilds the operator's
state and every stage's from it on start, and commits each checkpoint in one transaction:
the operator's closed minutes, open state, dead letters and offsets, every stage's rows
for the same minutes, and what each Alertmanager has taken since the last mark. Only then
is what the stages raised handed to their outboxes, which it delivers from the loop.
"""

from __future__ import annotations

import time

import duckdb
import polars as pl

from tailwatch import store
from tailwatch.streams.metrics import CpuAccount
from tailwatch.streams.rollup import RollUp, topics_ready
from tailwatch.streams.stages import Stage
from tailwatch.store.lock import StoreLock


class StoreSink:
    def __init__(self, path: str, release_s: float, stages: list[Stage], cpu: CpuAccount,
                 rollup: RollUp | None = None, memory_limit_mib: int = store.STORE_MEMORY_LIMIT_MIB,
                 on_memory_limit=None, stopping=lambda: False):
        self.path = path
        self.stopping = stopping  # the worker was told to stop: waits for the file are cut short
        self.memory_limit_mib = memory_limit_mib
        self.on_memory_limit = on_memory_limit  # told the store's memory limit in MiB, and each raise
        self.rollup = rollup
        self._rollup_checked_hours: tuple = ()
        self.release_s = release_s
        self.stages = stages
        self.outboxes = [s.alerts for s in stages if s.alerts is not None]
        self.cpu = cpu
        self._lock = StoreLock(path)
        self.session: store.StoreSession | None = None

    def open(self, restore) -> None:
        """Take the file, let `restore(con)` put the operator back, rebuild every stage."""
        self._lock.acquire()
        try:
            self.session = store.StoreSession(self.path, self.release_s, self.memory_limit_mib, self.on_memory_limit,
                                              self.stopping)

            def start(con) -> None:
                restore(con)
                for stage in self.stages:
                    stage.rebuild(con)

            try:
                self.session.start(start)
            except duckdb.Error as exc:  # out of memory at the ceiling, a broken file: one line
                raise store.store_failure(self.path, exc) from None
        except BaseException:
            self.close()
            raise

    def commit(self, cp: store.Checkpoint) -> None:
        """Run the stages on the checkpoint's closed minutes and write it all in one
        transaction; then hand out what the stages raised."""
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
        for outbox in self.outboxes:
            cp.stage_rows.extend(outbox.delivery_rows())
        if self.rollup is not None and topics_ready(cp.topics):
            # Old minutes fall due only when a new hour closes in either table (or the last roll
            # stopped at its limit).
            hours = tuple(int(f["window_start"].dt.epoch("s").max()) // 3600 if f.height else None
                          for f in (closed.get("sli_minute"), closed.get("gpu_minute")) if f is not None)
            if hours != self._rollup_checked_hours and any(h is not None for h in hours) or self.rollup.behind:
                self._rollup_checked_hours = hours
                cp.upkeep.append(self.rollup.roll)
        began = self.cpu.began()
        try:
            self.session.run(lambda con: store.write_checkpoint(con, cp))
        except duckdb.Error as exc:  # the disk filled, the file broke: one line, not a traceback
            raise store.store_failure(self.path, exc) from None
        self.cpu.spent("checkpoint_write", began)
        for stage in self.stages:
            stage.committed()

    def _resolve_late(self, cp: store.Checkpoint) -> pl.DataFrame | None:
        """Late events of closed minutes against the store (streams/corrections.py): the
        request rows they add, for the stages, or None."""
        if all(t.late is None for t in cp.topics):
            return None
        began = self.cpu.began()
        delta = None
        try:
            for t in cp.topics:
                if t.late is not None:
                    t.corrected = self.session.run(lambda con: t.late.resolve(con, t.seen))
                    if t.table == "sli_minute" and t.corrected.delta.height:
                        delta = t.corrected.delta
        except duckdb.Error as exc:
            raise store.store_failure(self.path, exc) from None
        self.cpu.spent("corrections", began)
        return delta

    def tick(self, deliver: bool) -> None:
        """From the loop: deliver pages (when `deliver`), let go of the file for readers when due."""
        if deliver:
            for outbox in self.outboxes:
                outbox.deliver()
        self.session.release_if_due()

    def drain(self, wait_s: float, record: bool = True) -> None:
        """At exit: wait up to `wait_s` for the outboxes' senders, then record what they
        delivered (a restart resends only what is past these marks)."""
        deadline = time.monotonic() + wait_s
        for outbox in self.outboxes:
            outbox.deliver(max(0.0, deadline - time.monotonic()))
        marks = [row for outbox in self.outboxes for row in outbox.delivery_rows()]
        if marks and record:
            with self.session as con:
                store.write_checkpoint(con, store.Checkpoint(topics=[], next_offsets={}, stage_rows=marks))

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        self._lock.release()
