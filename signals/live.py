"""The live view the signal API answers from: recent buckets → per-pool autoscale decisions,
per-version rollout verdicts, SLO and alert reads, each tagged with the tenants it covers.

Pure: rows in (closed buckets the worker kept, plus a peek at still-open minutes), a
`SignalSnapshot` out; the wall clock is a parameter and is used only to say how fresh a
pool's data is. The worker builds a snapshot every few seconds and swaps it in whole, so
HTTP threads read a finished, consistent answer and never touch live state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from signals.autoscale import AutoscalePolicy, Autoscaler, PoolSignals
from slo import histogram
from slo.capacity import PoolMinute, SustainedCapacity
from slo.engine import SliceState
from slo.prices import GpuPrices
from slo.sli import span
from slo.spec import SloSpec
from slo.windows import minute_start_utc
from signals.rollout import RolloutPolicy, VersionStats, verdict

# Labels that describe a pool (one deployment in one zone for one traffic class), for
# deciding which SLO slices and thresholds speak about it. Tenants share a pool, so an SLO
# sliced by tenant covers the pool through each of its tenants.
POOL_ATTRIBUTES = ("pool", "model", "zone", "workload", "traffic_class")


@dataclass(frozen=True)
class SignalPolicy:
    autoscale: AutoscalePolicy = field(default_factory=AutoscalePolicy)
    rollout: RolloutPolicy = field(default_factory=RolloutPolicy)
    pool_window_minutes: int = 5  # demand and latency are read over this many complete minutes
    rollout_window_minutes: int = 30
    history_minutes: int = 60  # buckets kept for the pool and rollout windows
    sustained_minutes: int = 3  # capacity counts only work sustained this long with the SLO held
    capacity_history_days: int = 7  # measured capacity: the best day of the last week
    capacity_gpu_s_per_s: dict[str, float] = field(default_factory=dict)  # per pool, overrides measurement


@dataclass(frozen=True)
class Scoped:
    """One answer and the tenants whose traffic it is made of."""

    body: dict
    tenants: frozenset[str]
    as_of_minute: int
    changed_wall_s: float = 0.0  # when this pool's data last moved (for staleness)


@dataclass(frozen=True)
class SignalSnapshot:
    built_wall_s: float
    as_of_minute: int | None
    pools: dict[str, Scoped]
    rollouts: dict[tuple[str, str], Scoped]
    models: dict[str, frozenset[str]]  # model → its versions (for 404 messages)
    slos: list[dict]  # one per SLO, slices carry their labels
    alerts: list[dict]


class RecentBuckets:
    """Closed `sli_minute` / `gpu_minute` rows of the newest `keep_minutes` minutes."""

    def __init__(self, keep_minutes: int):
        self.keep_minutes = keep_minutes
        self.requests = pl.DataFrame()
        self.gpu = pl.DataFrame()

    def add(self, requests: pl.DataFrame, gpu: pl.DataFrame) -> None:
        self.requests = self._trim(_concat(self.requests, requests))
        self.gpu = self._trim(_concat(self.gpu, gpu))

    def _trim(self, frame: pl.DataFrame) -> pl.DataFrame:
        if frame.height == 0:
            return frame
        newest = frame["window_start"].max()
        return frame.filter(pl.col("window_start") > newest - pl.duration(minutes=self.keep_minutes))


def _concat(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    frames = [f for f in (a, b) if f.height]
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]


def _minute_col() -> pl.Expr:
    return (pl.col("window_start").dt.epoch("s") // 60).alias("_m")


def _merged_quantiles(rows: pl.DataFrame, keys: list[str], hist_col: str, qs: dict[str, float]) -> pl.DataFrame:
    """Quantiles of the histograms of `rows` merged per `keys` (histograms add bin by bin)."""
    long = (rows.select(*keys, pl.col(hist_col).alias("_h")).explode("_h")
            .filter(pl.col("_h").is_not_null()).unnest("_h")
            .group_by(*keys, "bin").agg(pl.col("n").sum()))
    return histogram.quantiles_frame(long, keys, qs)


class LiveSignals:
    """Builds snapshots; keeps what must persist between them (recent closed rows, the
    autoscaler's scale-in history, when each pool's data last moved)."""

    def __init__(self, policy: SignalPolicy, specs: list[SloSpec] | None, prices: GpuPrices):
        self.policy = policy
        self.specs = list(specs or [])
        self.prices = prices
        self.recent = RecentBuckets(policy.history_minutes)
        self.autoscaler = Autoscaler(policy.autoscale)
        self.capacity = SustainedCapacity(policy.sustained_minutes, policy.capacity_history_days)
        self.capacity_observed_through: int | None = None  # pool-minutes up to here fed to `capacity`
        self._pool_marks: dict[str, tuple[int, float]] = {}  # pool → (events seen, wall when it last grew)

    def add_closed(self, requests: pl.DataFrame, gpu: pl.DataFrame) -> list[tuple[str, int, float]]:
        """Keep closed rows; feed minutes now closed on both topics to the capacity
        measurement. Returns (pool, day, best) for each pool whose best of the day rose."""
        self.recent.add(requests, gpu)
        req, gpu_rows = self.recent.requests, self.recent.gpu
        if not req.height or not gpu_rows.height:
            return []
        through = min(int(f["window_start"].dt.epoch("s").max()) // 60 for f in (req, gpu_rows))
        since = self.capacity_observed_through
        if since is not None and through <= since:
            return []
        self.capacity_observed_through = through
        lo = since + 1 if since is not None else through - self.policy.history_minutes
        raised = []
        for m in pool_minutes(req, gpu_rows, lo, through, self._first_output_slo_ms, self.policy.autoscale.queue_age_slo_ms):
            best = self.capacity.observe(m)
            if best is not None:
                raised.append((m.pool, m.minute // 1440, best))
        return raised

    def snapshot(self, open_requests: pl.DataFrame, open_gpu: pl.DataFrame, slo_states: list[SliceState],
                 wall_s: float) -> SignalSnapshot:
        req = _concat(self.recent.requests, open_requests)
        gpu = _concat(self.recent.gpu, open_gpu)
        if req.height:
            req = req.with_columns(_minute_col())
        if gpu.height:
            gpu = gpu.with_columns(_minute_col())
        newest = [int(f["_m"].max()) for f in (req, gpu) if f.height]
        pools = self._pools(req, gpu, slo_states, wall_s) if gpu.height or req.height else {}
        rollouts, models = self._rollouts(req, gpu) if req.height else ({}, {})
        return SignalSnapshot(
            built_wall_s=wall_s, as_of_minute=max(newest) if newest else None, pools=pools, rollouts=rollouts,
            models=models, slos=slo_reads(slo_states), alerts=firing_alerts(slo_states),
        )

    # ---- autoscale ------------------------------------------------------------------
    def _pools(self, req: pl.DataFrame, gpu: pl.DataFrame, slo_states: list[SliceState], wall_s: float) -> dict[str, Scoped]:
        p = self.policy
        out: dict[str, Scoped] = {}
        req_by_pool = req.partition_by("pool", as_dict=True) if req.height else {}
        gpu_by_pool = gpu.partition_by("pool", as_dict=True) if gpu.height else {}
        for (pool,) in sorted(set(req_by_pool) | set(gpu_by_pool), key=lambda k: str(k[0])):
            if not pool:
                continue
            r = req_by_pool.get((pool,), pl.DataFrame())
            g = gpu_by_pool.get((pool,), pl.DataFrame())
            newest = max(int(f["_m"].max()) for f in (r, g) if f.height)
            seen = (int(r["requests"].sum()) if r.height else 0) + (int(g["samples"].sum()) if g.height else 0)
            marks = self._pool_marks.get(pool)
            changed = wall_s if marks is None or seen != marks[0] else marks[1]
            self._pool_marks[pool] = (seen, changed)
            # The newest minute is still filling: rates come from the complete minutes before it.
            lo, hi = newest - p.pool_window_minutes, newest - 1
            if not any(f.height and f.filter(pl.col("_m").is_between(lo, hi)).height for f in (r, g)):
                lo, hi = newest, newest
            minutes = hi - lo + 1
            rw = r.filter(pl.col("_m").is_between(lo, hi)) if r.height else r
            gw = g.filter(pl.col("_m").is_between(lo, hi)) if g.height else g
            attrs = _pool_attributes(r, g)
            fo_slo = self._first_output_slo_ms(attrs)
            signals = PoolSignals(
                pool=pool, as_of_minute=newest,
                requests_per_s=_sum(rw, "requests") / (60 * minutes),
                work_gpu_s_per_s=_sum(rw, "gpu_seconds") / (60 * minutes),
                tokens_per_s=_sum(rw, "output_tokens") / (60 * minutes),
                audio_s_per_s=_sum(rw, "audio_seconds") / (60 * minutes),
                active_streams=_last_minute_sum(gw, "active_streams_max"),
                queue_age_p95_ms=_quantile(gw, "oldest_queue_age_ms_max", 0.95),
                first_output_p95_ms=_hist_quantile(rw, "first_output_ms_hist", 0.95),
                first_output_slo_ms=fo_slo,
                kv_cache_usage_max=_max(gw, "kv_cache_usage_max"),
                gpu_util_mean_pct=_mean(gw, "util_pct_mean"),
                replicas_by_state=_replicas_by_state(gw),
                burn_rate=_pool_burn_rate(attrs, slo_states),
            )
            capacity, capacity_reason = self._capacity(pool, newest)
            decision = self.autoscaler.decide(signals, capacity)
            tenants = frozenset(r["tenant"].unique().to_list()) if r.height else frozenset()
            body = {
                "pool": pool, "desired_replicas": decision.desired_replicas,
                "current_replicas": decision.current_replicas, "reasons": [*decision.reasons, capacity_reason],
                "signals": {**decision.signals, "capacity_gpu_s_per_s_per_replica": capacity,
                            "window_minutes": minutes, **{k: v for k, v in attrs.items() if k != "pool"}},
                "as_of": _iso(newest + 1),
            }
            out[pool] = Scoped(body, tenants, newest, changed)
        return out

    def _first_output_slo_ms(self, attrs: dict[str, str]) -> float | None:
        thresholds = [s.threshold_ms for s in self.specs
                      if s.latency_field == "first_output_ms" and s.threshold_ms is not None
                      and all(attrs.get(k) == v for k, v in s.selector.items() if k in POOL_ATTRIBUTES)
                      and all(k in POOL_ATTRIBUTES for k in s.selector)]
        return min(thresholds) if thresholds else None

    def _capacity(self, pool: str, now_minute: int) -> tuple[float | None, str]:
        p = self.policy
        if pool in p.capacity_gpu_s_per_s:
            return p.capacity_gpu_s_per_s[pool], f"capacity {p.capacity_gpu_s_per_s[pool]:g} GPU-s/s per replica from config"
        best = self.capacity.capacity(pool, now_minute)
        if best is None:
            return None, (f"capacity per replica not measured yet (needs {p.sustained_minutes} consecutive minutes "
                          "with the latency SLOs held): policy default used")
        return best, (f"capacity {best:.3g} GPU-s/s per warm replica: the most work sustained for "
                      f"{p.sustained_minutes} minutes with queue age and first output within SLO, best day of the "
                      f"last {p.capacity_history_days}")

    # ---- rollout --------------------------------------------------------------------
    def _rollouts(self, req: pl.DataFrame, gpu: pl.DataFrame) -> tuple[dict[tuple[str, str], Scoped], dict[str, frozenset[str]]]:
        sku_of_pool = {}
        if gpu.height:
            for pool, sku in gpu.sort("_m").group_by("pool").agg(pl.col("gpu_sku").last()).iter_rows():
                sku_of_pool[pool] = sku
        req = req.with_columns(pl.col("pool").replace_strict(
            {k: self.prices.usd_per_gpu_second(v) for k, v in sku_of_pool.items()},
            default=self.prices.usd_per_gpu_second(None), return_dtype=pl.Float64).alias("_usd_per_gpu_s"))
        out: dict[tuple[str, str], Scoped] = {}
        models: dict[str, frozenset[str]] = {}
        window = self.policy.rollout_window_minutes
        for (model,), rows in req.partition_by("model", as_dict=True).items():
            newest = int(rows["_m"].max())
            rows = rows.filter(pl.col("_m") > newest - window)
            versions = sorted(v for v in rows["model_version"].unique().to_list() if v)
            models[model] = frozenset(versions)
            stable_rows = rows.filter(pl.col("deployment") == "stable")
            for version in versions:
                mine = rows.filter(pl.col("model_version") == version)
                tenants = frozenset(mine["tenant"].unique().to_list())
                if mine.filter(pl.col("deployment") != "stable").height == 0:
                    body = {"verdict": "continue", "reasons": [f"{model} {version} is the stable version: nothing to compare"],
                            "model": model, "version": version, "window_minutes": window, "as_of": _iso(newest + 1)}
                    out[(model, version)] = Scoped(body, tenants | frozenset(stable_rows["tenant"].unique().to_list()), newest)
                    continue
                base = stable_rows.filter(pl.col("model_version") != version)
                canary, stable = _version_stats(mine, version), _version_stats(base, _versions(base))
                v = verdict(canary, stable, window, self.policy.rollout, as_of=_iso(newest + 1))
                body = {**v.to_json(), "model": model, "version": version}
                out[(model, version)] = Scoped(body, tenants | frozenset(base["tenant"].unique().to_list()), newest)
        return out, models


def pool_minutes(requests: pl.DataFrame, gpu: pl.DataFrame, lo: int, hi: int, first_output_slo_ms,
                 queue_age_slo_ms: float) -> list[PoolMinute]:
    """Per pool and closed minute in [lo, hi]: work, warm replicas, and whether queue-age
    p95 and first-output p95 held (`first_output_slo_ms(attributes)` gives the threshold)."""
    req = requests.with_columns(_minute_col()).filter(pl.col("_m").is_between(lo, hi))
    gpu = gpu.with_columns(_minute_col()).filter(pl.col("_m").is_between(lo, hi))
    if not req.height or not gpu.height:
        return []
    work = req.group_by("pool", "_m").agg((pl.col("gpu_seconds").sum() / 60).alias("work"))
    fo = _merged_quantiles(req, ["pool", "_m"], "first_output_ms_hist", {"fo_p95": 0.95})
    per = gpu.group_by("pool", "_m").agg(
        (pl.col("replica_state") == "warm").sum().alias("warm"),
        pl.col("oldest_queue_age_ms_max").quantile(0.95, interpolation="higher").alias("queue_p95"),
    ).join(work, on=["pool", "_m"]).join(fo, on=["pool", "_m"], how="left").sort("pool", "_m")
    req_by_pool = req.partition_by("pool", as_dict=True)
    gpu_by_pool = gpu.partition_by("pool", as_dict=True)
    thresholds = {pool: first_output_slo_ms(_pool_attributes(req_by_pool.get((pool,), pl.DataFrame()), g))
                  for (pool,), g in gpu_by_pool.items()}
    out = []
    for pool, minute, warm, queue_p95, w, fo_p95 in per.select("pool", "_m", "warm", "queue_p95", "work", "fo_p95").iter_rows():
        if not pool:
            continue
        threshold = thresholds.get(pool)
        held = (queue_p95 or 0.0) <= queue_age_slo_ms and (threshold is None or (fo_p95 or 0.0) <= threshold)
        out.append(PoolMinute(pool, int(minute), float(w), int(warm), held))
    return out


# ---- SLO and alert reads ------------------------------------------------------------
def slo_reads(states: list[SliceState]) -> list[dict]:
    by_slo: dict[str, dict] = {}
    for st in states:
        spec = st.spec
        entry = by_slo.setdefault(spec.name, {
            "name": spec.name, "description": spec.description, "objective": spec.objective,
            "window": span(spec.window_minutes), "slice_by": list(spec.slice_by), "selector": dict(spec.selector),
            "slices": [],
        })
        status = st.status()
        entry["slices"].append({
            "labels": dict(st.labels), "sli": status.sli, "error_budget_remaining": status.error_budget_remaining,
            "burn_rates": {span(m): b for m, b in status.burn_rates.items() if b is not None},
            "minutes_to_exhaustion": status.minutes_to_exhaustion, "firing": status.firing,
            "as_of": _iso(status.minute + 1) if status.minute else None,
        })
    return [by_slo[k] for k in sorted(by_slo)]


def firing_alerts(states: list[SliceState]) -> list[dict]:
    out = []
    for st in states:
        for fp, (aw, started) in sorted(st.firing.items()):
            out.append({"fingerprint": fp, "alertname": f"SLOBurn{aw.severity.capitalize()}", "severity": aw.severity,
                        "slo": st.spec.name, "window": aw.name, "labels": dict(st.labels), "since": _iso(started),
                        "runbook": st.spec.runbook})
        if st.no_data_since is not None:
            out.append({"fingerprint": None, "alertname": "SLONoData", "severity": "ticket", "slo": st.spec.name,
                        "window": "no-data", "labels": dict(st.labels), "since": _iso(st.no_data_since),
                        "runbook": "runbooks/slo-no-data.md"})
    return out


# ---- small pure helpers ---------------------------------------------------------------
def _iso(minute: int) -> str:
    return minute_start_utc(minute).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sum(f: pl.DataFrame, col: str) -> float:
    return float(f[col].sum() or 0) if f.height and col in f.columns else 0.0


def _max(f: pl.DataFrame, col: str) -> float | None:
    v = f[col].max() if f.height and col in f.columns else None
    return float(v) if v is not None else None


def _mean(f: pl.DataFrame, col: str) -> float | None:
    v = f[col].mean() if f.height and col in f.columns else None
    return round(float(v), 3) if v is not None else None


def _quantile(f: pl.DataFrame, col: str, q: float) -> float | None:
    v = f[col].quantile(q, interpolation="higher") if f.height and col in f.columns else None
    return float(v) if v is not None else None


def _hist_quantile(f: pl.DataFrame, col: str, q: float) -> float | None:
    if not f.height or col not in f.columns:
        return None
    qs = _merged_quantiles(f.with_columns(pl.lit(0).alias("_all")), ["_all"], col, {"q": q})
    return float(qs["q"][0]) if qs.height and qs["q"][0] is not None else None


def _last_minute_sum(g: pl.DataFrame, col: str) -> int:
    if not g.height:
        return 0
    last = g.filter(pl.col("_m") == g["_m"].max())
    return int(last[col].fill_null(0).sum())


def _replicas_by_state(g: pl.DataFrame) -> dict[str, int]:
    """GPUs (one replica each) by the state they last reported in the newest minute of the window."""
    if not g.height:
        return {}
    last = g.filter(pl.col("_m") == g["_m"].max())
    counts = last.group_by(pl.col("replica_state").fill_null("unknown")).len()
    return {state: int(n) for state, n in sorted(counts.iter_rows())}


def _pool_attributes(r: pl.DataFrame, g: pl.DataFrame) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for f in (g, r):
        for k in POOL_ATTRIBUTES:
            if f.height and k in f.columns and k not in attrs:
                values = f[k].drop_nulls().unique().to_list()
                if len(values) == 1 and values[0]:
                    attrs[k] = values[0]
    return attrs


def _pool_burn_rate(attrs: dict[str, str], states: list[SliceState]) -> float | None:
    """The fastest-burning SLO slice that speaks about this pool (fastest page window)."""
    rates = []
    for st in states:
        spec = st.spec
        scope = {**spec.selector, **st.labels}
        if any(k in attrs and attrs[k] != v for k, v in scope.items() if k in POOL_ATTRIBUTES):
            continue
        if not any(k in attrs for k in scope if k in POOL_ATTRIBUTES):
            continue
        fastest = min(spec.alert_windows, key=lambda a: a.long_minutes)
        b = st.burn(fastest.short_minutes)
        if b is not None:
            rates.append(b)
    return round(max(rates), 3) if rates else None


def _versions(rows: pl.DataFrame) -> str:
    return ",".join(sorted(v for v in rows["model_version"].unique().to_list() if v)) if rows.height else ""


def _version_stats(rows: pl.DataFrame, version: str) -> VersionStats:
    if not rows.height:
        return VersionStats(version, 0, 0, 0, None, None, 0.0, 0, 0.0)
    fo = _hist_quantile(rows, "first_output_ms_hist", 0.99)
    e2e = _hist_quantile(rows, "e2e_ms_hist", 0.99)
    return VersionStats(
        version=version, requests=int(rows["requests"].sum()),
        bad=int(rows["errors"].sum() + rows["timeouts"].sum()), timeouts=int(rows["timeouts"].sum()),
        first_output_p99_ms=fo, e2e_p99_ms=e2e,
        gpu_cost=round(float((rows["gpu_seconds"] * rows["_usd_per_gpu_s"]).sum()), 6),
        output_tokens=int(rows["output_tokens"].fill_null(0).sum()),
        audio_seconds=float(rows["audio_seconds"].fill_null(0).sum()),
    )

