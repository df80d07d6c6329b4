"""Sampled evaluations (eval.v1) from the producer's record to the store, the WER SLO and the
rollout gate by language slice, through the real broker and a worker; hostile evaluations are
dead letters with a reason, and an evaluation never counts as a request."""

from __future__ import annotations

import duckdb
import msgspec
import pytest

from tailwatch.store.queries import query_frame
from tailwatch.conventions import CORRECTED_EVENTS_TOTAL
from tailwatch.ingest.schema import EvalV1, RequestV1
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.ingest.validate import BatchDecoder, INVALID_VALUE, UNKNOWN_SCHEMA
from tailwatch.signals.live import SignalPolicy
from tailwatch.signals.rollout import RolloutPolicy
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.frames import REQUEST_COLUMNS, records_to_frame
from tailwatch.streams.slo_stage import SloStage
from tailwatch.streams.minute_windows import MinuteWindows
from tailwatch.backtest import backtest_rollout, read_buckets
from tests.test_pipeline import publish, run_worker
from tailwatch.streams.store_sink import StoreSink

TS = 1_767_225_600_000
REQUEST = {"schema": "request.v1", "event_id": "r1", "ts": TS, "tenant": "acme", "model": "asr-1", "workload": "asr",
           "status": "ok", "language": "de-DE"}
EVAL = {"schema": "eval.v1", "event_id": "r1", "ts": TS, "tenant": "acme", "model": "asr-1", "workload": "asr",
        "language": "de-DE", "word_errors": 3, "reference_words": 40}
ENC = msgspec.json.Encoder()
DECODER = BatchDecoder(RequestV1, also=(EvalV1,))


def test_evaluations_share_the_requests_topic_and_hostile_ones_are_dead_letters():
    values = [ENC.encode(REQUEST), ENC.encode(EVAL), ENC.encode({**EVAL, "event_id": "e2", "mos": 4.1, "extra": [1]}),
              ENC.encode({**EVAL, "event_id": "e3", "reference_words": None}),
              ENC.encode({**EVAL, "event_id": "e4", "word_errors": None, "reference_words": None}),
              ENC.encode({**EVAL, "event_id": "e5", "mos": 7}), ENC.encode({**EVAL, "event_id": "e6", "word_errors": -1}),
              ENC.encode({**EVAL, "event_id": "e7", "language": "any text at all"}),
              ENC.encode({**EVAL, "schema": "eval.v9"})]
    out = DECODER.decode(values)
    assert out.indices == [0, 1, 2] and [type(r).__name__.removesuffix("Strict") for r in out.records] == ["RequestV1", "EvalV1", "EvalV1"]
    assert all(isinstance(r, EvalV1) for r in out.records[1:])
    assert out.unknown_fields_dropped == 1
    reasons = {r.index: (r.reason, r.detail) for r in out.rejected}
    assert sorted(reasons) == [3, 4, 5, 6, 7, 8]  # each once, with a reason
    assert reasons[3] == (INVALID_VALUE, "`word_errors` and `reference_words` come together")
    assert reasons[4][0] == INVALID_VALUE and "mos" in reasons[4][1]
    assert "mos" in reasons[5][1] and "word_errors" in reasons[6][1] and "language" in reasons[7][1]
    assert reasons[8][0] == UNKNOWN_SCHEMA
    # The request and the evaluation that scored it (the same id: a scorer may reuse it) both
    # count, in one slice-minute; the evaluation is no request.
    frame, _ = records_to_frame(out.records, REQUEST_COLUMNS, [0] * len(values), list(range(len(values))), out.indices)
    windows = MinuteWindows(REQUESTS, 0, 1000)
    assert windows.add(frame).duplicates == 0
    again, _ = records_to_frame(out.records, REQUEST_COLUMNS, [0] * len(values), list(range(len(values))), out.indices)
    assert windows.add(again).duplicates == 3  # a redelivery is a duplicate, evaluations included
    closed, _ = windows.close(None)
    (row,) = closed.to_dicts()
    assert (row["requests"], row["evals"], row["word_errors"], row["reference_words"], row["mos_samples"],
            row["mos_milli"], row["language"]) == (1, 2, 6, 80, 1, 4100, "de-de")


