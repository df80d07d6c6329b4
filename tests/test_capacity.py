"""Capacity math: worked examples, printed with their working."""

import subprocess
import sys

import pytest

from tailwatch.planning import capacity


def test_streams_to_gpus_with_zone_headroom():
    plan = capacity.replicas(10_000 * 0.35, target_utilization=0.7, zones=3)
    assert (plan.base_replicas, plan.with_zone_headroom) == (5_000, 7_500)


def test_one_zone_gets_no_headroom_and_bad_inputs_are_refused():
    assert capacity.replicas(7.0, 0.7, zones=1).with_zone_headroom == 10
    with pytest.raises(ValueError):
        capacity.replicas(1.0, 0.0)
    with pytest.raises(ValueError):
        capacity.replicas(-1.0, 0.5)


def test_kv_cache_bytes_and_fit():
    plan = capacity.kv_cache(layers=32, kv_heads=32, head_dim=128, tokens=8000, bytes_per_value=2)
    assert plan.bytes_per_request == 4_194_304_000
    too_big = capacity.kv_cache(32, 32, 128, 8000, 2, gpu_memory_gib=80, weights_gib=140)
    assert too_big.weights_fit is False and too_big.requests_per_gpu == 0
    fits = capacity.kv_cache(32, 8, 128, 8000, 2, gpu_memory_gib=80, weights_gib=16)
    assert fits.weights_fit and fits.requests_per_gpu == (64 * 2**30) // 1_048_576_000


