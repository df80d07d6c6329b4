"""Delivery of alert state changes to Alertmanager through its v2 HTTP API.

State changes queue in an outbox and are posted in order; when Alertmanager is down the
outbox keeps them and retries with jittered exponential backoff (bounded), so no change is
lost while the process lives (and, through the store's durable outbox, across restarts);
every alert goes to every Alertmanager of an HA cluster. Times are event times: `startsAt` is when the condition began
in the telemetry and `endsAt` when it cooled, so a replay pages with the same times.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tailwatch.dashboards.links import dashboard_url, runbook_url
from tailwatch.dashboards.uids import DETECTOR_DASHBOARD, FILTER_LABELS, UID_FLEET, UID_SLO
from tailwatch.slo.engine import AlertChange
from tailwatch.slo.sli import span
from tailwatch.slo.alert_windows import minute_start_utc
from tailwatch import runbooks
from tailwatch.conventions import ALERTS_DELIVERED_TOTAL, ALERTS_PENDING, ALERTS_REFUSED_TOTAL

log = logging.getLogger("tailwatch.alerts")
OUTBOX_SCHEMA = {"stage": pl.String, "seq": pl.Int64, "payload": pl.String}
DELIVERED_SCHEMA = {"stage": pl.String, "seq": pl.Int64, "target": pl.String}


# The runbooks of this installation (packaged with it), until `--runbook-url` says where the
# team publishes them; the worker's own default is its HTTP port, which serves them.
LOCAL_RUNBOOK_BASE_URL = runbooks.packaged_base_url()


@dataclass(frozen=True)
class AlertLinks:
    """Where a page or a report points a person: the runbook and the dashboard, with the slice
    preset (built by `dashboards.links`, every label value encoded)."""

    runbook_base_url: str = LOCAL_RUNBOOK_BASE_URL
    grafana_url: str = "http://grafana.local"

    def runbook(self, path: str) -> str:
        """`runbooks/slo-burn.md` under the runbook base."""
        return runbook_url(self.runbook_base_url, path)

    @property
    def dashboard_base_url(self) -> str:
        """The SLO detail dashboard, where SLO pages land with their slice preset."""
        return self.dashboard(UID_SLO)

    def dashboard(self, uid: str, variables: dict[str, str] | None = None) -> str:
        """The dashboard `uid` with its variables preset (`var-<name>=<value>`)."""
        return dashboard_url(self.grafana_url, uid, variables)


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
    dashboard = links.dashboard(UID_SLO, {"slo": change.slo, **change.labels})
    alert = {
        "labels": {"alertname": change.alertname, "severity": change.severity, "slo": change.slo,
                   "window": w.name, **change.labels},
        "annotations": {
            "summary": (f"{change.slo} ({slice_text}) burns its error budget at {long_b} over "
                        f"{span(w.long_minutes)} and {short_b} over {span(w.short_minutes)}; "
                        f"{100 * change.error_budget_remaining:.1f}% of the budget left"),
            "runbook_url": links.runbook(runbook),
            "dashboard_url": dashboard,
        },
        "startsAt": rfc3339(change.started_minute),
        "generatorURL": dashboard,
    }
    if change.detail:
        alert["annotations"]["description"] = change.detail
    if change.state == "resolved":
        alert["endsAt"] = rfc3339(change.at_minute)
    return alert


def _no_data_alert(change: AlertChange, links: AlertLinks) -> dict:
    slice_text = ", ".join(f"{k}={v}" for k, v in change.labels.items()) or "all traffic"
    alert = {
        "labels": {"alertname": change.alertname, "severity": change.severity, "slo": change.slo, **change.labels},
        "annotations": {
            "summary": f"{change.slo} ({slice_text}) has had no events for {span(change.window.long_minutes)}",
            "runbook_url": links.runbook("runbooks/slo-no-data.md"),
            "dashboard_url": links.dashboard_base_url,
        },
        "startsAt": rfc3339(change.started_minute),
    }
    if change.state == "resolved":
        alert["endsAt"] = rfc3339(change.at_minute)
    return alert


class AlertmanagerOutbox:
    """In-order, retried delivery of alert payloads to one Alertmanager.

    A refusal that retrying cannot fix (a 4xx other than 408 and 429: Alertmanager says the
    payload is wrong) drops that batch with a log line and a count, so it cannot block every
    change queued behind it; anything else (unreachable, 5xx, 408, 429) is retried with
    exponential backoff and full jitter, so instances that come back are not hit in step, or
    after the `Retry-After` the answer asks for.

    Delivery runs in a thread of its own once `start` is called: the worker's loop only
    queues (`put`), so an Alertmanager that hangs for its whole timeout never slows
    consumption. `flush` is one delivery attempt (the thread's, or a caller's without a thread)."""

    def __init__(self, url: str, timeout_s: float = 5.0, max_backoff_s: float = 30.0, max_pending: int = 100_000,
                 rng: random.Random | None = None):
        self.target = url.rstrip("/")
        self.url = self.target + "/api/v2/alerts"
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.max_pending = max_pending
        self.pending: deque[dict] = deque()
        self.pending_seqs: deque[int | None] = deque()  # the durable outbox's sequence number of each, if any
        self.delivered_seq = -1  # the highest sequence number delivered (or given up on, refused)
        self.delivered = 0
        self.failures = 0
        self.refused = 0  # alerts dropped on a 4xx
        self._rng = rng or random.Random()
        self._backoff_s = 0.0
        self._next_try = 0.0  # monotonic clock: when to try again after a failure
        self._lock = threading.Lock()  # the queue's ends: the loop appends, the sender pops
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        # One kept-alive connection per Alertmanager (urllib opened a new one per batch), and a
        # deadline on each phase: connecting, sending the batch, and waiting for the answer.
        # httpx is imported here, by a worker that pages: with its command-line extras it is
        # a tenth of a second of every start.
        import httpx

        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s), headers={"Content-Type": "application/json"},
                                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    def put(self, alert: dict, seq: int | None = None) -> None:
        with self._wake:
            if len(self.pending) >= self.max_pending:
                # Never drop silently: the oldest change goes, and the log says so.
                dropped = self.pending.popleft()
                self.pending_seqs.popleft()
                log.error("alert outbox for %s full (%d): dropping the oldest change for %s", self.target,
                          self.max_pending, dropped["labels"])
            self.pending.append(alert)
            self.pending_seqs.append(seq)
            self._wake.notify()

    def start(self) -> None:
        """Deliver from a thread of its own from now on (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._send_forever, name=f"alertmanager {self.target}", daemon=True)
            self._thread.start()

    def _send_forever(self) -> None:
        while True:
            with self._wake:
                while not self.pending:
                    self._wake.wait()
                wait_s = self._next_try - time.monotonic()
            if wait_s > 0:
                time.sleep(min(wait_s, 1.0))
                continue
            try:
                self.flush()
            except Exception:  # the sender must outlive any one bad batch
                log.exception("delivering to Alertmanager at %s failed", self.target)
                time.sleep(1.0)

    def wait_empty(self, wait_s: float) -> bool:
        """Wait up to `wait_s` for the sender to empty the outbox; True when it is."""
        deadline = time.monotonic() + wait_s
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.pending

    def flush(self, batch: int = 500) -> bool:
        """Try to deliver what is pending; True when the outbox is empty afterwards."""
        if not self.pending:
            return True
        if time.monotonic() < self._next_try:
            return False
        while self.pending:
            with self._lock:
                chunk = [(self.pending[i], self.pending_seqs[i]) for i in range(min(batch, len(self.pending)))]
            outcome, retry_after_s = self._post([alert for alert, _seq in chunk])
            if outcome == "retry":
                self.failures += 1
                self._backoff_s = min(self.max_backoff_s, max(0.5, self._backoff_s * 2))
                self._next_try = time.monotonic() + (
                    retry_after_s if retry_after_s is not None else self._rng.uniform(0.0, self._backoff_s))
                return False
            with self._lock:
                for alert, seq in chunk:
                    # What a full outbox dropped meanwhile is gone from the front: pop only ours.
                    if self.pending and self.pending[0] is alert:
                        self.pending.popleft()
                        self.pending_seqs.popleft()
                    if seq is not None and seq > self.delivered_seq:
                        self.delivered_seq = seq
            if outcome == "refused":
                self.refused += len(chunk)
            else:
                self.delivered += len(chunk)
            self._backoff_s = 0.0
        return True

    def _post(self, alerts: list[dict]) -> tuple[str, float | None]:
        """('ok' | 'refused' (a 4xx retrying cannot fix) | 'retry', the Retry-After asked for in seconds)."""
        import httpx  # loaded by the constructor already

        try:
            resp = self._client.post(self.url, content=json.dumps(alerts).encode())
        except httpx.HTTPError as exc:  # unreachable, refused, reset, or a phase past its timeout
            log.warning("Alertmanager at %s did not take %d alerts: %s", self.target, len(alerts),
                        f"{type(exc).__name__}: {exc}")
            return "retry", None
        if resp.is_success:
            return "ok", None
        if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
            log.error("Alertmanager at %s refused %d alerts (HTTP %d: %s): dropped, not retried",
                      self.target, len(alerts), resp.status_code, resp.text[:500].strip())
            return "refused", None
        log.warning("Alertmanager at %s did not take %d alerts: HTTP %d", self.target, len(alerts), resp.status_code)
        return "retry", retry_after(resp.headers.get("Retry-After"), self.max_backoff_s)


