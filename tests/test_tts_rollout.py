"""A TTS canary judged on what its listeners hear and what each delivered minute costs: the
streams with an underrun and the cost per successful audio minute, from the producer's
records through topics in memory, a worker and its store to the rollout verdict."""

from __future__ import annotations

import duckdb
import pytest

from tailwatch.store.queries import query_frame
from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.signals.live import SignalPolicy
from tailwatch.signals.rollout import MinuteCounts, RolloutPolicy, VersionStats, underrun_verdict
from tailwatch.backtest import backtest_rollout, read_buckets, replay
from tests.test_pipeline import publish, run_worker

MODEL, CANARY = "voice-tts-2", "2.5"


def tts_run(kafka, tmp_path, scenario: str, seed: int, rate_scale: float = 3.0):
    sim = FleetSimulator(scenario, minutes=40, seed=seed, rate_scale=rate_scale)
    events = [e for e in sim.events() if isinstance(e, (RequestV1, GpuV1)) and e.model == MODEL]
    publish(kafka, events)
    path = tmp_path / "tw.duckdb"
    run_worker(kafka, path)
    return [e for e in events if isinstance(e, RequestV1)], path


@pytest.mark.slow
def test_a_stuttering_canary_is_rolled_back_on_underruns_alone(memory, tmp_path):
    requests, path = tts_run(memory, tmp_path, "tts-canary-underruns", seed=5)
    con = duckdb.connect(str(path), read_only=True)
    rows = query_frame(con, "SELECT model_version, sum(successful_audio_ms) audio_ms, "
                                  "sum(underrun_reported) reported, sum(underrun_streams) stuttered "
                                  "FROM sli_minute GROUP BY ALL")
    con.close()
    got = {r["model_version"]: (r["audio_ms"], r["reported"], r["stuttered"]) for r in rows.iter_rows(named=True)}
    # The store holds exactly what the producer sent: audio of ok attempts only, in whole milliseconds.
    want = {v: (sum(round(e.audio_seconds * 1000) for e in requests if e.model_version == v and e.status == "ok"
                    and e.audio_seconds is not None),
                sum(e.underruns is not None for e in requests if e.model_version == v),
                sum((e.underruns or 0) > 0 for e in requests if e.model_version == v)) for v in got}
    assert got == want and set(got) == {"2.4", CANARY}
    assert sum(e.audio_seconds or 0 for e in requests if e.status != "ok") > 0  # failed attempts did carry audio

    requests_frame, gpu = read_buckets(str(path))
    run = backtest_rollout(requests_frame, gpu, MODEL, CANARY)
    rolled = run.first("rollback")
    assert rolled is not None, [(s.minute, s.verdict, s.reason) for s in run.steps]
    assert rolled.decided_by == ("underruns",) and rolled.reason.startswith("streams with an underrun"), rolled
    assert "promote" not in {s.verdict for s in run.steps}


@pytest.mark.slow
def test_a_healthy_tts_canary_is_judged_per_successful_audio_minute_and_promoted(memory, tmp_path):
    _requests, path = tts_run(memory, tmp_path, "tts-canary-healthy", seed=6)
    requests_frame, gpu = read_buckets(str(path))
    policy = SignalPolicy(rollout=RolloutPolicy(promote_min_requests=1_000))
    verdicts = [snap.rollouts[(MODEL, CANARY)].body for _m, snap in replay(requests_frame, gpu, policy)
                if (MODEL, CANARY) in snap.rollouts]
    assert verdicts and not [v for v in verdicts if v.verdict in ("rollback", "pause")], \
        [(v.verdict, v.reasons) for v in verdicts if v.verdict in ("rollback", "pause")][:3]
    last = verdicts[-1]
    assert last.verdict == "promote", last.reasons
    assert last.canary.cost_unit == "per successful audio minute" and last.metrics["cost"].verdict == "pass"
    assert last.metrics["underruns"].verdict == "pass" and last.metrics["underruns"].canary_streams >= 500
    # The unit is the audio delivered: cost over the side's successful audio minutes.
    assert last.canary.cost_per_unit == pytest.approx(last.canary.gpu_cost / (last.canary.successful_audio_seconds / 60))


def minutes(reported: int, stuttered: int, n: int = 30) -> tuple[MinuteCounts, ...]:
    return tuple(MinuteCounts(m, reported, 0, 1.0, 0, 60.0, successful_audio_seconds=60.0, underrun_reported=reported,
                              underrun_streams=stuttered if m % 3 == 0 else 0) for m in range(n))


def side(version: str, per_minute: tuple[MinuteCounts, ...]) -> VersionStats:
    return VersionStats(version, sum(m.requests for m in per_minute), 0, 0, None, None, 30.0, 0, 1800.0,
                        per_minute=per_minute, successful_audio_seconds=1800.0)


def test_the_underrun_gate_needs_evidence_either_way():
    p = RolloutPolicy()
    stable = side("a", minutes(100, 3))  # 1% of streams stutter
    assert underrun_verdict(side("b", minutes(100, 3)), stable, p).verdict == "pass"
    assert underrun_verdict(side("b", minutes(100, 12)), stable, p).verdict == "rollback"  # 4x
    few = side("b", minutes(10, 0, n=5))  # 50 streams: no harm shown, and no pass either
    assert underrun_verdict(few, stable, p).verdict == "continue"
    silent = side("b", minutes(0, 0))  # the canary's streams never reported
    assert underrun_verdict(silent, stable, p).verdict == "continue"
    assert underrun_verdict(stable, side("b", minutes(0, 0)), p) is None  # stable never reported: not judged
