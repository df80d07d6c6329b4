"""Is "no harm seen" evidence of no harm? The power of the canary gates' tests.

Pure functions, no clock. A canary gate may say `pass` only when its data would have shown
the harm that matters: the minimum detectable effect (MDE) each metric states, at the gate's
own alpha, with probability at least 1 − beta. Below that the gate's answer is
`insufficient`, with the evidence still needed.

- Counts (errors, word errors, streams with an underrun), judged by the mixture sequential
  probability ratio test of `signals/rollout.py`: if the canary's rate were `factor` ×
  stable's, the bad events of both sides would split with the canary's share q₁ (its share
  of exposure p₀ tilted by the factor). Take the count the canary would reach with
  probability 1 − beta (the normal approximation to that binomial's beta quantile) and ask
  whether the test, fed that split, would reject at alpha. Fed as one look, the mixture's
  likelihood ratio equals the product over minutes when p₀ holds still, so this is the
  power of the test that is actually run, not of a fixed-sample test it does not run.
- Latency, judged by a rank test (Mann-Whitney): latency is close to log-normal, so a
  canary `factor` × slower shifts log latency by log(factor), and the AUC it would show is
  Φ(log(factor) ÷ (σ√2)) with σ the spread of stable's log latency (from its interquartile
  range). The rank statistic's standard error under no difference is
  √((n₁ + n₂ + 1) ÷ (12 n₁ n₂)); the sample has power when (AUC − ½) ÷ that error reaches
  z(1 − alpha) + z(1 − beta).

- Cost per unit, judged by a one-sided interval on the log of the canary ÷ stable ratio: a
  pass needs the interval's upper bound under the factor that pauses (the data tells this
  canary from one that costs that much more). The interval's half-width shrinks as
  √minutes, which says how many more minutes it needs.

"Evidence still needed" scales the canary's exposure (and stable's beside it, in the
proportion the window shows) until the sample would have the power, and says how much
more canary exposure that is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

_STD_NORMAL = NormalDist()
_MOST_SCALE = 1e6  # past a million times today's exposure, say "not reachable" rather than a number


@dataclass(frozen=True)
class Power:
    """Whether a comparison could have shown the harm that matters, and what it lacks."""

    detectable: bool
    factor: float  # the minimum detectable effect asked for, as canary ÷ stable
    more_canary: float | None  # more canary exposure (in the gate's unit) before it could; 0 when it can; None: never

    def needed(self, unit: str) -> str:
        """"needs ~1,200 more words" (empty once it has the power)."""
        if self.detectable:
            return ""
        if self.more_canary is None:
            return f"cannot show {self.factor:.3g}x at this traffic"
        return f"needs ~{_round_up(self.more_canary):,} more canary {unit} to show {self.factor:.3g}x"


def _round_up(x: float) -> int:
    """Two significant figures, rounded up: an estimate, not a count."""
    if x <= 0:
        return 0
    step = 10 ** max(0, math.floor(math.log10(x)) - 1)
    return int(math.ceil(x / step) * step)


def _more_needed(has_power: Callable[[float], bool], canary_n: float) -> float | None:
    """The canary exposure to add so that `has_power(scale)` holds, scale × today's; bisection
    between the last scale without and the first with power (both sides grow together)."""
    if has_power(1.0):
        return 0.0
    lo, hi = 1.0, 2.0
    while not has_power(hi):
        lo, hi = hi, hi * 2
        if hi > _MOST_SCALE:
            return None
    for _ in range(30):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if has_power(mid) else (mid, hi)
        if hi / lo < 1.01:
            break
    return canary_n * (hi - 1.0)


def count_power(canary_n: float, stable_n: float, stable_rate: float, factor: float, alpha: float, beta: float,
                sequential_p: Callable[..., float]) -> Power:
    """Could the sequential count test (`sequential_p(nc, kc, ns, ks, rho0=1)`) have shown a
    canary rate `factor` × `stable_rate` on these exposures, at `alpha`, with probability
    1 − `beta`? Exposures are requests, words or streams (already divided by any
    overdispersion)."""

    def has_power(scale: float) -> bool:
        nc, ns = canary_n * scale, stable_n * scale
        if nc <= 0 or ns <= 0 or stable_rate <= 0:
            return False
        p0 = nc / (nc + ns)
        q1 = factor * p0 / (factor * p0 + 1 - p0)
        total = stable_rate * (factor * nc + ns)  # bad events expected on both sides under the MDE
        kc = total * q1 - _STD_NORMAL.inv_cdf(1 - beta) * math.sqrt(total * q1 * (1 - q1))
        if kc <= total * p0:  # not even the direction of harm at the beta quantile
            return False
        return sequential_p([nc], [kc], [ns], [total - kc]) <= alpha

    if stable_rate <= 0:
        return Power(False, factor, None)
    return Power(has_power(1.0), factor, _more_needed(has_power, canary_n))


def log_spread(quantile_ms: Callable[[float], float | None]) -> float | None:
    """σ of log latency from the interquartile range (normal: IQR = 1.349 σ)."""
    q25, q75 = quantile_ms(0.25), quantile_ms(0.75)
    if not q25 or not q75 or q25 <= 0 or q75 <= q25:
        return None
    return math.log(q75 / q25) / 1.349


def rank_power(canary_n: float, stable_n: float, sigma_log: float, factor: float, alpha: float, beta: float) -> Power:
    """Could a one-sided rank test at `alpha` have shown a canary `factor` × slower (a log-
    normal shift) with probability 1 − `beta`, on `canary_n` and `stable_n` values?"""
    auc = _STD_NORMAL.cdf(math.log(factor) / (sigma_log * math.sqrt(2))) if sigma_log > 0 else 1.0
    z_needed = _STD_NORMAL.inv_cdf(1 - alpha) + _STD_NORMAL.inv_cdf(1 - beta)

    def has_power(scale: float) -> bool:
        n1, n2 = canary_n * scale, stable_n * scale
        if n1 <= 0 or n2 <= 0:
            return False
        return (auc - 0.5) / math.sqrt((n1 + n2 + 1) / (12 * n1 * n2)) >= z_needed

    return Power(has_power(1.0), factor, _more_needed(has_power, canary_n))


def cost_minutes_needed(ratio: float, sd_log: float, factor: float, confidence: float, minutes: int) -> int | None:
    """More minutes before the upper bound of a cost ratio (estimate `ratio`, standard error
    `sd_log` of its log over `minutes`) falls under `factor`; None when the estimate itself is not under it."""
    gap = math.log(factor) - math.log(ratio)
    if gap <= 0 or sd_log <= 0:
        return None if gap <= 0 else 0
    z = _STD_NORMAL.inv_cdf(confidence)
    total = minutes * (z * sd_log / gap) ** 2
    return max(0, math.ceil(total - minutes))
