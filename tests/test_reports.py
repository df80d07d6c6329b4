"""Cost reports: the pure cost math (slo.cost), and `tailwatch report cost` end to end:
simulator → topics in memory → real worker → store → report files."""

from __future__ import annotations

import datetime as dt
import math
import re

import duckdb
import polars as pl
import pytest

from tailwatch_dev.simulator import FleetSimulator
from tailwatch.reports import charts
from tailwatch.reports.cost_report import ReportError, build_report, parse_time, run_cost_report, trend_unit
from tailwatch.planning import cost
from tailwatch.planning.prices import GpuPrices
from tailwatch.cli import main
from tests.h100_lab import lab_store
from tests.test_pipeline import publish, run_worker

D1, D2 = dt.date(2026, 11, 2), dt.date(2026, 11, 3)
H100_PER_S, L4_PER_S, DEFAULT_PER_S = 4.0 / 3600, 0.8 / 3600, 2.0 / 3600


def usage(*rows) -> pl.DataFrame:
    cols = ("period", "tenant", "model", "workload", "pool", "requests", "turns", "successful_turns", "output_tokens",
            "audio_seconds", "gpu_seconds")
    return pl.DataFrame([dict(zip(cols, r)) for r in rows],
                        schema={**{c: pl.String for c in cols[1:5]}, "period": pl.Date, "requests": pl.Int64,
                                "turns": pl.Int64, "successful_turns": pl.Int64, "output_tokens": pl.Int64,
                                "audio_seconds": pl.Float64, "gpu_seconds": pl.Float64})


def fleet(*rows) -> pl.DataFrame:
    cols = ("period", "pool", "model", "gpu_sku", "gpu_seconds")
    return pl.DataFrame([dict(zip(cols, r)) for r in rows],
                        schema={"period": pl.Date, "pool": pl.String, "model": pl.String, "gpu_sku": pl.String,
                                "gpu_seconds": pl.Float64})


def assert_adds_up(frame: pl.DataFrame, attributed: str = "attributed_cost_usd", idle: str = "idle_cost_usd",
                   fully_loaded: str = "fully_loaded_cost_usd") -> None:
    """Attributed + idle = fully loaded on every row, and attributed never above fully loaded."""
    for r in frame.to_dicts():
        assert r[attributed] + r[idle] == pytest.approx(r[fully_loaded], rel=1e-9, abs=1e-12), r
        assert r[attributed] <= r[fully_loaded] * (1 + 1e-9) + 1e-12, r


def no_nan_or_inf(frame: pl.DataFrame) -> bool:
    floats = [c for c, t in frame.schema.items() if t == pl.Float64]
    return all(not (math.isnan(v) or math.isinf(v)) for c in floats for v in frame[c].drop_nulls())


# ---- pure math ----------------------------------------------------------------------------

def test_fleet_cost_is_allocated_in_proportion_to_attributed_gpu_seconds():
    u = usage((D1, "a", "llm-70b", "llm", "p1", 10, 10, 9, 1000, 0.0, 100.0),
              (D1, "b", "llm-70b", "llm", "p1", 30, 30, 30, 3000, 0.0, 300.0))
    f = fleet((D1, "p1", "llm-70b", "H100", 3600.0))  # one H100 for an hour: $4
    t = cost.allocate_costs(u, f, GpuPrices())
    rows = {r["tenant"]: r for r in t.detail.to_dicts()}
    assert t.fleet_total_usd == pytest.approx(4.0)
    assert rows["a"]["attributed_cost_usd"] == pytest.approx(100 * H100_PER_S)
    assert rows["a"]["fully_loaded_cost_usd"] == pytest.approx(1.0)  # 100 of 400 GPU-seconds used → a quarter
    assert rows["b"]["fully_loaded_cost_usd"] == pytest.approx(3.0)
    # Idle = fleet − attributed = 3,200 GPU-s, shared the same way; fully loaded = attributed + idle share.
    assert rows["a"]["idle_gpu_seconds"] == pytest.approx(800.0)
    assert_adds_up(t.detail)
    assert rows["a"]["cost_per_successful_turn_usd"] == pytest.approx(1.0 / 9)
    assert rows["a"]["cost_per_1k_output_tokens_usd"] == pytest.approx(1.0)
    assert rows["a"]["goodput_ratio"] == pytest.approx(0.9)


