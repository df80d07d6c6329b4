"""Cold starts, per pool: replicas loading, how long loading takes, requests queued
behind replicas that are not warm, and the warm-pool depth against a target.

A GPU's replica state is the newest one any of its sources reported in the minute
(`gpu_minute`). The detection holds while, over a window of k minutes, some replica
reported `loading` or `cold` and the warm share of the replicas that report a state is
under the target, or while some replica has been loading for longer than allowed (a load
that never finishes). GPUs that report no state at all are unknown, never cold.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailwatch.detectors.core import DetectionEvent, Finding, History, Minute, Tracker
from tailwatch.config import ConfigStruct, Fraction, Minutes

NAME = "cold_start"


class ColdStartConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 2
    warm_ratio_target: Fraction = 0.75  # breach when the window's mean warm share is strictly below
    max_loading_minutes: Minutes = 5  # a replica loading this long or longer breaches on its own
    clear_minutes: Minutes = 3


@dataclass(frozen=True)
class _ColdSample:
    gpus: int
    warm: int
    loading: int
    queued_behind_cold: int


class ColdStartDetector:
    name = NAME

    def __init__(self, cfg: ColdStartConfig):
        self.cfg = cfg
        self.history = History(cfg.window_minutes)
        self.tracker = Tracker(NAME, cfg.clear_minutes)
        self.loading_since: dict[str, int] = {}  # gpu id → first minute seen loading
        self.last_load_minutes: dict[str, int] = {}  # pool → minutes its last finished load took

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return ()  # pools only

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg, h = self.cfg, self.history
        longest: dict[str, int] = {}
        for pool, p in m.pools().items():
            h.add((("pool", pool),), {"pool": pool, "zone": p.zone, "model": p.model}, m.minute,
                  _ColdSample(p.gpus, p.replicas_warm, p.replicas_loading, p.queue_depth_not_warm))
            loading = set(p.loading_gpus)
            prefix = pool + "#"
            for gpu in [g for g in self.loading_since if g.startswith(prefix) and g[len(prefix):] not in loading]:
                # Loaded (or gone): the time from loading to warm.
                self.last_load_minutes[pool] = m.minute - self.loading_since.pop(gpu)
            for g in loading:
                since = self.loading_since.setdefault(prefix + g, m.minute)
                longest[pool] = max(longest.get(pool, 0), m.minute - since + 1)
        h.trim(m.minute)
        findings = []
        for key in sorted(h.values):
            window = h.window(key, m.minute, cfg.window_minutes)
            if not window:
                continue
            pool = h.labels[key]["pool"]
            # Only replicas that report a state count: a GPU whose source sends no
            # replica state (the NVML collector alone) is unknown, not cold.
            stateful = sum(s.warm + s.loading for s in window)
            warm_ratio = sum(s.warm for s in window) / stateful if stateful else 1.0
            loading_minutes = longest.get(pool, 0)
            reported_cold = any(s.loading for s in window)
            if (reported_cold and warm_ratio < cfg.warm_ratio_target) or loading_minutes >= cfg.max_loading_minutes:
                last = window[-1]
                findings.append(Finding(h.labels[key], {
                    "warm_ratio": round(warm_ratio, 4), "warm_ratio_target": cfg.warm_ratio_target,
                    "replicas_warm": last.warm, "replicas_loading": last.loading, "replicas": last.gpus,
                    "longest_loading_minutes": loading_minutes,
                    "last_load_to_warm_minutes": self.last_load_minutes.get(pool, -1),
                    "queue_depth_behind_cold": last.queued_behind_cold, "window_minutes": cfg.window_minutes,
                }))
        return self.tracker.update(m.minute, findings)
