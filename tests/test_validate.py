"""The worker's trust boundary: every kind of bad record gets its own reason."""

import json

import pytest

from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch.ingest.validate import MAX_DEPTH, BatchDecoder, json_depth

GOOD = {"schema": "request.v1", "event_id": "e1", "ts": 1_700_000_000_000, "tenant": "acme", "model": "m",
        "workload": "llm", "status": "ok", "e2e_ms": 12.5}


def rec(**changes) -> bytes:
    d = {**GOOD, **changes}
    return json.dumps({k: v for k, v in d.items() if v is not ...}).encode()


CORPUS = [
    (b'{"schema": "request.v1", "event_id": ', "malformed_json"),
    (b"not json at all", "malformed_json"),
    (rec(schema="request.v9"), "unknown_schema"),
    (rec(schema=...), "missing_field"),
    (rec(status=...), "missing_field"),
    (rec(tenant=5), "wrong_type"),
    (rec(e2e_ms="fast"), "wrong_type"),
    (rec(e2e_ms=-1), "negative_number"),
    (rec(prompt_tokens=-3), "negative_number"),
    (rec(e2e_ms=float("inf")), "non_finite_number"),   # json.dumps writes Infinity
    (rec(e2e_ms=float("nan")), "non_finite_number"),   # json.dumps writes NaN
    (b'{"schema": "request.v1", "event_id": "e", "ts": 1700000000000, "tenant": "a", "model": "m", "workload": "llm", "status": "ok", "e2e_ms": 1e999}',
     "non_finite_number"),
    (rec(status="great"), "invalid_value"),
    (rec(tenant="x" * 500), "out_of_range"),
    (b'{"schema": "request.v1", "event_id": "\xff", "ts": 1700000000000, "tenant": "a", "model": "m", "workload": "llm", "status": "ok"}',
     "invalid_utf8"),
    (b"[1, 2, 3]", "wrong_type"),
    (rec(ts=1), "bad_timestamp"),
    (rec(ts=4_102_444_800_000), "bad_timestamp"),
    (rec(ts=10**40), "bad_timestamp"),
    (rec(ts=1.7e12), "bad_timestamp"),
    (rec(tenant="a\u001b[2J"), "invalid_value"),  # an ANSI escape for whoever prints it
    (rec(zone="a\u0000b"), "invalid_value"),
    (rec(extra=json.loads("[" * 70 + "]" * 70)), "too_deep"),
    (b"[" * 100_000 + b"]" * 100_000, "oversized"),
    (b"[" * 50_000 + b"]" * 10_000, "too_deep"),
    (b"{" * 3000, "too_deep"),
    (rec(ts="9999-12-31T23:59:59Z"), "bad_timestamp"),
    (rec(ts="0001-01-01T00:00:00Z"), "bad_timestamp"),
    (rec(ts="2024-01-01T00:00:00\u0000"), "bad_timestamp"),
]


@pytest.mark.parametrize("raw,reason", CORPUS, ids=[f"{r}-{i}" for i, (_, r) in enumerate(CORPUS)])
def test_each_bad_record_is_named(raw, reason):
    out = BatchDecoder(RequestV1).decode([rec(event_id="ok-before"), raw, rec(event_id="ok-after")])
    assert [r.reason for r in out.rejected] == [reason]
    assert out.rejected[0].index == 1
    assert [r.event_id for r in out.records] == ["ok-before", "ok-after"]


def test_oversized_record_is_refused_before_decoding():
    big = rec(event_id="big", endpoint="x" * 100)
    out = BatchDecoder(RequestV1, max_record_bytes=len(big) - 1).decode([big])
    assert [r.reason for r in out.rejected] == ["oversized"]


