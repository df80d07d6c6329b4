"""`worker --tier 1`: the firehose without a store, one of N in a consumer group.

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
again after a crash: the store writer (streams/store_writer.py) drops copies of partials
and dead letters by their identity. No SLOs, detectors or signal view run here: they run
on whole minutes, downstream.
"""

from __future__ import annotations

import logging
import time

import msgspec
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from ingest import deadletter
from streams.partials import encode_frontier, encode_partials
from streams.partition_windows import PartitionWindows, Resume
from streams.worker import Worker
from ingest.kafka import ensure_topics, read_latest, send
from conventions import TOPIC_DEADLETTER, TOPIC_SLI

log = logging.getLogger("tailwatch.tier1")

_decode_resume = msgspec.json.Decoder(Resume).decode
_encode = msgspec.json.Encoder().encode


class _NoStore:
    """Tier 1 keeps no store; the loop's calls to let go of one do nothing."""

    def release_if_due(self) -> None:
        pass

    def close(self) -> None:
        pass


class PublishRefused(RuntimeError):
    """Kafka refused partials, frontiers or dead letters for good: the worker stops before
    its resume records move past them (a restart publishes them again)."""


def progress_topic(topic: str) -> str:
    return f"{topic}.progress"


def _resume_or_none(raw: bytes | None) -> Resume | None:
    """A resume record, or None for none or one that does not decode (the partition is then
    re-read from its start: slower, never wrong, since the store writer drops copies)."""
    if not raw:
        return None
    try:
        return _decode_resume(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("ignoring a resume record that does not decode: %s", exc)
        return None


class Tier1Worker(Worker):
    writes_store = False
    MARKER_EVERY_S = 10.0  # frontier markers repeat this often even when unchanged (a new tw.sli reader needs them)

    def __init__(self, settings, metrics=None):
        super().__init__(settings, metrics)
        self.live = None
        self.stages = []
        self.slo = None
        lateness_ms = int(settings.allowed_lateness_s * 1000)
        for p in self.pipelines.values():
            p.windows = PartitionWindows(p.windows.spec, lateness_ms, int(settings.idle_timeout_s * 1000))
            p.alignment = None  # each partition closes on its own watermark: a fast one holds nothing open
        self._markers: dict[tuple[str, int], bytes] = {}
        self._resumes: dict[tuple[str, int], Resume] = {}
        self._markers_sent_at = 0.0
        self._elsewhere_ms: dict[str, int | None] = {}  # topic → newest watermark of partitions other workers own
        self._elsewhere_read_at: dict[str, float] = {}
        self._idle: dict[str, set[int]] = {}
        self._refused: dict[tuple[str, str], int] = {}  # (topic, reason) → records Kafka refused
        self.partials_published = 0

    # ---- start and ownership ----------------------------------------------------------
    def _open_store(self) -> None:
        self.store = _NoStore()
        from confluent_kafka.admin import AdminClient

        topics = AdminClient(self.settings.kafka.base_config()).list_topics(timeout=10).topics
        for topic in self.pipelines:
            n = len(topics[topic].partitions) if topic in topics else self.settings.partitions
            ensure_topics(self.settings.kafka, n, others=(progress_topic(topic),))

    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        self._assigned_at = time.monotonic()
        if partitions:
            self._unassigned_since = None
        self._refresh_partitions(consumer)
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        resumes = {topic: read_latest(self.settings.kafka, progress_topic(topic), parts)
                   for topic, parts in by_topic.items()}
        for tp in partitions:
            p = self.pipelines[tp.topic]
            resume = _resume_or_none(resumes[tp.topic].get(tp.partition))
            start = p.windows.take(tp.partition, resume)
            tp.offset = start if start is not None else OFFSET_BEGINNING
            self.next_offsets[(tp.topic, tp.partition)] = start if start is not None else 0
            self._stored_offsets[(tp.topic, tp.partition)] = self.next_offsets[(tp.topic, tp.partition)]
            if resume is not None:
                self._resumes[(tp.topic, tp.partition)] = resume
            p.assigned.add(tp.partition)
            log.info("took %s[%d] from offset %s", tp.topic, tp.partition, tp.offset)
        consumer.assign(partitions)

    def _on_revoke(self, consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic in self.pipelines:
                self.pipelines[tp.topic].windows.drop(tp.partition)
                self.next_offsets.pop((tp.topic, tp.partition), None)
                self._markers.pop((tp.topic, tp.partition), None)
        super()._on_revoke(consumer, partitions)

    def _dead_letter(self, topic: str, msg, reason: str, detail: str) -> None:
        if self.pipelines[topic].windows.replaying(msg.partition(), msg.offset()):
            return  # its earlier owner sent this one
        super()._dead_letter(topic, msg, reason, detail)

    # ---- checkpoint: publish, never store ------------------------------------------------
    def _has_unsaved(self) -> bool:
        return bool(self.dead_letters) or any(p.windows.has_unsaved() for p in self.pipelines.values()) \
            or self.next_offsets != self._stored_offsets

    def checkpoint(self, consumer, close_all: bool) -> None:
        started = time.monotonic()
        sli = self.settings.kafka.topic(TOPIC_SLI)
        failed = self._publish_failed(sli)
        read_to_end: dict[str, set[int]] = {}
        for p in self.pipelines.values():
            w: PartitionWindows = p.windows
            read_to_end[p.topic] = self._read_to_end(consumer, p)
            if close_all:
                cuts = {part: None for part in w.parts}
            else:
                elsewhere = self._newest_elsewhere(p.topic, w) if read_to_end[p.topic] else None
                self._note_idle(p.topic, w.idle(read_to_end[p.topic], elsewhere))
                cuts = {part: cut for part, cut in w.closable_before(read_to_end[p.topic], elsewhere).items()
                        if cut is not None and (w.parts[part].closed_before_minute is None
                                                or cut > w.parts[part].closed_before_minute)}
            if not cuts:
                continue
            began = time.process_time()
            counts, hist = w.close(cuts)
            if counts is not None:
                records = encode_partials(w.spec, p.topic, counts, hist)
                for key, value in records:
                    send(self.producer, sli, value, key, on_error=failed)
                self.partials_published += len(records)
                self.buckets_closed += len(records)
                self.metrics.buckets_closed.labels(p.topic).inc(len(records))
            self._stage_cpu("close_buckets", began)
        letters, self.dead_letters = self.dead_letters, []
        dlq = self.settings.kafka.topic(TOPIC_DEADLETTER)
        for d in letters:
            send(self.producer, dlq, deadletter.encode(d), d.source_topic.encode(), on_error=self._publish_failed(dlq))
        self._flush_copies()
        self._send_markers(consumer, read_to_end, drained=close_all)
        self._flush_copies()
        if self._refused:
            raise PublishRefused(
                f"Kafka refused {sum(self._refused.values()):,} records tier 2 needs ("
                + ", ".join(f"{topic}: {reason}" for topic, reason in sorted(self._refused))
                + "); stopping before the resume points move past them")
        progress_sent = False
        for p in self.pipelines.values():
            for part in sorted(p.windows.parts):
                key = (p.topic, part)
                resume = p.windows.resume_point(p.topic, part, self.next_offsets.get(key, 0))
                if self._resumes.get(key) != resume:
                    send(self.producer, progress_topic(p.topic), _encode(resume), str(part).encode(),
                         partition=part, on_error=self._publish_failed(progress_topic(p.topic)))
                    self._resumes[key] = resume
                    progress_sent = True
            p.windows.forget_unsaved()
        if progress_sent:
            self._flush_copies()
        self._stored_offsets = dict(self.next_offsets)
        self.metrics.checkpoint_seconds.observe(time.monotonic() - started)
        self._update_gauges(consumer)

    def _publish_failed(self, topic: str):
        """For tier 1, tw.sli and the dead letters are not copies but what the store will
        hold: a refusal is counted as for any record, and remembered so that the checkpoint
        stops (see PublishRefused) instead of losing a minute's share. A refused resume
        record only makes the next owner re-read more: the worker's usual handling."""
        if topic in {progress_topic(t) for t in self.pipelines}:
            return super()._publish_failed(topic)

        def failed(reason: str) -> None:
            self.metrics.publish_failures.labels(topic, reason).inc()
            self._refused[(topic, reason)] = self._refused.get((topic, reason), 0) + 1
        return failed

    def _note_idle(self, topic: str, idle: set[int]) -> None:
        """Log partitions as they turn idle or come back (their minutes close on the topic's front meanwhile)."""
        was = self._idle.get(topic, set())
        if idle - was:
            log.info("%s partitions %s idle: minutes close on the topic's newest event", topic, sorted(idle - was))
        if was - idle:
            log.info("%s partitions %s active again", topic, sorted(was - idle))
        self._idle[topic] = idle

    def _newest_elsewhere(self, topic: str, windows: PartitionWindows) -> int | None:
        """The newest watermark of the topic's partitions other workers own, from their
        resume records; read at most every MARKER_EVERY_S, and only once some owned
        partition is read to its end (the only time idleness is judged)."""
        now = time.monotonic()
        if now - self._elsewhere_read_at.get(topic, -1e9) >= self.MARKER_EVERY_S:
            self._elsewhere_read_at[topic] = now
            others = sorted(self._topic_partitions.get(topic, set()) - set(windows.parts))
            try:
                latest = read_latest(self.settings.kafka, progress_topic(topic), others, timeout_s=5.0)
            except KafkaException as exc:  # the last answer stands until the broker answers again
                log.warning("reading %s for idleness: %s", progress_topic(topic), exc)
            else:
                marks = [r.watermark_ms for r in map(_resume_or_none, latest.values()) if r and r.watermark_ms is not None]
                self._elsewhere_ms[topic] = max(marks, default=None)
        return self._elsewhere_ms.get(topic)

    def _send_markers(self, consumer, read_to_end: dict[str, set[int]], drained: bool) -> None:
        """A frontier per owned partition into every tw.sli partition, when it changed (or,
        unchanged, every MARKER_EVERY_S, so a reader that starts late hears of every partition)."""
        sli = self.settings.kafka.topic(TOPIC_SLI)
        sli_parts = sorted(self._topic_partitions.get(sli, ()))
        if not sli_parts:
            return
        repeat = time.monotonic() - self._markers_sent_at >= self.MARKER_EVERY_S
        failed = self._publish_failed(sli)
        for p in self.pipelines.values():
            for part, w in sorted(p.windows.parts.items()):
                marker = encode_frontier(p.topic, part, w.closed_before_minute, p.windows.watermark(part),
                                         part in read_to_end[p.topic], drained)
                if not repeat and self._markers.get((p.topic, part)) == marker:
                    continue
                self._markers[(p.topic, part)] = marker
                for q in sli_parts:
                    send(self.producer, sli, marker, None, on_error=failed, partition=q)
        if repeat:
            self._markers_sent_at = time.monotonic()

    def _watched_topics(self) -> list[str]:
        return [*self.pipelines, self.settings.kafka.topic(TOPIC_SLI)]

    # ---- draining and readiness -------------------------------------------------------
    def _undrained(self, consumer) -> list[str]:
        """Drained: every partition this worker owns read to its end (the others are other workers')."""
        out = []
        for p in self.pipelines.values():
            behind = sorted(p.assigned - self._read_to_end(consumer, p))
            if behind:
                out.append(f"{p.topic} partitions {behind} are not read to their end")
        if not any(p.assigned for p in self.pipelines.values()):
            out.append("this worker owns no partition")
        return out

    def readiness(self) -> tuple[bool, str]:
        return False, "a tier-1 worker serves no signal API: ask a tier-2 worker"

    def _progress_line(self, elapsed_s: float) -> str:
        rate = self.events_seen / elapsed_s if elapsed_s > 0 else 0.0
        return f"tier 1: {self.events_seen:,} events ({rate:,.0f}/s), {self.partials_published:,} partials published"
