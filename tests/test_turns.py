"""Turns by default: an attempt chain is a turn whether or not the runtime reports
`task_success` (rule in `streams.aggregates`). Pure: the REQUESTS spec through MinuteWindows."""

from __future__ import annotations

import msgspec
import polars as pl
import pytest

from tailwatch.ingest.schema import RequestV1
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.frames import REQUEST_COLUMNS
from tests.h100_lab import buckets, lab_sli_minute

T0 = 1_795_420_800_000  # a minute boundary
ENC = msgspec.json.Encoder()


def attempt(eid: str, status: str, ts: int = T0 + 1_000, attempt_no: int | None = None, retry_of: str | None = None,
            task_success: bool | None = None) -> bytes:
    ev = {"schema": "request.v1", "event_id": eid, "ts": ts, "tenant": "t", "model": "m", "workload": "llm",
          "status": status, "pool": "p", "e2e_ms": 100.0}
    for key, value in (("attempt", attempt_no), ("retry_of", retry_of), ("task_success", task_success)):
        if value is not None:
            ev[key] = value
    return ENC.encode(ev)


def counts(*events: bytes) -> dict[str, int]:
    rows = buckets(list(events), RequestV1, REQUEST_COLUMNS, REQUESTS)
    return {c: int(rows[c].sum()) for c in ("requests", "retries", "turns", "successful_turns")}


def test_a_chain_is_one_turn_decided_by_how_it_ended():
    # vLLM-style: no task_success, no attempt field at all: one turn per request, ok = success.
    assert counts(attempt("a", "ok"), attempt("b", "shed"), attempt("c", "error"))["turns"] == 3
    assert counts(attempt("a", "ok"), attempt("b", "shed"))["successful_turns"] == 1
    # error, then a retry that succeeded: one turn, successful, one retry.
    assert counts(attempt("a", "error", attempt_no=1), attempt("a2", "ok", attempt_no=2, retry_of="a")) == \
        {"requests": 2, "retries": 1, "turns": 1, "successful_turns": 1}
    # retries exhausted: one failed turn.
    assert counts(attempt("a", "timeout"), attempt("a2", "error", attempt_no=2, retry_of="a"),
                  attempt("a3", "shed", attempt_no=3, retry_of="a")) == \
        {"requests": 3, "retries": 2, "turns": 1, "successful_turns": 0}
    # A producer that marks its retry with retry_of only (attempt left at its default 1).
    assert counts(attempt("a", "error"), attempt("a2", "ok", retry_of="a"))["turns"] == 1


def test_client_cancellations_are_left_out_and_task_success_keeps_control():
    assert counts(attempt("a", "cancelled"))["turns"] == 0  # as availability leaves them out
    # A failed attempt, then a retry the client cancelled: the user saw a failure, a failed turn.
    assert counts(attempt("a", "error"), attempt("a2", "cancelled", attempt_no=2, retry_of="a"))["turns"] == 1
    # The runtime says the turn failed although the attempt was ok, or succeeded although it was not.
    assert counts(attempt("a", "ok", task_success=False)) == {"requests": 1, "retries": 0, "turns": 1, "successful_turns": 0}
    assert counts(attempt("a", "error", task_success=True))["successful_turns"] == 1
    # A runtime that reports a cancelled first attempt's outcome makes it a turn.
    assert counts(attempt("a", "cancelled", task_success=False))["turns"] == 1
    # task_success only on the attempt that ended the chain (the contract): still one turn.
    assert counts(attempt("a", "error"), attempt("a2", "ok", attempt_no=2, retry_of="a", task_success=True)) == \
        {"requests": 2, "retries": 1, "turns": 1, "successful_turns": 1}


def test_a_chain_across_a_minute_boundary_counts_its_turn_and_its_success_once():
    rows = buckets([attempt("a", "error", ts=T0 + 59_900), attempt("a2", "ok", ts=T0 + 60_300, attempt_no=2, retry_of="a")],
                   RequestV1, REQUEST_COLUMNS, REQUESTS).sort("window_start")
    assert rows["turns"].to_list() == [1, 0] and rows["successful_turns"].to_list() == [0, 1]


@pytest.mark.slow
def test_the_simulator_with_task_success_and_retry_storms_counts_as_it_emitted():
    # The simulator reports task_success on each chain's last attempt, retries with attempt
    # and retry_of, and cancels 0.3% of first attempts (reporting task_success false on them).
    sim = FleetSimulator("retry-storm", 95, seed=3, start="2026-11-02T00:00:00Z", rate_scale=0.05,
                         gpu_samples_per_minute=1)
    values = [ENC.encode(e) for e in sim.events() if isinstance(e, RequestV1)]
    rows = buckets(values, RequestV1, REQUEST_COLUMNS, REQUESTS)
    t = sim.totals
    assert t.retries > 20  # the storm is in the run
    assert (rows["requests"].sum(), rows["retries"].sum()) == (t.requests, t.retries)
    assert (rows["turns"].sum(), rows["successful_turns"].sum()) == (t.turns, t.successful_turns)


def test_the_h100_lab_run_without_task_success_has_turns():
    sli = lab_sli_minute()
    totals = sli.select(pl.col("requests", "ok", "shed", "retries", "turns", "successful_turns").sum()).row(0, named=True)
    # 632 requests, none retried, none with task_success: each is a turn; the 271 ok ones succeeded.
    assert totals == {"requests": 632, "ok": 271, "shed": 361, "retries": 0, "turns": 632, "successful_turns": 271}
    assert (sli["successful_turns"] <= sli["turns"]).all()
