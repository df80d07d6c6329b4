"""The cardinality limiter alone (streams/cardinality.py): caps hold, no event is lost, the
values admitted first stay exact, ageing frees places, and its state survives a restart."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings, strategies as st

from tailwatch.conventions import OVERFLOW_LABEL_VALUE
from tailwatch.streams.cardinality import HOUR_MS, CardinalityLimiter, CardinalityLimits

CAPPED = ("tenant", "model")
SLICE = ("tenant", "model", "workload")


def _frame(rows: list[tuple[str, str, str, int]]) -> pl.DataFrame:
    return pl.DataFrame({"tenant": [r[0] for r in rows], "model": [r[1] for r in rows],
                         "workload": [r[2] for r in rows], "ts_ms": [r[3] for r in rows]},
                        schema={"tenant": pl.String, "model": pl.String, "workload": pl.String, "ts_ms": pl.Int64})


_rows = st.lists(st.tuples(st.sampled_from([f"t{i}" for i in range(12)]), st.sampled_from([f"m{i}" for i in range(6)]),
                           st.sampled_from(["llm", "asr"]), st.integers(0, 3 * HOUR_MS)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(_rows, min_size=1, max_size=5), max_values=st.integers(1, 8), max_slices=st.integers(1, 20))
def test_caps_hold_every_event_is_kept_and_the_first_values_stay_exact(batches, max_values, max_slices):
    limiter = CardinalityLimiter(CAPPED, SLICE, CardinalityLimits(max_values, max_slices, forget_after_ms=0))
    first_seen: dict[str, list[str]] = {label: [] for label in CAPPED}
    for rows in batches:
        frame = _frame(rows)
        out, overflowed = limiter.admit(frame)
        assert out.height == frame.height  # counts preserved: nothing dropped, nothing added
        assert out["workload"].to_list() == frame["workload"].to_list()  # closed labels untouched
        folded = 0
        for label in CAPPED:
            assert len(limiter.values[label]) <= max_values
            # Within a batch the first event decides, then the value.
            for value in frame.sort("ts_ms", label)[label].to_list():
                if value not in first_seen[label]:
                    first_seen[label].append(value)
            exact = set(first_seen[label][:max_values])
            kept = [(a, b) for a, b in zip(frame[label], out[label]) if a in exact]
            changed = sum(1 for a, b in zip(frame[label], out[label]) if a != b)
            folded += changed
            # A first-admitted value is rewritten only by the slice cap, never by its label's.
            assert all(b in (a, OVERFLOW_LABEL_VALUE) for a, b in kept)
        assert len(limiter.slices) <= max_slices
        distinct = {(t, m) for t, m in zip(out["tenant"], out["model"])
                    if not (t == OVERFLOW_LABEL_VALUE and m == OVERFLOW_LABEL_VALUE)}
        assert len(distinct) <= max_slices  # every named slice is an admitted one
        assert set(out["tenant"]) - {OVERFLOW_LABEL_VALUE} <= set(limiter.values["tenant"])
        assert overflowed.slice_events + sum(overflowed.events_by_label.values()) >= (1 if folded else 0)


def test_the_first_tenants_stay_exact_under_a_flood_and_the_counter_says_how_many_were_folded():
    limiter = CardinalityLimiter(CAPPED, SLICE, CardinalityLimits(max_values_per_label=3, max_slices=100))
    normal = _frame([("acme", "llama", "llm", 1000)] * 5)
    limiter.admit(normal)
    flood = _frame([(f"bot{i}", f"m{i}", "llm", 2000) for i in range(50)] + [("acme", "llama", "llm", 3000)])
    out, overflowed = limiter.admit(flood)
    assert out.filter(pl.col("tenant") == "acme").height == 1
    assert overflowed.events_by_label == {"tenant": 48, "model": 48}  # bot0, bot1 (and m0, m1) got the places left
    assert out.filter(pl.col("tenant") == OVERFLOW_LABEL_VALUE).height == 48
    assert sorted(limiter.values["tenant"]) == ["acme", "bot0", "bot1"]


def test_a_slice_past_the_slice_cap_is_folded_whole():
    limiter = CardinalityLimiter(CAPPED, SLICE, CardinalityLimits(max_values_per_label=10, max_slices=2))
    out, overflowed = limiter.admit(_frame([("a", "x", "llm", 0), ("a", "y", "llm", 0), ("b", "x", "llm", 0),
                                            ("b", "y", "asr", 0)]))
    assert out.rows()[:2] == [("a", "x", "llm", 0), ("a", "y", "llm", 0)]
    assert out.rows()[2:] == [(OVERFLOW_LABEL_VALUE, OVERFLOW_LABEL_VALUE, "llm", 0),
                              (OVERFLOW_LABEL_VALUE, OVERFLOW_LABEL_VALUE, "asr", 0)]
    assert overflowed.slice_events == 2 and overflowed.events_by_label == {}


def test_a_value_unseen_past_the_forget_time_frees_its_place():
    limiter = CardinalityLimiter(CAPPED, SLICE, CardinalityLimits(1, 10, forget_after_ms=2 * HOUR_MS))
    limiter.admit(_frame([("old", "m", "llm", 0)]))
    out, _ = limiter.admit(_frame([("new", "m", "llm", 1 * HOUR_MS)]))
    assert out["tenant"].to_list() == [OVERFLOW_LABEL_VALUE]  # `old` was seen an hour ago: still holds its place
    out, _ = limiter.admit(_frame([("new", "m", "llm", 3 * HOUR_MS)]))
    assert out["tenant"].to_list() == ["new"] and list(limiter.values["tenant"]) == ["new"]


def test_a_restored_limiter_admits_what_the_uninterrupted_one_admits():
    limits = CardinalityLimits(4, 6, forget_after_ms=HOUR_MS)
    first = _frame([(f"t{i}", f"m{i % 3}", "llm", i * 60_000) for i in range(6)])
    second = _frame([(f"t{i}", f"m{i % 5}", "asr", HOUR_MS + i) for i in range(9)])
    whole = CardinalityLimiter(CAPPED, SLICE, limits)
    whole.admit(first)
    blob = whole.to_bytes()
    restarted = CardinalityLimiter(CAPPED, SLICE, limits)
    restarted.restore(blob)
    assert not restarted.changed
    a, b = whole.admit(second), restarted.admit(second)
    assert a[0].equals(b[0]) and a[1] == b[1] and whole.to_bytes() == restarted.to_bytes()


class ReferenceLimiter(CardinalityLimiter):
    """What the reference limiters of the tests share: a batch's newest hour ages the state."""

    def aged(self, frame: pl.DataFrame) -> None:
        newest = int(frame["ts_ms"].max()) // HOUR_MS
        if self.newest_hour is None or newest > self.newest_hour:
            self.newest_hour = newest
            self._forget()


