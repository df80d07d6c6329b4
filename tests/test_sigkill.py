"""Kill a real worker process with SIGKILL mid-stream, restart it, and get the same store.

Offsets, closed buckets and open-minute state are committed in one DuckDB transaction,
so whatever instant the kill lands on, the restarted worker resumes from a consistent
point: no event lost, none counted twice.
"""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import duckdb

from ingest.producer import EventPublisher
from ingest.simulator import FleetSimulator
from tests.conftest import free_port

COMPARE = {
    "sli_minute": "window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool",
    "gpu_minute": "window_start, node, gpu_index",
}


def worker_cmd(kafka, store, group, port, until_idle="3"):
    return [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
            "--topic-prefix", kafka.topic_prefix, "--store", str(store), "--group", group,
            "--http-port", str(port), "--until-idle", until_idle, "--batch-size", "400",
            "--checkpoint-interval", "0.05", "--allowed-lateness", "2m"]


def accepted(port) -> float:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("tailwatch_events_total{") and 'outcome="accepted"' in line)


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
