"""Pipeline health: consumer lag, events per second by topic, dead letters by reason,
late events, bucket close delay, checkpoints (the worker's own metrics, streams/metrics.py),
HTTP refusals, and the fleet metrics' label sets against their budget."""

from __future__ import annotations

from tailwatch.dashboards.common import (
    RATE,
    UID_PIPELINE,
    Q,
    dashboard,
    datasource_variable,
    stat,
    table,
    timeseries,
)
from tailwatch.conventions import (
    BUCKETS_CLOSED_TOTAL, BUCKET_CLOSE_DELAY_SECONDS, CHECKPOINT_DURATION_SECONDS, CONSUMER_LAG_MESSAGES,
    DEAD_LETTERS_TOTAL, EVENTS_TOTAL, FLAGGER_EVENTS_TOTAL, FLEET_LABEL_SETS, FLEET_LABEL_SETS_LIMIT, HTTP_REFUSED_TOTAL,
    CORRECTED_EVENTS_TOTAL, LATE_EVENTS_TOTAL, OPEN_BUCKETS, PROCESS_MEMORY_BYTES, STATE_BYTES, UNKNOWN_FIELDS_DROPPED_TOTAL,
    WATERMARK_TIMESTAMP_SECONDS,
)


def quantile(q: float, histogram: str, by: str) -> str:
    return f"histogram_quantile({q:g}, sum by ({by}le) (rate({histogram}_bucket[{RATE}])))"


def build(specs=None):
    panels = [
        stat("Consumer lag", "short", [Q(f"sum({CONSUMER_LAG_MESSAGES})", instant=True)], w=6,
             description="Records published but not yet read, over every topic and partition."),
        stat("Events per second", "cps", [Q(f"sum(rate({EVENTS_TOTAL}[{RATE}]))", instant=True)], w=6,
             description="Events the worker decoded per second, every topic and outcome."),
        stat("Dead letters (range)", "short",
             [Q(f"sum(increase({DEAD_LETTERS_TOTAL}[$__range]))", instant=True)], w=6,
             description="Records refused over the time range, each with a reason (panel below; tw.deadletter)."),
        stat("Open minutes", "short", [Q(f"max({OPEN_BUCKETS})", instant=True)], w=6,
             description="Event-time minutes still open (waiting for late events): about the allowed lateness on "
                         "live traffic; growing means a partition is behind or silent."),
        timeseries("Consumer lag by topic and partition", "short",
                   [Q(f"sum by (topic, partition) ({CONSUMER_LAG_MESSAGES})", "{{topic}}[{{partition}}]")], w=12,
                   description="Records not yet read per partition: one partition behind holds every minute open."),
        timeseries("Events per second by topic and outcome", "cps",
                   [Q(f"sum by (topic, outcome) (rate({EVENTS_TOTAL}[{RATE}]))", "{{topic}} {{outcome}}")], w=12,
                   description="Decoded events per second by topic and outcome (accepted, duplicate, dead letter)."),
        timeseries("Dead letters by reason", "cps",
                   [Q(f"sum by (reason) (rate({DEAD_LETTERS_TOTAL}[{RATE}]))", "{{reason}}")],
                   description="Refused records per second by reason (docs/data-contract.md lists every reason)."),
        table("Dead letters since start by reason", "short",
              [Q(f"sum by (topic, reason) ({DEAD_LETTERS_TOTAL})", instant=True, column="Dead letters")], w=8,
              description="Refused records since the worker started, by topic and reason."),
        timeseries("Late events by topic: merged into their closed minute, or dead-lettered", "cps",
                   [Q(f"sum by (topic) (rate({CORRECTED_EVENTS_TOTAL}[{RATE}]))", "{{topic}} corrected"),
                    Q(f"sum by (topic) (rate({LATE_EVENTS_TOTAL}[{RATE}]))", "{{topic}} dead-lettered")],
                   description="Past the allowed lateness, a request within the correction horizon corrects its "
                               "minute in the store and SLO budgets; older ones (and late GPU samples) are dead letters."),
        timeseries("Bucket close delay p95", "s",
                   [Q(quantile(0.95, BUCKET_CLOSE_DELAY_SECONDS, "topic, "), "{{topic}}")],
                   description="Wall-clock time from a minute's end to its bucket landing in the store."),
        timeseries("Event-time lag (now − watermark)", "s",
                   [Q(f"time() - {WATERMARK_TIMESTAMP_SECONDS}", "{{topic}}")],
                   description="Large on a replay of old traffic; on live traffic about the allowed lateness."),
        timeseries("Checkpoint duration p95", "s",
                   [Q(quantile(0.95, CHECKPOINT_DURATION_SECONDS, ""), "p95")],
                   description="95th percentile time of the checkpoint transaction (buckets, stage rows, offsets)."),
        timeseries("Buckets closed per second by topic", "cps",
                   [Q(f"sum by (topic) (rate({BUCKETS_CLOSED_TOTAL}[{RATE}]))", "{{topic}}")], w=12,
                   description="Slice-minutes closed and stored per second: zero while events arrive means minutes "
                               "are held open (a partition behind or silent)."),
        timeseries("Fields dropped at ingest by topic", "cps",
                   [Q(f"sum by (topic) (rate({UNKNOWN_FIELDS_DROPPED_TOTAL}[{RATE}]))", "{{topic}}")], w=12,
                   description="Records that carried fields outside the schema (dropped before storage)."),
        timeseries("HTTP connections and requests refused, by reason", "cps",
                   [Q(f"sum by (reason) (rate({HTTP_REFUSED_TOTAL}[{RATE}]))", "{{reason}}")], w=12,
                   description="Slow heads and bodies cut, bodies refused before reading, malformed requests, and the "
                               "connection cap's evictions and refusals: a climb here is a client or an attacker "
                               "misbehaving, never the API slowing down."),
        timeseries("Flagger rollout events by phase", "short",
                   [Q(f"sum by (phase, event_type) (increase({FLAGGER_EVENTS_TOTAL}[{RATE}]))",
                      "{{phase}} {{event_type}}")], w=12,
                   description="Events Flagger sent to POST /v1/flagger/event: a canary's phases (Progressing, "
                               "Promoting, Failed ...) beside the SLIs it is judged on; Warning events are its halts "
                               "and rollbacks."),
        timeseries("Worker memory by holder", "bytes",
                   [Q(f"sum by (holder) ({PROCESS_MEMORY_BYTES})", "{{holder}}"),
                    Q(f"sum({STATE_BYTES})", "state the worker names")], w=12,
                   description="The resident set split by who holds it (file-backed code, glibc's heap in use and "
                               "held free, the store's cache, other anonymous memory), beside what the worker's own "
                               "state adds up to: a rise in the holders that the state does not share is the "
                               "allocators or the batches in flight, not data the worker keeps."),
        timeseries("Fleet metric label sets against their limit", "short",
                   [Q(f"max by (family) ({FLEET_LABEL_SETS})", "{{family}}"),
                    Q(f"max by (family) ({FLEET_LABEL_SETS_LIMIT})", "{{family}} limit")], w=12,
                   description="Past the limit, new label sets fold their tenant, model, version and pool into "
                               "other (--metrics-max-label-sets): totals stay exact, named breakdowns stop growing."),
    ]
    return dashboard(UID_PIPELINE, "tailwatch / Pipeline health", "The worker itself: lag, throughput, dead letters.",
                     panels, [datasource_variable()], time_from="now-1h")
