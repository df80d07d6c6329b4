"""The naive baseline for `tailwatch bench`: one faust agent, one event at a time.

It does the same work as the batch worker's hot path, event by event: decode and
validate against the schema, drop duplicates, and add the event to its 1-minute slice
bucket (counts and latency histogram bins). Two variants (BENCH_VARIANT):
`record`, the idiomatic faust way (a `faust.Record` model with validation, faust's JSON
codec), and `msgspec`, a tuned per-event agent (raw bytes decoded by msgspec). Run by the benchmark as
`faust -A tools.bench_faust worker`; configured through environment variables, it
writes `events cpu_seconds wall_seconds` to BENCH_RESULT after BENCH_EVENTS events and
exits.
"""

from __future__ import annotations

import os
import time

import faust
import msgspec

from tailwatch.ingest.schema import RequestV1
from tailwatch.slo.histogram import bin_of

app = faust.App(
    os.environ.get("BENCH_APP_ID", "tailwatch-bench-baseline"),
    broker=f"kafka://{os.environ.get('BENCH_BOOTSTRAP', '127.0.0.1:9092')}",
    value_serializer="raw",
    web_enabled=False,
    store="memory://",
)


# faust's own model of request.v1: the idiomatic faust way mirrors the wire schema
# (ingest/schema.py) as a Record, which is what this baseline measures.
class Request(faust.Record, validation=True, serializer="json"):
    schema: str
    event_id: str
    ts: int
    tenant: str
    model: str
    workload: str
    status: str
    model_version: str = ""
    zone: str = ""
    region: str = ""
    pool: str = ""
    endpoint: str = ""
    traffic_class: str = "realtime"
    deployment: str = "stable"
    http_status: int = None  # type: ignore[assignment]
    attempt: int = 1
    retry_of: str = None  # type: ignore[assignment]
    task_success: bool = None  # type: ignore[assignment]
    queue_ms: float = None  # type: ignore[assignment]
    first_output_ms: float = None  # type: ignore[assignment]
    e2e_ms: float = None  # type: ignore[assignment]
    prompt_tokens: int = None  # type: ignore[assignment]
    output_tokens: int = None  # type: ignore[assignment]
    gpu_seconds: float = None  # type: ignore[assignment]
    gpu_sku: str = ""


VARIANT = os.environ.get("BENCH_VARIANT", "record")
topic = app.topic(os.environ.get("BENCH_TOPIC", "tw.requests"), value_type=Request if VARIANT == "record" else bytes,
                  value_serializer="json" if VARIANT == "record" else "raw")
target = int(os.environ.get("BENCH_EVENTS", "50000"))
decoder = msgspec.json.Decoder(RequestV1)
buckets: dict[tuple, list] = {}
seen: set[str] = set()
state = {"n": 0, "cpu0": 0.0, "wall0": 0.0}


STATUS_INDEX = {"ok": 1, "error": 2, "timeout": 3, "shed": 4, "cancelled": 5}


def add_to_bucket(ev) -> None:
    """The worker's per-bucket sums and histograms, one event at a time."""
    key = (ev.ts // 60_000, ev.tenant, ev.model, ev.model_version, ev.zone, ev.workload,
           ev.traffic_class, ev.deployment, ev.pool)
    b = buckets.get(key)
    if b is None:
        b = buckets[key] = [0] * 12 + [{}, {}, {}]
    b[0] += 1
    b[STATUS_INDEX[ev.status]] += 1
    retry = ev.attempt > 1 or ev.retry_of is not None
    b[6] += retry
    # Turns as streams.aggregates counts them: at the chain's first attempt, success at its ok.
    b[7] += not retry and (ev.status != "cancelled" or ev.task_success is not None)
    b[8] += bool(ev.status == "ok" if ev.task_success is None else ev.task_success)
    b[9] += ev.prompt_tokens or 0
    b[10] += ev.output_tokens or 0
    b[11] += ev.gpu_seconds or 0.0
    for slot, value in ((12, ev.queue_ms), (13, ev.first_output_ms), (14, ev.e2e_ms)):
        if value is not None:
            hb = bin_of(value)
            b[slot][hb] = b[slot].get(hb, 0) + 1


@app.agent(topic)
async def aggregate(stream):
    async for value in stream:
        if state["n"] == 0:
            state["cpu0"], state["wall0"] = time.process_time(), time.monotonic()
        state["n"] += 1
        if VARIANT == "record":
            ev = value
        else:
            try:
                ev = decoder.decode(value)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue
        if ev.event_id not in seen:
            seen.add(ev.event_id)
            add_to_bucket(ev)
        if state["n"] >= target:
            with open(os.environ["BENCH_RESULT"], "w") as fh:
                fh.write(f"{state['n']} {time.process_time() - state['cpu0']} {time.monotonic() - state['wall0']}")
            os._exit(0)
