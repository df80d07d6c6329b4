"""Staged-pipeline bottleneck and greedy compute plan: a worked speech pipeline."""

import math

import pytest

from tailwatch.planning.prices import GpuPrices
from tailwatch.planning.phase_plan import PlanConstraints, PhaseProfile, bottleneck, plan_phases

PRICES = GpuPrices({"H100": 4.00, "L4": 0.80}, default_usd_per_gpu_hour=2.00)
CPU_USD = 0.10


def pipeline(acoustic_batch: float = 1.0) -> list[PhaseProfile]:
    return [
        PhaseProfile("feature_extraction", "cpu", 5.0),
        PhaseProfile("acoustic_model", "gpu", 20.0, batch_size=acoustic_batch, gpu_sku="H100",
                     utilisation=0.95, measured_rps=47.0, queue_ms_p95=30.0),
        PhaseProfile("language_model", "gpu", 15.0, gpu_sku="H100"),
        PhaseProfile("post_processing", "cpu", 2.0),
    ]


def needed(per_worker_rps: float, target_rps: float, utilisation: float) -> int:
    return math.ceil(round(target_rps / (per_worker_rps * utilisation), 9))


def test_worked_pipeline_bottleneck_is_the_acoustic_model():
    ps = pipeline()
    assert [p.throughput_per_worker_rps for p in ps] == pytest.approx([200, 50, 1000 / 15, 500])
    b = bottleneck(ps)
    assert b.stage == "acoustic_model" and b.capacity_rps == pytest.approx(50)
    text = " ".join(b.evidence)
    assert "next-smallest language_model at 66.7 rps" in text
    assert "95% busy" in text and "queue wait 30 ms" in text
    assert "48% of the pipeline's 42 ms" in text  # 20 of 5 + 20 + 15 + 2


def test_bottleneck_follows_given_workers_and_ties_go_to_the_earlier_stage():
    ps = pipeline()
    assert bottleneck(ps, {"acoustic_model": 2}).stage == "language_model"
    # feature extraction 200 rps; acoustic 4 × 50 = 200 rps: a tie, the earlier phase wins
    tie = bottleneck(ps, {"acoustic_model": 4, "language_model": 4})
    assert tie.stage == "feature_extraction" and tie.capacity_rps == pytest.approx(200)
    with pytest.raises(ValueError, match="unknown stages"):
        bottleneck(ps, {"vocoder": 2})


def test_plan_meets_the_target_with_the_exact_worker_counts():
    c = PlanConstraints(target_rps=400, budget_usd_per_hour=1000)
    plan = plan_phases(pipeline(), c, PRICES, cpu_usd_per_worker_hour=CPU_USD)
    want = {p.stage: needed(p.throughput_per_worker_rps, 400, 0.8) for p in pipeline()}
    assert want == {"feature_extraction": 3, "acoustic_model": 10, "language_model": 8, "post_processing": 1}
    assert {s.stage: s.workers for s in plan.stages} == want
    assert plan.met and plan.stopped_by == "target met"
    assert plan.usd_per_hour == pytest.approx((10 + 8) * 4.00 + (3 + 1) * CPU_USD)
    assert plan.throughput_rps >= 400 - 1e-6
    assert plan.usd_per_request == pytest.approx(plan.usd_per_hour / (3600 * 400))
    assert all(s.utilisation <= 0.8 + 1e-9 for s in plan.stages)
    # one line per added worker, after the start line
    assert len([w for w in plan.working if w.startswith("add 1")]) == sum(want.values()) - 4
    assert plan.working[1] == "add 1 acoustic_model worker (bottleneck 50 rps → 100 rps), $12.20/h"
    # at 200 rps feature extraction, acoustic (4 workers) and language (3) tie: the earliest phase gets the worker
    assert plan.working[6] == "add 1 feature_extraction worker (bottleneck 200 rps → 400 rps), $28.30/h"


def test_latency_is_the_mm1_inflation_of_the_bare_latency():
    one = [PhaseProfile("acoustic_model", "gpu", 20.0, gpu_sku="H100")]
    plan = plan_phases(one, PlanConstraints(target_rps=40), PRICES)
    assert plan.stages[0].workers == 1 and plan.stages[0].utilisation == pytest.approx(0.8)
    assert plan.latency_ms == pytest.approx(20.0 / (1 - 0.8))
    measured = [PhaseProfile("acoustic_model", "gpu", 20.0, latency_p95_ms=30.0, gpu_sku="H100")]
    assert plan_phases(measured, PlanConstraints(target_rps=40), PRICES).latency_ms == pytest.approx(150.0)


def test_latency_bound_adds_workers_beyond_throughput():
    loose = plan_phases(pipeline(), PlanConstraints(target_rps=400), PRICES)
    assert loose.latency_ms > 120
    plan = plan_phases(pipeline(), PlanConstraints(target_rps=400, max_latency_ms=120), PRICES)
    assert plan.met and plan.stopped_by == "target met" and plan.latency_ms <= 120
    extra = sum(s.workers for s in plan.stages) - sum(s.workers for s in loose.stages)
    assert extra > 0 and len([w for w in plan.working if "pipeline latency" in w]) == extra


