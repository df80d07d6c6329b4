"""Delivery of alert state changes to Alertmanager through its v2 HTTP API.

State changes queue in an outbox and are posted in order; when Alertmanager is down the
outbox keeps them and retries with exponential backoff (bounded), so no change is lost
while the process lives. Times are event times: `startsAt` is when the condition began
in the telemetry and `endsAt` when it cooled, so a replay pages with the same times.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass

import polars as pl

from dashboards.uids import DETECTOR_DASHBOARD, FILTER_LABELS, UID_FLEET, UID_SLO
from slo.engine import AlertChange
from slo.sli import span
from slo.windows import minute_start_utc

log = logging.getLogger("tailwatch.alerts")
OUTBOX_SCHEMA = {"stage": pl.String, "seq": pl.Int64, "payload": pl.String}
DELIVERED_SCHEMA = {"stage": pl.String, "seq": pl.Int64}


@dataclass(frozen=True)
class AlertLinks:
    """Where a page points a person: the runbook and the dashboard, with the slice preset."""

    runbook_base_url: str = "https://github.com/tailwatch/tailwatch/blob/main/"
    grafana_url: str = "http://grafana.local"

    @property
    def dashboard_base_url(self) -> str:
        """The SLO detail dashboard, where SLO pages land with their slice preset."""
        return self.dashboard(UID_SLO)

    def dashboard(self, uid: str) -> str:
        return f"{self.grafana_url.rstrip('/')}/d/{uid}"


def rfc3339(minute: int) -> str:
    return minute_start_utc(minute).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_alertmanager(change: AlertChange, runbook: str, links: AlertLinks) -> dict:
    """One alert in Alertmanager's v2 format, labelled by SLO and slice labels only."""
    w = change.window
    if change.alertname == "SLONoData":
        return _no_data_alert(change, links)
    long_b = "no data" if change.long_burn_rate is None else f"{change.long_burn_rate:.1f}x"
    short_b = "no data" if change.short_burn_rate is None else f"{change.short_burn_rate:.1f}x"
    slice_text = ", ".join(f"{k}={v}" for k, v in change.labels.items()) or "all traffic"
    query = "&".join([f"var-slo={change.slo}", *(f"var-{k}={v}" for k, v in change.labels.items())])
    alert = {
        "labels": {"alertname": change.alertname, "severity": change.severity, "slo": change.slo,
                   "window": w.name, **change.labels},
        "annotations": {
            "summary": (f"{change.slo} ({slice_text}) burns its error budget at {long_b} over "
                        f"{span(w.long_minutes)} and {short_b} over {span(w.short_minutes)}; "
                        f"{100 * change.error_budget_remaining:.1f}% of the budget left"),
            "runbook_url": links.runbook_base_url + runbook,
            "dashboard_url": f"{links.dashboard_base_url}?{query}",
        },
        "startsAt": rfc3339(change.started_minute),
        "generatorURL": f"{links.dashboard_base_url}?{query}",
    }
    if change.state == "resolved":
        alert["endsAt"] = rfc3339(change.at_minute)
    return alert


def _no_data_alert(change: AlertChange, links: AlertLinks) -> dict:
    slice_text = ", ".join(f"{k}={v}" for k, v in change.labels.items()) or "all traffic"
    alert = {
        "labels": {"alertname": change.alertname, "severity": change.severity, "slo": change.slo, **change.labels},
        "annotations": {
            "summary": f"{change.slo} ({slice_text}) has had no events for {span(change.window.long_minutes)}",
            "runbook_url": links.runbook_base_url + "runbooks/slo-no-data.md",
            "dashboard_url": links.dashboard_base_url,
        },
        "startsAt": rfc3339(change.started_minute),
    }
    if change.state == "resolved":
        alert["endsAt"] = rfc3339(change.at_minute)
    return alert


