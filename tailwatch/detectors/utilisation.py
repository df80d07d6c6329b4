"""Utilisation against latency, per pool: where the GPUs and the users disagree.

- Busy but slow: GPU utilisation high while the pool's oldest-queue age rises well above
  its own trailing baseline: the pool is full, typically because batch, eval or replay
  traffic occupies a realtime pool. The evidence carries each traffic class's share of
  the pool's requests over the window, to show who is in it.
- Idle but slow: GPU utilisation low while end-to-end latency is well above the pool's
  trailing baseline: the GPUs are not the bottleneck (CPU preprocessing, a dependency,
  admission control, model load).

Useful utilisation. NVML's utilisation is the share of time some kernel ran: it reads
90%+ while most SMs idle (batch-1 decode on an H100: utilisation 77-94%, SMs a few
percent active). Where the pool's GPUs report SM activity (NVML's GPM or DCGM's
profiling fields: `sm_active_pct_mean` in `gpu_minute`), busy-but-slow tells the two
apart and says which it saw (`signal`, `verdict` in the evidence):

- `saturated`: SMs active at least `sm_active_pct_saturated` of the time: the GPUs really
  are full; move foreign traffic or add replicas.
- `busy_idle_sms`: utilisation high, SMs mostly idle: the GPUs are held by small
  kernels (small batches, per-token synchronisation), not filled; batch more (bigger
  batches, more concurrent sequences per replica) before buying GPUs.

Without SM activity it decides on utilisation alone (`signal: util_pct`, `verdict: busy`)
and says that it could not tell. Idle-but-slow decides on utilisation either way: SMs
cannot be active while no kernel runs, so low utilisation is conclusive on its own, and
high utilisation with idle SMs means the GPU is the bottleneck, wastefully (busy-but-slow's
`busy_idle_sms`), not that the bottleneck is elsewhere. Its evidence adds the SM activity
it saw where there is one.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailwatch.detectors.core import POOL_CLASSES, DetectionEvent, Finding, History, LatencyP95, Minute, Tracker, median
from tailwatch.config import ConfigStruct, Count, Factor, Minutes, NonNegative, Percent

BUSY = "busy_but_slow"
IDLE = "idle_but_slow"


class BusyButSlowConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    util_pct_min: Percent = 80.0  # window mean utilisation at or above this is "busy"
    queue_age_ms_min: NonNegative = 500.0  # window mean oldest-queue age must exceed this ...
    queue_age_rise_factor: Factor = 3.0  # ... and this multiple of the trailing baseline
    sm_active_pct_saturated: Percent = 50.0  # window mean SM active at or above: saturated; below: busy but idle SMs
    baseline_minutes: Minutes = 30
    min_baseline_minutes: Minutes = 10
    clear_minutes: Minutes = 3


class IdleButSlowConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    util_pct_max: Percent = 40.0  # window mean utilisation strictly below this is "idle"
    latency_field: LatencyP95 = "e2e_ms_p95"  # or first_output_ms_p95, queue_ms_p95
    latency_rise_factor: Factor = 2.0  # window latency at or above this multiple of the baseline
    min_requests: Count = 30  # requests in the window
    min_minutes_over: Minutes = 2  # minutes of the window whose own latency is at or above the rise, too
    baseline_minutes: Minutes = 120  # longer than an incident: a half-hour of short answers must not own the median
    min_baseline_minutes: Minutes = 15
    clear_minutes: Minutes = 3


@dataclass(frozen=True)
class _PoolSample:
    util_pct: float | None
    queue_age_ms: float | None
    requests: int
    latency_ms: float | None
    classes: dict[str, int]
    gpus: int = 0
    gpm_gpus: int = 0  # GPUs that reported SM activity
    gpm: dict[str, float | None] | None = None  # GPM_EVIDENCE key → the pool's mean this minute


# PoolMinute field → evidence key: useful utilisation, where the pool's GPUs report it
GPM_EVIDENCE = {"sm_active_pct_mean": "sm_active_pct_mean", "sm_occupancy_pct_mean": "sm_occupancy_pct_mean",
                "tensor_active_pct_mean": "tensor_active_pct_mean", "dram_bw_pct_mean": "dram_bw_pct_mean",
                "gr_engine_active_pct_mean": "gr_engine_active_pct_mean"}
NO_SM_ACTIVITY = "no SM activity reported (GPM or DCGM profiling): utilisation only says a kernel ran"
GR_ENGINE_FALLBACK = ("no SM activity reported; DCGM_FI_PROF_GR_ENGINE_ACTIVE stands in (coarser: the share of time "
                      "any kernel ran, not how many SMs it used); enable DCGM_FI_PROF_SM_ACTIVE for the real signal")


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _gpm_evidence(window: list[_PoolSample]) -> dict[str, float]:
    """Window means of what GPM / DCGM reported for the pool, and the share of its
    GPU-minutes that reported SM activity; {} when none did."""
    out: dict[str, float] = {}
    for key in GPM_EVIDENCE.values():
        v = _mean([(s.gpm or {}).get(key) for s in window])
        if v is not None:
            out[key] = round(v, 3)
    gpus = sum(s.gpus for s in window)
    if "sm_active_pct_mean" in out and gpus:
        out["sm_active_coverage"] = round(sum(s.gpm_gpus for s in window) / gpus, 4)
    return out


POOL_LABEL_SETS = (("pool",), POOL_CLASSES)  # what _PoolHistory.add reads


class _PoolHistory:
    """GPU and request readings per pool and minute, shared by both detectors."""

    def __init__(self, keep_minutes: int, latency_field: str):
        self.history = History(keep_minutes)
        self.latency_field = latency_field

    def add(self, m: Minute) -> None:
        pools = m.pools()
        if not pools:  # no GPU telemetry this minute: nothing to read the requests against
            self.history.trim(m.minute)
            return
        lat = {s.labels["pool"]: s for s in m.slices(("pool",)).values()}
        classes = m.traffic_classes()
        for pool, p in pools.items():
            s = lat.get(pool)
            gpm = {key: getattr(p, f) for f, key in GPM_EVIDENCE.items() if getattr(p, f) is not None}
            self.history.add((("pool", pool),), {"pool": pool, "zone": p.zone, "model": p.model}, m.minute, _PoolSample(
                util_pct=p.util_pct_mean, queue_age_ms=p.oldest_queue_age_ms_max,
                requests=s.requests if s else 0, latency_ms=getattr(s, self.latency_field) if s else None,
                classes=classes.get(pool, {}), gpus=p.gpus, gpm_gpus=p.gpm_gpus, gpm=gpm or None,
            ))
        self.history.trim(m.minute)


class BusyButSlowDetector:
    name = BUSY

    def __init__(self, cfg: BusyButSlowConfig):
        self.cfg = cfg
        self.pools = _PoolHistory(cfg.window_minutes + cfg.baseline_minutes, "queue_ms_p95")
        self.tracker = Tracker(BUSY, cfg.clear_minutes)

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return POOL_LABEL_SETS

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg, h = self.cfg, self.pools.history
        self.pools.add(m)
        findings = []
        for key in sorted(h.values):
            window = h.window(key, m.minute, cfg.window_minutes)
            base = [s.queue_age_ms for s in h.before(key, m.minute, cfg.window_minutes, cfg.baseline_minutes)
                    if s.queue_age_ms is not None]
            if not window or len(base) < cfg.min_baseline_minutes:
                continue
            util = _mean([s.util_pct for s in window])
            age = _mean([s.queue_age_ms for s in window])
            baseline = median(base)
            gpm = _gpm_evidence(window)
            sm = gpm.get("sm_active_pct_mean")
            # A stock dcgm-exporter sends GR_ENGINE_ACTIVE and not SM activity: the named fallback.
            signal = "sm_active_pct" if sm is not None else "gr_engine_active_pct"
            if sm is None:
                sm = gpm.get("gr_engine_active_pct_mean")
            # Busy on utilisation, as before GPM; a source with SM activity and no utilisation
            # (DCGM profiling alone) is busy when its SMs are saturated.
            busy = util >= cfg.util_pct_min if util is not None else (sm is not None and sm >= cfg.sm_active_pct_saturated)
            if not busy or age is None or age <= cfg.queue_age_ms_min or age < cfg.queue_age_rise_factor * baseline:
                continue
            classes: dict[str, int] = {}
            for s in window:
                for c, n in s.classes.items():
                    classes[c] = classes.get(c, 0) + n
            total = sum(classes.values())
            evidence: dict[str, float | str] = {}
            if sm is not None:
                evidence.update(signal=signal,
                                verdict="saturated" if sm >= cfg.sm_active_pct_saturated else "busy_idle_sms",
                                sm_active_pct_saturated=cfg.sm_active_pct_saturated)
                if signal == "gr_engine_active_pct":
                    evidence["note"] = GR_ENGINE_FALLBACK
            else:
                evidence.update(signal="util_pct", verdict="busy", note=NO_SM_ACTIVITY)
            if util is not None:
                evidence["util_pct_mean"] = round(util, 3)
            evidence.update(gpm)
            evidence.update({"oldest_queue_age_ms_mean": round(age, 3),
                             "oldest_queue_age_ms_baseline": round(baseline, 3), "requests": total,
                             "window_minutes": cfg.window_minutes})
            for c in sorted(classes):
                evidence[f"share_{c}"] = round(classes[c] / total, 4)
            findings.append(Finding(h.labels[key], evidence))
        return self.tracker.update(m.minute, findings)


class IdleButSlowDetector:
    name = IDLE

    def __init__(self, cfg: IdleButSlowConfig):
        self.cfg = cfg
        self.pools = _PoolHistory(cfg.window_minutes + cfg.baseline_minutes, cfg.latency_field)
        self.tracker = Tracker(IDLE, cfg.clear_minutes)

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return POOL_LABEL_SETS

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg, h = self.cfg, self.pools.history
        self.pools.add(m)
        findings = []
        for key in sorted(h.values):
            window = h.window(key, m.minute, cfg.window_minutes)
            base = [s.latency_ms for s in h.before(key, m.minute, cfg.window_minutes, cfg.baseline_minutes)
                    if s.latency_ms is not None]
            if not window or len(base) < cfg.min_baseline_minutes:
                continue
            requests = sum(s.requests for s in window)
            util = _mean([s.util_pct for s in window])
            weighted = [(s.latency_ms, s.requests) for s in window if s.latency_ms is not None and s.requests]
            if requests < cfg.min_requests or util is None or not weighted:
                continue
            latency = sum(v * n for v, n in weighted) / sum(n for _, n in weighted)
            baseline = median(base)
            # One long answer sets a quiet minute's p95 on heavy-tailed LLM work: a pool that
            # is slow stays slow, so the rise must hold minute by minute, not only on average.
            over = sum(v >= cfg.latency_rise_factor * baseline for v, _ in weighted)
            if util < cfg.util_pct_max and baseline > 0 and latency >= cfg.latency_rise_factor * baseline \
                    and over >= min(cfg.min_minutes_over, cfg.window_minutes):
                findings.append(Finding(h.labels[key], {
                    # Low utilisation is conclusive on its own (no kernel running, no SM active);
                    # the SM activity seen is shown beside it where the pool reports one.
                    "signal": "util_pct", "util_pct_mean": round(util, 3), **_gpm_evidence(window),
                    f"{cfg.latency_field}": round(latency, 3),
                    f"{cfg.latency_field}_baseline": round(baseline, 3),
                    "latency_ratio": round(latency / baseline, 4), "requests": requests,
                    "window_minutes": cfg.window_minutes, "minutes_over": over,
                }))
        return self.tracker.update(m.minute, findings)
