"""OpenTelemetry in: batches serialised by the OpenTelemetry SDK itself (not by our encoder)
through the real broker and `tailwatch ingest otlp` into the worker, and Prometheus
expositions in DCGM exporter and vLLM format into gpu.v1, over real HTTP."""

from __future__ import annotations

import base64
import dataclasses
import http.server
import json
import threading
import uuid

import duckdb
import msgspec
import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from tailwatch.ingest.otlp import wire
from tailwatch.ingest.otlp.alignment import EventTimeAlignment
from tailwatch.ingest.otlp.gpu import GpuMapper
from tailwatch.ingest.otlp.mapping import OtlpMapping, check_mapping
from tailwatch.ingest.otlp.republish import OtlpRepublisher
from tailwatch.ingest.otlp.samples import samples_from_exposition, samples_from_otlp
from tailwatch.ingest.otlp.spans import OTLP_FINISH_NAME, requests_from_traces
from tailwatch.ingest.schema import RequestV1
from tailwatch_dev.simulator import FleetSimulator
from tailwatch_dev.trace import TraceReplay, read_any_trace
from tailwatch_dev.traces import AZURE_CODE_TRACE
from tailwatch.cli import main
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, make_producer
from tests.test_pipeline import publish, read_topic, run_worker

# Fields no OpenTelemetry convention carries: the request.v1 twin of a span leaves them out.
NOT_IN_OTLP = ("session_id", "turn_id", "task_success", "audio_seconds", "batch_size", "gpu_seconds", "attempt",
               "retry_of", "language", "voice", "status_reason", "partial_revisions", "endpointing_error",
               "finalization_ms", "underruns", "voice_cache_hit", "fallback", "cached_prompt_tokens", "draft_tokens",
               "accepted_tokens")
_GAP = {"attempt": 1, "language": "", "voice": ""}  # what the twin holds instead: the schema's default
ERROR_TYPE = {"error": "internal_error", "timeout": "timeout", "shed": "overloaded"}


def without_otlp_gaps(e: RequestV1) -> RequestV1:
    return msgspec.structs.replace(e, **{f: _GAP.get(f) for f in NOT_IN_OTLP})


def sdk_span_batches(events: list[RequestV1], per_batch: int = 512) -> list[bytes]:
    """Spans made and serialised by the OpenTelemetry SDK, with the GenAI conventions'
    current names (the simulator's encoder uses vLLM's older ones)."""
    exporter = InMemorySpanExporter()
    providers: dict[tuple, TracerProvider] = {}
    for e in events:
        key = (e.zone, e.region, e.pool)
        if key not in providers:
            providers[key] = TracerProvider(resource=Resource.create(
                {"service.name": "vllm", "cloud.availability_zone": e.zone, "cloud.region": e.region, "pool": e.pool}))
            providers[key].add_span_processor(SimpleSpanProcessor(exporter))
        end_ns = int(e.ts) * 1_000_000
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": e.model, "model_version": e.model_version,
                 "tenant.id": e.tenant, "workload": e.workload, "traffic_class": e.traffic_class,
                 "deployment": e.deployment, "http.response.status_code": e.http_status,
                 "gen_ai.usage.input_tokens": e.prompt_tokens, "gen_ai.usage.output_tokens": e.output_tokens,
                 "gen_ai.latency.e2e": e.e2e_ms / 1000 if e.e2e_ms is not None else None,
                 "gen_ai.latency.time_to_first_token": e.first_output_ms / 1000 if e.first_output_ms is not None else None,
                 "gen_ai.latency.time_in_queue": e.queue_ms / 1000 if e.queue_ms is not None else None,
                 "gen_ai.server.time_per_output_token": e.inter_token_ms / 1000 if e.inter_token_ms is not None else None,
                 "gpu_sku": e.gpu_sku}
        if e.status in ERROR_TYPE:
            attrs["error.type"] = ERROR_TYPE[e.status]
        if e.status == "cancelled":
            attrs["gen_ai.response.finish_reasons"] = ["abort"]
        if e.finish_reason is not None:
            attrs["gen_ai.response.finish_reasons"] = [OTLP_FINISH_NAME[e.finish_reason]]
        tracer = providers[key].get_tracer("serving")
        start_ns = end_ns - int((e.e2e_ms or 0) * 1e6)
        span = tracer.start_span("chat", kind=SpanKind.SERVER, start_time=start_ns,
                                 attributes={k: v for k, v in attrs.items() if v is not None and v != ""})
        # A cascaded turn's stages as child spans, each naming its stage.
        at = start_ns
        for stage, ms in (e.stages or {}).items():
            child = tracer.start_span(stage, context=set_span_in_context(span), start_time=at,
                                      attributes={"tailwatch.stage": stage})
            at += round(ms * 1e6)
            child.end(end_time=at)
        if e.status in ERROR_TYPE:
            span.set_status(Status(StatusCode.ERROR, ERROR_TYPE[e.status]))
        span.end(end_time=end_ns)
    # Whole traces per batch, as the Collector's groupbytrace processor sends them: a turn's
    # stage spans are joined to it within a batch.
    traces: dict[int, list] = {}
    for s in exporter.get_finished_spans():
        traces.setdefault(s.context.trace_id, []).append(s)
    batches, batch = [], []
    for spans in traces.values():
        batch += spans
        if len(batch) >= per_batch:
            batches.append(batch)
            batch = []
    return [encode_spans(b).SerializeToString() for b in batches + ([batch] if batch else [])]


