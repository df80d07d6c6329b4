"""Capacity math: replicas for a demand, zone-loss headroom, KV-cache bytes per request.

Pure functions that return their working as well as their answer, so that the command
line can print how a number came about and the autoscaler can give it as a reason.

- Replicas: demand in work-seconds per second (concurrent streams × GPU-seconds per
  second of audio, or tokens per second × GPU-seconds per token) ÷ (per-replica capacity
  × target utilisation). To survive losing one of Z zones, the remaining Z − 1 zones
  must carry everything: total = ceil(base × Z ÷ (Z − 1)).
- KV cache: layers × tokens × 2 (K and V) × KV heads × head dim × bytes per value.
- Per-replica capacity, bounded in both directions (`estimate_capacity`): the physical
  bound (GPUs per replica × 1 GPU-second per second, or for LLM pools the token
  throughput when that binds first), narrowed by measurement: load held for a few
  minutes with latency within SLO is a lower bound, load at which latency broke for as
  long is an upper bound. `SustainedCapacity` keeps both measurements per pool and day.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta

from tailwatch.config import ConfigStruct, NonNegative

GIB = 2**30


@dataclass(frozen=True)
class ReplicaPlan:
    demand_work_s_per_s: float
    per_replica_capacity: float
    target_utilization: float
    zones: int
    base_replicas: int
    with_zone_headroom: int
    working: list[str]


def replicas(demand_work_s_per_s: float, target_utilization: float, zones: int = 1,
             per_replica_capacity: float = 1.0, unit: str = "GPU-s/s") -> ReplicaPlan:
    if demand_work_s_per_s < 0:
        raise ValueError("demand must not be negative")
    if not 0 < target_utilization <= 1:
        raise ValueError("target utilisation must be in (0, 1]")
    if per_replica_capacity <= 0:
        raise ValueError("per-replica capacity must be positive")
    if zones < 1:
        raise ValueError("zones must be at least 1")
    usable = per_replica_capacity * target_utilization
    base = math.ceil(round(demand_work_s_per_s / usable, 9))
    working = [
        f"demand: {demand_work_s_per_s:,.6g} {unit}",
        f"usable per replica: {per_replica_capacity:,.6g} × {target_utilization:g} target utilisation = {usable:,.6g} {unit}",
        f"replicas before headroom: ceil({demand_work_s_per_s:,.6g} ÷ {usable:,.6g}) = {base:,}",
    ]
    if zones > 1:
        total = math.ceil(round(base * zones / (zones - 1), 9))
        working.append(f"to survive losing 1 of {zones} zones, {zones - 1} zones carry it all: "
                       f"ceil({base:,} × {zones} ÷ {zones - 1}) = {total:,} ({math.ceil(total / zones):,} per zone)")
    else:
        total = base
        working.append("one zone: no zone-loss headroom possible")
    return ReplicaPlan(demand_work_s_per_s, per_replica_capacity, target_utilization, zones, base, total, working)


@dataclass(frozen=True)
class KvCachePlan:
    bytes_per_request: int
    weights_fit: bool | None
    requests_per_gpu: int | None
    working: list[str]


def kv_cache(layers: int, kv_heads: int, head_dim: int, tokens: int, bytes_per_value: float,
             gpu_memory_gib: float | None = None, weights_gib: float | None = None,
             overhead_gib: float = 0.0) -> KvCachePlan:
    for name, v in (("layers", layers), ("kv heads", kv_heads), ("head dim", head_dim), ("tokens", tokens)):
        if v <= 0:
            raise ValueError(f"{name} must be positive")
    if bytes_per_value <= 0:
        raise ValueError("bytes per value must be positive")
    per_request = int(layers * tokens * 2 * kv_heads * head_dim * bytes_per_value)
    working = [f"KV cache per request: {layers} layers × {tokens:,} tokens × 2 (K and V) × {kv_heads} KV heads × "
               f"{head_dim} head dim × {bytes_per_value:g} bytes = {per_request:,} bytes ({per_request / 1e9:.2f} GB, "
               f"{per_request / GIB:.2f} GiB)"]
    if gpu_memory_gib is None or weights_gib is None:
        return KvCachePlan(per_request, None, None, working)
    free_gib = gpu_memory_gib - weights_gib - overhead_gib
    if free_gib <= 0:
        working.append(f"the weights alone do not fit: {weights_gib:g} GiB of weights (+ {overhead_gib:g} GiB overhead) "
                       f"on a {gpu_memory_gib:g} GiB GPU; shard the model across GPUs or quantise it")
        return KvCachePlan(per_request, False, 0, working)
    fit = int(free_gib * GIB // per_request)
    working.append(f"memory beside the weights: {gpu_memory_gib:g} − {weights_gib:g}"
                   + (f" − {overhead_gib:g}" if overhead_gib else "")
                   + f" = {free_gib:g} GiB → {fit:,} such requests fit at once")
    return KvCachePlan(per_request, True, fit, working)


@dataclass(frozen=True)
class PoolMinute:
    """One closed minute of one pool: the work its warm replicas carried, and whether its
    latency SLOs (queue age, first output) held in that minute."""

    pool: str
    minute: int
    work_gpu_s_per_s: float
    warm_replicas: int
    latency_held: bool


# Breach loads kept per pool and day: the lowest few, so that a breach bound survives when
# the held bound later rises past the lowest one (see `SustainedCapacity.bounds`).
_BREACHES_KEPT_PER_DAY = 8


class SustainedCapacity:
    """Per pool, both measured bounds on what one warm replica carries at SLO.

    - Held (a lower bound): the most work per warm replica sustained for
      `sustained_minutes` consecutive minutes with latency held.
    - Broke (an upper bound): the work per warm replica in runs of as many consecutive
      minutes with latency broken; a run counts at its highest load, since queues lag
      the load that filled them.

    Kept per UTC day for `history_days`, so a pool measured at its daily peak keeps that
    figure through the night, and a change of model or hardware ages out. Only the held
    bound is returned by `observe` (the worker persists it); breach loads are rebuilt from
    the recent buckets on restart.
    """

    def __init__(self, sustained_minutes: int = 3, history_days: int = 7):
        self.sustained_minutes = sustained_minutes
        self.history_days = history_days
        self._run: dict[str, list[PoolMinute]] = {}  # consecutive held minutes, newest last
        self._broke_run: dict[str, list[PoolMinute]] = {}  # consecutive breached minutes, newest last
        self.best_by_day: dict[str, dict[int, float]] = {}
        self.broke_by_day: dict[str, dict[int, list[float]]] = {}  # the lowest breach loads, ascending

    def observe(self, m: PoolMinute) -> float | None:
        """Feed minutes in order per pool; returns the pool's new best of the day, if it rose."""
        run = self._run.setdefault(m.pool, [])
        broke = self._broke_run.setdefault(m.pool, [])
        for r in (run, broke):
            if r and m.minute != r[-1].minute + 1:
                r.clear()
        if m.warm_replicas <= 0:
            run.clear()
            broke.clear()
            return None
        if not m.latency_held:
            run.clear()
            self._observe_breach(m, broke)
            return None
        broke.clear()
        run.append(m)
        del run[:-self.sustained_minutes]
        if len(run) < self.sustained_minutes:
            return None
        sustained = min(x.work_gpu_s_per_s / x.warm_replicas for x in run)
        day = m.minute // 1440
        days = self.best_by_day.setdefault(m.pool, {})
        if sustained <= days.get(day, 0.0):
            return None
        days[day] = sustained
        for old in [d for d in days if d <= day - self.history_days]:
            del days[old]
        return sustained

    def _observe_breach(self, m: PoolMinute, run: list[PoolMinute]) -> None:
        run.append(m)
        del run[:-self.sustained_minutes]
        if len(run) < self.sustained_minutes:
            return
        load = max(x.work_gpu_s_per_s / x.warm_replicas for x in run)
        if load <= 0:
            return  # latency broke with no work carried: something else broke it, not load
        day = m.minute // 1440
        days = self.broke_by_day.setdefault(m.pool, {})
        kept = days.setdefault(day, [])
        if load not in kept:
            kept.append(load)
            kept.sort()
            del kept[_BREACHES_KEPT_PER_DAY:]
        for old in [d for d in days if d <= day - self.history_days]:
            del days[old]

    def capacity(self, pool: str, now_minute: int) -> float | None:
        """The held (lower) bound: the best sustained load of the recent days."""
        days = self.best_by_day.get(pool, {})
        recent = [v for d, v in days.items() if d > now_minute // 1440 - self.history_days]
        return max(recent) if recent else None

    def bounds(self, pool: str, now_minute: int) -> tuple[float | None, float | None]:
        """(held, broke) per warm replica over the recent days. A breach at or under a load
        the pool has held is not evidence about capacity (a cold start, a bad version, a
        retry storm broke latency, not the load), so `broke` is the lowest breach load
        above `held`, or None."""
        held = self.capacity(pool, now_minute)
        days = self.broke_by_day.get(pool, {})
        candidates = [v for d, vs in days.items() if d > now_minute // 1440 - self.history_days for v in vs
                      if held is None or v > held]
        return held, (min(candidates) if candidates else None)

    def restore(self, pool: str, day: int, best: float) -> None:
        days = self.best_by_day.setdefault(pool, {})
        days[day] = max(best, days.get(day, 0.0))


# ---- per-replica capacity bounded in both directions -------------------------------

GPU_SECONDS_PER_SECOND_PER_GPU = 1.0  # a GPU cannot do more than one second of work per second


GpusPerReplica = Annotated[float, Meta(gt=0.0, le=4096.0, description="GPUs per replica, in (0, 4096]")]


class ReplicaShape(ConfigStruct):
    """What one replica physically is: its GPUs and, for LLM pools, the token throughput
    it reaches flat out (from a load test or the runtime's benchmark), per replica.
    A `replica_shape.<pool>` entry of the API config file."""

    gpus_per_replica: GpusPerReplica = 1.0
    prefill_tokens_per_s: NonNegative | None = None  # None or 0: not a bound
    decode_tokens_per_s: NonNegative | None = None


@dataclass(frozen=True)
class PhysicalBound:
    gpu_s_per_s: float  # per replica, in the unit demand is measured in
    binds: str  # "gpus", "prefill tokens" or "decode tokens"
    working: str


def physical_bound(shape: ReplicaShape, work_gpu_s_per_s: float = 0.0, prompt_tokens_per_s: float | None = None,
                   output_tokens_per_s: float | None = None) -> PhysicalBound:
    """The most work one replica can carry, whichever limit binds first.

    Token limits are converted into the demand's unit with the pool's current mix: a
    replica that prefills at most P tokens/s carries at most P × (GPU-s of work per prompt
    token) GPU-s/s, and likewise for decode with output tokens."""
    if shape.gpus_per_replica <= 0:
        raise ValueError("GPUs per replica must be positive")
    gpus = shape.gpus_per_replica * GPU_SECONDS_PER_SECOND_PER_GPU
    best = PhysicalBound(gpus, "gpus", f"{shape.gpus_per_replica:g} GPU(s) per replica × 1 GPU-s/s = {gpus:.3g} GPU-s/s")
    if work_gpu_s_per_s <= 0:
        return best
    for binds, limit, tokens in (("prefill tokens", shape.prefill_tokens_per_s, prompt_tokens_per_s),
                                 ("decode tokens", shape.decode_tokens_per_s, output_tokens_per_s)):
        if not limit or not tokens or tokens <= 0:
            continue
        bound = limit * work_gpu_s_per_s / tokens
        if bound < best.gpu_s_per_s:
            best = PhysicalBound(bound, binds, f"{limit:,.0f} {binds}/s per replica × {work_gpu_s_per_s / tokens:.3g} "
                                               f"GPU-s per token = {bound:.3g} GPU-s/s (binds before the GPUs' {gpus:.3g})")
    return best


@dataclass(frozen=True)
class CapacityEstimate:
    """Per-replica capacity at SLO, the bounds it was chosen from, and which one decided."""

    per_replica_gpu_s_per_s: float
    lower_gpu_s_per_s: float | None  # held with latency met
    upper_gpu_s_per_s: float  # the tighter of the physical bound and the load that broke latency
    physical_gpu_s_per_s: float | None
    broke_gpu_s_per_s: float | None
    basis: str  # configured | physical | breach | measured-above-physical | policy-default
    reason: str

    def to_json(self) -> dict:
        return {"per_replica_gpu_s_per_s": self.per_replica_gpu_s_per_s, "lower_gpu_s_per_s": self.lower_gpu_s_per_s,
                "upper_gpu_s_per_s": self.upper_gpu_s_per_s, "physical_gpu_s_per_s": self.physical_gpu_s_per_s,
                "broke_gpu_s_per_s": self.broke_gpu_s_per_s, "basis": self.basis, "reason": self.reason}


def configured_capacity(value: float, source: str = "config") -> CapacityEstimate:
    return CapacityEstimate(value, None, value, None, None, "configured",
                            f"capacity {value:.3g} GPU-s/s per replica from {source}")


# A replica this idle is not slowed by its load: a breach below this share of the physical
# bound is someone else's doing (a cold start, a stuck queue, a bad version), not a bound.
MIN_BREACH_SHARE_OF_PHYSICAL = 0.1


def estimate_capacity(physical: PhysicalBound, held: float | None = None, broke: float | None = None,
                      sustained_minutes: int = 3) -> CapacityEstimate:
    """The per-replica capacity to plan with: the least upper bound the evidence supports.

    The interval is [held, min(physical, broke)]. The point planned on is its upper end,
    because the two ways of being wrong are not alike. Too high shows itself: users wait,
    the autoscaler adds a step at once (fast out), and the load that broke latency becomes
    a tighter upper bound, so the estimate falls to the knee from above within a few
    breaches. Too low never shows itself: a pool sized by a lower bound never runs near
    its limit, so the bound never rises, and calm pools are told to double for good (the
    held load of a quiet night says only "at least this much"). This is optimism in the
    face of uncertainty, and target utilisation, applied on top, is the margin under the
    bound. The held load still matters: a breach at or under a load the pool has held was
    not caused by load (a cold start, a bad version), so it is no bound; nor is one under
    `MIN_BREACH_SHARE_OF_PHYSICAL` of the physical bound.

    Held above the physical bound means the work unit is not GPU time (runtimes that
    time-share a GPU report wall time): the physical bound says nothing then, and the held
    load decides until a breach above it is seen.
    """
    b = broke if (broke is not None and broke >= MIN_BREACH_SHARE_OF_PHYSICAL * physical.gpu_s_per_s
                  and (held is None or broke > held)) else None
    win = f"{sustained_minutes} minutes"
    lower = (f"{held:.3g} held for {win} within SLO is the lower bound" if held is not None
             else "no load held within SLO yet")
    if b is not None and (b < physical.gpu_s_per_s or (held is not None and held >= physical.gpu_s_per_s)):
        return CapacityEstimate(b, held, b, physical.gpu_s_per_s, b, "breach",
                                f"capacity {b:.3g} GPU-s/s per warm replica: the breach bound decided, the lowest load "
                                f"at which latency broke for {win} ({lower}; physical bound {physical.gpu_s_per_s:.3g}, "
                                f"{physical.binds})")
    if held is not None and held >= physical.gpu_s_per_s:
        return CapacityEstimate(held, held, held, physical.gpu_s_per_s, None, "measured-above-physical",
                                f"capacity {held:.3g} GPU-s/s per warm replica: the held load decided, held for {win} "
                                f"within SLO above the physical bound {physical.gpu_s_per_s:.3g} ({physical.binds}), so "
                                "the work unit is not GPU time (wall time on shared GPUs?); no breach seen above it")
    return CapacityEstimate(physical.gpu_s_per_s, held, physical.gpu_s_per_s, physical.gpu_s_per_s, b, "physical",
                            f"capacity {physical.gpu_s_per_s:.3g} GPU-s/s per replica: the physical bound decided "
                            f"({physical.working}); latency never broke for {win} under it, and {lower}, "
                            "only a floor")
