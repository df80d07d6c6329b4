"""Latency as users feel it: inter-token latency, stream completion, stage budgets
and the stage plan, on the simulator's `streaming` scenario (a decode slowdown in one zone,
streams cut behind HTTP 200 in another, TTS first audio slowing in every s2s pool)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import datetime, timezone

import msgspec
import numpy as np
import polars as pl
import pytest

from tailwatch.ingest.schema import RequestV1
from tailwatch_dev.simulator import FleetSimulator, parse_start
from tailwatch.signals.rollout import MinuteCounts, VersionStats, verdict
from tailwatch.slo import histogram
from tailwatch.slo.sli import SloEvaluator
from tailwatch.slo.spec import DEFAULT_SLOS, SpecErrors, load_slos
from tailwatch.slo.turn_phases import phase_latency
from tailwatch.store.connection import connect
from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.frames import REQUEST_COLUMNS
from tests.h100_lab import buckets

START_MINUTE = parse_start("2026-11-02T00:00:00Z") // 60_000


@pytest.fixture(scope="module")
def streaming_buckets() -> pl.DataFrame:
    sim = FleetSimulator("streaming", minutes=120, rate_scale=0.3, gpu_samples_per_minute=1)
    values = [msgspec.json.encode(e) for e in sim.events() if isinstance(e, RequestV1)]
    return buckets(values, RequestV1, REQUEST_COLUMNS, REQUESTS).sort("window_start")


@pytest.fixture(scope="module")
def pages(streaming_buckets) -> list:
    """Every firing change of the default SLOs, with its minute from the scenario's start."""
    changes = SloEvaluator(load_slos(DEFAULT_SLOS)).feed(streaming_buckets).changes
    return [(c.at_minute - START_MINUTE, c) for c in changes if c.state == "firing"]


