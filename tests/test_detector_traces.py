"""Detectors, autoscale and rollout backtests on the public traces.

Detectors: `tailwatch eval detectors --trace FILE` builds a quiet day from a one-hour public
trace (Azure code trace, Mooncake conversation trace) and the same day with every incident
kind injected; here at half a day each, on one fixed seed, so both traces fit in CI. The
detectors are fed the buckets the worker's own windowing (`MinuteWindows` with the
`streams.aggregates` specs) makes of the events (see `dev/tailwatch_dev/eval_detectors.py` for why
not the broker). Targets: recall >= 0.95, at most one false alert per detector per quiet
day, retry storms and queue saturation within 3 minutes.

Backtests: a store written from a trace day (the same windowing), replayed read-only.
"""

from __future__ import annotations

import msgspec
import polars as pl
import pytest

from tailwatch.conventions import SLICE_LABELS
from tailwatch_dev.detector_scoring import DAY_MINUTES, merge
from tailwatch.backtest import backtest_autoscale, backtest_rollout, read_buckets
from tailwatch_dev.eval_detectors import (
    TraceCanary,
    build_trace_day,
    trace_day_buckets,
    trace_kinds,
    trace_runs,
    write_trace_store,
)

from .conftest import AZURE_TRACE, MOONCAKE_TRACE, need

# Its module fixture replays both public traces through the detectors (minutes on two cores).
pytestmark = pytest.mark.slow

SEED = 7
MINUTES = 720  # half a day per run: a quiet half day and one with incidents (1-2 of each kind)
FAST = ("retry_storm", "queue_age")


def _need(path):
    need(path.is_file(), f"the public trace {path.name} in tests/data")
    return path


@pytest.fixture(scope="module", params=["azure", "mooncake"])
def trace_scores(request):
    path = _need(AZURE_TRACE if request.param == "azure" else MOONCAKE_TRACE)
    runs = trace_runs(path, seed=SEED, minutes=MINUTES, repeats=2)
    return path, runs, merge([r.scores for r in runs])


def test_trace_detectors_meet_the_targets(trace_scores):
    trace, runs, total = trace_scores
    assert not runs[0].scores["retry_storm"].incidents  # the quiet run is quiet
    failures = []
    for name, s in total.items():
        if s.incidents:
            if s.recall < 0.95:
                failures.append(f"{name}: recall {s.recall:.2f}")
        if s.false_alerts_per_day > 1.0:
            failures.append(f"{name}: {s.false_alerts_per_day:.1f} false alerts per day")
    for name in FAST:
        delays = total[name].delays_minutes
        assert delays, name
        if max(delays) > 3:
            failures.append(f"{name}: detected after {delays} minutes")
    assert not failures, (trace.name, failures)
    assert all(total[k].incidents >= 1 for k in trace_kinds(trace)), {k: s.incidents for k, s in total.items()}
    days = sum(r.minutes for r in runs) / DAY_MINUTES
    assert days == pytest.approx(1.0)


# ---- backtests -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trace_store(tmp_path_factory):
    """Four hours of the Azure code trace in six pools; from 02:00 a canary of code-llm-a takes
    15% of its turns and fails 8% of them."""
    _need(AZURE_TRACE)
    canary = TraceCanary("code-llm-a", "v2-rc1", share=0.15, start_minute=120, error_rate=0.08)
    day = build_trace_day(AZURE_TRACE, 240, seed=5, incidents=False, canary=canary)
    return write_trace_store(day, tmp_path_factory.mktemp("backtest") / "trace.duckdb"), day, canary


def test_backtest_autoscale_a_calm_pool_saves_replica_hours_and_nobody_waited(trace_store):
    path, day, _ = trace_store
    calm = "code-llm-b-us-east-1b"  # the trace at 0.2x its rate on four replicas
    req, gpu = read_buckets(str(path), pools=[calm])
    result = backtest_autoscale(req, gpu, pools=[calm])
    bt = result[calm]
    assert len(bt.minutes) >= 200
    assert not bt.waited
    assert set(bt.running) == {4}
    assert max(bt.desired) <= 4 and bt.replica_hours_added == 0
    assert bt.replica_hours_saved > 4  # two of four replicas for most of four hours
    assert bt.usd_per_replica_hour == pytest.approx(4.0)  # H100 list price, one GPU per replica
    row = bt.to_row()
    assert row[0] == calm and row[6] == 0


