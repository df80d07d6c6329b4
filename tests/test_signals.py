"""Autoscale and rollout decisions, one reason at a time."""

from tailwatch.signals.autoscale import AutoscalePolicy, Autoscaler, PoolSignals
from tailwatch.signals.rollout import VersionStats, verdict
from tailwatch.slo import histogram


def pool(minute=100, work=7.0, queue_p95=50.0, first_p95=400.0, util=55.0, warm=10, **kw):
    return PoolSignals(pool="llm-us-east-1a-realtime", as_of_minute=minute, requests_per_s=20.0, work_gpu_s_per_s=work,
                       tokens_per_s=4000.0, audio_s_per_s=0.0, active_streams=0, queue_age_p95_ms=queue_p95,
                       first_output_p95_ms=first_p95, first_output_slo_ms=1200.0, kv_cache_usage_max=0.4,
                       gpu_util_mean_pct=util, replicas_by_state={"warm": warm, **kw})


def test_demand_with_zone_headroom():
    d = Autoscaler(AutoscalePolicy(zones=3)).decide(pool(work=7.0))
    assert d.desired_replicas == 15  # 7 ÷ 0.7 = 10, × 3/2 = 15
    assert "10 replicas" in d.reasons[0] and "15 with headroom" in d.reasons[0]


def test_queue_age_breach_scales_out_while_gpu_utilisation_looks_normal():
    a = Autoscaler(AutoscalePolicy(zones=1))
    d = a.decide(pool(work=7.0, queue_p95=4000.0, util=50.0, warm=10))
    assert d.desired_replicas == 13 and d.current_replicas == 10
    assert any("queue age p95 4,000 ms" in r for r in d.reasons)
    assert any("not used to scale" in r for r in d.reasons)


def test_busy_gpus_alone_do_not_scale():
    d = Autoscaler(AutoscalePolicy(zones=1)).decide(pool(work=7.0, util=99.0, warm=10))
    assert d.desired_replicas == 10


def test_first_output_breach_scales_out():
    d = Autoscaler(AutoscalePolicy(zones=1)).decide(pool(work=7.0, first_p95=2500.0, warm=10))
    assert d.desired_replicas == 13 and any("first-output p95 2,500 ms" in r for r in d.reasons)


def test_fast_out_slow_in():
    a = Autoscaler(AutoscalePolicy(zones=1, scale_in_stabilization_minutes=10))
    assert a.decide(pool(minute=100, work=14.0, warm=10)).desired_replicas == 20  # out at once
    held = a.decide(pool(minute=105, work=3.5, warm=20))
    assert held.desired_replicas == 20 and any("scale-in held" in r for r in held.reasons)
    later = a.decide(pool(minute=111, work=3.5, warm=20))
    assert later.desired_replicas == 5


def side(version, requests=5000, bad=10, timeouts=2, fo=800.0, e2e=5000.0, cost=50.0, tokens=1_000_000):
    return VersionStats(version, requests, bad, timeouts, fo, e2e, cost, tokens, 0.0)


def test_not_enough_canary_traffic_means_continue():
    v = verdict(side("v2", requests=60, bad=0, timeouts=0), side("v1"), 30)
    assert v.verdict == "continue" and "not enough traffic" in v.reasons[0]


def test_gross_error_harm_rolls_back_without_waiting_for_a_fixed_count():
    # 10% failing on 100 requests against 0.2% on stable: overwhelming evidence at once.
    v = verdict(side("v2", requests=100, bad=10), side("v1"), 30)
    assert v.verdict == "rollback" and "errors" in v.decided_by
    assert v.metrics["errors"]["p_value"] < 1e-3 and v.confidence > 0.999


def test_p99_regression_rolls_back():
    v = verdict(side("v2", fo=1600.0), side("v1"), 30)
    assert v.verdict == "rollback" and any("first-output p99" in r for r in v.reasons)


def test_error_spike_rolls_back():
    v = verdict(side("v2", bad=200), side("v1"), 30)
    assert v.verdict == "rollback" and any("burns its error budget" in r for r in v.reasons)