def _minute(rows: pl.DataFrame) -> pl.Expr:
    return (pl.col("window_start").dt.epoch("s") // 60 - START_MINUTE).alias("m")


def test_inter_token_quantiles_are_within_the_sketch_accuracy_of_exact_values():
    # Per-answer mean gaps as a real decode produces them: a body near 25 ms, a tail from
    # long prompts and preemptions, and the odd zero (a one-token answer's gap).
    rng = np.random.default_rng(15)
    itl = np.concatenate([rng.lognormal(math.log(25), 0.35, 4000), rng.pareto(2.5, 300) * 80 + 60, np.zeros(5)])
    values = [msgspec.json.encode({"schema": "request.v1", "event_id": f"i{i}", "ts": 1_793_577_600_000 + i,
                                   "tenant": "t", "model": "m", "workload": "llm", "status": "ok",
                                   "inter_token_ms": round(float(v), 3)}) for i, v in enumerate(itl)]
    rows = buckets(values, RequestV1, REQUEST_COLUMNS, REQUESTS)
    assert rows.height == 1
    exact = np.sort(np.round(itl, 3))
    for q in (0.5, 0.95, 0.99):
        want = float(exact[math.floor(q * (len(exact) - 1))])
        got = rows[f"inter_token_ms_p{round(q * 100)}"][0]
        assert abs(got - want) <= histogram.RELATIVE_ACCURACY * want + 1e-9, (q, got, want)
    assert sum(h["n"] for h in rows["inter_token_ms_hist"][0]) == len(itl)


@pytest.mark.slow
def test_an_inter_token_slo_pages_on_a_decode_slowdown_while_first_token_stays_healthy(pages):
    itl = [(m, c) for m, c in pages if c.slo == "llm-realtime-inter-token"]
    assert any(c.severity == "page" and c.labels["zone"] == "us-east-1a" and 30 <= m < 80 for m, c in itl), itl
    assert all(c.labels["zone"] == "us-east-1a" for _, c in itl if c.severity == "page")
    # The first token never slowed: its SLO says nothing in the zone whose decode did.
    assert not [c for _, c in pages if c.slo == "llm-realtime-first-token" and c.labels.get("zone") == "us-east-1a"]


def test_rollout_rolls_back_a_canary_that_decodes_slowly_with_a_healthy_first_token():
    rng = np.random.default_rng(4)

    def side(version: str, itl_factor: float) -> VersionStats:
        minutes = []
        for m in range(20):
            fo = histogram.from_values(rng.lognormal(math.log(400), 0.3, 150))
            itl = histogram.from_values(rng.lognormal(math.log(25 * itl_factor), 0.3, 150))
            minutes.append(MinuteCounts(m, 150, 0, 1.5, 30_000, 0.0, fo, None, itl))
        merged = lambda name: histogram.merge(getattr(x, name) for x in minutes)  # noqa: E731
        return VersionStats(version, 3000, 0, 0, histogram.quantile_ms(merged("first_output_hist"), 0.99), None,
                            30.0, 600_000, 0.0, per_minute=tuple(minutes), first_output_hist=merged("first_output_hist"),
                            inter_token_p99_ms=histogram.quantile_ms(merged("inter_token_hist"), 0.99),
                            inter_token_hist=merged("inter_token_hist"))

    v = verdict(side("canary", 2.5), side("stable", 1.0), window_minutes=20)
    assert v.verdict == "rollback" and v.decided_by == ["inter_token"], (v.verdict, v.reasons)
    assert v.metrics["first_output"]["verdict"] == "pass"
    assert "inter-token" in v.reasons[0]
    same = verdict(side("canary", 1.0), side("stable", 1.0), window_minutes=20)
    assert same.metrics["inter_token"]["verdict"] == "pass"


@pytest.mark.slow
def test_stream_completion_drops_where_the_server_cuts_streams(streaming_buckets, pages):
    llm = streaming_buckets.filter((pl.col("workload") == "llm") & (pl.col("traffic_class") == "realtime"))
    per = llm.with_columns(_minute(llm)).group_by("zone", pl.col("m").is_between(40, 69).alias("cutting")).agg(
        (pl.col("streams_completed").sum() / (pl.col("streams") - pl.col("streams_cancelled")).sum()).alias("ratio"),
        pl.col("streams_cut").sum())
    ratio = {(z, c): r for z, c, r, _ in per.iter_rows()}
    assert 0.75 < ratio[("us-east-1b", True)] < 0.85  # a fifth of answered streams cut, HTTP 200 all the same
    assert ratio[("us-east-1b", False)] > 0.995 and ratio[("us-east-1a", True)] > 0.995
    completion = [(m, c) for m, c in pages if c.slo == "llm-realtime-stream-completion" and c.severity == "page"]
    assert completion and all(c.labels["zone"] == "us-east-1b" and 40 <= m < 75 for m, c in completion), completion


@pytest.mark.slow
def test_a_stage_budget_page_names_the_stage_that_overspent(streaming_buckets, pages):
    stage_pages = [(m, c) for m, c in pages if c.slo == "s2s-realtime-turn-stages" and c.severity == "page"]
    assert {c.labels["zone"] for _, c in stage_pages} == {"us-east-1a", "us-east-1b", "us-east-1c"}
    assert all(m >= 50 for m, _ in stage_pages)  # nothing before TTS slowed
    assert all(c.detail.startswith("tts_first_audio overspent its 350 ms share") for _, c in stage_pages), stage_pages
    # The stage histograms show why: TTS first audio six times slower, the others unchanged.
    s2s = streaming_buckets.filter(pl.col("workload") == "s2s")
    s2s = s2s.with_columns(_minute(s2s))
    before = {r["stage"]: r for r in phase_latency(s2s.filter(pl.col("m") < 50)).iter_rows(named=True)}
    during = {r["stage"]: r for r in phase_latency(s2s.filter(pl.col("m").is_between(55, 109))).iter_rows(named=True)}
    assert 5.0 < during["tts_first_audio"]["p50_ms"] / before["tts_first_audio"]["p50_ms"] < 7.2
    assert 0.85 < during["asr_final"]["p50_ms"] / before["asr_final"]["p50_ms"] < 1.15
    assert list(before) == ["vad", "asr_final", "retrieval", "llm_first_token", "llm_decode", "tts_first_audio", "playback"]


def test_stage_budgets_that_overspend_the_target_are_refused(tmp_path):
    bad = tmp_path / "slos.yaml"
    bad.write_text("slos:\n  - name: s\n    objective: 99%\n    sli: {stage_budget: {threshold: 1s, budgets: "
                   "{vad: 800ms, tts_first_audio: 400ms}}}\n")
    with pytest.raises(SpecErrors, match="add up to 1200 ms, more than the turn's target of 1000 ms"):
        load_slos(bad)


@pytest.fixture(scope="module")
def stage_store(streaming_buckets, tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "tw.duckdb"
    con = connect(path)
    con.register("rows", streaming_buckets.to_arrow())
    con.execute("INSERT INTO sli_minute BY NAME SELECT * FROM rows")
    con.close()
    return path


def _plan(store_path, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailwatch", "plan", "stages", "--store", str(store_path), *flags],
                          capture_output=True, text=True)


def _at(minute: int) -> str:
    return datetime.fromtimestamp((START_MINUTE + minute) * 60, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.slow
def test_plan_stages_names_the_bottleneck_from_the_store_and_plans_greedily(stage_store):
    calm = _plan(stage_store, "--to", _at(45), "--json")
    assert calm.returncode == 0, calm.stderr
    calm = json.loads(calm.stdout)
    # Calm: a single-threaded CPU retrieval worker (40 ms a turn) is the shortest line, not TTS.
    assert calm["bottleneck"]["stage"] == "retrieval" and calm["left_out"] == ["playback"]
    slow = _plan(stage_store, "--from", _at(60), "--target-rps", "20", "--json")
    plan = json.loads(slow.stdout)
    assert plan["bottleneck"]["stage"] == "tts_first_audio"
    stages = {s["stage"]: s for s in plan["plan"]["stages"]}
    assert plan["plan"]["met"] and plan["plan"]["throughput_rps"] >= 20
    # TTS got the most workers: it is the stage that limits the turn now.
    assert max(stages.values(), key=lambda s: s["workers"])["stage"] == "tts_first_audio"
    assert all(s["capacity_rps"] * 0.8 >= 20 - 1e-6 for s in stages.values())
    # The same target on a budget that cannot pay for it: stopped honestly, not over budget.
    tight = json.loads(_plan(stage_store, "--from", _at(60), "--target-rps", "20", "--budget-per-hour", "11.5",
                             "--json").stdout)["plan"]
    assert not tight["met"] and tight["stopped_by"] == "budget" and tight["usd_per_hour"] <= 11.5
    assert tight["throughput_rps"] < 20 and "more than the $11.50/h budget" in tight["working"][-1]
    table = _plan(stage_store, "--from", _at(60), "--target-rps", "20")
    assert "bottleneck: tts_first_audio" in table.stdout and "met (target met)" in table.stdout


@pytest.mark.slow
def test_plan_stages_says_plainly_when_the_store_has_no_stage_timings(stage_store):
    r = _plan(stage_store, "--workload", "asr")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no stage timings for workload 'asr'" in r.stderr


def test_inter_token_quantiles_of_a_real_h100_run_match_its_exact_values():
    """Traffic nobody here generated: the H100 lab's answers (vLLM, one GPU) and their own
    inter-token latency, merged over every slice-minute, against the exact rank values."""
    from tests.h100_lab import lab_dir, lab_sli_minute, lines

    exact = np.sort([v for v in (json.loads(line).get("inter_token_ms") for line in lines(lab_dir() / "requests.jsonl"))
                     if v is not None])
    assert len(exact) == 271  # the answered requests; the 361 shed ones have no tokens
    merged = histogram.merge({h["bin"]: h["n"] for h in hs} for hs in lab_sli_minute()["inter_token_ms_hist"].to_list())
    assert sum(merged.values()) == len(exact)
    for q in (0.5, 0.95, 0.99):
        want = float(exact[math.floor(q * (len(exact) - 1))])
        assert abs(histogram.quantile_ms(merged, q) - want) <= histogram.RELATIVE_ACCURACY * want + 1e-9, q


def test_the_overspent_phase_of_phases_alike_is_the_first_in_the_cascade():
    """Two phases over their budgets in the same share of samples: the page names the one the
    turn reaches first, whatever order the group-by gave the spends in."""
    from tailwatch.slo.turn_phases import PhaseSpend, most_overspent

    asr = PhaseSpend("asr_final", 350.0, 2, 103)
    llm = PhaseSpend("llm_first_token", 550.0, 2, 103)
    assert most_overspent([asr, llm]) == most_overspent([llm, asr]) == asr
    assert most_overspent([asr, PhaseSpend("tts_first_audio", 350.0, 3, 103)]).phase == "tts_first_audio"
