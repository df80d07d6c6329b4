"""Phases of a cascaded turn: per-phase latency from `stages_hist`, and which phase overspent
its budget when a `stage_budget` SLO burns.

A turn's target (first audio within 1.5 s) is split into shares per phase (VAD, ASR final,
LLM first token, TTS first audio, ...). Buckets keep one histogram per phase and slice-minute,
not the turns themselves, so the attribution is per phase: of the samples of each budgeted
phase, how many ran over that phase's share (exact when a budget is a histogram bin bound,
otherwise the bin holding it counts as over, as for latency SLIs). The phase with the largest
share of samples over its budget is the one that overspent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import polars as pl

from tailwatch.conventions import PHASE_NAMES
from tailwatch.slo import histogram
from tailwatch.slo.spec import SloSpec

_ORDER = {name: i for i, name in enumerate(PHASE_NAMES)}


def phase_histograms(buckets: pl.DataFrame, by: Iterable[str] = ()) -> pl.DataFrame:
    """Long rows (*by, `stage`, bin, n), summed over the given buckets (`stage`: the store's name for the phase)."""
    by = list(by)
    if buckets.height == 0 or "stages_hist" not in buckets.columns:
        return pl.DataFrame(schema={**{k: pl.String for k in by}, "stage": pl.String, "bin": pl.Int16, "n": pl.Int64})
    return (
        buckets.select(*by, "stages_hist").explode("stages_hist").drop_nulls("stages_hist").unnest("stages_hist")
        .group_by(*by, "stage", "bin").agg(pl.col("n").sum())
    )


def phase_latency(buckets: pl.DataFrame, by: Iterable[str] = ()) -> pl.DataFrame:
    """(*by, `stage`, samples, p50_ms, p95_ms, p99_ms), phases in pipeline order."""
    by = list(by)
    long = phase_histograms(buckets, by)
    if long.height == 0:
        return pl.DataFrame(schema={**{k: pl.String for k in by}, "stage": pl.String, "samples": pl.Int64,
                                    "p50_ms": pl.Float64, "p95_ms": pl.Float64, "p99_ms": pl.Float64})
    keys = [*by, "stage"]
    qs = histogram.quantiles_frame(long, keys, {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99})
    samples = long.group_by(keys).agg(pl.col("n").sum().alias("samples"))
    return (samples.join(qs, on=keys)
            .with_columns(pl.col("stage").replace_strict(_ORDER, default=len(_ORDER)).alias("_order"))
            .sort([*by, "_order"]).drop("_order"))


def overspend_counts(spec: SloSpec, buckets: pl.DataFrame) -> pl.DataFrame:
    """(window_start, *slice_by, `stage`, over, samples) for the phases the SLO budgets."""
    budgets = pl.DataFrame({"stage": [s for s, _ in spec.phase_budgets_ms],
                            "_bound": [histogram.last_good_bin(ms) for _, ms in spec.phase_budgets_ms]},
                           schema={"stage": pl.String, "_bound": pl.Int16})
    by = ["window_start", *spec.slice_by]
    long = phase_histograms(spec.selected(buckets), by).join(budgets, on="stage")
    return long.group_by(*by, "stage").agg(
        pl.col("n").filter(pl.col("bin") > pl.col("_bound")).sum().alias("over"),
        pl.col("n").sum().alias("samples"),
    )


@dataclass(frozen=True)
class PhaseSpend:
    phase: str
    budget_ms: float
    over: int  # samples over the phase's budget
    samples: int

    @property
    def share_over(self) -> float:
        return self.over / self.samples if self.samples else 0.0

    def describe(self) -> str:
        return (f"{self.phase} overspent its {self.budget_ms:g} ms share in {self.share_over:.0%} of "
                f"{self.samples:,} samples")


def most_overspent(spends: Iterable[PhaseSpend]) -> PhaseSpend | None:
    """The phase with the largest share of samples over its budget (None: none was over); of
    phases alike, the first in the cascade (the spends come in the order a group-by gives)."""
    over = [s for s in spends if s.over > 0]
    return max(over, key=lambda s: (s.share_over, s.over, -_ORDER.get(s.phase, len(_ORDER)))) if over else None
