"""TGI's and Triton's `/metrics` pages as their own source writes them (tests/data/tgi,
tests/data/triton: names, labels and bucket bounds from TGI's router and Triton core's metric
reporter), scraped twice over HTTP as `tailwatch collect prometheus` does. Between the scrapes
each served 100 requests, 5 of which failed: the requests come out with their failures, their
model, and only the latencies the runtime exports."""

from __future__ import annotations

import http.server
import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tailwatch.ingest.otlp.histogram_requests import HistogramRequests
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.samples import Sample
from tailwatch.cli import main
from tests.test_otlp import _Exposition

DATA = Path(__file__).parent / "data"


def _scrape(pages: list[str], capsys, mapping: Path | None = None) -> list[dict]:
    handler = type("H", (_Exposition,), {"texts": list(pages)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics#zone=eu-west-4a,pool=llm-a"
        extra = ["--mapping", str(mapping)] if mapping else []
        assert main(["collect", "prometheus", "--print", "--count", "2", "--interval", "0.1", "--url", url, *extra]) == 0
    finally:
        server.shutdown()
    return [r for line in capsys.readouterr().out.splitlines() if (r := json.loads(line))["schema"] == "request.v1"]


def _bounds(text: str, bucket: str) -> list[float]:
    return sorted({float(s.labels["le"]) for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == bucket and s.labels["le"] != "+Inf"})


def _moved(before: str, after: str, sample: str) -> float:
    def total(text: str) -> float:
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == sample)
    return total(after) - total(before)


def test_tgi_page_gives_every_request_its_failures_and_the_mapped_model(capsys, tmp_path):
    before, after = (DATA / "tgi" / "metrics-1.txt").read_text(), (DATA / "tgi" / "metrics-2.txt").read_text()
    # TGI's page names no model: a mapping file says which one the target serves.
    mapping = tmp_path / "tgi.yaml"
    mapping.write_text("requests:\n  model: {attributes: [model_name], default: llama-3.1-8b-instruct}\n")
    requests = _scrape([before, after], capsys, mapping)
    # The fixture is TGI's own shape: duration buckets 0.0001·1.5^k, k = 1..35, no labels.
    assert _bounds(after, "tgi_request_duration_bucket") == pytest.approx([0.0001 * 1.5 ** k for k in range(1, 36)])
    assert _moved(before, after, "tgi_request_success_total") == 95
    assert _moved(before, after, "tgi_request_failure_total") == 5
    assert len(requests) == 100
    assert Counter(r["status"] for r in requests) == {"ok": 95, "error": 5}
    # generation failures answer 424, an incomplete generation 500 (TGI's InferError → StatusCode)
    assert Counter(r.get("http_status") for r in requests if r["status"] == "error") == {424: 3, 500: 2}
    assert {r["model"] for r in requests} == {"llama-3.1-8b-instruct"}
    assert {(r["zone"], r["pool"]) for r in requests} == {("eu-west-4a", "llm-a")}
    ok = [r for r in requests if r["status"] == "ok"]
    bounds = _bounds(after, "tgi_request_duration_bucket")
    assert all(min(abs(r["e2e_ms"] - b * 1000) for b in bounds) < 1e-6 for r in ok)  # at a bucket's upper bound
    for le in bounds[::5]:  # as many requests at or under each bound as the page's bucket moved by
        moved = _bucket_moved(before, after, "tgi_request_duration", le)
        assert sum(1 for r in ok if r["e2e_ms"] <= le * 1000 + 1e-6) == moved
    # TGI measures no latency of a failed request and exports no time to first token: absent, not made up.
    assert all("e2e_ms" not in r and "queue_ms" not in r for r in requests if r["status"] == "error")
    assert all("first_output_ms" not in r for r in requests)
    assert sum(r["output_tokens"] for r in ok) == _moved(before, after, "tgi_request_generated_tokens_sum")
    assert all("queue_ms" in r and "inter_token_ms" in r for r in ok)


def _bucket_moved(before: str, after: str, histogram: str, le: float) -> float:
    def at(text: str) -> float:
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == f"{histogram}_bucket" and s.labels["le"] != "+Inf" and float(s.labels["le"]) == le)
    return at(after) - at(before)


