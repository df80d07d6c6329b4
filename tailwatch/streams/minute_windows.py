"""Event-time 1-minute windows: lateness, dedupe, partial aggregates, closing.

State in, frames out, no I/O. One `MinuteWindows` per topic holds mergeable partial
aggregates and histogram bins of the open minutes, as the micro-batches delivered them
(streams/open_rows.py: merged now and then), and per open minute the dedupe hashes seen.
The checkpoint writes only what changed since the last one (`take_unsaved`), and `restore`
rebuilds the same state.

Lateness is judged per partition, in the partition's own order: an event is late when
it is older than that partition's watermark minus the allowed lateness, or older than
the closed frontier. The frontier is cut over EVERY partition of the topic, not only the
ones this worker owns right now: a partition the group has handed elsewhere (a dead
member not yet expired, a second worker) holds it at its last known watermark, so how
partitions were assigned can never turn an on-time event into a late one. A partition
stops holding the frontier only when it is idle (Flink's `withIdleness`, in event-time
terms): read to its end by this worker and either without any valid event (a partition
of poison records or one no producer writes to) or more than `idle_timeout_ms` of event
time behind the newest partition. The frontier never passes the newest watermark minus
the allowed lateness, so an event within the allowed lateness of the newest event seen
is never late, whatever the assignment, the idleness or the timing. Together these make
the buckets a function of the log: a replay, or a restart from a checkpoint, gives the
same buckets. The dedupe sets live only as
long as their minute is open, so their memory is bounded by the events of the open
minutes (a redelivery after close is late by construction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
import polars as pl
import pyarrow as pa

from tailwatch.slo import histogram
from tailwatch.streams.open_rows import OpenRows

MINUTE_MS = 60_000
PARTITION_COL = "_partition"
_EMPTY_HIST = pl.lit([], dtype=pl.List(pl.Struct({"bin": pl.Int16, "n": pl.Int64})))
_EMPTY_KEYED_HIST = pl.lit([], dtype=pl.List(pl.Struct({"stage": pl.String, "bin": pl.Int16, "n": pl.Int64})))

# Histogram partials number their field: latency fields from 0, straddle histograms (below)
# from STRADDLE_FIELD_BASE, keyed ones (phases) from KEYED_FIELD_BASE.
STRADDLE_FIELD_BASE = 32
KEYED_FIELD_BASE = 64
Merge = Literal["sum", "max", "last"]


def utc_text(ms: int) -> str:
    """Epoch milliseconds as UTC text, for any int64 (datetime stops at year 9999)."""
    return f"{np.datetime64(ms, 'ms')}Z"


def concat_by_name(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The frames one under the other, matched by column name (`diagonal_relaxed`). Partials
    almost always line up already (the same columns in the same order and types), and then a
    vertical concatenation is the same frame at a third of the cost: closing a day of thin
    minutes concatenates thousands of partials."""
    try:
        return pl.concat(frames, how="vertical")
    except (pl.exceptions.ShapeError, pl.exceptions.SchemaError, pl.exceptions.ColumnNotFoundError):
        return pl.concat(frames, how="diagonal_relaxed")


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
    # A list column of {stage, ms} (stage: an index into the names) kept as one histogram per
    # key, closed into `<column>_hist`: [{stage, bin, n}].
    keyed_histogram: tuple[str, tuple[str, ...]] | None = None
    # (latency field, its bucket's lower-bound field): events known only as a bucket (lower,
    # latency], kept as `<field>_straddle_hist`, a signed histogram: +1 at the lower bound's
    # bin, −1 at the latency's. Its bins summed up to a threshold's bin count the events
    # whose bucket straddles the threshold (those wholly under it add +1 −1 = 0, those wholly
    # over it nothing), whatever the threshold, and it merges by adding like any histogram.
    straddle_fields: tuple[tuple[str, str], ...] = ()
    # Closed rows → their count partials (keys, `_minute` and the merged columns): `finalize`
    # undone, where every column of a row merges exactly with more events (sums; histograms are
    # read back generically), so an event past the allowed lateness can still correct its
    # minute (streams/corrections.py). None where means or last values cannot be merged again:
    # such a topic's late events stay dead letters.
    unfinalize: Callable[[pl.DataFrame], pl.DataFrame] | None = None
    # Keys added after checkpoints existed (conventions.LATER_SLICE_LABELS): empty, they leave a
    # slice's identity as it was, so an open minute checkpointed before them merges with it.
    later_keys: tuple[str, ...] = ()


def slice_id(keys: list[str], later: tuple[str, ...] = ()) -> pl.Expr:
    """The `_slice` of each row: a hash of its keys, in which later keys count only when set."""
    base = pl.struct([k for k in keys if k not in later]).hash()
    later = tuple(k for k in later if k in keys)
    if not later:
        return base.alias("_slice")
    given = pl.any_horizontal([pl.col(k).fill_null("") != "" for k in later])
    return pl.when(given).then(pl.struct(base.alias("_base"), *later).hash()).otherwise(base).alias("_slice")


_BIN_KEYS = ["_minute", "_slice", "field", "bin"]


