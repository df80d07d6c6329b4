"""The generated Collector scrape jobs as a real Prometheus applies them: dcgm-exporter and
vLLM pages scraped through the generated `honor_labels` and relabel rules (Kubernetes pod
discovery stood in for by file_sd targets carrying the same `__meta_kubernetes_*` labels),
the stored series mapped to events, published through the real broker to a real worker,
whose signal API then answers the pool's autoscale question and judges the canary."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid

import pytest
import yaml

from tailwatch.deploy.neighbours import collector_config, scrape_configs
from tailwatch.deploy.settings import DeploySettings, PodLabels
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.scrape import PrometheusScraper
from tests.conftest import free_port, need, worker_command
from tests.test_otlp import DCGM_EXPOSITION, _Exposition
from tests.test_signal_api import get

POOL = "llm-us-east-1a-realtime"
ZONE = "us-east-1a"  # the node's topology label: the pods carry none
NODE = "gpu-node-7"
STABLE_POD, CANARY_POD = "llama-8b-6f9c", "llama-8b-canary-7d2e"  # on GPU 0 and GPU 1 (DCGM's `pod`)
T0_MS = 1_793_577_600_000
TOKEN = "ops-secret-token"
SETTINGS = DeploySettings()  # the documented pod label keys: tailwatch.dev/pool, ...

VLLM = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-8b"} {waiting}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-8b"} 24.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="llama-8b"} {fast}
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="llama-8b"} {all}
vllm:e2e_request_latency_seconds_count{engine="0",model_name="llama-8b"} {all}
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="llama-8b"} {total}
"""


def vllm_page(fast: int, slow: int, waiting: int) -> str:
    return (VLLM.replace("{fast}", str(fast)).replace("{all}", str(fast + slow)).replace("{waiting}", str(waiting))
            .replace("{total}", str(0.5 * fast + 3.0 * slow)))


# dcgm-exporter's page as the GPU Operator runs it (Kubernetes mode): `pod` is the GPU's user.
DCGM = (DCGM_EXPOSITION.replace("{xid}", "0").replace("{ecc}", "2")
        .replace('container="",namespace="",pod=""', f'container="vllm",namespace="serving",pod="{CANARY_POD}"'))


class Pages:
    """HTTP servers whose page the test sets between scrapes (`set`)."""

    def __init__(self):
        self.texts: dict[int, list[str]] = {}  # each handler's one-page list: it serves [0]
        self.servers = []

    def serve(self, text: str) -> int:
        texts = [text]
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Exposition,), {"texts": texts}))
        port = server.server_address[1]
        self.texts[port] = texts
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return port

    def set(self, port: int, text: str) -> None:
        self.texts[port][0] = text

    def text(self, port: int) -> str:
        return self.texts[port][0]


