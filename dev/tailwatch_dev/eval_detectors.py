"""`tailwatch eval detectors`: run a labelled scenario through the real pipeline and score
the detectors against its truth. With `--trace FILE`: a quiet day built from a public trace
and the same day with every incident kind injected (see "public traces" below).

Embedded broker (a fresh one on a free port) → simulator events published to Kafka → the
real worker with the detector stage, until the topics are drained → the store's
`detections` → `tailwatch_dev.detector_scoring.score` → a table per detector: recall over the
labelled incidents, false alerts per simulated day, median delay from incident start to
first detection (event-time minutes).
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tailwatch.detectors import config as detector_config
from tailwatch_dev.detector_scoring import (
    DetectorScore,
    ObservedDetection,
    merge,
    parse_truth,
    score,
)
from tailwatch.ingest.producer import EventPublisher
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.store.connection import connect
from tailwatch.streams.detector_stage import DetectorStage
from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics

# Incident scenarios start at 08:00 (diurnal load rising toward its peak) and run 200
# minutes; the quiet day runs a whole day from midnight. Rates are scaled down (the
# detectors' minimum-sample floors are met at 0.3) so a run takes seconds, not minutes.
EVAL_SCENARIOS = ("retry-storm", "queue-saturation", "busy-but-slow", "idle-but-slow", "kv-pressure",
                  "prompt-growth", "cold-start", "cost-regression", "silent-degradation", "cold-voice-storm",
                  "partial-churn", "prompt-cache-collapse", "voice-quality-drop", "voice-fallback-surge",
                  "speculative-acceptance-drop", "tenant-starving", "quiet-day")
SUITE = "detector-suite"  # every kind once, in 240 minutes: the test suite's scenario
INCIDENT_START = "2026-11-02T08:00:00Z"
DAY_START = "2026-11-02T00:00:00Z"
DEFAULT_RATE_SCALE = 0.3
DEFAULT_GPU_SAMPLES = 2
# Answered ASR and TTS requests sampled for evaluation (eval.v1: WER counts, MOS proxies), as a
# fleet's scorer would: the voice-quality detector reads nothing else.
DEFAULT_EVAL_SHARE = 0.2


@dataclass(frozen=True)
class EvalRun:
    scenario: str
    seed: int
    minutes: int
    events: int
    scores: dict[str, DetectorScore]
    detections: list[ObservedDetection]
    store_path: str | None  # None: a scratch store, removed after scoring


def default_minutes(scenario: str) -> int:
    return {"quiet-day": 1440, SUITE: 240}.get(scenario, 200)


def run_scenario(scenario: str, seed: int = 7, minutes: int | None = None, rate_scale: float = DEFAULT_RATE_SCALE,
                 kafka: KafkaSettings | None = None, store_path: str | None = None,
                 cfg: detector_config.DetectorsConfig | None = None,
                 progress=None) -> EvalRun:
    """One scenario through the real broker and worker. With `kafka` given (a test's own
    broker and topic prefix) no broker is started."""
    say = progress or (lambda _line: None)
    minutes = minutes or default_minutes(scenario)
    start = DAY_START if scenario == "quiet-day" else INCIDENT_START
    sim = FleetSimulator(scenario, minutes, seed, start, rate_scale, gpu_samples_per_minute=DEFAULT_GPU_SAMPLES,
                         eval_share=DEFAULT_EVAL_SHARE)
    broker = None
    scratch = None
    if store_path is None:
        scratch = tempfile.mkdtemp(prefix="tw-eval-")  # removed after scoring
        store_path = str(Path(scratch) / "eval.duckdb")
    elif Path(store_path).exists():
        Path(store_path).unlink()  # the broker is new: so is the store
    try:
        if kafka is None:
            broker = EmbeddedBroker(port=free_port())
            say(f"{scenario}: starting the embedded broker")
            broker.start()
            kafka = KafkaSettings(bootstrap_servers=broker.bootstrap)
        ensure_topics(kafka, partitions=2)
        label = f"{scenario} (seed {seed})"
        publish(kafka, sim.events(), lambda n: say(f"{label}: published {n:,} events"))
        events = sim.totals.requests + sim.totals.gpu_samples
        stage = run_worker(kafka, store_path, cfg, f"tw-eval-{scenario}-{seed}", lambda line: say(f"{label}: {line}"))
    finally:
        if broker is not None:
            broker.stop()
    detections = read_detections(store_path)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
        store_path = None
    truth = parse_truth(sim.truth())
    names = list(stage.cfg.enabled())
    scores = score(detections, truth, names, minutes)
    return EvalRun(scenario, seed, minutes, events, scores, detections, store_path)


def publish(kafka: KafkaSettings, events, progress=None) -> None:
    pub = EventPublisher(kafka)
    pub.publish_events(events, progress=progress)
    pub.close()
    del pub
    gc.collect()  # drop the Kafka client now: librdkafka would keep reconnecting to a stopped broker


def run_worker(kafka: KafkaSettings, store_path: str, cfg: detector_config.DetectorsConfig | None, group: str,
               progress=None) -> DetectorStage:
    """The real worker with the detector stage (no SLOs, no HTTP), until the topics are drained."""
    from tailwatch.streams.tiers import WorkerSettings, build

    stage = DetectorStage(cfg)
    worker = build(WorkerSettings(kafka=kafka, store_path=store_path, http_port=None, until_idle_s=2.0,
                                  slos=None, publish_sli=False, partitions=2, stages=[stage],
                                  group_id=group, progress=progress))
    worker.run()
    del worker
    gc.collect()
    return stage


def read_detections(store_path: str) -> list[ObservedDetection]:
    con = connect(store_path, read_only=True)
    try:
        rows = con.execute("SELECT detector, slice, started_at, ended_at FROM detections ORDER BY started_at, detector").fetchall()
    finally:
        con.close()
    epoch = datetime(1970, 1, 1)
    minute = lambda t: None if t is None else int((t - epoch).total_seconds()) // 60
    return [ObservedDetection(d, json.loads(s), minute(a), minute(b)) for d, s, a, b in rows]


def table_rows(scores: dict[str, DetectorScore]) -> list[list]:
    rows = []
    for name in detector_config.DETECTOR_NAMES:
        s = scores.get(name)
        if s is None:
            continue
        rows.append([
            name, s.incidents, s.hit, "-" if s.recall is None else f"{s.recall:.2f}",
            s.false_alerts, "-" if s.false_alerts_per_day is None else f"{s.false_alerts_per_day:.2f}",
            s.explained, "-" if s.median_delay_minutes is None else f"{s.median_delay_minutes:g}",
            max(s.delays_minutes) if s.delays_minutes else "-",
        ])
    return rows


COLUMNS = ["detector", "incidents", "detected", "recall", "false_alerts", "false_per_day", "explained", "median_delay_min",
           "max_delay_min"]


def cmd_eval_detectors(scenarios: list[str], seed: int, minutes: int | None, rate_scale: float,
                       detectors_file: str | None) -> int:
    from tailwatch.cli import progress, progress_done
    from tailwatch.table import render

    cfg = detector_config.load(None if detectors_file in (None, "default") else detectors_file)
    runs = []
    started = time.monotonic()
    for name in scenarios:
        run = run_scenario(name, seed, minutes, rate_scale, cfg=cfg, progress=progress)
        progress_done()
        runs.append(run)
        print(f"\nscenario {name}, seed {seed}: {run.minutes} simulated minutes, {run.events:,} events, "
              f"{len(run.detections)} detections")
        # Per scenario, the detectors it concerns: those with incidents or detections in it.
        print(render(COLUMNS, [r for r in table_rows(run.scores) if r[1] or run.scores[r[0]].detections]
                     or table_rows(run.scores)))
    if len(runs) > 1:
        total = merge([r.scores for r in runs])
        days = sum(r.minutes for r in runs) / 1440
        print(f"\nall scenarios, seed {seed}: {days:.2f} simulated days")
        print(render(COLUMNS, table_rows(total)))
    print(f"\nfinished in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


# ---- public traces: a quiet day built from a real trace, incidents injected into it ---------
#
# `tailwatch eval detectors --trace FILE`. The Azure code trace and the Mooncake conversation
# trace each hold one hour of real arrivals and token counts. A day is built from that hour:
# every hour of it is the trace's hour circularly shifted by a seeded offset, thinned or
# superposed to a diurnal rate, so bursts stay bursts and token counts keep their heavy tails.
# Six pools (two models × three zones, four replicas each) serve it first come first served;
# a request's queue wait, GPU-seconds (service time ÷ sequences batched per replica) and the
# GPU samples (utilisation, oldest queued request, KV-cache usage) follow from that replay.
#
# The detectors are fed the buckets the worker would produce, through the worker's own
# windowing (`MinuteWindows` with the `streams.aggregates` specs) and `Minute`, without Kafka.
# Why not the broker: an Azure trace day is 3.7 million events (Mooncake's 0.66 million).
# The simulator scenarios here went through broker + worker at 12,000-14,000 events/s on
# this 2-core machine, so one Azure day would take about 5 minutes in the worker alone,
# plus publishing; both traces' two days, 20 minutes or more. Windowed directly, all four
# take 75 s. The detectors see the same closed minutes either way (late events aside: the
# trace's events are generated in event-time order, so none is late).

TRACE_REPLICAS = 4
TRACE_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
# Each model's pools, by zone: the trace's rate × this × diurnal. The second model is small,
# so that cost and latency judgements meet heavy tails at low volume.
TRACE_BASE_FACTORS = ((1.0, 0.7, 0.5), (0.35, 0.2, 0.12))
TRACE_VERSION = "v1"
TRACE_PEAK_UTILISATION = 0.35  # replicas sized so the busiest pool is this busy at the daily peak
TRACE_MIN_SLOTS = 16  # sequences batched per replica at least: a light trace is scaled up to fill them
TRACE_KINDS: tuple[str, ...] = ("retry_storm", "queue_age", "busy_but_slow", "idle_but_slow", "kv_cache_pressure",
               "prompt_growth", "cold_start", "cost_regression", "anomaly")
TRACE_EVAL_START = "2026-11-02T00:00:00Z"
# Kinds only a trace that says how much of each prompt its prefix cache could serve can carry.
REUSE_KINDS: tuple[str, ...] = ("prompt_cache_collapse",)


def trace_kinds(path: str | Path) -> tuple[str, ...]:
    """The incident kinds a trace day carries: every trace's, and the prefix-cache collapse for a
    trace with prefix block ids (Mooncake), whose real reuse is the quiet baseline."""
    from tailwatch_dev.trace import is_azure_csv

    return TRACE_KINDS + (() if is_azure_csv(path) else REUSE_KINDS)


def trace_model_names(path: str | Path) -> tuple[str, str]:
    stem = Path(path).stem.lower()
    base = "chat-llm" if "conversation" in stem or "mooncake" in str(path).lower() else "code-llm"
    return (f"{base}-a", f"{base}-b")


@dataclass(frozen=True)
class TracePool:
    pool: str
    model: str
    zone: str
    factor: float

    @property
    def labels(self) -> dict[str, str]:
        return {"pool": self.pool, "model": self.model, "zone": self.zone, "workload": "llm",
                "model_version": TRACE_VERSION, "traffic_class": "realtime", "deployment": "stable"}


def trace_pools(path: str | Path) -> list[TracePool]:
    out = []
    for mi, model in enumerate(trace_model_names(path)):
        for zi, zone in enumerate(TRACE_ZONES):
            factor = TRACE_BASE_FACTORS[mi][zi]
            out.append(TracePool(f"{model}-{zone}", model, zone, factor))
    return out


def diurnal(minute: int) -> float:
    """0.5 at 03:00, 1.0 at 15:00."""
    import math

    return 0.75 + 0.25 * math.cos(2 * math.pi * (minute / 60 - 15) / 24)


def trace_incidents(pools: list[TracePool], minutes: int, seed: int, repeats: int = 3,
                    first_minute: int = 120, gap_minutes: int = 25, kinds: tuple[str, ...] = TRACE_KINDS) -> list:
    """Each detector's kind `repeats` times, one after another from `first_minute`, on
    seeded slices, with the same effects (and `related` kinds) as the simulator's scenarios.
    Incidents that would end past `minutes` are left out."""
    import numpy as np

    from tailwatch_dev.simulator import Incident

    rng = np.random.default_rng(seed + 1000)
    models = sorted({p.model for p in pools})
    out = []
    t = first_minute
    for r in range(repeats):
        for kind in rng.permutation(kinds):
            p = pools[int(rng.integers(0, len(pools)))]
            model = p.model if kind not in ("prompt_growth", "cost_regression", "anomaly", "prompt_cache_collapse") \
                else models[r % len(models)]
            pool_sel = {"pool": p.pool, "model": p.model}
            name = f"{kind}-{r + 1}"
            if kind == "retry_storm":
                inc = Incident(name, kind, t, t + 10, {"workload": "llm", "model": p.model, "zone": p.zone},
                               error_ratio=0.3, retry_attempts=3, related=("anomaly", "cost_regression"))
            elif kind == "queue_age":
                inc = Incident(name, kind, t, t + 12, pool_sel, queue_ms=3000,
                               related=("idle_but_slow", "busy_but_slow", "anomaly"))
            elif kind == "busy_but_slow":
                inc = Incident(name, kind, t, t + 18, pool_sel, leak_traffic_class="replay", extra_rate_factor=0.8,
                               util_pct_floor=92, queue_ms=2500, latency_factor=1.3,
                               related=("queue_age", "anomaly", "cost_regression"))
            elif kind == "idle_but_slow":
                inc = Incident(name, kind, t, t + 18, pool_sel, util_pct_cap=20, latency_factor=3.0, related=("anomaly",))
            elif kind == "kv_cache_pressure":
                inc = Incident(name, kind, t, t + 18, pool_sel, kv_cache_usage=0.96, preemptions_per_sample=1.5,
                               latency_factor=1.2, related=("anomaly",))
            elif kind == "prompt_growth":
                inc = Incident(name, kind, t, t + 20, {"model": model}, prompt_tokens_factor=3.0,
                               related=("anomaly", "kv_cache_pressure", "cost_regression", "queue_age",
                                        "busy_but_slow", "idle_but_slow"))
            elif kind == "cold_start":
                inc = Incident(name, kind, t, t + 9, pool_sel, cold_replicas=3, queue_ms=600,
                               related=("queue_age", "busy_but_slow", "idle_but_slow", "anomaly"))
            elif kind == "prompt_cache_collapse":
                inc = Incident(name, kind, t, t + 20, {"model": model}, prompt_cache_factor=0.05, related=("anomaly",))
            elif kind == "cost_regression":
                inc = Incident(name, kind, t, t + 35, {"model": model}, cost_factor=1.6, related=("anomaly",))
            else:
                inc = Incident(name, kind, t, t + 28, {"model": model, "model_version": TRACE_VERSION},
                               output_tokens_factor=0.05)
            if inc.end_min > minutes:
                return out
            out.append(inc)
            t = inc.end_min + gap_minutes
    return out


def _day_arrivals(trace: "np.ndarray", factor: float, minutes: int, rng) -> "np.ndarray":
    """(arrival ms from the day's start, prompt, output) for `minutes`: hour by hour the trace's
    hour shifted by a random offset, at `factor` × diurnal × the trace's rate (superposed
    copies, each thinned), so that the hour's bursts and heavy tails stay."""
    import math

    import numpy as np

    span = float(trace[-1, 0]) + 1.0
    parts = []
    hour_ms = 3_600_000.0
    for h in range(math.ceil(minutes / 60)):
        rate = factor * diurnal(h * 60 + 30)
        copies = max(1, math.ceil(rate))
        for _ in range(copies):
            keep = rng.random(len(trace)) < rate / copies
            part = trace[keep].copy()
            part[:, 0] = (part[:, 0] + rng.uniform(0, span)) % span * (hour_ms / span) + h * hour_ms
            parts.append(part)
    out = np.concatenate(parts)
    out = out[out[:, 0] < minutes * 60_000]
    return out[np.argsort(out[:, 0], kind="stable")]


