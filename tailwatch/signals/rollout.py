"""Rollout verdicts: a canary model version against the stable version of the same model.

Pure: each side is a `VersionStats` summed over the same event-time window, with its
per-minute counts and merged latency histograms when the caller has them. The verdict is
`promote`, `continue`, `pause` or `rollback`, decided per metric as Kayenta does (each
metric says pass, continue, pause or rollback with the p-value or confidence it acted
on), the worst metric deciding. Cost counts as much as speed: a faster canary that costs
twice as much per unit of work is not promoted.

Methods, and why:

- Errors: a sequential test valid under continuous monitoring, so that a controller
  polling every minute may act the moment evidence is overwhelming (a few hundred
  requests for gross harm) without inflating false rollbacks by looking often. Each
  minute, conditional on how many requests each side served, an error is the canary's
  with probability p0 = canary share of requests if both error rates are equal; if the
  canary's rate is ρ times stable's, with q(ρ) = ρ·p0 ÷ (ρ·p0 + 1 − p0). The likelihood
  ratio of ρ against ρ0, mixed over a grid of ρ > ρ0, is a nonnegative supermartingale
  for every true ρ ≤ ρ0 (a mixture sequential probability ratio test), so by Ville's
  inequality 1 ÷ (its running maximum) is an always-valid p-value. Conditioning on the
  errors keeps it exact for rare errors (0.02% on stable), where normal approximations
  fail, and for a canary weight that changes minute to minute. Rollback tests ρ0 =
  `rollback_error_factor`; a canary shown worse than stable at all (ρ0 = 1) but not by
  that factor, or still within its error budget, is paused for a person.
- Burn rate: the paging alarm of the SRE workbook, applied to the canary alone: burning
  the error budget at ≥ 14.4× over the short window (5 min) and the whole window, each
  with `burn_min_requests` requests. The same alarm pages and rolls back, unless stable
  pages over the same short window too (a zone or dependency incident): then it pauses.
- Latency (first output, end to end, inter-token): the Mann-Whitney U test on the binned histograms
  (mid-ranks per bin, tie-corrected variance) for a shift of the whole distribution, and a
  conditional binomial test on the share of requests above stable's p99 for a tail-only
  regression; the smaller p-value, Bonferroni-corrected for two tests. A regression must be
  both significant and large (median or p99 ratio over the pause or rollback factor):
  with thousands of requests a rank test finds differences too small to matter.
- Cost per unit (per 1k output tokens, or per successful audio minute: audio of failed
  attempts is not served, so a canary that fails more costs more per minute it delivers;
  per audio-second for rows that predate the count): ratio of sums per side, its
  variance by linearisation over minutes (the delta method with minutes as clusters, since
  heavy-tailed work makes single requests far from independent of their minute's mix),
  and a one-sided confidence interval on the log of the canary ÷ stable ratio. A canary
  whose lower bound is over `pause_cost_factor` pauses (over `rollback_cost_factor`, rolls
  back); one whose estimate is over `promote_cost_factor` is never promoted.

- Word error rate by language (ASR, from sampled evaluations, eval.v1): the same mixture
  sequential test as errors, with reference words for requests and word errors for bad
  ones, per language slice, so a canary that improves the global WER while regressing one
  language is caught in that language. Word errors cluster within an utterance, so counts
  are divided by the overdispersion stable's own minutes show (Pearson's χ² over binomial,
  at least 1: a quasi-binomial test). Each slice needs `wer_min_evaluations` and
  `wer_min_words` on both sides before it is judged; the alpha is split across the language
  slices (Bonferroni), so the chance that any healthy slice is ever rolled back stays under
  `wer_alpha`. A slice stable has evidence for and the canary not yet keeps the canary from
  promotion.
- Underruns (TTS): the errors test again, with the streams that reported underruns for
  requests and the streams with at least one underrun for bad ones (a stream that stutters
  once is a bad listen, however many times it stutters). Underruns are rare, so not seeing
  harm is not a pass: the canary passes once the upper 95% bound on its share (Clopper-
  Pearson) is under `promote_underrun_factor` × stable's share or under
  `underrun_tolerance`, with `underrun_min_streams` reporting streams per side; until then it
  continues and is not promoted on silence.

No harm seen is a pass only where the data would have shown the harm that matters
(`signals/evidence.py`): each gate states a minimum detectable effect (errors: 2× stable's or a
canary burning its budget at 6×; WER per language: 1.5×; latency: `pause_latency_factor`;
cost: `pause_cost_factor`) and passes only if its own test, at its own alpha, would have
seen it with probability 1 − `gate_beta`. Below that the metric continues with `evidence:
insufficient` and the evidence it still needs; a WER slice says `insufficient`.

Latency and cost tests are fixed-sample tests repeated each minute; their small alpha and
the effect-size gates keep repeated looks from turning noise into verdicts. Callers with
totals only (no per-minute counts, no histograms) get the same rules on point estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from statistics import NormalDist
from typing import Annotated, Mapping, Sequence

import numpy as np
from msgspec import Meta
from scipy.special import betaincinv

from tailwatch.signals.evidence import Power, cost_minutes_needed, count_power, log_spread, rank_power
from tailwatch.slo import histogram
from tailwatch.config import Alpha, ConfigStruct, Count, Factor, Fraction, Objective, Positive, WindowMinutes


@dataclass(frozen=True)
class MinuteCounts:
    """One side's counts in one event-time minute."""

    minute: int
    requests: int
    bad: int  # errors + timeouts
    gpu_cost: float
    output_tokens: int
    audio_seconds: float
    first_output_hist: Mapping[int, int] | None = None  # this minute's latency bins, for stratified tests
    e2e_hist: Mapping[int, int] | None = None
    inter_token_hist: Mapping[int, int] | None = None
    successful_audio_seconds: float = 0.0  # audio of ok attempts (the unit of cost per successful audio minute)
    underrun_reported: int = 0  # TTS streams that reported underruns…
    underrun_streams: int = 0  # …and those with at least one


COST_UNITS = ("per 1k output tokens", "per successful audio minute", "per audio-second")


def units_of(row: MinuteCounts | VersionStats, unit: str) -> float:
    """How many of `unit` a minute or a side served."""
    if unit == "per 1k output tokens":
        return row.output_tokens / 1000
    if unit == "per successful audio minute":
        return row.successful_audio_seconds / 60
    return row.audio_seconds


@dataclass(frozen=True)
class QualityMinute:
    """One side's sampled evaluations in one language slice and event-time minute."""

    minute: int
    evaluations: int
    word_errors: int
    reference_words: int


