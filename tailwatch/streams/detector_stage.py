"""The worker's detector stage: closed minutes → detectors → `detections`, Alertmanager, /metrics.

Requests and GPU samples close in separate checkpoints (each topic has its own
watermark, and one may run far ahead of the other), so the stage holds closed rows until
both tables have closed a minute, then feeds the detectors minute by minute in event-time
order: every detector sees a minute whole, and a replay cuts the same minutes. A table
that has had no row while the other has closed `ABSENT_SOURCE_MINUTES` more is taken
as absent (a fleet without GPU telemetry, a collector that died) and no longer holds the
detectors back.

Store (written in the checkpoint transaction):
- `detection_events`: one row per change (raised, ended) with the slice labels and the
  evidence (JSON objects: numbers, and words such as the signal a detector used); `detections` is a view with one row per detection:
  detector, slice, started_at, ended_at (NULL while open), evidence.
- `_tw_detector_progress`: the minute the detectors have processed up to; a NULL row alone:
  the detectors were on when the store's first rows landed and have processed none yet.
- `_tw_detector_models`: each fitted anomaly model (version, fit window, pickled forest).

On start, detector state is rebuilt by replaying the store's last minutes silently (as
long as the longest window and baseline need), the stored open detections are adopted
as the same detections, and the newest anomaly model is loaded: a restart continues the
detections of an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime

import duckdb
import polars as pl
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tailwatch.alerts.alertmanager import (
    AlertLinks,
    FiringAlerts,
    detection_to_alertmanager,
)
from tailwatch.detectors import config as detector_config
from tailwatch.detectors.anomaly import NAME as ANOMALY
from tailwatch.detectors.anomaly import AnomalyModel
from tailwatch.detectors.core import (
    MINUTE_COL,
    REQUEST_COLUMNS_READ,
    Detection,
    DetectionEvent,
    Minute,
    MinuteBatch,
    slice_key,
    summaries,
    with_minute,
)
from tailwatch.slo.contributors import OpenDetection
from tailwatch.slo.alert_windows import minute_start_utc, minutes_text
from tailwatch.store.queries import bucket_runs
from tailwatch.slo.columns import compact_strings
from tailwatch.conventions import (
    ANOMALY_MODEL_VERSION, DETECTION_STARTED_TIMESTAMP_SECONDS, DETECTIONS_ACTIVE, DETECTIONS_TOTAL,
    DETECTOR_PROCESSED_TIMESTAMP_SECONDS, SLICE_LABELS,
)

log = logging.getLogger("tailwatch.detectors")

ABSENT_SOURCE_MINUTES = 60
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS detection_events (
    detection_id VARCHAR, detector VARCHAR, state VARCHAR, changed_at TIMESTAMP, started_at TIMESTAMP,
    labels VARCHAR, evidence VARCHAR
);
CREATE TABLE IF NOT EXISTS _tw_detector_progress (processed_before_minute BIGINT);
CREATE TABLE IF NOT EXISTS _tw_detector_models (
    detector VARCHAR, version INTEGER, fit_from TIMESTAMP, fit_to TIMESTAMP, fit_rows BIGINT, model BLOB
);
CREATE OR REPLACE VIEW detections AS
SELECT r.detection_id, r.detector, r.labels AS slice, r.started_at, e.changed_at AS ended_at, r.evidence,
       e.evidence AS end_evidence
FROM detection_events r
LEFT JOIN (SELECT * FROM detection_events WHERE state = 'ended') e USING (detection_id)
WHERE r.state = 'raised';
"""
EVENT_SCHEMA = {"detection_id": pl.String, "detector": pl.String, "state": pl.String, "changed_at": pl.Datetime("us"),
                "started_at": pl.Datetime("us"), "labels": pl.String, "evidence": pl.String}
MODEL_SCHEMA = {"detector": pl.String, "version": pl.Int32, "fit_from": pl.Datetime("us"), "fit_to": pl.Datetime("us"),
                "fit_rows": pl.Int64, "model": pl.Binary}
_EPOCH = datetime(1970, 1, 1)


def _minute_of(ts: datetime) -> int:
    return int((ts - _EPOCH).total_seconds()) // 60  # the store's TIMESTAMPs are naive UTC


def _newest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _first_pending(*pending: PendingMinutes) -> int | None:
    return min((m for p in pending if (m := p.first_minute()) is not None), default=None)


