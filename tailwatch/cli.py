"""The `tailwatch` command line: parses flags, builds settings, and hands off to the rooms.

Every expected failure (no broker, bad config, missing store, no GPU) ends in one line
on stderr and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Callable

from tailwatch.ingest.kafka import DEFAULT_BOOTSTRAP, ConfigError, KafkaSettings, KafkaUnavailable, read_client_config


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def arg_duration_s(text: str) -> float:
    from tailwatch.config import parse_duration_s

    value = parse_duration_s(text, bare_unit="s")
    if value is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 500ms, 90s, 2m, 1h, 7d; a bare number is seconds)")
    return value


def otlp_topic_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spans-topic", default="otlp_spans", help="the Collector's span topic (default otlp_spans)")
    p.add_argument("--metrics-topic", default="otlp_metrics", help="the Collector's metric topic (default otlp_metrics)")


def _number(kind: type, low: float | None = None, high: float | None = None, low_open: bool = False,
            what: str = "") -> "Callable[[str], float]":
    """An argparse type: a number of `kind` in [low, high] (`low_open`: above low), refused
    in one line naming the range, never with a traceback."""
    name = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {name}: {text!r}") from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
        too_low = low is not None and (v <= low if low_open else v < low)
        if too_low or (high is not None and v > high):
            if low is not None and high is not None and not low_open:
                allowed = f"{low:g} to {high:g}"
            else:
                lo = "" if low is None else (f"over {low:g}" if low_open else f"at least {low:g}")
                allowed = " and ".join(x for x in (lo, "" if high is None else f"at most {high:g}") if x)
            raise argparse.ArgumentTypeError(f"{text} is out of range ({what + ': ' if what else ''}{allowed})")
        return v

    return parse


arg_mib = _number(int, 16, 65536, what="a size in MiB")  # --store-memory-limit, the worker's and the month bench's


arg_positive_int = _number(int, 0, low_open=True, what="a count")
arg_count = _number(int, 0, what="a count")
arg_port = _number(int, 0, 65535, what="a TCP port, 0 for any free one")
arg_positive = _number(float, 0, low_open=True)
_non_negative = _number(float, 0)
_utilization = _number(float, 0, 1, low_open=True, what="a utilisation")


def kafka_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kafka")
    g.add_argument("--bootstrap-servers", default=None,
                   help=f"Kafka bootstrap servers (default: the embedded broker on {DEFAULT_BOOTSTRAP})")
    g.add_argument("--kafka-config", default=None, metavar="FILE",
                   help="librdkafka properties (key=value lines), e.g. security.protocol, sasl.*, ssl.*; its "
                        "bootstrap.servers is used where --bootstrap-servers is not given")
    g.add_argument("--topic-prefix", default="tw.", help="topic name prefix (default: tw.)")


def _deploy_inputs(c: argparse.ArgumentParser) -> None:
    c.add_argument("--settings", default=None, metavar="FILE",
                   help="deployment file: image, Kafka, replicas, storage, pools, canaries (docs/deploy.md; default: "
                        "every default)")
    c.add_argument("--slos", default="default", help="SLO file for the ConfigMap and the PrometheusRule (default: built-in)")
    c.add_argument("--prices", default=None, metavar="FILE", help="GPU price file for the ConfigMap (default: list prices)")
    c.add_argument("--otlp-mapping", default=None, metavar="FILE", help="the OTLP adapter's mapping file (default: built-in)")


def _link_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grafana-url", default="http://grafana.local", metavar="URL",
                   help="Grafana base URL that pages and reports link to (dashboards from `tailwatch dashboards generate`)")
    p.add_argument("--runbook-url", default=None, metavar="URL",
                   help="base URL that runbook paths (runbooks/slo-burn.md, …) are appended to, where your team "
                        "publishes them (default: this installation's packaged files as file:// URLs; for the worker, its "
                        "own HTTP port, which serves them at /runbooks/NAME.md)")


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    client_config = read_client_config(args.kafka_config)
    # The flag wins; without it the file's bootstrap.servers (a Secret mounted in Kubernetes
    # says where Kafka is along with its credentials), then the embedded broker.
    bootstrap = args.bootstrap_servers or client_config.pop("bootstrap.servers", None) or DEFAULT_BOOTSTRAP
    client_config.pop("bootstrap.servers", None)
    return KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=args.topic_prefix, client_config=client_config)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        if shown and "default" not in text and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse with tailwatch's manners: a bad flag said in one line (the usage is a
    `--help` away), a mistyped command answered with the nearest one, every default shown,
    and each command's examples under its help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}{_did_you_mean(message)} (see {self.prog} --help)\n")


def _did_you_mean(message: str) -> str:
    """"; did you mean 'status'?" for argparse's "invalid choice: 'stauts' (choose from …)"."""
    import difflib
    import re

    m = re.match(r"argument \S+: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not m:
        return ""
    choices = re.findall(r"'([^']*)'", m.group(2))
    near = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
    return f"; did you mean '{near[0]}'?" if near else ""


# One example (or a few) per command, shown under its --help.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "ingest otlp": ("tailwatch ingest otlp --until-idle 30s",),
    "otlp check": ("tailwatch otlp check ingest/otlp/mapping.yaml",),
    "produce": ("tailwatch produce events.jsonl",),
    "worker": ("tailwatch worker --store data/tailwatch.duckdb --http-port 8080",
               "tailwatch worker --until-idle 10s    # drain what Kafka holds, then exit"),
    "store snapshot": ("tailwatch store snapshot --store data/tailwatch.duckdb /backups/snap-1",),
    "sql": ("tailwatch sql \"SELECT slo, fired_at FROM alerts ORDER BY fired_at\"",
            "tailwatch sql --format csv \"SELECT * FROM detections\" > detections.csv"),
    "slo check": ("tailwatch slo check tailwatch/slo/examples/tenant-quota.yaml",
                  "tailwatch slo check my-slos.yaml --store data/tailwatch.duckdb"),
    "slo status": ("tailwatch slo status --at \"2026-11-02 01:20\"",
                   "tailwatch slo status --slo llm-realtime-first-token"),
    "rules generate": ("tailwatch rules generate --out rules/",),
    "rollout recipe": ("tailwatch rollout recipe flagger --model llama-3.1-70b --version 2024-11",),
    "deploy generate": ("tailwatch deploy generate --out k8s/ --settings deploy.yaml",),
    "deploy preflight": ("tailwatch deploy preflight --api-resources api.txt --settings deploy.yaml"
                         "    # api.txt: kubectl api-resources -o wide",),
    "dashboards generate": ("tailwatch dashboards generate --out dashboards/",),
    "report cost": ("tailwatch report cost --from 2026-11-01 --to 2026-11-08 --out reports/week-45",),
    "report readiness": ("tailwatch report readiness --model llama-3.1-70b",),
    "capacity replicas": ("tailwatch capacity replicas --tokens-per-second 50000 --gpu-seconds-per-unit 0.0004 --zones 3",),
    "capacity kv-cache": ("tailwatch capacity kv-cache --layers 80 --kv-heads 8 --head-dim 128 --tokens 8192 "
                          "--gpu-memory-gib 141 --weights-gib 70",),
    "capacity measured": ("tailwatch capacity measured --days 7",),
    "plan stages": ("tailwatch plan stages --workload s2s --target-rps 20 --format json",),
    "collect gpu": ("tailwatch collect gpu --zone us-east-1a --pool llm-realtime --interval 10",
                    "tailwatch collect gpu --count 1 --print    # one sample to stdout, no Kafka"),
    "collect prometheus": ("tailwatch collect prometheus --url http://dcgm-exporter:9400/metrics --print --count 1",),
    "backtest autoscale": ("tailwatch backtest autoscale --pool llm-us-east-1a-realtime --per-minute",),
    "backtest rollout": ("tailwatch backtest rollout llama-3.1-70b 2024-11",),
    "drill zone-loss": ("tailwatch drill zone-loss --zone us-east-1b",),
}


