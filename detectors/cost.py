"""Cost regression, per model: GPU cost per successful turn (or per 1,000 tokens) up by
more than a threshold against a trailing baseline while task success does not improve.

Cost is read in GPU-seconds (the store's `gpu_seconds`): against a baseline of the same
model on the same SKU, the price per GPU-second cancels out of the ratio, so no price
table is needed to see the regression; the evidence carries both figures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from detectors.core import DetectionEvent, Finding, History, Minute, Tracker, ratio

NAME = "cost_regression"


@dataclass(frozen=True)
class CostRegressionConfig:
    enabled: bool = True
    window_minutes: int = 5
    increase_threshold: float = 0.3  # breach when cost is up strictly more than 30% on the baseline
    success_gain_min: float = 0.01  # a task-success gain of at least this (absolute) excuses a cost rise
    baseline_minutes: int = 60
    min_baseline_minutes: int = 20
    min_successful_turns: int = 50  # in the window
    slice_by: tuple[str, ...] = ("workload", "model")
    clear_minutes: int = 3


@dataclass(frozen=True)
class CostSums:
    gpu_seconds: float = 0.0
    turns: int = 0
    successful_turns: int = 0
    tokens: int = 0

    def __add__(self, o: CostSums) -> CostSums:
        return CostSums(self.gpu_seconds + o.gpu_seconds, self.turns + o.turns,
                        self.successful_turns + o.successful_turns, self.tokens + o.tokens)

    @property
    def per_successful_turn(self) -> float | None:
        return ratio(self.gpu_seconds, self.successful_turns)

    @property
    def per_1k_tokens(self) -> float | None:
        r = ratio(self.gpu_seconds, self.tokens)
        return None if r is None else 1000 * r

    @property
    def task_success(self) -> float | None:
        return ratio(self.successful_turns, self.turns)


def _total(xs: list[CostSums]) -> CostSums:
    out = CostSums()
    for x in xs:
        out = out + x
    return out


@dataclass(frozen=True)
class CostBaseline:
    per_successful_turn: float | None
    per_1k_tokens: float | None
    task_success: float | None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def baseline(minutes: list[CostSums]) -> CostBaseline:
    """Medians of the per-minute costs over the trailing minutes: a ratio of sums would
    carry a past incident's minutes into the baseline (prompts that tripled for 20 minutes
    of the hour make the hour after look like a cost regression per 1,000 tokens)."""
    return CostBaseline(
        _median([m.per_successful_turn for m in minutes if m.per_successful_turn is not None]),
        _median([m.per_1k_tokens for m in minutes if m.per_1k_tokens is not None]),
        _total(minutes).task_success,
    )


def regression(window: CostSums, base: CostBaseline, cfg: CostRegressionConfig) -> dict[str, float] | None:
    """The evidence when the window's cost regressed against the baseline, else None."""
    if window.successful_turns < cfg.min_successful_turns:
        return None
    rises, breached = {}, False
    for name in ("per_successful_turn", "per_1k_tokens"):
        now, before = getattr(window, name), getattr(base, name)
        if now is not None and before:
            rises[name] = now / before - 1
            # Compared as a product: 1.3 / 1.0 - 1 is 0.30000000000000004 in floating point.
            breached = breached or now > before * (1 + cfg.increase_threshold)
    if not breached:
        return None
    s_now, s_before = window.task_success, base.task_success
    if s_now is not None and s_before is not None and s_now - s_before >= cfg.success_gain_min:
        return None
    ev = {"gpu_seconds_per_successful_turn": round(window.per_successful_turn or 0.0, 6),
          "gpu_seconds_per_successful_turn_baseline": round(base.per_successful_turn or 0.0, 6),
          "cost_increase": round(max(rises.values()), 4), "increase_threshold": cfg.increase_threshold,
          "task_success": round(s_now or 0.0, 6), "task_success_baseline": round(s_before or 0.0, 6),
          "successful_turns": window.successful_turns}
    if "per_1k_tokens" in rises:
        ev["gpu_seconds_per_1k_tokens"] = round(window.per_1k_tokens, 6)
        ev["gpu_seconds_per_1k_tokens_baseline"] = round(base.per_1k_tokens, 6)
    return ev


class CostRegressionDetector:
    name = NAME

    def __init__(self, cfg: CostRegressionConfig):
        self.cfg = cfg
        self.history = History(cfg.window_minutes + cfg.baseline_minutes)
        self.tracker = Tracker(NAME, cfg.clear_minutes)

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg, h = self.cfg, self.history
        for key, s in m.slices(tuple(cfg.slice_by)).items():
            h.add(key, s.labels, m.minute, CostSums(s.gpu_seconds, s.turns, s.successful_turns,
                                                    s.prompt_tokens + s.output_tokens))
        h.trim(m.minute)
        findings = []
        for key in sorted(h.values):
            window = h.window(key, m.minute, cfg.window_minutes)
            base = h.before(key, m.minute, cfg.window_minutes, cfg.baseline_minutes)
            if not window or len(base) < cfg.min_baseline_minutes:
                continue
            ev = regression(_total(window), baseline(base), cfg)
            if ev is not None:
                ev["window_minutes"] = cfg.window_minutes
                findings.append(Finding(h.labels[key], ev))
        return self.tracker.update(m.minute, findings)
