"""`tailwatch backtest autoscale --trace`: a public trace (or a diurnal week built from it)
served by a simulated pool (planning/serving_sim.py) under tailwatch's autoscaler and under
Kubernetes' HPA on GPU utilisation, replica-hours and minutes over SLO side by side.

tailwatch's controller is the signal API's own decision (`signals.autoscale.Autoscaler`),
fed what its worker would measure of the simulated minute: the work served in GPU-seconds
per second, the queue-age p95 and the replicas ready and loading, with a replica's capacity
configured at its physical bound (1 GPU-s/s). The HPA runs twice: on NVML utilisation (what
the dcgm-exporter's `DCGM_FI_DEV_GPU_UTIL` reads) and on work utilisation (an ideal metric
that reads how full each replica's batch is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from tailwatch_dev.trace import DECODE_MS_PER_TOKEN, PREFILL_MS_PER_TOKEN, read_any_trace
from tailwatch_dev.serving_sim import Controller, Hpa, MinuteLoad, ServedMinute, SimResult, simulate
from tailwatch.signals.autoscale import Autoscaler, AutoscalePolicy, PoolSignals
from tailwatch_dev.traces import AZURE_CODE_TRACE, MOONCAKE_TRACE

TRACES = {"azure-code": AZURE_CODE_TRACE, "mooncake": MOONCAKE_TRACE}
SLOTS_PER_REPLICA = 8  # the trace replay's GPU time is a request's duration ÷ 8
WEEK_MINUTES = 7 * 1440


def service_s(prompt_tokens: int, output_tokens: int) -> float:
    """How long a request holds a slot: prefill and decode at the trace replay's per-token times."""
    return (60.0 + prompt_tokens * PREFILL_MS_PER_TOKEN + output_tokens * DECODE_MS_PER_TOKEN) / 1000.0


def trace_minutes(path: str | Path, rate_scale: float = 1.0) -> list[MinuteLoad]:
    """A trace's requests per minute of arrival and their mean service time; `rate_scale`
    multiplies the arrivals (the same requests, more of them: a bigger fleet's share)."""
    rows = read_any_trace(path)
    n = rows[-1][0] // 60_000 + 1
    counts, seconds = [0] * n, [0.0] * n
    for at_ms, prompt, output in rows:
        counts[at_ms // 60_000] += 1
        seconds[at_ms // 60_000] += service_s(prompt, output)
    return [MinuteLoad(round(c * rate_scale), s / c if c else 0.0) for c, s in zip(counts, seconds)]


def diurnal_factor(minute_of_week: int) -> float:
    """Traffic relative to the busiest hour: a trough of 25% at 03:00 and the peak at 15:00
    (a raised cosine), weekends (days 6 and 7) at 60% of a weekday."""
    hour = (minute_of_week % 1440) / 60.0
    day = 0.25 + 0.75 * (1 - math.cos(2 * math.pi * (hour - 3) / 24)) / 2
    return day * (0.6 if minute_of_week // 1440 >= 5 else 1.0)


def diurnal_week(hour: list[MinuteLoad]) -> list[MinuteLoad]:
    """A week of minutes: the trace's minutes in turn, each scaled by the time of day and week."""
    return [replace(hour[t % len(hour)], arrivals=round(hour[t % len(hour)].arrivals * diurnal_factor(t)))
            for t in range(WEEK_MINUTES)]


def tailwatch_controller(policy: AutoscalePolicy, pool: str = "trace") -> Controller:
    autoscaler = Autoscaler(policy)

    def decide(m: ServedMinute, paid: int) -> int:
        work = m.in_flight / SLOTS_PER_REPLICA  # GPU-seconds per second served
        queue_ms = 60_000.0 if math.isinf(m.p95_wait_s) else m.p95_wait_s * 1000.0
        signals = PoolSignals(pool, m.minute, m.arrivals / 60.0, work, 0.0, 0.0, round(m.in_flight), queue_ms,
                              None, None, None, 100.0 * m.nvml_utilization,
                              {"warm": m.ready, "loading": m.starting})
        return autoscaler.decide(signals, capacity=1.0).desired_replicas

    return decide


def hpa_controller(metric: str, target: float = 0.7) -> Controller:
    hpa = Hpa(target=target)

    def decide(m: ServedMinute, paid: int) -> int:
        return hpa.decide(m.minute, paid, m.nvml_utilization if metric == "nvml" else m.work_utilization)

    return decide


@dataclass(frozen=True)
class Row:
    trace: str
    controller: str
    result: SimResult


def controllers() -> dict[str, Controller]:
    """Each controller by the name the table prints (fresh state each call)."""
    return {
        "HPA, NVML GPU utilisation 70%": hpa_controller("nvml"),
        "HPA, work utilisation 70%": hpa_controller("work"),
        "tailwatch (zone headroom, 3 zones)": tailwatch_controller(AutoscalePolicy()),
        "tailwatch (no zone headroom)": tailwatch_controller(AutoscalePolicy(zones=1)),
    }


def run(name: str, loads: list[MinuteLoad], startup_minutes: int = 2) -> list[Row]:
    rows = []
    for label, controller in controllers().items():
        initial = max(1, math.ceil(loads[0].arrivals * loads[0].mean_service_s / 60.0 / SLOTS_PER_REPLICA / 0.7))
        rows.append(Row(name, label, simulate(loads, controller, initial, SLOTS_PER_REPLICA, startup_minutes)))
    return rows


def cmd_backtest_trace(trace: str, week: bool, rate_scale: float, startup_minutes: int, fmt: str = "table") -> int:
    from tailwatch.cli import CliError
    from tailwatch.table import render

    path = TRACES.get(trace, trace)
    if not Path(path).is_file():
        raise CliError(f"--trace {trace}: not a file nor one of {', '.join(TRACES)}")
    loads = trace_minutes(path, rate_scale)
    name = f"{trace}{' (diurnal week)' if week else ''} ×{rate_scale:g}"
    if week:
        loads = diurnal_week(loads)
    rows = run(name, loads, startup_minutes)
    hpa = rows[0].result
    table = [[r.trace, r.controller, len(r.result.minutes), f"{r.result.replica_hours:.1f}",
              f"{(r.result.replica_hours / hpa.replica_hours - 1) * 100:+.1f}%", r.result.minutes_over_slo,
              max(m.paid_replicas for m in r.result.minutes)] for r in rows]
    print(f"{name}: {sum(l.arrivals for l in loads):,} requests over {len(loads):,} minutes; {SLOTS_PER_REPLICA} "
          f"sequences per replica, {startup_minutes} min to load a replica, over SLO = queue-wait p95 > 1 s or "
          "a backlog (planning/serving_sim.py states the model)")
    print(render(["trace", "controller", "minutes", "replica_h", "vs_hpa_nvml", "min_over_slo", "max_replicas"],
                 table, fmt))
    return 0
