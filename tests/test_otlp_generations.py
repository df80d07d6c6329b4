"""Every generation of the OpenTelemetry GenAI conventions, with data the OpenTelemetry SDK
itself encodes: each span attribute and each latency or token histogram that tailwatch reads
(ingest/otlp/spans.py SPAN_ATTRIBUTE_SOURCES, ingest/otlp/histogram_requests.py NAMES) gives
the request field it should; a public trace sent only as metric histograms gives the SLIs its
requests give; hostile histograms are refused with their reason."""

from __future__ import annotations

import http.server
import json
import threading
import uuid
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Histogram as PromHistogram

from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, make_producer
from tailwatch.ingest.otlp import wire
from tailwatch.ingest.otlp.histogram_requests import (MAX_REQUESTS_PER_POINT, NAMES, NAMES_SOURCE, TOKEN_USAGE,
                                            HistogramRequests)
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.republish import OtlpRepublisher
from tailwatch.ingest.otlp.samples import histograms_from_exposition, histograms_from_otlp
from tailwatch.ingest.otlp.spans import SPAN_ATTRIBUTE_SOURCES, requests_from_traces
from tailwatch.ingest.schema import RequestV1
from tailwatch_dev.trace import TraceReplay, read_any_trace
from tailwatch.cli import main
from tests.test_otlp import _Exposition
from tests.test_pipeline import run_worker
from tailwatch_dev.traces import AZURE_CODE_TRACE

T0_MS = 1_793_577_600_000
LATENCY_BOUNDS_S = [0.1, 0.5, 1.0, 5.0]
TOKEN_BOUNDS = [1, 4, 16, 64, 256, 1024]
# The OpenTelemetry conventions' advised boundaries (seconds): time to first token, and request duration.
TTFT_BOUNDS_S = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
DURATION_BOUNDS_S = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
FIELD = {"e2e": "e2e_ms", "first_output": "first_output_ms", "inter_token": "inter_token_ms", "queue": "queue_ms",
         "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens"}
SLICE = {"gen_ai.request.model": "llama-3.1-8b", "gen_ai.operation.name": "chat", "tenant.id": "acme",
         "cloud.availability_zone": "eu-west-4a", "gen_ai.provider.name": "vllm"}


class SdkMetrics:
    """A MeterProvider whose collections are stamped with event time (the SDK stamps the wall
    clock; a Collector replaying a day would carry the day's times)."""

    def __init__(self, delta: bool = True, resource: dict | None = None):
        temporality = AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE
        self.reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality})
        self.provider = MeterProvider(resource=Resource.create(resource or {}), metric_readers=[self.reader])
        self.meter = self.provider.get_meter("serving")
        self._instruments: dict[str, object] = {}
        self.started_ms = T0_MS

    def record(self, name: str, value: float, bounds: list[float], **attributes) -> None:
        if name not in self._instruments:
            self._instruments[name] = self.meter.create_histogram(name, explicit_bucket_boundaries_advisory=bounds)
        self._instruments[name].record(value, attributes)

    def collect(self, start_ms: int, end_ms: int) -> MetricsData:
        data = MetricsData.FromString(encode_metrics(self.reader.get_metrics_data()).SerializeToString())
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for p in metric.histogram.data_points:
                        cumulative = metric.histogram.aggregation_temporality == 2
                        p.start_time_unix_nano = (self.started_ms if cumulative else start_ms) * 1_000_000
                        p.time_unix_nano = end_ms * 1_000_000
        return data


def both_encodings(data: MetricsData):
    for encoding in wire.ENCODINGS:
        yield encoding, wire.decode(wire.encode(data, encoding), MetricsData)


def map_histograms(data, mapper: HistogramRequests | None = None):
    return (mapper or HistogramRequests(OtlpMapping().requests)).map(histograms_from_otlp(data))


# ---- each histogram name ------------------------------------------------------------

SCRAPED = [n for n, h in NAMES.items() if "/metrics" in h.source]  # Prometheus names, read by a scrape
HISTOGRAM_NAMES = [*(n for n in NAMES if n not in SCRAPED), f"{TOKEN_USAGE}:input", f"{TOKEN_USAGE}:output"]


