"""The runtime's Kafka source: one consumer, the partitions it reads and where each stands.

It owns which partitions of which topics this process reads (a consumer group's share,
or every partition with no group), each partition's read position (`next_offsets`), what
is read to its end, every partition the cluster says a topic has, pausing, and the lag.
Where a partition starts when it is taken is the operator's to say (`OffsetPolicy`): the
store's offsets, a tier-1 resume record, or the beginning.

Read positions the log no longer has (a broker that lost its data, a topic created again,
retention past a stopped worker's position) are checked on every tick against the log's
start and end as the last fetch saw them, and against the topic's id, which the cluster is
asked for every few seconds (streams/log_reset.py decides). Each partition remembers the id
of the log its position is an offset of, across a rebalance too: a broker restart also
empties the consumer group, whose partitions are then revoked and taken again, and an id
learned while none is owned must still be judged against each position once it is taken
back. Such a partition is read again from its start, said once in the log, handed to
`on_log_reset` (a counter, the gap's dead letter), and keeps the worker not ready until it
is read to its end again. A cluster that does not name the ids for long is said once in the
log: positions are then checked against the log's start and end only. A consumed topic the
cluster no longer has (deleted) has its partitions paused, so that nothing is fetched from a
log that is gone, and the worker not ready, until the topic is created again; its id then
changed, and the same policy reads it from the start. What one kind of cluster needs (the
embedded broker's consumer settings, its group rescue) the tier composition hands in
(`consumer_config`, `watchers`): the source asks the development tools for nothing.

`Source` is what the runtime and the operators use of a source; `KafkaSource` is the one a
worker runs on, and streams/memory_source.py reads lists of records held in memory, for
tests of a worker's logic that need no broker. `Connector` is where a tier gets its source
and the producer its topic sink writes with: Kafka (`KafkaConnector`) or the memory.

Membership: with a group, `instance_id` makes the worker a static member (KIP-345) and a
restart takes its partitions back at once. Without one (tier 2), every partition of the
topics is assigned directly: every replica reads all of them, and a restart waits for no
session to expire.
"""

from __future__ import annotations

import gc
import logging
import time
from itertools import repeat
from operator import is_not
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, make_consumer, make_producer
from tailwatch.streams.log_reset import BEFORE_START, PAST_END, LogReset, judge
from tailwatch.streams.record_batch import RecordBatch

log = logging.getLogger("tailwatch.source")


class OffsetPolicy(Protocol):
    def start_offsets(self, source: "Source", partitions: dict[str, list[int]]) -> dict[tuple[str, int], int | None]:
        """Where each partition just taken starts reading (None: its beginning)."""
        ...

    def revoked(self, source: "Source", topic: str, partition: int) -> None:
        """A partition went to another member."""
        ...


