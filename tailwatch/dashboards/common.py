"""What every tailwatch dashboard shares: the datasource, the template variables, label
matchers that know which metric carries which label, panel builders that demand a unit,
and the grid layout.

Dashboards are grafanalib objects; `generate.py` turns them into JSON that Grafana
imports as is (schema 39: Grafana 10 and later).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grafanalib import core as g

from tailwatch.conventions import GPU_TIME_LABELS, LATENCY_LABELS, POOL_LABELS, TRAFFIC_LABELS

SCHEMA_VERSION = 39
TAG = "tailwatch"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"  # Grafana: at least 4 scrape intervals, so rate() always has 2 samples

# Dashboard uids (stable, so links and bookmarks survive regeneration) and filter labels.
from tailwatch.dashboards.uids import (  # noqa: E402,F401
    FILTER_LABELS, UID_CANARY, UID_COST, UID_FLEET, UID_GPU, UID_LATENCY, UID_PIPELINE, UID_SLO,
)
from tailwatch.conventions import (
    AUDIO_SECONDS_TOTAL, GPUS, GPUS_PROFILED, GPU_DRAM_BANDWIDTH_RATIO, GPU_ECC_ERRORS_TOTAL,
    GPU_KV_CACHE_USAGE_RATIO, GPU_MEMORY_TOTAL_BYTES, GPU_MEMORY_USED_BYTES, GPU_POWER_WATTS,
    GPU_PRICE_USD_PER_GPU_SECOND, GPU_REPLICAS, GPU_SECONDS_TOTAL, GPU_SM_ACTIVE_RATIO,
    GPU_SM_OCCUPANCY_RATIO, GPU_TEMPERATURE_CELSIUS, GPU_TENSOR_ACTIVE_RATIO, GPU_UTILIZATION_RATIO,
    GPU_XID_ERRORS_TOTAL, OUTPUT_TOKENS_TOTAL, PROMPT_TOKENS_TOTAL, QUEUE_DEPTH_REQUESTS,
    QUEUE_OLDEST_AGE_SECONDS, REQUESTS_TOTAL, REQUEST_GPU_SECONDS_TOTAL, REQUEST_LATENCY_SECONDS,
    REQUEST_RETRIES_TOTAL, STREAMS_CANCELLED_TOTAL, STREAMS_COMPLETED_TOTAL, STREAMS_CUT_TOTAL,
    STREAMS_TIMED_OUT_TOTAL, STREAMS_TOTAL, SUCCESSFUL_AUDIO_SECONDS_TOTAL, SUCCESSFUL_TURNS_TOTAL, TURNS_TOTAL,
    ASR_ENDPOINTING_ERRORS_TOTAL, ASR_PARTIAL_REVISIONS_TOTAL, ASR_TURNS_REPORTING_ENDPOINTING_TOTAL,
    ASR_REFERENCE_WORDS_TOTAL, ASR_WORD_ERRORS_TOTAL,
    ASR_TURNS_REPORTING_PARTIALS_TOTAL, CACHED_PROMPT_TOKENS_TOTAL, OOM_FAILURES_TOTAL, QUOTA_REJECTIONS_TOTAL,
    SPECULATIVE_ACCEPTED_TOKENS_TOTAL, SPECULATIVE_DRAFT_TOKENS_TOTAL, TTS_FALLBACKS_TOTAL,
    TTS_STREAMS_REPORTING_UNDERRUNS_TOTAL, TTS_STREAMS_WITH_UNDERRUNS_TOTAL, TTS_UNDERRUNS_TOTAL,
    TTS_VOICE_CACHE_HITS_TOTAL, TTS_VOICE_CACHE_LOOKUPS_TOTAL, TTS_MOS_EVALUATIONS_TOTAL, TTS_MOS_SCORE_TOTAL,
)

# The quality counts (streams/fleet_metrics.py TRAFFIC_COUNTERS), each with what a fleet must send for it.
_QUALITY_NEEDS = {
    QUOTA_REJECTIONS_TOTAL: "status_reason quota or rate_limit on refused requests",
    OOM_FAILURES_TOTAL: "status_reason oom on failed requests",
    **dict.fromkeys((ASR_PARTIAL_REVISIONS_TOTAL, ASR_TURNS_REPORTING_PARTIALS_TOTAL), "partial_revisions on ASR requests"),
    **dict.fromkeys((ASR_ENDPOINTING_ERRORS_TOTAL, ASR_TURNS_REPORTING_ENDPOINTING_TOTAL),
                    "endpointing_error on ASR requests"),
    **dict.fromkeys((TTS_UNDERRUNS_TOTAL, TTS_STREAMS_WITH_UNDERRUNS_TOTAL, TTS_STREAMS_REPORTING_UNDERRUNS_TOTAL),
                    "underruns on TTS requests"),
    **dict.fromkeys((TTS_VOICE_CACHE_HITS_TOTAL, TTS_VOICE_CACHE_LOOKUPS_TOTAL), "voice_cache_hit on TTS requests"),
    TTS_FALLBACKS_TOTAL: "fallback on TTS requests",
    CACHED_PROMPT_TOKENS_TOTAL: "cached_prompt_tokens on LLM requests (vLLM's prefix cache)",
    **dict.fromkeys((ASR_WORD_ERRORS_TOTAL, ASR_REFERENCE_WORDS_TOTAL),
                    "eval.v1 evaluations with word_errors and reference_words"),
    **dict.fromkeys((TTS_MOS_EVALUATIONS_TOTAL, TTS_MOS_SCORE_TOTAL), "eval.v1 evaluations with mos (TTS)"),
    **dict.fromkeys((SPECULATIVE_DRAFT_TOKENS_TOTAL, SPECULATIVE_ACCEPTED_TOKENS_TOTAL),
                    "draft_tokens and accepted_tokens on LLM requests (speculative decoding)"),
}

_TRAFFIC_METRICS = (REQUESTS_TOTAL, REQUEST_RETRIES_TOTAL, TURNS_TOTAL,
                    SUCCESSFUL_TURNS_TOTAL, PROMPT_TOKENS_TOTAL,
                    OUTPUT_TOKENS_TOTAL, AUDIO_SECONDS_TOTAL, SUCCESSFUL_AUDIO_SECONDS_TOTAL, *_QUALITY_NEEDS)
_POOL_METRICS = (GPU_SECONDS_TOTAL, GPU_XID_ERRORS_TOTAL, GPU_ECC_ERRORS_TOTAL,
                 GPUS, GPU_UTILIZATION_RATIO, GPU_MEMORY_USED_BYTES,
                 GPU_MEMORY_TOTAL_BYTES, GPU_POWER_WATTS, GPU_TEMPERATURE_CELSIUS,
                 GPU_KV_CACHE_USAGE_RATIO, QUEUE_OLDEST_AGE_SECONDS,
                 QUEUE_DEPTH_REQUESTS, GPU_REPLICAS, GPU_SM_ACTIVE_RATIO,
                 GPU_SM_OCCUPANCY_RATIO, GPU_TENSOR_ACTIVE_RATIO,
                 GPU_DRAM_BANDWIDTH_RATIO, GPUS_PROFILED)
METRIC_LABELS: dict[str, tuple[str, ...]] = {
    **{m: TRAFFIC_LABELS for m in _TRAFFIC_METRICS},
    REQUEST_GPU_SECONDS_TOTAL: GPU_TIME_LABELS,
    f"{REQUEST_LATENCY_SECONDS}_bucket": LATENCY_LABELS,
    **{m: POOL_LABELS for m in _POOL_METRICS},
}


def sel(metric: str, **matchers: str) -> str:
    """`metric{…}` filtered by every dashboard variable the metric carries, plus matchers
    given as `label='="value"'` or `label='=~"regex"'`."""
    parts = [f'{k}=~"${k}"' for k in FILTER_LABELS if k in METRIC_LABELS.get(metric, ())]
    parts += [f"{k}{v}" for k, v in matchers.items()]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def eq(value: str) -> str:
    return f'="{value}"'


NOT_CANCELLED = '!="cancelled"'
ERRORS = '=~"error|timeout|shed"'  # failures of the service; a client's cancellation is not one


def rate(metric: str, by: str, **matchers: str) -> str:
    return f"sum by ({by}) (rate({sel(metric, **matchers)}[{RATE}]))"


LATENCY_BUCKETS = f"{REQUEST_LATENCY_SECONDS}_bucket"


def latency_quantile(field: str, quantile: str, by: str) -> str:
    """`histogram_quantile` over the latency histogram's buckets summed by `by`."""
    return f"histogram_quantile({quantile}, {rate(LATENCY_BUCKETS, f'le, {by}' if by else 'le', field=eq(field))})"


