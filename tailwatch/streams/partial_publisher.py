"""Tier 1's operator: the firehose without a store, one of N workers in a consumer group.

Each tier-1 worker windows the partitions of `tw.requests` and `tw.gpu` it owns, each
partition on its own watermark (streams/partition_windows.py), and at every checkpoint
publishes to `tw.sli`, in this order, each step flushed before the next:
1. the partials of the minutes it closed and the dead letters of what it refused;
2. a frontier marker per owned partition into every `tw.sli` partition (after the
   partials they cover, in each partition's order);
3. a `resume.v1` record per owned partition on `<topic>.progress` (same partition number),
   which is how a restarted worker, or whichever worker the partition moves to, resumes.

A partition read to its end is idle once its newest event is more than the idle timeout
behind the newest of the topic, its own partitions or, as their resume records say, other
workers' (Flink's `withIdleness`, judged in event time as the single worker does): a worker
whose partitions all went quiet still moves their frontiers on.

Nothing is committed until it is published (a record Kafka refuses for good stops the
worker: `PublishRefused`), and everything published may be published
again after a crash: tier 2 (streams/assembly.py) drops copies of partials
and dead letters by their identity. No SLOs, detectors or signal view run here: they run
on whole minutes, downstream.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import msgspec
from confluent_kafka import KafkaException

from tailwatch.ingest import deadletter
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, read_latest
from tailwatch.streams.decode_step import DecodeStep, InputTopic, input_topics, window_gauges
from tailwatch.streams.metrics import CpuAccount, WorkerMetrics
from tailwatch.streams.operator import Operator
from tailwatch.streams.partials import encode_frontier, encode_partials
from tailwatch.streams.partition_windows import PartitionWindows, Resume
from tailwatch.streams.source import Source
from tailwatch.streams.topic_sink import TopicSink
from tailwatch.conventions import TOPIC_DEADLETTER, TOPIC_REQUESTS, TOPIC_SLI

log = logging.getLogger("tailwatch.tier1")

_decode_resume = msgspec.json.Decoder(Resume).decode
_encode = msgspec.json.Encoder().encode


class PublishRefused(RuntimeError):
    """Kafka refused partials, frontiers or dead letters for good: the worker stops before
    its resume records move past them (a restart publishes them again)."""


def progress_topic(topic: str) -> str:
    return f"{topic}.progress"


def _resume_or_none(raw: bytes | None) -> Resume | None:
    """A resume record, or None for none or one that does not decode (the partition is then
    re-read from its start: slower, never wrong, since tier 2 drops copies)."""
    if not raw:
        return None
    try:
        return _decode_resume(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("ignoring a resume record that does not decode: %s", exc)
        return None


@dataclass
class PartialSettings:
    """Tier 1's share of the worker's settings (streams/tiers.py derives it)."""

    kafka: KafkaSettings
    allowed_lateness_s: float
    idle_timeout_s: float  # a partition read to its end this far behind the newest is idle
    max_event_ahead_s: float  # event time past its Kafka record's timestamp: `future`
    max_record_bytes: int
    partitions: int  # of each `<topic>.progress` made at start, where its topic does not exist yet


class PartialPublisher(Operator):
    """Tier 1's operator (see the module's docstring). It restores nothing from a store:
    where each partition resumes is read from Kafka as it is taken (`start_offsets`), and
    nothing runs on a timer (frontier markers repeat at checkpoints)."""

    MARKER_EVERY_S = 10.0  # frontier markers repeat this often even when unchanged (a new tw.sli reader needs them)

    def __init__(self, settings: PartialSettings, metrics: WorkerMetrics, cpu: CpuAccount, sink: TopicSink):
        s = settings
        self.kafka = s.kafka
        lateness_ms = int(s.allowed_lateness_s * 1000)
        # Each partition closes on its own watermark: a fast one holds nothing open, so no alignment.
        self.inputs: dict[str, InputTopic] = input_topics(
            s.kafka, s.max_record_bytes, lambda spec: PartitionWindows(spec, lateness_ms, int(s.idle_timeout_s * 1000)))
        self.topics = list(self.inputs)
        self.sli_topic = s.kafka.topic(TOPIC_SLI)
        self.dlq_topic = s.kafka.topic(TOPIC_DEADLETTER)
        self.watched = [self.sli_topic]
        self.whole_topic = s.kafka.topic(TOPIC_REQUESTS)
        self.partitions = s.partitions
        self.metrics, self.cpu, self.sink = metrics, cpu, sink
        sink.must_land |= {self.sli_topic, self.dlq_topic}
        # Its earlier owner sent the dead letter of a record re-read from a resume point.
        self.decode = DecodeStep(metrics, int(s.max_event_ahead_s * 1000),
                                 replaying=lambda p, part, offset: p.windows.replaying(part, offset))
        self._markers: dict[tuple[str, int], bytes] = {}
        self._resumes: dict[tuple[str, int], Resume] = {}
        self._markers_sent_at = 0.0
        self._elsewhere_ms: dict[str, int | None] = {}  # topic → newest watermark of partitions other workers own
        self._elsewhere_read_at: dict[str, float] = {}
        self._idle: dict[str, set[int]] = {}
        self._saved_offsets: dict[tuple[str, int], int] = {}
        self.partials_published = 0
        self.buckets_closed = 0
        self.minutes_closed = 0
        self.closing_behind = False

    # ---- start and ownership ----------------------------------------------------------
    def start(self, source: Source) -> None:
        """No store: where each partition resumes is on its `.progress` topic, made sure of here."""
        from confluent_kafka.admin import AdminClient

        topics = AdminClient(self.kafka.base_config()).list_topics(timeout=10).topics
        for topic in self.inputs:
            n = len(topics[topic].partitions) if topic in topics else self.partitions
            ensure_topics(self.kafka, n, others=(progress_topic(topic),))

    def start_offsets(self, source: Source, partitions: dict[str, list[int]]) -> dict[tuple[str, int], int | None]:
        out: dict[tuple[str, int], int | None] = {}
        for topic, parts in partitions.items():
            resumes = read_latest(self.kafka, progress_topic(topic), parts)
            for part in parts:
                key = (topic, part)
                resume = _resume_or_none(resumes.get(part))
                start = self.inputs[topic].windows.take(part, resume)
                out[key] = start
                source.next_offsets[key] = self._saved_offsets[key] = start if start is not None else 0
                if resume is not None:
                    self._resumes[key] = resume
                log.info("took %s[%d] from offset %s", topic, part, "the beginning" if start is None else start)
        return out

    def revoked(self, source: Source, topic: str, partition: int) -> None:
        self.inputs[topic].windows.drop(partition)
        source.next_offsets.pop((topic, partition), None)
        self._markers.pop((topic, partition), None)

    def mark_gap(self, letter: deadletter.DeadLetter) -> None:
        self.decode.dead_letters.append(letter)

    def process(self, topic: str, batch: list) -> None:
        self.decode.process(self.inputs[topic], batch)

    # ---- checkpoint: publish, never store ------------------------------------------------
    def has_unsaved(self, source: Source) -> bool:
        return bool(self.decode.dead_letters) or any(p.windows.has_unsaved() for p in self.inputs.values()) \
            or source.next_offsets != self._saved_offsets

    def checkpoint(self, source: Source, close_all: bool) -> None:
        read_to_end: dict[str, set[int]] = {}
        for p in self.inputs.values():
            w: PartitionWindows = p.windows
            read_to_end[p.topic] = source.read_to_end(p.topic)
            if close_all:
                cuts = {part: None for part in w.parts}
            else:
                elsewhere = self._newest_elsewhere(source, p.topic, w) if read_to_end[p.topic] else None
                self._note_idle(p.topic, w.idle(read_to_end[p.topic], elsewhere))
                cuts = {part: cut for part, cut in w.closable_before(read_to_end[p.topic], elsewhere).items()
                        if cut is not None and (w.parts[part].closed_before_minute is None
                                                or cut > w.parts[part].closed_before_minute)}
            if not cuts:
                continue
            began = self.cpu.began()
            counts, hist = w.close(cuts)
            if counts is not None:
                records = encode_partials(w.spec, p.topic, counts, hist)
                for key, value in records:
                    self.sink.send(self.sli_topic, value, key)
                self.partials_published += len(records)
                self.buckets_closed += len(records)
                self.metrics.buckets_closed.labels(p.topic).inc(len(records))
            self.cpu.spent("close_buckets", began)
        for d in self.decode.take():
            self.sink.send(self.dlq_topic, deadletter.encode(d), d.source_topic.encode())
        self.sink.flush()
        self._send_markers(source, read_to_end, drained=close_all)
        self.sink.flush()
        if self.sink.refused:
            raise PublishRefused(
                f"Kafka refused {sum(self.sink.refused.values()):,} records tier 2 needs ("
                + ", ".join(f"{topic}: {reason}" for topic, reason in sorted(self.sink.refused))
                + "); stopping before the resume points move past them")
        progress_sent = False
        for p in self.inputs.values():
            for part in sorted(p.windows.parts):
                key = (p.topic, part)
                resume = p.windows.resume_point(p.topic, part, source.next_offsets.get(key, 0))
                if self._resumes.get(key) != resume:
                    self.sink.send(progress_topic(p.topic), _encode(resume), str(part).encode(), partition=part)
                    self._resumes[key] = resume
                    progress_sent = True
            p.windows.forget_unsaved()
        if progress_sent:
            self.sink.flush()
        self._saved_offsets = dict(source.next_offsets)
        return None

    def _note_idle(self, topic: str, idle: set[int]) -> None:
        """Log partitions as they turn idle or come back (their minutes close on the topic's front meanwhile)."""
        was = self._idle.get(topic, set())
        if idle - was:
            log.info("%s partitions %s idle: minutes close on the topic's newest event", topic, sorted(idle - was))
        if was - idle:
            log.info("%s partitions %s active again", topic, sorted(was - idle))
        self._idle[topic] = idle

    def _newest_elsewhere(self, source: Source, topic: str, windows: PartitionWindows) -> int | None:
        """The newest watermark of the topic's partitions other workers own, from their
        resume records; read at most every MARKER_EVERY_S, and only once some owned
        partition is read to its end (the only time idleness is judged)."""
        now = time.monotonic()
        if now - self._elsewhere_read_at.get(topic, -1e9) >= self.MARKER_EVERY_S:
            self._elsewhere_read_at[topic] = now
            others = sorted(source.partitions.get(topic, set()) - set(windows.parts))
            try:
                latest = read_latest(self.kafka, progress_topic(topic), others, timeout_s=5.0)
            except KafkaException as exc:  # the last answer stands until the broker answers again
                log.warning("reading %s for idleness: %s", progress_topic(topic), exc)
            else:
                marks = [r.watermark_ms for r in map(_resume_or_none, latest.values()) if r and r.watermark_ms is not None]
                self._elsewhere_ms[topic] = max(marks, default=None)
        return self._elsewhere_ms.get(topic)

    def _send_markers(self, source: Source, read_to_end: dict[str, set[int]], drained: bool) -> None:
        """A frontier per owned partition into every tw.sli partition, when it changed (or,
        unchanged, every MARKER_EVERY_S, so a reader that starts late hears of every partition)."""
        sli_parts = sorted(source.partitions.get(self.sli_topic, ()))
        if not sli_parts:
            return
        repeat = time.monotonic() - self._markers_sent_at >= self.MARKER_EVERY_S
        for p in self.inputs.values():
            for part, w in sorted(p.windows.parts.items()):
                marker = encode_frontier(p.topic, part, w.closed_before_minute, p.windows.watermark(part),
                                         part in read_to_end[p.topic], drained)
                if not repeat and self._markers.get((p.topic, part)) == marker:
                    continue
                self._markers[(p.topic, part)] = marker
                for q in sli_parts:
                    self.sink.send(self.sli_topic, marker, None, partition=q)
        if repeat:
            self._markers_sent_at = time.monotonic()

    # ---- draining, the view, telemetry ----------------------------------------------------
    def undrained(self, source: Source) -> list[str]:
        """Drained: every partition this worker owns read to its end (the others are other workers')."""
        out = []
        for p in self.inputs.values():
            behind = sorted(source.assigned[p.topic] - source.read_to_end(p.topic))
            if behind:
                out.append(f"{p.topic} partitions {behind} are not read to their end")
        if not any(source.assigned.values()):
            out.append("this worker owns no partition")
        return out

    def update_gauges(self) -> None:
        window_gauges(self.metrics, self.inputs.values())

    def progress_line(self, events: int, rate_per_s: float) -> str:
        return f"tier 1: {events:,} records read ({rate_per_s:,.0f}/s), {self.partials_published:,} partials published"