def test_capacity_command_prints_its_working():
    r = subprocess.run([sys.executable, "-m", "tailwatch", "capacity", "replicas", "--concurrent-streams", "10000",
                        "--gpu-seconds-per-unit", "0.35", "--target-utilization", "0.7", "--zones", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0
    assert "ceil(3,500 ÷ 0.7) = 5,000" in r.stdout and "= 7,500" in r.stdout
    r = subprocess.run([sys.executable, "-m", "tailwatch", "capacity", "kv-cache", "--layers", "32", "--kv-heads", "32",
                        "--head-dim", "128", "--tokens", "8000", "--bytes-per-value", "2",
                        "--gpu-memory-gib", "80", "--weights-gib", "140"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "4,194,304,000 bytes" in r.stdout and "weights alone do not fit" in r.stdout


def test_sustained_capacity_needs_consecutive_held_minutes_and_keeps_the_best_day():
    from tailwatch.planning.capacity import PoolMinute, SustainedCapacity

    c = SustainedCapacity(sustained_minutes=3, history_days=2)
    feed = lambda minute, work, held=True, warm=4: c.observe(PoolMinute("p", minute, work, warm, held))  # noqa: E731
    assert feed(0, 4.0) is None and feed(1, 8.0) is None
    assert feed(2, 6.0) == 1.0  # min over the run of 3: 4 GPU-s/s on 4 warm replicas
    assert feed(3, 8.0, held=False) is None  # latency broke: the run starts over
    assert feed(4, 8.0) is None and feed(5, 8.0) is None
    assert feed(6, 8.0) == 2.0 and c.capacity("p", 6) == 2.0
    assert feed(8, 9.0) is None  # a gap in the minutes is not sustained
    assert feed(1440, 2.0) is None and feed(1441, 2.0) is None and feed(1442, 2.0) == 0.5
    assert c.capacity("p", 1442) == 2.0  # yesterday's peak still counts
    assert c.capacity("p", 3 * 1440) is None  # …until it ages out
    assert feed(10_000, 1.0, warm=0) is None  # no warm replicas: nothing to measure


# ---- capacity bounded in both directions ------------------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402

from tailwatch.signals.autoscale import AutoscalePolicy, Autoscaler, PoolSignals  # noqa: E402
from tailwatch.planning.capacity import (PhysicalBound, PoolMinute, ReplicaShape, SustainedCapacity,  # noqa: E402
                          estimate_capacity, physical_bound)


def test_physical_bound_is_the_gpus_or_the_token_limit_that_binds_first():
    assert physical_bound(ReplicaShape(gpus_per_replica=8)).gpu_s_per_s == 8.0
    # 2 GPU-s/s of work carrying 20,000 prompt and 1,000 output tokens/s: 1e-4 and 2e-3 GPU-s per token.
    shape = ReplicaShape(gpus_per_replica=8, prefill_tokens_per_s=50_000, decode_tokens_per_s=2_000)
    b = physical_bound(shape, work_gpu_s_per_s=2.0, prompt_tokens_per_s=20_000, output_tokens_per_s=1_000)
    assert b.binds == "decode tokens" and b.gpu_s_per_s == pytest.approx(4.0)  # 2,000 tok/s × 2e-3
    b = physical_bound(ReplicaShape(gpus_per_replica=8, prefill_tokens_per_s=10_000), 2.0, 20_000, 1_000)
    assert b.binds == "prefill tokens" and b.gpu_s_per_s == pytest.approx(1.0)


def test_the_estimate_is_the_least_upper_bound_the_evidence_supports():
    phys = PhysicalBound(1.0, "gpus", "1 GPU")
    calm = estimate_capacity(phys, held=0.16)  # a quiet pool: held 16%, never broke
    assert calm.basis == "physical" and calm.per_replica_gpu_s_per_s == 1.0 and calm.lower_gpu_s_per_s == 0.16
    broke = estimate_capacity(phys, held=0.5, broke=0.8)
    assert broke.basis == "breach" and broke.per_replica_gpu_s_per_s == 0.8 and "breach bound decided" in broke.reason
    # A breach at a load the pool has held was not the load's doing (cold start, bad version).
    assert estimate_capacity(phys, held=0.5, broke=0.3).basis == "physical"
    # Held above one GPU-s/s per GPU: the unit is wall time, the physical bound says nothing.
    wall = estimate_capacity(phys, held=3.0)
    assert wall.basis == "measured-above-physical" and wall.per_replica_gpu_s_per_s == 3.0
    assert estimate_capacity(phys, held=3.0, broke=5.0).per_replica_gpu_s_per_s == 5.0


def test_breach_runs_give_an_upper_bound_at_their_highest_load():
    """Each window of 3 breached minutes bounds capacity by its highest load (queues lag the
    load that filled them); the bound is the lowest such window."""
    c = SustainedCapacity(sustained_minutes=3)
    for minute, work, held in ((0, 1.0, True), (1, 1.0, True), (2, 1.0, True),  # held 0.25 per replica
                               (3, 3.6, False), (4, 3.2, False), (5, 3.0, False)):  # broke, peaking at 0.9
        c.observe(PoolMinute("p", minute, work, 4, held))
    held, broke = c.bounds("p", 5)
    assert held == 0.25 and broke == pytest.approx(0.9)
    c.observe(PoolMinute("p", 6, 0.8, 4, False))  # the queue drains: minutes 4-6 peaked at 0.8
    assert c.bounds("p", 6)[1] == pytest.approx(0.8)
    c.observe(PoolMinute("p", 10, 0.2, 4, False))  # one bad minute alone is no run
    assert c.bounds("p", 10)[1] == pytest.approx(0.8)


def _pool(work: float, current: int, queue_ms: float, first_ms: float, minute: int, prompt_per_gpu_s: float,
          output_per_gpu_s: float) -> PoolSignals:
    return PoolSignals(pool="p", as_of_minute=minute, requests_per_s=work * 10, work_gpu_s_per_s=work,
                       tokens_per_s=work * output_per_gpu_s, audio_s_per_s=0.0, active_streams=0,
                       queue_age_p95_ms=queue_ms, first_output_p95_ms=first_ms, first_output_slo_ms=1200.0,
                       kv_cache_usage_max=None, gpu_util_mean_pct=None, replicas_by_state={"warm": current},
                       prompt_tokens_per_s=work * prompt_per_gpu_s)


history_minutes = st.lists(st.tuples(st.floats(0.0, 4.0), st.booleans(), st.integers(1, 8)), max_size=40)


@settings(max_examples=400, deadline=None)
@given(history=history_minutes, zones=st.integers(1, 5), target=st.floats(0.2, 1.0),
       gpus=st.sampled_from([1.0, 2.0, 8.0]), prefill=st.one_of(st.none(), st.floats(1e3, 1e5)),
       decode=st.one_of(st.none(), st.floats(1e2, 1e4)), prompt_per_gpu_s=st.floats(1e2, 1e5),
       output_per_gpu_s=st.floats(10, 1e4), current=st.integers(1, 300), share=st.floats(0.0, 1.0),
       earlier=st.lists(st.tuples(st.floats(0.0, 3.0), st.booleans()), max_size=12))
def test_a_pool_without_breach_under_its_planning_target_is_never_told_to_grow(
        history, zones, target, gpus, prefill, decode, prompt_per_gpu_s, output_per_gpu_s, current, share, earlier):
    """The invariant: queue age and first output within SLO, and work under the planning
    target (target utilisation, less zone-loss headroom) of the capacity the answer states
    → desired ≤ current. Whatever the pool's measured past, its earlier answers, its shape."""
    measured = SustainedCapacity(sustained_minutes=3)
    for minute, (load, held, warm) in enumerate(history):
        measured.observe(PoolMinute("p", minute, load * warm, warm, held))
    now = len(history) + 20
    policy = AutoscalePolicy(target_utilization=target, zones=zones, min_replicas=1)
    scaler = Autoscaler(policy)
    shape = ReplicaShape(gpus_per_replica=gpus, prefill_tokens_per_s=prefill, decode_tokens_per_s=decode)
    phys = physical_bound(shape, 1.0, prompt_per_gpu_s, output_per_gpu_s)  # per GPU-s of work: scale-free
    estimate = estimate_capacity(phys, *measured.bounds("p", now))
    for i, (load, breach) in enumerate(earlier):  # earlier answers, with and without users waiting
        scaler.decide(_pool(load * current, current, 5000.0 if breach else 10.0, 300.0, now - len(earlier) + i,
                            prompt_per_gpu_s, output_per_gpu_s), estimate)
    planning = target * (zones - 1) / zones if zones > 1 else target
    work = share * planning * current * estimate.per_replica_gpu_s_per_s
    d = scaler.decide(_pool(work, current, 999.0, 1199.0, now, prompt_per_gpu_s, output_per_gpu_s), estimate)
    assert d.desired_replicas <= d.current_replicas == current, d.reasons
    assert d.signals["utilization_of_capacity"] <= d.signals["planning_target_utilization"] + 1e-9
    assert estimate.lower_gpu_s_per_s is None or estimate.per_replica_gpu_s_per_s >= min(
        estimate.lower_gpu_s_per_s, estimate.upper_gpu_s_per_s)
    if not measured.broke_by_day.get("p"):
        # Never broke: the physical bound (or a held load above it) decided, never the quiet past.
        assert estimate.basis in ("physical", "measured-above-physical")
    # The same pool with users waiting is told to grow, and gets more than the calm answer.
    sat = Autoscaler(policy).decide(_pool(work, current, 2500.0, 300.0, now, prompt_per_gpu_s, output_per_gpu_s),
                                    estimate)
    assert sat.desired_replicas > current >= d.desired_replicas


@pytest.mark.slow
def test_capacity_measured_says_what_the_store_lacks(tmp_path):
    """No capacity measured is explained by what the store holds: no signal stage, no GPU
    samples, or GPU minutes that never held 3 sustained minutes within the SLO."""
    import subprocess
    import sys

    from tailwatch.store.connection import connect
    from tailwatch.streams.signal_stage import SCHEMA_SQL

    path = tmp_path / "s.duckdb"

    def measured() -> str:
        r = subprocess.run([sys.executable, "-m", "tailwatch", "capacity", "measured", "--store", str(path)],
                           capture_output=True, timeout=120)
        assert r.returncode == 2 and b"Traceback" not in r.stderr
        return r.stderr.decode()

    con = connect(path)
    con.close()
    assert "no worker with the signal stage has written this store" in measured()
    con = connect(path)
    con.execute(SCHEMA_SQL)
    con.close()
    assert "no GPU samples" in measured()
    con = connect(path)
    con.execute("INSERT INTO gpu_minute (window_start, node, gpu_index, zone, pool) VALUES "
                "('2026-11-02 00:00', 'n1', 0, 'z', 'llm-a'), ('2026-11-02 00:01', 'n1', 0, 'z', 'llm-a')")
    con.close()
    err = measured()
    assert "2 minutes of GPU samples over 1 pool, " in err and "3 consecutive minutes" in err
    assert "--http-port" not in err  # the worker that wrote it had one: not the reason
