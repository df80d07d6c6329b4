"""Pipeline health: consumer lag, events per second by topic, dead letters by reason,
late events, bucket close delay, checkpoints (the worker's own metrics, streams/metrics.py),
HTTP refusals, and the fleet metrics' label sets against their budget."""

from __future__ import annotations

from dashboards.common import (
    RATE,
    UID_PIPELINE,
    Q,
    dashboard,
    datasource_variable,
    stat,
    table,
    timeseries,
)


def quantile(q: float, histogram: str, by: str) -> str:
    return f"histogram_quantile({q:g}, sum by ({by}le) (rate({histogram}_bucket[{RATE}])))"


def build(specs=None):
    panels = [
        stat("Consumer lag", "short", [Q("sum(tailwatch_consumer_lag_messages)", instant=True)], w=6),
        stat("Events per second", "cps", [Q(f"sum(rate(tailwatch_events_total[{RATE}]))", instant=True)], w=6),
        stat("Dead letters (range)", "short",
             [Q("sum(increase(tailwatch_dead_letters_total[$__range]))", instant=True)], w=6),
        stat("Open minutes", "short", [Q("max(tailwatch_open_buckets)", instant=True)], w=6),
        timeseries("Consumer lag by topic and partition", "short",
                   [Q("sum by (topic, partition) (tailwatch_consumer_lag_messages)", "{{topic}}[{{partition}}]")], w=12),
        timeseries("Events per second by topic and outcome", "cps",
                   [Q(f"sum by (topic, outcome) (rate(tailwatch_events_total[{RATE}]))", "{{topic}} {{outcome}}")], w=12),
        timeseries("Dead letters by reason", "cps",
                   [Q(f"sum by (reason) (rate(tailwatch_dead_letters_total[{RATE}]))", "{{reason}}")]),
        table("Dead letters since start by reason", "short",
              [Q("sum by (topic, reason) (tailwatch_dead_letters_total)", instant=True)], w=8),
        timeseries("Late events by topic", "cps",
                   [Q(f"sum by (topic) (rate(tailwatch_late_events_total[{RATE}]))", "{{topic}}")]),
        timeseries("Bucket close delay p95", "s",
                   [Q(quantile(0.95, "tailwatch_bucket_close_delay_seconds", "topic, "), "{{topic}}")],
                   description="Wall-clock time from a minute's end to its bucket landing in the store."),
        timeseries("Event-time lag (now − watermark)", "s",
                   [Q("time() - tailwatch_watermark_timestamp_seconds", "{{topic}}")],
                   description="Large on a replay of old traffic; on live traffic about the allowed lateness."),
        timeseries("Checkpoint duration p95", "s",
                   [Q(quantile(0.95, "tailwatch_checkpoint_duration_seconds", ""), "p95")]),
        timeseries("Buckets closed per second by topic", "cps",
                   [Q(f"sum by (topic) (rate(tailwatch_buckets_closed_total[{RATE}]))", "{{topic}}")], w=12),
        timeseries("Fields dropped at ingest by topic", "cps",
                   [Q(f"sum by (topic) (rate(tailwatch_unknown_fields_dropped_total[{RATE}]))", "{{topic}}")], w=12,
                   description="Records that carried fields outside the schema (dropped before storage)."),
        timeseries("HTTP connections and requests refused, by reason", "cps",
                   [Q(f"sum by (reason) (rate(tailwatch_http_refused_total[{RATE}]))", "{{reason}}")], w=12,
                   description="Slow heads and bodies cut, bodies refused before reading, malformed requests, and the "
                               "connection cap's evictions and refusals: a climb here is a client or an attacker "
                               "misbehaving, never the API slowing down."),
        timeseries("Fleet metric label sets against their limit", "short",
                   [Q("max by (family) (tailwatch_fleet_label_sets)", "{{family}}"),
                    Q("max by (family) (tailwatch_fleet_label_sets_limit)", "{{family}} limit")], w=12,
                   description="Past the limit, new label sets fold their tenant, model, version and pool into "
                               "other (--metrics-max-label-sets): totals stay exact, named breakdowns stop growing."),
    ]
    return dashboard(UID_PIPELINE, "tailwatch / Pipeline health", "The worker itself: lag, throughput, dead letters.",
                     panels, [datasource_variable()], time_from="now-1h")
