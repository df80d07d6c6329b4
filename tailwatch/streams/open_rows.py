"""Open minutes' partial rows, kept as the batches delivered them: a few frames, each in
minute order, rather than a frame per minute and batch.

A batch of thin traffic spans a hundred minutes. Split per minute, each batch cost a
`partition_by` into a hundred frames, and each close concatenated thousands of them. Kept
whole, closing minutes takes a prefix of each frame (a slice: nothing is copied).

Frames that hold mostly the same minutes (dense traffic: every batch adds rows to the
minute being filled) are merged the newest `fan_in` at a time, so that memory stays about
a row per (minute, key), as merging each minute's parts did. Frames of distinct minutes
gain nothing from a merge; they are merged a level at a time (`fan_in` frames of one level
make one of the next), which bounds how many there are while each row is copied only about
log_fan_in(batches) times, so that a backlog that cannot close yet is not copied once per
batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl


@dataclass
class Run:
    """Rows ordered by minute: `minutes` ascending and unique, `ends[i]` where the rows of
    `minutes[i]` end. `frame` has `_minute` where the kind keeps it."""

    frame: pl.DataFrame
    minutes: np.ndarray
    ends: np.ndarray
    level: int = 0

    @property
    def heights(self) -> np.ndarray:
        return np.diff(self.ends, prepend=0)

    def split(self, cut: int) -> tuple[Run | None, Run | None]:
        """The rows of minutes before `cut`, and the rest (None where there are none)."""
        i = int(np.searchsorted(self.minutes, cut))
        if i == 0:
            return None, self
        if i == len(self.minutes):
            return self, None
        k = int(self.ends[i - 1])
        return (Run(self.frame.slice(0, k), self.minutes[:i].copy(), self.ends[:i].copy(), self.level),
                Run(self.frame.slice(k), self.minutes[i:].copy(), self.ends[i:] - k, self.level))


class OpenRows:
    """One kind of partial rows (counts or histogram bins) of every open minute.

    `reduce`: rows with `_minute` whose keys may repeat → one row per key, in the same
    columns. `keep_minute`: whether the frames keep `_minute` (histogram bins leave it out: at
    thousands of slices they are most of an open minute, and the column was a third of each row)."""

    def __init__(self, reduce: Callable[[pl.DataFrame], pl.DataFrame], concat: Callable[[list[pl.DataFrame]], pl.DataFrame],
                 keep_minute: bool, fan_in: int):
        self.reduce = reduce
        self.concat = concat
        self.keep_minute = keep_minute
        self.fan_in = fan_in
        self.runs: list[Run] = []

    def __bool__(self) -> bool:
        return bool(self.runs)

    def add(self, frame: pl.DataFrame) -> None:
        """A batch's rows (with `_minute`; keys unique per minute, as a group-by gives them)."""
        if frame.height:
            self.runs.append(self._run(frame))
            self._compact()

    def restore(self, frames: list[pl.DataFrame]) -> None:
        """Rows from checkpoint deltas (keys repeat: a delta holds several batches), merged into one run."""
        frames = [f for f in frames if f.height]
        self.runs = [self._run(self.reduce(self.concat(frames)))] if frames else []

    def minutes(self) -> np.ndarray:
        return np.unique(np.concatenate([r.minutes for r in self.runs])) if self.runs else np.empty(0, np.int64)

    def rows_by_minute(self) -> dict[int, int]:
        """Rows held per minute (a key in several runs counts once per run)."""
        if not self.runs:
            return {}
        minutes = np.concatenate([r.minutes for r in self.runs])
        heights = np.concatenate([r.heights for r in self.runs])
        unique, at = np.unique(minutes, return_inverse=True)
        return dict(zip(unique.tolist(), np.bincount(at, weights=heights).astype(np.int64).tolist()))

    def take_before(self, cut: int | None, reduced: bool) -> pl.DataFrame | None:
        """The rows of minutes before `cut` (None: all), with `_minute`, removed from here.
        `reduced`: a key held by several runs comes once (else as often as held)."""
        taken, kept = [], []
        for run in self.runs:
            before, after = (run, None) if cut is None else run.split(cut)
            if before is not None:
                taken.append(before)
            if after is not None:
                kept.append(after)
        self.runs = kept
        return self._combined(taken, reduced) if taken else None

    def peek(self, reduced: bool) -> pl.DataFrame | None:
        """Every row as `take_before(None)` gives them, left in place."""
        return self._combined(self.runs, reduced) if self.runs else None

    def drop_from(self, minute: int) -> None:
        """Forget the rows of `minute` and later."""
        self.runs = [before for before, _ in (run.split(minute) for run in self.runs) if before is not None]

    def _run(self, frame: pl.DataFrame) -> Run:
        minute = frame["_minute"].to_numpy()
        if len(minute) > 1 and not (minute[1:] >= minute[:-1]).all():
            frame = frame.sort("_minute", maintain_order=True)
            minute = frame["_minute"].to_numpy()
        cuts = np.flatnonzero(minute[1:] != minute[:-1]) + 1
        return Run(frame if self.keep_minute else frame.drop("_minute"), minute[np.r_[0, cuts]].astype(np.int64),
                   np.r_[cuts, len(minute)].astype(np.int64))

    def _dated(self, run: Run) -> pl.DataFrame:
        if self.keep_minute:
            return run.frame
        return run.frame.select(pl.Series("_minute", np.repeat(run.minutes, run.heights)), pl.all())

    def _combined(self, runs: list[Run], reduced: bool) -> pl.DataFrame:
        out = self.concat([self._dated(r) for r in runs]) if len(runs) > 1 else self._dated(runs[0])
        if not reduced or len(runs) == 1:
            return out
        shared = _Shared(runs)
        if shared.mostly:
            return self.reduce(out)
        if shared.minutes.size:
            # Only the minutes held by more than one run go through the group-by: on thin
            # traffic, a batch's first and last minute.
            in_shared = pl.col("_minute").is_in(shared.minutes.tolist())
            out = self.concat([out.filter(~in_shared), self.reduce(out.filter(in_shared)).select(out.columns)])
        return out

    def _compact(self) -> None:
        while len(self.runs) > 1:
            tail = self.runs[-self.fan_in:]
            full_level = len(tail) == self.fan_in and all(r.level == tail[-1].level for r in tail)
            crowded = len(self.runs) > self.fan_in and _Shared(tail).mostly
            if not (full_level or crowded):
                return
            merged = self._run(self._combined(tail, reduced=True))
            merged.level = max(r.level for r in tail) + (1 if full_level else 0)
            self.runs[-len(tail):] = [merged]


class _Shared:
    """The minutes held by more than one of `runs`, and whether their rows are at least half
    of all (a merge folds them together; the other rows it only copies)."""

    def __init__(self, runs: list[Run]):
        minutes = np.concatenate([r.minutes for r in runs])
        heights = np.concatenate([r.heights for r in runs])
        unique, at, count = np.unique(minutes, return_inverse=True, return_counts=True)
        self.minutes = unique[count > 1]
        self.mostly = 2 * int(heights[count[at] > 1].sum()) >= int(heights.sum())