def test_backtest_rollout_rolls_a_failing_canary_back_within_10_minutes(trace_store):
    path, _, canary = trace_store
    req, gpu = read_buckets(str(path), models=[canary.model])
    bt = backtest_rollout(req, gpu, canary.model, canary.version)
    start = bt.canary_start
    assert start is not None and start % DAY_MINUTES >= canary.start_minute  # answers once the canary has traffic
    first = bt.first("rollback")
    assert first is not None and first.minute - start <= 10, bt.steps[:12]
    assert bt.first("promote") is None
    assert all(s.verdict == "rollback" for s in bt.steps if s.minute >= first.minute + 2)


def test_backtest_cli_reads_the_store_read_only(trace_store, capsys):
    from tailwatch.cli import main

    path, _, canary = trace_store
    assert main(["backtest", "rollout", canary.model, canary.version, "--store", str(path),
                 "--from", "2026-11-02T01:50:00Z", "--to", "2026-11-02T02:20:00Z"]) == 0
    out = capsys.readouterr().out
    assert "first rollback: 2026-11-02T02:0" in out and "first promote: never" in out
    assert main(["backtest", "autoscale", "--store", str(path), "--pool", "code-llm-b-us-east-1b",
                 "--from", "2026-11-02T03:00:00Z"]) == 0
    out = capsys.readouterr().out
    assert "code-llm-b-us-east-1b" in out and "users waited in 0 minute(s): none" in out
    assert main(["backtest", "rollout", "nope", "v1", "--store", str(path)]) == 2
    assert main(["backtest", "autoscale", "--store", str(path / "missing.duckdb")]) == 2


def test_detectors_fed_summaries_by_their_label_sets_find_what_they_find_in_the_rows():
    """The detector stage holds closed rows as summaries by the label sets the detectors read
    (memory: rows grow with slices, summaries with label values). On a public trace day with
    incidents, detectors fed the summaries raise and end the same detections at the same
    minutes, with the same evidence, as detectors fed the rows."""
    from tailwatch.detectors import config as detector_config
    from tailwatch.detectors.core import BY_COL, Minute, summaries, with_minute

    day = build_trace_day(_need(AZURE_TRACE), minutes=240, seed=SEED + 1, incidents=True, repeats=1)
    rows_fed, summaries_fed = detector_config.DetectorSet(), detector_config.DetectorSet()
    label_sets = summaries_fed.label_sets()
    assert ("pool", "traffic_class") in label_sets and ("workload", "model", "zone") in label_sets
    events = {"rows": [], "summaries": []}
    for m, req, gpu in trace_day_buckets(day):
        # As if the minute's rows closed in two checkpoints (two partitions): summaries of summaries.
        summary = None if req is None else pl.concat([summaries(with_minute(half, m), label_sets)
                                                      for half in (req[::2], req[1::2]) if half.height])
        if req is not None:
            assert set(summary[BY_COL].unique()) == {",".join(by) for by in label_sets}
            # Only the labels some detector reads are held (tenant by pool for tenant_starving;
            # never a language, voice or deployment).
            assert set(summary.columns) & set(SLICE_LABELS) == set().union(*label_sets)
        for name, dset, r in (("rows", rows_fed, req), ("summaries", summaries_fed, summary)):
            events[name] += [(e.detection.detector, sorted(e.detection.labels.items()), e.state, e.at_minute,
                              {k: pytest.approx(v, rel=1e-9) if isinstance(v, float) else v for k, v in e.evidence.items()})
                             for e in dset.observe(Minute(m, r, gpu))]
    assert len(events["rows"]) >= 4  # the injected incidents were found
    assert events["summaries"] == events["rows"]