# ---- template variables ------------------------------------------------------------------
def datasource_variable() -> g.Template:
    return g.Template(name="datasource", label="Data source", query="prometheus", type="datasource")


def label_variable(label: str, metric: str, label_text: str | None = None, selector: str = "",
                   include_all: bool = True) -> g.Template:
    """A variable over the values of `label` on `metric`; with All = the regex `.*`, which
    also matches series without the label (an SLO not sliced by it)."""
    return g.Template(
        name=label, label=label_text or label.replace("_", " "), dataSource=DATASOURCE,
        query=f"label_values({metric}{selector}, {label})",
        includeAll=include_all, multi=include_all, allValue=".*" if include_all else None,
        default="$__all" if include_all else None, refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
    )


def fleet_variables() -> list[g.Template]:
    return [datasource_variable(), *(label_variable(k, REQUESTS_TOTAL) for k in FILTER_LABELS)]


# ---- panels ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Q:
    """One query: PromQL and its legend; instant for stat and table panels."""

    expr: str
    legend: str = ""
    instant: bool = False
    column: str = ""  # in a table: the header of this query's value column


# What a family needs that a fleet may not send: a panel reading it says so where it has no
# data (Grafana's noValue), instead of a bare "No data" that reads as an outage.
_RUNTIME = "from the serving runtime's gauges (vLLM's or Triton's /metrics, or the runtime's own gpu.v1)"
NEEDS: dict[str, str] = {
    AUDIO_SECONDS_TOTAL: "audio_seconds on requests (speech runtimes)",
    SUCCESSFUL_AUDIO_SECONDS_TOTAL: "audio_seconds on successful requests (speech runtimes)",
    **dict.fromkeys((STREAMS_TOTAL, STREAMS_COMPLETED_TOTAL, STREAMS_CUT_TOTAL, STREAMS_TIMED_OUT_TOTAL,
                     STREAMS_CANCELLED_TOTAL), "finish_reason on requests (how answer streams ended)"),
    **dict.fromkeys((GPU_SM_ACTIVE_RATIO, GPU_SM_OCCUPANCY_RATIO, GPU_TENSOR_ACTIVE_RATIO, GPU_DRAM_BANDWIDTH_RATIO,
                     GPUS_PROFILED), "SM activity: NVML GPM (Hopper and later) or dcgm-exporter's DCGM_FI_PROF_* "
                                     "fields (off in its stock counters file)"),
    **dict.fromkeys((GPU_MEMORY_USED_BYTES, GPU_MEMORY_TOTAL_BYTES),
                    "mem_used_bytes and mem_total_bytes on GPU samples (NVML, or DCGM's FB_USED and FB_FREE)"),
    GPU_TEMPERATURE_CELSIUS: "temp_c on GPU samples (NVML, or DCGM_FI_DEV_GPU_TEMP)",
    GPU_POWER_WATTS: "power_w on GPU samples (NVML, or DCGM_FI_DEV_POWER_USAGE)",
    GPU_KV_CACHE_USAGE_RATIO: f"kv_cache_usage {_RUNTIME}",
    QUEUE_OLDEST_AGE_SECONDS: f"oldest_queue_age_ms {_RUNTIME}",
    QUEUE_DEPTH_REQUESTS: f"queue_depth {_RUNTIME}",
    'field="inter_token"': "inter_token_ms on requests (LLM streams)",
    'field="queue"': "queue_ms on requests",
    'field="finalization"': "finalization_ms on ASR requests",
    **_QUALITY_NEEDS,
}
_NEEDS_RE = {needle: re.compile(rf"(?<![\w:]){re.escape(needle)}(?![\w:])") for needle in NEEDS}


