"""Read positions the log no longer has, on a broker of the test's own that is restarted
(the embedded broker keeps its log in memory: a restart empties it and offsets begin again
at 0) under real `tailwatch worker` processes.

A worker then reads each such partition again from its start, says so in one log line,
counts it (`tailwatch_log_resets_total`) and marks the gap with a dead letter of reason
`log_reset`; every record published after the reset is counted once. The source's own order
of events around a restart (the group's rebalance, the topic's new id) is driven step by step
on a `KafkaSource` of the test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import duckdb
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tailwatch.conventions import EVENTS_TOTAL, LOG_RESETS_TOTAL
from tailwatch_dev.broker import CONSUMER_CONFIG, EmbeddedBroker, free_port
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
from tailwatch.streams.log_reset import BEFORE_START, LOG_RESET, PAST_END, TOPIC_RECREATED, judge
from tailwatch.streams.source import KafkaSource
from tests.conftest import start_broker

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
PARTITIONS = 4


def request(i: int) -> bytes:
    return json.dumps({"schema": "request.v1", "event_id": f"e-{i}", "ts": T0_MS + i * 20, "tenant": "acme",
                       "model": "m", "workload": "llm", "status": "ok", "e2e_ms": 100.0, "output_tokens": 10}).encode()


def publish(kafka: KafkaSettings, first: int, count: int) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
    for i in range(first, first + count):
        p.produce(kafka.topic("requests"), request(i), key=b"k", partition=i % PARTITIONS)
    assert p.flush(30) == 0


def worker(kafka: KafkaSettings, store, port: int, log_path, until_idle: str | None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
            "--topic-prefix", kafka.topic_prefix, "--store", str(store), "--group", "g", "--http-port", str(port),
            "--checkpoint-interval", "0.2", "--allowed-lateness", "2m", "--partitions", str(PARTITIONS)]
    if until_idle:
        argv += ["--until-idle", until_idle]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))


def metric(port: int, name: str, label: str = "") -> float:
    """The sum of the worker's `name{...}` series holding `label` (-1: /metrics did not answer)."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return -1.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(name + "{") and label in line)


def accepted(port: int) -> float:
    return metric(port, EVENTS_TOTAL, 'outcome="accepted"')


def wait_for(what, timeout_s: float, proc: subprocess.Popen, port: int) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, f"the worker exited with {proc.returncode}"
        if what():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out: {accepted(port)} accepted, {metric(port, LOG_RESETS_TOTAL)} resets")


def drained(kafka, store, tmp_path) -> tuple[int, int, list[tuple]]:
    """What is still open closed by a drain of the same store, then what the store holds."""
    done = worker(kafka, store, free_port(), tmp_path / "drain.log", until_idle="2")
    assert done.wait(60) == 0
    return stored(store)


def stored(store) -> tuple[int, int, list[tuple]]:
    with duckdb.connect(str(store), read_only=True) as con:
        requests, distinct = con.execute("SELECT sum(requests), count(*) FROM sli_minute").fetchone()
        gaps = con.execute("SELECT source_topic, source_partition, source_offset, detail FROM dead_letter "
                       f"WHERE reason = '{LOG_RESET}' ORDER BY source_partition").fetchall()
    return int(requests or 0), distinct, gaps


@pytest.fixture
def own_broker():
    """A broker of the test's own: restarting the session's would empty every other test's topics."""
    b = start_broker()
    yield b
    b.stop()


def restart(b: EmbeddedBroker, kafka: KafkaSettings) -> None:
    b.stop()
    b.start()
    ensure_topics(kafka, PARTITIONS)