def test_cheaper_and_as_fast_is_promoted():
    # 0.2% errors on each side: the harm that matters is the larger of 2x stable and the canary
    # burning a 99.9% objective's budget at 6x (0.6%, 3x stable's 0.2%); 60,000 requests a side
    # can show it, 5,000 cannot.
    v = verdict(side("v2", requests=60_000, bad=120, cost=40.0), side("v1", requests=60_000, bad=120), 30)
    assert v.verdict == "promote"
    thin = verdict(side("v2", cost=40.0), side("v1"), 30)
    assert thin.verdict == "continue" and thin.decided_by == ["errors"]
    assert thin.metrics["errors"]["evidence"] == "insufficient"
    assert "more canary requests to show 3x" in thin.metrics["errors"]["evidence_needed"]
    assert thin.metrics["errors"]["detectable_factor"] == 3.0
    assert v.canary["cost_per_unit"] < v.stable["cost_per_unit"] and v.canary["cost_unit"] == "per 1k output tokens"


def test_faster_but_twice_as_expensive_is_not_promoted():
    v = verdict(side("v2", fo=600.0, e2e=4000.0, cost=100.0), side("v1"), 30)
    assert v.verdict == "pause" and any("2.00x" in r for r in v.reasons)



# ---- the statistics behind the rollout verdict ---------------------------------------
import msgspec
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tailwatch.signals.rollout import (MinuteCounts, mann_whitney_binned, sequential_error_p_values,  # noqa: E402
                             tail_exceedance_p_value)


