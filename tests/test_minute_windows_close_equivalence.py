"""Closing many minutes at once (the sort-merge of histogram bins, their lists cut at group
boundaries, count partials conformed once) gives the rows the plain group-by path gives:
randomized thin minutes, old path against new. Pure, no Kafka."""

import io
import json
import random

import numpy as np
import polars as pl
import pytest

from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.frames import REQUEST_COLUMNS
from tailwatch.streams.minute_windows import (MINUTE_MS, MinuteWindows, _bin_lists, concat_by_name,
                                              sorted_bins)
from tailwatch.streams.partials import json_lines, sli_keys, sli_records

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS
TENANTS = ["acme", "initech", "globex", "umbrella", "hooli", "", None]
LATENCIES = ("queue_ms", "first_output_ms", "e2e_ms", "inter_token_ms")
KEYS = ["window_start", *REQUESTS.keys]


def batch(rng: random.Random, start: int, minutes: int, events: int, first_id: int) -> pl.DataFrame:
    """A batch of thin traffic over `minutes` minutes from `start`: a few slices, latencies
    sometimes missing or known only as a bucket, phases now and then."""
    data = {c: [None] * events for c in REQUEST_COLUMNS}
    data.update(ts_ms=[], _partition=[], _offset=[], _index=[])
    for i in range(events):
        data["event_id"][i] = f"e{first_id + i}"
        data["tenant"][i] = rng.choice(TENANTS)
        for c, v in (("model", rng.choice(["m1", "m2"])), ("model_version", "v1"), ("zone", rng.choice(["z1", "z2"])),
                     ("workload", "llm"), ("traffic_class", "realtime"), ("deployment", "stable"), ("pool", "p")):
            data[c][i] = v
        data["status"][i] = rng.choice(["ok", "ok", "ok", "error", "timeout", "cancelled"])
        data["attempt"][i] = 1
        for name in LATENCIES:
            if rng.random() < 0.8:
                data[name][i] = rng.lognormvariate(4, 1.5)
                if rng.random() < 0.1:
                    data[name.replace("_ms", "_lower_ms")][i] = data[name][i] / rng.uniform(1.5, 4)
        data["prompt_tokens"][i] = rng.randrange(1, 4000)
        data["output_tokens"][i] = rng.randrange(1, 400)
        data["gpu_seconds"][i] = rng.uniform(0, 3)
        if rng.random() < 0.2:
            data["stages"][i] = [{"stage": rng.randrange(15), "ms": rng.uniform(1, 500)} for _ in range(rng.randrange(1, 4))]
        data["ts_ms"].append(start + rng.randrange(minutes * MINUTE_MS))
        data["_partition"].append(rng.randrange(3))
        data["_offset"].append(first_id + i)
        data["_index"].append(i)
    schema = {**REQUEST_COLUMNS, "ts_ms": pl.Int64, "_partition": pl.Int32, "_offset": pl.Int64, "_index": pl.Int64}
    return pl.DataFrame(data, schema=schema)


def fed(seed: int) -> MinuteWindows:
    """Windows over a backlog of thin minutes, batches overlapping so that minutes hold
    several partials and some slices (and bins) repeat across them."""
    rng = random.Random(seed)
    w = MinuteWindows(REQUESTS, 10**12)
    first_id = 0
    for b in range(rng.randrange(8, 20)):
        events = rng.randrange(5, 200)
        w.add(batch(rng, T0 + b * 3 * MINUTE_MS, rng.randrange(1, 8), events, first_id))
        first_id += events
    return w


def old_close(w: MinuteWindows, before: int | None) -> pl.DataFrame:
    """The rows closing gave before: every partial of the closing minutes through the plain
    group-bys, finished by `finish` (which sorts the bins and groups them into lists itself)."""
    closing = pl.col("_minute") < (before if before is not None else 2**62)
    # Each batch's partials, as it added them (whatever the windows merged since).
    counts = w._merge_counts([f.filter(closing) for f in w.unsaved.counts], grouped=False)
    hist = pl.concat([f.filter(closing) for f in w.unsaved.hist])
    return w.finish(counts, w._merge_hist([hist], grouped=False))


