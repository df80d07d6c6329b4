"""The three tiers, each a configuration of the runtime's parts (streams/runtime.py).

| tier  | source                                   | operator                | sinks                          | HTTP port            |
|-------|------------------------------------------|-------------------------|--------------------------------|----------------------|
| `all` | tw.requests, tw.gpu (group)              | MinuteWindowOperator    | store + stages, tw.sli copies  | signal API, /metrics |
| `1`   | tw.requests, tw.gpu (group, N workers)   | PartialPublisher        | tw.sli partials, `.progress`   | /metrics             |
| `2`   | tw.sli, tw.deadletter (every partition)  | MinuteAssembly          | store + stages                 | signal API, /metrics |

The stages (SLO engine first: the signal view reads its states; then the settings'
stages, then the signal view) run where there is a store.
"""

from __future__ import annotations

import time
from typing import Callable

from tailwatch.streams.assembly import MinuteAssembly
from tailwatch.streams.metrics import CpuAccount, WorkerMetrics
from tailwatch.streams.partial_publisher import PartialPublisher
from tailwatch.streams.rollup import RollUp
from tailwatch.streams.runtime import Parts, Runtime, WorkerSettings
from tailwatch.streams.signal_stage import SignalStage
from tailwatch.streams.log_reset import LogReset
from tailwatch.streams.slo_stage import SloStage
from tailwatch.streams.source import KafkaSource
from tailwatch.streams.store_sink import StoreSink
from tailwatch.streams.topic_sink import TopicSink
from tailwatch.streams.window_operator import MinuteWindowOperator

OPERATORS = {"all": MinuteWindowOperator, "1": PartialPublisher, "2": MinuteAssembly}
TIERS = tuple(OPERATORS)


def _gap_marker(metrics: WorkerMetrics, operator) -> Callable[[LogReset], None]:
    """A reset partition is counted, and its gap marked by a dead letter stamped when it was seen."""
    def mark(reset: LogReset) -> None:
        metrics.log_resets.labels(reset.topic, reset.reason).inc()
        operator.mark_gap(reset.dead_letter(int(time.time() * 1000)))
    return mark


def build(settings: WorkerSettings, tier: str = "all", metrics: WorkerMetrics | None = None) -> Runtime:
    """The worker of a tier: `all` (one process does everything), `1` (the firehose, N of
    them, no store) or `2` (a replica: every stage over tw.sli, a store of its own)."""
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r}: one of {', '.join(TIERS)}")
    metrics = metrics or WorkerMetrics()
    cpu = CpuAccount(metrics)
    runtime: Runtime | None = None
    topics = TopicSink(settings.kafka, metrics, stopping=lambda: runtime is not None and runtime.stopping)
    operator = OPERATORS[tier](settings, metrics, cpu, topics)
    parts = Parts(operator, topics)
    if tier != "1":
        stages = []
        slo = SloStage(settings.slos, settings.alertmanager_urls, settings.alert_links) if settings.slos else None
        if slo is not None:
            stages.append(slo)
        stages.extend(settings.stages)
        if settings.http_port is not None:
            from tailwatch.signals.live import LiveSignals

            live = LiveSignals(settings.api_config.policy, settings.slos, settings.prices)
            parts.signals = SignalStage(live, slo.states, slo.details) if slo is not None else SignalStage(live)
            stages.append(parts.signals)
        parts.store = StoreSink(settings.store_path, settings.store_release_s, stages, cpu,
                                RollUp(int(settings.minute_retention_s // 60)), settings.store_memory_limit_mib,
                                on_memory_limit=lambda mib: metrics.store_memory_limit.set(mib * 2**20),
                                stopping=lambda: runtime is not None and runtime.stopping)
    source = KafkaSource(settings.kafka, operator.topics, operator.watched, settings.group_id,
                         by_group=operator.by_group, instance_id=settings.instance_id,
                         on_group_rescued=metrics.group_rescues.inc, on_log_reset=_gap_marker(metrics, operator))
    runtime = Runtime(settings, metrics, cpu, parts, source)
    return runtime
