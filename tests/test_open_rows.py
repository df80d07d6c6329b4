"""Open minutes' partial rows kept per batch (streams/open_rows.py): what is taken and peeked
is every row added and not yet taken, merged per key; dense batches stay about a row per key;
a backlog that cannot close is copied only about log(batches) times. Pure, no Kafka."""

import math
import random

import numpy as np
import polars as pl
import pytest

from tailwatch.streams.open_rows import OpenRows


def reduce(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.group_by("_minute", "key").agg(pl.col("n").sum()).select(frame.columns)


def batch(rng: random.Random, first_minute: int, minutes: int, rows: int) -> pl.DataFrame:
    """One batch's partials: keys unique per minute, as a group-by leaves them, in no order."""
    keys = {(first_minute + rng.randrange(minutes), rng.randrange(6)) for _ in range(rows)}
    return pl.DataFrame({"_minute": [m for m, _ in keys], "key": [k for _, k in keys],
                         "n": [rng.randrange(1, 9) for _ in keys]}, schema={"_minute": pl.Int64, "key": pl.Int64, "n": pl.Int64})


def summed(frames: list[pl.DataFrame]) -> pl.DataFrame:
    if not frames:
        return pl.DataFrame(schema={"_minute": pl.Int64, "key": pl.Int64, "n": pl.Int64})
    return reduce(pl.concat(frames)).sort("_minute", "key")


@pytest.mark.parametrize("keep_minute", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_taken_and_peeked_rows_are_every_row_added_and_not_taken(seed, keep_minute):
    rng = random.Random(seed)
    rows = OpenRows(reduce, pl.concat, keep_minute, fan_in=rng.choice([2, 4]))
    added: list[pl.DataFrame] = []
    taken_before = -(2**62)
    for step in range(rng.randrange(20, 60)):
        first = taken_before + rng.randrange(0, 4) if step else 1000
        frame = batch(rng, max(first, taken_before), rng.randrange(1, 12), rng.randrange(1, 40))
        rows.add(frame)
        added.append(frame)
        if rng.random() < 0.3:
            held = summed([f.filter(pl.col("_minute") >= taken_before) for f in added])
            assert rows.peek(reduced=True).sort("_minute", "key").equals(held)
            peeked = rows.peek(reduced=False)
            assert summed([peeked]).equals(held)  # unreduced: keys may repeat, the sums are the same
        if rng.random() < 0.25:
            cut = taken_before + rng.randrange(1, 8)
            got = rows.take_before(cut, reduced=True)
            want = summed([f.filter((pl.col("_minute") >= taken_before) & (pl.col("_minute") < cut)) for f in added])
            assert (got.sort("_minute", "key") if got is not None else summed([])).equals(want)
            if got is not None:
                assert got.select("_minute", "key").is_unique().all()
            taken_before = cut
            assert rows.minutes().size == 0 or rows.minutes().min() >= cut
    rest = rows.take_before(None, reduced=True)
    want = summed([f.filter(pl.col("_minute") >= taken_before) for f in added])
    assert (rest.sort("_minute", "key") if rest is not None else summed([])).equals(want)
    assert not rows and rows.peek(reduced=True) is None


def test_rows_by_minute_and_drop_from():
    rows = OpenRows(reduce, pl.concat, True, fan_in=4)
    rows.add(pl.DataFrame({"_minute": [5, 3, 3, 4], "key": [0, 0, 1, 0], "n": [1, 1, 1, 1]}))
    rows.add(pl.DataFrame({"_minute": [4, 6], "key": [0, 0], "n": [1, 1]}))
    assert rows.rows_by_minute() == {3: 2, 4: 2, 5: 1, 6: 1}  # minute 4's key in two runs counts twice
    rows.drop_from(5)
    assert rows.minutes().tolist() == [3, 4]
    assert rows.take_before(None, reduced=True).sort("_minute", "key").to_dicts() == [
        {"_minute": 3, "key": 0, "n": 1}, {"_minute": 3, "key": 1, "n": 1}, {"_minute": 4, "key": 0, "n": 2}]


def test_dense_batches_of_the_same_minute_stay_about_a_row_per_key():
    rows = OpenRows(reduce, pl.concat, True, fan_in=4)
    keys = 500
    for b in range(40):
        rows.add(pl.DataFrame({"_minute": [7] * keys, "key": list(range(keys)), "n": [1] * keys}))
        held = sum(r.frame.height for r in rows.runs)
        assert held <= keys * 5, (b, held)  # as merging a minute's parts at 4 kept it
    assert rows.take_before(8, reduced=True)["n"].to_list() == [40] * keys


def test_a_backlog_that_cannot_close_is_copied_about_log_batches_times():
    """Thin batches of distinct minutes, none taken: merging whatever is newest would copy the
    growing backlog once per batch; merged a level at a time, each row about log4(batches)."""
    copied = [0]

    def counting_concat(frames):
        copied[0] += sum(f.height for f in frames)
        return pl.concat(frames)

    rows = OpenRows(reduce, counting_concat, True, fan_in=4)
    batches, per_batch = 1024, 50
    for b in range(batches):
        rows.add(pl.DataFrame({"_minute": np.repeat(np.arange(b * 10, b * 10 + 10), 5), "key": np.tile(np.arange(5), 10),
                               "n": np.ones(per_batch, dtype=np.int64)}))
    levels = math.log(batches, 4)
    assert copied[0] <= batches * per_batch * (levels + 1), copied[0]
    assert len(rows.runs) <= 3 * (levels + 1)
    assert rows.peek(reduced=True).height == batches * per_batch
