"""`request.v1` / `gpu.v1` → OTLP batches, as a fleet's Collector would write them:
requests as GenAI spans (vLLM's latency names), GPU samples as DCGM exporter gauges and
serving-runtime gauges as vLLM's. Used by `tailwatch simulate --format otlp`, so the demo
and the tests run the whole OpenTelemetry path. The inverse of `spans` and `gpu` for the
fields OTLP carries; retries, turns, task success and GPU-seconds have no convention and
are not sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, MetricsData, NumberDataPoint, ResourceMetrics
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status, TracesData

from tailwatch.ingest.otlp.gpu import DCGM_GAUGES, MIB
from tailwatch.ingest.otlp.spans import OTLP_FINISH_NAME
from tailwatch.ingest.schema import GpuV1, RequestV1, parse_ts_ms

SPANS_PER_BATCH = 512  # the SDK's and the Collector's default batch size
_STATUS_ERROR_TYPE = {"error": "internal_error", "timeout": "timeout", "shed": "overloaded"}


def traces(events: list[RequestV1]) -> TracesData:
    by_resource: dict[tuple, list[RequestV1]] = {}
    for e in events:
        by_resource.setdefault((e.zone, e.region, e.pool), []).append(e)
    data = TracesData()
    for (zone, region, pool), group in by_resource.items():
        rs = data.resource_spans.add()
        rs.resource.CopyFrom(_resource({"cloud.availability_zone": zone, "cloud.region": region, "pool": pool}))
        scope = rs.scope_spans.add()
        scope.scope.name = "tailwatch.simulator"
        scope.spans.extend(sp for e in group for sp in (span(e), *phase_spans(e)))
    return data


def span(e: RequestV1) -> Span:
    ids = hashlib.sha256(e.event_id.encode()).digest()
    end_ns = int(e.ts) * 1_000_000
    s = Span(trace_id=ids[:16], span_id=ids[16:24], name="llm_request", kind=Span.SPAN_KIND_SERVER,
             start_time_unix_nano=end_ns - int((e.e2e_ms or 0) * 1e6), end_time_unix_nano=end_ns)
    attrs = {
        "gen_ai.request.model": e.model, "model_version": e.model_version, "tenant.id": e.tenant,
        "workload": e.workload, "traffic_class": e.traffic_class, "deployment": e.deployment, "http.route": e.endpoint,
        "gen_ai.usage.prompt_tokens": e.prompt_tokens, "gen_ai.usage.completion_tokens": e.output_tokens,
        "gen_ai.latency.e2e": _s(e.e2e_ms), "gen_ai.latency.time_to_first_token": _s(e.first_output_ms),
        "gen_ai.latency.time_in_queue": _s(e.queue_ms), "http.response.status_code": e.http_status,
        "gen_ai.server.time_per_output_token": _s(e.inter_token_ms), "gpu_sku": e.gpu_sku,
    }
    if e.status in _STATUS_ERROR_TYPE:
        attrs["error.type"] = _STATUS_ERROR_TYPE[e.status]
        s.status.code = Status.STATUS_CODE_ERROR
    elif e.status == "cancelled":
        attrs["gen_ai.response.finish_reasons"] = ["abort"]
    if e.finish_reason is not None:
        attrs["gen_ai.response.finish_reasons"] = [OTLP_FINISH_NAME[e.finish_reason]]
    s.attributes.extend(_key_values(attrs))
    return s


def phase_spans(e: RequestV1) -> list[Span]:
    """One child span per phase of a cascaded turn, named by `tailwatch.stage`, laid end to end."""
    if not e.stages:
        return []
    ids = hashlib.sha256(e.event_id.encode()).digest()
    at = int(e.ts) * 1_000_000 - int((e.e2e_ms or 0) * 1e6)
    out = []
    for i, (phase, ms) in enumerate(e.stages.items()):
        child = Span(trace_id=ids[:16], span_id=hashlib.sha256(ids + bytes([i])).digest()[:8], parent_span_id=ids[16:24],
                     name=phase, kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=at,
                     end_time_unix_nano=at + round(ms * 1e6))
        child.attributes.extend(_key_values({"tailwatch.stage": phase}))
        out.append(child)
        at += round(ms * 1e6)
    return out


def metrics(samples: list[GpuV1]) -> MetricsData:
    """One ResourceMetrics per node: DCGM gauges per GPU, vLLM gauges per replica (its pod
    is the GPU's, so the mapping joins them back)."""
    by_node: dict[tuple, list[GpuV1]] = {}
    for g in samples:
        by_node.setdefault((g.node, g.zone, g.pool), []).append(g)
    data = MetricsData()
    for (node, zone, pool), group in by_node.items():
        rm: ResourceMetrics = data.resource_metrics.add()
        rm.resource.CopyFrom(_resource({"cloud.availability_zone": zone, "pool": pool}))
        scope = rm.scope_metrics.add()
        gauges: dict[str, Metric] = {}
        for g in group:
            ts_ns = parse_ts_ms(g.ts) * 1_000_000
            pod = f"{node}-gpu{g.gpu_index}"
            dcgm = {"gpu": str(g.gpu_index), "UUID": g.gpu_uuid, "modelName": f"NVIDIA {g.gpu_sku}" if g.gpu_sku else "",
                    "Hostname": node, "pod": pod}
            fb_free = (g.mem_total_bytes - g.mem_used_bytes) if g.mem_total_bytes is not None and g.mem_used_bytes is not None else None
            readings = {"DCGM_FI_DEV_GPU_UTIL": g.util_pct, "DCGM_FI_DEV_FB_USED": _mib(g.mem_used_bytes),
                        "DCGM_FI_DEV_FB_FREE": _mib(fb_free), "DCGM_FI_DEV_POWER_USAGE": g.power_w,
                        "DCGM_FI_DEV_GPU_TEMP": g.temp_c, "DCGM_FI_DEV_SM_CLOCK": g.sm_clock_mhz,
                        **{name: getattr(g, fld) / scale for name, (fld, scale) in DCGM_GAUGES.items()
                           if fld.endswith("_pct") and name.startswith("DCGM_FI_PROF") and getattr(g, fld) is not None}}
            runtime = {"vllm:num_requests_waiting": g.queue_depth, "vllm:num_requests_running": g.running,
                       "vllm:kv_cache_usage_perc": g.kv_cache_usage}
            for name, value in readings.items():
                _point(gauges, scope, name, value, dcgm, ts_ns)
            for name, value in runtime.items():
                _point(gauges, scope, name, value, {"model_name": g.model, "model_version": g.model_version,
                                                    "Hostname": node, "pod": pod}, ts_ns)
    return data


def _point(gauges: dict[str, Metric], scope, name: str, value, labels: dict[str, str], ts_ns: int) -> None:
    if value is None:
        return
    metric = gauges.get(name)
    if metric is None:
        metric = gauges[name] = scope.metrics.add(name=name)
    p: NumberDataPoint = metric.gauge.data_points.add(time_unix_nano=ts_ns, as_double=float(value))
    p.attributes.extend(_key_values(labels))


def _resource(attrs: dict[str, str]) -> Resource:
    r = Resource()
    r.attributes.extend(_key_values({"service.name": "tailwatch-simulator", **attrs}))
    return r


def _key_values(attrs: dict) -> list[KeyValue]:
    out = []
    for k, v in attrs.items():
        if v is None or v == "":
            continue
        if isinstance(v, bool):
            value = AnyValue(bool_value=v)
        elif isinstance(v, int):
            value = AnyValue(int_value=v)
        elif isinstance(v, float):
            value = AnyValue(double_value=v)
        elif isinstance(v, list):
            value = AnyValue()
            value.array_value.values.extend(AnyValue(string_value=str(x)) for x in v)
        else:
            value = AnyValue(string_value=str(v))
        out.append(KeyValue(key=k, value=value))
    return out


def _s(ms: float | None) -> float | None:
    return ms / 1000 if ms is not None else None


def _mib(n: int | None) -> float | None:
    return n / MIB if n is not None else None



SPANS_PER_BATCH_BY_ENCODING = {"otlp_proto": SPANS_PER_BATCH, "otlp_json": 200}  # JSON is about 4x larger
GPU_SAMPLES_PER_BATCH = 48  # a DCGM + vLLM sample is about 4 KB in otlp_json


def otlp_batches(events: Iterable, spans_per_batch: int = SPANS_PER_BATCH) -> Iterator[tuple[str, object]]:
    """A simulator's time-ordered events as the Collector would ship them: ("spans",
    TracesData) and ("metrics", MetricsData) batches, and ("native", event) for what
    OTLP has no form for (deploy events)."""
    requests: list[RequestV1] = []
    gpus: list[GpuV1] = []
    for e in events:
        if isinstance(e, RequestV1):
            requests.append(e)
            if len(requests) == spans_per_batch:
                yield "spans", traces(requests)
                requests = []
        elif isinstance(e, GpuV1):
            gpus.append(e)
            if len(gpus) == GPU_SAMPLES_PER_BATCH:
                yield "metrics", metrics(gpus)
                gpus = []
        else:
            yield "native", e
    if requests:
        yield "spans", traces(requests)
    if gpus:
        yield "metrics", metrics(gpus)


def publish_batches(producer, events: Iterable, encoding: str, spans_topic: str, metrics_topic: str,
                    progress=None) -> tuple[dict[str, int], list]:
    """Send the events as OTLP batches (each under the exporter's and the broker's
    1,000,000-byte default record limit); returns the batches sent per kind and the
    events OTLP has no form for, for the caller to publish natively."""
    from tailwatch.ingest.otlp.wire import encode
    from tailwatch.ingest.kafka import send

    topics = {"spans": spans_topic, "metrics": metrics_topic}
    sent = {"spans": 0, "metrics": 0}
    native = []
    for n, (kind, item) in enumerate(otlp_batches(events, SPANS_PER_BATCH_BY_ENCODING[encoding]), 1):
        if kind == "native":
            native.append(item)
            continue
        send(producer, topics[kind], encode(item, encoding))
        sent[kind] += 1
        if n % 200 == 0:
            producer.poll(0)
            if progress:
                progress(f"{sent['spans']:,} span batches, {sent['metrics']:,} metric batches")
    return sent, native
