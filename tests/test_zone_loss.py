"""A zone lost at peak, end to end: the simulator's zone-loss scenario through the real broker
and a worker into the store, then `tailwatch drill zone-loss` over that store, checked against
the (z−1)/z capacity math and the scenario's labelled truth."""

from __future__ import annotations

import math

import pytest

from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch_dev.simulator import (WARM_POOL_LOADING_MIN, WARM_POOL_PROMOTED_AT_MIN, WARM_POOL_REPLICAS, ZONE_LOSS_AT_MIN,
                              ZONE_LOST, ZONES, FleetSimulator, queue_wait_ms)
from tailwatch.signals.live import SignalPolicy
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.backtest import BacktestError, read_buckets
from tailwatch.cli import main
from tailwatch.drill import drill, find_zone_loss
from tests.test_pipeline import publish, run_worker

SURVIVORS = [z for z in ZONES if z != ZONE_LOST]


def test_queue_wait_grows_with_load_and_is_bounded():
    waits = [queue_wait_ms(rho, 6, 1600.0) for rho in (0.3, 0.6, 0.8, 0.9, 0.95, 0.98, 1.5)]
    assert waits == sorted(waits) and waits[0] < 0.01 * 1600 and waits[3] > 1000
    # Near saturation, within 30% of the exact M/M/c wait (Erlang C), where waits matter.
    c, rho = 6, 0.9
    a = c * rho
    tail = a ** c / math.factorial(c) / (1 - rho)
    erlang_c = tail / (sum(a ** k / math.factorial(k) for k in range(c)) + tail)
    exact = erlang_c * 1600.0 / (c * (1 - rho))
    assert abs(waits[3] / exact - 1) < 0.3, (waits[3], exact)
    assert waits[-1] == waits[-2] <= 60_000  # overload: held at the bound, never infinite or negative
    assert queue_wait_ms(0.9, 0, 1600.0) == 60_000.0  # no server at all
    assert queue_wait_ms(0.9, 12, 1600.0) < queue_wait_ms(0.9, 6, 1600.0)  # more servers, shorter waits


@pytest.mark.slow
def test_the_scenario_loses_a_zone_and_moves_its_traffic_to_the_survivors():
    sim = FleetSimulator("zone-loss", seed=3)
    truth = sim.truth()
    assert {t["kind"] for t in truth} == {"zone_loss", "failover", "warm_pool_promotion"}
    assert [t["selector"] for t in truth if t["kind"] == "zone_loss"] == [{"zone": ZONE_LOST}]
    per_minute: dict[tuple[str, int], int] = {}
    loading: dict[tuple[str, int], set] = {}
    gpus: dict[tuple[str, int], set] = {}
    for e in sim.events():
        m = (e.ts - sim.start_ms) // 60_000
        if isinstance(e, RequestV1) and e.traffic_class == "realtime" and e.attempt == 1:
            per_minute[(e.zone, m)] = per_minute.get((e.zone, m), 0) + 1
        if isinstance(e, GpuV1):
            gpus.setdefault((e.pool, m), set()).add(e.gpu_uuid)
            if e.replica_state == "loading":
                loading.setdefault((e.pool, m), set()).add(e.gpu_uuid)
    assert not [k for k in per_minute if k[0] == ZONE_LOST and k[1] >= ZONE_LOSS_AT_MIN]
    assert not [k for k in gpus if ZONE_LOST in k[0] and k[1] >= ZONE_LOSS_AT_MIN]
    before = range(ZONE_LOSS_AT_MIN - 10, ZONE_LOSS_AT_MIN)
    after = range(ZONE_LOSS_AT_MIN, ZONE_LOSS_AT_MIN + 10)
    fleet_before = sum(per_minute.get((z, m), 0) for z in ZONES for m in before)
    for zone in SURVIVORS:
        mine_before = sum(per_minute.get((zone, m), 0) for m in before)
        mine_after = sum(per_minute.get((zone, m), 0) for m in after)
        assert 1.35 < mine_after / mine_before < 1.65, zone  # its own traffic and half the lost zone's
        assert abs(mine_after - fleet_before / len(SURVIVORS)) < 0.08 * mine_after
        pool = f"llm-{zone}-realtime"
        ready = WARM_POOL_PROMOTED_AT_MIN + WARM_POOL_LOADING_MIN
        assert len(gpus[(pool, WARM_POOL_PROMOTED_AT_MIN - 1)]) == 6
        assert len(loading[(pool, WARM_POOL_PROMOTED_AT_MIN)]) == WARM_POOL_REPLICAS
        assert len(gpus[(pool, ready)]) == 6 + WARM_POOL_REPLICAS and (pool, ready) not in loading


@pytest.fixture(scope="module")
def zone_loss_store(new_memory, tmp_path_factory):
    kafka = new_memory()
    sim = FleetSimulator("zone-loss", seed=7)
    publish(kafka, list(sim.events()))
    path = tmp_path_factory.mktemp("zone-loss") / "tw.duckdb"
    run_worker(kafka, path, slos=load_slos(DEFAULT_SLOS))
    return sim, path