@pytest.mark.parametrize("variant", ["", "-counters-only"])
def test_triton_page_gives_every_request_its_failures_and_its_model(variant, capsys):
    """With `--metrics-config histogram_latencies=true` Triton exports first-response times;
    by default (counters only) it exports no per-request latency at all."""
    before = (DATA / "triton" / f"metrics-1{variant}.txt").read_text()
    after = (DATA / "triton" / f"metrics-2{variant}.txt").read_text()
    requests = _scrape([before, after], capsys)
    assert _moved(before, after, "nv_inference_request_success_total") == 95
    assert _moved(before, after, "nv_inference_request_failure_total") == 5
    assert len(requests) == 100
    assert Counter(r["status"] for r in requests) == {"ok": 95, "error": 5}  # 3 BACKEND, 2 OTHER
    assert {(r["model"], r["model_version"]) for r in requests} == {("llama-3.1-8b-instruct", "1")}
    # Triton's latency counters are running sums over all requests: no request's own latency.
    assert all("e2e_ms" not in r and "queue_ms" not in r for r in requests)
    first = [r["first_output_ms"] for r in requests if "first_output_ms" in r]
    if variant:
        assert first == []  # the histogram family is not on the page: absent, never invented
    else:
        assert _bounds(after, "nv_inference_first_response_histogram_ms_bucket") == [100, 500, 2000, 5000]
        assert len(first) == 95 == _moved(before, after, "nv_inference_first_response_histogram_ms_count")
        for le in (100, 500, 2000):  # (above the last bound a value sits at 5000 or at the mean its sum leaves)
            moved = _bucket_moved(before, after, "nv_inference_first_response_histogram_ms", le)
            assert sum(1 for v in first if v <= le) == moved > 0
        assert all(r["status"] == "ok" for r in requests if "first_output_ms" in r)


def test_each_runtime_failure_becomes_its_status():
    """Every outcome label TGI and Triton write, as the request's status: an overload is shed,
    a client that left is cancelled, the rest are errors (an outcome unknown to this table too)."""
    mapper = HistogramRequests(OtlpMapping().requests)
    t0 = 1_795_000_000_000
    outcomes = [("tgi_request_failure", "err", "overloaded"), ("tgi_request_failure", "err", "dropped"),
                ("tgi_request_failure", "err", "validation"), ("tgi_request_failure", "err", "some_new_reason"),
                ("nv_inference_request_failure", "reason", "REJECTED"),
                ("nv_inference_request_failure", "reason", "CANCELED")]

    def scrape(ts_ms: int, n: int):
        counters = [Sample(name, {"instance": f"{name}:80", label: value}, float(n), ts_ms, cumulative=True)
                    for name, label, value in outcomes]
        counters += [Sample(name, {"instance": f"{name}:80"}, float(10 * n), ts_ms, cumulative=True)
                     for name in ("tgi_request_success", "nv_inference_request_success")]
        return mapper.map([], counters)

    assert scrape(t0, 1).events == []  # the base
    got = scrape(t0 + 15_000, 3)
    assert not got.refused
    by = Counter((r.status, r.http_status) for r in got.events)
    assert by == {("ok", None): 40, ("shed", 429): 2, ("cancelled", None): 4, ("error", 422): 2, ("error", None): 2,
                  ("shed", None): 2}
    assert all(t0 <= r.ts <= t0 + 15_000 and r.e2e_ms is None for r in got.events if r.status != "ok")
    assert scrape(t0 + 30_000, 3).events == []  # nothing moved


def test_request_counters_sent_as_deltas_are_the_requests_of_their_point():
    """A Collector that turns running totals into deltas (cumulativetodelta) sends each
    interval's requests as they are: no base reading is needed."""
    mapper = HistogramRequests(OtlpMapping().requests)
    labels, t0 = {"model": "m", "version": "2"}, 1_795_000_000_000
    counters = [Sample("nv_inference_request_success", labels, 7.0, t0, cumulative=False),
                Sample("nv_inference_request_failure", {**labels, "reason": "REJECTED"}, 2.0, t0, cumulative=False)]
    got = mapper.map([], counters).events
    assert Counter(r.status for r in got) == {"ok": 7, "shed": 2}
    assert {(r.model, r.model_version) for r in got} == {("m", "2")}
