"""Tier 2's operator: whole minutes assembled from what tier-1 workers publish, for a store
sink and every stage that needs whole minutes (SLOs, detectors, fleet metrics, the signal API).

It consumes `tw.sli` (partials and frontier markers, streams/partials.py) and
`tw.deadletter`, assembles each minute once every source partition has closed it, and
lands the rows, the dead letters and its own offsets in one DuckDB transaction, with the
SLO and stage rows of the same minutes: exactly once from `tw.sli` into the store, as the
single-process worker is from the raw topics. The offset it stores per `tw.sli`
partition is that of the oldest record still held (a minute not yet whole), so a restart
re-reads what it held and nothing it landed counts twice: partials of landed minutes are
dropped as copies, dead letters are deduplicated by their source offset.

The frontiers it restores were read further than that: up to its read position at the
checkpoint, stored beside the offsets. A frontier says its source partition's partials
before it came earlier in its tw.sli partition, which holds after a restart only once that
partition is re-read up to the stored read position. Until every tw.sli partition is, it
lands nothing: otherwise the frontiers of a partition re-read first could make a minute
whole while the partials of another, not re-read yet, are missing, and those would then be
dropped as copies of a minute landed without them.

High availability is by identical replicas, as Prometheus pairs do it: each tier-2
process keeps a store of its own (on any machine), reads all of `tw.sli`, serves the
whole signal API and sends every alert to every Alertmanager, whose cluster deduplicates
them. Replicas share nothing, so there is no election and no takeover: a replica that dies
restarts from its own store while the others answer (docs/operating.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec
import polars as pl

from tailwatch.ingest import deadletter
from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.store.checkpoint import Checkpoint, Restored, RestoreScope, TopicCheckpoint
from tailwatch.streams.decode_step import PRODUCER_TOPICS
from tailwatch.streams.metrics import CpuAccount, WorkerMetrics
from tailwatch.streams.operator import Operator
from tailwatch.streams.partials import Frontier, MinuteAssembler
from tailwatch.streams.source import Source
from tailwatch.streams.topic_sink import TopicSink
from tailwatch.streams.minute_windows import AggregateSpec
from tailwatch.conventions import TOPIC_DEADLETTER, TOPIC_SLI

log = logging.getLogger("tailwatch.tier2")
_decode_letter = msgspec.json.Decoder(deadletter.DeadLetter).decode


@dataclass
class AssemblySettings:
    """Tier 2's share of the worker's settings (streams/tiers.py derives it)."""

    kafka: KafkaSettings


class MinuteAssembly(Operator):
    """Tier 2's operator (see the module's docstring). Without a consumer group nothing is
    revoked; it holds no open windows (no gauges, and the signal view stands on landed
    minutes only)."""

    by_group = False  # every replica reads every partition

    def __init__(self, settings: AssemblySettings, metrics: WorkerMetrics, cpu: CpuAccount, sink: TopicSink):
        k = settings.kafka
        self.kafka = k
        self.sli_topic, self.dlq_topic = k.topic(TOPIC_SLI), k.topic(TOPIC_DEADLETTER)
        self.topics = [self.sli_topic, self.dlq_topic]
        self.whole_topic = self.sli_topic
        # The producers' topics are not read here, but their partitions are what a minute waits for.
        self.sources: dict[str, tuple[str, AggregateSpec, dict]] = {
            k.topic(suffix): (table, spec, columns) for suffix, _event_type, columns, spec, table in PRODUCER_TOPICS}
        self.watched = list(self.sources)
        self.metrics, self.cpu, self.sink = metrics, cpu, sink
        self.assemblers: dict[str, MinuteAssembler] = {}
        self.landing: list[deadletter.DeadLetter] = []  # dead letters read from tw.deadletter
        self.dead_letters: list[deadletter.DeadLetter] = []  # its own: malformed tw.sli records
        self.malformed = 0
        self.stored_offsets: dict[tuple[str, int], int] = {}
        self._read_offsets: dict[tuple[str, int], int] = {}  # next offsets at the last checkpoint
        self._saved_frontiers: dict[tuple[str, int, int], Frontier] = {}  # as the store holds them
        # After a restore: tw.sli partition → the offset its re-read must reach before the frontiers
        # restored stand for the partials before them (None: unknown, a store of an earlier release).
        self._rereading: dict[int, int | None] = {}
        self.buckets_closed = 0
        self.minutes_closed = 0
        self.closing_behind = False

    # ---- start and restore -------------------------------------------------------------
    def start(self, source: Source) -> None:
        """An assembler per source topic, waiting for the partitions the cluster says it has."""
        from confluent_kafka.admin import AdminClient

        meta = AdminClient(self.kafka.base_config()).list_topics(timeout=10).topics
        self.follow({topic: set(meta[topic].partitions) for topic in [*self.sources, self.sli_topic]})

    def follow(self, partitions: dict[str, set[int]]) -> None:
        """An assembler per source topic, waiting for these partitions (topic → partitions;
        a cluster's metadata, or topics in memory)."""
        for topic, (_table, spec, columns) in self.sources.items():
            self.assemblers[topic] = MinuteAssembler(spec, columns, topic, partitions[topic], partitions[self.sli_topic])

    def restore_scope(self) -> RestoreScope:
        return RestoreScope(assembly=tuple(self.sources))

    def restore(self, state: Restored) -> None:
        self.stored_offsets = dict(state.offsets)
        self._read_offsets = dict(self.stored_offsets)
        self._rereading = {q: read if (read := state.read_offsets.get((t, q))) is not None and read >= offset else None
                           for (t, q), offset in state.offsets.items() if t == self.sli_topic}
        for topic, a in self.assemblers.items():
            r = state.assembly[topic]
            a.restore(r.done_before, [Frontier(topic, int(p), cb, wm, bool(rte), bool(dr))
                                      for _q, p, cb, wm, rte, dr in r.frontiers],
                      [int(q) for q, *_ in r.frontiers])
            self._saved_frontiers.update({(topic, q, p): f for (q, p), f in a.frontiers.items()})

    def start_offsets(self, source: Source, partitions: dict[str, list[int]]) -> dict[tuple[str, int], int | None]:
        return {(t, q): self.stored_offsets.get((t, q)) for t, qs in partitions.items() for q in qs}

    def tick(self, source: Source, now: float) -> None:
        """Topics may gain partitions: a minute waits for the new ones too."""
        for topic, a in self.assemblers.items():
            a.source_partitions |= source.partitions.get(topic, set())
            a.sli_partitions |= source.partitions.get(self.sli_topic, set())

    # ---- the hot path: a few hundred records a minute -----------------------------------
    def mark_gap(self, letter: deadletter.DeadLetter) -> None:
        self.dead_letters.append(letter)

    def process(self, topic: str, batch: list) -> None:
        if topic == self.dlq_topic:
            for m in batch:
                try:
                    self.landing.append(_decode_letter(m.value()))
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    self.malformed += 1
                    log.warning("not a dead letter at %s[%d]@%d: %s", topic, m.partition(), m.offset(), exc)
            return
        for m in batch:
            value, q, offset = m.value(), m.partition(), m.offset()
            try:
                for a in self.assemblers.values():
                    a.add(q, value, offset)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.malformed += 1
                _kind, ts_ms = m.timestamp()
                self.dead_letters.append(deadletter.make(topic, q, offset, "malformed", str(exc), value, ts_ms))
                self.metrics.dead_letters.labels(topic, "malformed").inc()

    # ---- checkpoint ----------------------------------------------------------------------
    def has_unsaved(self, source: Source) -> bool:
        return bool(self.landing) or bool(self.dead_letters) or source.next_offsets != self._read_offsets

    def checkpoint(self, source: Source, close_all: bool) -> Checkpoint | None:
        # While a restart re-reads, an idle interval still looks again whether it is done (the
        # log end a store of an earlier release waits for may be learnt after the last record).
        if not self.has_unsaved(source) and not close_all and not self._rereading:
            return None
        topics = []
        sli_read_to_end = source.read_to_end(self.sli_topic)
        sli_unread = bool(source.partitions.get(self.sli_topic, set()) - sli_read_to_end)
        if self._rereading:
            self._rereading = rereading_left(self._rereading, source.next_offsets, source.positions(self.sli_topic),
                                             self.sli_topic, sli_read_to_end)
        for topic, a in self.assemblers.items():
            began = self.cpu.began()
            rows, minutes = (pl.DataFrame(), []) if self._rereading else a.take_complete()
            self.cpu.spent("assemble", began)
            table = self.sources[topic][0]
            if rows.height:
                self.metrics.buckets_closed.labels(topic).inc(rows.height)
                self.buckets_closed += rows.height
                if table == "sli_minute":
                    self.minutes_closed += len(minutes)
            # Behind: this replica has tw.sli left to read, or a tier-1 worker its partitions.
            read_to_end = {p for (_q, p), f in a.frontiers.items() if f.read_to_end or f.drained}
            backlogged = sli_unread or bool(a.source_partitions - read_to_end)
            topics.append(TopicCheckpoint(
                topic=topic, table=table, closed=rows, closed_minutes=minutes, counts=[], hist=[], seen=[],
                watermarks={}, closed_before_minute=a.done_before, backlogged=not close_all and backlogged))
        letters, self.landing = self.landing, []
        own, self.dead_letters = self.dead_letters, []
        for d in own:  # malformed tw.sli records: to the topic too, as every dead letter
            self.sink.send(self.dlq_topic, deadletter.encode(d), d.source_topic.encode())
        if own:
            self.sink.flush()
        # The offset stored per tw.sli partition is that of the oldest record still held.
        offsets = dict(source.next_offsets)
        for a in self.assemblers.values():
            for q, offset in a.resume_offsets().items():
                key = (self.sli_topic, q)
                offsets[key] = min(offsets.get(key, offset), offset)
        # The frontiers kept were read up to here, or, while a restart re-reads, up to the restored position.
        read_offsets = {(t, q): max(offset, self._rereading.get(q) or offset)
                        for (t, q), offset in source.next_offsets.items()
                        if t == self.sli_topic and not (q in self._rereading and self._rereading[q] is None)}
        cp = Checkpoint(
            topics=topics, next_offsets=offsets, read_offsets=read_offsets,
            dead_letters=deadletter.to_frame(letters + own) if letters or own else None, dedupe_dead_letters=True,
            assembly_frontiers=[(topic, q, f) for topic, a in self.assemblers.items() for (q, _p), f in a.frontiers.items()
                                if self._saved_frontiers.get((topic, q, f.source_partition)) != f],
        )
        self._saved_frontiers.update({(topic, q, f.source_partition): f for topic, q, f in cp.assembly_frontiers})
        self._read_offsets = dict(source.next_offsets)
        return cp

    def committed(self, cp: Checkpoint) -> None:
        self.stored_offsets = dict(cp.next_offsets)

    # ---- draining, the view, telemetry ----------------------------------------------------
    def undrained(self, source: Source) -> list[str]:
        out = [line for topic in self.topics for line in source.unread(topic)]
        for topic, a in self.assemblers.items():
            if a.held:
                out.append(f"{len(a.held)} minutes of {topic} wait for frontiers of tier-1 partitions")
            elif undrained := a.undrained():
                out.append(f"{topic} partitions {undrained} are not drained by their tier-1 worker")
        return out

    def progress_line(self, events: int, rate_per_s: float) -> str:
        held = sum(len(a.held) for a in self.assemblers.values())
        dropped = sum(a.redelivered for a in self.assemblers.values())
        rereading = f", re-reading tw.sli partitions {sorted(self._rereading)} before landing" if self._rereading else ""
        return (f"tier 2: {events:,} tw.sli records, {self.buckets_closed:,} buckets landed, {held} minutes "
                f"held, {dropped:,} partials of landed minutes dropped{rereading}")


def rereading_left(targets: dict[int, int | None], next_offsets: dict[tuple[str, int], int],
                   positions: dict[int, tuple[int, int]], sli_topic: str, read_to_end: set[int]) -> dict[int, int | None]:
    """The tw.sli partitions a restart still re-reads, of `targets` (partition → the read
    position to reach; None: unknown, taken as the log end once the source knows it, which
    is at or past it). A partition read to its end has nothing left to re-read, even where a
    log reset made it shorter than the position stored."""
    left: dict[int, int | None] = {}
    for q, target in targets.items():
        if q in read_to_end:
            continue
        if target is None and q in positions:
            target = positions[q][1]
        if target is None or next_offsets.get((sli_topic, q), 0) < target:
            left[q] = target
    return left
