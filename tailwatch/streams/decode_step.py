"""The decode operator: raw records of an input topic → typed events in its minute windows,
or dead letters.

One per worker that reads the producers' topics (tier `all` and tier 1). Each record is
decoded and validated on its own, straight into columns where the fast decoder can show it
is plainly good (ingest/columnar.py), by the reference decoder otherwise (ingest/validate.py),
its event time bounded by its
Kafka record's timestamp (streams/frames.py), and the frame goes into the topic's windows,
which are the tier's: minute windows over the whole topic, or one set per partition.
Whatever a record holds, it becomes its events or one dead letter with a reason. Where the
worker caps cardinality (streams/cardinality.py), the decoded frame passes the topic's limiter
here, before its windows: a value past a cap is counted under `__other__`, not refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import polars as pl

from tailwatch.ingest import deadletter
from tailwatch.ingest.columnar import ColumnDecoder
from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.ingest.schema import EvalV1, GpuV1, RequestV1
from tailwatch.ingest.validate import LATE, REASONS, TOO_LATE, BatchDecoder
from tailwatch.streams.aggregates import GPU, REQUESTS
from tailwatch.streams.cardinality import CardinalityLimiter, CardinalityLimits
from tailwatch.streams.minute_windows import AggregateSpec
from tailwatch.streams.record_batch import RecordBatch
from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS, column_decoder, decode_frame
from tailwatch.streams.metrics import WorkerMetrics
from tailwatch.conventions import CLOSED_LABELS, TOPIC_GPU, TOPIC_REQUESTS


@dataclass
class InputTopic:
    """One producers' topic: how its records decode and the windows they land in."""

    topic: str
    table: str  # the store table its closed minutes go to
    decoder: BatchDecoder  # the reference: decodes what the fast decoder declines, names every fault
    columns: dict[str, pl.DataType]
    windows: object  # streams.minute_windows.MinuteWindows or streams.partition_windows.PartitionWindows
    limiter: CardinalityLimiter | None = None  # None: the topic's labels are not capped
    fast: ColumnDecoder | None = None  # raw records straight into columns (ingest/columnar.py)

    def __post_init__(self) -> None:
        if self.fast is None:
            self.fast = column_decoder(self.decoder.event_type, self.columns, self.decoder.max_record_bytes)


# The producers' topics: (topic suffix, event types, columns taken, aggregate, store table).
# Evaluations share the requests' topic and slices: they are counted into the same rows.
PRODUCER_TOPICS = (
    (TOPIC_REQUESTS, (RequestV1, EvalV1), REQUEST_COLUMNS, REQUESTS, "sli_minute"),
    (TOPIC_GPU, (GpuV1,), GPU_COLUMNS, GPU, "gpu_minute"),
)


def input_topics(kafka: KafkaSettings, max_record_bytes: int,
                 windows: Callable[[AggregateSpec], object],
                 limits: CardinalityLimits | None = None) -> dict[str, InputTopic]:
    """`tw.requests` and `tw.gpu`, each with windows from `windows(spec)`, and with `limits`
    a cardinality limiter over its slice key's open-ended labels."""
    out = {}
    for suffix, (event_type, *also), columns, spec, table in PRODUCER_TOPICS:
        topic = kafka.topic(suffix)
        limiter = None if limits is None else CardinalityLimiter(capped_labels(spec, columns), spec.keys, limits)
        out[topic] = InputTopic(topic, table, BatchDecoder(event_type, max_record_bytes, also), columns, windows(spec),
                                limiter)
    return out


def capped_labels(spec: AggregateSpec, columns: dict[str, pl.DataType]) -> tuple[str, ...]:
    """The slice labels a producer can fill with anything: strings outside the closed sets."""
    return tuple(k for k in spec.keys if k not in CLOSED_LABELS and columns.get(k) == pl.String)