def retry_after(value: str | None, most_s: float) -> float | None:
    """A `Retry-After` header (seconds, or an HTTP date) as seconds from now, at most `most_s`."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), most_s)


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
    url = links.dashboard(DETECTOR_DASHBOARD.get(detection.detector, UID_FLEET),
                          {k: v for k, v in labels.items() if k in FILTER_LABELS})
    alert = {
        "labels": {"alertname": detector_alertname(detection.detector),
                   "severity": DETECTOR_SEVERITY.get(detection.detector, "ticket"),
                   "detector": detection.detector, **labels},
        "annotations": {
            "summary": f"{detection.detector.replace('_', ' ')} on {slice_text}: {numbers}",
            "runbook_url": links.runbook(detector_runbook(detection.detector)),
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

    Alertmanager's high availability asks clients to send every alert to every instance of
    the cluster, never to load-balance: each URL has its own outbox, backoff and delivered
    mark, so one instance down holds back nothing sent to the others, and gets everything
    once it is back.

    The outbox is durable: each change's payload is prepared (`prepare_changes`) as a row of
    `_tw_alert_outbox` in the checkpoint that commits the change, and what Alertmanager took
    is marked in `_tw_alert_delivered` by a later checkpoint (`delivery_rows`). On start
    (`restore`) every change past the last mark is sent again, so a page that fired, or
    resolved, while Alertmanager was down is not lost when the worker dies before it was
    delivered (a repeat is the same alert to Alertmanager)."""

    RESEND_S = 60.0

    def __init__(self, urls: Sequence[str] | None = (), stage: str = ""):
        self.outboxes = [AlertmanagerOutbox(u) for u in dict.fromkeys(urls or ())]
        self.stage = stage
        self.payloads: dict[str, dict] = {}  # key (fingerprint, detection id) → payload while firing
        self._last_resend = time.monotonic()
        self._next_seq = 0
        self._prepared: list[tuple[str, bool, dict, int]] = []  # written with the checkpoint, handed out on commit
        self._marked_seq: dict[str, int] = {}  # per target: the delivered mark last written to the store

    @property
    def enabled(self) -> bool:
        return bool(self.outboxes)

    def change(self, key: str, firing: bool, payload: dict, seq: int | None = None) -> None:
        if firing:
            self.payloads[key] = payload
        else:
            self.payloads.pop(key, None)
        for outbox in self.outboxes:
            outbox.put(payload, seq)

    def prepare_changes(self, changes: list[tuple[str, bool, dict]]) -> list[tuple[str, pl.DataFrame]]:
        """Number this checkpoint's changes and return the store rows that make them durable."""
        if not self.outboxes or not changes:
            return []
        rows = []
        for key, firing, payload in changes:
            self._prepared.append((key, firing, payload, self._next_seq))
            rows.append((self.stage, self._next_seq, json.dumps(payload, sort_keys=True)))
            self._next_seq += 1
        return [("_tw_alert_outbox", pl.DataFrame(rows, schema=OUTBOX_SCHEMA, orient="row"))]

    def committed(self) -> None:
        """The checkpoint holding the prepared changes is durable: hand them to the outbox."""
        prepared, self._prepared = self._prepared, []
        for key, firing, payload, seq in prepared:
            self.change(key, firing, payload, seq)
        if prepared:
            self.deliver()

    def delivery_rows(self) -> list[tuple[str, pl.DataFrame]]:
        """Rows marking what each Alertmanager has taken since its last mark (for a checkpoint)."""
        rows = []
        for outbox in self.outboxes:
            if outbox.delivered_seq > self._marked_seq.get(outbox.target, -1):
                self._marked_seq[outbox.target] = outbox.delivered_seq
                rows.append((self.stage, outbox.delivered_seq, outbox.target))
        return [("_tw_alert_delivered", pl.DataFrame(rows, schema=DELIVERED_SCHEMA, orient="row"))] if rows else []

    def restore(self, con) -> None:
        """On start: queue, per Alertmanager, every change past its last delivered mark, in order.
        (A mark without a target is from the single-URL days: it stands for every target.)"""
        if not self.outboxes:
            return
        row = con.execute("SELECT max(seq) FROM _tw_alert_outbox WHERE stage = ?", [self.stage]).fetchone()
        self._next_seq = row[0] + 1 if row and row[0] is not None else 0
        for outbox in self.outboxes:
            row = con.execute("SELECT max(seq) FROM _tw_alert_delivered WHERE stage = ? AND coalesce(target, ?) = ?",
                              [self.stage, outbox.target, outbox.target]).fetchone()
            mark = row[0] if row and row[0] is not None else -1
            self._marked_seq[outbox.target] = outbox.delivered_seq = mark
            undelivered = con.execute(
                "SELECT seq, payload FROM _tw_alert_outbox WHERE stage = ? AND seq > ? ORDER BY seq",
                [self.stage, mark]).fetchall()
            for seq, payload in undelivered:
                outbox.put(json.loads(payload), seq)
            if undelivered:
                log.info("%s: %d alert changes not confirmed delivered to %s before the restart are sent again",
                         self.stage, len(undelivered), outbox.target)

    def deliver(self, wait_s: float = 0.0) -> None:
        """Hand every outbox to its sender thread (started on the first call: until then the
        changes wait, see streams/runtime.py), queue the periodic resend of what is firing,
        and with `wait_s` wait up to that long for the outboxes to empty."""
        if not self.outboxes:
            return
        if time.monotonic() - self._last_resend >= self.RESEND_S:
            self._last_resend = time.monotonic()
            for payload in self.payloads.values():
                for outbox in self.outboxes:
                    outbox.put(payload)
        for outbox in self.outboxes:
            outbox.start()
        deadline = time.monotonic() + wait_s
        for outbox in self.outboxes:
            outbox.wait_empty(max(0.0, deadline - time.monotonic()))

    def pending(self) -> dict[str, int]:
        """Changes waiting per Alertmanager."""
        return {o.target: len(o.pending) for o in self.outboxes}

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per Alertmanager: alerts delivered and alerts refused (4xx, dropped)."""
        return {o.target: (o.delivered, o.refused) for o in self.outboxes}


class DeliveryCollector:
    """`tailwatch_alerts_delivered_total` and `tailwatch_alerts_refused_total` per stage and
    Alertmanager (the configured URLs: a handful, so the label stays bounded). One per
    process, over every stage's FiringAlerts: two collectors would export each name twice."""

    def __init__(self, alerts: Sequence[FiringAlerts]):
        self.alerts = list(alerts)

    def describe(self):
        return []

    def collect(self):
        delivered = CounterMetricFamily(ALERTS_DELIVERED_TOTAL, "Alert changes Alertmanager took, per instance.",
                                        labels=["stage", "alertmanager"])
        refused = CounterMetricFamily(ALERTS_REFUSED_TOTAL, "Alert changes an Alertmanager refused with a 4xx "
                                      "(dropped with a log line, never retried).", labels=["stage", "alertmanager"])
        pending = GaugeMetricFamily(ALERTS_PENDING, "Alert changes queued for an Alertmanager, not yet taken "
                                    "(delivery runs off the consume loop; a hung instance grows this, not the lag).",
                                    labels=["stage", "alertmanager"])
        for alerts in self.alerts:
            for target, (ok, bad) in alerts.counts().items():
                delivered.add_metric([alerts.stage, target], ok)
                refused.add_metric([alerts.stage, target], bad)
            for target, waiting in alerts.pending().items():
                pending.add_metric([alerts.stage, target], waiting)
        yield delivered
        yield refused
        yield pending
