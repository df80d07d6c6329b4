"""`tailwatch bench --tiers`: how tier 1 scales out and what tier 2 costs.

One embedded broker, the synthetic firehose of `tailwatch bench` (20,000 live slices by
default, keyed by tenant over 4 partitions), published once per measurement:

1. one `worker --tier 1` process drains it; then two, in one consumer group, drain the
   same events again (a fresh topic prefix). Scale-out is events per CPU-second of the
   busiest tier-1 worker with two, over that of the one: the throughput two workers
   sustain when each has a core of its own, which a shared laptop or CI box cannot show
   in wall-clock time (the broker and both workers share its cores). Wall-clock is
   reported beside it, with the machine's core count.
2. a `--tier 2` replica then lands what the two published, with `--slo-count`
   SLOs over the same slices and every default stage: CPU per minute of event time.
3. replicas: two `--tier 2` replicas, each with a store of its own, over the same
   `tw.sli`; once both are ready, one is SIGKILLed and restarted three times: the time from
   the kill to the restarted replica answering `/readyz` 200, and how long the other
   replica was not ready meanwhile (an autoscaler polling both is never without an answer).

CPU is each process's own (all its threads), from its first event (`--stats-file`).
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import yaml

from tailwatch_dev.bench import fresh, publish, worker_processes
from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.conventions import TOPIC_SLI


def slo_file(path: Path, count: int) -> Path:
    """`count` SLOs over the synthetic traffic's 13 models: availability and first-output
    latency in turn, sliced by tenant and zone (together every live slice)."""
    slos = []
    for i in range(count):
        sli = {"availability": {}} if i % 2 == 0 else {"latency": {"field": "first_output_ms", "threshold": f"{1000 + i}ms"}}
        slos.append({"name": f"bench-{i:03d}", "description": "bench", "selector": {"model": f"model-{i % 13}"},
                     "sli": sli, "objective": "99%", "window": "30d", "slice_by": ["tenant", "zone"], "min_events": 10})
    path.write_text(yaml.safe_dump({"slos": slos}))
    return path


def run(events: int, slices: int, events_per_minute: int, slo_count: int, port: int | None = None,
        say=lambda m: print(m, file=sys.stderr, flush=True)) -> list[str]:
    workdir = Path(tempfile.mkdtemp(prefix="tailwatch-bench-tiers-"))
    broker = EmbeddedBroker(port=port or free_port())
    broker.start()
    event_minutes = -(-events // events_per_minute)
    lines = [f"{events:,} events over {slices:,} slices, {events_per_minute:,} per event-minute "
             f"({event_minutes} event-minutes), {os.cpu_count()} cores"]
    try:
        runs = {}
        for n in (1, 2):
            say(f"tier 1, {n} worker{'s' if n > 1 else ''}: publishing {events:,} events once they hold partitions")
            s = fresh(broker)
            runs[n] = (s, worker_processes(s, n, workdir, events, extra=("--tier", "1", "--until-idle", "5"), publish_after_join=(
                lambda s=s: publish(s, events, slices, seed=5, events_per_minute=events_per_minute))))
        one, two = runs[1][1], runs[2][1]
        cpu_one = one["per_worker"][0]["cpu_seconds_processing"]
        cpus = [w["cpu_seconds_processing"] for w in two["per_worker"]]
        split = [w["events"] for w in two["per_worker"]]
        lines.append(f"tier 1, one worker: {one['events']:,} events, {cpu_one:.1f} CPU-s → {one['events'] / cpu_one:,.0f} "
                     f"events/CPU-s, {one['wall_s']:.1f} s wall")
        lines.append(f"tier 1, two workers: {' + '.join(f'{e:,}' for e in split)} events, "
                     f"{' + '.join(f'{c:.1f}' for c in cpus)} CPU-s, {two['wall_s']:.1f} s wall")
        lines.append(f"  scale-out (events per CPU-second of the busiest worker, two over one): {cpu_one / max(cpus):.2f}×; "
                     f"CPU in all {sum(cpus) / cpu_one:.2f}× one worker's; wall-clock {one['wall_s'] / two['wall_s']:.2f}× "
                     f"on {os.cpu_count()} cores shared with the broker")
        say(f"tier 2: a replica over what the two published, {slo_count} SLOs and every default stage")
        s = runs[2][0]
        slos = slo_file(workdir / "slos.yaml", slo_count)
        writer = worker_processes(s, 1, workdir, 0, all_stages=True, extra=("--tier", "2", "--slos", str(slos)))
        w = writer["per_worker"][0]
        cpu = w["cpu_seconds_processing"]
        minutes = max(1, w.get("minutes_closed") or event_minutes)
        lines.append(f"tier 2: {w['events']:,} tw.sli records, {minutes} minutes landed, {cpu:.1f} CPU-s "
                     f"→ {cpu / minutes:.2f} CPU-s per minute of event time ({slices:,} slices, {slo_count} SLOs)")
        lines.append(sli_sizing(s, writer["stores"][0]))
        stages = w.get("stage_cpu_seconds") or {}
        if stages:
            lines.append("  per minute: " + ", ".join(f"{k} {1000 * v / minutes:.0f} ms"
                                                       for k, v in sorted(stages.items(), key=lambda kv: -kv[1])))
        say("tier 2 replicas: two, each with its own store, one SIGKILLed and restarted three times")
        lines += replica_restarts(s, workdir, slos)
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return lines


def sli_sizing(settings, store_path: Path) -> str:
    """What `tw.sli` holds per slice-minute (bytes of every record tier 1 published, over the
    slice-minutes tier 2 landed from them), and so its retention's size a day."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    import duckdb

    topic = settings.topic(TOPIC_SLI)
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": f"sizing-{os.getpid()}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        total = records = 0
        ended: set[int] = set()
        while len(ended) < len(parts):
            for m in consumer.consume(1000, timeout=2.0):
                if m.error() is None:
                    total += len(m.value() or b"") + len(m.key() or b"")
                    records += 1
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
    finally:
        consumer.close()
    try:
        con = duckdb.connect(str(store_path), read_only=True)
        rows = con.execute("SELECT count(*) FROM sli_minute").fetchall()[0][0]
        con.close()
    except duckdb.Error:
        rows = 0
    if not rows:
        return f"tw.sli: {total:,} bytes in {records:,} records (no landed slice-minutes to size them by)"
    per = total / rows
    return (f"tw.sli: {total:,} bytes in {records:,} records for {rows:,} slice-minutes landed → {per:,.0f} bytes per "
            f"slice-minute: {per * 1440 * 1000 / 1e9:,.2f} GB a day per 1,000 busy slices (each slice busy every minute)")


