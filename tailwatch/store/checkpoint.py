"""The worker's runtime state in the store: what a checkpoint writes in one transaction
(closed buckets, open minutes, dedupe hashes, offsets, stage rows, alert changes), and what
a start reads back from it.

A checkpoint writes all of it in one transaction, so after a crash the store holds exactly
the buckets and state that match the offsets it resumes from.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Callable

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from tailwatch.store.queries import newest_minute, query_frame

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
    # A tier-2 store: per tw.sli partition, the next offset read when the frontiers above were
    # (next_offsets holds the oldest record still held, where a restart re-reads from).
    read_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
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
            if t.label_limits is not None and not _updated(con, "UPDATE _tw_label_limits SET state = ? WHERE topic = ?",
                                                           [t.label_limits, t.topic]):
                con.execute("INSERT INTO _tw_label_limits VALUES (?, ?)", [t.topic, t.label_limits])
            if t.closed_before_minute is not None:
                # Closed minutes left memory with this checkpoint; their partial state goes too,
                # and their dedupe hashes once they pass the correction horizon.
                for table in ("_tw_open_counts", "_tw_open_hist"):
                    con.execute(f"DELETE FROM {table} WHERE topic = ? AND minute < ?", [t.topic, t.closed_before_minute])
                con.execute("DELETE FROM _tw_open_seen WHERE topic = ? AND minute < ?",
                            [t.topic, t.closed_before_minute - t.keep_seen_minutes])
        frontiers = [(t.topic, t.closed_before_minute) for t in cp.topics if t.closed_before_minute is not None]
        args = [[topic for topic, _ in frontiers], [m for _, m in frontiers]]
        if frontiers and _updated(con, "UPDATE _tw_frontier SET closed_before_minute = v.m FROM (SELECT "
                                  "unnest(?::VARCHAR[]) AS t, unnest(?::BIGINT[]) AS m) v WHERE _tw_frontier.topic = v.t",
                                  args) < len(frontiers):
            con.execute("INSERT INTO _tw_frontier SELECT * FROM (SELECT unnest(?::VARCHAR[]) AS t, unnest(?::BIGINT[]) AS m) v "
                        "WHERE NOT EXISTS (SELECT 1 FROM _tw_frontier f WHERE f.topic = v.t)", args)
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
        if cp.read_offsets:  # one statement, as the offsets below
            con.execute("INSERT OR REPLACE INTO _tw_read_offsets VALUES " + ", ".join(["(?, ?, ?)"] * len(cp.read_offsets)),
                        [v for (topic, part), read in cp.read_offsets.items() for v in (topic, part, read)])
        for table, rows in cp.stage_rows:
            if table == "alerts" and rows.height:
                _write_alert_changes(con, rows)
            elif rows.height:
                con.register("_stage", rows.to_arrow())
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _stage")
                con.unregister("_stage")
        for task in cp.upkeep:
            task(con)
        _set_offsets(con, cp.next_offsets, {(t.topic, p): wm for t in cp.topics for p, wm in t.watermarks.items()})
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:  # a failed write (a full disk) may have ended the transaction already
            pass
        raise


def _updated(con: duckdb.DuckDBPyConnection, statement: str, parameters: list) -> int:
    """The rows an UPDATE changed. Where the rows exist already (every checkpoint but a
    store's first few), an UPDATE costs DuckDB a third to a half of an upsert's time, which is
    most of what a checkpoint that closes nothing spends on frontiers, offsets and label caps."""
    return int(con.execute(statement, parameters).fetchone()[0])


def _set_offsets(con: duckdb.DuckDBPyConnection, next_offsets: dict[tuple[str, int], int],
                 watermarks: dict[tuple[str, int], int]) -> None:
    """Each (topic, partition)'s next offset and watermark in `_tw_offsets`, where given; one
    not given is left as it is (NULL in a new row). One statement for every partition: an
    upsert costs DuckDB some 2 ms however few its rows, and statements per partition were
    most of a thin checkpoint's time. An UPDATE first (`_updated`), then an insert of the
    partitions without a row yet, where some are."""
    keys = list(dict.fromkeys([*next_offsets, *watermarks]))
    if not keys:
        return
    args = [[t for t, _ in keys], [p for _, p in keys], [next_offsets.get(k) for k in keys], [watermarks.get(k) for k in keys]]
    if _updated(con, "UPDATE _tw_offsets SET next_offset = coalesce(v.n, _tw_offsets.next_offset), "
                "watermark_ms = coalesce(v.w, _tw_offsets.watermark_ms) FROM (SELECT unnest(?::VARCHAR[]) AS t, "
                "unnest(?::INTEGER[]) AS p, unnest(?::BIGINT[]) AS n, unnest(?::BIGINT[]) AS w) v "
                "WHERE _tw_offsets.topic = v.t AND _tw_offsets.part = v.p", args) == len(keys):
        return
    # Only the partitions without a row: DuckDB refuses an upsert of a row this transaction updated already.
    con.execute("INSERT INTO _tw_offsets (topic, part, next_offset, watermark_ms) SELECT * FROM (SELECT "
                "unnest(?::VARCHAR[]) AS t, unnest(?::INTEGER[]) AS p, unnest(?::BIGINT[]) AS n, unnest(?::BIGINT[]) AS w) v "
                "WHERE NOT EXISTS (SELECT 1 FROM _tw_offsets o WHERE o.topic = v.t AND o.part = v.p)", args)


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


class StoredMinutes:
    """The closed minutes a store holds, through one connection: what late events are
    resolved against (streams/corrections.py), inside the checkpoint's transaction."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con

    def seen_hashes(self, topic: str, minutes: list[int]) -> dict[int, np.ndarray]:
        return seen_hashes(self.con, topic, minutes)

    def rows_of_minutes(self, table: str, minutes: list[int]) -> pl.DataFrame:
        return rows_of_minutes(self.con, table, minutes)


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
    """Fired alerts inserted and resolved ones closed, in the order they happened, with one
    statement per kind rather than one per alert (an outage that pages every slice at once
    changes tens of thousands). Where a fingerprint changes more than once (a backlog's
    checkpoint fires and resolves the same few over and over), the changes are played here
    first: a resolve closes every row of its fingerprint open at that moment, those fired
    earlier in this checkpoint (inserted already closed) and, at the first resolve of the
    fingerprint, those open in the store (one UPDATE, before the inserts, so it cannot
    touch them)."""
    if changes["fingerprint"].is_unique().all():
        fired = changes.filter(pl.col("state") == "firing").rename({"at": "fired_at"}).select(_FIRED_COLUMNS)
        resolved = changes.filter(pl.col("state") != "firing").select("fingerprint", "at")
        _write_alert_rows(con, fired.with_columns(pl.lit(None, dtype=changes.schema["at"]).alias("resolved_at")),
                          dict(resolved.iter_rows()) if resolved.height < 2 else resolved)
        return
    fired_rows: list[dict] = []
    open_fired: dict[str, list[dict]] = {}  # fingerprint → rows fired here and still open
    close_stored: dict[str, object] = {}  # fingerprint → when its stored open rows close
    for change in changes.iter_rows(named=True):
        fp = change["fingerprint"]
        if change["state"] == "firing":
            row = {c: change[c] for c in _FIRED_COLUMNS if c != "fired_at"}
            row["fired_at"], row["resolved_at"] = change["at"], None
            fired_rows.append(row)
            open_fired.setdefault(fp, []).append(row)
        else:
            for row in open_fired.pop(fp, []):
                row["resolved_at"] = change["at"]
            close_stored.setdefault(fp, change["at"])
    schema = {**{c: changes.schema[c] for c in _FIRED_COLUMNS if c != "fired_at"},
              "fired_at": changes.schema["at"], "resolved_at": changes.schema["at"]}
    _write_alert_rows(con, pl.DataFrame(fired_rows, schema=schema).select(*_FIRED_COLUMNS, "resolved_at"),
                      close_stored if len(close_stored) < 2 else pl.DataFrame(
                          {"fingerprint": list(close_stored), "at": list(close_stored.values())},
                          schema={"fingerprint": pl.String, "at": changes.schema["at"]}))


def _write_alert_rows(con: duckdb.DuckDBPyConnection, fired: pl.DataFrame, resolved: dict | pl.DataFrame) -> None:
    """`resolved` (fingerprint → when, or a frame of fingerprint, at) closes the rows open in
    the store, then `fired` (with their `resolved_at`) are inserted."""
    # Most checkpoints change one alert or none: a statement with parameters takes a third
    # of the time of registering an Arrow table (0.5 against 1.4 ms in DuckDB 2.0).
    if isinstance(resolved, dict):
        for fp, at in resolved.items():
            con.execute("UPDATE alerts SET resolved_at = ? WHERE fingerprint = ? AND resolved_at IS NULL", [at, fp])
    else:
        con.register("_resolved", resolved.to_arrow())
        con.execute("UPDATE alerts SET resolved_at = r.at FROM _resolved r "
                    "WHERE alerts.fingerprint = r.fingerprint AND alerts.resolved_at IS NULL")
        con.unregister("_resolved")
    if fired.height == 1:
        con.execute(f"INSERT INTO alerts ({', '.join(fired.columns)}) VALUES ({', '.join('?' * fired.width)})",
                    list(fired.row(0)))
    elif fired.height:
        con.register("_fired", fired.to_arrow())
        con.execute("INSERT INTO alerts BY NAME SELECT * FROM _fired")
        con.unregister("_fired")


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
    """One topic's open minutes as the last checkpoint left them."""

    counts: list[pl.DataFrame]
    hist: list[pl.DataFrame]
    seen: list[tuple[int, np.ndarray]]
    watermarks: dict[int, int]
    closed_before_minute: int | None
    label_limits: bytes | None = None  # the cardinality limiter's state (None: none stored)


@dataclass
class RestoredAssembly:
    """A tier-2 store's assembly state of one source topic."""

    done_before: int | None  # the first minute not landed yet
    # (sli_partition, source_partition, closed_before_minute, watermark_ms, read_to_end, drained)
    frontiers: list[tuple]


@dataclass(frozen=True)
class RestoreScope:
    """What an operator restores from a store: the open state of these topics, the newest
    minute of these bucket tables, the assembly state of these source topics (and always
    the stored read positions)."""

    topics: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    assembly: tuple[str, ...] = ()


@dataclass
class Restored:
    """The worker's state as the last committed checkpoint left it, read from the store at
    start (`load_restored`) and handed to the operator: what its checkpoints wrote, typed."""

    offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # next offset per partition
    read_offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # tier 2: read up to, per tw.sli partition
    topics: dict[str, RestoredTopic] = field(default_factory=dict)
    newest_minutes: dict[str, int | None] = field(default_factory=dict)  # bucket table → newest minute with rows
    assembly: dict[str, RestoredAssembly] = field(default_factory=dict)


def load_restored(con: duckdb.DuckDBPyConnection, scope: RestoreScope) -> Restored:
    """What `scope` names, as the store holds it."""
    out = Restored(offsets=load_offsets(con), read_offsets=load_read_offsets(con))
    for topic in scope.topics:
        out.topics[topic] = load_topic_state(con, topic)
        out.topics[topic].label_limits = load_label_limits(con, topic)
    for table in scope.tables:
        out.newest_minutes[table] = newest_minute(con, table)
    for topic in scope.assembly:
        out.assembly[topic] = RestoredAssembly(*load_assembly(con, topic))
    return out


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


def load_offsets(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, int], int]:
    rows = con.execute("SELECT topic, part, next_offset FROM _tw_offsets WHERE next_offset IS NOT NULL").fetchall()
    return {(t, int(p)): int(o) for t, p, o in rows}


def load_read_offsets(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, int], int]:
    """Tier 2's read position per tw.sli partition at its last checkpoint (none in a store
    that an earlier release wrote last)."""
    rows = con.execute("SELECT topic, part, read_offset FROM _tw_read_offsets WHERE read_offset IS NOT NULL").fetchall()
    return {(t, int(p)): int(o) for t, p, o in rows}
