"""The H100 lab run (`tests/data/h100-lab/`) cut into the
store's buckets by the worker's own pieces, without Kafka: decode and validate a batch
(`BatchDecoder`), take its columns (`records_to_frame`), window it (`MinuteWindows` with the
`streams.aggregates` specs), close every minute. The same sequence as the worker's
`_process_topic` and checkpoint, on one batch per file."""

from __future__ import annotations

from pathlib import Path

import msgspec
import polars as pl
import pytest

from tests.conftest import H100_LAB, need

from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch.ingest.validate import BatchDecoder
from tailwatch.store.connection import connect
from tailwatch.streams.aggregates import GPU, REQUESTS
from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS, records_to_frame
from tailwatch.streams.minute_windows import AggregateSpec, MinuteWindows



def lab_dir() -> Path:
    need((H100_LAB / "requests.jsonl").exists(), f"the H100 lab data at {H100_LAB}")  # a failure under CI=true
    return H100_LAB


def buckets(values: list[bytes], event_type: type[msgspec.Struct], columns: dict, spec: AggregateSpec) -> pl.DataFrame:
    """Closed 1-minute rows for raw JSON records, as the worker would store them."""
    decoded = BatchDecoder(event_type).decode(values)
    n = len(values)
    frame, bad_ts = records_to_frame(decoded.records, columns, [0] * n, list(range(n)), decoded.indices)
    assert not decoded.rejected and not bad_ts, (decoded.rejected[:3], bad_ts[:3])
    windows = MinuteWindows(spec, allowed_lateness_ms=5 * 60_000)
    windows.add(frame)
    rows, _minutes = windows.close(None)
    return rows


def lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def lab_sli_minute() -> pl.DataFrame:
    return buckets(lines(lab_dir() / "requests.jsonl"), RequestV1, REQUEST_COLUMNS, REQUESTS)


def lab_gpu_minute() -> pl.DataFrame:
    return buckets(lines(lab_dir() / "gpu-samples.jsonl"), GpuV1, GPU_COLUMNS, GPU)


def lab_store(path: Path) -> Path:
    """A store file holding the lab run's `sli_minute` and `gpu_minute`."""
    sli, gpu = lab_sli_minute(), lab_gpu_minute()
    con = connect(path)
    try:
        con.register("lab_sli", sli)
        con.register("lab_gpu", gpu)
        con.execute("INSERT INTO sli_minute BY NAME SELECT * FROM lab_sli")
        con.execute("INSERT INTO gpu_minute BY NAME SELECT * FROM lab_gpu")
    finally:
        con.close()
    return path
