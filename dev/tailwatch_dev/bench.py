"""`tailwatch bench`: events per CPU-second through the whole worker, against a baseline.

One run, one embedded broker: synthetic `request.v1` traffic over many live slices is
published once per measurement, then drained by (a) the batch worker (consume, decode,
validate, dedupe, window, store sink), (b) the naive faust agent of
`tailwatch_dev.bench_faust`, (c) optionally two worker processes in one consumer group, and
(d) optionally a long run that samples the worker's memory. Ratios, not absolute times,
are the result: they are measured in the same session on the same machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from tailwatch.signals.live import SignalWindows
from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.cli import progress, progress_done
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, make_producer, send
from tailwatch.conventions import PROCESS_MEMORY_BYTES, STATE_BYTES, STORE_MEMORY_LIMIT_BYTES, TOPIC_REQUESTS

T0_MS = 1_793_577_600_000
WORKLOADS = ("asr", "tts", "llm", "s2s")


def synthetic_events(n: int, slices: int, seed: int = 1, events_per_minute: int = 100_000):
    """(key, value) pairs of valid request.v1 JSON, about 340 bytes each, in event-time order."""
    rng = np.random.default_rng(seed)
    labels = []
    for i in range(slices):
        w = WORKLOADS[i % 4]
        tenant = f"tenant-{i % 97:03d}"
        labels.append((tenant, (
            f'"tenant":"{tenant}","model":"model-{i % 13}","model_version":"v{i % 7}","zone":"zone-{i % 3}",'
            f'"workload":"{w}","traffic_class":"{"realtime" if i % 5 else "batch"}","deployment":"{"canary" if i % 11 == 0 else "stable"}",'
            f'"pool":"{w}-pool-{i % 29}","region":"r1","endpoint":"/v1/{w}"'
        )))
    chunk = 100_000
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        idx = np.arange(start, start + m)
        ts = T0_MS + (idx * 60_000) // events_per_minute
        sl = rng.integers(0, slices, m)
        status = np.where(rng.random(m) < 0.01, "error", "ok")
        q = rng.lognormal(2.5, 0.8, m)
        fo = rng.lognormal(5.8, 0.4, m)
        e2e = fo + rng.lognormal(7.5, 0.5, m)
        out = rng.integers(20, 400, m)
        for j in range(m):
            tenant, lab = labels[sl[j]]
            yield tenant.encode(), (
                f'{{"schema":"request.v1","event_id":"b{seed}-{idx[j]:x}","ts":{ts[j]},{lab},"status":"{status[j]}",'
                f'"http_status":200,"attempt":1,"task_success":true,"queue_ms":{q[j]:.2f},"first_output_ms":{fo[j]:.2f},'
                f'"e2e_ms":{e2e[j]:.2f},"prompt_tokens":512,"output_tokens":{out[j]},"gpu_seconds":0.41,"gpu_sku":"H100"}}'
            ).encode()


def publish(settings: KafkaSettings, n: int, slices: int, seed: int, events_per_minute: int = 100_000) -> None:
    p = make_producer(settings)
    topic = settings.topic(TOPIC_REQUESTS)
    for i, (k, v) in enumerate(synthetic_events(n, slices, seed, events_per_minute), 1):
        send(p, topic, v, k)
        if i % 100_000 == 0:
            p.poll(0)
            progress(f"  published {i:,}/{n:,}")
    p.flush(120)
    progress_done()


def fresh(broker: EmbeddedBroker, partitions: int = 4) -> KafkaSettings:
    s = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"b{uuid.uuid4().hex[:6]}.")
    ensure_topics(s, partitions)
    return s


def worker_processes(settings: KafkaSettings, count: int, workdir: Path, total: int, sample_memory: bool = False,
                     all_stages: bool = False, extra: tuple[str, ...] = (), publish_after_join=None,
                     holders_at: tuple[int, ...] = (), code: tuple[str, Path] | None = None) -> dict:
    """`count` worker processes in one fresh group, run until idle; `extra`: more flags
    (`--tier 1`: tier-1 workers, which drain their share, so exit 0 is required).
    `publish_after_join`: called once every worker holds partitions (so that no start-up
    rebalance moves partitions mid-stream, whose re-reads are not what is measured).
    `holders_at` (with `sample_memory`): event counts at which the first worker's memory by
    holder and by part of its state is scraped (`memory_by_holder`), returned as `holders`.
    `code`: (an interpreter, a source tree) whose worker to run instead of this tree's (another
    release's, tools/bench_release.py)."""
    tiered = "--tier" in extra
    procs, stats_files, ports = [], [], []
    group = f"bench-{uuid.uuid4().hex[:6]}"
    for i in range(count):
        stats = workdir / f"stats-{group}-{i}.json"
        port = free_port()
        cmd = [code[0] if code else sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", settings.bootstrap_servers,
               "--topic-prefix", settings.topic_prefix, "--store", str(workdir / f"{group}-{i}.duckdb"),
               "--group", group, "--http-port", str(port), "--until-idle", "3", "--stats-file", str(stats)]
        if not all_stages:
            cmd += ["--slos", "none"]  # the firehose alone: SLO evaluation is measured by `bench --slo`
        cmd += list(extra)
        if count > 1 and not tiered:
            # Each worker owns part of the log and its own store, so none is ever drained
            # (exit 3): the scaling figure is about consuming, not closing.
            cmd += ["--drain-timeout", "1s"]
        env = None if code is None else {**os.environ, "PYTHONPATH": str(code[1])}
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                      cwd=None if code is None else code[1]))
        stats_files.append(stats)
        ports.append(port)
    if publish_after_join is not None:
        _wait_for_group(ports)
        publish_after_join()
    rss_samples: list[tuple[float, int]] = []
    accepted = {port: 0.0 for port in ports}
    holders: dict[int, dict[str, float]] = {}
    while any(p.poll() is None for p in procs):
        if sample_memory:
            for port in ports:  # a busy worker may not answer a scrape in time: keep its last count
                accepted[port] = _accepted(port) or accepted[port]
            done = sum(accepted.values())
            for mark in holders_at:
                if done >= mark and mark not in holders and procs[0].poll() is None:
                    holders[mark] = memory_by_holder(ports[0])
            rss = sum(_rss_bytes(p.pid) for p in procs if p.poll() is None)
            if rss:
                rss_samples.append((done, rss))
            progress(f"  {done:,.0f}/{total:,} events, RSS {rss / 2**20:,.0f} MiB")
        time.sleep(1.0)
    if sample_memory:
        progress_done()
    results = [json.loads(f.read_text()) for f in stats_files]
    if any(p.returncode not in ((0, 3) if count > 1 and not tiered else (0,)) for p in procs):
        raise RuntimeError(f"a worker exited with {[p.returncode for p in procs]}")
    events = sum(r["events"] for r in results)
    first = min(r["first_event_monotonic"] for r in results if r["first_event_monotonic"])
    last = max(r["last_event_monotonic"] for r in results if r["last_event_monotonic"])
    cpu = sum(r["cpu_seconds_processing"] for r in results)
    return {"events": events, "wall_s": last - first, "cpu_s": cpu, "per_worker": results, "rss": rss_samples,
            "holders": holders, "stores": [workdir / f"{group}-{i}.duckdb" for i in range(count)]}


