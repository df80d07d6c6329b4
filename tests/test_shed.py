"""Overload advice: the admission rule on its edge cases, and the
degradation ladder on a simulated pool that batch traffic saturates."""

from __future__ import annotations

import random

import msgspec
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch_dev.simulator import FleetSimulator, parse_start
from tailwatch.signals.answers import Shed, typed
from tailwatch.signals.live import LiveSignals, SignalPolicy
from tailwatch.signals.shed import (AdmissionRequest, RequestGroup, ShedPolicy, TrafficSlice, admit, admit_groups, shed_advice)
from tailwatch.planning.prices import GpuPrices
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.aggregates import GPU, REQUESTS
from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS
from tests.h100_lab import buckets


def r(id_: str, priority: int, cost: float) -> AdmissionRequest:
    return AdmissionRequest(id_, priority, cost)


def test_zero_capacity_admits_nothing():
    plan = admit([r("a", 3, 1.0), r("b", 0, 0.5)], 0.0)
    assert plan.admitted == [] and plan.rejected == ["a", "b"] and plan.used == 0.0


def test_higher_priority_first_then_cheaper_then_stable_id():
    reqs = [r("z-cheap-low", 1, 0.1), r("b-dear-high", 3, 4.0), r("a-dear-high", 3, 4.0), r("c-cheap-high", 3, 1.0)]
    # Budget 5: the cheap high-priority one, then one of the two equal ones (stable id: a before b).
    plan = admit(reqs, 5.0)
    assert plan.admitted == ["c-cheap-high", "a-dear-high"]
    assert plan.rejected == ["b-dear-high", "z-cheap-low"] or plan.rejected == ["b-dear-high"]
    # The cheap low-priority request fits in what is left only if any is: here 0 is left.
    assert "z-cheap-low" in plan.rejected


def test_equal_priorities_with_different_costs_admit_the_cheaper_first():
    plan = admit([r("x", 2, 3.0), r("y", 2, 1.0), r("w", 2, 2.0)], 3.0)
    assert plan.admitted == ["y", "w"] and plan.rejected == ["x"]


def test_a_request_larger_than_capacity_is_rejected_and_blocks_nobody_behind_it():
    plan = admit([r("huge", 5, 100.0), r("small", 1, 1.0), r("mid", 5, 2.0)], 10.0)
    assert plan.admitted == ["mid", "small"] and plan.rejected == ["huge"]
    assert plan.used == pytest.approx(3.0)


def test_stable_ids_make_the_plan_independent_of_arrival_order():
    reqs = [r(f"req-{i:03d}", i % 3, float(1 + i % 4)) for i in range(60)]
    first = admit(reqs, 40.0)
    for seed in range(5):
        shuffled = reqs[:]
        random.Random(seed).shuffle(shuffled)
        assert admit(shuffled, 40.0) == first
    with pytest.raises(ValueError):
        admit(reqs, -1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["acme", "globex", "hooli"]), st.sampled_from(["realtime", "batch"]),
                          st.integers(0, 4), st.integers(0, 12), st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0])),
                unique_by=lambda g: (g[0], g[1]), max_size=6),
       st.sampled_from([0.0, 0.5, 2.0, 7.25, 40.0]))
@pytest.mark.slow
def test_group_admission_counts_what_admitting_each_request_would(groups, capacity):
    gs = [RequestGroup(t, c, p, n, cost) for t, c, p, n, cost in groups]
    singles = [AdmissionRequest(f"{g.id}\x1f{i:04d}", g.priority, g.cost) for g in gs for i in range(g.requests)]
    plan = admit(singles, capacity)
    admitted = {g.id: 0 for g in gs}
    for id_ in plan.admitted:
        admitted[id_.rsplit("\x1f", 1)[0]] += 1
    assert {a.group.id: a.admitted for a in admit_groups(gs, capacity)} == admitted


def test_the_ladder_frees_batch_work_first_and_stops_where_demand_fits():
    traffic = [TrafficSlice("acme", "realtime", 10.0, 2.0, 8000.0, 2000.0),
               TrafficSlice("globex", "batch", 5.0, 1.5, 4000.0, 1000.0)]
    advice = shed_advice("p", traffic, 3.5, 2.5, ShedPolicy(quota_share={"acme": 0.5}), [], "llm")
    assert advice.under_pressure and advice.pressure[0].startswith("demand 3.50 GPU-s/s is over the capacity of 2.50")
    first, second = advice.steps[0], advice.steps[1]
    assert first.step == "delay_batch" and first.load_removed_gpu_s_per_s == pytest.approx(1.5) and first.enough
    assert first.still_over_gpu_s_per_s == 0.0
    assert second.step == "shed_over_quota" and second.load_removed_gpu_s_per_s == pytest.approx(0.75)
    assert not second.enough  # needed no more: the batch jobs were enough
    assert [s.step for s in advice.steps][-1] == "reject_low_priority"
    # Admission over the next minute at capacity 2.5 GPU-s/s: realtime first (priority 3).
    by_class = {a.group.traffic_class: a for a in advice.admission}
    # 150 GPU-s: 600 realtime × 0.2 = 120, then 30 ÷ 0.3 = 100 of 300 batch jobs.
    assert by_class["realtime"].rejected == 0 and by_class["batch"].admitted == 100 and by_class["batch"].rejected == 200