def _serve(arrival_ms, service_ms, slots: int):
    import heapq

    import numpy as np

    free = [0.0] * slots
    start = np.empty(len(arrival_ms))
    for i, (a, s) in enumerate(zip(arrival_ms.tolist(), service_ms.tolist())):
        st = max(a, heapq.heappop(free))
        start[i] = st
        heapq.heappush(free, st + s)
    return start


def _oldest_queue_age(arrival, start, minutes: int):
    """Per minute, the age of the oldest request waiting at any time in it."""
    import numpy as np

    out = np.zeros(minutes)
    waited = start > arrival + 1e-9
    for a, st in zip(arrival[waited].tolist(), start[waited].tolist()):
        for m in range(int(a // 60_000), min(minutes, int((st - 1) // 60_000) + 1)):
            out[m] = max(out[m], min(st, (m + 1) * 60_000) - a)
    return out


@dataclass
class TraceDay:
    """A trace day's request and GPU events as the worker's decoded frames, per hour."""

    trace: str
    minutes: int
    pools: list[TracePool]
    incidents: list
    start_ms: int
    requests: list  # per pool: a polars frame of request events (REQUEST_COLUMNS + ts_ms)
    gpu: list  # per pool: a polars frame of GPU samples (GPU_COLUMNS + ts_ms)

    @property
    def events(self) -> int:
        return sum(f.height for f in self.requests) + sum(f.height for f in self.gpu)

    def truth(self) -> list[dict]:
        from tailwatch_dev.simulator import _iso

        return [{"incident": i.name, "kind": i.kind, "start": _iso(self.start_ms + i.start_min * 60_000),
                 "end": _iso(self.start_ms + i.end_min * 60_000), "selector": i.selector,
                 "related": list(i.related)} for i in self.incidents]


def _active_per_minute(incidents: list, labels: dict[str, str], minutes: int) -> list[list]:
    act: list[list] = [[] for _ in range(minutes)]
    for inc in incidents:
        if all(labels.get(k) == v for k, v in inc.selector.items()):
            for m in range(max(0, inc.start_min), min(minutes, inc.end_min)):
                act[m].append(inc)
    return act


@dataclass(frozen=True)
class TraceCanary:
    """A canary version of one model taking `share` of its turns from `start_minute` on."""

    model: str
    version: str = "v2-rc1"
    share: float = 0.15
    start_minute: int = 30
    error_rate: float = 0.0  # added to the stable error rate
    gpu_seconds_factor: float = 1.0


def build_trace_day(path: str | Path, minutes: int = 1440, seed: int = 7, incidents: bool = True,
                    repeats: int = 3, start: str = TRACE_EVAL_START, canary: TraceCanary | None = None) -> TraceDay:
    """Request events and GPU samples of six pools serving the trace for `minutes`, with each
    detector's incident kind injected `repeats` times (none when `incidents` is False), and
    optionally a canary version of one model."""
    import math

    import numpy as np
    import polars as pl

    from tailwatch_dev.simulator import parse_start
    from tailwatch_dev.trace import DECODE_MS_PER_TOKEN, PREFILL_MS_PER_TOKEN, read_prefix_reuse
    from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS

    trace = np.array(read_prefix_reuse(path), dtype=float)  # arrival, prompt, output, cached (NaN: unknown)
    pools = trace_pools(path)
    incs = trace_incidents(pools, minutes, seed, repeats, kinds=trace_kinds(path)) if incidents else []
    start_ms = parse_start(start)
    rng = np.random.default_rng(seed)
    span_s = (float(trace[-1, 0]) + 1.0) / 1000
    mean_service_ms = float(np.mean(60 + trace[:, 1] * PREFILL_MS_PER_TOKEN + trace[:, 2] * DECODE_MS_PER_TOKEN))
    peak_concurrency = len(trace) / span_s * TRACE_BASE_FACTORS[0][0] * mean_service_ms / 1000
    # A trace too light to keep a replica's batch busy is superposed on itself (shifted copies).
    scale = max(1.0, TRACE_MIN_SLOTS * TRACE_REPLICAS * TRACE_PEAK_UTILISATION / peak_concurrency)
    slots = max(TRACE_MIN_SLOTS, math.ceil(peak_concurrency * scale / TRACE_PEAK_UTILISATION / TRACE_REPLICAS))
    req_frames, gpu_frames = [], []
    for pi, p in enumerate(pools):
        labels = p.labels
        act = _active_per_minute(incs, labels, minutes)
        rows = _day_arrivals(trace, p.factor * scale, minutes, rng)
        arrival, prompt, output = rows[:, 0], rows[:, 1].copy(), rows[:, 2].copy()
        minute = (arrival // 60_000).astype(np.int64)
        per_min = lambda attr, op: np.array([op([getattr(i, attr) for i in a]) if a else 0.0 for a in act])
        prod = lambda attr: np.array([math.prod(getattr(i, attr) for i in a) for a in act])
        # The trace's own prefix reuse (a longer prompt keeps its cached prefix; a collapse loses it).
        cached = np.floor(rows[:, 3] * prod("prompt_cache_factor")[minute])
        prompt = np.round(prompt * prod("prompt_tokens_factor")[minute])
        output = np.round(output * prod("output_tokens_factor")[minute])
        tclass = np.full(len(arrival), "realtime", dtype=object)
        # Traffic leaking in (busy-but-slow): extra requests drawn from the same minutes' trace rows.
        extra = per_min("extra_rate_factor", sum)
        if extra.any():
            leak = rng.random(len(arrival)) < extra[minute]
            arrival = np.concatenate([arrival, arrival[leak] + rng.uniform(0, 500, leak.sum())])
            prompt, output = np.concatenate([prompt, prompt[leak]]), np.concatenate([output, output[leak]])
            cached = np.concatenate([cached, cached[leak]])
            classes = [next((i.leak_traffic_class for i in a if i.leak_traffic_class), "realtime") for a in act]
            tclass = np.concatenate([tclass, np.array([classes[m] for m in minute[leak]], dtype=object)])
            order = np.argsort(arrival, kind="stable")
            arrival, prompt, output, tclass, cached = (arrival[order], prompt[order], output[order], tclass[order],
                                                       cached[order])
            keep = arrival < minutes * 60_000
            arrival, prompt, output, tclass, cached = arrival[keep], prompt[keep], output[keep], tclass[keep], cached[keep]
            minute = (arrival // 60_000).astype(np.int64)
        n = len(arrival)
        first_ms = 60 + prompt * PREFILL_MS_PER_TOKEN
        service = first_ms + output * DECODE_MS_PER_TOKEN
        start_t = _serve(arrival, service, TRACE_REPLICAS * slots)
        wait = start_t - arrival
        queue_age = _oldest_queue_age(arrival, start_t, minutes)
        lat = prod("latency_factor")[minute]
        add_q = per_min("queue_ms", sum)
        q = wait + add_q[minute] + rng.lognormal(math.log(8), 0.5, n)
        cost = prod("cost_factor")
        gpu_s = service / 1000 / slots * cost[minute]
        first = q + first_ms * lat  # time to first token: the wait, then the (slowed) prefill
        e2e = q + service * lat
        # Failures: 0.3% of first attempts fail and are retried once; a retry storm fails
        # `error_ratio` of attempts and retries up to `retry_attempts` times.
        err = 0.003 + per_min("error_ratio", sum)[minute]
        is_canary = np.zeros(n, dtype=bool)
        if canary is not None and canary.model == p.model:
            is_canary = (rng.random(n) < canary.share) & (arrival >= canary.start_minute * 60_000)
            err = err + np.where(is_canary, canary.error_rate, 0.0)
            gpu_s = gpu_s * np.where(is_canary, canary.gpu_seconds_factor, 1.0)
        tries = np.maximum(2, per_min("retry_attempts", max)[minute].astype(int))
        ids = np.array([f"t{seed:x}-{pi}-{i:x}" for i in range(n)], dtype=object)
        status = np.where(rng.random(n) < err, "error", "ok")
        cols = {"id": [ids], "retry_of": [np.full(n, None, dtype=object)], "attempt": [np.ones(n, np.int32)],
                "status": [status], "ts": [arrival + e2e], "i": [np.arange(n)]}
        pending = np.flatnonzero(status == "error")
        attempt = 1
        while pending.size:
            attempt += 1
            pending = pending[tries[pending] >= attempt]
            if not pending.size:
                break
            st = np.where(rng.random(pending.size) < err[pending], "error", "ok")
            cols["id"].append(np.array([f"{ids[i]}-r{attempt}" for i in pending], dtype=object))
            cols["retry_of"].append(ids[pending])
            cols["attempt"].append(np.full(pending.size, attempt, np.int32))
            cols["status"].append(st)
            cols["ts"].append(arrival[pending] + e2e[pending] + 200.0 * (attempt - 1) * attempt)
            cols["i"].append(pending)
            pending = pending[st == "error"]
        i = np.concatenate(cols["i"])
        st = np.concatenate(cols["status"])
        ok = st == "ok"
        frame = pl.DataFrame({
            "event_id": np.concatenate(cols["id"]).tolist(),
            "retry_of": np.concatenate(cols["retry_of"]).tolist(),
            "attempt": np.concatenate(cols["attempt"]),
            "status": st.tolist(),
            "ts_ms": np.concatenate(cols["ts"]).astype(np.int64) + start_ms,
            "traffic_class": tclass[i].tolist(),
            "queue_ms": np.round(q[i], 2),
            "first_output_ms": np.where(ok, np.round(first[i], 2), np.nan),
            "e2e_ms": np.round(e2e[i], 2),
            "prompt_tokens": prompt[i].astype(np.int64),
            "cached_prompt_tokens": cached[i],
            "output_tokens": np.where(ok, output[i], 0).astype(np.int64),
            "gpu_seconds": np.round(gpu_s[i] * np.where(ok, 1.0, 0.5), 5),
            "deployment": np.where(is_canary[i], "canary", "stable").tolist(),
            "model_version": np.where(is_canary[i], canary.version if canary else "", TRACE_VERSION).tolist(),
        }).with_columns(pl.col("first_output_ms").fill_nan(None), pl.col("cached_prompt_tokens").fill_nan(None))
        frame = frame.filter(pl.col("ts_ms") < start_ms + minutes * 60_000)
        frame = frame.with_columns(
            pl.lit("trace").alias("tenant"), pl.lit(p.model).alias("model"),
            pl.lit(p.zone).alias("zone"), pl.lit("llm").alias("workload"),
            pl.lit(p.pool).alias("pool"), pl.lit(None, pl.Boolean).alias("task_success"),
            pl.lit(None, pl.Float64).alias("audio_seconds"),
        )
        req_frames.append(frame.select(*[pl.col(c).cast(t) if c in frame.columns else pl.lit(None, t).alias(c)
                                          for c, t in REQUEST_COLUMNS.items()], "ts_ms").sort("ts_ms"))
        # GPU samples: one per replica per minute.
        done_minute = np.minimum(((start_t + service) // 60_000).astype(int), minutes - 1)
        work = np.bincount(done_minute, weights=gpu_s, minlength=minutes) / 60  # GPU-s per s, whole pool
        util = np.clip(100 * work / TRACE_REPLICAS, 0, 100)
        m_idx = np.repeat(np.arange(minutes), TRACE_REPLICAS)
        g_idx = np.tile(np.arange(TRACE_REPLICAS), minutes)
        u = np.clip(util[m_idx] + rng.normal(0, 3, m_idx.size), 0, 100)
        floor = per_min("util_pct_floor", max)[m_idx]
        u = np.where(floor > 0, np.maximum(u, np.minimum(100, floor + rng.normal(0, 2, m_idx.size))), u)
        cap = np.array([min([i.util_pct_cap for i in a], default=100.0) for a in act])[m_idx]
        u = np.where(cap < 100, np.minimum(u, np.maximum(0, cap - np.abs(rng.normal(0, 2, m_idx.size)))), u)
        kv = np.clip(0.1 + 0.7 * util[m_idx] / 100 + rng.random(m_idx.size) * 0.05, 0, 0.89)
        kv_forced = per_min("kv_cache_usage", max)[m_idx]
        kv = np.where(kv_forced > 0, np.minimum(1.0, kv_forced + rng.random(m_idx.size) * 0.03), kv)
        pre_rate = per_min("preemptions_per_sample", sum)[m_idx]
        pre = np.where(pre_rate > 0, rng.poisson(np.maximum(pre_rate, 0)), 0)
        cold = g_idx < per_min("cold_replicas", max)[m_idx]
        qa = queue_age[m_idx] + add_q[m_idx] + rng.lognormal(math.log(20), 0.5, m_idx.size)
        gpu = pl.DataFrame({
            "node": [f"{p.pool}-n{g}" for g in g_idx], "gpu_index": np.zeros(m_idx.size, np.int32),
            "ts_ms": start_ms + m_idx * 60_000 + 1000 + g_idx * 37,
            "util_pct": np.round(np.where(cold, rng.uniform(0, 5, m_idx.size), u), 1),
            "replica_state": np.where(cold, "loading", "warm").tolist(),
            "queue_depth": np.where(cold, rng.poisson(6, m_idx.size), rng.poisson(1 + qa / 400)).astype(np.int64),
            "oldest_queue_age_ms": np.round(qa, 1),
            "kv_cache_usage": np.round(kv, 3), "preemptions": pre.astype(np.int64),
            "running": np.zeros(m_idx.size, np.int64),
        }).with_columns(pl.lit(p.zone).alias("zone"), pl.lit(p.pool).alias("pool"), pl.lit("H100").alias("gpu_sku"),
                        pl.lit(p.model).alias("model"), pl.lit(TRACE_VERSION).alias("model_version"),
                        pl.lit("runtime").alias("source"))
        gpu = gpu.with_columns(*[pl.lit(None).cast(t).alias(c) for c, t in GPU_COLUMNS.items() if c not in gpu.columns])
        gpu_frames.append(gpu.select(*[pl.col(c).cast(t) for c, t in GPU_COLUMNS.items()], "ts_ms"))
    return TraceDay(str(path), minutes, pools, incs, start_ms, req_frames, gpu_frames)


def trace_day_buckets(day: TraceDay, chunk_minutes: int = 60):
    """Closed (minute, sli_minute rows, gpu_minute rows) in event-time order, through the
    worker's windowing (`MinuteWindows` and the `streams.aggregates` specs)."""
    import polars as pl

    from tailwatch.streams.aggregates import GPU, REQUESTS
    from tailwatch.streams.minute_windows import MinuteWindows

    req_windows = MinuteWindows(REQUESTS, allowed_lateness_ms=5 * 60_000)
    gpu_windows = MinuteWindows(GPU, allowed_lateness_ms=5 * 60_000)
    for c0 in range(0, day.minutes, chunk_minutes):
        lo, hi = day.start_ms + c0 * 60_000, day.start_ms + min(day.minutes, c0 + chunk_minutes) * 60_000
        closed = {}
        for windows, frames, key in ((req_windows, day.requests, "req"), (gpu_windows, day.gpu, "gpu")):
            # In event-time order, as one partition: pool after pool would read as hours late.
            part = pl.concat([f.filter((pl.col("ts_ms") >= lo) & (pl.col("ts_ms") < hi)) for f in frames]).sort("ts_ms")
            part = part.with_columns(pl.lit(0, pl.Int32).alias("_partition"),
                                     pl.arange(0, part.height, dtype=pl.Int64).alias("_offset"),
                                     pl.arange(0, part.height, dtype=pl.Int64).alias("_index"))
            windows.add(part)
            rows, _ = windows.close(hi // 60_000)
            closed[key] = _split(rows)
        for m in range(lo // 60_000, hi // 60_000):
            yield m, closed["req"].get(m), closed["gpu"].get(m)


def write_trace_store(day: TraceDay, store_path: str | Path) -> Path:
    """A store file holding the trace day's `sli_minute` and `gpu_minute`, as the worker would
    have written them (for backtests on a history nobody here generated)."""
    import polars as pl

    reqs, gpus = [], []
    for _m, req, gpu in trace_day_buckets(day):
        if req is not None:
            reqs.append(req)
        if gpu is not None:
            gpus.append(gpu)
    con = connect(store_path)
    try:
        for table, frames in (("sli_minute", reqs), ("gpu_minute", gpus)):
            if frames:
                con.register("_tw_rows", pl.concat(frames, how="vertical_relaxed"))
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _tw_rows")
                con.unregister("_tw_rows")
    finally:
        con.close()
    return Path(store_path)


def _split(frame) -> dict:
    import polars as pl

    if frame is None or frame.height == 0 or "window_start" not in frame.columns:
        return {}
    f = frame.with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_minute"))
    return {int(m): part.drop("_minute") for (m,), part in f.partition_by("_minute", as_dict=True).items()}


def run_trace(path: str | Path, seed: int = 7, minutes: int = 1440, incidents: bool = True, repeats: int = 3,
              cfg: detector_config.DetectorsConfig | None = None, progress=None) -> EvalRun:
    """One trace day through the worker's windowing and the detectors, scored."""
    from tailwatch.detectors.core import Minute

    say = progress or (lambda _line: None)
    name = f"{Path(path).stem} {'incidents' if incidents else 'quiet day'}"
    day = build_trace_day(path, minutes, seed, incidents, repeats)
    say(f"{name}: {day.events:,} events built")
    dset = detector_config.DetectorSet(cfg)
    raised = []
    for m, req, gpu in trace_day_buckets(day):
        for ev in dset.observe(Minute(m, req, gpu)):
            if ev.state == "raised":
                raised.append(ev.detection)
        if m % 120 == 0:
            say(f"{name}: minute {m - day.start_ms // 60_000:,} of {minutes:,}")
    detections = [ObservedDetection(d.detector, dict(d.labels), d.started_at, d.ended_at) for d in raised]
    scores = score(detections, parse_truth(day.truth()), list(dset.cfg.enabled()), minutes)
    return EvalRun(name, seed, minutes, day.events, scores, detections, None)


def trace_runs(path: str | Path, seed: int = 7, minutes: int = 1440, repeats: int = 3,
               cfg: detector_config.DetectorsConfig | None = None, progress=None) -> list[EvalRun]:
    """A trace's quiet day (nothing injected) and the same trace's day with every incident kind
    injected `repeats` times (a different seed's day, so its quiet stretches count too)."""
    return [run_trace(path, seed, minutes, incidents=False, cfg=cfg, progress=progress),
            run_trace(path, seed + 1, minutes, incidents=True, repeats=repeats, cfg=cfg, progress=progress)]


def cmd_eval_traces(paths: list[str], seed: int, minutes: int, repeats: int, detectors_file: str | None) -> int:
    from tailwatch.cli import progress, progress_done
    from tailwatch.table import render

    cfg = detector_config.load(None if detectors_file in (None, "default") else detectors_file)
    started = time.monotonic()
    for path in paths:
        runs = trace_runs(path, seed, minutes, repeats, cfg, progress)
        progress_done()
        for run in runs:
            print(f"\n{run.scenario}, seed {run.seed}: {run.minutes} minutes, {run.events:,} events, "
                  f"{len(run.detections)} detections")
            print(render(COLUMNS, table_rows(run.scores)))
        total = merge([r.scores for r in runs])
        print(f"\n{Path(path).name}, both days, seed {seed}: recall, false alerts per day (quiet and incident days), "
              f"delays")
        print(render(COLUMNS, table_rows(total)))
    print(f"\nfinished in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0