def _wait_for_group(ports: list[int], timeout_s: float = 90.0) -> None:
    """Until every worker says it owns partitions (/healthz), then two seconds more for the
    group to settle. (The embedded broker describes a group without its members.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        owned = [_health(port).get("partitions_owned", 0) for port in ports]
        if all(owned):
            time.sleep(2.0)
            return
        time.sleep(0.5)
    raise RuntimeError(f"the {len(ports)} workers did not all get partitions within {timeout_s:.0f} s")


def _health(port: int) -> dict:
    try:
        return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read())
    except (OSError, ValueError):
        return {}


def _accepted(port: int) -> float | None:
    """Events the worker has seen, from /healthz: /metrics would make the busy worker render
    its whole exposition every second (with 20,000 slices, hundreds of thousands of series),
    which is the measurement disturbing what it measures."""
    seen = _health(port).get("events_seen")
    return float(seen) if seen is not None else None


def _holder_table(holders: dict[int, dict[str, float]]) -> list[str]:
    """What held the worker's memory at each mark (MiB): the process by holder, then each part
    of its state as last measured (the memory run has the worker measure it every `--state-every`, 5 s by default)."""
    if not holders:
        return []
    names = list(dict.fromkeys(n for h in holders.values() for n in h if n not in ("state", "store_limit")))
    lines = ["worker memory by holder and by part of its state (MiB) at: "
             + ", ".join(f"{mark / 1e6:,.2f} M" for mark in sorted(holders))]
    for name in names:
        lines.append(f"  {name}: " + ", ".join(f"{holders[mark].get(name, 0.0):,.0f}" for mark in sorted(holders)))
    return lines


def memory_by_holder(port: int) -> dict[str, float]:
    """The worker's memory (MiB) from one /metrics scrape: by holder (streams/process_memory.py),
    its state's total (`state`) and each part of it (`state:<component>`, as last measured), and
    the store's memory limit (`store_limit`). Seldom: the exposition of many slices is not free."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except (OSError, ValueError):
        return out
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == PROCESS_MEMORY_BYTES:
                out[sample.labels["holder"]] = sample.value / 2**20
            elif sample.name == STATE_BYTES:
                out["state"] = out.get("state", 0.0) + sample.value / 2**20
                out[f"state:{sample.labels['component']}"] = sample.value / 2**20
            elif sample.name == STORE_MEMORY_LIMIT_BYTES:
                out["store_limit"] = sample.value / 2**20
    return out


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_baseline(settings: KafkaSettings, n: int, workdir: Path, variant: str) -> dict:
    faust_bin = shutil.which("faust", path=str(Path(sys.executable).parent)) or shutil.which("faust")
    if faust_bin is None:
        raise RuntimeError("faust-streaming is not installed: pip install -e './dev[bench]'")
    result = workdir / f"baseline-{variant}.txt"
    env = {**os.environ, "BENCH_BOOTSTRAP": settings.bootstrap_servers, "BENCH_TOPIC": settings.topic(TOPIC_REQUESTS),
           "BENCH_EVENTS": str(n), "BENCH_RESULT": str(result), "BENCH_APP_ID": f"baseline-{uuid.uuid4().hex[:6]}", "BENCH_VARIANT": variant}
    proc = subprocess.run([faust_bin, "-A", "tailwatch_dev.bench_faust", "--datadir", str(workdir / "faust"), "worker", "-l", "error"],
                          env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    if not result.exists():
        raise RuntimeError(f"the faust baseline exited with {proc.returncode} before reporting")
    events, cpu, wall = result.read_text().split()
    return {"events": int(events), "cpu_s": float(cpu), "wall_s": float(wall)}


def run_bench(args) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="tailwatch-bench-"))
    broker = EmbeddedBroker(port=args.port or free_port())
    broker.start()
    lines = []
    try:
        if args.memory_run:
            _memory_run(args, broker, workdir, lines)
            return 0
        print(f"worker: {args.events:,} events over {args.slices:,} slices, {args.events_per_minute:,} per event-minute",
              file=sys.stderr)
        s = fresh(broker)
        publish(s, args.events, args.slices, seed=1, events_per_minute=args.events_per_minute)
        one = worker_processes(s, 1, workdir, args.events)
        rate = one["events"] / one["cpu_s"]
        lines.append(f"batch worker, 1 process: {one['events']:,} events, {one['cpu_s']:.1f} CPU-s "
                     f"→ {rate:,.0f} events/CPU-s ({one['events'] / one['wall_s']:,.0f} events/s wall)")
        stages = one["per_worker"][0].get("stage_cpu_seconds") or {}
        if stages:
            lines.append("  of which stages: " + ", ".join(f"{k} {v:.2f} CPU-s" for k, v in sorted(stages.items())))
        if not args.skip_baseline:
            for variant, title in (("record", "faust agent, faust.Record per event"),
                                   ("msgspec", "faust agent, msgspec per event")):
                print(f"baseline: {args.baseline_events:,} events through a {title}", file=sys.stderr)
                s = fresh(broker)
                publish(s, args.baseline_events, args.slices, seed=2, events_per_minute=args.events_per_minute)
                base = run_baseline(s, args.baseline_events, workdir, variant)
                base_rate = base["events"] / base["cpu_s"]
                lines.append(f"{title}: {base['events']:,} events, {base['cpu_s']:.1f} CPU-s "
                             f"→ {base_rate:,.0f} events/CPU-s; the batch worker does {rate / base_rate:,.1f}× that")
        if args.workers > 1:
            print(f"scaling: {args.events:,} events, {args.workers} worker processes in one group", file=sys.stderr)
            s = fresh(broker)
            publish(s, args.events, args.slices, seed=3, events_per_minute=args.events_per_minute)
            many = worker_processes(s, args.workers, workdir, args.events)
            lines.append(f"{args.workers} worker processes: {many['events']:,} events in {many['wall_s']:.1f} s wall "
                         f"→ {many['events'] / many['wall_s']:,.0f} events/s "
                         f"({(many['events'] / many['wall_s']) / (one['events'] / one['wall_s']):.2f}× one process)")
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        print("\n".join(lines))
    return 0