class Source(Protocol):
    """What the runtime (streams/runtime.py) and the operators (streams/operator.py) use of a
    source. Records are read in batches by topic; each record answers `value()`,
    `partition()`, `offset()`, `timestamp()` (kind, ms), `topic()` and `error()` as a
    confluent_kafka.Message does (every source hands `RecordBatch`es, columns whose
    records say only whether there is a time, not which kind: streams/record_batch.py)."""

    topics: list[str]  # consumed
    assigned: dict[str, set[int]]  # the partitions of each consumed topic this worker reads
    partitions: dict[str, set[int]]  # every partition of each watched topic (a topic not known yet is absent)
    next_offsets: dict[tuple[str, int], int]  # where reading goes on, per partition (operators restore it)
    assigned_at: float | None  # monotonic: when partitions were last taken (None: never yet)
    gone: dict[str, set[int]]  # consumed topics the cluster no longer has → their partitions, paused
    resetting: dict[tuple[str, int], LogReset]  # read again from the start of a log reset under them

    def ensure_topics(self, partitions: int) -> None:
        """The topics a worker reads and writes exist (made with `partitions` each where not)."""
        ...

    def start(self, policy: OffsetPolicy) -> None:
        """Take partitions; `policy` says where each starts reading and hears of each revoked."""
        ...

    def close(self) -> None:
        ...

    def consume(self, batch_size: int, timeout_s: float) -> dict[str, list]:
        """The next batch (at most `batch_size` records), by topic, each topic's records in
        offset order per partition; waits up to `timeout_s` for one. Read positions move past it."""
        ...

    def positions(self, topic: str) -> dict[int, tuple[int, int]]:
        """Owned partitions whose log end is known (Kafka's leaves out those it has seen the
        end of): partition → (read position, log end)."""
        ...

    def read_to_end(self, topic: str) -> set[int]:
        """Owned partitions consumed up to the log end."""
        ...

    def pause(self, topic: str, partitions: set[int]) -> None:
        ...

    def resume(self, topic: str, partitions: set[int]) -> None:
        ...

    def lag(self) -> tuple[dict[tuple[str, int], int], bool]:
        """Records behind the log end per owned partition, and whether every one is known."""
        ...

    def unread(self, topic: str, waited_for: set[int] = frozenset()) -> list[str]:
        """Why `topic` is not drained (empty: it is)."""
        ...

    def tick(self, now: float) -> None:
        """Once per loop (monotonic `now`): metadata, checks, watchers."""
        ...


class Connector(Protocol):
    """Where a tier's records come from and go to: the source it reads and the producer its
    topic sink writes with (streams/tiers.py takes one; `KafkaConnector` by default)."""

    def source(self, topics: list[str], watched: list[str], by_group: bool,
               on_log_reset: Callable[[LogReset], None]) -> Source:
        ...

    def producer(self, on_refused: Callable[[str, str], None] | None = None, queue_max_kbytes: int | None = None):
        """A producer with confluent_kafka.Producer's produce, poll, flush and len (ingest/kafka.py's `make_producer`)."""
        ...


def unread_lines(topic: str, partitions: dict[str, set[int]], assigned: set[int], read_to_end: set[int],
                 waited_for: set[int] = frozenset()) -> list[str]:
    """Why `topic` is not drained: partitions (of the cluster's, plus `waited_for`) not owned,
    or owned and not read to their end."""
    if topic not in partitions:
        return [f"{topic}: the cluster has not said which partitions it has"]
    out = []
    missing = sorted((partitions[topic] | waited_for) - assigned)
    behind = sorted(assigned - read_to_end)
    if missing:
        out.append(f"{topic} partitions {missing} are not assigned to this worker")
    if behind:
        out.append(f"{topic} partitions {behind} are not read to their end")
    return out


