"""The worker's SLO stage: closed minutes → SLO engine → `slo_status`, `alerts`, Alertmanager.

The engine's state is a function of `sli_minute`, so on start it is rebuilt by replaying
the store's buckets (the compliance window's worth), and a restart or a replay gives the
same alerts at the same event-time minutes. Alert changes are written in the checkpoint
transaction and only then handed to the Alertmanager outbox; on start, alerts still
firing in the store are sent again (Alertmanager treats a repeat as the same alert).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import duckdb
import polars as pl

from alerts.alertmanager import AlertLinks, AlertmanagerOutbox, to_alertmanager
from slo.engine import AlertChange
from slo.sli import SloEvaluator
from slo.spec import SloSpec

STATUS_SCHEMA = {
    "window_start": pl.Datetime("us"), "slo": pl.String, "slice": pl.String, "sli": pl.Float64,
    "error_budget_remaining": pl.Float64, "minutes_to_exhaustion": pl.Float64,
    "burn_rates": pl.List(pl.Struct({"window": pl.String, "burn_rate": pl.Float64})), "firing": pl.Int32,
}


class SloStage:
    def __init__(self, specs: list[SloSpec], alertmanager_url: str | None, links: AlertLinks | None = None):
        self.specs = {s.name: s for s in specs}
        self.evaluator = SloEvaluator(specs)
        self.links = links or AlertLinks()
        self.outbox = AlertmanagerOutbox(alertmanager_url) if alertmanager_url else None

    def rebuild(self, con: duckdb.DuckDBPyConnection) -> None:
        longest = max(s.window_minutes for s in self.specs.values())
        buckets = con.sql(
            "SELECT * FROM sli_minute WHERE window_start >= (SELECT max(window_start) FROM sli_minute) - to_minutes($1)",
            params=[longest],
        ).pl()
        self.evaluator.feed(buckets, with_status=False)
        if self.outbox is None:
            return
        for row in con.execute(
            "SELECT fingerprint, alertname, severity, slo, alert_window, labels, fired_at, long_burn_rate, "
            "short_burn_rate, error_budget_remaining FROM alerts WHERE resolved_at IS NULL"
        ).fetchall():
            fp, name, sev, slo, window, labels, fired_at, long_b, short_b, left = row
            spec = self.specs.get(slo)
            aw = next((w for w in spec.alert_windows if w.name == window), None) if spec else None
            if aw is None:
                continue
            minute = int((fired_at - _EPOCH).total_seconds()) // 60  # stored as naive UTC
            change = AlertChange("firing", fp, name, sev, slo, json.loads(labels), minute, minute, aw, long_b, short_b, left)
            self.outbox.put(to_alertmanager(change, spec.runbook, self.links))

    def evaluate(self, closed: pl.DataFrame) -> tuple[pl.DataFrame | None, list[AlertChange]]:
        if closed.height == 0:
            return None, []
        result = self.evaluator.feed(closed)
        rows = [
            {**r, "window_start": _minute_dt(r["window_start"]),
             "burn_rates": [{"window": k, "burn_rate": v} for k, v in r["burn_rates"].items()]}
            for r in result.status
        ]
        return pl.DataFrame(rows, schema=STATUS_SCHEMA), result.changes

    def committed(self, changes: list[AlertChange]) -> None:
        if self.outbox is None:
            return
        for c in changes:
            self.outbox.put(to_alertmanager(c, self.specs[c.slo].runbook, self.links))
        self.outbox.flush()

    def deliver(self, wait_s: float = 0.0) -> None:
        """Try the outbox; with wait_s, keep trying (with its backoff) for up to that long."""
        if self.outbox is None:
            return
        deadline = time.monotonic() + wait_s
        while not self.outbox.flush() and time.monotonic() < deadline:
            time.sleep(0.2)


_EPOCH = datetime(1970, 1, 1)


def _minute_dt(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, tz=timezone.utc).replace(tzinfo=None)

