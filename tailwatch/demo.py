"""`tailwatch demo`: embedded broker → two simulated hours → worker → summary table.

Also sends a handful of malformed records and redelivered duplicates straight to the
topic (bypassing `produce`), to show the worker refusing and counting them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ingest.producer import EventPublisher
from ingest.simulator import FleetSimulator
from slo import histogram
from slo.spec import DEFAULT_SLOS, load_slos
from streams import store
from streams.stages import default_stages
from streams.worker import Worker, WorkerSettings
from tailwatch.broker import EmbeddedBroker, free_port
from tailwatch.cli import progress, progress_done
from tailwatch.kafka import KafkaSettings, ensure_topics, send
from tailwatch.table import render

BAD_RECORDS = [
    b'{"schema": "request.v1", "event_id": "bad-1", ',  # truncated JSON
    b'{"schema": "request.v9", "event_id": "bad-2", "ts": 1, "tenant": "a", "model": "m", "workload": "llm", "status": "ok"}',
    b'{"schema": "request.v1", "event_id": "bad-3", "ts": 1, "tenant": "a", "model": "m", "workload": "llm"}',
    b'{"schema": "request.v1", "event_id": "bad-4", "ts": 1, "tenant": "a", "model": "m", "workload": "llm", "status": "ok", "e2e_ms": -5}',
    b'{"schema": "request.v1", "event_id": "bad-5", "ts": 1, "tenant": "a", "model": "m", "workload": "llm", "status": "ok", "e2e_ms": 1e999}',
    b'{"schema": "request.v1", "event_id": "\xff\xfe", "ts": 1, "tenant": "a", "model": "m", "workload": "llm", "status": "ok"}',
]


def run_demo(minutes: int = 120, seed: int = 7, store_path: str | None = None, port: int | None = None,
             otlp: bool = False, workers: int = 1) -> int:
    """`otlp`: the fleet as an OpenTelemetry Collector ships it (spans and DCGM/vLLM metrics
    on otlp_spans / otlp_metrics), through `ingest otlp` into the worker's topics.
    `workers` > 1: that many `worker --tier 1` processes and the `--tier 2` store writer
    (README "Scaling out") instead of one worker doing everything."""
    started = time.monotonic()
    store_path = store_path or store.DEFAULT_STORE
    if Path(store_path).exists():
        Path(store_path).unlink()  # the demo's broker is new and in memory: start the store afresh too
    port = port or free_port(preferred=9092)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    say(f"[1/4] starting the embedded broker on 127.0.0.1:{port}")
    broker = EmbeddedBroker(port=port, log_path="data/broker.log")
    broker.start()
    try:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap)
        ensure_topics(settings, partitions=4)
        say(f"[2/4] simulating {minutes} minutes of a mixed GPU fleet (scenario mixed-fleet, seed {seed})")
        sim = FleetSimulator("mixed-fleet", minutes, seed)
        pub = EventPublisher(settings)
        # Every 5,000th event is delivered twice, right after itself, as a retrying producer would.
        events, dupes = [], 0
        for i, e in enumerate(sim.events()):
            events.append(e)
            if i % 5_000 == 4_999:
                events.append(e)
                dupes += 1
        if otlp:
            _publish_otlp(settings, pub, events, say)
        else:
            pub.publish_events(events, progress=lambda n: progress(f"      published {n:,} events"))
            for raw in BAD_RECORDS:
                send(pub.producer, settings.topic("requests"), raw, b"demo")
        pub.close()
        del pub
        progress_done()
        if not otlp:
            say(f"      {len(events) - dupes:,} events, {dupes} duplicate deliveries, {len(BAD_RECORDS)} malformed records")
        worker_settings = WorkerSettings(kafka=settings, store_path=store_path, http_port=0, until_idle_s=3.0,
                                         slos=load_slos(DEFAULT_SLOS), stages=default_stages(),
                                         progress=lambda line: progress("      " + line))
        if workers > 1:
            worker = _run_tiers(settings, worker_settings, workers, Path(store_path).parent, say)
        else:
            say("[3/4] running the worker until the topics are drained")
            worker = Worker(worker_settings)
            worker.run()
            progress_done()
        worker.refresh_signals()
    finally:
        broker.stop()
    say("[4/4] summary")
    print(summary(store_path))
    print("\n" + signal_summary(worker.signal_snapshot))
    print(f"\nstore: {Path(store_path).resolve()}   (query it: tailwatch sql \"SELECT * FROM sli_minute LIMIT 5\")")
    print(f"demo finished in {time.monotonic() - started:.0f} s")
    return 0


def _run_tiers(settings: KafkaSettings, worker_settings: WorkerSettings, workers: int, log_dir: Path, say) -> Worker:
    """`workers` tier-1 processes (the firehose) and the store writer here, until the tier-1
    workers have drained every partition and the writer has landed every minute."""
    from dataclasses import replace

    from streams.store_writer import StoreWriter
    from tailwatch.commands import WORKER_GROUPS

    say(f"[3/4] running {workers} tier-1 workers (processes, one consumer group) and the tier-2 store writer")
    log_dir.mkdir(parents=True, exist_ok=True)
    logs = [log_dir / f"demo-tier1-{i + 1}.log" for i in range(workers)]
    procs = []
    for log_path in logs:
        with open(log_path, "wb") as log_file:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tailwatch", "worker", "--tier", "1", "--bootstrap-servers", settings.bootstrap_servers,
                 "--topic-prefix", settings.topic_prefix, "--http-port", "0", "--until-idle", "3"],
                stdout=log_file, stderr=subprocess.STDOUT))
    writer = StoreWriter(replace(worker_settings, group_id=WORKER_GROUPS["2"]))
    try:
        writer.run()
    finally:
        progress_done()
        codes = [p.wait(timeout=120) for p in procs]
    for i, (code, log_path) in enumerate(zip(codes, logs)):
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith("tier 1:")]
        say(f"      tier-1 worker {i + 1}: {lines[-1][len('tier 1: '):] if lines else 'no progress line'}"
            f"{'' if code == 0 else f'  (exit {code}, see {log_path})'}")
    if any(codes):
        raise RuntimeError(f"a tier-1 worker failed: see {', '.join(map(str, logs))}")
    return writer


def _publish_otlp(settings: KafkaSettings, pub: EventPublisher, events: list, say) -> None:
    from ingest.otlp.encode import publish_batches
    from ingest.otlp.mapping import OtlpMapping
    from ingest.otlp.republish import DEFAULT_METRICS_TOPIC, DEFAULT_SPANS_TOPIC, OtlpRepublisher

    ensure_topics(settings, partitions=4, others=(DEFAULT_SPANS_TOPIC, DEFAULT_METRICS_TOPIC))
    sent, native = publish_batches(pub.producer, events, "otlp_proto", DEFAULT_SPANS_TOPIC, DEFAULT_METRICS_TOPIC,
                                   progress=lambda line: progress(f"      published {line}"))
    pub.publish_events(native)
    for raw in (b"\x0a\xff\xff not a batch", b'{"resourceSpans": [ cut short'):
        send(pub.producer, DEFAULT_SPANS_TOPIC, raw)
    pub.producer.flush(60)
    progress_done()
    say(f"      {sent['spans']:,} span batches and {sent['metrics']:,} metric batches (otlp_proto; some spans "
        "delivered twice), 2 malformed batches; `ingest otlp` republishes them")
    report = OtlpRepublisher(settings, OtlpMapping()).run(
        until_idle_s=3.0, progress=lambda line: progress("      " + line))
    progress_done()
    for line in report.lines():
        say("      " + line)


def summary(store_path: str) -> str:
    con = store.connect(store_path, read_only=True)
    try:
        counts = con.execute("""
            SELECT workload, zone, sum(requests), sum(ok), sum(errors + timeouts), sum(cancelled), sum(retries),
                   sum(successful_turns), sum(turns)
            FROM sli_minute GROUP BY ALL ORDER BY ALL""").fetchall()
        hists = {}
        for field in ("first_output_ms", "e2e_ms"):
            rows = con.execute(f"""
                SELECT workload, zone, h.bin, sum(h.n)
                FROM (SELECT workload, zone, unnest({field}_hist) AS h FROM sli_minute) GROUP BY ALL""").fetchall()
            for w, z, b, n in rows:
                hists.setdefault((field, w, z), {})[b] = n
        dead = con.execute("SELECT reason, count(*) FROM dead_letter GROUP BY ALL ORDER BY 2 DESC, 1").fetchall()
        gpus = con.execute("SELECT count(DISTINCT node || gpu_index), round(avg(util_pct_mean), 1) FROM gpu_minute").fetchone()
        pages = con.execute("""
            SELECT slo, labels, alert_window, strftime(fired_at, '%H:%M') AS fired, strftime(resolved_at, '%H:%M') AS resolved,
                   round(long_burn_rate, 1) AS burn_long, round(short_burn_rate, 1) AS burn_short
            FROM alerts WHERE severity = 'page' ORDER BY fired_at""").fetchall()
        detections = con.execute("""
            SELECT detector, slice, strftime(started_at, '%H:%M') AS started, strftime(ended_at, '%H:%M') AS ended
            FROM detections ORDER BY started_at, detector""").fetchall()
    finally:
        con.close()
    rows = []
    for w, z, req, ok, bad, cancelled, retries, succ, turns in counts:
        valid = req - cancelled
        rows.append([
            w, z, req, round(100 * ok / valid, 3) if valid else None, bad, retries,
            _q(hists.get(("first_output_ms", w, z)), 0.95), _q(hists.get(("e2e_ms", w, z)), 0.99),
            round(100 * succ / turns, 2) if turns else None,
        ])
    cols = ["workload", "zone", "requests", "availability_%", "errors+timeouts", "retries",
            "first_output_p95_ms", "e2e_p99_ms", "task_success_%"]
    out = "SLIs per workload and zone (availability = ok ÷ attempts excluding client cancellations)\n"
    out += render(cols, rows)
    out += f"\n\nGPUs sampled: {gpus[0]}, mean utilisation {gpus[1]}%"
    out += "\ndead letters by reason: " + (", ".join(f"{r} {n}" for r, n in dead) if dead else "none")
    out += "\n\nPages raised by the default SLOs (event time; `tailwatch slo status` for every SLO)\n"
    out += render(["slo", "slice", "window", "fired", "resolved", "burn_long", "burn_short"], pages)
    out += "\n\nDetections (why users hurt; evidence in `tailwatch sql \"SELECT * FROM detections\"`)\n"
    out += render(["detector", "slice", "started", "ended"], detections)
    return out


def signal_summary(snapshot) -> str:
    """What an autoscaler and a rollout controller would read from the signal API now."""
    if snapshot is None or not snapshot.pools:
        return "signal API: no data"
    rows = [[name, e.body["current_replicas"], e.body["desired_replicas"], e.body["signals"]["queue_age_p95_ms"],
             e.body["signals"]["first_output_p95_ms"], e.body["reasons"][0][:70]]
            for name, e in sorted(snapshot.pools.items()) if name.endswith("-realtime")]
    out = "GET /v1/autoscale/{pool} for the realtime pools (last 5 minutes of event time)\n"
    out += render(["pool", "current", "desired", "queue_age_p95_ms", "first_output_p95_ms", "first reason"], rows)
    verdicts = [[m, v, e.body["verdict"], (e.body["reasons"] or [""])[0][:90]]
                for (m, v), e in sorted(snapshot.rollouts.items()) if e.body.get("canary")]
    out += "\n\nGET /v1/rollout/{model}/{version} for the canaries (last 30 minutes)\n"
    out += render(["model", "version", "verdict", "first reason"], verdicts)
    pressed = [[name, e.body["pressure"][0][:60] if e.body["pressure"] else "",
                *next(([s["step"], f"{s['load_removed_gpu_s_per_s']:.2f}"] for s in e.body["steps"] if s["enough"]),
                      ["-", "-"]),
                sum(g["rejected"] for g in e.body["admission"]["groups"])]
               for name, e in sorted(snapshot.shed.items()) if e.body["under_pressure"]]
    out += "\n\nGET /v1/shed/{pool} for the pools under pressure (the ladder's first sufficient step)\n"
    out += render(["pool", "pressure", "step", "frees_gpu_s_per_s", "rejected_next_minute"], pressed) if pressed \
        else "no pool under pressure"
    return out


def _q(hist: dict | None, q: float) -> float | None:
    v = histogram.quantile_ms(hist, q) if hist else None
    return round(v, 1) if v is not None else None