def test_totals_reconcile_with_idle_pools_pools_without_gpus_and_unknown_skus():
    u = usage((D1, "a", "m", "llm", "p1", 10, 10, 9, 1000, 0.0, 100.0),
              (D1, "b", "m", "llm", "p1", 5, 5, 5, 500, 0.0, 50.0),
              (D2, "a", "m", "llm", "p1", 7, 7, 7, 700, 0.0, 70.0),
              (D1, "c", "asr", "asr", "p-no-gpus", 4, 4, 4, 0, 40.0, 20.0),  # no gpu_minute rows for this pool
              (D1, "b", "x", "tts", "p-weird", 3, 3, 3, 0, 9.0, 6.0))
    f = fleet((D1, "p1", "m", "H100", 7200.0), (D2, "p1", "m", "H100", 3600.0),
              (D1, "p-idle", "m", "L4", 3600.0),  # GPUs up, no traffic at all
              (D1, "p-weird", "x", "NEW-SKU", 600.0))  # not in the price table
    t = cost.allocate_costs(u, f, GpuPrices())
    expected = (7200 + 3600) * H100_PER_S + 3600 * L4_PER_S + 600 * DEFAULT_PER_S + 20.0 * DEFAULT_PER_S
    assert t.fleet_total_usd == pytest.approx(expected, rel=1e-12)
    assert t.detail["fully_loaded_cost_usd"].sum() == pytest.approx(t.fleet_total_usd, rel=1e-12)
    by_tenant = cost.rollup(t.detail, ["tenant"])
    assert by_tenant["fully_loaded_cost_usd"].sum() == pytest.approx(t.fleet_total_usd, rel=1e-12)
    for day in (D1, D2):  # and per day
        assert t.detail.filter(pl.col("period") == day)["fully_loaded_cost_usd"].sum() == pytest.approx(
            t.pools.filter(pl.col("period") == day)["fully_loaded_cost_usd"].sum(), rel=1e-12)
    idle = t.detail.filter(pl.col("tenant") == cost.UNALLOCATED_TENANT).to_dicts()
    assert len(idle) == 1 and idle[0]["fully_loaded_cost_usd"] == pytest.approx(0.8)
    assert idle[0]["idle_cost_usd"] == pytest.approx(0.8)
    c = t.detail.filter(pl.col("tenant") == "c").row(0, named=True)
    # No GPUs reported for its pool and no other price for its model: the default price, attributed = fully loaded.
    assert c["attributed_cost_usd"] == pytest.approx(20 * DEFAULT_PER_S)
    assert c["fully_loaded_cost_usd"] == pytest.approx(c["attributed_cost_usd"])
    assert c["cost_per_audio_second_usd"] == pytest.approx(20 * DEFAULT_PER_S / 40)
    weird = t.detail.filter(pl.col("model") == "x").row(0, named=True)
    assert weird["attributed_cost_usd"] == pytest.approx(6 * DEFAULT_PER_S)  # unknown SKU: the fallback price
    assert no_nan_or_inf(t.detail)
    assert_adds_up(t.detail)
    assert_adds_up(cost.rollup(t.detail, ["tenant"]))


def test_price_file_prices_and_model_fallback():
    u = usage((D2, "a", "m", "llm", "p-new", 1, 1, 1, 10, 0.0, 360.0))  # a pool with no GPU rows that day or ever
    f = fleet((D1, "p-old", "m", "L4", 3600.0))
    prices = GpuPrices({"L4": 1.8}, 3.0)
    t = cost.allocate_costs(u, f, prices)
    row = t.detail.filter(pl.col("tenant") == "a").row(0, named=True)
    assert row["attributed_cost_usd"] == pytest.approx(360 * 1.8 / 3600)  # its model's GPUs elsewhere
    assert t.fleet_total_usd == pytest.approx(1.8 + 360 * 1.8 / 3600)