@pytest.fixture(scope="module")
def fleet():
    sim = FleetSimulator("mixed-fleet", minutes=6, seed=5, rate_scale=0.3)
    events = list(sim.events())
    return [e for e in events if isinstance(e, RequestV1)]


@pytest.mark.slow
def test_sdk_spans_map_back_to_their_requests_in_both_encodings(fleet):
    assert_spans_map_back(fleet)


@pytest.mark.slow
def test_the_azure_trace_as_sdk_spans_maps_back_to_its_requests():
    """Traffic we did not generate: the public Azure code trace's first 3,000 requests."""
    requests = list(TraceReplay(rows=read_any_trace(AZURE_CODE_TRACE)[:3000], seed=3).events())
    assert len(requests) == 3000
    assert_spans_map_back(requests)


def assert_spans_map_back(fleet):
    batches = sdk_span_batches(fleet)
    assert len(batches) > 2
    for encoding in wire.ENCODINGS:
        mapped = []
        for raw in batches:
            if encoding == "otlp_json":
                raw = wire.encode(TracesData.FromString(raw), "otlp_json")
                assert raw.startswith(b"{") and b'"traceId":"' in raw
            result = requests_from_traces(wire.decode(raw, TracesData), OtlpMapping().requests)
            assert not result.refused and result.skipped == 0
            mapped += result.events
        assert len(mapped) == len(fleet)
        assert len({e.event_id for e in mapped}) == len(fleet)
        by_key = {(e.ts, e.tenant, e.e2e_ms): e for e in mapped}
        for original in fleet:
            got = by_key[(original.ts, original.tenant, original.e2e_ms)]
            expected = msgspec.structs.replace(without_otlp_gaps(original), endpoint="chat")  # gen_ai.operation.name
            assert msgspec.structs.replace(got, event_id=expected.event_id) == expected, encoding


def test_the_otlp_path_gives_the_store_the_same_slis(broker, tmp_path, fleet):
    """request.v1 straight to the worker, and the same requests as SDK spans through the
    Collector's topic (half otlp_proto, half otlp_json) and `ingest otlp`: equal sli_minute."""
    native = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"n{uuid.uuid4().hex[:8]}.")
    via_otlp = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"o{uuid.uuid4().hex[:8]}.")
    spans_topic, metrics_topic = f"{via_otlp.topic_prefix}otlp_spans", f"{via_otlp.topic_prefix}otlp_metrics"
    for s in (native, via_otlp):
        ensure_topics(s, partitions=2, others=(spans_topic, metrics_topic) if s is via_otlp else ())
    publish(native, [without_otlp_gaps(e) for e in fleet])
    p = make_producer(via_otlp)
    batches = sdk_span_batches(fleet, per_batch=200)
    # Both partitions span the whole six minutes, as unkeyed Collector batches do: read one
    # partition to its end before the other and the worker would refuse minutes as late.
    for i, raw in enumerate(batches):
        p.produce(spans_topic, raw if i % 2 else wire.encode(TracesData.FromString(raw), "otlp_json"), partition=i % 2)
    for poison in POISON_BATCHES:  # between good ones
        p.produce(spans_topic, poison)
    assert p.flush(30) == 0
    republisher = OtlpRepublisher(via_otlp, OtlpMapping(), spans_topic, metrics_topic, group_id=f"o-{uuid.uuid4().hex[:6]}")
    report = republisher.run(until_idle_s=3.0)
    assert report.requests == len(fleet) and report.batches == len(batches) + len(POISON_BATCHES)
    assert report.dead_letters == {"otlp_undecodable": 2, "otlp_span_incomplete": 1, "otlp_span_invalid": 1}
    letters = [json.loads(v) for v in read_topic(via_otlp, "deadletter", 4)]
    assert {d["source_topic"] for d in letters} == {spans_topic}
    invalid = next(d for d in letters if d["reason"] == "otlp_span_invalid")
    assert "workload" in invalid["detail"] and b"chat-bot" in base64.b64decode(invalid["raw_prefix_base64"])

    stores = {}
    for name, settings in (("native", native), ("otlp", via_otlp)):
        stores[name] = tmp_path / f"{name}.duckdb"
        run_worker(settings, stores[name])

    def rows(path):
        con = duckdb.connect(str(path), read_only=True)
        cols = [c for (c,) in con.execute("SELECT column_name FROM (DESCRIBE sli_minute)").fetchall()]
        out = sorted(con.execute(f"SELECT {', '.join(cols)} FROM sli_minute").fetchall(), key=repr)
        con.close()
        return cols, out

    otlp_con = duckdb.connect(str(stores["otlp"]), read_only=True)
    assert otlp_con.execute("SELECT count(*) FROM dead_letter WHERE reason LIKE '%late%'").fetchone()[0] == 0
    otlp_con.close()
    cols, native_rows = rows(stores["native"])
    assert rows(stores["otlp"]) == (cols, native_rows)
    assert sum(r[cols.index("requests")] for r in native_rows) == len(fleet)
    assert sum(r[cols.index("errors")] + r[cols.index("timeouts")] for r in native_rows) > 0