# ---- on the simulator: batch jobs leaking into a realtime pool -------------------------------
SCENARIO_START = parse_start("2026-11-02T00:00:00Z") // 60_000
POOL, CALM_POOL = "asr-us-east-1c-realtime", "asr-us-east-1a-realtime"


@pytest.fixture(scope="module")
def busy_snapshot():
    """busy-but-slow: from minute 130 batch jobs arrive in asr-us-east-1c-realtime at the
    realtime rate, and users wait 1.8 s in its queue."""
    sim = FleetSimulator("busy-but-slow", minutes=142, rate_scale=0.3, gpu_samples_per_minute=2)
    events = list(sim.events())
    req = buckets([msgspec.json.encode(e) for e in events if isinstance(e, RequestV1)], RequestV1, REQUEST_COLUMNS, REQUESTS)
    gpu = buckets([msgspec.json.encode(e) for e in events if isinstance(e, GpuV1)], GpuV1, GPU_COLUMNS, GPU)
    live = LiveSignals(SignalPolicy(), load_slos(DEFAULT_SLOS), GpuPrices())
    newest = req["window_start"].max()
    live.add_closed(req.filter(pl.col("window_start") < newest), gpu.filter(pl.col("window_start") < newest))
    return live.snapshot(req.filter(pl.col("window_start") == newest), gpu.filter(pl.col("window_start") == newest),
                         [], wall_s=0.0)


@pytest.mark.slow
def test_shedding_advice_delays_the_batch_jobs_first_with_the_load_they_free(busy_snapshot):
    body = msgspec.to_builtins(busy_snapshot.shed[POOL].body)
    assert body["under_pressure"] and any("queue age" in p for p in body["pressure"]), body["pressure"]
    first = body["steps"][0]
    assert first["step"] == "delay_batch" and first["enough"]
    # The leak runs at the realtime rate: about half the pool's work is batch.
    assert 0.35 < first["share_of_demand"] < 0.65, first
    assert "batch" in first["basis"]
    assert not any(s["enough"] for s in body["steps"][1:])
    # Admission: realtime before batch, and the answer fits its documented type whole.
    groups = body["admission"]["groups"]
    assert min(g["priority"] for g in groups if g["traffic_class"] == "realtime") > \
        max(g["priority"] for g in groups if g["traffic_class"] == "batch")
    assert msgspec.json.decode(msgspec.json.encode(typed(body, Shed)), type=dict) == \
        msgspec.json.decode(msgspec.json.encode(body), type=dict)


@pytest.mark.slow
def test_a_calm_pool_gets_no_shedding(busy_snapshot):
    body = msgspec.to_builtins(busy_snapshot.shed[CALM_POOL].body)
    assert not body["under_pressure"] and body["pressure"] == []
    assert not any(s["enough"] for s in body["steps"])
    assert all(g["rejected"] == 0 for g in body["admission"]["groups"])


def test_the_real_h100_run_that_shed_most_of_its_requests_is_under_pressure():
    """The H100 lab (one GPU, 361 of 632 requests shed, queue age up to 11 s): all realtime,
    so there is no batch to delay, and the advice says so; the answer fits its type whole."""
    from tests.h100_lab import lab_gpu_minute, lab_sli_minute

    req, gpu = lab_sli_minute(), lab_gpu_minute()
    newest = req["window_start"].max()
    live = LiveSignals(SignalPolicy(), load_slos(DEFAULT_SLOS), GpuPrices())
    live.add_closed(req.filter(pl.col("window_start") < newest), gpu.filter(pl.col("window_start") < newest))
    snap = live.snapshot(req.filter(pl.col("window_start") == newest), gpu.filter(pl.col("window_start") == newest),
                         [], wall_s=0.0)
    body = msgspec.to_builtins(snap.shed["h100-lab"].body)
    assert body["under_pressure"] and any("queue age" in p for p in body["pressure"]), body["pressure"]
    first = body["steps"][0]
    assert first["step"] == "delay_batch" and first["load_removed_gpu_s_per_s"] == 0 and not first["enough"]
    assert "no batch, eval or replay traffic" in first["basis"]
    assert {g["traffic_class"] for g in body["admission"]["groups"]} == {"realtime"}
    assert msgspec.json.decode(msgspec.json.encode(typed(body, Shed)), type=dict) == \
        msgspec.json.decode(msgspec.json.encode(body), type=dict)
