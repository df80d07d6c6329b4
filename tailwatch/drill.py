"""`tailwatch drill zone-loss`: a zone lost, minute by minute, from the store.

The store's closed minutes are replayed through the signal API's own decisions
(tailwatch/backtest.py `replay`), the SLO pages through the SLO engine (slo/sli.py `replay`),
and each minute around the loss is checked against the (z−1)/z capacity math:

- before the loss, was the fleet ready? Each surviving pool's replicas against what its demand
  needs at the target utilisation with headroom to lose one of z zones
  (planning/capacity.py `replicas`, `with_zone_headroom`);
- after it, the surviving z−1 zones carry the lost zone's traffic: each surviving pool needs
  `ceil(demand after the loss ÷ (capacity per replica × target utilisation))` replicas, the
  demand being its mean over the minutes after the loss (hindsight the autoscaler had not);
  the drill says when the autoscaler first asked for that many and when that many were warm;
- shedding: while a surviving pool is under pressure, which rung of the degradation ladder came
  first, and whether any realtime request was refused while batch was still admitted.

Read only, like the backtests. Pure where it can be: `find_zone_loss` and `drill` take frames
and return plain records; `cmd_drill_zone_loss` reads the store and prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tailwatch.alerts.alertmanager import rfc3339
from tailwatch.planning.prices import GpuPrices
from tailwatch.reports.readiness import build_readiness
from tailwatch.planning.capacity import GPU_SECONDS_PER_SECOND_PER_GPU, replicas
from tailwatch.signals.held import MINUTE, minute_col, rollup
from tailwatch.signals.live import LiveSignals, SignalPolicy, pool_minutes
from tailwatch.slo.sli import replay as replay_slos
from tailwatch.slo.spec import SloSpec
from tailwatch.backtest import BacktestError, minutes_of, read_buckets, replay, time_bounds

SILENT_MINUTES = 3  # a zone silent this long while others report is lost
BEFORE_MINUTES = 3  # minutes before the loss the table shows


@dataclass(frozen=True)
class ZoneLoss:
    zone: str
    at_minute: int  # the first minute with nothing from the zone
    zones: tuple[str, ...]  # every zone seen, the lost one included
    last_minute: int  # the store's newest minute in the range

    @property
    def survivors(self) -> tuple[str, ...]:
        return tuple(z for z in self.zones if z != self.zone)


def _minutes(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(minute_col())


def find_zone_loss(requests: pl.DataFrame, gpu: pl.DataFrame, zone: str | None = None) -> ZoneLoss:
    """The zone that fell silent (no requests, no GPU samples) for `SILENT_MINUTES` or more up
    to the newest minute while the others kept reporting; `zone` names it instead."""
    seen = pl.concat([_minutes(f).select("zone", MINUTE) for f in (requests, gpu) if f.height and "zone" in f.columns])
    seen = seen.filter(pl.col("zone").is_not_null() & (pl.col("zone") != ""))
    if seen.height == 0:
        raise BacktestError("no zone labels in that span: a drill needs requests or GPU samples by zone")
    newest = int(seen[MINUTE].max())
    firsts_lasts = seen.group_by("zone").agg(pl.col(MINUTE).min().alias("lo"), pl.col(MINUTE).max().alias("hi"))
    spans = {z: (int(lo), int(hi)) for z, lo, hi in firsts_lasts.iter_rows()}
    zones = tuple(sorted(spans))
    if len(zones) < 2:
        raise BacktestError(f"only one zone ({zones[0]}) in that span: nothing could carry its traffic")
    if zone is not None:
        if zone not in spans:
            raise BacktestError(f"no zone {zone!r} in that span; zones: {', '.join(zones)}")
        if spans[zone][1] >= newest:
            raise BacktestError(f"zone {zone} reported until the newest minute ({rfc3339(newest)}): it was not lost")
        return ZoneLoss(zone, spans[zone][1] + 1, zones, newest)
    silent = sorted((hi + 1, z) for z, (_lo, hi) in spans.items() if newest - hi >= SILENT_MINUTES)
    if not silent or len(silent) == len(zones):
        raise BacktestError(f"no zone went silent while the others reported (zones: {', '.join(zones)}); "
                            "name one with --zone")
    at, lost = silent[0]
    return ZoneLoss(lost, at, zones, newest)


@dataclass
class PoolDrill:
    """One surviving pool across the drill."""

    pool: str
    model: str
    demand_before_gpu_s_per_s: float  # mean over the minutes before the loss
    demand_after_gpu_s_per_s: float  # mean over the minutes after it
    running_before: int  # replicas serving in the minute before the loss
    desired_before: int  # the autoscaler's answer in the minute before the loss
    ready_before: int  # (z−1)/z: replicas its demand before the loss needed to survive losing a zone
    required_after: int  # replicas to carry its demand after the loss at the target utilisation
    asked_more_minute: int | None = None  # first minute ≥ the loss with desired above desired_before
    asked_enough_minute: int | None = None  # first minute ≥ the loss with desired ≥ required_after
    warm_enough_minute: int | None = None  # first minute ≥ the loss with that many warm replicas
    waited_minutes: list[int] = field(default_factory=list)
    pressure_minutes: list[int] = field(default_factory=list)
    first_steps: dict[int, str] = field(default_factory=dict)  # minute → the ladder's first rung that frees load
    realtime_refused_with_batch_admitted: list[int] = field(default_factory=list)  # minutes (should be none)


@dataclass(frozen=True)
class PoolAt:
    """One surviving pool's answers at one minute."""

    pool: PoolDrill
    desired: int
    running: int
    warm: int
    waited: bool
    first_step: str | None  # None: not under pressure
    batch_rejected: int
    realtime_rejected: int