def test_zero_turns_and_zero_work_give_null_not_inf_or_nan():
    u = usage((D1, "a", "m", "llm", "p1", 5, 0, 0, 0, 0.0, 0.0),
              (D1, "b", "m", "llm", "p1", 5, 0, 0, 0, 0.0, 0.0))
    f = fleet((D1, "p1", "m", "H100", 3600.0))
    t = cost.allocate_costs(u, f, GpuPrices())
    # Nobody reported GPU-seconds: the pool's cost is shared by requests instead.
    assert t.detail["fully_loaded_cost_usd"].to_list() == pytest.approx([2.0, 2.0])
    for col in ("goodput_ratio", "cost_per_successful_turn_usd", "cost_per_1k_output_tokens_usd", "cost_per_audio_second_usd"):
        assert t.detail[col].null_count() == 2, col
    assert no_nan_or_inf(t.detail)
    empty = cost.allocate_costs(usage(), fleet(), GpuPrices())
    assert empty.detail.height == 0 and empty.fleet_total_usd == 0.0


def test_requests_reporting_more_gpu_time_than_the_pool_had_are_capped_at_the_pool():
    # Batched requests each report the GPU time: 5,400 GPU-s claimed of the 3,600 that existed.
    # Before, attributed ($6) exceeded the bill ($4); the period cap brings it to the fleet's.
    u = usage((D1, "a", "m", "llm", "p1", 10, 10, 10, 0, 0.0, 3600.0),
              (D1, "b", "m", "llm", "p1", 10, 10, 10, 0, 0.0, 1800.0))
    f = fleet((D1, "p1", "m", "H100", 3600.0))
    t = cost.allocate_costs(u, f, GpuPrices())
    rows = {r["tenant"]: r for r in t.detail.to_dicts()}
    assert rows["a"]["attributed_cost_usd"] == pytest.approx(4.0 * 2 / 3)  # shares kept: a used twice what b did
    assert rows["b"]["attributed_cost_usd"] == pytest.approx(4.0 / 3)
    assert rows["a"]["gpu_seconds_reported"] == 3600.0 and rows["a"]["attribution_scale"] == pytest.approx(2 / 3)
    assert sum(r["idle_cost_usd"] for r in rows.values()) == pytest.approx(0.0, abs=1e-12)
    assert_adds_up(t.detail)
    pool = t.pools.row(0, named=True)
    assert pool["attribution_scaled"] and pool["reported_gpu_seconds"] == 5400.0
    assert pool["attributed_gpu_seconds"] == pytest.approx(3600.0) and pool["attributed_cost_usd"] == pytest.approx(4.0)


