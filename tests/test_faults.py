"""Faults that used to stop or falsify the worker, each pinned by a test: an oversized
record, an output topic that refuses a record, a partition of nothing but poison, a
partition that goes silent, and a partition the group has handed to someone else. Those
where Kafka's behaviour is the point (a refusal, a group, an unreachable broker) run on the
real broker, the others on topics in memory (streams/memory_source.py). The randomised mix
of all of them is tests/test_chaos.py.
"""

import hashlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
import uuid

import duckdb
import pytest
from confluent_kafka import Consumer, Producer

from tailwatch.conventions import STATE_BYTES
from tailwatch.streams.memory_source import MemoryTopics
from tailwatch.streams.runtime import NotDrained, Runtime
from tailwatch.streams.tiers import WorkerSettings, build
from tailwatch.streams.topic_sink import TopicSink
from tests.test_pipeline import read_topic

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, on a minute boundary
MINUTE_MS = 60_000


def request(i: int, ts_ms: int, tenant: str = "acme") -> bytes:
    return json.dumps({"schema": "request.v1", "event_id": f"e-{i}", "ts": ts_ms, "tenant": tenant, "model": "m",
                       "workload": "llm", "status": "ok", "e2e_ms": 100.0 + i % 50, "output_tokens": 10}).encode()


def produce(kafka, placed: list[tuple[int, bytes]], topic_suffix: str = "requests") -> None:
    """(partition, value) records, in order, by a producer that accepts records up to 5 MB
    (or to topics in memory)."""
    if isinstance(kafka, MemoryTopics):
        for part, value in placed:
            kafka.produce(kafka.topic(topic_suffix), value, key=b"k", partition=part)
        return
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "message.max.bytes": 5_000_000, "linger.ms": 5})
    for part, value in placed:
        p.produce(kafka.topic(topic_suffix), value, key=b"k", partition=part)
    assert p.flush(30) == 0


def settings(kafka, store, **kw) -> WorkerSettings:
    kw.setdefault("group_id", f"g-{uuid.uuid4().hex[:6]}")
    kw.setdefault("http_port", None)
    if isinstance(kafka, MemoryTopics):
        kafka = kafka.settings
    return WorkerSettings(kafka=kafka, store_path=str(store), checkpoint_interval_s=0.2, **kw)


def worker(kafka, store, tier: str = "all", **kw) -> Runtime:
    """A worker with `settings` on Kafka, or on topics in memory."""
    return build(settings(kafka, store, **kw), tier, connector=kafka if isinstance(kafka, MemoryTopics) else None)


def run_live(kafka, store, until, timeout_s: float = 40.0, **kw) -> Runtime:
    """A live worker (no --until-idle) in a thread, stopped once `until(worker)` holds."""
    w = worker(kafka, store, **kw)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    deadline = time.time() + timeout_s
    while time.time() < deadline and not until(w):
        time.sleep(0.1)
    w.stop()
    t.join(30)
    assert not t.is_alive()
    return w


def test_an_oversized_record_is_dead_lettered_bounded_and_the_worker_goes_on(memory, tmp_path):
    big = request(0, T0_MS)[:-1] + b', "endpoint": "' + b"x" * 2_000_000 + b'"}'
    produce(memory, [(0, request(1, T0_MS)), (0, big), (0, request(2, T0_MS + 1000))])
    store = tmp_path / "tw.duckdb"
    for _ in range(2):  # and a restart reads past it again, no crash loop
        w = worker(memory, store, until_idle_s=0)
        assert w.run() == 0
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT reason, size_bytes, sha256 FROM dead_letter").fetchall() == [
        ("oversized", len(big), hashlib.sha256(big).hexdigest())]
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == 2
    (envelope,) = read_topic(memory, "deadletter", 1)
    letter = json.loads(envelope)
    assert len(envelope) < 100_000 and letter["schema"] == "deadletter.v2" and letter["raw_truncated"] is True
    assert letter["size_bytes"] == len(big) and letter["sha256"] == hashlib.sha256(big).hexdigest()