@dataclass(frozen=True)
class VersionStats:
    version: str
    requests: int
    bad: int  # errors + timeouts
    timeouts: int
    first_output_p99_ms: float | None
    e2e_p99_ms: float | None
    gpu_cost: float  # currency units over the window
    output_tokens: int
    audio_seconds: float
    per_minute: tuple[MinuteCounts, ...] = ()  # for the sequential error test and the cost interval
    first_output_hist: Mapping[int, int] | None = None  # merged histogram bins (slo/histogram.py)
    e2e_hist: Mapping[int, int] | None = None
    inter_token_p99_ms: float | None = None  # LLM streams: the mean gap between tokens, per answer
    inter_token_hist: Mapping[int, int] | None = None
    languages: Mapping[str, tuple[QualityMinute, ...]] | None = None  # language → evaluations per minute
    successful_audio_seconds: float = 0.0

    @property
    def error_ratio(self) -> float | None:
        return self.bad / self.requests if self.requests else None

    @property
    def timeout_ratio(self) -> float | None:
        return self.timeouts / self.requests if self.requests else None

    def cost_per_unit(self, unit: str | None = None) -> tuple[float | None, str]:
        """Cost per 1,000 output tokens, or per successful audio minute for speech models (per
        audio-second where successful audio was not counted); in `unit` when given."""
        for u in ((unit,) if unit else COST_UNITS):
            if units_of(self, u) > 0:
                return self.gpu_cost / units_of(self, u), u
        return None, unit or "per unit"

    @property
    def underrun_reported(self) -> int:
        return sum(m.underrun_reported for m in self.per_minute)

    @property
    def underrun_streams(self) -> int:
        return sum(m.underrun_streams for m in self.per_minute)


class RolloutPolicy(ConfigStruct):
    """The `rollout:` section of the API config file."""

    objective: Objective = 0.999  # availability objective used for the canary's burn rate
    min_requests: Count = 100  # per side, before a latency or cost judgement (errors need no fixed count)
    promote_min_requests: Count = 2_000
    rollback_burn_rate: Positive = 14.4  # the canary alone would page…
    burn_short_minutes: WindowMinutes = 5  # …over this short window and the whole window
    burn_min_requests: Count = 100  # per burn window, as the SLOs' min_events
    rollback_error_factor: Factor = 2.0  # rollback needs evidence the canary errs more than this × stable…
    rollback_error_abs: Fraction = 0.0  # …and at least this much more in absolute terms (0: any)
    error_alpha: Alpha = 0.001  # always-valid: the chance a canary no worse than that is ever rolled back
    # A pass needs the power to have seen a canary erring this × stable's or burning its error budget
    # at this rate (the workbook's 6-hour page), whichever is more: on rare errors a doubling of
    # 0.02% is not the harm that matters, a canary that would page on its own is.
    error_detectable_factor: Factor = 2.0
    error_detectable_burn: Positive = 6.0
    rollback_latency_factor: Factor = 1.5  # median or p99, first output or e2e, vs stable
    pause_latency_factor: Factor = 1.15
    latency_alpha: Alpha = 0.001  # a pass needs the power to have seen a shift by pause_latency_factor
    pause_cost_factor: Positive = 1.25  # confidently over this: pause
    rollback_cost_factor: Positive = math.inf  # confidently over this: rollback (off unless set)
    promote_cost_factor: Positive = 1.10  # estimated over this: not promoted
    cost_alpha: Alpha = 0.01  # one-sided, for the cost ratio's interval
    cost_min_minutes: Annotated[int, Meta(ge=2, le=1440)] = 10  # minutes with work on each side before the interval is trusted
    wer_min_evaluations: Count = 30  # per side and language slice, before its WER is judged
    wer_min_words: Count = 500  # reference words per side and language slice, likewise
    rollback_wer_factor: Factor = 1.2  # rollback needs evidence the canary's WER in a language is over this × stable's
    wer_alpha: Alpha = 0.001  # always-valid, split across the language slices
    wer_detectable_factor: Factor = 1.5  # a language passes only once a canary WER this × stable's would have shown
    gate_beta: Alpha = 0.2  # a gate passes only where the harm it states would show with probability 1 − this
    underrun_min_streams: Count = 500  # TTS streams that reported underruns, per side, before a pass
    rollback_underrun_factor: Factor = 1.5  # rollback needs evidence the canary's share of stuttering streams is over this × stable's
    underrun_alpha: Alpha = 0.001  # always-valid
    # A pass needs the canary's stuttering share shown (95% upper bound) under this × stable's, or
    # under the tolerance: no-harm-seen on a few thousand streams is no evidence when 0.2% stutter.
    promote_underrun_factor: Factor = 2.0
    underrun_tolerance: Fraction = 0.001


@dataclass
class Verdict:
    verdict: str
    reasons: list[str]
    canary: dict
    stable: dict
    window_minutes: int
    as_of: str | None = None
    extra: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)  # per metric: verdict, method, p-value or interval
    decided_by: list[str] = field(default_factory=list)
    confidence: float | None = None  # 1 − the p-value the deciding metric acted on

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "reasons": self.reasons, "canary": self.canary, "stable": self.stable,
                "window_minutes": self.window_minutes, "as_of": self.as_of, "metrics": self.metrics,
                "decided_by": self.decided_by, "confidence": self.confidence, **self.extra}


_SIDE_DETAIL = ("per_minute", "first_output_hist", "e2e_hist", "inter_token_hist", "languages")


def _side(s: VersionStats) -> dict:
    cost, unit = s.cost_per_unit()
    d = {f.name: getattr(s, f.name) for f in fields(s) if f.name not in _SIDE_DETAIL}
    d.update(error_ratio=s.error_ratio, timeout_ratio=s.timeout_ratio, cost_per_unit=cost, cost_unit=unit,
             underrun_reported=s.underrun_reported, underrun_streams=s.underrun_streams)
    return d


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


# ---- the statistics ----------------------------------------------------------------

# Alternatives of the mixture, as multiples of the null's rate ratio: from barely worse to
# a canary that fails nearly every request on a model that almost never fails. Equal
# weights per factor of ~1.4, so no size of harm is favoured.
_RHO_GRID = np.geomspace(1.25, 5000.0, 25)
_STD_NORMAL = NormalDist()


