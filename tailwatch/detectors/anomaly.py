"""Anomaly: silent degradation that no fixed threshold catches.

Per slice (default: model, model_version), every minute gives a feature vector of how the
slice differs from its own trailing baseline (the previous hour): error ratio, task
success, end-to-end p95, output tokens per answered request, prompt tokens and
GPU-seconds per request, each as a robust z-score against the slice's own median and
spread (sizes and latencies on a log scale). Relative features let one model
cover every slice: an ASR slice without output tokens and an LLM slice with hundreds,
a busy stable version and a small noisy canary, all sit near zero when normal. "HTTP 200
with output tokens collapsing for one model version" is a point far out on one axis.

The model is a local outlier factor in novelty mode by default (`detectors.outlier_factor`:
scikit-learn's model, scored without scikit-learn's per-call and import costs),
scikit-learn's IsolationForest on request (`model`); see `fit_model` for why the default
is not the forest.

The model is fitted on the trailing `fit_window_minutes` of slice-minutes, at most every
`refit_every_minutes` of event time (at minutes aligned to that period, so a replay fits
at the same minutes on the same rows), in a thread off the worker's loop, and scores from
the next minute on; LocalOutlierFactor has no randomness and the forest
a fixed `random_state`, so the same buckets give the same model. Rows
scored anomalous are left out of later fits, so an ongoing degradation is not learned
as normal. Each fit is a new version (number, fit window), handed to the caller to
persist; `load` puts a persisted one back after a restart.
"""

from __future__ import annotations

import io
import math
import pickle
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from operator import sub
from typing import Literal, NamedTuple

import numpy as np

from tailwatch.detectors.core import (
    DetectionEvent,
    Finding,
    History,
    Minute,
    SliceKey,
    SliceMinute,
    Tracker,
    median,
    ratio,
    SliceBy,
)
from tailwatch.detectors.outlier_factor import LocalOutlierFactor
from tailwatch.detectors.sorted_baseline import SortedBaseline, robust_z
from tailwatch.config import ConfigStruct, Count, Minutes, PositiveCount

NAME = "anomaly"
FEATURES = ("error_ratio_z", "e2e_ms_p95_z", "output_tokens_per_ok_z", "task_success_z",
            "prompt_tokens_per_request_z", "gpu_seconds_per_request_z")


MODELS = ("local_outlier_factor", "isolation_forest")


class AnomalyConfig(ConfigStruct):
    enabled: bool = True
    slice_by: SliceBy = ("model", "model_version")
    min_requests: Count = 20  # a slice-minute with fewer requests is neither scored nor learned from
    baseline_minutes: Minutes = 60
    min_baseline_minutes: Minutes = 10
    fit_window_minutes: Minutes = 240
    refit_every_minutes: Minutes = 60
    min_fit_rows: PositiveCount = 200
    model: Literal[MODELS] = "local_outlier_factor"  # or "isolation_forest"
    n_neighbors: PositiveCount = 20  # local_outlier_factor
    n_estimators: PositiveCount = 100  # isolation_forest
    random_state: int = 0  # isolation_forest
    score_threshold: float = -3.0  # the model's score_samples strictly below this is anomalous
    window_minutes: Minutes = 3
    anomalous_minutes: Minutes = 3  # anomalous minutes within the window that raise a detection
    clear_minutes: Minutes = 3


class RawFeatures(NamedTuple):
    """One slice-minute's measures, each on the scale its robust z-score is taken on:
    ratios of counts as they are, sizes and latencies as logs (taken once, when the minute is
    measured, not again each minute it spends in a baseline)."""

    error_ratio: float
    log_e2e_ms_p95: float | None
    log_output_tokens_per_ok: float
    task_success: float | None
    log_prompt_tokens_per_request: float
    log_gpu_seconds_per_request: float


# The smallest spread each feature's z-score divides by, in RawFeatures order.
_SPREAD_FLOORS = (0.02, 0.05, 0.05, 0.02, 0.05, 0.05)


@dataclass
class AnomalyModel:
    """A fitted model with its version and the event-time minutes it was fitted on."""

    version: int
    fit_from_minute: int
    fit_to_minute: int  # exclusive
    rows: int
    forest: object  # the fitted estimator, anything with `score_samples` (see fit_model)

    def to_blob(self) -> bytes:
        buf = io.BytesIO()
        pickle.dump(self.forest, buf, protocol=pickle.HIGHEST_PROTOCOL)
        return buf.getvalue()

    @staticmethod
    def from_blob(version: int, fit_from: int, fit_to: int, rows: int, blob: bytes) -> AnomalyModel:
        # The blob was written by this process's own store (the worker's DuckDB file), not
        # taken from the network: unpickling it is as trusted as the store itself.
        return AnomalyModel(version, fit_from, fit_to, rows, pickle.loads(blob))


