"""Decoded records → columnar polars frames, with event time in epoch milliseconds.

Only the columns that aggregation needs are extracted; identifiers such as
`session_id` are validated by the decoder and then left behind here.
"""

from __future__ import annotations

import functools
import io
from typing import Sequence

import msgspec
import polars as pl

from ingest.schema import STAGE_NAMES, parse_ts_ms
from ingest.validate import BAD_TIMESTAMP, Rejected

# Columns taken from each record type, with their polars dtype.
REQUEST_COLUMNS: dict[str, pl.DataType] = {
    "event_id": pl.String,
    "tenant": pl.String, "model": pl.String, "model_version": pl.String, "zone": pl.String,
    "workload": pl.String, "traffic_class": pl.String, "deployment": pl.String, "pool": pl.String,
    "status": pl.String, "attempt": pl.Int32, "retry_of": pl.String, "task_success": pl.Boolean,
    "queue_ms": pl.Float64, "first_output_ms": pl.Float64, "e2e_ms": pl.Float64, "inter_token_ms": pl.Float64,
    "finish_reason": pl.String,
    "prompt_tokens": pl.Int64, "output_tokens": pl.Int64, "audio_seconds": pl.Float64,
    "gpu_seconds": pl.Float64,
}
# Stage timings, one {stage, ms} per stage a turn reports, stages numbered by STAGE_NAMES.
# Built from the decoded records, not by the JSON reader: a name outside the list folds
# into `other` here, so the buckets' stage keys stay bounded.
STAGES_COLUMN = "stages"
STAGES_DTYPE = pl.List(pl.Struct({"stage": pl.Int8, "ms": pl.Float64}))
STAGE_INDEX = {name: i for i, name in enumerate(STAGE_NAMES)}
REQUEST_COLUMNS[STAGES_COLUMN] = STAGES_DTYPE
GPU_COLUMNS: dict[str, pl.DataType] = {
    "node": pl.String, "gpu_index": pl.Int32, "zone": pl.String, "pool": pl.String,
    "gpu_sku": pl.String, "model": pl.String, "model_version": pl.String,
    "util_pct": pl.Float64, "mem_used_bytes": pl.Int64, "mem_total_bytes": pl.Int64,
    "power_w": pl.Float64, "temp_c": pl.Float64, "xid_errors": pl.Int64, "ecc_errors": pl.Int64,
    "replica_state": pl.String, "queue_depth": pl.Int64, "oldest_queue_age_ms": pl.Float64,
    "running": pl.Int64, "active_streams": pl.Int64, "kv_cache_usage": pl.Float64,
    "preemptions": pl.Int64,
    "sm_active_pct": pl.Float64, "sm_occupancy_pct": pl.Float64, "tensor_active_pct": pl.Float64,
    "dram_bw_pct": pl.Float64, "source": pl.String,
}


@functools.cache
def _defaults(event_type: type[msgspec.Struct], column_names: tuple[str, ...]) -> list[pl.Expr]:
    """The schema's defaults for fields a producer left out (the JSON reader gives null)."""
    return [
        pl.col(f.name).fill_null(f.default)
        for f in msgspec.structs.fields(event_type)
        if f.name in column_names and f.default is not msgspec.NODEFAULT and f.default is not None
    ]


def records_to_frame(
    records: Sequence[msgspec.Struct],
    raw_values: Sequence[bytes],
    columns: dict[str, pl.DataType],
    partitions: Sequence[int],
    offsets: Sequence[int],
    indices: Sequence[int],
) -> tuple[pl.DataFrame, list[Rejected]]:
    """A frame of `columns` plus `ts_ms`, `_partition`, `_offset`, `_index`; bad timestamps rejected.

    The records are already validated; their columns are read from the same raw bytes by
    polars' native JSON reader (about twice as fast as building columns from Python
    objects). `raw_values`/`partitions`/`offsets` are per raw record; `indices` maps each
    record to its raw position.
    """
    rejected: list[Rejected] = []
    ts_raw = [r.ts for r in records]  # type: ignore[attr-defined]
    if set(map(type, ts_raw)) <= {int}:
        ts_ms = ts_raw
    else:
        ts_ms, keep = [], []
        for pos, t in enumerate(ts_raw):
            try:
                ts_ms.append(parse_ts_ms(t))
                keep.append(pos)
            except (ValueError, OverflowError):
                rejected.append(Rejected(indices[pos], BAD_TIMESTAMP, "ts is neither epoch milliseconds nor RFC 3339"))
        indices = [indices[p] for p in keep]
        records = [records[p] for p in keep]
    read = {c: t for c, t in columns.items() if c != STAGES_COLUMN}
    if len(indices) == len(raw_values):
        body = pl.read_ndjson(io.BytesIO(b"\n".join(raw_values)), schema=read)
    elif indices:
        body = pl.read_ndjson(io.BytesIO(b"\n".join([raw_values[i] for i in indices])), schema=read)
    else:
        body = pl.DataFrame(schema=read)
    frame = body.with_columns(*_defaults(type(records[0]), tuple(read))) if records else body
    # Only batches that carry stages get the column (the windows take its absence for none):
    # a batch without them costs one scan, not a column of nulls.
    if STAGES_COLUMN in columns and any(r.stages for r in records):  # type: ignore[attr-defined]
        frame = frame.with_columns(stage_column(records))
    frame = frame.with_columns(
        pl.Series("ts_ms", ts_ms, dtype=pl.Int64),
        pl.Series("_partition", [partitions[i] for i in indices], dtype=pl.Int32),
        pl.Series("_offset", [offsets[i] for i in indices], dtype=pl.Int64),
        pl.Series("_index", list(indices), dtype=pl.Int64),
    )
    return frame, rejected


def stage_column(records: Sequence[msgspec.Struct]) -> pl.Series:
    """The `stages` column of request records (null where a record has none)."""
    other = STAGE_INDEX["other"]
    values = [
        [{"stage": STAGE_INDEX.get(name, other), "ms": ms} for name, ms in stages.items()] if stages else None
        for stages in (r.stages for r in records)  # type: ignore[attr-defined]
    ]
    return pl.Series(STAGES_COLUMN, values, dtype=STAGES_DTYPE)