def values_for(name: str, role: str) -> tuple[list[float], list[float], bool]:
    """What to record (values, bucket bounds, whether they are per chunk) for a histogram."""
    if role in ("prompt_tokens", "output_tokens"):
        return [3, 100, 700], TOKEN_BOUNDS, False
    if NAMES[name].scale == 1.0:  # a histogram in milliseconds (Triton)
        return [50, 300, 7000], [b * 1000 for b in LATENCY_BOUNDS_S], False
    if not NAMES[name].per_request:
        return [0.05, 0.05, 0.3, 0.3, 0.3, 7.0], LATENCY_BOUNDS_S, True  # six gaps of three answers
    return [0.05, 0.3, 7.0], LATENCY_BOUNDS_S, False


def assert_field(events: list[RequestV1], role: str, per_chunk: bool, where: str) -> None:
    assert len(events) == 3, where
    got = [getattr(e, FIELD[role]) for e in events]
    assert all(e.model == "llama-3.1-8b" and e.zone == "eu-west-4a" and e.status == "ok"
               and T0_MS <= e.ts < T0_MS + 60_000 for e in events), where
    if role in ("prompt_tokens", "output_tokens"):
        # each inside its bucket, adding up to the histogram's sum
        assert sum(got) == 803 and sorted(got)[0] in range(2, 5) and sorted(got)[1] in range(65, 257), got
        assert sorted(got)[2] in range(257, 1025), got
    elif per_chunk:
        assert sorted(got) == [100.0, 500.0, 6300.0], got  # evenly spaced quantiles of the six gaps
    else:
        assert sorted(got) == [100.0, 500.0, 6750.0], (where, got)  # upper bounds; above: what the sum leaves


@pytest.mark.parametrize("name", HISTOGRAM_NAMES)
def test_each_genai_histogram_name_gives_its_field(name):
    token_type = name.split(":")[1] if ":" in name else None
    metric = name.split(":")[0]
    role = ("prompt_tokens" if token_type == "input" else "output_tokens") if token_type else NAMES[name].role
    sdk = SdkMetrics(resource={"cloud.availability_zone": "eu-west-4a"})
    extra = {"gen_ai.token.type": token_type} if token_type else {}
    values, bounds, per_chunk = values_for(metric, role)
    for v in values:
        sdk.record(metric, v, bounds, **SLICE, **extra)
    if role != "e2e":  # the requests themselves come from a duration histogram
        for v in (0.2, 0.2, 0.2):
            sdk.record("gen_ai.server.request.duration", v, LATENCY_BOUNDS_S, **SLICE)
    for encoding, data in both_encodings(sdk.collect(T0_MS, T0_MS + 60_000)):
        mapped = map_histograms(data)
        assert not mapped.refused and mapped.skipped == 0, encoding
        assert_field(mapped.events, role, per_chunk, encoding)
        assert all(e.tenant == "acme" and e.endpoint == "chat" for e in mapped.events)
    assert metric in NAMES_SOURCE


@pytest.mark.parametrize("name", SCRAPED)
def test_each_runtime_histogram_scraped_gives_its_field(name):
    """vLLM, TGI and Triton expose their histograms through prometheus_client, as here: two
    scrapes, and the buckets that moved between them are the requests of that interval."""
    role = NAMES[name].role
    registry = CollectorRegistry()
    labels = {"model_name": "llama-3.1-8b", "zone": "eu-west-4a"}
    values, bounds, per_chunk = values_for(name, role)
    histogram = PromHistogram(name, "under test", list(labels), buckets=bounds, registry=registry).labels(**labels)
    duration = None
    if role != "e2e":
        duration = PromHistogram("vllm:e2e_request_latency_seconds", "requests", list(labels),
                                 buckets=LATENCY_BOUNDS_S, registry=registry).labels(**labels)
    mapper = HistogramRequests(OtlpMapping().requests)

    def scrape(ts_ms: int):
        return mapper.map(histograms_from_exposition(generate_latest(registry).decode(), ts_ms))

    assert scrape(T0_MS).events == []  # the first scrape is the base
    for v in values:
        histogram.observe(v)
    if duration is not None:
        for v in (0.2, 0.2, 0.2):
            duration.observe(v)
    mapped = scrape(T0_MS + 60_000)
    assert not mapped.refused
    assert_field(mapped.events, role, per_chunk, name)
    assert scrape(T0_MS + 120_000).events == []  # nothing moved


