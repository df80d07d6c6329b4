"""Two tiers: two `worker --tier 1` processes and tier-2 replicas, each with a store of its
own, tier-1 and replicas SIGKILLed mid-stream and restarted, give every replica the store one
`--tier all` process gives on the same log: buckets, dead letters, SLO statuses, alerts,
detections; and every replica answers the signal API alike for every pool. Real processes
on the embedded broker; the stream is the public Azure code trace (requests keyed by tenant
over 4 partitions, or unkeyed) and GPU samples (the trace's pools' replicas, and the real H100
run's moved to the trace's hour), with a poison record.
"""

from __future__ import annotations

import http.client
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import msgspec
import polars as pl
import pytest
from confluent_kafka import Producer

from tailwatch.store.connection import connect
from tailwatch.store.queries import query_frame
from tailwatch.slo.spec import DEFAULT_SLOS
from tailwatch.streams.partial_publisher import progress_topic
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, read_latest
from tailwatch.ingest.schema import GpuV1
from tests.conftest import free_port
from tests.test_alertmanager import Webhook, start_alertmanager_cluster
from tests.test_partials import azure_values, gpu_values

PARTITIONS = 4
CHUNKS = 10
# The log is published 240 times faster than the trace ran (4 trace-minutes a second): with
# the default one minute of event-time idleness a partition whose owner has read it to the
# end between two chunks would count as idle, and events after the gap would turn late,
# in one process or in tiers alike. Idleness is not what this test is about.
IDLE = "10m"
COMPARED = {
    "sli_minute": "window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool, language, voice",
    "gpu_minute": "window_start, node, gpu_index",
    "dead_letter": "source_topic, source_partition, source_offset",
    "slo_status": "window_start, slo, slice",
    "alerts": "fingerprint, fired_at",
    "detection_events": "detection_id, state, changed_at",
}


_started: list[subprocess.Popen] = []  # this test's processes (workers, Alertmanagers): see `_reap`


@pytest.fixture(autouse=True)
def _reap():
    """Whatever a test started and is still running when it ends, passed or failed, is killed:
    a failed assertion used to leave its Alertmanagers and workers running."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _eager_slos(tmp_path: Path) -> Path:
    """The default SLOs judged from their first minute: the trace is 40 minutes of a new store,
    and the alerts it fires (tickets on its 0.5% of errors) would wait hours of history under
    the young-window rule."""
    path = tmp_path / "slos-eager.yaml"
    if not path.exists():
        path.write_text(re.sub(r"(\n    min_events: \d+)", r"\1\n    young_window_share: 0%", DEFAULT_SLOS.read_text()))
    return path


def _worker(kafka, tmp_path: Path, name: str, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tailwatch", "--verbose", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
            "--topic-prefix", kafka.topic_prefix, "--http-port", "0", "--checkpoint-interval", "0.3",
            "--batch-size", "700", "--drain-timeout", "120", "--slos", str(_eager_slos(tmp_path)), *args]
    log = open(tmp_path / f"{name}.log", "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _started.append(proc)
    return proc


def _partition_of(mode: str, key: bytes, i: int, chunk: int) -> int:
    """keyed: by tenant; unkeyed: round robin; quiet: round robin over 0-2 for two chunks
    (eight trace minutes), then everything into partition 0 (3 gets poison only)."""
    if mode == "keyed":
        return sum(key) % PARTITIONS
    if mode == "quiet":
        return i % 3 if chunk < 2 else 0
    return i % PARTITIONS


def _pool_gpu_values(requests: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """GPU samples of the trace's pools over its span (two warm replicas each, every 10 s), in
    time order: a pool's answers read the replica states as well as the requests."""
    events = [msgspec.json.decode(v) for _k, v in requests]
    zones = dict(sorted({(e["pool"], e["zone"]) for e in events}))
    first, last = min(e["ts"] for e in events), max(e["ts"] for e in events)
    encode = msgspec.json.Encoder().encode
    return [(f"{pool}-n{r}".encode(), encode(GpuV1(
        schema="gpu.v1", ts=ts + r, node=f"{pool}-n{r}", gpu_index=0, zone=zone, pool=pool, gpu_sku="H100",
        util_pct=60.0, replica_state="warm", oldest_queue_age_ms=50.0, queue_depth=1, active_streams=2)))
        for ts in range(first - first % 10_000, last + 1, 10_000) for pool, zone in zones.items() for r in range(2)]


def _moved_to(values: list[tuple[bytes, bytes]], start_ms: int) -> list[tuple[bytes, bytes]]:
    """The H100 run's samples moved to start at `start_ms`: three weeks after the trace, they
    would be the newest GPU data and the view, which keeps the newest half hour, would hold
    no sample of the trace's pools."""
    docs = [msgspec.json.decode(v) for _k, v in values]
    shift = min(d["ts"] for d in docs) - start_ms
    return [(k, msgspec.json.encode({**d, "ts": d["ts"] - shift})) for (k, _v), d in zip(values, docs)]


