"""The development tools' commands: `tailwatch broker`, `simulate`, `demo`, `eval`, `fuzz` and
`bench`. The runtime's command line finds them through the `tailwatch.commands` entry point of
this distribution (tailwatch-dev), so an installation of the runtime alone (the container image)
has none of them and imports nothing from here."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec

from tailwatch.cli import (CliError, arg_count, arg_duration_s, arg_mib, arg_port, arg_positive, arg_positive_int,
                           kafka_args, kafka_settings, otlp_topic_args, progress, progress_done)
from tailwatch.ingest.kafka import ensure_reachable

# One example (or a few) per command, shown under its --help.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "broker": ("tailwatch broker --port 9092",),
    "simulate": ("tailwatch simulate --scenario retry-storm --minutes 60    # into the tw.* topics",
                 "tailwatch simulate --minutes 30 --out events.jsonl --truth incidents.jsonl",
                 "tailwatch simulate --scenario nope    # prints the known scenarios"),
    "eval detectors": ("tailwatch eval detectors --scenario retry-storm --scenario queue-saturation",),
    "fuzz decode": ("tailwatch fuzz decode --records 100000 --seed 3",),
    "demo": ("tailwatch demo", "tailwatch demo --seed 11 --store /tmp/demo.duckdb"),
    "bench": ("tailwatch bench --shape both", "tailwatch bench --api --seconds 10"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the development commands to the command line's subcommands."""
    p = sub.add_parser("broker", help="run the embedded Kafka-compatible broker (Tansu) in the foreground")
    p.set_defaults(handler=cmd_broker)
    p.add_argument("--port", type=arg_port, default=9092, help="TCP port to listen on, on 127.0.0.1")

    p = sub.add_parser("simulate", help="simulate a GPU inference fleet with scripted incidents")
    p.set_defaults(handler=cmd_simulate)
    p.add_argument("--scenario", default="mixed-fleet",
                   help="the scripted fleet and its incidents: mixed-fleet, retry-storm, queue-saturation, zone-loss, "
                        "… (an unknown name prints every scenario)")
    p.add_argument("--minutes", type=arg_positive_int, default=None, help="simulated minutes (default 120; zone-loss 75)")
    p.add_argument("--seed", type=int, default=7, help="random seed: the same seed, scenario and minutes give byte-identical events")
    p.add_argument("--start", default=None, help="RFC 3339 start of simulated time (default 2026-11-02T00:00:00Z; "
                   "zone-loss 13:00, before the diurnal peak)")
    p.add_argument("--rate-scale", type=arg_positive, default=None, help="multiply every request rate (default 1; zone-loss 0.33)")
    p.add_argument("--gpu-samples-per-minute", type=arg_positive_int, default=6,
                   help="GPU samples per GPU per minute (default 6; 1 keeps multi-day runs light)")
    p.add_argument("--eval-share", type=float, default=0.0, metavar="SHARE",
                   help="share of answered ASR and TTS requests a scorer samples, sent as eval.v1 (default 0)")
    p.add_argument("--out", default=None, metavar="FILE.jsonl", help="write JSON Lines here instead of to Kafka")
    p.add_argument("--truth", default=None, metavar="FILE", help="write the labelled incidents (JSON Lines) here")
    p.add_argument("--trace", default=None, metavar="CSV", help="replay an Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens)")
    p.add_argument("--format", choices=("json", "otlp"), default="json",
                   help="json: request.v1/gpu.v1 to tw.* topics; otlp: spans and metrics batches as an "
                        "OpenTelemetry Collector's kafka exporter writes them")
    p.add_argument("--otlp-encoding", choices=("otlp_proto", "otlp_json"), default="otlp_proto", help="with --format otlp: protobuf or JSON encoding of the OTLP messages")
    otlp_topic_args(p)
    kafka_args(p)

    p = sub.add_parser("eval", help="measure detectors against scenarios with labelled incidents")
    p.set_defaults(handler=cmd_eval)
    esub = p.add_subparsers(dest="eval_command", required=True, metavar="WHAT")
    c = esub.add_parser("detectors", help="a scenario through broker + worker: recall, false alerts per day, delay")
    c.add_argument("--scenario", action="append", default=None, metavar="NAME",
                   help="a detector scenario (repeatable), or `all` (default: all)")
    c.add_argument("--seed", type=int, default=7, help="the scenario's random seed")
    c.add_argument("--minutes", type=arg_positive_int, default=None,
                   help="simulated minutes (default: 200, and 1440 for quiet-day)")
    c.add_argument("--rate-scale", type=arg_positive, default=0.3, help="multiply every request rate (default 0.3)")
    c.add_argument("--detectors", default="default", metavar="FILE", help="detector settings (default: built-in)")
    c.add_argument("--trace", action="append", default=None, metavar="FILE",
                   help="a public trace instead of the simulator (repeatable): Azure LLM inference CSV or Mooncake "
                        "JSONL; a quiet day built from it, then the same day with every incident kind injected")
    c.add_argument("--repeats", type=arg_positive_int, default=3, help="with --trace: incidents of each kind (default 3)")

    p = sub.add_parser("fuzz", help="fuzz the record decode path with invariants (a developer's check)")
    p.set_defaults(handler=cmd_fuzz)
    fsub = p.add_subparsers(dest="fuzz_command", required=True, metavar="WHAT")
    c = fsub.add_parser("decode", help="generated and mutated records through the decoder as the worker calls it: "
                                       "nothing raises, every record is its events or one dead letter")
    c.add_argument("--records", type=arg_positive_int, default=1_000_000, help="records to generate and mutate")
    c.add_argument("--seed", type=int, default=1, help="random seed (a failure names the seed and record that reproduce it)")
    c.add_argument("--batch-size", type=arg_positive_int, default=500, help="records per decode call, as the worker batches them")

    p = sub.add_parser("demo", help="embedded broker + two simulated hours + worker + summary")
    p.set_defaults(handler=cmd_demo)
    p.add_argument("--scenario", default="mixed-fleet", help="the simulator's scenario (default mixed-fleet; "
                   "zone-loss for the drill)")
    p.add_argument("--minutes", type=arg_positive_int, default=None, help="simulated minutes (default: the scenario's, 120 for mixed-fleet)")
    p.add_argument("--seed", type=int, default=7, help="the simulation's random seed")
    p.add_argument("--store", default=None, help="DuckDB file the demo writes (default data/tailwatch.duckdb)")
    p.add_argument("--port", type=arg_port, default=None, help="broker port (default: 9092, or a free one)")
    p.add_argument("--otlp", action="store_true",
                   help="ship the fleet as an OpenTelemetry Collector would (OTLP spans and DCGM/vLLM metrics "
                        "on Kafka) and run `ingest otlp` before the worker")
    p.add_argument("--workers", type=arg_positive_int, default=1,
                   help="N > 1: N tier-1 worker processes and a tier-2 replica instead of one worker")

    p = sub.add_parser("bench", help="throughput benchmark of the worker against a naive faust agent")
    p.set_defaults(handler=cmd_bench)
    p.add_argument("--events", type=arg_positive_int, default=1_000_000, help="synthetic events to replay through the worker")
    p.add_argument("--slices", type=arg_positive_int, default=20_000, help="distinct slices the events fall into")
    p.add_argument("--events-per-minute", type=arg_positive_int, default=600_000,
                   help="event-time density of the synthetic traffic (default 600,000: 10,000 requests/s)")
    p.add_argument("--baseline-events", type=arg_positive_int, default=60_000, help="events for the faust baseline (it is slower: its rate is per event)")
    p.add_argument("--workers", type=arg_positive_int, default=1, help="also measure with this many worker processes")
    p.add_argument("--port", type=arg_port, default=None, help="broker port (default: a free one)")
    p.add_argument("--skip-baseline", action="store_true", help="measure the worker only, not the faust baseline")
    p.add_argument("--memory-run", action="store_true", help="run long and report memory over time")
    p.add_argument("--state-every", type=arg_duration_s, default=5.0, metavar="DURATION",
                   help="memory run: the worker's --state-every (default 5s; at tens of thousands of slices "
                        "each measure walks every detector's history, so a long run may want 1m)")
    p.add_argument("--slo", action="store_true",
                   help="benchmark the SLO engine instead: --slo-count SLOs over --slices live slices")
    p.add_argument("--slo-count", type=arg_positive_int, default=100, help="SLO bench: SLOs to judge")
    p.add_argument("--history-minutes", type=arg_positive_int, default=120,
                   help="SLO bench: minutes of history first (43200: a full 30-day window, fed a minute every 6 hours)")
    p.add_argument("--month", action="store_true",
                   help="a month of event time (sparse: --busy-slices slices, a request each every --every-minutes) "
                        "through the embedded broker and a worker with every default stage: RSS at days 2, 10, 20 "
                        "and 30, CPU, store size and the 30-day budgets against an exact count")
    p.add_argument("--label-flood", action="store_true",
                   help="a producer bug: --flood-requests requests with a new tenant and model each, among a steady "
                        "tenant's, through one worker with its default caps: peak RSS, /metrics latency, overflow counts")
    p.add_argument("--flood-requests", type=arg_positive_int, default=200_000, help="label-flood bench: flood requests")
    p.add_argument("--busy-slices", type=arg_positive_int, default=1_000, help="month bench: busy slices")
    p.add_argument("--every-minutes", type=arg_positive_int, default=5, help="month bench: minutes between a slice's requests")
    p.add_argument("--days", type=arg_positive_int, default=30, help="month bench: days of event time (and 17 minutes)")
    p.add_argument("--store-memory-limit", type=arg_mib, default=None,
                   metavar="MIB", help="month bench: the worker's --store-memory-limit (default: the worker's)")
    p.add_argument("--rollup", default=None, metavar="STORE",
                   help="roll a copy of STORE up to --retention-days of minutes: time taken, rows, store size")
    p.add_argument("--retention-days", type=arg_positive_int, default=7, help="roll-up bench: days of minutes kept")
    p.add_argument("--restore", default=None, metavar="STORE",
                   help="a new replica's time to ready from a snapshot of STORE: snapshot, restore, worker start")
    p.add_argument("--restore-fleet", action="store_true",
                   help="the same on a store of --days (or --hours) of history at --slices busy slices (a request each every "
                        "--every-minutes), its minutes closed by the worker's window operator")
    p.add_argument("--api", action="store_true",
                   help="benchmark the signal API with wrk instead: idle worker vs worker under load")
    p.add_argument("--against", default=None, metavar="REF",
                   help="API bench: also measure the worker of git commit REF, interleaved with this tree's (ABAB)")
    p.add_argument("--rate", type=arg_positive_int, default=500, help="API bench: requests per second to pace wrk to")
    p.add_argument("--seconds", type=arg_positive_int, default=20, help="API bench: seconds per wrk run")
    p.add_argument("--rounds", type=arg_positive_int, default=3,
                   help="API bench with --against, shape bench with --against-release: rounds of each tree, "
                        "interleaved (default 3)")
    p.add_argument("--unauthenticated", type=arg_count, default=2_500, metavar="N",
                   help="API bench: connections polling with a wrong token while authorised clients poll on new "
                        "connections (default 2,500; 0: skip)")
    p.add_argument("--shape", choices=("dense", "sparse", "both"), default=None,
                   help="replay a public trace through a worker with every default stage: each trace-hour in one "
                        "event-minute (dense), at its own pace (sparse), or both")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="shape bench: an Azure CSV or Mooncake JSONL trace (default: the Azure code trace in tests/data)")
    p.add_argument("--against-release", default=None, metavar="DIR",
                   help="shape bench: against the pinned baseline release checked out in DIR (tailwatch_dev/bench_release.py), "
                        "interleaved --rounds times, on --trace (default: both public traces)")
    p.add_argument("--release-python", default=None, metavar="PATH",
                   help="with --against-release: the release's interpreter (default DIR/.venv/bin/python)")
    p.add_argument("--hours", type=arg_positive_int, default=None,
                   help="shape bench: trace-hours to replay (default: 60 dense, 24 sparse); restore-fleet: hours "
                        "of history of --slices slices busy every minute, in place of --days")
    p.add_argument("--otlp", action="store_true",
                   help="spans per CPU-second through the OTLP adapter, on a public trace (--trace, --spans)")
    p.add_argument("--spans", type=arg_positive_int, default=20_000, help="OTLP bench: requests of the trace to send as spans")
    p.add_argument("--tiers", action="store_true",
                   help="tier 1's scale-out (1 vs 2 `worker --tier 1`) and a tier-2 replica's CPU per event-minute "
                        "with --slo-count SLOs over --slices slices")
    p.add_argument("--chaos", action="store_true",
                   help="the fault soak instead: a public-trace stream through broker, workers and Alertmanager with "
                        "seeded kills, rebalances, poison, silent partitions and pauses, checked against the log")
    p.add_argument("--seed", type=int, default=7, help="chaos: the fault schedule's seed")
    p.add_argument("--minutes", type=arg_positive_int, default=120, help="chaos: event-minutes of traffic (default 120)")
    p.add_argument("--out", default=None, metavar="DIR", help="chaos: where the run's files go (default: a temp dir); month: where its "
                        "memory chart goes (default: none drawn)")


