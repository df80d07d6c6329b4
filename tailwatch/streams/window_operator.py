"""Tier `all`'s operator: the producers' topics → minute windows → closed minutes for the store.

Records are decoded (streams/decode_step.py) into 1-minute event-time windows per topic
(streams/minute_windows.py). A minute closes once every partition of the topic, owned or not,
has passed it by the allowed lateness or gone idle, so a partition somewhere else for a
while (a dead member not yet expired, a second worker) delays closing instead of making
its events late, and every closed minute is whole. Each checkpoint carries the closed
rows, the open minutes' state (as deltas), watermarks, frontiers, dead letters and the
next offset of every partition; the store is where a restarted worker resumes, so on
assignment each partition seeks to its stored offset.

Closed buckets and dead letters are copied to `tw.sli` and `tw.deadletter` before the
checkpoint commits (at least once; readers dedupe).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import polars as pl

from tailwatch.ingest import deadletter
from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.store.checkpoint import Checkpoint, Restored, RestoreScope, TopicCheckpoint
from tailwatch.streams.alignment import WatermarkAlignment
from tailwatch.streams.cardinality import CardinalityLimits
from tailwatch.streams.corrections import LateEvents
from tailwatch.streams.decode_step import DecodeStep, InputTopic, input_topics, window_gauges
from tailwatch.streams.metrics import CpuAccount, WorkerMetrics
from tailwatch.streams.operator import Operator
from tailwatch.streams.partials import sli_records
from tailwatch.streams.source import Source
from tailwatch.streams.topic_sink import TopicSink
from tailwatch.streams.minute_windows import MINUTE_MS, MinuteWindows, utc_text
from tailwatch.conventions import TOPIC_DEADLETTER, TOPIC_REQUESTS, TOPIC_SLI

log = logging.getLogger("tailwatch.worker")


@dataclass
class WindowSettings:
    """The window operator's share of the worker's settings (streams/tiers.py derives it)."""

    kafka: KafkaSettings
    allowed_lateness_s: float
    idle_timeout_s: float  # a partition read to its end this far behind the newest stops holding minutes open
    correction_horizon_s: float  # late events still correct their closed minute up to this far behind
    max_event_ahead_s: float  # event time past its Kafka record's timestamp: `future`
    max_record_bytes: int
    checkpoint_max_rows: int  # a checkpoint closes minutes of at most about this many rows
    max_watermark_drift_s: float | None = None  # pause a partition this far ahead (None: the allowed lateness; 0: never)
    cardinality: CardinalityLimits = field(default_factory=CardinalityLimits)
    publish_sli: bool = True  # copies of closed buckets to tw.sli


class MinuteWindowOperator(Operator):
    def __init__(self, settings: WindowSettings, metrics: WorkerMetrics, cpu: CpuAccount, sink: TopicSink):
        s = settings
        lateness_ms = int(s.allowed_lateness_s * 1000)
        drift_s = s.allowed_lateness_s if s.max_watermark_drift_s is None else s.max_watermark_drift_s
        horizon_ms = int(s.correction_horizon_s * 1000)
        self.inputs: dict[str, InputTopic] = input_topics(
            s.kafka, s.max_record_bytes,
            lambda spec: MinuteWindows(spec, lateness_ms, int(s.idle_timeout_s * 1000), correction_horizon_ms=horizon_ms),
            s.cardinality)
        # One alignment group over both topics' partitions (as Flink's groups span sources): a
        # backlog drained topic by topic would close one topic's minutes an hour ahead of the
        # other's, and the detectors would take the other as absent.
        self.alignment = WatermarkAlignment(int(drift_s * 1000)) if drift_s > 0 else None
        self.topics = list(self.inputs)
        self.whole_topic = s.kafka.topic(TOPIC_REQUESTS)
        self.sli_topic = s.kafka.topic(TOPIC_SLI) if s.publish_sli else None
        self.dlq_topic = s.kafka.topic(TOPIC_DEADLETTER)
        self.metrics, self.cpu, self.sink = metrics, cpu, sink
        self.max_ahead_ms = int(s.max_event_ahead_s * 1000)
        self.decode = DecodeStep(metrics, self.max_ahead_ms)
        self.stored_offsets: dict[tuple[str, int], int] = {}
        self.stored_frontiers: dict[str, int | None] = {}
        self.buckets_closed = 0
        self.minutes_closed = 0
        self.closing_behind = False
        self.checkpoint_max_rows = s.checkpoint_max_rows
        self.events_corrected = 0

    # ---- restore and ownership ----------------------------------------------------------
    def restore_scope(self) -> RestoreScope:
        return RestoreScope(topics=tuple(self.inputs), tables=tuple(p.table for p in self.inputs.values()))

    def restore(self, state: Restored) -> None:
        # Event time accepted is at most its record's time plus the bound; a record's time is
        # at most about now. State past that came from a record refused today (`future`),
        # accepted by an older release: repaired here, once, before anything is read.
        bound_ms = int(time.time() * 1000) + self.max_ahead_ms
        for p in self.inputs.values():
            r = state.topics[p.topic]
            p.windows.restore(r.counts, r.hist, r.seen, r.watermarks, r.closed_before_minute)
            if p.limiter is not None:
                p.limiter.restore(r.label_limits)
            for line in p.windows.repair_event_time(bound_ms, state.newest_minutes[p.table]):
                log.warning("%s: %s (event time past %s cannot come from an accepted event)", p.topic, line,
                            utc_text(bound_ms))
        self.stored_offsets = dict(state.offsets)

    def start_offsets(self, source: Source, partitions: dict[str, list[int]]) -> dict[tuple[str, int], int | None]:
        return {(t, q): self.stored_offsets.get((t, q)) for t, qs in partitions.items() for q in qs}

    def revoked(self, source: Source, topic: str, partition: int) -> None:
        """The windows keep the partition's open state: it is in the store with its offsets.
        The alignment forgets it: a partition comes back unpaused (`KafkaSource._on_assign`)."""
        if self.alignment is not None:
            self.alignment.forget((topic, partition))

    # ---- the hot path ---------------------------------------------------------------------
    def mark_gap(self, letter: deadletter.DeadLetter) -> None:
        self.decode.dead_letters.append(letter)

    def process(self, topic: str, batch: list) -> None:
        self.decode.process(self.inputs[topic], batch)

    def tick(self, source: Source, now: float) -> None:
        """Pause partitions read too far ahead of their topic's slowest, resume them as it
        catches up (streams/alignment.py): a backlog drains without holding tens of minutes open."""
        a = self.alignment
        if a is None:
            return
        watermarks, to_read = {}, {}
        for p in self.inputs.values():
            watermarks.update({(p.topic, part): wm for part, wm in p.windows.watermark_ms.items()})
            to_read.update({(p.topic, part): position for part, (position, end) in source.positions(p.topic).items()
                            if position < end})
        pause, resume = a.decide(watermarks, to_read, now)
        for p in self.inputs.values():
            source.pause(p.topic, {part for topic, part in pause if topic == p.topic})
            source.resume(p.topic, {part for topic, part in resume if topic == p.topic})
            self.metrics.partitions_paused.labels(p.topic).set(sum(1 for topic, _ in a.paused if topic == p.topic))

    # ---- checkpoint -------------------------------------------------------------------------
    def has_unsaved(self, source: Source) -> bool:
        return bool(self.decode.dead_letters) or any(
            p.windows.unsaved.counts or p.windows.unsaved.seen or p.windows.holds_late for p in self.inputs.values()
        ) or source.next_offsets != self.stored_offsets

    def _partitions_of(self, source: Source, p: InputTopic) -> set[int]:
        """Every partition whose minutes the buckets must wait for: the topic's partitions
        per metadata, plus any owned or with a watermark held."""
        return source.partitions.get(p.topic, set()) | source.assigned[p.topic] | set(p.windows.watermark_ms)

    def checkpoint(self, source: Source, close_all: bool) -> Checkpoint | None:
        topics = []
        self.closing_behind = False
        for p in self.inputs.values():
            w = p.windows
            waited_for, read_to_end = self._partitions_of(source, p), source.read_to_end(p.topic)
            if close_all:
                before = None
            elif p.topic not in source.partitions:
                before = None  # until the cluster has said which partitions exist, any may hold anything
            else:
                before = w.closable_before(waited_for, read_to_end)
            if close_all or (before is not None and (w.closed_before_minute is None or before > w.closed_before_minute)):
                began = self.cpu.began()
                rows, minutes = w.close(before, None if close_all else self.checkpoint_max_rows)
                self.cpu.spent("close_buckets", began)
                if before is not None and w.open_before(before):
                    self.closing_behind = True
                if rows.height:
                    self._publish_closed(p, rows)
                    self.metrics.buckets_closed.labels(p.topic).inc(rows.height)
                    self.buckets_closed += rows.height
                    if p.table == "sli_minute":
                        self.minutes_closed += len(minutes)
                    wall, delay = time.time(), self.metrics.bucket_close_delay.labels(p.topic)  # one lookup, not one a minute
                    for minute in minutes:
                        delay.observe(max(0.0, wall - (minute + 1) * 60))
            else:
                rows, minutes = pl.DataFrame(), []
            unsaved = w.take_unsaved()
            late = w.take_late()
            topics.append(TopicCheckpoint(
                topic=p.topic, table=p.table, closed=rows, closed_minutes=minutes,
                counts=unsaved.counts, hist=unsaved.hist, seen=unsaved.seen,
                watermarks=dict(w.watermark_ms), closed_before_minute=w.closed_before_minute,
                backlogged=not close_all and bool(waited_for - read_to_end),
                late=None if late is None else LateEvents(p.topic, p.table, w, late,
                                                          lambda merged, p=p: self._publish_corrected(p, merged)),
                keep_seen_minutes=-(-w.correction_horizon_ms // MINUTE_MS),
                # With the offsets the admitted values came from, so a restart admits the same.
                label_limits=p.limiter.to_bytes() if p.limiter is not None and p.limiter.changed else None,
            ))
        frontiers = {t.topic: t.closed_before_minute for t in topics}
        nothing_new = not self.decode.dead_letters and source.next_offsets == self.stored_offsets \
            and frontiers == self.stored_frontiers \
            and all(not t.closed.height and not t.counts and not t.seen and t.late is None and t.label_limits is None
                    for t in topics)
        if nothing_new and not close_all:
            return None  # idle: leave the store file to its readers
        letters = self.decode.take()
        for d in letters:
            self.sink.send(self.dlq_topic, deadletter.encode(d), d.source_topic.encode())
        self.sink.flush()
        return Checkpoint(topics=topics, next_offsets=dict(source.next_offsets),
                                dead_letters=deadletter.to_frame(letters) if letters else None)

    def committed(self, cp: Checkpoint) -> None:
        self.stored_offsets = dict(cp.next_offsets)
        self.stored_frontiers = {t.topic: t.closed_before_minute for t in cp.topics}
        for t in cp.topics:
            if t.corrected is not None:
                self.events_corrected += t.corrected.events
                self.metrics.corrected_events.labels(t.topic).inc(t.corrected.events)
                self.metrics.events.labels(t.topic, "duplicate").inc(t.corrected.duplicates)

    def _publish_corrected(self, p: InputTopic, rows: pl.DataFrame) -> None:
        """A corrected minute is published again, whole: of a (window_start, slice), the last row read wins."""
        self._publish_closed(p, rows)
        self.sink.flush()

    def _publish_closed(self, p: InputTopic, rows: pl.DataFrame) -> None:
        if self.sli_topic is None:
            return
        for key, line in sli_records(rows, p.windows.spec):
            self.sink.send(self.sli_topic, line, key)

    # ---- draining, the view, telemetry ----------------------------------------------------
    def undrained(self, source: Source) -> list[str]:
        """Drained means every partition of every input topic read to its end by this worker;
        closing all minutes on less would cut them short."""
        return [line for p in self.inputs.values() for line in source.unread(p.topic, set(p.windows.watermark_ms))]

    def open_minutes(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        windows = {p.table: p.windows for p in self.inputs.values()}
        return windows["sli_minute"].peek(), windows["gpu_minute"].peek()

    def update_gauges(self) -> None:
        window_gauges(self.metrics, self.inputs.values())

    def progress_line(self, events: int, rate_per_s: float) -> str:
        return f"worker: {events:,} records read ({rate_per_s:,.0f}/s), {self.buckets_closed:,} buckets closed"
