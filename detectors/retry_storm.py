"""Retry storm: clients retrying failures multiply the load on a slice that is already hurting.

Per slice (default: workload, model, zone), over a rolling window of k minutes: the retry
ratio (retries ÷ attempts) above a threshold while the window holds enough attempts to
matter, with the retry amplification (attempts per first attempt) as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from detectors.core import (
    DetectionEvent,
    Finding,
    History,
    Minute,
    Tracker,
    ratio,
    slice_key,
)

NAME = "retry_storm"


@dataclass(frozen=True)
class RetryStormConfig:
    enabled: bool = True
    window_minutes: int = 3
    retry_ratio_threshold: float = 0.1  # breach strictly above
    min_requests: int = 200  # attempts in the window; fewer never alert
    slice_by: tuple[str, ...] = ("workload", "model", "zone")
    clear_minutes: int = 3


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


def breaches(w: RetryWindow, cfg: RetryStormConfig) -> bool:
    return w.requests >= cfg.min_requests and w.retry_ratio is not None and w.retry_ratio > cfg.retry_ratio_threshold


class RetryStormDetector:
    name = NAME

    def __init__(self, cfg: RetryStormConfig):
        self.cfg = cfg
        self.history = History(cfg.window_minutes)
        self.tracker = Tracker(NAME, cfg.clear_minutes)

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg = self.cfg
        for key, s in m.slices(tuple(cfg.slice_by)).items():
            self.history.add(key, s.labels, m.minute, (s.requests, s.retries))
        self.history.trim(m.minute)
        findings = []
        for key in sorted(self.history.values):
            counts = self.history.window(key, m.minute, cfg.window_minutes)
            if not counts:
                continue
            w = retry_window(counts)
            if breaches(w, cfg):
                findings.append(Finding(self.history.labels[key], {
                    "retry_ratio": round(w.retry_ratio, 6), "retry_ratio_threshold": cfg.retry_ratio_threshold,
                    "retry_amplification": round(w.amplification, 4) if w.amplification is not None else -1.0,
                    "requests": w.requests, "retries": w.retries, "window_minutes": cfg.window_minutes,
                }))
        return self.tracker.update(m.minute, findings)


__all__ = ["NAME", "RetryStormConfig", "RetryStormDetector", "RetryWindow", "breaches", "retry_window", "slice_key"]
