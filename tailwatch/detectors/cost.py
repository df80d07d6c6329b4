"""Cost regression, per model: GPU cost per successful turn (or per 1,000 tokens) up by
more than a threshold against a trailing baseline while task success does not improve.

Cost is read in GPU-seconds (the store's `gpu_seconds`): against a baseline of the same
model on the same SKU, the price per GPU-second cancels out of the ratio, so no price
table is needed to see the regression; the evidence carries both figures.

Calibrated on heavy-tailed work (the Azure code trace's output lengths, Mooncake's prompts):
GPU-seconds per turn swing minute to minute, so a +30% rule on a few minutes fires on quiet
traffic. Instead, per cost figure (per successful turn, per 1,000 tokens):

- the window is long (10 minutes) and its cost is volume-weighted (GPU-seconds summed ÷
  turns or tokens summed), never a mean of per-minute ratios;
- the baseline's level is the median of its window-long blocks' ratios (a past incident in
  the trailing two hours does not move it), and its noise is measured: the per-minute
  residuals of GPU-seconds around level × volume give the variance per unit of volume, so
  the window's ratio has a standard error that shrinks with its own volume;
- it breaches when the rise is both large (`increase_threshold`) and significant (`z`
  standard errors above the baseline), with `min_successful_turns` in the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tailwatch.detectors.core import BaselineDetector, SliceBy, SliceMinute, median, ratio
from tailwatch.config import ConfigStruct, Count, Minutes, NonNegative, Positive

NAME = "cost_regression"


class CostRegressionConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 10
    increase_threshold: NonNegative = 0.3  # breach when cost is up strictly more than 30% on the baseline ...
    z: Positive = 4.0  # ... and more than this many standard errors above it
    success_gain_min: NonNegative = 0.01  # a task-success gain of at least this (absolute) excuses a cost rise
    baseline_minutes: Minutes = 120
    min_baseline_minutes: Minutes = 30
    min_successful_turns: Count = 50  # in the window
    slice_by: SliceBy = ("workload", "model")
    clear_minutes: Minutes = 3


class CostSums(NamedTuple):
    """A slice-minute's (or window's) GPU time, turns and tokens. A named tuple: the
    baseline's two hours of them are taken apart column by column (zip) every minute."""

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
    # Field by field, not a chain of `+`: this runs for every slice and baseline block each
    # minute, and the sums (left to right from zero) are the same numbers.
    if not xs:
        return CostSums(0, 0, 0, 0)
    gpu_s, turns, successful_turns, tokens = zip(*xs)
    return CostSums(sum(gpu_s), sum(turns), sum(successful_turns), sum(tokens))


@dataclass(frozen=True)
class CostBaseline:
    per_successful_turn: float | None
    per_1k_tokens: float | None
    task_success: float | None
    # Noise: the variance of GPU-seconds per unit of volume (a successful turn; 1,000 tokens)
    # and the baseline's volume. None: unknown, judged on the increase alone.
    per_successful_turn_var: float | None = None
    per_1k_tokens_var: float | None = None
    successful_turns: int = 0
    tokens: int = 0


def _median(xs: list[float]) -> float | None:
    return median(xs) if xs else None


_VOLUME = {"per_successful_turn": (lambda s: s.successful_turns, 1.0),
           "per_1k_tokens": (lambda s: s.tokens, 1000.0)}


def _level(gpu_s: Sequence[float], volumes: Sequence[int], block: int, unit: float) -> float | None:
    """The median of `block`-minute blocks' volume-weighted costs (None: no block has volume).
    Over plain lists, not CostSums: it runs for every slice every minute."""
    block = max(1, block)
    ratios = []
    for i in range(0, len(gpu_s), block):
        r = ratio(sum(gpu_s[i:i + block]), sum(volumes[i:i + block]))
        if r is not None:
            ratios.append(unit * r if unit != 1.0 else r)
    return _median(ratios)


def _noise(gpu_s: Sequence[float], volumes: Sequence[int], level: float, unit: float) -> float | None:
    """The variance of GPU-seconds per unit of volume around `level` (per-minute residuals,
    volume-weighted); None where the minutes have no volume."""
    vol = sum(volumes) / unit
    if vol <= 0:
        return None
    residual = sum((g - level * v / unit) ** 2 for g, v in zip(gpu_s, volumes))
    return residual / vol