def no_value_reason(queries: list["Q"]) -> str | None:
    """"No data: needs …" for a panel whose queries read a family a fleet may not send."""
    needs = sorted({NEEDS[n] for n, pattern in _NEEDS_RE.items() for q in queries if pattern.search(q.expr)})
    return f"No data: needs {'; '.join(needs)}" if needs else None


def _with_no_value(panel, queries: list["Q"]):
    reason = no_value_reason(queries)
    if reason:
        extra = dict(panel.extraJson or {})
        defaults = extra.setdefault("fieldConfig", {}).setdefault("defaults", {})
        defaults["noValue"] = reason
        panel.extraJson = extra
    return panel


def _targets(queries: list[Q], table: bool = False) -> list[g.Target]:
    return [
        g.Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), instant=q.instant,
                 format=g.TABLE_TARGET_FORMAT if table else g.TIME_SERIES_TARGET_FORMAT, datasource=DATASOURCE)
        for i, q in enumerate(queries)
    ]


def thresholds(*steps: tuple[float, str], base: str = "green") -> list[dict]:
    return [{"color": base, "value": None}, *({"color": c, "value": v} for v, c in steps)]


def timeseries(title: str, unit: str, queries: list[Q], *, description: str, w: int = 8, h: int = 8,
               threshold_steps: list[dict] | None = None, stacked: bool = False, **extra) -> g.TimeSeries:
    _described(title, description)
    return _with_no_value(g.TimeSeries(
        title=title, unit=unit, dataSource=DATASOURCE, targets=_targets(queries), description=description,
        gridPos=g.GridPos(h=h, w=w, x=0, y=0),
        thresholds=threshold_steps or thresholds(),
        thresholdsStyleMode="line" if threshold_steps else "off",
        stacking={"mode": "normal", "group": "A"} if stacked else {},
        fillOpacity=30 if stacked else 0,
        legendDisplayMode="table" if len(queries) > 1 or w >= 12 else "list",
        legendCalcs=["lastNotNull", "max"] if w >= 12 else [],
        tooltipMode="multi", **extra,
    ), queries)


