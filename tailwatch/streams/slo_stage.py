"""The worker's SLO stage: closed minutes → SLO engine → `slo_status`, `alerts`, Alertmanager.

The engine's windows are a function of `sli_minute`, so on start they are rebuilt by
replaying the store's buckets (the period's worth) without judging alerts at
each minute; which alerts fire is taken from the store's `alerts` (what was decided live),
so a restart goes on to the same alerts at the same event-time minutes as a worker that
never stopped. Alert changes are written in the checkpoint transaction and only then
handed to the Alertmanager outbox; on start, alerts still firing in the store are sent
again (Alertmanager treats a repeat as the same alert).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from datetime import datetime

import duckdb
import polars as pl
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tailwatch.alerts.alertmanager import AlertLinks, FiringAlerts, to_alertmanager
from tailwatch.slo.contributors import OpenDetection, contributors_by_minute, explain
from tailwatch.slo.engine import AlertChange, SliceView, SloTable
from tailwatch.slo.sli import SloEvaluator, span, status_frame
from tailwatch.slo.spec import SloSpec
from tailwatch.slo.unmatched import UnmatchedSelectors
from tailwatch.store.checkpoint import ALERT_CHANGE_SCHEMA
from tailwatch.store.queries import recent_bucket_chunks
from tailwatch.conventions import (
    ALERTS_FIRING, SLO_BURN_RATE, SLO_ERROR_BUDGET_REMAINING_RATIO, SLO_EVENTS_TOTAL, SLO_OBJECTIVE_RATIO,
    SLO_SELECTOR_MATCHED, SLO_SLI_RATIO, SLO_SLI_UPPER_RATIO,
)

log = logging.getLogger("tailwatch.slo")

class SloCollector:
    """Prometheus view of the SLO tables. Labels: `slo` and the SLO's slice labels (a label
    another SLO slices by is empty here, which Prometheus treats as absent), plus `window`
    for per-window values. Event counters count from the worker's start (the replay that
    rebuilds the windows is not counted again)."""

    def __init__(self, specs: list[SloSpec]):
        self.labels = sorted({label for s in specs for label in s.slice_by})
        self.tables: list[SloTable] = []
        self.selector_matched: dict[str, bool] = {}  # the stage's UnmatchedSelectors.matched

    def describe(self):
        return []

    def collect(self):
        names = ["slo", *self.labels]
        objective = GaugeMetricFamily(SLO_OBJECTIVE_RATIO, "SLO objective (0-1).", labels=names)
        sli = GaugeMetricFamily(SLO_SLI_RATIO, "Good ÷ valid events over a window (undecided events counted bad).",
                                labels=[*names, "window"])
        sli_upper = GaugeMetricFamily(
            SLO_SLI_UPPER_RATIO, "The SLI with undecided events (a runtime bucket straddling the threshold) counted "
            "good: the SLI lies between this and the SLI ratio.", labels=[*names, "window"])
        burn = GaugeMetricFamily(SLO_BURN_RATE, "Error ratio over a window ÷ error budget.", labels=[*names, "window"])
        budget = GaugeMetricFamily(SLO_ERROR_BUDGET_REMAINING_RATIO,
                                   "Share of the compliance window's error budget left.", labels=names)
        firing = GaugeMetricFamily(ALERTS_FIRING, "SLO alerts firing, by severity.", labels=[*names, "severity"])
        events = CounterMetricFamily(SLO_EVENTS_TOTAL, "SLI events by outcome (good, bad: proven bad, undecided: "
                                     "neither proven), for Prometheus-side rules.", labels=[*names, "outcome"])
        for table in self.tables:
            burns, valids, remaining = table.rates()
            goods = table.window_sums()[..., 0]  # not proven bad
            undecided = table.undecided_sums()
            severities = [aw.severity for aw in table.spec.alert_windows]
            # Scrapes run on their own thread: a slice the worker adds meanwhile (a flood of new
            # ones adds many) is past the arrays read above. It is in the next scrape.
            known = min(len(remaining), valids.shape[0], goods.shape[0], undecided.shape[0], table.fired_at.shape[1],
                        len(table.events_good), len(table.events_valid), len(table.events_undecided))
            for st in table.views[:known]:
                i = st.i
                values = [table.spec.name, *(st.labels.get(k, "") for k in self.labels)]
                objective.add_metric(values, table.spec.objective)
                for k, m in enumerate(table.lengths):
                    if valids[i, k] > 0:
                        sli.add_metric([*values, span(m)], (goods[i, k] - undecided[i, k]) / valids[i, k])
                        sli_upper.add_metric([*values, span(m)], goods[i, k] / valids[i, k])
                        burn.add_metric([*values, span(m)], float(burns[i, k]))
                budget.add_metric(values, float(remaining[i]))
                for severity in ("page", "ticket"):
                    firing.add_metric([*values, severity], sum(
                        1 for j, sev in enumerate(severities) if sev == severity and table.fired_at[j, i] >= 0))
                # The engine's good holds the undecided events: proven good is the rest.
                events.add_metric([*values, "good"], int(table.events_good[i] - table.events_undecided[i]))
                events.add_metric([*values, "bad"], int(table.events_valid[i] - table.events_good[i]))
                if table.events_undecided[i]:
                    events.add_metric([*values, "undecided"], int(table.events_undecided[i]))
        matched = GaugeMetricFamily(SLO_SELECTOR_MATCHED, "1 once the SLO's selector has matched a bucket since the "
                                    "worker started; 0: a selector that matches nothing (no slice, never pages).",
                                    labels=["slo"])
        for name, yes in list(self.selector_matched.items()):
            matched.add_metric([name], 1.0 if yes else 0.0)
        yield from (objective, sli, sli_upper, burn, budget, firing, events, matched)


def alert_change_rows(changes: list[AlertChange]) -> pl.DataFrame:
    """The engine's alert changes as the store's `alerts` change rows (ALERT_CHANGE_SCHEMA)."""
    if not changes:  # most minutes: building and casting an empty frame cost half a millisecond
        return _NO_CHANGES
    return pl.DataFrame({
        "state": [c.state for c in changes], "fingerprint": [c.fingerprint for c in changes],
        "alertname": [c.alertname for c in changes], "severity": [c.severity for c in changes],
        "slo": [c.slo for c in changes], "alert_window": [c.window.name for c in changes],
        "labels": [json.dumps(c.labels, sort_keys=True) for c in changes],
        "at": pl.Series([c.at_minute * 60_000_000 for c in changes], dtype=pl.Int64),
        "long_burn_rate": [c.long_burn_rate for c in changes], "short_burn_rate": [c.short_burn_rate for c in changes],
        "error_budget_remaining": [c.error_budget_remaining for c in changes],
        "detail": [c.detail or None for c in changes],
    }).cast(ALERT_CHANGE_SCHEMA)  # type: ignore[arg-type]


_NO_CHANGES = pl.DataFrame(schema=ALERT_CHANGE_SCHEMA)


class SloStage:
    """The SLO engine as a stage: `slo_status` and `alerts` rows per closed minute, pages
    through its Alertmanager outbox."""

    name = "slo"

    def __init__(self, specs: list[SloSpec], alertmanager_urls: tuple[str, ...] = (), links: AlertLinks | None = None):
        self.specs = {s.name: s for s in specs}
        self.evaluator = SloEvaluator(specs)
        self.links = links or AlertLinks()
        self.alerts = FiringAlerts(alertmanager_urls, stage="slo")
        self.collector = SloCollector(specs)
        self.collector.tables = list(self.evaluator.tables.values())
        self._details: dict[str, str] = {}  # swapped whole: the view reads the old or the new
        self.unmatched = UnmatchedSelectors(specs)
        self.collector.selector_matched = self.unmatched.matched
        # The detections open now (the detector stage's, where the worker runs one): a page
        # names those whose scope holds its bad events (slo/contributors.py). The detector
        # stage runs after this one and waits for both tables' minutes, so a detection raised
        # in the checkpoint that fires a page is named by the pages after it.
        self.open_detections: Callable[[], list[OpenDetection]] = list

    def collectors(self) -> list:
        return [self.collector]

    def states(self) -> list[SliceView]:
        """Every slice's SLO state as of the newest closed minute (the signal view reads them)."""
        return self.evaluator.views()

    def details(self) -> dict[str, str]:
        """Fingerprint → what explains each firing alert (who holds its bad events)."""
        return self._details

    def rebuild(self, con: duckdb.DuckDBPyConnection) -> None:
        """The windows from the store's minutes of the longest SLO window, without judging any
        of those minutes: the alerts firing are the store's, which say what was decided live
        (a late correction never re-decides the past), and judging every minute of a 30-day
        replay again was most of a restart's time."""
        longest = max(s.period_minutes for s in self.specs.values())
        for rows in recent_bucket_chunks(con, longest):
            self.evaluator.feed(rows, with_status=False, judge=False)
            self._warn_unmatched(rows)
        self.evaluator.reset_event_counts()
        details = {}
        for fp, name, sev, slo, window, labels, fired_at, long_b, short_b, left, detail in con.execute(
            "SELECT fingerprint, alertname, severity, slo, alert_window, labels, fired_at, long_burn_rate, "
            "short_burn_rate, error_budget_remaining, detail FROM alerts WHERE resolved_at IS NULL"
        ).fetchall():
            if detail is not None:
                details[fp] = detail
            table, named = self.evaluator.tables.get(slo), json.loads(labels)
            minute = int((fired_at - _EPOCH).total_seconds()) // 60  # stored as naive UTC
            if table is not None:
                table.adopt_firing(window, tuple(named.get(k, "None") for k in table.spec.slice_by), minute)
            spec = self.specs.get(slo)
            aw = next((w for w in spec.alert_windows if w.name == window), None) if spec else None
            if aw is not None and self.alerts.enabled:
                change = AlertChange("firing", fp, name, sev, slo, named, minute, minute, aw, long_b, short_b, left,
                                     detail or "")
                self.alerts.change(fp, True, to_alertmanager(change, spec.runbook, self.links))
        self._details = details
        if not self.alerts.enabled:
            return
        self.alerts.restore(con)

    def on_closed(self, requests: pl.DataFrame, gpu: pl.DataFrame,
                  backlogged: frozenset[str] = frozenset()) -> dict[str, pl.DataFrame]:
        if requests.height == 0:
            return {}
        result = self.evaluator.feed(requests)
        self._warn_unmatched(requests)
        changes = self._explained(result.changes, requests)
        if changes:
            details = dict(self._details)
            for c in changes:
                if c.state == "firing" and c.detail:
                    details[c.fingerprint] = c.detail
                else:
                    details.pop(c.fingerprint, None)
            self._details = details
        out = {"slo_status": status_frame(result.status), "alerts": alert_change_rows(changes)}
        out.update(self.alerts.prepare_changes(
            [(c.fingerprint, c.state == "firing", to_alertmanager(c, self.specs[c.slo].runbook, self.links))
             for c in changes]))
        return out

    def _warn_unmatched(self, buckets: pl.DataFrame) -> None:
        for warning in self.unmatched.observe(buckets):
            log.warning(warning)

    def _explained(self, changes: list[AlertChange], requests: pl.DataFrame) -> list[AlertChange]:
        """A page that fires names who and what holds the slice's bad events at that minute (the
        minute's rows are in this checkpoint: it is what fired it), worked out once per SLO
        for all its slices and minutes."""
        wanted: dict[str, set[int]] = {}
        for c in changes:
            if c.state == "firing" and not c.detail:
                wanted.setdefault(c.slo, set()).add(c.at_minute)
        detections = self.open_detections() if wanted else []
        found = {slo: contributors_by_minute(self.specs[slo], requests, sorted(minutes), detections=detections)
                 for slo, minutes in wanted.items()}
        out = []
        for c in changes:
            if c.state == "firing" and not c.detail:
                spec = self.specs[c.slo]
                key = tuple(c.labels.get(k) for k in spec.slice_by if k in requests.columns)
                detail = explain(found[c.slo].get(c.at_minute, {}).get(key))
                if detail:
                    c = dataclasses.replace(c, detail=detail)
            if c.state == "firing" and c.long_undecided_events:
                c = dataclasses.replace(c, detail="; ".join(d for d in (c.detail, c.undecided_text()) if d))
            out.append(c)
        return out

    def on_corrected(self, requests: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """Late events correct the windows and budgets of the minutes they belong to; an alert
        already decided stays as it was (the next closed minute is judged on the corrected windows)."""
        self.evaluator.feed(requests, with_status=False)
        return {}

    def committed(self) -> None:
        self.alerts.committed()


_EPOCH = datetime(1970, 1, 1)

