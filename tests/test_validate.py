"""The worker's trust boundary: every kind of bad record gets its own reason."""

import json

import pytest

from ingest.schema import GpuV1, RequestV1
from ingest.validate import CHUNK_RECORDS, BatchDecoder

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
    (b'{"schema": "request.v1", "event_id": "e", "ts": 1, "tenant": "a", "model": "m", "workload": "llm", "status": "ok", "e2e_ms": 1e999}',
     "non_finite_number"),
    (rec(status="great"), "invalid_value"),
    (rec(tenant="x" * 500), "out_of_range"),
    (b'{"schema": "request.v1", "event_id": "\xff", "ts": 1, "tenant": "a", "model": "m", "workload": "llm", "status": "ok"}',
     "invalid_utf8"),
    (b"[1, 2, 3]", "wrong_type"),
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


def test_fast_path_decodes_a_clean_batch_in_one_call():
    out = BatchDecoder(RequestV1).decode([rec(event_id=f"e{i}") for i in range(1000)])
    assert len(out.records) == 1000 and out.indices == list(range(1000))


def test_a_batch_longer_than_a_chunk_keeps_every_position():
    """Batches are decoded in chunks: records, indices, rejections and dropped-field counts
    must come out as if the batch were decoded whole."""
    n = 2 * CHUNK_RECORDS + 7
    values = [rec(event_id=f"e{i}") for i in range(n)]
    values[CHUNK_RECORDS + 3] = b"not json"
    values[n - 1] = rec(event_id="extra", prompt="dropped")
    values[5] = None
    out = BatchDecoder(RequestV1).decode(values)
    assert [(r.index, r.reason) for r in out.rejected] == [(5, "malformed_json"), (CHUNK_RECORDS + 3, "malformed_json")]
    assert out.indices == [i for i in range(n) if i not in (5, CHUNK_RECORDS + 3)]
    assert [r.event_id for r in out.records[-2:]] == [f"e{n - 2}", "extra"]
    assert out.unknown_fields_dropped == 1


def test_gpu_sample_bounds():
    base = {"schema": "gpu.v1", "ts": 1, "node": "n1", "gpu_index": 0}
    out = BatchDecoder(GpuV1).decode([
        json.dumps({**base, "util_pct": 50}).encode(),
        json.dumps({**base, "util_pct": 150}).encode(),
        json.dumps({**base, "kv_cache_usage": 1.5}).encode(),
        json.dumps({**base, "replica_state": "sleepy"}).encode(),
    ])
    assert len(out.records) == 1
    assert [r.reason for r in out.rejected] == ["out_of_range", "out_of_range", "invalid_value"]