def readyz(port: int) -> tuple[int, str]:
    """/readyz's status and body (0: it did not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def reset_lines(log_path) -> list[str]:
    return [line for line in open(log_path).read().splitlines() if "stored read position" in line]


# ---- the decision ------------------------------------------------------------------------------
def test_a_position_the_log_has_is_left_alone_and_one_it_lacks_is_named():
    assert judge("t", 0, 500, 0, 500) is None  # at the end: read to it
    assert judge("t", 0, 0, -1, -1) is None and judge("t", 0, 500, -1, -1) is None  # nothing known: nothing decided
    assert judge("t", 0, 0, 0, 0, "a", "b") is None  # from the start already: nothing is skipped
    assert judge("t", 0, 501, 0, 500).reason == PAST_END
    assert judge("t", 0, 10, 20, 500).reason == BEFORE_START
    assert judge("t", 0, 100, 0, 500, "a", "b").reason == TOPIC_RECREATED
    assert judge("t", 0, 100, 0, 500, None, "b") is None  # the first id seen is no change
    r = judge("tw.requests", 3, 1_000, 0, 250)
    line = r.line()
    assert "tw.requests partition 3" in line and "1,000" in line and "offsets 0 to 249" in line
    letter = r.dead_letter(T0_MS)
    assert (letter.reason, letter.source_partition, letter.source_offset) == (LOG_RESET, 3, 1_000)


# ---- a live worker across a broker restart --------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_broker_restart_under_a_live_worker_loses_nothing_published_after_it(own_broker, tmp_path):
    kafka = KafkaSettings(bootstrap_servers=own_broker.bootstrap, topic_prefix="lr.")
    ensure_topics(kafka, PARTITIONS)
    publish(kafka, 0, 4_000)
    store, port, log_path = tmp_path / "s.duckdb", free_port(), tmp_path / "worker.log"
    w = worker(kafka, store, port, log_path, until_idle=None)
    try:
        wait_for(lambda: accepted(port) >= 4_000, 60, w, port)
        restart(own_broker, kafka)
        publish(kafka, 10_000, 5_000)  # offsets 0..1,249 per partition: below the worker's 1,000 and past it
        wait_for(lambda: accepted(port) >= 9_000 and metric(port, LOG_RESETS_TOTAL) >= PARTITIONS, 60, w, port)
        assert metric(port, LOG_RESETS_TOTAL) == PARTITIONS
    finally:
        w.terminate()
        assert w.wait(30) == 0
    requests, _rows, gaps = drained(kafka, store, tmp_path)
    assert requests == 9_000  # 4,000 read before the restart, 5,000 after: each once
    assert [(t, q) for t, q, _o, _d in gaps] == [("lr.requests", q) for q in range(PARTITIONS)]
    assert all(o == 1_000 or o == 1_250 for _t, _q, o, _d in gaps)
    lines = reset_lines(log_path)
    assert len(lines) == PARTITIONS and all("lr.requests partition" in line for line in lines)


@pytest.mark.timeout(120)
def test_a_stopped_worker_whose_positions_are_past_the_end_reads_the_new_log(own_broker, tmp_path):
    kafka = KafkaSettings(bootstrap_servers=own_broker.bootstrap, topic_prefix="lr.")
    ensure_topics(kafka, PARTITIONS)
    publish(kafka, 0, 4_000)
    store = tmp_path / "s.duckdb"
    assert worker(kafka, store, free_port(), tmp_path / "first.log", until_idle="2").wait(60) == 0
    assert stored(store)[0] == 4_000
    restart(own_broker, kafka)
    publish(kafka, 10_000, 2_000)  # 500 a partition: every stored position (1,000) is past the end
    log_path = tmp_path / "second.log"
    assert worker(kafka, store, free_port(), log_path, until_idle="2").wait(60) == 0
    requests, _rows, gaps = stored(store)
    assert requests == 6_000
    assert [(q, o) for _t, q, o, _d in gaps] == [(q, 1_000) for q in range(PARTITIONS)]
    assert all(d.startswith(PAST_END) for *_x, d in gaps)
    lines = reset_lines(log_path)
    assert len(lines) == PARTITIONS and all("past the log's end" in line and "1,000" in line for line in lines)


@pytest.mark.timeout(180)
def test_a_topic_deleted_and_created_again_under_a_live_worker_loses_nothing_published_after_it(own_broker, tmp_path):
    """The embedded broker answers a fetch of the deleted topic with a nameless leader hint that
    crashed librdkafka 2.16 (exit -11) while the worker kept the topic's partitions."""
    kafka = KafkaSettings(bootstrap_servers=own_broker.bootstrap, topic_prefix="lr.")
    ensure_topics(kafka, PARTITIONS)
    publish(kafka, 0, 4_000)
    store, port, log_path = tmp_path / "s.duckdb", free_port(), tmp_path / "worker.log"
    w = worker(kafka, store, port, log_path, until_idle=None)
    admin = AdminClient({"bootstrap.servers": own_broker.bootstrap})  # kept: a collected client drops its futures
    try:
        wait_for(lambda: accepted(port) >= 4_000, 60, w, port)
        admin.delete_topics([kafka.topic("requests")])[kafka.topic("requests")].result(timeout=30)
        wait_for(lambda: "the topic is gone" in readyz(port)[1], 30, w, port)
        assert readyz(port)[0] == 503
        time.sleep(3)  # the worker lives on while the topic is gone
        ensure_topics(kafka, PARTITIONS)
        publish(kafka, 10_000, 2_000)  # 500 a partition: the stored positions (1,000) are of the old log
        wait_for(lambda: accepted(port) >= 6_000 and metric(port, LOG_RESETS_TOTAL) >= PARTITIONS, 60, w, port)
        assert metric(port, LOG_RESETS_TOTAL) == PARTITIONS
        wait_for(lambda: "gone" not in readyz(port)[1] and "again from the start" not in readyz(port)[1], 30, w, port)
    finally:
        w.terminate()
        assert w.wait(30) == 0
    requests, _rows, gaps = drained(kafka, store, tmp_path)
    assert requests == 6_000  # 4,000 read before the deletion, the new log's 2,000 after it: each once
    assert [(q, o) for _t, q, o, _d in gaps] == [(q, 1_000) for q in range(PARTITIONS)]
    lines = reset_lines(log_path)
    assert len(lines) == PARTITIONS and all("lr.requests partition" in line and "1,000" in line for line in lines)
    assert "lr.requests: the topic is gone" in open(log_path).read()


