"""`tailwatch demo`: embedded broker → two simulated hours → worker → summary table.

Also sends a handful of malformed records and redelivered duplicates straight to the
topic (bypassing `produce`), to show the worker refusing and counting them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tailwatch.ingest.producer import EventPublisher
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.slo import histogram
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.store.connection import DEFAULT_STORE, connect
from tailwatch.streams.stages import default_stages
from tailwatch.streams.runtime import Runtime
from tailwatch.streams.tiers import WorkerSettings, build
from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.cli import progress, progress_done
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, send
from tailwatch.table import render
from tailwatch.backtest import read_buckets, replay
from tailwatch.signals.answers import Shed
from tailwatch.signals.rollout import CanaryStory, VerdictStep, canary_story
from tailwatch.slo.alert_windows import minute_text
from tailwatch.conventions import TOPIC_REQUESTS

_TS = b'"ts": 1793577600000'  # 2026-11-02T00:00:00Z, the demo's first minute
BAD_RECORDS = [
    b'{"schema": "request.v1", "event_id": "bad-1", ',  # truncated JSON
    b'{"schema": "request.v9", "event_id": "bad-2", ' + _TS + b', "tenant": "a", "model": "m", "workload": "llm", "status": "ok"}',
    b'{"schema": "request.v1", "event_id": "bad-3", ' + _TS + b', "tenant": "a", "model": "m", "workload": "llm"}',
    b'{"schema": "request.v1", "event_id": "bad-4", ' + _TS + b', "tenant": "a", "model": "m", "workload": "llm", "status": "ok", "e2e_ms": -5}',
    b'{"schema": "request.v1", "event_id": "bad-5", ' + _TS + b', "tenant": "a", "model": "m", "workload": "llm", "status": "ok", "e2e_ms": 1e999}',
    b'{"schema": "request.v1", "event_id": "\xff\xfe", ' + _TS + b', "tenant": "a", "model": "m", "workload": "llm", "status": "ok"}',
    # A hostile producer: nested past any parser's recursion limit, and stamped 2099.
    b'{"schema": "request.v1", "event_id": "bad-7", "x": ' + b"[" * 5000 + b"]" * 5000 + b'}',
    b'{"schema": "request.v1", "event_id": "bad-8", "ts": 4070908800000, "tenant": "a", "model": "m", "workload": "llm", "status": "ok"}',
]


def run_demo(minutes: int | None = None, seed: int = 7, store_path: str | None = None, port: int | None = None,
             otlp: bool = False, workers: int = 1, scenario: str = "mixed-fleet") -> int:
    """`otlp`: the fleet as an OpenTelemetry Collector ships it (spans and DCGM/vLLM metrics
    on otlp_spans / otlp_metrics), through `ingest otlp` into the worker's topics.
    `workers` > 1: that many `worker --tier 1` processes and a `--tier 2` replica
    (README "Scaling out") instead of one worker doing everything."""
    started = time.monotonic()
    store_path = store_path or DEFAULT_STORE
    if Path(store_path).exists():
        Path(store_path).unlink()  # the demo's broker is new and in memory: start the store afresh too
    port = port or free_port(preferred=9092)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    say(f"[1/5] starting the embedded broker on 127.0.0.1:{port}")
    broker = EmbeddedBroker(port=port, log_path="data/broker.log")
    broker.start()
    try:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap)
        ensure_topics(settings, partitions=4)
        sim = FleetSimulator(scenario, minutes, seed)
        say(f"[2/5] simulating {sim.minutes} minutes of a mixed GPU fleet (scenario {scenario}, seed {seed})")
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
                send(pub.producer, settings.topic(TOPIC_REQUESTS), raw, b"demo")
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
            say("[3/5] running the worker until the topics are drained")
            worker = build(worker_settings)
            worker.run()
            progress_done()
        # The answers as the signal API would build them now (the worker's view holds them
        # encoded, as its HTTP port serves them).
        final_answers = worker.signals.snapshot(*worker.operator.open_minutes(), wall_s=time.time()) if worker.signals else None
    finally:
        broker.stop()
    say("[4/5] replaying the store minute by minute through the signal API's decisions (as `tailwatch backtest`)")
    history = SignalHistory.of(store_path)
    say("[5/5] summary")
    print(summary(store_path))
    print("\n" + signal_summary(final_answers, history))
    tw = command_name()
    print(f"\nstore: {Path(store_path).resolve()}\nnext: {tw} sql \"SELECT * FROM alerts\"   {tw} slo status   "
          f"{tw} report readiness --model llama-3.1-70b   {tw} report cost   (README: the tour)")
    print(f"demo finished in {time.monotonic() - started:.0f} s")
    return 0


def command_name() -> str:
    """How to run tailwatch from here: `tailwatch` when it is on PATH, else the path of the
    one running (`.venv/bin/tailwatch` after `make demo`)."""
    import os
    import shutil

    me = Path(sys.argv[0]).resolve()
    found = shutil.which("tailwatch")
    if found and Path(found).resolve() == me:
        return "tailwatch"
    if me.name == "tailwatch":
        relative = os.path.relpath(me)
        return str(me) if relative.startswith("..") else relative
    return f"{sys.executable} -m tailwatch"


@dataclass
class SignalHistory:
    """What the signal API answered, minute by minute, over the whole store: each canary's
    story and each pool's answer at its worst minute of pressure (a backtest's replay)."""

    canaries: dict[tuple[str, str], CanaryStory]
    pressure: dict[str, tuple[int, Shed]]  # pool → (minute, its shed answer then)

    @classmethod
    def of(cls, store_path: str) -> "SignalHistory":
        requests, gpu = read_buckets(store_path)
        steps: dict[tuple[str, str], list[VerdictStep]] = {}
        pressure: dict[str, tuple[int, Shed, float]] = {}
        for minute, snap in replay(requests, gpu):
            for key, e in snap.rollouts.items():
                if e.body.canary:
                    steps.setdefault(key, []).append(VerdictStep(minute, e.body.verdict, (e.body.reasons or [""])[0],
                                                                 tuple(e.body.decided_by or ())))
            for pool, e in snap.shed.items():
                over = e.body.demand_gpu_s_per_s - e.body.capacity_gpu_s_per_s
                if e.body.under_pressure and (pool not in pressure or over > pressure[pool][2]):
                    pressure[pool] = (minute, e.body, over)
        return cls({k: canary_story(v) for k, v in steps.items()}, {p: (m, b) for p, (m, b, _) in pressure.items()})


def _run_tiers(settings: KafkaSettings, worker_settings: WorkerSettings, workers: int, log_dir: Path, say) -> Runtime:
    """`workers` tier-1 processes (the firehose) and a tier-2 replica here, until the tier-1
    workers have drained every partition and the writer has landed every minute."""
    from dataclasses import replace

    from tailwatch.commands import WORKER_GROUPS

    say(f"[3/5] running {workers} tier-1 workers (processes, one consumer group) and a tier-2 replica")
    log_dir.mkdir(parents=True, exist_ok=True)
    logs = [log_dir / f"demo-tier1-{i + 1}.log" for i in range(workers)]
    procs = []
    for log_path in logs:
        with open(log_path, "wb") as log_file:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tailwatch", "worker", "--tier", "1", "--bootstrap-servers", settings.bootstrap_servers,
                 "--topic-prefix", settings.topic_prefix, "--http-port", "0", "--until-idle", "3"],
                stdout=log_file, stderr=subprocess.STDOUT))
    writer = build(replace(worker_settings, group_id=WORKER_GROUPS["2"]), tier="2")
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
    from tailwatch.ingest.otlp.encode import publish_batches
    from tailwatch.ingest.otlp.mapping import OtlpMapping
    from tailwatch.ingest.otlp.republish import DEFAULT_METRICS_TOPIC, DEFAULT_SPANS_TOPIC, OtlpRepublisher

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
    con = connect(store_path, read_only=True)
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
            SELECT slo, labels, alert_window, strftime(fired_at, '%Y-%m-%d %H:%M') AS fired,
                   strftime(resolved_at, '%Y-%m-%d %H:%M') AS resolved,
                   round(long_burn_rate, 1) AS burn_long, round(short_burn_rate, 1) AS burn_short
            FROM alerts WHERE severity = 'page' ORDER BY fired_at""").fetchall()
        detections = con.execute("""
            SELECT detector, slice, strftime(started_at, '%Y-%m-%d %H:%M') AS started,
                   strftime(ended_at, '%Y-%m-%d %H:%M') AS ended
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


def signal_summary(snapshot, history: SignalHistory | None = None) -> str:
    """What an autoscaler and a rollout controller would read from the signal API at the end,
    and, from the replay, what it said along the way."""
    if snapshot is None or not snapshot.pools:
        return "signal API: no data"
    pools = [(name, e) for name, e in sorted(snapshot.pools.items()) if name.endswith("-realtime")]
    end = minute_text(snapshot.as_of_minute + 1) if snapshot.as_of_minute is not None else "the end"
    rows = [[name, e.body.current_replicas, e.body.desired_replicas, e.body.signals.queue_age_p95_ms,
             e.body.signals.first_output_p95_ms] for name, e in pools]
    out = f"GET /v1/autoscale/{{pool}} for the realtime pools at {end} (over the last 5 minutes of event time)\n"
    out += render(["pool", "current", "desired", "queue_age_p95_ms", "first_output_p95_ms"], rows)
    out += "\n" + "\n".join(f"  {name}: {e.body.reasons[0]}" for name, e in pools if e.body.reasons)
    out += f"\n\nGET /v1/rollout/{{model}}/{{version}} for the canaries: the worst verdict over the run, and the verdict at {end}\n"
    lines = []
    for (model, version), e in sorted(snapshot.rollouts.items()):
        if not e.body.canary:
            continue
        story = history.canaries.get((model, version)) if history else None
        told = story.sentence(minute_text) if story else f"{e.body.verdict} ({(e.body.reasons or [''])[0]})"
        lines.append(f"  {model} {version}: {told}")
    out += "\n".join(lines) if lines else "  no canary"
    out += "\n\nGET /v1/shed/{pool} for each pool that was under pressure, as it answered at its worst minute\n"
    if history and history.pressure:
        for pool, (minute, body) in sorted(history.pressure.items()):
            enough = next((s for s in body.steps if s.enough), None)
            rejected = sum(g.rejected for g in body.admission.groups)
            out += (f"  {pool} at {minute_text(minute)}: {'; '.join(body.pressure)}\n    "
                    + (f"first sufficient step: {enough.step} ({enough.action}), freeing "
                       f"{enough.load_removed_gpu_s_per_s:.2f} GPU-s/s" if enough else "no step of the ladder is enough")
                    + f"; the admission plan would reject {rejected:,} requests in the next minute\n")
    else:
        out += "  no pool was under pressure\n"
    return out.rstrip("\n")


def _q(hist: dict | None, q: float) -> float | None:
    v = histogram.quantile_ms(hist, q) if hist else None
    return round(v, 1) if v is not None else None