def _publish(kafka, mode: str, done: threading.Event) -> None:
    """The log, in CHUNKS pieces a second apart, so the kills land mid-stream."""
    requests = azure_values(40)
    pools_gpu = _pool_gpu_values(requests)
    moved = _moved_to(gpu_values(), msgspec.json.decode(pools_gpu[0][1])["ts"])
    gpu = sorted(pools_gpu + moved, key=lambda kv: msgspec.json.decode(kv[1])["ts"])  # in time, as the requests
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
    for topic in (kafka.topic("requests"), kafka.topic("gpu")):  # explicit partitions need their metadata first
        deadline = time.monotonic() + 20
        while len(p.list_topics(topic, timeout=10).topics[topic].partitions) < PARTITIONS:
            assert time.monotonic() < deadline, f"{topic} has no {PARTITIONS} partitions"
            time.sleep(0.2)
    for c in range(CHUNKS):
        for i in range(c * len(requests) // CHUNKS, (c + 1) * len(requests) // CHUNKS):
            key, value = requests[i]
            p.produce(kafka.topic("requests"), value, key=key if mode == "keyed" else None,
                      partition=_partition_of(mode, key, i, c))
        for i in range(c * len(gpu) // CHUNKS, (c + 1) * len(gpu) // CHUNKS):
            p.produce(kafka.topic("gpu"), gpu[i][1], partition=i % PARTITIONS)
        if c == 3:
            p.produce(kafka.topic("requests"), b'{"schema": "request.v1", "tenant": 7', partition=3 if mode == "quiet" else 2)
        if mode == "quiet" and c == 6:
            p.produce(kafka.topic("requests"), b'{"schema": "request.v1", "pad": "' + b"x" * 300_000, partition=3)
        p.flush()
        time.sleep(1.0)
    done.set()


def logs_of(tmp_path: Path, *names: str) -> str:
    return "\n".join(line for n in names for line in (tmp_path / f"{n}.log").read_text(errors="replace").splitlines()
                     if "rdkafka" not in line)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _tables(path: Path) -> dict[str, pl.DataFrame]:
    con = connect(path, read_only=True)
    try:
        return {t: query_frame(con, f"SELECT * FROM {t} ORDER BY {keys}") for t, keys in COMPARED.items()}
    finally:
        con.close()


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", path)
        got = conn.getresponse()
        return got.status, got.read()
    except OSError:  # a restarted replica's port is not open yet
        return 0, b""
    finally:
        conn.close()


def _answers_alike(ports: list[int], paths: list[str]) -> dict[str, bytes]:
    """Each path from every replica, asked again until all agree (a replica a checkpoint
    behind the others catches up within seconds); they must."""
    answers = {}
    for path in paths:
        deadline = time.monotonic() + 60
        while len(got := {_get(port, path) for port in ports}) > 1 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert len(got) == 1, (path, got)
        status, body = got.pop()
        assert status == 200, (path, status, body)
        answers[path] = body
    return answers


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.timeout(400)
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed-by-tenant", "unkeyed"])
def test_tier2_replicas_killed_mid_stream_each_equal_one_process(broker, tmp_path, keyed):
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka, PARTITIONS)
    names = "xyz"
    stores = {n: tmp_path / n / "replica.duckdb" for n in names}  # a directory each, as on separate machines
    single = tmp_path / "single.duckdb"
    ports = {n: free_port() for n in names}
    # Every replica pages every instance of a real two-instance Alertmanager cluster.
    hook = Webhook()
    cluster = start_alertmanager_cluster(tmp_path, hook.port, size=2)
    _started.extend(proc for proc, _url in cluster)
    am_urls = [arg for _proc, url in cluster for arg in ("--alertmanager-url", url)]

    def replica(name: str) -> subprocess.Popen:
        return _worker(kafka, tmp_path, f"tier2-{name}", "--tier", "2", "--store", str(stores[name]), "--until-idle", "30",
                       "--idle-timeout", IDLE, "--http-port", str(ports[name]), *am_urls)

    done = threading.Event()
    producer = threading.Thread(target=_publish, args=(kafka, "keyed" if keyed else "unkeyed", done))
    producer.start()
    tier1 = {n: _worker(kafka, tmp_path, f"tier1-{n}", "--tier", "1", "--until-idle", "6", "--idle-timeout", IDLE) for n in "ab"}
    replicas = {n: replica(n) for n in names}
    # A kill moves work only once tier 1 owns its partitions and has published: six seconds,
    # and longer where a loaded machine has not got there yet.
    time.sleep(6.0)
    deadline = time.monotonic() + 90
    while not (re.search(r"took \S+\[\d+\] from offset", log := logs_of(tmp_path, "tier1-a"))
               and re.search(r"[1-9][\d,]* partials published", log)):
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.3)
    # The replicas die at random instants (the seed is in every failure message).
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    _kill(tier1["a"])  # its partitions go to b, then come back when it returns
    time.sleep(rng.uniform(0.0, 1.5))
    _kill(replicas["x"])
    time.sleep(rng.uniform(1.5, 3.0))
    tier1["a"] = _worker(kafka, tmp_path, "tier1-a", "--tier", "1", "--until-idle", "6", "--idle-timeout", IDLE)
    replicas["x"] = replica("x")
    time.sleep(rng.uniform(0.2, 2.5))
    _kill(replicas["y"])  # while x restores, or just after: the replicas share nothing, so z answers throughout
    replicas["y"] = replica("y")
    producer.join()

    # Every replica answers for every pool, alike.
    pools = sorted({msgspec.json.decode(v)["pool"] for _k, v in azure_values(40)})
    deadline = time.monotonic() + 90
    while any(_get(ports[n], f"/v1/autoscale/{p}")[0] != 200 for n in names for p in pools):
        assert time.monotonic() < deadline, logs_of(tmp_path, "tier2-x", "tier2-y", "tier2-z")[-6000:]
        time.sleep(0.5)
    answers = _answers_alike(list(ports.values()), [f"/v1/autoscale/{p}" for p in pools]
                             + [f"/v1/shed/{p}" for p in pools] + ["/v1/slos", "/v1/alerts"])
    assert all(msgspec.json.decode(answers[f"/v1/autoscale/{p}"])["pool"] == p for p in pools)
    assert msgspec.json.decode(answers["/v1/slos"])

    logs = logs_of(tmp_path, "tier1-a", "tier1-b", *(f"tier2-{n}" for n in names))[-6000:]
    assert all(p.wait(timeout=240) == 0 for p in (*tier1.values(), *replicas.values())), logs

    # The same log through one process.
    assert _worker(kafka, tmp_path, "single", "--store", str(single), "--until-idle", "4",
                   "--idle-timeout", IDLE).wait(timeout=240) == 0

    # The kill really moved work: some partition was taken up from a resume point, not from the start.
    took = re.findall(r"took \S+\[(\d+)\] from offset (\d+)", logs_of(tmp_path, "tier1-a", "tier1-b"))
    assert any(int(offset) > 0 for _p, offset in took), took

    want = _tables(single)
    assert want["sli_minute"].height > 200 and want["gpu_minute"].height > 0 and want["slo_status"].height > 0
    assert want["dead_letter"].height == 1
    for name in names:
        got = _tables(stores[name])
        for table in COMPARED:
            assert got[table].equals(want[table]), (seed, name, table, got[table].height, want[table].height, logs)
    _assert_paged_once(want["alerts"], hook, [url for _proc, url in cluster])


