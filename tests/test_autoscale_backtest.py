"""The autoscaler's worth on public traces: the serving model's queue, the HPA's formula and
stabilisation on hand-checked cases, and a backtest on a slice of the Azure trace whose
numbers add up (replica-hours, work served, the HPA's replica series)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tailwatch_dev.serving_sim import Hpa, MinuteLoad, erlang_c, p95_wait_s, serve_minute, simulate
from tailwatch_dev.backtest_trace import SLOTS_PER_REPLICA, controllers, diurnal_factor, diurnal_week, run, trace_minutes
from tailwatch_dev.traces import AZURE_CODE_TRACE


def test_erlang_c_and_the_wait_by_hand():
    # M/M/2 at one Erlang: Erlang B = 0.5 / 2.5 = 0.2, C = 2·0.2 / (2 − 1·0.8) = 1/3.
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    # P(wait > t) = C·e^(−(c − a)t/S): the p95 is ln(C / 0.05)·S / (c − a).
    assert p95_wait_s(2, 1.0, 4.0) == pytest.approx(math.log((1 / 3) / 0.05) * 4.0)
    assert p95_wait_s(2, 2.0, 4.0) == math.inf and p95_wait_s(50, 1.0, 4.0) == 0.0
    # A minute that does not fit leaves its excess as a backlog and is over SLO.
    m = serve_minute(0, 1, 0, MinuteLoad(120, 6.0), 0.0, 8, 1.0)  # 12 Erlangs offered to 8 slots
    assert m.in_flight == 8 and m.backlog_s == pytest.approx(4 * 60) and m.over_slo
    assert m.nvml_utilization == pytest.approx(1 - math.exp(-8))


def test_the_hpa_follows_kubernetes_formula_tolerance_and_scale_down_window():
    hpa = Hpa(target=0.7)
    assert hpa.raw(10, 0.91) == 13  # ceil(10 × 0.91 / 0.7)
    assert hpa.raw(10, 0.75) == 10  # 1.07: within the 10% tolerance
    assert hpa.raw(10, 0.62) == 9  # 0.886: outside it, ceil(8.86)
    assert hpa.decide(0, 10, 0.91) == 13
    # Load halves: the raw answer is 7, but scale-down takes the highest of the last 5 minutes.
    assert [hpa.decide(t, 13, 0.35) for t in range(1, 5)] == [13, 13, 13, 13]
    assert hpa.decide(5, 13, 0.35) == 7  # minute 0's 13 has left the 300 s window
    assert hpa.decide(6, 7, 1.0) == 10  # scale-up is not stabilised: ceil(7 / 0.7)


def test_a_backtest_on_a_trace_slice_adds_up():
    loads = trace_minutes(AZURE_CODE_TRACE, rate_scale=10)[:20]
    assert sum(load.arrivals for load in loads) > 10_000
    rows = run("azure-code slice", loads)
    assert [r.controller for r in rows] == list(controllers())
    for row in rows:
        minutes = row.result.minutes
        assert row.result.replica_hours == pytest.approx(sum(m.ready + m.starting for m in minutes) / 60)
        assert row.result.minutes_over_slo == sum(1 for m in minutes if m.p95_wait_s > 1.0 or m.backlog_s > 0)
        assert all(m.in_flight <= m.ready * SLOTS_PER_REPLICA + 1e-9 for m in minutes)
        # Work is conserved: what arrived was served or is still waiting.
        offered = sum(load.arrivals * load.mean_service_s for load in loads)
        assert sum(m.in_flight * 60 for m in minutes) + minutes[-1].backlog_s == pytest.approx(offered)
    # The HPA row's replicas are the HPA's own answers, minute after minute.
    hpa, series = Hpa(target=0.7), rows[0].result.minutes
    for before, after in zip(series, series[1:]):
        assert after.ready + after.starting == hpa.decide(before.minute, before.ready + before.starting,
                                                          before.nvml_utilization)


def test_replicas_added_load_for_the_startup_minutes_before_they_serve():
    loads = [MinuteLoad(0, 1.0)] + [MinuteLoad(480, 6.0)] * 7  # 48 Erlangs from minute 1
    result = simulate(loads, lambda m, paid: 9, initial_replicas=1, slots=8, startup_minutes=2)
    minutes = result.minutes
    assert [(m.ready, m.starting) for m in minutes[:4]] == [(1, 0), (1, 8), (1, 8), (9, 0)]
    # 8 slots serve 8 of 48 Erlangs until minute 3; then 72 slots drain the backlog by 24 a minute.
    assert [round(m.backlog_s / 60) for m in minutes] == [0, 40, 80, 56, 32, 8, 0, 0]
    assert [m.over_slo for m in minutes] == [False, True, True, True, True, True, False, False]
    assert result.replica_hours == pytest.approx((1 + 9 * 7) / 60)


def test_the_diurnal_week_peaks_in_the_afternoon_and_rests_at_the_weekend():
    assert diurnal_factor(15 * 60) == pytest.approx(1.0) and diurnal_factor(3 * 60) == pytest.approx(0.25)
    assert diurnal_factor(5 * 1440 + 15 * 60) == pytest.approx(0.6)
    week = diurnal_week([MinuteLoad(100, 2.0)])
    assert len(week) == 7 * 1440 and max(w.arrivals for w in week) == 100 and week[3 * 60].arrivals == 25


@pytest.mark.slow
def test_the_command_prints_the_table_for_a_trace():
    r = subprocess.run([sys.executable, "-m", "tailwatch", "backtest", "autoscale", "--trace", "azure-code",
                        "--rate-scale", "5", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    table = [json.loads(line) for line in r.stdout.splitlines()[1:]]  # a heading, then a JSON line per row
    assert [row["controller"] for row in table] == list(controllers())
    assert all(float(row["replica_h"]) > 0 for row in table)
    bad = subprocess.run([sys.executable, "-m", "tailwatch", "backtest", "autoscale", "--trace", "azure-code",
                          "--pool", "p"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--trace" in bad.stderr and "Traceback" not in bad.stderr
