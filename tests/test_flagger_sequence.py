"""Flagger's whole canary sequence against a real worker over HTTP, fed through the real broker.

The scheduler below calls the hooks in the order Flagger's own scheduler does
(fluxcd/flagger pkg/controller/scheduler.go, `advanceCanary`, and scheduler_hooks.go):

1. a new revision: `confirm-rollout`; passing, the canary is scaled up (Progressing) and the
   interval ends;
2. each interval while Progressing (or WaitingPromotion): the `rollback` hooks (a 2xx rolls
   back at once); at `threshold` failed checks, a rollback; at weight 0 with no iterations
   the `pre-rollout` hooks, otherwise the `rollout` hooks (a failure is a failed check); then
   `confirm-traffic-increase` (not while WaitingPromotion) before every step, the first at
   weight 0 included; below `maxWeight` the weight steps up, at it `confirm-promotion`
   (failing: WaitingPromotion) and then Promoting;
3. Promoting routes traffic back to the primary (Finalising), Finalising ends Succeeded with
   the `post-rollout` hooks; a rollback ends Failed with the `post-rollout` hooks.

Traffic follows the weights: each interval publishes the minute of requests that flowed at
the current weight, so the canary has none at weight 0. Two models roll out side by side on
one worker: one canary as good as its stable version, one failing a third of its requests.
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
from datetime import datetime, timezone

import numpy as np
import pytest
import yaml

from tailwatch.ingest.producer import EventPublisher
from tailwatch.ingest.schema import RequestV1
from tailwatch.signals.answers import Alert, Slo, SloSlice
from tailwatch.signals.first_step import StableSide, first_step
from tailwatch.signals.recipes import flagger_canary
from tests.conftest import free_port
from tests.test_signal_api import get

START_MS = 1_793_577_600_000  # 2026-11-02T00:00:00Z
TOKEN = "flagger-secret-token"
REQUESTS_PER_MINUTE = 600
WARMUP_MINUTES = 6  # stable traffic only, before the canaries: SLO slices for the stable side
MODELS = {"chat-good": 0.0, "chat-bad": 0.33}  # model → the canary's error ratio


class Traffic:
    """One event-time minute of requests per model, split stable/canary by the canary weight."""

    def __init__(self, publisher: EventPublisher, seed: int = 7):
        self.publisher = publisher
        self.rng = np.random.default_rng(seed)
        self.minute = 0
        self.n = 0

    def publish_minute(self, weights: dict[str, int]) -> int:
        t0 = START_MS + self.minute * 60_000
        events = []
        for model, canary_errors in MODELS.items():
            canary_share = weights.get(model, 0) / 100
            for i in range(REQUESTS_PER_MINUTE):
                self.n += 1
                canary = self.rng.random() < canary_share
                failed = canary and self.rng.random() < canary_errors
                events.append(RequestV1(
                    schema="request.v1", event_id=f"{model}-{self.n}", ts=t0 + int(self.rng.integers(0, 60_000)),
                    tenant="acme", model=model, workload="llm", status="error" if failed else "ok",
                    model_version="v2" if canary else "v1", deployment="canary" if canary else "stable",
                    zone="us-east-1a", pool=f"{model}-realtime", traffic_class="realtime",
                    first_output_ms=float(self.rng.lognormal(np.log(200), 0.2)),
                    e2e_ms=float(self.rng.lognormal(np.log(2000), 0.2)), queue_ms=20.0,
                    output_tokens=200, prompt_tokens=800, gpu_seconds=0.8, gpu_sku="H100", task_success=not failed,
                ))
        self.publisher.publish_events(events)
        self.minute += 1
        return self.minute  # the view's as_of once it holds this minute


def call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    return get(port, path, TOKEN, method, None if body is None else json.dumps(body).encode())


class FlaggerScheduler:
    """Flagger's `advanceCanary`, one call per analysis interval, over HTTP (2xx to 202 pass)."""

    def __init__(self, port: int, canary: dict):
        self.port = port
        self.analysis = canary["spec"]["analysis"]
        self.hooks = {h["type"]: h for h in self.analysis["webhooks"]}
        self.phase, self.weight, self.failed_checks, self.iterations = "Initialized", 0, 0, 0
        self.calls: list[tuple[str, int, int]] = []  # (hook, weight, status)
        self.log: list[str] = []

    def hook(self, kind: str, phase: str = "Progressing") -> bool:
        h = self.hooks[kind]
        path = "/" + h["url"].split("/", 3)[3]
        status, body = call(self.port, "POST", path, {"name": "chat", "namespace": "serving", "phase": phase,
                                                      "metadata": h["metadata"]})
        self.calls.append((kind, self.weight, status))
        self.last_body = body
        return status <= 202

    def interval(self) -> None:
        if self.phase in ("Succeeded", "Failed"):
            return
        if self.phase in ("Initialized", "Waiting"):
            if not self.hook("confirm-rollout"):
                self.phase = "Waiting"
                self.log.append("waiting for approval")
                return
            self.phase = "Progressing"  # scaled up from zero; the analysis starts next interval
            self.log.append("scaled up")
            return
        if self.phase in ("Progressing", "WaitingPromotion") and self.hook("rollback", self.phase):
            return self._roll_back("rollback hook")
        if self.phase == "Promoting":
            self.phase = "Finalising"
            self.log.append("routed all traffic to primary")
            return
        if self.phase == "Finalising":
            self.phase = "Succeeded"
            self.hook("post-rollout", "Succeeded")
            self.log.append("promotion completed")
            return
        if self.failed_checks >= self.analysis["threshold"]:
            return self._roll_back("threshold")
        if self.weight == 0 and self.iterations == 0:
            if not self.hook("pre-rollout"):
                self.failed_checks += 1
                return
        elif not self.hook("rollout"):
            self.failed_checks += 1
            return
        if self.phase != "WaitingPromotion" and not self.hook("confirm-traffic-increase"):
            self.log.append(f"held at {self.weight}")
            return
        if self.weight < self.analysis["maxWeight"]:
            self.weight += self.analysis["stepWeight"]
            self.log.append(f"weight {self.weight}")
            return
        if not self.hook("confirm-promotion"):
            self.phase = "WaitingPromotion"
            self.log.append("promotion held")
            return
        self.phase = "Promoting"
        self.log.append("promoting")

    def _roll_back(self, why: str) -> None:
        self.phase, self.weight = "Failed", 0
        self.log.append(f"rolled back ({why})")
        self.hook("post-rollout", "Failed")


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory):
    from tailwatch.ingest.kafka import KafkaSettings, ensure_topics

    tmp = tmp_path_factory.mktemp("flagger")
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"f{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka, partitions=1)
    (tmp / "api.yaml").write_text(yaml.safe_dump({
        "stale_after": "30s",
        "tokens": [{"name": "flagger", "sha256": hashlib.sha256(TOKEN.encode()).hexdigest(), "tenants": "*"}],
        "rollout": {"min_requests": 100, "promote_min_requests": 300, "cost_min_minutes": 2},
    }))
    (tmp / "slos.yaml").write_text(yaml.safe_dump({"slos": [
        {"name": "chat-availability", "selector": {"workload": "llm"}, "sli": {"availability": {}},
         "objective": "99%", "window": "30d", "slice_by": ["model", "model_version"]},
    ]}))
    publisher = EventPublisher(kafka)
    traffic = Traffic(publisher)
    for _ in range(WARMUP_MINUTES):
        traffic.publish_minute({})
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", broker.bootstrap,
         "--topic-prefix", kafka.topic_prefix, "--store", str(tmp / "store.duckdb"), "--http-port", str(port),
         "--api-config", str(tmp / "api.yaml"), "--slos", str(tmp / "slos.yaml"), "--group", f"g-{uuid.uuid4().hex[:6]}",
         "--partitions", "1", "--detectors", "none", "--allowed-lateness", "60s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _, slos = call(port, "GET", "/v1/slos")
                stable_slices = {s["labels"].get("model") for slo in slos.get("slos", []) for s in slo["slices"]}
                if call(port, "GET", "/readyz")[0] == 200 and set(MODELS) <= stable_slices:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"the worker did not become ready; stderr: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.3)
        yield port, traffic
    finally:
        publisher.close()
        proc.kill()  # its store is thrown away: no need to wait for a clean checkpoint
        proc.wait(timeout=30)


