"""`tailwatch ingest otlp`: the Collector's Kafka topics in, `request.v1` / `gpu.v1` out.

A consumer group over the span and metric topics (`otlp_spans`, `otlp_metrics` by
default) that republishes each batch's requests (spans, and the requests that GenAI latency
histograms counted) to `tw.requests` keyed by tenant and its GPU samples to `tw.gpu` keyed
by node, as the worker expects. A record that is not an OTLP
batch, a request span that does not map, and a GPU sample the schema refuses each go to
the dead-letter topic with their reason; nothing stops. Partitions are kept within a
minute of event time of each other (`alignment`), and the records of one fetch are
produced oldest first, so the worker's watermark does not run ahead of a slow partition.

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
from confluent_kafka import KafkaError, TopicPartition
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from tailwatch.ingest import deadletter
from tailwatch.ingest.otlp.alignment import EventTimeAlignment
from tailwatch.ingest.otlp.gpu import GpuMapper
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.histogram_requests import HistogramRequests
from tailwatch.ingest.otlp.samples import histograms_from_otlp, samples_from_otlp
from tailwatch.ingest.otlp.spans import requests_from_traces
from tailwatch.ingest.otlp.wire import OtlpDecodeError, decode
from tailwatch.ingest.schema import partition_key
from tailwatch.ingest.kafka import KafkaSettings, make_consumer, make_producer, send
from tailwatch.conventions import TOPIC_DEADLETTER, TOPIC_GPU, TOPIC_REQUESTS

log = logging.getLogger("tailwatch.otlp")
IDLENESS_S = 10.0
DEFAULT_SPANS_TOPIC = "otlp_spans"
DEFAULT_METRICS_TOPIC = "otlp_metrics"
_encoder = msgspec.json.Encoder()


@dataclass
class RepublishReport:
    batches: int = 0
    spans: int = 0
    requests: int = 0
    requests_from_histograms: int = 0  # GenAI latency histograms turned back into their requests
    gpu_samples: int = 0
    skipped: int = 0  # spans and metric samples that are not requests or GPU readings
    dead_letters: Counter = field(default_factory=Counter)  # by reason
    cpu_seconds: float = 0.0

    def lines(self) -> list[str]:
        out = [f"{self.batches:,} OTLP batches: {self.requests:,} requests from {self.spans:,} spans, "
               f"{self.requests_from_histograms:,} from latency histograms, {self.gpu_samples:,} GPU samples, "
               f"{self.skipped:,} spans and samples not mapped (not requests or GPU readings)"]
        out += [f"dead-lettered {n:,}: {reason}" for reason, n in sorted(self.dead_letters.items())]
        return out


@dataclass
class MappedRecord:
    """What one Kafka record maps to, before it is produced."""

    topic: str
    partition: int
    outputs: dict[str, list] = field(default_factory=dict)  # topic to produce to → its events

    def events(self) -> list:
        return [e for events in self.outputs.values() for e in events]

    # The mapping writes `ts` as epoch milliseconds.
    def oldest_ms(self) -> int:
        return min((e.ts for e in self.events()), default=2**62)

    def newest_ms(self) -> int | None:
        return max((e.ts for e in self.events()), default=None)


class OtlpRepublisher:
    def __init__(self, settings: KafkaSettings, mapping: OtlpMapping, spans_topic: str = DEFAULT_SPANS_TOPIC,
                 metrics_topic: str = DEFAULT_METRICS_TOPIC, group_id: str = "tailwatch-otlp",
                 max_drift_ms: int = 60_000):
        self.settings = settings
        self.mapping = mapping
        self.spans_topic, self.metrics_topic = spans_topic, metrics_topic
        self.consumer = make_consumer(settings, group_id)
        self.producer = make_producer(settings)
        self.gpu = GpuMapper(mapping.gpu)
        self.histograms = HistogramRequests(mapping.requests)
        self.alignment = EventTimeAlignment(max_drift_ms)
        self.report = RepublishReport()
        self._warned: set[str] = set()

    def run(self, until_idle_s: float | None = None, progress: Callable[[str], None] | None = None) -> RepublishReport:
        assigned_at: list[float] = []  # idle time counts from the first assignment, not from the group join

        def on_assign(consumer, partitions) -> None:
            # A pause outlives the assignment in librdkafka, and the alignment forgot the
            # partition at its revocation: taken unpaused (streams/source.py, the same).
            consumer.assign(partitions)
            consumer.resume(partitions)
            self.alignment.assign([(p.topic, p.partition) for p in partitions])
            if partitions and not assigned_at:
                assigned_at.append(time.monotonic())

        def on_revoke(consumer, partitions) -> None:
            self.alignment.revoke([(p.topic, p.partition) for p in partitions])

        self.consumer.subscribe([self.spans_topic, self.metrics_topic], on_assign=on_assign, on_revoke=on_revoke)
        last_message = 0.0
        try:
            while True:
                msgs = self.consumer.consume(num_messages=500, timeout=0.5)
                records = [m for m in msgs if m.error() is None]
                for m in msgs:
                    err = m.error()
                    if err is None:
                        self.alignment.reading((m.topic(), m.partition()))
                    elif err.code() == KafkaError._PARTITION_EOF:
                        self.alignment.at_end((m.topic(), m.partition()))
                    elif err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:  # e.g. a Collector that ships no metrics yet
                        if err.str() not in self._warned:
                            self._warned.add(err.str())
                            log.warning("%s; waiting for it", err.str())
                    else:
                        raise RuntimeError(f"consume: {err}")
                if records:
                    last_message = time.monotonic()
                    started = time.process_time()
                    mapped = [self.map_record(m.topic(), m.partition(), m.offset(), m.value(), max(m.timestamp()[1], 0))
                              for m in records]
                    # Oldest first across the partitions of this fetch: the worker sees time move forward.
                    for record in sorted(mapped, key=MappedRecord.oldest_ms):
                        self.publish(record)
                        self.alignment.advance((record.topic, record.partition), record.newest_ms())
                    self.report.cpu_seconds += time.process_time() - started
                    self._commit()
                    if progress:
                        progress(f"ingest otlp: {self.report.batches:,} batches, {self.report.requests:,} requests, "
                                 f"{self.report.gpu_samples:,} GPU samples")
                elif assigned_at and time.monotonic() - max(last_message, assigned_at[0]) > IDLENESS_S and \
                        self.alignment.paused:
                    # The partitions the others wait for gave neither records nor their end: idle, as
                    # Flink's withIdleness says, they stop holding the others back until they speak again.
                    idle = self.alignment.assigned - self.alignment.ended - self.alignment.paused
                    log.warning("%d partitions silent for %.0f s: not waiting for them", len(idle), IDLENESS_S)
                    for tp in idle:
                        self.alignment.at_end(tp)
                    last_message = time.monotonic()
                elif until_idle_s is not None and assigned_at and not self.alignment.paused and \
                        time.monotonic() - max(last_message, assigned_at[0]) > until_idle_s:
                    return self.report
                self._align()
        finally:
            self.consumer.close()

    def _align(self) -> None:
        pause, resume = self.alignment.decide()
        if pause:
            self.consumer.pause([TopicPartition(t, p) for t, p in pause])
        if resume:
            self.consumer.resume([TopicPartition(t, p) for t, p in resume])

    def map_record(self, topic: str, partition: int, offset: int, raw: bytes | None, kafka_ts_ms: int) -> MappedRecord:
        """One Kafka record → the requests or GPU samples it maps to; every part that does
        not map is dead-lettered here."""
        self.report.batches += 1
        raw = raw or b""
        spans = topic == self.spans_topic
        try:
            data = decode(raw, TracesData if spans else MetricsData)
            return self._map(data, spans, topic, partition, offset, raw, kafka_ts_ms)
        except OtlpDecodeError as exc:
            self._dead_letter(topic, partition, offset, "otlp_undecodable", str(exc), raw, kafka_ts_ms)
        except Exception as exc:  # noqa: BLE001: nothing in a record may stop the adapter
            self._dead_letter(topic, partition, offset, "otlp_undecodable",
                              f"mapping the batch failed ({type(exc).__name__})", raw, kafka_ts_ms)
        return MappedRecord(topic, partition)

    def _map(self, data, spans: bool, topic: str, partition: int, offset: int, raw: bytes,
             kafka_ts_ms: int) -> MappedRecord:
        out = MappedRecord(topic, partition)
        if spans:
            mapped = requests_from_traces(data, self.mapping.requests)
            self.report.spans += len(mapped.events) + len(mapped.refused) + mapped.skipped
            self.report.skipped += mapped.skipped
            for reason, detail, span_bytes in mapped.refused:
                self._dead_letter(topic, partition, offset, reason, detail, span_bytes, kafka_ts_ms)
            out.outputs[self.settings.topic(TOPIC_REQUESTS)] = mapped.events
            self.report.requests += len(mapped.events)
        else:
            samples = samples_from_otlp(data)
            gpu = self.gpu.map(samples)
            requests = self.histograms.map(histograms_from_otlp(data), samples)
            self.report.skipped += gpu.skipped + requests.skipped
            # One dead letter per reason and record (each carries the record's bytes), counting them all.
            by_reason: dict[str, list[str]] = {}
            for reason, detail in (*gpu.refused, *requests.refused):
                by_reason.setdefault(reason, []).append(detail)
            for reason, details in by_reason.items():
                more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
                self._dead_letter(topic, partition, offset, reason, details[0] + more, raw, kafka_ts_ms)
                self.report.dead_letters[reason] += len(details) - 1
            out.outputs[self.settings.topic(TOPIC_GPU)] = gpu.samples
            out.outputs[self.settings.topic(TOPIC_REQUESTS)] = requests.events
            self.report.gpu_samples += len(gpu.samples)
            self.report.requests_from_histograms += len(requests.events)
        return out

    def publish(self, record: MappedRecord) -> None:
        for out_topic, events in record.outputs.items():
            for e in events:
                send(self.producer, out_topic, _encoder.encode(e), partition_key(e))
        self.producer.poll(0)
    def _dead_letter(self, topic: str, partition: int, offset: int, reason: str, detail: str, raw: bytes,
                     kafka_ts_ms: int) -> None:
        letter = deadletter.make(topic, partition, offset, reason, detail, raw, kafka_ts_ms)
        send(self.producer, self.settings.topic(TOPIC_DEADLETTER), deadletter.encode(letter), topic.encode())
        self.report.dead_letters[reason] += 1

    def _commit(self) -> None:
        left = self.producer.flush(30)
        if left:  # not delivered: do not commit, so a restart maps these batches again
            raise RuntimeError(f"{left} records were not delivered to Kafka within 30 s; offsets not committed")
        self.consumer.commit(asynchronous=False)
