"""The decode path fuzzed with invariants (tools/fuzz_decode.py): a few seconds here, a long
run with `tailwatch fuzz decode --records 1000000` (docs/benchmarks.md has its figures)."""

from __future__ import annotations

import json

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.schema import RequestV1
from ingest.validate import REASONS, BatchDecoder
from tools.fuzz_decode import Generator, run

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


def test_the_mutation_fuzzer_keeps_every_invariant():
    report = run(6_000, seed=11)
    assert report.violations == [], report.lines()
    # Every record made is tallied once: accepted, or rejected with a reason.
    assert sum(report.by_expect.values()) == report.accepted + sum(report.by_reason.values()) == 6_000
    # It went down every path: valid records accepted, invalid ones of many kinds refused.
    assert report.by_expect["valid"] > 1_500 and report.by_expect["joined"] > 100 and report.accepted > 1_500
    assert {"too_deep", "future", "bad_timestamp", "oversized", "invalid_value", "malformed_json"} <= set(report.by_reason)


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