class DecodeStep:
    def __init__(self, metrics: WorkerMetrics, max_ahead_ms: int,
                 replaying: Callable[[InputTopic, int, int], bool] = lambda p, part, offset: False):
        self.metrics = metrics
        self.max_ahead_ms = max_ahead_ms
        self.replaying = replaying  # a record whose dead letter an earlier owner already sent
        self.dead_letters: list[deadletter.DeadLetter] = []
        self._counted: set[str] = set()  # topics whose counters were created at 0

    def process(self, p: InputTopic, batch: RecordBatch) -> None:
        # Read as columns, as every source hands its batches (streams/record_batch.py).
        values, partitions, offsets, record_ts = batch.values, batch.partitions, batch.offsets, batch.timestamps_ms
        decoded = decode_frame(p.fast, p.decoder, p.columns, values, partitions, offsets, record_ts,  # type: ignore[arg-type]
                               self.max_ahead_ms)
        frame, rejected = decoded.frame, decoded.rejected
        m = self.metrics
        if p.limiter is not None:
            frame, overflowed = p.limiter.admit(frame)
            for label, n in overflowed.events_by_label.items():
                m.label_values_overflowed.labels(p.topic, label).inc(n)
            if overflowed.slice_events:
                m.slices_overflowed.labels(p.topic).inc(overflowed.slice_events)
            limiter_gauges(m, p)  # with its counters: a scrape never shows overflow past an empty set
        outcome = p.windows.add(frame)
        for r in rejected:
            self.dead_letter(p, batch[r.index], r.reason, r.detail)
        reason, detail = ((TOO_LATE, "older than the correction horizon") if outcome.past_horizon
                          else (LATE, "older than the allowed lateness"))
        for i in outcome.late_index:
            self.dead_letter(p, batch[i], reason, detail)
        m.events.labels(p.topic, "accepted").inc(outcome.accepted)
        m.events.labels(p.topic, "rejected").inc(len(rejected))
        m.events.labels(p.topic, reason).inc(len(outcome.late_index))
        if outcome.to_correct:
            m.events.labels(p.topic, "correcting").inc(outcome.to_correct)
        m.events.labels(p.topic, "duplicate").inc(outcome.duplicates)
        m.late_events.labels(p.topic).inc(len(outcome.late_index))
        if p.topic not in self._counted:  # known label sets exist at 0 before their first count
            self._counted.add(p.topic)
            m.corrected_events.labels(p.topic)
            m.unknown_fields_dropped.labels(p.topic)
            for known in REASONS:
                m.dead_letters.labels(p.topic, known)
            if p.limiter is not None:
                m.slices_overflowed.labels(p.topic)
                for label in p.limiter.capped:
                    m.label_values_overflowed.labels(p.topic, label)
        if decoded.unknown_fields_dropped:
            m.unknown_fields_dropped.labels(p.topic).inc(decoded.unknown_fields_dropped)

    def dead_letter(self, p: InputTopic, msg, reason: str, detail: str) -> None:
        if self.replaying(p, msg.partition(), msg.offset()):
            return
        _kind, ts_ms = msg.timestamp()
        self.dead_letters.append(deadletter.make(p.topic, msg.partition(), msg.offset(), reason, detail, msg.value(), ts_ms))
        self.metrics.dead_letters.labels(p.topic, reason).inc()

    def take(self) -> list[deadletter.DeadLetter]:
        letters, self.dead_letters = self.dead_letters, []
        return letters


def window_gauges(metrics: WorkerMetrics, inputs) -> None:
    """Each input topic's lowest watermark, open minutes and event ids held for dedupe."""
    for p in inputs:
        w = p.windows
        if w.watermark_ms:
            metrics.watermark.labels(p.topic).set(min(w.watermark_ms.values()) / 1000)
        metrics.open_minutes.labels(p.topic).set(len(w.open_minutes()))
        metrics.dedupe_ids.labels(p.topic).set(w.dedupe_ids)
        limiter_gauges(metrics, p)


def limiter_gauges(metrics: WorkerMetrics, p: InputTopic) -> None:
    """The values and slices each capped label of `p` holds."""
    if p.limiter is not None:
        for label, n in p.limiter.sizes().items():
            metrics.label_values.labels(p.topic, label).set(n)
