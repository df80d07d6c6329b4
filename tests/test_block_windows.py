"""Bounded SLO windows against a brute-force sum of every minute: exact at minute resolution
and before the history fills a window, off by no more than the oldest block's pro-rata share
beyond, corrected by late minutes, and within 0.1% of a month's events on real traffic shapes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailwatch.slo.block_windows import CHUNK, RESOLUTIONS, BlockWindows
from tailwatch.slo.engine import SloTable
from tailwatch.slo.spec import SloSpec
from tailwatch.slo.alert_windows import default_catalog

LENGTHS = (5, 30, 60, 90, 120, 360, 500, 1440)


def _block_of(length: int) -> int:
    return next(block for block, serves in RESOLUTIONS if length <= serves)


def _exact(per_minute: np.ndarray, now: int, length: int) -> np.ndarray:
    """Sum over minutes (now − length, now] of a (minutes, slices) array."""
    return per_minute[max(0, now - length + 1): now + 1].sum(axis=0)


def _oldest_block(per_minute: np.ndarray, now: int, length: int) -> np.ndarray:
    """The events of the oldest block a window of this length reads (what pro-rata may misplace)."""
    b = _block_of(length)
    tail = (now - length + 1) // b
    return per_minute[max(0, tail * b): max(0, (tail + 1) * b)].sum(axis=0)


@pytest.mark.slow
@given(st.integers(0, 2**32 - 1))
@settings(max_examples=25, deadline=None)
def test_sums_equal_brute_force_within_the_oldest_block(seed):
    rng = np.random.default_rng(seed)
    minutes, slices = 2200, 3
    valid = rng.poisson(rng.uniform(0, 40, slices), (minutes, slices)) * (rng.random((minutes, slices)) < 0.7)
    good = rng.binomial(valid, 0.97)
    w = BlockWindows(LENGTHS)
    w.add_slices(1)
    joined = np.sort(rng.integers(0, 600, slices - 1))  # two slices appear later (nothing before they join)
    for k, at in enumerate(joined, 1):
        valid[:at, k] = good[:at, k] = 0
    seen = 1
    for now in range(minutes):
        while seen < slices and joined[seen - 1] <= now:
            w.add_slices(1)
            seen += 1
        if rng.random() < 0.9:  # some minutes are skipped: the windows still move
            w.advance(now)
            cols = np.arange(seen)
            w.add(cols, now, good[now, :seen], valid[now, :seen])
        else:
            w.advance(now)
            good[now] = valid[now] = 0
        if now % 7 and now < minutes - 1:
            continue
        for length in LENGTHS:
            got_good, got_valid = w.sums(length)
            exact_good, exact_valid = _exact(good, now, length)[:seen], _exact(valid, now, length)[:seen]
            if _block_of(length) == 1 or now < length:
                assert np.array_equal(got_valid, exact_valid) and np.array_equal(got_good, exact_good), (length, now)
            else:
                bound = _oldest_block(valid, now, length)[:seen] + 1e-9
                assert (np.abs(got_valid - exact_valid) <= bound).all(), (length, now)
                assert (np.abs(got_good - exact_good) <= bound).all(), (length, now)
            assert (got_good <= got_valid + 1e-9).all()


def test_even_traffic_is_exact_at_every_resolution():
    w = BlockWindows(LENGTHS)
    w.add_slices(2)
    for now in range(3000):
        w.advance(now)
        w.add(np.array([0, 1]), now, np.array([9, 0]), np.array([10, 3]))
    for length in LENGTHS:
        good, valid = w.sums(length)
        assert good == pytest.approx([9 * length, 0]) and valid == pytest.approx([10 * length, 3 * length])


def test_a_late_minute_corrects_every_window_that_holds_it():
    w = BlockWindows(LENGTHS)
    w.add_slices(1)
    for now in range(1000):
        w.advance(now)
        w.add(np.array([0]), now, np.array([10]), np.array([10]))
    w.add(np.array([0]), 990, np.array([0]), np.array([50]))  # 50 failures of minute 990, arriving at 999
    assert w.sums(5)[1][0] == 50  # 995..999: not in it
    assert w.sums(30)[1][0] == 300 + 50
    assert w.sums(1440)[1][0] == pytest.approx(10_000 + 50)  # fewer minutes than the window: exact
    w.add(np.array([0]), 100, np.array([0]), np.array([7]))  # older than the minute ring: only the longer windows
    assert w.sums(60)[1][0] == 600 + 50 and w.sums(1440)[1][0] == pytest.approx(10_000 + 57)


def test_memory_per_slice_is_fixed_by_the_catalog_not_the_traffic():
    lengths = {30 * 1440} | {m for aw in default_catalog() for m in (aw.long_minutes, aw.short_minutes)}
    w = BlockWindows(lengths)
    assert [(r.block, r.slots) for r in w.rings] == [(1, 61), (5, 73), (60, 721)]
    assert w.bytes_per_slice() == 8 * (61 + 73 + 721)
    w.add_slices(3)
    assert w.rings[2].chunks[0].shape[1] < 100  # a small table holds a small chunk
    w.add_slices(CHUNK)  # a second chunk; the first, full, is not copied again
    first = w.rings[0].chunks[0]
    w.add_slices(5)
    assert w.rings[0].chunks[0] is first and first.shape[1] == CHUNK and len(w.rings[0].chunks) == 2
    assert w.nbytes() <= 2 * (CHUNK + 64) * w.bytes_per_slice()


@pytest.mark.slow
def test_a_month_of_busy_traffic_keeps_the_budget_within_a_tenth_of_a_percent_of_its_events():
    """35 days of diurnal traffic with error bursts, four slices: the 30-day window's counts
    against the exact sum, every 6 hours."""
    spec = SloSpec(name="avail", description="", selector={}, sli_kind="availability", objective=0.999,
                   period_minutes=30 * 1440, calendar_month=False, slice_by=("zone",), alert_windows=default_catalog(),
                   min_events=10)
    table = SloTable(spec)
    cols = table.columns([("a",), ("b",), ("c",), ("d",)])
    rng = np.random.default_rng(7)
    minutes = 35 * 1440
    t = np.arange(minutes)
    rate = np.outer(1 + 0.8 * np.sin(2 * np.pi * t / 1440), [5, 50, 200, 1000])
    valid = rng.poisson(rate)
    burst = (rng.random((minutes, 4)) < 0.002)  # a bad minute now and then: 30% errors
    good = valid - rng.binomial(valid, np.where(burst, 0.3, 0.0005))
    worst = 0.0
    for now in range(minutes):
        table.advance(now, cols, good[now], valid[now])
        if now % 360 == 0 and now > 30 * 1440:
            got_good, got_valid = table.period_counts()
            exact_valid = _exact(valid, now, 30 * 1440)
            exact_bad = exact_valid - _exact(good, now, 30 * 1440)
            worst = max(worst, float(np.max(np.abs((got_valid - got_good) - exact_bad) / exact_valid)),
                        float(np.max(np.abs(got_valid - exact_valid) / exact_valid)))
    assert worst <= 0.001, worst