def dev_commands() -> list:
    """The development tools' command modules (bench, demo, simulate, …): each has `register(sub)`
    and its `EXAMPLES`. They come from the `tailwatch.commands` entry points of the tailwatch-dev
    distribution, so an installation of the runtime alone (the container image) lists none and
    the runtime never imports them."""
    from importlib.metadata import entry_points

    return [ep.load() for ep in entry_points(group="tailwatch.commands")]


def all_examples(modules: list | None = None) -> dict[str, tuple[str, ...]]:
    """Every command's examples: the runtime's and those of the development commands installed."""
    found = dict(EXAMPLES)
    for module in dev_commands() if modules is None else modules:
        found.update(module.EXAMPLES)
    return found


def _add_examples(parser: argparse.ArgumentParser, examples: dict[str, tuple[str, ...]],
                  path: tuple[str, ...] = ()) -> None:
    """Each command's examples as its help's epilog; nested commands walked."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        lines = examples[" ".join(path)]
        parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
    for action in subs:
        for name, child in action.choices.items():
            _add_examples(child, examples, (*path, name))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tailwatch", description="Streaming SLO analytics for GPU inference fleets.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument("--version", action="version", version=f"tailwatch {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("ingest", help="adapters from standard telemetry")
    isub = p.add_subparsers(dest="ingest_command", required=True, metavar="SOURCE")
    c = isub.add_parser("otlp", help="the Collector's otlp_spans / otlp_metrics topics → tw.requests / tw.gpu")
    c.add_argument("--mapping", default=None, metavar="FILE", help="where tenant, pool, zone ... come from (docs/configuration.md, 'OTLP mapping file')")
    c.add_argument("--group", default="tailwatch-otlp", help="consumer group id")
    c.add_argument("--until-idle", type=arg_duration_s, default=None, metavar="SECONDS",
                   help="stop after this long without a record (default: run until stopped)")
    c.add_argument("--max-drift", type=arg_duration_s, default=60.0, metavar="DURATION",
                   help="event time a partition may run ahead of the slowest before it is paused (default 1m; "
                        "keep it well under the worker's --allowed-lateness)")
    otlp_topic_args(c)
    kafka_args(c)

    p = sub.add_parser("otlp", help="the OTLP mapping file")
    osub = p.add_subparsers(dest="otlp_command", required=True, metavar="ACTION")
    c = osub.add_parser("check", help="validate a mapping file; exit 1 on problems")
    c.add_argument("file", help="the OTLP mapping file (YAML)")

    p = sub.add_parser("produce", help="validate JSON Lines events and publish them to their topics")
    p.add_argument("files", nargs="+", metavar="FILE", help="JSON Lines files, or - for standard input")
    kafka_args(p)

    p = sub.add_parser("worker", help="the stream processor: events → 1-minute SLI buckets → store")
    p.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    p.add_argument("--http-port", type=arg_port, default=8000, help="port for /metrics and /healthz (0: any free port)")
    p.add_argument("--restore-from", default=None, metavar="DIR",
                   help="a new replica: start the store from this snapshot (`tailwatch store snapshot`) and catch up "
                        "from its offsets; ignored once the store holds data")
    p.add_argument("--until-idle", type=arg_duration_s, default=None, metavar="SECONDS",
                   help="drain, close all buckets and exit 0 after this long without new events (0: as soon as every "
                        "partition is read to its end)")
    p.add_argument("--tier", choices=("all", "1", "2"), default="all",
                   help="all: one process does everything (default); 1: a firehose worker of N, publishing "
                        "partial buckets to tw.sli, no store; 2: a replica with a store of its own, every SLO, detector and the "
                        "signal API over what tier 1 publishes; run N replicas, each with its own --store, for "
                        "high availability (docs/operating.md). A store file is written by one process at a time")
    p.add_argument("--group", default=None,
                   help="consumer group id (default tailwatch-worker; tier 1: tailwatch-tier1; tier 2: tailwatch-tier2)")
    p.add_argument("--instance-id", default=None, metavar="ID",
                   help="static group membership (KIP-345): a restart with the same id takes its partitions back "
                        "at once; for clusters that expire static members (not the embedded broker). Default: dynamic")
    p.add_argument("--allowed-lateness", type=arg_duration_s, default=300.0, metavar="DURATION",
                   help="event time a minute waits for its events before it closes (default 5m)")
    p.add_argument("--minute-retention", type=arg_duration_s, default=35 * 86400.0, metavar="DURATION",
                   help="minute rows older than this are rolled into hour rows (sli_hour, gpu_hour); at least the "
                        "longest SLO window plus the correction horizon (default 35d; 0: keep every minute)")
    p.add_argument("--correction-horizon", type=arg_duration_s, default=86400.0, metavar="DURATION",
                   help="a request later than the allowed lateness but within this still corrects its minute in the "
                        "store, SLO budgets and reports; older ones are dead letters `too_late` (default 24h; 0: "
                        "late requests are dead letters `late`)")
    p.add_argument("--store-memory-limit", type=arg_mib, default=None,
                   metavar="MiB", help="DuckDB's memory for the store: its cache, and what one checkpoint inserts and "
                   "reads; a checkpoint that needs more doubles it, at most to four times this, and a start runs at four "
                   "times this (default 256 MiB)")
    p.add_argument("--max-event-ahead", type=arg_duration_s, default=300.0, metavar="DURATION",
                   help="event time an event may lead the timestamp of the Kafka record carrying it; later events "
                        "are dead letters (`future`) and never move a watermark (default 5m)")
    p.add_argument("--max-record-bytes", type=_number(int, 1024, 64 * 1024 * 1024, what="a record size"), default=65536,
                   metavar="N", help="larger records are dead letters (`oversized`) (default 65536)")
    p.add_argument("--max-watermark-drift", type=arg_duration_s, default=None, metavar="DURATION",
                   help="pause a partition read this far (event time) ahead of its topic's slowest until it "
                        "catches up, so a backlog drains without holding minutes open (default: the allowed "
                        "lateness; 0: never)")
    p.add_argument("--idle-timeout", type=arg_duration_s, default=60.0, metavar="DURATION",
                   help="event time: a partition read to its end and this far behind the newest stops holding "
                        "minutes open (default 1m)")
    p.add_argument("--drain-timeout", type=arg_duration_s, default=120.0, metavar="DURATION",
                   help="with --until-idle: how long to wait for partitions not owned or not read to their end "
                        "before exiting 3 (default 2m)")
    p.add_argument("--partitions", type=arg_positive_int, default=4, help="partitions for topics the worker creates")
    p.add_argument("--batch-size", type=arg_positive_int, default=20_000, help="records consumed and processed together at most")
    p.add_argument("--checkpoint-interval", type=arg_duration_s, default=2.0, metavar="DURATION",
                   help="how often buckets, state and offsets are committed to the store (default 2s)")
    p.add_argument("--checkpoint-max-rows", type=arg_positive_int, default=20_000, metavar="N",
                   help="a checkpoint closes minutes of at most about N rows; a backlog's other closable "
                        "minutes close at the next ones, before more is read (default 20000)")
    p.add_argument("--max-label-values", type=arg_positive_int, default=5_000, metavar="N",
                   help="values kept apart per open-ended slice label (tenant, model, model_version, zone, pool, "
                        "language, voice; a GPU's node), first seen first; later values are counted under __other__ "
                        "(default 5000)")
    p.add_argument("--max-slices", type=arg_positive_int, default=20_000, metavar="N",
                   help="slices (label combinations) kept apart per input topic; later ones are counted with their "
                        "open-ended labels __other__ (default 20000)")
    p.add_argument("--label-values-forget-after", type=arg_duration_s, default=86400.0, metavar="DURATION",
                   help="event time after which a label value or slice not seen again frees its place "
                        "(default 24h; 0: never)")
    p.add_argument("--state-every", type=arg_duration_s, default=60.0, metavar="DURATION",
                   help="how often the worker measures what each part of its state holds "
                        "for /metrics (a walk of its objects; default 1m)")
    p.add_argument("--stats-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--slos", default="default", metavar="FILE",
                   help="SLOs evaluated on every closed minute: a file, `default` (built-in set) or `none`")
    p.add_argument("--alertmanager-url", action="append", default=None, metavar="URL",
                   help="deliver pages to this Alertmanager (v2 API), e.g. http://127.0.0.1:9093; repeat it for "
                        "every instance of an HA cluster (each gets every alert)")
    p.add_argument("--detectors", default="default", metavar="FILE",
                   help="detector settings: a YAML file, `default` (detectors/defaults.yaml) or `none`")
    _link_args(p)
    p.add_argument("--http-host", default="127.0.0.1",
                   help="address of the HTTP port (default loopback; any other needs tokens in --api-config)")
    p.add_argument("--api-config", default=None, metavar="FILE",
                   help="signal API config: bearer tokens and tenant scopes, staleness bound, policies (docs/signal-api.md)")
    p.add_argument("--prices", default=None, metavar="FILE",
                   help="GPU prices per SKU in USD per GPU-hour (default: built-in list prices, see planning/prices.py)")
    p.add_argument("--metrics-max-tenants", type=arg_positive_int, default=50, metavar="N",
                   help="tenants named in /metrics; later ones count as tenant=other (default 50)")
    p.add_argument("--metrics-max-label-sets", type=arg_positive_int, default=1000, metavar="N",
                   help="label sets per fleet metric family in /metrics before new ones fold into other (default 1000)")
    kafka_args(p)

    p = sub.add_parser("store", help="the store file")
    stsub = p.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    c = stsub.add_parser("snapshot", help="every table as Parquet plus the offsets it covers, for a new replica's "
                                          "`worker --restore-from DIR`")
    c.add_argument("dir", metavar="DIR", help="a new or empty folder")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")

    p = sub.add_parser("sql", help="query the store")
    p.add_argument("query", help="SQL for DuckDB over the store's tables (read-only)")
    p.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")

    p = sub.add_parser("slo", help="SLO specifications and status")
    ssub = p.add_subparsers(dest="slo_command", required=True, metavar="ACTION")
    c = ssub.add_parser("check", help="validate an SLO file (tailwatch YAML or OpenSLO v1); exit 1 on problems")
    c.add_argument("file", help="tailwatch SLO YAML or OpenSLO v1 file")
    c.add_argument("--store", default=None, help="DuckDB file whose sli_minute rows each selector is counted in, "
                   "warning of selectors that match nothing (default: no store is read)")
    c = ssub.add_parser("status", help="each SLO and slice: SLI, budget left, burn rates, firing alerts")
    c.add_argument("--slos", default=None, help="SLO file (default: the built-in set)")
    c.add_argument("--slo", default=None, help="only this SLO")
    c.add_argument("--at", default=None, help="RFC 3339 event time to evaluate at (default: the newest bucket)")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")

    p = sub.add_parser("rules", help="Prometheus rules equivalent to the SLO engine")
    rsub = p.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    c = rsub.add_parser("generate", help="write <slo>.rules.yml and a promtool test <slo>.test.yml per SLO")
    c.add_argument("--slos", default="default", help="SLO file (default: the built-in set)")
    c.add_argument("--out", required=True, help="output folder")

    p = sub.add_parser("rollout", help="rollout controllers wired to the signal API")
    rosub = p.add_subparsers(dest="rollout_command", required=True, metavar="ACTION")
    c = rosub.add_parser("recipe", help="manifests for Flagger (a Canary with every webhook) or Argo Rollouts (analysis "
                         "templates and the Rollout's strategy), whose only success at the last step is promote")
    c.add_argument("controller", choices=("flagger", "argo"), help="which rollout controller the manifests are for")
    c.add_argument("--model", required=True, help="the model, as in request.v1's `model` (any name: Kubernetes names are made from it)")
    c.add_argument("--version", required=True, help="the canary's model_version")
    c.add_argument("--url", default="http://tailwatch.monitoring:8000", help="the signal API as the controller reaches it")
    c.add_argument("--target", default="", help="the Deployment the Canary or Rollout drives, and their name (default: the model as a Kubernetes name: llama-3.1-70b → llama-3-1-70b)")
    c.add_argument("--namespace", default="default", help="Kubernetes namespace of the Canary or Rollout")
    c.add_argument("--token", default=None, help="Flagger: a bearer token for the hooks' metadata (scope it to the "
                   "model's tenants; it is plain text in the Canary)")

    p = sub.add_parser("deploy", help="Kubernetes manifests for a whole installation")
    desub = p.add_subparsers(dest="deploy_command", required=True, metavar="ACTION")
    c = desub.add_parser("generate", help="tier-1 and tier-2 workers, Services, budgets, config, and KEDA, Argo Rollouts, "
                         "Flagger, Prometheus Operator, Grafana, Collector and dcgm-exporter objects, with a "
                         "kustomization.yaml (`kubectl apply -k DIR`)")
    c.add_argument("--out", required=True, metavar="DIR", help="output folder")
    _deploy_inputs(c)
    c = desub.add_parser("preflight", help="which kinds the manifests use that the cluster does not serve (KEDA, "
                         "Argo Rollouts, Flagger, Prometheus Operator CRDs), from `kubectl api-resources -o wide`; "
                         "exit 1 if any")
    c.add_argument("--api-resources", required=True, metavar="FILE",
                   help="the output of `kubectl api-resources -o wide` on the target cluster")
    _deploy_inputs(c)

    p = sub.add_parser("dashboards", help="Grafana dashboards over the worker's /metrics")
    dsub = p.add_subparsers(dest="dashboards_command", required=True, metavar="ACTION")
    c = dsub.add_parser("generate", help="write one importable Grafana JSON per dashboard (<uid>.json)")
    c.add_argument("--slos", default="default", help="SLO file the SLO dashboards are built for (default: the built-in set)")
    c.add_argument("--out", required=True, help="output folder")

    p = sub.add_parser("report", help="reports for finance and product, from the store")
    repsub = p.add_subparsers(dest="report_command", required=True, metavar="REPORT")
    c = repsub.add_parser("cost", help="GPU cost per successful turn, goodput, idle cost by tenant, model, workload, day:"
                                       " report.html, cost.csv, cost.parquet")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    c.add_argument("--from", dest="start", default=None, metavar="T1",
                   help="start, RFC 3339 or a date (UTC); default: the last day of data")
    c.add_argument("--to", dest="end", default=None, metavar="T2",
                   help="end, exclusive RFC 3339 time, or a date (that whole day included)")
    c.add_argument("--out", default="data/reports/cost", metavar="DIR", help="output folder (default data/reports/cost)")
    c.add_argument("--prices", default=None, metavar="FILE",
                   help="GPU prices per SKU in USD per GPU-hour (YAML; default: built-in list prices, see planning/prices.py)")
    c = repsub.add_parser("readiness", help="one model's launch readiness: contract, latency, memory, quality by "
                                            "slice, operations, a verdict: readiness.html, readiness.json")
    c.add_argument("--model", required=True, help="the model, as in request.v1's `model`")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    c.add_argument("--from", dest="start", default=None, metavar="T1", help="start, RFC 3339 or a date (UTC); default: all")
    c.add_argument("--to", dest="end", default=None, metavar="T2", help="end, exclusive RFC 3339 time, or a date")
    c.add_argument("--out", default="data/reports/readiness", metavar="DIR",
                   help="output folder (default data/reports/readiness)")
    c.add_argument("--slos", default="default", help="SLO file, `default` or `none` (default: the built-in set)")
    c.add_argument("--api-config", default=None, metavar="FILE", help="the signal API's policies (rollout, autoscale)")
    c.add_argument("--prices", default=None, metavar="FILE", help="GPU prices per SKU in USD per GPU-hour (YAML)")
    c.add_argument("--cost-budget-per-turn", type=arg_positive, default=None, metavar="USD",
                   help="flag the model when its fully loaded GPU cost per successful turn is over this")
    _link_args(c)

    p = sub.add_parser("capacity", help="capacity planning: replicas with zone headroom, KV-cache memory")
    capsub = p.add_subparsers(dest="capacity_command", required=True, metavar="QUESTION")
    c = capsub.add_parser("replicas", help="replicas for a demand, with headroom to lose one zone")
    demand = c.add_mutually_exclusive_group(required=True)
    demand.add_argument("--concurrent-streams", type=_non_negative, help="concurrent real-time streams (units of work per second)")
    demand.add_argument("--tokens-per-second", type=_non_negative, help="tokens per second")
    c.add_argument("--gpu-seconds-per-unit", type=arg_positive, required=True,
                   help="GPU-seconds per unit of work (per audio-second of a stream, or per token)")
    c.add_argument("--target-utilization", type=_utilization, default=0.7, help="plan each replica at most this busy")
    c.add_argument("--zones", type=arg_positive_int, default=1, help="zones to spread over, with headroom to lose one")
    c.add_argument("--gpus-per-replica", type=arg_positive, default=1.0, help="GPUs one replica holds")
    c = capsub.add_parser("kv-cache", help="KV-cache bytes per request, and how many fit beside the weights")
    c.add_argument("--layers", type=arg_positive_int, required=True, help="the model's transformer layers")
    c.add_argument("--kv-heads", type=arg_positive_int, required=True, help="key-value heads per layer (GQA: fewer than query heads)")
    c.add_argument("--head-dim", type=arg_positive_int, required=True, help="dimension of one head")
    c.add_argument("--tokens", type=arg_positive_int, required=True, help="context tokens per request")
    c.add_argument("--bytes-per-value", type=arg_positive, default=2.0, help="2 for fp16/bf16, 1 for fp8")
    c.add_argument("--gpu-memory-gib", type=arg_positive, default=None, help="one GPU's memory in GiB (with --weights-gib: requests that fit beside the weights)")
    c.add_argument("--weights-gib", type=_non_negative, default=None, help="the model's weights in GiB on one GPU")
    c.add_argument("--overhead-gib", type=_non_negative, default=0.0, help="activations, CUDA context, fragmentation")

    c = capsub.add_parser("measured", help="per-replica capacity each pool sustained with its latency SLOs held (from the store)")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    c.add_argument("--days", type=arg_positive_int, default=7, help="newest days of measurements to show (default 7)")
    c.add_argument("--pool", default=None, help="one pool only")

    p = sub.add_parser("plan", help="plan compute from what the store measured")
    plsub = p.add_subparsers(dest="plan_command", required=True, metavar="WHAT")
    c = plsub.add_parser("stages", help="per stage of a cascaded turn: latency, throughput, the bottleneck, and a "
                                        "greedy plan of workers per stage")
    c.add_argument("--workload", default="s2s", help="the workload whose turns report stages (default s2s)")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    c.add_argument("--from", dest="start", default=None, metavar="T1", help="start, RFC 3339 or a date (UTC); default: all")
    c.add_argument("--to", dest="end", default=None, metavar="T2", help="end, exclusive RFC 3339 time, or a date")
    c.add_argument("--target-rps", type=arg_positive, default=None,
                   help="turns per second to plan for (default: the measured rate over the range)")
    c.add_argument("--max-latency-ms", type=arg_positive, default=None, help="bound on the sum of stage latencies")
    c.add_argument("--budget-per-hour", type=arg_positive, default=None, help="USD per hour the plan may spend")
    c.add_argument("--gpu-types", default=None, help="GPU SKUs GPU stages may run on, e.g. H100,L4 (cheapest per request)")
    c.add_argument("--target-utilization", type=_utilization, default=0.8, help="plan each stage at most this busy (default 0.8)")
    c.add_argument("--stage-setup", default=None, metavar="FILE",
                   help="YAML: per stage device (cpu, gpu, none), batch_size, workers, gpu_sku (docs/configuration.md, 'Stage setup')")
    c.add_argument("--prices", default=None, metavar="FILE", help="GPU prices per SKU in USD per GPU-hour (YAML)")
    c.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    c.add_argument("--json", action="store_const", const="json", dest="format", help=argparse.SUPPRESS)  # the old spelling

    p = sub.add_parser("collect", help="collectors")
    csub = p.add_subparsers(dest="collector", required=True, metavar="SOURCE")
    g = csub.add_parser("gpu", help="NVML GPU samples → tw.gpu")
    g.add_argument("--interval", type=arg_duration_s, default=10.0, help="seconds between samples (e.g. 10s, 1m)")
    g.add_argument("--count", type=arg_count, default=0, help="stop after this many rounds (0: run until stopped)")
    g.add_argument("--node", default=None, help="node name on the samples (default: this host's name)")
    g.add_argument("--zone", default="", help="zone label on the samples")
    g.add_argument("--pool", default="", help="pool label on the samples")
    g.add_argument("--print", action="store_true", dest="print_only", help="print samples instead of publishing")
    kafka_args(g)
    g = csub.add_parser("prometheus", help="DCGM exporter, vLLM, TGI, Triton /metrics → tw.gpu, and their latency "
                        "histograms → tw.requests")
    g.add_argument("--url", action="append", default=[], metavar="URL",
                   help="a /metrics URL (repeatable), with the target's labels after #: URL#node=n1,zone=z1,gpu=0")
    g.add_argument("--targets", default=None, metavar="FILE", help="a targets file in the shape of Prometheus's "
                   "file_sd (JSON or YAML: [{targets: [host:port], labels: {node: n1, zone: z1, gpu: '0'}}]); "
                   "read again each round")
    g.add_argument("--interval", type=arg_duration_s, default=10.0, help="seconds between scrapes (e.g. 10s, 1m)")
    g.add_argument("--count", type=arg_count, default=0, help="stop after this many rounds (0: run until stopped)")
    g.add_argument("--mapping", default=None, metavar="FILE", help="OTLP mapping file (its gpu: section)")
    g.add_argument("--print", action="store_true", dest="print_only", help="print samples instead of publishing")
    kafka_args(g)

    p = sub.add_parser("backtest", help="replay the store through the autoscaler or the rollout verdict")
    bsub = p.add_subparsers(dest="backtest_command", required=True, metavar="WHAT")
    c = bsub.add_parser("autoscale", help="per pool: desired vs running replicas, minutes users waited, replica-hours")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb), opened read-only")
    c.add_argument("--pool", action="append", default=None, metavar="P", help="only this pool (repeatable)")
    c.add_argument("--from", dest="start", default=None, metavar="T", help="RFC 3339 start (default: the first bucket)")
    c.add_argument("--to", dest="end", default=None, metavar="T", help="RFC 3339 end, exclusive (default: the last)")
    c.add_argument("--slos", default="default", metavar="FILE", help="SLOs whose first-output thresholds say who waited")
    c.add_argument("--per-minute", action="store_true", help="also print every minute's desired and running replicas")
    c.add_argument("--trace", default=None, metavar="NAME|FILE",
                   help="instead of the store: a public trace (azure-code, mooncake, or an Azure CSV / Mooncake JSONL "
                        "file) served by a simulated pool under tailwatch's autoscaler and the HPA on GPU utilisation")
    c.add_argument("--week", action="store_true", help="with --trace: a diurnal week built from the trace's hour")
    c.add_argument("--rate-scale", type=arg_positive, default=1.0, metavar="X", help="with --trace: arrivals × X (default 1)")
    c.add_argument("--startup-minutes", type=arg_count, default=2, metavar="N",
                   help="with --trace: minutes a new replica loads before it serves (default 2)")
    c.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output format")
    c = bsub.add_parser("rollout", help="the verdict minute by minute for a canary version")
    c.add_argument("model", help="the model, as in request.v1's `model`")
    c.add_argument("version", help="the canary's model_version")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb), opened read-only")
    c.add_argument("--from", dest="start", default=None, metavar="T", help="RFC 3339 start (default: the first bucket)")
    c.add_argument("--to", dest="end", default=None, metavar="T", help="RFC 3339 end, exclusive (default: the last)")
    c.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output format")

    p = sub.add_parser("drill", help="what tailwatch would have said, minute by minute, in a failure the store holds")
    dsub = p.add_subparsers(dest="drill_command", required=True, metavar="FAILURE")
    c = dsub.add_parser("zone-loss", help="a zone gone silent: autoscaler, shed advice and pages against the (z-1)/z math")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb), opened read-only")
    c.add_argument("--zone", default=None, help="the lost zone (default: the one that went silent while others reported)")
    c.add_argument("--from", dest="start", default=None, metavar="T", help="RFC 3339 start (default: the first bucket)")
    c.add_argument("--to", dest="end", default=None, metavar="T", help="RFC 3339 end, exclusive (default: the last)")
    c.add_argument("--slos", default="default", metavar="FILE", help="SLOs whose pages and thresholds the drill replays")
    c.add_argument("--model", action="append", default=None, metavar="M", help="minute-by-minute table for this model only (repeatable)")
    c.add_argument("--minutes-after", type=arg_positive_int, default=15, metavar="N",
                   help="minutes after the loss in the minute-by-minute tables (default 15)")
    c.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output format")

    extra = dev_commands()
    for module in extra:
        module.register(sub)
    _add_examples(parser, all_examples(extra))
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tailwatch")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`tailwatch slo status | head -2`): stop quietly, as a Unix tool
        # killed by SIGPIPE would, and keep Python from complaining about the closed stdout.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (CliError, ConfigError, KafkaUnavailable) as exc:
        print(f"tailwatch {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # known one-line errors from the rooms
        from tailwatch.ingest.nvml import NvmlUnavailable
        from tailwatch.store.connection import StoreError
        from tailwatch.streams.http import PortInUse

        if isinstance(exc, (NvmlUnavailable, StoreError, ValueError, PortInUse)):
            print(f"tailwatch {args.command}: {exc}", file=sys.stderr)
            return 2
        raise


def _dispatch(args: argparse.Namespace) -> int:
    handler = getattr(args, "handler", None)  # a development command's own
    if handler is not None:
        return handler(args)
    from tailwatch import commands

    return getattr(commands, f"cmd_{args.command}")(args)


def progress(line: str) -> None:
    """A progress line on stderr that overwrites itself on a terminal."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + line)
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def progress_done() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\n")