class PendingMinutes:
    """One table's closed rows waiting for the detectors, kept as the frames they came in
    (each with its MINUTE_COL), not split per minute: on thin traffic a checkpoint closes a
    hundred minutes, and splitting them only to concatenate them again when they are
    ready cost a fifth of the detector stage."""

    def __init__(self, table: str, hold: Callable[[pl.DataFrame], pl.DataFrame | None] | None = None):
        self.table = table
        self.hold = hold  # what of the rows is worth holding (None: the rows)
        self.frames: list[tuple[int, int, pl.DataFrame]] = []  # (first minute, last minute, rows)

    def add(self, frame: pl.DataFrame | None, not_before: int | None = None) -> int | None:
        """Hold the rows of minutes from `not_before` on; the newest minute among them (None: no rows)."""
        f = with_minute(frame) if frame is not None and {"window_start", MINUTE_COL} & set(frame.columns) else None
        if f is None:
            return None
        newest = f[MINUTE_COL].max()
        if not_before is not None and f[MINUTE_COL].min() < not_before:
            # Only when the table was taken as absent: the detectors have moved on.
            late = f.filter(pl.col(MINUTE_COL) < not_before)[MINUTE_COL].unique().sort().to_list()
            log.warning("%s rows of minutes %s (UTC) closed after the detectors passed them: not seen by detectors",
                        self.table, minutes_text(late))
            f = f.filter(pl.col(MINUTE_COL) >= not_before)
        if self.hold is not None and f.height:
            f = self.hold(f)
        if f is not None and f.height:
            f = compact_strings(f)  # held up to an hour: not pinning the buffers of every batch that fed it
            self.frames.append((f[MINUTE_COL].min(), f[MINUTE_COL].max(), f))
        return newest

    def first_minute(self) -> int | None:
        return min((first for first, _, _ in self.frames), default=None)

    def overlap_until(self, until: int) -> bool:
        """Whether two held frames have rows of one minute up to `until` (it closed in two
        checkpoints): their summaries must then be summed again."""
        spans = sorted((first, min(last, until)) for first, last, _ in self.frames if first <= until)
        return any(later[0] <= earlier[1] for earlier, later in zip(spans, spans[1:]))

    def take_until(self, until: int) -> pl.DataFrame | None:
        """The rows of minutes up to `until`, taken out, as one frame."""
        taken, kept = [], []
        for first, last, f in self.frames:
            if last <= until:
                taken.append(f)
            elif first > until:
                kept.append((first, last, f))
            else:
                taken.append(f.filter(pl.col(MINUTE_COL) <= until))
                rest = f.filter(pl.col(MINUTE_COL) > until)
                kept.append((rest[MINUTE_COL].min(), last, rest))
        self.frames = kept
        return pl.concat(taken, how="diagonal_relaxed") if taken else None


OPEN_DETECTION_SERIES = 200


