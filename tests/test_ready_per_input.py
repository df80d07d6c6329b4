"""A pool's answers are given only on every input they read, on a real worker and broker.

A worker starts on a backlog of requests from a pool of 4 replicas whose users wait (queue
age far over the SLO) while the GPU samples, which carry the replica states and the queue
age, are held back: the autoscale and shed answers are 503 naming the GPU input, never
"current 0". Once the samples are published and read, the answer counts the replicas seen.
The per-topic catch-up rule itself is checked on its own below.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import uuid

import numpy as np
import pytest
import yaml

from tailwatch.ingest.producer import EventPublisher
from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch.signals.autoscale import PoolInputs, absent_input
from tailwatch.streams.input_catch_up import InputCatchUp
from tests.conftest import free_port
from tests.test_signal_api import get

START_MS = 1_793_577_600_000  # 2026-11-02T00:00:00Z
MINUTES = 12
POOL = "llm-a-realtime"
REPLICAS = 4
TOKEN = "ops-token"


def requests_backlog(seed: int = 5) -> list[RequestV1]:
    rng = np.random.default_rng(seed)
    return [RequestV1(
        schema="request.v1", event_id=f"r{m}-{i}", ts=START_MS + m * 60_000 + int(rng.integers(0, 60_000)),
        tenant="acme", model="chat-70b", workload="llm", status="ok", model_version="v1", zone="us-east-1a",
        pool=POOL, traffic_class="realtime", first_output_ms=float(rng.lognormal(np.log(300), 0.2)),
        e2e_ms=2500.0, queue_ms=4000.0, output_tokens=200, prompt_tokens=800, gpu_seconds=1.2, gpu_sku="H100")
        for m in range(MINUTES) for i in range(200)]


def gpu_backlog() -> list[GpuV1]:
    """4 replicas (a GPU each), every 10 s, queues saturated."""
    return [GpuV1(schema="gpu.v1", ts=START_MS + m * 60_000 + s * 10_000 + r, node=f"n{r}", gpu_index=0,
                  zone="us-east-1a", pool=POOL, gpu_sku="H100", util_pct=97.0, replica_state="warm", model="chat-70b",
                  oldest_queue_age_ms=4000.0, queue_depth=60, kv_cache_usage=0.95, active_streams=12)
            for m in range(MINUTES) for s in range(6) for r in range(REPLICAS)]


def until(port: int, path: str, done, timeout_s: float = 30.0) -> tuple[int, dict]:
    deadline = time.monotonic() + timeout_s
    got = (0, {})
    while time.monotonic() < deadline:
        try:
            got = get(port, path, TOKEN)
            if done(*got):
                return got
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.3)
    pytest.fail(f"{path} never answered as expected; last: {got}")


def test_a_pool_without_its_gpu_input_is_503_naming_it_then_counts_the_replicas_seen(broker, tmp_path):
    from tailwatch.ingest.kafka import KafkaSettings, ensure_topics

    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"r{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka, partitions=1)
    publisher = EventPublisher(kafka)
    publisher.publish_events(requests_backlog())
    (tmp_path / "api.yaml").write_text(yaml.safe_dump({
        "stale_after": "60s", "autoscale": {"queue_age_slo_ms": 1000},
        "tokens": [{"name": "ops", "sha256": hashlib.sha256(TOKEN.encode()).hexdigest(), "tenants": "*"}]}))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", broker.bootstrap,
         "--topic-prefix", kafka.topic_prefix, "--store", str(tmp_path / "store.duckdb"), "--http-port", str(port),
         "--api-config", str(tmp_path / "api.yaml"), "--group", f"g-{uuid.uuid4().hex[:6]}", "--partitions", "1",
         "--detectors", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        # Requests read, no GPU sample: the pool is known, and its answers name the missing input.
        # (Starting, catching up, or the pool not in the view yet are passing states; a
        # decision or a refusal naming an input is the answer.)
        status, body = until(port, f"/v1/autoscale/{POOL}", lambda st, b: st == 200 or b.get("reason") == "no_data",
                             timeout_s=90)
        assert status == 503 and body["reason"] == "no_data" and "no GPU samples" in body["error"], body
        assert POOL in body["error"] and "replica" in body["error"], body
        status, shed = get(port, f"/v1/shed/{POOL}", TOKEN)
        assert status == 503 and "no GPU samples" in shed["error"], shed
        assert get(port, "/v1/autoscale/no-such-pool", TOKEN)[0] == 404

        publisher.publish_events(gpu_backlog())
        until(port, f"/v1/autoscale/{POOL}", lambda st, b: st == 200, timeout_s=60)
        until(port, "/healthz", lambda st, b: b.get("view_current") is True)  # the view holds all it read
        status, body = get(port, f"/v1/autoscale/{POOL}", TOKEN)
        assert status == 200, body
        assert body["current_replicas"] == REPLICAS, body
        assert body["signals"]["replicas_by_state"] == {"warm": REPLICAS}, body
        assert body["signals"]["queue_age_p95_ms"] == 4000.0 and body["desired_replicas"] > REPLICAS, body
        assert get(port, "/readyz")[0] == 200
    finally:
        publisher.close()
        proc.kill()  # its store is thrown away
        proc.wait(timeout=30)


def test_each_input_topic_is_caught_up_on_its_own():
    inputs = InputCatchUp(["tw.requests", "tw.gpu"], batch_size=20_000)
    owned = {"tw.requests": {0, 1}, "tw.gpu": {0}}
    # Requests read to their end; 5,000 GPU samples unread: the sum is within one batch, the GPU input is not.
    inputs.observe(owned, {"tw.requests": {0, 1}, "tw.gpu": set()},
                   {("tw.requests", 0): 0, ("tw.requests", 1): 0, ("tw.gpu", 0): 5_000}, True, wall_s=100.0)
    behind = inputs.behind(owned, 100.0, bound_s=120.0)
    assert list(behind) == ["tw.gpu"] and "5,000 messages behind" in behind["tw.gpu"], behind
    # Read to its end once, it stays caught up while within a batch of its end...
    inputs.observe(owned, {"tw.requests": {0, 1}, "tw.gpu": {0}}, {}, True, wall_s=110.0)
    inputs.observe(owned, {"tw.requests": {0}, "tw.gpu": set()},
                   {("tw.requests", 1): 300, ("tw.gpu", 0): 40}, True, wall_s=150.0)
    assert inputs.behind(owned, 150.0, 120.0) == {}
    # ...and is behind once that lasts past the bound without catching up.
    inputs.observe(owned, {"tw.requests": {0, 1}, "tw.gpu": set()}, {("tw.gpu", 0): 90_000}, True, wall_s=400.0)
    late = inputs.behind(owned, 400.0, 120.0)
    assert list(late) == ["tw.gpu"] and "last caught up 250 s ago" in late["tw.gpu"], late
    # An input of which this worker owns nothing is behind too.
    assert "owns none" in inputs.behind({"tw.requests": {0, 1}, "tw.gpu": set()}, 400.0, 120.0)["tw.gpu"]


def test_a_pool_answer_needs_gpu_samples_and_requests_unless_idle():
    gpu_missing = absent_input(PoolInputs("p", 5, requests=1200.0, gpu_samples=0, newest_gpu_minute=None, gpu_busy=False))
    assert gpu_missing is not None and gpu_missing[0] == "gpu" and "none kept" in gpu_missing[1]
    old = absent_input(PoolInputs("p", 5, requests=1200.0, gpu_samples=0, newest_gpu_minute=42, gpu_busy=False))
    assert old is not None and "minute 42" in old[1]
    busy = absent_input(PoolInputs("p", 5, requests=0.0, gpu_samples=120, newest_gpu_minute=50, gpu_busy=True))
    assert busy is not None and busy[0] == "requests"
    assert absent_input(PoolInputs("p", 5, requests=0.0, gpu_samples=120, newest_gpu_minute=50, gpu_busy=False)) is None
    assert absent_input(PoolInputs("p", 5, requests=10.0, gpu_samples=120, newest_gpu_minute=50, gpu_busy=True)) is None


def test_a_view_built_while_an_input_is_behind_answers_pools_503_naming_it():
    from tailwatch.signals.answers import InputAbsent
    from tailwatch.signals.api import SignalApi
    from tailwatch.signals.config import ApiConfig
    from tailwatch.signals.live import Scoped, SignalSnapshot
    from tailwatch.signals.served import serve
    from tests.conftest import call_api

    absent = {POOL: Scoped(InputAbsent(POOL, "gpu", "no GPU samples for pool llm-a-realtime ...", "2026-11-02T00:12:00Z"),
                           frozenset({"acme"}), 11, 1000.0)}
    behind = serve(SignalSnapshot(1000.0, 11, {}, {}, {}, [], [], absent=absent,
                                  inputs_behind={"tw.gpu": "not read to its end yet (5,000 messages behind)"}))
    api = SignalApi(ApiConfig(stale_after_s=60.0), lambda: behind, lambda: (False, ""), wall_clock=lambda: 1001.0)
    status, _ct, body = call_api(api, "GET", f"/v1/autoscale/{POOL}")
    answer = json.loads(body)
    assert status == 503 and answer["reason"] == "behind" and "tw.gpu: not read to its end" in answer["error"], answer
    caught_up = serve(SignalSnapshot(1000.0, 11, {}, {}, {}, [], [], absent=absent))
    api = SignalApi(ApiConfig(stale_after_s=60.0), lambda: caught_up, lambda: (True, ""), wall_clock=lambda: 1001.0)
    status, _ct, body = call_api(api, "GET", f"/v1/shed/{POOL}")
    assert status == 503 and json.loads(body)["reason"] == "no_data", body
    assert call_api(api, "GET", "/v1/autoscale/other")[0] == 404