def sequential_error_p_values(canary_n, canary_bad, stable_n, stable_bad, rho0: float = 1.0) -> np.ndarray:
    """Always-valid p-values, minute by minute, of H0: canary error rate ≤ rho0 × stable's,
    from per-minute counts in time order (arrays of equal length). See the module docstring."""
    nc, kc, ns, ks = (np.asarray(a, dtype=float) for a in (canary_n, canary_bad, stable_n, stable_bad))
    # A minute without errors, or without one side, moves no likelihood ratio (its step is 0).
    usable = (nc > 0) & (ns > 0)
    p0 = np.where(usable, nc / np.where(usable, nc + ns, 1.0), 0.5)
    kc, ks = np.where(usable, kc, 0.0), np.where(usable, ks, 0.0)
    rhos = rho0 * _RHO_GRID[:, None]
    q0 = rho0 * p0 / (rho0 * p0 + 1 - p0)
    q = rhos * p0 / (rhos * p0 + 1 - p0)
    steps = kc * np.log(q / q0) + ks * (np.log1p(-q) - np.log1p(-q0))
    path = np.cumsum(steps, axis=1)
    top = path.max(axis=0)
    log_mix = top + np.log(np.exp(path - top).mean(axis=0))  # log of the mixture after each minute
    return np.minimum(1.0, np.exp(-np.maximum.accumulate(np.maximum(log_mix, 0.0))))


def sequential_error_p_value(canary_n, canary_bad, stable_n, stable_bad, rho0: float = 1.0) -> float:
    """The always-valid p-value after the last minute."""
    if len(np.atleast_1d(canary_n)) == 0:
        return 1.0
    return float(sequential_error_p_values(canary_n, canary_bad, stable_n, stable_bad, rho0)[-1])


Strata = Sequence[tuple[Mapping[int, int], Mapping[int, int]]]  # per minute: (canary bins, stable bins)


@dataclass(frozen=True)
class DenseStrata:
    """Strata on one bin axis: `canary[i, j]` and `stable[i, j]` count the values of minute
    i in bin `bins[j]`. Only minutes where both sides have values are kept."""

    bins: np.ndarray
    canary: np.ndarray
    stable: np.ndarray

    @staticmethod
    def of(strata: Strata | DenseStrata) -> DenseStrata:
        if isinstance(strata, DenseStrata):
            return strata
        pairs = [[(np.fromiter(h.keys(), np.int64, len(h)), np.fromiter(h.values(), float, len(h))) for h in pair]
                 for pair in strata if pair[0] and pair[1]]
        bins = np.unique(np.concatenate([k for pair in pairs for k, _ in pair])) if pairs else np.zeros(0, np.int64)
        out = [np.zeros((len(pairs), len(bins))) for _ in range(2)]
        for i, pair in enumerate(pairs):
            for side, (keys, values) in zip(out, pair):
                side[i, np.searchsorted(bins, keys)] = values
        keep = (out[0].sum(axis=1) > 0) & (out[1].sum(axis=1) > 0)
        return DenseStrata(bins, out[0][keep], out[1][keep])

    def merged(self) -> tuple[dict[int, int], dict[int, int]]:
        c, s = self.canary.sum(axis=0), self.stable.sum(axis=0)
        return ({int(b): int(n) for b, n in zip(self.bins, c) if n}, {int(b): int(n) for b, n in zip(self.bins, s) if n})


def mann_whitney_binned(strata: Strata | DenseStrata) -> tuple[float, float]:
    """One-sided Mann-Whitney U on histograms, stratified by minute (van Elteren): (p-value
    that the canary is stochastically larger, AUC = P(canary > stable) + ½ P(tie)).

    Values in one bin are ties: they share the bin's mid-rank, and each stratum's variance
    carries the tie correction. Strata keep the comparison within a minute, so a canary
    whose weight changed over the window is not compared with stable traffic from minutes
    it did not see (latency moves with load); weights 1 ÷ (N + 1) per stratum are van
    Elteren's locally most powerful choice."""
    d = DenseStrata.of(strata)
    c, s = d.canary, d.stable
    if not len(c):
        return 1.0, 0.5
    n1, n2 = c.sum(axis=1), s.sum(axis=1)
    t = c + s
    n = n1 + n2
    midrank = np.cumsum(t, axis=1) - t + (t + 1) / 2
    u = (c * midrank).sum(axis=1) - n1 * (n1 + 1) / 2
    var = n1 * n2 / 12 * ((n + 1) - (t**3 - t).sum(axis=1) / np.maximum(n * (n - 1), 1))
    w = 1.0 / (n + 1)
    num, v = float((w * (u - n1 * n2 / 2)).sum()), float((w * w * var).sum())
    auc = float(u.sum() / (n1 * n2).sum())
    if v <= 0:
        return 1.0, auc
    return 1.0 - _STD_NORMAL.cdf(num / math.sqrt(v)), auc


def _binomial_pmf(k: int, p: float) -> np.ndarray:
    if p <= 0 or p >= 1:
        out = np.zeros(k + 1)
        out[k if p >= 1 else 0] = 1.0
        return out
    # log pmf(i) = k·log(1 − p) + Σ_{j<i} log((k − j) ÷ (j + 1) · p ÷ (1 − p)): one cumulative sum.
    j = np.arange(k, dtype=float)
    steps = np.log(k - j) - np.log(j + 1) + math.log(p) - math.log1p(-p)
    return np.exp(k * math.log1p(-p) + np.concatenate(([0.0], np.cumsum(steps))))


def tail_exceedance_p_value(strata: Strata | DenseStrata, q: float = 0.99) -> float:
    """Does the canary put more requests above the pooled p99 than its share of traffic?

    The cut is the q-quantile bin of both sides pooled (label-blind, so under equal
    distributions the labels stay exchangeable); within each minute, an exceedance is the
    canary's with probability n_canary ÷ n. The count of canary exceedances is then a sum
    of binomials, whose tail is computed exactly by convolution. It catches a tail-only
    regression (a slow path hit by 3% of requests) that a rank test barely moves for."""
    d = DenseStrata.of(strata)
    if not len(d.canary):
        return 1.0
    pooled = d.canary.sum(axis=0) + d.stable.sum(axis=0)
    rank = math.floor(q * (pooled.sum() - 1))
    cut = int(np.searchsorted(np.cumsum(pooled), rank, side="right"))  # index of the quantile's bin
    n1, n2 = d.canary.sum(axis=1), d.stable.sum(axis=1)
    ca = d.canary[:, cut + 1:].sum(axis=1).astype(int)
    k = ca + d.stable[:, cut + 1:].sum(axis=1).astype(int)
    dist = np.ones(1)
    for ki, p0 in zip(k[k > 0], (n1 / (n1 + n2))[k > 0]):
        dist = np.convolve(dist, _binomial_pmf(int(ki), float(p0)))
    return float(min(1.0, dist[int(ca.sum()):].sum()))


@dataclass(frozen=True)
class CostInterval:
    ratio: float  # canary ÷ stable cost per unit
    lower: float
    upper: float
    confidence: float
    minutes: tuple[int, int]