def _assert_paged_once(fired: pl.DataFrame, hook, am_urls: list[str]) -> None:
    """Six senders (three replicas × two instances) and one receiver: every alert still
    firing is active on both instances and reached the receiver, and no alert change
    reached it twice (the cluster's notification log deduplicates)."""
    import json
    import urllib.request

    def stored(name: str, slo: str, window: str, labels: str) -> str:
        extra = {} if name == "SLONoData" else {"window": window}
        return json.dumps({**json.loads(labels), "alertname": name, "slo": slo, **extra}, sort_keys=True)

    def sent(alert: dict) -> str:
        return json.dumps({k: v for k, v in alert["labels"].items() if k != "severity"}, sort_keys=True)

    firing = {stored(*row[:4]) for row in fired.select("alertname", "slo", "alert_window", "labels", "resolved_at").iter_rows()
              if row[4] is None}
    assert fired.height and firing, "the trace fires alerts, some still firing at its end"
    for url in am_urls:  # each instance heard of every alert from the replicas themselves
        active = {sent(a) for a in json.load(urllib.request.urlopen(url + "/api/v2/alerts?active=true", timeout=5))}
        assert firing <= active, (url, sorted(firing - active)[:3])
    deadline = time.monotonic() + 30
    while not firing <= {sent(a) for a in hook.alerts() if a["status"] == "firing"}:
        assert time.monotonic() < deadline, (sorted(firing)[:3], [a["labels"] for a in hook.alerts()][:3])
        time.sleep(0.5)
    changes = [(a["fingerprint"], a["status"], a["startsAt"]) for a in hook.alerts()]
    assert len(changes) == len(set(changes)), sorted({c for c in changes if changes.count(c) > 1})


