"""Simulated events → topics → worker → DuckDB store, checked against the simulator.

The topics are in memory (streams/memory_source.py): what is checked here is the worker's
logic, not Kafka's. The helpers take Kafka's settings or topics in memory alike.
"""

import json
import threading
import urllib.request
import uuid

import duckdb
import msgspec
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from tailwatch.ingest.producer import EventPublisher
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.streams.memory_source import MemoryTopics
from tailwatch.streams.runtime import Runtime
from tailwatch.streams.tiers import WorkerSettings, build
from tailwatch.ingest.kafka import make_producer

from tests.test_validate import CORPUS


def worker(kafka, store_path, tier: str = "all", **kw) -> Runtime:
    """A worker on `kafka`: Kafka's settings, or topics in memory (MemoryTopics)."""
    memory = kafka if isinstance(kafka, MemoryTopics) else None
    settings = WorkerSettings(kafka=memory.settings if memory else kafka, store_path=str(store_path),
                              **{"group_id": f"g-{uuid.uuid4().hex[:6]}", "http_port": None, **kw})
    return build(settings, tier, connector=memory)


def run_worker(kafka, store_path, **kw) -> Runtime:
    # Every event is produced before the worker starts: `until_idle_s=0` exits as soon as each
    # partition is read to its end (the exact counts below fail if it left anything unread).
    w = worker(kafka, store_path, **{"until_idle_s": 0, **kw})
    assert w.run() == 0
    return w


def publish(kafka, events):
    if isinstance(kafka, MemoryTopics):
        pub = EventPublisher(kafka.settings, producer=kafka)
    else:
        pub = EventPublisher(kafka)
    pub.publish_events(events)
    pub.close()
    return pub.report


def send_raw(kafka, topic_suffix, values, key=b"k"):
    p = kafka if isinstance(kafka, MemoryTopics) else make_producer(kafka)
    for v in values:
        p.produce(kafka.topic(topic_suffix), v, key=key)
    assert p.flush(30) == 0


def test_store_counts_match_the_simulator_exactly(memory, tmp_path):
    sim = FleetSimulator("mixed-fleet", minutes=20, seed=11, rate_scale=0.5)
    events = list(sim.events())
    publish(memory, events)
    store = tmp_path / "tw.duckdb"
    w = run_worker(memory, store)
    con = duckdb.connect(str(store), read_only=True)
    t = sim.totals
    got = con.execute("""SELECT sum(requests), sum(ok), sum(errors), sum(timeouts), sum(cancelled), sum(retries),
                                sum(turns), sum(successful_turns), sum(output_tokens) FROM sli_minute""").fetchone()
    assert got == (t.requests, t.by_status["ok"], t.by_status["error"], t.by_status["timeout"],
                   t.by_status["cancelled"], t.retries, t.turns, t.successful_turns, t.output_tokens)
    assert con.execute("SELECT sum(samples) FROM gpu_minute").fetchone()[0] == t.gpu_samples
    # One row per slice and minute, 20 minutes, and histograms that add up to their counts.
    assert con.execute("SELECT count(DISTINCT window_start) FROM sli_minute").fetchone()[0] == 20
    dup = con.execute("""SELECT count(*) FROM (SELECT window_start, tenant, model, model_version, zone, workload,
                         traffic_class, deployment, pool, language, voice, count(*) c FROM sli_minute GROUP BY ALL HAVING c > 1)""").fetchone()[0]
    assert dup == 0
    mismatch = con.execute("""SELECT count(*) FROM sli_minute
                              WHERE list_sum([h.n for h in e2e_ms_hist]) != requests - cancelled""").fetchone()[0]
    assert mismatch == 0
    # Inter-token latency, stream endings and stage timings reach the store whole.
    streams = con.execute("""SELECT sum(streams), sum(streams_completed), sum(streams_cut), sum(streams_timed_out),
                                    sum(streams_cancelled), sum(list_sum([h.n for h in inter_token_ms_hist])),
                                    sum(list_sum([h.n for h in stages_hist])) FROM sli_minute""").fetchone()
    f = t.finish_reasons
    assert streams == (sum(f.values()), f.get("stop", 0) + f.get("length", 0) + f.get("content_filter", 0),
                       f.get("server_cut", 0), f.get("timeout", 0), f.get("client_cancel", 0), t.inter_token_values,
                       t.phase_samples)
    assert t.phase_samples > 0 and t.inter_token_values > 0
    assert con.execute("SELECT count(*) FROM dead_letter").fetchone()[0] == 0
    assert w.metrics.events.labels(memory.topic("requests"), "accepted")._value.get() == t.requests
    # Fields the producer left out take the schema's defaults (the simulator omits them).
    by_class = dict(con.execute("SELECT traffic_class, sum(requests) FROM sli_minute GROUP BY ALL").fetchall())
    expected_classes = {"realtime", "batch"}
    assert set(by_class) == expected_classes
    assert con.execute("SELECT count(*) FROM sli_minute WHERE deployment IS NULL OR model_version IS NULL").fetchone()[0] == 0
    # Every closed bucket was also published to tw.sli for the derived streams.
    rows = con.execute("SELECT (SELECT count(*) FROM sli_minute) + (SELECT count(*) FROM gpu_minute)").fetchone()[0]
    published = read_topic(memory, "sli", rows)
    assert len(published) == rows
    first = json.loads(published[0])
    assert first["schema"] in ("requests_minute.v1", "gpu_minute.v1") and "window_start" in first


