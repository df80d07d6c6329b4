"""Hostile and buggy producers and clients, against the real broker and real worker processes.

Each test is one way a producer or an HTTP client tried to stop, blind or fool the worker:
records nested past the recursion limit, timestamps far in the future, records that only
parse when joined, slow bodies and bodies the server would refuse anyway, a second writer
reaching the store by another path, a store whose frontier an older release let a bad record
move, and the one-line errors a person sees for a corrupt store or a config line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import duckdb
import msgspec
import pytest
import yaml
from confluent_kafka import Producer

from tailwatch.ingest.schema import RequestV1
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
from tests.conftest import free_port

TOKEN = "ops-secret-token"
START_MS = 1_793_577_600_000  # 2026-11-02T00:00:00Z, in the past of every record's timestamp


def request(n: int, minute: int, tenant: str = "acme", **fields) -> bytes:
    return msgspec.json.encode(RequestV1(
        schema="request.v1", event_id=f"e{n}", ts=START_MS + minute * 60_000 + n % 60_000, tenant=tenant,
        model="chat-70b", workload="llm", status="ok", zone="us-east-1a", pool="llm-a", e2e_ms=900.0, **fields))


def produce(kafka: KafkaSettings, values: list[bytes], topic: str = "requests", timestamps: list[int] | None = None) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5, "message.max.bytes": 5_000_000})
    for i, v in enumerate(values):
        extra = {"timestamp": timestamps[i]} if timestamps and timestamps[i] is not None else {}
        p.produce(kafka.topic(topic), v, key=b"acme", **extra)
    assert p.flush(30) == 0


def worker(kafka: KafkaSettings, store: Path, log: Path, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
            "--topic-prefix", kafka.topic_prefix, "--store", str(store), "--http-port", "0", "--detectors", "none",
            "--slos", "none", "--group", f"g-{uuid.uuid4().hex[:6]}", *args]
    return subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def drain(kafka: KafkaSettings, store: Path, tmp_path: Path, tier: str, timeout: float = 120) -> None:
    """Read the topics into `store` until idle: one worker (tier `all`), or a tier-1 and a tier-2
    worker; each must exit 0."""
    if tier == "all":
        assert worker(kafka, store, tmp_path / "w.log", "--until-idle", "3").wait(timeout=timeout) == 0, \
            (tmp_path / "w.log").read_text()[-3000:]
        return
    t1 = worker(kafka, tmp_path / "unused.duckdb", tmp_path / "t1.log", "--tier", "1", "--until-idle", "4")
    t2 = worker(kafka, store, tmp_path / "t2.log", "--tier", "2", "--until-idle", "4")
    assert t1.wait(timeout=timeout) == 0, (tmp_path / "t1.log").read_text()[-3000:]
    assert t2.wait(timeout=timeout) == 0, (tmp_path / "t2.log").read_text()[-3000:]


@pytest.fixture
def kafka(broker) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(settings, 1)
    return settings


def rows(store: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# ---- records --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.parametrize("tier", ["all", "1"])
def test_records_nested_past_the_recursion_limit_are_dead_letters_not_a_crash_loop(kafka, tmp_path, tier):
    """2 KB of `[` as the value of an unknown field, or as the whole record, used to raise
    RecursionError out of the decoder: exit 1 on every restart, nothing stored after it."""
    deep_field = request(2, 1)[:-1] + b', "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    values = [request(1, 1), deep_field, b"[" * 2048, b'{"a":' * 1500, request(3, 2)]
    produce(kafka, values)
    store = tmp_path / "tw.duckdb"
    drain(kafka, store, tmp_path, tier)
    assert rows(store, "SELECT sum(requests) FROM sli_minute") == [(2,)]
    assert sorted(rows(store, "SELECT source_offset, reason FROM dead_letter")) == [
        (1, "too_deep"), (2, "too_deep"), (3, "too_deep")]


@pytest.mark.broker
def test_a_far_future_record_is_refused_and_later_minutes_close_on_time(kafka, tmp_path):
    """One `ts` in 2099 used to move its partition's frontier there, for good (8,417 of 8,417
    later requests late), and a year-9999 string crash-looped the worker."""
    before = [request(i, 1 + i // 10) for i in range(50)]  # minutes 1..5
    hostile = [request(900, 0), request(901, 0), request(902, 0), request(903, 3)]
    hostile[0] = hostile[0].replace(str(START_MS + 900).encode(), b"4070908800000")  # 2099-01-01, in the schema's range
    hostile[1] = hostile[1].replace(str(START_MS + 901).encode(), b'"9999-12-31T23:59:59Z"')
    ahead = int(time.time() * 1000) + 3_600_000  # a producer whose clock is an hour fast
    hostile[2] = hostile[2].replace(str(START_MS + 902).encode(), str(ahead).encode())
    after = [request(100 + i, 6 + i // 10) for i in range(50)]  # minutes 6..10: after the hostile records
    produce(kafka, before + hostile + after,
            timestamps=[None] * 53 + [1] + [None] * 50)  # the fourth: a record stamped 1970, nothing to bound by
    store = tmp_path / "tw.duckdb"
    proc = worker(kafka, store, tmp_path / "w.log", "--until-idle", "3")
    assert proc.wait(timeout=120) == 0, (tmp_path / "w.log").read_text()[-3000:]
    assert rows(store, "SELECT sum(requests) FROM sli_minute") == [(100,)]  # every good one, none late
    assert sorted(rows(store, "SELECT source_offset, reason FROM dead_letter")) == [
        (50, "future"), (51, "bad_timestamp"), (52, "future"), (53, "future")]
    assert rows(store, "SELECT ts FROM dead_letter WHERE source_offset = 53") == [(None,)]
    # The frontier stands where the good events put it: minutes up to 10 closed, nothing later.
    assert rows(store, "SELECT max(window_start) FROM sli_minute")[0][0].isoformat() == "2026-11-02T00:10:00"


@pytest.mark.broker
def test_records_that_only_parse_when_joined_forge_no_event(kafka, tmp_path):
    """`{…},{…` (missing a brace) then a record that closes it used to decode as two valid
    events with labels of the producer's choosing, and nothing was dead-lettered."""
    forged = request(5, 1, tenant="someone-else")[:-1]
    first = request(4, 1)[:-1] + b"}," + forged
    second = b'"zone": "made-up"}'  # joined with a comma between, `[…,first,second,…]` is valid JSON
    assert len(msgspec.json.decode(b"[" + b",".join([request(1, 1), first, second, request(2, 1)]) + b"]")) == 4
    produce(kafka, [request(1, 1), first, second, request(2, 1)])
    store = tmp_path / "tw.duckdb"
    assert worker(kafka, store, tmp_path / "w.log", "--until-idle", "3").wait(timeout=120) == 0
    assert rows(store, "SELECT tenant, zone, sum(requests) FROM sli_minute GROUP BY ALL") == [("acme", "us-east-1a", 2)]
    assert sorted(rows(store, "SELECT source_offset, reason FROM dead_letter")) == [(1, "malformed_json"), (2, "malformed_json")]


