"""Scraping without a Collector, over real HTTP: vLLM's own /metrics carries no pod, node or GPU
label, so its gauges join a GPU only through the target's labels (`--url URL#node=..,gpu=..` or a
targets file in Prometheus's file_sd shape), and never make up a GPU of their own."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
import yaml

from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.scrape import PrometheusScraper, ScrapeError, parse_target
from tailwatch.cli import main
from tests.test_otlp import DCGM_EXPOSITION, _Exposition

T0_MS = 1_793_577_600_000
# vLLM's page as it serves it: only engine and model_name on each series.
BARE_VLLM = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 24.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} {fast}
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} {all}
vllm:e2e_request_latency_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} {all}
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} {total}
"""


def vllm_page(fast: int, slow: int) -> str:
    return (BARE_VLLM.replace("{fast}", str(fast)).replace("{all}", str(fast + slow))
            .replace("{total}", str(0.5 * fast + 3.0 * slow)))


@pytest.fixture()
def pages():
    servers = []

    def serve(*texts: str) -> str:
        handler = type("H", (_Exposition,), {"texts": list(texts)})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield serve
    for s in servers:
        s.shutdown()


def dcgm_page() -> str:
    return DCGM_EXPOSITION.replace("{xid}", "0").replace("{ecc}", "2")


def test_a_bare_vllm_page_makes_no_phantom_gpu(pages):
    dcgm, vllm = pages(dcgm_page()), pages(vllm_page(3, 1))
    scraped = PrometheusScraper([f"http://{dcgm}/metrics", f"http://{vllm}/metrics"], OtlpMapping()).round(T0_MS)
    gpus = {(g.node, g.gpu_index) for g in scraped.gpu.samples}
    assert gpus == {("gpu-node-7", 0), ("gpu-node-7", 1)}  # the two GPUs DCGM reports, no third
    assert all(g.source == "dcgm" for g in scraped.gpu.samples)
    reasons = {reason for reason, _ in scraped.gpu.refused}
    assert reasons == {"otlp_metric_unmapped"}
    assert all("node=" in detail and "gpu=" in detail for _, detail in scraped.gpu.refused)


def test_target_labels_join_the_runtime_to_its_gpu_and_slice_its_requests(pages):
    dcgm, vllm = pages(dcgm_page()), pages(vllm_page(0, 0), vllm_page(3, 1))
    scraper = PrometheusScraper([f"http://{dcgm}/metrics",
                                 f"http://{vllm}/metrics#node=gpu-node-7,zone=eu-west-4a,pool=llm-eu,gpu=1"],
                                OtlpMapping())
    first = scraper.round(T0_MS)
    assert not first.gpu.refused and not first.errors
    runtime = [g for g in first.gpu.samples if g.source == "runtime"]
    assert [(g.node, g.gpu_index, g.queue_depth, g.running, g.zone, g.pool) for g in runtime] == [
        ("gpu-node-7", 1, 7, 24, "eu-west-4a", "llm-eu")]
    assert {(g.node, g.gpu_index) for g in first.gpu.samples} == {("gpu-node-7", 0), ("gpu-node-7", 1)}
    requests = scraper.round(T0_MS + 60_000).requests.events
    # above the last bound: what the sum leaves once the others sit at their bounds (4.5 - 3 s), at least 1 s
    assert sorted(r.e2e_ms for r in requests) == [1000.0, 1000.0, 1000.0, 1500.0]
    assert {(r.zone, r.pool, r.model) for r in requests} == {("eu-west-4a", "llm-eu", "meta-llama/Llama-3.1-8B-Instruct")}


def test_a_targets_file_in_file_sd_shape_is_read_each_round(pages, tmp_path, capsys):
    dcgm, vllm = pages(dcgm_page()), pages(vllm_page(0, 0), vllm_page(2, 0))
    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump([
        {"targets": [dcgm], "labels": {"zone": "eu-west-4a"}},
        {"targets": [vllm], "labels": {"node": "gpu-node-7", "gpu": "0,1", "zone": "eu-west-4a",
                                       "__metrics_path__": "/metrics"}},
    ]))
    assert main(["collect", "prometheus", "--print", "--count", "2", "--interval", "0.1",
                 "--targets", str(targets)]) == 0
    out = capsys.readouterr()
    events = [json.loads(line) for line in out.out.splitlines()]
    runtime = [e for e in events if e.get("source") == "runtime"]
    assert sorted({e["gpu_index"] for e in runtime}) == [0, 1] and {e["zone"] for e in runtime} == {"eu-west-4a"}
    assert {(e["node"], e["gpu_index"]) for e in events if e["schema"] == "gpu.v1"} == {("gpu-node-7", 0),
                                                                                       ("gpu-node-7", 1)}
    requests = [e for e in events if e["schema"] == "request.v1"]
    assert len(requests) == 2 and {r["zone"] for r in requests} == {"eu-west-4a"}
    assert "otlp_metric_unmapped" not in out.err
    # A broken file keeps the last good list and says why, each round.
    targets.write_text("targets: [oops")
    scraper = PrometheusScraper([], OtlpMapping(), targets_file=None)
    with pytest.raises(ScrapeError, match="targets.yaml"):
        PrometheusScraper([], OtlpMapping(), targets_file=str(targets))
    assert scraper.round(T0_MS).errors == []


@pytest.mark.parametrize("text, labels", [
    ("http://h:8000/metrics", {}),
    ("http://h:8000/metrics#node=n1,zone=z1,gpu=0,1", {"node": "n1", "zone": "z1", "gpu": "0,1"}),
    ("http://h:8000/metrics#gpu=2;pool=p", {"gpu": "2", "pool": "p"}),
])
def test_target_labels_after_the_fragment(text, labels):
    target = parse_target(text)
    assert target.url == text.split("#")[0] and target.labels == labels


@pytest.mark.parametrize("text", ["http://h/metrics#tenant=acme", "http://h/metrics#zone"])
def test_unknown_or_malformed_target_labels_are_refused_in_one_line(text):
    with pytest.raises(ScrapeError, match=r"h/metrics"):
        parse_target(text)


def test_rounds_keep_each_target_connection_alive_and_an_endless_page_is_cut(pages, monkeypatch):
    """One TCP connection per target across rounds (HTTP/1.1 keep-alive), and a target that
    sends more than the page limit is one error line, read no further than the limit."""
    connections = []

    class KeepAlive(_Exposition):
        protocol_version = "HTTP/1.1"
        texts = [dcgm_page()]

        def setup(self):
            connections.append(self.client_address)
            super().setup()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        scraper = PrometheusScraper([f"http://127.0.0.1:{server.server_address[1]}/metrics"], OtlpMapping())
        rounds = [scraper.round(T0_MS + i * 10_000) for i in range(3)]
        assert all(not r.errors and r.gpu.samples for r in rounds)
        assert len(connections) == 1
    finally:
        server.shutdown()
    import tailwatch.ingest.otlp.scrape as scrape

    monkeypatch.setattr(scrape, "MAX_EXPOSITION_BYTES", 4096)
    big = pages("# padding\n" * 100_000)  # about 1 MB
    round_ = PrometheusScraper([f"http://{big}/metrics"], OtlpMapping()).round(T0_MS)
    assert len(round_.errors) == 1 and "larger than 4,096 bytes" in round_.errors[0]
