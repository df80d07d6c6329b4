"""Event-time 1-minute windows: lateness, dedupe, partial aggregates, closing.

State in, frames out, no I/O. One `MinuteWindows` per topic holds, for every open
minute, mergeable partial aggregates (appended per micro-batch, compacted now and then),
histogram bins and the set of dedupe hashes seen. The checkpoint writes only what
changed since the last one (`take_unsaved`), and `restore` rebuilds the same state.

Lateness is judged per partition, in the partition's own order: an event is late when
it is older than that partition's watermark minus the allowed lateness. A minute closes
when the watermark of every assigned partition has passed its end plus the allowed
lateness. Together these make the buckets a function of the log, not of timing: a replay,
or a restart from a checkpoint, gives the same buckets. The dedupe sets live only as
long as their minute is open, so their memory is bounded by the events of the open
minutes (a redelivery after close is late by construction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
import polars as pl

from slo import histogram

MINUTE_MS = 60_000
Merge = Literal["sum", "max", "last"]


@dataclass(frozen=True)
class AggregateSpec:
    """What one topic's buckets hold and how partial aggregates merge."""

    name: str
    keys: tuple[str, ...]
    dedupe_key: pl.Expr
    partial: list[pl.Expr]  # over raw rows grouped by (minute, slice)
    merge: dict[str, Merge]
    finalize: Callable[[pl.DataFrame], pl.DataFrame]
    histogram_fields: tuple[str, ...] = ()


@dataclass
class Unsaved:
    counts: list[pl.DataFrame] = field(default_factory=list)
    hist: list[pl.DataFrame] = field(default_factory=list)
    seen: list[tuple[int, np.ndarray]] = field(default_factory=list)


@dataclass
class BatchOutcome:
    accepted: int
    duplicates: int
    late_index: list[int]  # raw-batch positions of late records
    late_ts_ms: list[int]


