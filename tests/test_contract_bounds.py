"""Numbers a producer may send, at and past the contract's bounds, through the real broker and
worker: past a bound, one `out_of_range` dead letter and the rest counted; at the bounds, in one
slice-minute, sums that equal the exact reference (ingest/schema.py, streams/aggregates.py)."""

from __future__ import annotations

import uuid

import pytest

from ingest.kafka import KafkaSettings, ensure_topics
from ingest.schema import MAX_RECORD_COUNT, MAX_REQUEST_AUDIO_SECONDS, MAX_REQUEST_GPU_SECONDS
from tests.test_hostile import produce, request, rows, worker


@pytest.fixture
def kafka(broker) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(settings, 1)
    return settings


@pytest.mark.broker
def test_absurd_gpu_and_audio_seconds_are_dead_letters_and_the_worker_counts_the_rest(kafka, tmp_path):
    """gpu_seconds 10¹³ (or audio_seconds 10¹⁵) was inside the contract and overflowed the
    fixed-point cast: exit 1 on every restart, nothing stored after it."""
    good_before = [request(i, 1, gpu_seconds=0.25, audio_seconds=1.5) for i in range(40)]
    # As a producer writes them: a Struct is not checked until it is decoded.
    hostile = [request(900, 1, gpu_seconds=1e13), request(901, 1, audio_seconds=1e15),
               request(902, 2, gpu_seconds=1e13, audio_seconds=1e15)]
    good_after = [request(100 + i, 2 + i // 20, gpu_seconds=0.5) for i in range(60)]
    produce(kafka, good_before + hostile + good_after)
    store = tmp_path / "tw.duckdb"
    proc = worker(kafka, store, tmp_path / "w.log", "--until-idle", "3")
    assert proc.wait(timeout=120) == 0, (tmp_path / "w.log").read_text()[-3000:]
    assert rows(store, "SELECT sum(requests)::BIGINT, sum(gpu_seconds), sum(audio_seconds) FROM sli_minute") == [
        (100, 40 * 0.25 + 60 * 0.5, 40 * 1.5)]
    letters = rows(store, "SELECT source_offset, reason, detail FROM dead_letter ORDER BY source_offset")
    assert [(o, r) for o, r, _ in letters] == [(40, "out_of_range"), (41, "out_of_range"), (42, "out_of_range")]
    assert "gpu_seconds" in letters[0][2] and "audio_seconds" in letters[1][2], letters


@pytest.mark.broker
@pytest.mark.parametrize("tier", ["all", "1"])
def test_records_at_the_contract_maximum_in_one_slice_minute_sum_exactly(kafka, tmp_path, tier):
    """10,000 requests at every summed bound in one slice-minute: 1.02 × 10¹⁹ micro-GPU-seconds,
    past 2⁶³, where the Int64 sum wrapped negative. Stored sums equal the exact reference, in one
    process and through tier-1 partials merged by tier 2."""
    n = 10_000
    top = dict(gpu_seconds=MAX_REQUEST_GPU_SECONDS, audio_seconds=MAX_REQUEST_AUDIO_SECONDS,
               prompt_tokens=MAX_RECORD_COUNT, output_tokens=MAX_RECORD_COUNT)
    produce(kafka, [request(i, 1, **top) for i in range(n)] + [request(n, 9)])  # the last closes minute 1
    store = tmp_path / "tw.duckdb"
    if tier == "all":
        assert worker(kafka, store, tmp_path / "w.log", "--until-idle", "3").wait(timeout=180) == 0, \
            (tmp_path / "w.log").read_text()[-3000:]
    else:
        t1 = worker(kafka, tmp_path / "unused.duckdb", tmp_path / "t1.log", "--tier", "1", "--until-idle", "4")
        t2 = worker(kafka, store, tmp_path / "t2.log", "--tier", "2", "--until-idle", "4")
        assert t1.wait(timeout=180) == 0, (tmp_path / "t1.log").read_text()[-3000:]
        assert t2.wait(timeout=180) == 0, (tmp_path / "t2.log").read_text()[-3000:]
    got = rows(store, "SELECT requests, gpu_seconds, audio_seconds, prompt_tokens, output_tokens, successful_audio_ms "
                      "FROM sli_minute WHERE requests > 1")
    # References in Python integers; the doubles stored are exact at these magnitudes (< 2⁵³ · 2¹⁰).
    assert got == [(n, float(n * int(MAX_REQUEST_GPU_SECONDS)), float(n * int(MAX_REQUEST_AUDIO_SECONDS)),
                    n * MAX_RECORD_COUNT, n * MAX_RECORD_COUNT, n * int(MAX_REQUEST_AUDIO_SECONDS) * 1000)], got
    assert rows(store, "SELECT count(*) FROM dead_letter") == [(0,)]
