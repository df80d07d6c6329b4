"""A label flood against the real broker and worker processes: a producer that stamps every
request with a new tenant and model (a request id in the wrong field) costs the worker a
bounded set of slices, counted under `__other__`; the tenants it knew stay exact, /metrics keeps
answering, and a restarted worker admits the same values from its store."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Producer

from tailwatch.conventions import OVERFLOW_LABEL_VALUE
from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.ingest.schema import RequestV1
from tests.conftest import free_port
# One partition (`kafka`): the order values arrive in, and so the admitted set, is the log's.
from tests.test_hostile import kafka, rows  # noqa: F401 (a fixture)

START_MS = 1_793_577_600_000  # 2026-11-02T00:00:00Z, in the past of every record's timestamp
FLOOD = 3_000
MAX_VALUES, MAX_SLICES = 50, 100


def request(event_id: str, ts_ms: int, tenant: str, model: str) -> bytes:
    return msgspec.json.encode(RequestV1(
        schema="request.v1", event_id=event_id, ts=ts_ms, tenant=tenant, model=model, workload="llm",
        status="ok", zone="us-east-1a", pool="llm-a", e2e_ms=900.0))


def produce(kafka: KafkaSettings, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
    for v in values:
        p.produce(kafka.topic("requests"), v)
    assert p.flush(30) == 0


def worker(kafka: KafkaSettings, store: Path, log: Path, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
            "--topic-prefix", kafka.topic_prefix, "--store", str(store), "--detectors", "none", "--slos", "none",
            "--group", f"g-{uuid.uuid4().hex[:6]}", "--max-label-values", str(MAX_VALUES),
            "--max-slices", str(MAX_SLICES), "--checkpoint-interval", "0.5", *args]
    return subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def scrape(port: int) -> tuple[str, float]:
    began = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode(), time.monotonic() - began


def sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


@pytest.mark.broker
def test_a_flood_of_unique_tenants_lands_in_the_overflow_slice_counted_and_the_known_tenant_stays_exact(kafka, tmp_path):
    # acme is known before the flood; its requests keep coming through it.
    normal = [request(f"a{i}", START_MS + 60_000 + i * 100, "acme", "chat-70b") for i in range(100)]
    flood = [request(f"f{i}", START_MS + 120_000 + i * 10, f"bot-{i}", f"model-{i}") for i in range(FLOOD)]
    during = [request(f"b{i}", START_MS + 120_000 + i * 300, "acme", "chat-70b") for i in range(100)]
    produce(kafka, normal + [v for pair in zip(flood[::30], during) for v in pair]
            + [f for i, f in enumerate(flood) if i % 30])
    store, port, log = tmp_path / "tw.duckdb", free_port(), tmp_path / "w.log"
    proc = worker(kafka, store, log, "--http-port", str(port))
    try:
        accepted, latencies, deadline, text = 0.0, [], time.time() + 60, ""
        while accepted < len(normal) + FLOOD + len(during) and time.time() < deadline:
            try:
                text, took = scrape(port)
                latencies.append(took)
                accepted = sample(text, "tailwatch_events_total", outcome="accepted")
            except OSError:
                assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.3)
        assert accepted == len(normal) + FLOOD + len(during), log.read_text()[-3000:]
        admitted_bots = MAX_VALUES - 1  # acme holds a place
        assert sample(text, "tailwatch_label_values_overflowed_total", label="tenant") == FLOOD - admitted_bots
        assert sample(text, "tailwatch_label_values_overflowed_total", label="model") == FLOOD - admitted_bots
        assert sample(text, "tailwatch_label_values", label="tenant") == MAX_VALUES
        assert sample(text, "tailwatch_label_values", label="slice") <= MAX_SLICES
        series = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert len(series) < 2_000 and max(latencies) < 5.0, (len(series), max(latencies))
        assert not any(f"bot-{i}\"" in text for i in range(admitted_bots, FLOOD))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # A restart: the admitted set comes from the store, so a new tenant still finds no room
    # and acme, admitted first, still has its own slice.
    later = [request(f"c{i}", START_MS + 180_000 + i, "acme", "chat-70b") for i in range(10)] + \
        [request(f"d{i}", START_MS + 180_000 + i, f"late-bot-{i}", "chat-70b") for i in range(10)]
    produce(kafka, later)
    assert worker(kafka, store, tmp_path / "w2.log", "--http-port", "0", "--until-idle", "3").wait(timeout=120) == 0, \
        (tmp_path / "w2.log").read_text()[-3000:]
    assert rows(store, "SELECT sum(requests) FROM sli_minute") == [(len(normal) + FLOOD + len(during) + len(later),)]
    assert rows(store, "SELECT sum(requests) FROM sli_minute WHERE tenant = 'acme'") == [(len(normal) + len(during) + 10,)]
    assert rows(store, "SELECT sum(requests), count(DISTINCT tenant) FROM sli_minute WHERE tenant LIKE 'bot-%'") == \
        [(admitted_bots, admitted_bots)]
    assert rows(store, f"SELECT sum(requests) FROM sli_minute WHERE tenant = '{OVERFLOW_LABEL_VALUE}'") == \
        [(FLOOD - admitted_bots + 10,)]
    assert rows(store, "SELECT count(*) FROM dead_letter") == [(0,)]


def test_a_scrape_right_after_a_batch_shows_the_values_held_beside_the_values_folded():
    # The gauge moves with the counters, not at the next checkpoint: between the two a scrape
    # would show thousands folded past an empty set.
    from prometheus_client import CollectorRegistry, generate_latest

    from tailwatch.streams.cardinality import CardinalityLimits
    from tailwatch.streams.decode_step import DecodeStep, input_topics
    from tailwatch.streams.memory_source import MemoryRecord
    from tailwatch.streams.metrics import WorkerMetrics
    from tailwatch.streams.minute_windows import MinuteWindows
    from tailwatch.streams.record_batch import RecordBatch

    settings = KafkaSettings(bootstrap_servers="memory", topic_prefix="t.")
    inputs = input_topics(settings, 1 << 20, lambda spec: MinuteWindows(spec, 60_000, 0),
                          CardinalityLimits(max_values_per_label=MAX_VALUES, max_slices=MAX_SLICES))
    p = inputs[settings.topic("requests")]
    registry = CollectorRegistry()
    step = DecodeStep(WorkerMetrics(registry), max_ahead_ms=10**12)
    batch = [MemoryRecord(p.topic, 0, i, None, request(f"f{i}", START_MS + i, f"bot-{i}", "chat-70b"), 1, START_MS + i)
             for i in range(FLOOD)]
    step.process(p, RecordBatch.of(p.topic, batch))
    text = generate_latest(registry).decode()
    assert sample(text, "tailwatch_label_values_overflowed_total", label="tenant") == FLOOD - MAX_VALUES
    assert sample(text, "tailwatch_label_values", label="tenant") == MAX_VALUES
    assert sample(text, "tailwatch_label_values", label="slice") == MAX_VALUES + 1  # and (__other__, chat-70b)
