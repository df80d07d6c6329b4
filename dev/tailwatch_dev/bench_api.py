"""`tailwatch bench --api`: signal API latency under `wrk` at a paced request rate, with the
worker idle (the baseline), under a slow-body attack (20,000 connections dripping POST bodies
a byte every 2 s, opened at 500 a second, tools/slow_clients.py, in a process of its own), and
while it processes a stream of events, in one session. Then authorised polls on new
connections while 2,500 connections poll with a wrong bearer token (reconnecting when closed,
at most 500 new connections a second): the share answered within 2 s, and their latencies.

wrk (Debian package `wrk`) drives a fixed number of keep-alive connections; a Lua script
paces each one so the total is about the asked rate, rotates over autoscale, rollout and
SLO paths, and sends a bearer token. Results are wrk's latency percentiles and rate.

`--against REF` measures the worker of another commit (a git worktree of REF, run from the
same virtual environment) in the same session, ABAB, so a change to the HTTP path is judged
against the code it replaces on the same machine at the same time.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import yaml

from tailwatch.ingest.producer import EventPublisher
from tailwatch_dev.simulator import FleetSimulator
from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
from tailwatch_dev.bench_tiers import _cpu_seconds

TOKEN = "bench-token"
PATHS = ("/v1/autoscale/llm-us-east-1a-realtime", "/v1/autoscale/asr-us-east-1b-realtime",
         "/v1/rollout/llama-3.1-70b/2024-11", "/v1/slos/llm-realtime-first-token", "/v1/alerts")

LUA = """
local paths = {%(paths)s}
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", paths[(i %% #paths) + 1], {["Authorization"] = "Bearer %(token)s"})
end
delay = function() return %(delay_ms)d end
"""


class BenchError(Exception):
    pass


def _wrk(port: int, rate: int, connections: int, seconds: int, workdir: Path, server_pid: int | None = None) -> dict:
    """wrk's percentiles and rate, and the HTTP process's CPU per request: the figure that
    contention on a small machine moves least (a p99 there is mostly the scheduler's)."""
    cpu_before = _cpu_seconds(server_pid) if server_pid else None
    script = workdir / "pace.lua"
    script.write_text(LUA % {"paths": ", ".join(f'"{p}"' for p in PATHS), "token": TOKEN,
                             "delay_ms": max(1, int(connections / rate * 1000) - 1)})
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script),
                          f"http://127.0.0.1:{port}"], capture_output=True, text=True, check=True).stdout
    pct = {m.group(1): _ms(m.group(2), m.group(3)) for m in re.finditer(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    cpu_us = (1e6 * (_cpu_seconds(server_pid) - cpu_before) / requests) if cpu_before is not None and requests else None
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"p50_ms": pct.get("50"), "p90_ms": pct.get("90"), "p99_ms": pct.get("99"), "rps": rps,
            "non_2xx": int(non2xx.group(1)) if non2xx else 0, "cpu_us": cpu_us}


def _http_process(worker_pid: int) -> int | None:
    """The worker's HTTP child (multiprocessing's spawn), not its resource tracker."""
    for child in Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text().split():
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    return None


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def _wait_ready(port: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{PATHS[0]}", headers={"Authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise BenchError("the worker's signal API did not answer within 90 s")


def _events_seen(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return int(json.loads(r.read())["events_seen"])


def run(rate: int = 500, seconds: int = 20, connections: int = 8, load_minutes: int = 240, say=print,
        attackers: int = 20_000, code_dir: Path | None = None, unauthenticated: int = 2_500) -> list[str]:
    """Baseline (worker idle), attack (slow bodies), wrong tokens (`unauthenticated`
    connections; 0: not measured), then load (simulator publishing while the worker
    consumes); the worker's code from `code_dir` (default: this tree)."""
    return _report(*_measure(rate, seconds, connections, load_minutes, say, attackers, code_dir, unauthenticated),
                   rate, seconds, connections)


POLL_DEADLINE_S = 2.0  # an authorised poll answered later than this counts as failed (a controller's timeout)
POLLS_PER_S = 10


def _fresh_poll(port: int, timeout_s: float) -> float | None:
    """An authorised poll on a new connection: its seconds to a 200, or None."""
    t0 = time.monotonic()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{PATHS[0]}", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
            return time.monotonic() - t0 if r.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None


def _wrong_tokens(port: int, connections: int, seconds: int, say) -> dict:
    """Authorised polls on new connections, POLLS_PER_S a second for `seconds`, while
    `connections` poll with a wrong token (tools/slow_clients.py, a process of its own)."""
    say(f"wrong tokens: {connections:,} connections polling every second with a wrong token, "
        f"{POLLS_PER_S} authorised polls a second on new connections")
    attack = subprocess.Popen([sys.executable, "-m", "tailwatch_dev.slow_clients", "--wrong-token", "--port", str(port),
                               "--connections", str(connections), "--drip", "1", "--rate", "500",
                               "--seconds", str(seconds + 6)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              cwd=Path(__file__).resolve().parents[1])
    time.sleep(3)  # the attackers are connected and polling before the polls are measured
    took: list[float | None] = []
    polls = []
    for _ in range(seconds * POLLS_PER_S):
        # Threads, so a slow answer does not delay the next poll: each is a controller of its own.
        polls.append(threading.Thread(target=lambda: took.append(_fresh_poll(port, 5 * POLL_DEADLINE_S))))
        polls[-1].start()
        time.sleep(1 / POLLS_PER_S)
    for poll in polls:
        poll.join(timeout=15)
    out, _ = attack.communicate(timeout=60)
    answered = sorted(t for t in took if t is not None)
    in_time = [t for t in answered if t <= POLL_DEADLINE_S]

    def pct(q: float) -> float | None:
        return 1000 * answered[min(len(answered) - 1, int(q * len(answered)))] if answered else None

    return {"polls": len(took), "in_time": len(in_time), "failed": len(took) - len(answered),
            "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
            "max_ms": 1000 * answered[-1] if answered else None, "attack": json.loads(out or b"{}")}


def compare(ref: str, rate: int = 500, seconds: int = 20, say=print, rounds: int = 3) -> list[str]:
    """This tree's worker against REF's, interleaved ABAB in one session: each phase's p99 and
    the HTTP process's CPU per request, per round, and the ratio of after to before."""
    root = Path(__file__).resolve().parents[1]
    tree = Path(tempfile.mkdtemp(prefix="tailwatch-bench-ref-"))
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    try:
        sha = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        runs: dict[str, list] = {"before": [], "after": []}
        for i in range(rounds):
            for side, code in (("before", tree), ("after", root)):
                say(f"round {i + 1}/{rounds}: {side} ({sha if side == 'before' else 'this tree'})")
                runs[side].append(_measure(rate, seconds, 8, 240, lambda m: say(f"  {m}"), 20_000, code))
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], capture_output=True)
    lines = [f"signal API, {sha} (before) and this tree (after), interleaved ABAB, wrk ~{rate} req/s, {seconds} s each:"]
    for figure, unit, key in (("p99", "ms", "p99_ms"), ("HTTP process CPU per request", "µs", "cpu_us")):
        lines.append(f"  {figure} ({unit}):")
        for k, name in enumerate(("worker idle", "under slow bodies", "worker under load")):
            before = [r[k][key] for r in runs["before"]]
            after = [r[k][key] for r in runs["after"]]
            if None in before or None in after:
                lines.append(f"    {name:<18} not measured")
                continue
            ratio = math.prod(a / b for a, b in zip(after, before)) ** (1 / len(before))
            lines.append(f"    {name:<18} before {' '.join(f'{v:.2f}' for v in before):<20} after "
                         f"{' '.join(f'{v:.2f}' for v in after):<20} medians {statistics.median(before):.2f} and "
                         f"{statistics.median(after):.2f}, after/before {ratio:.2f}x (geometric mean of rounds)")
    return lines


def _measure(rate: int, seconds: int, connections: int, load_minutes: int, say, attackers: int,
             code_dir: Path | None, unauthenticated: int = 0) -> tuple[dict, dict, dict, dict, float, dict | None]:
    if shutil.which("wrk") is None:
        raise BenchError("wrk is not installed (Debian: apt-get install wrk)")
    workdir = Path(tempfile.mkdtemp(prefix="tailwatch-bench-api-"))
    broker = EmbeddedBroker(port=free_port(), log_path=str(workdir / "broker.log"))
    broker.start()
    worker = publisher = None
    try:
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"b{uuid.uuid4().hex[:6]}.")
        ensure_topics(kafka, partitions=4)
        say("[1/5] publishing 30 minutes of the mixed fleet so every pool has data")
        pub = EventPublisher(kafka)
        pub.publish_events(FleetSimulator("mixed-fleet", 30, seed=11).events())
        pub.close()
        (workdir / "api.yaml").write_text(yaml.safe_dump({
            "stale_after": "10m",
            "tokens": [{"name": "bench", "sha256": hashlib.sha256(TOKEN.encode()).hexdigest(), "tenants": "*"}],
        }))
        port = free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        worker_env = {**env, "PYTHONPATH": str(code_dir)} if code_dir else env
        common = ["--bootstrap-servers", broker.bootstrap, "--topic-prefix", kafka.topic_prefix]
        worker = subprocess.Popen(
            [sys.executable, "-m", "tailwatch", "worker", *common, "--store", str(workdir / "store.duckdb"),
             "--http-port", str(port), "--api-config", str(workdir / "api.yaml"), "--group", "bench-api"],
            stdout=subprocess.DEVNULL, stderr=open(workdir / "worker.log", "w"), env=worker_env, cwd=code_dir)
        try:
            _wait_ready(port)
        except BenchError:
            tail = (workdir / "worker.log").read_text()[-1500:]
            raise BenchError(f"the worker's signal API did not answer within 90 s; worker log ends: {tail}") from None
        time.sleep(3)  # let the first 30 minutes drain: the baseline is an idle worker
        server = _http_process(worker.pid)
        say(f"[2/5] baseline: wrk at about {rate} requests/s for {seconds} s, worker idle")
        baseline = _wrk(port, rate, connections, seconds, workdir, server)
        say(f"[3/5] attack: {attackers:,} connections dripping POST bodies a byte every 2 s while wrk runs again")
        attack = subprocess.Popen([sys.executable, "-m", "tailwatch_dev.slow_clients", "--port", str(port), "--connections",
                                   str(attackers), "--rate", "500", "--seconds", str(seconds + 6)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=env, cwd=Path(__file__).resolve().parents[1])
        time.sleep(3)  # the attackers are connected and dripping before wrk measures
        attacked = _wrk(port, rate, connections, seconds, workdir, server)
        out, _ = attack.communicate(timeout=60)
        attack_counts = json.loads(out or b"{}")
        wrong_tokens = _wrong_tokens(port, unauthenticated, seconds, lambda m: say(f"[3/5] {m}")) \
            if unauthenticated else None
        say(f"[4/5] load: publishing {load_minutes} simulated minutes while wrk runs again")
        publisher = subprocess.Popen(
            [sys.executable, "-m", "tailwatch", "simulate", *common, "--minutes", str(load_minutes), "--seed", "12",
             "--start", "2026-11-02T00:30:00Z"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        time.sleep(5)  # the publisher's start-up, so wrk measures while events flow
        before, t0 = _events_seen(port), time.monotonic()
        loaded = _wrk(port, rate, connections, seconds, workdir, server)
        processed = (_events_seen(port) - before) / (time.monotonic() - t0)
        say("[5/5] done")
    finally:
        for proc in (publisher, worker):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return baseline, attacked, loaded, attack_counts, processed, wrong_tokens


def _cpu_text(step: dict) -> str:
    return "CPU per request unknown" if step.get("cpu_us") is None else f"{step['cpu_us']:.0f} µs CPU per request"


def _ms_text(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _wrong_token_lines(case: dict | None) -> list[str]:
    if case is None:
        return []
    attack = case["attack"]
    share = case["in_time"] / case["polls"] if case["polls"] else 0.0
    return [
        f"  wrong tokens:       {case['in_time']} of {case['polls']} authorised polls on new connections answered "
        f"within {POLL_DEADLINE_S:.0f} s ({100 * share:.1f}%), {case['failed']} failed   p50 {_ms_text(case['p50_ms'])}   "
        f"p90 {_ms_text(case['p90_ms'])}   p99 {_ms_text(case['p99_ms'])}   max {_ms_text(case['max_ms'])}   "
        f"(the wrong-token clients opened {attack.get('opened', 0):,} connections, read "
        f"{attack.get('answers', 0):,} answers; the server closed or cut {attack.get('cut', 0):,})   "
        f"target: 95% within {POLL_DEADLINE_S:.0f} s ({'met' if share >= 0.95 else 'NOT met'})"]


def _report(baseline: dict, attacked: dict, loaded: dict, attack_counts: dict, processed: float,
            wrong_tokens: dict | None, rate: int, seconds: int, connections: int) -> list[str]:
    ratio = loaded["p99_ms"] / baseline["p99_ms"] if baseline["p99_ms"] else float("nan")
    return [
        f"signal API under wrk ({connections} keep-alive connections paced to ~{rate} req/s, {seconds} s each, "
        f"paths rotating over autoscale, rollout, SLO and alert reads):",
        f"  worker idle:        {baseline['rps']:,.0f} req/s   p50 {baseline['p50_ms']:.2f} ms   "
        f"p90 {baseline['p90_ms']:.2f} ms   p99 {baseline['p99_ms']:.2f} ms   non-2xx {baseline['non_2xx']}   "
        f"HTTP process {_cpu_text(baseline)}",
        f"  under slow bodies:  {attacked['rps']:,.0f} req/s   p50 {attacked['p50_ms']:.2f} ms   "
        f"p90 {attacked['p90_ms']:.2f} ms   p99 {attacked['p99_ms']:.2f} ms   non-2xx {attacked['non_2xx']}   "
        f"HTTP process {_cpu_text(attacked)} (the attack's connections included)   "
        f"(attackers opened {attack_counts.get('opened', 0):,} connections, the server cut "
        f"{attack_counts.get('cut', 0):,}, refused {attack_counts.get('refused', 0):,})",
        f"  p99 under attack ÷ p99 idle: {attacked['p99_ms'] / baseline['p99_ms'] if baseline['p99_ms'] else float('nan'):.2f}x",
        *_wrong_token_lines(wrong_tokens),
        f"  worker under load:  {loaded['rps']:,.0f} req/s   p50 {loaded['p50_ms']:.2f} ms   "
        f"p90 {loaded['p90_ms']:.2f} ms   p99 {loaded['p99_ms']:.2f} ms   non-2xx {loaded['non_2xx']}   "
        f"HTTP process {_cpu_text(loaded)}   "
        f"(the worker processed {processed:,.0f} events/s meanwhile)",
        f"  p99 under load ÷ p99 idle: {ratio:.2f}x   target: p99 under 20 ms at 500 req/s "
        f"({'met' if loaded['p99_ms'] < 20 and loaded['rps'] >= 0.9 * rate else 'NOT met'})",
    ]