def wait_for_minute(port: int, through: int) -> None:
    """Until every model's answer holds the newest published minute (the view peeks at open minutes)."""
    as_of = datetime.fromtimestamp((START_MS + through * 60_000) / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(call(port, "GET", f"/v1/rollout/{m}/v1")[1].get("as_of") == as_of for m in MODELS):
            return
        time.sleep(0.2)
    pytest.fail(f"the view did not reach {as_of}")


@pytest.mark.alone  # bounds on wall-clock data age: run by itself, after the parallel part
@pytest.mark.slow
def test_flagger_moves_a_healthy_canary_off_weight_0_to_promotion_and_rolls_back_a_failing_one(worker):
    port, traffic = worker
    url = "http://127.0.0.1:8000"  # each hook's path is called on the worker's port
    canaries = {m: flagger_canary("chat", "serving", m, "v2", url, token=TOKEN) for m in MODELS}
    for canary in canaries.values():  # two steps to the top weight keep the test short
        canary["spec"]["analysis"].update(stepWeight=25, maxWeight=50)
    schedulers = {m: FlaggerScheduler(port, canary) for m, canary in canaries.items()}
    for _ in range(16):
        wait_for_minute(port, traffic.publish_minute({m: s.weight for m, s in schedulers.items()}))
        for s in schedulers.values():
            s.interval()
        if all(s.phase in ("Succeeded", "Failed") for s in schedulers.values()):
            break
    good, bad = schedulers["chat-good"], schedulers["chat-bad"]

    # The first confirm-traffic-increase comes at weight 0 with no canary traffic: it passes on
    # the stable side (fresh, not paging), and its answer says so.
    first = next(c for c in good.calls if c[0] == "confirm-traffic-increase")
    assert first == ("confirm-traffic-increase", 0, 200), good.calls
    assert [c[0] for c in good.calls[:3]] == ["confirm-rollout", "rollback", "pre-rollout"], good.calls
    # From the first step on the canary's own verdict gates every step, up to promotion.
    assert good.log[:3] == ["scaled up", "weight 25", "weight 50"], good.log
    assert [c[2] for c in good.calls if c[0] == "confirm-traffic-increase"][:2] == [200, 200], good.calls
    assert good.phase == "Succeeded" and good.failed_checks == 0, good.log
    assert good.log[-3:] == ["promoting", "routed all traffic to primary", "promotion completed"], good.log
    assert good.calls[-1] == ("post-rollout", 50, 200) and ("confirm-promotion", 50, 200) in good.calls
    assert all(kind != "pre-rollout" for kind, weight, _ in good.calls if weight > 0)

    # The failing canary takes its first step the same way, then its own errors roll it back
    # before a second step.
    assert next(c for c in bad.calls if c[0] == "confirm-traffic-increase") == ("confirm-traffic-increase", 0, 200)
    assert bad.phase == "Failed" and bad.log[:2] == ["scaled up", "weight 25"] and "weight 50" not in bad.log, bad.log
    assert bad.log[-1] == "rolled back (rollback hook)", bad.log
    assert bad.calls[-2][0] == "rollback" and bad.calls[-2][2] == 200 and bad.calls[-1][0] == "post-rollout"
    status, verdict = call(port, "GET", "/v1/rollout/chat-bad/v2")
    assert status == 200 and verdict["verdict"] == "rollback" and "errors" in verdict["decided_by"], verdict


def _slo(labels: list[dict[str, str]]) -> Slo:
    return Slo("avail", "", 0.99, "30d", ["model", "model_version"], {}, [
        SloSlice(l, 0.999, 1.0, {}, None, [], None) for l in labels])


def _page(labels: dict[str, str], severity: str = "page") -> Alert:
    return Alert("f", "SLOBurnPage", severity, "avail", "1h", labels, "2026-11-02T00:00:00Z", "runbooks/x.md")


def test_the_first_step_is_judged_on_the_stable_side_with_evidence_or_held():
    side = StableSide("chat", "v1", data_age_s=5.0)
    slos = [_slo([{"model": "chat", "model_version": "v1"}, {"model": "chat", "model_version": "v2"},
                  {"model": "other", "model_version": "v1"}])]
    ok = first_step(side, slos, [], stale_after_s=120.0)
    assert ok.passes and "1 SLO slices cover it" in ok.reason, ok
    # A page on the canary's own slice or another model's is not the stable side's.
    assert first_step(side, slos, [_page({"model": "chat", "model_version": "v2"}), _page({"model": "other"})],
                      120.0).passes
    # A ticket does not hold it; a page on the stable side or on a slice covering every model does.
    assert first_step(side, slos, [_page({"model": "chat", "model_version": "v1"}, "ticket")], 120.0).passes
    held = first_step(side, slos, [_page({"model": "chat", "model_version": "v1"})], 120.0)
    assert not held.passes and "paging: avail (1h, model=chat, model_version=v1)" in held.reason, held
    assert not first_step(side, slos, [_page({"zone": "us-east-1a"})], 120.0).passes
    # Stale stable data, no stable side, or no SLO covering it: no evidence, held.
    stale = first_step(StableSide("chat", "v1", 300.0), slos, [], 120.0)
    assert not stale.passes and "300 s" in stale.reason, stale
    assert not first_step(None, slos, [], 120.0).passes
    uncovered = first_step(side, [_slo([{"model": "other"}])], [], 120.0)
    assert not uncovered.passes and "health is unknown" in uncovered.reason, uncovered