def test_a_copy_kafka_refuses_is_counted_and_the_store_keeps_it(kafka, tmp_path):
    # A producer limit below the envelope's size: every dead letter is refused by Kafka.
    refusing = type(kafka)(kafka.bootstrap_servers, kafka.topic_prefix, {"message.max.bytes": "1000"})
    produce(kafka, [(0, request(1, T0_MS)), (0, b"{" + b"x" * 5000)])
    store = tmp_path / "tw.duckdb"
    w = build(settings(refusing, store, until_idle_s=0, publish_sli=False))
    assert w.run() == 0
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT reason FROM dead_letter").fetchall() == [("malformed_json",)]
    failures = sum(s.value for m in w.metrics.publish_failures.collect() for s in m.samples if s.name.endswith("_total"))
    assert failures == 1


def test_a_partition_of_only_poison_does_not_hold_minutes_open(memory, tmp_path):
    good = [(0, request(i, T0_MS + i * 10_000)) for i in range(60)]  # ten minutes in partition 0
    poison = [(1, b"not json"), (1, b"\xff\xfe"), (1, b'{"schema": "request.v1"}')]
    produce(memory, good + poison)
    w = run_live(memory, tmp_path / "tw.duckdb", lambda w: w.buckets_closed >= 4)
    assert w.buckets_closed >= 4, "minutes stayed open behind a partition that holds only invalid records"


def test_a_silent_partition_stops_holding_minutes_after_the_idle_timeout(memory, tmp_path):
    busy = [(0, request(i, T0_MS + i * 10_000, "a")) for i in range(90)]  # 15 minutes
    quiet = [(1, request(1000 + i, T0_MS + i * 10_000, "b")) for i in range(12)]  # then silent after 2
    produce(memory, quiet + busy)
    store = tmp_path / "tw.duckdb"
    w = run_live(memory, store, lambda w: w.buckets_closed >= 8, idle_timeout_s=60.0)
    assert w.buckets_closed >= 8
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT count(*) FROM dead_letter").fetchone()[0] == 0


def test_a_partition_owned_elsewhere_holds_minutes_open_and_nothing_turns_late(kafka, tmp_path):
    group = f"g-{uuid.uuid4().hex[:6]}"
    # Another member of the group (a worker that crashed but has not expired, or a second
    # worker) owns partition 1 while ours reads partition 0 to its end.
    other = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group, "session.timeout.ms": 6000})
    got = threading.Event()
    other.subscribe([kafka.topic("requests"), kafka.topic("gpu")], on_assign=lambda c, parts: got.set())
    stop = threading.Event()

    def hold():
        while not stop.is_set():
            other.poll(0.2)
    holder = threading.Thread(target=hold, daemon=True)
    deadline = time.time() + 30
    while not got.is_set() and time.time() < deadline:
        other.poll(0.2)
    holder.start()
    events = [(i % 2, request(i, T0_MS + i * 5_000, "ab"[i % 2])) for i in range(240)]  # 20 minutes, both partitions
    produce(kafka, events)
    store = tmp_path / "tw.duckdb"
    w = build(settings(kafka, store, group_id=group, until_idle_s=2.0, drain_timeout_s=3.0))
    with pytest.raises(NotDrained, match=r"requests partitions \[\d\] are not assigned"):
        w.run()
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT count(*) FROM sli_minute").fetchone()[0] == 0  # nothing closed on half the log
    con.close()
    stop.set()
    holder.join(5)
    other.close()  # leaves the group: partition 1 comes to our worker
    w = build(settings(kafka, store, group_id=group, until_idle_s=2.0, drain_timeout_s=30.0))
    assert w.run() == 0
    # Both members left within a second, the leader while the group was rebalancing: the
    # embedded broker then names a departed leader for good, and only the worker's rescue
    # (ingest/broker.py rescue_wedged_group) gets it a partition again.
    assert w.metrics.group_rescues._value.get() >= 1
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == 240
    assert con.execute("SELECT count(*) FROM dead_letter").fetchone()[0] == 0


