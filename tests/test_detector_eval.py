"""Detectors measured through the real pipeline: embedded broker → worker → detector stage
→ store, scored against the simulator's labelled incidents.

The `detector-suite` scenario holds one incident of every kind in four simulated hours.
The issue's targets (recall ≥ 0.95, at most one false alert per detector per simulated
day, retry storms and queue saturation detected within 3 minutes) are asserted on the
fixed seed 7 only; another seed runs the same evaluation and must produce a sane report.
A third run stops the worker in the middle of an anomaly and restarts it on the same
store: the anomaly model is reloaded (not refitted) and the detections are identical to
the uninterrupted run's.
"""

from __future__ import annotations

import duckdb
import pytest

from tailwatch.detectors.config import DETECTOR_NAMES
from tailwatch_dev.simulator import FleetSimulator
from tailwatch_dev.eval_detectors import (
    DEFAULT_EVAL_SHARE,
    DEFAULT_GPU_SAMPLES,
    DEFAULT_RATE_SCALE,
    INCIDENT_START,
    SUITE,
    publish,
    read_detections,
    run_scenario,
    run_worker,
)

pytestmark = pytest.mark.broker

FIXED_SEED = 7
_runs: dict = {}


def _suite(kafka, tmp_path, seed):
    if seed not in _runs:
        _runs[seed] = run_scenario(SUITE, seed, kafka=kafka, store_path=str(tmp_path / f"suite-{seed}.duckdb"))
    return _runs[seed]


@pytest.mark.slow
def test_suite_meets_the_targets_on_the_fixed_seed(kafka, tmp_path):
    run = _suite(kafka, tmp_path, FIXED_SEED)
    days = run.minutes / 1440
    for name in DETECTOR_NAMES:
        s = run.scores[name]
        assert s.incidents == 1, name
        assert s.recall >= 0.95, f"{name}: recall {s.recall}"
        # At most one false alert per simulated day: over 4 hours, none.
        assert s.false_alerts <= 1 * days, f"{name}: {s.false_alerts} false alerts in {run.minutes} minutes"
    assert run.scores["retry_storm"].median_delay_minutes <= 3
    assert run.scores["queue_age"].median_delay_minutes <= 3


@pytest.mark.slow
def test_suite_on_another_seed_reports_every_detector(kafka, tmp_path):
    run = _suite(kafka, tmp_path, 11)
    for name in DETECTOR_NAMES:
        s = run.scores[name]
        assert s.incidents == 1 and s.recall is not None and s.false_alerts_per_day is not None, name
    # Not the targets (those are asserted on the fixed seed), but the evaluation must see incidents.
    assert sum(s.hit for s in run.scores.values()) >= len(DETECTOR_NAMES) // 2


@pytest.mark.slow
def test_anomaly_model_and_detections_survive_a_worker_restart(kafka, tmp_path):
    reference = _suite(kafka, tmp_path, FIXED_SEED)
    # The reference ran on topics of its own prefix; this run gets fresh topics.
    from tailwatch.ingest.kafka import KafkaSettings, ensure_topics

    restarted = KafkaSettings(bootstrap_servers=kafka.bootstrap_servers, topic_prefix=kafka.topic_prefix + "r.")
    ensure_topics(restarted, partitions=2)
    sim = FleetSimulator(SUITE, reference.minutes, FIXED_SEED, INCIDENT_START, DEFAULT_RATE_SCALE,
                         gpu_samples_per_minute=DEFAULT_GPU_SAMPLES, eval_share=DEFAULT_EVAL_SHARE)
    split_ms = sim.start_ms + 215 * 60_000  # ten minutes into the output-token collapse (205-230)
    events = list(sim.events())
    first = [e for e in events if e.ts < split_ms]
    store_path = str(tmp_path / "restarted.duckdb")

    publish(restarted, first)
    stage = run_worker(restarted, store_path, None, "tw-restart")
    fitted = stage.collector.model_version
    assert fitted >= 2
    con = duckdb.connect(store_path, read_only=True)
    open_anomalies = con.execute("SELECT slice FROM detections WHERE detector = 'anomaly' AND ended_at IS NULL").fetchall()
    versions = con.execute("SELECT max(version) FROM _tw_detector_models").fetchall()[0][0]
    con.close()
    assert ('{"model": "llama-3.1-70b", "model_version": "2024-11"}',) in open_anomalies  # open across the restart
    assert versions == fitted

    publish(restarted, events[len(first):])
    stage = run_worker(restarted, store_path, None, "tw-restart")
    assert stage.collector.model_version >= fitted  # reloaded from the store, then refitted on schedule
    con = duckdb.connect(store_path, read_only=True)
    fits = con.execute("SELECT version, count(*) FROM _tw_detector_models GROUP BY ALL HAVING count(*) > 1").fetchall()
    con.close()
    assert fits == []  # no version fitted twice: the restart reloaded, it did not refit
    key = lambda d: (d.detector, sorted(d.labels.items()), d.started_at, d.ended_at)
    assert sorted(map(key, read_detections(store_path))) == sorted(map(key, reference.detections))