@pytest.mark.parametrize("attribute", sorted(SPAN_ATTRIBUTE_SOURCES))
def test_each_span_attribute_gives_its_field(attribute):
    tokens = {"gen_ai.usage.input_tokens": "prompt_tokens", "gen_ai.usage.prompt_tokens": "prompt_tokens",
              "gen_ai.usage.output_tokens": "output_tokens", "gen_ai.usage.completion_tokens": "output_tokens",
              "gen_ai.usage.cache_read.input_tokens": "cached_prompt_tokens"}
    seconds = {"gen_ai.response.time_to_first_chunk": "first_output_ms", "gen_ai.server.time_to_first_token":
               "first_output_ms", "gen_ai.response.time_to_first_token": "first_output_ms",
               "gen_ai.latency.time_to_first_token": "first_output_ms", "gen_ai.latency.e2e": "e2e_ms",
               "gen_ai.latency.time_in_queue": "queue_ms", "gen_ai.server.time_per_output_token": "inter_token_ms"}
    value = 42 if attribute in tokens else 0.35
    attributes = {attribute: value, "gen_ai.request.model": "m"}
    if attribute == "gen_ai.latency.time_in_model_decode":
        attributes["gen_ai.usage.output_tokens"] = 8  # the mean gap over the tokens after the first
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"cloud.availability_zone": "z1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("t").start_span("chat m", start_time=T0_MS * 1_000_000, attributes=attributes)
    span.end(end_time=(T0_MS + 2_000) * 1_000_000)
    data = TracesData.FromString(encode_spans(exporter.get_finished_spans()).SerializeToString())
    for encoding in wire.ENCODINGS:
        [event] = requests_from_traces(wire.decode(wire.encode(data, encoding), TracesData), OtlpMapping().requests).events
        if attribute in tokens:
            assert getattr(event, tokens[attribute]) == 42
        elif attribute == "gen_ai.latency.time_in_model_decode":
            assert event.inter_token_ms == 50.0  # 0.35 s over 7 gaps
        else:
            assert getattr(event, seconds[attribute]) == 350.0, (encoding, event)
        assert event.zone == "z1" and event.model == "m"


# ---- one interval, several histograms -------------------------------------------------

def test_errors_split_by_error_type_and_first_output_goes_to_the_answers_that_succeeded():
    sdk = SdkMetrics(resource={"cloud.availability_zone": "eu-west-4b"})
    for v in (0.2, 0.3, 0.4):
        sdk.record("gen_ai.client.inference.duration", v, LATENCY_BOUNDS_S, **SLICE)
    sdk.record("gen_ai.client.inference.duration", 5.5, LATENCY_BOUNDS_S, **SLICE, **{"error.type": "timeout"})
    sdk.record("gen_ai.client.inference.duration", 0.05, LATENCY_BOUNDS_S, **SLICE, **{"error.type": "429"})
    sdk.record("gen_ai.client.inference.duration", 0.05, LATENCY_BOUNDS_S, **SLICE, **{"error.type": "500"})
    for v in (0.05, 0.05, 0.3):
        sdk.record("gen_ai.client.inference.time_to_first_chunk", v, LATENCY_BOUNDS_S, **SLICE)
    for encoding, data in both_encodings(sdk.collect(T0_MS, T0_MS + 30_000)):
        events = map_histograms(data).events
        assert Counter(e.status for e in events) == {"ok": 3, "timeout": 1, "shed": 1, "error": 1}, encoding
        assert sorted(e.first_output_ms for e in events if e.status == "ok") == [100.0, 100.0, 500.0]
        assert all(e.first_output_ms is None for e in events if e.status != "ok")
        assert all(e.zone == "eu-west-4a" for e in events)  # a point's own attribute before its resource's
        assert len({e.event_id for e in events}) == 6
    assert sdk.reader.get_metrics_data() is None  # nothing recorded since: a delta reader exports nothing
    # The same batch read twice gives the same event ids (the worker drops the second as duplicates).
    again = SdkMetrics()
    again.record("gen_ai.client.inference.duration", 0.2, LATENCY_BOUNDS_S, **SLICE)
    batch = again.collect(T0_MS, T0_MS + 60_000)
    assert [e.event_id for e in map_histograms(batch).events] == [e.event_id for e in map_histograms(batch).events]