class _PerEventLimiter(ReferenceLimiter):
    """The reference: each capped label's values grouped over every event of the batch."""

    def admit(self, frame: pl.DataFrame):
        from tailwatch.streams.cardinality import Overflowed

        out = Overflowed()
        if frame.height == 0:
            return frame, out
        hour = (pl.col("ts_ms").max() // HOUR_MS).alias("_hour")
        first = pl.col("ts_ms").min().alias("_first")
        self.aged(frame)
        for label in self.capped:
            seen = frame.group_by(label).agg(hour, first).sort("_first", label)
            refused = self._admit_values(label, seen.select(label, "_hour").iter_rows())
            if refused:
                frame = self.fold_values(frame, label, refused, out)
        keys = list(self.slice_labels)
        key_hash = pl.struct(keys).hash().alias("_key")
        combos = frame.select(key_hash, *keys, "ts_ms").group_by("_key").agg(
            *[pl.col(k).first() for k in keys], hour, first).sort("_first", *keys).drop("_first")
        refused = self._admit_slices(keys, combos.drop("_key").iter_rows())
        refused_keys = [h for h, *key in combos.iter_rows() if tuple(key[:-1]) in refused]
        if refused_keys:
            frame = self.fold_slices(frame, keys, refused_keys, out)
        return frame, out


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(_rows, min_size=1, max_size=5), max_values=st.integers(1, 8), max_slices=st.integers(1, 20),
       forget=st.sampled_from([0, HOUR_MS]))
def test_values_taken_from_the_batchs_slices_decide_as_a_pass_over_every_event_does(batches, max_values, max_slices,
                                                                                   forget):
    limits = CardinalityLimits(max_values, max_slices, forget_after_ms=forget)
    fast, reference = CardinalityLimiter(CAPPED, SLICE, limits), _PerEventLimiter(CAPPED, SLICE, limits)
    for rows in batches:
        frame = _frame(rows)
        (got, got_over), (want, want_over) = fast.admit(frame), reference.admit(frame)
        assert got.equals(want)
        assert (got_over.events_by_label, got_over.slice_events) == (want_over.events_by_label, want_over.slice_events)
        assert (fast.values, fast.slices, fast.newest_hour) == (reference.values, reference.slices, reference.newest_hour)
