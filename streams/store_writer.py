"""`worker --tier 2`: a store writer over what tier-1 workers publish, and every stage that
needs whole minutes (SLOs, detectors, fleet metrics, the signal API).

It consumes `tw.sli` (partials and frontier markers, streams/partials.py) and
`tw.deadletter`, assembles each minute once every source partition has closed it, and
lands the rows, the dead letters and its own offsets in one DuckDB transaction, with the
SLO and stage rows of the same minutes: exactly once from `tw.sli` into the store, as the
single-process worker is from the raw topics. The offset it stores per `tw.sli`
partition is that of the oldest record still held (a minute not yet whole), so a restart
re-reads what it held and nothing it landed counts twice: partials of landed minutes are
dropped as copies, dead letters are deduplicated by their source offset.

High availability is by identical replicas, as Prometheus pairs do it: each tier-2
process keeps a store of its own (on any machine), reads all of `tw.sli`, serves the
whole signal API and sends every alert to every Alertmanager, whose cluster deduplicates
them. Replicas share nothing, so there is no election and no takeover: a replica that dies
restarts from its own store while the others answer (docs/operating.md).
"""

from __future__ import annotations

import logging
import time

import msgspec
import polars as pl
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from ingest import deadletter
import store
from streams.partials import Frontier, MinuteAssembler
from streams.worker import TopicPipeline, Worker
from ingest.kafka import send
from conventions import TOPIC_DEADLETTER, TOPIC_SLI

log = logging.getLogger("tailwatch.tier2")
_decode_letter = msgspec.json.Decoder(deadletter.DeadLetter).decode


