"""Overload advice for a pool: the degradation ladder with the load each step would free, and
admission of the next interval's requests under a fixed capacity budget.

Pure: a pool's recent traffic by tenant and traffic class, its demand and measured capacity
in, a `ShedAdvice` out.

Degradation: when a pool cannot keep its SLO, degrade in a stated
order, cheapest for users first, and reject last. The default ladder sheds batch and
over-quota traffic first and protects paid realtime streams last:

1. `delay_batch`: delay non-real-time jobs (batch, eval, replay traffic in the pool);
2. `shed_over_quota`: tenants over their quota (a share of the pool's capacity) lose the excess;
3. `shorten_context`: cap prompts at `context_budget_tokens` (LLM pools);
4. `reduce_retrieval_depth`: fewer retrieved passages (the configured share of work retrieval costs);
5. `route_to_smaller_model`: a share of realtime LLM requests to a smaller model;
6. `disable_premium_effects`: TTS premium voices and effects (the configured share of work);
7. `reject_low_priority`: reject what still does not fit, lowest priority first, with Retry-After.

Each step's load is estimated from the buckets (GPU-seconds per second of demand); where
the buckets cannot tell (retrieval depth, premium effects), the policy's share is used and the
step says it is configured, not measured, or that it frees nothing known.

Admission: requests are considered highest priority first, within a
priority the cheaper first, ties broken by a stable id; each is admitted if its cost fits what
capacity is left, else rejected, and the walk goes on, so a request larger than what is left
never blocks cheaper ones behind it. Zero capacity admits nothing. A request's priority is its
traffic class's plus its tenant's (paid tiers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Iterable, Literal

import msgspec
from msgspec import Meta

from tailwatch.ingest.schema import TrafficClass
from tailwatch.config import ConfigStruct, Fraction, Ratio

Step = Literal["delay_batch", "shed_over_quota", "shorten_context", "reduce_retrieval_depth",
               "route_to_smaller_model", "disable_premium_effects", "reject_low_priority"]
DEFAULT_LADDER: tuple[str, ...] = ("delay_batch", "shed_over_quota", "shorten_context", "reduce_retrieval_depth",
                                   "route_to_smaller_model", "disable_premium_effects", "reject_low_priority")
DEFERRABLE_CLASSES = ("batch", "eval", "replay")
ACTIONS = {
    "delay_batch": "delay batch, eval and replay jobs until the pool has headroom",
    "shed_over_quota": "hold tenants over their quota to it",
    "shorten_context": "cap prompts at the context budget",
    "reduce_retrieval_depth": "retrieve fewer passages per turn",
    "route_to_smaller_model": "route a share of realtime requests to the smaller model",
    "disable_premium_effects": "turn off premium voices and effects",
    "reject_low_priority": "reject the lowest-priority requests with Retry-After",
}


class ShedPolicy(ConfigStruct):
    """The `shed:` section of the API config file."""

    ladder: list[Step] = msgspec.field(default_factory=lambda: list(DEFAULT_LADDER))
    traffic_class_priority: dict[TrafficClass, int] = msgspec.field(
        default_factory=lambda: {"realtime": 3, "batch": 1, "eval": 1, "replay": 0, "shadow": 0})
    tenant_priority: dict[str, int] = {}  # added to the class's: paid tiers above free ones
    quota_share: dict[str, Fraction] = {}  # tenant → its share of the pool's capacity
    context_budget_tokens: Annotated[int, Meta(ge=1)] = 8000
    routable_share: Fraction = 0.5  # of realtime LLM requests that a smaller model can answer
    smaller_model_work_ratio: Ratio = 0.4  # its GPU work per request, against this model's
    retrieval_share_of_work: Fraction = 0.0  # 0: not known, the step frees nothing it can show
    premium_effects_share_of_work: Fraction = 0.0
    interval_s: Annotated[int, Meta(ge=1, le=3600)] = 60  # the admission plan's horizon
    retry_after_s: Annotated[int, Meta(ge=1, le=3600)] = 30

    def __post_init__(self):
        if len(set(self.ladder)) != len(self.ladder):
            raise ValueError("ladder names a step twice")


# ---- admission ----------------------------------------------------------------------
@dataclass(frozen=True)
class AdmissionRequest:
    id: str
    priority: int
    cost: float  # in capacity units (GPU-seconds)


@dataclass(frozen=True)
class Admission:
    admitted: list[str]
    rejected: list[str]
    used: float
    capacity: float


def admission_key(priority: int, cost: float, stable_id: str) -> tuple:
    return (-priority, cost, stable_id)


def admit(requests: Iterable[AdmissionRequest], capacity: float) -> Admission:
    """Seed 000's admission under a fixed budget (module doc)."""
    if capacity < 0:
        raise ValueError("capacity must not be negative")
    left, admitted, rejected = capacity, [], []
    for r in sorted(requests, key=lambda r: admission_key(r.priority, r.cost, r.id)):
        if r.cost < 0:
            raise ValueError(f"request {r.id}: cost must not be negative")
        if r.cost <= left * (1 + 1e-12):
            admitted.append(r.id)
            left -= r.cost
        else:
            rejected.append(r.id)
    return Admission(admitted, rejected, capacity - max(left, 0.0), capacity)