def cmd_broker(args: argparse.Namespace) -> int:
    from tailwatch_dev.broker import EmbeddedBroker

    import signal

    broker = EmbeddedBroker(port=args.port)
    # SIGTERM (a service manager, `kill`) stops the broker as Ctrl-C does, child included.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    broker.start(foreground_output=True)
    print(f"embedded broker ready on {broker.bootstrap} (in memory; Ctrl-C stops it)", file=sys.stderr)
    try:
        while broker.proc is not None and broker.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
    return 0


def _source(args: argparse.Namespace):
    from tailwatch_dev.simulator import DEFAULT_START, FleetSimulator
    from tailwatch_dev.trace import TraceReplay

    if args.trace:
        return TraceReplay(args.trace, minutes=args.minutes or 120, seed=args.seed, start=args.start or DEFAULT_START)
    return FleetSimulator(args.scenario, args.minutes, args.seed, args.start, args.rate_scale,
                          getattr(args, "gpu_samples_per_minute", 6), getattr(args, "eval_share", 0.0))


def cmd_simulate(args: argparse.Namespace) -> int:
    sim = _source(args)
    if args.truth:
        Path(args.truth).write_bytes(b"".join(msgspec.json.encode(t) + b"\n" for t in sim.truth()))
    if args.out:
        enc = msgspec.json.Encoder()
        n = 0
        with open(args.out, "wb") as fh:
            for n, event in enumerate(sim.events(), 1):
                fh.write(enc.encode(event) + b"\n")
                if n % 50_000 == 0:
                    progress(f"simulate: {n:,} events")
        progress_done()
        print(f"wrote {n:,} events to {args.out}", file=sys.stderr)
        return 0
    from tailwatch.ingest.producer import EventPublisher

    settings = kafka_settings(args)
    ensure_reachable(settings)
    from tailwatch.ingest.kafka import ensure_topics

    otlp = args.format == "otlp"
    ensure_topics(settings, others=(args.spans_topic, args.metrics_topic) if otlp else ())
    pub = EventPublisher(settings)
    if otlp:
        return _simulate_otlp(args, sim, pub)
    report = pub.publish_events(sim.events(), progress=lambda n: progress(f"simulate: {n:,} events published"))
    pub.close()
    progress_done()
    for line in report.lines():
        print(line)
    return 0


