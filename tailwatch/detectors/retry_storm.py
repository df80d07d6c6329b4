"""Retry storm: clients retrying failures multiply the load on a slice that is already hurting.

Per slice (default: workload, model, zone): the retry ratio (retries ÷ attempts) above a
threshold, judged on the trailing 1, 2, …, k minutes (a storm is caught on its first
minute when that minute alone says so, not only once it dominates the k-minute mean), with
the retry amplification (attempts per first attempt) as evidence.

Significance rather than a fixed count: a window breaches when the lower bound of its retry
ratio (Wilson score interval, one-sided, `z`) is above the threshold, so a small slice
with 3 retries in 20 attempts does not page, while 60 retries in 200 attempts does at
once; `min_requests` is only a floor under which nothing is judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailwatch.detectors.core import (
    DetectionEvent,
    Finding,
    History,
    Minute,
    Tracker,
    ratio,
    slice_key,
    SliceBy,
)
from tailwatch.config import ConfigStruct, Count, Minutes, Positive, Ratio

NAME = "retry_storm"


class RetryStormConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    retry_ratio_threshold: Ratio = 0.1  # breach when the ratio's lower bound is strictly above
    min_requests: Count = 30  # attempts in the window; fewer never alert
    z: Positive = 3.09  # one-sided lower confidence bound of the retry ratio (3.09: 99.9%)
    slice_by: SliceBy = ("workload", "model", "zone")
    clear_minutes: Minutes = 3


@dataclass(frozen=True)
class RetryWindow:
    requests: int
    retries: int
    retry_ratio: float | None  # None: no attempts
    amplification: float | None  # attempts ÷ first attempts; None: no first attempt


def retry_window(counts: list[tuple[int, int]]) -> RetryWindow:
    """(requests, retries) per minute → the window's ratios, without dividing by zero."""
    requests = sum(r for r, _ in counts)
    retries = sum(x for _, x in counts)
    return RetryWindow(requests, retries, ratio(retries, requests), ratio(requests, requests - retries))


def wilson_lower(successes: int, n: int, z: float) -> float:
    """The lower end of the Wilson score interval for successes ÷ n (0 when n is 0)."""
    if n <= 0:
        return 0.0
    p = successes / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z2 / n))


def breaches(w: RetryWindow, cfg: RetryStormConfig) -> bool:
    return (w.requests >= cfg.min_requests and w.retry_ratio is not None and w.retry_ratio > cfg.retry_ratio_threshold
            and wilson_lower(w.retries, w.requests, cfg.z) > cfg.retry_ratio_threshold)


def _first_breach(counts: list[tuple[int, int]], cfg: RetryStormConfig) -> int | None:
    """The shortest trailing run of minutes that breaches (None: none does). The counts are
    added up from the newest minute back, and a run is judged in full only where its ratio
    is over the threshold at all (most minutes of most slices are not)."""
    requests = retries = 0
    for j in range(1, len(counts) + 1):
        r, x = counts[-j]
        requests += r
        retries += x
        if requests and requests >= cfg.min_requests and retries / requests > cfg.retry_ratio_threshold \
                and breaches(retry_window(counts[-j:]), cfg):
            return j
    return None


class RetryStormDetector:
    name = NAME

    def __init__(self, cfg: RetryStormConfig):
        self.cfg = cfg
        self.history = History(cfg.window_minutes)
        self.tracker = Tracker(NAME, cfg.clear_minutes)

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return (tuple(self.cfg.slice_by),)

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg = self.cfg
        for key, labels, requests, retries in m.readings(tuple(cfg.slice_by), ("requests", "retries")):
            self.history.add(key, labels, m.minute, (requests, retries))
        self.history.trim(m.minute)
        findings = []
        for key in sorted(self.history.values):
            counts = self.history.window(key, m.minute, cfg.window_minutes)
            # A window breaches only with retries and `min_requests` in it; a shorter one has fewer.
            if not counts or not any(x for _, x in counts) or sum(r for r, _ in counts) < cfg.min_requests:
                continue
            # The trailing j minutes for j = 1..k: the shortest that breaches decides (a storm's
            # first minute is not diluted by the quiet minutes before it); evidence is the k-minute window's.
            j = _first_breach(counts, cfg)
            if j is None:
                continue
            w = retry_window(counts)
            if w.retry_ratio is None:
                continue
            findings.append(Finding(self.history.labels[key], {
                "retry_ratio": round(w.retry_ratio, 6), "retry_ratio_threshold": cfg.retry_ratio_threshold,
                "retry_ratio_lower_bound": round(wilson_lower(w.retries, w.requests, cfg.z), 6),
                "retry_amplification": round(w.amplification, 4) if w.amplification is not None else -1.0,
                "requests": w.requests, "retries": w.retries, "window_minutes": cfg.window_minutes,
                "breached_minutes": j,
            }))
        return self.tracker.update(m.minute, findings)


__all__ = ["NAME", "RetryStormConfig", "RetryStormDetector", "RetryWindow", "breaches", "retry_window", "slice_key",
           "wilson_lower"]