class KafkaSource:
    METADATA_EVERY_S = 30.0  # topics may gain partitions
    TOPIC_IDS_EVERY_S = 5.0  # a topic created again has a new id; asking costs one request
    GONE_EVERY_S = 1.0  # a deleted topic, or one whose id is not known, is asked for every second
    DESCRIBE_TIMEOUT_S = 5.0  # an unreachable cluster holds the loop this long at each ask
    IDS_UNCHECKED_WARN_S = 30.0  # ids not named for this long: said once, not vouched for in silence

    def __init__(self, kafka: KafkaSettings, topics: list[str], watched: list[str], group_id: str,
                 by_group: bool = True, instance_id: str | None = None,
                 watchers: Sequence[Callable[["KafkaSource", float], None]] = (),
                 on_log_reset: Callable[[LogReset], None] = lambda reset: None,
                 consumer_config: Callable[[], dict | None] | None = None):
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
        # Called from each tick with (source, monotonic now): what only some clusters need
        # (the embedded broker's group rescue, streams/group_rescue.py), added by the tier.
        self.watchers = list(watchers)
        # Consumer settings one kind of cluster needs (the embedded broker's, streams/tiers.py),
        # asked for when the consumer is made: the answer may take asking the cluster.
        self._consumer_config = consumer_config
        self._on_log_reset = on_log_reset
        # Each consumed topic's id as the cluster last named it (its log's identity); absent: not
        # named yet, or in doubt after a log reset the cluster had not named.
        self.topic_ids: dict[str, str] = {}
        # The id of the log each partition's read position is an offset of, kept while the partition
        # is revoked (its stored offset still points there); absent: not known, the next id named is taken.
        self.position_logs: dict[tuple[str, int], str] = {}
        self.resetting: dict[tuple[str, int], LogReset] = {}  # read again from the start, not yet to the end
        self._unsought: dict[tuple[str, int], LogReset] = {}  # reset, the seek not taken yet (retried each tick)
        self._was_reset: set[tuple[str, int]] = set()  # until the policy's saved offsets are of the new log
        self._ids_checked_at = 0.0
        self._ids_failing_since: float | None = None  # monotonic: asks since then named no id of some topic
        self._ids_unchecked_said = False  # the warning that they cannot be checked is out
        self.gone: dict[str, set[int]] = {}  # consumed topics the cluster no longer has → the partitions paused for it
        self._admin: AdminClient | None = None
        self.consumer = None

    # ---- membership -------------------------------------------------------------------
    def ensure_topics(self, partitions: int) -> None:
        ensure_topics(self.kafka, partitions)

    def start(self, policy: OffsetPolicy) -> None:
        self._policy = policy
        extra = self._consumer_config() if self._consumer_config is not None else None
        self.consumer = make_consumer(self.kafka, self.group_id, self.instance_id, extra)
        # Named before anything is read: a position reached before the first answer has no known
        # log, and a topic created again before that answer would be taken for the same one.
        self._topic_ids()
        self.unassigned_since = time.monotonic()
        if self.by_group:
            self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.refresh_partitions()

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
        self._admin = None

    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        self.assigned_at = time.monotonic()
        if partitions:
            self.unassigned_since = None
        # The partitions' metadata is asked at the next tick, not here: a call on the consumer
        # inside its own rebalance callback ends confluent-kafka's call state for the consume
        # that is still running, and the next callback of that consume (a log line, with the
        # broker gone) aborts the process (CallState_get: Assertion `cs != NULL').
        self._checked_at = 0.0
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
            key = (tp.topic, tp.partition)
            start, read = starts.get(key), self.next_offsets.get(key)
            if key in self._was_reset:
                if start is not None and read is not None and read < start:
                    # Reset since the policy saved its offset, which points into the log that is gone.
                    start = read or None
                else:
                    self._was_reset.discard(key)
            # Taken back after the topic's id changed (a restart's rebalance): the start points
            # into the log that is gone; read the new one from its start instead of from there.
            reset = judge(tp.topic, tp.partition, start or 0, -1, -1,
                          self.position_logs.get(key), self.topic_ids.get(tp.topic))
            if reset is not None:
                self._note_reset(reset)
                self.position_logs[key] = self.topic_ids[tp.topic]
                self.next_offsets[key], start = 0, None
            tp.offset = OFFSET_BEGINNING if start is None else start
            self.assigned[tp.topic].add(tp.partition)

    def _on_revoke(self, consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic in self.assigned:
                self._policy.revoked(self, tp.topic, tp.partition)
                self.assigned[tp.topic].discard(tp.partition)
                self.eof[tp.topic].discard(tp.partition)
                self.resetting.pop((tp.topic, tp.partition), None)
                self._unsought.pop((tp.topic, tp.partition), None)
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
        """The next batch, by topic, each a `RecordBatch` (streams/record_batch.py); read
        positions move past it, end-of-partition events are noted. A fatal consumer error
        (fenced: another process took this static membership) raises."""
        # The cycle collector waits while the messages exist: they are let go here, and a
        # collection meanwhile would only walk twenty thousand live objects.
        collecting = gc.isenabled()
        gc.disable()
        try:
            msgs = self.consumer.consume(num_messages=batch_size, timeout=timeout_s)
            return self._batches(msgs) if msgs else {}
        finally:
            msgs = None
            if collecting:
                gc.enable()

    def _batches(self, msgs: list) -> dict[str, RecordBatch]:
        # C-level passes (map over the Message methods, read_messages): a Python frame per
        # message cost twice as much, and this is the hottest loop of the worker.
        errors = list(map(Message.error, msgs))
        if any(map(is_not, errors, repeat(None))):
            for m, err in zip(msgs, errors):
                if err is None:
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    if m.topic() in self.eof:
                        self.eof[m.topic()].add(m.partition())
                elif err.code() == KafkaError._AUTO_OFFSET_RESET and m.topic() in self.assigned:
                    # librdkafka was told the position is out of range and went to the log's
                    # start itself: the same policy, which must not pass in silence.
                    self._out_of_range(m.topic(), m.partition())
                elif err.fatal():
                    raise RuntimeError(f"Kafka consumer failed: {err.str()}")
                else:
                    log.warning("consumer error: %s", err)
            msgs = [m for m, e in zip(msgs, errors) if e is None]
        topics = list(map(Message.topic, msgs))
        if not topics:
            return {}
        if topics.count(topics[0]) == len(topics):
            by_topic = {topics[0]: msgs}
        else:
            by_topic = {t: [m for m, mt in zip(msgs, topics) if mt == t] for t in dict.fromkeys(topics)}
        out = {}
        for topic, batch in by_topic.items():
            out[topic] = records = RecordBatch.of(topic, batch)
            last = records.last_offsets()
            for part, offset in last.items():
                key = (topic, part)
                if offset + 1 > self.next_offsets.get(key, -1):
                    self.next_offsets[key] = offset + 1
            self.eof[topic].difference_update(last)
        return out

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
        owned = partitions & self.assigned[topic] - self.gone.get(topic, set())
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
                behind = high - self.next_offsets.get((topic, part), 0)
                if high < 0 or behind < 0:  # past the end: the next tick's check says so and reads from the start
                    known = False
                    continue
                out[(topic, part)] = behind
        return out, known

    def unread(self, topic: str, waited_for: set[int] = frozenset()) -> list[str]:
        """Why `topic` is not drained: partitions (of the cluster's, plus `waited_for`) not
        owned, or owned and not read to their end."""
        return unread_lines(topic, self.partitions, self.assigned[topic], self.read_to_end(topic), waited_for)

    # ---- timers -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if now - self._checked_at >= self.METADATA_EVERY_S:
            self.refresh_partitions()
        self.check_positions(now)
        for watch in self.watchers:
            watch(self, now)

    # ---- positions the log no longer has ------------------------------------------------
    def check_positions(self, now: float) -> None:
        """Judge every owned partition's read position against its log (streams/log_reset.py)
        and reset those the log no longer has. A position past the end also has the topic's id
        asked at once: after a re-creation every partition of the topic is read again, not only
        those whose new log is still short."""
        unnamed = any(t not in self.topic_ids for t in self.topics)
        every = self.GONE_EVERY_S if self.gone or unnamed else self.TOPIC_IDS_EVERY_S
        named = self._topic_ids() if now - self._ids_checked_at >= every else None
        found = self._judge_all()
        if named is None and any(r.reason == PAST_END for r in found):
            named = self._topic_ids()
            found = self._judge_all()
        for reset in found:
            self._reset(reset)
            key = (reset.topic, reset.partition)
            if reset.topic in (named or {}):
                self.position_logs[key] = named[reset.topic]
            else:  # reset under an id the cluster did not name in this check: the next one named is the log's
                self._forget_log(key)
        for key, reset in list(self._unsought.items()):
            self._seek_start(key, reset)
        for key in [k for k in self.resetting if k not in self._unsought and k[1] in self.read_to_end(k[0])]:
            log.info("%s partition %d: read again to its end after the reset", *key)
            del self.resetting[key]

    def _judge_all(self) -> list[LogReset]:
        """Every owned partition's position against its log's start and end, and the id of the
        log it is an offset of against the topic's id as last named (the first one named for a
        position of a log not known yet is taken as its log's)."""
        out = []
        for topic, parts in self.assigned.items():
            current = self.topic_ids.get(topic)
            for part in sorted(parts):
                key = (topic, part)
                position = self.next_offsets.get(key)
                if position is None or key in self._unsought or topic in self.gone:
                    continue
                if current is not None:
                    self.position_logs.setdefault(key, current)
                low, high = self._cached_watermarks(topic, part)
                reset = judge(topic, part, position, low, high, self.position_logs.get(key), current)
                if reset is not None:
                    out.append(reset)
        return out

    def _forget_log(self, key: tuple[str, int]) -> None:
        """The partition reads from the start of a log the cluster has not named: neither its
        position's log nor the topic's id is known until the next answer (the other partitions'
        positions are then judged against it, this one takes it)."""
        self.position_logs.pop(key, None)
        self.topic_ids.pop(key[0], None)

    def _cached_watermarks(self, topic: str, part: int) -> tuple[int, int]:
        """The log's start and end as the last fetch response said (-1: not known). The cached
        ones, not a ListOffsets request: the embedded broker answers that with the first
        offset of the newest batch plus one, not the log's end."""
        try:
            low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, part), cached=True)
        except KafkaException:
            return -1, -1
        return (low if low >= 0 else -1), (high if high >= 0 else -1)

    def _topic_ids(self) -> dict[str, str]:
        """Ask the cluster for each consumed topic's id: those it names (a topic it lacks is left
        out), also kept in `topic_ids`. A topic found deleted is paused, one found back is
        resumed; a cluster that names no id of some topic for long is said once."""
        self._ids_checked_at = now = time.monotonic()
        if self._admin is None:
            self._admin = AdminClient(self.kafka.base_config())
        out: dict[str, str] = {}
        failure = ""
        try:
            futures = self._admin.describe_topics(TopicCollection(self.topics),
                                                  request_timeout=self.DESCRIBE_TIMEOUT_S)
        except KafkaException as exc:
            futures, failure = {}, str(exc.args[0])
        for topic, future in futures.items():
            try:
                out[topic] = str(future.result(timeout=2 * self.DESCRIBE_TIMEOUT_S).topic_id)
            except KafkaException as exc:
                if exc.args[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN_TOPIC_ID):
                    self._topic_gone(topic)
                else:
                    failure = f"{topic}: {exc.args[0]}"
            except TimeoutError:  # unreachable now: judged when it answers
                failure = f"{topic}: no answer within {2 * self.DESCRIBE_TIMEOUT_S:.0f} s"
        self._ids_answered(now, failure)
        for topic in [t for t in self.gone if t in out]:
            self._topic_back(topic)
        self.topic_ids.update(out)
        return out

    def _ids_answered(self, now: float, failure: str) -> None:
        """Track whether the ids can be asked for: a failed ask is debug-level (a broker
        restarting), failures for longer than IDS_UNCHECKED_WARN_S a warning, once per run."""
        if not failure:
            if self._ids_unchecked_said:
                log.warning("the cluster names the ids of %s again: read positions are checked against them",
                            ", ".join(self.topics))
            self._ids_failing_since, self._ids_unchecked_said = None, False
            return
        log.debug("cannot describe %s: %s", self.topics, failure)
        if self._ids_failing_since is None:
            self._ids_failing_since = now
        elif now - self._ids_failing_since >= self.IDS_UNCHECKED_WARN_S and not self._ids_unchecked_said:
            self._ids_unchecked_said = True
            log.warning("cannot ask the cluster for the ids of %s for %.0f s (%s): a topic deleted and created "
                        "again in that time is not seen, and read positions are checked against the log's start "
                        "and end only until it answers", ", ".join(self.topics), now - self._ids_failing_since,
                        failure)

    def _topic_gone(self, topic: str) -> None:
        """The cluster no longer has `topic`: stop fetching from a log that is gone (its owned
        partitions paused) until it is created again."""
        if topic in self.gone:
            return
        parts = set(self.assigned.get(topic, ()))
        self.gone[topic] = parts
        if parts:
            self.consumer.pause([TopicPartition(topic, part) for part in sorted(parts)])
        log.warning("%s: the topic is gone (deleted); partitions %s are paused until it is created again, "
                    "then read from the start of the new log", topic, sorted(parts))

    def _topic_back(self, topic: str) -> None:
        """`topic` exists again: the consumer learns its new id (librdkafka fetches by id and
        asks for a topic's metadata only when it needs to), and its partitions are resumed.
        Its positions are judged against the new id in the same check: read from the start."""
        parts = self.gone.pop(topic) & self.assigned.get(topic, set())
        try:
            self.consumer.list_topics(topic, timeout=10)
        except KafkaException as exc:  # the consumer also asks on its own; the check by id still holds
            log.warning("cannot read the metadata of %s: %s", topic, exc)
        if parts:
            self.consumer.resume([TopicPartition(topic, part) for part in sorted(parts)])
        log.warning("%s: the topic exists again", topic)

    def _out_of_range(self, topic: str, part: int) -> None:
        position = self.next_offsets.get((topic, part), 0)
        low, high = self._cached_watermarks(topic, part)
        reason = PAST_END if 0 <= high < position else BEFORE_START
        self._note_reset(LogReset(topic, part, position, low, high, reason))
        self.next_offsets[(topic, part)] = max(low, 0)  # librdkafka already reads from the start
        self._forget_log((topic, part))

    def _reset(self, reset: LogReset) -> None:
        self._note_reset(reset)
        self._seek_start((reset.topic, reset.partition), reset)

    def _note_reset(self, reset: LogReset) -> None:
        """Said once in the log, handed on, and not ready until read to its end again."""
        key = (reset.topic, reset.partition)
        log.warning("%s", reset.line())
        self._on_log_reset(reset)
        self.resetting[key] = reset
        self._was_reset.add(key)

    def _seek_start(self, key: tuple[str, int], reset: LogReset) -> None:
        """Read the partition from the start of its log; a seek librdkafka cannot take yet (the
        partition not fetching since its assignment) is tried again on the next tick."""
        topic, part = key
        try:
            self.consumer.seek(TopicPartition(topic, part, OFFSET_BEGINNING))
        except KafkaException:
            self._unsought[key] = reset
            return
        self._unsought.pop(key, None)
        self.next_offsets[key] = 0
        self.eof[topic].discard(part)


@dataclass
class KafkaConnector:
    """Kafka: a `KafkaSource` per tier and librdkafka's producer. `consumer_config` and
    `watchers` are what one kind of cluster needs (the tier composition asks the development
    tools for the embedded broker's, streams/tiers.py)."""

    kafka: KafkaSettings
    group_id: str
    instance_id: str | None = None
    consumer_config: Callable[[], dict | None] | None = None
    watchers: list[Callable[[KafkaSource, float], None]] = field(default_factory=list)

    def source(self, topics: list[str], watched: list[str], by_group: bool,
               on_log_reset: Callable[[LogReset], None]) -> KafkaSource:
        return KafkaSource(self.kafka, topics, watched, self.group_id, by_group=by_group, instance_id=self.instance_id,
                           watchers=self.watchers, on_log_reset=on_log_reset, consumer_config=self.consumer_config)

    def producer(self, on_refused: Callable[[str, str], None] | None = None, queue_max_kbytes: int | None = None):
        return make_producer(self.kafka, on_refused=on_refused, queue_max_kbytes=queue_max_kbytes)