def _memory_run(args, broker: EmbeddedBroker, workdir: Path, lines: list[str]) -> None:
    print(f"memory: {args.events:,} events over {args.slices:,} slices, RSS sampled each second", file=sys.stderr)
    s = fresh(broker)
    publish(s, args.events, args.slices, seed=4, events_per_minute=args.events_per_minute)
    marks = (1_000_000, *(int(f * args.events) for f in (0.25, 0.5, 0.75, 1.0)))
    # The end's scrape comes a moment before the last event: the worker exits once drained.
    mem = worker_processes(s, 1, workdir, args.events, sample_memory=True,
                           extra=("--state-every", f"{args.state_every:g}s"),
                           holders_at=tuple(sorted({*marks[:-1], int(0.98 * args.events)})))
    samples = mem["rss"]
    lines.append(f"worker: {mem['events']:,} events, {mem['events'] / mem['cpu_s']:,.0f} events/CPU-s")
    if samples:
        # Medians of the samples near each mark: a close's transient frames spike RSS for a
        # second or two, and a single sample at a mark measured the spike, not the level.
        def median_near(events: int) -> float | None:
            near = sorted(rss for done, rss in samples if abs(done - events) <= 0.05 * args.events)
            return near[len(near) // 2] / 2**20 if near else None

        rss_at = {events: median_near(events) for events in marks}
        lines.append("worker RSS (median of the samples within 5% of the run around each mark): "
                     + ", ".join(f"{mib:,.0f} MiB at {events / 1e6:,.2f} M" for events, mib in rss_at.items() if mib)
                     + f"; peak {max(rss for _, rss in samples) / 2**20:,.0f} MiB")
        if rss_at[1_000_000] and rss_at[args.events]:
            # The bound held to: RSS at the end within 10% of RSS at 1 M events.
            lines.append(f"RSS at the end against RSS at 1 M events: {rss_at[args.events] / rss_at[1_000_000] - 1:+.1%}")
        lines += _holder_table(mem["holders"])
        history = SignalWindows().history_minutes
        lines.append(f"at {args.events_per_minute:,} events per event-minute the open minutes (allowed lateness 5 min "
                     f"+ the newest, + up to 5 of watermark drift) fill after about {6 * args.events_per_minute / 1e6:,.1f} M "
                     f"events, the signal view's {history} minutes of closed rows after about "
                     f"{(6 + history) * args.events_per_minute / 1e6:,.1f} M: RSS is level only after both")