def sorted_bins(hist: pl.DataFrame) -> pl.DataFrame:
    """Dated histogram partials as one row per (minute, slice, field, bin), in that order:
    the order `_finish` reads them in. One sort, then the rows whose key repeats (adjacent
    once sorted) summed, in place of a group-by and then a sort: closing a backlog of thin
    minutes merges and sorts a few hundred thousand bins per checkpoint, and on them
    polars' four-key sort alone cost as much as numpy's sort and the sums together."""
    if hist.height == 0 or any(hist[k].null_count() for k in _BIN_KEYS):
        merged = hist.group_by(_BIN_KEYS).agg(pl.col("n").sum()) if hist.height else hist
        return merged.sort(_BIN_KEYS)
    columns = [hist[k].to_numpy() for k in _BIN_KEYS]
    minute = columns[0]
    first, span = minute.min(), minute.max() - minute.min()
    # numpy sorts keys of 16 bits or less by radix: minutes as offsets from the first, where
    # they fit (the same order), halve the sort.
    by_minute = (minute - first).astype(np.uint16) if span < 2**16 else minute
    order = np.lexsort((columns[3], columns[2], columns[1], by_minute))
    # Gathered column by column in numpy: polars' gather of the frame cost half the sort.
    keys = [c[order] for c in columns]
    n = hist["n"].to_numpy()[order]
    repeats = keys[0][1:] == keys[0][:-1]
    for k in keys[1:]:
        repeats &= k[1:] == k[:-1]
    if repeats.any():
        starts = np.flatnonzero(np.r_[True, ~repeats])
        keys, n = [k[starts] for k in keys], np.add.reduceat(n, starts).astype(n.dtype)
    return pl.DataFrame([pl.Series(name, k) for name, k in zip(_BIN_KEYS, keys)] + [pl.Series("n", n)]).cast(hist.schema)


def _bin_lists(ordered: pl.DataFrame) -> pl.DataFrame:
    """(minute, slice, field, hist: [{bin, n}]) per histogram of `sorted_bins`' rows, in their
    order: what a group-by keeping order gives, from the group boundaries alone."""
    if ordered.height == 0:
        return ordered.group_by(_BIN_KEYS[:3], maintain_order=True).agg(
            pl.struct(pl.col("bin"), pl.col("n").cast(pl.Int64)).alias("hist"))
    minute, slice_, field = (ordered[k].to_numpy() for k in _BIN_KEYS[:3])
    change = (minute[1:] != minute[:-1]) | (slice_[1:] != slice_[:-1]) | (field[1:] != field[:-1])
    starts = np.flatnonzero(np.r_[True, change])
    bins = pa.StructArray.from_arrays([ordered["bin"].to_arrow(), ordered["n"].cast(pl.Int64).to_arrow()], names=["bin", "n"])
    lists = pa.LargeListArray.from_arrays(np.r_[starts, ordered.height].astype(np.int64), bins)
    # Through a record batch: polars turns a bare arrow array into a Series by way of
    # pyarrow.compute, whose import alone cost a worker 50 ms of CPU at its first close.
    hist = pl.from_arrow(pa.RecordBatch.from_arrays([lists], names=["hist"]))["hist"]
    return pl.DataFrame([pl.Series("_minute", minute[starts]), pl.Series("_slice", slice_[starts]),
                         pl.Series("field", field[starts]), hist])


def _row_of_key(rows: pl.DataFrame, parts: pl.DataFrame) -> np.ndarray | None:
    """Per row of `parts`, the row of `rows` with its (minute, slice), or -1 where none has:
    both sorted by those keys, unique in `rows`. Each key is one int64 (the minute, then the
    slice's rank among `rows`' slices), found by a binary search. None where `rows` is not
    so sorted or the keys do not fit (then a join does it)."""
    minute, slice_ = rows["_minute"].to_numpy(), rows["_slice"].to_numpy()
    part_minute, part_slice = parts["_minute"].to_numpy(), parts["_slice"].to_numpy()
    if not len(minute) or not len(part_minute):
        return np.full(len(part_minute), -1, dtype=np.int64)
    slices = np.unique(slice_)
    first = min(minute.min(), part_minute.min())
    if (max(minute.max(), part_minute.max()) - first + 1) * len(slices) >= 2**62:
        return None
    key = (minute - first) * len(slices) + np.searchsorted(slices, slice_)
    if len(key) > 1 and not (key[1:] > key[:-1]).all():
        return None
    rank = np.minimum(np.searchsorted(slices, part_slice), len(slices) - 1)
    part_key = (part_minute - first) * len(slices) + rank
    at = np.minimum(np.searchsorted(key, part_key), len(key) - 1)
    return np.where((slices[rank] == part_slice) & (key[at] == part_key), at, -1)


def _gather_index(height: int, at: np.ndarray, chosen: np.ndarray) -> pl.Series:
    """The index that lays the `chosen` parts (`at`: their rows, `_row_of_key`) on `height`
    rows: a part's index where one is, null elsewhere (as a left join leaves it)."""
    picked = np.flatnonzero(chosen & (at >= 0))
    index = np.zeros(height, dtype=np.uint32)
    placed = np.zeros(height, dtype=bool)
    index[at[picked]] = picked
    placed[at[picked]] = True
    return pl.Series(index).set(pl.Series(~placed), None)


@dataclass
class Unsaved:
    counts: list[pl.DataFrame] = field(default_factory=list)
    hist: list[pl.DataFrame] = field(default_factory=list)
    seen: list[tuple[int, np.ndarray]] = field(default_factory=list)


