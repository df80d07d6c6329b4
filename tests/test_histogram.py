"""Mergeable latency histograms: bounded relative error, exact merges."""

import math

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from tailwatch.slo import histogram

values = st.lists(st.floats(min_value=0.02, max_value=3_600_000, allow_nan=False), min_size=1, max_size=300)


@given(values, st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.0, 1.0]))
@settings(max_examples=200, deadline=None)
def test_quantile_within_two_percent_of_exact(vals, q):
    exact = float(np.sort(vals)[math.floor(q * (len(vals) - 1))])
    got = histogram.quantile_ms(histogram.from_values(vals), q)
    assert abs(got - exact) <= 0.02 * exact


@given(values, values)
@settings(max_examples=100, deadline=None)
def test_merge_equals_histogram_of_union(a, b):
    merged = histogram.merge([histogram.from_values(a), histogram.from_values(b)])
    assert merged == histogram.from_values(a + b)


def test_zero_and_tiny_values_share_the_zero_bin():
    h = histogram.from_values([0.0, 0.001, 0.01])
    assert h == {histogram.ZERO_BIN: 3}
    assert histogram.quantile_ms(h, 0.5) == 0.0


def test_empty_histogram_has_no_quantile():
    assert histogram.quantile_ms({}, 0.99) is None
    assert histogram.fraction_at_or_under({}, 100) is None


def test_fraction_under_threshold_is_exact_at_bin_bounds():
    bound = histogram.bin_upper_bound_ms(histogram.bin_of(300.0))
    vals = [bound * 0.5, bound * 0.999, bound, bound * 1.05, bound * 3]
    assert histogram.fraction_at_or_under(histogram.from_values(vals), bound) == 3 / 5


def test_vectorised_bins_and_quantiles_agree_with_scalar():
    rng = np.random.default_rng(3)
    vals = rng.lognormal(5, 1, 5000)
    frame = pl.DataFrame({"g": [1] * 5000, "v": vals})
    bins = frame.select(histogram.bin_expr("v").alias("bin"))["bin"].to_list()
    assert bins == [histogram.bin_of(v) for v in vals]
    long = frame.with_columns(histogram.bin_expr("v").alias("bin")).group_by("g", "bin").agg(pl.len().cast(pl.Int64).alias("n"))
    qs = histogram.quantiles_frame(long, ["g"], {"p95": 0.95, "p50": 0.5})
    h = histogram.from_values(vals)
    assert math.isclose(qs["p95"][0], histogram.quantile_ms(h, 0.95))
    assert math.isclose(qs["p50"][0], histogram.quantile_ms(h, 0.5))