def test_a_worker_reading_a_reset_partition_again_is_not_ready(tmp_path):
    """/readyz says not ready, naming the partition, from the reset until it is read to its end."""
    from tailwatch.streams.tiers import WorkerSettings, build

    w = build(WorkerSettings(kafka=KafkaSettings(topic_prefix="lr."), store_path=str(tmp_path / "s.duckdb"),
                             http_port=free_port()))
    w.source.assigned_at = time.monotonic()
    w.source.resetting[("lr.requests", 2)] = judge("lr.requests", 2, 1_000, 0, 250)
    ready, why = w.readiness()
    assert not ready and "lr.requests partition 2 again from the start" in why
    del w.source.resetting[("lr.requests", 2)]
    assert "again from the start" not in w.readiness()[1]


# ---- the source's own steps around a restart --------------------------------------------------------
class FromReadPosition:
    """Where a partition taken again starts: its read position, as a worker's stored offsets say."""

    def __init__(self):
        self.taken_away: set[tuple[str, int]] = set()

    def start_offsets(self, source, partitions):
        return {(t, q): source.next_offsets.get((t, q)) for t, qs in partitions.items() for q in qs}

    def revoked(self, source, topic, partition):
        self.taken_away.add((topic, partition))


def own_source(kafka: KafkaSettings, resets: list) -> tuple[KafkaSource, FromReadPosition]:
    source = KafkaSource(kafka, [kafka.topic("requests")], [], "g", on_log_reset=resets.append,
                         consumer_config=lambda: dict(CONSUMER_CONFIG))
    policy = FromReadPosition()
    source.start(policy)
    return source, policy


