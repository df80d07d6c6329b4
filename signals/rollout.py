"""Rollout verdicts: a canary model version against the stable version of the same model.

Pure: each side is a `VersionStats` summed over the same event-time window; the verdict
is `promote`, `continue`, `pause` or `rollback`, with the reasons in words and the
numbers for both sides. Cost counts as much as speed: a faster canary that costs twice
as much per unit of work is not promoted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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

    @property
    def error_ratio(self) -> float | None:
        return self.bad / self.requests if self.requests else None

    @property
    def timeout_ratio(self) -> float | None:
        return self.timeouts / self.requests if self.requests else None

    def cost_per_unit(self) -> tuple[float | None, str]:
        """Cost per 1,000 output tokens, or per audio-second for speech models."""
        if self.output_tokens > 0:
            return self.gpu_cost / self.output_tokens * 1000, "per 1k output tokens"
        if self.audio_seconds > 0:
            return self.gpu_cost / self.audio_seconds, "per audio-second"
        return None, "per unit"


@dataclass(frozen=True)
class RolloutPolicy:
    objective: float = 0.999  # availability objective used for the canary's burn rate
    min_requests: int = 500  # per side, before any verdict but `continue`
    promote_min_requests: int = 2_000
    rollback_burn_rate: float = 14.4  # the canary alone would page
    rollback_error_factor: float = 2.0  # canary error ratio vs stable…
    rollback_error_abs: float = 0.005  # …and at least this much worse in absolute terms
    rollback_latency_factor: float = 1.5  # p99 first output or e2e vs stable
    pause_latency_factor: float = 1.15
    pause_cost_factor: float = 1.25
    promote_cost_factor: float = 1.10


@dataclass
class Verdict:
    verdict: str
    reasons: list[str]
    canary: dict
    stable: dict
    window_minutes: int
    as_of: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "reasons": self.reasons, "canary": self.canary, "stable": self.stable,
                "window_minutes": self.window_minutes, "as_of": self.as_of, **self.extra}


def _side(s: VersionStats) -> dict:
    cost, unit = s.cost_per_unit()
    d = asdict(s)
    d.update(error_ratio=s.error_ratio, timeout_ratio=s.timeout_ratio, cost_per_unit=cost, cost_unit=unit)
    return d


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def verdict(canary: VersionStats, stable: VersionStats, window_minutes: int, policy: RolloutPolicy = RolloutPolicy(),
            as_of: str | None = None) -> Verdict:
    reasons: list[str] = []
    out = lambda v: Verdict(v, reasons, _side(canary), _side(stable), window_minutes, as_of)  # noqa: E731
    if canary.requests < policy.min_requests or stable.requests < policy.min_requests:
        reasons.append(f"not enough traffic to judge: canary {canary.requests:,} and stable {stable.requests:,} requests "
                       f"in {window_minutes} min, {policy.min_requests:,} each needed")
        return out("continue")
    rollback, pause = [], []
    c_err, s_err = canary.error_ratio or 0.0, stable.error_ratio or 0.0
    burn = c_err / (1 - policy.objective)
    if burn > policy.rollback_burn_rate:
        rollback.append(f"canary burns its error budget at {burn:.1f}x (pages above {policy.rollback_burn_rate:g}x)")
    if c_err > s_err * policy.rollback_error_factor and c_err - s_err > policy.rollback_error_abs:
        rollback.append(f"canary error+timeout ratio {100 * c_err:.2f}% vs stable {100 * s_err:.2f}%")
    for name, c, s in (("first-output p99", canary.first_output_p99_ms, stable.first_output_p99_ms),
                       ("e2e p99", canary.e2e_p99_ms, stable.e2e_p99_ms)):
        r = _ratio(c, s)
        if r is None:
            continue
        if r > policy.rollback_latency_factor:
            rollback.append(f"{name} {c:,.0f} ms vs stable {s:,.0f} ms ({r:.2f}x)")
        elif r > policy.pause_latency_factor:
            pause.append(f"{name} {c:,.0f} ms vs stable {s:,.0f} ms ({r:.2f}x)")
    (c_cost, unit), (s_cost, _) = canary.cost_per_unit(), stable.cost_per_unit()
    cost_r = _ratio(c_cost, s_cost)
    if cost_r is not None and cost_r > policy.pause_cost_factor:
        pause.append(f"cost {unit} {c_cost:.4g} vs stable {s_cost:.4g} ({cost_r:.2f}x): not promoted while it costs more")
    if rollback:
        reasons.extend(rollback + pause)
        return out("rollback")
    if pause:
        reasons.extend(pause)
        return out("pause")
    if canary.requests < policy.promote_min_requests:
        reasons.append(f"healthy so far on {canary.requests:,} requests; promotion needs {policy.promote_min_requests:,}")
        return out("continue")
    if cost_r is not None and cost_r > policy.promote_cost_factor:
        reasons.append(f"as good as stable but {cost_r:.2f}x the cost {unit}: keep watching")
        return out("continue")
    reasons.append(f"canary matches or beats stable on errors ({100 * c_err:.2f}% vs {100 * s_err:.2f}%), "
                   f"latency and cost over {canary.requests:,} requests")
    return out("promote")
