"""The DuckDB store: contract tables, and the worker's checkpoint in the same file.

`sli_minute`, `gpu_minute` and `dead_letter` are the contract that dashboards, reports
and users' SQL read. The `_tw_*` tables are the worker's own: the Kafka offsets it has
consumed up to, per-partition watermarks, and the partial state of still-open minutes.
A checkpoint writes all of them in one transaction, so after a crash the store holds
exactly the buckets and state that match the offsets it resumes from.
"""

from __future__ import annotations

import io
import logging
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from tailwatch.conventions import SLICE_LABELS


log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_STORE = "data/tailwatch.duckdb"

_HIST = "STRUCT(bin SMALLINT, n BIGINT)[]"
_STAGE_HIST = "STRUCT(stage VARCHAR, bin SMALLINT, n BIGINT)[]"

# Language and voice slices (rows from before them are the slices without: ''), the
# finalization latency histogram and the quality counts (what each counts: streams/aggregates.py).
# What eval.v1 records add to their slice-minute (schema 5). successful_audio_ms: audio of
# ok attempts in milliseconds, the unit of cost per successful audio minute (schema 6).
EVAL_COUNTS = ("evals", "word_errors", "reference_words", "char_errors", "reference_chars", "mos_samples", "mos_milli")
QUALITY_COUNTS = ("rejected_quota", "ooms", "partial_revisions", "asr_partials_reported", "endpointing_errors",
                   "endpointing_reported", "underruns", "underrun_streams", "underrun_reported", "voice_cache_hits",
                   "voice_cache_lookups", "fallbacks", "cached_prompt_tokens", "draft_tokens", "accepted_tokens",
                   *EVAL_COUNTS, "successful_audio_ms")
_SPEECH_AND_QUALITY = "\n".join([
    "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS language VARCHAR DEFAULT '';",
    "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS voice VARCHAR DEFAULT '';",
    f"ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS finalization_ms_hist {_HIST};",
    *[f"ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS finalization_ms_{q} DOUBLE;" for q in ("p50", "p95", "p99")],
    *[f"ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS {c} BIGINT DEFAULT 0;" for c in QUALITY_COUNTS],
]) + "\n"

SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS sli_minute (
    window_start TIMESTAMP NOT NULL,
    tenant VARCHAR, model VARCHAR, model_version VARCHAR, zone VARCHAR, workload VARCHAR,
    traffic_class VARCHAR, deployment VARCHAR, pool VARCHAR,
    requests BIGINT, ok BIGINT, errors BIGINT, timeouts BIGINT, shed BIGINT, cancelled BIGINT,
    retries BIGINT, turns BIGINT, successful_turns BIGINT,
    prompt_tokens BIGINT, output_tokens BIGINT, audio_seconds DOUBLE, gpu_seconds DOUBLE,
    queue_ms_hist {_HIST}, queue_ms_p50 DOUBLE, queue_ms_p95 DOUBLE, queue_ms_p99 DOUBLE,
    first_output_ms_hist {_HIST}, first_output_ms_p50 DOUBLE, first_output_ms_p95 DOUBLE, first_output_ms_p99 DOUBLE,
    e2e_ms_hist {_HIST}, e2e_ms_p50 DOUBLE, e2e_ms_p95 DOUBLE, e2e_ms_p99 DOUBLE,
    inter_token_ms_hist {_HIST}, inter_token_ms_p50 DOUBLE, inter_token_ms_p95 DOUBLE, inter_token_ms_p99 DOUBLE,
    streams BIGINT, streams_completed BIGINT, streams_cut BIGINT, streams_timed_out BIGINT, streams_cancelled BIGINT,
    stages_hist {_STAGE_HIST}
);
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS inter_token_ms_hist {_HIST};
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS inter_token_ms_p50 DOUBLE;
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS inter_token_ms_p95 DOUBLE;
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS inter_token_ms_p99 DOUBLE;
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS streams BIGINT;
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS streams_completed BIGINT;
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS streams_cut BIGINT;
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS streams_timed_out BIGINT;
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS streams_cancelled BIGINT;
ALTER TABLE sli_minute ADD COLUMN IF NOT EXISTS stages_hist {_STAGE_HIST};
{_SPEECH_AND_QUALITY.format(table="sli_minute")}CREATE TABLE IF NOT EXISTS gpu_minute (
    window_start TIMESTAMP NOT NULL, node VARCHAR, gpu_index INTEGER, zone VARCHAR, pool VARCHAR,
    gpu_sku VARCHAR, model VARCHAR, model_version VARCHAR, samples BIGINT,
    util_pct_mean DOUBLE, util_pct_max DOUBLE, mem_used_bytes_max BIGINT, mem_total_bytes BIGINT,
    power_w_mean DOUBLE, temp_c_max DOUBLE, xid_errors BIGINT, ecc_errors BIGINT,
    queue_depth_max BIGINT, oldest_queue_age_ms_max DOUBLE, running_max BIGINT,
    active_streams_max BIGINT, kv_cache_usage_max DOUBLE, preemptions BIGINT, replica_state VARCHAR,
    sm_active_pct_mean DOUBLE, sm_occupancy_pct_mean DOUBLE, tensor_active_pct_mean DOUBLE, dram_bw_pct_mean DOUBLE,
    sources VARCHAR, gr_engine_active_pct_mean DOUBLE
);
ALTER TABLE gpu_minute ADD COLUMN IF NOT EXISTS sm_active_pct_mean DOUBLE;
ALTER TABLE gpu_minute ADD COLUMN IF NOT EXISTS sm_occupancy_pct_mean DOUBLE;
ALTER TABLE gpu_minute ADD COLUMN IF NOT EXISTS tensor_active_pct_mean DOUBLE;
ALTER TABLE gpu_minute ADD COLUMN IF NOT EXISTS dram_bw_pct_mean DOUBLE;
ALTER TABLE gpu_minute ADD COLUMN IF NOT EXISTS sources VARCHAR;
ALTER TABLE gpu_minute ADD COLUMN IF NOT EXISTS gr_engine_active_pct_mean DOUBLE;
CREATE TABLE IF NOT EXISTS dead_letter (
    ts TIMESTAMP, source_topic VARCHAR, source_partition INTEGER, source_offset BIGINT,
    reason VARCHAR, detail VARCHAR, size_bytes BIGINT, sha256 VARCHAR
);
ALTER TABLE dead_letter ADD COLUMN IF NOT EXISTS sha256 VARCHAR;
CREATE TABLE IF NOT EXISTS slo_status (
    window_start TIMESTAMP, slo VARCHAR, slice VARCHAR, sli DOUBLE, error_budget_remaining DOUBLE,
    minutes_to_exhaustion DOUBLE, burn_rates STRUCT("window" VARCHAR, burn_rate DOUBLE)[], firing INTEGER
);
CREATE TABLE IF NOT EXISTS alerts (
    fingerprint VARCHAR, alertname VARCHAR, severity VARCHAR, slo VARCHAR, alert_window VARCHAR,
    labels VARCHAR, fired_at TIMESTAMP, resolved_at TIMESTAMP,
    long_burn_rate DOUBLE, short_burn_rate DOUBLE, error_budget_remaining DOUBLE
);
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS detail VARCHAR;
-- Hours rolled up from minutes older than the retention (streams/rollup.py).
CREATE TABLE IF NOT EXISTS sli_hour AS FROM sli_minute LIMIT 0;
ALTER TABLE sli_hour ADD COLUMN IF NOT EXISTS gpu_seconds_attributed DOUBLE;
ALTER TABLE sli_hour ADD COLUMN IF NOT EXISTS minutes BIGINT;
{_SPEECH_AND_QUALITY.format(table="sli_hour")}CREATE TABLE IF NOT EXISTS gpu_hour AS FROM gpu_minute LIMIT 0;
ALTER TABLE gpu_hour ADD COLUMN IF NOT EXISTS gpu_minutes BIGINT;
ALTER TABLE gpu_hour ADD COLUMN IF NOT EXISTS gr_engine_active_pct_mean DOUBLE;
CREATE TABLE IF NOT EXISTS attribution_minute (
    minute TIMESTAMP, pool VARCHAR, reported_gpu_seconds DOUBLE, fleet_gpu_seconds DOUBLE, attribution_scale DOUBLE
);
CREATE TABLE IF NOT EXISTS rolled_minute (window_start TIMESTAMP, requests BOOLEAN, gpu BOOLEAN);
CREATE TABLE IF NOT EXISTS _tw_offsets (
    topic VARCHAR, part INTEGER, next_offset BIGINT, watermark_ms BIGINT, PRIMARY KEY (topic, part)
);
CREATE TABLE IF NOT EXISTS _tw_alert_outbox (stage VARCHAR, seq BIGINT, payload VARCHAR);
CREATE TABLE IF NOT EXISTS _tw_alert_delivered (stage VARCHAR, seq BIGINT);
ALTER TABLE _tw_alert_delivered ADD COLUMN IF NOT EXISTS target VARCHAR;
CREATE TABLE IF NOT EXISTS _tw_frontier (topic VARCHAR PRIMARY KEY, closed_before_minute BIGINT);
CREATE TABLE IF NOT EXISTS _tw_assembly (
    source_topic VARCHAR, sli_partition INTEGER, source_partition INTEGER, closed_before_minute BIGINT,
    watermark_ms BIGINT, read_to_end BOOLEAN, drained BOOLEAN, PRIMARY KEY (source_topic, sli_partition, source_partition)
);
CREATE TABLE IF NOT EXISTS _tw_open_counts (topic VARCHAR, minute BIGINT, payload BLOB);
CREATE TABLE IF NOT EXISTS _tw_open_hist (topic VARCHAR, minute BIGINT, payload BLOB);
CREATE TABLE IF NOT EXISTS _tw_open_seen (topic VARCHAR, minute BIGINT, hashes BLOB);
CREATE TABLE IF NOT EXISTS _tw_label_limits (topic VARCHAR PRIMARY KEY, state BLOB);
"""


# The store's schema version. Version 1 is every store written before the store carried one
# (its tables are SCHEMA_SQL's, which only ever adds). A store is migrated up at the writer's
# start, one step at a time, in one transaction; a store from a newer release is refused.
SCHEMA_VERSION = 6
MIGRATIONS: dict[int, str] = {  # version → the SQL that brings version - 1 to it (after SCHEMA_SQL)
    2: "CREATE TABLE IF NOT EXISTS _tw_schema (version INTEGER NOT NULL)",
    3: "SELECT 1",  # the hour tables (sli_hour, gpu_hour, attribution_minute, rolled_minute): in SCHEMA_SQL
    4: "SELECT 1",  # language and voice slices, finalization_ms, the quality counts: in SCHEMA_SQL
    5: "SELECT 1",  # the evaluation counts (EVAL_COUNTS), added with the quality counts in SCHEMA_SQL
    6: "SELECT 1",  # successful_audio_ms, added with the quality counts in SCHEMA_SQL
}


class StoreError(Exception):
    """The store cannot be opened or written (a one-line message for the user)."""


class StoreBusy(StoreError):
    """Another process holds the store's file (DuckDB's lock) past the wait."""


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The version a store was written at (1: before stores carried one; 0: an empty file)."""
    tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "_tw_schema" in tables:
        row = con.execute("SELECT max(version) FROM _tw_schema").fetchall()[0]
        if row[0] is not None:
            return int(row[0])
    return 1 if "sli_minute" in tables else 0