class MinuteWindows:
    COMPACT_EVERY = 16

    def __init__(self, spec: AggregateSpec, allowed_lateness_ms: int):
        self.spec = spec
        self.allowed_lateness_ms = allowed_lateness_ms
        self.watermark_ms: dict[int, int] = {}  # per partition
        self.closed_before_minute: int | None = None  # minutes < this are closed
        self._counts: list[pl.DataFrame] = []
        self._hist: list[pl.DataFrame] = []
        self._seen: dict[int, list[np.ndarray]] = {}
        self._batches_since_compact = 0
        self.unsaved = Unsaved()

    # ---- ingest -------------------------------------------------------------------
    def add(self, frame: pl.DataFrame) -> BatchOutcome:
        if frame.height == 0:
            return BatchOutcome(0, 0, [], [])
        frame = frame.with_columns((pl.col("ts_ms") // MINUTE_MS).alias("_minute"))
        late_mask = self._late_mask(frame)
        for p, wm in frame.group_by("_partition").agg(pl.col("ts_ms").max()).iter_rows():
            if wm > self.watermark_ms.get(p, -(2**62)):
                self.watermark_ms[p] = wm
        late = frame.filter(late_mask)
        on_time = frame.filter(~late_mask)
        on_time, duplicates = self._dedupe(on_time)
        if on_time.height:
            self._aggregate(on_time)
        return BatchOutcome(
            accepted=on_time.height,
            duplicates=duplicates,
            late_index=late["_index"].to_list(),
            late_ts_ms=late["ts_ms"].to_list(),
        )

    def _late_mask(self, frame: pl.DataFrame) -> pl.Series:
        before = pl.DataFrame(
            {"_partition": list(self.watermark_ms), "_wm0": list(self.watermark_ms.values())},
            schema={"_partition": pl.Int32, "_wm0": pl.Int64},
        )
        prior = pl.col("ts_ms").shift(1).cum_max().over("_partition")
        judged = frame.select("_partition", "ts_ms", "_minute").join(before, on="_partition", how="left", maintain_order="left")
        judged = judged.with_columns(pl.max_horizontal(prior, pl.col("_wm0")).alias("_wm"))
        late = (pl.col("ts_ms") < pl.col("_wm") - self.allowed_lateness_ms).fill_null(False)
        if self.closed_before_minute is not None:
            late = late | (pl.col("_minute") < self.closed_before_minute)
        return judged.select(late.alias("late"))["late"]

    def _dedupe(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        arrived = frame.height
        frame = frame.with_columns(self.spec.dedupe_key.alias("_dedupe"))
        frame = frame.filter(pl.struct("_minute", "_dedupe").is_first_distinct())
        keep = np.ones(frame.height, dtype=bool)
        minutes = frame["_minute"].to_numpy()
        hashes = frame["_dedupe"].to_numpy()
        for minute in np.unique(minutes):
            rows = np.flatnonzero(minutes == minute)
            h = hashes[rows]
            for run in self._seen.get(int(minute), ()):
                pos = np.minimum(np.searchsorted(run, h), len(run) - 1)
                keep[rows[run[pos] == h]] = False
            fresh = np.sort(h[keep[rows]])
            if fresh.size:
                runs = self._seen.setdefault(int(minute), [])
                runs.append(fresh)
                if len(runs) > 8:
                    self._seen[int(minute)] = [np.sort(np.concatenate(runs))]
                self.unsaved.seen.append((int(minute), fresh))
        frame = frame.filter(pl.Series(keep))
        return frame, arrived - frame.height

    def _aggregate(self, frame: pl.DataFrame) -> None:
        keys = list(self.spec.keys)
        frame = frame.with_columns(pl.struct(keys).hash().alias("_slice"))
        counts = frame.group_by("_minute", "_slice").agg(
            *[pl.col(k).first() for k in keys], *self.spec.partial
        )
        self._counts.append(counts)
        self.unsaved.counts.append(counts)
        if self.spec.histogram_fields:
            parts = []
            for fi, name in enumerate(self.spec.histogram_fields):
                part = (
                    frame.filter(pl.col(name).is_not_null())
                    .group_by("_minute", "_slice", histogram.bin_expr(name).alias("bin"))
                    .agg(pl.len().cast(pl.Int64).alias("n"))
                    .with_columns(pl.lit(fi, dtype=pl.Int8).alias("field"))
                )
                parts.append(part)
            hist = pl.concat(parts).select("_minute", "_slice", "field", "bin", "n")
            self._hist.append(hist)
            self.unsaved.hist.append(hist)
        self._batches_since_compact += 1
        if self._batches_since_compact >= self.COMPACT_EVERY:
            self._compact()

    # ---- merging ------------------------------------------------------------------
    def _merge_counts(self, frames: list[pl.DataFrame]) -> pl.DataFrame:
        keys = list(self.spec.keys)
        merged = pl.concat(frames, how="vertical_relaxed")
        exprs = [pl.col(k).first() for k in keys]
        for col, how in self.spec.merge.items():
            if how == "sum":
                exprs.append(pl.col(col).sum())
            elif how == "max":
                exprs.append(pl.col(col).max())
            else:
                exprs.append(pl.col(col).sort_by("_last_ts_ms").last())
        return merged.group_by("_minute", "_slice").agg(exprs)

    def _merge_hist(self, frames: list[pl.DataFrame]) -> pl.DataFrame:
        return pl.concat(frames).group_by("_minute", "_slice", "field", "bin").agg(pl.col("n").sum())

    def _compact(self) -> None:
        if len(self._counts) > 1:
            self._counts = [self._merge_counts(self._counts)]
        if len(self._hist) > 1:
            self._hist = [self._merge_hist(self._hist)]
        self._batches_since_compact = 0

    # ---- closing ------------------------------------------------------------------
    def open_minutes(self) -> list[int]:
        minutes: set[int] = set()
        for f in self._counts:
            minutes.update(f["_minute"].unique().to_list())
        return sorted(minutes)

    def closable_before(self, assigned_partitions: set[int], idle_partitions: set[int]) -> int | None:
        """The first minute that must stay open; minutes before it may close (None: none may)."""
        marks = []
        for p in assigned_partitions:
            if p in self.watermark_ms:
                marks.append(self.watermark_ms[p])
            elif p not in idle_partitions:
                return None  # a partition we have not heard from yet holds everything open
        if not marks:
            return None
        global_wm = min(marks)
        return (global_wm - self.allowed_lateness_ms) // MINUTE_MS

    def close(self, before_minute: int | None) -> tuple[pl.DataFrame, list[int]]:
        """Close every open minute < before_minute (None: all). Returns rows and the minutes closed."""
        if not self._counts:
            if before_minute is not None:
                self._advance_frontier(before_minute)
            return self._empty_closed(), []
        self._compact()
        counts = self._counts[0]
        if before_minute is None:
            cut = counts["_minute"].max() + 1  # type: ignore[operator]
        else:
            cut = before_minute
        closing = counts.filter(pl.col("_minute") < cut)
        self._counts = [counts.filter(pl.col("_minute") >= cut)]
        hist = self._hist[0] if self._hist else None
        closing_hist = None
        if hist is not None:
            closing_hist = hist.filter(pl.col("_minute") < cut)
            self._hist = [hist.filter(pl.col("_minute") >= cut)]
        closed_minutes = sorted(closing["_minute"].unique().to_list())
        for m in list(self._seen):
            if m < cut:
                del self._seen[m]
        self._advance_frontier(cut)
        if closing.height == 0:
            return self._empty_closed(), []
        rows = self._finish(closing, closing_hist)
        return rows, closed_minutes

    def _advance_frontier(self, cut: int) -> None:
        if self.closed_before_minute is None or cut > self.closed_before_minute:
            self.closed_before_minute = cut

    def _finish(self, counts: pl.DataFrame, hist: pl.DataFrame | None) -> pl.DataFrame:
        out = counts
        if hist is not None:
            names = self.spec.histogram_fields
            qs = histogram.quantiles_frame(hist, ["_minute", "_slice", "field"], {"p50": 0.5, "p95": 0.95, "p99": 0.99})
            lists = hist.sort("bin").group_by("_minute", "_slice", "field").agg(
                pl.struct(pl.col("bin"), pl.col("n")).alias("hist")
            )
            per_field = lists.join(qs, on=["_minute", "_slice", "field"])
            for fi, name in enumerate(names):
                part = per_field.filter(pl.col("field") == fi).select(
                    "_minute", "_slice",
                    pl.col("hist").alias(f"{name}_hist"),
                    pl.col("p50").alias(f"{name}_p50"),
                    pl.col("p95").alias(f"{name}_p95"),
                    pl.col("p99").alias(f"{name}_p99"),
                )
                out = out.join(part, on=["_minute", "_slice"], how="left")
            empty = pl.lit([], dtype=pl.List(pl.Struct({"bin": pl.Int16, "n": pl.Int64})))
            out = out.with_columns([pl.col(f"{n}_hist").fill_null(empty) for n in names])
        out = out.with_columns(pl.from_epoch(pl.col("_minute") * 60, time_unit="s").alias("window_start"))
        return self.spec.finalize(out)

    def _empty_closed(self) -> pl.DataFrame:
        return pl.DataFrame()

    # ---- checkpoint support --------------------------------------------------------
    def take_unsaved(self) -> Unsaved:
        out, self.unsaved = self.unsaved, Unsaved()
        return out

    def restore(self, counts: pl.DataFrame | None, hist: pl.DataFrame | None, seen: list[tuple[int, np.ndarray]],
                watermarks: dict[int, int], closed_before_minute: int | None) -> None:
        self.watermark_ms = dict(watermarks)
        self.closed_before_minute = closed_before_minute
        self._counts = [counts] if counts is not None and counts.height else []
        self._hist = [hist] if hist is not None and hist.height else []
        self._seen = {}
        for minute, hashes in seen:
            self._seen.setdefault(minute, []).append(np.sort(hashes))
        self._compact()

    @property
    def dedupe_ids(self) -> int:
        return sum(len(r) for runs in self._seen.values() for r in runs)
