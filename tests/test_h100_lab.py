"""The real H100 run (tests/data/h100-lab) through the real broker and a `tailwatch
worker` process, as a new user would replay it: two sources for one GPU make
one truthful GPU minute, the autoscaler counts the replica that served, no cold start is
invented, detections do not split into a model-less slice, costs add up to the bill, turns
exist without `task_success`, and a caught-up worker does not rebuild its view while idle.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import duckdb
import polars as pl
from confluent_kafka import Producer

from tailwatch.streams.process_memory import HOLDERS, rss_parts
from tests.conftest import H100_LAB, free_port, need

LAB = H100_LAB
POOL = "h100-lab"


def lab_records(shift_ms: int) -> tuple[list[dict], list[dict]]:
    def read(name):
        rows = [json.loads(line) for line in (LAB / name).read_text().splitlines() if line.strip()]
        for r in rows:
            r["ts"] += shift_ms
        return rows
    return read("requests.jsonl"), read("gpu-samples.jsonl")


def get(port: int, path: str):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None, ""


def metric(body: str, name: str, **labels) -> list[float]:
    out = []
    for line in body.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


def test_the_h100_lab_run_gives_one_truthful_gpu_minute_and_costs_that_add_up(kafka, tmp_path):
    need(LAB.is_dir(), f"the H100 lab data in {LAB}")
    requests, samples = lab_records(0)
    newest = max(r["ts"] for r in requests + samples)
    # Shifted to end now, so the signal API (which judges staleness by wall clock) answers.
    requests, samples = lab_records(int(time.time() * 1000) - 5_000 - newest)
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
    for r in requests:
        p.produce(kafka.topic("requests"), json.dumps(r).encode(), key=r["tenant"].encode())
    for s in samples:
        p.produce(kafka.topic("gpu"), json.dumps(s).encode(), key=s["node"].encode())
    assert p.flush(30) == 0

    store, port = tmp_path / "tw.duckdb", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
         "--topic-prefix", kafka.topic_prefix, "--store", str(store), "--group", f"g-{uuid.uuid4().hex[:6]}",
         "--http-port", str(port), "--allowed-lateness", "30s", "--checkpoint-interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, waiting = time.time() + 150, {}
        while time.time() < deadline:
            status, body = get(port, "/metrics")
            accepted = sum(metric(body, "tailwatch_events_total", outcome="accepted")) if status == 200 else 0
            ready = get(port, "/readyz")
            # The API's view is rebuilt at its own pace (at most a tenth of the worker's time):
            # ready and caught up may come a rebuild before the view holds the pool.
            answered = get(port, f"/v1/autoscale/{POOL}")[0]
            waiting = {"accepted": f"{accepted:.0f} of {len(requests) + len(samples)}", "readyz": ready,
                       "warm replicas": metric(body, "tailwatch_gpu_replicas", state="warm"),
                       "autoscale": answered}
            if accepted >= len(requests) + len(samples) and ready[0] == 200 and waiting["warm replicas"] \
                    and answered == 200:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the worker did not catch up within 150 s: {waiting}")
        assert proc.poll() is None

        # The replica that served all along is one warm replica, not zero and not "unknown".
        status, body = get(port, f"/v1/autoscale/{POOL}")
        assert status == 200, body
        answer = json.loads(body)
        assert answer["current_replicas"] == 1 and answer["signals"]["replicas_by_state"] == {"warm": 1}
        # Four replica processes time-share the GPU and each reports its wall time as GPU-seconds
        # (2.2x what existed): demand is capped at the GPU-seconds the GPU had, as cost is, so
        # a one-GPU pool is not told to run a replica per overlapping request.
        assert 0 < answer["signals"]["work_gpu_s_per_s"] <= 1.0, answer["signals"]
        print(f"h100-lab autoscale: desired {answer['desired_replicas']}, work {answer['signals']['work_gpu_s_per_s']:.2f} "
              f"GPU-s/s, reasons {answer['reasons']}")
        _, exposition = get(port, "/metrics")
        assert metric(exposition, "tailwatch_gpu_replicas", state="warm") == [1.0]
        # What holds the worker's memory is named: every holder measured, the libraries'
        # code and the heap never empty, and together about the process's resident set.
        held = {h: metric(exposition, "tailwatch_process_memory_bytes", holder=h) for h in HOLDERS}
        assert all(len(v) == 1 for v in held.values()), held
        assert held["file"][0] > 0 and held["malloc_in_use"][0] > 0 and held["other_anonymous"][0] > 0, held
        rss = rss_parts(open(f"/proc/{proc.pid}/status").read())["VmRSS"]
        assert 0.5 * rss < sum(v[0] for v in held.values()) < 1.5 * rss, (held, rss)
        limit = [float(line.split()[1]) for line in exposition.splitlines()
                 if line.startswith("tailwatch_store_memory_limit_bytes ")]
        assert limit == [256 * 2**20], limit  # the store's DuckDB memory limit as started (no checkpoint needed more)

        # Caught up and idle: the view is not rebuilt (the heartbeat keeps the API fresh).
        view_cpu = sum(metric(exposition, "tailwatch_stage_cpu_seconds_total", stage="signals_view"))
        cpu_before = _cpu_seconds(proc.pid)
        time.sleep(15)
        cpu_idle_share = (_cpu_seconds(proc.pid) - cpu_before) / 15
        _, exposition = get(port, "/metrics")
        assert sum(metric(exposition, "tailwatch_stage_cpu_seconds_total", stage="signals_view")) == view_cpu
        assert get(port, f"/v1/autoscale/{POOL}")[0] == 200
        print(f"caught-up worker: {cpu_idle_share:.1%} of a core over 15 s")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    con = duckdb.connect(str(store), read_only=True)
    # One row per GPU and minute, labelled by the runtime and measured by the collector.
    rows = con.execute("SELECT model, replica_state, sources, util_pct_mean FROM gpu_minute "
                       "WHERE sources = 'nvml,runtime'").fetchall()
    assert rows and all(m == "llama-1b-rand" and s == "warm" and u is not None for m, s, _, u in rows)
    assert con.execute("SELECT count(*) FROM gpu_minute GROUP BY window_start, node, gpu_index "
                       "HAVING count(*) > 1").fetchall() == []
    detections = con.execute("SELECT detector, slice FROM detections").fetchall()
    assert not [d for d, _ in detections if d == "cold_start"]
    assert not [s for _, s in detections if json.loads(s).get("model", "x") == ""]
    turns, ok_turns = con.execute("SELECT sum(turns), sum(successful_turns) FROM sli_minute").fetchone()
    assert turns > 0 and 0 < ok_turns <= turns  # no task_success in this data, as from vLLM
    con.close()

    out = tmp_path / "report"
    subprocess.run([sys.executable, "-m", "tailwatch", "report", "cost", "--store", str(store), "--out", str(out)],
                   check=True, timeout=120, stdout=subprocess.DEVNULL)
    cost = pl.read_csv(out / "cost.csv")
    assert cost["attributed_cost_usd"].sum() <= cost["fully_loaded_cost_usd"].sum() + 1e-9
    gap = (cost["attributed_cost_usd"] + cost["idle_cost_usd"] - cost["fully_loaded_cost_usd"]).abs().max()
    assert gap < 1e-9


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its children that were waited for (/proc, Linux)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
