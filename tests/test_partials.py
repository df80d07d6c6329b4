"""Tier 1's partials (streams/partials.py): workers that each own part of a topic publish
their partitions' share of every minute, and the assembler rebuilds exactly the rows one
worker owning everything would have closed. On the public Azure code trace (requests) and
the real H100 run (GPU samples from two sources per GPU), never on simulator traffic."""

from __future__ import annotations

import itertools
import msgspec
import polars as pl
import pytest

from tests.conftest import AZURE_TRACE, need
from tests.h100_lab import lab_dir, lines

from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch_dev.trace import TraceReplay
from tailwatch.ingest.validate import BatchDecoder
from tailwatch.streams.aggregates import GPU, REQUESTS
from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS, records_to_frame
from tailwatch.streams.partials import MinuteAssembler, encode_frontier, encode_partials
from tailwatch.streams.minute_windows import MinuteWindows

LATENESS_MS = 5 * 60_000
SLI_PARTITIONS = (0, 1, 2)


def azure_values(minutes: int) -> list[tuple[bytes, bytes]]:
    need(AZURE_TRACE.is_file(), f"the Azure code trace at {AZURE_TRACE}")  # a failure under CI=true
    encode = msgspec.json.Encoder().encode
    return [(e.tenant.encode(), encode(e)) for e in TraceReplay(AZURE_TRACE, minutes=minutes, seed=3).events()]


def gpu_values() -> list[tuple[bytes, bytes]]:
    return [(msgspec.json.decode(v)["node"].encode(), v) for v in lines(lab_dir() / "gpu-samples.jsonl")]


def partitioned(values: list[tuple[bytes, bytes]], partitions: int, keyed: bool) -> dict[int, list[bytes]]:
    """The log of each partition: by key (a keyed producer) or round robin (an unkeyed one)."""
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for i, (key, value) in enumerate(values):
        out[(sum(key) if keyed else i) % partitions].append(value)
    return out


def feed(windows: MinuteWindows, logs: dict[int, list[bytes]], owned: list[int], event_type, columns,
         batch: int = 700) -> None:
    """The worker's hot path over the owned partitions' logs, interleaved batch by batch."""
    decoder = BatchDecoder(event_type)
    positions = {p: 0 for p in owned}
    while any(positions[p] < len(logs[p]) for p in owned):
        values, parts, offsets = [], [], []
        for p in owned:
            chunk = logs[p][positions[p]:positions[p] + batch]
            values += chunk
            parts += [p] * len(chunk)
            offsets += range(positions[p], positions[p] + len(chunk))
            positions[p] += len(chunk)
        decoded = decoder.decode(values)
        frame, bad = records_to_frame(decoded.records, columns, parts, offsets, decoded.indices)
        assert not decoded.rejected and not bad
        windows.add(frame)


