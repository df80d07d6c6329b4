"""Records held in memory, for a worker with no broker: a source and a producer over lists.

`MemoryTopics` holds topics as lists of records per partition; it is a `Connector`
(streams/source.py) that `tiers.build` takes in place of Kafka, and a producer with the
calls of confluent_kafka.Producer that the worker and the publishers use (`produce`,
`poll`, `flush`, `len`). `MemorySource` reads it as `KafkaSource` reads Kafka: every
partition of its topics (one member, as a group of one), each from where the operator's
policy says, in batches by topic; end of log, lag, pause and resume as Kafka has them.
Records answer `value()`, `partition()`, `offset()`, `timestamp()`, `topic()`, `key()`
and `error()` as confluent_kafka.Message does. As on the broker the worker makes them, the
input topics stamp each record with the time it was appended (LogAppendTime).

What it leaves out is what Kafka's behaviour is: group membership and rebalances, logs
reset or topics deleted under a reader, a broker that refuses or goes away; tests of those
run on the embedded broker. The same lists are what a bytewax `TestingSource` or a Flink
in-memory source are for: the worker's logic (windows, stages, store, signal view) on
records a test writes down.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Callable, Iterable

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME

from tailwatch.conventions import TOPIC_SUFFIXES
from tailwatch.ingest.kafka import INPUT_SUFFIXES, KafkaSettings
from tailwatch.streams.log_reset import LogReset
from tailwatch.streams.record_batch import RecordBatch
from tailwatch.streams.source import OffsetPolicy, unread_lines


class MemoryRecord:
    """One record of a partition, with confluent_kafka.Message's accessors."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_ts_kind", "_ts_ms")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 ts_kind: int, ts_ms: int):
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._ts_kind, self._ts_ms = key, value, ts_kind, ts_ms

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return self._ts_kind, self._ts_ms

    def error(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"MemoryRecord({self._topic}[{self._partition}]@{self._offset})"


class MemoryTopics:
    """Topics in memory: each a list of records per partition. A `Connector` for
    `tiers.build`, and a producer (records keyed as librdkafka's default partitioner places
    them: CRC32 of the key; unkeyed ones round robin)."""

    OUTSIDE_STATE = True  # a broker's stand-in: not the worker's state (streams/state_size.py)

    def __init__(self, settings: KafkaSettings | None = None, partitions: int = 2):
        self.settings = settings or KafkaSettings(topic_prefix="mem.")
        self.default_partitions = partitions
        self.logs: dict[str, list[list[MemoryRecord]]] = {}
        self.log_append: set[str] = set()  # topics whose records take the time they were appended
        self._next_unkeyed: dict[str, int] = {}
        self._appended = threading.Condition()

    # ---- topics -------------------------------------------------------------------------
    def topic(self, suffix: str) -> str:
        """The prefixed name, as KafkaSettings.topic."""
        return self.settings.topic(suffix)

    def create(self, topic: str, partitions: int | None = None, log_append_time: bool = False) -> None:
        """A topic with `partitions` partitions (the default count); one that exists stays as it is."""
        with self._appended:
            if topic not in self.logs:
                self.logs[topic] = [[] for _ in range(partitions or self.default_partitions)]
                if log_append_time:
                    self.log_append.add(topic)

    def ensure(self, partitions: int | None = None) -> None:
        """The tailwatch topics under the prefix, as ingest/kafka.py's `ensure_topics` makes them."""
        inputs = {self.topic(s) for s in INPUT_SUFFIXES}
        for suffix in TOPIC_SUFFIXES:
            self.create(self.topic(suffix), partitions, log_append_time=self.topic(suffix) in inputs)

    def records(self, topic: str) -> list[MemoryRecord]:
        """Every record of `topic`, partition by partition."""
        return [r for part in self.logs.get(topic, ()) for r in part]

    def values(self, topic: str) -> list[bytes]:
        return [r.value() for r in self.records(topic)]

    # ---- the producer's calls -------------------------------------------------------------
    def produce(self, topic: str, value: bytes | None = None, key: bytes | str | None = None, partition: int = -1,
                on_delivery: Callable | None = None, timestamp: int = 0, **_ignored) -> None:
        if isinstance(key, str):
            key = key.encode()
        if isinstance(value, str):
            value = value.encode()
        if topic not in self.logs:  # as a broker that creates topics on first use
            self.create(topic)
        with self._appended:
            parts = self.logs[topic]
            if partition is None or partition < 0:
                if key is None:
                    partition = self._next_unkeyed.get(topic, 0) % len(parts)
                    self._next_unkeyed[topic] = partition + 1
                else:
                    partition = zlib.crc32(key) % len(parts)
            if partition >= len(parts):
                raise ValueError(f"{topic} has no partition {partition} (it has {len(parts)})")
            now_ms = int(time.time() * 1000)
            if topic in self.log_append:
                kind, ts = TIMESTAMP_LOG_APPEND_TIME, now_ms
            else:
                kind, ts = TIMESTAMP_CREATE_TIME, timestamp or now_ms
            log = parts[partition]
            log.append(MemoryRecord(topic, partition, len(log), key, value, kind, ts))
            self._appended.notify_all()

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def flush(self, timeout: float = 0.0) -> int:
        return 0  # delivered as produced

    def __len__(self) -> int:
        return 0  # nothing waits for delivery

    def publish(self, topic: str, values: Iterable[bytes], key: bytes | None = None) -> None:
        for value in values:
            self.produce(topic, value, key=key)

    # ---- the connector's ------------------------------------------------------------------
    def source(self, topics: list[str], watched: list[str], by_group: bool = True,
               on_log_reset: Callable[[LogReset], None] = lambda reset: None) -> "MemorySource":
        return MemorySource(self, topics, watched)

    def producer(self, on_refused: Callable[[str, str], None] | None = None,
                 queue_max_kbytes: int | None = None) -> "MemoryTopics":
        return self

    def wait(self, timeout_s: float) -> None:
        """Until a record is appended anywhere, or `timeout_s` passed."""
        with self._appended:
            self._appended.wait(timeout_s)


class MemorySource:
    """A `Source` (streams/source.py) over `MemoryTopics`: one member owning every partition."""

    def __init__(self, memory: MemoryTopics, topics: list[str], watched: list[str] = ()):
        self.memory = memory
        self.topics = list(topics)
        self.watched = list(dict.fromkeys([*topics, *watched]))
        self.assigned: dict[str, set[int]] = {t: set() for t in self.topics}
        self.partitions: dict[str, set[int]] = {}
        self.next_offsets: dict[tuple[str, int], int] = {}
        self.paused: set[tuple[str, int]] = set()
        self.assigned_at: float | None = None
        self.gone: dict[str, set[int]] = {}  # a memory topic is never deleted
        self.resetting: dict[tuple[str, int], LogReset] = {}  # nor its log reset
        self._policy: OffsetPolicy | None = None
        self._turn = 0  # the partition a batch starts from, in turn

    def ensure_topics(self, partitions: int) -> None:
        self.memory.ensure(partitions)

    def start(self, policy: OffsetPolicy) -> None:
        self._policy = policy
        self._follow()

    def close(self) -> None:
        pass

    def _follow(self) -> None:
        """Every partition of the watched topics known; those of the consumed ones not yet
        owned are taken, from where the policy says."""
        for topic in self.watched:
            if topic in self.memory.logs:
                self.partitions[topic] = set(range(len(self.memory.logs[topic])))
        new = {t: sorted(self.partitions.get(t, set()) - self.assigned[t]) for t in self.topics}
        new = {t: parts for t, parts in new.items() if parts}
        if not new:
            return
        starts = self._policy.start_offsets(self, new)
        for topic, parts in new.items():
            for part in parts:
                start = starts.get((topic, part))
                self.next_offsets[(topic, part)] = start if start is not None else 0
                self.assigned[topic].add(part)
        self.assigned_at = time.monotonic()

    def _end(self, topic: str, part: int) -> int:
        return len(self.memory.logs[topic][part])

    def consume(self, batch_size: int, timeout_s: float) -> dict[str, RecordBatch]:
        batch = self._take(batch_size)
        if not batch and timeout_s > 0:
            self.memory.wait(timeout_s)
            batch = self._take(batch_size)
        return {topic: RecordBatch.of(topic, records) for topic, records in batch.items()}

    def _take(self, batch_size: int) -> dict[str, list]:
        """Up to `batch_size` records, a share from each readable partition in turn (as a
        fetch brings some of each), each partition's in offset order."""
        readable = [(t, q) for t in self.topics for q in sorted(self.assigned[t])
                    if (t, q) not in self.paused and self.next_offsets.get((t, q), 0) < self._end(t, q)]
        if not readable:
            return {}
        self._turn = (self._turn + 1) % len(readable)
        readable = readable[self._turn:] + readable[:self._turn]
        share = max(1, batch_size // len(readable))
        out: dict[str, list] = {}
        left = batch_size
        for topic, part in readable:
            if left <= 0:
                break
            position = self.next_offsets.get((topic, part), 0)
            records = self.memory.logs[topic][part][position:position + min(share, left)]
            out.setdefault(topic, []).extend(records)
            self.next_offsets[(topic, part)] = position + len(records)
            left -= len(records)
        return out

    def positions(self, topic: str) -> dict[int, tuple[int, int]]:
        return {q: (self.next_offsets.get((topic, q), 0), self._end(topic, q)) for q in self.assigned[topic]}

    def read_to_end(self, topic: str) -> set[int]:
        return {q for q, (position, end) in self.positions(topic).items() if position >= end}

    def pause(self, topic: str, partitions: set[int]) -> None:
        self.paused.update((topic, q) for q in partitions)

    def resume(self, topic: str, partitions: set[int]) -> None:
        self.paused.difference_update((topic, q) for q in partitions)

    def lag(self) -> tuple[dict[tuple[str, int], int], bool]:
        return {(t, q): max(0, end - position) for t in self.topics
                for q, (position, end) in self.positions(t).items()}, True

    def unread(self, topic: str, waited_for: set[int] = frozenset()) -> list[str]:
        return unread_lines(topic, self.partitions, self.assigned[topic], self.read_to_end(topic), waited_for)

    def tick(self, now: float) -> None:
        self._follow()  # partitions added since