def _simulate_otlp(args: argparse.Namespace, sim, pub) -> int:
    """The simulator's fleet as a Collector's kafka exporter would write it."""
    from tailwatch.ingest.otlp.encode import publish_batches

    sent, native = publish_batches(pub.producer, sim.events(), args.otlp_encoding, args.spans_topic, args.metrics_topic,
                                   progress=lambda line: progress(f"simulate: {line}"))
    report = pub.publish_events(native)
    pub.close()
    progress_done()
    print(f"published {sent['spans']:,} span batches to {args.spans_topic} and {sent['metrics']:,} metric batches "
          f"to {args.metrics_topic} ({args.otlp_encoding})")
    for line in report.lines() if native else ():
        print(line)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from tailwatch_dev.eval_detectors import EVAL_SCENARIOS, SUITE, cmd_eval_detectors, cmd_eval_traces

    if args.trace:
        if args.scenario:
            raise CliError("--trace and --scenario are exclusive: a trace run builds its own scenarios")
        return cmd_eval_traces(args.trace, args.seed, args.minutes or 1440, args.repeats, args.detectors)
    names = args.scenario or ["all"]
    scenarios = list(EVAL_SCENARIOS) if "all" in names else names
    unknown = [n for n in scenarios if n not in (*EVAL_SCENARIOS, SUITE)]
    if unknown:
        raise CliError(f"unknown detector scenario {unknown[0]!r}; known: {', '.join(EVAL_SCENARIOS)}, {SUITE}, all")
    return cmd_eval_detectors(scenarios, args.seed, args.minutes, args.rate_scale, args.detectors)


