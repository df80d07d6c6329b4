"""Watermark alignment (streams/alignment.py): which partitions pause, when they resume,
and that a stalled or finished partition never holds the others back."""

from tailwatch.streams.alignment import WatermarkAlignment

MIN = 60_000


def reading(*parts: int, at: int = 0) -> dict[int, int]:
    """Partitions with records still to read, at read position `at`."""
    return {p: at for p in parts}


def test_a_partition_past_the_drift_pauses_and_resumes_at_half_of_it():
    a = WatermarkAlignment(max_drift_ms=5 * MIN)
    behind = reading(0, 1, 2)
    pause, resume = a.decide({0: 0, 1: 4 * MIN, 2: 6 * MIN}, behind, now_s=0.0)
    assert (pause, resume) == ({2}, set())
    # The slowest moves up 2 minutes: partition 2 is 4 ahead, within the drift but not yet within half.
    assert a.decide({0: 2 * MIN, 1: 4 * MIN, 2: 6 * MIN}, reading(0, 1, 2, at=1), now_s=1.0) == (set(), set())
    assert a.paused == {2}
    # Within half the drift: resumed; partition 1 never paused.
    assert a.decide({0: 4 * MIN, 1: 4 * MIN, 2: 6 * MIN}, reading(0, 1, 2, at=2), now_s=2.0) == (set(), {2})
    assert a.paused == set()


def test_the_slowest_partition_is_never_paused_and_one_partition_alone_never_is():
    a = WatermarkAlignment(max_drift_ms=MIN)
    pause, _ = a.decide({0: 0, 1: 10 * MIN, 2: 20 * MIN, 3: 30 * MIN}, reading(0, 1, 2, 3), now_s=0.0)
    assert pause == {1, 2, 3}
    b = WatermarkAlignment(max_drift_ms=MIN)
    assert b.decide({0: 30 * MIN}, reading(0), now_s=0.0) == (set(), set())


def test_a_partition_read_to_its_end_holds_nobody_back_and_one_not_yet_read_holds_everybody():
    a = WatermarkAlignment(max_drift_ms=MIN)
    # Partition 0 is far behind but read to its end (nothing to read): nobody pauses for it.
    assert a.decide({0: 0, 1: 30 * MIN, 2: 31 * MIN}, reading(1, 2), now_s=0.0) == (set(), set())
    # Partition 3 has records but has given no valid event yet (librdkafka handed over the
    # others' backlogs first): it holds every minute open, so the others wait for it.
    assert a.decide({1: 30 * MIN, 2: 31 * MIN}, reading(1, 2, 3), now_s=1.0) == ({1, 2}, set())
    # Its first events are at minute 30: 1 resumes; 2, a minute ahead, waits until within half the drift.
    assert a.decide({1: 30 * MIN, 2: 31 * MIN, 3: 30 * MIN}, reading(1, 2, 3, at=5), now_s=2.0) == (set(), {1})


