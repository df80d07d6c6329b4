"""The canary gates' evidence: the sequential test's error rate under repeated looks, and the
power rule that turns "no harm seen" into a pass only where harm would have shown."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tailwatch.signals.evidence import count_power, rank_power
from tailwatch.signals.rollout import sequential_error_p_value, sequential_error_p_values


@settings(max_examples=12, deadline=None)
@given(rate=st.floats(0.005, 0.2), canary_share=st.floats(0.05, 0.5), per_minute=st.integers(20, 400),
       seed=st.integers(0, 2**31 - 1))
@pytest.mark.slow
def test_repeated_looks_at_stationary_null_data_rarely_ever_reject(rate, canary_share, per_minute, seed):
    """Canary and stable fail alike; a poller looks after every one of 60 minutes. The share
    of canaries ever rejected at alpha (the running p-value at or under it at any look) stays
    within alpha, up to the sampling error of 1,000 runs."""
    alpha, runs, minutes = 0.05, 1000, 60
    rng = np.random.default_rng(seed)
    nc = rng.binomial(per_minute, canary_share, size=(runs, minutes))
    ns = per_minute - nc
    kc, ks = rng.binomial(nc, rate), rng.binomial(ns, rate)
    ever = sum(sequential_error_p_values(nc[r], kc[r], ns[r], ks[r]).min() <= alpha for r in range(runs))
    assert ever / runs <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / runs), ever / runs


def test_the_power_rule_passes_only_where_the_harm_would_have_shown():
    """At the exposure the rule names as enough, a canary worse by the detectable factor is
    rejected in at least 1 − beta of simulated runs; below it, the rule says how much is missing."""
    alpha, beta, factor, rate = 0.001, 0.2, 1.5, 0.064
    thin = count_power(1_000, 2_000, rate, factor, alpha, beta, sequential_error_p_value)
    assert not thin.detectable and thin.more_canary > 0
    assert thin.needed("words").startswith("needs ~") and thin.needed("words").endswith("more canary words to show 1.5x")
    enough = 1_000 + thin.more_canary * 1.02
    assert count_power(enough, 2 * enough, rate, factor, alpha, beta, sequential_error_p_value).detectable
    rng = np.random.default_rng(5)
    runs, minutes = 400, 20
    nc, ns = np.full(minutes, enough / minutes), np.full(minutes, 2 * enough / minutes)
    rejected = sum(sequential_error_p_value(nc, rng.binomial(nc.astype(int), rate * factor), ns,
                                            rng.binomial(ns.astype(int), rate)) <= alpha for _ in range(runs))
    assert rejected / runs >= 1 - beta - 0.05, rejected / runs
    # Without a stable baseline there is nothing a factor could be shown against.
    assert count_power(10_000, 10_000, 0.0, factor, alpha, beta, sequential_error_p_value).more_canary is None


def test_the_latency_power_rule_scales_with_the_spread_of_latency():
    # Spread log latency (σ 1.0) needs far more values to show 1.15x than tight latency (σ 0.2).
    wide, tight = rank_power(500, 2_000, 1.0, 1.15, 0.001, 0.2), rank_power(500, 2_000, 0.2, 1.15, 0.001, 0.2)
    assert tight.detectable and not wide.detectable and wide.more_canary > 400


def test_latency_and_cost_pass_only_on_the_evidence_to_see_the_harm():
    """Pure, through the rollout judge: few values of widely spread latency, and cost per unit
    that swings minute to minute, say nothing against a 1.15x slowdown or a 1.25x cost; the
    same canary with enough minutes and values passes both."""
    from tailwatch.signals.rollout import MinuteCounts, RolloutPolicy, VersionStats, verdict
    from tailwatch.slo import histogram

    def side(version, minutes, per_minute, seed, cost_swing):
        rng = np.random.default_rng(seed)
        rows = []
        for m in range(minutes):
            tokens = 20_000
            rows.append(MinuteCounts(m, per_minute, 0, 1e-4 * tokens * (1 + cost_swing * (-1) ** m), tokens,
                                     0.0, histogram.from_values(rng.lognormal(np.log(800), 1.2, per_minute))))
        return VersionStats(version, sum(r.requests for r in rows), 0, 0, None, None, sum(r.gpu_cost for r in rows),
                            sum(r.output_tokens for r in rows), 0.0, tuple(rows),
                            histogram.merge(r.first_output_hist for r in rows))

    # No errors anywhere, and a burn that would be noticed on any traffic: errors are not what this tests.
    policy = RolloutPolicy(promote_min_requests=100, min_requests=100, error_detectable_burn=1000.0)
    thin = verdict(side("v2", 12, 12, 1, 0.5), side("v1", 12, 60, 2, 0.5), 12, policy)
    assert thin.verdict == "continue", thin.reasons
    assert thin.metrics["first_output"]["evidence"] == "insufficient"
    assert "more canary values to show 1.15x" in thin.metrics["first_output"]["evidence_needed"]
    assert thin.metrics["cost"]["evidence"] == "insufficient" and thin.metrics["cost"]["upper"] >= 1.25
    assert "more minutes with work" in thin.metrics["cost"]["evidence_needed"]
    rich = verdict(side("v2", 30, 400, 3, 0.1), side("v1", 30, 1200, 4, 0.1), 30, policy)
    assert rich.metrics["first_output"]["verdict"] == "pass" and rich.metrics["cost"]["verdict"] == "pass"
