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


def _duration_s(text: str) -> float:
    from tailwatch.config import parse_duration_s

    value = parse_duration_s(text, bare_unit="s")
    if value is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 500ms, 90s, 2m, 1h, 7d; a bare number is seconds)")
    return value


def _otlp_topic_args(p: argparse.ArgumentParser) -> None:
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


_MIB = _number(int, 16, 65536, what="a size in MiB")  # --store-memory-limit, the worker's and the month bench's


_positive_int = _number(int, 0, low_open=True, what="a count")
_count = _number(int, 0, what="a count")
_port = _number(int, 0, 65535, what="a TCP port, 0 for any free one")
_positive = _number(float, 0, low_open=True)
_non_negative = _number(float, 0)
_utilization = _number(float, 0, 1, low_open=True, what="a utilisation")


def _kafka_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kafka")
    g.add_argument("--bootstrap-servers", default=None,
                   help=f"Kafka bootstrap servers (default: the embedded broker on {DEFAULT_BOOTSTRAP})")
    g.add_argument("--kafka-config", default=None, metavar="FILE",
                   help="librdkafka properties (key=value lines), e.g. security.protocol, sasl.*, ssl.*")
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
    return KafkaSettings(
        bootstrap_servers=args.bootstrap_servers or DEFAULT_BOOTSTRAP,
        topic_prefix=args.topic_prefix,
        client_config=read_client_config(args.kafka_config),
    )


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
    "broker": ("tailwatch broker --port 9092",),
    "simulate": ("tailwatch simulate --scenario retry-storm --minutes 60    # into the tw.* topics",
                 "tailwatch simulate --minutes 30 --out events.jsonl --truth incidents.jsonl",
                 "tailwatch simulate --scenario nope    # prints the known scenarios"),
    "ingest otlp": ("tailwatch ingest otlp --until-idle 30s",),
    "otlp check": ("tailwatch otlp check ingest/otlp/mapping.yaml",),
    "produce": ("tailwatch produce events.jsonl",),
    "worker": ("tailwatch worker --store data/tailwatch.duckdb --http-port 8080",
               "tailwatch worker --until-idle 10s    # drain what Kafka holds, then exit"),
    "store snapshot": ("tailwatch store snapshot --store data/tailwatch.duckdb /backups/snap-1",),
    "sql": ("tailwatch sql \"SELECT slo, fired_at FROM alerts ORDER BY fired_at\"",
            "tailwatch sql --format csv \"SELECT * FROM detections\" > detections.csv"),
    "slo check": ("tailwatch slo check slo/examples/tenant-quota.yaml",
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
    "eval detectors": ("tailwatch eval detectors --scenario retry-storm --scenario queue-saturation",),
    "fuzz decode": ("tailwatch fuzz decode --records 100000 --seed 3",),
    "backtest autoscale": ("tailwatch backtest autoscale --pool llm-us-east-1a-realtime --per-minute",),
    "backtest rollout": ("tailwatch backtest rollout llama-3.1-70b 2024-11",),
    "drill zone-loss": ("tailwatch drill zone-loss --zone us-east-1b",),
    "demo": ("tailwatch demo", "tailwatch demo --seed 11 --store /tmp/demo.duckdb"),
    "bench": ("tailwatch bench --shape both", "tailwatch bench --api --seconds 10"),
}