def cost_ratio_interval(canary: tuple[MinuteCounts, ...], stable: tuple[MinuteCounts, ...], unit: str,
                        alpha: float, min_minutes: int) -> CostInterval | None:
    """One-sided (1 − alpha) bounds on canary ÷ stable cost per unit (see module docstring)."""
    def side(rows):
        x = np.array([units_of(r, unit) for r in rows], float)
        y = np.array([r.gpu_cost for r in rows], float)
        keep = x > 0
        x, y = x[keep], y[keep]
        if len(x) < max(2, min_minutes) or y.sum() <= 0:
            return None
        r = y.sum() / x.sum()
        m = len(x)
        var_r = m / (m - 1) * float(((y - r * x) ** 2).sum()) / x.sum() ** 2
        return r, var_r / r**2, m

    a, b = side(canary), side(stable)
    if a is None or b is None:
        return None
    ratio = a[0] / b[0]
    sd = math.sqrt(a[1] + b[1])
    z = _STD_NORMAL.inv_cdf(1 - alpha)
    return CostInterval(ratio, ratio * math.exp(-z * sd), ratio * math.exp(z * sd), 1 - alpha, (a[2], b[2]))


# ---- per-metric verdicts ------------------------------------------------------------

_RANK = {"pass": 0, "continue": 1, "pause": 2, "rollback": 3}


@dataclass
class MetricVerdict:
    verdict: str  # pass | continue | pause | rollback
    reason: str
    p_value: float | None = None
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "p_value": self.p_value, **self.detail}


def _aligned(canary: VersionStats, stable: VersionStats, n: str = "requests", bad: str = "bad") -> tuple[np.ndarray, ...]:
    """Per-minute (canary n, bad, stable n, bad) for minutes both sides served, in time
    order; without per-minute counts, the window as one look. `n` and `bad` name the counts
    (requests and failures; streams that reported underruns and those that stuttered)."""
    if canary.per_minute and stable.per_minute:
        s = {m.minute: m for m in stable.per_minute}
        rows = [(getattr(c, n), getattr(c, bad), getattr(s[c.minute], n), getattr(s[c.minute], bad))
                for c in sorted(canary.per_minute, key=lambda m: m.minute) if c.minute in s]
        if rows:
            return tuple(np.array(col, float) for col in zip(*rows))
        return tuple(np.zeros(0) for _ in range(4))
    return tuple(np.array([getattr(side, k)], float) for side, k in ((canary, n), (canary, bad), (stable, n), (stable, bad)))


def error_verdict(canary: VersionStats, stable: VersionStats, p: RolloutPolicy) -> MetricVerdict:
    nc, kc, ns, ks = _aligned(canary, stable)
    # Ratios over the minutes both sides served, as the test sees them (stable's window may
    # reach back before the canary started).
    c_err = float(kc.sum() / nc.sum()) if nc.sum() else canary.error_ratio or 0.0
    s_err = float(ks.sum() / ns.sum()) if ns.sum() else stable.error_ratio or 0.0
    p_rollback = sequential_error_p_value(nc, kc, ns, ks, p.rollback_error_factor)
    p_worse = sequential_error_p_value(nc, kc, ns, ks, 1.0)
    # Add-half estimate: finite when stable has no errors in the window.
    rate_ratio = ((kc.sum() + 0.5) / (nc.sum() + 1)) / ((ks.sum() + 0.5) / (ns.sum() + 1))
    burn = c_err / (1 - p.objective)
    detail = {"method": "mixture SPRT on the canary's share of errors, per minute (always-valid p-value)",
              "p_value_worse_than_stable": p_worse, "rate_ratio": round(rate_ratio, 4),
              "canary_error_ratio": c_err, "stable_error_ratio": s_err, "canary_burn_rate": round(burn, 3),
              "alpha": p.error_alpha}
    words = f"canary error+timeout ratio {100 * c_err:.2f}% vs stable {100 * s_err:.2f}% (~{rate_ratio:.1f}x)"
    if p_rollback <= p.error_alpha and c_err - s_err >= p.rollback_error_abs and burn >= 1.0:
        return MetricVerdict("rollback", f"{words}: over {p.rollback_error_factor:g}x stable with p = {p_rollback:.2g} "
                             f"(always-valid, alpha {p.error_alpha:g}) and burning its budget at {burn:.1f}x",
                             p_rollback, detail)
    if p_worse <= p.error_alpha:
        why = "within its error budget" if burn < 1.0 else f"not yet shown over {p.rollback_error_factor:g}x"
        return MetricVerdict("pause", f"{words}: worse than stable with p = {p_worse:.2g}, {why}", p_worse, detail)
    # No harm seen: a pass only if the harm that matters would have shown (stable's rate, add-half
    # where it had no errors, so that a clean stable asks for evidence rather than none).
    s_rate = max(s_err, 0.5 / max(float(ns.sum()), 1.0))
    factor = max(p.error_detectable_factor, p.error_detectable_burn * (1 - p.objective) / s_rate)
    power = count_power(float(nc.sum()), float(ns.sum()), s_rate, factor, p.error_alpha, p.gate_beta,
                        sequential_error_p_value)
    detail["detectable_factor"] = round(factor, 3)
    if not power.detectable:
        detail.update(evidence="insufficient", evidence_needed=power.needed("requests"))
        return MetricVerdict("continue", f"{words}: no harm seen, but too little to see {factor:.3g}x: "
                             f"{power.needed('requests')}", p_worse, detail)
    return MetricVerdict("pass", f"{words}: no evidence it errs more (p = {p_worse:.2g}), and {factor:.3g}x would "
                         "have shown", p_worse, detail)