def read_topic(kafka, suffix, expected, partitions=2):
    if isinstance(kafka, MemoryTopics):
        return kafka.values(kafka.topic(suffix))
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "read-" + uuid.uuid4().hex[:6]})
    c.assign([TopicPartition(kafka.topic(suffix), p, OFFSET_BEGINNING) for p in range(partitions)])
    values = []
    for _ in range(60):
        values += [m.value() for m in c.consume(5000, timeout=0.5) if m.error() is None]
        if len(values) >= expected:
            break
    c.close()
    return values


def test_bad_records_are_dead_lettered_with_reason_and_worker_goes_on(memory, tmp_path):
    sim = FleetSimulator("quiet", minutes=3, seed=3, rate_scale=0.2)
    events = [e for e in sim.events() if e.schema == "request.v1"]
    good = [msgspec.json.encode(e) for e in events]
    bad = [raw for raw, _ in CORPUS]
    mixed = good[: len(good) // 2] + bad + good[len(good) // 2:]
    send_raw(memory, "requests", mixed)
    big = msgspec.json.encode(events[0])[:-1] + b', "endpoint": "' + b"x" * 70_000 + b'"}'
    send_raw(memory, "requests", [big])
    store = tmp_path / "tw.duckdb"
    w = run_worker(memory, store)
    con = duckdb.connect(str(store), read_only=True)
    reasons = dict(con.execute("SELECT reason, count(*) FROM dead_letter GROUP BY ALL").fetchall())
    expected = {}
    for _, r in CORPUS:
        expected[r] = expected.get(r, 0) + 1
    expected["oversized"] = expected.get("oversized", 0) + 1  # the big one below
    assert reasons == expected
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == len(events)
    offsets = con.execute("SELECT source_topic, min(source_offset), max(source_offset) FROM dead_letter WHERE reason != 'oversized' GROUP BY ALL").fetchall()
    assert offsets[0][0] == memory.topic("requests")
    # The raw bytes are in the dead-letter topic, with their reason and source.
    decoded = [json.loads(v) for v in read_topic(memory, "deadletter", len(bad) + 1)]
    assert sorted(d["reason"] for d in decoded) == sorted(r for r, n in expected.items() for _ in range(n))
    assert all(d["source_topic"] == memory.topic("requests") and d["source_offset"] >= 0 for d in decoded)
    for reason, n in expected.items():
        assert w.metrics.dead_letters.labels(memory.topic("requests"), reason)._value.get() == n


def test_text_outside_the_schema_never_reaches_the_store(memory, tmp_path):
    sim = FleetSimulator("quiet", minutes=2, seed=5, rate_scale=0.1)
    events = [e for e in sim.events() if e.schema == "request.v1"]
    secret = "PROMPT-TEXT-7f3a tell me about my diagnosis"
    leaky = []
    for e in events:
        d = msgspec.to_builtins(e)
        d["prompt"] = secret
        d["transcript"] = secret
        leaky.append(json.dumps(d).encode())
    send_raw(memory, "requests", leaky)
    store = tmp_path / "tw.duckdb"
    w = run_worker(memory, store)
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == len(events)
    con.close()
    assert b"PROMPT-TEXT-7f3a" not in store.read_bytes()
    assert w.metrics.unknown_fields_dropped.labels(memory.topic("requests"))._value.get() == len(events)


def _late_log(kafka):
    sim = FleetSimulator("quiet", minutes=12, seed=9, rate_scale=0.2)
    events = [e for e in sim.events() if e.schema == "request.v1"]
    raw = [msgspec.json.encode(e) for e in events]
    redelivered = raw[:50]  # redelivered right after the first part of the log
    late = msgspec.json.encode(msgspec.structs.replace(events[0], event_id="really-late"))
    # One key, so one partition: the last records sit 12 minutes behind that partition's
    # watermark: a new event, and a copy of one its minute counted.
    send_raw(kafka, "requests", raw[:200] + redelivered + raw[200:] + [late, raw[3]])
    return events


def test_duplicate_deliveries_count_once_and_past_the_horizon_events_are_dead_lettered(memory, tmp_path):
    events = _late_log(memory)
    store = tmp_path / "tw.duckdb"
    w = run_worker(memory, store, correction_horizon_s=600.0)
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == len(events)
    assert con.execute("SELECT reason, count(*) FROM dead_letter GROUP BY ALL").fetchall() == [("too_late", 2)]
    assert w.metrics.events.labels(memory.topic("requests"), "duplicate")._value.get() == 50
    assert w.metrics.late_events.labels(memory.topic("requests"))._value.get() == 2


def test_a_late_event_within_the_horizon_corrects_its_minute_and_a_late_copy_counts_once(memory, tmp_path):
    events = _late_log(memory)
    store = tmp_path / "tw.duckdb"
    w = run_worker(memory, store)
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == len(events) + 1
    assert con.execute("SELECT count(*) FROM dead_letter").fetchone()[0] == 0
    topic = memory.topic("requests")
    assert w.metrics.events.labels(topic, "duplicate")._value.get() == 51
    # Counted in its open minute or merged into the closed one, as the checkpoints fell.
    assert (w.metrics.events.labels(topic, "accepted")._value.get()
            + w.metrics.corrected_events.labels(topic)._value.get()) == len(events) + 1
    assert w.metrics.late_events.labels(topic)._value.get() == 0


@pytest.mark.slow
def test_metrics_and_health_are_served_while_running(memory, tmp_path):
    publish(memory, FleetSimulator("quiet", minutes=2, seed=1, rate_scale=0.1).events())
    from tests.conftest import free_port

    port = free_port()
    w = worker(memory, tmp_path / "tw.duckdb", group_id="g-http", http_port=port, until_idle_s=6.0,
               store_release_s=0.5)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        import time

        deadline = time.time() + 30
        body = ""
        accepted = f'tailwatch_events_total{{outcome="accepted",topic="{memory.topic("requests")}"}}'
        while time.time() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                # The requests topic's line, not any topic's: the GPU topic's batch may land first.
                if accepted in body:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read())
        # The store can be read while the worker runs: it holds the file only to checkpoint.
        import subprocess
        import sys

        q = subprocess.run([sys.executable, "-m", "tailwatch", "sql", "SELECT count(*) AS n FROM dead_letter",
                            "--store", str(tmp_path / "tw.duckdb"), "--format", "json"], capture_output=True, text=True)
        assert t.is_alive(), "the worker should still be running during the query"
        assert q.returncode == 0 and json.loads(q.stdout) == {"n": 0}, q.stderr
    finally:
        t.join(60)
    assert health["status"] == "ok"
    for name in ("tailwatch_events_total", "tailwatch_dead_letters_total", "tailwatch_late_events_total",
                 "tailwatch_consumer_lag_messages", "tailwatch_bucket_close_delay_seconds"):
        assert name in body
    assert accepted in body


