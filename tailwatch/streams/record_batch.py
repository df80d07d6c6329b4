"""One topic's records of a consumed batch, held as columns instead of one object per record.

`KafkaSource.consume` reads what the worker uses of each confluent-kafka `Message` (value,
partition, offset, record time) in one C pass (ingest/columnar.py's `read_messages`) and lets
the messages go before the batch is handed on. The messages are objects the cycle collector
tracks: twenty thousand of them alive through a batch's decoding and checkpoint were walked by
every collection that ran meanwhile, young and old, a twentieth of a dense worker's CPU. A
`RecordBatch` holds a list of byte strings and three arrays, which it never walks.

The decode step reads the columns directly; other readers (the assembly of tier 2, a dead
letter's record) index or iterate the batch and get a `Record` per record, with the accessors
of confluent_kafka.Message that the operators use.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE

from tailwatch.ingest.columnar import read_messages


class Record:
    """One record of a `RecordBatch`. `timestamp()` is (kind, ms) as a Message's, but the
    batch keeps only the milliseconds: the kind says whether there is a time
    (TIMESTAMP_CREATE_TIME) or not (TIMESTAMP_NOT_AVAILABLE, -1), not which clock set it."""

    __slots__ = ("_topic", "_value", "_partition", "_offset", "_ts_ms")

    def __init__(self, topic: str, value: bytes | None, partition: int, offset: int, ts_ms: int):
        self._topic, self._value, self._partition, self._offset, self._ts_ms = topic, value, partition, offset, ts_ms

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes | None:
        return self._value

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_CREATE_TIME if self._ts_ms >= 0 else TIMESTAMP_NOT_AVAILABLE), self._ts_ms

    def error(self) -> None:
        return None  # error events (end of partition, faults) are the source's, never in a batch


class RecordBatch(Sequence):
    """A topic's records in consumed order: `values`, and per record its `partitions` (int32),
    `offsets` and `timestamps_ms` (int64, -1 where a record has no time)."""

    __slots__ = ("topic", "values", "partitions", "offsets", "timestamps_ms")

    def __init__(self, topic: str, values: list, partitions: np.ndarray, offsets: np.ndarray, timestamps_ms: np.ndarray):
        self.topic, self.values = topic, values
        self.partitions, self.offsets, self.timestamps_ms = partitions, offsets, timestamps_ms

    @classmethod
    def of(cls, topic: str, records: list) -> RecordBatch:
        """The batch of `records` (objects with confluent_kafka.Message's accessors), read in one C pass."""
        return cls(topic, *read_messages(records))

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return Record(self.topic, self.values[i], int(self.partitions[i]), int(self.offsets[i]), int(self.timestamps_ms[i]))

    def __iter__(self):
        topic = self.topic
        for value, part, offset, ts in zip(self.values, self.partitions.tolist(), self.offsets.tolist(),
                                           self.timestamps_ms.tolist()):
            yield Record(topic, value, part, offset, ts)

    def last_offsets(self) -> dict[int, int]:
        """Each partition's highest offset in the batch. Offsets rise within a partition, and a
        fetch brings each partition's records in a run: the last of each run, the last one wins."""
        parts = self.partitions
        if not len(parts):
            return {}
        ends = np.append(np.flatnonzero(parts[1:] != parts[:-1]), len(parts) - 1)
        return dict(zip(parts[ends].tolist(), self.offsets[ends].tolist()))