def burn_verdict(canary: VersionStats, stable: VersionStats, p: RolloutPolicy, window_minutes: int) -> MetricVerdict:
    budget = 1 - p.objective
    if canary.per_minute:
        newest = max(m.minute for m in canary.per_minute)
        short = [m for m in canary.per_minute if m.minute > newest - p.burn_short_minutes]
        short_n, short_bad = sum(m.requests for m in short), sum(m.bad for m in short)
        s_short = [m for m in stable.per_minute if m.minute > newest - p.burn_short_minutes]
        s_n, s_bad = sum(m.requests for m in s_short), sum(m.bad for m in s_short)
    else:
        short_n, short_bad = canary.requests, canary.bad  # totals only: one window
        s_n, s_bad = stable.requests, stable.bad
    long_n, long_bad = canary.requests, canary.bad
    short_b = short_bad / short_n / budget if short_n else None
    long_b = long_bad / long_n / budget if long_n else None
    stable_b = s_bad / s_n / budget if s_n else None
    # How surprising the short window's errors would be at exactly the paging burn rate (exact
    # binomial): reported as the evidence behind the alarm, which itself acts on the rate.
    at_threshold = min(1.0, p.rollback_burn_rate * budget)
    p_short = float(min(1.0, _binomial_pmf(short_n, at_threshold)[short_bad:].sum())) if short_n else None
    detail = {"method": "multi-window burn rate (SRE workbook page: short and long windows)",
              "short_burn_rate": short_b, "long_burn_rate": long_b, "short_requests": short_n, "long_requests": long_n,
              "stable_short_burn_rate": stable_b, "short_minutes": p.burn_short_minutes, "long_minutes": window_minutes,
              "threshold": p.rollback_burn_rate}
    enough = short_n >= p.burn_min_requests and long_n >= p.burn_min_requests
    if enough and short_b >= p.rollback_burn_rate and long_b >= p.rollback_burn_rate:
        words = (f"canary burns its error budget at {short_b:.1f}x over {p.burn_short_minutes} min and {long_b:.1f}x "
                 f"over {window_minutes} min (pages at {p.rollback_burn_rate:g}x)")
        if stable_b is not None and s_n >= p.burn_min_requests and stable_b >= p.rollback_burn_rate:
            # Stable pages too: the incident is the fleet's (a zone, a dependency), and rolling
            # back onto a version that burns as fast helps nobody. Halt for a person instead.
            return MetricVerdict("pause", f"{words}, but stable burns at {stable_b:.1f}x too: not the canary's "
                                 "incident alone", p_short, detail)
        return MetricVerdict("rollback", words, p_short, detail)
    if not enough:
        return MetricVerdict("pass", f"burn rate not judged: {short_n:,} canary requests in the short window, "
                             f"{p.burn_min_requests:,} needed", None, detail)
    return MetricVerdict("pass", f"canary burn rate {short_b:.1f}x short, {long_b:.1f}x long: under "
                         f"{p.rollback_burn_rate:g}x", p_short, detail)


def latency_strata(canary: VersionStats, stable: VersionStats, field_name: str) -> Strata | None:
    """Per minute both sides served, (canary bins, stable bins); or the window as one
    stratum when only whole-window histograms are given; None without histograms."""
    c_min = [(m.minute, getattr(m, field_name)) for m in canary.per_minute if getattr(m, field_name)]
    s_min = {m.minute: getattr(m, field_name) for m in stable.per_minute if getattr(m, field_name)}
    strata = [(h, s_min[minute]) for minute, h in c_min if minute in s_min]
    if strata:
        return strata
    c, s = getattr(canary, field_name), getattr(stable, field_name)
    return [(c, s)] if c and s else None


def latency_verdict(name: str, strata: Strata | None, c_p99: float | None, s_p99: float | None, canary_n: int,
                    stable_n: int, p: RolloutPolicy) -> MetricVerdict | None:
    dense = DenseStrata.of(strata) if strata else None
    if dense is not None and len(dense.canary):
        c_hist, s_hist = dense.merged()
        n1, n2 = sum(c_hist.values()), sum(s_hist.values())
        if n1 < p.min_requests or n2 < p.min_requests:
            return MetricVerdict("continue", f"{name}: {n1:,} canary and {n2:,} stable values, {p.min_requests:,} each "
                                 "needed to judge latency", None, {"canary_values": n1, "stable_values": n2})
        p_mw, auc = mann_whitney_binned(dense)
        p_tail = tail_exceedance_p_value(dense)
        p_val = min(1.0, 2 * min(p_mw, p_tail))
        c50, s50 = histogram.quantile_ms(c_hist, 0.5), histogram.quantile_ms(s_hist, 0.5)
        c99, s99 = histogram.quantile_ms(c_hist, 0.99), histogram.quantile_ms(s_hist, 0.99)
        r50, r99 = _ratio(c50, s50), _ratio(c99, s99)
        effect = max(r for r in (r50, r99, 0.0) if r is not None)
        detail = {"method": "Mann-Whitney U on histogram bins, stratified by minute (van Elteren), and exceedance "
                            "of the pooled p99 (Bonferroni over the two)",
                  "p_value_rank": p_mw, "p_value_tail": p_tail, "auc": round(auc, 4), "p50_ratio": r50,
                  "p99_ratio": r99, "canary_p99_ms": c99, "stable_p99_ms": s99, "minutes": len(dense.canary),
                  "alpha": p.latency_alpha}
        words = (f"{name} p99 {c99:,.0f} ms vs stable {s99:,.0f} ms ({r99:.2f}x), median {r50:.2f}x"
                 if r99 is not None and r50 is not None else f"{name}")
        if p_val <= p.latency_alpha and effect > p.rollback_latency_factor:
            return MetricVerdict("rollback", f"{words}, p = {p_val:.2g}", p_val, detail)
        if p_val <= p.latency_alpha and effect > p.pause_latency_factor:
            return MetricVerdict("pause", f"{words}, p = {p_val:.2g}", p_val, detail)
        # Not significant, or too small to matter: no evidence of harm. A large ratio
        # without significance is the noise of a tail quantile from few requests. A pass
        # needs the power to have seen a shift by the pause factor, at the rank test's share
        # of the alpha (Bonferroni over the two tests).
        sigma = log_spread(lambda q: histogram.quantile_ms(s_hist, q))
        power = rank_power(n1, n2, sigma, p.pause_latency_factor, p.latency_alpha / 2, p.gate_beta) \
            if sigma else Power(True, p.pause_latency_factor, 0.0)  # one bin: any shift moves values across it
        detail["detectable_factor"] = p.pause_latency_factor
        if not power.detectable:
            detail.update(evidence="insufficient", evidence_needed=power.needed("values"))
            return MetricVerdict("continue", f"{words}: no harm seen, but too little to see "
                                 f"{p.pause_latency_factor:g}x: {power.needed('values')}", p_val, detail)
        return MetricVerdict("pass", f"{words}: no significant regression over {p.pause_latency_factor:g}x "
                             f"(p = {p_val:.2g})", p_val, detail)
    # Totals only: the p99 ratio once both sides have enough requests.
    r = _ratio(c_p99, s_p99)
    if r is None:
        return None
    detail = {"method": "p99 ratio (no histograms given)", "p99_ratio": r}
    if canary_n < p.min_requests or stable_n < p.min_requests:
        return MetricVerdict("continue", f"{name}: {p.min_requests:,} requests per side needed", None, detail)
    words = f"{name} p99 {c_p99:,.0f} ms vs stable {s_p99:,.0f} ms ({r:.2f}x)"
    if r > p.rollback_latency_factor:
        return MetricVerdict("rollback", words, None, detail)
    if r > p.pause_latency_factor:
        return MetricVerdict("pause", words, None, detail)
    return MetricVerdict("pass", words, None, detail)