def _streams(canary_rate, stable_rate, streams=1000, minutes=60, canary_per_min=16, stable_per_min=90, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(streams):
        nc, ns = rng.poisson(canary_per_min, minutes), rng.poisson(stable_per_min, minutes)
        yield nc, rng.binomial(nc, canary_rate), ns, rng.binomial(ns, stable_rate)


def _first_minute(p_values, alpha=0.001):
    hit = np.flatnonzero(p_values <= alpha)
    return int(hit[0]) + 1 if len(hit) else None


@pytest.mark.parametrize("canary_rate, stable_rate, rho0", [(0.01, 0.01, 1.0), (0.002, 0.001, 2.0), (0.02, 0.01, 2.0)])
def test_the_sequential_error_test_keeps_its_false_alarm_rate_under_continuous_monitoring(canary_rate, stable_rate, rho0):
    # At the null's boundary, checked after every minute for an hour: at most alpha (0.1%)
    # of canaries are ever flagged (Ville's inequality); 1,000 seeded canaries, at most 3.
    flagged = sum(_first_minute(sequential_error_p_values(*s, rho0=rho0)) is not None
                  for s in _streams(canary_rate, stable_rate))
    assert flagged <= 3


def test_gross_error_harm_at_15_percent_traffic_is_flagged_within_minutes_and_small_harm_waits():
    # 8% vs 0.02% with 16 canary requests a minute: the rollback test (over 2x stable).
    minutes = [_first_minute(sequential_error_p_values(*s, rho0=2.0)) for s in _streams(0.08, 0.0002, streams=400)]
    assert all(m is not None for m in minutes)
    assert np.median(minutes) <= 6 and np.percentile(minutes, 95) <= 10
    # 1.5x worse (1.5% vs 1%): an hour is rarely enough evidence to say even "worse".
    small = [_first_minute(sequential_error_p_values(*s, rho0=1.0)) for s in _streams(0.015, 0.01, streams=400)]
    assert sum(m is not None for m in small) < 0.05 * len(small)


def test_rank_and_tail_tests_on_histograms():
    rng = np.random.default_rng(5)
    same = [(histogram.from_values(rng.lognormal(6, 0.8, 40)), histogram.from_values(rng.lognormal(6, 0.8, 200)))
            for _ in range(20)]
    p, auc = mann_whitney_binned(same)
    assert p > 0.01 and 0.45 < auc < 0.55 and tail_exceedance_p_value(same) > 0.01
    slower = [(histogram.from_values(rng.lognormal(6.3, 0.8, 40)), s) for _, s in same]
    p, auc = mann_whitney_binned(slower)
    assert p < 1e-6 and auc > 0.55
    # 4% of canary requests take a slow path 10x longer: the median barely moves, the tail test sees it.
    tail = [(histogram.from_values(np.where(rng.random(40) < 0.04, 10, 1) * rng.lognormal(6, 0.3, 40)),
             histogram.from_values(rng.lognormal(6, 0.3, 200))) for _ in range(20)]
    assert tail_exceedance_p_value(tail) < 1e-6


def _minutes(n_minutes, requests, bad, cost_per_token, tokens=20_000, seed=0, latency_ms=800.0):
    rng = np.random.default_rng(seed)
    out = []
    for m in range(n_minutes):
        t = int(tokens * rng.uniform(0.5, 1.5))
        out.append(MinuteCounts(m, requests, bad if m % 2 == 0 else 0, cost_per_token * t * rng.uniform(0.9, 1.1), t, 0.0,
                                histogram.from_values(rng.lognormal(np.log(latency_ms), 0.3, requests)),
                                histogram.from_values(rng.lognormal(np.log(latency_ms * 5), 0.3, requests))))
    return tuple(out)


def _with_minutes(version, minutes):
    from tailwatch.slo.histogram import merge
    return VersionStats(version, sum(m.requests for m in minutes), sum(m.bad for m in minutes), 0, None, None,
                        sum(m.gpu_cost for m in minutes), sum(m.output_tokens for m in minutes), 0.0, minutes,
                        merge(m.first_output_hist for m in minutes), merge(m.e2e_hist for m in minutes))


def test_the_verdict_carries_per_metric_verdicts_and_the_confidence_it_acted_on():
    stable = _with_minutes("v1", _minutes(30, 120, 0, 1e-4, seed=1))
    costly = verdict(_with_minutes("v2", _minutes(30, 20, 0, 2.2e-4, seed=2)), stable, 30)
    assert costly.verdict == "pause" and costly.decided_by == ["cost"]
    cost = costly.metrics["cost"]
    assert cost["lower"] > 1.5 and cost["ratio"] == pytest.approx(2.2, rel=0.1) and costly.confidence > 0.99
    assert set(costly.metrics) == {"errors", "burn_rate", "first_output", "e2e", "cost"}
    assert all({"verdict", "reason", "p_value"} <= set(m) for m in costly.metrics.values())
    body = costly.to_json()
    assert {"metrics", "decided_by", "confidence"} <= set(body) and "per_minute" not in body["canary"]
    # No errors on either side: a pass needs the traffic to have shown a budget's worth (0.1%) more.
    same = verdict(_with_minutes("v3", _minutes(30, 800, 0, 1e-4, seed=3)), _with_minutes("v1", _minutes(30, 1200, 0, 1e-4, seed=1)), 30)
    assert same.verdict == "promote" and same.confidence is None
    slow = verdict(_with_minutes("v4", _minutes(30, 20, 0, 1e-4, seed=4, latency_ms=1600.0)), stable, 30)
    assert slow.verdict == "rollback" and "first_output" in slow.decided_by and slow.confidence > 0.999

# ---- the API config file: one line per problem ----------------------------------------
import hashlib  # noqa: E402

import pytest  # noqa: E402

from tailwatch.signals.config import ApiConfigError, load_api_config  # noqa: E402


@pytest.mark.parametrize("text, words", [
    ("bogus: 1", "unknown field `bogus`"),
    ("stale_after: soon", "stale_after must be a duration"),
    ("stale_after: true", "stale_after: expected `float | str`, got `bool`"),
    ("tokens: [{name: a}]", "tokens[0]: token 'a' needs exactly one of sha256 or env"),
    ("tokens: [{name: a, sha256: abc}]", "tokens[0].sha256: expected `str` matching regex"),
    ("tokens: [{name: a, env: TW_TEST_UNSET_VAR}]", "TW_TEST_UNSET_VAR is not set"),
    (f"tokens: [{{name: a, sha256: {'a' * 64}, tenants: []}}]", "tokens[0].tenants: expected `array` of length >= 1"),
    ("autoscale: {target_utilisation: 0.7}", "autoscale: object contains unknown field `target_utilisation`"),
    ("autoscale: {zones: 2.5}", "autoscale.zones: expected `int`, got `float`"),
    ("rollout: {min_requests: -1}", "rollout.min_requests: expected `int` >= 0"),
    ("rollout: {objective: 1}", "rollout.objective: expected `float` < 1.0"),
    ("autoscale: {target_utilization: 0}", "autoscale.target_utilization: expected `float` > 0.0"),
    ("autoscale: {target_utilization: 1.5}", "autoscale.target_utilization: expected `float` <= 1.0"),
    ("autoscale: {zones: 0}", "autoscale.zones: expected `int` >= 1"),
    ("autoscale: {zones: .inf}", "autoscale.zones: expected `int`"),
    ("autoscale: {default_capacity_gpu_s_per_s: 0}", "default_capacity_gpu_s_per_s: expected `float` > 0.0"),
    ("autoscale: {min_replicas: 9, max_replicas: 3}", "autoscale: min_replicas (9) is above max_replicas (3)"),
    ("signals: {history_minutes: 10}", "signals: history_minutes must cover"),
    ("capacity_gpu_s_per_s: {pool-b: 2, pool-a: 0}", "capacity_gpu_s_per_s.pool-a: expected `float` > 0.0"),
    ("rollout: {error_alpha: 0}", "rollout.error_alpha: expected `float` > 0.0"),
    ("rollout: {pause_cost_factor: .nan}", "rollout.pause_cost_factor: expected `float` > 0.0"),
    ("rollout: {rollback_error_factor: 0.5}", "rollout.rollback_error_factor: expected `float` >= 1.0"),
    ("autoscale: {gpus_per_replica: 0}", "autoscale.gpus_per_replica: expected `float` > 0.0"),
    ("replica_shape: {pool-a: {gpus: 8}}", "replica_shape.pool-a: object contains unknown field `gpus`"),
    ("replica_shape: {ok: {gpus_per_replica: 2}, pool-z: {gpus_per_replica: 5000}}",
     "replica_shape.pool-z.gpus_per_replica: expected `float` <= 4096.0"),
    ("replica_shape: [1]", "replica_shape: expected `object`, got `array`"),
    ("[1, 2", "line 1, column 6: not valid YAML"),
    ("- 1", "expected a mapping"),
])
def test_api_config_errors_are_one_line(tmp_path, text, words):
    _one_line_error(tmp_path, load_api_config, ApiConfigError, text, words)


def _one_line_error(tmp_path, load, error: type[Exception], text: str, words: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(error) as exc:
        load(path)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_api_config_tokens_and_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("TW_TEST_TOKEN", "from-env")
    path = tmp_path / "api.yaml"
    path.write_text(f"""
stale_after: 90s
tokens:
  - {{name: ops, sha256: {hashlib.sha256(b"s3cret").hexdigest()}}}
  - {{name: acme, env: TW_TEST_TOKEN, tenants: [acme]}}
autoscale: {{zones: 2, target_utilization: 0.6}}
signals: {{pool_window_minutes: 3}}
rollout: {{error_alpha: 0.01, rollback_cost_factor: 1.5}}
replica_shape: {{llm-a: {{gpus_per_replica: 8, decode_tokens_per_s: 4000}}}}
""")
    cfg = load_api_config(path)
    assert cfg.policy.rollout.error_alpha == 0.01 and cfg.policy.rollout.rollback_cost_factor == 1.5
    shape = cfg.policy.replica_shape["llm-a"]
    assert shape.gpus_per_replica == 8 and shape.decode_tokens_per_s == 4000 and not shape.prefill_tokens_per_s
    assert cfg.stale_after_s == 90 and cfg.policy.autoscale.zones == 2 and cfg.policy.pool_window_minutes == 3
    assert cfg.authenticate("Bearer s3cret").tenants is None
    acme = cfg.authenticate("Bearer from-env")
    assert acme.name == "acme" and acme.sees(frozenset({"acme"})) and not acme.sees(frozenset({"acme", "globex"}))
    assert cfg.authenticate("Bearer nope") is None and cfg.authenticate("Basic s3cret") is None


def test_worker_refuses_to_serve_beyond_loopback_without_tokens(capsys):
    from tailwatch.cli import main

    assert main(["worker", "--http-host", "0.0.0.0", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "needs bearer tokens" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---- the live view: a pool that stops sending goes stale ------------------------------
def _bucket_rows(pool: str, minutes: range):
    from datetime import datetime, timedelta

    import polars as pl

    hist = pl.List(pl.Struct({"bin": pl.Int16, "n": pl.Int64}))
    n = len(minutes)
    return pl.DataFrame({
        "window_start": [datetime(2026, 11, 2) + timedelta(minutes=m) for m in minutes],
        "tenant": ["acme"] * n, "model": ["m"] * n, "model_version": ["v1"] * n, "deployment": ["stable"] * n,
        "zone": ["z"] * n, "workload": ["llm"] * n, "traffic_class": ["realtime"] * n, "pool": [pool] * n,
        "requests": [100] * n, "errors": [0] * n, "timeouts": [0] * n, "gpu_seconds": [60.0] * n,
        "output_tokens": [1000] * n, "audio_seconds": [0.0] * n,
        "first_output_ms_hist": [[{"bin": 300, "n": 100}]] * n, "e2e_ms_hist": [[{"bin": 400, "n": 100}]] * n,
    }, schema_overrides={"first_output_ms_hist": hist, "e2e_ms_hist": hist})


def _gpu_rows(pool: str, minutes: range):
    """One GPU of one warm replica per minute, as `gpu_minute` holds it."""
    from datetime import datetime, timedelta

    import polars as pl

    n = len(minutes)
    return pl.DataFrame({
        "window_start": [datetime(2026, 11, 2) + timedelta(minutes=m) for m in minutes], "node": ["n0"] * n,
        "gpu_index": [0] * n, "zone": ["z"] * n, "pool": [pool] * n, "gpu_sku": ["H100"] * n, "model": ["m"] * n,
        "model_version": ["v1"] * n, "samples": [6] * n, "util_pct_mean": [50.0] * n,
        "oldest_queue_age_ms_max": [20.0] * n, "kv_cache_usage_max": [0.3] * n, "active_streams_max": [2] * n,
        "replica_state": ["warm"] * n,
    }, schema_overrides={"gpu_index": pl.Int32, "samples": pl.Int64, "active_streams_max": pl.Int64})


def test_a_pool_that_stops_sending_goes_stale_even_as_old_minutes_are_trimmed():
    import polars as pl

    from tailwatch.signals.live import LiveSignals, SignalPolicy
    from tailwatch.planning.prices import GpuPrices

    live = LiveSignals(SignalPolicy(history_minutes=6, pool_window_minutes=2, rollout_window_minutes=5), [], GpuPrices())
    live.add_closed(_bucket_rows("p", range(0, 6)), _gpu_rows("p", range(0, 6)))
    first = live.snapshot(pl.DataFrame(), pl.DataFrame(), [], wall_s=100.0)
    assert first.pools["p"].changed_wall_s == 100.0
    assert msgspec.to_builtins(first.pools["p"].body)["signals"]["requests_per_s"] == pytest.approx(100 / 60)
    # Another pool moves on; p's oldest minutes fall out of the kept history, p sends nothing new.
    live.add_closed(_bucket_rows("q", range(6, 9)), _gpu_rows("q", range(6, 9)))
    later = live.snapshot(pl.DataFrame(), pl.DataFrame(), [], wall_s=200.0)
    assert later.pools["p"].changed_wall_s == 100.0  # not fresh: nothing new arrived for p
    assert later.pools["q"].changed_wall_s == 200.0
    live.add_closed(_bucket_rows("p", range(9, 10)), _gpu_rows("p", range(9, 10)))
    assert live.snapshot(pl.DataFrame(), pl.DataFrame(), [], wall_s=300.0).pools["p"].changed_wall_s == 300.0


def test_sm_activity_tells_saturated_gpus_from_busy_ones_with_idle_sms():
    from dataclasses import replace

    a = Autoscaler(AutoscalePolicy(zones=1))
    busy_idle = a.decide(replace(pool(util=95.0, queue_p95=3000.0), sm_active_mean_pct=28.0))
    assert any("busy but idle SMs" in r and "batching more" in r for r in busy_idle.reasons)
    saturated = Autoscaler(AutoscalePolicy(zones=1)).decide(replace(pool(util=95.0, queue_p95=3000.0), sm_active_mean_pct=91.0))
    assert any("saturated" in r for r in saturated.reasons)
    assert saturated.desired_replicas == busy_idle.desired_replicas  # reported, never the scaling signal
    assert not any("SMs active" in r for r in a.decide(pool()).reasons)  # no GPM: nothing claimed
    unknown = Autoscaler(AutoscalePolicy(zones=1)).decide(pool(warm=0, unknown=2))
    assert unknown.current_replicas == 2  # GPUs that send no state still serve


def test_one_duration_parser_for_flags_and_files(tmp_path):
    """`--until-idle 90` and `stale_after: 90` mean the same; d and w work in both; a latency
    threshold, where a bare 300 could be ms or s, still needs its unit."""
    from tailwatch.slo.spec import SpecErrors, load_slos
    from tailwatch.cli import arg_duration_s

    path = tmp_path / "api.yaml"
    for text, seconds in (("90", 90), ("90s", 90), ("1.5m", 90), ("2h", 7200), ("1d", 86400), ("1w", 604800)):
        path.write_text(f"stale_after: {text}\n")
        assert load_api_config(path).stale_after_s == seconds == arg_duration_s(text)
    slos = tmp_path / "slos.yaml"
    slos.write_text("slos:\n  - name: x\n    sli: {latency: {field: first_output_ms, threshold: 300}}\n    objective: 99%\n")
    with pytest.raises(SpecErrors, match="needs a unit"):
        load_slos(slos)


@pytest.mark.parametrize("text, words", [
    ("usd_per_gpu_hour: {L4: 0.8, H100: -1}", "usd_per_gpu_hour.H100: expected `float` >= 0.0"),
    ("currency: EUR", "currency: invalid enum value 'EUR'"),
    ("usd_per_gpu_hours: {H100: 3}", "unknown field `usd_per_gpu_hours`"),
    ("default_usd_per_gpu_hour: cheap", "default_usd_per_gpu_hour: expected `float`, got `str`"),
])
def test_price_file_errors_name_their_place(tmp_path, text, words):
    from tailwatch.planning.prices import PriceError, load_prices

    _one_line_error(tmp_path, load_prices, PriceError, text, words)
    path = tmp_path / "prices.yaml"
    path.write_text("usd_per_gpu_hour: {H100: 3.5}\n")
    prices = load_prices(path)
    assert prices.usd_per_gpu_hour["H100"] == 3.5 and prices.usd_per_gpu_hour["L4"] == 0.80


def test_the_wer_gate_judges_each_language_with_its_own_evidence():
    """Pure: per-minute evaluations per language on each side (signals/rollout.py wer_verdict)."""
    from tailwatch.signals.rollout import QualityMinute, RolloutPolicy, overdispersion, wer_verdict

    def side(version, per_language: dict[str, tuple[int, int]], minutes=40, evaluations=5):
        return VersionStats(version, 3000, 0, 0, None, None, 0.0, 0, 0.0, languages={
            lang: tuple(QualityMinute(m, evaluations, errors, words) for m in range(minutes))
            for lang, (errors, words) in per_language.items()})

    stable = side("v1", {"en-us": (10, 200), "de-de": (16, 200)})
    p = RolloutPolicy()
    # A canary never evaluated, beside an evaluated stable: not judged yet, never promoted.
    bare = VersionStats("v2", 3000, 0, 0, None, None, 0.0, 0, 0.0)
    assert wer_verdict(bare, stable, p).verdict == "continue"
    # Worse in German only, better in English: rolled back, naming German alone.
    v = wer_verdict(side("v2", {"en-us": (6, 200), "de-de": (32, 200)}), stable, p)
    assert v.verdict == "rollback" and v.detail["languages"] == ["de-de"] and v.reason.startswith("WER on de-de")
    assert v.detail["slices"]["en-us"]["verdict"] == "pass"
    # Equal everywhere: passes.
    assert wer_verdict(side("v2", {"en-us": (10, 200), "de-de": (16, 200)}), stable, p).verdict == "pass"
    # Too few canary evaluations in a language: that slice waits.
    thin = wer_verdict(side("v2", {"en-us": (10, 200), "de-de": (16, 200)}, minutes=5), stable, p)
    assert thin.verdict == "continue" and thin.detail["slices"]["de-de"]["verdict"] == "continue"
    # Stable without evaluations: no WER metric at all.
    assert wer_verdict(side("v2", {"en-us": (6, 200)}), bare, p) is None
    # Errors that swing from minute to minute more than words would (clustered in utterances)
    # raise the overdispersion, and with it the evidence a rollback needs.
    steady = [QualityMinute(m, 5, 10, 200) for m in range(30)]
    swinging = [QualityMinute(m, 5, 0 if m % 2 else 20, 200) for m in range(30)]
    assert overdispersion(steady) == 1.0 and overdispersion(swinging) > 3


def test_a_backlog_rolled_up_at_once_keeps_what_minute_by_minute_would():
    """Rows older than the kept history are left out before the rollup, not after: the same
    frames as rolling each minute up as it closed."""
    import polars as pl

    from tailwatch.signals.live import RecentBuckets

    rows = pl.concat([_bucket_rows(pool, range(0, 40)) for pool in ("p", "q")])
    at_once, one_by_one = RecentBuckets(6, 3), RecentBuckets(6, 3)
    at_once.add(rows, pl.DataFrame())
    for minute in range(40):
        one_by_one.add(rows.filter(pl.col("window_start").dt.minute() == minute), pl.DataFrame())
        one_by_one.requests  # rolled up each minute
    kept, expected = at_once.requests, one_by_one.requests
    assert kept.newest_minute() == expected.newest_minute() and kept.height == 2 * 6
    for got, want in zip(kept._frames(), expected._frames()):
        keys = sorted(want.columns)
        assert got.select(keys).sort(keys).equals(want.select(keys).sort(keys))