def sd_label(prefix: str, key: str) -> str:
    """A label key as Kubernetes discovery names its meta label."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def pod_target(port: int, app: str, pod: str, labels: dict[str, str]) -> dict:
    """A file_sd group with the meta labels Kubernetes pod discovery gives this pod."""
    meta = {sd_label("__meta_kubernetes_pod_label_", k): v for k, v in {"app.kubernetes.io/name": app, **labels}.items()}
    return {"targets": [f"127.0.0.1:{port}"],
            "labels": {**meta, "__meta_kubernetes_pod_name": pod, "__meta_kubernetes_pod_node_name": NODE,
                       sd_label("__meta_kubernetes_node_label_", "topology.kubernetes.io/zone"): ZONE}}


def prometheus_config(targets_file: str) -> dict:
    jobs = []
    generated = yaml.safe_load(collector_config(SETTINGS)["data"]["config.yaml"])
    for job in generated["receivers"]["prometheus"]["config"]["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"  # file_sd stands in, with its meta labels
        jobs.append({**job, "scrape_interval": "1s", "file_sd_configs": [{"files": [targets_file],
                                                                          "refresh_interval": "1s"}]})
    return {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}


def prometheus_page(port: int) -> str:
    """Every series Prometheus stored, as a text exposition with the types it learnt."""
    def api(path: str, **query) -> dict:
        url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())["data"]

    types = {name: entries[0]["type"] for name, entries in api("metadata").items()}
    families: dict[str, list[str]] = {}
    for series in api("query", query='{job=~"dcgm|serving"}')["result"]:
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        family = next((name.removesuffix(s) for s in ("_bucket", "_count", "_sum")
                       if types.get(name.removesuffix(s)) == "histogram"), name)
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        families.setdefault(family, []).append(f"{name}{{{inner}}} {series['value'][1]}")
    return "".join(f"# TYPE {f} {types.get(f, 'untyped')}\n" + "\n".join(lines) + "\n" for f, lines in families.items())


@pytest.fixture()
def prometheus(tmp_path):
    need(shutil.which("prometheus") is not None, "the prometheus binary")
    pages = Pages()
    dcgm = pages.serve(DCGM)
    stable, canary = pages.serve(vllm_page(0, 0, 0)), pages.serve(vllm_page(0, 0, 0))
    shared = {"tailwatch.dev/pool": POOL, "tailwatch.dev/model": "llama-8b"}
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([
        pod_target(dcgm, "dcgm-exporter", "nvidia-dcgm-exporter-x2k4p", {"tailwatch.dev/pool": "not-a-pool"}),
        pod_target(stable, "vllm", STABLE_POD, {**shared, "tailwatch.dev/model-version": "v1",
                                                "tailwatch.dev/deployment": "stable"}),
        pod_target(canary, "vllm", CANARY_POD, {**shared, "tailwatch.dev/model-version": "v2",
                                                "tailwatch.dev/deployment": "canary"}),
    ]))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(str(targets))))
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    yield port, pages, {"stable": stable, "canary": canary}
    proc.terminate()
    proc.wait(timeout=20)
    for s in pages.servers:
        s.shutdown()


def scraped_once(port: int, want: dict[str, str], timeout_s: float = 20.0) -> str:
    """Prometheus's page once it holds DCGM's series and every wanted `pod` → e2e count."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            page = prometheus_page(port)
        except OSError:
            page = ""
        counts = [line for line in page.splitlines() if line.startswith("vllm:e2e_request_latency_seconds_count")]
        # each target scrapes on its own offset: DCGM's series may come a second after vLLM's
        if 'job="dcgm"' in page and all(any(f'pod="{pod}"' in line and line.endswith(f" {n}") for line in counts)
                                        for pod, n in want.items()):
            return page
        time.sleep(0.3)
    pytest.fail(f"prometheus did not scrape {want} in {timeout_s} s")


