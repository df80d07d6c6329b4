"""The three tiers, each a list of the runtime's parts (streams/runtime.py), and the
worker's settings they are built from.

| tier  | source                                   | operator (settings)                      | restored from          | sinks                                                | HTTP port            |
|-------|------------------------------------------|------------------------------------------|------------------------|------------------------------------------------------|----------------------|
| `all` | tw.requests, tw.gpu (group)              | MinuteWindowOperator (WindowSettings)    | the store              | topics (tw.sli copies), store (StoreSettings), pages | signal API, /metrics |
| `1`   | tw.requests, tw.gpu (group, N workers)   | PartialPublisher (PartialSettings)       | Kafka (`.progress`)    | topics (tw.sli partials, `.progress`)                | /metrics             |
| `2`   | tw.sli, tw.deadletter (every partition)  | MinuteAssembly (AssemblySettings)        | the store              | topics, store (StoreSettings), pages                 | signal API, /metrics |

The stages (SLO engine first: the signal view reads its states; then the settings'
stages, then the signal view) run where there is a store. The domain parts (SLOs, the
signal view, GPU prices, Alertmanager links) are built here, so that the runtime imports
none of their rooms.

Each part is built from its own settings, derived here from the worker's (`WorkerSettings`,
the command line's flags): the loop's `RuntimeSettings`, the operators' `WindowSettings`,
`PartialSettings` and `AssemblySettings`, the store sink's `StoreSettings`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from tailwatch.alerts.alertmanager import AlertLinks
from tailwatch.config.plugins import CONSUMER_CONFIG, GROUP_RESCUE, dev_hook
from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.ingest.validate import DEFAULT_MAX_RECORD_BYTES
from tailwatch.planning.prices import GpuPrices
from tailwatch.signals.config import ApiConfig
from tailwatch.streams.cardinality import CardinalityLimits
from tailwatch.streams.frames import DEFAULT_MAX_AHEAD_MS
from tailwatch.streams.http import WorkerHttp
from tailwatch.streams.alert_sink import AlertSink
from tailwatch.streams.assembly import AssemblySettings, MinuteAssembly
from tailwatch.streams.detector_stage import DetectorStage
from tailwatch.streams.metrics import CpuAccount, WorkerMetrics
from tailwatch.streams.operator import Operator
from tailwatch.streams.partial_publisher import PartialPublisher, PartialSettings
from tailwatch.streams.rollup import RollUp
from tailwatch.streams.runtime import Parts, Runtime, RuntimeSettings
from tailwatch.streams.signal_stage import SignalStage
from tailwatch.streams.group_rescue import GroupRescue
from tailwatch.streams.log_reset import LogReset
from tailwatch.streams.slo_stage import SloStage
from tailwatch.streams.source import Connector, KafkaConnector
from tailwatch.streams.store_sink import StoreSettings, StoreSink
from tailwatch.streams.topic_sink import TopicSink
from tailwatch.streams.window_operator import MinuteWindowOperator, WindowSettings


@dataclass
class WorkerSettings:
    """What a worker is started with (the command line's flags); `build` hands each part its own."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    store_path: str = StoreSettings.path
    group_id: str = "tailwatch-worker"
    http_port: int | None = 8000
    # Stop after this long without a record, once drained (0: as soon as every partition is read to its end).
    until_idle_s: float | None = None
    allowed_lateness_s: float = 300.0
    # Past the allowed lateness, a request still corrects its closed minute up to this far behind
    # its partition's watermark and the closed frontier (0: dead letters `late`, as before).
    correction_horizon_s: float = 86400.0
    # Minute rows older than this are rolled into hour rows (streams/rollup.py; 0: never).
    minute_retention_s: float = 35 * 86400.0
    max_event_ahead_s: float = DEFAULT_MAX_AHEAD_MS / 1000  # event time past its Kafka record's timestamp: `future`
    batch_size: int = 20_000
    checkpoint_interval_s: float = 2.0
    # A checkpoint closes minutes of at most about this many rows; the rest close at the next,
    # before more is read. A backlog then closes in steps whose memory does not grow with it.
    checkpoint_max_rows: int = 20_000
    # Values per open-ended slice label and slices kept apart; the rest count under `__other__`.
    cardinality: CardinalityLimits = field(default_factory=CardinalityLimits)
    state_every_s: float = 60.0  # how often the state's memory is measured for /metrics (a walk of its objects)
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    partitions: int = 4
    publish_sli: bool = True
    progress: Callable[[str], None] | None = None  # a status line, when what it says changed
    announce: Callable[[str], None] | None = None  # the start and stop lines
    stats_file: str | None = None  # JSON run statistics at exit (benchmarks read it)
    slos: list | None = None  # slo.spec.SloSpec: evaluated on every closed minute; None: none
    slos_file: str = ""  # where they came from, for the start line
    alertmanager_urls: tuple[str, ...] = ()  # every Alertmanager of the cluster
    store_release_s: float = StoreSettings.release_s  # how often the worker lets go of the DuckDB file for readers
    store_memory_limit_mib: int = StoreSettings.memory_limit_mib  # DuckDB's buffer pool for the store, to start with
    stages: list = field(default_factory=list)  # streams.stages.Stage: fed each checkpoint's closed minutes
    http_host: str = "127.0.0.1"
    api_config: ApiConfig = field(default_factory=ApiConfig)  # the signal API on the HTTP port
    prices: GpuPrices = field(default_factory=GpuPrices)
    alert_links: AlertLinks = field(default_factory=AlertLinks)  # where pages point: runbooks, Grafana
    signals_refresh_s: float = 2.0  # how often the API's view is rebuilt from buckets and open minutes
    # Event time: a partition read to its end that is this far behind the newest stops holding minutes open.
    idle_timeout_s: float = 60.0
    # Static group membership (KIP-345) on a cluster that expires static members; None: dynamic.
    instance_id: str | None = None
    drain_timeout_s: float = 120.0  # --until-idle: how long to wait for partitions it does not own or has not read
    # Pause a partition whose watermark is this far ahead of the topic's slowest (None: the allowed lateness; 0: never).
    max_watermark_drift_s: float | None = None


def window_settings(settings: WorkerSettings) -> WindowSettings:
    """Tier `all`'s operator's share of the worker's settings."""
    s = settings
    return WindowSettings(kafka=s.kafka, allowed_lateness_s=s.allowed_lateness_s, idle_timeout_s=s.idle_timeout_s,
                          correction_horizon_s=s.correction_horizon_s, max_event_ahead_s=s.max_event_ahead_s,
                          max_record_bytes=s.max_record_bytes, checkpoint_max_rows=s.checkpoint_max_rows,
                          max_watermark_drift_s=s.max_watermark_drift_s, cardinality=s.cardinality,
                          publish_sli=s.publish_sli)


def partial_settings(settings: WorkerSettings) -> PartialSettings:
    """Tier 1's operator's share of the worker's settings."""
    s = settings
    return PartialSettings(kafka=s.kafka, allowed_lateness_s=s.allowed_lateness_s, idle_timeout_s=s.idle_timeout_s,
                           max_event_ahead_s=s.max_event_ahead_s, max_record_bytes=s.max_record_bytes,
                           partitions=s.partitions)


def assembly_settings(settings: WorkerSettings) -> AssemblySettings:
    """Tier 2's operator's share of the worker's settings."""
    return AssemblySettings(kafka=settings.kafka)


def store_settings(settings: WorkerSettings) -> StoreSettings:
    """The store sink's share of the worker's settings."""
    return StoreSettings(path=settings.store_path, release_s=settings.store_release_s,
                         memory_limit_mib=settings.store_memory_limit_mib)


# Each tier's operator, and what it is built from.
OPERATORS: dict[str, tuple[Callable[..., Operator], Callable[[WorkerSettings], object]]] = {
    "all": (MinuteWindowOperator, window_settings),
    "1": (PartialPublisher, partial_settings),
    "2": (MinuteAssembly, assembly_settings),
}
TIERS = tuple(OPERATORS)


def _gap_marker(metrics: WorkerMetrics, operator: Operator) -> Callable[[LogReset], None]:
    """A reset partition is counted, and its gap marked by a dead letter stamped when it was seen."""
    def mark(reset: LogReset) -> None:
        metrics.log_resets.labels(reset.topic, reset.reason).inc()
        operator.mark_gap(reset.dead_letter(int(time.time() * 1000)))
    return mark


def kafka_connector(settings: WorkerSettings, metrics: WorkerMetrics) -> KafkaConnector:
    """Kafka, with what the development tools lend for the embedded broker (their hooks,
    tailwatch.config.plugins, all asked for here; none where only the runtime is installed):
    the consumer settings its answers need, handed to the source and asked of the hook when
    the consumer is made (it asks the cluster whether it is the embedded broker), and the
    rescue of a wedged group, a tick watcher of the source (streams/group_rescue.py)."""
    kafka = settings.kafka
    settings_for, rescue = dev_hook(CONSUMER_CONFIG), dev_hook(GROUP_RESCUE)
    consumer_config = None if settings_for is None else lambda: settings_for(kafka.bootstrap_servers, kafka.base_config())
    watchers = [] if rescue is None else [GroupRescue(kafka, rescue, on_rescued=metrics.group_rescues.inc)]
    return KafkaConnector(kafka, settings.group_id, settings.instance_id, consumer_config=consumer_config,
                          watchers=watchers)


def build(settings: WorkerSettings, tier: str = "all", metrics: WorkerMetrics | None = None,
          connector: Connector | None = None) -> Runtime:
    """The worker of a tier: `all` (one process does everything), `1` (the firehose, N of
    them, no store) or `2` (a replica: every stage over tw.sli, a store of its own).
    `connector` gives its source and its topic sink's producer: Kafka (`kafka_connector`) by
    default, or records in memory (streams/memory_source.py)."""
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r}: one of {', '.join(TIERS)}")
    metrics = metrics or WorkerMetrics()
    connector = kafka_connector(settings, metrics) if connector is None else connector
    cpu = CpuAccount(metrics)
    runtime: Runtime | None = None
    topics = TopicSink(settings.kafka, metrics, stopping=lambda: runtime is not None and runtime.stopping,
                       producer=connector.producer)
    make_operator, operator_settings = OPERATORS[tier]
    operator = make_operator(operator_settings(settings), metrics, cpu, topics)
    parts = Parts(operator, [topics])
    if tier != "1":
        stages = []
        slo = SloStage(settings.slos, settings.alertmanager_urls, settings.alert_links) if settings.slos else None
        if slo is not None:
            stages.append(slo)
        stages.extend(settings.stages)
        detectors = [s for s in settings.stages if isinstance(s, DetectorStage)]
        if slo is not None and detectors:
            slo.open_detections = lambda: [d for stage in detectors for d in stage.open_detections()]
        if settings.http_port is not None:
            from tailwatch.signals.live import LiveSignals

            live = LiveSignals(settings.api_config.policy, settings.slos, settings.prices)
            parts.signals = SignalStage(live, slo.states, slo.details) if slo is not None else SignalStage(live)
            stages.append(parts.signals)
        store_sink = StoreSink(store_settings(settings), stages, cpu, RollUp(int(settings.minute_retention_s // 60)),
                               on_memory_limit=lambda mib: metrics.store_memory_limit.set(mib * 2**20),
                               stopping=lambda: runtime is not None and runtime.stopping)
        parts.sinks += [store_sink, AlertSink(store_sink.outboxes)]
    source = connector.source(operator.topics, operator.watched, operator.by_group, _gap_marker(metrics, operator))
    if settings.http_port is not None:
        parts.http = WorkerHttp(settings.http_port, metrics.registry, host=settings.http_host,
                                api_config=settings.api_config, on_restart=metrics.http_restarts.inc)
    runtime = Runtime(runtime_settings(settings), metrics, cpu, parts, source)
    return runtime


def runtime_settings(settings: WorkerSettings) -> RuntimeSettings:
    """The loop's share of the worker's settings, and what the parts add to its start line."""
    s = settings
    notes = () if s.slos is None else (f"{len(s.slos)} SLOs" + (f" from {s.slos_file}" if s.slos_file else ""),)
    return RuntimeSettings(kafka=s.kafka, group_id=s.group_id, partitions=s.partitions, batch_size=s.batch_size,
                           checkpoint_interval_s=s.checkpoint_interval_s, until_idle_s=s.until_idle_s,
                           drain_timeout_s=s.drain_timeout_s, state_every_s=s.state_every_s,
                           stale_after_s=s.api_config.stale_after_s, view_refresh_s=s.signals_refresh_s,
                           stats_file=s.stats_file, progress=s.progress, announce=s.announce, start_notes=notes)
