"""The alert window catalog: multi-window, multi-burn-rate pairs and their factors.

A window pair alerts when a share of the error budget of the SLO period would be spent
within its long window. The burn-rate factor follows from that share, not from a
rounded table: factor = budget_share × period ÷ long window. With the SRE Workbook's
default catalog over 30 days this gives 14.4 (2% in 1 h), 6 (5% in 6 h), 3 (10% in 1 d)
and 1 (10% in 3 d). Short windows are 1/12 of their long window unless set.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

MINUTE_S = 60


def minute_start_utc(minute: int) -> datetime:
    """The start of an epoch minute as a naive UTC datetime (the store's TIMESTAMP)."""
    return datetime.fromtimestamp(minute * MINUTE_S, tz=timezone.utc).replace(tzinfo=None)


def minute_text(minute: int) -> str:
    """An event-time minute as a person reads it, its date included: `2026-11-02 00:55`
    (UTC, as every time tailwatch prints)."""
    return minute_start_utc(minute).strftime("%Y-%m-%d %H:%M")


@dataclass(frozen=True)
class AlertWindow:
    name: str
    severity: str  # "page" or "ticket"
    budget_share: float  # fraction of the period's error budget
    long_minutes: int
    short_minutes: int

    def factor(self, period_minutes: int) -> float:
        return self.budget_share * period_minutes / self.long_minutes


def default_catalog() -> tuple[AlertWindow, ...]:
    """The SRE Workbook's catalog ("Alerting on SLOs", table 5-8)."""
    return (
        AlertWindow("page-fast", "page", 0.02, 60, 5),
        AlertWindow("page-slow", "page", 0.05, 360, 30),
        AlertWindow("ticket-fast", "ticket", 0.10, 1440, 120),
        AlertWindow("ticket-slow", "ticket", 0.10, 4320, 360),
    )
