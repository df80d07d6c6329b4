"""The runtime's Kafka source: one consumer, the partitions it reads and where each stands.

It owns which partitions of which topics this process reads (a consumer group's share,
or every partition with no group), each partition's read position (`next_offsets`), what
is read to its end, every partition the cluster says a topic has, pausing, and the lag.
Where a partition starts when it is taken is the operator's to say (`OffsetPolicy`): the
store's offsets, a tier-1 resume record, or the beginning.

Membership: with a group, `instance_id` makes the worker a static member (KIP-345) and a
restart takes its partitions back at once. Without one (tier 2), every partition of the
topics is assigned directly: every replica reads all of them, and a restart waits for no
session to expire.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Protocol

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from ingest.broker import is_embedded, rescue_wedged_group
from ingest.kafka import KafkaSettings, make_consumer

log = logging.getLogger("tailwatch.source")


class OffsetPolicy(Protocol):
    def start_offsets(self, source: "KafkaSource", partitions: dict[str, list[int]]) -> dict[tuple[str, int], int | None]:
        """Where each partition just taken starts reading (None: its beginning)."""
        ...

    def revoked(self, source: "KafkaSource", topic: str, partition: int) -> None:
        """A partition went to another member."""
        ...


class KafkaSource:
    GROUP_RESCUE_AFTER_S = 15.0  # a rebalance takes a few seconds; three times the session timeout and more is not one
    METADATA_EVERY_S = 30.0  # topics may gain partitions

    def __init__(self, kafka: KafkaSettings, topics: list[str], watched: list[str], group_id: str,
                 by_group: bool = True, instance_id: str | None = None,
                 on_group_rescued: Callable[[], None] = lambda: None):
        self.kafka = kafka
        self.topics = list(topics)  # consumed
        self.watched = list(dict.fromkeys([*topics, *watched]))  # topics whose partition sets are tracked
        self.group_id = group_id
        self.by_group = by_group  # False: every partition, assigned directly, no group joined
        self.instance_id = instance_id
        self.assigned: dict[str, set[int]] = {t: set() for t in self.topics}
        self.eof: dict[str, set[int]] = {t: set() for t in self.topics}
        self.partitions: dict[str, set[int]] = {}  # every partition of each watched topic (metadata)
        self.next_offsets: dict[tuple[str, int], int] = {}  # where reading goes on, per partition
        self.assigned_at: float | None = None
        self.unassigned_since: float | None = None  # holding no partition since (monotonic)
        self._policy: OffsetPolicy | None = None
        self._checked_at = 0.0
        self._last_rescue = 0.0
        self._embedded: bool | None = None  # whether the cluster is the embedded broker, once asked
        self._on_group_rescued = on_group_rescued
        self.consumer = None

    # ---- membership -------------------------------------------------------------------
    def start(self, policy: OffsetPolicy) -> None:
        self._policy = policy
        self.consumer = make_consumer(self.kafka, self.group_id, self.instance_id)
        self.unassigned_since = time.monotonic()
        if self.by_group:
            self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.refresh_partitions()

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()

    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        self.assigned_at = time.monotonic()
        if partitions:
            self.unassigned_since = None
        self.refresh_partitions(assign_new=False)
        self._take(partitions)
        consumer.assign(partitions)
        # A pause outlives the assignment in librdkafka: a partition the alignment paused,
        # then lost to a rebalance (a worker stopped past its session timeout), came back
        # paused, and no one resumed it (the alignment lets go of a partition when it is
        # revoked). It was never read again and the topic's minutes never closed. Taken
        # unpaused; the alignment pauses it again if it is still ahead.
        consumer.resume(partitions)

    def _take(self, partitions: list[TopicPartition]) -> None:
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        starts = self._policy.start_offsets(self, by_topic)
        for tp in partitions:
            start = starts.get((tp.topic, tp.partition))
            tp.offset = OFFSET_BEGINNING if start is None else start
            self.assigned[tp.topic].add(tp.partition)

    def _on_revoke(self, consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic in self.assigned:
                self._policy.revoked(self, tp.topic, tp.partition)
                self.assigned[tp.topic].discard(tp.partition)
                self.eof[tp.topic].discard(tp.partition)
        if not any(self.assigned.values()):
            self.unassigned_since = time.monotonic()

    def refresh_partitions(self, assign_new: bool = True) -> None:
        """Every partition of each watched topic, from the cluster's metadata; without a
        group, new partitions of the consumed topics are assigned here."""
        self._checked_at = time.monotonic()
        for topic in self.watched:
            try:
                meta = self.consumer.list_topics(topic, timeout=10).topics.get(topic)
            except Exception as exc:  # metadata is retried on the next tick; the last known set stays
                log.warning("cannot read the partitions of %s: %s", topic, exc)
                continue
            if meta is not None and meta.error is None and meta.partitions:
                self.partitions[topic] = set(meta.partitions)
        if not self.by_group and assign_new:
            new = [TopicPartition(t, q) for t in self.topics for q in sorted(self.partitions.get(t, ()))
                   if q not in self.assigned[t]]
            if new:
                self._take(new)
                self.consumer.incremental_assign(new)
                self.assigned_at, self.unassigned_since = time.monotonic(), None

    # ---- reading ----------------------------------------------------------------------
    def consume(self, batch_size: int, timeout_s: float) -> dict[str, list]:
        """The next batch, by topic; read positions move past it, end-of-partition events
        are noted. A fatal consumer error (fenced: another process took this static
        membership) raises."""
        msgs = self.consumer.consume(num_messages=batch_size, timeout=timeout_s)
        if not msgs:
            return {}
        # List comprehensions over the C accessors: a statement-per-message loop costs
        # twice as much, and this is the hottest loop of the worker.
        errors = [m.error() for m in msgs]
        if any(e is not None for e in errors):
            for m, err in zip(msgs, errors):
                if err is None:
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    if m.topic() in self.eof:
                        self.eof[m.topic()].add(m.partition())
                elif err.fatal():
                    raise RuntimeError(f"Kafka consumer failed: {err.str()}")
                else:
                    log.warning("consumer error: %s", err)
            msgs = [m for m, e in zip(msgs, errors) if e is None]
        topics = [m.topic() for m in msgs]
        first = topics[0] if topics else None
        if all(t == first for t in topics):
            by_topic = {first: msgs} if msgs else {}
        else:
            by_topic = {t: [m for m, mt in zip(msgs, topics) if mt == t] for t in dict.fromkeys(topics)}
        for topic, batch in by_topic.items():
            partitions = [m.partition() for m in batch]
            # Offsets rise within a partition, so the last one seen per partition is its highest.
            for part, last in dict(zip(partitions, [m.offset() for m in batch])).items():
                key = (topic, part)
                if last + 1 > self.next_offsets.get(key, -1):
                    self.next_offsets[key] = last + 1
            self.eof[topic].difference_update(partitions)
        return by_topic

    def positions(self, topic: str) -> dict[int, tuple[int, int]]:
        """Owned partitions without an EOF seen whose log end is known: partition → (read position, log end)."""
        out = {}
        for part in self.assigned[topic] - self.eof[topic]:
            try:
                # Cached: the high offset arrives with every fetch response, no extra request.
                low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, part), cached=True)
            except Exception:  # unknown yet: not read to its end
                continue
            if high >= 0:
                out[part] = (self.next_offsets.get((topic, part), low), high)
        return out

    def read_to_end(self, topic: str) -> set[int]:
        """Owned partitions consumed up to the log end (EOF seen, or position ≥ high watermark)."""
        return (self.eof[topic] & self.assigned[topic]) | {
            part for part, (position, end) in self.positions(topic).items() if position >= end}

    def pause(self, topic: str, partitions: set[int]) -> None:
        if partitions:
            self.consumer.pause([TopicPartition(topic, part) for part in sorted(partitions)])

    def resume(self, topic: str, partitions: set[int]) -> None:
        owned = partitions & self.assigned[topic]
        if owned:
            self.consumer.resume([TopicPartition(topic, part) for part in sorted(owned)])

    def lag(self) -> tuple[dict[tuple[str, int], int], bool]:
        """Messages behind the log end per owned partition, and whether every one is known."""
        out, known = {}, True
        for topic, parts in self.assigned.items():
            for part in sorted(parts):
                try:
                    _low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, part), cached=True)
                except Exception:  # lag is best-effort telemetry; never stop the worker for it
                    known = False
                    continue
                if high < 0:
                    known = False
                    continue
                out[(topic, part)] = max(0, high - self.next_offsets.get((topic, part), 0))
        return out, known

    def unread(self, topic: str, waited_for: set[int] = frozenset()) -> list[str]:
        """Why `topic` is not drained: partitions (of the cluster's, plus `waited_for`) not
        owned, or owned and not read to their end."""
        if topic not in self.partitions:
            return [f"{topic}: the cluster has not said which partitions it has"]
        out = []
        missing = sorted((self.partitions[topic] | waited_for) - self.assigned[topic])
        behind = sorted(self.assigned[topic] - self.read_to_end(topic))
        if missing:
            out.append(f"{topic} partitions {missing} are not assigned to this worker")
        if behind:
            out.append(f"{topic} partitions {behind} are not read to their end")
        return out

    # ---- timers -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if now - self._checked_at >= self.METADATA_EVERY_S:
            self.refresh_partitions()
        self._rescue_group_if_wedged(now)

    def _rescue_group_if_wedged(self, now: float) -> None:
        """Holding no partition for a while: see whether the group is wedged on a departed
        leader (a bug of the embedded broker, see `rescue_wedged_group`) and free it."""
        since = self.unassigned_since
        if not self.by_group or since is None or now - since < self.GROUP_RESCUE_AFTER_S \
                or now - self._last_rescue < self.GROUP_RESCUE_AFTER_S:
            return
        self._last_rescue = now
        if self._embedded is None:  # asked once: only the embedded broker wedges groups so
            self._embedded = is_embedded(self.kafka.bootstrap_servers, self.kafka.base_config())
        if not self._embedded:
            return
        done = rescue_wedged_group(self.kafka.bootstrap_servers, self.group_id, self.topics, self.consumer.memberid())
        if done:
            self._on_group_rescued()
            log.warning("%s", done)