def _genai_span_json(**extra) -> bytes:
    span = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "chat",
            "startTimeUnixNano": "1793577600000000000",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}], **extra}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


POISON_BATCHES = [
    b"\x0a\xff\xff not a batch",
    b'{"resourceSpans": [ cut short',
    _genai_span_json(),  # a request span without an end time
    _genai_span_json(endTimeUnixNano="1793577601000000000",  # a workload outside the schema
                     attributes=[{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                                 {"key": "workload", "value": {"stringValue": "chat-bot"}}]),
]


def test_alignment_pauses_the_partition_that_runs_ahead():
    a = EventTimeAlignment(max_drift_ms=60_000)
    a.assign([("s", 0), ("s", 1), ("m", 0)])
    a.reading(("s", 0))
    a.advance(("s", 0), 600_000)
    assert a.decide() == ({("s", 0)}, set())  # s/1 not read yet: it may hold the oldest records
    a.reading(("s", 1))
    a.advance(("s", 1), 100_000)
    a.at_end(("m", 0))
    assert a.decide() == (set(), set()) and a.paused == {("s", 0)}  # still 500 s ahead
    a.advance(("s", 1), 560_000)
    assert a.decide() == (set(), {("s", 0)})  # within a minute again
    a.advance(("s", 0), 900_000)
    a.reading(("s", 1))
    a.at_end(("s", 1))  # its last records, then its end, in one fetch: caught up, holds nobody back
    a.advance(("s", 1), 570_000)
    assert a.decide() == (set(), set())
    a.revoke([("s", 0)])
    assert ("s", 0) not in a.newest_ms and a.paused == set()


def test_a_replayed_batch_is_not_counted_twice(broker, tmp_path, fleet):
    """A crash between producing and committing republishes the batch: same event ids,
    which the worker drops."""
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"r{uuid.uuid4().hex[:8]}.")
    spans_topic = f"{kafka.topic_prefix}otlp_spans"
    ensure_topics(kafka, partitions=2, others=(spans_topic,))
    p = make_producer(kafka)
    for raw in sdk_span_batches(fleet[:300], per_batch=100):
        p.produce(spans_topic, raw)
    assert p.flush(30) == 0
    for _ in range(2):  # a fresh group each time: as if offsets had never been committed
        OtlpRepublisher(kafka, OtlpMapping(), spans_topic, "unused", group_id=f"r-{uuid.uuid4().hex[:6]}").run(until_idle_s=3.0)
    store = tmp_path / "tw.duckdb"
    run_worker(kafka, store)
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == 300