@dataclass(frozen=True)
class DrillRow:
    """One model over the surviving zones, one minute."""

    minute: int
    model: str
    lost_zone_requests: int
    lost_answers_age_min: int | None  # age of the lost zone's pool answers (None: no longer answered)
    demand_gpu_s_per_s: float
    required_replicas: int
    desired_replicas: int
    running_replicas: int  # warm, loading and unknown
    warm_replicas: int
    waited_pools: int  # queue age or first output p95 over its SLO in this minute
    pressure_pools: int
    first_steps: tuple[str, ...]
    batch_rejected: int
    realtime_rejected: int
    pages: tuple[str, ...]  # SLO pages that began this minute


@dataclass
class DrillReport:
    loss: ZoneLoss
    target_utilization: float
    capacity_gpu_s_per_s_per_replica: float
    pools: dict[str, PoolDrill]
    rows: list[DrillRow]
    pages: list[tuple[int, str, str]]  # (minute, SLO, page) that began over the drill, every model
    readiness: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # model → verdict, findings

    def models(self) -> list[str]:
        return sorted({p.model for p in self.pools.values()})


def _page_text(change) -> str:
    slice_ = ",".join(f"{k}={v}" for k, v in sorted(change.labels.items()) if k not in ("slo", "severity", "alertname")
                      and not k.startswith("tw_"))
    return f"{change.severity} {change.alertname} {change.slo}" + (f" [{slice_}]" if slice_ else "")


def replay_pages(specs: list[SloSpec], requests: pl.DataFrame) -> list[tuple[int, str, str]]:
    """(minute, SLO, page) for every SLO alert that began, fed minute by minute as the worker
    feeds closed minutes, so a silent slice's no-data alert fires when the worker's would."""
    if not specs or not requests.height:
        return []
    by_minute = minutes_of(requests)
    changes = replay_slos(specs, (by_minute[m] for m in sorted(by_minute))).changes
    return sorted({(c.at_minute, c.slo, _page_text(c)) for c in changes if c.state == "firing"})


def _slos_of(model: str, workload: str, specs: list[SloSpec]) -> set[str]:
    return {s.name for s in specs if s.selector.get("model", model) == model and s.selector.get("workload", workload) == workload}


def _pool_frames(requests: pl.DataFrame, gpu: pl.DataFrame) -> tuple[dict[str, str], dict[str, str], dict[tuple[str, int], float]]:
    """pool → zone, pool → model, and (pool, minute) → work in GPU-s/s from the requests."""
    zone_of, model_of = {}, {}
    for f in (requests, gpu):
        if f.height:
            for pool, zone, model in f.select("pool", "zone", "model").unique().iter_rows():
                if pool and zone:
                    zone_of.setdefault(pool, zone)
                if pool and model:
                    model_of.setdefault(pool, model)
    work: dict[tuple[str, int], float] = {}
    if requests.height:
        per = _minutes(requests).group_by("pool", MINUTE).agg(pl.col("gpu_seconds").fill_null(0).sum())
        work = {(p, int(m)): float(s) / 60 for p, m, s in per.iter_rows() if p}
    return zone_of, model_of, work