def _level_and_noise(gpu_s: Sequence[float], volumes: Sequence[int], block: int,
                     unit: float) -> tuple[float | None, float | None]:
    """`_level`, and `_noise` around it."""
    level = _level(gpu_s, volumes, block, unit)
    if level is None:
        return None, None
    return level, _noise(gpu_s, volumes, level, unit)


def baseline(minutes: list[CostSums], block_minutes: int = 1) -> CostBaseline:
    """The trailing minutes' cost level and noise. The level is a median of block ratios: a
    ratio of all the sums would carry a past incident's minutes into the baseline (prompts
    that tripled for 20 minutes make the hours after look like a cost regression per 1,000
    tokens)."""
    gpu_s, _turns, turns_ok, tokens = zip(*minutes) if minutes else ((), (), (), ())
    turn, turn_var = _level_and_noise(gpu_s, turns_ok, block_minutes, 1.0)
    tok, tok_var = _level_and_noise(gpu_s, tokens, block_minutes, 1000.0)
    total = _total(minutes)
    return CostBaseline(turn, tok, total.task_success, turn_var, tok_var, total.successful_turns, total.tokens)


def could_regress(window: CostSums, base: list[CostSums], cfg: CostRegressionConfig) -> bool:
    """Whether either cost figure of the window is `increase_threshold` over the baseline's
    level: without that `regression` finds nothing, whatever the noise. The levels are
    the same numbers `baseline` computes; the noise and the baseline's totals (a pass over
    every baseline minute each) are left for the rare window that rises, since this runs
    for every slice every minute."""
    gpu_s, _turns, turns_ok, tokens = zip(*base) if base else ((), (), (), ())
    for now, volumes, unit in ((window.per_successful_turn, turns_ok, 1.0), (window.per_1k_tokens, tokens, 1000.0)):
        if now is None:
            continue
        before = _level(gpu_s, volumes, cfg.window_minutes, unit)
        if before and now > before * (1 + cfg.increase_threshold):
            return True
    return False


def z_score(now: float, before: float, var_per_unit: float | None, window_volume: float,
            base_volume: float) -> float | None:
    """Standard errors between the window's cost and the baseline's: the window's ratio of
    sums has variance var_per_unit ÷ its volume (and the baseline's ÷ its own)."""
    if var_per_unit is None or window_volume <= 0:
        return None
    se2 = var_per_unit / window_volume + (var_per_unit / base_volume if base_volume > 0 else 0.0)
    if se2 <= 0:
        return math.inf if now > before else 0.0
    return (now - before) / math.sqrt(se2)


def regression(window: CostSums, base: CostBaseline, cfg: CostRegressionConfig) -> dict[str, float] | None:
    """The evidence when the window's cost regressed against the baseline, else None."""
    if window.successful_turns < cfg.min_successful_turns:
        return None
    rises, zs, breached = {}, {}, False
    for name in ("per_successful_turn", "per_1k_tokens"):
        now, before = getattr(window, name), getattr(base, name)
        if now is not None and before:
            rises[name] = now / before - 1
            volume, unit = _VOLUME[name]
            base_volume = (base.successful_turns if name == "per_successful_turn" else base.tokens) / unit
            z = z_score(now, before, getattr(base, f"{name}_var"), volume(window) / unit, base_volume)
            if z is not None:
                zs[name] = z
            # Compared as a product: 1.3 / 1.0 - 1 is 0.30000000000000004 in floating point.
            large = now > before * (1 + cfg.increase_threshold)
            breached = breached or (large and (z is None or z > cfg.z))
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
    if zs:
        ev["z"] = round(min(max(zs.values()), 1e6), 3)
        ev["z_threshold"] = cfg.z
    if "per_1k_tokens" in rises:
        ev["gpu_seconds_per_1k_tokens"] = round(window.per_1k_tokens, 6)
        ev["gpu_seconds_per_1k_tokens_baseline"] = round(base.per_1k_tokens, 6)
    return ev


class CostRegressionDetector(BaselineDetector):
    name = NAME
    cfg: CostRegressionConfig

    def reading(self, s: SliceMinute, seen: bool) -> CostSums:
        return CostSums(s.gpu_seconds, s.turns, s.successful_turns, s.prompt_tokens + s.output_tokens)

    def judge(self, window: list, base: list) -> dict | None:
        total = _total(window)
        if total.successful_turns < self.cfg.min_successful_turns:
            return None  # too thin to judge: regression() would say so after the baseline's cost
        if not could_regress(total, base, self.cfg):
            return None
        return regression(total, baseline(base, self.cfg.window_minutes), self.cfg)