def test_attributed_gpu_seconds_are_scaled_per_pool_and_minute():
    m0, m1, m2 = (dt.datetime(2026, 11, 2, 10, i) for i in range(3))
    reported = pl.DataFrame({"minute": [m0, m1, m1, m2], "pool": ["p1", "p1", "p2", "p3"],
                             "gpu_seconds": [150.0, 30.0, 200.0, 500.0]})
    # p1 had 2 GPUs (120 GPU-s a minute), p2 one; p3 sent no GPU rows that minute.
    present = pl.DataFrame({"minute": [m0, m1, m1], "pool": ["p1", "p1", "p2"], "gpu_seconds": [120.0, 120.0, 60.0]})
    s = {(r["minute"], r["pool"]): r for r in cost.attribution_scales(reported, present).to_dicts()}
    assert s[(m0, "p1")]["attribution_scale"] == pytest.approx(120 / 150)  # 150 claimed of 120: no more than 60 s per GPU
    assert s[(m1, "p1")]["attribution_scale"] == 1.0  # under the GPUs' time: never scaled up
    assert s[(m1, "p2")]["attribution_scale"] == pytest.approx(0.3)
    assert s[(m2, "p3")]["attribution_scale"] == 1.0 and s[(m2, "p3")]["fleet_gpu_seconds"] is None
    scales = cost.attribution_scales(reported, present)
    pools = pl.DataFrame({"reported_gpu_seconds": [880.0], "attributed_gpu_seconds": [120.0 + 30 + 60 + 500]})
    summary = cost.summarize_scaling(scales, pools)
    assert (summary.pool_minutes, summary.pool_minutes_scaled, summary.pools_scaled) == (3, 2, ("p1", "p2"))
    assert summary.first_scaled_minute == m0 and summary.last_scaled_minute == m1
    assert summary.min_scale == pytest.approx(0.3) and summary.overall_scale == pytest.approx(710 / 880)
    assert "2 of 3 server-pool minutes" in summary.sentence() and f"{880 / 710 - 1:.1%} more" in summary.sentence()
    unscaled = cost.summarize_scaling(scales.with_columns(pl.lit(1.0).alias("attribution_scale")),
                                      pl.DataFrame({"reported_gpu_seconds": [5.0], "attributed_gpu_seconds": [5.0]}))
    assert not unscaled.scaled and "each request's server reported using" in unscaled.sentence()
    import dataclasses
    barely = dataclasses.replace(summary, reported_gpu_seconds=100_000.0, attributed_gpu_seconds=99_990.0)
    assert barely.scaled and "under 0.1% more" in barely.sentence() and "0.0%" not in barely.sentence()


def test_charts_say_no_data_and_keep_a_short_run_on_a_minute_axis():
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    assert trend_unit(dt.timedelta(minutes=7)) == "minute" and trend_unit(dt.timedelta(days=2)) == "hour"
    assert trend_unit(dt.timedelta(days=30)) == "day"
    one = [dt.datetime(2026, 11, 23, 8, 41)]
    # One point used to make matplotlib widen a zero-width range to 2025-2028.
    fig, ax = plt.subplots()
    ax.plot(one, [1.0])
    charts._time_axis(ax, one, dt.timedelta(minutes=1))
    lo, hi = (mdates.num2date(x).replace(tzinfo=None) for x in ax.get_xlim())
    plt.close(fig)
    assert (lo, hi) == (one[0] - dt.timedelta(seconds=30), one[0] + dt.timedelta(seconds=30))
    # Nothing to draw: a labelled panel, not an empty frame (a PNG all the same, for the page).
    nothing = charts.cost_per_turn_trend(one, [None], [None], [], step=dt.timedelta(minutes=1))
    assert nothing.startswith("data:image/png;base64,") and nothing != charts.cost_per_turn_trend(
        one, [0.01], [0.005], [], step=dt.timedelta(minutes=1))
    assert charts.goodput_vs_throughput([], [], [], "minute").startswith("data:image/png;base64,")


def daily(*rows) -> pl.DataFrame:
    return pl.DataFrame([dict(zip(("period", "fully_loaded_cost_usd", "turns", "successful_turns", "minutes_with_data"), r))
                         for r in rows])


def test_spend_rise_with_flat_success_is_flagged_with_its_numbers():
    days = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(5)]
    flat = daily(*[(d, 1000.0, 10_000, 9_700, 1440) for d in days])
    assert cost.flag_spend_rises(flat) == []
    risen = daily(*[(d, 1000.0 if i < 3 else 1380.0, 10_000, 9_700 + (i == 4), 1440) for i, d in enumerate(days)])
    flags = cost.flag_spend_rises(risen, days=days[3:])
    # A sustained step stays flagged while the trailing baseline still holds the old days (+26% on day 5).
    assert [f.day for f in flags] == days[3:]
    assert flags[1].rise_ratio == pytest.approx(1380 / ((3 * 1000 + 1380) / 4) - 1)
    f = flags[0]
    assert f.rise_ratio == pytest.approx(0.38) and f.baseline_daily_spend_usd == pytest.approx(1000.0)
    assert f.success_ratio == pytest.approx(0.97) and f.baseline_success_ratio == pytest.approx(0.97)
    assert "up 38.0%" in f.summary()
    # The same rise with success up 5 points bought something: not flagged.
    better = daily(*[(d, 1000.0 if i < 3 else 1380.0, 10_000, 9_000 if i < 3 else 9_500, 1440) for i, d in enumerate(days)])
    assert cost.flag_spend_rises(better) == []
    # A half day of data at the same rate is not a drop, and a half day at +38% rate is a rise.
    partial = daily((days[0], 1000.0, 100, 97, 1440), (days[1], 500.0, 50, 48, 720))
    assert cost.flag_spend_rises(partial) == []
    partial_up = daily((days[0], 1000.0, 100, 97, 1440), (days[1], 690.0, 50, 48, 720))
    assert [round(f.rise_ratio, 4) for f in cost.flag_spend_rises(partial_up)] == [0.38]


