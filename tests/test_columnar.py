"""The fast columnar decoder (ingest/columnar.py, ingest/_columnar.c) against the reference
decoder (ingest/validate.py): for any input the worker's path gives the reference's frame and
rejections, and on what producers really send it takes the records itself."""

from __future__ import annotations

import json
import math
import struct
from datetime import datetime, timezone

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tailwatch.ingest import _columnar
from tailwatch.ingest.schema import MAX_EVENT_TS_MS, MIN_EVENT_TS_MS, EvalV1, GpuV1, RequestV1, parse_ts_ms
from tailwatch.ingest.validate import BatchDecoder
from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS, column_decoder, decode_frame, records_to_frame
from tailwatch_dev.trace import TraceReplay, read_any_trace
from tailwatch_dev.traces import AZURE_CODE_TRACE, MOONCAKE_TRACE

REFERENCE = {RequestV1: BatchDecoder(RequestV1, also=(EvalV1,)), GpuV1: BatchDecoder(GpuV1)}
COLUMNS = {RequestV1: REQUEST_COLUMNS, GpuV1: GPU_COLUMNS}
FAST = {t: column_decoder(t, COLUMNS[t], REFERENCE[t].max_record_bytes) for t in REFERENCE}
NOW_MS = 1_795_000_000_000


def both_ways(values: list[bytes | None], event_type=RequestV1, record_ts: list[int] | None = None):
    """(the worker's decode, the reference's frame and rejections)."""
    n = len(values)
    record_ts = record_ts or [NOW_MS] * n
    got = decode_frame(FAST[event_type], REFERENCE[event_type], COLUMNS[event_type], values, [n % 3] * n,
                       list(range(100, 100 + n)), record_ts, 300_000)
    ref = REFERENCE[event_type].decode(values)
    frame, future = records_to_frame(ref.records, COLUMNS[event_type], [n % 3] * n, list(range(100, 100 + n)),
                                     ref.indices, record_ts, 300_000)
    return got, frame, sorted((r.index, r.reason, r.detail) for r in ref.rejected + future)


def assert_same(values, event_type=RequestV1, record_ts=None):
    got, frame, rejected = both_ways(values, event_type, record_ts)
    assert got.frame.schema == frame.schema
    assert got.frame.equals(frame), (got.frame, frame)
    assert sorted((r.index, r.reason, r.detail) for r in got.rejected) == rejected
    return got


def request(**fields) -> dict:
    return {"schema": "request.v1", "event_id": "e1", "ts": 1_790_000_000_000, "tenant": "acme",
            "model": "llama", "workload": "llm", "status": "ok", **fields}


def compact(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


@pytest.mark.parametrize("trace", [AZURE_CODE_TRACE, MOONCAKE_TRACE], ids=["azure", "mooncake"])
def test_on_public_traces_the_fast_decoder_takes_every_record_and_gives_the_reference_frame(trace):
    encode = msgspec.json.Encoder().encode
    values = []
    for event in TraceReplay(rows=read_any_trace(trace)[:3_000], seed=3).events():
        values.append(encode(event))
    got = assert_same(values)
    assert got.fast_rows == len(values) > 2_000


def test_a_record_declined_half_way_leaves_nothing_in_the_columns():
    good = [compact(request(event_id=f"g{i}", queue_ms=1.5 * i, prompt_tokens=i)) for i in range(3)]
    # Valid up to its last field: an unknown field (dropped by the reference, which keeps the
    # record), an escape, a duplicate key, a value past its bound.
    late = [compact(request(event_id="u", queue_ms=9.0, prompt_tokens=7, x=1)),
            compact(request(event_id="esc", tenant="a\\u0062c")).replace(b"\\\\", b"\\"),
            compact(request(event_id="dup", queue_ms=3.0))[:-1] + b',"queue_ms":4.0}',
            compact(request(event_id="big", queue_ms=2e9))]
    got = assert_same([good[0], late[0], good[1], late[1], late[2], good[2], late[3]])
    assert got.fast_rows == 3
    assert got.frame["event_id"].to_list() == ["g0", "u", "g1", "esc", "dup", "g2"]
    assert got.frame["tenant"][3] == "abc"  # the escape, as the reference reads it
    assert got.frame["queue_ms"].to_list() == [0.0, 9.0, 1.5, None, 4.0, 3.0]
    assert got.unknown_fields_dropped == 1
    assert [(r.index, r.reason) for r in got.rejected] == [(6, "out_of_range")]


def test_defaults_nulls_and_gpu_samples():
    gpu = {"schema": "gpu.v1", "ts": "2026-11-28T10:00:00.250Z", "node": "n1", "gpu_index": 3, "util_pct": 100,
           "mem_used_bytes": 2**50, "kv_cache_usage": None, "replica_state": "warm", "source": "dcgm"}
    got = assert_same([compact(gpu), compact({**gpu, "gpu_index": 1025}), compact({**gpu, "source": "smi"})], GpuV1,
                      record_ts=[1_796_464_800_000] * 3)
    assert got.fast_rows == 1 and got.frame["ts_ms"].to_list() == [parse_ts_ms(gpu["ts"])]
    got = assert_same([compact(request(attempt=2, task_success=False, retry_of=None)), compact(request())])
    assert got.fast_rows == 2
    assert got.frame["attempt"].to_list() == [2, 1] and got.frame["traffic_class"].to_list() == ["realtime"] * 2
    assert got.frame["task_success"].to_list() == [False, None] and got.frame["zone"].to_list() == ["", ""]


def test_a_patterned_label_is_taken_only_once_the_reference_accepted_it():
    fast = column_decoder(RequestV1, REQUEST_COLUMNS, 1 << 16)
    values = [compact(request(language="en-US", voice="premium-2")), compact(request(event_id="b", language="english!")),
              compact(request(event_id="e2", language="EN-gb")), compact(request(event_id="c", voice="Bad Voice"))]
    n = len(values)
    for fast_rows in (0, 2):  # first seen: all to the reference, which approves what it accepts
        got = decode_frame(fast, REFERENCE[RequestV1], REQUEST_COLUMNS, values, [0] * n, list(range(n)), [NOW_MS] * n)
        assert got.fast_rows == fast_rows
        assert got.frame["language"].to_list() == ["en-us", "en-gb"]  # one slice whatever the case
        assert [r.index for r in got.rejected] == [1, 3]
    assert_same(values)


finite = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)