@pytest.fixture(scope="module")
def regression_run(new_memory, tmp_path_factory):
    """40 minutes of the ASR fleet with 30% of answers scored: the canary is better in every
    language but German (scenario asr-canary-language-regression)."""
    kafka = new_memory()
    sim = FleetSimulator("asr-canary-language-regression", minutes=40, seed=5, eval_share=0.3)
    events = [e for e in sim.events() if isinstance(e, (RequestV1, EvalV1)) and e.workload == "asr"]
    publish(kafka, events)
    path = tmp_path_factory.mktemp("evals") / "tw.duckdb"
    worker = run_worker(kafka, path, slos=load_slos(DEFAULT_SLOS))
    return sim, events, path, worker


def test_evaluations_reach_the_store_exactly_and_feed_the_wer_slo(regression_run):
    sim, events, path, worker = regression_run
    con = duckdb.connect(str(path), read_only=True)
    rows = query_frame(con, "SELECT model_version, language, sum(requests) requests, sum(evals) evals, "
                                  "sum(word_errors) word_errors, sum(reference_words) words FROM sli_minute GROUP BY ALL")
    con.close()
    got = {(r["model_version"], r["language"]): [r["evals"], r["word_errors"], r["words"]]
           for r in rows.iter_rows(named=True) if r["evals"]}
    assert got == sim.totals.evaluations and len(got) == 8
    assert rows["requests"].sum() == sum(isinstance(e, RequestV1) for e in events)  # evaluations are no requests
    slo = next(s for s in worker.sink(StoreSink).stages if isinstance(s, SloStage))
    wer = {(v.labels["language"], v.labels["model_version"]): v for v in slo.states() if v.spec.name == "asr-wer"}
    assert set(wer) == set((lang, version) for version, lang in got)
    for (lang, version), view in wer.items():
        good, valid = view.sums(view.spec.period_minutes)
        evals, errors, words = got[(version, lang)]
        assert valid == words and good == words - errors, (lang, version)  # WER as a ratio of sums


def test_the_canary_is_rolled_back_for_the_one_language_it_regresses(regression_run):
    sim, _events, path, _worker = regression_run
    requests, gpu = read_buckets(str(path))
    run = backtest_rollout(requests, gpu, "whisper-large-v3", "v3.2")
    rolled = run.first("rollback")
    assert rolled is not None, [(s.minute, s.verdict, s.reason) for s in run.steps]
    assert rolled.decided_by == ("wer",) and rolled.reason.startswith("WER on de-de"), rolled
    totals = {v: [0, 0] for v in ("v3.1", "v3.2")}
    for (version, _lang), (_n, errors, words) in sim.totals.evaluations.items():
        totals[version][0] += errors
        totals[version][1] += words
    assert totals["v3.2"][0] / totals["v3.2"][1] < totals["v3.1"][0] / totals["v3.1"][1]  # better globally
    assert "promote" not in {s.verdict for s in run.steps}


@pytest.mark.slow
def test_a_canary_better_in_every_language_goes_on_to_promotion(memory, tmp_path):
    kafka = memory
    sim = FleetSimulator("asr-canary-better", minutes=40, seed=6, eval_share=1.0, rate_scale=1.6)
    publish(kafka, [e for e in sim.events() if isinstance(e, (RequestV1, EvalV1)) and e.workload == "asr"])
    run_worker(kafka, tmp_path / "tw.duckdb")
    requests, gpu = read_buckets(str(tmp_path / "tw.duckdb"))
    # 10% of the ASR fleet at night, at 1.6x the simulator's rate and every answer scored:
    # about 2,600 canary requests in the 30-minute window, enough to have shown a canary erring
    # enough to page on its own and a language 1.5x worse (1,600 were not).
    run = backtest_rollout(requests, gpu, "whisper-large-v3", "v3.2",
                           SignalPolicy(rollout=RolloutPolicy(promote_min_requests=1_000)))
    assert not [s for s in run.steps if s.verdict in ("rollback", "pause")], run.steps
    assert run.steps[-1].verdict == "promote", run.steps[-1]


