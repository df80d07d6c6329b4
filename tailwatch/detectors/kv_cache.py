"""KV-cache pressure and prompt growth (LLM pools and models).

- KV-cache pressure, per pool: the KV cache near full for a sustained window (mean over
  the pool's GPUs of each GPU's per-minute maximum usage) while preemptions (requests
  evicted to make room) run above a floor and above the pool's trailing rate.
- Prompt growth, per model: mean prompt tokens per request over a window against the
  model's own trailing baseline (a prompt-bundle change that tripled prompts). The store
  keeps prompt-token sums per bucket, not a prompt-length histogram, so growth is read
  on the mean; a change that only fattens the tail would need a histogram column.
"""

from __future__ import annotations


from tailwatch.detectors.core import (
    BaselineDetector, DetectionEvent, Finding, History, Minute, SliceBy, SliceMinute, Tracker, median,
)
from tailwatch.config import ConfigStruct, Count, Factor, Fraction, Minutes, NonNegative

KV = "kv_cache_pressure"
PROMPT = "prompt_growth"


class KvCachePressureConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    kv_cache_usage_min: Fraction = 0.9  # window mean usage at or above this is "near full"
    preemptions_per_minute_min: NonNegative = 1.0  # window preemption rate must reach this ...
    preemption_rise_factor: Factor = 2.0  # ... and exceed this multiple of the trailing rate
    baseline_minutes: Minutes = 30
    clear_minutes: Minutes = 3


class PromptGrowthConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    growth_factor: Factor = 2.0  # window mean prompt tokens at or above this multiple of the baseline
    min_requests: Count = 50  # requests with prompts in the window
    baseline_minutes: Minutes = 60
    min_baseline_minutes: Minutes = 15
    slice_by: SliceBy = ("model",)
    clear_minutes: Minutes = 3


class KvCachePressureDetector:
    name = KV

    def __init__(self, cfg: KvCachePressureConfig):
        self.cfg = cfg
        self.history = History(cfg.window_minutes + cfg.baseline_minutes)
        self.tracker = Tracker(KV, cfg.clear_minutes)

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return ()  # pools only

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg, h = self.cfg, self.history
        for pool, p in m.pools().items():
            if p.kv_cache_usage_mean is not None:
                h.add((("pool", pool),), {"pool": pool, "zone": p.zone, "model": p.model}, m.minute,
                      (p.kv_cache_usage_mean, p.preemptions))
        h.trim(m.minute)
        findings = []
        for key in sorted(h.values):
            window = h.window(key, m.minute, cfg.window_minutes)
            if not window:
                continue
            usage = sum(u for u, _ in window) / len(window)
            rate = sum(p for _, p in window) / len(window)
            base = h.before(key, m.minute, cfg.window_minutes, cfg.baseline_minutes)
            base_rate = sum(p for _, p in base) / len(base) if base else 0.0
            if usage >= cfg.kv_cache_usage_min and rate >= cfg.preemptions_per_minute_min \
                    and rate > cfg.preemption_rise_factor * base_rate:
                findings.append(Finding(h.labels[key], {
                    "kv_cache_usage_mean": round(usage, 4), "kv_cache_usage_min": cfg.kv_cache_usage_min,
                    "preemptions_per_minute": round(rate, 3), "preemptions_per_minute_baseline": round(base_rate, 3),
                    "window_minutes": cfg.window_minutes,
                }))
        return self.tracker.update(m.minute, findings)


class PromptGrowthDetector(BaselineDetector):
    name = PROMPT
    cfg: PromptGrowthConfig

    def reading(self, s: SliceMinute, seen: bool) -> tuple | None:
        return (s.requests, s.prompt_tokens) if s.prompt_tokens > 0 and s.requests > 0 else None

    def judge(self, window: list, base: list) -> dict | None:
        requests = sum(r for r, _ in window)
        if requests < self.cfg.min_requests:
            return None
        mean = sum(t for _, t in window) / requests
        baseline = median([t / r for r, t in base])
        if baseline > 0 and mean >= self.cfg.growth_factor * baseline:
            return {"prompt_tokens_per_request": round(mean, 2), "prompt_tokens_per_request_baseline": round(baseline, 2),
                    "growth": round(mean / baseline, 4), "requests": requests}
        return None
