"""A real vLLM `/metrics` page (tests/data/vllm: vLLM 0.32 with the prefix cache and
speculative decoding on), scraped twice over HTTP as `tailwatch collect prometheus` does:
the requests between the scrapes come out with their latencies, tokens, cached prompt tokens
and drafted and accepted tokens, each adding up to what the page's own counters moved by."""

from __future__ import annotations

import http.server
import json
import threading
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tailwatch.ingest.otlp.histogram_requests import HistogramRequests
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.samples import HistogramPoint, Sample
from tailwatch.cli import main
from tests.test_otlp import _Exposition

PAGES = Path(__file__).parent / "data" / "vllm"


def _value(text: str, sample: str) -> float:
    """The sum of a sample's values over its series on a page (one series per name here,
    but for `finished_reason`)."""
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == sample)


def _scrape(pages: list[str], capsys) -> list[dict]:
    handler = type("H", (_Exposition,), {"texts": list(pages)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics#zone=eu-west-4a,pool=llm-a"
        assert main(["collect", "prometheus", "--print", "--count", "2", "--interval", "0.1", "--url", url]) == 0
    finally:
        server.shutdown()
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_a_real_vllm_page_becomes_its_requests_with_their_cached_and_drafted_tokens(capsys):
    before, after = (PAGES / "metrics-1.txt").read_text(), (PAGES / "metrics-2.txt").read_text()
    records = _scrape([before, after], capsys)

    def moved(sample: str) -> int:
        return int(round(_value(after, sample) - _value(before, sample)))

    requests = [r for r in records if r["schema"] == "request.v1"]
    # vLLM's gauges name no GPU and nothing else on the target does: no phantom GPU row.
    assert [r for r in records if r["schema"] != "request.v1"] == []
    assert len(requests) == moved("vllm:e2e_request_latency_seconds_count") == moved("vllm:request_success_total") == 24
    assert {r["model"] for r in requests} == {"tiny-llama"} and {r["status"] for r in requests} == {"ok"}
    assert {(r["zone"], r["pool"]) for r in requests} == {("eu-west-4a", "llm-a")}
    # How each ended, from request_success_total{finished_reason}: this page's requests all hit their max tokens.
    assert [r["finish_reason"] for r in requests] == ["length"] * 24
    assert sum(r["prompt_tokens"] for r in requests) == moved("vllm:request_prompt_tokens_sum")
    assert sum(r["output_tokens"] for r in requests) == moved("vllm:request_generation_tokens_sum")
    # The page has the cached total and the local hits (equal here, no external cache): one is read.
    cached = moved("vllm:prompt_tokens_cached_total")
    assert cached == moved("vllm:prefix_cache_hits_total") > 0
    assert sum(r["cached_prompt_tokens"] for r in requests) == cached
    assert sum(r["draft_tokens"] for r in requests) == moved("vllm:spec_decode_num_draft_tokens_total") > 0
    assert sum(r["accepted_tokens"] for r in requests) == moved("vllm:spec_decode_num_accepted_tokens_total") > 0
    # Shares follow each request's own tokens: within one token of its prompt's share of the cached total.
    prompts = sum(r["prompt_tokens"] for r in requests)
    assert all(abs(r["cached_prompt_tokens"] - cached * r["prompt_tokens"] / prompts) < 1 for r in requests)
    # First-token times sit at the upper bounds of the buckets the page counted them in.
    bounds = sorted({float(s.labels["le"]) for f in text_string_to_metric_families(after)
                     for s in f.samples if s.name == "vllm:time_to_first_token_seconds_bucket" and s.labels["le"] != "+Inf"})
    assert all(r["first_output_ms"] / 1000 in bounds for r in requests)
    fast = sum(1 for r in requests if r["first_output_ms"] <= 100)
    assert fast == int(_bucket(after, 0.1) - _bucket(before, 0.1))


def _bucket(text: str, le: float) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:time_to_first_token_seconds_bucket" and float(s.labels["le"]) == le)


def test_tokens_counted_while_no_request_finished_go_to_the_next_requests():
    """vLLM counts cached and drafted tokens when it schedules a request, the histograms when
    it finishes: an increase in an interval with no finished request is not lost."""
    mapper = HistogramRequests(OtlpMapping().requests)
    labels = {"model_name": "m", "instance": "h:8000"}
    t0 = 1_795_000_000_000

    def scrape(ts_ms: int, finished: int, cached: float, drafted: float):
        point = HistogramPoint("vllm:e2e_request_latency_seconds", labels, (1.0,), (finished, 0), 0.5 * finished,
                               0, t0 + ts_ms, cumulative=True)
        counters = [Sample("vllm:prefix_cache_hits", labels, cached, t0 + ts_ms, cumulative=True),
                    Sample("vllm:spec_decode_num_draft_tokens", labels, drafted, t0 + ts_ms, cumulative=True)]
        return mapper.map([point], counters).events

    assert scrape(1_000, 5, 100, 40) == []  # the base
    assert scrape(16_000, 5, 400, 90) == []  # 300 cached and 50 drafted, nothing finished
    got = scrape(31_000, 7, 460, 100)  # two finished; 60 more cached, 10 more drafted
    assert len(got) == 2
    assert sum(r.cached_prompt_tokens for r in got) == 360 and sum(r.draft_tokens for r in got) == 60
    again = scrape(46_000, 8, 460, 100)  # the counters did not move: the next request had none cached
    assert len(again) == 1 and again[0].cached_prompt_tokens == 0 and again[0].accepted_tokens is None
    assert scrape(61_000, 9, 10, 5)[0].cached_prompt_tokens == 10  # a restart: the counter began again


def test_an_impossible_token_counter_is_refused_alone():
    """A counter that jumps by more than any request field holds (a buggy or hostile exporter)
    is refused with its reason; the interval's requests still come out, without it."""
    mapper = HistogramRequests(OtlpMapping().requests)
    labels, t0 = {"model_name": "m"}, 1_795_000_000_000
    for i, (finished, drafted) in enumerate(((1, 0.0), (3, 1.7e308))):
        point = HistogramPoint("vllm:e2e_request_latency_seconds", labels, (1.0,), (finished, 0), 0.5 * finished,
                               0, t0 + 15_000 * i, cumulative=True)
        mapped = mapper.map([point], [Sample("vllm:spec_decode_num_draft_tokens", labels, drafted, t0 + 15_000 * i,
                                             cumulative=True)])
    assert [reason for reason, _ in mapped.refused] == ["otlp_metric_invalid"]
    assert len(mapped.events) == 2 and all(r.draft_tokens is None for r in mapped.events)


def test_aborted_and_failed_requests_come_from_the_finished_reason_counter():
    """vLLM counts each finished request once under its finished_reason in the same loop that
    observes its latencies: the interval's requests take those endings, an abort as a client
    cancellation and an error as a failure cut by the server, the counts exact."""
    mapper = HistogramRequests(OtlpMapping().requests)
    labels, t0 = {"model_name": "m", "engine": "0"}, 1_795_000_000_000

    def scrape(ts_ms: int, ended: dict[str, float], started: int):
        finished = int(sum(ended.values()))
        points = [HistogramPoint("vllm:e2e_request_latency_seconds", labels, (1.0,), (finished, 0), 0.5 * finished,
                                 0, t0 + ts_ms, cumulative=True),
                  HistogramPoint("vllm:time_to_first_token_seconds", labels, (0.1,), (started, 0), 0.05 * started,
                                 0, t0 + ts_ms, cumulative=True)]
        counters = [Sample("vllm:request_success", {**labels, "finished_reason": reason}, n, t0 + ts_ms, cumulative=True)
                    for reason, n in ended.items()]
        return mapper.map(points, counters).events

    assert scrape(0, {"stop": 10, "length": 2, "abort": 1, "error": 0}, 11) == []  # the base
    got = scrape(15_000, {"stop": 16, "length": 3, "abort": 3, "error": 1}, 17)  # 6 stop, 1 length, 2 abort, 1 error
    assert len(got) == 10
    assert Counter(r.finish_reason for r in got) == {"stop": 6, "length": 1, "client_cancel": 2, "server_cut": 1}
    assert Counter(r.status for r in got) == {"ok": 7, "cancelled": 2, "error": 1}
    # An abort or an error goes to a request that never had a first token (6 of the 10 had one).
    failed = [r for r in got if r.status != "ok"]
    assert all(r.first_output_ms is None for r in failed) and all(r.e2e_ms is None for r in failed if r.status == "cancelled")
    assert all(r.finish_reason in ("stop", "length") for r in got if r.status == "ok")


def test_a_full_interval_of_endings_is_given_out_in_one_pass():
    """An interval may hold MAX_REQUESTS_PER_POINT requests: at that bound every ending is given
    out, each count exact."""
    from tailwatch.ingest.otlp.histogram_requests import MAX_REQUESTS_PER_POINT

    mapper = HistogramRequests(OtlpMapping().requests)
    labels, t0, n = {"model_name": "m"}, 1_795_000_000_000, MAX_REQUESTS_PER_POINT
    endings = {"stop": n // 2, "abort": n // 4, "error": n // 4}
    for i, scale in enumerate((0, 1)):
        point = HistogramPoint("vllm:e2e_request_latency_seconds", labels, (1.0,), (n * scale, 0), 0.5 * n * scale,
                               0, t0 + 15_000 * i, cumulative=True)
        counters = [Sample("vllm:request_success", {**labels, "finished_reason": r}, k * scale, t0 + 15_000 * i,
                           cumulative=True) for r, k in endings.items()]
        mapped = mapper.map([point], counters)
    assert len(mapped.events) == n and not mapped.refused
    assert Counter(r.status for r in mapped.events) == {"ok": n // 2, "cancelled": n // 4, "error": n // 4}
