"""A Collector that goes silent for 15 minutes and then flushes its backlog, through topics in
memory and a live worker: every request ends in `sli_minute`, the SLO budgets equal the
truth, and nothing is dead-lettered. Requests from a public
trace (Azure LLM inference, tests/data/azure-llm-2023)."""

from collections import Counter
from pathlib import Path

import duckdb
import msgspec
import numpy as np
import pytest

from tailwatch_dev.simulator import ZONES
from tailwatch_dev.trace import TraceReplay
from tailwatch.slo.engine import error_budget_remaining
from tailwatch.slo.spec import load_slos
from tailwatch.streams.runtime import Runtime
from tailwatch.streams.slo_stage import SloStage
from tests.test_faults import produce, run_live, worker
from tailwatch.streams.store_sink import StoreSink

TRACE = Path(__file__).parent / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
DEFAULT_SLOS = Path(__file__).parents[1] / "tailwatch" / "slo" / "defaults.yaml"
ORDER = "window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool, language, voice"
MINUTES = 40
SILENT = (10, 25)  # the Collector of one zone sends nothing in these minutes, then all of it at once


def trace_requests():
    replay = TraceReplay(TRACE, minutes=MINUTES, seed=3)
    events = list(replay.events())
    start = replay.start_ms
    minute_of = lambda e: (e.ts - start) // 60_000  # noqa: E731
    silent_zone = ZONES[1]
    # The silent Collector's zone had a bad quarter of an hour: a fifth of its requests failed.
    out = []
    for i, e in enumerate(events):
        if e.zone == silent_zone and SILENT[0] <= minute_of(e) < SILENT[1] and i % 5 == 0:
            e = msgspec.structs.replace(e, status="error", http_status=503, task_success=False, first_output_ms=None)
        out.append(e)
    return out, start, silent_zone, minute_of


def slo_stage(w: Runtime) -> SloStage:
    return next(s for s in w.sink(StoreSink).stages if isinstance(s, SloStage))


def frontier(w: Runtime) -> int | None:
    return next(iter(w.operator.inputs.values())).windows.closed_before_minute


@pytest.mark.slow
def test_a_collector_silent_for_15_minutes_then_flushing_loses_nothing(memory, tmp_path):
    events, start, silent_zone, minute_of = trace_requests()
    enc = msgspec.json.Encoder()
    from_silent = lambda e: e.zone == silent_zone  # noqa: E731
    before = [(1 if from_silent(e) else 0, enc.encode(e)) for e in events
              if not (from_silent(e) and minute_of(e) >= SILENT[0])]
    backlog = [(1, enc.encode(e)) for e in events if from_silent(e) and minute_of(e) >= SILENT[0]]
    produce(memory, before)
    store_path = tmp_path / "tw.duckdb"
    slos = load_slos(DEFAULT_SLOS)
    start_minute = start // 60_000
    state = {"sent": False}

    def flushed_and_corrected(w: Runtime) -> bool:
        cut = frontier(w)
        if not state["sent"]:
            if cut is not None and cut >= start_minute + MINUTES - 6:  # the silent minutes are closed
                state["closed_at_flush"] = cut
                produce(memory, backlog)
                state["sent"] = True
            return False
        return w.operator.events_corrected >= sum(
            1 for e in events if from_silent(e) and SILENT[0] <= minute_of(e) and e.ts // 60_000 < state["closed_at_flush"])

    w = run_live(memory, store_path, flushed_and_corrected, timeout_s=90.0, slos=slos, idle_timeout_s=60.0)
    assert state["sent"], "the silent Collector's minutes never closed"
    corrected = w.operator.events_corrected
    assert corrected > 1000, corrected
    # The live SLO engine's 30-day budgets, corrected: the truth over the minutes it has closed.
    closed_before = frontier(w)
    table = slo_stage(w).evaluator.tables["llm-realtime-availability"]
    truth_valid, truth_bad = Counter(), Counter()
    for e in events:
        if e.ts // 60_000 < closed_before:
            truth_valid[(e.zone, e.model_version)] += 1
            truth_bad[(e.zone, e.model_version)] += e.status != "ok"
    views = {tuple(v.labels[k] for k in ("zone", "model_version")): v for v in slo_stage(w).states()
             if v.spec.name == "llm-realtime-availability"}
    assert set(views) == set(truth_valid)
    for key, view in views.items():
        expect = error_budget_remaining(np.array([truth_bad[key]]), np.array([truth_valid[key]]), table.spec.objective)[0]
        assert abs(view.budget_remaining() - expect) < 1e-9, (key, view.budget_remaining(), expect)
    assert views[(silent_zone, events[0].model_version)].budget_remaining() < 0  # the backlog's failures count

    # A restart drains the rest (minutes still open) from its checkpoint.
    w2 = worker(memory, store_path, until_idle_s=2.0, slos=slos, idle_timeout_s=60.0)
    assert w2.run() == 0
    con = duckdb.connect(str(store_path), read_only=True)
    assert con.execute("SELECT count(*) FROM dead_letter").fetchone()[0] == 0
    per_minute_zone = Counter((e.ts // 60_000 * 60, e.zone) for e in events)
    errors = Counter((e.ts // 60_000 * 60, e.zone) for e in events if e.status != "ok")
    got = {(int(t), z): (n, err) for t, z, n, err in con.execute(
        "SELECT epoch(window_start), zone, sum(requests), sum(errors) FROM sli_minute GROUP BY ALL").fetchall()}
    assert got == {k: (n, errors[k]) for k, n in per_minute_zone.items()}
    dup = con.execute("""SELECT count(*) FROM (SELECT window_start, tenant, model, model_version, zone, workload,
                         traffic_class, deployment, pool, language, voice, count(*) c FROM sli_minute GROUP BY ALL HAVING c > 1)""").fetchone()[0]
    assert dup == 0
    live = con.execute(f"SELECT * FROM sli_minute ORDER BY {ORDER}").fetchall()
    con.close()

    # A replay of the same log from the beginning ends with the same rows, every column.
    replay_path = tmp_path / "replay.duckdb"
    assert worker(memory, replay_path, until_idle_s=2.0, slos=slos).run() == 0
    con = duckdb.connect(str(replay_path), read_only=True)
    assert con.execute(f"SELECT * FROM sli_minute ORDER BY {ORDER}").fetchall() == live
