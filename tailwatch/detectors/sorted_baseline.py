"""A slice's trailing baseline kept sorted feature by feature, for the anomaly detector's
robust z-scores (`anomaly.relative_features`: median and median absolute deviation of each
feature over the baseline minutes).

Each minute the baseline moves by a minute or two: its oldest readings leave and the newest
come in. Sorting each feature's hour of readings twice a minute (once for the median, once
for the deviations) was most of the detector's time on thin traffic; here a reading is put
into (or taken out of) each feature's sorted list as it enters (or leaves), the median is read
off the middle, and the median deviation is found by walking out from the median to its
middle: the deviations below the median, nearest first, and those above, nearest first, are
each in order already. The numbers are the same as `relative_features` gives: the same
values, the same middle elements (ties are equal values), the same operations on them.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from operator import is_


def _middle(values: list[float]) -> float:
    n = len(values)
    half = n // 2
    return values[half] if n % 2 else (values[half - 1] + values[half]) / 2


def _middle_deviation(values: list[float], middle: float) -> float:
    """The median of |v - middle| over sorted `values` (non-empty), without sorting them
    again. Below the median |v - middle| is middle - v: the same number (a rounded
    difference negates exactly)."""
    n = len(values)
    half = n // 2
    above = bisect_left(values, middle)  # values[:above] < middle <= values[above:]
    below = above - 1
    previous = current = 0.0
    for _ in range(half + 1):
        if below >= 0 and (above >= n or middle - values[below] <= values[above] - middle):
            previous, current = current, middle - values[below]
            below -= 1
        else:
            previous, current = current, values[above] - middle
            above += 1
    return current if n % 2 else (previous + current) / 2


def robust_z(now: float | None, values: list[float], floor: float) -> float:
    """`anomaly._robust_z` over a feature's baseline values already sorted (None left out)."""
    if now is None or not values:
        return 0.0
    middle = _middle(values)
    spread = 1.4826 * _middle_deviation(values, middle)
    return (now - middle) / max(spread, floor)


class SortedBaseline:
    """One slice's baseline readings (tuples of features, None where a minute has no value
    for one), each feature's values held sorted. `update` takes the baseline as the minute
    reads it and moves only what changed since the last minute; readings are known by
    identity (the history holds each minute's one object, and this holds it too while it is
    in the baseline, so no other object can take its id)."""

    __slots__ = ("base", "columns", "ordered")

    def __init__(self, features: int):
        self.base: list[tuple] = []
        self.columns: list[list[float]] = [[] for _ in range(features)]
        self.ordered = True  # False once a value that does not order (NaN) came in: sort afresh instead

    def update(self, base: Sequence[tuple]) -> None:
        old = self.base
        first = base[0] if base else None
        start = next((i for i, reading in enumerate(old) if reading is first), None)
        kept = len(old) - start if start is not None else 0
        if start is None or kept > len(base) or not self.ordered or not all(map(is_, old[start:], base)):
            for column in self.columns:
                column.clear()
            self.ordered = True
            start, kept, old = len(old), 0, []
        for reading in old[:start]:
            self._remove(reading)
        for reading in base[kept:]:
            self._insert(reading)
        self.base = list(base)

    def _insert(self, reading: tuple) -> None:
        for column, x in zip(self.columns, reading):
            if x is not None:
                if x != x:
                    self.ordered = False
                insort(column, x)

    def _remove(self, reading: tuple) -> None:
        for column, x in zip(self.columns, reading):
            if x is not None:
                i = bisect_left(column, x)
                if i < len(column) and column[i] == x:
                    del column[i]
                else:
                    self.ordered = False
