"""Good and valid event counts per SLO, slice and minute, from `sli_minute` rows.

Vectorised over a polars frame of buckets; `replay` then feeds the counts, minute by
minute in event time, through one `SloTable` per SLO (its slices column-wise). The same function serves a
replay of the store (`tailwatch slo status --at`) and, minute by minute, a live stream.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa

from tailwatch.conventions import LATENCY_LOWER_FIELDS
from tailwatch.slo import histogram
from tailwatch.slo.engine import (
    AlertChange, KeptMinutes, SliceView, SloTable, window_lengths,
)
from tailwatch.slo.shared_windows import SharedWindows
from tailwatch.slo.spec import COUNT_KINDS, REPORTED_KINDS, SloSpec
from tailwatch.slo.turn_phases import overspend_counts


def histogram_sums(spec: SloSpec) -> dict[str, pl.Expr]:
    """The sums of histogram bins an SLO's good and valid counts read, by column name: the
    events of its latency field, those at or under its threshold's bin (none for
    availability and stream completion), and, where the field can come from a runtime's
    histogram, those whose bucket straddles the threshold (`undecided_expr`). SLOs over one
    field share them."""
    if spec.sli_kind in COUNT_KINDS:
        return {}
    bound = histogram.last_good_bin(spec.threshold_ms)  # type: ignore[arg-type]
    hist = pl.col(f"{spec.latency_field}_hist")
    out = {
        f"_n_{spec.latency_field}": hist.list.eval(pl.element().struct.field("n")).list.sum(),
        f"_n_{spec.latency_field}_le_{bound}":
            hist.list.eval(pl.element().filter(pl.element().struct.field("bin") <= bound).struct.field("n")).list.sum(),
    }
    if has_undecided(spec):
        # The signed straddle histogram summed to the threshold's bin (streams/minute_windows.py).
        straddle = pl.col(f"{spec.latency_field}_straddle_hist")
        out[f"_u_{spec.latency_field}_le_{bound}"] = straddle.list.eval(
            pl.element().filter(pl.element().struct.field("bin") <= bound).struct.field("n")).list.sum().fill_null(0)
    return out


def has_undecided(spec: SloSpec) -> bool:
    """Whether the SLO can have undecided events: a latency that a runtime's histogram can give."""
    return spec.sli_kind not in COUNT_KINDS and spec.latency_field in LATENCY_LOWER_FIELDS


def undecided_expr(spec: SloSpec, sums_as_columns: bool = False) -> pl.Expr:
    """Of one bucket row's valid events, those neither proven good nor bad: known only as a
    runtime bucket whose bounds straddle the threshold (counted bad in `good_valid_exprs`'
    good, so good + undecided is the SLI's upper end). 0 for measured latencies and counts."""
    if not has_undecided(spec):
        return pl.lit(0, pl.Int64)
    sums = list(histogram_sums(spec).items())
    total, good, undecided = (pl.col(name) for name, _ in sums) if sums_as_columns else (e for _, e in sums)
    valid = total if spec.sli_kind in ("latency", "stage_budget") else pl.col("requests") - pl.col("cancelled")
    # Never below 0 (a producer's lower bound above its latency) nor past the valid events not good.
    return pl.max_horizontal(pl.min_horizontal(undecided.cast(pl.Int64), valid - good.cast(pl.Int64)), 0)


