"""The anomaly detector's sorted baselines give the z-scores `relative_features` gives, to the bit.

A slice's baseline moves each minute (its oldest readings leave, the newest come in, an
anomalous minute never enters, a gap empties it); `SortedBaseline` keeps each feature sorted
through those moves and `robust_z` reads the median and the median deviation off it. Here
random walks of such baselines, with missing values, ties and repeated readings, are scored
both ways and must agree exactly, minute by minute.
"""

from __future__ import annotations

import math
import random

import pytest

from tailwatch.detectors.anomaly import _SPREAD_FLOORS, FEATURES, RawFeatures, relative_features
from tailwatch.detectors.sorted_baseline import SortedBaseline, robust_z


def _reading(rng: random.Random) -> RawFeatures:
    tie = rng.random() < 0.3  # values from a small set: equal values, and deviations equal on both sides
    value = (lambda: rng.choice((0.0, 0.25, 0.5, 1.0, 2.0))) if tie else (lambda: rng.gauss(1.0, 0.5))
    return RawFeatures(abs(value()), None if rng.random() < 0.2 else math.log(abs(value()) + 1.0), value(),
                       None if rng.random() < 0.5 else min(1.0, abs(value())), value(), value())


def _scores(order: SortedBaseline, now: RawFeatures) -> list[float]:
    return [robust_z(x, column, floor) for x, column, floor in zip(now, order.columns, _SPREAD_FLOORS)]


@pytest.mark.parametrize("seed", range(6))
def test_a_moving_baseline_scores_as_a_sorted_copy_does(seed):
    rng = random.Random(seed)
    keep = rng.choice((1, 5, 60))
    history: list[RawFeatures] = []
    order = SortedBaseline(len(FEATURES))
    for minute in range(600):
        if rng.random() < 0.01:
            history = []  # a gap longer than the baseline: it starts again
        base = history[-keep:]
        now = _reading(rng)
        if rng.random() < 0.05 and base:
            now = now._replace(error_ratio=base[0].error_ratio)  # a reading equal to one held
        order.update(base)
        assert order.ordered
        assert _scores(order, now) == relative_features(now, base), minute
        if rng.random() < 0.9:  # an anomalous minute stays out of the baseline
            history.append(now if rng.random() < 0.95 else base[-1] if base else now)  # the same reading twice
        if rng.random() < 0.05 and len(history) > 3:
            history.pop(rng.randrange(len(history) - 1))  # a reading replaced out of order: sorted afresh


def test_a_value_that_does_not_order_is_left_to_the_plain_path():
    order = SortedBaseline(len(FEATURES))
    nan = RawFeatures(float("nan"), 1.0, 1.0, 1.0, 1.0, 1.0)
    order.update([nan, RawFeatures(0.5, 1.0, 1.0, 1.0, 1.0, 1.0)])
    assert not order.ordered  # the detector then scores with relative_features
    order.update([RawFeatures(0.5, 1.0, 1.0, 1.0, 1.0, 1.0)])
    assert order.ordered and order.columns[0] == [0.5]