# Expositions in the format of the projects' documentation: dcgm-exporter's README sample
# (labels gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, and
# container/namespace/pod with Kubernetes mapping on), and vLLM's /metrics (docs/usage/metrics).
DCGM_EXPOSITION = """\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} 1980
DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-8b2f40e1-0c3e-4c1d-9a57-0f1e2d3c4b5a",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="",namespace="",pod=""} 345
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} 61
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-8b2f40e1-0c3e-4c1d-9a57-0f1e2d3c4b5a",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="",namespace="",pod=""} 33
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} 512.25
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} 97
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-8b2f40e1-0c3e-4c1d-9a57-0f1e2d3c4b5a",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="",namespace="",pod=""} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} 6083
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} 75000
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} {xid}
# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned (in %).
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} 0.412
# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.
# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm",namespace="serving",pod="llama-8b-6f9c"} {ecc}
"""
VLLM_EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",pod="llama-8b-6f9c",Hostname="gpu-node-7"} 24.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",pod="llama-8b-6f9c",Hostname="gpu-node-7"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",pod="llama-8b-6f9c",Hostname="gpu-node-7"} 0.87
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",pod="llama-8b-6f9c",Hostname="gpu-node-7"} {preemptions}
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 812.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 901.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 901.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 61.9
"""


def exposition(xid=0, ecc=2, preemptions=40):
    return (DCGM_EXPOSITION.replace("{xid}", str(xid)).replace("{ecc}", str(ecc)),
            VLLM_EXPOSITION.replace("{preemptions}", str(preemptions)))


def test_dcgm_and_vllm_expositions_become_gpu_samples():
    mapper = GpuMapper(OtlpMapping().gpu)
    first = mapper.map([s for text in exposition() for s in samples_from_exposition(text, 1_793_577_600_000)])
    second = mapper.map([s for text in exposition(xid=79, ecc=3, preemptions=46)
                         for s in samples_from_exposition(text, 1_793_577_610_000)])
    assert not first.refused and not second.refused
    by = {(g.gpu_index, g.source, g.ts): g for g in first.samples + second.samples}
    gpu0 = by[(0, "dcgm", 1_793_577_600_000)]
    assert (gpu0.node, gpu0.gpu_sku, gpu0.gpu_uuid) == ("gpu-node-7", "H100", "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52")
    assert (gpu0.util_pct, gpu0.temp_c, gpu0.power_w, gpu0.sm_clock_mhz) == (97, 61, 512.25, 1980)
    assert gpu0.mem_used_bytes == 75000 * 2**20 and gpu0.mem_total_bytes == 81083 * 2**20
    assert gpu0.sm_active_pct == pytest.approx(41.2)
    assert gpu0.xid_errors == 0 and gpu0.ecc_errors is None  # a running total's first reading is its base
    later = by[(0, "dcgm", 1_793_577_610_000)]
    assert (later.xid_errors, later.ecc_errors) == (1, 1)  # XID 79 appeared; one more double-bit error
    runtime = by[(0, "runtime", 1_793_577_600_000)]  # joined to GPU 0 by the pod, not GPU 1
    assert (runtime.model, runtime.queue_depth, runtime.running, runtime.kv_cache_usage) == (
        "meta-llama/Llama-3.1-8B-Instruct", 7, 24, 0.87)
    assert runtime.preemptions is None and by[(0, "runtime", 1_793_577_610_000)].preemptions == 6
    assert (1, "runtime", 1_793_577_600_000) not in by
    assert by[(1, "dcgm", 1_793_577_600_000)].util_pct == 0


def test_sdk_metrics_in_both_encodings_become_gpu_samples():
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=Resource.create({"cloud.availability_zone": "eu-west-4a", "pool": "llm-eu"}),
                             metric_readers=[reader])
    meter = provider.get_meter("dcgm")
    labels = {"gpu": "3", "UUID": "GPU-aa", "modelName": "NVIDIA L40S", "Hostname": "n9"}
    meter.create_gauge("DCGM_FI_DEV_GPU_UTIL").set(55, labels)
    meter.create_gauge("DCGM_FI_DEV_FB_USED").set(1024, labels)
    meter.create_gauge("DCGM_FI_DEV_FB_FREE").set(1024, labels)
    meter.create_gauge("DCGM_FI_DEV_GPU_UTIL").set(101, {**labels, "gpu": "4", "Hostname": "n10"})  # out of range: refused
    # A runtime's queue as an up-down counter: a level, not a running total to take deltas of.
    meter.create_up_down_counter("nv_inference_pending_request_count").add(7, {"model": "m", "Hostname": "n9"})
    request = encode_metrics(reader.get_metrics_data())
    for encoding in wire.ENCODINGS:
        raw = wire.encode(MetricsData.FromString(request.SerializeToString()), encoding)
        mapped = GpuMapper(OtlpMapping().gpu).map(samples_from_otlp(wire.decode(raw, MetricsData)))
        [g] = [s for s in mapped.samples if s.source == "dcgm"]
        [runtime] = [s for s in mapped.samples if s.source == "runtime"]
        assert (runtime.node, runtime.gpu_index, runtime.queue_depth, runtime.model) == ("n9", 3, 7, "m")
        assert (g.node, g.gpu_index, g.zone, g.pool, g.gpu_sku, g.util_pct) == ("n9", 3, "eu-west-4a", "llm-eu", "L40S", 55)
        assert g.mem_total_bytes == 2048 * 2**20
        assert [r for r, _ in mapped.refused] == ["otlp_metric_invalid"]


class _Exposition(http.server.BaseHTTPRequestHandler):
    texts: list[str] = []

    def do_GET(self):
        body = self.texts.pop(0).encode() if len(self.texts) > 1 else self.texts[0].encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_collect_prometheus_scrapes_over_http(capsys):
    dcgm_text, vllm_text = exposition()
    servers = []
    for texts in ([dcgm_text], [vllm_text]):
        handler = type("H", (_Exposition,), {"texts": list(texts)})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        urls = [f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in servers]
        assert main(["collect", "prometheus", "--print", "--count", "2", "--interval", "0.1",
                     *[a for u in urls for a in ("--url", u)], "--url", "http://127.0.0.1:9/metrics"]) == 0
    finally:
        for s in servers:
            s.shutdown()
    out = capsys.readouterr()
    samples = [json.loads(line) for line in out.out.splitlines()]
    assert {(s["gpu_index"], s["source"]) for s in samples} == {(0, "dcgm"), (1, "dcgm"), (0, "runtime")}
    assert len(samples) == 6  # two rounds
    assert out.err.count("127.0.0.1:9/metrics") == 2  # the dead target is reported each round, the rest still count


def test_mapping_file_problems_are_listed_with_their_place(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("requests:\n  tenant: {attributes: [k8s.namespace.name], default: shared}\n"
                    "  traffic_class: {attributes: [priority], values: {high: realtime, low: batch}}\n")
    assert main(["otlp", "check", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("requests:\n  tenant: {attribute: [x]}\n  traffic_class: {default: urgent}\n"
                   "  pool: {attributes: [k8s.deployment.name, enduser.id]}\ngpu:\n  nodes: {}\n")
    assert main(["otlp", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}: requests.tenant: object contains unknown field `attribute`" in err
    assert "requests.traffic_class.default: invalid enum value 'urgent'" in err
    assert "gpu: unknown field `nodes`" in err
    assert "requests.pool: attribute enduser.id carries a person or their words and is never read" in err
    assert len(check_mapping(bad)) == 4
    assert main(["ingest", "otlp", "--mapping", str(bad), "--bootstrap-servers", "127.0.0.1:9"]) == 2


def test_simulate_otlp_then_ingest_otlp_feed_the_worker(kafka, tmp_path, capsys):
    """The demo path from the command line: the simulator as a Collector would ship it
    (otlp_json), `ingest otlp`, the worker; GPU rows merge DCGM and runtime sources."""
    spans_topic, metrics_topic = f"{kafka.topic_prefix}otlp_spans", f"{kafka.topic_prefix}otlp_metrics"
    common = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", kafka.topic_prefix,
              "--spans-topic", spans_topic, "--metrics-topic", metrics_topic]
    assert main(["simulate", "--minutes", "3", "--rate-scale", "0.2", "--seed", "9", "--format", "otlp",
                 "--otlp-encoding", "otlp_json", *common]) == 0
    assert main(["ingest", "otlp", "--until-idle", "3", "--group", f"i-{uuid.uuid4().hex[:6]}", *common]) == 0
    out = capsys.readouterr().out
    sim = FleetSimulator("mixed-fleet", minutes=3, seed=9, rate_scale=0.2)
    requests = sum(1 for e in sim.events() if isinstance(e, RequestV1))
    assert f"{requests:,} requests from {requests:,} spans" in out
    store = tmp_path / "tw.duckdb"
    run_worker(kafka, store)
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == requests
    merged = con.execute("SELECT count(*), count(*) FILTER (WHERE sources = 'dcgm,runtime' AND model IS NOT NULL "
                         "AND util_pct_mean IS NOT NULL AND queue_depth_max IS NOT NULL) FROM gpu_minute").fetchone()
    assert merged[0] > 0 and merged[1] == merged[0]


def test_triton_spans_become_one_request_with_its_queue_time():
    """Triton (trace mode opentelemetry) sends a top-level span, a model span and a compute
    span per request, each with model_name, model_version and request_id, and the queue and
    compute timestamps as span events."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "triton-inference-server",
                                                        "cloud.availability_zone": "us-east-1a", "tenant.id": "acme"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("triton")
    t0 = 1_793_577_600_000_000_000
    ms = 1_000_000
    for i, (queue_ms, failed) in enumerate(((12, False), (40, True))):
        start = t0 + i * 1000 * ms
        attrs = {"model_name": "whisper", "model_version": "3", "request_id": f"r{i}", "workload": "asr"}
        top = tracer.start_span("InferRequest", start_time=start, attributes=attrs)
        model = tracer.start_span("whisper", context=set_span_in_context(top), start_time=start + ms, attributes=attrs)
        model.add_event("QUEUE_START", timestamp=start + 2 * ms)
        compute = tracer.start_span("compute", context=set_span_in_context(model), start_time=start + (2 + queue_ms) * ms, attributes=attrs)
        compute.add_event("COMPUTE_START", timestamp=start + (2 + queue_ms) * ms)
        compute.add_event("COMPUTE_END", timestamp=start + (60 + queue_ms) * ms)
        compute.end(end_time=start + (61 + queue_ms) * ms)
        model.end(end_time=start + (62 + queue_ms) * ms)
        if failed:
            top.set_status(Status(StatusCode.ERROR, "model instance failed"))
        top.end(end_time=start + (70 + queue_ms) * ms)
    raw = encode_spans(exporter.get_finished_spans()).SerializeToString()
    mapped = requests_from_traces(wire.decode(raw, TracesData), OtlpMapping().requests)
    assert mapped.skipped == 4 and not mapped.refused  # the model and compute spans are parts, not requests
    first, second = sorted(mapped.events, key=lambda e: e.ts)
    assert (first.model, first.model_version, first.tenant, first.zone, first.workload) == ("whisper", "3", "acme", "us-east-1a", "asr")
    assert (first.queue_ms, first.e2e_ms, first.status) == (12.0, 82.0, "ok")
    assert (second.queue_ms, second.e2e_ms, second.status) == (40.0, 110.0, "error")