def cost_verdict(canary: VersionStats, stable: VersionStats, p: RolloutPolicy) -> MetricVerdict | None:
    c_cost, unit = canary.cost_per_unit()
    s_cost, _ = stable.cost_per_unit(unit)  # the canary's unit on both sides
    point = _ratio(c_cost, s_cost)
    if point is None:
        return None
    # Over the minutes the canary served: cost per token moves with the prompt mix over time.
    served = {m.minute for m in canary.per_minute}
    ci = cost_ratio_interval(canary.per_minute, tuple(m for m in stable.per_minute if m.minute in served), unit,
                             p.cost_alpha, p.cost_min_minutes) if canary.per_minute and stable.per_minute else None
    if ci is not None:
        point = ci.ratio
    words = f"cost {unit} {c_cost:.4g} vs stable {s_cost:.4g} ({point:.2f}x over the minutes the canary served)"
    if ci is None:
        detail = {"method": "ratio of costs per unit (no per-minute data for an interval)", "ratio": point}
        if canary.per_minute and stable.per_minute:
            return MetricVerdict("continue", f"{words}: {p.cost_min_minutes} minutes with work per side needed for an "
                                 "interval; not promoted before", None, detail)
        if canary.requests < p.min_requests or stable.requests < p.min_requests:
            return MetricVerdict("continue", f"{words}: {p.min_requests:,} requests per side needed", None, detail)
        if point > p.rollback_cost_factor:
            return MetricVerdict("rollback", words, None, detail)
        if point > p.pause_cost_factor:
            return MetricVerdict("pause", f"{words}: not promoted while it costs more", None, detail)
        if point > p.promote_cost_factor:
            return MetricVerdict("continue", f"as good as stable but {point:.2f}x the cost {unit}: keep watching", None, detail)
        return MetricVerdict("pass", words, None, detail)
    # The p-value of "canary costs no more than factor × stable", from the same normal approximation.
    sd = (math.log(ci.upper) - math.log(ci.lower)) / (2 * _STD_NORMAL.inv_cdf(ci.confidence))

    def p_over(factor: float) -> float:
        return 1.0 - _STD_NORMAL.cdf((math.log(point) - math.log(factor)) / sd) if sd > 0 and math.isfinite(factor) else 1.0

    detail = {"method": "ratio of sums per side, delta-method interval over minutes (one-sided)", "ratio": point,
              "lower": ci.lower, "upper": ci.upper, "confidence": ci.confidence, "minutes": list(ci.minutes)}
    bounds = f"{ci.lower:.2f}x–{ci.upper:.2f}x at {ci.confidence:.0%}"
    if ci.lower > p.rollback_cost_factor:
        return MetricVerdict("rollback", f"{words}, {bounds}: over {p.rollback_cost_factor:g}x",
                             p_over(p.rollback_cost_factor), detail)
    if ci.lower > p.pause_cost_factor:
        return MetricVerdict("pause", f"{words}, {bounds}: costs over {p.pause_cost_factor:g}x stable, not promoted",
                             p_over(p.pause_cost_factor), detail)
    if point > p.promote_cost_factor:
        return MetricVerdict("continue", f"{words}, {bounds}: may cost more than {p.promote_cost_factor:g}x, keep "
                             "watching, not promoted", p_over(p.promote_cost_factor), detail)
    detail["detectable_factor"] = p.pause_cost_factor
    if ci.upper >= p.pause_cost_factor:
        # The interval still reaches the harm that pauses: the data cannot tell this canary from
        # one that costs that much more. Its width shrinks as √minutes.
        more = cost_minutes_needed(point, sd, p.pause_cost_factor, ci.confidence, min(ci.minutes))
        needed = f"needs ~{more:,} more minutes with work" if more is not None else "cannot show it at this spread"
        detail.update(evidence="insufficient", evidence_needed=needed)
        return MetricVerdict("continue", f"{words}, {bounds}: too little to rule out {p.pause_cost_factor:g}x: {needed}",
                             p_over(p.promote_cost_factor), detail)
    return MetricVerdict("pass", f"{words}, {bounds}: under {p.pause_cost_factor:g}x", p_over(p.promote_cost_factor),
                         detail)


def _quality_sums(rows: Sequence[QualityMinute]) -> tuple[int, int, int]:
    return (sum(m.evaluations for m in rows), sum(m.word_errors for m in rows), sum(m.reference_words for m in rows))


def overdispersion(rows: Sequence[QualityMinute]) -> float:
    """How much more word errors vary from minute to minute than independent words would
    (Pearson's χ² over the binomial, per degree of freedom), at least 1; 1 with under 5 minutes."""
    used = [m for m in rows if m.reference_words > 0]
    words = sum(m.reference_words for m in used)
    if len(used) < 5 or not words:
        return 1.0
    rate = sum(m.word_errors for m in used) / words
    if not 0 < rate < 1:
        return 1.0
    chi2 = sum((m.word_errors - m.reference_words * rate) ** 2 / (m.reference_words * rate * (1 - rate)) for m in used)
    return max(1.0, chi2 / (len(used) - 1))