def cmd_demo(args: argparse.Namespace) -> int:
    from tailwatch_dev.demo import run_demo

    return run_demo(minutes=args.minutes, seed=args.seed, store_path=args.store, port=args.port, otlp=args.otlp,
                    workers=args.workers, scenario=args.scenario)


def cmd_fuzz(args: argparse.Namespace) -> int:
    from tailwatch_dev.fuzz_decode import run as fuzz_decode

    report = fuzz_decode(args.records, args.seed, args.batch_size, progress=progress)
    progress_done()
    print("\n".join(report.lines()))
    return 1 if report.violations else 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.chaos:
        import tempfile

        from tailwatch_dev.chaos import ChaosSetupError, run_chaos

        out = args.out or tempfile.mkdtemp(prefix="tailwatch-chaos-")
        try:
            report = run_chaos(args.seed, args.minutes, out, progress=lambda m: print(m, file=sys.stderr, flush=True))
        except ChaosSetupError as exc:
            raise CliError(str(exc)) from None
        print(report.table())
        return 0 if report.ok else 1
    if args.rollup:
        from tailwatch_dev.bench_restore import run_rollup

        print("\n".join(run_rollup(args.rollup, args.retention_days, say=lambda m: print(m, file=sys.stderr, flush=True))))
        return 0
    if args.restore:
        from tailwatch_dev.bench_restore import run as run_restore

        print("\n".join(run_restore(args.restore, say=lambda m: print(m, file=sys.stderr, flush=True))))
        return 0
    if args.restore_fleet:
        from tailwatch_dev.bench_restore import run_fleet

        print("\n".join(run_fleet(args.slices, args.days, args.every_minutes,
                                  say=lambda m: print(m, file=sys.stderr, flush=True), hours=args.hours)))
        return 0
    if args.tiers:
        from tailwatch_dev.bench_tiers import run as run_tiers

        print("\n".join(run_tiers(args.events, args.slices, args.events_per_minute, args.slo_count, args.port)))
        return 0
    if args.api:
        from tailwatch_dev.bench_api import BenchError, compare, run as run_api

        say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        try:
            if args.against:
                print("\n".join(compare(args.against, args.rate, args.seconds, say=say, rounds=args.rounds)))
            else:
                print("\n".join(run_api(args.rate, args.seconds, say=say, unauthenticated=args.unauthenticated)))
        except BenchError as exc:
            raise CliError(str(exc)) from None
        return 0
    if args.otlp:
        from tailwatch_dev.bench_otlp import run as run_otlp
        from tailwatch_dev.bench_trace import DEFAULT_TRACE

        print("\n".join(run_otlp(Path(args.trace) if args.trace else DEFAULT_TRACE, args.spans,
                                 say=lambda m: print(m, file=sys.stderr, flush=True))))
        return 0
    if args.against_release:
        from tailwatch_dev.bench_release import ReleaseError, compare, release_code
        from tailwatch_dev.bench_trace import SHAPES
        from tailwatch_dev.trace import TraceError
        from tailwatch_dev.traces import AZURE_CODE_TRACE, MOONCAKE_TRACE

        shapes = SHAPES if args.shape in (None, "both") else (args.shape,)
        traces = [Path(args.trace)] if args.trace else [AZURE_CODE_TRACE, MOONCAKE_TRACE]
        try:
            code = release_code(Path(args.against_release), Path(args.release_python) if args.release_python else None)
            print("\n".join(compare(traces, shapes, args.rounds, code, args.hours)))
        except (ReleaseError, TraceError) as exc:
            raise CliError(str(exc)) from None
        return 0
    if args.shape or args.trace:
        from tailwatch_dev.trace import TraceError
        from tailwatch_dev.bench_trace import DEFAULT_TRACE, SHAPES, run as run_trace

        shapes = SHAPES if args.shape in (None, "both") else (args.shape,)
        try:
            print("\n".join(run_trace(Path(args.trace) if args.trace else DEFAULT_TRACE, shapes, args.hours,
                                      args.baseline_events, args.skip_baseline)))
        except TraceError as exc:
            raise CliError(str(exc)) from None
        return 0
    if args.label_flood:
        from tailwatch_dev.bench_flood import run_flood

        print("\n".join(run_flood(args.flood_requests)))
        return 0
    if args.month:
        from tailwatch_dev.bench_month import run_month

        print("\n".join(run_month(args.busy_slices, args.days, args.every_minutes,
                                   out=Path(args.out) if args.out else None,
                                   store_memory_limit_mib=args.store_memory_limit)))
        return 0
    if args.slo:
        from tailwatch_dev.bench_slo import run

        print("\n".join(run(args.slo_count, args.slices, args.history_minutes)))
        return 0
    from tailwatch_dev.bench import run_bench

    return run_bench(args)