def _held(log_text: str) -> list[int]:
    return [int(n) for n in re.findall(r"tier 2: .* (\d+) minutes held", log_text)]


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.timeout(400)
def test_a_tier1_worker_whose_partitions_went_quiet_or_hold_only_poison_holds_no_minute_back(broker, tmp_path):
    # Requests go to partitions 0-2 for eight trace minutes, then to partition 0 only;
    # partition 3 holds poison records only. Whichever worker does not own partition 0
    # owns only quiet and poison partitions: it must learn the topic's newest watermark
    # from the other's resume records, or the writer would hold every minute after the
    # eighth until the tier-1 workers drained on their way out.
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka, PARTITIONS)
    tiered, single = tmp_path / "tiered.duckdb", tmp_path / "single.duckdb"
    done = threading.Event()
    producer = threading.Thread(target=_publish, args=(kafka, "quiet", done))
    producer.start()
    tier1 = [_worker(kafka, tmp_path, f"tier1-{n}", "--tier", "1", "--until-idle", "15", "--idle-timeout", IDLE) for n in "ab"]
    writer = _worker(kafka, tmp_path, "tier2", "--tier", "2", "--store", str(tiered), "--until-idle", "5", "--idle-timeout", IDLE)
    producer.join()
    # The quiet worker finds its partitions idle (partition 3 has no valid event at all)...
    def idle_partitions() -> set[int]:
        idle = re.findall(r"requests partitions \[([\d, ]+)\] idle", logs_of(tmp_path, "tier1-a", "tier1-b"))
        return {int(p) for found in idle for p in found.split(",")}

    deadline = time.monotonic() + 60
    while not idle_partitions() >= {1, 2, 3}:
        assert time.monotonic() < deadline, ("no idle partitions", logs_of(tmp_path, "tier1-a", "tier1-b")[-3000:])
        time.sleep(0.5)
    # ... and while tier 1 still runs (it drains 15 s after its last event), minutes land on
    # the frontiers alone, up to the allowed lateness (5 minutes) behind the newest event. Only
    # the writer's lines from now on count: before the quiet stretch, nothing was held anyway.
    seen = len(_held(logs_of(tmp_path, "tier2")))
    deadline = time.monotonic() + 30
    while not ((held := _held(logs_of(tmp_path, "tier2"))[seen:]) and held[-1] <= 7):
        assert time.monotonic() < deadline, ("minutes stay held while tier 1 runs", held[-5:],
                                             logs_of(tmp_path, "tier1-a", "tier1-b")[-3000:])
        time.sleep(0.5)
    assert all(p.poll() is None for p in tier1), "tier 1 drained before the check: it proves nothing"
    logs = logs_of(tmp_path, "tier1-a", "tier1-b", "tier2")[-6000:]
    assert all(p.wait(timeout=240) == 0 for p in (*tier1, writer)), logs
    assert _worker(kafka, tmp_path, "single", "--store", str(single), "--until-idle", "4",
                   "--idle-timeout", IDLE).wait(timeout=240) == 0
    got, want = _tables(tiered), _tables(single)
    assert want["dead_letter"].height == 2 and want["sli_minute"].height > 100
    for table in COMPARED:
        assert got[table].equals(want[table]), (table, got[table].height, want[table].height, logs)


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.timeout(200)
def test_a_tier1_worker_whose_partials_kafka_refuses_stops_before_its_resume_point_moves(broker, tmp_path):
    # A producer limit (librdkafka's least, 1,000 bytes) below most partials (markers and resume records
    # are smaller): partials are refused. Tier 1 must not carry on as the single worker
    # does with its tw.sli copies, or that share of every minute would be gone for good.
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka, PARTITIONS)
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for key, value in azure_values(3):
        p.produce(kafka.topic("requests"), value, key=key)
    p.flush()
    config = tmp_path / "small.properties"
    config.write_text("message.max.bytes=1000\n")
    proc = _worker(kafka, tmp_path, "tier1", "--tier", "1", "--until-idle", "3", "--kafka-config", str(config))
    assert proc.wait(timeout=120) == 1
    said = logs_of(tmp_path, "tier1")
    assert re.search(r"tailwatch worker: Kafka refused [\d,]+ records tier 2 needs \(\S+sli: MSG_SIZE_TOO_LARGE\)", said), said[-3000:]
    assert "Traceback" not in said
    # No resume point moved past a refused partial: whoever takes these partitions next
    # reads them from the start (every minute was still open before the refusals).
    latest = read_latest(kafka, progress_topic(kafka.topic("requests")), list(range(PARTITIONS)))
    assert latest and all(msgspec.json.decode(r)["resume_offset"] == 0 for r in latest.values()), latest