def test_triton_metrics_join_their_gpu_by_uuid_and_pod():
    text = """\
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"} 0.93
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"} 42949672960
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="whisper",version="3",pod="llama-8b-6f9c"} 5
"""
    mapper = GpuMapper(OtlpMapping().gpu)
    dcgm_text, _ = exposition()
    mapper.map(samples_from_exposition(dcgm_text, 1_793_577_600_000))  # DCGM teaches uuid → index and pod → GPU
    mapped = mapper.map([replace_label(s, Hostname="gpu-node-7") for s in samples_from_exposition(text, 1_793_577_610_000)])
    [g] = mapped.samples
    assert (g.node, g.gpu_index, g.source) == ("gpu-node-7", 0, "runtime")
    assert (g.util_pct, g.mem_used_bytes, g.queue_depth, g.model, g.model_version) == (93.0, 40 * 2**30, 5, "whisper", "3")


def replace_label(sample, **labels):
    return dataclasses.replace(sample, labels={**sample.labels, **labels})


def test_refused_gpu_samples_of_one_batch_share_one_dead_letter_and_all_count():
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("dcgm")
    util = meter.create_gauge("DCGM_FI_DEV_GPU_UTIL")
    for gpu in range(3):
        util.set(150, {"gpu": str(gpu), "Hostname": "n1"})  # above 100%: the schema refuses it
    util.set(40, {"gpu": "3", "Hostname": "n1"})
    raw = encode_metrics(reader.get_metrics_data()).SerializeToString()
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:9", topic_prefix="x.")  # nothing is sent: queued only
    republisher = OtlpRepublisher(settings, OtlpMapping(), "spans", "metrics", group_id="unused")
    sent = []
    republisher._dead_letter = lambda *args: (sent.append(args), republisher.report.dead_letters.update([args[3]]))
    record = republisher.map_record("metrics", 0, 17, raw, 0)
    assert [(g.node, g.gpu_index, g.util_pct) for g in record.events()] == [("n1", 3, 40.0)]
    assert republisher.report.dead_letters == {"otlp_metric_invalid": 3}
    [(topic, partition, offset, reason, detail, letter_raw, _ts)] = sent  # one letter with the batch's bytes
    assert (topic, partition, offset, letter_raw) == ("metrics", 0, 17, raw) and "(and 2 more)" in detail