@pytest.mark.parametrize("seed", range(8))
def test_closing_many_minutes_gives_the_rows_of_the_group_by_path(seed):
    w = fed(seed)
    minutes = sorted(w._open)
    before = minutes[len(minutes) * 2 // 3]
    expected = old_close(w, before)
    held = [set(f["_minute"].to_list()) for f in w.unsaved.hist]
    assert any(sum(m in h for h in held) > 1 for m in minutes if m < before)  # repeats to merge
    assert len(w.counts.runs) < len(w.unsaved.counts)  # and some batches merged already
    rows, closed = w.close(before)
    assert closed == [m for m in minutes if m < before]
    assert rows.height == expected.height > 0
    assert rows.sort(KEYS, nulls_last=True).equals(expected.sort(KEYS, nulls_last=True))
    # One order, whatever the group-bys did: minutes, then slices.
    again = fed(seed).close(before)[0]
    assert rows.equals(again)
    assert rows["window_start"].is_sorted()


@pytest.mark.parametrize("seed", range(4))
def test_peek_gives_the_rows_of_the_group_by_path(seed):
    w = fed(100 + seed)
    assert w.peek().sort(KEYS, nulls_last=True).equals(old_close(w, None).sort(KEYS, nulls_last=True))


def random_bins(rng: np.random.Generator, rows: int, minutes: int = 10) -> pl.DataFrame:
    return pl.DataFrame({
        "_minute": 29_000_000 + rng.integers(0, 10, rows) * (minutes // 10), "_slice": rng.integers(0, 2**64, rows, dtype=np.uint64) % 7,
        "field": rng.integers(0, 70, rows).astype(np.int8), "bin": rng.integers(-40, 300, rows).astype(np.int16),
        "n": rng.integers(-3, 9, rows).astype(np.int32)})


@pytest.mark.parametrize("rows,minutes", [(1, 10), (2, 10), (50, 10), (5000, 10), (5000, 10**6)])
def test_sorted_bins_is_the_group_by_sorted(rows, minutes):
    """`minutes`: the span (past 2**16 the minutes are sorted as they are, not as offsets)."""
    hist = random_bins(np.random.default_rng(rows), rows, minutes)
    expected = hist.group_by("_minute", "_slice", "field", "bin").agg(pl.col("n").sum()).sort("_minute", "_slice", "field", "bin")
    got = sorted_bins(hist)
    assert got.equals(expected) and got.schema == hist.schema
    if rows > 50:
        assert got.height < rows  # some keys repeated and were summed
    lists = got.group_by("_minute", "_slice", "field", maintain_order=True).agg(
        pl.struct(pl.col("bin"), pl.col("n").cast(pl.Int64)).alias("hist"))
    assert _bin_lists(got).equals(lists)


def test_sorted_bins_of_no_rows_keeps_the_columns():
    hist = random_bins(np.random.default_rng(0), 3).head(0)
    assert sorted_bins(hist).schema == hist.schema and sorted_bins(hist).height == 0


def test_count_partials_that_do_not_line_up_merge_as_each_conformed():
    """Partials from an older checkpoint lack newer columns: conformed one by one, as before."""
    w = fed(7)
    frames = w.unsaved.counts
    older = [f.drop("successful_audio_ms", "voice") if i % 3 == 0 else f for i, f in enumerate(frames)]
    merged = w._conformed(older)
    expected = concat_by_name([w._conform(f) for f in older])
    assert merged.equals(expected)
    aligned = w._conformed(frames)
    assert aligned.equals(concat_by_name([w._conform(f) for f in frames]))


def test_sli_records_are_the_lines_of_write_ndjson():
    w = fed(3)
    rows, _ = w.close(None)
    records = list(sli_records(rows, REQUESTS))
    keys = [k for k in REQUESTS.keys if k in rows.columns]
    shaped = rows.with_columns(pl.lit("requests_minute.v1").alias("schema"),
                               pl.col("window_start").dt.epoch("ms").alias("window_start"))
    expected = list(zip(sli_keys(shaped, keys), shaped.write_ndjson().encode().splitlines()))
    assert records == expected and len(records) == rows.height
    buf = io.BytesIO()
    shaped.write_ndjson(buf)
    assert b"\n".join(line for _, line in records) + b"\n" == buf.getvalue()


def test_json_lines_are_write_ndjsons_lines_for_hostile_values():
    """Label values a producer sent (quotes, escapes, control characters, line separators,
    emoji), floats no JSON number holds, nulls inside and instead of histograms."""
    rows = pl.DataFrame(
        {"tenant": ['a"b', "\u00e9\u2028x", "\x00\x1f\n", None, "\\", "emoji \U0001F600", "", "tab\t\r"],
         "p99_ms": [1.0, float("nan"), float("inf"), -0.0, None, 1e300, 1.2345678901234567e-7, -float("inf")],
         "requests": [2**62, -1, None, 0, 5, 6, 7, 8],
         "queue_ms_hist": [[{"bin": 1, "n": 2}], None, [], [{"bin": None, "n": 3}], None, None, None, None],
         "stable": [True, False, None, True, True, True, True, True]},
        schema_overrides={"queue_ms_hist": pl.List(pl.Struct({"bin": pl.Int16, "n": pl.Int64}))})
    assert json_lines(rows) == rows.write_ndjson().encode().splitlines()
    assert [json.loads(line)["tenant"] for line in json_lines(rows)] == rows["tenant"].to_list()


def test_finishing_rows_out_of_key_order_falls_back_to_joins():
    """Rows not sorted by (minute, slice) cannot be placed by position: joined, the same rows."""
    w = fed(11)
    counts, hist = w._merged(w.counts.peek(reduced=True), w.hist.peek(reduced=False))
    shuffled = counts.sample(fraction=1.0, shuffle=True, seed=1)
    assert not shuffled.equals(counts)
    placed = w._finish(counts, hist, bins_sorted=True)
    joined = w._finish(shuffled, hist, bins_sorted=True)
    assert placed.sort(KEYS, nulls_last=True).equals(joined.sort(KEYS, nulls_last=True))
    assert placed.sort(KEYS, nulls_last=True).equals(w.finish(counts, hist).sort(KEYS, nulls_last=True))


def gpu_batch(rng: random.Random, start: int, minutes: int, samples: int) -> pl.DataFrame:
    """GPU samples of a few GPUs from several sources: sums, maxima and newest labels to merge."""
    from tailwatch.streams.frames import GPU_COLUMNS

    rows = []
    for _ in range(samples):
        row = {c: None for c in GPU_COLUMNS}
        row.update(node=f"n{rng.randrange(4)}", gpu_index=rng.randrange(2), zone=rng.choice(["z1", "z2", None]),
                   pool=rng.choice(["p1", "p2"]), gpu_sku="H100", source=rng.choice(["nvml", "dcgm", "runtime"]),
                   ts_ms=start + rng.randrange(minutes * MINUTE_MS))
        if row["source"] == "runtime":
            row.update(model=rng.choice(["m1", "m2"]), model_version="v1", replica_state=rng.choice(["warm", "busy"]),
                       queue_depth=rng.randrange(10), running=rng.randrange(5))
        else:
            row.update(util_pct=rng.uniform(0, 100), power_w=rng.uniform(50, 700), temp_c=rng.uniform(30, 90),
                       mem_used_bytes=rng.randrange(10**11), mem_total_bytes=8 * 10**10, xid_errors=rng.randrange(2))
        rows.append(row)
    data = {c: [r[c] for r in rows] for c in GPU_COLUMNS}
    data.update(ts_ms=[r["ts_ms"] for r in rows], _partition=[rng.randrange(2) for _ in rows],
                _offset=list(range(len(rows))), _index=list(range(len(rows))))
    schema = {**GPU_COLUMNS, "ts_ms": pl.Int64, "_partition": pl.Int32, "_offset": pl.Int64, "_index": pl.Int64}
    return pl.DataFrame(data, schema=schema)


@pytest.mark.parametrize("seed", range(4))
def test_closing_gpu_minutes_gives_the_rows_of_the_group_by_path(seed):
    from tailwatch.streams.aggregates import GPU

    rng = random.Random(seed)
    w = MinuteWindows(GPU, 10**12)
    for b in range(rng.randrange(6, 14)):
        w.add(gpu_batch(rng, T0 + b * 2 * MINUTE_MS, rng.randrange(1, 6), rng.randrange(5, 120)))
    batches = w.unsaved.counts  # each batch's partials, as it added them
    held = [set(f["_minute"].to_list()) for f in batches]
    assert any(sum(m in h for h in held) > 1 for m in w._open)  # minutes of several batches, to merge
    expected = w.finish(w._merge_counts(batches, grouped=False), None)
    rows, _ = w.close(None)
    keys = ["window_start", *GPU.keys]
    assert rows.height == expected.height > 0
    assert rows.sort(keys).equals(expected.sort(keys))
    assert rows.select(keys).is_unique().all()
