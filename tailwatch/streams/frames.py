"""Decoded records → columnar polars frames, with event time in epoch milliseconds.

Only the columns that aggregation needs are extracted; identifiers such as
`session_id` are validated by the decoder and then left behind here.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Sequence

import msgspec
import numpy as np
import polars as pl

from tailwatch.conventions import LATENCY_LOWER_FIELDS, PHASE_NAMES
from tailwatch.ingest.columnar import INDEX_COLUMN, OFFSET_COLUMN, PARTITION_COLUMN, TS_COLUMN, ColumnDecoder, FastBatch
from tailwatch.ingest.schema import MAX_EVENT_TS_MS, MIN_EVENT_TS_MS, EvalV1
from tailwatch.ingest.validate import FUTURE, BatchDecoder, Rejected

# How far an event may be stamped ahead of the Kafka record that carries it (default).
DEFAULT_MAX_AHEAD_MS = 5 * 60_000

# Columns taken from each record type, with their polars dtype.
_OPTIONAL_COLUMNS = tuple(LATENCY_LOWER_FIELDS.values())
REQUEST_COLUMNS: dict[str, pl.DataType] = {
    "event_id": pl.String,
    "tenant": pl.String, "model": pl.String, "model_version": pl.String, "zone": pl.String,
    "workload": pl.String, "traffic_class": pl.String, "deployment": pl.String, "pool": pl.String,
    "status": pl.String, "attempt": pl.Int32, "retry_of": pl.String, "task_success": pl.Boolean,
    "queue_ms": pl.Float64, "first_output_ms": pl.Float64, "e2e_ms": pl.Float64, "inter_token_ms": pl.Float64,
    "queue_lower_ms": pl.Float64, "first_output_lower_ms": pl.Float64, "e2e_lower_ms": pl.Float64,
    "inter_token_lower_ms": pl.Float64,
    "finish_reason": pl.String,
    "prompt_tokens": pl.Int64, "output_tokens": pl.Int64, "audio_seconds": pl.Float64,
    "gpu_seconds": pl.Float64,
    "language": pl.String, "voice": pl.String, "status_reason": pl.String,
    "partial_revisions": pl.Int64, "endpointing_error": pl.Boolean, "finalization_ms": pl.Float64,
    "underruns": pl.Int64, "voice_cache_hit": pl.Boolean, "fallback": pl.String,
    "cached_prompt_tokens": pl.Int64, "draft_tokens": pl.Int64, "accepted_tokens": pl.Int64,
    # eval.v1 records (sharing the topic) fill these and the slice labels; their `status` is null.
    "word_errors": pl.Int64, "reference_words": pl.Int64, "char_errors": pl.Int64, "reference_chars": pl.Int64,
    "mos": pl.Float64,
}
# Event ids are deduplicated per topic: an evaluation's id lives apart from requests' (a
# scorer may well reuse the id of the request it scored). No accepted id holds a NUL.
EVAL_ID_PREFIX = "\x00eval\x00"
# Phase timings, one {stage, ms} per phase a turn reports, phases numbered by PHASE_NAMES.
# Built apart from the flat columns: a name outside the list folds
# into `other` here, so the buckets' phase keys stay bounded.
PHASES_COLUMN = "stages"
PHASES_DTYPE = pl.List(pl.Struct({"stage": pl.Int8, "ms": pl.Float64}))
PHASE_INDEX = {name: i for i, name in enumerate(PHASE_NAMES)}
_TS = attrgetter("ts")
# Labels compared without case: BCP 47 language tags (en-US and en-us are one slice).
CASE_FOLDED = ("language",)
REQUEST_COLUMNS[PHASES_COLUMN] = PHASES_DTYPE
GPU_COLUMNS: dict[str, pl.DataType] = {
    "node": pl.String, "gpu_index": pl.Int32, "zone": pl.String, "pool": pl.String,
    "gpu_sku": pl.String, "model": pl.String, "model_version": pl.String,
    "util_pct": pl.Float64, "mem_used_bytes": pl.Int64, "mem_total_bytes": pl.Int64,
    "power_w": pl.Float64, "temp_c": pl.Float64, "xid_errors": pl.Int64, "ecc_errors": pl.Int64,
    "replica_state": pl.String, "queue_depth": pl.Int64, "oldest_queue_age_ms": pl.Float64,
    "running": pl.Int64, "active_streams": pl.Int64, "kv_cache_usage": pl.Float64,
    "preemptions": pl.Int64,
    "sm_active_pct": pl.Float64, "sm_occupancy_pct": pl.Float64, "tensor_active_pct": pl.Float64,
    "dram_bw_pct": pl.Float64, "gr_engine_active_pct": pl.Float64, "source": pl.String,
}


@dataclass(slots=True)
class DecodedFrame:
    """A batch of raw records decoded: the frame of its events, the records refused (with
    their positions in the batch), and how many records had unknown fields dropped."""

    frame: pl.DataFrame
    rejected: list[Rejected]
    unknown_fields_dropped: int = 0
    fast_rows: int = 0  # records the fast decoder put in columns itself


def decode_frame(fast: ColumnDecoder, reference: BatchDecoder, columns: dict[str, pl.DataType],
                 values: Sequence[bytes | None], partitions: Sequence[int], offsets: Sequence[int],
                 record_ts_ms: Sequence[int] | None = None, max_ahead_ms: int = DEFAULT_MAX_AHEAD_MS) -> DecodedFrame:
    """Raw records into the frame `records_to_frame` builds: the records the fast decoder
    accepts straight into columns, those it declines (a handful: evaluations, escapes,
    unknown fields, faults, a label value not seen before) through the reference decoder,
    which decodes them or says why not; the two merged in the batch's order."""
    accepted = fast.decode(values, partitions, offsets)  # type: ignore[arg-type]
    records: list = []
    indices: list[int] = []
    rejected: list[Rejected] = []
    dropped = 0
    if accepted.declined:
        at = accepted.declined
        decoded = reference.decode([values[i] for i in at])
        fast.approve(decoded.records)
        records, indices = decoded.records, [at[i] for i in decoded.indices]
        rejected = [Rejected(at[r.index], r.reason, r.detail) for r in decoded.rejected]
        dropped = decoded.unknown_fields_dropped
    frame, future = records_to_frame(records, columns, partitions, offsets, indices, record_ts_ms, max_ahead_ms,
                                     fast=accepted)
    return DecodedFrame(frame, rejected + future, dropped, accepted.frame.height)