@pytest.mark.slow
@pytest.mark.broker
def test_a_frontier_an_older_release_let_a_bad_record_move_is_repaired_at_start(kafka, tmp_path):
    store = tmp_path / "tw.duckdb"
    produce(kafka, [request(i, 1 + i // 10) for i in range(30)])  # minutes 1..3
    assert worker(kafka, store, tmp_path / "w.log", "--until-idle", "3").wait(timeout=120) == 0
    # What an older release stored after a record stamped 2099: the partition's watermark and
    # the closed frontier there (every later event was late), and an open minute holding it.
    con = duckdb.connect(str(store))
    con.execute("UPDATE _tw_offsets SET watermark_ms = 4070908800000 WHERE topic LIKE '%requests'")
    con.execute("UPDATE _tw_frontier SET closed_before_minute = 4070908800000 // 60000 - 5 WHERE topic LIKE '%requests'")
    con.close()
    produce(kafka, [request(100 + i, 5 + i // 10) for i in range(30)])  # minutes 5..7
    assert worker(kafka, store, tmp_path / "w2.log", "--until-idle", "3").wait(timeout=120) == 0
    said = (tmp_path / "w2.log").read_text()
    assert "forgot a watermark at 2099-01-01" in said and "moved the closed frontier back" in said, said[-3000:]
    assert rows(store, "SELECT sum(requests) FROM sli_minute") == [(60,)]
    assert rows(store, "SELECT count(*) FROM dead_letter WHERE reason = 'late'") == [(0,)]


@pytest.mark.slow
@pytest.mark.broker
def test_a_second_writer_on_the_same_file_by_any_path_refuses_to_start_naming_the_first(kafka, tmp_path):
    """The writer lock used to follow the path string: the same file through a symlink got two
    writers and 55% of requests counted twice."""
    store = tmp_path / "data" / "tw.duckdb"
    first = worker(kafka, store, tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 60
        while not store.exists() or "FLOCK" not in Path("/proc/locks").read_text():
            assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(1.0)
        (tmp_path / "link.duckdb").symlink_to(store)
        os.link(store, tmp_path / "hard.duckdb")
        for path in (tmp_path / "link.duckdb", tmp_path / "hard.duckdb", Path("data") / "tw.duckdb"):
            got = subprocess.run([sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers",
                                  kafka.bootstrap_servers, "--topic-prefix", kafka.topic_prefix, "--store", str(path),
                                  "--http-port", "0", "--until-idle", "2"],
                                 capture_output=True, text=True, timeout=60, cwd=tmp_path)
            lines = got.stderr.strip().splitlines()
            assert got.returncode == 2 and len(lines) == 1, (path, got.returncode, got.stderr)
            assert f"is already written by pid {first.pid}" in lines[0] and "--store of its own" in lines[0], lines
    finally:
        first.terminate()
        first.wait(timeout=60)


# ---- the HTTP port ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api_port(broker, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-api")
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(kafka, 1)
    produce(kafka, [request(i, 1 + i // 50) for i in range(200)])
    (tmp / "api.yaml").write_text(yaml.safe_dump({
        "stale_after": "10m", "max_connections": 64,
        "tokens": [{"name": "ops", "sha256": hashlib.sha256(TOKEN.encode()).hexdigest(), "tenants": "*"}]}))
    port = free_port()
    log = tmp / "worker.log"
    proc = worker(kafka, tmp / "tw.duckdb", log, "--api-config", str(tmp / "api.yaml"), "--http-port", str(port))
    deadline = time.monotonic() + 60
    while _status(port, "/v1/slos") != 200:
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.3)
    yield port, log
    proc.terminate()
    proc.wait(timeout=30)


def _status(port: int, path: str, token: str | None = TOKEN) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _exchange(port: int, raw: bytes, timeout_s: float = 3.0) -> bytes:
    """Send `raw` and read what comes back until the server closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(raw)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return out


def _refused(port: int) -> dict[str, float]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'^tailwatch_http_refused_total\{reason="(\w+)"\} (\S+)$',
                                                                text, re.M)}


@pytest.mark.broker
def test_slow_bodies_are_cut_and_counted_and_never_starve_an_authorised_poll(api_port):
    """POSTs dripping one body byte a second used to be held for ever: 20,000 of them ran the
    process out of file descriptors, authorised polls timed out, and the log grew a line per
    refused accept and a traceback per dropped body."""
    port, log = api_port
    before = _refused(port)
    lines_before = len(log.read_text().splitlines())
    attackers, stop = 200, threading.Event()  # over three times the cap (64)
    cut: list[float] = []
    started = time.monotonic()

    def drip() -> None:
        sel = selectors.DefaultSelector()
        for _ in range(attackers):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            sel.register(s, selectors.EVENT_WRITE | selectors.EVENT_READ, {"sent_head": False})
        last_byte = 0.0
        while sel.get_map() and not stop.is_set() and time.monotonic() - started < 30:
            for key, events in sel.select(timeout=0.2):
                s, state = key.fileobj, key.data
                try:
                    if events & selectors.EVENT_READ and s.recv(4096) == b"":
                        raise ConnectionResetError
                    if events & selectors.EVENT_WRITE and not state["sent_head"]:
                        s.send(b"POST /v1/flagger/confirm-promotion HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
                        state["sent_head"] = True
                        sel.modify(s, selectors.EVENT_READ, state)
                except OSError:
                    cut.append(time.monotonic() - started)
                    sel.unregister(s)
                    s.close()
            if time.monotonic() - last_byte >= 1.0:  # one body byte a second on every connection
                last_byte = time.monotonic()
                for key in list(sel.get_map().values()):
                    try:
                        key.fileobj.send(b" ")
                    except OSError:
                        pass
        for key in list(sel.get_map().values()):
            key.fileobj.close()

    import http.client

    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # a poller's keep-alive connection (KEDA's, wrk's)

    def poll_kept() -> int:
        kept.request("GET", "/v1/slos", headers={"Authorization": f"Bearer {TOKEN}"})
        got = kept.getresponse()
        got.read()
        return got.status

    assert poll_kept() == 200
    attack = threading.Thread(target=drip)
    attack.start()
    polls, fresh = [], []
    try:
        while time.monotonic() - started < 10:
            polls.append(poll_kept())
            if time.monotonic() - started > 1.0:  # a new poller, once the burst of 200 connects is over
                fresh.append(_status(port, "/v1/slos"))
            time.sleep(0.05)
    finally:
        attack.join(timeout=40)
        stop.set()
        kept.close()
    # Every authorised poll answered during the whole attack, on a kept connection or a new one.
    assert polls and set(polls) == {200}, polls
    assert fresh and set(fresh) == {200}, fresh
    assert len(cut) == attackers, (len(cut), attackers)  # the server cut every slow body
    refused = _refused(port)
    counted = {k: refused[k] - before.get(k, 0) for k in refused}
    # Each attacker is one count: cut at the body deadline, evicted by a newcomer, or refused at the cap.
    assert counted["body_timeout"] + counted["evicted_slow_connection"] + counted["connection_limit"] >= attackers - 5, counted
    assert counted["body_timeout"] > 0, counted
    # Over the cap (64): newcomers evicted slow bodies (the new pollers got in so) or were refused.
    assert counted["evicted_slow_connection"] + counted["connection_limit"] >= attackers - 64, counted
    said = [line for line in log.read_text().splitlines()[lines_before:] if not line.startswith("worker: ")]  # progress
    assert not any("Traceback" in line for line in said) and len(said) < 5, said[:20]


@pytest.mark.broker
def test_a_body_the_server_would_refuse_is_not_read(api_port):
    port, _log = api_port
    before = _refused(port)
    # A wrong token in the header: 401 at once, though 60,000 body bytes are announced and none sent.
    got = _exchange(port, b"POST /v1/flagger/confirm-promotion HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
                          b"Content-Length: 60000\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 401") and b"connection: close" in got.lower(), got[:300]
    # A POST to a path that takes no body: 405 at once; to no path at all: 404.
    got = _exchange(port, b"POST /v1/autoscale/llm-a HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 405"), got[:300]
    got = _exchange(port, b"POST /v1/nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 404"), got[:300]
    assert _refused(port)["refused_before_body"] - before.get("refused_before_body", 0) == 3


@pytest.mark.broker
def test_a_deeply_nested_body_and_odd_paths_are_400_not_500(api_port):
    port, log = api_port
    nested = b'{"metadata": {"model": "chat-70b", "version": "v1"}, "x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/flagger/confirm-promotion", data=nested, method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        urllib.request.urlopen(req, timeout=10)
        status = 200
    except urllib.error.HTTPError as e:
        status, body = e.code, json.loads(e.read())
    assert status == 400 and "nests deeper" in body["error"], (status, body)
    for path in ("/v1/autoscale/a%00b", "/v1/autoscale/a%2Fb", "/v1/autoscale/a%20b", "/v1/rollout/m%ff/v"):
        assert _status(port, path) == 400, path
    assert "Traceback" not in log.read_text()


# ---- errors a person reads ---------------------------------------------------------------------

def test_a_kafka_config_line_that_cannot_be_parsed_is_named_by_line_never_by_value(tmp_path):
    from tailwatch.ingest.kafka import ConfigError, read_client_config

    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL\n# a comment\nsasl.password hunter2-secret\n")
    with pytest.raises(ConfigError) as err:
        read_client_config(str(config))
    assert f"{config}:3" in str(err.value) and "hunter2" not in str(err.value), err.value


@pytest.mark.broker
def test_a_corrupt_store_is_one_line_naming_the_file_and_the_way_out(kafka, tmp_path):
    store = tmp_path / "tw.duckdb"
    store.write_bytes(b"this is not a database" * 1000)
    got = subprocess.run([sys.executable, "-m", "tailwatch", "worker", "--store", str(store), "--http-port", "0",
                          "--bootstrap-servers", kafka.bootstrap_servers], capture_output=True, text=True, timeout=60)
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 2 and len(lines) == 1, got.stderr
    assert str(store) in lines[0] and "not a DuckDB store" in lines[0] and "rebuild" in lines[0], lines
    got = subprocess.run([sys.executable, "-m", "tailwatch", "sql", "SELECT 1", "--store", str(store)],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and len(got.stderr.strip().splitlines()) == 1 and str(store) in got.stderr, got.stderr


@pytest.mark.broker
def test_a_truncated_store_is_the_same_one_line_and_way_out_as_a_corrupt_one(kafka, tmp_path):
    from tailwatch.store.connection import connect

    path = tmp_path / "tw.duckdb"
    con = connect(path)  # a real store: the worker's own schema, then a month of minutes in it
    con.execute("INSERT INTO sli_minute (window_start, tenant, model, requests, ok) "
                "SELECT TIMESTAMP '2026-11-01' + INTERVAL (i) MINUTE, 'acme', 'chat-70b', i, i FROM range(200000) t(i)")
    con.close()
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)  # a copy stopped half-way
    for cmd in (["worker", "--store", str(path), "--http-port", "0", "--bootstrap-servers", kafka.bootstrap_servers],
                ["sql", "SELECT count(*) FROM sli_minute", "--store", str(path)]):
        got = subprocess.run([sys.executable, "-m", "tailwatch", *cmd], capture_output=True, text=True, timeout=60)
        lines = got.stderr.strip().splitlines()
        assert got.returncode == 2 and len(lines) == 1, (cmd[0], got.returncode, got.stderr)
        assert str(path) in lines[0] and "truncated" in lines[0] and "move it away" in lines[0] and "rebuild" in lines[0], lines


@pytest.mark.broker
def test_a_full_disk_is_one_line_saying_so_not_a_rollback_error(kafka, tmp_path):
    """A full disk used to end in `cannot rollback - no transaction is active`, hiding
    `No space left on device`. A 3 MB tmpfs stands in for the full disk."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(small)], capture_output=True, text=True)
    if mounted.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a small tmpfs to fill (CI runs as root): {mounted.stderr.strip()}")
        pytest.skip(f"mounting a tmpfs needs root: {mounted.stderr.strip()}")
    try:
        produce(kafka, [request(i, i // 500, tenant=f"t{i % 300}") for i in range(60_000)])
        got = subprocess.run([sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
                              "--topic-prefix", kafka.topic_prefix, "--store", str(small / "tw.duckdb"), "--http-port", "0",
                              "--until-idle", "3", "--slos", "none", "--detectors", "none", "--batch-size", "2000"],
                             capture_output=True, text=True, timeout=180)
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)
    last = got.stderr.strip().splitlines()[-1]
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr[-3000:]
    assert last == (f"tailwatch worker: no space left on device for store {small / 'tw.duckdb'}: free space there (or "
                    "move --store) and start the worker again; it resumes from its last checkpoint"), last