def _add_examples(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> None:
    """Each command's examples as its help's epilog (EXAMPLES); nested commands walked."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        lines = EXAMPLES[" ".join(path)]
        parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
    for action in subs:
        for name, child in action.choices.items():
            _add_examples(child, (*path, name))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tailwatch", description="Streaming SLO analytics for GPU inference fleets.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument("--version", action="version", version=f"tailwatch {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("broker", help="run the embedded Kafka-compatible broker (Tansu) in the foreground")
    p.add_argument("--port", type=_port, default=9092, help="TCP port to listen on, on 127.0.0.1")

    p = sub.add_parser("simulate", help="simulate a GPU inference fleet with scripted incidents")
    p.add_argument("--scenario", default="mixed-fleet",
                   help="the scripted fleet and its incidents: mixed-fleet, retry-storm, queue-saturation, zone-loss, "
                        "… (an unknown name prints every scenario)")
    p.add_argument("--minutes", type=_positive_int, default=None, help="simulated minutes (default 120; zone-loss 75)")
    p.add_argument("--seed", type=int, default=7, help="random seed: the same seed, scenario and minutes give byte-identical events")
    p.add_argument("--start", default=None, help="RFC 3339 start of simulated time (default 2026-11-02T00:00:00Z; "
                   "zone-loss 13:00, before the diurnal peak)")
    p.add_argument("--rate-scale", type=_positive, default=None, help="multiply every request rate (default 1; zone-loss 0.33)")
    p.add_argument("--gpu-samples-per-minute", type=_positive_int, default=6,
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
    _otlp_topic_args(p)
    _kafka_args(p)

    p = sub.add_parser("ingest", help="adapters from standard telemetry")
    isub = p.add_subparsers(dest="ingest_command", required=True, metavar="SOURCE")
    c = isub.add_parser("otlp", help="the Collector's otlp_spans / otlp_metrics topics → tw.requests / tw.gpu")
    c.add_argument("--mapping", default=None, metavar="FILE", help="where tenant, pool, zone ... come from (docs/configuration.md, 'OTLP mapping file')")
    c.add_argument("--group", default="tailwatch-otlp", help="consumer group id")
    c.add_argument("--until-idle", type=_duration_s, default=None, metavar="SECONDS",
                   help="stop after this long without a record (default: run until stopped)")
    c.add_argument("--max-drift", type=_duration_s, default=60.0, metavar="DURATION",
                   help="event time a partition may run ahead of the slowest before it is paused (default 1m; "
                        "keep it well under the worker's --allowed-lateness)")
    _otlp_topic_args(c)
    _kafka_args(c)

    p = sub.add_parser("otlp", help="the OTLP mapping file")
    osub = p.add_subparsers(dest="otlp_command", required=True, metavar="ACTION")
    c = osub.add_parser("check", help="validate a mapping file; exit 1 on problems")
    c.add_argument("file", help="the OTLP mapping file (YAML)")

    p = sub.add_parser("produce", help="validate JSON Lines events and publish them to their topics")
    p.add_argument("files", nargs="+", metavar="FILE", help="JSON Lines files, or - for standard input")
    _kafka_args(p)

    p = sub.add_parser("worker", help="the stream processor: events → 1-minute SLI buckets → store")
    p.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    p.add_argument("--http-port", type=_port, default=8000, help="port for /metrics and /healthz (0: any free port)")
    p.add_argument("--restore-from", default=None, metavar="DIR",
                   help="a new replica: start the store from this snapshot (`tailwatch store snapshot`) and catch up "
                        "from its offsets; ignored once the store holds data")
    p.add_argument("--until-idle", type=_duration_s, default=None, metavar="SECONDS",
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
    p.add_argument("--allowed-lateness", type=_duration_s, default=300.0, metavar="DURATION",
                   help="event time a minute waits for its events before it closes (default 5m)")
    p.add_argument("--minute-retention", type=_duration_s, default=35 * 86400.0, metavar="DURATION",
                   help="minute rows older than this are rolled into hour rows (sli_hour, gpu_hour); at least the "
                        "longest SLO window plus the correction horizon (default 35d; 0: keep every minute)")
    p.add_argument("--correction-horizon", type=_duration_s, default=86400.0, metavar="DURATION",
                   help="a request later than the allowed lateness but within this still corrects its minute in the "
                        "store, SLO budgets and reports; older ones are dead letters `too_late` (default 24h; 0: "
                        "late requests are dead letters `late`)")
    p.add_argument("--store-memory-limit", type=_MIB, default=None,
                   metavar="MiB", help="DuckDB's memory for the store: its cache, and what one checkpoint inserts and "
                   "reads; a checkpoint that needs more doubles it, at most to four times this, and a start runs at four "
                   "times this (default 256 MiB)")
    p.add_argument("--max-event-ahead", type=_duration_s, default=300.0, metavar="DURATION",
                   help="event time an event may lead the timestamp of the Kafka record carrying it; later events "
                        "are dead letters (`future`) and never move a watermark (default 5m)")
    p.add_argument("--max-record-bytes", type=_number(int, 1024, 64 * 1024 * 1024, what="a record size"), default=65536,
                   metavar="N", help="larger records are dead letters (`oversized`) (default 65536)")
    p.add_argument("--max-watermark-drift", type=_duration_s, default=None, metavar="DURATION",
                   help="pause a partition read this far (event time) ahead of its topic's slowest until it "
                        "catches up, so a backlog drains without holding minutes open (default: the allowed "
                        "lateness; 0: never)")
    p.add_argument("--idle-timeout", type=_duration_s, default=60.0, metavar="DURATION",
                   help="event time: a partition read to its end and this far behind the newest stops holding "
                        "minutes open (default 1m)")
    p.add_argument("--drain-timeout", type=_duration_s, default=120.0, metavar="DURATION",
                   help="with --until-idle: how long to wait for partitions not owned or not read to their end "
                        "before exiting 3 (default 2m)")
    p.add_argument("--partitions", type=_positive_int, default=4, help="partitions for topics the worker creates")
    p.add_argument("--batch-size", type=_positive_int, default=20_000, help="records consumed and processed together at most")
    p.add_argument("--checkpoint-interval", type=_duration_s, default=2.0, metavar="DURATION",
                   help="how often buckets, state and offsets are committed to the store (default 2s)")
    p.add_argument("--checkpoint-max-rows", type=_positive_int, default=20_000, metavar="N",
                   help="a checkpoint closes minutes of at most about N rows; a backlog's other closable "
                        "minutes close at the next ones, before more is read (default 20000)")
    p.add_argument("--max-label-values", type=_positive_int, default=5_000, metavar="N",
                   help="values kept apart per open-ended slice label (tenant, model, model_version, zone, pool, "
                        "language, voice; a GPU's node), first seen first; later values are counted under __other__ "
                        "(default 5000)")
    p.add_argument("--max-slices", type=_positive_int, default=20_000, metavar="N",
                   help="slices (label combinations) kept apart per input topic; later ones are counted with their "
                        "open-ended labels __other__ (default 20000)")
    p.add_argument("--label-values-forget-after", type=_duration_s, default=86400.0, metavar="DURATION",
                   help="event time after which a label value or slice not seen again frees its place "
                        "(default 24h; 0: never)")
    p.add_argument("--state-every", type=_duration_s, default=60.0, metavar="DURATION",
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
    p.add_argument("--metrics-max-tenants", type=_positive_int, default=50, metavar="N",
                   help="tenants named in /metrics; later ones count as tenant=other (default 50)")
    p.add_argument("--metrics-max-label-sets", type=_positive_int, default=1000, metavar="N",
                   help="label sets per fleet metric family in /metrics before new ones fold into other (default 1000)")
    _kafka_args(p)

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
    c.add_argument("--cost-budget-per-turn", type=_positive, default=None, metavar="USD",
                   help="flag the model when its fully loaded GPU cost per successful turn is over this")
    _link_args(c)

    p = sub.add_parser("capacity", help="capacity planning: replicas with zone headroom, KV-cache memory")
    capsub = p.add_subparsers(dest="capacity_command", required=True, metavar="QUESTION")
    c = capsub.add_parser("replicas", help="replicas for a demand, with headroom to lose one zone")
    demand = c.add_mutually_exclusive_group(required=True)
    demand.add_argument("--concurrent-streams", type=_non_negative, help="concurrent real-time streams (units of work per second)")
    demand.add_argument("--tokens-per-second", type=_non_negative, help="tokens per second")
    c.add_argument("--gpu-seconds-per-unit", type=_positive, required=True,
                   help="GPU-seconds per unit of work (per audio-second of a stream, or per token)")
    c.add_argument("--target-utilization", type=_utilization, default=0.7, help="plan each replica at most this busy")
    c.add_argument("--zones", type=_positive_int, default=1, help="zones to spread over, with headroom to lose one")
    c.add_argument("--gpus-per-replica", type=_positive, default=1.0, help="GPUs one replica holds")
    c = capsub.add_parser("kv-cache", help="KV-cache bytes per request, and how many fit beside the weights")
    c.add_argument("--layers", type=_positive_int, required=True, help="the model's transformer layers")
    c.add_argument("--kv-heads", type=_positive_int, required=True, help="key-value heads per layer (GQA: fewer than query heads)")
    c.add_argument("--head-dim", type=_positive_int, required=True, help="dimension of one head")
    c.add_argument("--tokens", type=_positive_int, required=True, help="context tokens per request")
    c.add_argument("--bytes-per-value", type=_positive, default=2.0, help="2 for fp16/bf16, 1 for fp8")
    c.add_argument("--gpu-memory-gib", type=_positive, default=None, help="one GPU's memory in GiB (with --weights-gib: requests that fit beside the weights)")
    c.add_argument("--weights-gib", type=_non_negative, default=None, help="the model's weights in GiB on one GPU")
    c.add_argument("--overhead-gib", type=_non_negative, default=0.0, help="activations, CUDA context, fragmentation")

    c = capsub.add_parser("measured", help="per-replica capacity each pool sustained with its latency SLOs held (from the store)")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    c.add_argument("--days", type=_positive_int, default=7, help="newest days of measurements to show (default 7)")
    c.add_argument("--pool", default=None, help="one pool only")

    p = sub.add_parser("plan", help="plan compute from what the store measured")
    plsub = p.add_subparsers(dest="plan_command", required=True, metavar="WHAT")
    c = plsub.add_parser("stages", help="per stage of a cascaded turn: latency, throughput, the bottleneck, and a "
                                        "greedy plan of workers per stage")
    c.add_argument("--workload", default="s2s", help="the workload whose turns report stages (default s2s)")
    c.add_argument("--store", default=None, help="DuckDB file (default data/tailwatch.duckdb)")
    c.add_argument("--from", dest="start", default=None, metavar="T1", help="start, RFC 3339 or a date (UTC); default: all")
    c.add_argument("--to", dest="end", default=None, metavar="T2", help="end, exclusive RFC 3339 time, or a date")
    c.add_argument("--target-rps", type=_positive, default=None,
                   help="turns per second to plan for (default: the measured rate over the range)")
    c.add_argument("--max-latency-ms", type=_positive, default=None, help="bound on the sum of stage latencies")
    c.add_argument("--budget-per-hour", type=_positive, default=None, help="USD per hour the plan may spend")
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
    g.add_argument("--interval", type=_duration_s, default=10.0, help="seconds between samples (e.g. 10s, 1m)")
    g.add_argument("--count", type=_count, default=0, help="stop after this many rounds (0: run until stopped)")
    g.add_argument("--node", default=None, help="node name on the samples (default: this host's name)")
    g.add_argument("--zone", default="", help="zone label on the samples")
    g.add_argument("--pool", default="", help="pool label on the samples")
    g.add_argument("--print", action="store_true", dest="print_only", help="print samples instead of publishing")
    _kafka_args(g)
    g = csub.add_parser("prometheus", help="DCGM exporter, vLLM, TGI, Triton /metrics → tw.gpu, and their latency "
                        "histograms → tw.requests")
    g.add_argument("--url", action="append", default=[], metavar="URL",
                   help="a /metrics URL (repeatable), with the target's labels after #: URL#node=n1,zone=z1,gpu=0")
    g.add_argument("--targets", default=None, metavar="FILE", help="a targets file in the shape of Prometheus's "
                   "file_sd (JSON or YAML: [{targets: [host:port], labels: {node: n1, zone: z1, gpu: '0'}}]); "
                   "read again each round")
    g.add_argument("--interval", type=_duration_s, default=10.0, help="seconds between scrapes (e.g. 10s, 1m)")
    g.add_argument("--count", type=_count, default=0, help="stop after this many rounds (0: run until stopped)")
    g.add_argument("--mapping", default=None, metavar="FILE", help="OTLP mapping file (its gpu: section)")
    g.add_argument("--print", action="store_true", dest="print_only", help="print samples instead of publishing")
    _kafka_args(g)

    p = sub.add_parser("eval", help="measure detectors against scenarios with labelled incidents")
    esub = p.add_subparsers(dest="eval_command", required=True, metavar="WHAT")
    c = esub.add_parser("detectors", help="a scenario through broker + worker: recall, false alerts per day, delay")
    c.add_argument("--scenario", action="append", default=None, metavar="NAME",
                   help="a detector scenario (repeatable), or `all` (default: all)")
    c.add_argument("--seed", type=int, default=7, help="the scenario's random seed")
    c.add_argument("--minutes", type=_positive_int, default=None,
                   help="simulated minutes (default: 200, and 1440 for quiet-day)")
    c.add_argument("--rate-scale", type=_positive, default=0.3, help="multiply every request rate (default 0.3)")
    c.add_argument("--detectors", default="default", metavar="FILE", help="detector settings (default: built-in)")
    c.add_argument("--trace", action="append", default=None, metavar="FILE",
                   help="a public trace instead of the simulator (repeatable): Azure LLM inference CSV or Mooncake "
                        "JSONL; a quiet day built from it, then the same day with every incident kind injected")
    c.add_argument("--repeats", type=_positive_int, default=3, help="with --trace: incidents of each kind (default 3)")

    p = sub.add_parser("fuzz", help="fuzz the record decode path with invariants (a developer's check)")
    fsub = p.add_subparsers(dest="fuzz_command", required=True, metavar="WHAT")
    c = fsub.add_parser("decode", help="generated and mutated records through the decoder as the worker calls it: "
                                       "nothing raises, every record is its events or one dead letter")
    c.add_argument("--records", type=_positive_int, default=1_000_000, help="records to generate and mutate")
    c.add_argument("--seed", type=int, default=1, help="random seed (a failure names the seed and record that reproduce it)")
    c.add_argument("--batch-size", type=_positive_int, default=500, help="records per decode call, as the worker batches them")

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
    c.add_argument("--rate-scale", type=_positive, default=1.0, metavar="X", help="with --trace: arrivals × X (default 1)")
    c.add_argument("--startup-minutes", type=_count, default=2, metavar="N",
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
    c.add_argument("--minutes-after", type=_positive_int, default=15, metavar="N",
                   help="minutes after the loss in the minute-by-minute tables (default 15)")
    c.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output format")

    p = sub.add_parser("demo", help="embedded broker + two simulated hours + worker + summary")
    p.add_argument("--scenario", default="mixed-fleet", help="the simulator's scenario (default mixed-fleet; "
                   "zone-loss for the drill)")
    p.add_argument("--minutes", type=_positive_int, default=None, help="simulated minutes (default: the scenario's, 120 for mixed-fleet)")
    p.add_argument("--seed", type=int, default=7, help="the simulation's random seed")
    p.add_argument("--store", default=None, help="DuckDB file the demo writes (default data/tailwatch.duckdb)")
    p.add_argument("--port", type=_port, default=None, help="broker port (default: 9092, or a free one)")
    p.add_argument("--otlp", action="store_true",
                   help="ship the fleet as an OpenTelemetry Collector would (OTLP spans and DCGM/vLLM metrics "
                        "on Kafka) and run `ingest otlp` before the worker")
    p.add_argument("--workers", type=_positive_int, default=1,
                   help="N > 1: N tier-1 worker processes and a tier-2 replica instead of one worker")

    p = sub.add_parser("bench", help="throughput benchmark of the worker against a naive faust agent")
    p.add_argument("--events", type=_positive_int, default=1_000_000, help="synthetic events to replay through the worker")
    p.add_argument("--slices", type=_positive_int, default=20_000, help="distinct slices the events fall into")
    p.add_argument("--events-per-minute", type=_positive_int, default=600_000,
                   help="event-time density of the synthetic traffic (default 600,000: 10,000 requests/s)")
    p.add_argument("--baseline-events", type=_positive_int, default=60_000, help="events for the faust baseline (it is slower: its rate is per event)")
    p.add_argument("--workers", type=_positive_int, default=1, help="also measure with this many worker processes")
    p.add_argument("--port", type=_port, default=None, help="broker port (default: a free one)")
    p.add_argument("--skip-baseline", action="store_true", help="measure the worker only, not the faust baseline")
    p.add_argument("--memory-run", action="store_true", help="run long and report memory over time")
    p.add_argument("--state-every", type=_duration_s, default=5.0, metavar="DURATION",
                   help="memory run: the worker's --state-every (default 5s; at tens of thousands of slices "
                        "each measure walks every detector's history, so a long run may want 1m)")
    p.add_argument("--slo", action="store_true",
                   help="benchmark the SLO engine instead: --slo-count SLOs over --slices live slices")
    p.add_argument("--slo-count", type=_positive_int, default=100, help="SLO bench: SLOs to judge")
    p.add_argument("--history-minutes", type=_positive_int, default=120,
                   help="SLO bench: minutes of history first (43200: a full 30-day window, fed a minute every 6 hours)")
    p.add_argument("--month", action="store_true",
                   help="a month of event time (sparse: --busy-slices slices, a request each every --every-minutes) "
                        "through the embedded broker and a worker with every default stage: RSS at days 2, 10, 20 "
                        "and 30, CPU, store size and the 30-day budgets against an exact count")
    p.add_argument("--label-flood", action="store_true",
                   help="a producer bug: --flood-requests requests with a new tenant and model each, among a steady "
                        "tenant's, through one worker with its default caps: peak RSS, /metrics latency, overflow counts")
    p.add_argument("--flood-requests", type=_positive_int, default=200_000, help="label-flood bench: flood requests")
    p.add_argument("--busy-slices", type=_positive_int, default=1_000, help="month bench: busy slices")
    p.add_argument("--every-minutes", type=_positive_int, default=5, help="month bench: minutes between a slice's requests")
    p.add_argument("--days", type=_positive_int, default=30, help="month bench: days of event time (and 17 minutes)")
    p.add_argument("--store-memory-limit", type=_MIB, default=None,
                   metavar="MIB", help="month bench: the worker's --store-memory-limit (default: the worker's)")
    p.add_argument("--rollup", default=None, metavar="STORE",
                   help="roll a copy of STORE up to --retention-days of minutes: time taken, rows, store size")
    p.add_argument("--retention-days", type=_positive_int, default=7, help="roll-up bench: days of minutes kept")
    p.add_argument("--restore", default=None, metavar="STORE",
                   help="a new replica's time to ready from a snapshot of STORE: snapshot, restore, worker start")
    p.add_argument("--restore-fleet", action="store_true",
                   help="the same on a store of --days (or --hours) of history at --slices busy slices (a request each every "
                        "--every-minutes), its minutes closed by the worker's window operator")
    p.add_argument("--api", action="store_true",
                   help="benchmark the signal API with wrk instead: idle worker vs worker under load")
    p.add_argument("--against", default=None, metavar="REF",
                   help="API bench: also measure the worker of git commit REF, interleaved with this tree's (ABAB)")
    p.add_argument("--rate", type=_positive_int, default=500, help="API bench: requests per second to pace wrk to")
    p.add_argument("--seconds", type=_positive_int, default=20, help="API bench: seconds per wrk run")
    p.add_argument("--rounds", type=_positive_int, default=3,
                   help="API bench with --against: rounds of each tree, interleaved (default 3)")
    p.add_argument("--unauthenticated", type=_count, default=2_500, metavar="N",
                   help="API bench: connections polling with a wrong token while authorised clients poll on new "
                        "connections (default 2,500; 0: skip)")
    p.add_argument("--shape", choices=("dense", "sparse", "both"), default=None,
                   help="replay a public trace through a worker with every default stage: each trace-hour in one "
                        "event-minute (dense), at its own pace (sparse), or both")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="shape bench: an Azure CSV or Mooncake JSONL trace (default: the Azure code trace in tests/data)")
    p.add_argument("--hours", type=_positive_int, default=None,
                   help="shape bench: trace-hours to replay (default: 60 dense, 24 sparse); restore-fleet: hours "
                        "of history of --slices slices busy every minute, in place of --days")
    p.add_argument("--otlp", action="store_true",
                   help="spans per CPU-second through the OTLP adapter, on a public trace (--trace, --spans)")
    p.add_argument("--spans", type=_positive_int, default=20_000, help="OTLP bench: requests of the trace to send as spans")
    p.add_argument("--tiers", action="store_true",
                   help="tier 1's scale-out (1 vs 2 `worker --tier 1`) and a tier-2 replica's CPU per event-minute "
                        "with --slo-count SLOs over --slices slices")
    p.add_argument("--chaos", action="store_true",
                   help="the fault soak instead: a public-trace stream through broker, workers and Alertmanager with "
                        "seeded kills, rebalances, poison, silent partitions and pauses, checked against the log")
    p.add_argument("--seed", type=int, default=7, help="chaos: the fault schedule's seed")
    p.add_argument("--minutes", type=_positive_int, default=120, help="chaos: event-minutes of traffic (default 120)")
    p.add_argument("--out", default=None, metavar="DIR", help="chaos: where the run's files go (default: a temp dir); month: where its "
                        "memory chart goes (default: none drawn)")
    _add_examples(parser)
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
        from tailwatch_dev.trace import TraceError
        from tailwatch.store import StoreError
        from tailwatch_dev.broker import BrokerError
        from tailwatch.streams.http import PortInUse

        if isinstance(exc, (NvmlUnavailable, TraceError, StoreError, BrokerError, ValueError, PortInUse)):
            print(f"tailwatch {args.command}: {exc}", file=sys.stderr)
            return 2
        raise


def _dispatch(args: argparse.Namespace) -> int:
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

