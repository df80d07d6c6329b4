"""The signal API on a real worker process, fed through the real broker.

A small hand-made fleet makes each decision unambiguous: pool llm-a has a queue-age breach
in its last minutes while its GPUs sit at 50% utilisation; pool llm-b is healthy; the
chat model has a canary that triples first-output p99 and one that is as fast at half the
GPU-seconds; a TTS pool serves one tenant only, for token scoping.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import msgspec
import numpy as np
import pytest
import yaml

from tailwatch.ingest.producer import EventPublisher
from tailwatch.ingest.schema import GpuV1, RequestV1
from tests.conftest import api_client, call_api, free_port

START_MS = 1_793_577_600_000  # 2026-11-02T00:00:00Z
MINUTES = 20
BREACH_FROM = 15
TOKENS = {"ops": "ops-secret-token", "solo": "solo-secret-token"}


def fleet_events(seed: int = 3) -> list:
    rng = np.random.default_rng(seed)
    events: list = []
    n = 0
    for minute in range(MINUTES):
        t0 = START_MS + minute * 60_000
        for zone in ("a", "b"):
            pool = f"llm-{zone}-realtime"
            for i in range(300):
                n += 1
                version = ("v1", "v1", "v1", "v2-slow", "v3-cheap")[i % 5]
                slow = 3.0 if version == "v2-slow" else 1.0
                gpu_s = 0.4 if version == "v3-cheap" else 0.8
                # 0.02% failing: 2,400 canary requests can show a canary erring enough to page on its
                # own (at 0.1%, the rule would rightly keep v3-cheap at continue).
                status = "error" if rng.random() < 0.0002 else "ok"
                events.append(RequestV1(
                    schema="request.v1", event_id=f"r{n}", ts=t0 + int(rng.integers(0, 60_000)),
                    tenant=("acme", "globex")[i % 2], model="chat-70b", workload="llm", status=status,
                    model_version=version, zone=f"us-east-1{zone}", pool=pool, traffic_class="realtime",
                    deployment="stable" if version == "v1" else "canary",
                    first_output_ms=float(rng.lognormal(np.log(200), 0.2)) * slow,
                    e2e_ms=float(rng.lognormal(np.log(2000), 0.2)) * slow,
                    queue_ms=4000.0 if zone == "a" and minute >= BREACH_FROM else 20.0,
                    output_tokens=200, prompt_tokens=800, gpu_seconds=gpu_s, gpu_sku="H100", task_success=True,
                ))
        for i in range(60):
            n += 1
            events.append(RequestV1(
                schema="request.v1", event_id=f"t{n}", ts=t0 + i * 1000, tenant="solo", model="voice-1",
                workload="tts", status="ok", model_version="1.0", zone="us-east-1c", pool="tts-c-realtime",
                first_output_ms=150.0, e2e_ms=900.0, audio_seconds=4.0, gpu_seconds=0.1, gpu_sku="L4",
            ))
        for pool, zone, sku in (("llm-a-realtime", "us-east-1a", "H100"), ("llm-b-realtime", "us-east-1b", "H100"),
                                ("tts-c-realtime", "us-east-1c", "L4")):
            breach = pool == "llm-a-realtime" and minute >= BREACH_FROM
            for g in range(4):
                for s in range(6):
                    events.append(GpuV1(
                        schema="gpu.v1", ts=t0 + s * 10_000 + g, node=f"{pool}-n0", gpu_index=g, zone=zone, pool=pool,
                        gpu_sku=sku, util_pct=50.0, replica_state="warm", model="chat-70b" if "llm" in pool else "voice-1",
                        oldest_queue_age_ms=4000.0 if breach else 30.0, queue_depth=40 if breach else 1,
                        kv_cache_usage=0.4, active_streams=3,
                    ))
    return events


def _api_config(path) -> None:
    path.write_text(yaml.safe_dump({
        "stale_after": "8s",
        "tokens": [
            {"name": "ops", "sha256": hashlib.sha256(TOKENS["ops"].encode()).hexdigest(), "tenants": "*"},
            {"name": "solo", "sha256": hashlib.sha256(TOKENS["solo"].encode()).hexdigest(), "tenants": ["solo"]},
        ],
        "autoscale": {"zones": 3, "queue_age_slo_ms": 1000},
        "rollout": {"min_requests": 200, "promote_min_requests": 500},
    }))


def _slos(path) -> None:
    path.write_text(yaml.safe_dump({"slos": [
        {"name": "chat-first-token", "selector": {"workload": "llm"},
         "sli": {"latency": {"field": "first_output_ms", "threshold": "1.2s"}}, "objective": "99%", "window": "30d",
         "slice_by": ["zone"]},
        {"name": "tenant-availability", "sli": {"availability": {}}, "objective": "99.9%", "window": "30d",
         "slice_by": ["tenant"]},
    ]}))


def get(port: int, path: str, token: str | None = None, method: str = "GET", body: bytes | None = None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def api_worker(api_worker_process) -> int:
    return api_worker_process[0]


@pytest.fixture(scope="module")
def api_worker_process(broker, tmp_path_factory):
    from tailwatch.ingest.kafka import KafkaSettings, ensure_topics

    tmp = tmp_path_factory.mktemp("signal-api")
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka, partitions=2)
    pub = EventPublisher(kafka)
    pub.publish_events(fleet_events())
    pub.close()
    _api_config(tmp / "api.yaml")
    _slos(tmp / "slos.yaml")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", broker.bootstrap,
         "--topic-prefix", kafka.topic_prefix, "--store", str(tmp / "store.duckdb"), "--http-port", str(port),
         "--api-config", str(tmp / "api.yaml"), "--slos", str(tmp / "slos.yaml"), "--group", f"g-{uuid.uuid4().hex[:6]}",
         "--partitions", "2", "--detectors", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 60
    ready = None
    while time.monotonic() < deadline:
        try:
            ready = get(port, "/readyz")
            if ready[0] == 200:
                # Ready once the log is drained and its minutes closed: the view peeks at open
                # minutes (autoscale answers first), the SLOs need the closed ones.
                status, body = get(port, "/v1/autoscale/llm-a-realtime", TOKENS["ops"])
                _, slos = get(port, "/v1/slos", TOKENS["ops"])
                tenants = {s["labels"].get("tenant") for slo in slos.get("slos", []) for s in slo["slices"]}
                if status == 200 and body["signals"]["requests_per_s"] > 0 and {"acme", "globex", "solo"} <= tenants:
                    break
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail(f"the worker did not become ready: {ready}; stderr: {proc.stderr.read().decode()[-2000:]}")
    yield port, proc
    proc.terminate()
    proc.wait(timeout=30)


def test_queue_age_breach_scales_out_while_gpu_utilisation_looks_normal(api_worker):
    status, a = get(api_worker, "/v1/autoscale/llm-a-realtime", TOKENS["ops"])
    assert status == 200, a
    _, b = get(api_worker, "/v1/autoscale/llm-b-realtime", TOKENS["ops"])
    assert a["signals"]["gpu_util_mean_pct"] == pytest.approx(50.0)
    assert a["signals"]["queue_age_p95_ms"] == pytest.approx(4000.0)
    assert a["current_replicas"] == 4
    assert a["desired_replicas"] > b["desired_replicas"], (a, b)
    assert any("queue age p95 4,000 ms" in r for r in a["reasons"]), a["reasons"]
    assert any("not used to scale" in r for r in a["reasons"])
    assert not any("users are waiting" in r for r in b["reasons"]), b["reasons"]
    assert isinstance(a["desired_replicas"], int) and a["as_of"].startswith("2026-11-02T00:")


def test_shed_advice_for_a_pool_whose_users_wait(api_worker):
    status, a = get(api_worker, "/v1/shed/llm-a-realtime", TOKENS["ops"])
    assert status == 200, a
    assert a["under_pressure"] and any("queue age p95 4,000 ms" in p for p in a["pressure"]), a["pressure"]
    assert [s["step"] for s in a["steps"]][0] == "delay_batch" and a["steps"][0]["load_removed_gpu_s_per_s"] == 0
    assert sum(s["enough"] for s in a["steps"]) == 1  # realtime only: a later step is the one to take
    assert {g["tenant"] for g in a["admission"]["groups"]} == {"acme", "globex"}
    _, b = get(api_worker, "/v1/shed/llm-b-realtime", TOKENS["ops"])
    assert not b["under_pressure"] and not any(s["enough"] for s in b["steps"])
    # A tenant-scoped token sees no pool that carries other tenants' traffic.
    assert get(api_worker, "/v1/shed/llm-a-realtime", TOKENS["solo"])[0] == 404
    assert get(api_worker, "/v1/shed/tts-c-realtime", TOKENS["solo"])[0] == 200


def test_rollout_verdicts(api_worker):
    status, slow = get(api_worker, "/v1/rollout/chat-70b/v2-slow", TOKENS["ops"])
    assert status == 200 and slow["verdict"] == "rollback", slow
    assert any("first-output p99" in r for r in slow["reasons"])
    assert slow["canary"]["first_output_p99_ms"] > 2 * slow["stable"]["first_output_p99_ms"]
    status, cheap = get(api_worker, "/v1/rollout/chat-70b/v3-cheap", TOKENS["ops"])
    assert status == 200 and cheap["verdict"] == "promote", cheap
    assert cheap["canary"]["cost_per_unit"] == pytest.approx(cheap["stable"]["cost_per_unit"] / 2, rel=0.01)
    status, missing = get(api_worker, "/v1/rollout/chat-70b/v9", TOKENS["ops"])
    assert status == 404 and "v2-slow" in missing["error"]


def test_flagger_webhook(api_worker):
    def hook(check, version, token=TOKENS["ops"]):
        body = json.dumps({"name": "chat", "namespace": "serving", "phase": "Progressing",
                           "metadata": {"model": "chat-70b", "version": version, "token": token}}).encode()
        return get(api_worker, f"/v1/flagger/{check}", method="POST", body=body)

    assert hook("rollout", "v2-slow")[0] == 412  # a failed check: Flagger rolls back after `threshold`
    assert hook("rollback", "v2-slow")[0] == 200  # a rollback hook's 2xx rolls back at once
    assert hook("rollout", "v3-cheap")[0] == 200
    assert hook("confirm-traffic-increase", "v3-cheap")[0] == 200
    assert hook("confirm-promotion", "v3-cheap")[0] == 200
    assert hook("post-rollout", "v2-slow")[0] == 200  # Flagger only logs a failed post-rollout hook
    assert hook("rollback", "v3-cheap")[0] == 412
    # A version with no data yet is inconclusive: no failed check counted, promotion holds; its
    # first traffic step is judged on the stable side, fresh and not paging here.
    status, body = hook("rollout", "v9")
    assert status == 200 and body["verdict"] == "inconclusive" and body["reason"] == "no_data", body
    status, body = hook("confirm-traffic-increase", "v9")
    assert status == 200 and body["reason"] == "no_data" and "chat-70b v1" in body["error"], body
    assert [hook(c, "v9")[0] for c in ("confirm-promotion", "rollback")] == [412, 412]
    assert hook("rollout", "v3-cheap", token="wrong")[0] == 401
    assert hook("nonsense", "v3-cheap")[0] == 404
    assert hook("traffic-increase", "v3-cheap")[0] == 404  # Flagger's hook types are the names
    # The event hook (no token: Flagger replaces the metadata with the event) is counted, not logged.
    event = json.dumps({"name": "chat", "namespace": "serving", "phase": "Progressing", "metadata": {
        "eventMessage": "Advance chat.serving canary weight 20", "eventType": "Normal", "timestamp": "1793577600000"}})
    status, body = get(api_worker, "/v1/flagger/event", method="POST", body=event.encode())
    assert status == 200 and body == {"counted": True, "phase": "Progressing", "event_type": "Normal"}, body


def test_argo_web_metric_answers_200_with_the_verdict_or_inconclusive(api_worker):
    status, slow = get(api_worker, "/v1/argo/chat-70b/v2-slow", TOKENS["ops"])
    assert status == 200 and slow["verdict"] == "rollback"
    status, missing = get(api_worker, "/v1/argo/chat-70b/v9", TOKENS["ops"])
    assert status == 200 and missing["verdict"] == "inconclusive" and missing["reason"] == "no_data", missing
    assert get(api_worker, "/v1/argo/chat-70b/v2-slow")[0] == 401


def _controller_api(verdicts: dict[str, str], built_wall_s: float, now_s: float, canary_moved_s: float | None = None,
                    stable_moved_s: float | None = None):
    from tailwatch.signals.api import SignalApi
    from tailwatch.signals.config import ApiConfig, Principal
    from tailwatch.signals.answers import Verdict
    from tailwatch.signals.live import Scoped, SignalSnapshot, answer
    from tailwatch.signals.served import serve

    rollouts = {("m", v): Scoped(answer({"verdict": verdict, "reasons": [], "model": "m", "version": v, "window_minutes": 30,
                                         "as_of": "2026-11-02T00:30:00Z"}, Verdict), frozenset({"t"}), 0,
                                 built_wall_s if canary_moved_s is None else canary_moved_s,
                                 built_wall_s if stable_moved_s is None else stable_moved_s)
                for v, verdict in verdicts.items()}
    snap = serve(SignalSnapshot(built_wall_s, 0, {}, rollouts, {"m": frozenset(verdicts)}, [], []))
    token = "tok"
    config = ApiConfig(stale_after_s=60.0, tokens={hashlib.sha256(token.encode()).hexdigest(): Principal("ops", None)})
    return SignalApi(config, lambda: snap, lambda: (True, ""), wall_clock=lambda: now_s), token


HOOKS = ("confirm-rollout", "pre-rollout", "rollout", "confirm-traffic-increase", "confirm-promotion", "post-rollout",
         "rollback")


@pytest.mark.parametrize("verdict, expected", [
    ("promote", [200, 200, 200, 200, 200, 200, 412]),
    ("continue", [200, 200, 200, 200, 412, 200, 412]),
    ("pause", [200, 200, 200, 412, 412, 200, 412]),  # wait: no failed check counted, the traffic gate holds
    ("rollback", [412, 412, 412, 412, 412, 200, 200]),
])
def test_flagger_hook_types_follow_flaggers_contract(verdict, expected):
    api, token = _controller_api({"v2": verdict}, built_wall_s=1000.0, now_s=1001.0)
    body = json.dumps({"metadata": {"model": "m", "version": "v2", "token": token}}).encode()
    assert [call_api(api, "POST", f"/v1/flagger/{c}", None, body)[0] for c in HOOKS] == expected


def test_a_new_canary_without_data_may_start_and_frozen_data_holds_it():
    """`confirm-rollout` runs before the canary has traffic: no data for the version passes
    (no gate would ever open otherwise), and neither pre-rollout nor rollout counts a failure;
    data that stopped moving holds the rollout at the gate."""
    api, token = _controller_api({"v2": "promote"}, built_wall_s=1000.0, now_s=1001.0)
    hook = json.dumps({"metadata": {"model": "m", "version": "v-new", "token": token}}).encode()
    assert [call_api(api, "POST", f"/v1/flagger/{c}", None, hook)[0] for c in HOOKS] == [
        200, 200, 200, 412, 412, 200, 412]
    stale, token = _controller_api({"v2": "promote"}, built_wall_s=1000.0, now_s=1000.0 + 600)
    hook = json.dumps({"metadata": {"model": "m", "version": "v2", "token": token}}).encode()
    assert [call_api(stale, "POST", f"/v1/flagger/{c}", None, hook)[0] for c in HOOKS] == [
        412, 200, 200, 412, 412, 200, 412]


def test_stale_data_is_inconclusive_for_controllers_and_503_for_pollers():
    api, token = _controller_api({"v2": "rollback"}, built_wall_s=1000.0, now_s=1000.0 + 600)
    auth = f"Bearer {token}"
    assert call_api(api, "GET", "/v1/rollout/m/v2", auth, b"")[0] == 503
    status, _ct, body = call_api(api, "GET", "/v1/argo/m/v2", auth, b"")
    answer = json.loads(body)
    assert status == 200 and answer["verdict"] == "inconclusive" and answer["reason"] == "stale", answer
    hook = json.dumps({"metadata": {"model": "m", "version": "v2", "token": token}}).encode()
    # Ten-minute-old data says rollback: a rollout controller neither rolls back nor advances on it.
    assert [call_api(api, "POST", f"/v1/flagger/{c}", None, hook)[0]
            for c in ("rollout", "confirm-traffic-increase", "confirm-promotion", "rollback")] == [200, 412, 412, 412]


@pytest.mark.parametrize("stale_side", ["canary", "stable"])
def test_a_verdict_on_a_side_that_stopped_moving_is_stale_though_the_view_is_fresh(stale_side):
    """The view is rebuilt every few seconds, but the canary's own traffic (or the stable
    baseline's) stopped ten minutes ago: its `promote` is frozen data, never a promotion."""
    moved = {f"{stale_side}_moved_s": 1000.0 - 600}
    api, token = _controller_api({"v2": "promote"}, built_wall_s=1000.0, now_s=1001.0, **moved)
    auth = f"Bearer {token}"
    status, _ct, body = call_api(api, "GET", "/v1/rollout/m/v2", auth, b"")
    answer = json.loads(body)
    assert status == 503 and answer["reason"] == "stale" and answer["data_age_s"] == 601.0, answer
    assert stale_side in answer["error"]
    argo = json.loads(call_api(api, "GET", "/v1/argo/m/v2", auth, b"")[2])
    assert argo["verdict"] == "inconclusive" and argo["reason"] == "stale" and argo["data_age_s"] == 601.0, argo
    hook = json.dumps({"metadata": {"model": "m", "version": "v2", "token": token}}).encode()
    assert [call_api(api, "POST", f"/v1/flagger/{c}", None, hook)[0]
            for c in ("rollout", "confirm-traffic-increase", "confirm-promotion", "rollback")] == [200, 412, 412, 412]
    # Both sides fresh: the verdict, with each side's age.
    api, token = _controller_api({"v2": "promote"}, built_wall_s=1000.0, now_s=1001.0, canary_moved_s=990.0)
    fresh = json.loads(call_api(api, "GET", "/v1/rollout/m/v2", f"Bearer {token}", b"")[2])
    assert fresh["verdict"] == "promote" and (fresh["canary_data_age_s"], fresh["stable_data_age_s"], fresh["data_age_s"]) \
        == (11.0, 1.0, 11.0), fresh


