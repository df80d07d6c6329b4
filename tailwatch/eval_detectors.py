"""`tailwatch eval detectors`: run a labelled scenario through the real pipeline and score
the detectors against its truth.

Embedded broker (a fresh one on a free port) → simulator events published to Kafka → the
real worker with the detector stage, until the topics are drained → the store's
`detections` → `detectors.evaluation.score` → a table per detector: recall over the
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

from detectors import config as detector_config
from detectors.evaluation import (
    DetectorScore,
    ObservedDetection,
    merge,
    parse_truth,
    score,
)
from ingest.producer import EventPublisher
from ingest.simulator import FleetSimulator
from streams import store
from streams.detector_stage import DetectorStage
from tailwatch.broker import EmbeddedBroker, free_port
from tailwatch.kafka import KafkaSettings, ensure_topics

# Incident scenarios start at 08:00 (diurnal load rising toward its peak) and run 200
# minutes; the quiet day runs a whole day from midnight. Rates are scaled down (the
# detectors' minimum-sample floors are met at 0.3) so a run takes seconds, not minutes.
EVAL_SCENARIOS = ("retry-storm", "queue-saturation", "busy-but-slow", "idle-but-slow", "kv-pressure",
                  "prompt-growth", "cold-start", "cost-regression", "silent-degradation", "quiet-day")
SUITE = "detector-suite"  # every kind once, in 240 minutes: the test suite's scenario
INCIDENT_START = "2026-11-02T08:00:00Z"
DAY_START = "2026-11-02T00:00:00Z"
DEFAULT_RATE_SCALE = 0.3
DEFAULT_GPU_SAMPLES = 2


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
    sim = FleetSimulator(scenario, minutes, seed, start, rate_scale, gpu_samples_per_minute=DEFAULT_GPU_SAMPLES)
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
    from streams.worker import Worker, WorkerSettings

    stage = DetectorStage(cfg)
    worker = Worker(WorkerSettings(kafka=kafka, store_path=store_path, http_port=None, until_idle_s=2.0,
                                   slos=None, publish_sli=False, partitions=2, stages=[stage],
                                   group_id=group, progress=progress))
    worker.run()
    del worker
    gc.collect()
    return stage


def read_detections(store_path: str) -> list[ObservedDetection]:
    con = store.connect(store_path, read_only=True)
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
        ])
    return rows


COLUMNS = ["detector", "incidents", "detected", "recall", "false_alerts", "false_per_day", "explained", "median_delay_min"]


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
