"""The store's tables and their migrations.

`sli_minute`, `gpu_minute` and `dead_letter` are the contract that dashboards, reports
and users' SQL read. The `_tw_*` tables are the worker's own: the Kafka offsets it has
consumed up to, per-partition watermarks, and the partial state of still-open minutes
(written by store/checkpoint.py). A store carries its schema version; a writer migrates it
up at start (store/connection.py), one step at a time, in one transaction.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from tailwatch.conventions import LATENCY_LOWER_FIELDS

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
    # Per latency field, the events known only as a runtime bucket (streams/minute_windows.py, `straddle_fields`).
    *[f"ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS {f}_straddle_hist {_HIST};" for f in LATENCY_LOWER_FIELDS],
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
ALTER TABLE slo_status ADD COLUMN IF NOT EXISTS sli_upper DOUBLE;
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
-- Tier 2 (streams/assembly.py): per tw.sli partition, how far the replica had read at its last
-- checkpoint, past its resume offset in _tw_offsets (the oldest record it held). The frontiers it
-- stored were read up to here; after a restart they stand for the partials before them only
-- once the re-read has come this far. A table of its own: a store of an earlier release gains
-- it at start, and that release, opened on this store, leaves it alone.
CREATE TABLE IF NOT EXISTS _tw_read_offsets (topic VARCHAR, part INTEGER, read_offset BIGINT, PRIMARY KEY (topic, part));
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


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The version a store was written at (1: before stores carried one; 0: an empty file)."""
    tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "_tw_schema" in tables:
        row = con.execute("SELECT max(version) FROM _tw_schema").fetchall()[0]
        if row[0] is not None:
            return int(row[0])
    return 1 if "sli_minute" in tables else 0


def migrate(con: duckdb.DuckDBPyConnection, path: str | Path) -> int:
    """Bring the store to SCHEMA_VERSION (creating it if empty); returns the version it had.
    A store of a newer release is refused before this (store.connection.connect)."""
    found = schema_version(con)
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
