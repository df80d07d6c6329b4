"""Numbers a producer may send, at and past the contract's bounds, through the real broker and
worker: past a bound, one `out_of_range` dead letter and the rest counted; at the bounds, in one
slice-minute, sums that equal the exact reference (ingest/schema.py, streams/aggregates.py)."""

from __future__ import annotations

import uuid

import pytest

from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
from tailwatch.ingest.schema import MAX_RECORD_COUNT, MAX_REQUEST_AUDIO_SECONDS, MAX_REQUEST_GPU_SECONDS
from tests.test_hostile import drain, produce, request, rows


@pytest.fixture
def kafka(broker) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(settings, 1)
    return settings


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.parametrize("tier", ["all", "1"])
def test_numbers_past_the_bounds_are_dead_letters_and_at_the_bounds_sum_exactly(kafka, tmp_path, tier):
    """gpu_seconds 10¹³ (or audio_seconds 10¹⁵) was inside the contract and overflowed the
    fixed-point cast: exit 1 on every restart. 10,000 requests at every summed bound in one
    slice-minute are 1.02 × 10¹⁹ micro-GPU-seconds, past 2⁶³, where the Int64 sum wrapped
    negative. Now the first are one `out_of_range` dead letter each, the worker goes on, and the
    stored sums equal the exact reference, in one process and through tier-1 partials merged by
    tier 2."""
    n = 10_000
    top = dict(gpu_seconds=MAX_REQUEST_GPU_SECONDS, audio_seconds=MAX_REQUEST_AUDIO_SECONDS,
               prompt_tokens=MAX_RECORD_COUNT, output_tokens=MAX_RECORD_COUNT)
    # As a producer writes them: a Struct is not checked until it is decoded.
    past = [request(n + 1, 2, gpu_seconds=1e13), request(n + 2, 2, audio_seconds=1e15),
            request(n + 3, 2, gpu_seconds=1e13, audio_seconds=1e15)]
    after = [request(n + 10 + i, 2 + i // 20, gpu_seconds=0.25, audio_seconds=1.5) for i in range(60)]
    produce(kafka, [request(i, 1, **top) for i in range(n)] + past + after)
    store = tmp_path / "tw.duckdb"
    drain(kafka, store, tmp_path, tier, timeout=180)
    letters = rows(store, "SELECT source_offset, reason, detail FROM dead_letter ORDER BY source_offset")
    assert [(o, r) for o, r, _ in letters] == [(n, "out_of_range"), (n + 1, "out_of_range"), (n + 2, "out_of_range")]
    assert "gpu_seconds" in letters[0][2] and "audio_seconds" in letters[1][2], letters
    got = rows(store, "SELECT requests, gpu_seconds, audio_seconds, prompt_tokens, output_tokens, successful_audio_ms "
                      "FROM sli_minute WHERE window_start = (SELECT min(window_start) FROM sli_minute)")
    # References in Python integers; the doubles stored are exact at these magnitudes.
    assert got == [(n, float(n * int(MAX_REQUEST_GPU_SECONDS)), float(n * int(MAX_REQUEST_AUDIO_SECONDS)),
                    n * MAX_RECORD_COUNT, n * MAX_RECORD_COUNT, n * int(MAX_REQUEST_AUDIO_SECONDS) * 1000)], got
    # The records after the refused ones, every one counted.
    assert rows(store, "SELECT sum(requests)::BIGINT, sum(gpu_seconds), sum(audio_seconds) FROM sli_minute "
                       "WHERE window_start > (SELECT min(window_start) FROM sli_minute)") == [(60, 60 * 0.25, 60 * 1.5)]