def evidence_text(evidence: dict[str, float | str], limit: int = 160) -> str:
    """A detection's evidence in one short line: `retry_ratio=0.31 requests=1.2e+03`."""
    parts = [f"{k}={v:.3g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in sorted(evidence.items())]
    text = " ".join(parts)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def open_detection_family(open_detections: list[Detection]) -> GaugeMetricFamily:
    """One series per open detection (the newest OPEN_DETECTION_SERIES): its start in Unix
    seconds, labelled by detector, every slice label (empty where it does not slice by one)
    and its evidence."""
    family = GaugeMetricFamily(DETECTION_STARTED_TIMESTAMP_SECONDS,
                               "When each open detection started (event time), with its slice and evidence.",
                               labels=["detector", *SLICE_LABELS, "evidence"])
    newest = sorted(open_detections, key=lambda d: (-d.started_at, d.detection_id))[:OPEN_DETECTION_SERIES]
    for d in newest:
        family.add_metric([d.detector, *(str(d.labels.get(k, "")) for k in SLICE_LABELS), evidence_text(d.evidence)],
                          d.started_at * 60)
    return family


class DetectorCollector:
    """Prometheus view: detections raised (counter) and open (gauge) per detector, the
    event-time minute processed, and the anomaly model version, each labelled by `detector`
    alone; and one series per open detection (when it started, with its slice and the
    evidence it was raised on), so a dashboard can say who hurts and why. Those series are
    as many as the open detections, and at most OPEN_DETECTION_SERIES (the newest)."""

    def __init__(self, names: list[str]):
        self.names = names
        self.raised: dict[str, int] = {n: 0 for n in names}
        self.active: dict[str, int] = {n: 0 for n in names}
        self.open: list[Detection] = []  # replaced whole, never mutated: /metrics reads it from another thread
        self.processed_before_minute: int | None = None
        self.model_version = 0

    def describe(self):
        return []

    def collect(self):
        total = CounterMetricFamily(DETECTIONS_TOTAL, "Detections raised since the worker started.",
                                    labels=["detector"])
        active = GaugeMetricFamily(DETECTIONS_ACTIVE, "Detections open now.", labels=["detector"])
        for n in self.names:
            total.add_metric([n], self.raised[n])
            active.add_metric([n], self.active[n])
        yield total
        yield active
        yield open_detection_family(self.open)
        if self.processed_before_minute is not None:
            yield GaugeMetricFamily(DETECTOR_PROCESSED_TIMESTAMP_SECONDS,
                                    "Event time up to which the detectors have processed closed minutes.",
                                    value=self.processed_before_minute * 60)
        yield GaugeMetricFamily(ANOMALY_MODEL_VERSION, "Version of the anomaly model in use (0: none yet).",
                                value=self.model_version)


class DetectorStage:
    name = "detectors"

    def __init__(self, cfg: detector_config.DetectorsConfig | None = None, alertmanager_urls: tuple[str, ...] = (),
                 links: AlertLinks | None = None):
        self.cfg = cfg or detector_config.DetectorsConfig()
        self.set = detector_config.DetectorSet(self.cfg)
        self.links = links or AlertLinks()
        self.alerts = FiringAlerts(alertmanager_urls, stage="detectors")
        self.collector = DetectorCollector([d.name for d in self.set.detectors])
        # Held up to ABSENT_SOURCE_MINUTES while GPU telemetry has not shown up: only their
        # summaries by the label sets the detectors read (with 20,000 slices, whole rows
        # grew RSS by 11 MiB a minute; the columns the detectors read, by 5).
        self.label_sets = self.set.label_sets()
        self.pending_requests = PendingMinutes("sli_minute", lambda rows: summaries(rows, self.label_sets))
        self.pending_gpu = PendingMinutes("gpu_minute")
        self.backlogged: frozenset[str] = frozenset()  # as of the last on_closed (see there)
        self.max_request_minute: int | None = None
        self.max_gpu_minute: int | None = None
        self.processed_before: int | None = None  # the next minute to feed the detectors
        self._marked_start = False  # the store says the detectors were on from its first rows (see on_closed)
        self._uncommitted: list[tuple[str, str, dict]] = []  # (id, state, Alertmanager payload) of the last on_closed

    @classmethod
    def from_option(cls, value: str | None, alertmanager_urls: tuple[str, ...] = (),
                    links: AlertLinks | None = None) -> DetectorStage | None:
        """`--detectors FILE|default|none` → a stage (or None). A bad file raises
        DetectorConfigError, a ValueError with a one-line message."""
        if value == "none":
            return None
        cfg = detector_config.load(None if value in (None, "default") else value)
        return cls(cfg, alertmanager_urls, links) if cfg.enabled() else None

    # ---- Stage protocol ------------------------------------------------------------
    def open_detections(self) -> list[OpenDetection]:
        """The detections open now, as the SLO stage's contributors take them."""
        return [OpenDetection(d.detector, dict(d.labels), d.started_at, d.ended_at) for d in self.collector.open]

    def collectors(self) -> list:
        return [self.collector]

    def rebuild(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(SCHEMA_SQL)
        self.alerts.restore(con)
        # fetchall, not fetchone: DuckDB refuses the next query while a result is unfinished.
        marks, row = con.execute("SELECT count(*), max(processed_before_minute) FROM _tw_detector_progress").fetchall()[0]
        processed_before = int(row) if row is not None else None
        newest = [con.execute(f"SELECT max(window_start) FROM {t}").fetchall()[0][0] for t in ("sli_minute", "gpu_minute")]
        newest_minutes = [_minute_of(t) for t in newest if t is not None]
        if not newest_minutes:
            return  # a fresh store
        fed_nothing = processed_before is None and marks > 0
        if fed_nothing:
            # On since the store's first rows and stopped before feeding any minute (one table
            # closed minutes, the other none yet): every stored row still waits for them. Taken
            # for history from before the detectors, what they would have raised on those
            # minutes was never raised (a tier-2 replica killed then had no detection the
            # others had).
            oldest = [con.execute(f"SELECT min(window_start) FROM {t}").fetchall()[0][0] for t in ("sli_minute", "gpu_minute")]
            processed_before = min(_minute_of(t) for t in oldest if t is not None)
        elif processed_before is None:
            # Detectors switched on for a store with history: learn from it, raise nothing for the past.
            processed_before = max(newest_minutes) + 1
        start = processed_before - self.cfg.history_minutes()
        anomaly = self.set.get(ANOMALY)
        models: list[AnomalyModel] = []
        if anomaly is not None:
            # Every stored version, so that the replay scores each minute with the model that
            # scored it the first time (which minutes were anomalous decides what later fits
            # and baselines learn from); nothing is refitted during the replay.
            models = [AnomalyModel.from_blob(int(v), _minute_of(a), _minute_of(b), int(n), blob)
                      for v, a, b, n, blob in con.execute(
                          "SELECT version, fit_from, fit_to, fit_rows, model FROM _tw_detector_models "
                          "WHERE detector = ? ORDER BY version", [ANOMALY]).fetchall()]
            anomaly.fitting = False
        self.max_request_minute = self.max_gpu_minute = None
        first = None  # the oldest minute with rows: the replay begins there
        # Runs of whole minutes of bounded rows: a big fleet's history (its rows, then a
        # summary object per label-set slice and minute) held at once took gigabytes.
        for lo, hi, request_rows, gpu_rows in bucket_runs(con, start, ", ".join(sorted(REQUEST_COLUMNS_READ))):
            requests, gpu = with_minute(request_rows), with_minute(gpu_rows)
            end = processed_before if hi is None else min(hi, processed_before)
            if requests is not None:
                self.max_request_minute = requests[MINUTE_COL].max()
            if gpu is not None:
                self.max_gpu_minute = gpu[MINUTE_COL].max()
            requests = summaries(requests, self.label_sets)
            batch = MinuteBatch(requests, gpu, one_summary_per_slice=True)  # one run's rows, summarised at once
            if first is None:
                first = min(batch.minutes(), default=None)
            for minute in range(max(first if first is not None else end, lo), end):
                if anomaly is not None:
                    # A model fitted at minute F scores from F + 1 on (the fit runs while F is scored).
                    anomaly.model = next((mdl for mdl in reversed(models) if mdl.fit_to_minute < minute), None)
                self.set.observe(Minute(minute, batch=batch))
            for pending, rows in ((self.pending_requests, requests), (self.pending_gpu, gpu)):
                if rows is not None:
                    pending.add(rows.filter(pl.col(MINUTE_COL) >= processed_before))
        if anomaly is not None:
            anomaly.fitting = True
            if models:
                anomaly.load(models[-1])
                self.collector.model_version = models[-1].version
            anomaly.resume_fit(processed_before)
        self._adopt_open(con)
        if fed_nothing:  # as before the stop: the first minute fed is the first pending one, whichever table's
            self._marked_start = True
            return
        self.processed_before = processed_before
        self.collector.processed_before_minute = processed_before

    def _adopt_open(self, con: duckdb.DuckDBPyConnection) -> None:
        """The store's open detections continue as themselves; any the replay opened that
        the store does not hold are dropped (they are raised again if the condition holds)."""
        rows = con.execute("SELECT detector, slice, started_at, evidence FROM detections WHERE ended_at IS NULL").fetchall()
        stored: dict[str, dict] = {}
        for detector, labels, started_at, evidence in rows:
            d = Detection(detector, json.loads(labels), _minute_of(started_at), None, json.loads(evidence))
            stored.setdefault(detector, {})[slice_key(d.labels)] = d
        for det in self.set.detectors:
            det.tracker.open.clear()
            for d in stored.get(det.name, {}).values():
                det.tracker.adopt(d)
                self.alerts.change(d.detection_id, True, detection_to_alertmanager(d, d.evidence, self.links))
        self._publish_open()

    def _publish_open(self) -> None:
        for det in self.set.detectors:
            self.collector.active[det.name] = len(det.tracker.open)
        self.collector.open = [d for det in self.set.detectors for d in det.tracker.open.values()]

    def on_closed(self, requests: pl.DataFrame, gpu: pl.DataFrame,
                  backlogged: frozenset[str] = frozenset()) -> dict[str, pl.DataFrame]:
        self.backlogged = backlogged
        self.max_request_minute = _newest(self.max_request_minute, self.pending_requests.add(requests, self.processed_before))
        self.max_gpu_minute = _newest(self.max_gpu_minute, self.pending_gpu.add(gpu, self.processed_before))
        until = self._ready_until()
        events: list[DetectionEvent] = []
        if until is not None:
            if self.processed_before is None:
                self.processed_before = _first_pending(self.pending_requests, self.pending_gpu)
            history = self.cfg.history_minutes()
            # Every ready minute summarised in one pass per label set (MinuteBatch), then
            # fed to the detectors minute by minute.
            unique = not self.pending_requests.overlap_until(until)
            batch = MinuteBatch(self.pending_requests.take_until(until), self.pending_gpu.take_until(until),
                                one_summary_per_slice=unique)
            minute = self.processed_before
            last_data = max(batch.minutes(), default=None)
            while minute <= until:
                events.extend(self.set.observe(Minute(minute, batch=batch)))
                minute += 1
                if (last_data is None or minute > last_data) and until - minute > history:
                    minute = until - history  # a long gap: empty minutes past every window change nothing
            self.processed_before = until + 1
            self.collector.processed_before_minute = self.processed_before
        out = {"detection_events": self._event_rows(events)}
        if until is not None:
            out["_tw_detector_progress"] = pl.DataFrame({"processed_before_minute": [self.processed_before]},
                                                        schema={"processed_before_minute": pl.Int64})
        elif self.processed_before is None and not self._marked_start and \
                (self.max_request_minute is not None or self.max_gpu_minute is not None):
            # Rows land with this checkpoint and none is fed yet: a NULL row says the detectors
            # were on from the store's first rows, so that a restart feeds them these rows rather
            # than take them for history from before the detectors (see `rebuild`).
            out["_tw_detector_progress"] = pl.DataFrame({"processed_before_minute": [None]},
                                                        schema={"processed_before_minute": pl.Int64})
            self._marked_start = True
        anomaly = self.set.get(ANOMALY)
        if anomaly is not None and anomaly.new_models:
            out["_tw_detector_models"] = pl.DataFrame([
                {"detector": ANOMALY, "version": mdl.version, "fit_from": minute_start_utc(mdl.fit_from_minute),
                 "fit_to": minute_start_utc(mdl.fit_to_minute), "fit_rows": mdl.rows, "model": mdl.to_blob()}
                for mdl in anomaly.new_models], schema=MODEL_SCHEMA)
            self.collector.model_version = anomaly.new_models[-1].version
            anomaly.new_models = []
        self._publish_open()
        for e in events:
            if e.state == "raised":
                self.collector.raised[e.detection.detector] += 1
        changes, self._uncommitted = self._uncommitted, []
        out.update(self.alerts.prepare_changes([(i, state == "raised", p) for i, state, p in changes]))
        return out

    def _ready_until(self) -> int | None:
        """The newest minute that both tables have closed (or that one table's silence lets go)."""
        r, g = self.max_request_minute, self.max_gpu_minute
        if r is None and g is None:
            return None
        # A source that has sent nothing for an hour of the other's buckets (a fleet without
        # GPU telemetry, or a collector that died) is taken as absent rather than late: the
        # detectors go on an hour behind instead of waiting for it, and holding the other
        # table's minutes, for ever.
        # Only a source read to its end can be absent: one with records still to read (a
        # backlog drained one topic first) is behind, and the other's minutes wait for it.
        newest = max(m for m in (r, g) if m is not None)
        lagging = "sli_minute" if r is None or (g is not None and r < g) else "gpu_minute"
        if r is not None and g is not None:
            until = min(r, g) if lagging in self.backlogged else max(newest - ABSENT_SOURCE_MINUTES, min(r, g))
        elif lagging in self.backlogged:
            return None
        else:
            until = newest - ABSENT_SOURCE_MINUTES
        if self.processed_before is not None and until < self.processed_before:
            return None
        first = _first_pending(self.pending_requests, self.pending_gpu)
        if self.processed_before is None and first is not None and until < first:
            return None
        return until

    def _event_rows(self, events: list[DetectionEvent]) -> pl.DataFrame:
        rows = []
        for e in events:
            d = e.detection
            rows.append({
                "detection_id": d.detection_id, "detector": d.detector, "state": e.state,
                "changed_at": minute_start_utc(e.at_minute), "started_at": minute_start_utc(d.started_at),
                "labels": json.dumps(d.labels, sort_keys=True), "evidence": json.dumps(e.evidence, sort_keys=True),
            })
            # The payload is built now: `d` is the live record and may end within this checkpoint.
            snapshot = Detection(d.detector, dict(d.labels), d.started_at, e.at_minute if e.state == "ended" else None,
                                 dict(d.evidence))
            self._uncommitted.append((d.detection_id, e.state,
                                      detection_to_alertmanager(snapshot, dict(e.evidence), self.links)))
        return pl.DataFrame(rows, schema=EVENT_SCHEMA)

    def on_corrected(self, requests: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """A detector judged each minute as it closed; a correction of the past changes no detection."""
        return {}

    def committed(self) -> None:
        self.alerts.committed()


def detector_stages(value: str | None, alertmanager_urls: tuple[str, ...] = (),
                    links: AlertLinks | None = None) -> list[DetectorStage]:
    """`--detectors FILE|default|none` → the stages list entry (empty when off)."""
    stage = DetectorStage.from_option(value, alertmanager_urls, links)
    return [stage] if stage is not None else []
