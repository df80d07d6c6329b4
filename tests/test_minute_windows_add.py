"""The windows' `add` as it is (lateness judged in NumPy a partition's rows at a time, the
dedupe marking rows and filtering the frame once) decides as the code it replaced: on randomized
batches over several partitions, out of order, with repeated event ids, watermarks from earlier
batches, a closed frontier and with or without a correction horizon, the same outcome (accepted,
duplicates, late records, corrections), the same watermarks, the same dedupe runs held and
checkpointed, and the same minutes closed."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings, strategies as st

from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams import minute_windows as mw
from tailwatch.streams.minute_windows import MINUTE_MS, MinuteWindows
from tests.test_minute_windows import T0, frame


class _PolarsJudgedWindows(MinuteWindows):
    """The reference: lateness by a join on the watermarks and a cumulative max over each
    partition, watermarks by a group-by, and the dedupe's filters, as the windows had them."""

    def _judge(self, frame: pl.DataFrame) -> mw._Judged:
        """The former query; the watermarks then moved by a group-by, as `add` did after it."""
        judged = self._polars_judged(frame)
        for p, wm in frame.group_by("_partition").agg(pl.col("ts_ms").max()).iter_rows():
            if wm > self.watermark_ms.get(p, -(2**62)):
                self.watermark_ms[p] = wm
        return mw._Judged(*[judged[c].to_numpy() for c in judged.columns])

    def _polars_judged(self, frame: pl.DataFrame) -> pl.DataFrame:
        before = pl.DataFrame(
            {"_partition": list(self.watermark_ms), "_wm0": list(self.watermark_ms.values())},
            schema={"_partition": pl.Int32, "_wm0": pl.Int64},
        )
        prior = pl.col("ts_ms").shift(1).cum_max().over("_partition")
        judged = frame.select("_partition", "ts_ms", "_minute").join(before, on="_partition", how="left", maintain_order="left")
        judged = judged.with_columns(pl.max_horizontal(prior, pl.col("_wm0")).alias("_wm"))
        late = (pl.col("ts_ms") < pl.col("_wm") - self.allowed_lateness_ms).fill_null(False)
        too_late = (pl.col("ts_ms") < pl.col("_wm") - self.correction_horizon_ms).fill_null(False)
        closed = pl.lit(False)
        if self.closed_before_minute is not None:
            closed = pl.col("_minute") < self.closed_before_minute
            late = late | closed
            too_late = too_late | (pl.col("_minute") < self.closed_before_minute - self.correction_horizon_ms // MINUTE_MS)
        if not self.correction_horizon_ms:
            return judged.select(late.alias("late"))
        return judged.select(late.alias("late"), (late & too_late).alias("too_late"), closed.alias("closed"))


    def _dedupe(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        arrived = frame.height
        frame = frame.with_columns(self.spec.dedupe_key.alias("_dedupe"))
        # One event has one timestamp, so its copies share a minute: the hash alone decides.
        frame = frame.filter(pl.col("_dedupe").is_first_distinct())
        keep = np.ones(frame.height, dtype=bool)
        minutes = frame["_minute"].to_numpy()
        hashes = frame["_dedupe"].to_numpy()
        # Each minute's rows (in batch order) from one stable sort, not a scan of the batch per
        # minute: a batch of thin traffic spans a hundred minutes.
        order = np.argsort(minutes, kind="stable")
        for rows in np.split(order, np.flatnonzero(np.diff(minutes[order])) + 1) if order.size else ():
            minute = minutes[rows[0]]
            h = hashes[rows]
            state = self._minute(int(minute))
            for run in state.seen:
                pos = np.minimum(np.searchsorted(run, h), len(run) - 1)
                keep[rows[run[pos] == h]] = False
            fresh = np.sort(h[keep[rows]])
            if fresh.size:
                state.seen.append(fresh)
                if len(state.seen) > self.SEEN_RUNS_AT:
                    state.seen = mw._tiered(state.seen, lambda runs: np.sort(np.concatenate(runs)), self.SEEN_RUNS_AT)
                self.unsaved.seen.append((int(minute), fresh))
        frame = frame.filter(pl.Series(keep))
        return frame, arrived - frame.height


_event = st.tuples(st.integers(0, 30), st.integers(-25 * MINUTE_MS, 25 * MINUTE_MS), st.integers(0, 3),
                   st.sampled_from(["ok", "error"]), st.floats(1, 5_000))


def _runs(w: MinuteWindows) -> dict[int, list[list[int]]]:
    """The sorted runs of dedupe hashes each open minute holds."""
    return {m: [run.tolist() for run in state.seen] for m, state in w._open.items()}


@settings(max_examples=120, deadline=None)
@given(batches=st.lists(st.lists(_event, max_size=40), min_size=1, max_size=6), lateness_min=st.integers(0, 6),
       horizon_min=st.sampled_from([0, 3, 60]), close_at=st.lists(st.integers(-20, 20), max_size=6))
def test_add_decides_as_the_former_code_did(batches, lateness_min, horizon_min, close_at):
    keys = ["window_start", *REQUESTS.keys]  # closed rows come in no fixed order
    new = MinuteWindows(REQUESTS, lateness_min * MINUTE_MS, correction_horizon_ms=horizon_min * MINUTE_MS)
    old = _PolarsJudgedWindows(REQUESTS, lateness_min * MINUTE_MS, correction_horizon_ms=horizon_min * MINUTE_MS)
    for k, rows in enumerate(batches):
        batch = frame([(f"e{eid}", T0 + at, part, status, e2e) for eid, at, part, status, e2e in rows])
        got, want = new.add(batch), old.add(batch)
        assert got == want
        assert new.watermark_ms == old.watermark_ms
        assert _runs(new) == _runs(old)
        if k < len(close_at):  # a checkpoint closes minutes between batches, moving the frontier
            before = T0 // MINUTE_MS + close_at[k]
            (rows_new, closed_new), (rows_old, closed_old) = new.close(before), old.close(before)
            assert closed_new == closed_old
            assert (rows_new.height == 0 and rows_old.height == 0) or rows_new.sort(keys).equals(rows_old.sort(keys))
            assert new.closed_before_minute == old.closed_before_minute
    unsaved_new, unsaved_old = new.take_unsaved().seen, old.take_unsaved().seen
    assert [(m, h.tolist()) for m, h in unsaved_new] == [(m, h.tolist()) for m, h in unsaved_old]
    late_new, late_old = new.take_late(), old.take_late()
    assert (late_new is None and late_old is None) or late_new.equals(late_old)
    (rows_new, closed_new), (rows_old, closed_old) = new.close(None), old.close(None)
    assert closed_new == closed_old
    assert (rows_new.height == 0 and rows_old.height == 0) or rows_new.sort(keys).equals(rows_old.sort(keys))