def test_a_stalled_slowest_partition_is_left_out_so_the_others_resume():
    a = WatermarkAlignment(max_drift_ms=MIN, stalled_after_s=10.0)
    assert a.decide({0: 0, 1: 5 * MIN}, reading(0, 1), now_s=0.0) == ({1}, set())
    # Partition 0 has records to read but its read position has not moved for 10 s (its leader is away).
    assert a.decide({0: 0, 1: 5 * MIN}, reading(0, 1), now_s=5.0) == (set(), set())
    assert a.decide({0: 0, 1: 5 * MIN}, reading(0, 1), now_s=10.0) == (set(), {1})
    # It delivers again: its position moves, it counts again, and 1 pauses again.
    assert a.decide({0: MIN // 2, 1: 5 * MIN}, {0: 10, 1: 0}, now_s=11.0) == ({1}, set())


def test_a_partition_reading_poison_moves_and_so_is_not_stalled():
    a = WatermarkAlignment(max_drift_ms=MIN, stalled_after_s=10.0)
    # Partition 0's records are all poison: no watermark, but its position moves.
    for t in range(0, 30, 5):
        assert a.decide({1: 5 * MIN}, {0: t * 100, 1: 0}, now_s=float(t))[0] <= {1}
        assert a.paused == {1}


def test_a_revoked_partition_is_no_longer_paused():
    a = WatermarkAlignment(max_drift_ms=MIN)
    a.decide({0: 0, 1: 5 * MIN}, reading(0, 1), now_s=0.0)
    assert a.paused == {1}
    pause, resume = a.decide({0: 0}, reading(0), now_s=1.0)
    assert (pause, resume, a.paused) == (set(), {1}, set())
    # Revoked while paused, before any decision: forgotten, so it comes back as unpaused.
    a.decide({0: 0, 1: 5 * MIN}, reading(0, 1), now_s=2.0)
    a.forget(1)
    assert a.paused == set() and 1 not in a._moved


# ---- on the real broker --------------------------------------------------------------------

import time  # noqa: E402

import duckdb  # noqa: E402
import pytest  # noqa: E402

from tailwatch.streams.tiers import build  # noqa: E402
from tests.test_faults import produce, settings  # noqa: E402
from tests.test_partials import azure_values  # noqa: E402


class _Watched:
    """The window operator, recording at every checkpoint how many request minutes are open
    and partitions paused."""

    def __init__(self, operator):
        self.operator = operator
        self.most_open = 0
        self.most_paused = 0

    def __getattr__(self, name):
        return getattr(self.operator, name)

    def checkpoint(self, source, close_all: bool):
        p = next(p for p in self.operator.inputs.values() if p.table == "sli_minute")
        self.most_open = max(self.most_open, len(p.windows.open_minutes()))
        a = self.operator.alignment
        self.most_paused = max(self.most_paused, len(a.paused) if a else 0)
        return self.operator.checkpoint(source, close_all)


def _drain(kafka, store, drift_s: float) -> _Watched:
    w = build(settings(kafka, store, until_idle_s=2.0, allowed_lateness_s=60.0, max_watermark_drift_s=drift_s,
                       batch_size=200, publish_sli=False))
    w.operator = watched = _Watched(w.operator)
    assert w.run() == 0
    return watched


@pytest.mark.slow
@pytest.mark.broker
def test_a_backlog_read_unevenly_holds_few_minutes_open_and_gives_the_same_buckets(kafka, tmp_path):
    # The Azure code trace's first 40 minutes: every fourth request into partition 1, the rest into 0.
    # Partition 1 is a quarter as long for the same event time, so read freely it runs ahead and
    # every minute it read stays open until partition 0 catches up.
    values = [v for _, v in azure_values(40)]
    produce(kafka, [(1 if i % 4 == 0 else 0, v) for i, v in enumerate(values)])
    free = _drain(kafka, tmp_path / "free.duckdb", drift_s=0.0)
    aligned = _drain(kafka, tmp_path / "aligned.duckdb", drift_s=60.0)
    assert free.most_paused == 0 and aligned.most_paused == 1
    # Free: partition 1 runs ahead and its minutes wait for partition 0 (34 in the first run).
    # Aligned: lateness 1 minute + drift 1 + what one 200-record batch of partition 1 spans
    # (about 5 minutes) past the line + the newest.
    assert aligned.most_open <= 12 and free.most_open >= 20, (aligned.most_open, free.most_open)

    def buckets(path):
        con = duckdb.connect(str(path), read_only=True)
        try:
            return con.execute("SELECT * FROM sli_minute ORDER BY ALL").fetchall()
        finally:
            con.close()

    assert buckets(tmp_path / "aligned.duckdb") == buckets(tmp_path / "free.duckdb")
    con = duckdb.connect(str(tmp_path / "aligned.duckdb"), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == len(values)


class _FromTheStart:
    """An offset policy that starts every partition taken at its beginning."""

    def start_offsets(self, source, partitions):
        return {}

    def revoked(self, source, topic, partition):
        pass


@pytest.mark.broker
def test_a_partition_paused_when_its_group_rebalances_is_read_after_it(kafka):
    # librdkafka keeps a partition's pause through a rebalance that takes it away and hands
    # it back; the alignment that paused it lets go of it when it is revoked, so nobody would
    # resume it. Seen as a worker stopped past its session timeout (8 s against 3) while
    # draining a backlog: one partition was never read again and no minute closed after.
    import uuid

    from confluent_kafka import Consumer

    from tailwatch.streams.source import KafkaSource

    topic = kafka.topic("requests")
    produce(kafka, [(i % 2, b"r%d" % i) for i in range(100)])
    group = f"g-{uuid.uuid4().hex[:6]}"
    source = KafkaSource(kafka, [topic], [], group)
    source.start(_FromTheStart())

    def consume_until(done, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            source.consume(20, 0.2)
        assert done(), (source.assigned, source.next_offsets)

    try:
        consume_until(lambda: source.assigned[topic] == {0, 1})
        source.pause(topic, {1})
        consume_until(lambda: source.next_offsets.get((topic, 0)) == 50)
        held = source.next_offsets.get((topic, 1), 0)
        assert held < 50
        # A second member joins (every partition is revoked and handed out again), then leaves.
        other = Consumer({**kafka.base_config(), "group.id": group, "session.timeout.ms": 3000,
                          "enable.auto.commit": False})
        other.subscribe([topic])
        deadline = time.monotonic() + 60
        while not other.assignment() and time.monotonic() < deadline:
            other.poll(0.2)
            source.consume(20, 0.2)
        assert other.assignment(), "the second member got no partition"
        other.close()
        consume_until(lambda: source.assigned[topic] == {0, 1} and source.next_offsets.get((topic, 1)) == 50)
    finally:
        source.close()