def drill(requests: pl.DataFrame, gpu: pl.DataFrame, loss: ZoneLoss, policy: SignalPolicy | None = None,
          specs: list[SloSpec] | None = None) -> DrillReport:
    """Every minute from the first bucket (earlier ones warm the view up) through the newest:
    the signal API's answers for the surviving pools, checked against the (z−1)/z math."""
    policy = policy or SignalPolicy()
    a = policy.autoscale
    per_replica = a.gpus_per_replica * GPU_SECONDS_PER_SECOND_PER_GPU
    zone_of, model_of, work = _pool_frames(requests, gpu)
    survivors = sorted(p for p, z in zone_of.items() if z in loss.survivors)
    lost_pools = {p for p, z in zone_of.items() if z == loss.zone}
    first_data = min((m for _p, m in work), default=loss.at_minute - 1)
    before = range(max(loss.at_minute - 10, first_data), loss.at_minute)
    after = range(loss.at_minute, loss.last_minute + 1)
    pools: dict[str, PoolDrill] = {}
    for pool in survivors:
        d_before = sum(work.get((pool, m), 0.0) for m in before) / len(before)
        d_after = sum(work.get((pool, m), 0.0) for m in after) / len(after)
        plan = replicas(d_before, a.target_utilization, len(loss.zones), per_replica_capacity=per_replica)
        need = replicas(d_after, a.target_utilization, 1, per_replica_capacity=per_replica).base_replicas
        pools[pool] = PoolDrill(pool, model_of.get(pool, ""), d_before, d_after, 0, 0, plan.with_zone_headroom, need)
    lost_requests = {}
    if requests.height:
        lost = _minutes(requests).filter(pl.col("zone") == loss.zone).group_by(MINUTE).agg(pl.col("requests").sum())
        lost_requests = {int(m): int(n) for m, n in lost.iter_rows()}
    pages = replay_pages(specs or [], requests)
    workload_of = dict(requests.select("model", "workload").unique().iter_rows()) if requests.height else {}
    slos_of = {m: _slos_of(m, w or "", specs or []) for m, w in workload_of.items()}
    live = LiveSignals(policy, specs, GpuPrices())
    # Users waited, minute by minute: queue age or first output p95 over its SLO (backtest autoscale's test).
    waited_at: set[tuple[str, int]] = set()
    if requests.height and gpu.height:
        lo, hi = loss.at_minute - BEFORE_MINUTES, loss.last_minute
        waited_at = {(pm.pool, pm.minute) for pm in pool_minutes(rollup(requests), gpu, lo, hi, live.first_output_slo_ms,
                                                                  a.queue_age_slo_ms) if not pm.latency_held}
    rows: list[DrillRow] = []
    first_minute = loss.at_minute - BEFORE_MINUTES
    for m, snap in replay(requests, gpu, live=live):
        if m < first_minute - 1:
            continue
        lost_ages = [m - snap.pools[p].as_of_minute for p in lost_pools if p in snap.pools]
        by_model: dict[str, list[PoolAt]] = {}
        for pool in survivors:
            scoped, shed = snap.pools.get(pool), snap.shed.get(pool)
            if scoped is None:
                continue
            body, pd = scoped.body, pools[pool]
            warm = int(body.signals.replicas_by_state.get("warm", 0))
            if m == loss.at_minute - 1:
                pd.running_before, pd.desired_before = body.current_replicas, body.desired_replicas
            waited = (pool, m) in waited_at
            step, batch_rej, rt_rej, batch_adm = None, 0, 0, 0
            if shed is not None and shed.body.under_pressure:
                step = next((s.step for s in shed.body.steps if s.load_removed_gpu_s_per_s > 0), "none")
                for g in shed.body.admission.groups:
                    if g.traffic_class == "realtime":
                        rt_rej += g.rejected
                    else:
                        batch_rej += g.rejected
                        batch_adm += g.admitted
            if m >= loss.at_minute:
                if pd.asked_more_minute is None and body.desired_replicas > pd.desired_before:
                    pd.asked_more_minute = m
                if pd.asked_enough_minute is None and body.desired_replicas >= pd.required_after:
                    pd.asked_enough_minute = m
                if pd.warm_enough_minute is None and warm >= pd.required_after:
                    pd.warm_enough_minute = m
                if waited:
                    pd.waited_minutes.append(m)
                if step is not None:
                    pd.pressure_minutes.append(m)
                    pd.first_steps[m] = step
                    if rt_rej and batch_adm:
                        pd.realtime_refused_with_batch_admitted.append(m)
            by_model.setdefault(pd.model, []).append(PoolAt(pd, body.desired_replicas, body.current_replicas, warm,
                                                            waited, step, batch_rej, rt_rej))
        if m < first_minute:
            continue
        for model, at in sorted(by_model.items()):
            rows.append(DrillRow(
                m, model, lost_requests.get(m, 0), max(lost_ages) if lost_ages else None,
                sum(work.get((e.pool.pool, m), 0.0) for e in at), sum(e.pool.required_after for e in at),
                sum(e.desired for e in at), sum(e.running for e in at), sum(e.warm for e in at),
                sum(e.waited for e in at), sum(e.first_step is not None for e in at),
                tuple(sorted({e.first_step for e in at if e.first_step is not None})),
                sum(e.batch_rejected for e in at), sum(e.realtime_rejected for e in at),
                tuple(p for pm, slo, p in pages if pm == m and slo in slos_of.get(model, ())),
            ))
    readiness = {}
    for model in sorted({pd.model for pd in pools.values() if pd.model}):
        verdict = build_readiness(model, requests.filter(pl.col("model") == model), gpu.filter(pl.col("model") == model),
                                  specs or [], GpuPrices(), [], a.queue_age_slo_ms)
        readiness[model] = (verdict.verdict, [f"{f.severity}: {f.what}" for f in verdict.findings])
    return DrillReport(loss, a.target_utilization, per_replica, pools, rows, pages, readiness)