@dataclass(frozen=True)
class RequestGroup:
    """Requests alike: one tenant and traffic class, each costing the group's mean."""

    tenant: str
    traffic_class: str
    priority: int
    requests: int
    cost: float

    @property
    def id(self) -> str:
        return f"{self.traffic_class}\x1f{self.tenant}"


@dataclass(frozen=True)
class GroupAdmission:
    group: RequestGroup
    admitted: int
    rejected: int


def admit_groups(groups: Iterable[RequestGroup], capacity: float) -> list[GroupAdmission]:
    """`admit` over the groups' requests, counted per group: a group's requests share a
    cost and an id prefix, so they come one after another in the admission order."""
    if capacity < 0:
        raise ValueError("capacity must not be negative")
    left, out = capacity, []
    for g in sorted(groups, key=lambda g: admission_key(g.priority, g.cost, g.id)):
        fits = g.requests if g.cost <= 0 else min(g.requests, int(left * (1 + 1e-12) // g.cost))
        left -= fits * g.cost
        out.append(GroupAdmission(g, fits, g.requests - fits))
    return out


# ---- the ladder ---------------------------------------------------------------------
@dataclass(frozen=True)
class TrafficSlice:
    """One tenant and traffic class of the pool over the window: per-second rates."""

    tenant: str
    traffic_class: str
    requests_per_s: float
    work_gpu_s_per_s: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class LadderStep:
    step: str
    action: str
    load_removed_gpu_s_per_s: float
    share_of_demand: float
    still_over_gpu_s_per_s: float  # demand left over capacity after this step and those before
    enough: bool  # the first step at which demand fits
    basis: str  # how the load was estimated, or why it is unknown


@dataclass(frozen=True)
class ShedAdvice:
    pool: str
    under_pressure: bool
    pressure: list[str]
    demand_gpu_s_per_s: float
    capacity_gpu_s_per_s: float
    steps: list[LadderStep]
    admission: list[GroupAdmission]
    admission_capacity_gpu_s: float
    interval_s: int
    retry_after_s: int
    notes: list[str] = field(default_factory=list)


def priority_of(policy: ShedPolicy, tenant: str, traffic_class: str) -> int:
    return policy.traffic_class_priority.get(traffic_class, 0) + policy.tenant_priority.get(tenant, 0)  # type: ignore[call-overload]


def _step_load(step: str, traffic: list[TrafficSlice], policy: ShedPolicy, capacity: float,
               workload: str | None, still_over: float) -> tuple[float, str]:
    realtime = [t for t in traffic if t.traffic_class == "realtime"]
    if step == "delay_batch":
        deferrable = [t for t in traffic if t.traffic_class in DEFERRABLE_CLASSES]
        load = sum(t.work_gpu_s_per_s for t in deferrable)
        classes = sorted({t.traffic_class for t in deferrable})
        return load, (f"measured: the work of {', '.join(classes)} traffic in the pool" if classes
                      else "measured: no batch, eval or replay traffic in the pool")
    if step == "shed_over_quota":
        if not policy.quota_share:
            return 0.0, "no quotas configured (shed.quota_share)"
        by_tenant: dict[str, float] = {}
        for t in traffic:
            by_tenant[t.tenant] = by_tenant.get(t.tenant, 0.0) + t.work_gpu_s_per_s
        over = {tenant: work - policy.quota_share[tenant] * capacity for tenant, work in by_tenant.items()
                if tenant in policy.quota_share and work > policy.quota_share[tenant] * capacity}
        names = ", ".join(f"{k} {v:,.2f}" for k, v in sorted(over.items()))
        return sum(over.values()), (f"measured: work over quota by tenant (GPU-s/s): {names}" if over
                                    else "measured: no tenant is over its quota")
    if step == "shorten_context":
        if workload not in (None, "llm"):
            return 0.0, f"not an LLM pool ({workload})"
        freed = 0.0
        for t in traffic:
            tokens = t.prompt_tokens_per_s + t.output_tokens_per_s
            excess = max(0.0, t.prompt_tokens_per_s - t.requests_per_s * policy.context_budget_tokens)
            freed += t.work_gpu_s_per_s * excess / tokens if tokens > 0 else 0.0
        return freed, (f"estimated: prompt tokens over {policy.context_budget_tokens:,} a request (from means per "
                       "tenant and class, so a lower bound), each token costing alike")
    if step == "reduce_retrieval_depth":
        share = policy.retrieval_share_of_work
        load = share * sum(t.work_gpu_s_per_s for t in realtime) / 2
        return load, (f"configured: retrieval is {share:.0%} of realtime work, halving its depth" if share
                      else "not measured: set shed.retrieval_share_of_work to size it")
    if step == "route_to_smaller_model":
        if workload not in (None, "llm", "s2s"):
            return 0.0, f"no smaller model for a {workload} pool"
        load = sum(t.work_gpu_s_per_s for t in realtime) * policy.routable_share * (1 - policy.smaller_model_work_ratio)
        return load, (f"configured: {policy.routable_share:.0%} of realtime requests routable, at "
                      f"{policy.smaller_model_work_ratio:.0%} of the work")
    if step == "disable_premium_effects":
        share = policy.premium_effects_share_of_work
        if workload not in (None, "tts", "s2s") or not share:
            return 0.0, ("not measured: set shed.premium_effects_share_of_work to size it" if not share
                         else f"no premium effects in a {workload} pool")
        return share * sum(t.work_gpu_s_per_s for t in traffic), f"configured: premium effects are {share:.0%} of work"
    # reject_low_priority: what still does not fit, from the lowest priority up.
    return still_over, "what still does not fit, rejected lowest priority first (admission plan)"


def shed_advice(pool: str, traffic: list[TrafficSlice], demand_gpu_s_per_s: float, capacity_gpu_s_per_s: float,
                policy: ShedPolicy, pressure: list[str], workload: str | None = None) -> ShedAdvice:
    """The ladder in the policy's order with what each step frees, and the admission plan for
    the next `interval_s` at the measured capacity."""
    over = demand_gpu_s_per_s - capacity_gpu_s_per_s
    under_pressure = bool(pressure) or over > 0
    if over > 0:
        pressure = [f"demand {demand_gpu_s_per_s:,.2f} GPU-s/s is over the capacity of {capacity_gpu_s_per_s:,.2f}",
                    *pressure]
    steps, still_over, done = [], max(over, 0.0), not under_pressure
    for step in policy.ladder:
        load, basis = _step_load(step, traffic, policy, capacity_gpu_s_per_s, workload, still_over)
        if step == "reject_low_priority" and not under_pressure:
            load, basis = 0.0, "nothing to reject: the pool is not under pressure"
        before = still_over
        still_over = max(0.0, still_over - load)
        # Under pressure with demand within capacity (users wait anyway), the first step that
        # frees anything is the one to take.
        enough = not done and (load > 0 and (before > 0 and still_over <= 0 or before <= 0))
        done = done or enough
        steps.append(LadderStep(step, ACTIONS[step], round(load, 6),
                                round(load / demand_gpu_s_per_s, 6) if demand_gpu_s_per_s > 0 else 0.0,
                                round(still_over, 6), enough, basis))
    groups = [RequestGroup(t.tenant, t.traffic_class, priority_of(policy, t.tenant, t.traffic_class),
                           round(t.requests_per_s * policy.interval_s),
                           t.work_gpu_s_per_s / t.requests_per_s if t.requests_per_s > 0 else 0.0)
              for t in traffic if round(t.requests_per_s * policy.interval_s) > 0]
    budget = capacity_gpu_s_per_s * policy.interval_s
    return ShedAdvice(pool, under_pressure, pressure, demand_gpu_s_per_s, capacity_gpu_s_per_s, steps,
                      admit_groups(groups, budget), budget, policy.interval_s, policy.retry_after_s)
