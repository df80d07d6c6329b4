"""Capacity math: replicas for a demand, zone-loss headroom, KV-cache bytes per request.

Pure functions that return their working as well as their answer, so that the command
line can print how a number came about and the autoscaler can give it as a reason.

- Replicas: demand in work-seconds per second (concurrent streams × GPU-seconds per
  second of audio, or tokens per second × GPU-seconds per token) ÷ (per-replica capacity
  × target utilisation). To survive losing one of Z zones, the remaining Z − 1 zones
  must carry everything: total = ceil(base × Z ÷ (Z − 1)).
- KV cache: layers × tokens × 2 (K and V) × KV heads × head dim × bytes per value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


class SustainedCapacity:
    """Per pool, the most work per warm replica sustained for `sustained_minutes`
    consecutive minutes with latency held: the measured per-replica capacity at SLO.

    Kept as the best value per UTC day for `history_days`, so a pool measured at its daily
    peak keeps that figure through the night, and a change of model or hardware ages out.
    Until a pool has been measured near its limit this is a lower bound, which makes the
    autoscaler ask for more replicas than needed, never fewer.
    """

    def __init__(self, sustained_minutes: int = 3, history_days: int = 7):
        self.sustained_minutes = sustained_minutes
        self.history_days = history_days
        self._run: dict[str, list[PoolMinute]] = {}  # consecutive held minutes, newest last
        self.best_by_day: dict[str, dict[int, float]] = {}

    def observe(self, m: PoolMinute) -> float | None:
        """Feed minutes in order per pool; returns the pool's new best of the day, if it rose."""
        run = self._run.setdefault(m.pool, [])
        if run and m.minute != run[-1].minute + 1:
            run.clear()
        if not (m.latency_held and m.warm_replicas > 0):
            run.clear()
            return None
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

    def capacity(self, pool: str, now_minute: int) -> float | None:
        days = self.best_by_day.get(pool, {})
        recent = [v for d, v in days.items() if d > now_minute // 1440 - self.history_days]
        return max(recent) if recent else None

    def restore(self, pool: str, day: int, best: float) -> None:
        days = self.best_by_day.setdefault(pool, {})
        days[day] = max(best, days.get(day, 0.0))