def test_report_times_parse_as_utc():
    assert parse_time("2026-11-03") == dt.datetime(2026, 11, 3)
    assert parse_time("2026-11-03", end=True) == dt.datetime(2026, 11, 4)
    assert parse_time("2026-11-03T06:30:00Z") == dt.datetime(2026, 11, 3, 6, 30)
    assert parse_time("2026-11-03T08:30:00+02:00") == dt.datetime(2026, 11, 3, 6, 30)
    with pytest.raises(ReportError):
        parse_time("last tuesday")


# ---- end to end: simulator → topics in memory → worker → store → report ----------------------

def _store_from(new_memory, tmp_path_factory, scenario: str, minutes: int, start: str, rate_scale: float = 0.01):
    topics = new_memory()
    sim = FleetSimulator(scenario, minutes, seed=5, start=start, rate_scale=rate_scale, gpu_samples_per_minute=1)
    publish(topics, sim.events())
    path = tmp_path_factory.mktemp(scenario) / "tw.duckdb"
    # Two days replayed at once: big batches and rare checkpoints keep it quick.
    run_worker(topics, path, until_idle_s=2.0, publish_sli=False, batch_size=100_000, checkpoint_interval_s=30.0)
    return path, sim


@pytest.fixture(scope="module")
def cost_spike_store(new_memory, tmp_path_factory):
    """Two simulated days; from the second, 38% more GPU time for the same traffic and success."""
    return _store_from(new_memory, tmp_path_factory, "cost-spike", 2 * 1440, "2026-11-02T00:00:00Z")


def _fleet_total_from_store(path, prices: GpuPrices) -> float:
    con = duckdb.connect(str(path), read_only=True)
    rows = con.execute("SELECT gpu_sku, count(*) * 60 FROM gpu_minute GROUP BY ALL").fetchall()
    con.close()
    return sum(gs * prices.usd_per_gpu_second(sku) for sku, gs in rows)