def read(source: KafkaSource, seen: dict[int, set[int]], until, timeout_s: float, tick: bool = True) -> None:
    """Consume (and tick) until `until()`; each record read goes into `seen`: its number → its
    partitions' offsets it was read at."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, f"timed out: {sum(len(o) for o in seen.values())} records read"
        for batch in source.consume(500, 0.05).values():
            for m in batch:
                seen.setdefault(int(json.loads(m.value())["event_id"][2:]), set()).add(m.offset())
        if tick:
            source.tick(time.monotonic())


@pytest.mark.timeout(120)
def test_a_topic_id_learned_while_the_partitions_are_revoked_is_judged_when_they_come_back(own_broker):
    """A restart empties the group too: the partitions are revoked and taken again, each at its
    stored position. The new id, learned while the source owned none, must still send each
    back to the start of the new log, not to its stored position 1,000 there."""
    kafka = KafkaSettings(bootstrap_servers=own_broker.bootstrap, topic_prefix="lr.")
    topic = kafka.topic("requests")
    ensure_topics(kafka, PARTITIONS)
    publish(kafka, 0, 4_000)
    resets, seen = [], {}
    source, policy = own_source(kafka, resets)
    try:
        read(source, seen, lambda: len(seen) == 4_000 and topic in source.topic_ids, 60)
        old_id = source.topic_ids[topic]
        assert {source.next_offsets[(topic, q)] for q in range(PARTITIONS)} == {1_000}
        restart(own_broker, kafka)
        publish(kafka, 10_000, 5_000)  # offsets 0..1,249 a partition
        read(source, seen, lambda: len(policy.taken_away) == PARTITIONS, 60, tick=False)
        assert not any(source.assigned.values())  # the group lost: nothing owned until it assigns again
        source.TOPIC_IDS_EVERY_S = 0.2
        deadline = time.monotonic() + 30
        while source.topic_ids.get(topic) in (None, old_id):  # no consume: nothing is taken back meanwhile
            assert time.monotonic() < deadline, "the cluster did not name the topic's new id"
            source.tick(time.monotonic())
            time.sleep(0.1)
        assert not resets  # nothing owned, nothing judged yet
        read(source, seen, lambda: all(i in seen for i in range(10_000, 15_000)), 30)
    finally:
        source.close()
    # Stored 1,000, or up to 1,250 where the new log's records past 1,000 were fetched before the
    # revocation (as many as had been published by then: 1,249 has been seen).
    assert sorted((r.partition, r.reason) for r in resets) == [(q, TOPIC_RECREATED) for q in range(PARTITIONS)]
    assert all(1_000 <= r.stored_offset <= 1_250 for r in resets), [r.stored_offset for r in resets]
    assert all(seen[i] == {(i - 10_000) // PARTITIONS} for i in range(10_000, 15_000))  # each at its offset


@pytest.mark.timeout(120)
def test_topic_ids_the_cluster_does_not_name_for_long_are_said_once(own_broker, caplog):
    kafka = KafkaSettings(bootstrap_servers=own_broker.bootstrap, topic_prefix="lr.")
    ensure_topics(kafka, PARTITIONS)
    resets, seen = [], {}
    source, _policy = own_source(kafka, resets)
    source.TOPIC_IDS_EVERY_S, source.DESCRIBE_TIMEOUT_S, source.IDS_UNCHECKED_WARN_S = 0.2, 0.5, 2.0
    said = lambda what: [r for r in caplog.records if what in r.getMessage() and r.levelname == "WARNING"]  # noqa: E731
    caplog.set_level("WARNING", logger="tailwatch.source")
    try:
        # Stopped once the partitions are owned: a consumer still joining its group when the broker
        # goes away can abort in librdkafka's Python binding (CallState_get), another matter.
        read(source, seen, lambda: kafka.topic("requests") in source.topic_ids and any(source.assigned.values()), 30)
        own_broker.stop()
        read(source, seen, lambda: said("cannot ask the cluster for the ids"), 30)
        stop_at = time.monotonic() + 3
        read(source, seen, lambda: time.monotonic() > stop_at, 10)  # failing on: said once, not at each ask
        assert len(said("cannot ask the cluster for the ids")) == 1
        line = said("cannot ask the cluster for the ids")[0].getMessage()
        assert "lr.requests" in line and "not seen" in line
        own_broker.start()
        read(source, seen, lambda: said("names the ids of"), 30)
    finally:
        source.close()
    assert len(said("cannot ask the cluster for the ids")) == 1


# The broker stops while the worker's consumer is still joining its group; the process runs in
# a child of its own, since what failed here was the process itself (SIGABRT).
BROKER_GONE_WHILE_JOINING = """
import sys, time
from tailwatch_dev.broker import CONSUMER_CONFIG, EmbeddedBroker, free_port
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
from tailwatch.streams.source import KafkaSource

class Policy:
    def start_offsets(self, source, parts):
        return {}

    def revoked(self, *args):
        pass

b = EmbeddedBroker(port=free_port())
b.start()
k = KafkaSettings(bootstrap_servers=b.bootstrap, topic_prefix="lr.")
ensure_topics(k, 4)
s = KafkaSource(k, [k.topic("requests")], [], "g", consumer_config=lambda: dict(CONSUMER_CONFIG))
s.start(Policy())
began = time.monotonic()
while time.monotonic() - began < 0.3:
    s.consume(500, 0.05)
    s.tick(time.monotonic())
b.stop()
began = time.monotonic()
while time.monotonic() - began < 15:
    s.consume(500, 0.05)
    s.tick(time.monotonic())
print("still running", flush=True)
"""


@pytest.mark.timeout(120)
def test_a_broker_gone_while_the_worker_joins_its_group_does_not_abort_it(tmp_path):
    root = Path(__file__).parents[1]
    r = subprocess.run([sys.executable, "-c", BROKER_GONE_WHILE_JOINING], capture_output=True, text=True, timeout=90,
                       cwd=root, env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'dev'}"})
    assert r.returncode == 0 and "still running" in r.stdout, (r.returncode, r.stderr[-2000:])