def column_decoder(event_type: type[msgspec.Struct], columns: dict[str, pl.DataType],
                   max_record_bytes: int) -> ColumnDecoder:
    """The fast decoder for a topic's `columns`, laid out as `records_to_frame` lays them."""
    return ColumnDecoder(event_type, {c: t for c, t in columns.items() if c != PHASES_COLUMN}, max_record_bytes,
                         case_folded=CASE_FOLDED, droppable=_OPTIONAL_COLUMNS)


def records_to_frame(
    records: Sequence[msgspec.Struct],
    columns: dict[str, pl.DataType],
    partitions: Sequence[int],
    offsets: Sequence[int],
    indices: Sequence[int],
    record_ts_ms: Sequence[int] | None = None,
    max_ahead_ms: int = DEFAULT_MAX_AHEAD_MS,
    fast: FastBatch | None = None,
) -> tuple[pl.DataFrame, list[Rejected]]:
    """A frame of `columns` plus `ts_ms`, `_partition`, `_offset`, `_index`; records stamped
    too far ahead of their Kafka records are rejected.

    The records are already validated, with the schema's defaults filled in; each column is
    gathered from them with one `attrgetter` pass. `fast`: records the fast decoder already
    put in columns (`ingest/columnar.py`), merged in the batch's order. `partitions`,
    `offsets` and `record_ts_ms` (each Kafka record's own timestamp) are per raw record;
    `indices` maps each record to its raw position.

    Event time is bounded by what the log itself holds, so a replay decides as the live run
    did: an event stamped more than `max_ahead_ms` after its Kafka record's timestamp is
    refused as `future` (one such event would otherwise move its partition's watermark
    ahead and make every later event late), and so is an event whose record carries no
    usable timestamp (none, or outside the event-time range) to bound it by.

    Bucket lower bounds come only from scraped runtimes: a batch of measured latencies
    leaves them out (the windows take their absence for none) rather than carrying four
    columns of nulls for every batch of a traced fleet. Phases likewise: only batches that
    carry them get the column.
    """
    read = {c: t for c, t in columns.items() if c != PHASES_COLUMN}
    if fast is None or records:
        frame = _gathered(records, columns, read, indices, partitions, offsets)
        if fast is not None and fast.frame.height:
            frame = pl.concat([fast.frame, frame], how="diagonal").sort(INDEX_COLUMN)
        mixed = True
    else:
        frame, mixed = fast.frame, False
    frame, rejected = _bound_event_time(frame, record_ts_ms, max_ahead_ms)
    if not mixed and not rejected:  # the fast decoder left out what is null throughout
        return frame, rejected
    dropped = {c for c in (*_OPTIONAL_COLUMNS, PHASES_COLUMN)
               if c in frame.columns and frame[c].null_count() == frame.height}
    order = [c for c in (*read, PHASES_COLUMN) if c in frame.columns and c not in dropped]
    order += [TS_COLUMN, PARTITION_COLUMN, OFFSET_COLUMN, INDEX_COLUMN]
    return (frame if frame.columns == order else frame.select(order)), rejected


