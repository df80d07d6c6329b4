"""The live view the signal API answers from: recent buckets → per-pool autoscale decisions,
per-version rollout verdicts, SLO and alert reads, each tagged with the tenants it covers.

Pure: rows in (closed buckets the worker kept, plus a peek at still-open minutes), a
`SignalSnapshot` out; the wall clock is a parameter and is used only to say how fresh a
pool's data is. The worker builds a snapshot every few seconds and publishes it whole, its
answers encoded (signals/served.py), so the HTTP process serves finished, consistent answers
and never touches live state.
"""

from __future__ import annotations

import math
from typing import Annotated, Generic, TypeVar

import msgspec
import polars as pl
from msgspec import Meta

from tailwatch.alerts.alertmanager import rfc3339
from tailwatch.signals.answers import Alert, Autoscale, InputAbsent, Shed, Slo, Verdict
from tailwatch.signals.autoscale import AutoscalePolicy, Autoscaler, Decision, PoolInputs, PoolSignals, absent_input
from tailwatch.signals.held import (EMPTY, MINUTE, NO_QUALITY, SPEECH_SUMS, WER_SUMS, VERSION_HISTOGRAMS, RequestRollup,
                          concat_frames, minute_col, summed_bins)
from tailwatch.signals.shed import ShedAdvice, ShedPolicy, TrafficSlice, shed_advice
from tailwatch.slo import histogram
from tailwatch.config import ConfigStruct, Days, WindowMinutes
from tailwatch.planning.cost import attribution_scales
from tailwatch.planning.capacity import (CapacityEstimate, PoolMinute, ReplicaShape, SustainedCapacity, configured_capacity,
                          estimate_capacity, physical_bound)
from tailwatch.slo.engine import SliceView
from tailwatch.planning.prices import GpuPrices
from tailwatch.planning.work_estimate import WorkEstimate, pool_busy
from tailwatch.slo.sli import span
from tailwatch.slo.spec import SloSpec
from tailwatch.signals.rollout import MinuteCounts, QualityMinute, RolloutPolicy, VersionStats, verdict

# Labels that describe a pool (one deployment in one zone for one traffic class), for
# deciding which SLO slices and thresholds speak about it. Tenants share a pool, so an SLO
# sliced by tenant covers the pool through each of its tenants.
POOL_ATTRIBUTES = ("pool", "model", "zone", "workload", "traffic_class")


Answer = TypeVar("Answer", Autoscale, Shed, Verdict, InputAbsent)

# Per-replica capacity a person configures for a pool (a load test's knee), GPU-s/s.
CapacityGpuSPerS = Annotated[float, Meta(gt=0.0, lt=1e9)]


class SignalWindows(ConfigStruct):
    """The `signals:` section of the API config file."""

    pool_window_minutes: WindowMinutes = 5  # demand and latency are read over this many complete minutes
    rollout_window_minutes: WindowMinutes = 30
    # Minutes kept for the pool and rollout windows (rolled up: signals/held.py): as long as the
    # longest window, not longer.
    history_minutes: WindowMinutes = 30
    sustained_minutes: WindowMinutes = 3  # capacity counts only work sustained this long with the SLO held
    capacity_history_days: Days = 7  # measured capacity: the best day of the last week

    def __post_init__(self):
        if self.history_minutes < max(self.pool_window_minutes + 1, self.rollout_window_minutes):
            raise ValueError("history_minutes must cover pool_window_minutes + 1 and rollout_window_minutes")


class SignalPolicy(SignalWindows):
    autoscale: AutoscalePolicy = AutoscalePolicy()
    rollout: RolloutPolicy = RolloutPolicy()
    shed: ShedPolicy = ShedPolicy()
    # Per pool: a configured capacity overrides measurement; the shape bounds it physically.
    capacity_gpu_s_per_s: dict[str, CapacityGpuSPerS] = {}
    replica_shape: dict[str, ReplicaShape] = {}


class Scoped(msgspec.Struct, Generic[Answer], frozen=True):
    """One answer, typed, and the tenants whose traffic it is made of."""

    body: Answer
    tenants: frozenset[str]
    as_of_minute: int
    changed_wall_s: float = 0.0  # when the data behind it last moved (for staleness); a canary's own
    baseline_changed_wall_s: float | None = None  # a canary verdict's: when its stable baseline's did


def answer(body: dict, kind: type[Answer]) -> Answer:
    """A view's mapping as its typed answer, built once here: what the HTTP process serves,
    the demo prints and the backtests replay."""
    return msgspec.convert(significant(body), type=kind)


