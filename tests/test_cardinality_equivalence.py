"""The cardinality limiter's bookkeeping over a batch's few slices in Python decides as the
polars queries it replaced: the same frame out, the same overflow counts, the same admitted
values and slices in the same order (the order the checkpoint writes them in), on randomized
batches with unset, folded and non-ASCII values, a closed integer label, and floods past the
caps that take both the Python and the polars path."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings, strategies as st

from tailwatch.conventions import OVERFLOW_LABEL_VALUE
from tailwatch.streams.cardinality import HOUR_MS, CardinalityLimiter, CardinalityLimits, Overflowed
from tests.test_cardinality import ReferenceLimiter

CAPPED = ("tenant", "model", "zone")
SLICE = ("tenant", "model", "workload", "zone", "gpu_index")
SCHEMA = {"tenant": pl.String, "model": pl.String, "workload": pl.String, "zone": pl.String, "gpu_index": pl.Int32,
          "ts_ms": pl.Int64}


class _HashGroupedLimiter(ReferenceLimiter):
    """The reference: the slices grouped by a hash of their key and every capped label's
    values by a polars query of their own, as the limiter did before."""

    def admit(self, frame: pl.DataFrame):
        out = Overflowed()
        if frame.height == 0:
            return frame, out
        hour, first = (pl.col("ts_ms").max() // HOUR_MS).alias("_hour"), pl.col("ts_ms").min().alias("_first")
        self.aged(frame)
        keys = [k for k in self.slice_labels if k in frame.columns]
        key_hash = pl.struct(keys).hash().alias("_key")

        def slices_of(frame: pl.DataFrame) -> pl.DataFrame:
            return frame.select(key_hash, *keys, "ts_ms").group_by("_key").agg(
                *[pl.col(k).first() for k in keys], hour, first)

        combos, folded = slices_of(frame), False
        for label in self.capped:
            if label not in frame.columns:
                continue
            if label in keys:
                seen = combos.group_by(label).agg(pl.col("_hour").max(), pl.col("_first").min())
            else:
                seen = frame.group_by(label).agg(hour, first)
            seen = seen.sort("_first", label)
            refused = self._admit_values(label, seen.select(label, "_hour").iter_rows())
            if refused:
                frame, folded = self.fold_values(frame, label, refused, out), True
        if folded:
            combos = slices_of(frame)
        combos = combos.sort("_first", *keys).drop("_first")
        refused = self._admit_slices(keys, combos.drop("_key").iter_rows())  # the bookkeeping is the same
        refused_keys = [h for h, *key in combos.iter_rows() if tuple(key[:-1]) in refused]
        if refused_keys:
            frame = self.fold_slices(frame, keys, refused_keys, out)
        return frame, out


_label = st.sampled_from([None, "", OVERFLOW_LABEL_VALUE, "a", "b", "B", "ab", "é", "zz", "ü-1", "t10", "t9"])
_row = st.tuples(_label, _label, st.sampled_from([None, "llm", "asr"]), _label, st.sampled_from([None, 0, 1, 7]),
                 st.integers(0, 5 * HOUR_MS))


def _frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame([dict(zip(SCHEMA, r)) for r in rows], schema=SCHEMA)


def _held(limiter: CardinalityLimiter) -> tuple:
    """What the limiter holds, in order: the checkpoint writes dicts in insertion order."""
    return ({label: list(v.items()) for label, v in limiter.values.items()}, list(limiter.slices.items()),
            limiter.newest_hour, limiter.changed)


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(st.lists(_row, max_size=80), min_size=1, max_size=6), max_values=st.integers(1, 9),
       max_slices=st.integers(1, 40), forget=st.sampled_from([0, HOUR_MS, 3 * HOUR_MS]),
       python_slices=st.sampled_from([0, 3, 512]), widths=st.sampled_from(["all", "no zone", "no gpu_index"]))
def test_python_bookkeeping_admits_and_folds_as_the_polars_queries_did(batches, max_values, max_slices, forget,
                                                                      python_slices, widths):
    limits = CardinalityLimits(max_values, max_slices, forget_after_ms=forget)
    fast, reference = CardinalityLimiter(CAPPED, SLICE, limits), _HashGroupedLimiter(CAPPED, SLICE, limits)
    fast.PYTHON_SLICES = python_slices  # 0: every batch on the polars path; 512: every batch in Python
    for rows in batches:
        frame = _frame(rows)
        if widths != "all":  # a frame without one of the slice labels (a topic that lacks it)
            frame = frame.drop(widths.removeprefix("no "))
        (got, got_over), (want, want_over) = fast.admit(frame), reference.admit(frame)
        assert got.equals(want)
        assert (got_over.events_by_label, got_over.slice_events) == (want_over.events_by_label, want_over.slice_events)
        assert _held(fast) == _held(reference)
    assert fast.to_bytes() == reference.to_bytes()


def test_a_flood_past_the_slice_cap_folds_the_same_events_on_both_paths():
    """Hundreds of new slices in one batch (the polars path) and in batches of a few (Python)."""
    limits = CardinalityLimits(max_values_per_label=30, max_slices=30)
    rows = [(f"t{i % 40}", f"m{i % 7}", "llm", f"z{i % 3}", i % 2, 1_000 + i) for i in range(2_000)]
    one, reference = CardinalityLimiter(CAPPED, SLICE, limits), _HashGroupedLimiter(CAPPED, SLICE, limits)
    (got, got_over), (want, want_over) = one.admit(_frame(rows)), reference.admit(_frame(rows))
    assert got_over.slice_events > 0 and got_over.events_by_label  # both caps were reached
    assert got.equals(want) and (got_over.events_by_label, got_over.slice_events) == (
        want_over.events_by_label, want_over.slice_events)
    assert _held(one) == _held(reference)
    small, reference = CardinalityLimiter(CAPPED, SLICE, limits), _HashGroupedLimiter(CAPPED, SLICE, limits)
    for at in range(0, len(rows), 25):
        (got, got_over), (want, want_over) = small.admit(_frame(rows[at:at + 25])), reference.admit(_frame(rows[at:at + 25]))
        assert got.equals(want) and got_over.slice_events == want_over.slice_events
    assert _held(small) == _held(reference)