class StoreWriter(Worker):
    def __init__(self, settings, metrics=None):
        super().__init__(settings, metrics)
        k = settings.kafka
        self.sli_topic, self.dlq_topic = k.topic(TOPIC_SLI), k.topic(TOPIC_DEADLETTER)
        self._inputs = {t: TopicPipeline(topic=t, table="", decoder=None, columns={}, windows=None)
                        for t in (self.sli_topic, self.dlq_topic)}
        self.assemblers: dict[str, MinuteAssembler] = {}
        self.landing: list[deadletter.DeadLetter] = []
        self.malformed = 0
        self._read_offsets: dict[tuple[str, int], int] = {}  # next offsets at the last checkpoint
        self._saved_frontiers: dict[tuple[str, int, int], Frontier] = {}  # as the store holds them

    @property
    def inputs(self) -> dict[str, TopicPipeline]:
        return self._inputs

    def _watched_topics(self) -> list[str]:
        return [self.sli_topic, self.dlq_topic, *self.pipelines]

    def _whole_topic(self) -> str:
        return self.sli_topic

    # ---- start ------------------------------------------------------------------------
    def _open_store(self) -> None:
        from confluent_kafka.admin import AdminClient

        meta = AdminClient(self.settings.kafka.base_config()).list_topics(timeout=10).topics
        for topic, p in self.pipelines.items():
            self.assemblers[topic] = MinuteAssembler(
                p.windows.spec, p.columns, topic, set(meta[topic].partitions), set(meta[self.sli_topic].partitions))
        super()._open_store()

    def _restore(self, con) -> None:
        self._stored_offsets = store.load_offsets(con)
        self.next_offsets = dict(self._stored_offsets)
        self._read_offsets = dict(self._stored_offsets)
        for topic, a in self.assemblers.items():
            done_before, marks = store.load_assembly(con, topic)
            a.restore(done_before, [Frontier(topic, int(p), cb, wm, bool(rte), bool(dr)) for _q, p, cb, wm, rte, dr in marks],
                      [int(q) for q, *_ in marks])
            self._saved_frontiers.update({(topic, q, p): f for (q, p), f in a.frontiers.items()})

    def _join(self, consumer) -> None:
        """No group: `_refresh_partitions` assigns every partition of the inputs directly.
        Every replica reads all of `tw.sli`; a group would split it between them, and hold a
        restart until the dead member's session expired."""

    def _refresh_partitions(self, consumer) -> None:
        super()._refresh_partitions(consumer)
        for topic, a in self.assemblers.items():  # topics may gain partitions
            a.source_partitions |= self._topic_partitions.get(topic, set())
            a.sli_partitions |= self._topic_partitions.get(self.sli_topic, set())
        new = [TopicPartition(t, q, self._stored_offsets.get((t, q), OFFSET_BEGINNING))
               for t, p in self.inputs.items() for q in sorted(self._topic_partitions.get(t, ())) if q not in p.assigned]
        if new:
            consumer.incremental_assign(new)
            for tp in new:
                self.inputs[tp.topic].assigned.add(tp.partition)
            self._assigned_at, self._unassigned_since = time.monotonic(), None

    # ---- the hot path: a few hundred records a minute -----------------------------------
    def _process_topic(self, p: TopicPipeline, batch: list) -> None:
        for m in batch:
            key = (p.topic, m.partition())
            if m.offset() + 1 > self.next_offsets.get(key, -1):
                self.next_offsets[key] = m.offset() + 1
        p.eof.difference_update(m.partition() for m in batch)
        if p.topic == self.dlq_topic:
            for m in batch:
                try:
                    self.landing.append(_decode_letter(m.value()))
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    self.malformed += 1
                    log.warning("not a dead letter at %s[%d]@%d: %s", p.topic, m.partition(), m.offset(), exc)
            return
        for m in batch:
            value, q, offset = m.value(), m.partition(), m.offset()
            try:
                for a in self.assemblers.values():
                    a.add(q, value, offset)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.malformed += 1
                self._dead_letter(p.topic, m, "malformed", str(exc))

    # ---- checkpoint ----------------------------------------------------------------------
    def _has_unsaved(self) -> bool:
        return bool(self.landing) or bool(self.dead_letters) or self.next_offsets != self._read_offsets

    def checkpoint(self, consumer, close_all: bool) -> None:
        started = time.monotonic()
        if not self._has_unsaved() and not close_all:
            self._update_gauges(consumer)
            return
        topics = []
        for topic, a in self.assemblers.items():
            began = time.process_time()
            rows, minutes = a.take_complete()
            self._stage_cpu("assemble", began)
            table = self.pipelines[topic].table
            if rows.height:
                self._view_dirty = True
                self.metrics.buckets_closed.labels(topic).inc(rows.height)
                self.buckets_closed += rows.height
                if table == "sli_minute":
                    self.minutes_closed += len(minutes)
            topics.append(store.TopicCheckpoint(
                topic=topic, table=table, closed=rows, closed_minutes=minutes, counts=[], hist=[], seen=[],
                watermarks={}, closed_before_minute=a.done_before))
        letters, self.landing = self.landing, []
        own, self.dead_letters = self.dead_letters, []
        for d in own:  # malformed tw.sli records: to the topic too, as every dead letter
            send(self.producer, self.dlq_topic, deadletter.encode(d), d.source_topic.encode(),
                 on_error=self._publish_failed(self.dlq_topic))
        if own:
            self._flush_copies()
        offsets = dict(self.next_offsets)
        for a in self.assemblers.values():
            for q, offset in a.resume_offsets().items():
                key = (self.sli_topic, q)
                offsets[key] = min(offsets.get(key, offset), offset)
        cp = store.Checkpoint(
            topics=topics, next_offsets=offsets,
            dead_letters=deadletter.to_frame(letters + own) if letters or own else None, dedupe_dead_letters=True,
            assembly_frontiers=[(topic, q, f) for topic, a in self.assemblers.items() for (q, _p), f in a.frontiers.items()
                                if self._saved_frontiers.get((topic, q, f.source_partition)) != f],
        )
        self._saved_frontiers.update({(topic, q, f.source_partition): f for topic, q, f in cp.assembly_frontiers})
        self._read_offsets = dict(self.next_offsets)
        self._commit(consumer, cp, started)

    # ---- the signal view: landed minutes only ---------------------------------------------
    def refresh_signals(self) -> None:
        started = time.process_time()
        states = list(self.slo.evaluator.states.values()) if self.slo else []
        self.signal_snapshot = self.live.snapshot(pl.DataFrame(), pl.DataFrame(), states, wall_s=time.time())
        self._stage_cpu("signals_view", started)

    def _undrained(self, consumer) -> list[str]:
        out = super()._undrained(consumer)
        for topic, a in self.assemblers.items():
            if a.held:
                out.append(f"{len(a.held)} minutes of {topic} wait for frontiers of tier-1 partitions")
            elif undrained := a.undrained():
                out.append(f"{topic} partitions {undrained} are not drained by their tier-1 worker")
        return out

    def _progress_line(self, elapsed_s: float) -> str:
        held = sum(len(a.held) for a in self.assemblers.values())
        dropped = sum(a.redelivered for a in self.assemblers.values())
        return (f"tier 2: {self.events_seen:,} tw.sli records, {self.buckets_closed:,} buckets landed, {held} minutes "
                f"held, {dropped:,} partials of landed minutes dropped")
