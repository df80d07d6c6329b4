"""Event-time alignment of the partitions `ingest otlp` reads.

The Collector writes batches with no key, so any partition may hold any time, and a
consumer with a backlog can read one partition far ahead of another. Republished as is,
the records of the slower partition would reach the worker minutes behind its watermark
and be refused as late. So, as Flink's watermark alignment does for its sources, a
partition whose newest event time runs more than `max_drift_ms` ahead of the slowest
partition still reading is paused until the others catch up. A partition at its end (no
backlog) holds nobody back, nor does one silent for the republisher's idleness timeout
(Flink's `withIdleness`); one not read yet holds everyone back, since it may hold the
oldest records.
"""

from __future__ import annotations

TopicPartition = tuple[str, int]


class EventTimeAlignment:
    def __init__(self, max_drift_ms: int = 60_000):
        self.max_drift_ms = max_drift_ms
        self.assigned: set[TopicPartition] = set()
        self.newest_ms: dict[TopicPartition, int] = {}
        self.ended: set[TopicPartition] = set()
        self.paused: set[TopicPartition] = set()

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned |= set(partitions)

    def revoke(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.assigned.discard(tp)
            self.newest_ms.pop(tp, None)
            self.ended.discard(tp)
            self.paused.discard(tp)

    # `reading` and `at_end` are called in the order the consumer returned records and
    # end-of-partition events; `advance` once a record's events are out.
    def reading(self, tp: TopicPartition) -> None:
        self.ended.discard(tp)

    def at_end(self, tp: TopicPartition) -> None:
        self.ended.add(tp)

    def advance(self, tp: TopicPartition, newest_ms: int | None) -> None:
        if newest_ms is not None:
            self.newest_ms[tp] = max(newest_ms, self.newest_ms.get(tp, newest_ms))

    def decide(self) -> tuple[set[TopicPartition], set[TopicPartition]]:
        """(partitions to pause, partitions to resume) now; applied, they become `paused`."""
        want: set[TopicPartition] = set()
        for topic in {t for t, _ in self.assigned}:
            reading = [tp for tp in self.assigned if tp[0] == topic and tp not in self.ended]
            if not reading:
                continue
            slowest = min(self.newest_ms.get(tp, -1) for tp in reading)  # -1: not read yet
            want |= {tp for tp in reading if self.newest_ms.get(tp, -1) > slowest + self.max_drift_ms}
        pause, resume = want - self.paused, self.paused - want
        self.paused = want
        return pause, resume
