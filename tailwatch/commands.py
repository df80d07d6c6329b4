"""One function per subcommand: wires settings to the rooms that do the work."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path

import msgspec

from tailwatch.cli import CliError, kafka_settings, progress, progress_done
from tailwatch.ingest.kafka import ensure_reachable


def load_mapping_option(path: str | None):
    from tailwatch.ingest.otlp.mapping import MappingError, load_mapping

    try:
        return load_mapping(path)
    except MappingError as exc:
        raise CliError(f"--mapping {exc}") from None


def cmd_ingest(args: argparse.Namespace) -> int:
    from tailwatch.ingest.otlp.republish import OtlpRepublisher
    from tailwatch.ingest.kafka import ensure_topics

    mapping = load_mapping_option(args.mapping)
    settings = kafka_settings(args)
    ensure_reachable(settings)
    ensure_topics(settings, others=(args.spans_topic, args.metrics_topic))
    republisher = OtlpRepublisher(settings, mapping, args.spans_topic, args.metrics_topic, args.group,
                                  max_drift_ms=int(args.max_drift * 1000))
    report = republisher.run(args.until_idle, progress=progress)
    progress_done()
    for line in report.lines():
        print(line)
    return 0


def cmd_otlp(args: argparse.Namespace) -> int:
    from tailwatch.ingest.otlp.mapping import MappingError, check_mapping

    try:
        problems = check_mapping(args.file)
    except MappingError as exc:
        raise CliError(str(exc)) from None
    for problem in problems:
        print(f"{args.file}: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{args.file}: no problems")
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from tailwatch.ingest.producer import EventPublisher
    from tailwatch.ingest.kafka import ensure_topics

    for f in args.files:
        if f != "-" and not Path(f).is_file():
            raise CliError(f"no such file {f}")
    settings = kafka_settings(args)
    ensure_reachable(settings)
    ensure_topics(settings)
    pub = EventPublisher(settings)
    for f in args.files:
        if f == "-":
            pub.publish_lines(sys.stdin.buffer, "stdin")
        else:
            with open(f, "rb") as fh:
                pub.publish_lines(fh, Path(f).name)
    pub.close()
    for line in pub.report.lines():
        print(line)
    return 0


def load_slo_option(value: str | None):
    """`--slos`: a file, `default` or `none` → a list of SloSpec (or None)."""
    from tailwatch.slo.spec import DEFAULT_SLOS, SpecErrors, load_slos

    if value in (None, "none"):
        return None
    path = DEFAULT_SLOS if value == "default" else value
    try:
        return load_slos(path)
    except SpecErrors as exc:
        raise CliError(f"--slos {value}: {exc.problems[0]} (run `tailwatch slo check {value}` for all)") from None


def load_api_config_option(path: str | None):
    from tailwatch.signals.config import ApiConfigError, load_api_config

    try:
        return load_api_config(path)
    except ApiConfigError as exc:
        raise CliError(f"--api-config {exc}") from None


def load_prices_option(path: str | None):
    from tailwatch.planning.prices import PriceError, load_prices

    try:
        return load_prices(path)
    except PriceError as exc:
        raise CliError(f"--prices {exc}") from None


def _worker_settings(args: argparse.Namespace, **overrides):
    from tailwatch.streams.fleet_metrics import FleetMetricsConfig
    from tailwatch.streams.stages import default_stages
    from tailwatch.store.connection import DEFAULT_STORE, STORE_MEMORY_LIMIT_MIB
    from tailwatch.streams.cardinality import CardinalityLimits
    from tailwatch.streams.tiers import WorkerSettings

    api_config = load_api_config_option(args.api_config)
    prices = load_prices_option(args.prices)
    links = alert_links(args, worker_base_url(args.http_host, args.http_port))
    if args.http_host not in ("127.0.0.1", "localhost", "::1") and not api_config.auth_required:
        raise CliError(f"--http-host {args.http_host}: serving beyond loopback needs bearer tokens in --api-config")
    settings = dict(
        group_id=getattr(args, "group", None) or "tailwatch-worker",
        api_config=api_config,
        http_host=args.http_host,
        prices=prices,
        slos=load_slo_option(args.slos),
        slos_file="the built-in set" if args.slos in (None, "default") else args.slos,
        alertmanager_urls=tuple(args.alertmanager_url or ()),
        kafka=kafka_settings(args),
        store_path=args.store or DEFAULT_STORE,
        http_port=args.http_port,
        until_idle_s=args.until_idle,
        allowed_lateness_s=args.allowed_lateness,
        correction_horizon_s=getattr(args, "correction_horizon", 86400.0),
        minute_retention_s=getattr(args, "minute_retention", 35 * 86400.0),
        store_memory_limit_mib=getattr(args, "store_memory_limit", None) or STORE_MEMORY_LIMIT_MIB,
        idle_timeout_s=args.idle_timeout,
        max_watermark_drift_s=args.max_watermark_drift,
        drain_timeout_s=args.drain_timeout,
        instance_id=args.instance_id,
        partitions=args.partitions,
        batch_size=args.batch_size,
        checkpoint_interval_s=args.checkpoint_interval,
        checkpoint_max_rows=args.checkpoint_max_rows,
        cardinality=CardinalityLimits(max_values_per_label=args.max_label_values, max_slices=args.max_slices,
                                      forget_after_ms=int(args.label_values_forget_after * 1000)),
        state_every_s=args.state_every,
        stats_file=args.stats_file,
        progress=progress,
        stages=default_stages(args.detectors, tuple(args.alertmanager_url or ()), links,
                              FleetMetricsConfig(max_tenants=args.metrics_max_tenants,
                                                 max_label_sets=args.metrics_max_label_sets,
                                                 prices=prices)),
        alert_links=links,
    )
    settings.update(overrides)
    _check_retention(settings)
    return WorkerSettings(**settings)


def _check_retention(settings: dict) -> None:
    """Minutes must outlive what reads them: the SLO windows (rebuilt from minutes at start) and corrections."""
    retention_s = settings.get("minute_retention_s") or 0
    if not retention_s:
        return
    longest_min = max((s.period_minutes for s in settings.get("slos") or []), default=0)
    needed_s = longest_min * 60 + settings.get("correction_horizon_s", 0) + 3600
    if retention_s < needed_s:
        raise CliError(f"--minute-retention {retention_s / 86400:g}d is shorter than the longest SLO window "
                       f"({longest_min / 1440:g}d) plus the correction horizon and an hour: at least "
                       f"{needed_s / 86400:.2f}d")


WORKER_GROUPS = {"all": "tailwatch-worker", "1": "tailwatch-tier1", "2": "tailwatch-tier2"}


def _announce(who: str, notes: list[str] | None = None):
    """A worker's start and stop lines on stderr, always (a status line in progress is ended
    first); `notes` (what its SLO file does not say as written) follow the start line, so that
    a worker that cannot start says why in one line."""
    def say(line: str) -> None:
        progress_done()
        print(f"{who}: {line}", file=sys.stderr, flush=True)
        if line.startswith("started"):
            for note in notes or ():
                print(f"{who}: warning: {note}", file=sys.stderr, flush=True)

    return say


def cmd_worker(args: argparse.Namespace) -> int:
    from tailwatch.streams.process_memory import settle_malloc

    settle_malloc()  # before the consumer's threads start, so they share glibc's two arenas
    overrides = {}
    if args.group is None:
        overrides["group_id"] = WORKER_GROUPS[args.tier]
    if args.tier == "1":
        overrides.update(slos=None, stages=[])
    settings = _worker_settings(args, **overrides)
    from tailwatch.slo.spec import spec_warnings

    settings.announce = _announce(f"tailwatch worker{' --tier ' + args.tier if args.tier != 'all' else ''}",
                                  [w for spec in settings.slos or () for w in spec_warnings(spec)])
    ensure_reachable(settings.kafka)
    if args.restore_from:
        _restore_store(args.restore_from, settings.store_path, args.tier)
    from tailwatch.streams.partial_publisher import PublishRefused
    from tailwatch.streams.runtime import NotDrained
    from tailwatch.streams.tiers import build

    try:
        code = build(settings, args.tier).run()
    except OSError as exc:
        raise CliError(f"cannot serve HTTP on port {args.http_port}: {exc.strerror}") from None
    except (NotDrained, PublishRefused) as exc:  # one line each; 3: not drained, 1: Kafka refused tier 1's output
        progress_done()
        print(f"tailwatch worker: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, NotDrained) else 1
    progress_done()
    return code


def _restore_store(folder: str, store_path: str, tier: str) -> None:
    from tailwatch.store import snapshot

    if tier == "1":
        raise CliError("--restore-from: a tier-1 worker keeps no store")
    manifest = snapshot.restore(folder, store_path)
    if manifest is None:
        print(f"tailwatch worker: {store_path} already holds data; resuming from it, not from {folder}", file=sys.stderr)
        return
    print(f"tailwatch worker: restored {store_path} from {folder} (taken {manifest.written_at}, newest minute "
          f"{manifest.newest_minute}, {sum(manifest.rows.values()):,} rows); catching up from its offsets", file=sys.stderr)


def cmd_store(args: argparse.Namespace) -> int:
    from tailwatch.store.connection import DEFAULT_STORE
    from tailwatch.store import snapshot

    folder = args.dir
    manifest = snapshot.write(args.store or DEFAULT_STORE, folder)
    offsets = sum(len(parts) for parts in manifest.offsets.values())
    print(f"snapshot of {args.store or DEFAULT_STORE} in {folder}: {sum(manifest.rows.values()):,} rows in "
          f"{len(manifest.rows)} tables, newest minute {manifest.newest_minute}, offsets of {offsets} partitions "
          f"(restore: tailwatch worker --restore-from {folder})")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    import duckdb

    from tailwatch.store.connection import DEFAULT_STORE, connect
    from tailwatch.table import render

    # A running worker lets go of the store every 20 s: wait for that moment.
    con = connect(args.store or DEFAULT_STORE, read_only=True, wait_s=30.0)
    try:
        cur = con.execute(args.query)
    except duckdb.Error as exc:
        raise CliError(str(exc).splitlines()[0]) from None
    if cur.description is None:
        return 0
    cols = [d[0] for d in cur.description]
    print(render(cols, cur.fetchall(), args.format))
    return 0


def _capacity_measured(args: argparse.Namespace) -> int:
    from tailwatch.store.connection import DEFAULT_STORE, connect
    from tailwatch.store.queries import has_table
    from tailwatch.streams.signal_stage import load_pool_capacity
    from tailwatch.table import render

    con = connect(args.store or DEFAULT_STORE, read_only=True, wait_s=30.0)
    try:
        rows = load_pool_capacity(con, args.days) if has_table(con, "pool_capacity") else None
        if rows is None or rows.height == 0:
            raise CliError(f"no capacity measured yet: {_why_no_capacity(con, rows is not None)}")
    finally:
        con.close()
    if args.pool:
        rows = rows.filter(rows["pool"] == args.pool)
        if rows.height == 0:
            raise CliError(f"no capacity measured for pool {args.pool!r}")
    import polars as pl

    summary = rows.sort("day").group_by("pool", maintain_order=True).agg(
        pl.col("best").max().alias("capacity"), pl.col("day").sort_by("best").last().alias("best_day"),
        pl.col("day").count().alias("days_measured")).sort("pool")
    table = [[pool, round(cap, 4), str(day), n] for pool, cap, day, n in summary.iter_rows()]
    print("work per warm replica (GPU-s/s), sustained with queue age and first output within SLO; best day per pool")
    print(render(["pool", "capacity", "best_day", "days_measured"], table))
    return 0


def _why_no_capacity(con, signal_stage_ran: bool) -> str:
    """What the store says about why no pool's capacity is measured, in the order a user
    would look: the stage that measures it, the GPU samples it reads, the sustained minutes."""
    from tailwatch.store.queries import has_table

    if not signal_stage_ran:
        return ("no worker with the signal stage has written this store: a worker serving the signal API "
                "(--http-port) measures it as minutes close")
    gpu = con.execute("SELECT count(DISTINCT pool), count(DISTINCT window_start) FROM gpu_minute").fetchone() \
        if has_table(con, "gpu_minute") else (0, 0)
    if not gpu[0]:
        return "the store holds no GPU samples (tw.gpu): capacity is work per warm replica, read from them"
    pools = f"{gpu[0]:,} pool" + ("s" if gpu[0] != 1 else "")
    return (f"the store holds {gpu[1]:,} minutes of GPU samples over {pools}, but no pool held 3 "
            "consecutive minutes with work on warm replicas and its queue age and first output within the SLO "
            "(a pool that breached all along, or sent no replica states, has no held capacity)")


def cmd_collect(args: argparse.Namespace) -> int:
    if args.collector == "prometheus":
        return _collect_prometheus(args)
    import pynvml

    from tailwatch.ingest import nvml

    nvml.init(pynvml)
    node = args.node or nvml.default_node()
    publisher = None
    if not args.print_only:
        from tailwatch.ingest.producer import EventPublisher

        settings = kafka_settings(args)
        ensure_reachable(settings)
        publisher = EventPublisher(settings)
    enc = msgspec.json.Encoder()
    gpm = nvml.GpmReader(pynvml)  # keeps each GPU's previous GPM sample between intervals
    rounds = 0
    try:
        if gpm.start():  # the first samples, so that the first round already has an interval behind it
            time.sleep(min(1.0, args.interval))
        while True:
            samples = nvml.read_samples(pynvml, int(time.time() * 1000), node, args.zone, args.pool, gpm=gpm)
            if publisher:
                publisher.publish_events(samples)
                publisher.producer.flush(10)
            else:
                for s in samples:
                    print(enc.encode(s).decode())
                sys.stdout.flush()
            rounds += 1
            if args.count and rounds >= args.count:
                break
            time.sleep(args.interval)
    finally:
        if publisher:
            publisher.close()
        gpm.close()
        pynvml.nvmlShutdown()
    return 0


def _collect_prometheus(args: argparse.Namespace) -> int:
    from tailwatch.ingest.otlp.scrape import PrometheusScraper, ScrapeError

    mapping = load_mapping_option(args.mapping)
    publisher = None
    if not args.print_only:
        from tailwatch.ingest.producer import EventPublisher

        settings = kafka_settings(args)
        ensure_reachable(settings)
        publisher = EventPublisher(settings)
    if not args.url and not args.targets:
        raise CliError("give --url URL (repeatable) or --targets FILE")
    try:
        scraper = PrometheusScraper(args.url, mapping, targets_file=args.targets)
    except ScrapeError as exc:
        raise CliError(str(exc)) from None
    enc = msgspec.json.Encoder()
    rounds = 0
    try:
        while True:
            started = time.monotonic()
            scraped = scraper.round(int(time.time() * 1000))
            for line in scraped.errors:
                print(f"tailwatch collect prometheus: {line}", file=sys.stderr)
            for reason, detail in (*scraped.gpu.refused, *scraped.requests.refused):
                print(f"tailwatch collect prometheus: {reason}: {detail}", file=sys.stderr)
            events = [*scraped.gpu.samples, *scraped.requests.events]
            if publisher:
                publisher.publish_events(events)
                publisher.producer.flush(10)
            else:
                for event in events:
                    print(enc.encode(event).decode())
                sys.stdout.flush()
            rounds += 1
            if args.count and rounds >= args.count:
                break
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    finally:
        if publisher:
            publisher.close()
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    from tailwatch.store.connection import DEFAULT_STORE
    from tailwatch.backtest import cmd_backtest_autoscale, cmd_backtest_rollout

    path = args.store or DEFAULT_STORE
    if args.backtest_command == "autoscale" and args.trace:
        from tailwatch.config.plugins import BACKTEST_TRACE, dev_hook

        cmd_backtest_trace = dev_hook(BACKTEST_TRACE)
        if cmd_backtest_trace is None:
            raise CliError("--trace replays a public trace: it needs the development tools (tailwatch-dev, "
                           "which `make setup` installs)")
        if args.store or args.pool or args.start or args.end or args.per_minute:
            raise CliError("--trace replays a trace through a simulated pool: --store, --pool, --from, --to and "
                           "--per-minute are for the store's replay")
        if not args.rate_scale > 0 or args.startup_minutes < 0:
            raise CliError("--rate-scale must be above 0 and --startup-minutes at least 0")
        return cmd_backtest_trace(args.trace, args.week, args.rate_scale, args.startup_minutes, args.format)
    if args.backtest_command == "autoscale":
        return cmd_backtest_autoscale(path, args.pool, args.start, args.end, load_slo_option(args.slos),
                                      args.per_minute, args.format)
    return cmd_backtest_rollout(path, args.model, args.version, args.start, args.end, args.format)


def cmd_drill(args: argparse.Namespace) -> int:
    from tailwatch.store.connection import DEFAULT_STORE
    from tailwatch.drill import cmd_drill_zone_loss

    return cmd_drill_zone_loss(args.store or DEFAULT_STORE, args.zone, args.start, args.end, load_slo_option(args.slos),
                               args.model, args.minutes_after, args.format)


def slo_check(path: str, store_path: str | None) -> int:
    """What was understood of each SLO, then every warning and problem; 1 when there are problems."""
    from tailwatch.slo.check import check_file, unmatched_selector_warning
    from tailwatch.slo.spec import spec_warnings

    report = check_file(path)
    report.warnings.extend(w for spec in report.specs for w in spec_warnings(spec))
    if store_path and report.specs:
        from tailwatch.store.connection import connect
        from tailwatch.store.queries import selector_rows

        con = connect(store_path, read_only=True)
        try:
            total = selector_rows(con, {})
            for spec in report.specs:
                warning = unmatched_selector_warning(spec, selector_rows(con, spec.selector), total,
                                                     Path(store_path).name)
                if warning:
                    report.warnings.append(warning)
        finally:
            con.close()
    for line in report.understood:
        print(line)
    for warning in report.warnings:
        print(f"{path}: warning: {warning}")
    for problem in report.problems:
        print(f"{path}: {problem}", file=sys.stderr)
    if report.problems:
        print(f"{path}: {len(report.problems)} problems", file=sys.stderr)
        return 1
    print(f"{path}: {len(report.specs)} SLOs, no problems" + (f", {len(report.warnings)} warnings" if report.warnings else ""))
    return 0


def cmd_slo(args: argparse.Namespace) -> int:

    if args.slo_command == "check":
        return slo_check(args.file, args.store)
    specs = load_slo_option(args.slos or "default")
    if args.slo:
        specs = [s for s in specs if s.name == args.slo]
        if not specs:
            raise CliError(f"no SLO named {args.slo!r}")
    from tailwatch.slo_status import print_status

    return print_status(specs, args.store, args.at)


def cmd_rollout(args: argparse.Namespace) -> int:
    import yaml

    from tailwatch.signals.recipes import argo_rollout, argo_templates, flagger_canary

    from tailwatch.config.kubernetes import RULE, is_kubernetes_name, kubernetes_name

    if args.target and not is_kubernetes_name(args.target):
        raise CliError(f"--target {args.target!r} is not {RULE}; '{kubernetes_name(args.target)}' would do")
    try:
        target = args.target or kubernetes_name(args.model)  # Flagger names Services after it
    except ValueError as exc:
        raise CliError(f"--model: {exc}; pass --target NAME") from None
    if args.controller == "flagger":
        docs = [flagger_canary(target, args.namespace, args.model, args.version, args.url, args.token)]
    else:
        if args.token:
            raise CliError("--token is for Flagger; Argo reads the token from the Secret tailwatch-token")
        docs = [*argo_templates(args.url), argo_rollout(target, args.namespace, args.model, args.version)]
    print(yaml.safe_dump_all(docs, sort_keys=False, width=120), end="")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    import yaml

    from tailwatch.deploy.generate import FLAGGER_TOKEN_ENV, manifests, write
    from tailwatch.deploy.preflight import ApiResourcesError, missing, served_kinds
    from tailwatch.deploy.settings import DeployError, load_settings
    from tailwatch.planning.prices import PriceFile
    from tailwatch.slo.spec import DEFAULT_SLOS

    specs = load_slo_option(args.slos) or []
    load_prices_option(args.prices)  # refused here, not in a pod that cannot start
    try:
        settings = load_settings(args.settings)
        slos_yaml = Path(DEFAULT_SLOS if args.slos == "default" else args.slos).read_text()
        prices_yaml = Path(args.prices).read_text() if args.prices else yaml.safe_dump(msgspec.to_builtins(PriceFile(
            usd_per_gpu_hour=dict(load_prices_option(None).usd_per_gpu_hour))), sort_keys=False)
        mapping_yaml = Path(args.otlp_mapping).read_text() if args.otlp_mapping else None
        if args.deploy_command == "preflight":
            # only the kinds are read: a Canary's token does not change them
            token = os.environ.get(FLAGGER_TOKEN_ENV) or "preflight"
            files = manifests(settings, specs, slos_yaml, prices_yaml, mapping_yaml, token)
            absent = missing(files, served_kinds(Path(args.api_resources).read_text()))
            for m in absent:
                print(m.line())
            kinds = len({(o["apiVersion"], o["kind"]) for objects in files.values() for o in objects})
            print(f"{kinds - len(absent)} of {kinds} kinds the manifests use are served by the cluster")
            return 1 if absent else 0
        written = write(settings, specs, slos_yaml, prices_yaml, mapping_yaml, args.out)
    except (DeployError, OSError, ApiResourcesError) as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {written.objects} objects in {len(written.files)} files to {args.out}; "
          f"deploy with: kubectl apply -k {args.out}")
    if written.templates:
        print("fill in secrets.yaml first (keep the filled copy out of version control): "
              + "; ".join(written.templates))
    if written.secrets:
        print("create these Secrets first: " + "; ".join(written.secrets))
    return 0


def cmd_dashboards(args: argparse.Namespace) -> int:
    from tailwatch.dashboards.generate import write

    specs = load_slo_option(args.slos) or []
    paths = write(specs, args.out)
    print(f"wrote {len(paths)} dashboards for {len(specs)} SLOs to {args.out}: {', '.join(p.name for p in paths)}")
    return 0


def time_range_option(args: argparse.Namespace):
    """`--from` / `--to` (RFC 3339 or a date, UTC; `--to` a date includes that day) as
    aware datetimes, None where not given."""
    from tailwatch.reports.cost_report import ReportError, parse_time

    try:
        start = parse_time(args.start) if args.start else None
        end = parse_time(args.end, end=True) if args.end else None
    except ReportError as exc:
        raise CliError(str(exc)) from None
    if start is not None and end is not None and end <= start:
        raise CliError(f"--to {args.end} must be after --from {args.start}")
    return start, end


def cmd_report(args: argparse.Namespace) -> int:
    from tailwatch.reports.cost_report import ReportError, run_cost_report
    from tailwatch.store.connection import DEFAULT_STORE

    if args.report_command == "readiness":
        return _report_readiness(args)

    start, end = time_range_option(args)
    try:
        prices = load_prices_option(args.prices)
        result = run_cost_report(args.store or DEFAULT_STORE, start, end, args.out, prices,
                                 prices_source=args.prices or "defaults", progress=progress)
    except ReportError as exc:
        raise CliError(str(exc)) from None
    progress_done()
    print(f"fleet GPU cost ${result.fleet_total_usd:,.2f} (fully loaded) in {result.rows:,} rows by day, tenant, model"
          f" and workload; wrote {', '.join(str(f) for f in result.files)} in {result.seconds:.1f} s")
    for flag in result.flags:
        print(f"FLAG spend up with flat task success: {flag.summary()}")
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    import yaml

    from tailwatch.alerts.rules import promtool_test, rule_groups

    specs = load_slo_option(args.slos) or []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        rules = out / f"{spec.name}.rules.yml"
        rules.write_text(yaml.safe_dump(rule_groups(spec), sort_keys=False, width=120))
        (out / f"{spec.name}.test.yml").write_text(
            yaml.safe_dump(promtool_test(spec, rules.name), sort_keys=False, width=120))
    print(f"wrote rules and promtool tests for {len(specs)} SLOs to {out}")
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    from tailwatch.planning import capacity

    if args.capacity_command == "replicas":
        units = args.concurrent_streams if args.concurrent_streams is not None else args.tokens_per_second
        what = "streams" if args.concurrent_streams is not None else "tokens/s"
        demand = units * args.gpu_seconds_per_unit
        plan = capacity.replicas(demand, args.target_utilization, args.zones, per_replica_capacity=args.gpus_per_replica)
        print(f"{units:,.6g} {what} × {args.gpu_seconds_per_unit:g} GPU-s per unit = {demand:,.6g} GPU-s/s of work")
        print("\n".join(plan.working[1:]))
        print(f"answer: {plan.base_replicas:,} replicas before headroom, {plan.with_zone_headroom:,} with zone-loss headroom")
        return 0
    if args.capacity_command == "measured":
        return _capacity_measured(args)
    plan = capacity.kv_cache(args.layers, args.kv_heads, args.head_dim, args.tokens, args.bytes_per_value,
                             args.gpu_memory_gib, args.weights_gib, args.overhead_gib)
    print("\n".join(plan.working))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """`plan stages`: measured phase profiles → bottleneck → greedy plan (slo/turn_phases.py, planning/phase_plan.py)."""
    import dataclasses
    import json

    from tailwatch.planning.phase_plan import PlanConstraints, bottleneck, plan_phases
    from tailwatch.planning.phase_setup import PhaseSetupError, load_phase_setup, measured_profiles
    from tailwatch.store.connection import DEFAULT_STORE, connect
    from tailwatch.store.queries import query_frame
    from tailwatch.table import render

    start, end = time_range_option(args)
    try:
        setup = load_phase_setup(args.stage_setup)
    except PhaseSetupError as exc:
        raise CliError(str(exc)) from None
    prices = load_prices_option(args.prices)
    con = connect(args.store or DEFAULT_STORE, read_only=True, wait_s=30.0)
    try:
        where, params = ["workload = $1"], [args.workload]
        if start is not None:
            where.append(f"window_start >= ${len(params) + 1}")
            params.append(start.replace(tzinfo=None))
        if end is not None:
            where.append(f"window_start < ${len(params) + 1}")
            params.append(end.replace(tzinfo=None))
        rows = query_frame(con, f"SELECT window_start, stages_hist FROM sli_minute WHERE {' AND '.join(where)} "
                                      "AND len(stages_hist) > 0", params)
    finally:
        con.close()
    measured = measured_profiles(rows, setup)
    if not measured.profiles:
        raise CliError(f"no stage timings for workload {args.workload!r} in the store"
                       + (" in that range" if start or end else "")
                       + ": turns report them in request.v1's `stages` (or as child spans through `ingest otlp`)")
    profiles = measured.profiles
    target = args.target_rps if args.target_rps is not None else max(p.measured_rps or 0.0 for p in profiles)
    try:
        constraints = PlanConstraints(
            target_rps=target, max_latency_ms=args.max_latency_ms, budget_usd_per_hour=args.budget_per_hour,
            gpu_types=tuple(t.strip() for t in args.gpu_types.split(",") if t.strip()) if args.gpu_types else (),
            target_utilisation=args.target_utilization)
        neck = bottleneck(profiles, {p.stage: p.workers for p in profiles if p.workers})
        plan = plan_phases(profiles, constraints, prices, cpu_usd_per_worker_hour=setup.cpu_usd_per_worker_hour)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.format == "json":
        print(json.dumps({"workload": args.workload, "minutes": measured.minutes, "turns": measured.turns,
                          "left_out": measured.left_out, "profiles": [dataclasses.asdict(p) for p in profiles],
                          "bottleneck": dataclasses.asdict(neck), "plan": dataclasses.asdict(plan)}, indent=2))
        return 0

    def ms(v):
        return "-" if v is None else f"{v:,.1f}"

    print(f"{args.workload}: {measured.turns:,} turns with stage timings over {measured.minutes:,} minutes"
          + (f"; not compute, left out of the plan: {', '.join(measured.left_out)}" if measured.left_out else ""))
    print(render(["stage", "device", "gpu_sku", "p50_ms", "p95_ms", "p99_ms", "rps", "batch", "rps_per_worker",
                  "workers", "utilisation"],
                 [[p.stage, p.device, p.gpu_sku or "-", ms(p.latency_p50_ms), ms(p.latency_p95_ms), ms(p.latency_p99_ms),
                   f"{p.measured_rps:,.2f}", f"{p.batch_size:g}", f"{p.throughput_per_worker_rps:,.2f}",
                   p.workers or "?", "-" if p.utilisation is None else f"{p.utilisation:.0%}"] for p in profiles]))
    print(f"bottleneck: {neck.stage} ({neck.capacity_rps:,.2f} rps)")
    for line in neck.evidence:
        print(f"  {line}")
    print(f"plan for {target:,.2f} turns/s" + (f" within {args.max_latency_ms:g} ms" if args.max_latency_ms else "")
          + (f" and ${args.budget_per_hour:,.2f}/h" if args.budget_per_hour is not None else "") + ":")
    print(render(["stage", "device", "gpu_sku", "workers", "capacity_rps", "utilisation", "latency_ms", "usd_per_hour"],
                 [[s.stage, s.device, s.gpu_sku or "-", s.workers, f"{s.capacity_rps:,.2f}", f"{s.utilisation:.0%}",
                   ms(s.latency_ms) if s.latency_ms != float("inf") else "inf", f"{s.usd_per_hour:,.2f}"]
                  for s in plan.stages]))
    per_request = "-" if plan.usd_per_request is None else f"${plan.usd_per_request:.6f}"
    latency = "inf" if plan.latency_ms == float("inf") else f"{plan.latency_ms:,.0f} ms"
    print(f"{'met' if plan.met else 'NOT met'} ({plan.stopped_by}): {plan.throughput_rps:,.2f} turns/s, latency {latency}, "
          f"${plan.usd_per_hour:,.2f}/h, {per_request} per turn; bottleneck {plan.bottleneck}")
    for line in plan.working:
        print(f"  {line}")
    return 0


def alert_links(args: argparse.Namespace, served_at: str | None = None):
    """`served_at`: the worker's own HTTP base URL, which serves the runbooks; the default
    base for its pages when `--runbook-url` names none."""
    from tailwatch.alerts.alertmanager import LOCAL_RUNBOOK_BASE_URL, AlertLinks

    base = args.runbook_url or served_at or LOCAL_RUNBOOK_BASE_URL
    return AlertLinks(runbook_base_url=base, grafana_url=args.grafana_url)


def worker_base_url(host: str, port: int) -> str | None:
    """Where others reach this worker's HTTP port: its host as given, or this machine's name
    when it listens on every address; None for a port chosen at start (0)."""
    if not port:
        return None
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.getfqdn()
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def known_models(store_path: str) -> list[str]:
    from tailwatch.store.connection import connect

    con = connect(store_path, read_only=True, wait_s=30.0)
    try:
        return [m for (m,) in con.execute("SELECT DISTINCT model FROM sli_minute WHERE model != '' ORDER BY 1").fetchall()]
    finally:
        con.close()


def _report_readiness(args: argparse.Namespace) -> int:
    """`report readiness`: the store's buckets of one model, its canaries and pools replayed
    through the signal API's decisions, into reports/readiness.py."""
    from tailwatch.reports.readiness import CanaryHistory, build_readiness, write_readiness
    from tailwatch.store.connection import DEFAULT_STORE
    from tailwatch.backtest import backtest_rollout, read_buckets

    start, end = time_range_option(args)
    specs = load_slo_option(args.slos) or []
    prices = load_prices_option(args.prices)
    policy = load_api_config_option(args.api_config).policy
    naive = lambda t: t.replace(tzinfo=None) if t is not None else None  # noqa: E731
    known = known_models(args.store or DEFAULT_STORE)
    if args.model not in known:
        raise CliError(f"no model {args.model!r} in the store; known: {', '.join(known) or 'none (run the worker first)'}")
    requests, gpu = read_buckets(args.store or DEFAULT_STORE, naive(start), naive(end), models=[args.model])
    canaries = []
    if requests.height:
        progress(f"report readiness: replaying {args.model}'s canaries through the rollout verdict")
        versions = requests.filter(requests["deployment"] != "stable")["model_version"].unique().sort().to_list()
        for version in (v for v in versions if v):
            replayed = backtest_rollout(requests, gpu, args.model, version, policy, prices)
            story = replayed.story()
            if story is not None:
                canaries.append(CanaryHistory(version, story, tuple((s.minute, s.verdict) for s in replayed.steps)))
        progress_done()
    from tailwatch.reports.cost_report import minute_scales, model_costs
    from tailwatch.store.connection import DEFAULT_STORE, connect

    con = connect(args.store or DEFAULT_STORE, read_only=True, wait_s=30.0)
    try:
        scales = minute_scales(con, naive(start) or dt.datetime(1970, 1, 1), naive(end) or dt.datetime(2100, 1, 1))
        model_cost = model_costs(con, args.model, naive(start), naive(end), prices)
    finally:
        con.close()
    report = build_readiness(args.model, requests, gpu, specs, prices, canaries, policy.autoscale.queue_age_slo_ms,
                             start, end, args.cost_budget_per_turn, scales, model_cost)
    files = write_readiness(report, requests, args.out, alert_links(args), policy.rollout_window_minutes)
    print(f"{args.model}: {report.verdict}; wrote {', '.join(str(f) for f in files)}")
    for f in report.findings:
        print(f"  {f.severity}: {f.what}")
    return 0