def test_a_backlog_closes_in_checkpoints_of_bounded_rows_and_the_store_is_the_same(memory, tmp_path):
    """A worker started behind a backlog closes at most about `checkpoint_max_rows` rows a
    checkpoint (its memory bound), reading nothing more until the closable minutes are closed;
    the store holds exactly what the producers sent, one row per slice and minute."""
    BOUND = 500
    sim = FleetSimulator("mixed-fleet", minutes=20, seed=12, rate_scale=0.5)
    publish(memory, list(sim.events()))
    store = tmp_path / "tw.duckdb"
    w = run_worker(memory, store, checkpoint_max_rows=BOUND, checkpoint_interval_s=30.0)
    con = duckdb.connect(str(store), read_only=True)
    t = sim.totals
    assert con.execute("SELECT sum(requests), sum(errors) FROM sli_minute").fetchone() == (
        t.requests, t.by_status["error"])
    assert con.execute("SELECT sum(samples) FROM gpu_minute").fetchone()[0] == t.gpu_samples
    assert con.execute("SELECT count(DISTINCT window_start) FROM sli_minute").fetchone()[0] == 20
    dup = con.execute("""SELECT count(*) FROM (SELECT window_start, tenant, model, model_version, zone, workload,
                         traffic_class, deployment, pool, language, voice, count(*) c FROM sli_minute GROUP BY ALL HAVING c > 1)""").fetchone()[0]
    assert dup == 0
    rows, widest = con.execute("SELECT sum(n), max(n) FROM (SELECT window_start, count(*) n FROM sli_minute GROUP BY 1)").fetchone()
    checkpoints = next(x.value for x in w.metrics.checkpoint_seconds.collect()[0].samples if x.name.endswith("_count"))
    # Every checkpoint but the drain's closes at most the bound plus one minute; the interval
    # (30 s) alone would have closed the backlog's minutes in one or two.
    assert rows > 4 * (BOUND + widest)
    assert checkpoints >= rows / (BOUND + widest), (checkpoints, rows, widest)