def wer_verdict(canary: VersionStats, stable: VersionStats, p: RolloutPolicy) -> MetricVerdict | None:
    """Word error rate per language slice (module docstring); None where stable was never
    evaluated. A canary without evaluations beside an evaluated stable is not judged yet."""
    if not stable.languages:
        return None
    canary_languages = canary.languages or {}
    languages = sorted(set(canary_languages) | set(stable.languages))
    alpha = p.wer_alpha / len(languages)
    slices: dict[str, dict] = {}
    verdicts: dict[str, MetricVerdict] = {}
    totals = np.zeros(4)
    for lang in languages:
        c_rows, s_rows = canary_languages.get(lang, ()), stable.languages.get(lang, ())
        (c_evals, c_err, c_words), (s_evals, s_err, s_words) = _quality_sums(c_rows), _quality_sums(s_rows)
        totals += (c_err, c_words, s_err, s_words)
        name = lang or "(no language)"
        row = {"canary_wer": round(c_err / c_words, 5) if c_words else None,
               "stable_wer": round(s_err / s_words, 5) if s_words else None,
               "canary_evaluations": c_evals, "stable_evaluations": s_evals,
               "canary_words": c_words, "stable_words": s_words}
        slices[name] = row
        stable_ready = s_evals >= p.wer_min_evaluations and s_words >= p.wer_min_words
        if not stable_ready:
            row["verdict"] = "unjudged"  # stable's own evidence too thin: no baseline
            continue
        if c_evals < p.wer_min_evaluations or c_words < p.wer_min_words:
            row["verdict"] = "continue"
            verdicts[name] = MetricVerdict("continue", f"WER on {name}: {c_evals:,} canary evaluations ({c_words:,} words) "
                                           f"of the {p.wer_min_evaluations:,} and {p.wer_min_words:,} needed to judge it",
                                           None, row)
            continue
        by_minute = {m.minute: m for m in s_rows}
        aligned = [(c.reference_words, c.word_errors, by_minute[c.minute].reference_words, by_minute[c.minute].word_errors)
                   for c in sorted(c_rows, key=lambda m: m.minute) if c.minute in by_minute]
        phi = overdispersion(s_rows)
        nc, kc, ns, ks = (np.array(col, float) / phi for col in zip(*aligned)) if aligned else (np.zeros(0),) * 4
        p_rollback = sequential_error_p_value(nc, kc, ns, ks, p.rollback_wer_factor)
        p_worse = sequential_error_p_value(nc, kc, ns, ks, 1.0)
        row.update(overdispersion=round(phi, 3), p_value_worse_than_stable=p_worse, alpha=alpha)
        words = (f"WER on {name}: canary {100 * c_err / c_words:.1f}% vs stable {100 * s_err / s_words:.1f}% "
                 f"over {c_words:,} and {s_words:,} evaluated words")
        if p_rollback <= alpha:
            row["verdict"] = "rollback"
            verdicts[name] = MetricVerdict("rollback", f"{words}: over {p.rollback_wer_factor:g}x stable with "
                                           f"p = {p_rollback:.2g} (always-valid, alpha {alpha:.2g} per language)",
                                           p_rollback, row)
        elif p_worse <= alpha:
            row["verdict"] = "pause"
            verdicts[name] = MetricVerdict("pause", f"{words}: worse than stable with p = {p_worse:.2g}, not yet shown "
                                           f"over {p.rollback_wer_factor:g}x", p_worse, row)
        else:
            # No harm seen: a pass only if a canary worse by the detectable factor would have been seen.
            power = count_power(float(nc.sum()), float(ns.sum()), s_err / s_words, p.wer_detectable_factor, alpha,
                                p.gate_beta, sequential_error_p_value)
            row["detectable_factor"] = p.wer_detectable_factor
            if power.detectable:
                row["verdict"] = "pass"
                verdicts[name] = MetricVerdict("pass", f"{words}: no evidence it is worse (p = {p_worse:.2g}), and "
                                               f"{p.wer_detectable_factor:g}x would have shown", p_worse, row)
            else:
                more = power.more_canary * phi if power.more_canary is not None else None  # words, not φ-units
                needed = Power(False, power.factor, more).needed("words")
                row.update(verdict="insufficient", evidence_needed=needed)
                verdicts[name] = MetricVerdict("continue", f"{words}: no harm seen, but too little to see "
                                               f"{p.wer_detectable_factor:g}x: {needed}", p_worse, row)
    c_err, c_words, s_err, s_words = totals
    global_words = (f"global WER canary {100 * c_err / c_words:.1f}% vs stable {100 * s_err / s_words:.1f}%"
                    if c_words and s_words else "no global WER yet")
    detail = {"method": "mixture SPRT on the canary's share of word errors per language and minute, counts divided by "
                        "stable's overdispersion (always-valid, Bonferroni across languages)",
              "slices": slices, "global_canary_wer": round(c_err / c_words, 5) if c_words else None,
              "global_stable_wer": round(s_err / s_words, 5) if s_words else None}
    worst = max((v.verdict for v in verdicts.values()), key=_RANK.__getitem__, default="continue")
    if not verdicts:
        return MetricVerdict("continue", f"WER: no language slice has the evidence to judge yet ({global_words})", None,
                             detail)
    named = [v for v in verdicts.values() if v.verdict == worst]
    p_values = [v.p_value for v in named if v.p_value is not None]
    detail["languages"] = [k for k, v in verdicts.items() if v.verdict == worst]
    reason = "; ".join(v.reason for v in named) if worst != "pass" else "WER within bounds on every judged language"
    return MetricVerdict(worst, f"{reason} ({global_words})", min(p_values) if p_values else None, detail)


def underrun_verdict(canary: VersionStats, stable: VersionStats, p: RolloutPolicy) -> MetricVerdict | None:
    """Streams with an underrun, canary against stable (module docstring); None where stable's
    streams never reported underruns."""
    if not stable.underrun_reported:
        return None
    nc, kc, ns, ks = _aligned(canary, stable, "underrun_reported", "underrun_streams")
    reported = nc > 0  # stable's streams count only in minutes the canary's streams were judged beside
    nc, kc, ns, ks = nc[reported], kc[reported], ns[reported], ks[reported]
    c_n, s_n = int(nc.sum()), int(ns.sum())
    c_share = float(kc.sum() / c_n) if c_n else None
    s_share = float(ks.sum() / s_n) if s_n else None
    detail = {"method": "mixture SPRT on the canary's share of streams with an underrun, per minute (always-valid "
                        "p-value)", "canary_streams": c_n, "stable_streams": s_n,
              "canary_underrun_ratio": c_share, "stable_underrun_ratio": s_share, "alpha": p.underrun_alpha}
    if not c_n:
        return MetricVerdict("continue", "underruns: no canary stream reported underruns yet beside stable's", None,
                             detail)
    p_rollback = sequential_error_p_value(nc, kc, ns, ks, p.rollback_underrun_factor)
    p_worse = sequential_error_p_value(nc, kc, ns, ks, 1.0)
    detail["p_value_worse_than_stable"] = p_worse
    words = (f"streams with an underrun: canary {100 * c_share:.2f}% vs stable {100 * (s_share or 0.0):.2f}% "
             f"over {c_n:,} and {s_n:,} streams")
    if p_rollback <= p.underrun_alpha:
        return MetricVerdict("rollback", f"{words}: over {p.rollback_underrun_factor:g}x stable with p = "
                             f"{p_rollback:.2g} (always-valid, alpha {p.underrun_alpha:g})", p_rollback, detail)
    if p_worse <= p.underrun_alpha:
        return MetricVerdict("pause", f"{words}: worse than stable with p = {p_worse:.2g}, not yet shown over "
                             f"{p.rollback_underrun_factor:g}x", p_worse, detail)
    if min(c_n, s_n) < p.underrun_min_streams:
        return MetricVerdict("continue", f"{words}: {p.underrun_min_streams:,} streams per side needed to pass it",
                             p_worse, detail)
    upper = float(betaincinv(kc.sum() + 1, c_n - kc.sum(), 0.95)) if kc.sum() < c_n else 1.0
    bound = max(p.promote_underrun_factor * (s_share or 0.0), p.underrun_tolerance)
    detail["canary_underrun_ratio_upper"] = round(upper, 6)
    if upper >= bound:
        return MetricVerdict("continue", f"{words}: no harm shown, but its share may be up to {100 * upper:.2f}% (95% "
                             f"bound), not yet shown under {100 * bound:.2f}%", p_worse, detail)
    return MetricVerdict("pass", f"{words}: under {100 * bound:.2f}% with 95% confidence (p worse = {p_worse:.2g})",
                         p_worse, detail)