class AlertmanagerOutbox:
    """In-order, retried delivery of alert payloads to one Alertmanager."""

    def __init__(self, url: str, timeout_s: float = 5.0, max_backoff_s: float = 30.0, max_pending: int = 100_000):
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.max_pending = max_pending
        self.pending: deque[dict] = deque()
        self.pending_seqs: deque[int | None] = deque()  # the durable outbox's sequence number of each, if any
        self.delivered_seq = -1  # the highest sequence number delivered
        self.delivered = 0
        self.failures = 0
        self._backoff_s = 0.0
        self._next_try = 0.0  # monotonic clock: when to try again after a failure

    def put(self, alert: dict, seq: int | None = None) -> None:
        if len(self.pending) >= self.max_pending:
            # Never drop silently: the oldest change goes, and the log says so.
            dropped = self.pending.popleft()
            self.pending_seqs.popleft()
            log.error("alert outbox full (%d): dropping the oldest change for %s", self.max_pending, dropped["labels"])
        self.pending.append(alert)
        self.pending_seqs.append(seq)

    def flush(self, batch: int = 500) -> bool:
        """Try to deliver what is pending; True when the outbox is empty afterwards."""
        if not self.pending:
            return True
        if time.monotonic() < self._next_try:
            return False
        while self.pending:
            chunk = [self.pending[i] for i in range(min(batch, len(self.pending)))]
            if not self._post(chunk):
                self.failures += 1
                self._backoff_s = min(self.max_backoff_s, max(0.5, self._backoff_s * 2))
                self._next_try = time.monotonic() + self._backoff_s
                return False
            for _ in chunk:
                self.pending.popleft()
                seq = self.pending_seqs.popleft()
                if seq is not None and seq > self.delivered_seq:
                    self.delivered_seq = seq
            self.delivered += len(chunk)
            self._backoff_s = 0.0
        return True

    def _post(self, alerts: list[dict]) -> bool:
        req = urllib.request.Request(self.url, data=json.dumps(alerts).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return 200 <= resp.status < 300
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            log.warning("Alertmanager at %s did not take %d alerts: %s", self.url, len(alerts), exc)
            return False


# ---- detectors -------------------------------------------------------------------------

# Detectors whose condition is itself user pain now page; the rest explain and open tickets.
DETECTOR_SEVERITY = {"retry_storm": "page", "queue_age": "page"}


def detector_alertname(detector: str) -> str:
    """retry_storm → DetectorRetryStorm."""
    return "Detector" + "".join(part.capitalize() for part in detector.split("_"))


def detector_runbook(detector: str) -> str:
    return f"runbooks/detector-{detector.replace('_', '-')}.md"


def detection_to_alertmanager(detection, evidence: dict[str, float | str], links: AlertLinks) -> dict:
    """One detection (detectors.core.Detection) in Alertmanager's v2 format: labelled by the
    detector and the detection's slice labels (pool, zone, model, ...: bounded sets), with
    the numbers that triggered it in the summary, and runbook and dashboard links."""
    labels = {k: v for k, v in detection.labels.items() if v}
    slice_text = ", ".join(f"{k}={v}" for k, v in labels.items()) or "all traffic"
    numbers = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in evidence.items())
    # The evidence dashboard, preset to the detection's slice where it has that variable.
    query = "&".join(f"var-{k}={v}" for k, v in labels.items() if k in FILTER_LABELS)
    url = links.dashboard(DETECTOR_DASHBOARD.get(detection.detector, UID_FLEET)) + (f"?{query}" if query else "")
    alert = {
        "labels": {"alertname": detector_alertname(detection.detector),
                   "severity": DETECTOR_SEVERITY.get(detection.detector, "ticket"),
                   "detector": detection.detector, **labels},
        "annotations": {
            "summary": f"{detection.detector.replace('_', ' ')} on {slice_text}: {numbers}",
            "runbook_url": links.runbook_base_url + detector_runbook(detection.detector),
            "dashboard_url": url,
        },
        "startsAt": rfc3339(detection.started_at),
        "generatorURL": url,
    }
    if detection.ended_at is not None:
        alert["endsAt"] = rfc3339(detection.ended_at)
    return alert


