"""Autoscale decisions per pool: replicas from demand and per-replica capacity, raised on
user pain, with zone-loss headroom, fast out and slow in. Pure: `now_minute` is event time.

Demand is work in GPU-seconds per second. Capacity per replica is a `CapacityEstimate`
(planning/capacity.py): the physical bound narrowed by measurement, with the bound that decided
named in the answer. GPU utilisation is reported but never drives the answer: a busy GPU
serving batch traffic in a realtime pool is a reason to look at traffic classes, not to
add replicas.

Invariant (tests/test_capacity.py, a property test): a pool where no user waits (queue
age and first output within SLO) and whose work is under the planning target of its
capacity (target utilisation, less the zone-loss headroom) is never told to grow.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Annotated

from msgspec import Meta

from tailwatch.planning.capacity import CapacityEstimate, GpusPerReplica, configured_capacity, replicas
from tailwatch.config import ConfigStruct, NonNegative, Percent, Positive, Ratio


@dataclass(frozen=True)
class PoolSignals:
    pool: str
    as_of_minute: int
    requests_per_s: float
    work_gpu_s_per_s: float
    tokens_per_s: float
    audio_s_per_s: float
    active_streams: int
    queue_age_p95_ms: float | None
    first_output_p95_ms: float | None
    first_output_slo_ms: float | None
    kv_cache_usage_max: float | None
    gpu_util_mean_pct: float | None
    replicas_by_state: dict[str, int]
    burn_rate: float | None = None  # fastest page window of the pool's SLOs
    prompt_tokens_per_s: float | None = None
    # Useful utilisation (GPM / DCGM profiling) where the GPUs report it: SMs doing work.
    sm_active_mean_pct: float | None = None


@dataclass(frozen=True)
class PoolInputs:
    """What each input a pool's answer reads holds in the pool's window."""

    pool: str
    window_minutes: int
    requests: float  # requests in the window
    gpu_samples: int  # GPU samples (replica states, queue age, utilisation) in the window
    newest_gpu_minute: int | None  # the pool's newest GPU sample, any minute kept
    gpu_busy: bool  # its GPUs report work in the window (utilisation or active streams)


def absent_input(i: PoolInputs) -> tuple[str, str] | None:
    """(input, why) when an input the decision reads holds nothing in the pool's window:
    no decision is made then. Without GPU samples the replica count, queue age and
    utilisation are unknown, and "current 0" would be a guess that scales a busy pool in;
    without requests while the GPUs work, demand is unknown. An idle pool (no requests, idle
    GPUs) is a decision: its demand is zero."""
    if i.gpu_samples == 0:
        newest = "none kept" if i.newest_gpu_minute is None else f"the newest is from minute {i.newest_gpu_minute}"
        return "gpu", (f"no GPU samples for pool {i.pool} in its {i.window_minutes}-minute window ({newest}): its "
                       "replica states, queue age and utilisation are unknown, so no replica count is answered")
    if i.requests == 0 and i.gpu_busy:
        return "requests", (f"no requests from pool {i.pool} in its {i.window_minutes}-minute window while its GPUs "
                            "report work: its demand is unknown, so no replica count is answered")
    return None


class AutoscalePolicy(ConfigStruct):
    """The `autoscale:` section of the API config file."""

    target_utilization: Ratio = 0.7
    zones: Annotated[int, Meta(ge=1, le=1000)] = 3
    default_capacity_gpu_s_per_s: Positive = 1.0  # only when a caller passes no capacity at all
    gpus_per_replica: GpusPerReplica = 1.0  # the physical bound: this many GPU-s/s per replica
    queue_age_slo_ms: Positive = 1_000.0
    breach_step: NonNegative = 0.25  # add this share of current replicas per evaluation while users wait
    scale_in_stabilization_minutes: Annotated[int, Meta(ge=0, le=1440)] = 10
    min_replicas: Annotated[int, Meta(ge=0, le=10**7)] = 1
    max_replicas: Annotated[int, Meta(ge=1, le=10**7)] = 10_000
    sm_active_pct_saturated: Percent = 50.0  # as the busy-but-slow detector: SMs this busy are saturated

    def __post_init__(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")


@dataclass
class Decision:
    pool: str
    desired_replicas: int
    current_replicas: int
    reasons: list[str]
    signals: dict
    as_of_minute: int
    capacity: dict = field(default_factory=dict)  # CapacityEstimate.to_json()
    breaches: list[str] = field(default_factory=list)  # users waiting: queue age or first output over SLO

    @property
    def capacity_basis(self) -> str:
        return self.capacity.get("basis", "")


@dataclass
class Autoscaler:
    """Keeps each pool's recent recommendations for the scale-in stabilisation window."""

    policy: AutoscalePolicy = field(default_factory=AutoscalePolicy)
    _history: dict[str, deque] = field(default_factory=dict)

    def decide(self, s: PoolSignals, capacity: float | CapacityEstimate | None = None) -> Decision:
        """`capacity`: an estimate (the live view's), a number (per-replica capacity from
        config or a load test), or None for the policy default."""
        p = self.policy
        # A GPU that reports without a state (a node whose runtime sends no gauges) is a
        # replica in state unknown: it serves, so it counts; cold and draining ones do not.
        current = sum(s.replicas_by_state.get(state, 0) for state in ("warm", "loading", "unknown"))
        if isinstance(capacity, CapacityEstimate):
            estimate = capacity
        elif capacity:
            estimate = configured_capacity(capacity)
        else:
            estimate = replace(configured_capacity(p.default_capacity_gpu_s_per_s, "the policy default"),
                               basis="policy-default")
        per_replica = estimate.per_replica_gpu_s_per_s
        plan = replicas(s.work_gpu_s_per_s, p.target_utilization, p.zones, per_replica_capacity=per_replica)
        # A pool lives in one zone; to keep the SLO when another zone fails, it takes its share of that zone's load.
        recommended = plan.with_zone_headroom if p.zones > 1 else plan.base_replicas
        planning_target = p.target_utilization * (p.zones - 1) / p.zones if p.zones > 1 else p.target_utilization
        utilization = s.work_gpu_s_per_s / (current * per_replica) if current else None
        reasons = [
            f"demand {s.work_gpu_s_per_s:,.2f} GPU-s/s ({s.requests_per_s:,.1f} req/s) at {per_replica:.3g} GPU-s/s per "
            f"replica and {p.target_utilization:.0%} target utilisation needs {plan.base_replicas:,} replica{'' if plan.base_replicas == 1 else 's'}, "
            f"{recommended:,} with headroom to lose one of {p.zones} zones",
            estimate.reason,
        ]
        breaches = []
        if s.queue_age_p95_ms is not None and s.queue_age_p95_ms > p.queue_age_slo_ms:
            breaches.append(f"queue age p95 {s.queue_age_p95_ms:,.0f} ms is over {p.queue_age_slo_ms:,.0f} ms")
        if s.first_output_p95_ms is not None and s.first_output_slo_ms is not None and s.first_output_p95_ms > s.first_output_slo_ms:
            breaches.append(f"first-output p95 {s.first_output_p95_ms:,.0f} ms is over its SLO of {s.first_output_slo_ms:,.0f} ms")
        if breaches:
            # Users waiting means the capacity model is optimistic right now: add a step on
            # top of whichever is larger, the demand answer or what runs today.
            raised = max(recommended, current) + max(1, math.ceil(current * p.breach_step))
            reasons.append("users are waiting: " + "; ".join(breaches) + f" → scale out to {raised:,}")
            recommended = raised
        elif utilization is not None and utilization <= planning_target * (1 + 1e-9) and recommended > current:
            # Only rounding gets here (a ceiling before the zone headroom and one after it):
            # with no user waiting and work under the planning target, growing has no evidence.
            reasons.append(f"not grown: no user waits and {current:,} replicas run at {utilization:.0%} of capacity, "
                           f"under the {planning_target:.0%} planning target")
            recommended = current
        if s.gpu_util_mean_pct is not None:
            reasons.append(f"GPU utilisation {s.gpu_util_mean_pct:.0f}% (reported, not used to scale)")
        if s.sm_active_mean_pct is not None:
            reasons.append(sm_activity_reason(s.sm_active_mean_pct, s.gpu_util_mean_pct, p.sm_active_pct_saturated))
        recommended = min(max(recommended, p.min_replicas), p.max_replicas)
        history = self._history.setdefault(s.pool, deque())
        history.append((s.as_of_minute, recommended))
        while history and history[0][0] <= s.as_of_minute - p.scale_in_stabilization_minutes:
            history.popleft()
        desired = recommended
        if recommended < current:
            held = max(r for _, r in history)
            desired = min(current, held)
            if desired > recommended:
                reasons.append(f"scale-in held at {desired:,}: the highest recommendation of the last "
                               f"{p.scale_in_stabilization_minutes} minutes (slow in)")
        signals = {
            "requests_per_s": s.requests_per_s, "work_gpu_s_per_s": s.work_gpu_s_per_s, "tokens_per_s": s.tokens_per_s,
            "prompt_tokens_per_s": s.prompt_tokens_per_s,
            "audio_seconds_per_s": s.audio_s_per_s, "active_streams": s.active_streams,
            "queue_age_p95_ms": s.queue_age_p95_ms, "first_output_p95_ms": s.first_output_p95_ms,
            "first_output_slo_ms": s.first_output_slo_ms, "kv_cache_usage_max": s.kv_cache_usage_max,
            "gpu_util_mean_pct": s.gpu_util_mean_pct, "sm_active_mean_pct": s.sm_active_mean_pct, "replicas_by_state": s.replicas_by_state, "burn_rate": s.burn_rate,
            "capacity_gpu_s_per_s_per_replica": per_replica, "capacity_basis": estimate.basis,
            "utilization_of_capacity": round(utilization, 4) if utilization is not None else None,
            "planning_target_utilization": round(planning_target, 4),
        }
        return Decision(s.pool, desired, current, reasons, signals, s.as_of_minute, estimate.to_json(), breaches)


def sm_activity_reason(sm_active_pct: float, util_pct: float | None, saturated_pct: float) -> str:
    """What the SMs say about the GPUs' headroom: NVML utilisation reads 100% while most SMs
    idle (a kernel was running), so only SM activity tells a saturated GPU from one that
    would serve more by batching more."""
    if sm_active_pct >= saturated_pct:
        return f"SMs active {sm_active_pct:.0f}%: the GPUs are saturated (SM activity, reported)"
    util = f" while utilisation reads {util_pct:.0f}%" if util_pct is not None else ""
    return (f"SMs active {sm_active_pct:.0f}%{util}: busy but idle SMs, so batching more (larger max batch, "
            "more sequences per replica) would serve more before buying GPUs")