def test_running_totals_count_each_interval_once_and_survive_a_reset():
    sdk = SdkMetrics(delta=False)
    mapper = HistogramRequests(OtlpMapping().requests)
    for v in (0.2, 0.3):
        sdk.record("gen_ai.server.request.duration", v, LATENCY_BOUNDS_S, **SLICE)
    assert map_histograms(sdk.collect(0, T0_MS + 60_000), mapper).events == []  # the first reading is the base
    for v in (0.2, 0.7, 2.0):
        sdk.record("gen_ai.server.request.duration", v, LATENCY_BOUNDS_S, **SLICE)
    second = map_histograms(sdk.collect(0, T0_MS + 120_000), mapper).events
    assert sorted(e.e2e_ms for e in second) == [500.0, 1000.0, 5000.0]
    assert all(T0_MS + 60_000 <= e.ts < T0_MS + 120_000 for e in second)
    assert map_histograms(sdk.collect(0, T0_MS + 120_000), mapper).events == []  # the same reading again
    restarted = SdkMetrics(delta=False)  # the runtime restarted: its totals start from zero
    restarted.record("gen_ai.server.request.duration", 0.05, LATENCY_BOUNDS_S, **SLICE)
    assert [e.e2e_ms for e in map_histograms(restarted.collect(0, T0_MS + 180_000), mapper).events] == [100.0]


def test_hostile_histograms_are_refused_with_their_reason_and_the_rest_maps():
    def point(name, counts, bounds, total=1.0):
        return {"name": name, "histogram": {"aggregationTemporality": 1, "dataPoints": [{
            "startTimeUnixNano": str(T0_MS * 1_000_000), "timeUnixNano": str((T0_MS + 60_000) * 1_000_000),
            "count": str(sum(counts)), "sum": total, "bucketCounts": [str(c) for c in counts],
            "explicitBounds": bounds, "attributes": [{"key": "gen_ai.request.model", "value": {"stringValue": "m"}}]}]}}

    doc = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        point("gen_ai.server.request.duration", [10**12, 0], [1.0]),  # a trillion requests in a minute
        point("gen_ai.server.request.duration", [1, 2, 3], [1.0]),  # counts for bounds it does not have
        point("gen_ai.server.request.duration", [1, 1, 0], [1.0, 0.5]),  # bounds going down
        point("gen_ai.server.time_to_first_token", [1, 1, 0], [0.1, float("nan")]),
        point("gen_ai.server.request.duration", [0, 0], [1.0], total=float("inf")),
        point("gen_ai.client.inference.duration", [2, 1], [1.0], total=3.5),
        point("some.other.histogram", [1, 1], [1.0]),
    ]}]}]}
    raw = json.dumps(doc).replace("NaN", '"NaN"').replace("Infinity", '"Infinity"').encode()
    mapped = map_histograms(wire.decode(raw, MetricsData))
    assert [reason for reason, _ in mapped.refused] == ["otlp_histogram_invalid"] * 5, mapped.refused
    assert f"at most {MAX_REQUESTS_PER_POINT:,}" in mapped.refused[0][1]
    assert sorted(e.e2e_ms for e in mapped.events) == [1000.0, 1000.0, 1500.0] and mapped.skipped == 1


# ---- a public trace as metrics only ---------------------------------------------------

def trace_requests(n: int = 3000) -> list[RequestV1]:
    return list(TraceReplay(rows=read_any_trace(AZURE_CODE_TRACE)[:n], seed=3).events())