def _check_not_newer(path: str | Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StoreError(f"store {path} was written by a newer tailwatch (schema {version}; this release reads up to "
                         f"{SCHEMA_VERSION}): upgrade tailwatch, or give this one a --store of its own")


def migrate(con: duckdb.DuckDBPyConnection, path: str | Path) -> int:
    """Bring the store to SCHEMA_VERSION (creating it if empty); returns the version it had."""
    found = schema_version(con)
    _check_not_newer(path, found)
    if found == SCHEMA_VERSION:
        con.execute(SCHEMA_SQL)  # idempotent: tables a stage adds to a current store
        return found
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(SCHEMA_SQL)
        for version in range(max(found, 1) + 1, SCHEMA_VERSION + 1):
            con.execute(MIGRATIONS[version])
        con.execute("DELETE FROM _tw_schema")
        con.execute("INSERT INTO _tw_schema VALUES (?)", [SCHEMA_VERSION])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return found


# The worker's store is written in small transactions; DuckDB's default buffer pool (80% of
# RAM) would let its cache dwarf the worker's own state. A transaction's inserted rows and a
# query's working set must fit: 64 MiB failed a month bench's first checkpoint after its
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
        if read_only:
            _check_not_newer(path, schema_version(con))
        else:
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


@dataclass
class TopicCheckpoint:
    """What one topic contributes to a checkpoint."""

    topic: str
    table: str  # contract table for closed buckets
    closed: pl.DataFrame
    closed_minutes: list[int]
    counts: list[pl.DataFrame]
    hist: list[pl.DataFrame]
    seen: list[tuple[int, np.ndarray]]
    watermarks: dict[int, int]
    closed_before_minute: int | None
    backlogged: bool = False  # the topic has records left to read: a silence in it is not an absence
    # Late events of closed minutes (streams.corrections.LateEvents), resolved against the
    # store into `corrected` before the checkpoint is written.
    late: object | None = None
    corrected: Corrected | None = None
    # Dedupe hashes are kept this many minutes behind the closed frontier (the correction
    # horizon), so a late copy of an event a closed minute counted is known as one.
    keep_seen_minutes: int = 0
    # The cardinality limiter's state (streams/cardinality.py) where it changed; None: unchanged.
    label_limits: bytes | None = None


@dataclass
class Corrected:
    """Closed rows that late events changed: each replaces the row of its (window_start,
    slice) in the table, in the checkpoint's transaction."""

    rows: pl.DataFrame  # whole rows, as the minute would have closed with the late events in it
    delta: pl.DataFrame  # the late events alone, as rows (what the stages add)
    keys: tuple[str, ...]  # the slice labels that, with window_start, name a row
    seen: list[tuple[int, np.ndarray]]  # dedupe hashes of the events merged, by minute
    events: int  # late events merged
    duplicates: int  # late copies of events already counted


@dataclass
class Checkpoint:
    topics: list[TopicCheckpoint]
    next_offsets: dict[tuple[str, int], int]
    dead_letters: pl.DataFrame | None = None
    # (table, rows) from the stages (streams/stages.py), inserted BY NAME; `alerts` rows are
    # changes (ALERT_CHANGE_SCHEMA).
    stage_rows: list[tuple[str, pl.DataFrame]] = field(default_factory=list)
    # A tier-2 store: dead letters may arrive twice (tier 1 re-publishes after a crash),
    # and the assemblers' frontiers (source_topic, sli_partition, streams.partials.Frontier).
    dedupe_dead_letters: bool = False
    assembly_frontiers: list[tuple[str, int, object]] = field(default_factory=list)
    # Store upkeep run inside the same transaction, last (the roll-up of old minutes: streams/rollup.py).
    upkeep: list[Callable[[duckdb.DuckDBPyConnection], object]] = field(default_factory=list)


def _frame_blob(frame: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.write_ipc(buf, compression="lz4")
    return buf.getvalue()


def write_checkpoint(con: duckdb.DuckDBPyConnection, cp: Checkpoint) -> None:
    """One transaction: closed buckets, dead letters, open state deltas, offsets."""
    con.execute("BEGIN TRANSACTION")
    try:
        for t in cp.topics:
            if t.closed.height:
                con.register("_closed", t.closed.to_arrow())
                con.execute(f"INSERT INTO {t.table} BY NAME SELECT * FROM _closed")
                con.unregister("_closed")
            if t.corrected is not None and t.corrected.rows.height:
                _replace_rows(con, t.table, t.corrected)
            _append_open(con, t)
            if t.label_limits is not None:
                con.execute("INSERT OR REPLACE INTO _tw_label_limits VALUES (?, ?)", [t.topic, t.label_limits])
            if t.closed_before_minute is not None:
                # Closed minutes left memory with this checkpoint; their partial state goes too,
                # and their dedupe hashes once they pass the correction horizon.
                for table in ("_tw_open_counts", "_tw_open_hist"):
                    con.execute(f"DELETE FROM {table} WHERE topic = ? AND minute < ?", [t.topic, t.closed_before_minute])
                con.execute("DELETE FROM _tw_open_seen WHERE topic = ? AND minute < ?",
                            [t.topic, t.closed_before_minute - t.keep_seen_minutes])
            for p, wm in t.watermarks.items():
                con.execute(
                    "INSERT INTO _tw_offsets VALUES (?, ?, NULL, ?) ON CONFLICT (topic, part) "
                    "DO UPDATE SET watermark_ms = excluded.watermark_ms",
                    [t.topic, p, wm],
                )
            if t.closed_before_minute is not None:
                con.execute(
                    "INSERT INTO _tw_frontier VALUES (?, ?) ON CONFLICT (topic) "
                    "DO UPDATE SET closed_before_minute = excluded.closed_before_minute",
                    [t.topic, t.closed_before_minute],
                )
        if cp.dead_letters is not None and cp.dead_letters.height:
            letters = cp.dead_letters
            if cp.dedupe_dead_letters:
                letters = letters.unique(["source_topic", "source_partition", "source_offset"], keep="first",
                                         maintain_order=True)
            con.register("_dl", letters.to_arrow())
            if cp.dedupe_dead_letters:
                con.execute("INSERT INTO dead_letter BY NAME SELECT * FROM _dl WHERE NOT EXISTS (SELECT 1 FROM "
                            "dead_letter d WHERE d.source_topic = _dl.source_topic AND d.source_partition = "
                            "_dl.source_partition AND d.source_offset = _dl.source_offset)")
            else:
                con.execute("INSERT INTO dead_letter BY NAME SELECT * FROM _dl")
            con.unregister("_dl")
        for source_topic, q, f in cp.assembly_frontiers:
            con.execute("INSERT OR REPLACE INTO _tw_assembly VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [source_topic, q, f.source_partition, f.closed_before_minute, f.watermark_ms, f.read_to_end,
                         f.drained])
        for table, rows in cp.stage_rows:
            if table == "alerts" and rows.height:
                _write_alert_changes(con, rows)
            elif rows.height:
                con.register("_stage", rows.to_arrow())
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _stage")
                con.unregister("_stage")
        for task in cp.upkeep:
            task(con)
        for (topic, part), nxt in cp.next_offsets.items():
            con.execute(
                "INSERT INTO _tw_offsets VALUES (?, ?, ?, NULL) ON CONFLICT (topic, part) "
                "DO UPDATE SET next_offset = excluded.next_offset",
                [topic, part, nxt],
            )
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:  # a failed write (a full disk) may have ended the transaction already
            pass
        raise


def _replace_rows(con: duckdb.DuckDBPyConnection, table: str, corrected: Corrected) -> None:
    """Each corrected row replaces the stored row of its minute and slice (or is the first)."""
    con.register("_fix", corrected.rows.to_arrow())
    same = " AND ".join([f"{table}.window_start = _fix.window_start",
                         *[f"{table}.{k} IS NOT DISTINCT FROM _fix.{k}" for k in corrected.keys]])
    con.execute(f"DELETE FROM {table} USING _fix WHERE {same}")
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _fix")
    con.unregister("_fix")


def seen_hashes(con: duckdb.DuckDBPyConnection, topic: str, minutes: list[int]) -> dict[int, np.ndarray]:
    """The dedupe hashes the store keeps for these minutes of a topic (open or closed within
    the correction horizon), one sorted array per minute."""
    runs: dict[int, list[np.ndarray]] = {}
    for m, h in con.execute("SELECT minute, hashes FROM _tw_open_seen WHERE topic = ? AND minute IN "
                            "(SELECT unnest(?::BIGINT[]))", [topic, minutes]).fetchall():
        runs.setdefault(int(m), []).append(np.frombuffer(h, dtype="<u8").astype(np.uint64))
    return {m: np.sort(np.concatenate(r)) for m, r in runs.items()}


def rows_of_minutes(con: duckdb.DuckDBPyConnection, table: str, minutes: list[int]) -> pl.DataFrame:
    """Every row a bucket table holds for these minutes (epoch minutes)."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    return query_frame(con, f"SELECT * FROM {table} WHERE window_start IN "
                            "(SELECT make_timestamp(unnest($1::BIGINT[]) * 60000000))", [minutes])


# The `alerts` rows of a checkpoint are changes, not rows: a fired alert is inserted, a
# resolved one closes the open row of its fingerprint. In the order they happened.
ALERT_CHANGE_SCHEMA = {
    "state": pl.String, "fingerprint": pl.String, "alertname": pl.String, "severity": pl.String, "slo": pl.String,
    "alert_window": pl.String, "labels": pl.String, "at": pl.Datetime("us"), "long_burn_rate": pl.Float64,
    "short_burn_rate": pl.Float64, "error_budget_remaining": pl.Float64, "detail": pl.String,
}
_FIRED_COLUMNS = ("fingerprint", "alertname", "severity", "slo", "alert_window", "labels", "fired_at",
                  "long_burn_rate", "short_burn_rate", "error_budget_remaining", "detail")


def _write_alert_changes(con: duckdb.DuckDBPyConnection, changes: pl.DataFrame) -> None:
    """Fired alerts inserted and resolved ones closed, a statement per kind rather than per
    alert (an outage that pages every slice at once changes tens of thousands). In runs
    where no fingerprint repeats, so that a fire, resolve and fire again of one alert in
    the same checkpoint land in that order."""
    fingerprints = changes["fingerprint"].to_list()
    start, in_run = 0, set()
    for i, fp in enumerate(fingerprints):
        if fp in in_run:
            _write_alert_run(con, changes.slice(start, i - start))
            start, in_run = i, set()
        in_run.add(fp)
    _write_alert_run(con, changes.slice(start))


def _write_alert_run(con: duckdb.DuckDBPyConnection, run: pl.DataFrame) -> None:
    fired = run.filter(pl.col("state") == "firing").rename({"at": "fired_at"}).select(_FIRED_COLUMNS)
    resolved = run.filter(pl.col("state") != "firing").select("fingerprint", "at")
    # Most checkpoints change one alert or none: a statement with parameters takes a third
    # of the time of registering an Arrow table (0.5 against 1.4 ms in DuckDB 2.0).
    if fired.height == 1:
        con.execute(f"INSERT INTO alerts ({', '.join(_FIRED_COLUMNS)}) VALUES ({', '.join('?' * len(_FIRED_COLUMNS))})",
                    list(fired.row(0)))
    elif fired.height:
        con.register("_fired", fired.to_arrow())
        con.execute("INSERT INTO alerts BY NAME SELECT * FROM _fired")
        con.unregister("_fired")
    if resolved.height == 1:
        fp, at = resolved.row(0)
        con.execute("UPDATE alerts SET resolved_at = ? WHERE fingerprint = ? AND resolved_at IS NULL", [at, fp])
    elif resolved.height:
        con.register("_resolved", resolved.to_arrow())
        con.execute("UPDATE alerts SET resolved_at = r.at FROM _resolved r "
                    "WHERE alerts.fingerprint = r.fingerprint AND alerts.resolved_at IS NULL")
        con.unregister("_resolved")


def _append_open(con: duckdb.DuckDBPyConnection, t: TopicCheckpoint) -> None:
    """Deltas of open-minute state since the last checkpoint, for the minutes still open
    after it (a minute that closes in this checkpoint is in its closed rows): one blob per
    table and checkpoint, whatever the number of minutes, stored under its newest minute so
    that it is deleted once every minute in it has closed (the restore skips closed ones).
    The cost follows what changed, not how many minutes are open."""
    frontier = t.closed_before_minute if t.closed_before_minute is not None else -(2**62)
    kept_from = frontier - t.keep_seen_minutes
    for table, frames in (("_tw_open_counts", t.counts), ("_tw_open_hist", t.hist)):
        frames = [f for f in frames if f.height]
        if not frames:
            continue
        merged = pl.concat(frames, how="diagonal_relaxed").filter(pl.col("_minute") >= frontier)
        if merged.height:
            con.execute(f"INSERT INTO {table} VALUES (?, ?, ?)", [t.topic, int(merged["_minute"].max()), _frame_blob(merged)])
    merged_late = t.corrected.seen if t.corrected is not None else []
    seen = [(minute, hashes.astype("<u8").tobytes()) for minute, hashes in [*t.seen, *merged_late] if minute >= kept_from]
    if seen:
        # One insert for every run: a batch of thin traffic leaves runs in tens of minutes,
        # and a statement per run cost more than the runs' bytes.
        runs = pa.table({"topic": [t.topic] * len(seen), "minute": [m for m, _ in seen], "hashes": [b for _, b in seen]},
                        schema=pa.schema([("topic", pa.string()), ("minute", pa.int64()), ("hashes", pa.binary())]))
        con.register("_runs", runs)
        con.execute("INSERT INTO _tw_open_seen BY NAME SELECT * FROM _runs")
        con.unregister("_runs")


def _load_blobs(con: duckdb.DuckDBPyConnection, table: str, topic: str) -> list[pl.DataFrame]:
    rows = con.execute(f"SELECT payload FROM {table} WHERE topic = ?", [topic]).fetchall()
    return [pl.read_ipc(io.BytesIO(r[0])) for r in rows]


@dataclass
class RestoredTopic:
    counts: list[pl.DataFrame]
    hist: list[pl.DataFrame]
    seen: list[tuple[int, np.ndarray]]
    watermarks: dict[int, int]
    closed_before_minute: int | None


def load_topic_state(con: duckdb.DuckDBPyConnection, topic: str) -> RestoredTopic:
    row = con.execute("SELECT closed_before_minute FROM _tw_frontier WHERE topic = ?", [topic]).fetchall()
    row = row[0] if row else None
    closed = int(row[0]) if row and row[0] is not None else None
    # Hashes of closed minutes stay in the store for corrections (`seen_hashes`), not in memory.
    seen = [
        (int(m), np.frombuffer(h, dtype="<u8").astype(np.uint64))
        for m, h in con.execute("SELECT minute, hashes FROM _tw_open_seen WHERE topic = ? AND minute >= ?",
                                [topic, closed if closed is not None else -(2**62)]).fetchall()
    ]
    wms = {
        int(p): int(w)
        for p, w in con.execute(
            "SELECT part, watermark_ms FROM _tw_offsets WHERE topic = ? AND watermark_ms IS NOT NULL", [topic]
        ).fetchall()
    }
    return RestoredTopic(
        counts=_load_blobs(con, "_tw_open_counts", topic),
        hist=_load_blobs(con, "_tw_open_hist", topic),
        seen=seen,
        watermarks=wms,
        closed_before_minute=closed,
    )


def load_label_limits(con: duckdb.DuckDBPyConnection, topic: str) -> bytes | None:
    """The cardinality limiter's state as the last checkpoint left it (None: none stored)."""
    row = con.execute("SELECT state FROM _tw_label_limits WHERE topic = ?", [topic]).fetchone()
    return None if row is None else bytes(row[0])


def load_assembly(con: duckdb.DuckDBPyConnection, source_topic: str) -> tuple[int | None, list[tuple]]:
    """A tier-2 store's assembly state of one source topic: the first minute not landed
    yet, and the frontier rows (sli_partition, source_partition, closed_before_minute,
    watermark_ms, read_to_end, drained)."""
    row = con.execute("SELECT closed_before_minute FROM _tw_frontier WHERE topic = ?", [source_topic]).fetchone()
    marks = con.execute("SELECT sli_partition, source_partition, closed_before_minute, watermark_ms, read_to_end, "
                        "drained FROM _tw_assembly WHERE source_topic = ?", [source_topic]).fetchall()
    return (int(row[0]) if row and row[0] is not None else None), marks


def newest_minute(con: duckdb.DuckDBPyConnection, table: str) -> int | None:
    """The newest minute (epoch minutes) a bucket table holds rows of."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    row = con.execute(f"SELECT epoch(max(window_start)) FROM {table}").fetchall()[0]
    return int(row[0]) // 60 if row and row[0] is not None else None


def oldest_minute(con: duckdb.DuckDBPyConnection, table: str) -> int | None:
    """The oldest minute (epoch minutes) a bucket table holds rows of."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    row = con.execute(f"SELECT epoch(min(window_start)) FROM {table}").fetchall()[0]
    return int(row[0]) // 60 if row and row[0] is not None else None


def selector_rows(con: duckdb.DuckDBPyConnection, selector: dict[str, str]) -> int:
    """How many rows of `sli_minute` an SLO's selector picks (label names as the spec checked
    them against conventions.SLICE_LABELS)."""
    labels = [label for label in selector if label in SLICE_LABELS]
    where = " AND ".join(f'"{label}" = ?' for label in labels) or "TRUE"
    return int(con.execute(f"SELECT count(*) FROM sli_minute WHERE {where}",
                           [selector[k] for k in labels]).fetchall()[0][0])


def has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether the store has this table (a store of an older release, opened read-only, may not)."""
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]).fetchall()[0][0])


def recent_buckets(con: duckdb.DuckDBPyConnection, minutes: int, table: str = "sli_minute") -> pl.DataFrame:
    """Rows of the newest `minutes` minutes of `sli_minute` or `gpu_minute` (what SLO
    state and the signal API's view are rebuilt from)."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    return query_frame(
        con, f"SELECT * FROM {table} WHERE window_start >= (SELECT max(window_start) FROM {table}) - to_minutes($1)",
        [minutes])


# Rows of a bucket table read at once when a stage's state is rebuilt from it: a fleet's
# six hours (100,000 busy slices: 36 million rows, histograms included) do not fit in memory.
BUCKET_CHUNK_ROWS = 200_000


@dataclass(frozen=True)
class BucketPiece:
    """Rows of a bucket table to read in one go: the minutes [first_minute, end_minute), or,
    where one minute alone holds more than a piece may, share `part` of its `parts` shares."""

    first_minute: int
    end_minute: int
    part: int = 0
    parts: int = 1


def bucket_pieces(rows_by_minute: list[tuple[int, int]], max_rows: int) -> list[BucketPiece]:
    """Cut (minute, rows) counts, in minute order, into pieces of at most about `max_rows`
    rows: runs of whole minutes, and a minute over the limit in equal shares of its rows
    (each share its own piece, one after the other)."""
    pieces: list[BucketPiece] = []
    first, rows = None, 0
    for minute, n in rows_by_minute:
        if first is not None and rows + n > max_rows:
            pieces.append(BucketPiece(first, minute))
            first, rows = None, 0
        if n > max_rows:
            parts = -(-n // max_rows)
            pieces += [BucketPiece(minute, minute + 1, part, parts) for part in range(parts)]
            continue
        if first is None:
            first = minute
        rows += n
    if first is not None:
        pieces.append(BucketPiece(first, rows_by_minute[-1][0] + 1))
    return pieces


def _rows_by_minute(con: duckdb.DuckDBPyConnection, table: str, since_minute: int) -> list[tuple[int, int]]:
    """(minute, rows) of a bucket table from `since_minute` on, in minute order."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    return [(int(m), int(n)) for m, n in con.execute(
        f"SELECT epoch(window_start)::BIGINT // 60 AS minute, count(*) FROM {table} "
        "WHERE window_start >= make_timestamp($1::BIGINT * 60000000) GROUP BY minute ORDER BY minute",
        [since_minute]).fetchall()]


def minute_runs(con: duckdb.DuckDBPyConnection, since_minute: int, max_rows: int = BUCKET_CHUNK_ROWS,
                table: str = "sli_minute") -> list[tuple[int, int | None]]:
    """[first, end) runs of whole minutes from `since_minute` on, each holding at most about
    `max_rows` rows of `table` (a minute that alone holds more is a run of its own), together
    covering every minute from `since_minute` on (the last run's end is None: open), so that
    rows of other tables in the same minutes are read with them."""
    pieces = bucket_pieces(_rows_by_minute(con, table, since_minute), max_rows)
    firsts = [since_minute, *sorted({p.first_minute for p in pieces if p.first_minute > since_minute})]
    return list(zip(firsts, [*firsts[1:], None]))


def bucket_runs(con: duckdb.DuckDBPyConnection, since_minute: int, request_columns: str = "*",
                max_rows: int = BUCKET_CHUNK_ROWS) -> Iterator[tuple[int, int | None, pl.DataFrame, pl.DataFrame]]:
    """(first, end, sli_minute rows, gpu_minute rows) of `minute_runs` from `since_minute` on,
    in event-time order: both tables' rows of the same whole minutes, at most about `max_rows`
    request rows at a time, for a stage that rebuilds from them as the minutes closed."""
    for lo, hi in minute_runs(con, since_minute, max_rows=max_rows):
        within = "window_start >= $1" + ("" if hi is None else " AND window_start < $2")
        bounds = [_minute_utc(lo)] + ([] if hi is None else [_minute_utc(hi)])
        yield (lo, hi, query_frame(con, f"SELECT {request_columns} FROM sli_minute WHERE {within}", bounds),
               query_frame(con, f"SELECT * FROM gpu_minute WHERE {within}", bounds))


def _minute_utc(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, tz=timezone.utc).replace(tzinfo=None)


def recent_bucket_chunks(con: duckdb.DuckDBPyConnection, minutes: int, table: str = "sli_minute",
                         max_rows: int = BUCKET_CHUNK_ROWS) -> Iterator[pl.DataFrame]:
    """`recent_buckets`, in event-time order, at most about `max_rows` rows at a time (whole
    minutes, or shares of one minute's rows where it alone holds more): a month of a busy
    fleet's rows held at once took gigabytes to rebuild SLO windows from, and so did six hours
    of a big one. The rows of a minute read in shares come in consecutive frames."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    newest = newest_minute(con, table)
    if newest is None:
        return
    for piece in bucket_pieces(_rows_by_minute(con, table, newest - minutes), max_rows):
        # rowid: any split of the minute's rows serves (the SLO engine adds a minute's shares up).
        share = "" if piece.parts == 1 else f" AND rowid % {piece.parts} = {piece.part}"
        yield query_frame(con, f"SELECT * FROM {table} WHERE window_start >= make_timestamp($1::BIGINT * 60000000) "
                               f"AND window_start < make_timestamp($2::BIGINT * 60000000){share} ORDER BY window_start",
                          [piece.first_minute, piece.end_minute])


def query_frame(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pl.DataFrame:
    """A query's rows as a polars frame. Through `execute`, not `con.sql`: DuckDB 2 refuses
    relation queries on a connection whose previous result was not fetched to the end
    (a `fetchone()` anywhere before), while `execute` starts afresh."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Arrow output on a DB-API result")  # one extra copy: fine here
        return pl.from_arrow(con.execute(sql, params or []).to_arrow_table())


def load_offsets(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, int], int]:
    rows = con.execute("SELECT topic, part, next_offset FROM _tw_offsets WHERE next_offset IS NOT NULL").fetchall()
    return {(t, int(p)): int(o) for t, p, o in rows}