def raw_features(s: SliceMinute) -> RawFeatures:
    return RawFeatures(
        error_ratio=ratio(s.errors + s.timeouts, s.requests) or 0.0,
        log_e2e_ms_p95=_log(s.e2e_ms_p95, 1.0),
        log_output_tokens_per_ok=_log(ratio(s.output_tokens, s.ok) or 0.0, 1.0),
        task_success=ratio(s.successful_turns, s.turns),
        log_prompt_tokens_per_request=_log(ratio(s.prompt_tokens, s.requests) or 0.0, 1.0),
        log_gpu_seconds_per_request=_log(ratio(s.gpu_seconds, s.requests) or 0.0, 1e-3),
    )


def _robust_z(now: float | None, base: Sequence[float | None], floor: float) -> float:
    """How many spreads `now` sits from the baseline's median; the spread is the baseline's
    own (1.4826 × median absolute deviation, the normal-consistent scale), never under
    `floor`, so a small slice's noisy minutes and a large slice's steady ones land on the
    same scale and one model fits both."""
    if now is None:
        return 0.0
    vals = [b for b in base if b is not None]
    if not vals:
        return 0.0
    middle = median(vals)
    # |v - median| for every v in C loops (map): this runs for six features of every scored
    # slice each minute.
    spread = 1.4826 * median(list(map(abs, map(sub, vals, repeat(middle)))))
    return (now - middle) / max(spread, floor)


def _log(x: float | None, eps: float) -> float | None:
    return None if x is None else math.log(x + eps)


def relative_features(now: RawFeatures, base: list[RawFeatures]) -> list[float]:
    """The slice's distance from its own trailing baseline, one robust z-score per FEATURES
    entry (ratios of counts on their own scale, sizes and latencies on a log scale)."""
    columns = zip(*base) if base else ([] for _ in now)
    return [_robust_z(x, column, floor) for x, column, floor in zip(now, columns, _SPREAD_FLOORS)]


def fit_model(rows: np.ndarray, cfg: AnomalyConfig):
    """Both are novelty detectors whose `score_samples` is lower for odder rows (the local
    outlier factor is scikit-learn's model, scored by `detectors.outlier_factor`; the forest is
    scikit-learn's). Local outlier factor (the default) measures how much sparser a row's
    neighbourhood is than its neighbours' own: it grows without bound with the distance
    from the training rows. An isolation forest only ranks along each feature, so a row
    beyond the training range scores like the most extreme training row: measured here,
    an output-token collapse 40 spreads out scored −0.43 to −0.63 while ordinary noisy
    minutes of a small canary scored −0.60 to −0.69, which no threshold separates."""
    if cfg.model == "isolation_forest":
        from sklearn.ensemble import (
            IsolationForest,  # imported on first fit: sklearn is slow to import
        )

        return IsolationForest(n_estimators=cfg.n_estimators, random_state=cfg.random_state).fit(rows)
    if cfg.model == "local_outlier_factor":
        return LocalOutlierFactor(cfg.n_neighbors).fit(rows)
    raise ValueError(f"anomaly.model: unknown model {cfg.model!r} (known: {', '.join(MODELS)})")