def stat(title: str, unit: str, queries: list[Q], *, description: str, w: int = 4, h: int = 4,
         threshold_steps: list[dict] | None = None) -> g.Stat:
    _described(title, description)
    return g.Stat(
        title=title, format=unit, dataSource=DATASOURCE, targets=_targets(queries), description=description,
        gridPos=g.GridPos(h=h, w=w, x=0, y=0), thresholds=threshold_steps or thresholds(),
        reduceCalc="lastNotNull", graphMode="none", noValue=no_value_reason(queries) or "0",
        color={"mode": "thresholds"},
    )


def table(title: str, unit: str, queries: list[Q], *, description: str, w: int = 12, h: int = 8,
          column_units: dict[str, str] | None = None, column_thresholds: dict[str, list[dict]] | None = None,
          links: list[dict] | None = None, hidden: tuple[str, ...] = ("Time",), quiet: str = "") -> g.Table:
    """Instant queries in table format, merged on their labels into one row per series.

    Each query names its value column (`Q.column`): Grafana calls a lone query's column
    "Value" and several queries' "Value #A", "Value #B", …, which tell a reader nothing.
    `column_units` and `column_thresholds` are keyed by those names; a thresholded column
    colours its cells. `quiet`: what an empty table means when all is well (no detection
    open, no page firing), shown instead of "No data"; it starts with QUIET."""
    _described(title, description)
    unnamed = [q.expr for q in queries if not q.column]
    if unnamed:
        raise ValueError(f"table {title!r}: every query needs a column name (Q.column): {unnamed[0]}")
    renames = ({"Value": queries[0].column} if len(queries) == 1
               else {f"Value #{chr(ord('A') + i)}": q.column for i, q in enumerate(queries)})
    overrides = [
        {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": u}]}
        for name, u in (column_units or {}).items()
    ]
    overrides += [
        {"matcher": {"id": "byName", "options": name},
         "properties": [{"id": "thresholds", "value": {"mode": "absolute", "steps": steps}},
                        {"id": "custom.cellOptions", "value": {"type": "color-background"}}]}
        for name, steps in (column_thresholds or {}).items()
    ]
    known = set(renames.values())
    for name in [*(column_units or {}), *(column_thresholds or {})]:
        if name not in known:
            raise ValueError(f"table {title!r}: no column named {name!r} (columns: {sorted(known)})")
    panel = g.Table(
        title=title, unit=unit, dataSource=DATASOURCE, targets=_targets(queries, table=True), description=description,
        gridPos=g.GridPos(h=h, w=w, x=0, y=0), overrides=overrides,
        transformations=[{"id": "merge", "options": {}},
                         {"id": "organize", "options": {"excludeByName": {n: True for n in hidden},
                                                        "renameByName": renames}}],
    )
    defaults: dict = {}
    if links:
        defaults["links"] = links
    if quiet:
        if not quiet.startswith(QUIET):
            raise ValueError(f"table {title!r}: a quiet text starts with {QUIET!r}")
        defaults["noValue"] = quiet
    if defaults:
        panel.extraJson = {"fieldConfig": {"defaults": defaults}}
    return _with_no_value(panel, queries)


QUIET = "None now"  # how a panel that is empty when all is well starts its "no data" text


def _described(title: str, description: str) -> None:
    """Every panel says what it shows and how to read it (Grafana's ⓘ beside the title)."""
    if not description.strip():
        raise ValueError(f"panel {title!r} has no description")


def layout(panels: list) -> list:
    """Place panels left to right in a 24-column grid, wrapping to a new row when a panel
    does not fit; a row is as tall as its tallest panel."""
    x = y = row_h = 0
    for p in panels:
        w, h = p.gridPos.w, p.gridPos.h
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p.gridPos = g.GridPos(h=h, w=w, x=x, y=y)
        x += w
        row_h = max(row_h, h)
    return panels


def dashboard(uid: str, title: str, description: str, panels: list, variables: list[g.Template],
              annotations: list[dict] | None = None, time_from: str = "now-6h") -> g.Dashboard:
    return g.Dashboard(
        uid=uid, title=title, description=description, tags=[TAG], panels=layout(panels),
        templating=g.Templating(list=variables),
        annotations=g.Annotations(list=annotations or []),
        links=[g.DashboardLink(title="tailwatch", tags=[TAG], asDropdown=True, includeVars=True, keepTime=True)],
        time=g.Time(time_from, "now"), refresh="30s", timezone="utc", schemaVersion=SCHEMA_VERSION,
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
    ).auto_panel_ids()


def promql_annotation(name: str, expr: str, color: str, title: str, tag_keys: str) -> dict:
    """A Grafana annotation from a Prometheus query: a band wherever the series exists."""
    return {
        "name": name, "datasource": DATASOURCE, "enable": True, "hide": False, "iconColor": color,
        "expr": expr, "step": "60s", "titleFormat": title, "tagKeys": tag_keys, "useValueForTime": False,
        "target": {"expr": expr, "refId": "Anno", "datasource": DATASOURCE},
    }


# ---- cost, in PromQL ----------------------------------------------------------------------
PRICE = f"max by (gpu_sku) ({GPU_PRICE_USD_PER_GPU_SECOND})"  # one per SKU, however many workers


def fleet_cost_usd_per_second_by_pool() -> str:
    """What each pool's GPUs cost per second, idle time included."""
    return (f"sum by (pool) (rate({sel(GPU_SECONDS_TOTAL)}[{RATE}]) "
            f"* on (gpu_sku) group_left() {PRICE})")


def allocated_cost_usd_per_second(by: str) -> str:
    """GPU cost per second by `by`, idle time allocated (docs/reports.md, "cost per successful
    turn"): each pool's whole cost is shared out in proportion to the GPU-seconds its
    requests used, so idle GPUs are paid for by the traffic that keeps them provisioned.
    The share's denominator is the whole pool, not the filtered traffic."""
    used = REQUEST_GPU_SECONDS_TOTAL
    return (f"sum by ({by}) (\n"
            f"  sum by ({by}, pool) (rate({sel(used)}[{RATE}]))\n"
            f"  / on (pool) group_left() (sum by (pool) (rate({used}[{RATE}])) > 0)\n"
            f"  * on (pool) group_left() {fleet_cost_usd_per_second_by_pool()}\n"
            f")")


def per_unit(numerator: str, metric: str, by: str, scale: float = 1) -> str:
    """numerator ÷ rate(metric), by `by`, where that rate is not zero."""
    factor = f" * {scale:g}" if scale != 1 else ""
    return f"{numerator}\n/ ({rate(metric, by)} > 0){factor}"