def test_budget_binds_and_the_plan_says_what_the_target_needs():
    c = PlanConstraints(target_rps=400, budget_usd_per_hour=40)
    plan = plan_phases(pipeline(), c, PRICES, cpu_usd_per_worker_hour=CPU_USD)
    assert plan.stopped_by == "budget" and not plan.met
    assert plan.throughput_rps < 400
    assert plan.usd_per_hour <= 40
    # it spent what it could: one more worker on the limiting phase would pass the budget
    limiting = next(s for s in plan.stages if s.stage == plan.bottleneck)
    assert plan.usd_per_hour + limiting.usd_per_hour / limiting.workers > 40
    assert plan.usd_per_request == pytest.approx(plan.usd_per_hour / (3600 * plan.throughput_rps))
    assert plan.working[-1] == "the target needs $72.40/h: $32.40/h more than the $40.00/h budget"


def test_budget_below_one_worker_per_stage_stops_at_once():
    plan = plan_phases(pipeline(), PlanConstraints(target_rps=400, budget_usd_per_hour=5), PRICES)
    assert plan.stopped_by == "budget" and not plan.met
    assert [s.workers for s in plan.stages] == [1, 1, 1, 1]


def test_impossible_latency_bound_stops_at_once():
    c = PlanConstraints(target_rps=400, max_latency_ms=41)  # service times sum to 42 ms
    plan = plan_phases(pipeline(), c, PRICES)
    assert plan.stopped_by == "latency bound" and not plan.met
    assert [s.workers for s in plan.stages] == [1, 1, 1, 1]
    assert "no number of workers can meet it" in plan.working[-1]


def test_max_workers_stops_the_plan():
    plan = plan_phases(pipeline(), PlanConstraints(target_rps=400, max_workers_per_phase=5), PRICES)
    assert plan.stopped_by == "max workers" and not plan.met
    assert max(s.workers for s in plan.stages) == 5 and plan.throughput_rps < 400


def test_gpu_type_choice_by_cost_per_request():
    c = PlanConstraints(target_rps=400, gpu_types=("H100", "L4"))
    # L4 at 0.3 of an H100: $0.80 ÷ 0.3 beats $4.00 ÷ 1 per request
    plan = plan_phases(pipeline(), c, PRICES, gpu_speed={"H100": 1.0, "L4": 0.3})
    by = {s.stage: s for s in plan.stages}
    assert by["acoustic_model"].gpu_sku == "L4" and by["language_model"].gpu_sku == "L4"
    assert by["feature_extraction"].gpu_sku is None
    am = by["acoustic_model"]
    assert am.capacity_rps / am.workers == pytest.approx(50 * 0.3)
    assert am.workers == needed(50 * 0.3, 400, 0.8) and am.usd_per_hour == pytest.approx(am.workers * 0.80)
    assert any(w.startswith("acoustic_model on L4") for w in plan.working)
    # at the default speeds (L4 0.12 of an H100), $0.80 ÷ 0.12 loses to $4.00 ÷ 1
    default = plan_phases(pipeline(), c, PRICES)
    assert {s.gpu_sku for s in default.stages if s.device == "gpu"} == {"H100"}
    with pytest.raises(ValueError, match="no relative speed for GPU types: X9"):
        plan_phases(pipeline(), PlanConstraints(target_rps=400, gpu_types=("H100", "X9")), PRICES)


def test_gpu_types_fall_back_to_the_fastest_when_the_cheapest_cannot_meet_the_latency_bound():
    # on L4 at 0.3 the bare latencies sum to 5 + 66.7 + 50 + 2 = 123.7 ms, over a 100 ms bound
    c = PlanConstraints(target_rps=400, max_latency_ms=100, gpu_types=("L4", "H100"))
    plan = plan_phases(pipeline(), c, PRICES, gpu_speed={"H100": 1.0, "L4": 0.3})
    assert {s.gpu_sku for s in plan.stages if s.device == "gpu"} == {"H100"}
    assert plan.met and plan.latency_ms <= 100
    assert any("move to the fastest type" in w for w in plan.working)


def test_batching_raises_per_worker_throughput():
    ps = pipeline(acoustic_batch=4)
    assert ps[1].throughput_per_worker_rps == pytest.approx(200)
    assert bottleneck(ps).stage == "language_model"
    plan = plan_phases(ps, PlanConstraints(target_rps=400), PRICES)
    assert next(s.workers for s in plan.stages if s.stage == "acoustic_model") == needed(200, 400, 0.8)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="duplicate stage names: asr"):
        bottleneck([PhaseProfile("asr", "gpu", 20.0), PhaseProfile("asr", "cpu", 5.0)])
    with pytest.raises(ValueError, match="service_ms must be positive"):
        PhaseProfile("asr", "gpu", 0.0)
    with pytest.raises(ValueError, match="utilisation must be in"):
        PhaseProfile("asr", "gpu", 20.0, utilisation=1.5)
    with pytest.raises(ValueError, match="batch_size"):
        PhaseProfile("asr", "gpu", 20.0, batch_size=0.5)
    with pytest.raises(ValueError, match="no stage profiles"):
        plan_phases([], PlanConstraints(target_rps=1), PRICES)
    with pytest.raises(ValueError, match="target_rps must be positive"):
        PlanConstraints(target_rps=0)
    with pytest.raises(ValueError, match="target_utilisation"):
        PlanConstraints(target_rps=1, target_utilisation=0)
