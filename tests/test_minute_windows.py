"""Event-time windows: lateness per partition, dedupe, closing, restore (pure, no Kafka)."""

import polars as pl
import pytest

from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.frames import REQUEST_COLUMNS
from tailwatch.streams.minute_windows import MINUTE_MS, MinuteWindows

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS


def frame(rows):
    """rows: (event_id, ts_ms, partition, status, e2e_ms)."""
    data = {c: [] for c in REQUEST_COLUMNS}
    data.update(ts_ms=[], _partition=[], _offset=[], _index=[])
    for i, (eid, ts, part, status, e2e) in enumerate(rows):
        for c in REQUEST_COLUMNS:
            data[c].append(None)
        data["event_id"][-1] = eid
        for c, v in (("tenant", "acme"), ("model", "m"), ("model_version", "v1"), ("zone", "z"),
                     ("workload", "llm"), ("traffic_class", "realtime"), ("deployment", "stable"), ("pool", "p")):
            data[c][-1] = v
        data["status"][-1] = status
        data["attempt"][-1] = 1
        data["e2e_ms"][-1] = e2e
        data["ts_ms"].append(ts)
        data["_partition"].append(part)
        data["_offset"].append(i)
        data["_index"].append(i)
    schema = {**REQUEST_COLUMNS, "ts_ms": pl.Int64, "_partition": pl.Int32, "_offset": pl.Int64, "_index": pl.Int64}
    return pl.DataFrame(data, schema=schema)


def windows(lateness_min=5):
    return MinuteWindows(REQUESTS, lateness_min * MINUTE_MS)