def _after(minute: int | None, at: int) -> str:
    return "never" if minute is None else f"+{minute - at} min"


SUMMARY_COLUMNS = ["pool", "demand before", "running", "desired", "(z-1)/z needs", "demand after", "needs after",
                   "asked more", "asked enough", "warm enough", "users waited (min)", "first shed step",
                   "realtime refused, batch admitted (min)"]
MINUTE_COLUMNS = ["minute", "t", "lost zone req", "lost answers age", "demand GPU-s/s", "needs", "desired", "running",
                  "warm", "pools waiting", "pools shedding", "first step", "batch rejected", "realtime rejected", "pages"]


def summary_rows(report: DrillReport) -> list[list]:
    at = report.loss.at_minute
    out = []
    for pd in report.pools.values():
        steps = sorted(set(pd.first_steps.values()))
        out.append([pd.pool, f"{pd.demand_before_gpu_s_per_s:.2f}", pd.running_before, pd.desired_before,
                    f"{pd.ready_before}" + ("" if pd.running_before >= pd.ready_before else " (short)"),
                    f"{pd.demand_after_gpu_s_per_s:.2f}", pd.required_after,
                    _after(pd.asked_more_minute, at), _after(pd.asked_enough_minute, at), _after(pd.warm_enough_minute, at), len(pd.waited_minutes),
                    ", ".join(steps) or "-", len(pd.realtime_refused_with_batch_admitted)])
    return out


def minute_rows(report: DrillReport, model: str, minutes_after: int) -> list[list]:
    at = report.loss.at_minute
    return [[rfc3339(r.minute)[11:16], f"{r.minute - at:+d}", r.lost_zone_requests,
             "gone" if r.lost_answers_age_min is None else r.lost_answers_age_min, f"{r.demand_gpu_s_per_s:.2f}",
             r.required_replicas, r.desired_replicas, r.running_replicas, r.warm_replicas, r.waited_pools,
             r.pressure_pools, ",".join(r.first_steps) or "-", r.batch_rejected, r.realtime_rejected,
             _pages_cell(r.pages)]
            for r in report.rows if r.model == model and r.minute - at <= minutes_after]


def _pages_cell(pages: tuple[str, ...]) -> str:
    """Alerts that began, counted by kind and SLO: `4× page llm-realtime-first-token`."""
    counts: dict[str, int] = {}
    for page in pages:
        severity, alertname, slo = page.split(" ")[:3]
        kind = "no-data" if alertname == "SLONoData" else severity
        counts[f"{kind} {slo}"] = counts.get(f"{kind} {slo}", 0) + 1
    return "; ".join(f"{n}× {what}" for what, n in counts.items()) or "-"