def significant(value, digits: int = 12):
    """Floats in an answer to `digits` significant digits. Sums over the same rows in another
    order (a replica restored from its store, one that was not) differ in the last bits;
    replicas must answer alike, and no decision reads past the twelfth digit."""
    if isinstance(value, float):
        # Not finite: null, as a client is sent it (and as JSON carried it).
        return float(f"{value:.{digits}g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: significant(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [significant(v, digits) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "item"):  # a NumPy scalar
        return significant(value.item(), digits)
    return value


class SignalSnapshot(msgspec.Struct, frozen=True):
    """Everything the signal API answers from, as of one build, typed; the worker encodes
    each answer once for the HTTP process (signals/served.py)."""

    built_wall_s: float
    as_of_minute: int | None
    pools: dict[str, Scoped[Autoscale]]
    rollouts: dict[tuple[str, str], Scoped[Verdict]]
    models: dict[str, frozenset[str]]  # model → its versions (for 404 messages)
    slos: list[Slo]  # one per SLO, slices carry their labels
    alerts: list[Alert]
    shed: dict[str, Scoped[Shed]] = {}  # per pool: the degradation ladder and admission plan
    # Per pool whose window holds nothing of an input its answers read: no autoscale or shed
    # answer then (signals/autoscale.py, absent_input).
    absent: dict[str, Scoped[InputAbsent]] = {}
    # Input topic → why it is not caught up, as the worker judged when it built the view
    # (streams/runtime.py): what the view holds of it is old, so pool answers wait.
    inputs_behind: dict[str, str] = {}


class RecentBuckets:
    """The newest `keep_minutes` closed minutes: `sli_minute` rolled up (signals/held.py, the
    per-tenant traffic only for `traffic_minutes`), `gpu_minute` rows as they are (one per
    GPU and minute)."""

    # Closed request rows wait to be rolled up until read (a snapshot, the capacity
    # measurement) or until this many have gathered: a rollup costs about 7 ms however few
    # its rows, and a replay closes a batch every checkpoint between two snapshots.
    PENDING_ROWS_AT = 50_000

    def __init__(self, keep_minutes: int, traffic_minutes: int):
        self.keep_minutes = keep_minutes
        self.traffic_minutes = traffic_minutes
        self._requests: RequestRollup = EMPTY
        self._pending: list[pl.DataFrame] = []
        self.gpu = pl.DataFrame()

    def add(self, requests: pl.DataFrame, gpu: pl.DataFrame) -> None:
        if requests.height:
            self._pending.append(requests)
            if sum(f.height for f in self._pending) >= self.PENDING_ROWS_AT:
                self._roll_up()
        self.gpu = self._trim(concat_frames(self.gpu, gpu))

    @property
    def requests(self) -> RequestRollup:
        self._roll_up()
        return self._requests

    def _roll_up(self) -> None:
        if self._pending:
            rows = pl.concat(self._pending, how="diagonal_relaxed") if len(self._pending) > 1 else self._pending[0]
            self._pending = []
            self._requests = self._requests.added(rows, self.keep_minutes, self.traffic_minutes)

    def _trim(self, frame: pl.DataFrame) -> pl.DataFrame:
        if frame.height == 0:
            return frame
        newest = frame["window_start"].max()
        return frame.filter(pl.col("window_start") > newest - pl.duration(minutes=self.keep_minutes))


def _bin_quantiles(bins: pl.DataFrame, keys: list[str], qs: dict[str, float]) -> pl.DataFrame:
    """Quantiles of long histogram rows added up per `keys` (histograms add bin by bin)."""
    return histogram.quantiles_frame(summed_bins(bins, keys), keys, qs, presorted=True)


class LiveSignals:
    """Builds snapshots; keeps what must persist between them (recent closed rows, the
    autoscaler's scale-in history, when each pool's data last moved)."""

    def __init__(self, policy: SignalPolicy, specs: list[SloSpec] | None, prices: GpuPrices):
        self.policy = policy
        self.specs = list(specs or [])
        self.prices = prices
        self.recent = RecentBuckets(policy.history_minutes, policy.pool_window_minutes + 1)
        self.autoscaler = Autoscaler(policy.autoscale)
        self.capacity = SustainedCapacity(policy.sustained_minutes, policy.capacity_history_days)
        self.capacity_observed_through: int | None = None  # pool-minutes up to here fed to `capacity`
        self.work = WorkEstimate()  # GPU time for requests that report none
        # (kind, name...) → ((newest minute, events in it), wall time when that last grew), for
        # pools, canary versions and stable baselines: trimming old minutes out of the kept
        # history must not look like fresh data.
        self._marks: dict[tuple, tuple[tuple[int, int], float]] = {}

    def _changed(self, key: tuple, mark: tuple[int, int], wall_s: float) -> float:
        """When the data under `key` last moved, given its mark now."""
        previous = self._marks.get(key)
        changed = wall_s if previous is None or mark > previous[0] else previous[1]
        self._marks[key] = (max(mark, previous[0]) if previous else mark, changed)
        return changed

    def add_closed(self, requests: pl.DataFrame, gpu: pl.DataFrame) -> list[tuple[str, int, float]]:
        """Keep closed rows; feed minutes now closed on both topics to the capacity
        measurement. Returns (pool, day, best) for each pool whose best of the day rose.

        Demand is GPU time: where the requests report none (vLLM, TGI, Triton, OpenTelemetry),
        their pool-minute's busy GPU time shared by tokens, audio or wall time
        (planning/work_estimate.py), so a busy pool is never read as idle; a version's cost
        stays what its requests reported (held.py)."""
        if requests.height:
            requests = self.work.attribute(requests, pool_busy(gpu))
        self.recent.add(requests, gpu)
        gpu_rows = self.recent.gpu
        if not gpu_rows.height:  # checked first: reading the requests rolls them up
            return []
        req = self.recent.requests
        if not req.height:
            return []
        through = min(req.newest_minute(), int(gpu_rows["window_start"].dt.epoch("s").max()) // 60)
        since = self.capacity_observed_through
        if since is not None and through <= since:
            return []
        self.capacity_observed_through = through
        lo = since + 1 if since is not None else through - self.policy.history_minutes
        raised = []
        for m in pool_minutes(req, gpu_rows, lo, through, self.first_output_slo_ms, self.policy.autoscale.queue_age_slo_ms):
            best = self.capacity.observe(m)
            if best is not None:
                raised.append((m.pool, m.minute // 1440, best))
        return raised

    def snapshot(self, open_requests: pl.DataFrame, open_gpu: pl.DataFrame, slo_states: list[SliceView],
                 wall_s: float, alert_details: dict[str, str] | None = None) -> SignalSnapshot:
        """`alert_details`: fingerprint → who holds the bad events of a firing alert."""
        req = self.recent.requests.added(open_requests)
        gpu = concat_frames(self.recent.gpu, open_gpu)
        if gpu.height:
            gpu = gpu.with_columns(minute_col())
        newest = [m for m in (req.newest_minute(), int(gpu["_m"].max()) if gpu.height else None) if m is not None]
        pools, shed, absent = self._pools(req, gpu, slo_states, wall_s) if gpu.height or req.height else ({}, {}, {})
        rollouts, models = self._rollouts(req, gpu, wall_s) if req.height else ({}, {})
        return SignalSnapshot(
            built_wall_s=wall_s, as_of_minute=max(newest) if newest else None, pools=pools, rollouts=rollouts,
            shed=shed, absent=absent,
            models=models, slos=[answer(s, Slo) for s in slo_reads(slo_states)],
            alerts=[answer(a, Alert) for a in firing_alerts(slo_states, alert_details or {})],
        )

    # ---- autoscale ------------------------------------------------------------------
    def _pools(self, req: RequestRollup, gpu: pl.DataFrame, slo_states: list[SliceView],
               wall_s: float) -> tuple[dict[str, Scoped], dict[str, Scoped], dict[str, Scoped]]:
        """One group-by per signal over all pools at once; the loop only decides. Returns the
        autoscale answers, the shedding advice and the pools an input is absent from."""
        out: dict[str, Scoped] = {}
        shed: dict[str, Scoped] = {}
        absent: dict[str, Scoped] = {}
        for pool, st in sorted(pool_stats(req, gpu, self.policy.pool_window_minutes).items()):
            changed = self._changed(("pool", pool), (st["newest"], st["seen_in_newest"]), wall_s)
            missing = absent_input(PoolInputs(
                pool, st["minutes"], st["requests"], st["gpu_samples"], st["newest_gpu"],
                bool(st["active_streams"] or (st["gpu_util_mean_pct"] or 0.0) > 0.0)))
            if missing is not None:
                body = {"pool": pool, "input": missing[0], "reason": missing[1], "as_of": rfc3339(st["newest"] + 1)}
                absent[pool] = Scoped(answer(body, InputAbsent), st["tenants"], st["newest"], changed)
                continue  # no decision: the autoscaler's scale-in history is left as it was
            attrs, per_s = st["attrs"], 60 * st["minutes"]
            fo_slo = self.first_output_slo_ms(attrs)
            signals = PoolSignals(
                pool=pool, as_of_minute=st["newest"],
                requests_per_s=st["requests"] / per_s, work_gpu_s_per_s=st["gpu_seconds"] / per_s,
                tokens_per_s=st["output_tokens"] / per_s, audio_s_per_s=st["audio_seconds"] / per_s,
                prompt_tokens_per_s=st["prompt_tokens"] / per_s,
                active_streams=st["active_streams"], queue_age_p95_ms=st["queue_age_p95_ms"],
                first_output_p95_ms=st["first_output_p95_ms"], first_output_slo_ms=fo_slo,
                kv_cache_usage_max=st["kv_cache_usage_max"], gpu_util_mean_pct=st["gpu_util_mean_pct"],
                sm_active_mean_pct=st["sm_active_mean_pct"],
                replicas_by_state=st["replicas_by_state"], burn_rate=_pool_burn_rate(attrs, slo_states),
            )
            decision = self.autoscaler.decide(signals, self._capacity(pool, st["newest"], signals))
            body = {
                "pool": pool, "desired_replicas": decision.desired_replicas,
                "current_replicas": decision.current_replicas, "reasons": decision.reasons,
                "signals": {**decision.signals, "window_minutes": st["minutes"],
                            **{k: v for k, v in attrs.items() if k != "pool"}},
                "capacity_basis": decision.capacity_basis, "capacity": decision.capacity,
                "as_of": rfc3339(st["newest"] + 1),
            }
            out[pool] = Scoped(answer(body, Autoscale), st["tenants"], st["newest"], changed)
            advice = self._shed(st, signals, decision)
            shed[pool] = Scoped(answer({**shed_body(advice), "as_of": body["as_of"]}, Shed), st["tenants"], st["newest"],
                                changed)
        return out, shed, absent

    def _shed(self, st: dict, s: PoolSignals, decision: Decision) -> ShedAdvice:
        # Replicas still loading their model serve nothing yet: admission plans on the serving ones.
        states = decision.signals["replicas_by_state"]
        serving = states.get("warm", 0) + states.get("unknown", 0)
        capacity = decision.signals["capacity_gpu_s_per_s_per_replica"] * serving
        return shed_advice(s.pool, st["traffic"], s.work_gpu_s_per_s, capacity, self.policy.shed, decision.breaches,
                           st["attrs"].get("workload"))

    def first_output_slo_ms(self, attrs: dict[str, str]) -> float | None:
        """The tightest first-output threshold of the SLOs that select a pool with these attributes."""
        thresholds = [s.threshold_ms for s in self.specs
                      if s.latency_field == "first_output_ms" and s.threshold_ms is not None
                      and all(attrs.get(k) == v for k, v in s.selector.items() if k in POOL_ATTRIBUTES)
                      and all(k in POOL_ATTRIBUTES for k in s.selector)]
        return min(thresholds) if thresholds else None

    def _capacity(self, pool: str, now_minute: int, s: PoolSignals) -> CapacityEstimate:
        """Configured capacity wins (a load test measured the knee); otherwise the physical
        bound narrowed by what the pool held and where its latency broke, recent days."""
        p = self.policy
        if pool in p.capacity_gpu_s_per_s:
            return configured_capacity(p.capacity_gpu_s_per_s[pool], "config (capacity_gpu_s_per_s)")
        shape = p.replica_shape.get(pool) or ReplicaShape(gpus_per_replica=p.autoscale.gpus_per_replica)
        physical = physical_bound(shape, s.work_gpu_s_per_s, s.prompt_tokens_per_s, s.tokens_per_s)
        held, broke = self.capacity.bounds(pool, now_minute)
        return estimate_capacity(physical, held, broke, p.sustained_minutes)

    # ---- rollout --------------------------------------------------------------------
    def _rollouts(self, req: RequestRollup, gpu: pl.DataFrame,
                  wall_s: float) -> tuple[dict[tuple[str, str], Scoped], dict[str, frozenset[str]]]:
        """Each version's canary traffic (deployment other than stable) against the model's
        stable traffic, over the model's newest `rollout_window_minutes`; one group-by per side.
        Each side's data is marked with when it last moved: a verdict is as fresh as the
        older of its two sides (a canary whose producers stopped is stale, however fresh
        stable is)."""
        window = self.policy.rollout_window_minutes
        versions = req.versions.filter(pl.col("model") != "")
        if not versions.height:
            return {}, {}
        newest = dict(versions.group_by("model").agg(pl.col(MINUTE).max()).iter_rows())
        newest_of = pl.DataFrame({"model": list(newest), "_newest": list(newest.values())},
                                 schema={"model": versions.schema["model"], "_newest": pl.Int64})

        stable, canary = pl.col("stable"), ~pl.col("stable") & (pl.col("model_version") != "")
        quality = req.version_quality if req.version_quality.columns else NO_QUALITY
        frames = (versions.with_columns(self._usd_per_gpu_s(gpu)), req.version_bins, req.labels, quality)
        # Each frame cut to its model's window once, then split by side (a join each, not one per side).
        windowed = [f.join(newest_of, on="model").filter(pl.col(MINUTE) > pl.col("_newest") - window) for f in frames]
        per_version = _version_table(*(f.filter(canary) for f in windowed), ["model", "model_version"])
        canary_models = sorted({m for m, _, _, _ in per_version})
        stable_all = _version_table(*(f.filter(stable) for f in windowed), ["model"], detail_for=canary_models)
        stable_versions = windowed[0].filter(stable & (pl.col("model_version") != "")).select(
            "model", "model_version").unique()
        changed = self._side_marks(versions, wall_s)
        out: dict[tuple[str, str], Scoped] = {}
        models: dict[str, frozenset[str]] = {}
        for model, version in stable_versions.iter_rows():
            base = stable_all[(model,)]
            models[model] = models.get(model, frozenset()) | {version}
            body = {"verdict": "continue", "reasons": [f"{model} {version} is the stable version: nothing to compare"],
                    "model": model, "version": version, "window_minutes": window, "as_of": rfc3339(newest[model] + 1)}
            out[(model, version)] = Scoped(answer(body, Verdict), base[2], newest[model],
                                           changed.get(("stable", model), wall_s))
        for model, version, stats, tenants in per_version:
            models[model] = models.get(model, frozenset()) | {version}
            as_of = rfc3339(newest[model] + 1)
            base = stable_all.get((model,))
            base_tenants = base[2] if base else frozenset()
            stable = base[1] if base else VersionStats("", 0, 0, 0, None, None, 0.0, 0, 0.0)
            v = verdict(stats, stable, window, self.policy.rollout, as_of=as_of)
            out[(model, version)] = Scoped(answer({**v.to_json(), "model": model, "version": version}, Verdict),
                                           tenants | base_tenants, newest[model],
                                           changed.get(("canary", model, version), wall_s),
                                           changed.get(("stable", model)))
        return out, models

    def _side_marks(self, versions: pl.DataFrame, wall_s: float) -> dict[tuple, float]:
        """When each canary version's and each model's stable traffic last moved."""
        side = pl.when(pl.col("stable")).then(pl.lit("")).otherwise(pl.col("model_version")).alias("_side")
        per_side = versions.group_by("model", side, "stable", MINUTE).agg(pl.col("requests").sum())
        newest = per_side.filter(pl.col(MINUTE) == pl.col(MINUTE).max().over("model", "_side"))
        out = {}
        for model, version, stable, minute, requests in newest.select("model", "_side", "stable", MINUTE, "requests").iter_rows():
            key = ("stable", model) if stable else ("canary", model, version)
            out[key] = self._changed(key, (int(minute), int(requests)), wall_s)
        return out

    def _usd_per_gpu_s(self, gpu: pl.DataFrame) -> pl.Expr:
        """Price of a request row's GPU-second: its pool's SKU as the GPU samples last said."""
        sku_of_pool = dict(gpu.sort("_m").group_by("pool").agg(pl.col("gpu_sku").last()).iter_rows()) if gpu.height else {}
        return pl.col("pool").replace_strict(
            {k: self.prices.usd_per_gpu_second(v) for k, v in sku_of_pool.items()},
            default=self.prices.usd_per_gpu_second(None), return_dtype=pl.Float64).alias("_usd_per_gpu_s")


def capped_work(req: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Per (pool, `_m`): the requests' GPU-seconds, capped at the GPU-seconds the pool's GPUs
    had that minute (60 per GPU reporting). Runtimes that time-share a GPU report each
    request's wall time (the H100 lab: 2.2x the GPU-seconds that existed); read as demand,
    that told a one-GPU pool to run 9 replicas. The same scaling as cost attribution
    (`slo.cost.attribution_scales`); a minute without GPU rows is left as reported."""
    reported = req.group_by("pool", "_m").agg(pl.col("gpu_seconds").fill_null(0).sum()).rename({"_m": "minute"})
    fleet = (gpu.group_by("pool", "_m").agg((pl.len() * 60.0).alias("gpu_seconds")).rename({"_m": "minute"})
             if gpu.height else pl.DataFrame(schema={"pool": pl.String, "minute": pl.Int64, "gpu_seconds": pl.Float64}))
    scales = attribution_scales(reported, fleet.with_columns(pl.col("minute").cast(reported.schema["minute"])))
    return scales.select("pool", pl.col("minute").alias("_m"),
                         (pl.col("reported_gpu_seconds") * pl.col("attribution_scale")).alias("gpu_seconds"))


def traffic_slices(rows: pl.DataFrame, capped: pl.DataFrame) -> dict[str, list[tuple]]:
    """Per pool, (tenant, traffic class, requests, GPU-seconds, prompt tokens, output tokens)
    over `rows`, GPU-seconds scaled per pool-minute as `capped_work` scaled them."""
    reported = rows.group_by("pool", "_m").agg(pl.col("gpu_seconds").fill_null(0).sum().alias("_reported"))
    scale = capped.join(reported, on=["pool", "_m"]).select(
        "pool", "_m", pl.when(pl.col("_reported") > 0).then(pl.col("gpu_seconds") / pl.col("_reported"))
        .otherwise(1.0).alias("_scale"))
    def total(column: str) -> pl.Expr:
        return pl.col(column).sum().cast(pl.Float64)

    sums = rows.join(scale, on=["pool", "_m"], how="left").group_by("pool", "tenant", "traffic_class").agg(
        total("requests"), (pl.col("gpu_seconds") * pl.col("_scale").fill_null(1.0)).sum(),
        total("prompt_tokens"), total("output_tokens"),
    ).sort("pool", "traffic_class", "tenant")
    out: dict[str, list[tuple]] = {}
    for row in sums.iter_rows():
        out.setdefault(row[0], []).append(row[1:])
    return out


def shed_body(advice) -> dict:
    """A `ShedAdvice` as the API's mapping (answers.Shed)."""
    return {
        "pool": advice.pool, "under_pressure": advice.under_pressure, "pressure": advice.pressure,
        "demand_gpu_s_per_s": round(advice.demand_gpu_s_per_s, 6), "capacity_gpu_s_per_s": round(advice.capacity_gpu_s_per_s, 6),
        "steps": [vars(step) for step in advice.steps],
        "admission": {
            "interval_s": advice.interval_s, "capacity_gpu_s": round(advice.admission_capacity_gpu_s, 6),
            "retry_after_s": advice.retry_after_s,
            "groups": [{"tenant": a.group.tenant, "traffic_class": a.group.traffic_class, "priority": a.group.priority,
                        "requests": a.group.requests, "cost_gpu_s": round(a.group.cost, 6), "admitted": a.admitted,
                        "rejected": a.rejected} for a in advice.admission],
        },
    }


def pool_stats(req: RequestRollup, gpu: pl.DataFrame, window_minutes: int) -> dict[str, dict]:
    """Per pool: the window (its newest complete minutes, or the newest minute when none is
    complete), demand sums, latency and GPU signals, tenants and attributes."""
    frames = [f.select("pool", "_m") for f in (req.pools, gpu) if f.height]
    if not frames:
        return {}
    bounds = pl.concat(frames).filter(pl.col("pool") != "").group_by("pool").agg(
        pl.col("_m").max().alias("newest"),
        pl.col("_m").filter(pl.col("_m") < pl.col("_m").max()).max().alias("_complete"),
    )
    # The newest minute is still filling: rates come from complete minutes before it.
    bounds = bounds.with_columns(
        pl.when(pl.col("_complete") >= pl.col("newest") - window_minutes)
        .then(pl.col("newest") - window_minutes).otherwise(pl.col("newest")).alias("lo"),
        pl.when(pl.col("_complete") >= pl.col("newest") - window_minutes)
        .then(pl.col("newest") - 1).otherwise(pl.col("newest")).alias("hi"),
    )
    stats = {pool: {"newest": int(newest), "minutes": int(hi - lo + 1), "seen_in_newest": 0, "tenants": frozenset(),
                    "requests": 0.0, "gpu_seconds": 0.0, "output_tokens": 0.0, "audio_seconds": 0.0, "prompt_tokens": 0.0,
                    "first_output_p95_ms": None, "queue_age_p95_ms": None, "kv_cache_usage_max": None,
                    "gpu_util_mean_pct": None, "sm_active_mean_pct": None, "active_streams": 0, "replicas_by_state": {}, "attrs": {},
                    "traffic": [], "gpu_samples": 0, "newest_gpu": None}
             for pool, newest, lo, hi in bounds.select("pool", "newest", "lo", "hi").iter_rows()}
    in_window = pl.col("_m").is_between(pl.col("lo"), pl.col("hi"))
    gpu_bounds = gpu.join(bounds, on="pool") if gpu.height else gpu  # joined once, read three times
    if req.height:
        for pool, tenants in req.labels.group_by("pool").agg(pl.col("tenant").unique()).iter_rows():
            if pool in stats:
                stats[pool]["tenants"] = frozenset(tenants)
        pools = req.pools.join(bounds, on="pool")  # joined once, for the newest minute and the window
        newest_rows = pools.filter(pl.col("_m") == pl.col("newest"))
        for pool, seen in newest_rows.group_by("pool").agg(pl.col("requests").sum()).iter_rows():
            stats[pool]["seen_in_newest"] += int(seen)
        rw = pools.filter(in_window)
        sums = rw.group_by("pool").agg(*[pl.col(c).sum().cast(pl.Float64)
                                         for c in ("requests", "output_tokens", "audio_seconds", "prompt_tokens")])
        for row in sums.iter_rows(named=True):
            stats[row.pop("pool")].update(row)
        gw_all = gpu_bounds.filter(in_window) if gpu.height else gpu
        capped = capped_work(rw, gw_all)
        work = capped.group_by("pool").agg(pl.col("gpu_seconds").sum())
        for pool, gpu_s in work.iter_rows():
            if pool in stats:
                stats[pool]["gpu_seconds"] = float(gpu_s)
        for pool, slices in traffic_slices(req.traffic.join(bounds, on="pool").filter(in_window), capped).items():
            stats[pool]["traffic"] = [TrafficSlice(*row[:2], *(v / (60 * stats[pool]["minutes"]) for v in row[2:]))
                                      for row in slices]
        bins = req.pool_bins.join(bounds, on="pool").filter(in_window)
        for pool, q in _bin_quantiles(bins, ["pool"], {"q": 0.95}).iter_rows():
            stats[pool]["first_output_p95_ms"] = float(q) if q is not None else None
    if gpu.height:
        newest_rows = gpu_bounds.filter(pl.col("_m") == pl.col("newest"))
        for pool, seen in newest_rows.group_by("pool").agg(pl.col("samples").sum()).iter_rows():
            stats[pool]["seen_in_newest"] += int(seen)
        for pool, newest_gpu in gpu.group_by("pool").agg(pl.col("_m").max()).iter_rows():
            if pool in stats:
                stats[pool]["newest_gpu"] = int(newest_gpu)
        gw = gpu_bounds.filter(in_window)
        g = gw.group_by("pool").agg(
            pl.col("samples").sum().alias("gpu_samples"),
            pl.col("oldest_queue_age_ms_max").quantile(0.95, interpolation="higher").alias("queue_age_p95_ms"),
            pl.col("kv_cache_usage_max").max(), pl.col("util_pct_mean").mean().round(3).alias("gpu_util_mean_pct"),
            (pl.col("sm_active_pct_mean").mean().round(3) if "sm_active_pct_mean" in gw.columns
             else pl.lit(None, dtype=pl.Float64)).alias("sm_active_mean_pct"))
        for row in g.iter_rows(named=True):
            stats[row.pop("pool")].update(row)
        last = gw.filter(pl.col("_m") == pl.col("_m").max().over("pool"))
        for pool, streams in last.group_by("pool").agg(pl.col("active_streams_max").fill_null(0).sum()).iter_rows():
            stats[pool]["active_streams"] = int(streams)
        for pool, state, n in last.group_by("pool", pl.col("replica_state").fill_null("unknown")).len().sort("pool", "replica_state").iter_rows():
            stats[pool]["replicas_by_state"][state] = int(n)
    for pool, attrs in pool_attributes(req.labels, gpu).items():
        if pool in stats:
            stats[pool]["attrs"] = attrs
    return stats


def pool_attributes(labels: pl.DataFrame, gpu: pl.DataFrame) -> dict[str, dict[str, str]]:
    """Per pool, the attributes (model, zone, workload, traffic class) its rows agree on:
    one non-empty value, taken from the GPU samples first, then from the requests' label sets."""
    out: dict[str, dict[str, str]] = {}
    for f in (gpu, labels):
        if not f.height:
            continue
        keys = [k for k in POOL_ATTRIBUTES if k != "pool" and k in f.columns]
        agreed = f.group_by("pool").agg(*[pl.col(k).drop_nulls().unique().alias(k) for k in keys])
        for row in agreed.iter_rows(named=True):
            pool = row.pop("pool")
            if not pool:
                continue
            attrs = out.setdefault(pool, {"pool": pool})
            for k, values in row.items():
                if k not in attrs and len(values) == 1 and values[0]:
                    attrs[k] = values[0]
    return out


def _version_table(rows: pl.DataFrame, hists: pl.DataFrame, labels: pl.DataFrame, quality: pl.DataFrame,
                   keys: list[str], detail_for: list[str] | None = None) -> dict | list:
    """VersionStats per group of `keys`, with the group's tenants, from the held version
    sums, histograms and label sets (signals/held.py); for (model, model_version) a list of
    (model, version, stats, tenants), for (model,) a dict (model,) → (model, stats, tenants).

    Each carries its per-minute counts and latency histograms, for the rollout tests
    (signals/rollout.py); one group-by per table, not one per version. `detail_for`: only
    these models need them (the stable side of models with no canary is never compared)."""
    if not rows.height:
        return [] if len(keys) == 2 else {}
    cost = (pl.col("gpu_seconds") * pl.col("_usd_per_gpu_s"))
    sums = rows.group_by(keys).agg(
        pl.col("requests").sum(), pl.col("bad").sum(), pl.col("timeouts").sum(), cost.sum().alias("gpu_cost"),
        pl.col("output_tokens").sum(), pl.col("audio_seconds").sum(), pl.col("successful_audio_ms").sum(),
        pl.col("model_version").unique().alias("versions"),
    ).join(labels.group_by(keys).agg(pl.col("tenant").unique().alias("tenants")), on=keys, how="left")
    if detail_for is not None:
        rows, detailed_hists = (f.filter(pl.col("model").is_in(detail_for)) for f in (rows, hists))
    else:
        detailed_hists = hists
    minutes = rows.group_by(*keys, MINUTE).agg(
        pl.col("requests").sum(), pl.col("bad").sum(), cost.sum().alias("gpu_cost"), pl.col("output_tokens").sum(),
        pl.col("audio_seconds").sum(), *[pl.col(c).sum() for c in SPEECH_SUMS],
    ).sort(*keys, MINUTE)
    # Histograms per group and minute (the rollout's rank tests compare within minutes), and
    # their sums per group (the p99s shown), from the held bins.
    minute_hists: dict[str, dict[tuple, dict[int, int]]] = {}
    quantile_frames = []
    by = [*keys, MINUTE]
    for col, name in VERSION_HISTOGRAMS:
        long_m = detailed_hists.filter(pl.col("field") == col).group_by(*by, "bin").agg(pl.col("n").sum())
        quantile_frames.append(_bin_quantiles(hists.filter(pl.col("field") == col), keys, {name: 0.99}))
        per_minute_bins = minute_hists.setdefault(name, {})
        for group, bins, ns in long_m.group_by(by).agg("bin", "n").select(
                pl.struct(by).alias("_k"), "bin", "n").iter_rows():
            per_minute_bins[tuple(group[k] for k in by)] = dict(zip(bins, ns))
    # Sampled evaluations per group, language and minute (the WER gate by language slice).
    languages: dict[tuple, dict[str, list[QualityMinute]]] = {}
    if quality.height:
        per_language = quality.group_by(*keys, "language", MINUTE).agg(
            pl.col(c).sum() for c in WER_SUMS).sort(*keys, "language", MINUTE)
        for r in per_language.iter_rows(named=True):
            languages.setdefault(tuple(r[k] for k in keys), {}).setdefault(r["language"], []).append(QualityMinute(
                int(r[MINUTE]), int(r["evals"]), int(r["word_errors"]), int(r["reference_words"])))
    per_minute: dict[tuple, list] = {}
    for r in minutes.iter_rows(named=True):
        key = tuple(r[k] for k in keys)
        per_minute.setdefault(key, []).append(MinuteCounts(
            int(r["_m"]), int(r["requests"]), int(r["bad"]), float(r["gpu_cost"] or 0.0), int(r["output_tokens"]),
            float(r["audio_seconds"]), minute_hists["fo"].get((*key, r["_m"])), minute_hists["e2e"].get((*key, r["_m"])),
            minute_hists["itl"].get((*key, r["_m"])), successful_audio_seconds=r["successful_audio_ms"] / 1000,
            underrun_reported=int(r["underrun_reported"]), underrun_streams=int(r["underrun_streams"])))
    qs = quantile_frames[0]
    for more in quantile_frames[1:]:
        qs = qs.join(more, on=keys, how="full", coalesce=True)
    sums = sums.join(qs, on=keys, how="left")
    out_list, out_dict = [], {}
    for r in sums.sort(keys).iter_rows(named=True):
        key = tuple(r[k] for k in keys)
        label = r["model_version"] if len(keys) == 2 else ",".join(sorted(v for v in r["versions"] if v))
        stats = VersionStats(
            version=label, requests=int(r["requests"]), bad=int(r["bad"]), timeouts=int(r["timeouts"]),
            first_output_p99_ms=float(r["fo"]) if r["fo"] is not None else None,
            e2e_p99_ms=float(r["e2e"]) if r["e2e"] is not None else None,
            inter_token_p99_ms=float(r["itl"]) if r["itl"] is not None else None,
            gpu_cost=round(float(r["gpu_cost"] or 0.0), 6), output_tokens=int(r["output_tokens"]),
            audio_seconds=float(r["audio_seconds"]), successful_audio_seconds=r["successful_audio_ms"] / 1000,
            per_minute=tuple(per_minute.get(key, ())),
            languages={lang: tuple(rows_) for lang, rows_ in languages.get(key, {}).items()} or None)
        if len(keys) == 2:
            out_list.append((r["model"], r["model_version"], stats, frozenset(r["tenants"])))
        else:
            out_dict[(r["model"],)] = (r["model"], stats, frozenset(r["tenants"]))
    return out_list if len(keys) == 2 else out_dict


def pool_minutes(requests: RequestRollup, gpu: pl.DataFrame, lo: int, hi: int, first_output_slo_ms,
                 queue_age_slo_ms: float) -> list[PoolMinute]:
    """Per pool and closed minute in [lo, hi]: work, warm replicas, and whether queue-age
    p95 and first-output p95 held (`first_output_slo_ms(attributes)` gives the threshold).
    Attributes come from the label sets seen since `lo`."""
    if not requests.height:
        return []
    req = requests.pools.filter(pl.col("_m").is_between(lo, hi))
    gpu = gpu.with_columns(minute_col()).filter(pl.col("_m").is_between(lo, hi))
    if not req.height or not gpu.height:
        return []
    work = capped_work(req, gpu).select("pool", "_m", (pl.col("gpu_seconds") / 60).alias("work"))
    fo = _bin_quantiles(requests.pool_bins.filter(pl.col("_m").is_between(lo, hi)), ["pool", "_m"], {"fo_p95": 0.95})
    per = gpu.group_by("pool", "_m").agg(
        (pl.col("replica_state") == "warm").sum().alias("warm"),
        pl.col("oldest_queue_age_ms_max").quantile(0.95, interpolation="higher").alias("queue_p95"),
    ).join(work, on=["pool", "_m"]).join(fo, on=["pool", "_m"], how="left").sort("pool", "_m")
    thresholds = {pool: first_output_slo_ms(attrs)
                  for pool, attrs in pool_attributes(requests.labels.filter(pl.col("_m") >= lo), gpu).items()}
    out = []
    for pool, minute, warm, queue_p95, w, fo_p95 in per.select("pool", "_m", "warm", "queue_p95", "work", "fo_p95").iter_rows():
        if not pool:
            continue
        threshold = thresholds.get(pool)
        held = (queue_p95 or 0.0) <= queue_age_slo_ms and (threshold is None or (fo_p95 or 0.0) <= threshold)
        out.append(PoolMinute(pool, int(minute), float(w), int(warm), held))
    return out


# ---- SLO and alert reads ------------------------------------------------------------
def _ordered(states: list[SliceView]) -> list[SliceView]:
    """By SLO and slice labels, so answers do not depend on the order slices first appeared."""
    return sorted(states, key=lambda st: (st.spec.name, sorted(st.labels.items())))


def slo_reads(states: list[SliceView]) -> list[dict]:
    by_slo: dict[str, dict] = {}
    for st in _ordered(states):
        spec = st.spec
        entry = by_slo.setdefault(spec.name, {
            "name": spec.name, "description": spec.description, "objective": spec.objective,
            "window": span(spec.period_minutes), "slice_by": list(spec.slice_by), "selector": dict(spec.selector),
            "slices": [],
        })
        status = st.status()
        entry["slices"].append({
            "labels": dict(st.labels), "sli": status.sli, "sli_upper": status.sli_upper,
            "undecided_events": status.undecided_events, "error_budget_remaining": status.error_budget_remaining,
            "burn_rates": {span(m): b for m, b in status.burn_rates.items() if b is not None},
            "minutes_to_exhaustion": status.minutes_to_exhaustion, "firing": status.firing,
            "as_of": rfc3339(status.minute + 1) if status.minute else None,
        })
    return [by_slo[k] for k in sorted(by_slo)]


def firing_alerts(states: list[SliceView], details: dict[str, str]) -> list[dict]:
    out = []
    for st in _ordered(states):
        for fp, (aw, started) in sorted(st.firing.items()):
            out.append({"fingerprint": fp, "alertname": f"SLOBurn{aw.severity.capitalize()}", "severity": aw.severity,
                        "slo": st.spec.name, "window": aw.name, "labels": dict(st.labels), "since": rfc3339(started),
                        "runbook": st.spec.runbook, **({"detail": details[fp]} if fp in details else {})})
        if st.no_data_since is not None:
            out.append({"fingerprint": None, "alertname": "SLONoData", "severity": "ticket", "slo": st.spec.name,
                        "window": "no-data", "labels": dict(st.labels), "since": rfc3339(st.no_data_since),
                        "runbook": "runbooks/slo-no-data.md"})
    return out


# ---- small pure helpers ---------------------------------------------------------------

def _pool_burn_rate(attrs: dict[str, str], states: list[SliceView]) -> float | None:
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



