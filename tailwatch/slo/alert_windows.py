"""Alert window catalogs (multi-window, multi-burn-rate pairs and their factors), one per SLO
period in `slo/catalogs/`, and minutes as people read them.

A window pair alerts when a share of the error budget of the SLO period would be spent
within its long window. The burn-rate factor follows from that share, not from a
rounded table: factor = budget_share × period ÷ long window. With the SRE Workbook's
default catalog over 30 days this gives 14.4 (2% in 1 h), 6 (5% in 6 h), 3 (10% in 1 d)
and 1 (10% in 3 d). Short windows are 1/12 of their long window unless set.

Two rules keep an alert honest about what it can see:

- **Reachable.** A window pair fires when the error ratio passes factor × (1 − objective);
  where that product is 1 or more no traffic can fire it (a WER objective of 92% has an
  8% budget: 14.4 × 8% = 115%). A catalog's window is then capped (`max_factor`) so that
  it fires once more than `MAX_ALERT_ERROR_RATIO` of the valid events are bad, as sloth's
  catalogs set each factor per period rather than copy one table; a window written out
  in an SLO file that can never fire is refused by `slo check` and the worker.
- **Young windows.** A long window is judged only once the slice's history (minutes since
  its first valid event) covers `YOUNG_SHARE` of the window's span (an SLO's
  `young_window_share`): before that the pair is not evaluated and the slice's status names
  it young, so a new slice or a new store cannot ticket on minutes of a 3-day window.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

MINUTE_S = 60
# The error ratio above which a capped catalog window fires: half the valid events bad is an
# outage under any objective, and 0.5 leaves room for the short window to prove it.
MAX_ALERT_ERROR_RATIO = 0.5
# The share of a long window's span a slice's history must cover before the window is judged:
# a twelfth, which for the 30- and 28-day catalogs is the pair's short window (a pair is judged
# once its short window is full; before that both windows read the same few minutes).
YOUNG_SHARE = 1 / 12


def minute_start_utc(minute: int) -> datetime:
    """The start of an epoch minute as a naive UTC datetime (the store's TIMESTAMP)."""
    return datetime.fromtimestamp(minute * MINUTE_S, tz=timezone.utc).replace(tzinfo=None)


def minute_text(minute: int) -> str:
    """An event-time minute as a person reads it, its date included: `2026-11-02 00:55`
    (UTC, as every time tailwatch prints)."""
    return minute_start_utc(minute).strftime("%Y-%m-%d %H:%M")


def consecutive_runs(minutes: list[int]) -> list[tuple[int, int]]:
    """The distinct minutes as runs of consecutive ones, (first, last) each, in order."""
    runs: list[tuple[int, int]] = []
    for m in sorted(set(minutes)):
        if runs and m == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], m)
        else:
            runs.append((m, m))
    return runs


def minutes_text(minutes: list[int], most: int = 8) -> str:
    """Event-time minutes as a person reads them: runs of consecutive minutes as ranges,
    `2026-11-02 00:55–01:03, 2026-11-02 01:10`, at most `most` runs and a count of the rest."""
    runs = consecutive_runs(minutes)

    def run_text(first: int, last: int) -> str:
        if first == last:
            return minute_text(first)
        end = minute_start_utc(last)
        same_day = minute_start_utc(first).date() == end.date()
        return f"{minute_text(first)}–{end.strftime('%H:%M') if same_day else minute_text(last)}"

    shown = ", ".join(run_text(a, b) for a, b in runs[:most])
    return shown + (f" and {len(runs) - most} more runs" if len(runs) > most else "")


@dataclass(frozen=True)
class AlertWindow:
    name: str
    severity: str  # "page" or "ticket"
    budget_share: float  # fraction of the period's error budget
    long_minutes: int
    short_minutes: int
    max_factor: float | None = None  # a cap that keeps the window reachable (see the module doc)

    def factor(self, period_minutes: int) -> float:
        factor = self.budget_share * period_minutes / self.long_minutes
        return factor if self.max_factor is None else min(factor, self.max_factor)

    def error_ratio_needed(self, period_minutes: int, objective: float) -> float:
        """The error ratio both windows must pass for the pair to fire: ≥ 1 means never."""
        return self.factor(period_minutes) * (1.0 - objective)

    def history_needed_minutes(self, young_share: float = YOUNG_SHARE) -> int:
        """Minutes of a slice's history before this pair is judged (the young-window rule)."""
        return math.ceil(young_share * self.long_minutes - 1e-9)


def reachable(window: AlertWindow, period_minutes: int, objective: float) -> AlertWindow:
    """A catalog window as it can fire under `objective`: capped at the factor whose error
    ratio is `MAX_ALERT_ERROR_RATIO` where the catalog's factor needs more than that."""
    if window.error_ratio_needed(period_minutes, objective) <= MAX_ALERT_ERROR_RATIO:
        return window
    return dataclasses.replace(window, max_factor=MAX_ALERT_ERROR_RATIO / (1.0 - objective))


CATALOGS = Path(__file__).parent / "catalogs"


def catalog_for(period_minutes: int) -> tuple[AlertWindow, ...] | None:
    """The alert windows for an SLO period (a file of `slo/catalogs/`, as sloth keeps one per
    period); None when there is none for it."""
    return _catalogs().get(period_minutes)


def catalog_periods() -> list[str]:
    return [f"{m // 1440}d" for m in sorted(_catalogs())]


def default_catalog() -> tuple[AlertWindow, ...]:
    """The 30-day catalog: the SRE Workbook's ("Alerting on SLOs")."""
    return _catalogs()[30 * 1440]


@functools.cache
def _catalogs() -> dict[int, tuple[AlertWindow, ...]]:
    from tailwatch.config import parse_duration_s  # the one duration parser

    out = {}
    for path in sorted(CATALOGS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        windows = tuple(
            AlertWindow(w["name"], w["severity"], float(w["budget_share"]),
                        int(parse_duration_s(w["long"]) // 60), int(parse_duration_s(w["short"]) // 60))
            for w in doc["windows"])
        out[int(parse_duration_s(doc["period"]) // 60)] = windows
    return out