def test_tokens_and_tenant_scopes(api_worker):
    assert get(api_worker, "/v1/autoscale/llm-a-realtime")[0] == 401
    assert get(api_worker, "/v1/autoscale/llm-a-realtime", "not-a-token")[0] == 401
    # The scoped token sees its own tenant's pool, and nothing that carries another tenant's traffic.
    status, tts = get(api_worker, "/v1/autoscale/tts-c-realtime", TOKENS["solo"])
    assert status == 200 and tts["pool"] == "tts-c-realtime"
    hidden = get(api_worker, "/v1/autoscale/llm-a-realtime", TOKENS["solo"])
    unknown = get(api_worker, "/v1/autoscale/no-such-pool", TOKENS["solo"])
    assert hidden[0] == unknown[0] == 404
    assert "acme" not in json.dumps(hidden[1]) and "globex" not in json.dumps(hidden[1])
    assert get(api_worker, "/v1/rollout/chat-70b/v3-cheap", TOKENS["solo"])[0] == 404
    status, slos = get(api_worker, "/v1/slos", TOKENS["solo"])
    assert status == 200
    labels = [s["labels"] for slo in slos["slos"] for s in slo["slices"]]
    assert labels == [{"tenant": "solo"}], labels
    status, everything = get(api_worker, "/v1/slos", TOKENS["ops"])
    tenants = {s["labels"].get("tenant") for slo in everything["slos"] for s in slo["slices"]}
    assert {"acme", "globex", "solo"} <= tenants
    assert get(api_worker, "/v1/slos/chat-first-token", TOKENS["solo"])[0] == 404
    status, one = get(api_worker, "/v1/slos/chat-first-token", TOKENS["ops"])
    assert status == 200 and {s["labels"]["zone"] for s in one["slices"]} == {"us-east-1a", "us-east-1b"}
    assert all(0 <= s["error_budget_remaining"] <= 1 for s in one["slices"])
    status, alerts = get(api_worker, "/v1/alerts", TOKENS["solo"])
    assert status == 200 and all(a["labels"].get("tenant") == "solo" for a in alerts["alerts"])
    # /metrics carries every tenant's series: with tokens configured, only an all-tenants token reads it.
    assert get(api_worker, "/metrics")[0] == 401
    assert get(api_worker, "/metrics", TOKENS["solo"])[0] == 403
    req = urllib.request.Request(f"http://127.0.0.1:{api_worker}/metrics", headers={"Authorization": f"Bearer {TOKENS['ops']}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and b"tailwatch_events_total" in r.read()


def test_bad_requests(api_worker):
    assert get(api_worker, "/v1/autoscale/" + "x" * 200, TOKENS["ops"])[0] == 400
    assert get(api_worker, "/v1/autoscale/bad%20name", TOKENS["ops"])[0] == 400
    assert get(api_worker, "/v1/autoscale/llm-a-realtime", TOKENS["ops"], method="POST", body=b"{}")[0] == 405
    status, big = get(api_worker, "/v1/flagger/rollout", method="POST", body=b"x" * 70_000)
    assert status == 413
    assert get(api_worker, "/v1/flagger/rollout", TOKENS["ops"], method="POST", body=b"not json")[0] == 400
    import socket

    with socket.create_connection(("127.0.0.1", api_worker), timeout=10) as sock:
        sock.sendall(b"POST /v1/flagger/rollout HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
        assert sock.recv(200).startswith(b"HTTP/1.1 400")


def test_openapi_lists_every_route_and_answers_carry_required_fields(api_worker):
    status, doc = get(api_worker, "/openapi.json")
    from tailwatch.signals.api import SignalApi
    from tailwatch.signals.config import ApiConfig
    from tailwatch.signals.routes import make_app, route_table

    app = make_app(SignalApi(ApiConfig(), lambda: None, lambda: (True, "")))
    assert status == 200 and doc == json.loads(msgspec.json.encode(app.openapi_schema.to_schema()))
    served = {(m.lower(), p) for m, p in route_table(app) if not p.startswith("/openapi")}
    assert len(served) == 11 and served == {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert sorted(doc["paths"]["/v1/flagger/{check}"]["post"]["parameters"][0]["schema"]["enum"]) == [
        "confirm-promotion", "confirm-rollout", "confirm-traffic-increase", "post-rollout", "pre-rollout", "rollback",
        "rollout"]
    schemas = doc["components"]["schemas"]
    # Every schema is a real one (the hand copy once held a `Side` with no properties).
    assert all(s.get("properties") for s in schemas.values()), [n for n, s in schemas.items() if not s.get("properties")]
    # A live server's answers hold every required property, and no property the document lacks.
    for path, schema in (("/v1/autoscale/llm-b-realtime", "Autoscale"), ("/v1/rollout/chat-70b/v3-cheap", "Verdict"),
                         ("/v1/slos/chat-first-token", "Slo"), ("/v1/rollout/chat-70b/v2-slow", "Verdict"),
                         ("/v1/shed/llm-a-realtime", "Shed")):
        _, answer = get(api_worker, path, TOKENS["ops"])
        props = schemas[schema]["properties"]
        assert set(schemas[schema]["required"]) <= set(answer) <= set(props), (path, set(answer) ^ set(props))
    _, slow = get(api_worker, "/v1/rollout/chat-70b/v2-slow", TOKENS["ops"])
    assert set(slow["canary"]) == set(schemas["Side"]["properties"])
    for metric in slow["metrics"].values():
        assert set(metric) <= set(schemas["MetricAnswer"]["properties"])
    _, a = get(api_worker, "/v1/autoscale/llm-b-realtime", TOKENS["ops"])
    assert set(a["signals"]) <= set(schemas["PoolSignalsAnswer"]["properties"])


def test_stale_data_answers_503_so_keda_falls_back(api_worker):
    # No new events arrive; once the pool's data is older than stale_after (8 s) the
    # answer turns to 503 with a JSON reason, while the health endpoints stay up.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = get(api_worker, "/v1/autoscale/llm-b-realtime", TOKENS["ops"])
        if status == 503:
            break
        time.sleep(0.5)
    assert status == 503 and body["reason"] == "stale" and "llm-b-realtime" in body["error"], body
    # Shedding advice on data that stopped arriving would shed on a guess: the same 503.
    status, body = get(api_worker, "/v1/shed/llm-b-realtime", TOKENS["ops"])
    assert status == 503 and body["reason"] == "stale", body
    assert get(api_worker, "/healthz")[0] == 200
    # Nor does a canary promote on it. v3-cheap was promotable (test_flagger_webhook: confirm-promotion
    # 200); its producers stopped with the rest. The worker's view stays fresh (it still
    # answers the SLO list), but the verdict stands on data older than the bound.
    assert get(api_worker, "/v1/slos", TOKENS["ops"])[0] == 200
    deadline = time.monotonic() + 30  # each side is judged on its own last movement, which may be seconds later
    while (got := get(api_worker, "/v1/rollout/chat-70b/v3-cheap", TOKENS["ops"]))[0] != 503 and time.monotonic() < deadline:
        assert got[1]["data_age_s"] <= 8 + 1, got  # fresh while it says so: a verdict only within the bound
        time.sleep(0.5)
    status, body = got
    assert status == 503 and body["reason"] == "stale" and body["data_age_s"] > 8, body
    status, argo = get(api_worker, "/v1/argo/chat-70b/v3-cheap", TOKENS["ops"])
    assert status == 200 and argo["verdict"] == "inconclusive" and argo["reason"] == "stale", argo
    hook = json.dumps({"metadata": {"model": "chat-70b", "version": "v3-cheap", "token": TOKENS["ops"]}}).encode()
    assert [get(api_worker, f"/v1/flagger/{c}", method="POST", body=hook)[0]
            for c in ("confirm-traffic-increase", "confirm-promotion")] == [412, 412]


def _http_head(port: int, raw: bytes, timeout_s: float = 10.0) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(raw)
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = sock.recv(4096)
            if not chunk:
                break
            out += chunk
        return out


def _read_response(sock) -> bytes:
    """One whole HTTP response (head and Content-Length body) from a socket."""
    out = b""
    while b"\r\n\r\n" not in out:
        out += sock.recv(65536)
    head, _, body = out.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_chunked_and_malformed_requests_are_answered_correctly(api_worker):
    body = json.dumps({"metadata": {"model": "chat-70b", "version": "v9", "token": TOKENS["ops"]}}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7)) + b"0\r\n\r\n"
    import socket

    with socket.create_connection(("127.0.0.1", api_worker), timeout=10) as sock:
        # A chunked POST is read whole (not its chunk-size line as a second request), and the
        # same keep-alive connection then answers the next request.
        sock.sendall(b"POST /v1/flagger/confirm-traffic-increase HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunked)
        first = _read_response(sock)
        assert first.startswith(b"HTTP/1.1 412") and b"inconclusive" in first, first[:300]  # no v9: the gate holds
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
    assert _http_head(api_worker, b"NOT-HTTP\r\n\r\n").startswith(b"HTTP/1.1 400")
    # A head that keeps growing past 16 KiB without ending is refused, not buffered on.
    with socket.create_connection(("127.0.0.1", api_worker), timeout=10) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000)
        time.sleep(0.3)
        try:
            sock.sendall(b"a" * 40_000 + b"\r\n\r\n")
            answer = sock.recv(200)
        except OSError:  # reset while we were still sending: refused all the same
            answer = b""
        assert answer[:12] in (b"HTTP/1.1 400", b"HTTP/1.1 431", b""), answer[:200]
    # The bearer scheme is case-insensitive.
    req = urllib.request.Request(f"http://127.0.0.1:{api_worker}/v1/slos")
    req.add_header("Authorization", f"bearer {TOKENS['ops']}")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def test_slow_clients_and_idle_connections_do_not_hold_the_port(api_worker):
    """A slowloris client is cut off once its head is late; a thousand idle connections are
    held by one event loop (no thread each) while another client is answered every time."""
    import socket

    idle = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", api_worker), timeout=10))
        slow = socket.create_connection(("127.0.0.1", api_worker), timeout=30)
        started = time.monotonic()
        closed_after = None
        for byte in b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40:
            try:
                slow.sendall(bytes([byte]))
                slow.settimeout(1.0)
                if slow.recv(1) == b"":
                    closed_after = time.monotonic() - started
                    break
            except socket.timeout:
                continue  # still open: send the next byte
            except OSError:
                closed_after = time.monotonic() - started
                break
        slow.close()
        assert closed_after is not None and closed_after < 15, closed_after  # HEAD_TIMEOUT_S is 5 s
        latencies = []
        for _ in range(200):
            t0 = time.perf_counter()
            status, _body = get(api_worker, "/v1/slos", TOKENS["ops"])
            latencies.append(time.perf_counter() - t0)
            assert status == 200
        latencies.sort()
        print(f"with 1,000 idle connections: p50 {latencies[100] * 1000:.1f} ms, p99 {latencies[197] * 1000:.1f} ms")
    finally:
        for s in idle:
            s.close()


def test_an_http_process_that_dies_is_started_again_on_its_port_and_the_worker_goes_on(api_worker_process):
    # The worker serves HTTP from a child process (streams/http.py). Killed (an OOM kill, a
    # crash), it must come back on the same port with the same view, even from an idle worker
    # that only sends heartbeats, and the worker must keep running.
    port, worker = api_worker_process
    # The SLO list: the pools' answers are stale (503) by now, the idle worker's view is not.
    before, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline:  # the worker has drained the log: two reads agree
        status, answer = get(port, "/v1/slos", TOKENS["ops"])
        assert status == 200, answer
        if answer == before:
            break
        before = answer
        time.sleep(2)
    assert before["slos"] and all(slo["slices"] for slo in before["slos"]), before
    children = open(f"/proc/{worker.pid}/task/{worker.pid}/children").read().split()
    served_by = [int(c) for c in children if b"spawn_main" in open(f"/proc/{c}/cmdline", "rb").read()]
    assert len(served_by) == 1, children
    os.kill(served_by[0], 9)
    deadline, after = time.monotonic() + 40, None
    while time.monotonic() < deadline:
        try:
            status, after = get(port, "/v1/slos", TOKENS["ops"])
            if status == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.5)
    assert worker.poll() is None, worker.stderr.read().decode()[-2000:]
    assert status == 200, after
    assert after == before
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKENS['ops']}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert b"tailwatch_http_restarts_total 1.0" in r.read()


@pytest.mark.parametrize("method, path, authorization, status", [
    ("GET", "/v1/rollout/m/v2", "tok", 200),
    ("GET", "/v1/rollout/m/v2", "wrong", 401),
    ("GET", "/v1/rollout/m/v9", "tok", 404),
    ("GET", "/v1/nothing", "tok", 404),
    ("POST", "/v1/alerts", "tok", 405),
])
def test_every_answer_has_one_json_head(method, path, authorization, status):
    """The app writes each answer's head itself (`JsonResponse`): one content type, the body's
    exact length, the bearer challenge on a 401 and nothing else, whoever answered."""
    api, _token = _controller_api({"v2": "promote"}, built_wall_s=1000.0, now_s=1001.0)
    r = api_client(api).request(method, path, headers={"authorization": f"Bearer {authorization}"})
    assert r.status_code == status and r.json()
    expected = {("content-type", "application/json"), ("content-length", str(len(r.content)))}
    if status == 401:
        expected.add(("www-authenticate", 'Bearer realm="tailwatch"'))
    assert sorted(r.headers.multi_items()) == sorted(expected)
