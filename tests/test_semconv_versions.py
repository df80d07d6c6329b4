"""Every OpenTelemetry GenAI name tailwatch reads has its claim of which convention defines
it, since and until which release (ingest/otlp/genai_versions.py, the docs' "Defined by"
columns), and no release is invented; and the cached input tokens those conventions define
are read from spans and from the counters."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tailwatch.ingest.otlp import wire
from tailwatch.ingest.otlp.genai_versions import GENAI_NAMES
from tailwatch.ingest.otlp.histogram_requests import NAMES_SOURCE, HistogramRequests
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.samples import histograms_from_otlp, samples_from_otlp
from tailwatch.ingest.otlp.spans import SPAN_ATTRIBUTE_SOURCES, requests_from_traces

ROOT = Path(__file__).parent.parent
T0_MS = 1_793_577_600_000


def test_every_convention_name_read_has_a_checked_claim_and_no_release_is_invented():
    sources = {**NAMES_SOURCE, **SPAN_ATTRIBUTE_SOURCES}
    for name, source in sources.items():
        if "semantic-conventions" in source:
            assert name in GENAI_NAMES and GENAI_NAMES[name].text in source, name
    for path in (ROOT / "docs" / "ingest.md", ROOT / "ingest" / "otlp" / "spans.py",
                 ROOT / "ingest" / "otlp" / "histogram_requests.py"):
        text = path.read_text()
        assert "v0.1.0" not in text and "the last release" not in text, path  # genai has no release; v1.44 exists


# ---- cached input tokens ------------------------------------------------------------

def test_a_span_with_cached_input_tokens_gives_its_request_cached_prompt_tokens():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"cloud.availability_zone": "z1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 1200,
                  "gen_ai.usage.output_tokens": 80, "gen_ai.usage.cache_read.input_tokens": 1024,
                  "gen_ai.usage.cache_creation.input_tokens": 150}
    span = provider.get_tracer("t").start_span("chat m", start_time=T0_MS * 1_000_000, attributes=attributes)
    span.end(end_time=(T0_MS + 900) * 1_000_000)
    data = TracesData.FromString(encode_spans(exporter.get_finished_spans()).SerializeToString())
    for encoding in wire.ENCODINGS:
        [event] = requests_from_traces(wire.decode(wire.encode(data, encoding), TracesData),
                                       OtlpMapping().requests).events
        assert (event.prompt_tokens, event.cached_prompt_tokens, event.output_tokens) == (1200, 1024, 80), encoding


def test_the_cache_read_counter_is_shared_over_its_interval_requests():
    """A counter of cache-read tokens (per modality) knows no request: its increase is shared
    over the interval's requests of the same labels, in proportion to their input tokens, so
    the interval's cached total is exact."""
    reader = InMemoryMetricReader(preferred_temporality={Histogram: AggregationTemporality.DELTA,
                                                         Counter: AggregationTemporality.DELTA})
    meter = MeterProvider(resource=Resource.create({"cloud.availability_zone": "z1"}),
                          metric_readers=[reader]).get_meter("client")
    labels = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.provider.name": "openai"}
    duration = meter.create_histogram("gen_ai.client.operation.duration", explicit_bucket_boundaries_advisory=[1.0, 5.0])
    tokens = meter.create_histogram("gen_ai.client.inference.operation.input_tokens",
                                    explicit_bucket_boundaries_advisory=[100, 1000, 10000])
    cached = meter.create_counter("gen_ai.client.inference.usage.cache_read.input_tokens")
    for prompt in (300, 600, 2400):
        duration.record(0.8, labels)
        tokens.record(prompt, labels)
    cached.add(900, {**labels, "gen_ai.token.modality": "text"})
    cached.add(100, {**labels, "gen_ai.token.modality": "image"})
    data = MetricsData.FromString(encode_metrics(reader.get_metrics_data()).SerializeToString())
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points = metric.histogram.data_points if metric.HasField("histogram") else metric.sum.data_points
                for p in points:
                    p.start_time_unix_nano, p.time_unix_nano = T0_MS * 1_000_000, (T0_MS + 60_000) * 1_000_000
    for encoding in wire.ENCODINGS:
        decoded = wire.decode(wire.encode(data, encoding), MetricsData)
        mapped = HistogramRequests(OtlpMapping().requests).map(histograms_from_otlp(decoded), samples_from_otlp(decoded))
        assert not mapped.refused and len(mapped.events) == 3, encoding
        assert sum(e.prompt_tokens for e in mapped.events) == 3300
        assert sum(e.cached_prompt_tokens for e in mapped.events) == 1000  # both modalities, exact
        by_prompt = sorted((e.prompt_tokens, e.cached_prompt_tokens) for e in mapped.events)
        assert all(abs(c - 1000 * p / 3300) < 1 for p, c in by_prompt), by_prompt