class FiringAlerts:
    """What a stage has firing, delivered through an outbox: each change is sent once, and
    alerts still firing are sent again every RESEND_S, because Alertmanager resolves an
    alert it has not heard of for its resolve_timeout (5 m by default), as Prometheus does.
    Without a URL nothing is sent and the calls are no-ops.

    The outbox is durable: each change's payload is staged (`stage_changes`) as a row of
    `_tw_alert_outbox` in the checkpoint that commits the change, and what Alertmanager took
    is marked in `_tw_alert_delivered` by a later checkpoint (`delivery_rows`). On start
    (`restore`) every change past the last mark is sent again, so a page that fired, or
    resolved, while Alertmanager was down is not lost when the worker dies before it was
    delivered (a repeat is the same alert to Alertmanager)."""

    RESEND_S = 60.0

    def __init__(self, url: str | None, stage: str = ""):
        self.outbox = AlertmanagerOutbox(url) if url else None
        self.stage = stage
        self.payloads: dict[str, dict] = {}  # key (fingerprint, detection id) → payload while firing
        self._last_resend = time.monotonic()
        self._next_seq = 0
        self._staged: list[tuple[str, bool, dict, int]] = []  # written with the checkpoint, handed out on commit
        self._marked_seq = -1  # the delivered mark last written to the store

    def change(self, key: str, firing: bool, payload: dict, seq: int | None = None) -> None:
        if firing:
            self.payloads[key] = payload
        else:
            self.payloads.pop(key, None)
        if self.outbox is not None:
            self.outbox.put(payload, seq)

    def stage_changes(self, changes: list[tuple[str, bool, dict]]) -> list[tuple[str, pl.DataFrame]]:
        """Number this checkpoint's changes and return the store rows that make them durable."""
        if self.outbox is None or not changes:
            return []
        rows = []
        for key, firing, payload in changes:
            self._staged.append((key, firing, payload, self._next_seq))
            rows.append((self.stage, self._next_seq, json.dumps(payload, sort_keys=True)))
            self._next_seq += 1
        return [("_tw_alert_outbox", pl.DataFrame(rows, schema=OUTBOX_SCHEMA, orient="row"))]

    def committed(self) -> None:
        """The checkpoint holding the staged changes is durable: hand them to the outbox."""
        staged, self._staged = self._staged, []
        for key, firing, payload, seq in staged:
            self.change(key, firing, payload, seq)
        if staged:
            self.deliver()

    def delivery_rows(self) -> list[tuple[str, pl.DataFrame]]:
        """A row marking what Alertmanager has taken since the last mark (for a checkpoint)."""
        if self.outbox is None or self.outbox.delivered_seq <= self._marked_seq:
            return []
        self._marked_seq = self.outbox.delivered_seq
        return [("_tw_alert_delivered", pl.DataFrame([(self.stage, self._marked_seq)], schema=DELIVERED_SCHEMA,
                                                     orient="row"))]

    def restore(self, con) -> None:
        """On start: queue every change past the last delivered mark, in order."""
        if self.outbox is None:
            return
        row = con.execute("SELECT max(seq) FROM _tw_alert_delivered WHERE stage = ?", [self.stage]).fetchone()
        self._marked_seq = self.outbox.delivered_seq = row[0] if row and row[0] is not None else -1
        undelivered = con.execute("SELECT seq, payload FROM _tw_alert_outbox WHERE stage = ? AND seq > ? ORDER BY seq",
                                  [self.stage, self._marked_seq]).fetchall()
        for seq, payload in undelivered:
            self.outbox.put(json.loads(payload), seq)
        row = con.execute("SELECT max(seq) FROM _tw_alert_outbox WHERE stage = ?", [self.stage]).fetchone()
        self._next_seq = row[0] + 1 if row and row[0] is not None else 0
        if undelivered:
            log.info("%s: %d alert changes not confirmed delivered before the restart are sent again",
                     self.stage, len(undelivered))

    def deliver(self, wait_s: float = 0.0) -> None:
        """Try the outbox; with wait_s, keep trying (with its backoff) for up to that long."""
        if self.outbox is None:
            return
        if time.monotonic() - self._last_resend >= self.RESEND_S:
            self._last_resend = time.monotonic()
            for payload in self.payloads.values():
                self.outbox.put(payload)
        deadline = time.monotonic() + wait_s
        while not self.outbox.flush() and time.monotonic() < deadline:
            time.sleep(0.2)