def _tiered(parts: list, merge: Callable[[list], object], fan_in: int) -> list:
    """Merge the newest `fan_in` parts into one, leaving older (bigger) ones alone, so each
    row is merged about log_fan_in(n) times instead of once per batch."""
    return parts[:-fan_in] + [merge(parts[-fan_in:])]


@dataclass
class OpenMinute:
    """What one open minute holds besides its partial rows (those are `MinuteWindows.counts`
    and `.hist`, kept across minutes): the dedupe hashes seen, appended per batch, merged now and then."""

    seen: list[np.ndarray] = field(default_factory=list)  # sorted runs of dedupe hashes


@dataclass
class BatchOutcome:
    accepted: int
    duplicates: int
    late_index: list[int]  # raw-batch positions of late records (dead letters `late`, or `too_late` with corrections)
    late_ts_ms: list[int]
    to_correct: int = 0  # late events of closed minutes held for the next checkpoint's corrections
    past_horizon: bool = False  # the late records are past the correction horizon (`too_late`), not the lateness


@dataclass
class _Judged:
    """Per row of a batch (MinuteWindows._judge): late; with a correction horizon, past it,
    and of a closed minute."""

    late: np.ndarray
    too_late: np.ndarray | None = None
    closed: np.ndarray | None = None


def _rows_by_partition(partitions: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each partition's row positions, in row order (a batch is most often one partition's)."""
    if not len(partitions):
        return []
    first = partitions[0]
    if (partitions == first).all():
        return [(int(first), np.arange(len(partitions)))]
    order = np.argsort(partitions, kind="stable")
    cuts = np.flatnonzero(np.diff(partitions[order])) + 1
    return [(int(partitions[rows[0]]), rows) for rows in np.split(order, cuts)]


class MinuteWindows:
    # Partial frames of the same minutes merged at a time (streams/open_rows.py). Count
    # partials carry every slice's labels and merge cheaply; histogram partials are larger
    # and costlier to merge.
    COUNTS_AT = 4
    HIST_AT = 32
    SEEN_RUNS_AT = 4  # every batch searches every run, so runs are merged sooner

    def __init__(self, spec: AggregateSpec, allowed_lateness_ms: int, idle_timeout_ms: int = 60_000,
                 per_partition: bool = False, correction_horizon_ms: int = 0):
        """`per_partition`: buckets are kept apart per source partition (`_partition` is part
        of the slice), so each closes into a partial that merges exactly downstream
        (streams/partials.py): how tier-1 workers that own part of a topic publish.
        `correction_horizon_ms` (a correctable spec only; 0: none): an event past the allowed
        lateness but within this of its partition's watermark and of the closed frontier is
        kept to correct its minute (`take_late`); older ones are `too_late`."""
        self.spec = spec
        self.correction_horizon_ms = correction_horizon_ms if spec.unfinalize is not None else 0
        self._late: list[pl.DataFrame] = []  # late events of closed minutes, until the next checkpoint
        self.per_partition = per_partition
        self.labels = (*spec.keys, PARTITION_COL) if per_partition else spec.keys
        self.allowed_lateness_ms = allowed_lateness_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.watermark_ms: dict[int, int] = {}  # per partition
        self.closed_before_minute: int | None = None  # minutes < this are closed
        self._open: dict[int, OpenMinute] = {}  # every minute with partial rows has one
        self.counts = OpenRows(lambda f: self._merge_counts([f], grouped=False), concat_by_name, True, self.COUNTS_AT)
        self.hist = OpenRows(lambda f: self._merge_hist([f], grouped=False), pl.concat, False, self.HIST_AT)
        self.unsaved = Unsaved()

    # ---- ingest -------------------------------------------------------------------
    def add(self, frame: pl.DataFrame) -> BatchOutcome:
        if frame.height == 0:
            return BatchOutcome(0, 0, [], [])
        frame = frame.with_columns((pl.col("ts_ms") // MINUTE_MS).alias("_minute"))
        judged = self._judge(frame)
        to_correct, refused = 0, None
        if not judged.late.any():  # the common case: one pass, no filtering
            on_time = frame
        elif self.correction_horizon_ms:
            # Past the allowed lateness but within the horizon: an open minute takes the event
            # as it takes any; a closed one is corrected at the next checkpoint.
            refuse = judged.too_late
            correct = ~refuse & judged.closed
            refused = frame.filter(pl.Series(refuse))
            if correct.any():
                late = frame.filter(pl.Series(correct))
                self._late.append(late)
                to_correct = late.height
            on_time = frame.filter(pl.Series(~(refuse | correct)))
        else:
            refused = frame.filter(pl.Series(judged.late))
            on_time = frame.filter(pl.Series(~judged.late))
        on_time, duplicates = self._dedupe(on_time)
        if on_time.height:
            self._aggregate(on_time)
        return BatchOutcome(
            accepted=on_time.height,
            duplicates=duplicates,
            late_index=[] if refused is None else refused["_index"].to_list(),
            late_ts_ms=[] if refused is None else refused["ts_ms"].to_list(),
            to_correct=to_correct,
            past_horizon=bool(self.correction_horizon_ms),
        )

    def _judge(self, frame: pl.DataFrame) -> "_Judged":
        """Per row: `late` (older than its partition's watermark minus the allowed lateness,
        or of a closed minute); with a correction horizon also `too_late` (beyond the horizon
        the same way) and `closed` (of a closed minute). The partitions' watermarks then move
        to their newest event. In NumPy, a partition's rows at a time: the polars query (a join
        and a windowed cumulative max) cost more than the rest of the judging."""
        ts = frame["ts_ms"].to_numpy()
        minute = frame["_minute"].to_numpy()
        # Each row's watermark before it: its partition's before the batch, or the newest of
        # the partition's earlier rows in the batch. `known` is False where there is none.
        wm = np.empty(len(ts), dtype=np.int64)
        known = np.ones(len(ts), dtype=bool)
        for part, rows in _rows_by_partition(frame["_partition"].to_numpy()):
            at = ts[rows]
            prior = np.maximum.accumulate(at)
            before = self.watermark_ms.get(part)
            wm[rows[1:]] = prior[:-1] if before is None else np.maximum(prior[:-1], before)
            if before is None:
                known[rows[0]] = False
                wm[rows[0]] = 0
            else:
                wm[rows[0]] = before
            if int(prior[-1]) > self.watermark_ms.get(part, -(2**62)):
                self.watermark_ms[part] = int(prior[-1])
        late = known & (ts < wm - self.allowed_lateness_ms)
        if not self.correction_horizon_ms:
            if self.closed_before_minute is not None:
                late |= minute < self.closed_before_minute
            return _Judged(late)
        too_late = known & (ts < wm - self.correction_horizon_ms)
        closed = np.zeros(len(ts), dtype=bool)
        if self.closed_before_minute is not None:
            closed = minute < self.closed_before_minute
            late |= closed
            too_late |= minute < self.closed_before_minute - self.correction_horizon_ms // MINUTE_MS
        return _Judged(late, late & too_late, closed)

    def take_late(self) -> pl.DataFrame | None:
        """The late events of closed minutes held since the last call, with their dedupe hash
        (`_dedupe`), for the checkpoint that corrects their minutes (streams/corrections.py)."""
        if not self._late:
            return None
        late, self._late = pl.concat(self._late, how="diagonal_relaxed"), []
        return late.with_columns(self.spec.dedupe_key.alias("_dedupe"))

    @property
    def holds_late(self) -> bool:
        return bool(self._late)

    def _dedupe(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        arrived = frame.height
        frame = frame.with_columns(self.spec.dedupe_key.alias("_dedupe"))
        column = frame["_dedupe"]
        # One event has one timestamp, so its copies share a minute: the hash alone decides.
        # The rows kept are marked here and the frame filtered once, at the end.
        firsts = np.flatnonzero(column.is_first_distinct().to_numpy())
        hashes = column.to_numpy()[firsts]
        minutes = frame["_minute"].to_numpy()[firsts]
        keep = np.zeros(arrived, dtype=bool)
        # Each minute's rows from one stable sort, not a scan of the batch per minute: a batch
        # of thin traffic spans a hundred minutes.
        order = np.argsort(minutes, kind="stable")
        for rows in np.split(order, np.flatnonzero(np.diff(minutes[order])) + 1) if order.size else ():
            minute = int(minutes[rows[0]])
            # The minute's hashes in order: each run is searched front to back (a quarter of the
            # cost of searching it in arrival order), and what is new is already sorted.
            rows = rows[np.argsort(hashes[rows])]
            h = hashes[rows]
            state = self._minute(minute)
            new = np.ones(len(h), dtype=bool)
            for run in state.seen:
                pos = np.minimum(np.searchsorted(run, h), len(run) - 1)
                new &= run[pos] != h
            keep[firsts[rows[new]]] = True
            fresh = h[new]
            if fresh.size:
                state.seen.append(fresh)
                if len(state.seen) > self.SEEN_RUNS_AT:
                    state.seen = _tiered(state.seen, lambda runs: np.sort(np.concatenate(runs)), self.SEEN_RUNS_AT)
                self.unsaved.seen.append((minute, fresh))
        frame = frame.filter(pl.Series(keep))
        return frame, arrived - frame.height

    def _minute(self, minute: int) -> OpenMinute:
        state = self._open.get(minute)
        if state is None:
            state = self._open[minute] = OpenMinute()
        return state

    def _aggregate(self, frame: pl.DataFrame) -> None:
        """The batch's partials (every minute of it has an `OpenMinute` already: `_dedupe`)."""
        counts, hist = self.partials(frame)
        self.unsaved.counts.append(counts)
        self.counts.add(counts)
        if hist is not None:
            self.unsaved.hist.append(hist)
            self.hist.add(hist)

    def partials(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame | None]:
        """Count and histogram partials of events (deduped, with `_minute`), keyed by (minute,
        slice); the open minutes are not touched (a correction merges them into closed rows)."""
        keys = list(self.labels)
        frame = frame.with_columns(slice_id(keys, self.spec.later_keys))
        counts = frame.group_by("_minute", "_slice").agg(
            *[pl.col(k).first() for k in keys], *self.spec.partial
        )
        if not self.spec.histogram_fields:
            return counts, None
        # Every latency field binned, then one group-by over (minute, slice, field, bin):
        # a group-by per field cost 60% more on a 20,000-event batch.
        binned = frame.select("_minute", "_slice", *[
            histogram.bin_expr(name).alias(str(fi)) for fi, name in enumerate(self.spec.histogram_fields)])
        flat = (
            binned.unpivot(index=["_minute", "_slice"], variable_name="field", value_name="bin")
            .drop_nulls("bin")
            .group_by("_minute", "_slice", pl.col("field").cast(pl.Int8), "bin")
            .agg(pl.len().cast(pl.Int32).alias("n"))
            .select("_minute", "_slice", "field", "bin", "n")
        )
        return counts, pl.concat([flat, *self._straddle_hist(frame), *self._keyed_hist(frame)])

    def _straddle_hist(self, frame: pl.DataFrame) -> list[pl.DataFrame]:
        out = []
        for fi, (name, lower) in enumerate(self.spec.straddle_fields):
            if lower not in frame.columns or frame[lower].null_count() == frame.height:
                continue  # measured latencies only (the common case): nothing straddles
            known = frame.select("_minute", "_slice", name, lower).filter(
                pl.col(name).is_not_null() & pl.col(lower).is_not_null())
            field = pl.lit(STRADDLE_FIELD_BASE + fi, pl.Int8).alias("field")
            out.append(pl.concat([
                known.select("_minute", "_slice", field, histogram.bin_expr(lower).alias("bin"), pl.lit(1, pl.Int32).alias("n")),
                known.select("_minute", "_slice", field, histogram.bin_expr(name).alias("bin"), pl.lit(-1, pl.Int32).alias("n")),
            ]).group_by("_minute", "_slice", "field", "bin").agg(pl.col("n").sum()).filter(pl.col("n") != 0)
                       .select("_minute", "_slice", "field", "bin", "n"))
        return out

    def _keyed_hist(self, frame: pl.DataFrame) -> list[pl.DataFrame]:
        keyed = self.spec.keyed_histogram
        if keyed is None or keyed[0] not in frame.columns or frame[keyed[0]].null_count() == frame.height:
            return []
        column = keyed[0]
        return [
            frame.select("_minute", "_slice", column).drop_nulls(column).explode(column).unnest(column)
            .drop_nulls("ms")
            .group_by("_minute", "_slice", (pl.col("stage") + KEYED_FIELD_BASE).cast(pl.Int8).alias("field"),
                      histogram.bin_expr("ms").alias("bin"))
            .agg(pl.len().cast(pl.Int32).alias("n"))
            .select("_minute", "_slice", "field", "bin", "n")
        ]

    # ---- merging ------------------------------------------------------------------
    def _merge_counts(self, frames: list[pl.DataFrame], grouped: bool = True) -> pl.DataFrame:
        """One row per (minute, slice). `grouped`: each frame already has unique keys."""
        if len(frames) == 1 and grouped:
            return self._conform(frames[0])
        keys = list(self.labels)
        merged = self._conformed(frames)
        exprs = [pl.col(k).first() for k in keys]
        for col, how in self.spec.merge.items():
            if how == "sum":
                exprs.append(pl.col(col).sum())
            elif how == "max":
                exprs.append(pl.col(col).max())
            else:  # the newest non-empty value, by the time kept beside it (streams/aggregates.py)
                exprs.append(pl.col(col).sort_by([f"_ts_{col}", col], nulls_last=False).last())
        # Every frame's columns, in the order first seen: the concatenation's own.
        return merged.group_by("_minute", "_slice").agg(exprs).select(merged.columns)

    def _conformed(self, frames: list[pl.DataFrame]) -> pl.DataFrame:
        """The frames one under the other, each `_conform`ed. Where they line up already (the
        same columns in the same order and types: almost always), the concatenation is
        conformed once: a checkpoint that closes a thousand thin minutes spent as long looking
        at each partial's columns as concatenating them. Otherwise by name: partials from a
        batch and merged ones list their columns in different orders, and blobs from an older
        checkpoint may lack newer columns."""
        try:
            return self._conform(pl.concat(frames, how="vertical"))
        except (pl.exceptions.ShapeError, pl.exceptions.SchemaError, pl.exceptions.ColumnNotFoundError):
            return concat_by_name([self._conform(f) for f in frames])

    def _conform(self, frame: pl.DataFrame) -> pl.DataFrame:
        """A partial from an older version (a checkpoint blob, or a tier-1 worker not yet
        upgraded) lacks the merge columns added since: they are added empty (a sum of nothing)."""
        have = set(frame.columns)  # a list built anew on every access: once, not once per column
        missing = [c for c in self.spec.merge if c not in have]
        keys = [k for k in self.spec.later_keys if k not in have]
        if not missing and not keys:
            return frame
        return frame.with_columns(*[pl.lit(None, dtype=pl.Int64).alias(c) for c in missing],
                                  *[pl.lit("", dtype=pl.String).alias(k) for k in keys])

    def _merge_hist(self, frames: list[pl.DataFrame], grouped: bool = True) -> pl.DataFrame:
        """One row per (minute, slice, field, bin); an open minute's partials have no `_minute`."""
        if len(frames) == 1 and grouped:
            return frames[0]
        keys = ["_minute", "_slice", "field", "bin"] if "_minute" in frames[0].columns else ["_slice", "field", "bin"]
        return pl.concat(frames).group_by(keys).agg(pl.col("n").sum())

    # ---- closing ------------------------------------------------------------------
    def open_minutes(self) -> list[int]:
        return sorted(self._open)

    def peek(self) -> pl.DataFrame:
        """Rows of every open minute as they would close now: the live view for readers
        that cannot wait for the lateness window (the signal API). The open state is left
        as it is: merging each minute's partials in place took two queries a minute."""
        counts = self.counts.peek(reduced=True)
        if counts is None:
            return pl.DataFrame()
        counts, hist = self._merged(counts, self.hist.peek(reduced=False))
        return self._finish(counts, hist if self.spec.histogram_fields else None, bins_sorted=True)

    def closable_before(self, partitions: set[int], read_to_end: set[int]) -> int | None:
        """The first minute that must stay open; minutes before it may close (None: none may).

        `partitions`: every partition of the topic, owned or not. `read_to_end`: those this
        worker owns and has consumed to the log end (only those can be idle)."""
        newest = max(self.watermark_ms.values(), default=None)
        marks = []
        for p in partitions:
            wm = self.watermark_ms.get(p)
            if p in read_to_end and (wm is None or wm < newest - self.idle_timeout_ms):
                continue  # idle: it holds nothing back until it delivers a valid event again
            if wm is None:
                return None  # not heard from, and not known to be empty: it may hold anything
            marks.append(wm)
        if not marks:
            return None
        return (min(marks) - self.allowed_lateness_ms) // MINUTE_MS

    def idle_partitions(self, partitions: set[int], read_to_end: set[int]) -> set[int]:
        """The partitions that `closable_before` passes over (for metrics and readiness)."""
        newest = max(self.watermark_ms.values(), default=None)
        return {p for p in partitions & read_to_end
                if self.watermark_ms.get(p) is None or self.watermark_ms[p] < newest - self.idle_timeout_ms}

    def close(self, before_minute: int | None, max_rows: int | None = None) -> tuple[pl.DataFrame, list[int]]:
        """Close every open minute < before_minute (None: all), oldest first, stopping after
        the minute that reaches `max_rows` partial rows (at least one minute closes; the rest
        stay open, `open_before` says so). Returns rows and the minutes closed."""
        counts, hist, closing = self.close_partials(before_minute, max_rows)
        if counts is None:
            return pl.DataFrame(), []
        return self._finish(counts, hist if self.spec.histogram_fields else None, bins_sorted=True), closing

    def open_before(self, minute: int) -> bool:
        """Whether an open minute precedes `minute` (a bounded close left it open)."""
        return any(m < minute for m in self._open)

    def close_partials(self, before_minute: int | None, max_rows: int | None = None
                       ) -> tuple[pl.DataFrame | None, pl.DataFrame | None, list[int]]:
        """Like `close`, but the minutes' merged partial state (counts, histogram bins), not
        finished rows: what `finish` (here or downstream, after more partials) turns into rows.
        The histogram bins come one row per (minute, slice, field, bin), in that order."""
        closing = sorted(m for m in self._open if before_minute is None or m < before_minute)
        bounded = False
        if max_rows is not None and len(closing) > 1:
            held = self.counts.rows_by_minute()
            reached = np.flatnonzero(np.cumsum([held.get(m, 0) for m in closing[:-1]]) >= max_rows)
            if reached.size:
                closing, bounded = closing[:int(reached[0]) + 1], True
        if before_minute is None or bounded:
            cut = closing[-1] + 1 if closing else self.closed_before_minute
        else:
            cut = before_minute
        if cut is not None:
            self._advance_frontier(cut)
        if not closing:
            return None, None, []
        for m in closing:
            del self._open[m]
        counts = self.counts.take_before(cut, reduced=True)
        hist = self.hist.take_before(cut, reduced=False)
        if counts is None:
            return None, None, []
        counts, hist = self._merged(counts, hist)
        return counts, hist, closing

    @staticmethod
    def _merged(counts: pl.DataFrame, hist: pl.DataFrame | None) -> tuple[pl.DataFrame, pl.DataFrame | None]:
        """Closing minutes' partials (counts one row per minute and slice, dated histogram
        bins) in the order finishing reads them: every minute at once (keys include the
        minute), since on thin traffic a checkpoint closes, and the view peeks at, many
        minutes of a few rows each."""
        # In one order whatever the merges did (a group-by's rows come in any order), so the
        # rows stored and published are too.
        return counts.sort("_minute", "_slice"), None if hist is None else sorted_bins(hist)

    def _advance_frontier(self, cut: int) -> None:
        if self.closed_before_minute is None or cut > self.closed_before_minute:
            self.closed_before_minute = cut

    def finish(self, counts: pl.DataFrame, hist: pl.DataFrame | None) -> pl.DataFrame:
        """Merged partial state of closed minutes → the store's rows."""
        return self._finish(counts, hist if self.spec.histogram_fields else None)

    def row_partials(self, rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Closed rows → the partial state they were finished from (a spec with `unfinalize`):
        with more partials, `merge_partials` gives the row the minute would have closed with."""
        keys = list(self.labels)
        rows = rows.with_columns(*[pl.col(k).cast(pl.String) for k in keys])
        slice_ = slice_id(keys, self.spec.later_keys)
        minute = (pl.col("window_start").dt.epoch("s") // 60).alias("_minute")
        counts = self.spec.unfinalize(rows).with_columns(slice_)
        hists = []
        for fi, name in enumerate(self.spec.histogram_fields):
            hists.append(rows.select(minute, slice_, pl.col(f"{name}_hist").alias("_bins")).explode("_bins")
                         .drop_nulls("_bins").unnest("_bins").select(
                             "_minute", "_slice", pl.lit(fi, pl.Int8).alias("field"), "bin", pl.col("n").cast(pl.Int32)))
        for fi, (name, _) in enumerate(self.spec.straddle_fields):
            if f"{name}_straddle_hist" in rows.columns:
                hists.append(rows.select(minute, slice_, pl.col(f"{name}_straddle_hist").alias("_bins")).explode("_bins")
                             .drop_nulls("_bins").unnest("_bins").select(
                                 "_minute", "_slice", pl.lit(STRADDLE_FIELD_BASE + fi, pl.Int8).alias("field"), "bin",
                                 pl.col("n").cast(pl.Int32)))
        if self.spec.keyed_histogram is not None:
            column, names = self.spec.keyed_histogram
            hists.append(rows.select(minute, slice_, pl.col(f"{column}_hist").alias("_bins")).explode("_bins")
                         .drop_nulls("_bins").unnest("_bins").select(
                             "_minute", "_slice",
                             (pl.col("stage").replace_strict(list(names), list(range(len(names))), return_dtype=pl.Int32)
                              + KEYED_FIELD_BASE).cast(pl.Int8).alias("field"),
                             "bin", pl.col("n").cast(pl.Int32)))
        return counts, pl.concat(hists)

    def merge_partials(self, counts: pl.DataFrame, hist: pl.DataFrame | None) -> pl.DataFrame:
        """Partial state whose keys repeat (the same slice-minute from several partitions) →
        the store's rows: the same merge and finish as closing in one process."""
        merged_hist = self._merge_hist([hist], grouped=False) if hist is not None and hist.height else None
        return self.finish(self._merge_counts([counts], grouped=False), merged_hist)

    def _finish(self, counts: pl.DataFrame, hist: pl.DataFrame | None, bins_sorted: bool = False) -> pl.DataFrame:
        """`bins_sorted`: `hist` is already one row per bin in key order (`sorted_bins`)."""
        out = counts
        if hist is not None:
            keys = ["_minute", "_slice", "field"]
            ordered = hist if bins_sorted else hist.sort([*keys, "bin"])
            # Quantiles of latency and phase fields only: a straddle histogram's counts are signed.
            straddle = (pl.col("field") >= STRADDLE_FIELD_BASE) & (pl.col("field") < KEYED_FIELD_BASE)
            main = ordered.filter(~straddle) if self.spec.straddle_fields else ordered
            qs = histogram.quantiles_frame(main, keys, {"p50": 0.5, "p95": 0.95, "p99": 0.99}, presorted=True)
            if bins_sorted:
                out, lists = self._finish_sorted(out, ordered, main, ordered.filter(straddle), qs)
            else:
                out, lists = self._finish_joined(out, ordered, qs)
            out = self._finish_keyed(out, lists)
        elif self.spec.histogram_fields:
            # Minutes in which no event carried any latency field: empty histograms, no
            # quantiles (closing them used to fail on the missing columns).
            out = out.with_columns(
                *[_EMPTY_HIST.alias(f"{n}_hist") for n in self.spec.histogram_fields],
                *[pl.lit(None, dtype=pl.Float64).alias(f"{n}_{q}") for n in self.spec.histogram_fields
                  for q in ("p50", "p95", "p99")],
                *[_EMPTY_HIST.alias(f"{n}_straddle_hist") for n, _ in self.spec.straddle_fields],
            )
            out = self._finish_keyed(out, None)
        out = out.with_columns(pl.from_epoch(pl.col("_minute") * 60, time_unit="s").alias("window_start"))
        return self.spec.finalize(out)

    def _finish_joined(self, out: pl.DataFrame, ordered: pl.DataFrame, qs: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Each field's histogram and quantiles, and the straddle histograms, joined onto the
        rows by (minute, slice); and the histograms as lists (minute, slice, field, hist)."""
        lists = ordered.group_by(["_minute", "_slice", "field"], maintain_order=True).agg(
            pl.struct(pl.col("bin"), pl.col("n").cast(pl.Int64)).alias("hist"))
        per_field = lists.join(qs, on=["_minute", "_slice", "field"])
        for fi, name in enumerate(self.spec.histogram_fields):
            part = per_field.filter(pl.col("field") == fi).select(
                "_minute", "_slice",
                pl.col("hist").alias(f"{name}_hist"),
                pl.col("p50").alias(f"{name}_p50"),
                pl.col("p95").alias(f"{name}_p95"),
                pl.col("p99").alias(f"{name}_p99"),
            )
            out = out.join(part, on=["_minute", "_slice"], how="left")
        out = out.with_columns([pl.col(f"{n}_hist").fill_null(_EMPTY_HIST) for n in self.spec.histogram_fields])
        for fi, (name, _) in enumerate(self.spec.straddle_fields):
            part = lists.filter(pl.col("field") == STRADDLE_FIELD_BASE + fi).select(
                "_minute", "_slice", pl.col("hist").alias(f"{name}_straddle_hist"))
            out = out.join(part, on=["_minute", "_slice"], how="left").with_columns(
                pl.col(f"{name}_straddle_hist").fill_null(_EMPTY_HIST))
        return out, lists

    def _finish_sorted(self, out: pl.DataFrame, ordered: pl.DataFrame, main: pl.DataFrame, straddles: pl.DataFrame,
                       qs: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """`_finish_joined` for rows sorted by (minute, slice) and `sorted_bins`' histograms
        (`ordered`; `main`: its latency and keyed fields, `straddles`: the rest): the same columns,
        placed by position rather than by a join per field. Closing a backlog of thin
        minutes, the joins were half of finishing them."""
        lists = _bin_lists(main)
        at = _row_of_key(out, lists)
        if at is None or not qs.select("_minute", "_slice", "field").equals(lists.select("_minute", "_slice", "field")):
            return self._finish_joined(out, ordered, qs)
        per_field = pl.concat([lists, qs.select("p50", "p95", "p99")], how="horizontal")
        field = lists["field"].to_numpy()
        columns = []
        for fi, name in enumerate(self.spec.histogram_fields):
            index = _gather_index(out.height, at, field == fi)
            columns += [per_field["hist"].gather(index).fill_null(_EMPTY_HIST).alias(f"{name}_hist"),
                        *[per_field[q].gather(index).alias(f"{name}_{q}") for q in ("p50", "p95", "p99")]]
        straddle_lists = _bin_lists(straddles)
        straddle_at = _row_of_key(out, straddle_lists)
        if straddle_at is None:
            return self._finish_joined(out, ordered, qs)
        straddle_field = straddle_lists["field"].to_numpy()
        for fi, (name, _) in enumerate(self.spec.straddle_fields):
            index = _gather_index(out.height, straddle_at, straddle_field == STRADDLE_FIELD_BASE + fi)
            columns.append(straddle_lists["hist"].gather(index).fill_null(_EMPTY_HIST).alias(f"{name}_straddle_hist"))
        return out.with_columns(columns), lists

    def _finish_keyed(self, out: pl.DataFrame, lists: pl.DataFrame | None) -> pl.DataFrame:
        """`<column>_hist` per slice-minute: the keyed fields' bins, named, in key order."""
        if self.spec.keyed_histogram is None:
            return out
        column, names = self.spec.keyed_histogram
        name = f"{column}_hist"
        keyed = None if lists is None else lists.filter(pl.col("field") >= KEYED_FIELD_BASE)
        if keyed is None or keyed.height == 0:
            return out.with_columns(_EMPTY_KEYED_HIST.alias(name))
        by_key = (
            keyed.explode("hist").unnest("hist")
            .with_columns((pl.col("field").cast(pl.Int32) - KEYED_FIELD_BASE)
                          .replace_strict(list(range(len(names))), list(names), return_dtype=pl.String).alias("stage"))
            .sort("_minute", "_slice", "field", "bin")
            .group_by("_minute", "_slice", maintain_order=True)
            .agg(pl.struct("stage", "bin", "n").alias(name))
        )
        return out.join(by_key, on=["_minute", "_slice"], how="left").with_columns(
            pl.col(name).fill_null(_EMPTY_KEYED_HIST))

    # ---- checkpoint support --------------------------------------------------------
    def take_unsaved(self) -> Unsaved:
        out, self.unsaved = self.unsaved, Unsaved()
        return out

    def restore(self, counts: list[pl.DataFrame], hist: list[pl.DataFrame], seen: list[tuple[int, np.ndarray]],
                watermarks: dict[int, int], closed_before_minute: int | None) -> None:
        """Rebuild open minutes from checkpointed deltas (frames may span several minutes)."""
        self.watermark_ms = dict(watermarks)
        self.closed_before_minute = closed_before_minute
        self._open = {}
        closed = closed_before_minute if closed_before_minute is not None else -(2**62)
        # A delta spans the minutes open at its checkpoint; some have closed since.
        self.counts.restore([self._conform(f.filter(pl.col("_minute") >= closed)) for f in counts])
        self.hist.restore([f.filter(pl.col("_minute") >= closed) for f in hist])
        for minute in np.union1d(self.counts.minutes(), self.hist.minutes()).tolist():
            self._minute(minute)
        for minute, hashes in seen:
            if minute >= closed:
                self._minute(minute).seen.append(np.sort(hashes))
        for state in self._open.values():
            if len(state.seen) > 1:
                state.seen = [np.sort(np.concatenate(state.seen))]

    def repair_event_time(self, bound_ms: int, newest_closed_minute: int | None) -> list[str]:
        """Undo what a record stamped far in the future did before `future` was refused:
        state past `bound_ms` that no event accepted now could have made. Watermarks past it
        are forgotten (the partition's next event sets it again), open minutes past it are
        dropped, and a frontier past it goes back to the minute after the newest one closed
        with rows (`newest_closed_minute`), so no minute is closed twice. Returns one line
        per repair."""
        done = []
        for part, wm in sorted(self.watermark_ms.items()):
            if wm > bound_ms:
                del self.watermark_ms[part]
                done.append(f"partition {part}: forgot a watermark at {utc_text(wm)}")
        bound_minute = bound_ms // MINUTE_MS
        for minute in sorted(m for m in self._open if m > bound_minute):
            del self._open[minute]
            done.append(f"dropped the open minute {utc_text(minute * MINUTE_MS)}")
        self.counts.drop_from(bound_minute + 1)
        self.hist.drop_from(bound_minute + 1)
        if self.closed_before_minute is not None and self.closed_before_minute > bound_minute:
            back = newest_closed_minute + 1 if newest_closed_minute is not None else None
            done.append(f"moved the closed frontier back from {utc_text(self.closed_before_minute * MINUTE_MS)} to "
                        + (utc_text(back * MINUTE_MS) if back is not None else "none"))
            self.closed_before_minute = back
        return done

    @property
    def dedupe_ids(self) -> int:
        return sum(len(r) for state in self._open.values() for r in state.seen)
