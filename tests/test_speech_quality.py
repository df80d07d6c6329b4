"""Language and voice slices and the speech and LLM quality fields, from the producer's record
to the store and the SLO engine, through topics in memory and a worker, checked against what
the simulator sent; hostile values are dead letters naming the field. (The dashboards test
reads every quality panel from a real Prometheus scraping the worker.)"""

from __future__ import annotations

from collections import Counter

import duckdb
import msgspec
from tailwatch.store.queries import query_frame
from tailwatch.ingest.schema import RequestV1
from tailwatch_dev.simulator import TENANTS, FleetSimulator
from tailwatch.ingest.validate import BatchDecoder
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.frames import REQUEST_COLUMNS, records_to_frame
from tailwatch.streams.slo_stage import SloStage
from tests.test_pipeline import publish, run_worker
from tailwatch.streams.store_sink import StoreSink

TENANT_QUOTA_SLOS = DEFAULT_SLOS.parent / "examples" / "tenant-quota.yaml"
BASE = {"schema": "request.v1", "event_id": "e1", "ts": 1_767_225_600_000, "tenant": "acme", "model": "tts-1",
        "workload": "tts", "status": "ok"}


def decode(**fields):
    enc = msgspec.json.Encoder()
    return BatchDecoder(RequestV1).decode([enc.encode({**BASE, **fields})])


def test_quality_fields_decode_and_hostile_values_are_dead_letters_naming_the_field():
    ok = decode(language="en-US", voice="premium-2", underruns=2, voice_cache_hit=False, fallback="voice",
                status_reason="rate_limit", partial_revisions=3, endpointing_error=True, finalization_ms=210.5,
                cached_prompt_tokens=100, draft_tokens=50, accepted_tokens=40)
    assert not ok.rejected and ok.records[0].voice == "premium-2"
    frame, _ = records_to_frame(ok.records, REQUEST_COLUMNS, [0], [0], ok.indices)
    assert frame["language"].to_list() == ["en-us"]  # BCP 47 is case-insensitive: one slice
    for field, value in [("language", "english please"), ("language", "x" * 200), ("language", "en-US-x-private-extra"),
                         ("voice", "Jane Doe"), ("voice", "v" * 60), ("voice", "a\nb"), ("status_reason", "because"),
                         ("underruns", -1), ("fallback", "human"), ("finalization_ms", 2e9),
                         ("voice_cache_hit", "yes"), ("cached_prompt_tokens", 10**13)]:
        bad = decode(**{field: value})
        assert not bad.records and len(bad.rejected) == 1, (field, value)
        assert field in bad.rejected[0].detail, (field, value, bad.rejected[0].detail)