def test_counts_and_quantiles_of_one_minute():
    w = windows()
    w.add(frame([(f"e{i}", T0 + i * 100, 0, "ok" if i % 10 else "error", float(i + 1)) for i in range(100)]))
    rows, minutes = w.close(None)
    assert minutes == [T0 // MINUTE_MS]
    r = rows.row(0, named=True)
    assert (r["requests"], r["ok"], r["errors"]) == (100, 90, 10)
    assert abs(r["e2e_ms_p50"] - 50) <= 1 and abs(r["e2e_ms_p99"] - 99) <= 2
    assert sum(x["n"] for x in r["e2e_ms_hist"]) == 100


def test_out_of_order_events_inside_lateness_update_their_bucket():
    w = windows()
    w.add(frame([("a", T0 + 4 * MINUTE_MS, 0, "ok", 1.0)]))
    out = w.add(frame([("b", T0 + 10, 0, "ok", 1.0)]))  # 4 minutes older: inside 5 minutes
    assert out.late_index == [] and out.accepted == 1
    rows, _ = w.close(None)
    assert sorted(rows["requests"].to_list()) == [1, 1]


def test_events_older_than_lateness_are_late_and_not_counted():
    w = windows(lateness_min=5)
    w.add(frame([("a", T0 + 10 * MINUTE_MS, 0, "ok", 1.0)]))
    out = w.add(frame([("b", T0 + 4 * MINUTE_MS, 0, "ok", 1.0), ("c", T0 + 5 * MINUTE_MS, 0, "ok", 1.0)]))
    assert out.late_index == [0]  # b is 6 min behind the watermark; c exactly 5: allowed
    rows, _ = w.close(None)
    assert rows["requests"].sum() == 2


def test_lateness_is_judged_per_partition():
    w = windows(lateness_min=5)
    w.add(frame([("a", T0 + 60 * MINUTE_MS, 0, "ok", 1.0)]))
    out = w.add(frame([("b", T0, 1, "ok", 1.0)]))  # partition 1 has its own watermark
    assert out.late_index == []


def test_late_within_one_batch_uses_running_watermark():
    w = windows(lateness_min=1)
    out = w.add(frame([("a", T0 + 10 * MINUTE_MS, 0, "ok", 1.0), ("b", T0, 0, "ok", 1.0)]))
    assert out.late_index == [1]


def test_duplicates_in_one_batch_and_across_batches_count_once():
    w = windows()
    first = w.add(frame([("a", T0, 0, "ok", 1.0), ("a", T0, 0, "ok", 1.0), ("b", T0, 0, "ok", 1.0)]))
    again = w.add(frame([("a", T0, 1, "ok", 1.0), ("c", T0, 0, "ok", 1.0)]))
    assert (first.duplicates, again.duplicates) == (1, 1)
    rows, _ = w.close(None)
    assert rows["requests"].sum() == 3


def test_dedupe_memory_is_released_when_a_minute_closes():
    w = windows(lateness_min=1)
    w.add(frame([(f"e{i}", T0 + i, 0, "ok", 1.0) for i in range(50)]))
    assert w.dedupe_ids == 50
    w.add(frame([("later", T0 + 5 * MINUTE_MS, 0, "ok", 1.0)]))
    before = w.closable_before({0}, set())
    w.close(before)
    assert w.dedupe_ids == 1


def test_minutes_close_only_when_every_assigned_partition_has_passed():
    w = windows(lateness_min=1)
    w.add(frame([("a", T0, 0, "ok", 1.0), ("b", T0 + 10 * MINUTE_MS, 0, "ok", 1.0)]))
    assert w.closable_before({0, 1}, set()) is None  # partition 1 not heard from yet
    assert w.closable_before({0, 1}, {1}) == T0 // MINUTE_MS + 9  # 1 is empty (at end of log)
    w.add(frame([("c", T0 + 3 * MINUTE_MS, 1, "ok", 1.0)]))
    assert w.closable_before({0, 1}, set()) == T0 // MINUTE_MS + 2


def test_event_for_a_closed_minute_is_late():
    w = windows(lateness_min=1)
    w.add(frame([("a", T0, 0, "ok", 1.0), ("b", T0 + 10 * MINUTE_MS, 0, "ok", 1.0)]))
    w.close(w.closable_before({0}, set()))
    out = w.add(frame([("c", T0 + 30, 1, "ok", 1.0)]))  # a new partition, but minute 0 is closed
    assert out.late_index == [0]


RESTORE_ROWS = [(f"e{i}", T0 + i * 7_000, i % 2, "ok" if i % 7 else "timeout", float(i % 50 + 1)) for i in range(120)]


def assert_restored_closes_as_whole(counts, hist, seen, watermarks, closed_before_minute):
    """Windows restored from saved open state, then given every row again (a redelivery of
    the saved part too: deduped), close the same buckets as one pass over the rows."""
    whole = windows()
    whole.add(frame(RESTORE_ROWS))
    expected, _ = whole.close(None)
    second = windows()
    second.restore(counts, hist, seen, watermarks, closed_before_minute)
    second.add(frame(RESTORE_ROWS))
    got, _ = second.close(None)
    key = ["window_start", "tenant"]
    assert got.sort(key).equals(expected.sort(key))


@pytest.mark.parametrize("split,concatenated", [(1, False), (3, False), (7, False), (7, True)])
def test_restore_from_unsaved_parts_gives_the_same_buckets(split, concatenated):
    rows = RESTORE_ROWS
    first = windows()
    for i in range(split):
        first.add(frame(rows[i * 10: (i + 1) * 10]))
    saved = first.take_unsaved()
    if concatenated:  # as a checkpoint stores them: one delta frame of many batches
        saved.counts, saved.hist = [pl.concat(saved.counts)], [pl.concat(saved.hist)]
    assert_restored_closes_as_whole(saved.counts, saved.hist, saved.seen, first.watermark_ms, first.closed_before_minute)


def test_restore_through_a_store_checkpoint_gives_the_same_buckets(tmp_path):
    """The open state written by a checkpoint (deltas, dedupe runs of many minutes in one
    insert) and read back by a restarted worker closes the same buckets, and dedupes."""
    from tailwatch.store.checkpoint import Checkpoint, TopicCheckpoint, load_topic_state, write_checkpoint
    from tailwatch.store.connection import connect

    rows = RESTORE_ROWS
    first = windows()
    for i in range(3):
        first.add(frame(rows[i * 25: (i + 1) * 25]))  # three batches over four minutes
    unsaved = first.take_unsaved()
    assert len({m for m, _ in unsaved.seen}) > 1
    con = connect(tmp_path / "s.duckdb")
    write_checkpoint(con, Checkpoint(topics=[TopicCheckpoint(
        topic="t", table="sli_minute", closed=pl.DataFrame(), closed_minutes=[], counts=unsaved.counts,
        hist=unsaved.hist, seen=unsaved.seen, watermarks=dict(first.watermark_ms), closed_before_minute=None)],
        next_offsets={}))
    back = load_topic_state(con, "t")
    assert sorted((m, h.tolist()) for m, h in back.seen) == sorted((m, h.tolist()) for m, h in unsaved.seen)
    assert_restored_closes_as_whole(back.counts, back.hist, back.seen, back.watermarks, back.closed_before_minute)


def test_checkpoints_keep_each_partitions_offset_watermark_and_each_topics_frontier(tmp_path):
    """Offsets and watermarks are set together for every partition, each leaving the other as
    the last checkpoint left it; frontiers per topic."""
    from tailwatch.store.checkpoint import Checkpoint, TopicCheckpoint, load_topic_state, write_checkpoint
    from tailwatch.store.connection import connect

    def topic(name, watermarks, closed_before):
        return TopicCheckpoint(topic=name, table="sli_minute", closed=pl.DataFrame(), closed_minutes=[], counts=[],
                               hist=[], seen=[], watermarks=watermarks, closed_before_minute=closed_before)

    con = connect(tmp_path / "s.duckdb")
    write_checkpoint(con, Checkpoint(topics=[topic("a", {0: T0, 1: T0 + 5}, 7), topic("b", {}, None)],
                                     next_offsets={("a", 0): 10, ("a", 1): 11, ("b", 0): 12}))
    write_checkpoint(con, Checkpoint(topics=[topic("a", {1: T0 + 9}, 8), topic("b", {2: T0 + 1}, 3)],
                                     next_offsets={("a", 0): 20, ("b", 0): 22}))
    assert con.execute("SELECT topic, part, next_offset, watermark_ms FROM _tw_offsets ORDER BY ALL").fetchall() == [
        ("a", 0, 20, T0), ("a", 1, 11, T0 + 9), ("b", 0, 22, None), ("b", 2, None, T0 + 1)]
    a, b = load_topic_state(con, "a"), load_topic_state(con, "b")
    assert (a.watermarks, a.closed_before_minute) == ({0: T0, 1: T0 + 9}, 8)
    assert (b.watermarks, b.closed_before_minute) == ({2: T0 + 1}, 3)


def test_minutes_without_any_latency_field_close_with_empty_histograms():
    w = windows()
    w.add(frame([(f"e{i}", T0 + i * 1000, 0, "ok", None) for i in range(3)]))
    closed, _minutes = w.close(None)
    assert closed["requests"].to_list() == [3]
    assert closed["e2e_ms_hist"].to_list() == [[]] and closed["e2e_ms_p95"].to_list() == [None]


def test_a_partition_owned_elsewhere_holds_the_frontier_and_an_idle_one_does_not():
    w = windows(lateness_min=1)
    w.add(frame([(f"a{i}", T0 + i * MINUTE_MS, 0, "ok", 10.0) for i in range(10)]))
    w.add(frame([("b0", T0, 1, "ok", 10.0)]))
    # Partition 1 is not ours right now: it holds at its watermark (T0), read to its end or not.
    assert w.closable_before({0, 1}, read_to_end={0}) == T0 // MINUTE_MS - 1
    # Ours and read to its end, 9 minutes behind the newest (> the 1-minute idle timeout): idle.
    assert w.closable_before({0, 1}, read_to_end={0, 1}) == T0 // MINUTE_MS + 8
    assert w.idle_partitions({0, 1}, {0, 1}) == {1}
    # A partition never heard from holds everything unless it is read to its end (empty or all poison).
    assert w.closable_before({0, 1, 2}, read_to_end={0, 1}) is None
    assert w.closable_before({0, 1, 2}, read_to_end={0, 1, 2}) == T0 // MINUTE_MS + 8


def gpu_frame(rows):
    """rows: dicts of gpu.v1 fields plus ts_ms and partition."""
    from tailwatch.streams.frames import GPU_COLUMNS

    data = {c: [r.get(c) for r in rows] for c in GPU_COLUMNS}
    data.update(ts_ms=[r["ts_ms"] for r in rows], _partition=[0] * len(rows), _offset=list(range(len(rows))),
                _index=list(range(len(rows))))
    schema = {**GPU_COLUMNS, "ts_ms": pl.Int64, "_partition": pl.Int32, "_offset": pl.Int64, "_index": pl.Int64}
    return pl.DataFrame(data, schema=schema)


def test_two_sources_for_one_gpu_make_one_row_merged_field_by_field():
    from tailwatch.streams.aggregates import GPU

    gpu = {"node": "n0", "gpu_index": 0, "pool": "p", "zone": "z", "gpu_sku": "H100"}
    nvml = [{**gpu, "ts_ms": T0 + i * 2000, "util_pct": 90.0, "power_w": 200.0, "sm_active_pct": 30.0} for i in range(0, 30, 2)]
    runtime = [{**gpu, "ts_ms": T0 + i * 2000, "model": "llm", "model_version": "v1", "replica_state": "warm",
                "queue_depth": 3} for i in range(1, 30, 2)]
    # The newest sample of the minute is the collector's, which carries no model or state.
    nvml.append({**gpu, "ts_ms": T0 + 59_999, "util_pct": 90.0})
    for split in (1, 4):  # one batch, or several: partials merge to the same row
        w = MinuteWindows(GPU, MINUTE_MS)  # batches interleave in time: within the allowed lateness
        rows = sorted(nvml + runtime, key=lambda r: r["ts_ms"])
        for k in range(split):
            w.add(gpu_frame(rows[k::split]))
        closed, _ = w.close(None)
        row = closed.row(0, named=True)
        assert closed.height == 1 and row["samples"] == 31
        assert (row["model"], row["model_version"], row["replica_state"]) == ("llm", "v1", "warm")
        assert row["util_pct_mean"] == 90.0 and row["queue_depth_max"] == 3 and row["sm_active_pct_mean"] == 30.0
        assert row["sources"] == "nvml,runtime"


def test_gpu_partials_merged_and_unmerged_close_together():
    from tailwatch.streams.aggregates import GPU

    w = MinuteWindows(GPU, MINUTE_MS)
    gpu = {"node": "n0", "gpu_index": 0, "pool": "p"}
    for batch in range(6):  # more batches than COUNTS_AT: one minute merged, the next one not
        w.add(gpu_frame([{**gpu, "ts_ms": T0 + batch * 1000, "util_pct": 50.0},
                         {**gpu, "gpu_index": 1, "ts_ms": T0 + MINUTE_MS + batch, "replica_state": "warm"}][: 1 + (batch == 0)]))
    closed, minutes = w.close(None)
    assert closed.height == 2 and sorted(closed["samples"].to_list()) == [1, 6]


@pytest.mark.parametrize("batches,own_tenant", [(2, True), (2, False), (5, False)])
def test_thin_minutes_from_several_batches_close_as_one_batch_would(batches, own_tenant):
    # Six thin minutes whose events came in `batches` batches, each one partition's: with a
    # tenant per partition (their bins never repeat across a minute's parts) or one tenant for
    # all (they do), few parts a minute or many. The rows, peeked at open and closed, are those
    # of one batch of every event.
    events = [(f"e{i}", T0 + i * 1500, i % batches, "ok" if i % 7 else "error", float(1 + i % 97 * 13))
              for i in range(240)]

    def tenants(f: pl.DataFrame) -> pl.DataFrame:
        return f.with_columns(pl.format("t{}", pl.col("_partition")).alias("tenant")) if own_tenant else f

    whole = windows()
    whole.add(tenants(frame(events)))
    expected, minutes = whole.close(None)
    parts = windows()
    for b in range(batches):
        parts.add(tenants(frame([e for e in events if e[2] == b])))
    assert len(parts.hist.runs) == batches  # kept apart: closing merges them
    key = ["window_start", "tenant"]
    assert parts.peek().sort(key).equals(expected.sort(key))  # the view's look at them, as they will close
    got, same_minutes = parts.close(None)
    assert same_minutes == minutes and len(minutes) == 6
    assert got.sort(key).equals(expected.sort(key))


def test_compacted_strings_keep_their_values_and_nulls():
    # compact_strings copies string columns (rows the detectors hold must not pin their
    # batches' buffers); a copy that lost a value or turned a null into "" would change every label.
    from tailwatch.slo.columns import compact_strings

    long_name = "a-model-name-longer-than-twelve-bytes"
    source = pl.DataFrame({"model": [long_name, None, "m", long_name * 3], "n": [1, 2, 3, 4]})
    cut = source.filter(pl.col("n") != 3)
    copied = compact_strings(cut)
    assert copied.schema == cut.schema
    assert copied.to_dict(as_series=False) == {"model": [long_name, None, long_name * 3], "n": [1, 2, 4]}


def test_a_bounded_close_takes_the_oldest_minutes_up_to_its_rows_and_the_rest_as_one_close_would():
    """A backlog closes in steps of about `max_rows` rows (the checkpoint's memory bound): each
    step the oldest minutes up to the one that reaches the bound, the frontier just past them;
    together the steps close exactly the minutes and rows of one unbounded close."""
    events = [(f"e{i}", T0 + (i // 30) * MINUTE_MS + i, 0, "ok" if i % 9 else "error", float(i % 40 + 1))
              for i in range(360)]  # 12 minutes of 30 requests, in order
    f = frame(events)
    f = f.with_columns((pl.lit("t") + (pl.col("_index") % 5).cast(pl.String)).cast(f.schema["tenant"]).alias("tenant"))
    whole, bounded = windows(), windows()
    whole.add(f)
    bounded.add(f)
    first = T0 // MINUTE_MS
    before = first + 10
    expect, expect_minutes = whole.close(before)
    parts, steps, frontiers = [], [], []
    while True:
        rows, minutes = bounded.close(before, max_rows=12)
        parts.append(rows)
        steps.append(minutes)
        frontiers.append(bounded.closed_before_minute)
        if not bounded.open_before(before):
            break
    assert [len(m) for m in steps] == [3, 3, 3, 1]  # 5 rows a minute: each step ends at the minute reaching 12
    assert frontiers == [first + 3, first + 6, first + 9, before]
    assert [m for step in steps for m in step] == expect_minutes
    order = ["window_start", "tenant"]
    assert pl.concat(parts).sort(order).equals(expect.sort(order))
    assert bounded.open_minutes() == whole.open_minutes() == [first + 10, first + 11]


def test_an_open_minute_checkpointed_with_int64_fixed_sums_merges_with_int128_partials():
    """Checkpoints written before GPU- and audio-seconds were Int128 sums hold them as Int64: a
    restored minute takes new partials past 2⁶³ micro-seconds and closes with the exact sum."""
    old = windows()
    old.add(frame([("a", T0, 0, "ok", 1.0)]).with_columns(pl.lit(1.5).alias("gpu_seconds")))
    saved = old.take_unsaved()
    blob = saved.counts[0].with_columns(pl.col("_gpu_seconds_fixed", "_audio_seconds_fixed").cast(pl.Int64))
    w = windows()
    w.restore([blob], saved.hist, saved.seen, dict(old.watermark_ms), None)
    w.add(frame([(f"e{i}", T0 + i, 0, "ok", 1.0) for i in range(10_000)]).with_columns(pl.lit(1e9).alias("gpu_seconds")))
    rows, _ = w.close(None)
    assert rows.select("requests", "gpu_seconds").rows() == [(10_001, 10_000 * 10**9 + 1.5)]


def test_minutes_are_printed_as_times_with_runs_as_ranges():
    from tailwatch.slo.alert_windows import minutes_text

    m = 29_892_964  # 2026-11-02 00:04 UTC
    assert minutes_text([m + 2, m, m + 1, m + 10, m + 2000]) == \
        "2026-11-02 00:04–00:06, 2026-11-02 00:14, 2026-11-03 09:24"
    midnight = m - 4
    assert minutes_text([midnight + 1439, midnight + 1440]) == "2026-11-02 23:59–2026-11-03 00:00"  # a run across days
    assert minutes_text(list(range(m, m + 40, 2)), most=3).endswith("and 17 more runs")
    assert str(m) not in minutes_text([m])