@pytest.mark.slow
def test_cost_report_end_to_end_flags_the_38pct_rise(cost_spike_store, tmp_path, capsys):
    path, sim = cost_spike_store
    assert [t["kind"] for t in sim.truth()] == ["cost_regression"]
    out = tmp_path / "report"
    prices_file = tmp_path / "prices.yaml"
    prices_file.write_text("usd_per_gpu_hour:\n  H100: 3.5\n")
    rc = main(["report", "cost", "--store", str(path), "--from", "2026-11-02", "--to", "2026-11-03",
               "--out", str(out), "--prices", str(prices_file)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "report cost: drawing charts" in captured.err  # progress while it runs
    assert "FLAG spend up with flat task success: 2026-11-03" in captured.out
    for name in ("report.html", "cost.csv", "cost.parquet"):
        assert (out / name).stat().st_size > 0

    page = (out / "report.html").read_text()
    assert len(re.findall(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', page)) == 4
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*(https?:)?//', page, re.IGNORECASE)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert "http://" not in page and "https://" not in page and "url(" not in page
    assert 'id="spend-rise"' in page and "Fully loaded" in page and "Attributed" in page
    # Two whole days: the spend over them with their length, and a rate per day labelled as one.
    assert "fleet GPU cost, fully loaded, over 2 d of data" in page and "2026-11-02 (" not in page
    rate = re.search(r'id="per-day-rate" data-usd="([0-9.]+)">\$[0-9,.]+ per day<', page)
    assert rate and float(rate.group(1)) * 2 == pytest.approx(
        float(re.search(r'id="fleet-total-usd" data-usd="([0-9.]+)"', page).group(1)), rel=1e-6)

    prices = GpuPrices({**GpuPrices().usd_per_gpu_hour, "H100": 3.5})
    fleet_total = _fleet_total_from_store(path, prices)
    csv = pl.read_csv(out / "cost.csv")
    parquet = pl.read_parquet(out / "cost.parquet")
    assert csv.height == parquet.height > 0
    assert csv["fully_loaded_cost_usd"].sum() == pytest.approx(fleet_total, rel=1e-9)
    by_tenant = csv.group_by("tenant").agg(pl.col("fully_loaded_cost_usd").sum())
    assert by_tenant["fully_loaded_cost_usd"].sum() == pytest.approx(fleet_total, rel=1e-9)
    assert float(re.search(r'id="fleet-total-usd" data-usd="([0-9.]+)"', page).group(1)) == pytest.approx(fleet_total, rel=1e-6)
    assert csv["turns"].sum() == sim.totals.turns and csv["successful_turns"].sum() == sim.totals.successful_turns
    assert_adds_up(csv)

    rise = float(re.search(r"up (\d+\.\d)%", captured.out).group(1))
    assert 35.0 <= rise <= 42.0
    per_day = csv.group_by("day").agg(pl.col("successful_turns").sum() / pl.col("turns").sum()).sort("day")
    assert abs(per_day["successful_turns"][1] - per_day["successful_turns"][0]) < 0.01  # success stayed flat


@pytest.mark.slow
def test_default_range_is_the_last_day_of_data_and_first_day_alone_is_not_flagged(cost_spike_store, tmp_path, capsys):
    path, _ = cost_spike_store
    assert main(["report", "cost", "--store", str(path), "--out", str(tmp_path / "last")]) == 0
    out = capsys.readouterr().out
    assert "FLAG" in out and "2026-11-03" in out
    assert pl.read_csv(tmp_path / "last" / "cost.csv")["day"].unique().to_list() == ["2026-11-03"]
    assert main(["report", "cost", "--store", str(path), "--from", "2026-11-02", "--to", "2026-11-02",
                 "--out", str(tmp_path / "first")]) == 0
    assert "FLAG" not in capsys.readouterr().out
    assert 'id="no-spend-rise"' in (tmp_path / "first" / "report.html").read_text()


@pytest.mark.slow
def test_empty_range_bad_dates_and_bad_prices_are_one_line_errors_and_write_nothing(cost_spike_store, tmp_path, capsys):
    path, _ = cost_spike_store
    out = tmp_path / "nothing"
    assert main(["report", "cost", "--store", str(path), "--from", "2026-12-01", "--to", "2026-12-02", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no data from 2026-12-01T00:00Z to 2026-12-03T00:00Z" in err
    assert "the store holds 2026-11-02T00:00Z to 2026-11-04T00:00Z" in err
    assert len(err.splitlines()) == 1 and not out.exists()
    assert main(["report", "cost", "--store", str(path), "--from", "2026-11-03", "--to", "2026-11-02", "--out", str(out)]) == 2
    assert "must be after" in capsys.readouterr().err
    assert main(["report", "cost", "--store", str(path), "--from", "soon", "--out", str(out)]) == 2
    assert "not a date" in capsys.readouterr().err
    bad = tmp_path / "prices.yaml"
    bad.write_text("usd_per_gpu_hour: {H100: lots}\n")
    assert main(["report", "cost", "--store", str(path), "--prices", str(bad), "--out", str(out)]) == 2
    assert "--prices" in capsys.readouterr().err
    assert main(["report", "cost", "--store", str(tmp_path / "none.duckdb"), "--out", str(out)]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not out.exists()


def test_quiet_fleet_across_midnight_is_not_flagged(new_memory, tmp_path_factory, tmp_path, capsys):
    # An hour on each side of midnight: partial days at the same rate must not look like a change.
    path, _ = _store_from(new_memory, tmp_path_factory, "quiet", 120, "2026-11-02T23:00:00Z")
    assert main(["report", "cost", "--store", str(path), "--from", "2026-11-02", "--to", "2026-11-03",
                 "--out", str(tmp_path / "q")]) == 0
    assert "FLAG" not in capsys.readouterr().out
    csv = pl.read_csv(tmp_path / "q" / "cost.csv")
    assert csv["fully_loaded_cost_usd"].sum() == pytest.approx(_fleet_total_from_store(path, GpuPrices()), rel=1e-9)
    assert 'id="no-spend-rise"' in (tmp_path / "q" / "report.html").read_text()


# ---- the H100 lab run: time-shared GPU, no task_success -----------------------------------

@pytest.mark.slow
def test_h100_lab_costs_add_up_and_turns_are_counted(tmp_path):
    """Four replicas time-sharing one H100 reported 920 GPU-s in 7 minutes of one GPU (420 GPU-s):
    before, $1.02 attributed against a $0.47 fully loaded cost, and 0 turns (no task_success)."""
    path = lab_store(tmp_path / "lab.duckdb")
    con = duckdb.connect(str(path), read_only=True)
    try:
        report = build_report(con, str(path), None, None, GpuPrices())
    finally:
        con.close()
    detail = report.daily.detail
    fleet_usd = 7 * 60 * H100_PER_S  # one H100 for the seven minutes it reported
    assert report.daily.fleet_total_usd == pytest.approx(fleet_usd)
    assert detail["gpu_seconds_reported"].sum() == pytest.approx(920.0527)
    assert detail["attributed_cost_usd"].sum() <= detail["fully_loaded_cost_usd"].sum()
    assert detail["fully_loaded_cost_usd"].sum() == pytest.approx(fleet_usd)
    assert_adds_up(detail)
    assert_adds_up(report.per_day)
    assert_adds_up(report.trend)  # per minute too
    # No minute of the pool is attributed more than its one GPU's 60 s.
    assert report.trend.filter(pl.col("gpu_seconds") > 60.0 + 1e-9).height == 0
    assert report.scaling.scaled and report.scaling.pools_scaled == ("h100-lab",)
    assert report.scaling.overall_scale == pytest.approx(297.1012 / 920.0527)
    total = cost.rollup(detail, []).row(0, named=True)
    assert (total["turns"], total["successful_turns"]) == (632, 271)
    assert total["cost_per_successful_turn_usd"] == pytest.approx(fleet_usd / 271)
    # Seven minutes of data chart one point per minute.
    assert report.trend_unit == "minute" and report.trend.height == 7

    out = run_cost_report(str(path), None, None, tmp_path / "report", GpuPrices())
    page = (tmp_path / "report" / "report.html").read_text()
    scaling = re.search(r'<p class=\'scaled\' id="attribution-scaling" data-scale="([0-9.]+)">([^<]+)</p>', page)
    assert scaling and float(scaling.group(1)) == pytest.approx(0.3229, abs=1e-4)
    assert "4 of 5 server-pool minutes" in scaling.group(2) and "Attribution scale" in page
    # The two charts that were empty frames now have a value for every minute with traffic.
    with_turns = report.trend.filter(pl.col("turns") > 0)
    assert with_turns.height == 5 and with_turns["cost_per_successful_turn_usd"].null_count() == 0
    csv = pl.read_csv(tmp_path / "report" / "cost.csv")
    assert_adds_up(csv)
    assert (csv["attribution_scale"] < 1).all() and out.fleet_total_usd == pytest.approx(fleet_usd)


@pytest.mark.slow
def test_readiness_of_the_real_h100_run_names_its_saturated_pool_and_what_it_could_not_tell(tmp_path):
    """Overload advice on real telemetry: one H100 serving an LLM, overloaded (most requests shed,
    queue age up to 11 s), with two sources per GPU and no KV-cache or stream-ending fields."""
    import json

    store = lab_store(tmp_path / "lab.duckdb")
    assert main(["report", "readiness", "--model", "llama-1b-rand", "--store", str(store),
                 "--out", str(tmp_path / "out")]) == 0

    def no_nan(token):
        raise AssertionError(f"{token} in readiness.json")

    report = json.loads((tmp_path / "out" / "readiness.json").read_text(), parse_constant=no_nan)
    assert report["verdict"] == "blocked"  # its availability budget is spent: 57% of requests shed
    assert [p["pool"] for p in report["saturated_pools"]] == ["h100-lab"]
    assert report["saturated_pools"][0]["worst_queue_age_ms"] > 5000
    assert report["contract"]["gpu_skus"] == ["H100"] and report["contract"]["requests"] == 632
    memory = report["memory"][0]
    assert 0 < memory["gpu_memory_peak_ratio"] < 1 and memory["kv_cache_usage_max"] is None
    said = " ".join(report["not_measured"])
    assert "KV-cache use" in said and "stream endings" in said and "cold start" in said
    assert report["quality"]["model_version"][0]["stream_completion"] is None
    assert report["latency"][0]["inter-token p50 ms"] is not None
    assert "Verdict: blocked" in (tmp_path / "out" / "readiness.html").read_text()


def test_report_pages_escape_every_value_from_the_store():
    """Tenants, models and versions are whatever producers send (128 characters, any of them
    printable): the pages are Jinja2 templates with autoescape, so none becomes markup."""
    from tailwatch.reports.html import ENV
    from tailwatch.reports.readiness import Finding, ReadinessReport, render_html

    hostile = "<img src=x onerror=alert(1)>"
    table = ENV.from_string('{% from "macros.html" import table %}{{ table(h, r, ["total"]) }}').render(
        h=[("Tenant", True), ("$", False)], r=[[hostile, "1.00"]])
    assert hostile not in table and "&lt;img src=x onerror=alert(1)&gt;" in table and 'class="total"' in table
    report = ReadinessReport(
        model=hostile, start=None, end=None, verdict="blocked", findings=[Finding("blocker", f"version {hostile} fails")],
        not_measured=[hostile], contract={"workload": "llm", "requests": 1200, "minutes": 10, "tenants": 1,
                                          "gpu_skus": ["H100"], "pools": [hostile], "zones": ["z1"],
                                          "versions": [{"model_version": hostile, "requests": 1200}]},
        latency=[], cold_starts=[], memory=[], quality={hostile: [{"slice": hostile, "error_ratio": 0.5}]}, slos=[],
        canaries=[], saturated_pools=[], cost=[], rollback_path=hostile)
    page = render_html(report)
    assert hostile not in page and page.count("&lt;img src=x onerror=alert(1)&gt;") >= 7
    assert "<title>Readiness: &lt;img" in page and "1,200 requests" in page and "50.00%" in page


def test_cost_per_successful_audio_minute_counts_only_the_audio_of_ok_attempts():
    # 40 s of audio, of which 30 s in ok attempts: the unit divides by the 30 s served.
    u = usage((D1, "a", "tts", "tts", "p1", 10, 10, 8, 0, 40.0, 60.0)).with_columns(
        pl.lit(30_000, pl.Int64).alias("successful_audio_ms"))
    t = cost.allocate_costs(u, fleet(), GpuPrices())
    row = t.detail.filter(pl.col("tenant") == "a").row(0, named=True)
    assert row["cost_per_audio_second_usd"] == pytest.approx(60 * DEFAULT_PER_S / 40)
    assert row["cost_per_successful_audio_minute_usd"] == pytest.approx(60 * DEFAULT_PER_S / 0.5)
    # Usage from before successful audio was counted: unknown, never a division by zero.
    old = cost.allocate_costs(usage((D1, "a", "tts", "tts", "p1", 10, 10, 8, 0, 40.0, 60.0)), fleet(), GpuPrices())
    assert old.detail["cost_per_successful_audio_minute_usd"].null_count() == old.detail.height
