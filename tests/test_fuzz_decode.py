"""The decode path fuzzed with invariants (dev/tailwatch_dev/fuzz_decode.py): a few seconds here, a long
run with `tailwatch fuzz decode --records 1000000` (docs/benchmarks.md has its figures)."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailwatch.ingest.schema import (MAX_RECORD_COUNT, MAX_REQUEST_AUDIO_SECONDS, MAX_REQUEST_GPU_SECONDS, EvalV1, GpuV1,
                           RequestV1)
from tailwatch.ingest.validate import REASONS, BatchDecoder
from tailwatch.streams.aggregates import MAX_EVENTS_PER_SLICE_MINUTE, MICRO
from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS, records_to_frame
from tailwatch_dev.fuzz_decode import REFERENCE_SUMS, Generator, SumCheck, run

DECODER = BatchDecoder(RequestV1)
FIELDS = [f.name for f in msgspec.inspect.type_info(RequestV1).fields]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


def base(n: int = 1) -> dict:
    return {"schema": "request.v1", "event_id": f"e{n}", "ts": 1_790_000_000_000, "tenant": "acme", "model": "m",
            "workload": "llm", "status": "ok"}


def outcome(batch_result, index: int):
    for r in batch_result.rejected:
        if r.index == index:
            return r.reason
    return msgspec.to_builtins(batch_result.records[batch_result.indices.index(index)])


@pytest.mark.slow
def test_the_mutation_fuzzer_keeps_every_invariant():
    report = run(6_000, seed=11)
    assert report.violations == [], report.lines()
    # Every record made is tallied once: accepted, or rejected with a reason.
    assert sum(report.by_expect.values()) == report.accepted + sum(report.by_reason.values()) == 6_000
    # It went down every path: valid records accepted, invalid ones of many kinds refused.
    assert report.by_expect["valid"] > 1_500 and report.by_expect["joined"] > 100 and report.accepted > 1_500
    assert {"too_deep", "future", "bad_timestamp", "oversized", "invalid_value", "malformed_json"} <= set(report.by_reason)
    # Its accepted records were summed by the windows and checked against a reference (invariant 7).
    assert report.sums_checked > 1_000, report.lines()


def _at_the_bounds(n: int, others: int) -> tuple[list[bytes], list[bytes]]:
    """`n` requests, `others` evaluations and GPU samples with every summed field at the
    contract's maximum, all in one slice-minute (one GPU)."""
    ts = 1_790_000_000_000
    top = {c: MAX_RECORD_COUNT for c in ("prompt_tokens", "output_tokens", "partial_revisions", "underruns",
                                          "cached_prompt_tokens", "draft_tokens", "accepted_tokens")}
    requests = [json.dumps({**base(i), "ts": ts + i % 1000, **top, "gpu_seconds": MAX_REQUEST_GPU_SECONDS,
                            "audio_seconds": MAX_REQUEST_AUDIO_SECONDS}).encode() for i in range(n)]
    evals = [json.dumps({"schema": "eval.v1", "event_id": f"x{i}", "ts": ts, "tenant": "acme", "model": "m",
                         "workload": "llm", "mos": 5, **dict.fromkeys(("word_errors", "reference_words", "char_errors",
                                                                       "reference_chars"), MAX_RECORD_COUNT)}).encode()
             for i in range(others)]
    gpus = [json.dumps({"schema": "gpu.v1", "ts": ts + i % 1000, "node": "n1", "gpu_index": 0, "util_pct": 100,
                        "power_w": 1e5, "xid_errors": MAX_RECORD_COUNT, "ecc_errors": MAX_RECORD_COUNT,
                        "preemptions": MAX_RECORD_COUNT, "sm_active_pct": 100, "queue_depth": i}).encode()
            for i in range(others)]
    return requests + evals, gpus


def test_sums_at_the_contract_maximum_in_one_slice_minute_equal_the_exact_reference():
    """Thousands of records at every summed field's bound in one slice-minute: each sum is never
    negative and equals the reference in Python integers. (10,000 GPU-seconds at the bound
    are 1.02 × 10¹⁹ micro-seconds: past 2⁶³, where an Int64 sum wraps negative.)"""
    requests, gpus = _at_the_bounds(10_000, others=2_000)
    for schema, values, decoder, columns in (("request.v1", requests, BatchDecoder(RequestV1, also=(EvalV1,)), REQUEST_COLUMNS),
                                             ("gpu.v1", gpus, BatchDecoder(GpuV1), GPU_COLUMNS)):
        decoded = decoder.decode(values)
        assert not decoded.rejected, decoded.rejected[:3]
        frame, _ = records_to_frame(decoded.records, columns, [0] * len(values), list(range(len(values))),
                                    decoded.indices)
        checked, problems = SumCheck().check(schema, frame, crowded=False)
        assert checked == 1 and problems == [], problems
        want = SumCheck.reference(schema, frame)
        (row,) = want.values()
        assert all(v >= 0 for v in row.values()) and set(row) == set(REFERENCE_SUMS[schema])
    assert row["samples"] == 2_000 and row["xid_errors"] == 2_000 * MAX_RECORD_COUNT


def test_the_bounds_leave_no_sum_room_to_wrap():
    """The proof in streams/aggregates.py, as numbers: an hour row of Int64 sums at the
    per-record bound and the design's events per slice-minute stays under 2⁶³; a fixed-point
    sum in Int128 has room for 10²³ events at its bound."""
    assert 60 * MAX_EVENTS_PER_SLICE_MINUTE * MAX_RECORD_COUNT < 2**63
    assert max(MAX_REQUEST_GPU_SECONDS, MAX_REQUEST_AUDIO_SECONDS) * MICRO < 2**53  # exact before rounding
    assert 2**127 // int(MAX_REQUEST_GPU_SECONDS * MICRO) > 10**23


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS + ["unknown_field"]), value=json_values, raw_unicode=st.booleans())
def test_any_json_value_in_any_field_is_its_record_alone(field, value, raw_unicode):
    doc = {**base(), field: value}
    raw = json.dumps(doc, ensure_ascii=not raw_unicode).encode()
    alone = DECODER.decode([raw])
    among = DECODER.decode([json.dumps(base(0)).encode(), raw, json.dumps(base(2)).encode()])
    assert len(alone.records) + len(alone.rejected) == 1
    assert {r.reason for r in alone.rejected} <= set(REASONS)
    assert outcome(among, 1) == outcome(alone, 0)
    assert [outcome(among, i)["event_id"] for i in (0, 2)] == ["e0", "e2"]  # the neighbours are untouched


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(which=st.integers(min_value=0, max_value=40), seed=st.integers(0, 2**16))
def test_records_that_only_parse_joined_never_forge_an_event(which, seed):
    """Split a valid record at one of its commas and hang the first part on another record:
    joined as `[first,second]` the two parse as two events, the second with a tenant of the
    producer's choosing. Alone, each is refused."""
    g = Generator(seed)
    a, _ = g.valid_doc("request.v1")
    b, _ = g.valid_doc("request.v1")
    b["tenant"] = "forged"
    first, second = json.dumps(a).encode(), json.dumps(b).encode()
    commas = [i for i in range(len(second)) if second[i:i + 2] == b", "]
    cut = commas[which % len(commas)]
    values = [first + b"," + second[:cut], second[cut + 1:]]
    assert len(msgspec.json.decode(b"[" + b",".join(values) + b"]")) == 2  # two values, two events: counts agree
    out = DECODER.decode(values)
    assert not out.records and len(out.rejected) == 2