class AnomalyDetector:
    name = NAME

    def __init__(self, cfg: AnomalyConfig):
        self.cfg = cfg
        self.raw = History(cfg.baseline_minutes + 1)
        self.training: deque[tuple[int, list[float]]] = deque()  # (minute, features) of normal slice-minutes
        self.recent: dict[SliceKey, dict[int, float]] = {}  # slice → minute → score (last window)
        self.labels: dict[SliceKey, dict[str, str]] = {}
        self._baselines: dict[SliceKey, SortedBaseline] = {}  # each scored slice's baseline, sorted (see _relative)
        self.anomalous_run: dict[SliceKey, int] = {}  # consecutive anomalous minutes per slice
        self.model: AnomalyModel | None = None
        self.fitting = True  # off while a restart replays history: the stored model is put back after
        self._fit: tuple[int, Future] | None = None  # (the minute it was started at, the fit running off the loop)
        self.new_models: list[AnomalyModel] = []  # fitted since the caller last took them
        self.tracker = Tracker(NAME, cfg.clear_minutes)

    def load(self, model: AnomalyModel) -> None:
        self.model = model

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return (tuple(self.cfg.slice_by),)

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg = self.cfg
        if self._fit is not None and m.minute > self._fit[0]:
            self._install()
        if self.fitting and m.minute % cfg.refit_every_minutes == 0:
            self._start_fit(m.minute)
        scored: list[tuple[SliceKey, list[float]]] = []
        raws: dict[SliceKey, RawFeatures] = {}
        for key, s in m.slices(tuple(cfg.slice_by)).items():
            if s.requests < cfg.min_requests:
                continue
            now = raw_features(s)
            base = self.raw.before(key, m.minute, 1, cfg.baseline_minutes + 1)  # every minute kept, before this one
            self.labels[key] = s.labels
            if len(base) >= cfg.min_baseline_minutes:
                scored.append((key, self._relative(key, now, base[-cfg.baseline_minutes:])))
            else:
                self.raw.add(key, s.labels, m.minute, now)
            raws[key] = now
        scores = {}
        if scored and self.model is not None:
            values = self.model.forest.score_samples(np.array([f for _, f in scored]))
            scores = {key: float(v) for (key, _), v in zip(scored, values)}
        for key, features in scored:
            score = scores.get(key)
            normal = score is None or score >= cfg.score_threshold
            run = 0 if normal else self.anomalous_run.get(key, 0) + 1
            self.anomalous_run[key] = run
            if normal:
                self.training.append((m.minute, features))  # normal (or not yet judged): learn from it
            if normal or run > cfg.baseline_minutes:
                # Anomalous minutes stay out of the slice's baseline, so the minutes after a
                # fault are not judged against it; one that lasts a whole baseline is the new normal.
                self.raw.add(key, self.labels[key], m.minute, raws[key])
            self.recent.setdefault(key, {})[m.minute] = score if score is not None else 0.0
        self.raw.trim(m.minute)
        for key in [k for k in self._baselines if k not in self.raw.values]:
            del self._baselines[key]
        while self.training and self.training[0][0] < m.minute - cfg.fit_window_minutes:
            self.training.popleft()
        findings = []
        features_of = dict(scored)
        for key in sorted(self.recent):
            window = {mm: v for mm, v in self.recent[key].items() if mm > m.minute - cfg.window_minutes}
            self.recent[key] = window
            bad = [v for v in window.values() if v < cfg.score_threshold]
            if len(bad) >= cfg.anomalous_minutes and self.model is not None:
                ev = {"score": round(min(bad), 4), "score_threshold": cfg.score_threshold,
                      "anomalous_minutes": len(bad), "window_minutes": cfg.window_minutes,
                      "model_version_fitted": self.model.version}
                if key in features_of:
                    ev.update({f: round(x, 4) for f, x in zip(FEATURES, features_of[key])})
                findings.append(Finding(self.labels[key], ev))
        return self.tracker.update(m.minute, findings)

    def _relative(self, key: SliceKey, now: RawFeatures, base: list[RawFeatures]) -> list[float]:
        """`relative_features(now, base)`, from the slice's baseline kept sorted as it moves."""
        order = self._baselines.get(key)
        if order is None:
            order = self._baselines[key] = SortedBaseline(len(FEATURES))
        order.update(base)
        if not order.ordered:
            return relative_features(now, base)
        return [robust_z(x, column, floor) for x, column, floor in zip(now, order.columns, _SPREAD_FLOORS)]

    def _start_fit(self, minute: int) -> None:
        """Fit on the rows before `minute` in a thread, off the worker's loop (importing
        the model's library and fitting take up to a second); the model is put in place when
        the next minute is observed, waiting for it if need be, so the minutes it scores
        depend on event time only and a replay scores the same minutes with it."""
        rows = [f for mm, f in self.training if minute - self.cfg.fit_window_minutes <= mm < minute]
        if len(rows) < self.cfg.min_fit_rows:
            return
        if self._fit is not None:
            self._install()
        version = (self.model.version + 1) if self.model else 1
        first = max(min(mm for mm, _ in self.training), minute - self.cfg.fit_window_minutes)
        cfg = self.cfg
        self._fit = (minute, _fitter().submit(
            lambda: AnomalyModel(version, first, minute, len(rows), fit_model(np.array(rows), cfg))))

    def _install(self) -> None:
        _started, fit = self._fit
        self._fit = None
        self.model = fit.result()
        self.new_models.append(self.model)

    def resume_fit(self, processed_before: int) -> None:
        """After a restart's replay: a fit started at the last aligned minute whose model was
        never stored (the worker stopped while it ran) is started again on the same rows."""
        last = (processed_before - 1) // self.cfg.refit_every_minutes * self.cfg.refit_every_minutes
        if self.fitting and (self.model is None or self.model.fit_to_minute < last):
            self._start_fit(last)


_FITTER: ThreadPoolExecutor | None = None


def _fitter() -> ThreadPoolExecutor:
    global _FITTER
    if _FITTER is None:
        _FITTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anomaly-fit")
    return _FITTER
