"""Alerts that can fire and windows judged on enough history: an SLO's alert windows are
checked against its objective (a window that needs more than every event bad is capped or
refused), and a long window is not judged on minutes of a new slice's history."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tailwatch.slo.engine import SloTable
from tailwatch.slo.spec import DEFAULT_SLOS, SpecErrors, load_slos, spec_warnings
from tailwatch.slo.alert_windows import MAX_ALERT_ERROR_RATIO, YOUNG_SHARE
from tests.test_slo import AVAIL


def _advance(table: SloTable, minute: int, good: int, valid: int):
    return table.advance(minute, [table.column(())], [good], [valid])


def test_the_default_wer_slo_can_page_and_says_its_fast_window_was_capped():
    """A 92% WER objective has an 8% budget: the workbook's 14.4× page needs a WER above 115%.
    Capped, it fires on a WER above 50%, and the check says so naming the SLO and window."""
    (wer,) = [s for s in load_slos(DEFAULT_SLOS) if s.name == "asr-wer"]
    fast = next(w for w in wer.alert_windows if w.name == "page-fast")
    assert fast.error_ratio_needed(wer.period_minutes, wer.objective) == pytest.approx(MAX_ALERT_ERROR_RATIO)
    assert all(w.error_ratio_needed(wer.period_minutes, wer.objective) < 1 for w in wer.alert_windows)
    (warning,) = spec_warnings(wer)
    assert "asr-wer" in warning and "page-fast" in warning and "115.2%" in warning
    # A model that gets 60% of its words wrong, 1,000 evaluated words a minute: the fast page fires.
    table = SloTable(wer)
    changes = [c for m in range(60) for c in _advance(table, m, 400, 1000)]
    assert "page-fast" in {c.window.name for c in changes if c.state == "firing"}


@pytest.mark.slow
def test_slo_check_names_an_alert_window_that_can_never_fire(tmp_path):
    path = tmp_path / "slos.yaml"
    path.write_text("""
slos:
  - name: asr-wer-strict
    selector: {workload: asr}
    sli: {word_accuracy: {}}
    objective: 90%
    alert_windows:
      - {name: wer-page, severity: page, budget_share: 0.05, long: 1h, short: 5m}
      - {name: wer-ticket, severity: ticket, budget_share: 0.1, long: 3d, short: 6h}
""")
    with pytest.raises(SpecErrors) as raised:
        load_slos(path)
    (problem,) = raised.value.problems  # 0.05 × 720 h ÷ 1 h = 36×, × 10% = 360%; the ticket (1×, 10%) can fire
    assert "asr-wer-strict" in problem and "wer-page" in problem and "360.0%" in problem
    run = subprocess.run([sys.executable, "-m", "tailwatch", "slo", "check", str(path)], capture_output=True, text=True)
    assert run.returncode == 1 and "wer-page can never fire" in run.stderr and "Traceback" not in run.stderr
    defaults = subprocess.run([sys.executable, "-m", "tailwatch", "slo", "check", str(DEFAULT_SLOS)],
                              capture_output=True, text=True)
    assert defaults.returncode == 0 and "warning: SLO asr-wer, window page-fast" in defaults.stdout


TICKETS = AVAIL.replace("99.9%", "99%").replace("min_events: 10", "min_events: 100")  # 1% budget, 100 events


def test_a_new_slice_does_not_ticket_on_minutes_of_a_three_day_window(tmp_path):
    """150 events over 30 minutes with 2% bad burn the 3-day window at 2× (its factor is 1): on
    30 minutes of history that is noise. The pair is judged once the slice's history covers a
    twelfth of the window (6 h, its short window); then the same traffic tickets."""
    path = tmp_path / "slos.yaml"
    path.write_text(TICKETS)
    (spec,) = load_slos(path)
    slow = next(w for w in spec.alert_windows if w.name == "ticket-slow")
    assert slow.history_needed_minutes() == round(YOUNG_SHARE * 3 * 1440) == slow.short_minutes == 360
    table = SloTable(spec)

    def minute(m: int):  # 5 events a minute, one bad every 10 minutes: 2%
        return _advance(table, m, 4 if m % 10 == 0 else 5, 5)

    early = [c for m in range(30) for c in minute(m)]
    assert early == []
    status = table.views[0].status()
    assert "ticket-slow" in status.young and "ticket-fast" in status.young
    assert status.burn_rates[3 * 1440] == pytest.approx(2.0)  # the burn is there, the history is not
    later = [c for m in range(30, 400) for c in minute(m)]
    fired = [(c.window.name, c.at_minute) for c in later if c.state == "firing"]
    assert fired == [("ticket-slow", 359)]  # history 0..359 = 360 minutes
    assert "ticket-slow" not in table.views[0].status().young


@pytest.mark.slow
def test_the_worker_refuses_a_file_with_an_alert_that_can_never_fire(tmp_path):
    path = tmp_path / "slos.yaml"
    path.write_text(TICKETS + "    alert_windows:\n      - {name: hopeless, budget_share: 0.5, long: 1h}\n")
    run = subprocess.run([sys.executable, "-m", "tailwatch", "worker", "--slos", str(path), "--bootstrap-servers",
                          "127.0.0.1:1", "--store", str(tmp_path / "tw.duckdb")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and "llm-avail, window hopeless can never fire" in run.stderr, run.stderr