def spellings(x: float) -> list[str]:
    out = [repr(x), f"{x:.17g}", f"{x:.3f}", f"{x:e}", f"{x:E}", f"{x:.20e}", f"{x:.1f}", f"{x:.0f}"]
    if x == int(x) and x < 2**60:
        out += [str(int(x)), f"{int(x)}.0", f"{int(x)}e0", f"{int(x)}E+00"]
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(finite)
@example(0.1)
@example(1e-300)
@example(4.9406564584124654e-324)
@example(999_999_999.9999999)
@example(2.0**53 + 1)
@example(123456789012345678.0)
@example(1e9)
@example(0.30000000000000004)
def test_every_spelling_of_a_number_decodes_as_the_reference_reads_it(x):
    values = [compact(request(event_id=f"e{i}"))[:-1] + f',"queue_ms":{s}}}'.encode() for i, s in enumerate(spellings(x))]
    values += [compact(request(event_id="n"))[:-1] + f',"prompt_tokens":{s}}}'.encode() for s in spellings(x)[:3]]
    got = assert_same(values)
    assert got.fast_rows >= 1 or x > 1e9  # every in-bound value is taken in some spelling


@given(st.integers(min_value=-(2**64), max_value=2**64))
@example(10**9)
@example(10**9 + 1)
@example(-0)
@example(999_999_999_999_999_999)
@example(2**53 + 1)
def test_integers_at_and_past_their_bounds(n):
    assert_same([compact(request(prompt_tokens=n)), compact(request(attempt=n)),
                 compact(request(event_id="q"))[:-1] + f',"queue_ms":{n}}}'.encode(),
                 compact(request(ts=n)), compact(request(http_status=n))])


ts_ms = st.integers(min_value=MIN_EVENT_TS_MS - 86_400_000, max_value=MAX_EVENT_TS_MS + 86_400_000)


@given(ts_ms, st.sampled_from(["{}Z", "{}z", "{}+00:00", "{}+01:00", "{}", "{} ", "{}-00:00"]),
       st.sampled_from(["ms", "us", "none", "one", "nine"]))
@example(946_684_800_000, "{}Z", "none")
@example(4_102_444_799_999, "{}Z", "ms")
def test_timestamps_in_every_spelling_decode_as_the_reference_parses_them(ms, zone, fraction):
    secs, milli = divmod(ms, 1000)
    base = datetime.fromtimestamp(secs, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    frac = {"ms": f".{milli:03d}", "us": f".{milli:03d}{ms % 7:03d}", "none": "", "one": f".{milli // 100}",
            "nine": f".{milli:03d}000000"}[fraction]
    text = zone.format(base + frac)
    got = _columnar.rfc3339_ms(text)
    try:
        want = parse_ts_ms(text)
    except ValueError:
        want = None
    assert got is None or got == want or not MIN_EVENT_TS_MS <= got < MAX_EVENT_TS_MS
    assert_same([compact(request(ts=text)), compact(request(ts=ms))])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_mutation_of_a_record_decodes_as_the_reference_decodes_it(data):
    doc = request(queue_ms=12.5, e2e_ms=900.25, prompt_tokens=4096, task_success=True, zone="z-1",
                  language="en-US", finish_reason="stop", gpu_seconds=0.125)
    raw = bytearray(json.dumps(doc, separators=data.draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")])))
                    .encode())
    for _ in range(data.draw(st.integers(1, 4))):
        if not raw:
            break
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        pos = data.draw(st.integers(0, len(raw) - 1))
        if op == "flip":
            raw[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw.insert(pos, data.draw(st.sampled_from(b'{}[]",:\\0123456789eE+-. \t\n\x00\x7f\x80\xc2\xff')))
        elif op == "delete" and len(raw) > 1:
            del raw[pos]
        elif op == "cut":
            raw = raw[:pos]
    assert_same([compact(request(event_id="before")), bytes(raw), compact(request(event_id="after"))])


def test_a_struct_of_doubles_packs_as_the_columns_hold_it():
    """The float column's buffer is IEEE 754 doubles in native order: -0.0 keeps its sign."""
    got = assert_same([compact(request(queue_ms=-0.0)), compact(request(event_id="x", queue_ms=0.0))])
    assert [struct.pack("<d", v) for v in got.frame["queue_ms"].to_list()] == [struct.pack("<d", -0.0),
                                                                              struct.pack("<d", 0.0)]
    assert math.copysign(1, got.frame["queue_ms"][0]) == -1