def test_language_voice_and_quality_counts_reach_the_store_and_the_slos(memory, tmp_path):
    sim = FleetSimulator("mixed-fleet", minutes=12, seed=4, rate_scale=0.4)
    events = [e for e in sim.events() if isinstance(e, RequestV1)]
    publish(memory, events)
    store_path = tmp_path / "tw.duckdb"
    w = run_worker(memory, store_path, slos=load_slos(DEFAULT_SLOS) + load_slos(TENANT_QUOTA_SLOS))

    con = duckdb.connect(str(store_path), read_only=True)
    frame = query_frame(con,
        "SELECT workload, language, voice, sum(requests) requests, sum(underrun_reported) underrun_reported, "
        "sum(underrun_streams) underrun_streams, sum(voice_cache_hits) hits, sum(voice_cache_lookups) lookups, "
        "sum(endpointing_errors) ep_err, sum(endpointing_reported) ep_n, sum(partial_revisions) revisions, "
        "sum(rejected_quota) quota, sum(ooms) ooms, sum(cached_prompt_tokens) cached, sum(accepted_tokens) accepted, "
        "sum(draft_tokens) drafted, sum(fallbacks) fallbacks FROM sli_minute GROUP BY ALL")
    got = {(r["workload"], r["language"], r["voice"]): r for r in frame.iter_rows(named=True)}
    want = Counter((e.workload, e.language, e.voice) for e in events)
    assert {k: r["requests"] for k, r in got.items()} == dict(want)
    assert {k[1] for k in want if k[0] == "asr"} == {"en-us", "es-es", "de-de", "ja-jp"}

    def total(column: str) -> int:
        return sum(r[column] for r in got.values())

    assert total("underrun_reported") == sum(e.underruns is not None for e in events) > 0
    assert total("underrun_streams") == sum(bool(e.underruns) for e in events)
    assert total("hits") == sum(bool(e.voice_cache_hit) for e in events)
    assert total("lookups") == sum(e.voice_cache_hit is not None for e in events)
    assert total("ep_err") == sum(bool(e.endpointing_error) for e in events)
    assert total("ep_n") == sum(e.endpointing_error is not None for e in events) > 0
    assert total("revisions") == sum(e.partial_revisions or 0 for e in events)
    assert total("quota") == sum(e.status_reason == "quota" for e in events) > 0
    assert total("ooms") == sum(e.status_reason == "oom" for e in events)
    assert total("cached") == sum(e.cached_prompt_tokens or 0 for e in events) > 0
    assert total("accepted") == sum(e.accepted_tokens or 0 for e in events)
    assert total("drafted") == sum(e.draft_tokens or 0 for e in events)
    assert total("fallbacks") == sum(e.fallback is not None for e in events)

    # The speech SLOs slice by language and voice; their windows hold exactly the reported events.
    slo = next(s for s in w.sink(StoreSink).stages if isinstance(s, SloStage))
    underrun = {tuple(sorted(v.labels.items())): v for v in slo.states() if v.spec.name == "tts-realtime-underrun-free"}
    assert {dict(k)["voice"] for k in underrun} == {"neutral", "premium-1", "premium-2"}
    good = sum(v.sums(v.spec.period_minutes)[0] for v in underrun.values())
    valid = sum(v.sums(v.spec.period_minutes)[1] for v in underrun.values())
    assert (good, valid) == (total("underrun_reported") - total("underrun_streams"), total("underrun_reported"))
    # First audio per voice tier: each voice's slices hold exactly its answered realtime TTS requests.
    first_audio = [v for v in slo.states() if v.spec.name == "tts-realtime-first-audio"]
    for voice in ("neutral", "premium-1", "premium-2"):
        valid = sum(v.sums(v.spec.period_minutes)[1] for v in first_audio if v.labels["voice"] == voice)
        good = sum(v.sums(v.spec.period_minutes)[0] for v in first_audio if v.labels["voice"] == voice)
        sent = [e for e in events if e.workload == "tts" and e.traffic_class == "realtime" and e.voice == voice
                and e.first_output_ms is not None]
        assert valid == len(sent) > 0 and good == sum(e.first_output_ms <= 450 for e in sent), voice
    endpointing = [v for v in slo.states() if v.spec.name == "asr-realtime-endpointing"]
    assert {v.labels["language"] for v in endpointing} == {"en-us", "es-es", "de-de", "ja-jp"}
    assert con.execute("SELECT count(DISTINCT slice) FROM slo_status WHERE slo = 'asr-realtime-endpointing'").fetchone()[0] \
        == len(endpointing)
    # Quota refusals are not availability failures: the LLM availability SLO's valid events leave them out.
    llm = [v for v in slo.states() if v.spec.name == "llm-realtime-availability"]
    llm_valid = sum(v.sums(v.spec.period_minutes)[1] for v in llm)
    realtime_llm = [e for e in events if e.workload == "llm" and e.traffic_class == "realtime"]
    assert llm_valid == sum(e.status not in ("cancelled",) and e.status_reason != "quota" for e in realtime_llm)
    # ...and the quota SLO counts exactly them, per tenant: its error ratio is the tenant's rejection rate.
    quota = {v.labels["tenant"]: v.sums(v.spec.period_minutes) for v in slo.states()
             if v.spec.name == "llm-tenant-quota-admission"}
    llm = [e for e in events if e.workload == "llm"]
    assert set(quota) == {e.tenant for e in llm}
    for tenant, (good, valid) in quota.items():
        attempts = [e for e in llm if e.tenant == tenant and e.status != "cancelled"]
        refused = sum(e.status_reason in ("quota", "rate_limit") for e in attempts)
        assert (good, valid) == (len(attempts) - refused, len(attempts)), tenant
        assert (refused > 0) == (tenant == TENANTS[0]), tenant  # the simulator's biggest tenant alone runs over
    con.close()