def verdict(canary: VersionStats, stable: VersionStats, window_minutes: int, policy: RolloutPolicy = RolloutPolicy(),
            as_of: str | None = None) -> Verdict:
    p = policy
    metrics: dict[str, MetricVerdict] = {}
    if canary.requests and stable.requests:
        metrics["errors"] = error_verdict(canary, stable, p)
    if canary.requests:
        metrics["burn_rate"] = burn_verdict(canary, stable, p, window_minutes)
    for key, name, field_name, c99, s99 in (
            ("first_output", "first-output", "first_output_hist", canary.first_output_p99_ms, stable.first_output_p99_ms),
            ("e2e", "e2e", "e2e_hist", canary.e2e_p99_ms, stable.e2e_p99_ms),
            # A canary that decodes slowly keeps its first token and its e2e within noise of
            # long answers; the gap between tokens shows it.
            ("inter_token", "inter-token", "inter_token_hist", canary.inter_token_p99_ms, stable.inter_token_p99_ms)):
        m = latency_verdict(name, latency_strata(canary, stable, field_name), c99, s99, canary.requests,
                            stable.requests, p)
        if m is not None:
            metrics[key] = m
    cost = cost_verdict(canary, stable, p)
    if cost is not None:
        metrics["cost"] = cost
    wer = wer_verdict(canary, stable, p)
    if wer is not None:
        metrics["wer"] = wer
    underruns = underrun_verdict(canary, stable, p)
    if underruns is not None:
        metrics["underruns"] = underruns
    worst = max((m.verdict for m in metrics.values()), key=_RANK.__getitem__, default="continue")
    reasons: list[str] = []
    decided_by: list[str] = []
    if worst in ("rollback", "pause"):
        for level in ("rollback", "pause"):
            for k, m in metrics.items():
                if m.verdict == level:
                    reasons.append(m.reason)
                    if level == worst:
                        decided_by.append(k)
        result = worst
    elif canary.requests < p.min_requests or stable.requests < p.min_requests:
        reasons.append(f"not enough traffic to judge latency and cost: canary {canary.requests:,} and stable "
                       f"{stable.requests:,} requests in {window_minutes} min, {p.min_requests:,} each needed "
                       "(errors are judged sequentially: no harm shown yet)")
        result = "continue"
    elif worst == "continue":
        reasons.extend(m.reason for m in metrics.values() if m.verdict == "continue")
        decided_by = [k for k, m in metrics.items() if m.verdict == "continue"]
        result = "continue"
    elif canary.requests < p.promote_min_requests:
        reasons.append(f"healthy so far on {canary.requests:,} requests; promotion needs {p.promote_min_requests:,}")
        result = "continue"
    else:
        c_err, s_err = canary.error_ratio or 0.0, stable.error_ratio or 0.0
        p_err = metrics["errors"].p_value if "errors" in metrics else None
        reasons.append(f"no metric shows the canary worse than stable over {canary.requests:,} requests: errors "
                       f"{100 * c_err:.2f}% vs {100 * s_err:.2f}%"
                       + (f" (no evidence it errs more, p = {p_err:.2g})" if p_err is not None else "")
                       + ", latency and cost within bounds")
        decided_by = list(metrics)
        result = "promote"
    # The confidence acted on: for a halt, 1 − the deciding metric's p-value. Promotion and
    # continue act on the absence of evidence of harm, which has no such number; each
    # metric's p-value is in `metrics`.
    p_values = [metrics[k].p_value for k in decided_by if metrics[k].p_value is not None]
    confidence = round(1 - min(p_values), 6) if result in ("rollback", "pause") and p_values else None
    return Verdict(result, reasons, _side(canary), _side(stable), window_minutes, as_of,
                   metrics={k: m.to_json() for k, m in metrics.items()}, decided_by=decided_by, confidence=confidence)


# ---- a canary's story over a window ------------------------------------------------------------

SEVERITY = {"promote": 0, "continue": 1, "pause": 2, "rollback": 3}


@dataclass(frozen=True)
class VerdictStep:
    """The verdict a poller read during one minute (a backtest's replay)."""

    minute: int
    verdict: str
    reason: str
    decided_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class CanaryStory:
    """What a canary's verdicts said over a window, told one way wherever it is told (the
    demo, `backtest rollout`, the readiness report): the worst verdict in the window with its
    first run of minutes and the metric that decided it, and the verdict now."""

    worst: str
    worst_from: int | None  # first minute of the first run of the worst verdict (None: never halted)
    worst_to: int | None  # first minute after that run
    worst_minutes: int  # minutes with the worst verdict in all
    worst_reason: str
    worst_decided_by: tuple[str, ...]
    latest: str
    latest_since: int
    latest_reason: str

    @property
    def halted(self) -> bool:
        return self.worst in ("pause", "rollback")

    def sentence(self, at) -> str:
        """One finished sentence; `at(minute)` writes a minute (event time, with its date)."""
        now = f"{self.latest} since {at(self.latest_since)}"
        if not self.halted:
            return f"never halted; {now} ({self.latest_reason})"
        by = f" by {', '.join(self.worst_decided_by)}" if self.worst_decided_by else ""
        run = f"from {at(self.worst_from)} to {at(self.worst_to)}"
        more = f", {self.worst_minutes} minutes in all" if self.worst_minutes > self.worst_to - self.worst_from else ""
        if self.latest == self.worst and self.latest_since == self.worst_from:
            return f"{self.worst}{by} since {at(self.worst_from)} ({self.worst_reason})"
        return f"{self.worst}{by} {run}{more} ({self.worst_reason}); now {now}"


def canary_story(steps: list[VerdictStep]) -> CanaryStory | None:
    """The story of a run of verdicts, oldest first (None for none)."""
    if not steps:
        return None
    worst = max(steps, key=lambda s: SEVERITY.get(s.verdict, 0)).verdict
    runs, start = [], None  # runs of the worst verdict: (first minute, first minute after)
    for i, s in enumerate(steps):
        if s.verdict == worst and start is None:
            start = i
        if start is not None and (s.verdict != worst or i == len(steps) - 1):
            end = i + 1 if s.verdict == worst else i
            runs.append((start, end))
            start = None
    first_run = runs[0]
    first = steps[first_run[0]]
    after = steps[first_run[1]].minute if first_run[1] < len(steps) else steps[-1].minute + 1
    latest = steps[-1]
    since = len(steps) - 1
    while since > 0 and steps[since - 1].verdict == latest.verdict:
        since -= 1
    return CanaryStory(
        worst=worst, worst_from=first.minute if SEVERITY.get(worst, 0) >= 2 else None,
        worst_to=after if SEVERITY.get(worst, 0) >= 2 else None,
        worst_minutes=sum(1 for s in steps if s.verdict == worst), worst_reason=first.reason,
        worst_decided_by=first.decided_by, latest=latest.verdict, latest_since=steps[since].minute,
        latest_reason=latest.reason)
