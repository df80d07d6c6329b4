"""Kill a real worker process with SIGKILL mid-stream, restart it, and get the same store.

Offsets, closed buckets and open-minute state are committed in one DuckDB transaction,
so whatever instant the kill lands on, the restarted worker resumes from a consistent
point: no event lost, none counted twice. And what it then answers on the signal API (the
view rebuilt from the store, the open minutes restored) is what a worker that was never
killed answers, on the public traces.
"""

import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import duckdb
import pytest

from tailwatch.ingest.producer import EventPublisher
from tailwatch_dev.simulator import FleetSimulator
from tests.conftest import free_port

COMPARE = {
    "sli_minute": "window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool, language, voice",
    "gpu_minute": "window_start, node, gpu_index",
}


def worker_cmd(kafka, store, group, port, until_idle="3"):
    return [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
            "--topic-prefix", kafka.topic_prefix, "--store", str(store), "--group", group,
            "--http-port", str(port), "--until-idle", until_idle, "--batch-size", "400",
            "--checkpoint-interval", "0.05", "--allowed-lateness", "2m"]


def _metric_values(port: int, name: str, label: str = "") -> list[float] | None:
    """Values of the worker's `name{...}` series holding `label`, from /metrics; None when it does not answer."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    return [float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + "{") and label in line]


def accepted(port) -> float:
    return sum(_metric_values(port, "tailwatch_events_total", 'outcome="accepted"') or [])


@pytest.mark.slow
def test_sigkill_at_any_moment_gives_the_same_buckets(kafka, tmp_path):
    sim = FleetSimulator("mixed-fleet", minutes=40, seed=21, rate_scale=0.5)
    pub = EventPublisher(kafka)
    pub.publish_events(sim.events())
    pub.close()
    total = sum(pub.report.published.values())

    reference = tmp_path / "reference.duckdb"
    subprocess.run(worker_cmd(kafka, reference, "ref", free_port()), check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    killed = tmp_path / "killed.duckdb"
    kills = 0
    for fraction in (0.15, 0.45, 0.8):
        port = free_port()
        proc = subprocess.Popen(worker_cmd(kafka, killed, "victim", port, until_idle="30"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if accepted(port) >= fraction * total / 3:  # this run's own count: it restarts mid-log
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the worker finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    subprocess.run(worker_cmd(kafka, killed, "victim", free_port()), check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert kills == 3

    con = duckdb.connect()
    con.execute(f"ATTACH '{reference}' AS ref (READ_ONLY)")
    con.execute(f"ATTACH '{killed}' AS got (READ_ONLY)")
    for table, keys in COMPARE.items():
        n_ref = con.execute(f"SELECT count(*) FROM ref.{table}").fetchone()[0]
        assert n_ref > 0
        assert con.execute(f"SELECT count(*) FROM got.{table}").fetchone()[0] == n_ref
        for a, b in (("ref", "got"), ("got", "ref")):
            diff = con.execute(f"SELECT count(*) FROM (SELECT * FROM {a}.{table} EXCEPT ALL SELECT * FROM {b}.{table})").fetchone()[0]
            assert diff == 0, f"{table}: {diff} rows of {a} are not in {b}"
    assert con.execute("SELECT sum(requests) FROM got.sli_minute").fetchone()[0] == sim.totals.requests


# ---- what the signal API answers after kills, on the public traces ---------------------------

def _publish_trace_stream(kafka, seed: int, minutes: int) -> tuple[int, set[str], set[tuple[str, str]]]:
    """The chaos harness's stream of the Azure and Mooncake traces (no poison): returns the
    records published, the pools, and each (model, version) served as a canary."""
    import json
    import random

    from tailwatch_dev.chaos import build_stream
    from tailwatch_dev.traces import AZURE_CODE_TRACE, MOONCAKE_TRACE
    from tailwatch.ingest.kafka import make_producer

    stream = build_stream(seed, minutes, AZURE_CODE_TRACE, MOONCAKE_TRACE, random.Random(seed))
    producer = make_producer(kafka)
    pools, canaries, n = set(), set(), 0
    for chunk in stream.chunks:
        for o in chunk:
            producer.produce(kafka.topic(o.topic), o.value, key=o.key)
            producer.poll(0)
            n += 1
            if o.topic == "requests":
                doc = json.loads(o.value)
                pools.add(doc["pool"])
                if doc.get("deployment") == "canary":
                    canaries.add((doc["model"], doc["model_version"]))
    assert producer.flush(60) == 0
    return n, pools, canaries


def _lag(port: int) -> float | None:
    lags = _metric_values(port, "tailwatch_consumer_lag_messages")
    return sum(lags) if lags else None


def _answers(port: int, pools: set[str], canaries: set[tuple[str, str]]) -> dict[str, object]:
    import json

    out = {}
    paths = ["/v1/slos", "/v1/alerts"] + [f"/v1/autoscale/{p}" for p in sorted(pools)] \
        + [f"/v1/shed/{p}" for p in sorted(pools)] + [f"/v1/rollout/{m}/{v}" for m, v in sorted(canaries)]
    for path in paths:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                out[path] = (r.status, _without_ages(json.loads(r.read())))
        except urllib.error.HTTPError as e:
            out[path] = (e.code, _without_ages(json.loads(e.read())))
    return out


def _without_ages(answer: dict) -> dict:
    """An answer without the seconds since its data last moved: wall-clock readings of the
    serving process, not data (they differ between any two reads)."""
    return {k: v for k, v in answer.items() if not k.endswith("data_age_s")}


def _view_current(port: int) -> bool:
    """The worker's view holds everything it has read (/healthz): the API's view is rebuilt
    at most every 2 s, and less often where a rebuild is slow, so equal reads alone could
    both come from a view built before the last batch."""
    import json

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            return json.loads(r.read())["view_current"]
    except OSError:
        return False


def _settled_answers(proc, port: int, pools, canaries, timeout_s: float = 240.0) -> dict[str, object]:
    """The answers once the worker has read the whole log, its view holds all of it, and two
    reads a few seconds apart agree."""
    deadline = time.time() + timeout_s
    previous = None
    while time.time() < deadline:
        assert proc.poll() is None, "the worker exited"
        if _lag(port) == 0 and _view_current(port):
            got = _answers(port, pools, canaries)
            # Every answer given, or refused for an input its pool lacks (some of the chaos
            # stream's pools have no GPU samples): both are data, and must be equal.
            if got == previous and all(status == 200 or (status == 503 and body.get("reason") == "no_data")
                                       for status, body in got.values()):
                return got
            previous = got
        time.sleep(3)
    raise AssertionError(f"the answers did not settle: {previous}")


@pytest.mark.slow
def test_signal_answers_after_sigkills_equal_an_unkilled_run(kafka, tmp_path):
    """Autoscalers and rollout controllers poll a worker that may have been SIGKILLed and
    restarted on its DuckDB store: it must answer exactly what a worker that was never
    killed answers over the same log (the view rebuilt from the store and the open minutes)."""
    total, pools, canaries = _publish_trace_stream(kafka, seed=11, minutes=25)
    assert pools and canaries

    def run(store, group, port):
        return subprocess.Popen(worker_cmd(kafka, store, group, port, until_idle="600"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    port = free_port()
    proc = run(tmp_path / "reference.duckdb", "ref", port)
    try:
        reference = _settled_answers(proc, port, pools, canaries)
    finally:
        proc.kill()
        proc.wait()

    store = tmp_path / "killed.duckdb"
    for fraction in (0.3, 0.7):
        port = free_port()
        proc = run(store, "victim", port)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and accepted(port) < fraction * total / 2:
            time.sleep(0.02)  # this run's own count: it restarts mid-log, so each kill lands later
        assert proc.poll() is None, "the worker finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    port = free_port()
    proc = run(store, "victim", port)
    try:
        after_kills = _settled_answers(proc, port, pools, canaries)
    finally:
        proc.kill()
        proc.wait()

    assert set(after_kills) == set(reference)
    # Exact but for the last bits of float sums: a restart merges the open minutes' partial
    # sums in another order than one uninterrupted run adds them (and an answer rounded to
    # six places may then round the other way: one unit there).
    differ = {path: d for path in reference if (d := _differences(reference[path], after_kills[path]))}
    assert not differ, differ


def _differences(a, b, at: str = "") -> list[str]:
    """Where two JSON answers differ: `field.sub[i]: a != b`, leaves only."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{at}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1.01e-6):
        return []
    return [] if a == b else [f"{at}: {a!r} != {b!r}"]