def test_a_stop_while_kafka_takes_no_copies_commits_no_minute_past_them(kafka, tmp_path):
    """The broker that leads tw.sli is gone while the one leading tw.requests is not: the
    worker reads and closes minutes, and Kafka takes none of their copies. Told to stop, it
    leaves within a container's grace period (30 s) and commits no minute whose copy Kafka
    did not take; the next start sends them all. Requests from a public trace."""
    import msgspec

    from tailwatch.ingest.kafka import KafkaSettings, make_producer
    from tailwatch_dev.trace import TraceReplay
    from tests.conftest import free_port
    from tests.test_late_backlog import TRACE

    events = list(TraceReplay(TRACE, minutes=20, seed=5).events())
    enc = msgspec.json.Encoder()
    produce(kafka, [(i % 2, enc.encode(e)) for i, e in enumerate(events)])
    store = tmp_path / "tw.duckdb"
    w = build(settings(kafka, store))
    # Where the copies go, nobody answers (a real librdkafka producer; a port nobody listens on).
    w.sink(TopicSink).producer = make_producer(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    deadline = time.time() + 60
    while time.time() < deadline and w.events_seen < len(events):
        time.sleep(0.1)
    assert w.events_seen == len(events)
    time.sleep(1.0)  # a checkpoint with closed minutes now waits for their copies
    stopped = time.monotonic()
    w.stop()
    t.join(60)
    assert not t.is_alive()
    took_s = time.monotonic() - stopped
    assert took_s < 25.0, took_s  # 41 s before: 30 s flushing, then 10 s more in closing
    assert w.buckets_closed > 0
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT count(*) FROM sli_minute").fetchone()[0] == 0
    con.close()
    # The next start, with Kafka taking them: every request lands, and every minute's copy.
    assert build(settings(kafka, store, until_idle_s=0)).run() == 0
    con = duckdb.connect(str(store), read_only=True)
    requests, rows = con.execute("SELECT sum(requests), count(*) FROM sli_minute").fetchone()
    con.close()
    assert requests == len(events)
    copies = [json.loads(v) for v in read_topic(kafka, "sli", rows)]
    requests_copies = {(c["window_start"], c["tenant"], c["model"], c["zone"], c["pool"], c["deployment"])
                       for c in copies if c["schema"] == "requests_minute.v1"}
    assert len(requests_copies) == rows


@pytest.mark.slow
def test_a_broker_down_is_a_log_line_a_window_not_twenty_a_second(caplog, monkeypatch):
    """librdkafka logs every failed connection: with nobody on the port, one consumer tried 19
    times a second. The worker's log gets the first, then one per window that counts the rest."""
    import logging

    from tailwatch.ingest import kafka_log
    from tailwatch.ingest.kafka import KafkaSettings, make_consumer
    from tests.conftest import free_port

    monkeypatch.setattr(kafka_log, "REPEAT_WINDOW_S", 1.5)
    caplog.set_level(logging.DEBUG, logger="tailwatch.kafka")
    consumer = make_consumer(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"), f"g-{uuid.uuid4().hex[:6]}")
    consumer.subscribe(["tw.requests"])
    began = time.monotonic()
    while time.monotonic() - began < 4.5:
        consumer.consume(100, 0.5)
    consumer.close()
    refused = [r.getMessage() for r in caplog.records if r.name == "tailwatch.kafka" and "Connection refused" in r.getMessage()]
    assert 2 <= len(refused) <= 4, refused
    folded = [int(m.group(1).replace(",", "")) for m in (re.search(r"\(([\d,]+) more like it", t) for t in refused) if m]
    assert folded and max(folded) >= 10, refused


def test_repeats_fold_by_kind_and_say_how_many():
    import logging

    from tailwatch.ingest.kafka_log import RepeatFold

    now = [0.0]
    fold = RepeatFold(lambda: 60.0, clock=lambda: now[0])

    def say(text: str) -> str | None:
        record = logging.LogRecord("tailwatch.kafka", logging.ERROR, __file__, 1, "%s", (text,), None)
        return record.getMessage() if fold.filter(record) else None

    assert say("broker 10.0.0.1:9092 down after 3ms") == "broker 10.0.0.1:9092 down after 3ms"
    assert say("group rebalanced") == "group rebalanced"  # another kind: its own first line
    for ms in range(5):
        now[0] += 1.0
        assert say(f"broker 10.0.0.1:9092 down after {ms}ms") is None
    now[0] = 61.0
    assert say("broker 10.0.0.2:9092 down after 7ms") == "broker 10.0.0.2:9092 down after 7ms (5 more like it in the last 61 s)"
    assert say("group rebalanced") == "group rebalanced"
    # librdkafka's own folding, said inside the line: the same kind, and its count is counted.
    now[0] = 200.0
    assert say("Connect to 127.0.0.1:1 failed (after 0ms in state CONNECT)") is not None
    now[0] = 201.0
    assert say("Connect to 127.0.0.1:1 failed (after 0ms in state CONNECT, 3 identical error(s) suppressed)") is None
    now[0] = 261.0
    assert say("Connect to 127.0.0.1:1 failed (after 5ms in state CONNECT)") == (
        "Connect to 127.0.0.1:1 failed (after 5ms in state CONNECT) (4 more like it in the last 61 s)")


def test_an_idle_worker_serves_its_producer_log_queue(caplog, monkeypatch):
    """librdkafka queues a client's log lines until the client is polled: the worker's loop
    polls its producer even when it sends nothing, so an outage's lines neither pile up in
    memory nor go unseen."""
    import logging

    from tailwatch.ingest import kafka_log
    from tailwatch.ingest.kafka import KafkaSettings
    from tailwatch.streams.metrics import WorkerMetrics
    from tailwatch.streams.topic_sink import TopicSink
    from tests.conftest import free_port

    monkeypatch.setattr(kafka_log, "REPEAT_WINDOW_S", 0.5)
    caplog.set_level(logging.DEBUG, logger="tailwatch.kafka")
    sink = TopicSink(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"), WorkerMetrics(), stopping=lambda: True)
    sink.send("tw.sli", b"{}")  # something to deliver, so the producer dials the broker
    began = time.monotonic()
    while time.monotonic() - began < 3.0 and not any("producer" in r.getMessage() for r in caplog.records):
        sink.tick()
        time.sleep(0.1)
    said = [r.getMessage() for r in caplog.records if r.name == "tailwatch.kafka"]
    assert any("rdkafka#producer" in t and "Connection refused" in t for t in said), said
    sink.gave_up = True  # nothing to wait for in closing
    sink.close()


def test_a_stopping_worker_whose_sink_queue_is_full_gives_up_instead_of_hanging(monkeypatch):
    """The sink's queue is bounded; with the broker gone it fills, and `send` waits for room.
    A worker told to stop waits STOP_FLUSH_S for it, as a flush does, then leaves the
    checkpoint uncommitted; until then (and while not stopping) it keeps waiting."""
    from tailwatch.ingest.kafka import KafkaSettings
    from tailwatch.streams import topic_sink
    from tailwatch.streams.metrics import WorkerMetrics
    from tailwatch.streams.topic_sink import TopicSink, Undelivered
    from tests.conftest import free_port

    monkeypatch.setattr(topic_sink, "STOP_FLUSH_S", 1.0)
    monkeypatch.setattr(TopicSink, "QUEUE_MAX_KBYTES", 64)
    stopping = {"now": False}
    sink = TopicSink(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"), WorkerMetrics(),
                     stopping=lambda: stopping["now"])
    record = b"x" * 4096
    sent = 0
    with pytest.raises(BufferError):  # the queue is full at 64 KiB of 4 KiB records
        while sent <= 100:
            sink.producer.produce("tw.sli", record)
            sent += 1
    assert 8 <= sent <= 16, f"the queue took {sent} records of 4 KiB against a bound of 64 KiB"
    stopping["now"] = True
    began = time.monotonic()
    with pytest.raises(Undelivered):
        sink.send("tw.sli", record)
    assert 0.9 <= time.monotonic() - began < 5.0
    assert sink.gave_up
    sink.close()


def _hold_store(path, seconds: float):
    """Another process that opens the store to read and keeps it `seconds` (a long query)."""
    import subprocess
    import sys

    code = ("import sys, time; from tailwatch.store.connection import connect; con = connect(sys.argv[1], read_only=True, wait_s=30); "
            "print('held', flush=True); time.sleep(float(sys.argv[2])); con.close()")
    reader = subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "held"
    return reader


def _trace_halves(kafka):
    import msgspec

    from tailwatch_dev.trace import TraceReplay
    from tests.test_late_backlog import TRACE

    events = list(TraceReplay(TRACE, minutes=20, seed=5).events())
    enc = msgspec.json.Encoder()
    placed = [(i % 2, enc.encode(e)) for i, e in enumerate(events)]
    return events, placed[:len(placed) // 2], placed[len(placed) // 2:]


@pytest.mark.slow
def test_a_reader_holding_the_store_past_a_minute_pauses_the_worker_and_does_not_stop_it(kafka, tmp_path, caplog):
    """A long query (`tailwatch sql`, a report, a DuckDB shell) holds the store's file between
    two of the worker's releases. The worker cannot checkpoint meanwhile; it used to give up
    after 60 s and exit (measured: exit 2 after 63 s under a 75 s reader). It waits, warning,
    and carries on where it was. Requests from a public trace."""
    import logging

    from tailwatch.store.connection import StoreSession

    events, first, second = _trace_halves(kafka)
    produce(kafka, first)
    store = tmp_path / "tw.duckdb"
    assert build(settings(kafka, store, until_idle_s=0)).run() == 0
    produce(kafka, second)
    caplog.set_level(logging.WARNING, logger="tailwatch.store")
    reader = _hold_store(store, 65.0)
    StoreSession.LOCK_WARN_S = 20.0
    try:
        w = build(settings(kafka, store, until_idle_s=2.0))
        assert w.run() == 0  # started once the reader let go, and drained
    finally:
        StoreSession.LOCK_WARN_S = 60.0
        reader.wait(10)
    waits = [r.getMessage() for r in caplog.records if "held by another process" in r.getMessage()]
    assert len(waits) >= 2 and "the worker waits for it" in waits[0], waits
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == len(events)


@pytest.mark.slow
def test_a_stop_while_a_reader_holds_the_store_leaves_in_seconds_and_loses_nothing(memory, tmp_path, caplog, monkeypatch):
    """Told to stop while a reader holds the file and a checkpoint waits for it, the worker
    waits STOP_WAIT_S more, then leaves without that checkpoint; the next start resumes from
    the one before, and every request lands once."""
    import logging

    from tailwatch.store.connection import StoreSession

    events, first, second = _trace_halves(memory)
    produce(memory, first)
    store = tmp_path / "tw.duckdb"
    monkeypatch.setattr(StoreSession, "STOP_WAIT_S", 2.0)
    caplog.set_level(logging.ERROR, logger="tailwatch.worker")
    w = worker(memory, store, store_release_s=0.5)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    deadline = time.time() + 60
    while time.time() < deadline and w.events_seen < len(first):
        time.sleep(0.1)
    time.sleep(1.0)
    reader = _hold_store(store, 30.0)  # taken while the worker lets go of the file
    try:
        produce(memory, second)
        time.sleep(3.0)  # a checkpoint of the second half now waits for the file
        stopped = time.monotonic()
        w.stop()
        t.join(30)
        assert not t.is_alive() and time.monotonic() - stopped < 10.0
    finally:
        reader.kill()
        reader.wait(10)
    said = [r.getMessage() for r in caplog.records if "held by another process" in r.getMessage()]
    assert said and "stopping without writing to it" in said[0], said
    # The next start resumes from the last checkpoint: every request, once.
    assert worker(memory, store, until_idle_s=0).run() == 0
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == len(events)


def test_the_state_is_measured_as_often_as_settings_say(memory, tmp_path):
    # 2,000 events of 200 tenants in one minute that stays open (nothing later moves the
    # frontier past it).
    produce(memory, [(0, request(i, T0_MS + i * 25, tenant=f"t{i % 200}")) for i in range(2000)])

    def measured(w) -> float:
        return w.metrics.registry.get_sample_value(STATE_BYTES, {"component": "open_minutes"}) or 0.0

    # The default walks the state at start, then once a minute: a short run keeps the start's.
    seldom = run_live(memory, tmp_path / "seldom.duckdb", lambda w: w.events_seen >= 2000, timeout_s=20.0)
    at_start = measured(seldom)
    assert seldom.events_seen == 2000 and at_start > 0
    often = run_live(memory, tmp_path / "often.duckdb", lambda w: measured(w) > at_start + 50_000, state_every_s=0.0)
    assert often.events_seen == 2000 and measured(often) > at_start + 50_000
    assert measured(seldom) == at_start


@pytest.mark.slow
def test_healthz_says_when_the_api_view_stands_on_less_than_was_read(kafka, tmp_path):
    # Read in batches of 100, so the view's first rebuild comes before the last event.
    produce(kafka, [(0, request(i, T0_MS + i * 25)) for i in range(2000)])
    # The view rebuilt once an hour at most, and when the worker turns ready: after that it
    # falls behind what is read and says so.
    behind = worker(kafka, tmp_path / "behind.duckdb", http_port=0, batch_size=100, signals_refresh_s=3600.0)
    t = threading.Thread(target=behind.run, daemon=True)
    t.start()
    try:
        deadline = time.time() + 40
        while time.time() < deadline and not (behind.events_seen >= 2000 and behind.readiness()[0]):
            time.sleep(0.1)
        time.sleep(0.5)
        assert behind.readiness()[0] and behind.health()["view_current"] is True
        produce(kafka, [(0, request(i, T0_MS + i * 25)) for i in range(2000, 2500)])
        while time.time() < deadline and behind.events_seen < 2500:
            time.sleep(0.1)
        assert behind.events_seen == 2500 and behind.health()["view_current"] is False
    finally:
        behind.stop()
        t.join(30)
    # At the default pace it catches up with what was read.
    current = run_live(kafka, tmp_path / "current.duckdb",
                       lambda w: w.events_seen >= 2500 and w.health()["view_current"], http_port=0, batch_size=100)
    assert current.events_seen == 2500 and current.health()["view_current"] is True
    # A worker without the signal API (tier 1) has no view to speak of.
    assert "view_current" not in build(settings(kafka, tmp_path / "t1.duckdb"), tier="1").health()


@pytest.mark.memory
def test_a_worker_turns_ready_only_with_a_view_of_what_it_caught_up_to(memory, tmp_path):
    # The view rebuilt once an hour at most, so a rebuild at its own pace cannot hide the race:
    # a pool first seen in the catch-up is answered for as soon as /readyz says ready.
    produce(memory, [(0, request(i, T0_MS + i * 25)[:-1] + b', "pool": "llm-new"}') for i in range(2000)])
    w = worker(memory, tmp_path / "tw.duckdb", http_port=0, batch_size=100, signals_refresh_s=3600.0)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        deadline, status = time.time() + 40, 0
        while time.time() < deadline and status != 200:
            port = w.http.port if w.http is not None else None
            if port:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                        status = r.status
                except urllib.error.HTTPError as e:
                    status = e.code
            time.sleep(0.05)
        assert status == 200 and w.events_seen == 2000
        # The answer stands on everything read: not "an input is behind" (the view of before the
        # catch-up), but what the data says: requests, and no GPU samples to size the pool on.
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/autoscale/llm-new", timeout=5)
        said = json.loads(answer.value.read())
        assert answer.value.code == 503 and said["reason"] == "no_data", said
        assert "no GPU samples for pool llm-new" in said["error"], said
    finally:
        w.stop()
        t.join(30)