def test_the_signal_view_answers_from_its_rollups_what_the_rows_say():
    """The live view holds closed request minutes rolled up per pool, tenant and version
    (signals/held.py), not the rows. On a public trace day with a canary and incidents (its
    rows spread over three tenants), every pool's request rate and tenants over its window,
    and every canary's and stable side's requests, errors and first-output p99 over the
    rollout window equal what the rows fed say, computed here straight from them; and the
    view holds 30 minutes and one row per label set seen in them."""
    from tailwatch.signals.live import LiveSignals, SignalPolicy
    from tailwatch.slo import histogram
    from tailwatch.planning.prices import GpuPrices
    from tailwatch.slo.spec import DEFAULT_SLOS, load_slos

    day = build_trace_day(_need(AZURE_TRACE), minutes=90, seed=SEED, incidents=True, repeats=1,
                          canary=TraceCanary("code-llm-a", "v2-rc1", share=0.2, start_minute=20, error_rate=0.05))
    live = LiveSignals(SignalPolicy(), load_slos(DEFAULT_SLOS), GpuPrices())
    empty, fed, checked = pl.DataFrame(), [], {"pools": 0, "canaries": 0}
    for m, req, gpu in trace_day_buckets(day):
        if req is not None:
            req = req.with_columns(tenant=pl.format("tenant-{}", pl.int_range(pl.len()) % 3))
            fed.append(req.with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_m")))
        live.add_closed(req if req is not None else empty, gpu if gpu is not None else empty)
        if m % 10 or m < 40:
            continue
        rows = pl.concat(fed, how="diagonal_relaxed")
        snap = live.snapshot(empty, empty, [], wall_s=60.0 * m)
        for pool, answer in snap.pools.items():
            window = msgspec.to_builtins(answer.body)["signals"]["window_minutes"]
            hi = answer.as_of_minute - 1 if window > 1 else answer.as_of_minute
            in_window = rows.filter((pl.col("pool") == pool) & pl.col("_m").is_between(hi - window + 1, hi))
            assert msgspec.to_builtins(answer.body)["signals"]["requests_per_s"] == pytest.approx(in_window["requests"].sum() / (60 * window))
            # The tenants of the label sets the view holds: those seen in its newest history_minutes.
            held = rows.filter((pl.col("pool") == pool) & (pl.col("_m") > rows["_m"].max() - SignalPolicy().history_minutes))
            assert answer.tenants == set(held["tenant"].unique())
            checked["pools"] += 1
        for (model, version), answer in snap.rollouts.items():
            if "canary" not in msgspec.to_builtins(answer.body):
                continue
            model_rows = rows.filter((pl.col("model") == model) & (pl.col("_m") > answer.as_of_minute - 30))
            for side, chosen in (("canary", model_rows.filter((pl.col("model_version") == version)
                                                             & (pl.col("deployment") != "stable"))),
                                 ("stable", model_rows.filter(pl.col("deployment") == "stable"))):
                said = msgspec.to_builtins(answer.body)[side]
                assert said["requests"] == chosen["requests"].sum()
                assert said["bad"] == (chosen["errors"] + chosen["timeouts"]).sum()
                bins = histogram.merge({b["bin"]: b["n"] for b in h} for h in chosen["first_output_ms_hist"].to_list() if h)
                assert said["first_output_p99_ms"] == pytest.approx(histogram.quantile_ms(bins, 0.99))
            assert answer.tenants == set(model_rows["tenant"].unique())
            checked["canaries"] += 1
    assert checked["pools"] > 20 and checked["canaries"] >= 4
    held, recent = live.recent.requests, rows.filter(pl.col("_m") > rows["_m"].max() - 30)
    assert held.pools["_m"].n_unique() == 30  # the history kept, and nothing older
    assert held.labels.height == recent.select("pool", "tenant", "model", "model_version", "deployment", "zone",
                                               "workload", "traffic_class").unique().height