def test_detection_pages_through_alertmanager_and_shows_on_metrics(tmp_path):
    """The stage's outbox against a real Alertmanager; the stage's collector in the exposition."""
    import time

    import polars as pl
    from prometheus_client import CollectorRegistry, generate_latest

    from tailwatch.streams.detector_stage import DetectorStage
    from tests.test_alertmanager import Webhook, start_alertmanager
    from tests.test_detectors import GPU_SCHEMA, REQ_SCHEMA, _ts, gpu_row, req_rows

    hook = Webhook()
    proc, url = start_alertmanager(tmp_path, hook.port)
    try:
        now_min = int(time.time()) // 60
        stage = DetectorStage(alertmanager_urls=(url,))
        con = duckdb.connect(str(tmp_path / "am.duckdb"))
        from tailwatch.store.schema import SCHEMA_SQL

        con.execute(SCHEMA_SQL)
        stage.rebuild(con)
        minutes = range(now_min - 10, now_min - 5)
        reqs = pl.DataFrame([req_rows(m, requests=300, retries=120) for m in minutes], schema_overrides=REQ_SCHEMA)
        gpu = pl.DataFrame([gpu_row(m) for m in minutes], schema_overrides=GPU_SCHEMA)
        out = stage.on_closed(reqs, gpu)
        assert out["detection_events"]["detector"].to_list() == ["retry_storm"]
        stage.committed()
        stage.alerts.deliver(wait_s=10)
        pages = hook.wait_for(lambda a: a["labels"]["alertname"] == "DetectorRetryStorm")
        assert pages, "the detection never reached the receiver"
        a = pages[0]
        assert a["labels"]["severity"] == "page" and a["labels"]["zone"] == "z1" and a["labels"]["detector"] == "retry_storm"
        assert a["annotations"]["runbook_url"].endswith("runbooks/detector-retry-storm.md")
        assert "retry_ratio=0.4" in a["annotations"]["summary"]
        assert a["startsAt"].startswith(_ts(now_min - 8).strftime("%Y-%m-%dT%H:%M"))
        registry = CollectorRegistry()
        for c in stage.collectors():
            registry.register(c)
        text = generate_latest(registry).decode()
        assert 'tailwatch_detections_total{detector="retry_storm"} 1.0' in text
        assert 'tailwatch_detections_active{detector="retry_storm"} 1.0' in text
        # The per-detector families carry `detector` alone; the open detections carry their slice
        # (at most OPEN_DETECTION_SERIES series, one per open detection).
        per_detector = [line for line in text.splitlines() if line.startswith(("tailwatch_detections_total",
                                                                               "tailwatch_detections_active"))]
        assert per_detector and not any("tenant=" in line or "pool=" in line for line in per_detector)
        opened = [line for line in text.splitlines() if line.startswith("tailwatch_detection_started_timestamp_seconds{")]
        assert len(opened) == 1 and 'detector="retry_storm"' in opened[0] and 'zone="z1"' in opened[0]
    finally:
        proc.kill()