def good_valid_exprs(spec: SloSpec, sums_as_columns: bool = False) -> tuple[pl.Expr, pl.Expr]:
    """The SLO's good and valid counts of one bucket row. `sums_as_columns`: the rows already
    hold `histogram_sums(spec)` as columns."""
    not_cancelled = pl.col("requests") - pl.col("cancelled")
    # A tenant over its quota is refused by policy, not by a fault: availability's valid
    # attempts are quota_admission's good ones.
    admitted = not_cancelled - pl.col("rejected_quota").fill_null(0)
    if spec.sli_kind == "availability":
        return pl.col("ok"), admitted
    if spec.sli_kind == "quota_admission":
        return admitted, not_cancelled
    if spec.sli_kind == "underrun_free":
        reported = pl.col("underrun_reported").fill_null(0)
        return reported - pl.col("underrun_streams").fill_null(0), reported
    if spec.sli_kind == "endpointing":
        reported = pl.col("endpointing_reported").fill_null(0)
        return reported - pl.col("endpointing_errors").fill_null(0), reported
    if spec.sli_kind == "word_accuracy":  # insertions can outnumber a minute's words: never below 0
        words = pl.col("reference_words").fill_null(0)
        return (words - pl.col("word_errors").fill_null(0)).clip(lower_bound=0), words
    if spec.sli_kind == "stream_completion":
        return pl.col("streams_completed").fill_null(0), (pl.col("streams") - pl.col("streams_cancelled")).fill_null(0)
    total, good = list((pl.col(name) for name in histogram_sums(spec)) if sums_as_columns
                       else histogram_sums(spec).values())[:2]
    if spec.sli_kind in ("latency", "stage_budget"):
        return good.cast(pl.Int64), total
    # Goodput: the first-output histogram also holds attempts the client cancelled after
    # their first token (an LLM stream abandoned mid-answer), which valid leaves out;
    # capped so that good never exceeds valid (it used to crash the engine).
    return pl.min_horizontal(good.cast(pl.Int64), not_cancelled), not_cancelled


def pick_key(spec: SloSpec) -> tuple:
    """SLOs with the same key pick the same bucket rows: they have rows in the same minutes."""
    return tuple(sorted(spec.selector.items())), spec.sli_kind if spec.sli_kind in REPORTED_KINDS else None


def window_table_key(spec: SloSpec) -> tuple | None:
    """SLOs with the same key close the same minutes over the same windows, and share one
    window table (slo/shared_windows.py); None for an SLO that keeps one of its own (a
    calendar-month budget, counted apart from its windows)."""
    if spec.calendar_month:
        return None
    return pick_key(spec), window_lengths(spec), spec.period_minutes


def _selects(spec: SloSpec) -> pl.Expr:
    """True for the bucket rows that the SLO's selector picks (a null label never matches)."""
    picked = pl.lit(True)
    for label, value in spec.selector.items():
        picked = picked & (pl.col(label) == value).fill_null(False)
    return picked


# Count columns the SLIs read that buckets written before them lack (rows of an older store
# or partial, frames built by hand): none of those events said, so they count 0.
_LATER_COUNTS = ("rejected_quota", "underrun_reported", "underrun_streams", "endpointing_reported", "endpointing_errors",
                 "reference_words", "word_errors")
# Likewise the straddle histograms: rows without them knew of no runtime bucket.
_LATER_HISTS = tuple(f"{f}_straddle_hist" for f in LATENCY_LOWER_FIELDS)
_NO_HIST = pl.lit(None, pl.List(pl.Struct({"bin": pl.Int16, "n": pl.Int64})))


def with_later_counts(buckets: pl.DataFrame) -> pl.DataFrame:
    have = set(buckets.columns)
    missing = [c for c in _LATER_COUNTS if c not in have]
    hists = [c for c in _LATER_HISTS if c not in have]
    if not missing and not hists:
        return buckets
    return buckets.with_columns(*[pl.lit(0, pl.Int64).alias(c) for c in missing], *[_NO_HIST.alias(c) for c in hists])


def good_valid(spec: SloSpec, buckets: pl.DataFrame) -> pl.DataFrame:
    """Rows (window_start, *slice_by, good, valid) for the buckets that the SLO selects."""
    buckets = with_later_counts(buckets)
    good, valid = good_valid_exprs(spec)
    counted = spec.selected(buckets).select("window_start", *spec.slice_by, good.alias("good"), valid.alias("valid"))
    return counted.group_by("window_start", *spec.slice_by).agg(pl.col("good").sum(), pl.col("valid").sum())


# A long replay (a restart reading a month of buckets) is fed in runs of about this many
# bucket rows, cut at minute boundaries, so that it is never all Python tuples at once.
FEED_ROWS = 200_000


# SLOs counted together in one select: three columns each over every bucket row, so a
# hundred SLOs at once over 200,000 buckets held 340 MB of columns.
SLOS_PER_SELECT = 16


