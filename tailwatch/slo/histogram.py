"""Mergeable latency histograms: fixed log-spaced bins with bounded relative error.

A value v > MIN_VALUE_MS falls in bin i = ceil(log(v) / log(GAMMA)); bin i covers
(GAMMA^(i-1), GAMMA^i] and is represented by 2·GAMMA^i / (GAMMA + 1), which is within
RELATIVE_ACCURACY of every value in the bin (the DDSketch construction). Values at or
under MIN_VALUE_MS share bin ZERO_BIN, represented by 0. Histograms of any slices and
windows merge by adding counts per bin, so roll-ups are exact and "fraction under a
threshold" is exact whenever the threshold is a bin bound (see `bin_upper_bound_ms`).

Bins are small integers, stored as `{bin, n}` lists in the store (`<field>_hist`).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np
import polars as pl

RELATIVE_ACCURACY = 0.0195  # quantiles within 1.95%: the contract is 2%
GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
LOG_GAMMA = math.log(GAMMA)
MIN_VALUE_MS = 0.01
ZERO_BIN = math.ceil(math.log(MIN_VALUE_MS) / LOG_GAMMA) - 1  # below every real bin


def bin_of(value_ms: float) -> int:
    if value_ms <= MIN_VALUE_MS:
        return ZERO_BIN
    return math.ceil(math.log(value_ms) / LOG_GAMMA)


def bin_expr(column: str) -> pl.Expr:
    """The bin of each value of `column` (null stays null), as a polars expression."""
    col = pl.col(column)
    return (
        pl.when(col <= MIN_VALUE_MS)
        .then(pl.lit(ZERO_BIN))
        .otherwise((col.log() / LOG_GAMMA).ceil())
        .cast(pl.Int16)
    )


def bin_value_ms(bin_index: int) -> float:
    if bin_index <= ZERO_BIN:
        return 0.0
    return 2 * GAMMA**bin_index / (GAMMA + 1)


def bin_upper_bound_ms(bin_index: int) -> float:
    if bin_index <= ZERO_BIN:
        return MIN_VALUE_MS
    return GAMMA**bin_index


def last_good_bin(threshold_ms: float) -> int:
    """The highest bin whose every value is ≤ threshold (the bin holding it counts as bad)."""
    b = bin_of(threshold_ms)
    return b if bin_upper_bound_ms(b) <= threshold_ms * (1 + 1e-12) else b - 1


def bin_upper_bound_expr(bin_column: str) -> pl.Expr:
    """`bin_upper_bound_ms` as a polars expression."""
    b = pl.col(bin_column)
    return pl.when(b <= ZERO_BIN).then(MIN_VALUE_MS).otherwise((b.cast(pl.Float64) * LOG_GAMMA).exp())


def bin_value_expr(bin_column: str) -> pl.Expr:
    b = pl.col(bin_column)
    return pl.when(b <= ZERO_BIN).then(0.0).otherwise(2 * (b.cast(pl.Float64) * LOG_GAMMA).exp() / (GAMMA + 1))


def merge(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in histograms:
        for b, n in h.items():
            out[b] = out.get(b, 0) + n
    return out


def from_values(values_ms: Iterable[float]) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in values_ms:
        b = bin_of(v)
        out[b] = out.get(b, 0) + 1
    return out


def quantile_ms(histogram: Mapping[int, int], q: float) -> float | None:
    """The value at rank floor(q·(n−1)) (0-based), within RELATIVE_ACCURACY; None if empty."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = math.floor(q * (total - 1))
    seen = 0
    for b in sorted(histogram):
        seen += histogram[b]
        if seen > rank:
            return bin_value_ms(b)
    raise AssertionError("unreachable: rank < total")


def fraction_at_or_under(histogram: Mapping[int, int], threshold_ms: float) -> float | None:
    """Share of values ≤ threshold, counting whole bins whose upper bound is ≤ threshold."""
    total = sum(histogram.values())
    if total == 0:
        return None
    good = sum(n for b, n in histogram.items() if bin_upper_bound_ms(b) <= threshold_ms * (1 + 1e-12))
    return good / total


def quantiles_frame(hist_long: pl.DataFrame, keys: list[str], qs: Mapping[str, float], presorted: bool = False) -> pl.DataFrame:
    """Per group of `keys`, the quantiles of a long histogram frame (keys…, bin, n).

    Vectorised equivalent of `quantile_ms` for many histograms at once: one sort (none if
    `presorted` by keys then bin), one cumulative sum over all groups, and a binary
    search per quantile.
    """
    if hist_long.height == 0:
        return hist_long.select(keys).with_columns([pl.lit(None, dtype=pl.Float64).alias(k) for k in qs])
    ordered = hist_long if presorted else hist_long.sort([*keys, "bin"])
    n = ordered["n"].to_numpy()
    bins = ordered["bin"].to_numpy()
    group = ordered.select(pl.struct(keys).rle_id())[:, 0].to_numpy()
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    cum = np.cumsum(n)
    totals = np.add.reduceat(n, starts)
    before = cum[starts] - n[starts]
    out = ordered[starts].select(keys)
    for name, q in qs.items():
        at = np.searchsorted(cum, before + np.floor((totals - 1) * q), side="right")
        out = out.with_columns(pl.Series(name, bins[at]).cast(pl.Int16))
    return out.with_columns([bin_value_expr(name).alias(name) for name in qs])
