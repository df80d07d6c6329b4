"""Alert window catalogs (multi-window, multi-burn-rate pairs and their factors), one per SLO
period in `slo/catalogs/`, and minutes as people read them.

A window pair alerts when a share of the error budget of the SLO period would be spent
within its long window. The burn-rate factor follows from that share, not from a
rounded table: factor = budget_share × period ÷ long window. With the SRE Workbook's
default catalog over 30 days this gives 14.4 (2% in 1 h), 6 (5% in 6 h), 3 (10% in 1 d)
and 1 (10% in 3 d). Short windows are 1/12 of their long window unless set.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml

MINUTE_S = 60


def minute_start_utc(minute: int) -> datetime:
    """The start of an epoch minute as a naive UTC datetime (the store's TIMESTAMP)."""
    return datetime.fromtimestamp(minute * MINUTE_S, tz=timezone.utc).replace(tzinfo=None)


def minute_text(minute: int) -> str:
    """An event-time minute as a person reads it, its date included: `2026-11-02 00:55`
    (UTC, as every time tailwatch prints)."""
    return minute_start_utc(minute).strftime("%Y-%m-%d %H:%M")


def minutes_text(minutes: list[int], most: int = 8) -> str:
    """Event-time minutes as a person reads them: runs of consecutive minutes as ranges,
    `2026-11-02 00:55–01:03, 2026-11-02 01:10`, at most `most` runs and a count of the rest."""
    runs: list[tuple[int, int]] = []
    for m in sorted(set(minutes)):
        if runs and m == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], m)
        else:
            runs.append((m, m))

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

    def factor(self, period_minutes: int) -> float:
        return self.budget_share * period_minutes / self.long_minutes


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
    from config import parse_duration_s  # the one duration parser

    out = {}
    for path in sorted(CATALOGS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        windows = tuple(
            AlertWindow(w["name"], w["severity"], float(w["budget_share"]),
                        int(parse_duration_s(w["long"]) // 60), int(parse_duration_s(w["short"]) // 60))
            for w in doc["windows"])
        out[int(parse_duration_s(doc["period"]) // 60)] = windows
    return out
