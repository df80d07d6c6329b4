"""Decoded records → the worker's columnar frame (streams/frames.py): a batch's constant
columns, filled from their one value, are the columns a value-by-value conversion gives."""

from __future__ import annotations

import msgspec
import polars as pl
from hypothesis import given, settings, strategies as st

from tailwatch.ingest.schema import EvalV1, RequestV1
from tailwatch.ingest.validate import BatchDecoder
from tailwatch.streams.frames import _OPTIONAL_COLUMNS, REQUEST_COLUMNS, PHASES_COLUMN, _gather, records_to_frame

TS = 1_767_225_600_000
ENC = msgspec.json.Encoder()
DECODER = BatchDecoder(RequestV1, also=(EvalV1,))

_request = st.fixed_dictionaries(
    {"schema": st.just("request.v1"), "event_id": st.uuids().map(str), "ts": st.integers(TS, TS + 600_000),
     "tenant": st.sampled_from(["acme", "globex"]), "model": st.just("llama"), "workload": st.just("llm"),
     "status": st.sampled_from(["ok", "error"])},
    optional={"voice": st.sampled_from(["", "alto"]), "e2e_ms": st.floats(0, 1e4), "language": st.sampled_from(["", "de-DE"]),
              "prompt_tokens": st.integers(0, 10_000), "task_success": st.booleans(),
              "stages": st.dictionaries(st.sampled_from(["asr", "llm", "tts"]), st.floats(0, 1e3), max_size=2)})
_eval = st.fixed_dictionaries(
    {"schema": st.just("eval.v1"), "event_id": st.uuids().map(str), "ts": st.integers(TS, TS + 600_000),
     "tenant": st.just("acme"), "model": st.just("asr-1"), "workload": st.just("asr"), "language": st.just("de-DE")},
    optional={"mos": st.floats(1, 5)})


@settings(max_examples=150, deadline=None)
@given(events=st.lists(st.one_of(_request, _eval), min_size=1, max_size=30))
def test_every_column_is_the_value_by_value_conversion(events):
    values = [ENC.encode(e) for e in events]
    out = DECODER.decode(values)
    n = len(values)
    frame, _ = records_to_frame(out.records, REQUEST_COLUMNS, [0] * n, list(range(n)), out.indices)
    kinds = set(map(type, out.records))
    for column, dtype in REQUEST_COLUMNS.items():
        if column in (PHASES_COLUMN, "event_id", "language"):
            continue  # rewritten after gathering (evaluations' ids, lower case) or built apart
        want = pl.Series(column, _gather(out.records, kinds, column), dtype=dtype)
        if column in _OPTIONAL_COLUMNS and column not in frame.columns:  # a bucket bound no record carries
            assert want.null_count() == len(want), column
            continue
        assert frame[column].dtype == dtype
        assert frame[column].to_list() == want.to_list(), column
    assert frame["language"].to_list() == [r.language.lower() for r in out.records]
    has_stages = any(getattr(r, PHASES_COLUMN, None) for r in out.records)
    assert (PHASES_COLUMN in frame.columns) == has_stages