@pytest.mark.slow
def test_the_drill_finds_the_lost_zone_and_checks_the_survivors_against_the_math(zone_loss_store):
    sim, path = zone_loss_store
    requests, gpu = read_buckets(str(path))
    loss = find_zone_loss(requests, gpu)
    at = sim.start_ms // 60_000 + ZONE_LOSS_AT_MIN
    assert (loss.zone, loss.at_minute, loss.survivors) == (ZONE_LOST, at, tuple(SURVIVORS))
    with pytest.raises(BacktestError, match="was not lost"):
        find_zone_loss(requests, gpu, SURVIVORS[0])
    policy = SignalPolicy()
    report = drill(requests, gpu, loss, policy, load_slos(DEFAULT_SLOS))
    assert sorted({pd.pool.split("-us-")[0] for pd in report.pools.values()}) == ["asr", "llm", "s2s", "tts"]
    assert all(ZONE_LOST not in pool for pool in report.pools)
    target = policy.autoscale.target_utilization
    for pd in report.pools.values():
        # The (z−1)/z math, recomputed here from the drill's demand: carry it all at the target utilisation.
        assert pd.required_after == math.ceil(round(pd.demand_after_gpu_s_per_s / target, 9))
        # The surviving zones are asked for enough replicas within a few minutes of the loss.
        assert pd.asked_enough_minute is not None and pd.asked_enough_minute - at <= 3, pd
        # Shedding never refuses a realtime request while batch is still admitted.
        assert pd.realtime_refused_with_batch_admitted == [], pd
        # Wherever the pool was under pressure, the first rung that frees load is delaying batch.
        assert set(pd.first_steps.values()) <= {"delay_batch"}, pd
    llm = [report.pools[f"llm-{z}-realtime"] for z in SURVIVORS]
    ready = at + WARM_POOL_PROMOTED_AT_MIN - ZONE_LOSS_AT_MIN + WARM_POOL_LOADING_MIN
    for pd in llm:
        # Before the loss the LLM pools ran short of the (z−1)/z headroom, and the drill says so.
        assert pd.running_before == 6 and pd.ready_before > pd.running_before
        assert pd.desired_before >= pd.ready_before  # the autoscaler had asked for the headroom
        # Users waited from the loss until the promoted replicas were warm, and not long after.
        assert pd.waited_minutes and min(pd.waited_minutes) <= at + 1 and max(pd.waited_minutes) <= ready + 2, pd
        assert ready <= pd.warm_enough_minute <= ready + 1  # the API counts replicas of its newest complete minute
        assert pd.pressure_minutes and min(pd.pressure_minutes) <= at + 2
    # The speech pools had headroom: nobody waited there.
    assert not [pd.pool for pd in report.pools.values() if pd.waited_minutes and not pd.pool.startswith("llm-")]
    # Pages: the survivors' first-token SLO pages within minutes; the lost zone's slices go no-data at +10.
    pages = [(m, slo, text) for m, slo, text in report.pages if m >= at]
    first_token = [m for m, slo, text in pages if slo == "llm-realtime-first-token" and text.startswith("page ")]
    assert first_token and min(first_token) <= at + 3
    no_data = {m for m, _slo, text in pages if "SLONoData" in text}
    assert no_data and all(f"zone={ZONE_LOST}" in text for m, _slo, text in pages if "SLONoData" in text)
    assert min(no_data) == at + 9  # the last minute with data is at − 1; silent for no_data_after (10m)
    rows = [r for r in report.rows if r.model == "llama-3.1-70b"]
    assert [r.lost_zone_requests > 0 for r in rows if r.minute < at] == [True] * 3
    assert all(r.lost_zone_requests == 0 for r in rows if r.minute >= at)
    # The lost zone's pools keep answering with the age of their newest minute until it leaves the
    # view's history; then they answer no more (404), never a fresh-looking number.
    ages = [(r.minute - at, r.lost_answers_age_min) for r in rows if r.minute >= at]
    answered = [(t, age) for t, age in ages if age is not None]
    assert answered == [(t, t + 1) for t in range(len(answered))] and len(answered) < len(ages)
    assert all(age is None for t, age in ages[len(answered):])
    assert report.readiness["llama-3.1-70b"][0] != "ready"
    assert any("saturated" in f for f in report.readiness["llama-3.1-70b"][1])


@pytest.mark.slow
def test_under_a_tighter_capacity_batch_is_refused_before_any_realtime_request(zone_loss_store):
    """With a configured capacity below the survivors' demand, the admission plan must refuse:
    batch goes first, and a realtime request is refused only once no batch is admitted."""
    sim, path = zone_loss_store
    requests, gpu = read_buckets(str(path))
    loss = find_zone_loss(requests, gpu)
    tight = {f"llm-{z}-realtime": 0.85 for z in SURVIVORS}
    report = drill(requests, gpu, loss, SignalPolicy(capacity_gpu_s_per_s=tight), None)
    rows = [r for r in report.rows if r.model == "llama-3.1-70b" and loss.at_minute < r.minute]
    refused = [r for r in rows if r.batch_rejected]
    assert refused, [(r.minute, r.batch_rejected, r.realtime_rejected) for r in rows]
    assert any(r.realtime_rejected == 0 for r in refused)  # minutes where refusing batch was enough
    for pool in tight:
        assert report.pools[pool].realtime_refused_with_batch_admitted == []


@pytest.mark.slow
def test_the_drill_command_prints_the_tables_and_refuses_a_zone_that_was_not_lost(zone_loss_store, capsys):
    _sim, path = zone_loss_store
    assert main(["drill", "zone-loss", "--store", str(path), "--model", "llama-3.1-70b", "--minutes-after", "8"]) == 0
    out = capsys.readouterr().out
    assert f"zone-loss drill: {ZONE_LOST} silent from 2026-11-02T13:30" in out
    assert "llama-3.1-70b, surviving zones, minute by minute" in out and "voice-tts-2, surviving" not in out
    assert "13:38   +8" in out and "13:39   +9" not in out
    assert "no realtime request refused while batch was admitted" in out
    assert main(["drill", "zone-loss", "--store", str(path), "--zone", SURVIVORS[0]]) == 2
    assert "was not lost" in capsys.readouterr().err
