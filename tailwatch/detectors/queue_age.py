"""Queue age: per pool, the first minute at which the average oldest-queue age over a
window of k minutes exceeds a threshold.

The pool's value for a minute is the oldest queued request anywhere in the pool (max over
its GPUs of `oldest_queue_age_ms_max`). The detection is raised at the last minute of the
window that breaches (not at its start), and a value exactly at the threshold does not
breach.

A burst is not saturation: bursty real traffic (the Azure code trace at 35% utilisation)
puts requests behind a wave of long prompts for 1.5-5 s in one minute, now and then in two.
A saturated queue stays old. So besides the mean, `min_minutes_over` of the window's
minutes (all three, by default) must be over the threshold; a queue that is badly stuck
(the window's mean over `severe_factor` × the threshold) is raised after
`severe_minutes_over` minutes (two) already. A queue 3 s old from its first minute on is
raised on its second minute, one just over 1 s on its third.
"""

from __future__ import annotations

import re

from tailwatch.detectors.core import DetectionEvent, Finding, History, Minute, Tracker
from tailwatch.config import ConfigStruct, Factor, Minutes, NonNegative

NAME = "queue_age"


class QueueAgeConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    oldest_queue_age_ms_threshold: NonNegative = 1000.0  # breach strictly above
    pool_regex: str = ".*"  # only pools whose name matches (e.g. "-realtime$")
    min_minutes_over: Minutes = 3  # minutes of the window strictly above the threshold, too ...
    severe_factor: Factor = 2.0  # ... or, with the window's mean above this multiple of the threshold,
    severe_minutes_over: Minutes = 2  # ... this many
    clear_minutes: Minutes = 3

    def __post_init__(self):
        try:
            re.compile(self.pool_regex)
        except re.error as exc:
            raise ValueError(f"pool_regex is not a regular expression ({exc})") from None


def window_mean(values: list[float], k: int) -> list[float | None]:
    """For each index i, the mean of values[i-k+1 .. i], or None while fewer than k values exist."""
    if k <= 0:
        raise ValueError("window must be at least one minute")
    out: list[float | None] = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= k:
            total -= values[i - k]
        out.append(total / k if i >= k - 1 else None)
    return out


def first_breach(values: list[float], k: int, threshold_ms: float) -> int | None:
    """Index of the minute that ends the first window whose mean exceeds the threshold."""
    for i, mean in enumerate(window_mean(values, k)):
        if mean is not None and mean > threshold_ms:
            return i
    return None


class QueueAgeDetector:
    name = NAME

    def __init__(self, cfg: QueueAgeConfig):
        self.cfg = cfg
        self.pools = re.compile(cfg.pool_regex)
        self.history = History(cfg.window_minutes)
        self.tracker = Tracker(NAME, cfg.clear_minutes)

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return ()  # pools only

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg = self.cfg
        for pool, p in m.pools().items():
            if p.oldest_queue_age_ms_max is not None and self.pools.search(pool):
                labels = {"pool": pool, "zone": p.zone, "model": p.model}
                self.history.add((("pool", pool),), labels, m.minute, p.oldest_queue_age_ms_max)
        self.history.trim(m.minute)
        findings = []
        for key in sorted(self.history.values):
            ages = self.history.window(key, m.minute, cfg.window_minutes)
            if not ages:
                continue
            mean = sum(ages) / len(ages)
            over = sum(a > cfg.oldest_queue_age_ms_threshold for a in ages)
            need = min(cfg.min_minutes_over, cfg.window_minutes)
            if mean > cfg.severe_factor * cfg.oldest_queue_age_ms_threshold:
                need = min(need, cfg.severe_minutes_over)
            if mean > cfg.oldest_queue_age_ms_threshold and over >= need:
                findings.append(Finding(self.history.labels[key], {
                    "oldest_queue_age_ms_mean": round(mean, 3), "oldest_queue_age_ms_last": round(ages[-1], 3),
                    "oldest_queue_age_ms_threshold": cfg.oldest_queue_age_ms_threshold,
                    "window_minutes": cfg.window_minutes, "minutes_over": over,
                }))
        return self.tracker.update(m.minute, findings)