def histogram_batches(requests: list[RequestV1]) -> list[MetricsData]:
    """Per minute, what a server's SDK exports for these requests: request duration (with
    error.type on failures), time to first token, token usage; slices as attributes."""
    by_minute: dict[int, list[RequestV1]] = {}
    for r in requests:
        by_minute.setdefault(r.ts // 60_000, []).append(r)
    out = []
    for minute, rs in sorted(by_minute.items()):
        sdk = SdkMetrics()
        for r in rs:
            attrs = {"gen_ai.request.model": r.model, "tenant.id": r.tenant, "cloud.availability_zone": r.zone,
                     "cloud.region": r.region, "pool": r.pool, "model_version": r.model_version,
                     "gen_ai.operation.name": "chat", "traffic_class": r.traffic_class}
            failed = {"error.type": "500"} if r.status == "error" else {}
            sdk.record("gen_ai.server.request.duration", r.e2e_ms / 1000, DURATION_BOUNDS_S, **attrs, **failed)
            if r.first_output_ms is not None and r.status == "ok":
                sdk.record("gen_ai.server.time_to_first_token", r.first_output_ms / 1000, TTFT_BOUNDS_S, **attrs)
            for kind, n in (("input", r.prompt_tokens), ("output", r.output_tokens)):
                if n is not None and r.status == "ok":
                    sdk.record(TOKEN_USAGE, n, TOKEN_BOUNDS * 1 + [4096, 16384, 65536], **attrs,
                               **{"gen_ai.token.type": kind})
        out.append(sdk.collect(minute * 60_000, (minute + 1) * 60_000))
    return out


def slice_of(e: RequestV1) -> tuple:
    return (e.ts // 60_000, e.zone, e.tenant, e.model, e.model_version)


def test_a_public_trace_sent_only_as_histograms_gives_the_slis_its_requests_give():
    """The Azure code trace's requests, exported as the conventions' server metrics only:
    per minute and slice, the same requests, failures, first-token SLI at each bucket bound,
    and tokens as the requests themselves."""
    truth = [r for r in trace_requests() if r.e2e_ms is not None]
    mapper = HistogramRequests(OtlpMapping().requests)
    mapped = [e for data in histogram_batches(truth) for e in map_histograms(data, mapper).events]

    def per_slice(events, measure):
        out = Counter()
        for e in events:
            out[slice_of(e)] += measure(e)
        return out

    assert per_slice(mapped, lambda e: 1) == per_slice(truth, lambda e: 1)
    assert per_slice(mapped, lambda e: e.status != "ok") == per_slice(truth, lambda e: e.status != "ok")
    assert sum(e.status == "error" for e in mapped) > 0
    for threshold_s in (0.25, 0.5, 1.0, 2.5):  # thresholds at bucket bounds: exact
        good = lambda e: e.status == "ok" and e.first_output_ms is not None and e.first_output_ms <= threshold_s * 1000  # noqa: E731
        assert per_slice(mapped, good) == per_slice(truth, good), threshold_s
    for field in ("prompt_tokens", "output_tokens"):
        assert per_slice(mapped, lambda e: getattr(e, field) or 0) == per_slice(
            truth, lambda e: (getattr(e, field) or 0) if e.status == "ok" else 0), field
    # Between bucket bounds, the bucket holding the threshold counts as bad: never optimistic.
    between = lambda e: e.status == "ok" and e.first_output_ms is not None and e.first_output_ms <= 800  # noqa: E731
    assert sum(map(between, mapped)) <= sum(map(between, truth))


def test_histograms_through_the_broker_and_ingest_otlp_fill_sli_minute(broker, tmp_path):
    """The same export through the Collector's metrics topic (proto and JSON records), `ingest
    otlp` and a worker: every request in sli_minute per minute and zone, failures included."""
    truth = [r for r in trace_requests(1500) if r.e2e_ms is not None]
    settings = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"h{uuid.uuid4().hex[:8]}.")
    spans_topic, metrics_topic = f"{settings.topic_prefix}otlp_spans", f"{settings.topic_prefix}otlp_metrics"
    ensure_topics(settings, partitions=1, others=(spans_topic, metrics_topic))
    p = make_producer(settings)
    for i, data in enumerate(histogram_batches(truth)):
        p.produce(metrics_topic, wire.encode(data, wire.ENCODINGS[i % 2]))
    assert p.flush(30) == 0
    report = OtlpRepublisher(settings, OtlpMapping(), spans_topic, metrics_topic,
                             group_id=f"h-{uuid.uuid4().hex[:6]}").run(until_idle_s=3.0)
    assert report.requests_from_histograms == len(truth) and not report.dead_letters
    store = tmp_path / "h.duckdb"
    run_worker(settings, store)
    con = duckdb.connect(str(store), read_only=True)
    rows = con.execute("SELECT epoch_ms(window_start) // 60000, zone, sum(requests), sum(errors), sum(output_tokens) "
                       "FROM sli_minute GROUP BY ALL").fetchall()
    con.close()
    want: dict[tuple, list[int]] = {}
    for r in truth:
        counts = want.setdefault((r.ts // 60_000, r.zone), [0, 0, 0])
        counts[0] += 1
        counts[1] += r.status == "error"
        counts[2] += (r.output_tokens or 0) if r.status == "ok" else 0
    assert {(m, z): [n, f, t] for m, z, n, f, t in rows} == want


def test_every_name_read_is_in_the_docs_with_its_source():
    doc = (Path(__file__).parent.parent / "docs" / "ingest.md").read_text()
    for name, source in {**NAMES_SOURCE, **SPAN_ATTRIBUTE_SOURCES}.items():
        assert f"| `{name}` |" in doc and source in doc, name


def test_collect_prometheus_turns_a_scraped_vllm_page_into_requests(capsys):
    """Over real HTTP: two scrapes of a vLLM page (prometheus_client, as vLLM writes it); the
    requests between them come out as request.v1 beside the GPU samples."""
    registry = CollectorRegistry()
    labels = {"model_name": "meta-llama/Llama-3.1-8B-Instruct"}
    e2e = PromHistogram("vllm:e2e_request_latency_seconds", "e2e", list(labels), buckets=LATENCY_BOUNDS_S,
                        registry=registry).labels(**labels)
    ttft = PromHistogram("vllm:time_to_first_token_seconds", "ttft", list(labels), buckets=LATENCY_BOUNDS_S,
                         registry=registry).labels(**labels)
    before = generate_latest(registry).decode()
    for v in (0.3, 0.7, 3.0):
        e2e.observe(v)
        ttft.observe(v / 10)
    after = generate_latest(registry).decode()
    handler = type("H", (_Exposition,), {"texts": [before, after]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert main(["collect", "prometheus", "--print", "--count", "2", "--interval", "0.1",
                     "--url", f"http://127.0.0.1:{server.server_address[1]}/metrics"]) == 0
    finally:
        server.shutdown()
    requests = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["schema"] for r in requests] == ["request.v1"] * 3
    assert sorted(r["e2e_ms"] for r in requests) == [500.0, 1000.0, 5000.0]
    assert sorted(r["first_output_ms"] for r in requests) == [100.0, 100.0, 500.0]
    assert {r["model"] for r in requests} == {"meta-llama/Llama-3.1-8B-Instruct"}


def test_no_record_can_ask_for_more_requests_or_series_than_the_bounds(monkeypatch):
    from tailwatch.ingest.otlp import histogram_requests

    def doc(n_points: int, count: int, *, cumulative: bool = False, offset: int = 0):
        return {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "gen_ai.server.request.duration",
                "histogram": {"aggregationTemporality": 2 if cumulative else 1, "dataPoints": [{
                    "startTimeUnixNano": str(T0_MS * 1_000_000), "timeUnixNano": str((T0_MS + 60_000) * 1_000_000),
                    "count": str(count), "sum": 0.1 * count, "bucketCounts": [str(count), "0"], "explicitBounds": [1.0],
                    "attributes": [{"key": "series", "value": {"stringValue": f"s{offset + i}"}}]}
                    for i in range(n_points)]}}]}]}]}

    monkeypatch.setattr(histogram_requests, "MAX_REQUESTS_PER_BATCH", 1000)
    mapped = map_histograms(wire.decode(json.dumps(doc(12, 100)).encode(), MetricsData))
    assert len(mapped.events) == 1000 and [r for r, _ in mapped.refused] == ["otlp_histogram_invalid"] * 2
    monkeypatch.setattr(histogram_requests, "MAX_SERIES", 10)
    mapper = HistogramRequests(OtlpMapping().requests)
    for batch in range(5):  # fifty series of running totals: the mapper keeps at most ten
        map_histograms(wire.decode(json.dumps(doc(10, 1, cumulative=True, offset=10 * batch)).encode(), MetricsData),
                       mapper)
        assert len(mapper._previous) <= 10
