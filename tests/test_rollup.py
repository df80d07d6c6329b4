"""Minutes older than the retention roll into hours in the checkpoint transaction, and the cost
report over a range spanning both tables gives what it gave over minutes alone (topics in
memory, real worker, real DuckDB files)."""

import datetime as dt
import math

import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tailwatch_dev.simulator import FleetSimulator
from tailwatch.planning.prices import GpuPrices
from tailwatch.reports.cost_report import build_report
from tailwatch.streams.rollup import RollUp, topics_ready
from tailwatch.store.connection import connect
from tests.test_pipeline import publish, run_worker

DAY_MIN = 1440


@pytest.fixture(scope="module")
def two_stores(new_memory, tmp_path_factory):
    """Two days and three hours of a fleet: one store keeps every minute, one keeps a day."""
    kafka = new_memory()
    publish(kafka, FleetSimulator("cost-spike", minutes=2 * DAY_MIN + 180, seed=4, rate_scale=0.005,
                                  gpu_samples_per_minute=1).events())
    tmp = tmp_path_factory.mktemp("rollup")
    kept, rolled = tmp / "kept.duckdb", tmp / "rolled.duckdb"
    run_worker(kafka, kept, minute_retention_s=0)
    run_worker(kafka, rolled, minute_retention_s=DAY_MIN * 60.0)
    return kept, rolled


def report(path, start=None, end=None):
    con = duckdb.connect(str(path), read_only=True)
    try:
        return build_report(con, str(path), start, end, GpuPrices())
    finally:
        con.close()


def same(a: pl.DataFrame, b: pl.DataFrame, by: list[str]) -> None:
    assert_frame_equal(a.sort(by), b.sort(by), check_exact=False, rel_tol=1e-9, abs_tol=1e-9)


def close(a: dict, b: dict) -> None:
    """Equal, floats to 1e-9 (sums taken in another order differ in the last bits)."""
    assert a.keys() == b.keys()
    for name, x in a.items():
        y = b[name]
        assert (math.isclose(x, y, rel_tol=1e-9) if isinstance(x, float) else x == y), (name, x, y)


@pytest.mark.slow
def test_the_worker_rolls_minutes_past_the_retention_into_hours(two_stores):
    kept, rolled = two_stores
    k, r = duckdb.connect(str(kept), read_only=True), duckdb.connect(str(rolled), read_only=True)
    newest = k.execute("SELECT max(window_start) FROM sli_minute").fetchone()[0]
    oldest_kept = r.execute("SELECT min(window_start) FROM sli_minute").fetchone()[0]
    # Minutes of whole hours past a day behind the newest are gone, in hours now; the rest are minutes.
    assert newest - dt.timedelta(days=1, hours=1) <= oldest_kept <= newest - dt.timedelta(days=1) + dt.timedelta(hours=1)
    assert r.execute("SELECT count(*) FROM sli_hour").fetchone()[0] > 0
    assert r.execute("SELECT count(*) FROM gpu_minute WHERE window_start < ?", [oldest_kept]).fetchone()[0] == 0
    totals = "SELECT sum(requests), sum(errors), sum(successful_turns), sum(output_tokens) FROM {}"
    both = [a + b for a, b in zip(r.execute(totals.format("sli_minute")).fetchone(), r.execute(totals.format("sli_hour")).fetchone())]
    assert both == list(k.execute(totals.format("sli_minute")).fetchone())
    gpu = r.execute("SELECT (SELECT count(*) FROM gpu_minute) + (SELECT sum(gpu_minutes) FROM gpu_hour)").fetchone()[0]
    assert gpu == k.execute("SELECT count(*) FROM gpu_minute").fetchone()[0]
    # An hour row is the hour's minutes merged: its histogram holds every minute's bins.
    hour = r.execute("SELECT min(window_start) FROM sli_hour").fetchone()[0]
    hist = "SELECT sum(list_sum([b.n for b in e2e_ms_hist])) FROM {} WHERE window_start >= ? AND window_start < ?"
    span = [hour, hour + dt.timedelta(hours=1)]
    assert r.execute(hist.format("sli_hour"), span).fetchone() == k.execute(hist.format("sli_minute"), span).fetchone()
    k.close(), r.close()


@pytest.mark.slow
def test_the_cost_report_across_minutes_and_hours_equals_the_report_over_minutes(two_stores):
    kept, rolled = two_stores
    con = duckdb.connect(str(kept), read_only=True)
    first, last = con.execute("SELECT min(window_start), max(window_start) FROM sli_minute").fetchone()
    con.close()
    start = dt.datetime.combine(first.date(), dt.time())
    for a_start, a_end in ((start, last + dt.timedelta(minutes=1)), (start + dt.timedelta(days=1), None)):
        a, b = report(kept, a_start, a_end), report(rolled, a_start, a_end)
        assert a.data_range == b.data_range
        same(a.daily.detail, b.daily.detail, ["period", "tenant", "model", "workload"])
        same(a.per_day, b.per_day, ["period"])
        assert a.trend_unit == b.trend_unit
        same(a.trend, b.trend, ["period"])
        close(a.scaling.__dict__, b.scaling.__dict__)
        assert len(a.flags) == len(b.flags)
        for x, y in zip(a.flags, b.flags):
            close(x.__dict__, y.__dict__)


@pytest.mark.slow
def test_a_store_without_retention_keeps_every_minute(two_stores):
    kept, _ = two_stores
    con = connect(kept)
    try:
        assert RollUp(0).roll(con) == 0
        assert con.execute("SELECT count(*) FROM sli_hour").fetchone()[0] == 0
    finally:
        con.close()


@pytest.mark.slow
def test_a_replay_reaching_into_rolled_hours_is_refused_in_one_line(two_stores):
    from tailwatch.backtest import BacktestError, read_buckets

    _, rolled = two_stores
    con = duckdb.connect(str(rolled), read_only=True)
    edge = con.execute("SELECT min(window_start) FROM sli_minute").fetchone()[0]
    con.close()
    with pytest.raises(BacktestError, match="rolled up into hours"):
        read_buckets(str(rolled), edge - dt.timedelta(hours=2), edge + dt.timedelta(hours=1))
    requests, _ = read_buckets(str(rolled), edge + dt.timedelta(minutes=5), edge + dt.timedelta(hours=1))
    assert requests.height > 0


def test_no_hour_is_rolled_while_a_topic_has_not_closed_its_first_minute():
    """In a backlog the GPU topic can trail the requests by more than the retention: an hour
    rolled before its GPU minutes closed would keep no cost attribution for them."""
    from types import SimpleNamespace as T

    closed = T(closed_before_minute=29_000_000, backlogged=False, watermarks={0: 1})
    assert topics_ready([closed, T(closed_before_minute=28_000_000, backlogged=True, watermarks={0: 1})])
    assert not topics_ready([closed, T(closed_before_minute=None, backlogged=True, watermarks={})])  # unread yet
    assert not topics_ready([closed, T(closed_before_minute=None, backlogged=False, watermarks={0: 1})])  # open minutes
    assert topics_ready([closed, T(closed_before_minute=None, backlogged=False, watermarks={})])  # read, empty: no GPUs
