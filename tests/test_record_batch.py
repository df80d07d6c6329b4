"""A consumed batch held as columns (streams/record_batch.py): the records it answers are the
consumed messages (value, partition, offset, record time), each partition's read position moves
past its highest offset, and the decode step takes the columns as it took the messages."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, Consumer, TopicPartition, OFFSET_BEGINNING

from tailwatch.ingest.columnar import read_messages
from tailwatch.streams.record_batch import RecordBatch
from tests.test_faults import produce


def _batch(parts: list[int], offsets: list[int], stamps: list[int] | None = None) -> RecordBatch:
    stamps = stamps if stamps is not None else [1_000 + o for o in offsets]
    return RecordBatch("tw.requests", [b"v%d" % o for o in offsets], np.array(parts, dtype=np.int32),
                       np.array(offsets, dtype=np.int64), np.array(stamps, dtype=np.int64))


def test_the_last_offset_of_each_partition_is_its_highest_however_the_runs_interleave():
    # Fetches bring a partition's records in runs, and runs of several partitions interleave.
    batch = _batch([0, 0, 1, 1, 1, 0, 2, 1], [5, 6, 10, 11, 12, 7, 0, 13])
    assert batch.last_offsets() == {0: 7, 1: 13, 2: 0}
    assert _batch([], []).last_offsets() == {}
    assert _batch([3], [41]).last_offsets() == {3: 41}


def test_records_answer_the_accessors_the_operators_use():
    batch = _batch([1, 0], [4, 9], stamps=[1_700_000_000_000, -1])
    assert len(batch) == 2
    first, second = batch[0], batch[-1]
    assert (first.topic(), first.value(), first.partition(), first.offset()) == ("tw.requests", b"v4", 1, 4)
    assert first.timestamp() == (TIMESTAMP_CREATE_TIME, 1_700_000_000_000)
    assert second.timestamp() == (TIMESTAMP_NOT_AVAILABLE, -1)  # a record without a time
    assert first.error() is None
    assert [(r.partition(), r.offset()) for r in batch] == [(1, 4), (0, 9)]
    assert [r.offset() for r in batch[::-1]] == [9, 4]
    # read_messages over the records gives back the columns (a dead letter's record is one of them).
    values, parts, offsets, stamps = read_messages(list(batch))
    assert values == batch.values and parts.tolist() == [1, 0] and stamps.tolist() == [1_700_000_000_000, -1]


class _FromTheStart:
    def start_offsets(self, source, partitions):
        return {(t, q): None for t, qs in partitions.items() for q in qs}

    def revoked(self, source, topic, partition):
        pass


@pytest.mark.broker
def test_kafka_source_batches_hold_what_the_messages_held_and_positions_move_past_them(kafka):
    from tailwatch.streams.source import KafkaSource

    topic = kafka.topic("requests")
    placed = [(i % 2, b"record-%d" % i) for i in range(300)]
    produce(kafka, placed)
    plain = Consumer({**kafka.base_config(), "group.id": f"p-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
    plain.assign([TopicPartition(topic, q, OFFSET_BEGINNING) for q in (0, 1)])
    want = []
    deadline = time.monotonic() + 60
    while len(want) < len(placed) and time.monotonic() < deadline:
        want += [(m.value(), m.partition(), m.offset(), m.timestamp()[1]) for m in plain.consume(100, 0.2)
                 if m.error() is None]
    plain.close()
    source = KafkaSource(kafka, [topic], [], f"g-{uuid.uuid4().hex[:6]}", by_group=False)
    source.start(_FromTheStart())
    got, batches = [], 0
    try:
        deadline = time.monotonic() + 60
        while (len(got) < len(placed) or source.read_to_end(topic) != {0, 1}) and time.monotonic() < deadline:
            for t, batch in source.consume(70, 0.2).items():
                assert t == topic and isinstance(batch, RecordBatch)
                got += [(r.value(), r.partition(), r.offset(), r.timestamp()[1]) for r in batch]
                batches += 1
        assert batches > 1  # positions moved batch by batch
        assert sorted(got, key=lambda r: (r[1], r[2])) == sorted(want, key=lambda r: (r[1], r[2]))
        assert all(ts > 0 for *_, ts in got)
        assert source.next_offsets == {(topic, 0): 150, (topic, 1): 150}
        assert source.read_to_end(topic) == {0, 1}  # the end of each partition was seen
    finally:
        source.close()


def test_the_decode_step_takes_a_batchs_columns_as_it_takes_its_records():
    """The same records as a `RecordBatch` and as a list of records: the same open minutes,
    counters and dead letters (each with its record's partition, offset, value and time)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from tailwatch.ingest.kafka import KafkaSettings
    from tailwatch.streams.cardinality import CardinalityLimits
    from tailwatch.streams.decode_step import DecodeStep, input_topics
    from tailwatch.streams.metrics import WorkerMetrics
    from tailwatch.streams.minute_windows import MinuteWindows
    from tests.test_label_flood import START_MS, request

    values = [request(f"e{i % 40}", START_MS + 997 * i, f"tenant-{i % 3}", "chat-70b") for i in range(60)]
    values[7], values[21] = b"{not json", b'{"schema":"request.v1"}'
    values.append(request("late", START_MS - 3_600_000, "tenant-0", "chat-70b"))  # past the allowed lateness
    parts = [i % 2 for i in range(len(values))]
    batch = RecordBatch("t.tw.requests", values, np.array(parts, dtype=np.int32),
                        np.arange(100, 100 + len(values), dtype=np.int64),
                        np.array([START_MS + 60_000 * 60] * len(values), dtype=np.int64))
    outcomes = []
    for given in (batch, RecordBatch.of(batch.topic, list(batch))):
        settings = KafkaSettings(bootstrap_servers="memory", topic_prefix="t.")
        inputs = input_topics(settings, 1 << 20, lambda spec: MinuteWindows(spec, 60_000, 0), CardinalityLimits())
        p = inputs[settings.topic("requests")]
        registry = CollectorRegistry()
        step = DecodeStep(WorkerMetrics(registry), max_ahead_ms=10**12)
        step.process(p, given)
        rows, _ = p.windows.close(None)
        rows = rows.sort("window_start", *p.windows.spec.keys)  # group-by order is not fixed
        metrics = sorted(line for line in generate_latest(registry).decode().splitlines()
                         if line.startswith("tailwatch_events_total") or line.startswith("tailwatch_dead_letters_total"))
        outcomes.append((rows, metrics, step.take()))
    (rows, metrics, letters), (want_rows, want_metrics, want_letters) = outcomes
    assert rows.height and rows.equals(want_rows)
    assert metrics == want_metrics
    assert len(letters) >= 3 and letters == want_letters  # two malformed, one late
