"""`tailwatch ingest otlp`: the Collector's Kafka topics in, `request.v1` / `gpu.v1` out.

A consumer group over the span and metric topics (`otlp_spans`, `otlp_metrics` by
default) that republishes each batch's requests to `tw.requests` keyed by tenant and its
GPU samples to `tw.gpu` keyed by node, as the worker expects. A record that is not an OTLP
batch, a request span that does not map, and a GPU sample the schema refuses each go to
the dead-letter topic with their reason; nothing stops.

Exactly once into the store: offsets are committed only after everything produced from
the records before them is delivered, so a crash republishes whole batches, never half of
one; the republished requests carry the same event ids (trace and span ids) and GPU
samples the same content, which the worker drops as duplicates.

Why a separate group and not the worker reading OTLP itself: mapping costs Python per
span and attribute, which would take CPU from the worker's vectorised path; as its own
group it scales beside the worker (README, "OpenTelemetry").
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import msgspec
from confluent_kafka import KafkaError
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from ingest import deadletter
from ingest.otlp.gpu import GpuMapper
from ingest.otlp.mapping import OtlpMapping
from ingest.otlp.samples import samples_from_otlp
from ingest.otlp.spans import requests_from_traces
from ingest.otlp.wire import OtlpDecodeError, decode
from ingest.schema import partition_key
from tailwatch.kafka import KafkaSettings, make_consumer, make_producer, send

log = logging.getLogger("tailwatch.otlp")
DEFAULT_SPANS_TOPIC = "otlp_spans"
DEFAULT_METRICS_TOPIC = "otlp_metrics"
_encoder = msgspec.json.Encoder()


@dataclass
class RepublishReport:
    batches: int = 0
    spans: int = 0
    requests: int = 0
    gpu_samples: int = 0
    skipped: int = 0  # spans and metric samples that are not requests or GPU readings
    dead_letters: Counter = field(default_factory=Counter)  # by reason
    cpu_seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [f"{self.batches:,} OTLP batches: {self.requests:,} requests from {self.spans:,} spans, "
               f"{self.gpu_samples:,} GPU samples, {self.skipped:,} spans and samples not mapped (not requests or GPU readings)"]
        out += [f"dead-lettered {n:,}: {reason}" for reason, n in sorted(self.dead_letters.items())]
        return out


class OtlpRepublisher:
    def __init__(self, settings: KafkaSettings, mapping: OtlpMapping, spans_topic: str = DEFAULT_SPANS_TOPIC,
                 metrics_topic: str = DEFAULT_METRICS_TOPIC, group_id: str = "tailwatch-otlp"):
        self.settings = settings
        self.mapping = mapping
        self.spans_topic, self.metrics_topic = spans_topic, metrics_topic
        self.consumer = make_consumer(settings, group_id)
        self.producer = make_producer(settings)
        self.gpu = GpuMapper(mapping.gpu)
        self.report = RepublishReport()
        self._warned: set[str] = set()

    def run(self, until_idle_s: float | None = None, progress: Callable[[str], None] | None = None) -> RepublishReport:
        self.consumer.subscribe([self.spans_topic, self.metrics_topic])
        last_message = time.monotonic()
        try:
            while True:
                msgs = self.consumer.consume(num_messages=500, timeout=0.5)
                records = [m for m in msgs if m.error() is None]
                for m in msgs:
                    err = m.error()
                    if err is None or err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:  # e.g. a Collector that ships no metrics yet
                        if err.str() not in self._warned:
                            self._warned.add(err.str())
                            log.warning("%s; waiting for it", err.str())
                        continue
                    raise RuntimeError(f"consume: {err}")
                if records:
                    last_message = time.monotonic()
                    started = time.process_time()
                    for m in records:
                        self.handle(m.topic(), m.partition(), m.offset(), m.value(), max(m.timestamp()[1], 0))
                    self.report.cpu_seconds += time.process_time() - started
                    self._commit()
                    if progress:
                        progress(f"ingest otlp: {self.report.batches:,} batches, {self.report.requests:,} requests, "
                                 f"{self.report.gpu_samples:,} GPU samples")
                elif until_idle_s is not None and time.monotonic() - last_message > until_idle_s:
                    return self.report
        finally:
            self.consumer.close()

    def handle(self, topic: str, partition: int, offset: int, raw: bytes | None, kafka_ts_ms: int) -> None:
        """One Kafka record: every request or GPU sample it maps to is produced, every part
        that does not map is dead-lettered."""
        self.report.batches += 1
        raw = raw or b""
        spans = topic == self.spans_topic
        try:
            data = decode(raw, TracesData if spans else MetricsData)
        except OtlpDecodeError as exc:
            self._dead_letter(topic, partition, offset, "otlp_undecodable", str(exc), raw, kafka_ts_ms)
            return
        if spans:
            mapped = requests_from_traces(data, self.mapping.requests)
            self.report.spans += len(mapped.events) + len(mapped.refused) + mapped.skipped
            self.report.skipped += mapped.skipped
            for reason, detail, span_bytes in mapped.refused:
                self._dead_letter(topic, partition, offset, reason, detail, span_bytes, kafka_ts_ms)
            out_topic, events = self.settings.topic("requests"), mapped.events
            self.report.requests += len(events)
        else:
            gpu = self.gpu.map(samples_from_otlp(data))
            self.report.skipped += gpu.skipped
            for reason, detail in gpu.refused:
                self._dead_letter(topic, partition, offset, reason, detail, raw, kafka_ts_ms)
            out_topic, events = self.settings.topic("gpu"), gpu.samples
            self.report.gpu_samples += len(events)
        for e in events:
            send(self.producer, out_topic, _encoder.encode(e), partition_key(e))
        self.producer.poll(0)

    def _dead_letter(self, topic: str, partition: int, offset: int, reason: str, detail: str, raw: bytes,
                     kafka_ts_ms: int) -> None:
        letter = deadletter.make(topic, partition, offset, reason, detail, raw, kafka_ts_ms)
        send(self.producer, self.settings.topic("deadletter"), deadletter.encode(letter), topic.encode())
        self.report.dead_letters[reason] += 1

    def _commit(self) -> None:
        left = self.producer.flush(30)
        if left:  # not delivered: do not commit, so a restart maps these batches again
            raise RuntimeError(f"{left} records were not delivered to Kafka within 30 s; offsets not committed")
        self.consumer.commit(asynchronous=False)