def verdict_lines(report: DrillReport) -> list[str]:
    """The drill's findings in sentences: the autoscaler, the fleet against the math, shedding."""
    at, pools = report.loss.at_minute, list(report.pools.values())
    late = [pd.pool for pd in pools if pd.asked_enough_minute is None]
    asked = [pd.asked_enough_minute - at for pd in pools if pd.asked_enough_minute is not None]
    already = sum(pd.desired_before >= pd.required_after for pd in pools)
    raised = [pd.asked_more_minute - at for pd in pools if pd.asked_more_minute is not None]
    out = ["autoscaler: " + (f"every surviving pool was asked for what it needs after the loss by +{max(asked)} min"
                             if not late else f"never asked for what they need after the loss: {', '.join(late)}")
           + f" ({already} of {len(pools)} already before it, from the zone headroom in its answer)"
           + (f"; answers rose within +{max(raised)} min where the loss added demand" if raised else "")]
    short = [pd for pd in pools if pd.running_before < pd.ready_before]
    if short:
        out.append(f"fleet: {len(short)} pool(s) ran short of the (z-1)/z headroom before the loss ("
                   + ", ".join(f"{pd.pool} {pd.running_before} of {pd.ready_before}" for pd in short) + ")")
    else:
        out.append("fleet: every surviving pool ran the (z-1)/z headroom before the loss")
    for pd in pools:
        if pd.waited_minutes:
            warm = "never" if pd.warm_enough_minute is None else f"+{pd.warm_enough_minute - at} min"
            out.append(f"  {pd.pool}: users waited {len(pd.waited_minutes)} min (+{min(pd.waited_minutes) - at} to "
                       f"+{max(pd.waited_minutes) - at}); enough replicas warm at {warm}")
    refused = [pd.pool for pd in pools if pd.realtime_refused_with_batch_admitted]
    steps = sorted({step for pd in pools for step in pd.first_steps.values()})
    out.append("shedding: " + (f"first rung {', '.join(steps)}; " if steps else "no pool under pressure; ")
               + ("no realtime request refused while batch was admitted" if not refused else
                  f"realtime refused while batch was admitted in {', '.join(refused)}"))
    return out


def cmd_drill_zone_loss(store_path: str, zone: str | None, start: str | None, end: str | None,
                        specs: list[SloSpec] | None, models: list[str] | None, minutes_after: int,
                        fmt: str = "table") -> int:
    from tailwatch.table import render

    a, b = time_bounds(start, end)
    policy = SignalPolicy()
    req, gpu = read_buckets(store_path, a, b, warmup_minutes=policy.history_minutes)
    if not req.height and not gpu.height:
        raise BacktestError(f"{store_path}: no buckets in that span")
    loss = find_zone_loss(req, gpu, zone)
    report = drill(req, gpu, loss, policy, specs)
    if not report.pools:
        raise BacktestError(f"no pool in the surviving zones ({', '.join(loss.survivors)}) answered")
    z = len(loss.zones)
    print(f"zone-loss drill: {loss.zone} silent from {rfc3339(loss.at_minute)}; {z - 1} of {z} zones "
          f"({', '.join(loss.survivors)}) carry its traffic; capacity {report.capacity_gpu_s_per_s_per_replica:g} GPU-s/s "
          f"per replica at {report.target_utilization:.0%} target utilisation")
    print(f"(z-1)/z needs = replicas the demand before the loss needed with headroom to lose 1 of {z} zones; needs after = "
          f"ceil(mean demand after the loss ÷ ({report.capacity_gpu_s_per_s_per_replica:g} × {report.target_utilization:g}))")
    print(render(SUMMARY_COLUMNS, summary_rows(report), fmt))
    for model in models or report.models():
        rows = minute_rows(report, model, minutes_after)
        if rows:
            print(f"\n{model}, surviving zones, minute by minute (t = minutes from the loss)")
            print(render(MINUTE_COLUMNS, rows, fmt))
    if fmt == "table":
        print()
        for line in verdict_lines(report):
            print(line)
        later = [f"{rfc3339(m)[11:16]} {p}" for m, _slo, p in report.pages if m >= loss.at_minute]
        print(f"SLO alerts from the loss on: {len(later)}" + "".join(f"\n  {p}" for p in later[:30])
              + (f"\n  ... {len(later) - 30} more" if len(later) > 30 else ""))
        print("readiness over the same span (`report readiness`):")
        for model, (verdict, findings) in report.readiness.items():
            print(f"  {model}: {verdict}" + "".join(f"\n    {f}" for f in findings))
    return 0