def _readiness(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/readyz")
        got = conn.getresponse()
        body = got.read()
        return got.status, (msgspec.json.decode(body).get("reason") or body.decode()[:80]) if got.status != 200 else ""
    except OSError:
        return 0, "port closed"
    except msgspec.DecodeError:
        return 0, "not JSON"
    finally:
        conn.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replica_restarts(settings, workdir: Path, slos: Path, rounds: int = 3) -> list[str]:
    ports = [free_port(), free_port()]

    def start(i: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tailwatch", "worker", "--tier", "2", "--bootstrap-servers",
                                 settings.bootstrap_servers, "--topic-prefix", settings.topic_prefix,
                                 "--store", str(workdir / f"replica-{i}.duckdb"),
                                 "--slos", str(slos), "--http-port", str(ports[i])],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    procs = [start(0), start(1)]
    try:
        began = time.monotonic()
        while any(_readiness(port)[0] != 200 for port in ports):
            if time.monotonic() - began > 600 or any(p.poll() is not None for p in procs):
                return ["tier 2 replicas: the two replicas never became ready"]
            time.sleep(0.2)
        took, other_down, phases = [], [], []
        for _ in range(rounds):
            killed_at = time.monotonic()
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait()
            procs[0] = start(0)
            phases, last, down = [], None, 0.0  # (seconds after the kill, what /readyz said) at each change
            while (status := _readiness(ports[0]))[0] != 200:
                if status[1].split(":")[0] != last:
                    last = status[1].split(":")[0]
                    phases.append(f"{time.monotonic() - killed_at:.1f} s {last[:60]}")
                if _readiness(ports[1])[0] != 200:
                    down += 0.05
                if time.monotonic() - killed_at > 300:
                    return [f"tier 2 replicas: the restarted replica was not ready 300 s after the kill (so far: {took})"]
                time.sleep(0.05)
            took.append(time.monotonic() - killed_at)
            other_down.append(down)
            time.sleep(5.0)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    return [f"tier 2 replicas: from SIGKILL to the restarted replica ready: {', '.join(f'{t:.2f}' for t in took)} s; "
            f"the other replica not ready meanwhile: {', '.join(f'{d:.2f}' for d in other_down)} s",
            "  the last restart, /readyz after the kill: " + "; ".join(phases)]
