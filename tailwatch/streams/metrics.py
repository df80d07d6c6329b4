"""The worker's own Prometheus metrics: every name in one place, labels bounded.

Labels are topic (a handful), outcome and reason (closed sets), partition (bounded
by the topic's partition count), and label (the slice labels).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from tailwatch.streams.connections import EVICTED_SLOW, EVICTED_UNAUTHENTICATED
from tailwatch.conventions import (
    BUCKETS_CLOSED_TOTAL, BUCKET_CLOSE_DELAY_SECONDS, CHECKPOINT_DURATION_SECONDS,
    CONSUMER_GROUP_RESCUES_TOTAL, LOG_RESETS_TOTAL, CONSUMER_LAG_MESSAGES, DEAD_LETTERS_TOTAL, DEDUPE_IDS, EVENTS_TOTAL,
    FLAGGER_EVENT_TYPES, FLAGGER_EVENTS_TOTAL, FLAGGER_PHASES, HTTP_REFUSED_TOTAL, HTTP_RESTARTS_TOTAL, LATE_EVENTS_TOTAL, CORRECTED_EVENTS_TOTAL, OPEN_BUCKETS, PARTITIONS_PAUSED,
    PUBLISH_FAILURES_TOTAL, STAGE_CPU_SECONDS_TOTAL, STATE_BYTES, PROCESS_MEMORY_BYTES, STORE_MEMORY_LIMIT_BYTES,
    UNKNOWN_FIELDS_DROPPED_TOTAL, WATERMARK_TIMESTAMP_SECONDS, LABEL_VALUES, LABEL_VALUES_OVERFLOWED_TOTAL,
    SLICES_OVERFLOWED_TOTAL,
)

# `_created` series would double the exposition for a timestamp no dashboard reads.
disable_created_metrics()


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events = Counter(
            EVENTS_TOTAL, "Records consumed, by topic and outcome (accepted, rejected, duplicate; correcting: "
            "late, held to correct a closed minute; late or too_late: dead-lettered).", ["topic", "outcome"], registry=r)
        self.dead_letters = Counter(
            DEAD_LETTERS_TOTAL, "Records sent to the dead-letter topic, by reason.",
            ["topic", "reason"], registry=r)
        self.publish_failures = Counter(
            PUBLISH_FAILURES_TOTAL, "Records Kafka refused on the worker's output topics (dead letters, "
            "closed buckets), by topic and Kafka error; the store still holds them.", ["topic", "error"], registry=r)
        self.group_rescues = Counter(
            CONSUMER_GROUP_RESCUES_TOTAL, "Times the worker, holding no partition, found its consumer "
            "group wedged on a departed leader and freed it (the embedded broker only, through the development tools).", registry=r)
        self.log_resets = Counter(
            LOG_RESETS_TOTAL, "Partitions whose stored read position the log no longer had (past its end, "
            "before its start, or the topic created again), read again from their start; each gap is a dead "
            "letter of reason log_reset (streams/log_reset.py).", ["topic", "reason"], registry=r)
        self.http_restarts = Counter(
            HTTP_RESTARTS_TOTAL, "Times the process serving /metrics and the signal API died and "
            "was started again on the same port (streams/http.py).", registry=r)
        self.late_events = Counter(
            LATE_EVENTS_TOTAL, "Events dead-lettered as late: past the allowed lateness where no correction "
            "horizon applies, or past the correction horizon.", ["topic"], registry=r)
        self.corrected_events = Counter(
            CORRECTED_EVENTS_TOTAL, "Late events merged into the closed minute they belong to (copies of "
            "events a minute already counted are duplicates).", ["topic"], registry=r)
        self.unknown_fields_dropped = Counter(
            UNKNOWN_FIELDS_DROPPED_TOTAL, "Records kept after dropping fields outside the schema.",
            ["topic"], registry=r)
        self.buckets_closed = Counter(
            BUCKETS_CLOSED_TOTAL, "Closed 1-minute buckets written to the store.", ["topic"], registry=r)
        self.bucket_close_delay = Histogram(
            BUCKET_CLOSE_DELAY_SECONDS, "Wall-clock time from the end of a minute to its bucket landing.",
            ["topic"], buckets=(30, 60, 120, 240, 360, 480, 600, 900, 1800, 3600, 86400, float("inf")), registry=r)
        self.consumer_lag = Gauge(
            CONSUMER_LAG_MESSAGES, "Messages between the worker's position and the log end.",
            ["topic", "partition"], registry=r)
        self.watermark = Gauge(
            WATERMARK_TIMESTAMP_SECONDS, "Lowest partition watermark (event time).", ["topic"], registry=r)
        self.state_bytes = Gauge(
            STATE_BYTES, "Memory held by each part of the worker (open minutes, each stage, the signal view), "
            "estimated from its objects about once a minute (streams/state_size.py).", ["component"], registry=r)
        self.process_memory = Gauge(
            PROCESS_MEMORY_BYTES, "The worker's resident memory by holder (file-backed pages, glibc's heap in use "
            "and held free, the store's cache, other anonymous memory), about once a minute "
            "(streams/process_memory.py).", ["holder"], registry=r)
        self.store_memory_limit = Gauge(
            STORE_MEMORY_LIMIT_BYTES, "DuckDB's memory limit for the store: --store-memory-limit, doubled for a "
            "checkpoint that needed more (at most four times it).", registry=r)
        self.open_minutes = Gauge(
            OPEN_BUCKETS, "One-minute buckets of event time still open.", ["topic"], registry=r)
        self.partitions_paused = Gauge(
            PARTITIONS_PAUSED, "Partitions paused for reading too far ahead of the topic's slowest "
            "(watermark alignment, --max-watermark-drift).", ["topic"], registry=r)
        self.dedupe_ids = Gauge(
            DEDUPE_IDS, "Event ids held for duplicate detection (open minutes only).", ["topic"], registry=r)
        self.stage_cpu_seconds = Counter(
            STAGE_CPU_SECONDS_TOTAL, "CPU time spent in each stage fed by closed minutes (slo, "
            "detectors, fleet_metrics, signals) and in rebuilding the signal API's view (signals_view).",
            ["stage"], registry=r)
        self.checkpoint_seconds = Histogram(
            CHECKPOINT_DURATION_SECONDS, "Time to write one checkpoint transaction.", registry=r)
        # label: the capped slice labels of the topic (streams/cardinality.py), and `slice`.
        self.label_values_overflowed = Counter(
            LABEL_VALUES_OVERFLOWED_TOTAL, "Events counted under __other__ because their value of this label "
            "came when the label held --max-label-values values.", ["topic", "label"], registry=r)
        self.slices_overflowed = Counter(
            SLICES_OVERFLOWED_TOTAL, "Events counted in a slice folded into __other__ because the worker held "
            "--max-slices slices.", ["topic"], registry=r)
        self.label_values = Gauge(
            LABEL_VALUES, "Values each capped label holds (label slice: slices held), against "
            "--max-label-values and --max-slices.", ["topic", "label"], registry=r)


# Why the HTTP process refused or cut a connection or request (streams/http_server.py): a closed set.
HTTP_REFUSALS = ("head_timeout", "idle_head_timeout", "body_timeout", "body_too_large", "client_disconnected",
                 "refused_before_body", "malformed_request", EVICTED_SLOW, EVICTED_UNAUTHENTICATED,
                 "connection_limit", "accept_failed")


class HttpMetrics:
    """The HTTP process's own counters, appended to the worker's /metrics."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.refused = Counter(
            HTTP_REFUSED_TOTAL, "Connections and requests the HTTP port refused or cut, by reason "
            "(slow heads and bodies, oversized or malformed requests, bodies refused before reading, the "
            "connection cap and the connections evicted at it).", ["reason"], registry=self.registry)
        for reason in HTTP_REFUSALS:  # known label sets start at 0
            self.refused.labels(reason)
        self.flagger_events = Counter(
            FLAGGER_EVENTS_TOTAL, "Events Flagger sent to the `event` webhook, by canary phase and event type "
            "(other: a value outside Flagger's sets).", ["phase", "event_type"], registry=self.registry)
        for phase in (*FLAGGER_PHASES, "other"):  # known label sets start at 0
            for kind in (*FLAGGER_EVENT_TYPES, "other"):
                self.flagger_events.labels(phase, kind)


class CpuAccount:
    """CPU time per part of the worker (the `stage_cpu_seconds` family, and the run's stats)."""

    def __init__(self, metrics: WorkerMetrics):
        self.metrics = metrics
        self.seconds: dict[str, float] = {}

    @staticmethod
    def began() -> float:
        return time.process_time()

    def spent(self, part: str, began: float) -> None:
        spent = time.process_time() - began
        self.seconds[part] = self.seconds.get(part, 0.0) + spent
        self.metrics.stage_cpu_seconds.labels(part).inc(spent)