def tier1_records(spec, columns, event_type, logs, owned, topic, checkpoints: int) -> list[tuple[int, bytes]]:
    """What one tier-1 worker owning `owned` publishes: partials, then a frontier for each
    owned partition, into every tw.sli partition (as (tw.sli partition, value))."""
    w = MinuteWindows(spec, LATENESS_MS, per_partition=True)
    feed(w, logs, owned, event_type, columns)
    out: list[tuple[int, bytes]] = []
    minutes = w.open_minutes()
    cuts = [minutes[len(minutes) * (i + 1) // checkpoints] for i in range(checkpoints - 1)] + [None]
    for cut in cuts:  # several checkpoints: minutes close a few at a time
        counts, hist, closed = w.close_partials(cut)
        if counts is not None:
            for key, value in encode_partials(spec, topic, counts, hist):
                out.append((sum(key) % len(SLI_PARTITIONS), value))
        for p in owned:
            for q in SLI_PARTITIONS:
                out.append((q, encode_frontier(topic, p, w.closed_before_minute)))
    return out


def single_worker(spec, columns, event_type, logs) -> pl.DataFrame:
    w = MinuteWindows(spec, LATENESS_MS)
    feed(w, logs, sorted(logs), event_type, columns)
    return w.close(None)[0]


def same_rows(a: pl.DataFrame, b: pl.DataFrame, keys: list[str]) -> None:
    assert a.height == b.height and a.height > 0
    assert a.columns == b.columns
    order = ["window_start", *keys]
    a, b = a.sort(order, nulls_last=True), b.sort(order, nulls_last=True)
    assert a.equals(b), "partials merged downstream differ from one worker's buckets"


def two_workers_assembled(spec, columns, event_type, logs, topic, owners, checkpoints):
    """Two tier-1 workers (partitions `owners[i]`, closing in `checkpoints[i]` steps), their
    records interleaved as the assembler reads them, assembled: (rows, minutes)."""
    records = [tier1_records(spec, columns, event_type, logs, owned, topic, n) for owned, n in zip(owners, checkpoints)]
    assembler = MinuteAssembler(spec, columns, topic, set(logs), set(SLI_PARTITIONS))
    frames, minutes = [], []
    for pair in itertools.zip_longest(*records):
        for q, value in filter(None, pair):
            assembler.add(q, value)
        rows, taken = assembler.take_complete()  # as tier 2 does: whatever is whole, at once
        frames += [rows] if rows.height else []
        minutes += taken
    return pl.concat(frames), minutes


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed-by-tenant", "unkeyed"])
def test_two_tier1_workers_partials_assemble_into_one_workers_sli_minute(keyed):
    logs = partitioned(azure_values(minutes=40), 4, keyed)
    rows, minutes = two_workers_assembled(REQUESTS, REQUEST_COLUMNS, RequestV1, logs, "tw.requests",
                                          ([0, 1], [2, 3]), (3, 5))
    one = single_worker(REQUESTS, REQUEST_COLUMNS, RequestV1, logs)
    assert minutes == sorted({t // 60 for t in one["window_start"].dt.epoch("s").to_list()})
    same_rows(rows, one, list(REQUESTS.keys))


def test_gpu_partials_of_two_sources_per_gpu_spread_over_partitions_assemble_exactly():
    # Round robin: the NVML collector's and the runtime's samples of one GPU land in
    # different partitions owned by different workers, and merge field by field downstream.
    logs = partitioned(gpu_values(), 4, keyed=False)
    rows, _ = two_workers_assembled(GPU, GPU_COLUMNS, GpuV1, logs, "tw.gpu", ([0, 2], [1, 3]), (2, 4))
    same_rows(rows, single_worker(GPU, GPU_COLUMNS, GpuV1, logs), list(GPU.keys))


def test_a_minute_waits_for_every_source_partition_in_every_sli_partition_and_copies_count_once():
    logs = partitioned(azure_values(minutes=6), 2, keyed=False)
    topic = "tw.requests"
    first = tier1_records(REQUESTS, REQUEST_COLUMNS, RequestV1, logs, [0], topic, checkpoints=1)
    second = tier1_records(REQUESTS, REQUEST_COLUMNS, RequestV1, logs, [1], topic, checkpoints=1)
    assembler = MinuteAssembler(REQUESTS, REQUEST_COLUMNS, topic, {0, 1}, set(SLI_PARTITIONS))
    for q, value in first:
        assembler.add(q, value)
    assert assembler.complete_before() is None  # partition 1 has said nothing yet
    assert assembler.take_complete()[0].height == 0
    # Partition 1's partials and frontiers, but the frontier of one tw.sli partition held back.
    late_q = SLI_PARTITIONS[-1]
    held_back = [(q, v) for q, v in second if q == late_q and b"frontier.v1" in v]
    for q, value in second:
        if (q, value) not in held_back:
            assembler.add(q, value)
    assert assembler.complete_before() is None
    for q, value in held_back:
        assembler.add(q, value)
    # A redelivery of partition 0's records (its worker died before its checkpoint) before the take.
    for q, value in first:
        assembler.add(q, value)
    rows, minutes = assembler.take_complete()
    assert len(minutes) >= 4
    same_rows(rows, single_worker(REQUESTS, REQUEST_COLUMNS, RequestV1, logs), list(REQUESTS.keys))
    # And after it: minutes handed out are not handed out again.
    for q, value in first:
        assembler.add(q, value)
    assert assembler.take_complete()[0].height == 0 and assembler.redelivered > 0


def test_a_worker_whose_partitions_all_went_quiet_moves_them_on_with_the_topics_newest_watermark():
    # Keyed by tenant over 4 partitions, and partitions 2 and 3 go quiet after 8 minutes of
    # the trace: their owner, alone, sees only its own stale watermarks (the partition at
    # the front is never idle to itself) and would hold every later minute downstream.
    from tailwatch.streams.partition_windows import PartitionWindows

    logs = partitioned(azure_values(minutes=40), 4, keyed=True)
    quiet_from_ms = min(msgspec.json.decode(v)["ts"] for v in logs[0]) + 8 * 60_000
    logs = {p: [v for v in log if p < 2 or msgspec.json.decode(v)["ts"] < quiet_from_ms] for p, log in logs.items()}
    idle_ms = 60_000
    quiet = PartitionWindows(REQUESTS, LATENESS_MS, idle_ms)
    for p in (2, 3):
        quiet.take(p, None)
    feed(quiet, logs, [2, 3], RequestV1, REQUEST_COLUMNS)
    one = MinuteWindows(REQUESTS, LATENESS_MS, idle_ms)
    feed(one, logs, [0, 1, 2, 3], RequestV1, REQUEST_COLUMNS)
    busy_newest_ms = max(one.watermark_ms[0], one.watermark_ms[1])
    one_worker_cut = one.closable_before({0, 1, 2, 3}, read_to_end={0, 1, 2, 3})

    alone = quiet.closable_before(read_to_end={2, 3})
    assert max(alone.values()) < quiet_from_ms // 60_000  # stuck at its own last events
    told = quiet.closable_before(read_to_end={2, 3}, newest_elsewhere_ms=busy_newest_ms)
    assert set(told.values()) == {(busy_newest_ms - LATENESS_MS) // 60_000}
    assert min(told.values()) >= one_worker_cut > quiet_from_ms // 60_000 + 20  # as far as one worker goes
    # Not read to the end (a backlog), or within the idle timeout of the front: no move.
    assert quiet.closable_before(read_to_end={2}, newest_elsewhere_ms=busy_newest_ms)[3] == alone[3]
    near = quiet.closable_before(read_to_end={2, 3}, newest_elsewhere_ms=max(quiet.watermark(2), quiet.watermark(3)) + idle_ms // 2)
    assert near == alone


def test_closed_rows_become_one_tw_sli_record_each_whatever_the_chunk_they_are_serialised_in(monkeypatch):
    """A backlog's checkpoint serialises its closed rows a chunk at a time (bounded memory);
    the records are those of the whole frame serialised at once, in order, one per row, each
    keyed by its slice labels."""
    from tailwatch.streams import partials

    rows = single_worker(REQUESTS, REQUEST_COLUMNS, RequestV1, partitioned(azure_values(40), 2, keyed=True))
    assert rows.height > 250
    monkeypatch.setattr(partials, "SLI_CHUNK_ROWS", 97)  # chunks of uneven length, the last one short
    chunked = list(partials.sli_records(rows, REQUESTS))
    whole = rows.with_columns(pl.lit("requests_minute.v1").alias("schema"),
                              pl.col("window_start").dt.epoch("ms").alias("window_start"))
    assert [value for _, value in chunked] == whole.write_ndjson().encode().splitlines()
    labels = [k for k in REQUESTS.keys if k in rows.columns]
    assert [key for key, _ in chunked] == partials.sli_keys(rows, labels)
    first = msgspec.json.decode(chunked[0][1])
    assert first["schema"] == "requests_minute.v1"
    assert first["window_start"] == rows["window_start"][0].timestamp() * 1000
    assert chunked[0][0] == "|".join("" if rows[k][0] is None else str(rows[k][0]) for k in labels).encode()
