"""Metric samples, from OTLP `MetricsData` or from a Prometheus text exposition, in one
shape for the GPU mapping: name, labels (resource attributes under the point's own),
value, time, and whether the value is a running total. Histograms (explicit buckets) come
out in a shape of their own, `HistogramPoint`, for the request mapping
(`ingest/otlp/histogram_requests.py`).

Names are matched as Prometheus writes them; the Collector's Prometheus receiver may drop
a counter's `_total`, so `_total` is taken off every counter name here and the mapping
tables name counters without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, MetricsData
from prometheus_client.parser import text_string_to_metric_families

from tailwatch.ingest.otlp.attributes import as_dict
from tailwatch.ingest.otlp.views import as_int, as_list, as_object, json_attributes


@dataclass(frozen=True)
class HistogramPoint:
    """One histogram data point: per-bucket counts (not Prometheus's cumulative `le`), bucket
    i holding values in (bounds[i-1], bounds[i]] and the last one everything above."""

    name: str
    labels: dict[str, str]
    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # len(bounds) + 1
    total: float  # the sum of the values observed
    start_ms: int  # where the interval (delta) or the running total (cumulative) starts; 0 unknown
    ts_ms: int
    cumulative: bool
    max_value: float | None = None


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    ts_ms: int
    cumulative: bool = False  # a running total (counter): the mapping takes deltas


def histograms_from_otlp(data: MetricsData | dict) -> list[HistogramPoint]:
    """The explicit-bucket histogram points of a decoded batch (exponential histograms and
    summaries are not read: no runtime we map emits them for the request metrics)."""
    if isinstance(data, dict):
        return _histograms_from_json(data)
    out: list[HistogramPoint] = []
    for resource, metric in _proto_metrics(data):
        if metric.WhichOneof("data") != "histogram":
            continue
        cumulative = metric.histogram.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
        for p in metric.histogram.data_points:
            out.append(HistogramPoint(metric.name, _point_labels(resource, p.attributes), tuple(p.explicit_bounds),
                                      tuple(p.bucket_counts), p.sum, p.start_time_unix_nano // 1_000_000,
                                      p.time_unix_nano // 1_000_000, cumulative, p.max if p.HasField("max") else None))
    return out


def _histograms_from_json(doc: dict) -> list[HistogramPoint]:
    out: list[HistogramPoint] = []
    for resource, metric in _json_metrics(doc):
        body = as_object(metric.get("histogram"))
        if not body:
            continue
        cumulative = body.get("aggregationTemporality", 0) in (
            AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE, "AGGREGATION_TEMPORALITY_CUMULATIVE")
        for p in as_list(body.get("dataPoints")):
            p = as_object(p)
            try:
                bounds = tuple(float(b) for b in as_list(p.get("explicitBounds")))
                counts = tuple(int(c) for c in as_list(p.get("bucketCounts")))
                total = float(p.get("sum", 0.0))
                top = float(p["max"]) if "max" in p else None
            except (TypeError, ValueError):
                continue  # not numbers: nothing to read (the point cannot be told apart from noise)
            out.append(HistogramPoint(str(metric.get("name", "")), {**resource, **_labels(p.get("attributes"))},
                                      bounds, counts, total, as_int(p.get("startTimeUnixNano")) // 1_000_000,
                                      as_int(p.get("timeUnixNano")) // 1_000_000, cumulative, top))
    return out


def _proto_metrics(data: MetricsData):
    """(resource labels, metric) for every metric of a protobuf batch."""
    for rm in data.resource_metrics:
        resource = {k: str(v) for k, v in as_dict(rm.resource.attributes).items() if v is not None}
        for scope in rm.scope_metrics:
            for metric in scope.metrics:
                yield resource, metric


def _json_metrics(doc: dict):
    """(resource labels, metric object) for every metric of an OTLP/JSON batch."""
    for rm in as_list(doc.get("resourceMetrics")):
        rm = as_object(rm)
        resource = _labels(as_object(rm.get("resource")).get("attributes"))
        for scope in as_list(rm.get("scopeMetrics")):
            for metric in as_list(as_object(scope).get("metrics")):
                yield resource, as_object(metric)


def _point_labels(resource: dict[str, str], attributes) -> dict[str, str]:
    """A point's labels: its resource's, under its own attributes."""
    return {**resource, **{k: str(v) for k, v in as_dict(attributes).items() if v is not None}}


def histograms_from_exposition(text: str, now_ms: int) -> list[HistogramPoint]:
    """The histograms of a Prometheus text exposition, as running totals (Prometheus
    histograms always are); `le` buckets are differenced into per-bucket counts."""
    out: list[HistogramPoint] = []
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        series: dict[tuple, dict] = {}
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            entry = series.setdefault(tuple(sorted(labels.items())), {"labels": labels, "le": [], "sum": 0.0,
                                                                       "ts": None})
            if s.timestamp is not None:
                entry["ts"] = int(s.timestamp * 1000)
            if s.name.endswith("_bucket") and "le" in s.labels:
                entry["le"].append((float(s.labels["le"]), float(s.value)))
            elif s.name.endswith("_sum"):
                entry["sum"] = float(s.value)
        for entry in series.values():
            les = sorted(entry["le"])
            if not les or les[-1][0] != float("inf"):
                continue  # no +Inf bucket: not a histogram a client library writes
            running = [int(v) for _, v in les]
            counts = tuple(b - a for a, b in zip([0, *running[:-1]], running))
            out.append(HistogramPoint(family.name, entry["labels"], tuple(le for le, _ in les[:-1]), counts,
                                      entry["sum"], 0, entry["ts"] or now_ms, True))
    return out


def samples_from_otlp(data: MetricsData | dict) -> list[Sample]:
    """A decoded batch (`wire.decode`: the protobuf message or the OTLP/JSON document)."""
    if isinstance(data, dict):
        return _samples_from_json(data)
    out: list[Sample] = []
    for resource, metric in _proto_metrics(data):
        kind = metric.WhichOneof("data")
        if kind == "gauge":
            points, cumulative = metric.gauge.data_points, False
        elif kind == "sum":
            points = metric.sum.data_points
            # a running total to take deltas of; a non-monotonic sum (an up-down counter) is a level
            cumulative = metric.sum.is_monotonic and \
                metric.sum.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
        else:
            continue  # histograms (read by histograms_from_otlp) and summaries
        name = _counter_name(metric.name) if kind == "sum" else metric.name
        for p in points:
            value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
            out.append(Sample(name, _point_labels(resource, p.attributes), value, p.time_unix_nano // 1_000_000,
                              cumulative))
    return out


def _samples_from_json(doc: dict) -> list[Sample]:
    out: list[Sample] = []
    for resource, metric in _json_metrics(doc):
        name = str(metric.get("name", ""))
        if "gauge" in metric:
            body, cumulative = as_object(metric["gauge"]), False
        elif "sum" in metric:
            body = as_object(metric["sum"])
            temporality = body.get("aggregationTemporality", 0)
            cumulative = bool(body.get("isMonotonic")) and temporality in (
                AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE, "AGGREGATION_TEMPORALITY_CUMULATIVE")
            name = _counter_name(name)
        else:
            continue
        for p in as_list(body.get("dataPoints")):
            p = as_object(p)
            raw = p.get("asDouble", p.get("asInt"))
            try:
                value = float(raw)
            except (TypeError, ValueError):
                continue  # no value (a NaN or a missing point): nothing to carry
            out.append(Sample(name, {**resource, **_labels(p.get("attributes"))}, value,
                              as_int(p.get("timeUnixNano")) // 1_000_000, cumulative))
    return out


def _labels(key_values) -> dict[str, str]:
    return {k: str(v) for k, v in json_attributes(key_values).items() if v is not None}


def samples_from_exposition(text: str, now_ms: int) -> list[Sample]:
    """A Prometheus text exposition scraped at `now_ms` (a sample's own timestamp wins)."""
    out: list[Sample] = []
    for family in text_string_to_metric_families(text):
        if family.type not in ("gauge", "counter", "untyped", "unknown"):
            continue
        for s in family.samples:
            if family.type == "counter" and not s.name.endswith("_total"):
                continue  # _created
            ts_ms = int(s.timestamp * 1000) if s.timestamp is not None else now_ms
            name = _counter_name(s.name) if family.type == "counter" else s.name
            out.append(Sample(name, dict(s.labels), float(s.value), ts_ms, family.type == "counter"))
    return out


def _counter_name(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name