@pytest.mark.slow
def test_dcgm_and_vllm_pages_through_the_generated_rules_answer_autoscale_and_judge_the_canary(prometheus, broker,
                                                                                             tmp_path):
    from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
    from tailwatch.ingest.producer import EventPublisher

    port, pages, ports = prometheus
    stored = Pages()
    page_port = stored.serve("")
    scraper = PrometheusScraper([f"http://127.0.0.1:{page_port}/metrics"], OtlpMapping())
    events, rounds = [], []
    # (stable fast, slow), (canary fast, slow) running totals, one state a minute
    states = [((0, 0), (0, 0)), ((290, 10), (150, 150)), ((580, 20), (300, 300)), ((870, 30), (450, 450))]
    for minute, ((sf, ss), (cf, cs)) in enumerate(states):
        pages.set(ports["stable"], vllm_page(sf, ss, waiting=40))
        pages.set(ports["canary"], vllm_page(cf, cs, waiting=40))
        stored.set(page_port, scraped_once(port, {STABLE_POD: str(sf + ss), CANARY_POD: str(cf + cs)}))
        got = scraper.round(T0_MS + minute * 60_000)
        assert not got.errors and not got.gpu.refused and not got.requests.refused, got
        rounds.append(got)
        events += got.gpu.samples + got.requests.events
    page = stored.text(page_port)
    # dcgm-exporter's own `pod` kept (not `exported_pod`); the exporter's pod labels give no pool
    assert f'pod="{CANARY_POD}"' in next(l for l in page.splitlines() if l.startswith("DCGM_FI_DEV_GPU_UTIL{")
                                         and 'gpu="1"' in l)
    assert "exported_pod" not in page and "not-a-pool" not in page
    # each runtime's gauges join the GPU its pod uses, with the pool, zone, version and deployment of its pod
    runtime = {(g.gpu_index, g.pool, g.zone, g.model_version) for r in rounds for g in r.gpu.samples
               if g.source == "runtime"}
    assert runtime == {(0, POOL, ZONE, "v1"), (1, POOL, ZONE, "v2")}, runtime
    requests = [e for r in rounds for e in r.requests.events]
    assert {(e.pool, e.zone, e.model, e.model_version, e.deployment) for e in requests} == {
        (POOL, ZONE, "llama-8b", "v1", "stable"), (POOL, ZONE, "llama-8b", "v2", "canary")}
    assert len(requests) == 900 + 900

    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka, partitions=1)
    pub = EventPublisher(kafka)
    pub.publish_events(events)
    pub.close()
    (tmp_path / "api.yaml").write_text(yaml.safe_dump({
        "stale_after": "1h", "tokens": [{"name": "ops", "sha256": hashlib.sha256(TOKEN.encode()).hexdigest(),
                                         "tenants": "*"}],
        "rollout": {"min_requests": 100, "promote_min_requests": 500}}))
    api = free_port()
    worker = subprocess.Popen(
        worker_command(broker.bootstrap, kafka.topic_prefix, tmp_path / "store.duckdb", api,
                       "--api-config", str(tmp_path / "api.yaml")),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline, scaled, judged = time.monotonic() + 60, (None, None), (None, None)
        while time.monotonic() < deadline:
            try:
                scaled = get(api, f"/v1/autoscale/{POOL}", TOKEN)
                judged = get(api, "/v1/rollout/llama-8b/v2", TOKEN)
                if scaled[0] == 200 and judged[0] == 200 and judged[1].get("reason") != "no_data":
                    break
            except OSError:
                pass
            time.sleep(0.5)
    finally:
        worker.terminate()
        stderr = worker.communicate(timeout=30)[1].decode()[-2000:]
    assert scaled[0] == 200 and scaled[1]["signals"]["requests_per_s"] > 0, (scaled, stderr)
    assert judged[0] == 200 and judged[1]["verdict"] in ("rollback", "continue", "promote"), (judged, stderr)
    # the canary is six times slower at the tail: half its requests above 1 s against 3% of stable's
    assert judged[1]["verdict"] == "rollback", judged


def test_pod_label_keys_are_settings_and_each_becomes_the_label_the_mapping_reads():
    s = DeploySettings(pod_labels=PodLabels(pool="example.com/pool", deployment="rollouts.example/track"))
    jobs = {j["job_name"]: j for j in scrape_configs(s)}
    assert all(j["honor_labels"] for j in jobs.values())
    copied = {r["source_labels"][0]: r["target_label"] for r in jobs["serving"]["relabel_configs"]
              if r.get("regex") == "(.+)"}
    assert copied["__meta_kubernetes_pod_label_example_com_pool"] == "pool"
    assert copied["__meta_kubernetes_pod_label_rollouts_example_track"] == "deployment"
    assert copied["__meta_kubernetes_pod_label_tailwatch_dev_model_version"] == "model_version"
    assert copied["__meta_kubernetes_node_label_topology_kubernetes_io_zone"] == "zone"
    # the exporter's own pod labels name no pool: only the node and its zone come from its target
    assert {r.get("target_label") for r in jobs["dcgm"]["relabel_configs"]} == {None, "node", "zone"}
    rules = OtlpMapping()
    for target in ("pool", "zone", "model_version", "deployment"):
        assert target in getattr(rules.requests, target).attributes
