"""Cascaded pipelines: the phase that limits throughput, and a greedy plan of workers per phase.

A pipeline (feature extraction → acoustic model → language model → post-processing, or any
chain) is profiled phase by phase; this module owns the arithmetic over those profiles.

- Capacity = workers × per-worker throughput, batch_size × 1000 ÷ service_ms rps. The
  phase with the least capacity is the bottleneck (ties: the earlier phase). Usable
  capacity = capacity × target_utilisation; a plan's throughput_rps is the least usable
  capacity over its phases, what the pipeline carries with no phase busier than planned.
- Latency of a phase at ρ = target_rps ÷ capacity: bare ÷ (1 − ρ), the M/M/1 inflation of
  the measured p95 (service_ms where unmeasured); infinite at ρ ≥ 1. Pipeline latency is
  the sum over phases. Both overstate (p95s do not add; M/M/c queues wait less than
  M/M/1), so the plan errs towards more workers, not fewer.
- Greedy plan: one worker per phase; then, while some phase's usable capacity is short of
  the target, add a worker to the bottleneck; while the latency bound fails, add one to
  the phase whose extra worker cuts pipeline latency most (in ms, not per dollar); then
  "target met". A phase at max_workers_per_phase stops it ("max workers"); an addition
  past the budget stops it ("budget"), and the working says what the target costs without
  the budget. Bare latencies that already reach the bound stop it at once ("latency bound").
- Cost: one GPU per GPU worker at GpuPrices for its SKU; CPU workers at a flat price per
  worker-hour. Given gpu_types, each GPU phase runs on the SKU cheapest per request (price
  ÷ per-worker throughput there), or on the fastest when the cheapest make the latency
  bound unreachable; service time and p95 on SKU s = measured × speed[measured] ÷ speed[s].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailwatch.planning.prices import GpuPrices

# Rough relative inference throughput per GPU (H100 = 1); measured figures should override.
DEFAULT_GPU_SPEED = {"H200": 1.3, "H100": 1.0, "A100": 0.45, "L40S": 0.4, "A10G": 0.15, "L4": 0.12, "T4": 0.06}
# Float products such as 10 × 50 × 0.8 land a hair off 400; within this fraction counts as met.
_EPS = 1e-9


@dataclass(frozen=True)
class PhaseProfile:
    stage: str
    device: str                 # "cpu" or "gpu"
    service_ms: float           # one worker's time per request (per batch when batch_size > 1)
    batch_size: float = 1.0     # requests served together per service_ms (mean measured batch)
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None   # measured; when None, service_ms stands in
    latency_p99_ms: float | None = None
    measured_rps: float | None = None     # throughput observed over the profile window
    workers: int | None = None            # workers observed (None: unknown)
    utilisation: float | None = None      # observed busy fraction in [0, 1]
    queue_ms_p95: float | None = None
    gpu_sku: str | None = None            # the SKU it was measured on (GPU phases)

    def __post_init__(self) -> None:
        at = f"stage {self.stage!r}:"
        _require(self.device in ("cpu", "gpu"), f"{at} device must be 'cpu' or 'gpu', not {self.device!r}")
        _require(self.service_ms > 0, f"{at} service_ms must be positive, not {self.service_ms}")
        _require(self.batch_size >= 1, f"{at} batch_size must be at least 1, not {self.batch_size}")
        _require(self.utilisation is None or 0 <= self.utilisation <= 1,
                 f"{at} utilisation must be in [0, 1], not {self.utilisation}")

    @property
    def throughput_per_worker_rps(self) -> float:
        return self.batch_size * 1000.0 / self.service_ms

    @property
    def bare_latency_ms(self) -> float:
        return self.latency_p95_ms if self.latency_p95_ms is not None else self.service_ms


@dataclass(frozen=True)
class Bottleneck:
    stage: str
    capacity_rps: float
    evidence: list[str]


@dataclass(frozen=True)
class PlanConstraints:
    target_rps: float
    max_latency_ms: float | None = None   # end-to-end bound on the sum of phase latencies
    budget_usd_per_hour: float | None = None
    gpu_types: tuple[str, ...] = ()       # candidate SKUs for GPU phases (empty: the measured SKU)
    target_utilisation: float = 0.8
    max_workers_per_phase: int = 1000

    def __post_init__(self) -> None:
        _require(self.target_rps > 0, f"target_rps must be positive, not {self.target_rps}")
        _require(0 < self.target_utilisation <= 1, f"target_utilisation must be in (0, 1], not {self.target_utilisation}")
        _require(self.max_workers_per_phase >= 1, f"max_workers_per_phase must be at least 1: {self.max_workers_per_phase}")
        _require(self.budget_usd_per_hour is None or self.budget_usd_per_hour >= 0,
                 f"budget_usd_per_hour must not be negative, not {self.budget_usd_per_hour}")


@dataclass(frozen=True)
class PhasePlan:
    stage: str
    device: str
    gpu_sku: str | None
    workers: int
    capacity_rps: float
    utilisation: float       # target_rps / capacity (above 1 when the plan stopped short)
    latency_ms: float        # bare ÷ (1 − utilisation); infinite at utilisation ≥ 1
    usd_per_hour: float


@dataclass(frozen=True)
class Plan:
    stages: list[PhasePlan]
    throughput_rps: float            # least usable capacity: min over phases of capacity × target_utilisation
    latency_ms: float                # sum of phase latencies at target_rps
    usd_per_hour: float
    usd_per_request: float | None    # usd_per_hour / (3600 × min(target, throughput)); None if that is 0
    bottleneck: str
    met: bool                        # target, latency bound and budget all met
    stopped_by: str                  # "target met" | "budget" | "latency bound" | "max workers"
    working: list[str]


@dataclass(frozen=True)
class _Phase:  # a profile resolved to the SKU it is planned on
    name: str
    device: str
    gpu_sku: str | None
    per_worker_rps: float
    bare_ms: float
    usd_per_worker_hour: float


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _rps(x: float) -> str:
    return f"{x:,.1f}".rstrip("0").rstrip(".")


def _ms(x: float) -> str:
    """Milliseconds to a tenth at most: measured latencies are histogram bin values (80.4685)."""
    return f"{x:,.1f}".rstrip("0").rstrip(".")


def _argmin(xs: list[float]) -> int:
    return min(range(len(xs)), key=lambda i: xs[i])  # min keeps the first of equals: pipeline order


def _check_profiles(profiles: list[PhaseProfile]) -> None:
    _require(bool(profiles), "no stage profiles given")
    names = [p.stage for p in profiles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    _require(not dupes, f"duplicate stage names: {', '.join(dupes)}")


def bottleneck(profiles: list[PhaseProfile], workers: dict[str, int] | None = None) -> Bottleneck:
    _check_profiles(profiles)
    workers = workers or {}
    unknown = sorted(set(workers) - {p.stage for p in profiles})
    _require(not unknown, f"workers given for unknown stages: {', '.join(unknown)}")
    counts = [workers.get(p.stage, p.workers or 1) for p in profiles]
    _require(min(counts) >= 1, "workers per stage must be at least 1")
    caps = [n * p.throughput_per_worker_rps for n, p in zip(counts, profiles)]
    i = _argmin(caps)
    p, cap = profiles[i], caps[i]
    said = f"{p.stage} has the least capacity: {counts[i]} × {_rps(p.throughput_per_worker_rps)} rps = {_rps(cap)} rps"
    if len(profiles) > 1:
        j = _argmin([c if k != i else math.inf for k, c in enumerate(caps)])
        said += f"; next-smallest {profiles[j].stage} at {_rps(caps[j])} rps ({caps[j] / cap:.2f}× as much)"
    evidence = [said]
    if p.utilisation is not None:
        evidence.append(f"{p.stage} observed {p.utilisation:.0%} busy"
                        + (f" carrying {_rps(p.measured_rps)} rps" if p.measured_rps is not None else ""))
    if p.queue_ms_p95 is not None:
        evidence.append(f"{p.stage} p95 queue wait {p.queue_ms_p95:g} ms")
    total = sum(q.bare_latency_ms for q in profiles)
    evidence.append(f"{p.stage} p95 {_ms(p.bare_latency_ms)} ms is {p.bare_latency_ms / total:.0%} of the pipeline's "
                    f"{_ms(total)} ms (sum of stage p95s, service time where unmeasured)")
    return Bottleneck(p.stage, cap, evidence)


def _resolve(p: PhaseProfile, c: PlanConstraints, prices: GpuPrices, cpu_usd: float,
             speed: dict[str, float], working: list[str], fastest: bool = False) -> _Phase:
    if p.device == "cpu":
        return _Phase(p.stage, "cpu", None, p.throughput_per_worker_rps, p.bare_latency_ms, cpu_usd)
    if not c.gpu_types:
        return _Phase(p.stage, "gpu", p.gpu_sku, p.throughput_per_worker_rps, p.bare_latency_ms,
                      prices.usd_per_gpu_second(p.gpu_sku) * 3600)
    _require(p.gpu_sku in speed, f"stage {p.stage!r}: measured GPU {p.gpu_sku!r} has no speed to scale from")
    options = []
    for sku in c.gpu_types:
        factor = speed[sku] / speed[p.gpu_sku]
        options.append(_Phase(p.stage, "gpu", sku, p.throughput_per_worker_rps * factor, p.bare_latency_ms / factor,
                              prices.usd_per_gpu_second(sku) * 3600))
    per_m = [o.usd_per_worker_hour / (3.6e-3 * o.per_worker_rps) for o in options]  # dollars per million requests
    best = options[_argmin([-o.per_worker_rps for o in options] if fastest else per_m)]
    working.append(f"{p.stage} on {best.gpu_sku}: {'fastest' if fastest else 'cheapest per request at full load'} ("
                   + ", ".join(f"{o.gpu_sku} ${m:,.3g}/M" for o, m in zip(options, per_m)) + ")")
    return best


def _resolve_all(profiles: list[PhaseProfile], c: PlanConstraints, prices: GpuPrices, cpu_usd: float,
                 speed: dict[str, float], working: list[str]) -> list[_Phase]:
    phases = [_resolve(p, c, prices, cpu_usd, speed, working) for p in profiles]
    bare = sum(s.bare_ms for s in phases)
    if not c.gpu_types or c.max_latency_ms is None or bare < c.max_latency_ms:
        return phases
    # slow cheap GPUs can put the bound out of reach at any worker count; faster ones may not
    working.append(f"on the cheapest GPUs the stage latencies alone sum to {bare:,.1f} ms, not under the "
                   f"{c.max_latency_ms:g} ms bound: GPU stages move to the fastest type")
    return [_resolve(p, c, prices, cpu_usd, speed, working, fastest=True) for p in profiles]


def _phase_latency(s: _Phase, workers: int, target_rps: float) -> float:
    rho = target_rps / (workers * s.per_worker_rps)
    return s.bare_ms / (1 - rho) if rho < 1 else math.inf


def _latency(phases: list[_Phase], counts: list[int], target_rps: float) -> float:
    return sum(_phase_latency(s, n, target_rps) for s, n in zip(phases, counts))


def _cost(phases: list[_Phase], counts: list[int]) -> float:
    return sum(n * s.usd_per_worker_hour for s, n in zip(phases, counts))


def _greedy(phases: list[_Phase], counts: list[int], c: PlanConstraints, budget: float | None,
            working: list[str]) -> str:
    """Add workers in place until a stop; returns why it stopped."""
    t = c.target_rps
    while True:
        caps = [n * s.per_worker_rps for s, n in zip(phases, counts)]
        short = min(caps) * c.target_utilisation < t * (1 - _EPS)
        latency = _latency(phases, counts, t)
        if not short and (c.max_latency_ms is None or latency <= c.max_latency_ms):
            return "target met"
        if short:
            i = _argmin(caps)
        else:
            cuts = [_phase_latency(s, n, t) - _phase_latency(s, n + 1, t) for s, n in zip(phases, counts)]
            i = max(range(len(cuts)), key=lambda k: cuts[k])
        s = phases[i]
        if counts[i] >= c.max_workers_per_phase:
            working.append(f"stop: {s.name} is at the {c.max_workers_per_phase} workers allowed per stage")
            return "max workers"
        cost = _cost(phases, counts) + s.usd_per_worker_hour
        if budget is not None and cost > budget * (1 + _EPS):
            working.append(f"stop: 1 more {s.name} worker would cost ${cost:,.2f}/h, over the ${budget:,.2f}/h budget")
            return "budget"
        counts[i] += 1
        change = (f"bottleneck {_rps(caps[i])} rps → {_rps(caps[i] + s.per_worker_rps)} rps" if short else
                  f"pipeline latency {latency:,.1f} ms → {_latency(phases, counts, t):,.1f} ms")
        working.append(f"add 1 {s.name} worker ({change}), ${cost:,.2f}/h")


def _shortfall(phases: list[_Phase], counts: list[int], c: PlanConstraints, budget: float) -> str:
    more = list(counts)
    end = _greedy(phases, more, c, None, [])
    need = _cost(phases, more)
    if end != "target met":
        return f"even without the budget the plan stops ({end}) at ${need:,.2f}/h"
    return f"the target needs ${need:,.2f}/h: ${need - budget:,.2f}/h more than the ${budget:,.2f}/h budget"


def plan_phases(profiles: list[PhaseProfile], constraints: PlanConstraints, prices: GpuPrices,
                cpu_usd_per_worker_hour: float = 0.10, gpu_speed: dict[str, float] | None = None) -> Plan:
    _check_profiles(profiles)
    c, speed = constraints, gpu_speed if gpu_speed is not None else DEFAULT_GPU_SPEED
    missing = [sku for sku in c.gpu_types if not speed.get(sku, 0) > 0]
    _require(not missing, f"no relative speed for GPU types: {', '.join(missing)} (give gpu_speed)")
    working: list[str] = []
    phases = _resolve_all(profiles, c, prices, cpu_usd_per_worker_hour, speed, working)
    bare = sum(s.bare_ms for s in phases)
    counts = [1] * len(phases)
    working.append(f"start: 1 worker per stage, ${_cost(phases, counts):,.2f}/h")
    if c.max_latency_ms is not None and bare >= c.max_latency_ms:
        working.append(f"stop: the stage latencies alone sum to {bare:,.1f} ms, not under the {c.max_latency_ms:g} ms "
                       "bound; no number of workers can meet it")
        stopped = "latency bound"
    elif c.budget_usd_per_hour is not None and _cost(phases, counts) > c.budget_usd_per_hour * (1 + _EPS):
        working.append(f"stop: one worker per stage is already over the ${c.budget_usd_per_hour:,.2f}/h budget")
        stopped = "budget"
    else:
        stopped = _greedy(phases, counts, c, c.budget_usd_per_hour, working)
    if stopped == "budget":
        working.append(_shortfall(phases, counts, c, c.budget_usd_per_hour))
    return _assemble(phases, counts, c, stopped, working)


def _assemble(phases: list[_Phase], counts: list[int], c: PlanConstraints, stopped: str, working: list[str]) -> Plan:
    t = c.target_rps
    caps = [n * s.per_worker_rps for s, n in zip(phases, counts)]
    rows = [PhasePlan(s.name, s.device, s.gpu_sku, n, cap, t / cap, _phase_latency(s, n, t), n * s.usd_per_worker_hour)
            for s, n, cap in zip(phases, counts, caps)]
    throughput = min(caps) * c.target_utilisation
    cost = sum(r.usd_per_hour for r in rows)
    served = min(t, throughput)
    per_request = cost / (3600 * served) if served > 0 else None
    return Plan(rows, throughput, sum(r.latency_ms for r in rows), cost, per_request,
                phases[_argmin(caps)].name, stopped == "target met", stopped, working)