@dataclass
class SloRows:
    """One SLO's counts of some buckets: per (minute, slice) in minute order."""

    minutes: np.ndarray
    keys: list[tuple[str, ...]]  # slice label values ("None" for a null)
    good: np.ndarray
    valid: np.ndarray
    undecided: np.ndarray  # of valid, neither proven good nor bad (`undecided_expr`); counted bad in good


class _Counting:
    """The polars expressions that count up to `SLOS_PER_SELECT` SLOs over buckets, built once
    (building them took a third of a thin minute's SLO stage)."""

    def __init__(self, specs: list[SloSpec]):
        self.specs = specs
        # Each histogram sum once, however many SLOs read it (each is a list evaluation per row).
        self.sums = list({name: e.alias(name) for spec in specs for name, e in histogram_sums(spec).items()}.values())
        self.select = [(pl.col("window_start").dt.epoch("s") // 60).alias("_minute"),
                       *sorted({label for spec in specs for label in spec.slice_by})]
        # On a thin minute each column of the select costs about the same whatever its rows, so
        # SLOs that pick the same rows share one `_p` column, and an SLO that can have no
        # undecided events has no `_u` column (its counts are zeros).
        self.picks: list[int] = []  # per SLO, its `_p` column
        picks: dict[tuple, int] = {}
        for i, spec in enumerate(specs):
            good, valid = good_valid_exprs(spec, sums_as_columns=True)
            picked = _selects(spec)
            if spec.sli_kind in REPORTED_KINDS:  # a fleet that does not report the field has no slices of it
                picked = picked & (valid > 0)
            key = pick_key(spec)
            if key not in picks:
                picks[key] = len(picks)
                self.select.append(picked.alias(f"_p{picks[key]}"))
            self.picks.append(picks[key])
            self.select += [pl.when(picked).then(good).alias(f"_g{i}"), pl.when(picked).then(valid).alias(f"_v{i}")]
            if has_undecided(spec):
                self.select.append(pl.when(picked).then(undecided_expr(spec, sums_as_columns=True)).alias(f"_u{i}"))
        by_slicing: dict[tuple[str, ...], list[int]] = {}
        for i, spec in enumerate(specs):
            by_slicing.setdefault(spec.slice_by, []).append(i)
        self.slicings = [
            (slice_by, members,
             [pl.col(f"_p{k}").any() for k in dict.fromkeys(self.picks[i] for i in members)]
             + [pl.col(f"_{c}{i}").sum().fill_null(0).cast(pl.Int64)
                for i in members for c in ("gvu" if has_undecided(specs[i]) else "gv")])
            for slice_by, members in by_slicing.items()]

    def rows(self, buckets: pl.DataFrame) -> dict[str, SloRows]:
        # Eager, not lazy: planning a lazy group-by of this many aggregations cost three times
        # the group-by itself on a thin minute (1 ms against 0.3, five slicings a minute).
        counted = (buckets.with_columns(self.sums) if self.sums else buckets).select(self.select)
        out: dict[str, SloRows] = {}
        for slice_by, members, aggs in self.slicings:
            g = counted.group_by("_minute", *slice_by).agg(aggs).sort("_minute", *slice_by, nulls_last=True)
            keys = [k if None not in k else tuple("None" if v is None else v for v in k)
                    for k in zip(*(g[k].cast(pl.String).to_list() for k in slice_by))] if slice_by else [()] * g.height
            minutes = g["_minute"].to_numpy()
            for i in members:
                picked = g[f"_p{self.picks[i]}"].to_numpy()
                undecided = (g[f"_u{i}"].to_numpy()[picked] if has_undecided(self.specs[i])
                             else np.zeros(int(picked.sum()), np.int64))
                out[self.specs[i].name] = SloRows(minutes[picked], [k for k, p in zip(keys, picked) if p],
                                                  g[f"_g{i}"].to_numpy()[picked], g[f"_v{i}"].to_numpy()[picked],
                                                  undecided)
        return out


def good_valid_rows(specs: list[SloSpec], buckets: pl.DataFrame) -> dict[str, SloRows]:
    """Per SLO, (minute, slice values, good, valid) of the buckets it selects, in minute and
    slice order: up to `SLOS_PER_SELECT` SLOs in one select and one group-by per distinct
    `slice_by`, each SLO's rows then picked with numpy, not a filter, select and group-by per
    SLO (a polars call costs the same for the 20 rows of a closed minute as for 20,000, and
    ten SLOs made a hundred calls a minute)."""
    return _counted_by(buckets, [_Counting(specs[at:at + SLOS_PER_SELECT]) for at in range(0, len(specs), SLOS_PER_SELECT)])


def _counted_by(buckets: pl.DataFrame, countings: list[_Counting]) -> dict[str, SloRows]:
    buckets = with_later_counts(buckets)
    out: dict[str, SloRows] = {}
    for counting in countings:
        out.update(counting.rows(buckets))
    return out


@dataclass
class Evaluation:
    """What one feed of buckets produced: alert changes and `slo_status` rows per SLO and minute."""

    changes: list[AlertChange] = field(default_factory=list)
    status: list[StatusPart] = field(default_factory=list)


class SloEvaluator:
    """Every SLO's table of slices, fed with closed buckets in event-time order."""

    def __init__(self, specs: list[SloSpec], share_windows: bool = True):
        self.specs = specs
        # SLOs that close the same minutes over the same windows share one window table: a
        # minute moves it, and computes their burn rates, once (slo/shared_windows.py).
        # Without `share_windows` each SLO has a table of its own (what the shared ones are
        # held to).
        shared: dict[tuple, SharedWindows] = {}
        self.tables: dict[str, SloTable] = {}
        for spec in specs:
            key = window_table_key(spec) if share_windows else None
            if key is not None and key not in shared:
                shared[key] = SharedWindows(window_lengths(spec), spec.period_minutes)
            self.tables[spec.name] = SloTable(spec, shared.get(key) if key is not None else None)
        by_table: dict[int, list[SloSpec]] = {}
        for spec in specs:
            by_table.setdefault(id(self.tables[spec.name].shared), []).append(spec)
        self._sharing = list(by_table.values())  # the SLOs of each window table, in spec order
        # SLOs by selector: a feed counts only the SLOs whose selector picks any of its rows (a
        # thin minute of one workload would otherwise pay every other workload's expressions).
        selectors = list(dict.fromkeys(tuple(sorted(s.selector.items())) for s in specs))
        self._selector_of = [selectors.index(tuple(sorted(s.selector.items()))) for s in specs]
        self._any_picked = [_selects(specs[self._selector_of.index(k)]).any().alias(f"_s{k}")
                            for k in range(len(selectors))]
        self._countings_by_picked: dict[tuple[bool, ...], list[_Counting]] = {}

    def _countings(self, buckets: pl.DataFrame) -> list[_Counting]:
        if not self._any_picked:
            return []  # no SLOs: nothing to count
        picked = tuple(bool(x) for x in buckets.select(self._any_picked).row(0))
        countings = self._countings_by_picked.get(picked)
        if countings is None:
            specs = [s for s, k in zip(self.specs, self._selector_of) if picked[k]]
            countings = [_Counting(specs[at:at + SLOS_PER_SELECT]) for at in range(0, len(specs), SLOS_PER_SELECT)]
            if len(self._countings_by_picked) >= 64:  # many selectors, few of them at a time: keep it bounded
                self._countings_by_picked.clear()
            self._countings_by_picked[picked] = countings
        return countings

    @property
    def states(self) -> dict[tuple[str, tuple[str, ...]], SliceView]:
        """(SLO, slice values) → that slice's view, for readers."""
        return {(name, values): t.views[i] for name, t in self.tables.items() for values, i in t.index.items()}

    def views(self) -> list[SliceView]:
        return [v for t in self.tables.values() for v in t.views]

    def feed(self, buckets: pl.DataFrame, until_minute: int | None = None, with_status: bool = True,
             judge: bool = True) -> Evaluation:
        """Close the buckets' minutes, in order, for every SLO. A minute an SLO has already
        closed corrects its windows (late data) without judging alerts for the past. Where
        not `judge`, no minute judges alerts or silences (a restart's replay of the store:
        it adopts the alerts the store holds as firing)."""
        out = Evaluation()
        if until_minute is not None:
            buckets = buckets.filter(pl.col("window_start").dt.epoch("s") // 60 <= until_minute)
        if buckets.height <= FEED_ROWS:
            return self._feed_minutes(buckets, with_status, judge)
        # A long replay: runs of whole minutes, about FEED_ROWS rows each (a minute that alone
        # holds more goes on its own: its rows are all here already, and alerts are judged
        # on a whole minute).
        buckets = buckets.sort("window_start")
        starts = buckets["window_start"]
        at = 0
        while at < buckets.height:
            end = min(at + FEED_ROWS, buckets.height)
            end = int(starts.search_sorted(starts[end - 1], side="right"))
            part = self._feed_minutes(buckets.slice(at, end - at), with_status, judge)
            out.changes += part.changes
            out.status += part.status
            at = end
        return out

    def _feed_minutes(self, buckets: pl.DataFrame, with_status: bool, judge: bool) -> Evaluation:
        out = Evaluation()
        if buckets.height == 0:
            return out
        rows_by_slo = _counted_by(buckets, self._countings(buckets))
        changes: dict[str, list[AlertChange]] = {}
        status: dict[str, list[StatusPart]] = {}
        for sharing in self._sharing:
            fed = [(spec, rows) for spec in sharing
                   if (rows := rows_by_slo.get(spec.name)) is not None and len(rows.minutes)]
            if fed:
                self._close_minutes(buckets, fed, with_status, judge, changes, status)
        # In spec order, each SLO's minutes in order, as the store and Alertmanager take them.
        for spec in self.specs:
            out.changes += changes.get(spec.name, [])
            out.status += status.get(spec.name, [])
        return out

    def _close_minutes(self, buckets: pl.DataFrame, fed: list[tuple[SloSpec, SloRows]], with_status: bool, judge: bool,
                       changes: dict[str, list[AlertChange]], status: dict[str, list[StatusPart]]) -> None:
        """Close the minutes of SLOs sharing a window table: at each minute every SLO counts it,
        the table adds their counts at once, then each SLO judges it."""
        minutes = None
        for spec, rows in fed:
            starts = np.unique(rows.minutes)
            if minutes is None:
                minutes = starts
            elif not np.array_equal(starts, minutes):
                # SLOs sharing a table pick the same rows (`pick_key`), so this cannot happen.
                raise AssertionError(f"{spec.name} closes other minutes than {fed[0][0].name}, whose window table it shares")
        assert minutes is not None
        if len(minutes) == 1:  # a live worker's usual feed: nothing to spread over minutes
            self._close_minute(buckets, fed, int(minutes[0]), with_status, judge, changes, status)
        else:
            self._close_backlog(buckets, fed, minutes.tolist(), with_status, judge, changes, status)
        for spec, rows in fed:
            table = self.tables[spec.name]
            if judge and int(rows.minutes[-1]) >= table.now:  # silence is judged at the newest minute, never a corrected one
                changes[spec.name].extend(table.check_silence(int(rows.minutes[-1])))

    def _close_minute(self, buckets: pl.DataFrame, fed: list[tuple[SloSpec, SloRows]], minute: int, with_status: bool,
                      judge: bool, changes: dict[str, list[AlertChange]], status: dict[str, list[StatusPart]]) -> None:
        """One minute: each SLO's status rows read and its alerts judged at it."""
        shared = self.tables[fed[0][0].name].shared
        late = shared.now is not None and minute <= shared.now
        tables = [self.tables[spec.name] for spec, _ in fed]
        cols = [table.columns(rows.keys) for table, (_, rows) in zip(tables, fed)]
        counted = [table.count(minute, c, rows.good, rows.valid, late, rows.undecided)
                   for table, c, (_, rows) in zip(tables, cols, fed)]
        shared.flush()
        for (spec, rows), table, c, minute_counts in zip(fed, tables, cols, counted):
            spent = _spent(_phase_spends(spec, buckets) if spec.phase_budgets_ms else {}, minute, rows.keys, c, 0, len(c))
            changes.setdefault(spec.name, []).extend(table.judge(minute_counts, spent, judge))
            if with_status and not late:
                status.setdefault(spec.name, []).append(status_part(table, c))

    def _close_backlog(self, buckets: pl.DataFrame, fed: list[tuple[SloSpec, SloRows]], minutes: list[int],
                       with_status: bool, judge: bool, changes: dict[str, list[AlertChange]],
                       status: dict[str, list[StatusPart]]) -> None:
        """Many minutes (a backlog): what does not need each minute's windows (checking and
        splitting the counts, the event counters, judging the alerts, the status rows'
        arithmetic) is done once for all of them (`SloTable.prepare`, `judge_later`,
        `_StatusRows`), each minute only moving the windows."""
        shared = self.tables[fed[0][0].name].shared
        members = []
        for spec, rows in fed:
            cuts = [0, *(np.flatnonzero(np.diff(rows.minutes)) + 1).tolist(), len(rows.minutes)]
            table = self.tables[spec.name]
            spends = _phase_spends(spec, buckets) if spec.phase_budgets_ms else {}
            feed = table.prepare(cuts, minutes, table.columns(rows.keys), rows.good, rows.valid, rows.undecided)
            members.append((spec, rows, table, feed, spends, changes.setdefault(spec.name, [])))
        # The alert windows of each SLO that can be judged after the feed, from the minutes kept.
        later = [KeptMinutes() if judge and table.can_judge_later() else None for _, _, table, _, _, _ in members]
        statuses = [_StatusRows(table, judged) if with_status else None
                    for (_, _, table, _, _, _), judged in zip(members, later)]
        for m, minute in enumerate(minutes):
            late = shared.now is not None and minute <= shared.now
            counted = [table.count_prepared(feed, m, minute, late) for _, _, table, feed, _, _ in members]
            shared.flush()
            for (spec, rows, table, feed, spends, changed), c, judged, parts in zip(members, counted, later, statuses):
                spent = _spent(spends, minute, rows.keys, feed.cols, feed.cuts[m], feed.cuts[m + 1])
                changed.extend(table.judge(c, spent, judge, judged))
                if parts is not None and not late:
                    parts.add(c.cols)
        for (spec, rows, table, _, _, changed), judged, parts in zip(members, later, statuses):
            if judged is not None:
                changed.extend(table.judge_later(judged))
            if parts is not None and parts.rows:
                status.setdefault(spec.name, []).append(parts.part())

    def retire_until(self, minute: int) -> None:
        for table in self.tables.values():
            table.retire_until(minute)

    def reset_event_counts(self) -> None:
        for table in self.tables.values():
            table.reset_event_counts()


def _spent(spends: dict[tuple[int, tuple], list[tuple[str, int, int]]], minute: int, keys: list[tuple[str, ...]],
           cols: np.ndarray, a: int, b: int) -> dict[int, list[tuple[str, int, int]]] | None:
    """The phase spends (`_phase_spends`) of rows a..b of a minute, by the rows' columns; None
    for an SLO without phase budgets."""
    if not spends:
        return None
    return {int(cols[k]): spends[(minute, keys[k])] for k in range(a, b) if (minute, keys[k]) in spends}


def _phase_spends(spec: SloSpec, buckets: pl.DataFrame) -> dict[tuple[int, tuple], list[tuple[str, int, int]]]:
    """(minute, slice values) → [(phase, samples over budget, samples)] of a stage_budget SLO."""
    out: dict[tuple[int, tuple], list[tuple[str, int, int]]] = {}
    rows = overspend_counts(spec, buckets).with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_minute"))
    for row in rows.iter_rows(named=True):
        key = (row["_minute"], tuple(str(row[k]) for k in spec.slice_by))
        out.setdefault(key, []).append((row["stage"], int(row["over"]), int(row["samples"])))
    return out


STATUS_SCHEMA = {
    "window_start": pl.Datetime("us"), "slo": pl.String, "slice": pl.String, "sli": pl.Float64,
    "error_budget_remaining": pl.Float64, "minutes_to_exhaustion": pl.Float64,
    "burn_rates": pl.List(pl.Struct({"window": pl.String, "burn_rate": pl.Float64})), "firing": pl.Int32,
    "sli_upper": pl.Float64,
}
_BURN_RATE = pa.struct([("window", pa.string()), ("burn_rate", pa.float64())])


@dataclass
class StatusPart:
    """`slo_status` columns of some slices of one SLO at some minutes (rows built once per feed:
    a frame per SLO and minute cost more than the SLO engine itself on thin traffic)."""

    minutes: np.ndarray  # per row, the minute it is the status at
    slo: str
    slices: list[str]
    sli: np.ndarray
    sli_upper: np.ndarray  # undecided events counted good: the SLI's range is [sli, sli_upper]
    error_budget_remaining: np.ndarray
    minutes_to_exhaustion: np.ndarray
    burn_rates: np.ndarray  # (rows, windows), NaN where a window holds no events
    windows: list[str]
    firing: np.ndarray


def status_part(table: SloTable, cols: np.ndarray) -> StatusPart:
    """Some slices of a table as of its newest minute."""
    burns, remaining, to_exhaustion, good, valid, undecided = table.status_columns(cols)
    texts = table.slice_texts()
    sli, sli_upper = _sli_range(good, valid, undecided)
    return StatusPart(np.full(len(cols), table.now, np.int64), table.spec.name, [texts[i] for i in cols.tolist()], sli,
                      sli_upper, remaining, to_exhaustion, burns, _window_names(table.lengths), table.firing_count(cols))


def _sli_range(good: np.ndarray, valid: np.ndarray, undecided: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sli, sli_upper): undecided events counted bad, then good; NaN where nothing was valid."""
    with np.errstate(divide="ignore", invalid="ignore"):
        some = valid > 0
        return np.where(some, (good - undecided) / valid, np.nan), np.where(some, good / valid, np.nan)


class _StatusRows:
    """One SLO's `slo_status` rows over the minutes of a feed, as `status_part` gives them at
    each minute, but read from the minutes' kept window arrays (`KeptMinutes`) once for every
    minute: on a thin minute the few picks and divisions per SLO were a third of the stage."""

    def __init__(self, table: SloTable, judged: KeptMinutes | None = None):
        self.table = table
        # The minutes judged later keep the arrays already, and say which alerts fire after each.
        self.judged = judged
        self.kept = judged if judged is not None else KeptMinutes()
        self.calendar = table.spec.calendar_month  # its budget's arrays change in place: read at each minute
        self.parts: list[StatusPart] = []
        self.firing: list[np.ndarray] = []  # per minute not judged later, the alerts firing per slice
        self.rows = 0

    def add(self, cols: np.ndarray) -> None:
        """The rows of the slices in `cols` as of the table's newest minute (one judged later: kept there)."""
        table = self.table
        self.rows += len(cols)
        if self.calendar:
            self.parts.append(status_part(table, cols))
        elif self.judged is None:
            self.kept.add(table, table.now, cols, [])  # type: ignore[arg-type]
            self.firing.append(table.firing_count(cols))

    def part(self) -> StatusPart:
        """Every row added, in order, as one part (after `judge_later`, where judged later)."""
        if self.calendar:
            return self.parts[0] if len(self.parts) == 1 else _joined(self.parts)
        table, kept = self.table, self.kept
        rows = kept.stacked(table)
        counts, burns, remaining = rows.counts, rows.burns, rows.remaining
        k = table.at[table.spec.period_minutes]
        good, valid = rows.sums[:, k, 0], rows.sums[:, k, 1]
        undecided = np.zeros(len(rows.cols)) if rows.undecided is None else rows.undecided[:, k]
        to_exhaustion = table.exhaustion(remaining, burns)
        sli, sli_upper = _sli_range(good, valid, undecided)
        if self.judged is not None:
            assert kept.firing_after is not None and len(kept.firing_after) == len(rows.cols) == self.rows
            firing = kept.firing_after
        else:
            firing = np.concatenate(self.firing)
        texts = table.slice_texts()
        return StatusPart(np.repeat(np.asarray(kept.minutes, np.int64), counts), table.spec.name,
                          [texts[i] for i in rows.cols.tolist()], sli, sli_upper, remaining,
                          to_exhaustion, burns, _window_names(table.lengths), firing)


def _joined(parts: list[StatusPart]) -> StatusPart:
    """Parts of one SLO (the same windows) as one."""
    first = parts[0]
    return StatusPart(np.concatenate([p.minutes for p in parts]), first.slo, [t for p in parts for t in p.slices],
                      np.concatenate([p.sli for p in parts]), np.concatenate([p.sli_upper for p in parts]),
                      np.concatenate([p.error_budget_remaining for p in parts]),
                      np.concatenate([p.minutes_to_exhaustion for p in parts]),
                      np.concatenate([p.burn_rates for p in parts]), first.windows,
                      np.concatenate([p.firing for p in parts]))


def status_frame(parts: list[StatusPart]) -> pl.DataFrame:
    """One `slo_status` frame, column by column (burn rates of windows without events left out)."""
    if not parts:
        return pl.DataFrame(schema=STATUS_SCHEMA)
    rows = [len(p.slices) for p in parts]
    names, rates, counts = [], [], []
    for p in parts:
        present = ~np.isnan(p.burn_rates)
        names.append(np.tile(np.array(p.windows, dtype=object), len(p.slices))[present.ravel()])
        rates.append(p.burn_rates[present])
        counts.append(present.sum(axis=1))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(counts))]).astype(np.int32)
    listed = pa.ListArray.from_arrays(pa.array(offsets), pa.StructArray.from_arrays(
        [pa.array(np.concatenate(names), pa.string()), pa.array(np.concatenate(rates), pa.float64())],
        fields=list(_BURN_RATE)))
    # One Arrow table with the schema's types, converted once (eight Series and a cast cost
    # three times as much on a thin minute).
    sli = np.concatenate([p.sli for p in parts])
    sli_upper = np.concatenate([p.sli_upper for p in parts])
    to_exhaustion = np.concatenate([p.minutes_to_exhaustion for p in parts])
    return pl.from_arrow(pa.table({
        "window_start": pa.array(np.concatenate([p.minutes for p in parts]).astype(np.int64) * 60_000_000,
                                 pa.timestamp("us")),
        "slo": pa.array(np.repeat([p.slo for p in parts], rows).tolist(), pa.string()),
        "slice": pa.array([t for p in parts for t in p.slices], pa.string()),
        "sli": pa.array(sli, pa.float64(), mask=np.isnan(sli)),
        "error_budget_remaining": pa.array(np.concatenate([p.error_budget_remaining for p in parts]), pa.float64()),
        "minutes_to_exhaustion": pa.array(to_exhaustion, pa.float64(), mask=np.isnan(to_exhaustion)),
        "burn_rates": listed,
        "firing": pa.array(np.concatenate([p.firing for p in parts]).astype(np.int32), pa.int32()),
        "sli_upper": pa.array(sli_upper, pa.float64(), mask=np.isnan(sli_upper)),
    }))  # type: ignore[return-value]


