"""`tailwatch bench --otlp`: spans per CPU-second through the OTLP adapter, on a public trace.

The requests of a public LLM trace (the Azure code trace by default) become GenAI spans in
Collector-sized batches, in both encodings. Measured in one process: decoding the batches
alone, decoding and mapping them to `request.v1`, and the whole adapter (mapping plus
encoding the JSON it republishes); the baseline, in the same process, is the worker's own
per-event decode of the same requests as `request.v1` JSON. Then the adapter runs for real
(`ingest otlp` against the embedded broker) on the protobuf batches.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import msgspec
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from tailwatch.ingest.otlp.encode import traces
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.republish import OtlpRepublisher
from tailwatch.ingest.otlp.spans import requests_from_traces
from tailwatch.ingest.otlp.wire import ENCODINGS, decode, encode
from tailwatch.ingest.schema import RequestV1
from tailwatch_dev.trace import TraceReplay, read_any_trace
from tailwatch.ingest.validate import BatchDecoder
from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, make_producer

SPANS_PER_BATCH = {"otlp_proto": 512, "otlp_json": 200}  # under the exporter's 1,000,000-byte record


def _cpu(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def run(trace: Path, spans: int, say=print) -> list[str]:
    rows = read_any_trace(trace)[:spans]
    requests = list(TraceReplay(rows=rows, seed=7).events())
    rules = OtlpMapping().requests
    enc = msgspec.json.Encoder()
    native = [enc.encode(r) for r in requests]
    decoder = BatchDecoder(RequestV1)
    base_s = min(_cpu(lambda: decoder.decode(native)) for _ in range(3))
    lines = [f"trace {trace.name}: {len(requests):,} requests as GenAI spans; the worker decodes the same requests as "
             f"request.v1 JSON at {len(requests) / base_s:,.0f} events/CPU-s (the baseline)"]
    proto_batches: list[bytes] = []
    for encoding in ENCODINGS:
        per = SPANS_PER_BATCH[encoding]
        batches = [encode(traces(requests[i:i + per]), encoding) for i in range(0, len(requests), per)]
        if encoding == "otlp_proto":
            proto_batches = batches
        say(f"{encoding}: {len(batches):,} batches, {sum(map(len, batches)) / len(requests):,.0f} bytes a span")

        def decoded():
            for b in batches:
                decode(b, TracesData)

        def mapped():
            for b in batches:
                requests_from_traces(decode(b, TracesData), rules)

        def adapter():
            for b in batches:
                for e in requests_from_traces(decode(b, TracesData), rules).events:
                    enc.encode(e)

        d, m, a = (min(_cpu(f) for _ in range(3)) for f in (decoded, mapped, adapter))
        n = len(requests)
        lines.append(f"{encoding}: decode {n / d:,.0f} spans/CPU-s; decode + map {n / m:,.0f}; the adapter's whole "
                     f"work {n / a:,.0f} ({base_s / a * 100:.0f}% of the worker's per-event decode rate)")
    say("through the embedded broker: ingest otlp on the protobuf batches")
    broker = EmbeddedBroker(port=free_port())
    broker.start()
    try:
        s = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"b{uuid.uuid4().hex[:6]}.")
        spans_topic = f"{s.topic_prefix}otlp_spans"
        ensure_topics(s, 4, others=(spans_topic, f"{s.topic_prefix}otlp_metrics"))
        p = make_producer(s)
        for b in proto_batches:
            p.produce(spans_topic, b)
        p.flush(60)
        report = OtlpRepublisher(s, OtlpMapping(), spans_topic, f"{s.topic_prefix}otlp_metrics",
                                 group_id=f"b-{uuid.uuid4().hex[:6]}").run(until_idle_s=3.0)
        lines.append(f"ingest otlp through the broker: {report.requests:,} requests republished, "
                     f"{report.cpu_seconds:.2f} CPU-s → {report.requests / report.cpu_seconds:,.0f} spans/CPU-s "
                     "(consume, decode, map, produce, commit)")
    finally:
        broker.stop()
    return lines