def test_the_readiness_report_shows_wer_by_language_and_version_and_the_rollback(regression_run):
    from tailwatch.planning.prices import GpuPrices
    from tailwatch.reports.readiness import CanaryHistory, build_readiness

    sim, _events, path, _worker = regression_run
    requests, gpu = read_buckets(str(path))
    run = backtest_rollout(requests, gpu, "whisper-large-v3", "v3.2")
    report = build_readiness("whisper-large-v3", requests, gpu, load_slos(DEFAULT_SLOS), GpuPrices(),
                             [CanaryHistory("v3.2", run.story())], queue_age_slo_ms=1000)
    table = {(r["language"], r["model_version"]): r for r in
             report.quality["language and model_version (sampled evaluations)"]}
    assert {k: [r["evals"], r["word_errors"], r["reference_words"]] for k, r in table.items()} == \
        {(lang, version): v for (version, lang), v in sim.totals.evaluations.items()}
    assert table[("de-de", "v3.2")]["wer"] > table[("de-de", "v3.1")]["wer"]
    assert table[("en-us", "v3.2")]["wer"] < table[("en-us", "v3.1")]["wer"]
    assert report.verdict == "blocked" and any("v3.2" in f.what and "de-de" in f.what for f in report.findings), \
        report.findings


def test_scores_that_arrive_after_their_minutes_closed_are_merged_into_them(memory, tmp_path):
    """A scorer runs behind: the requests are read and their minutes closed, then their
    evaluations arrive (a late backlog on the same topic). Each is merged into its request's
    closed slice-minute, as a correction; nothing is dead-lettered, no request count moves,
    no slice-minute is doubled, and a redelivery of the backlog changes nothing."""
    kafka = memory
    sim = FleetSimulator("asr-canary-language-regression", minutes=12, seed=8, eval_share=0.3)
    events = [e for e in sim.events() if isinstance(e, (RequestV1, EvalV1)) and e.workload == "asr"]
    requests = [e for e in events if isinstance(e, RequestV1)]
    scores = [e for e in events if isinstance(e, EvalV1)]
    path = tmp_path / "tw.duckdb"
    publish(kafka, requests)
    run_worker(kafka, path)

    def table():
        con = duckdb.connect(str(path), read_only=True)
        try:
            return query_frame(con, "SELECT * FROM sli_minute ORDER BY ALL")
        finally:
            con.close()

    before = table()
    assert before["evals"].sum() == 0 and before["requests"].sum() == len(requests)
    publish(kafka, scores)
    late = run_worker(kafka, path)
    corrected = late.metrics.registry.get_sample_value(CORRECTED_EVENTS_TOTAL,
                                                         {"topic": kafka.topic("requests")})
    assert corrected == len(scores)  # every score was a correction of a closed minute
    after = table()
    got = {}
    for r in after.filter(after["evals"] > 0).iter_rows(named=True):
        row = got.setdefault((r["model_version"], r["language"]), [0, 0, 0])
        row[0] += r["evals"]
        row[1] += r["word_errors"]
        row[2] += r["reference_words"]
    assert got == sim.totals.evaluations
    assert after["requests"].sum() == len(requests)
    keys = ["window_start", "tenant", "model", "model_version", "zone", "workload", "traffic_class", "deployment",
            "pool", "language", "voice"]
    assert after.select(keys).unique().height == after.height  # merged into its row, not a second one
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT count(*) FROM dead_letter").fetchone()[0] == 0
    con.close()
    publish(kafka, scores)  # the scorer's backlog redelivered
    run_worker(kafka, path)
    assert table().equals(after)