@functools.cache  # a table's window lengths, named for every status part (each one's list is not changed)
def _window_names(lengths: tuple[int, ...]) -> list[str]:
    return [span(m) for m in lengths]


@functools.cache  # a few window lengths, named for every status row
def span(minutes: int) -> str:
    """A window length as people write it: 5m, 1h, 30d."""
    if minutes % 1440 == 0:
        return f"{minutes // 1440}d"
    if minutes % 60 == 0:
        return f"{minutes // 60}h"
    return f"{minutes}m"


@dataclass
class Replay:
    """The SLO state after a run of buckets, and the alert changes on the way."""

    evaluator: SloEvaluator
    changes: list[AlertChange]


def replay(specs: list[SloSpec], buckets: pl.DataFrame | Iterable[pl.DataFrame],
           until_minute: int | None = None) -> Replay:
    """The SLO state after the given buckets, a frame or frames in event-time order (for reads
    of the store)."""
    ev = SloEvaluator(specs)
    changes: list[AlertChange] = []
    last = None
    for frame in [buckets] if isinstance(buckets, pl.DataFrame) else buckets:
        changes += ev.feed(frame, until_minute, with_status=False).changes
        if frame.height:
            last = max(last or 0, int(frame["window_start"].dt.epoch("s").max() // 60))
    if last is not None:
        ev.retire_until(until_minute if until_minute is not None else last)
    return Replay(ev, changes)
