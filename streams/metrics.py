"""The worker's own Prometheus metrics: every name in one place, labels bounded.

Labels are topic (a handful), outcome and reason (closed sets), and partition (bounded
by the topic's partition count).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# `_created` series would double the exposition for a timestamp no dashboard reads.
disable_created_metrics()


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "tailwatch_events_total", "Records consumed, by topic and outcome "
            "(accepted, rejected, late, duplicate).", ["topic", "outcome"], registry=r)
        self.dead_letters = Counter(
            "tailwatch_dead_letters_total", "Records sent to the dead-letter topic, by reason.",
            ["topic", "reason"], registry=r)
        self.publish_failures = Counter(
            "tailwatch_publish_failures_total", "Records Kafka refused on the worker's output topics (dead letters, "
            "closed buckets), by topic and Kafka error; the store still holds them.", ["topic", "error"], registry=r)
        self.group_rescues = Counter(
            "tailwatch_consumer_group_rescues_total", "Times the worker, holding no partition, found its consumer "
            "group wedged on a departed leader and freed it (the embedded broker only: tailwatch/broker.py).", registry=r)
        self.http_restarts = Counter(
            "tailwatch_http_restarts_total", "Times the process serving /metrics and the signal API died and "
            "was started again on the same port (streams/http.py).", registry=r)
        self.late_events = Counter(
            "tailwatch_late_events_total", "Events older than the allowed lateness (dead-lettered).",
            ["topic"], registry=r)
        self.unknown_fields_dropped = Counter(
            "tailwatch_unknown_fields_dropped_total", "Records kept after dropping fields outside the schema.",
            ["topic"], registry=r)
        self.buckets_closed = Counter(
            "tailwatch_buckets_closed_total", "Closed 1-minute buckets written to the store.", ["topic"], registry=r)
        self.bucket_close_delay = Histogram(
            "tailwatch_bucket_close_delay_seconds", "Wall-clock time from the end of a minute to its bucket landing.",
            ["topic"], buckets=(30, 60, 120, 240, 360, 480, 600, 900, 1800, 3600, 86400, float("inf")), registry=r)
        self.consumer_lag = Gauge(
            "tailwatch_consumer_lag_messages", "Messages between the worker's position and the log end.",
            ["topic", "partition"], registry=r)
        self.watermark = Gauge(
            "tailwatch_watermark_timestamp_seconds", "Lowest partition watermark (event time).", ["topic"], registry=r)
        self.open_minutes = Gauge(
            "tailwatch_open_buckets", "One-minute buckets of event time still open.", ["topic"], registry=r)
        self.partitions_paused = Gauge(
            "tailwatch_partitions_paused", "Partitions paused for reading too far ahead of the topic's slowest "
            "(watermark alignment, --max-watermark-drift).", ["topic"], registry=r)
        self.dedupe_ids = Gauge(
            "tailwatch_dedupe_ids", "Event ids held for duplicate detection (open minutes only).", ["topic"], registry=r)
        self.stage_cpu_seconds = Counter(
            "tailwatch_stage_cpu_seconds_total", "CPU time spent in each stage fed by closed minutes (slo, "
            "detectors, fleet_metrics, signals) and in rebuilding the signal API's view (signals_view).",
            ["stage"], registry=r)
        self.checkpoint_seconds = Histogram(
            "tailwatch_checkpoint_duration_seconds", "Time to write one checkpoint transaction.", registry=r)


# Why the HTTP process refused or cut a connection or request (streams/http.py): a closed set.
HTTP_REFUSALS = ("head_timeout", "idle_head_timeout", "body_timeout", "body_too_large", "client_disconnected",
                 "refused_before_body", "malformed_request", "evicted_slow_connection", "connection_limit",
                 "accept_failed")


class HttpMetrics:
    """The HTTP process's own counters, appended to the worker's /metrics."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.refused = Counter(
            "tailwatch_http_refused_total", "Connections and requests the HTTP port refused or cut, by reason "
            "(slow heads and bodies, oversized or malformed requests, bodies refused before reading, the "
            "connection cap).", ["reason"], registry=self.registry)
        for reason in HTTP_REFUSALS:  # known label sets start at 0
            self.refused.labels(reason)
