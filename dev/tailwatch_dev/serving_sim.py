"""A pool of LLM replicas serving a minute series of requests, and Kubernetes' HPA on GPU
utilisation: the model `tailwatch backtest autoscale --trace` runs autoscalers against.

It is a model, not a measurement. Its assumptions:

- Time moves in 1-minute steps. A controller decides at the end of minute t from what minute
  t showed; a replica it adds is paid for at once and serves from minute t + 1 +
  `startup_minutes` (loading a model); a replica it removes stops at once (the newest first,
  loading ones before ready ones).
- A replica serves `slots` sequences at once (continuous batching). The trace replay charges a
  request its duration ÷ 8 in GPU time (ingest/trace.py), so one replica's 1 GPU-s/s of work is
  8 sequences in flight; work utilisation = sequences in flight ÷ slots.
- A minute's requests arrive as a Poisson stream and each holds a slot for its duration
  (prefill and decode at the trace replay's per-token times). Waiting is M/M/c with c = ready
  replicas × slots: the p95 wait follows from Erlang C. Offered load at or above c does not
  fit: the excess waits in a backlog carried into the next minute (in sequence-seconds).
- A minute is over SLO when its p95 wait passes the queue-age SLO or a backlog is left.
- NVML's GPU utilisation is the share of time any kernel runs, so a replica with one sequence
  in flight reads busy. With L sequences in flight per replica on average, taken as a Poisson
  count, it reads 1 − e^(−L): 100% long before the batch is full. `work_utilization` is the
  other reading (what SM activity or tailwatch's GPU-seconds measure).
- The HPA is Kubernetes' algorithm on one metric, its mean over ready replicas: desired =
  ceil(current × metric ÷ target), left unchanged within `tolerance` of the target;
  scale-down is stabilised (the highest recommendation of the last `scale_down_window_minutes`),
  scale-up is not (the default behaviour), and replicas stay within [min, max]. The real HPA
  syncs every 15 s; here once a minute.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass(frozen=True)
class MinuteLoad:
    arrivals: int
    mean_service_s: float  # how long a request holds a slot, on average


@dataclass(frozen=True)
class ServedMinute:
    minute: int
    ready: int
    starting: int
    arrivals: int
    offered_erlangs: float  # sequences wanting a slot, on average (this minute's and the backlog's)
    in_flight: float  # sequences served at once, on average
    work_utilization: float  # in_flight ÷ slots of the ready replicas
    nvml_utilization: float  # the share of time a kernel runs, averaged over ready replicas
    p95_wait_s: float  # inf: the load did not fit
    backlog_s: float  # sequence-seconds left waiting at the minute's end
    over_slo: bool

    @property
    def paid_replicas(self) -> int:
        return self.ready + self.starting


def erlang_c(servers: int, erlangs: float) -> float:
    """The probability that an arrival waits in an M/M/c queue (1 where the load does not fit)."""
    if erlangs <= 0:
        return 0.0
    if servers <= erlangs:
        return 1.0
    b = 1.0  # Erlang B by its stable recursion
    for k in range(1, servers + 1):
        b = erlangs * b / (k + erlangs * b)
    return servers * b / (servers - erlangs * (1 - b))


def p95_wait_s(servers: int, erlangs: float, mean_service_s: float) -> float:
    """The 95th percentile of an M/M/c queue's wait: P(wait > t) = C·e^(−(c − a)t/S)."""
    if erlangs <= 0:
        return 0.0
    if servers <= erlangs:
        return math.inf
    c = erlang_c(servers, erlangs)
    return 0.0 if c <= 0.05 else math.log(c / 0.05) * mean_service_s / (servers - erlangs)


def serve_minute(minute: int, ready: int, starting: int, load: MinuteLoad, backlog_s: float, slots: int,
                 wait_slo_s: float) -> ServedMinute:
    """One minute of a pool with `ready` replicas, the backlog before it included."""
    servers = ready * slots
    offered = load.arrivals * load.mean_service_s / 60.0 + backlog_s / 60.0
    in_flight = min(offered, float(servers))
    left = (offered - in_flight) * 60.0
    wait = p95_wait_s(servers, offered, load.mean_service_s or 1.0)
    per_replica = in_flight / ready if ready else 0.0
    return ServedMinute(minute, ready, starting, load.arrivals, offered, in_flight,
                        in_flight / servers if servers else (1.0 if offered else 0.0),
                        1.0 - math.exp(-per_replica) if ready else 0.0, wait, left,
                        wait > wait_slo_s or left > 0)


@dataclass
class Hpa:
    """Kubernetes' HorizontalPodAutoscaler on one utilisation metric (see the module doc)."""

    target: float = 0.7
    tolerance: float = 0.1
    scale_down_window_minutes: int = 5
    min_replicas: int = 1
    max_replicas: int = 10_000
    _recommended: deque = field(default_factory=deque)  # (minute, recommendation)

    def raw(self, current: int, metric: float) -> int:
        """desired = ceil(current × metric ÷ target), or current within the tolerance."""
        ratio = metric / self.target
        if abs(ratio - 1.0) <= self.tolerance:
            return current
        return math.ceil(current * ratio - 1e-9)

    def decide(self, minute: int, current: int, metric: float) -> int:
        wanted = min(max(self.raw(current, metric), self.min_replicas), self.max_replicas)
        self._recommended.append((minute, wanted))
        while self._recommended[0][0] <= minute - self.scale_down_window_minutes:
            self._recommended.popleft()
        return max(wanted, min(current, max(r for _, r in self._recommended)))


# A controller: (the minute just served, replicas paid for now) → replicas wanted.
Controller = Callable[[ServedMinute, int], int]


@dataclass(frozen=True)
class SimResult:
    minutes: tuple[ServedMinute, ...]

    @property
    def replica_hours(self) -> float:
        """Replicas paid for (ready or loading), integrated over the minutes."""
        return sum(m.paid_replicas for m in self.minutes) / 60.0

    @property
    def minutes_over_slo(self) -> int:
        return sum(m.over_slo for m in self.minutes)


def simulate(loads: Sequence[MinuteLoad], controller: Controller, initial_replicas: int, slots: int = 8,
             startup_minutes: int = 2, wait_slo_s: float = 1.0) -> SimResult:
    """Serve `loads` minute by minute, letting `controller` resize the pool after each."""
    ready, backlog = initial_replicas, 0.0
    loading: deque = deque()  # [minute it serves from, count], oldest first
    out = []
    for t, load in enumerate(loads):
        while loading and loading[0][0] <= t:
            ready += loading.popleft()[1]
        starting = sum(n for _, n in loading)
        served = serve_minute(t, ready, starting, load, backlog, slots, wait_slo_s)
        out.append(served)
        backlog = served.backlog_s
        wanted, paid = max(0, controller(served, ready + starting)), ready + starting
        if wanted > paid:
            loading.append([t + 1 + startup_minutes, wanted - paid])
        while wanted < paid and loading:  # the newest loading ones go first
            drop = min(loading[-1][1], paid - wanted)
            loading[-1][1] -= drop
            paid -= drop
            if not loading[-1][1]:
                loading.pop()
        if wanted < paid:
            ready -= paid - wanted
    return SimResult(tuple(out))