def _gathered(records: Sequence[msgspec.Struct], columns: dict[str, pl.DataType], read: dict[str, pl.DataType],
              indices: Sequence[int], partitions: Sequence[int], offsets: Sequence[int]) -> pl.DataFrame:
    """Decoded records as columns, then `ts_ms`, `_partition`, `_offset` and `_index`: one
    `attrgetter` pass a column."""
    kinds = set(map(type, records))
    frame = pl.DataFrame([_column(records, kinds, c, t) for c, t in read.items()])
    # The phase column is gathered in C and tested in C: no Python call per record.
    if PHASES_COLUMN in columns and any(phases := _gather(records, kinds, PHASES_COLUMN)):
        frame = frame.with_columns(phase_column(records, phases))
    if any(issubclass(k, EvalV1) for k in kinds) and "event_id" in read:
        frame = frame.with_columns(pl.when(pl.col("status").is_null()).then(EVAL_ID_PREFIX + pl.col("event_id"))
                                   .otherwise(pl.col("event_id")).alias("event_id"))
    folded = [pl.col(c).str.to_lowercase() for c in CASE_FOLDED if c in read]
    index = np.asarray(indices, dtype=np.int64)
    return frame.with_columns(*folded,
                              pl.Series(TS_COLUMN, list(map(_TS, records)), dtype=pl.Int64),
                              pl.Series(PARTITION_COLUMN, np.asarray(partitions, dtype=np.int32)[index]),
                              pl.Series(OFFSET_COLUMN, np.asarray(offsets, dtype=np.int64)[index]),
                              pl.Series(INDEX_COLUMN, index))


def _bound_event_time(frame: pl.DataFrame, record_ts_ms: Sequence[int] | None,
                      max_ahead_ms: int) -> tuple[pl.DataFrame, list[Rejected]]:
    """The frame without events stamped too far ahead of their Kafka records, and those refused."""
    if record_ts_ms is None or not frame.height:
        return frame, []
    index = frame[INDEX_COLUMN].to_numpy()
    ts = frame[TS_COLUMN].to_numpy()
    bound = np.asarray(record_ts_ms, dtype=np.int64)[index]
    usable = (bound >= MIN_EVENT_TS_MS) & (bound < MAX_EVENT_TS_MS)
    ahead = ~usable | (ts > np.where(usable, bound, 0) + max_ahead_ms)
    if not ahead.any():
        return frame, []
    rejected = [Rejected(int(index[pos]), FUTURE, _future_detail(int(ts[pos]), int(bound[pos]), max_ahead_ms))
                for pos in np.flatnonzero(ahead)]
    return frame.filter(pl.Series(~ahead)), rejected


def _column(records: Sequence[msgspec.Struct], kinds: set[type], column: str, dtype: pl.DataType) -> pl.Series:
    """One column as a Series. Most of a batch's columns hold one value throughout (a
    request's unset `mos` or `voice`, the trace's single model): those are filled in
    from that value, as converting a list of Python objects costs several times as much
    as gathering it (40 of the request columns, most unset on any one workload)."""
    values = _gather(records, kinds, column)
    n = len(values)
    if n > 1:
        first = values[0]
        if (first is None or first == "") and values.count(first) == n:
            return pl.Series(column, [first], dtype=dtype).new_from_index(0, n)
    return pl.Series(column, values, dtype=dtype)


def _gather(records: Sequence[msgspec.Struct], kinds: set[type], column: str) -> list:
    """One column's values: one attrgetter pass where every record type has the field, None
    where a record's type lacks it (a request's `mos`, an evaluation's `status`)."""
    have = [column in k.__struct_fields__ for k in kinds]
    if all(have):
        return list(map(attrgetter(column), records))
    if not any(have):
        return [None] * len(records)
    return [getattr(r, column, None) for r in records]


def _future_detail(ts_ms: int, record_ts_ms: int, max_ahead_ms: int) -> str:
    if not MIN_EVENT_TS_MS <= record_ts_ms < MAX_EVENT_TS_MS:
        return f"the Kafka record's timestamp ({record_ts_ms}) cannot bound event time"
    return f"ts is {(ts_ms - record_ts_ms) / 1000:.0f} s after its Kafka record's timestamp (bound {max_ahead_ms / 1000:.0f} s)"


def phase_column(records: Sequence[msgspec.Struct], phases: Sequence[dict | None] | None = None) -> pl.Series:
    """The `stages` column of request records (null where a record has none); `phases`: each
    record's own, where already gathered."""
    other = PHASE_INDEX["other"]
    if phases is None:
        phases = [getattr(r, PHASES_COLUMN, None) for r in records]
    values = [
        [{"stage": PHASE_INDEX.get(name, other), "ms": ms} for name, ms in s.items()] if s else None
        for s in phases
    ]
    return pl.Series(PHASES_COLUMN, values, dtype=PHASES_DTYPE)