def test_fields_outside_the_schema_are_dropped_and_counted():
    raw = rec(prompt="tell me a secret", transcript="hello", user_email="a@b.c")
    out = BatchDecoder(RequestV1).decode([raw, rec(event_id="e2")])
    assert out.unknown_fields_dropped == 1
    assert len(out.records) == 2 and not out.rejected
    assert not hasattr(out.records[0], "prompt")


def test_a_record_that_smuggles_two_objects_is_not_split():
    smuggled = rec(event_id="a") + b"," + rec(event_id="b")
    out = BatchDecoder(RequestV1).decode([smuggled])
    assert len(out.records) == 0 and [r.reason for r in out.rejected] == ["malformed_json"]


def test_rejection_detail_never_carries_the_offending_value():
    out = BatchDecoder(RequestV1).decode([rec(status="my secret prompt text")])
    assert "secret" not in out.rejected[0].detail


def test_a_clean_batch_keeps_every_record_in_order():
    out = BatchDecoder(RequestV1).decode([rec(event_id=f"e{i}") for i in range(1000)])
    assert len(out.records) == 1000 and out.indices == list(range(1000))


def test_bad_records_anywhere_in_a_batch_keep_every_position():
    """Records, indices, rejections and dropped-field counts come out as if each record
    were decoded alone, wherever the bad ones sit (first, last, next to each other)."""
    n = 2_007
    values = [rec(event_id=f"e{i}") for i in range(n)]
    for i in (0, 1003, 1004):
        values[i] = b"not json"
    values[n - 1] = rec(event_id="extra", prompt="dropped")
    values[5] = None
    values[6] = rec(event_id="pad") + b" " * 70_000  # valid JSON, too big
    out = BatchDecoder(RequestV1).decode(values)
    bad = {0: "malformed_json", 5: "malformed_json", 6: "oversized", 1003: "malformed_json", 1004: "malformed_json"}
    assert [(r.index, r.reason) for r in out.rejected] == sorted(bad.items())
    assert out.indices == [i for i in range(n) if i not in bad]
    assert [r.event_id for r in out.records[-2:]] == [f"e{n - 2}", "extra"]
    assert out.unknown_fields_dropped == 1


def test_records_that_only_parse_together_forge_nothing():
    """A record missing its closing brace, then one that closes it: joined as `[r1,r2]` they
    parse as two events (one with a tenant of the producer's choosing). Each is refused."""
    first = rec(event_id="a")[:-1] + b"}, " + rec(event_id="forged", tenant="someone-else", zone="made-up")[:-1]
    second = b', "extra": 1}'
    out = BatchDecoder(RequestV1).decode([first, second, rec(event_id="c")])
    assert [r.event_id for r in out.records] == ["c"]
    assert [(r.index, r.reason) for r in out.rejected] == [(0, "malformed_json"), (1, "malformed_json")]
    # and two records that are each invalid JSON
    out = BatchDecoder(RequestV1).decode([rec(event_id="x")[:-1], b"}"])
    assert not out.records and len(out.rejected) == 2


def test_json_depth_ignores_brackets_in_strings():
    assert json_depth(b'{"a": "[[[[{{{{", "b": [[1]]}') == 3
    assert json_depth(b'{"a": "\\"[[[["}') == 1  # an escaped quote does not end the string
    assert json_depth(b"") == 0 and json_depth(b"[" * (MAX_DEPTH + 1)) == MAX_DEPTH + 1


def test_gpu_sample_bounds():
    base = {"schema": "gpu.v1", "ts": 1_700_000_000_000, "node": "n1", "gpu_index": 0}
    out = BatchDecoder(GpuV1).decode([
        json.dumps({**base, "util_pct": 50}).encode(),
        json.dumps({**base, "util_pct": 150}).encode(),
        json.dumps({**base, "kv_cache_usage": 1.5}).encode(),
        json.dumps({**base, "replica_state": "sleepy"}).encode(),
    ])
    assert len(out.records) == 1
    assert [r.reason for r in out.rejected] == ["out_of_range", "out_of_range", "invalid_value"]
