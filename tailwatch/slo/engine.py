"""Error budgets, burn rates and multi-window alerts over per-minute SLI counts.

Pure and column-wise: an `SloTable` holds one SLO's every slice in arrays, its windows in
a `slo.shared_windows.SharedWindows` that the SLOs closing the same minutes over the same
catalog share (`slo.block_windows.BlockWindows` columns), so closing a minute is a few
vector operations over the slices, not a loop, and not once per SLO; a slice's memory does
not grow with the SLO's period. Ratios
are event-weighted (sum of bad ÷ sum of valid over the window), and a window without
valid events has no burn rate (None), never NaN.

An alert window pair fires while both its long and short windows burn above the factor
and both hold at least `min_events` valid events, and resolves as soon as that no longer
holds: usually the short window cooling a few minutes after the burn stops, but also the
long one cooling first or the traffic thinning below `min_events` (the generated Prometheus
rule's expression, alerts/rules.py, decides the same way). Alerts are judged
for the slices that have a bucket in the minute being closed. A window pair is not judged
while it is young: until the slice's history, from its first valid event, covers the
pair's `history_needed_minutes` (slo/alert_windows.py); the slice's status names such pairs. One condition (SLO, window
pair, slice) is one alert, identified by its fingerprint.

A minute that arrives after the table has moved past it (late data) corrects the
windows and the budget; it fires or resolves nothing for the past, and the next closed
minute judges the corrected windows.

Undecided events (a latency known only as a runtime bucket whose bounds straddle the
threshold, `slo.sli.undecided_expr`) are neither proven good nor bad. Burn rates, alerts and
the budget count only proven bad events (undecided counted good: a page fires only on what
the data proves); the SLI is reported as a range, from undecided counted bad (`sli`) to
undecided counted good (`sli_upper`), and a firing alert says how many events its long
window left undecided. A table keeps windows of undecided events only once it has seen one.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tailwatch.slo.shared_windows import SharedWindows, grown as _grown, rates_of
from tailwatch.slo.spec import SloSpec
from tailwatch.slo.turn_phases import PhaseSpend, most_overspent
from tailwatch.slo.alert_windows import AlertWindow, minute_start_utc


def burn_rate(bad: np.ndarray, valid: np.ndarray, objective: float) -> np.ndarray:
    """Error ratio over each window ÷ error budget; NaN where a window has no valid events."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.maximum(bad, 0.0) / valid / (1.0 - objective)


def error_budget_remaining(bad: np.ndarray, valid: np.ndarray, objective: float) -> np.ndarray:
    """Share of each period's budget left (1 = untouched, < 0 = overspent)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(valid > 0, 1.0 - np.maximum(bad, 0.0) / (valid * (1.0 - objective)), 1.0)


def minutes_to_exhaustion(remaining: np.ndarray, burn: np.ndarray, period_minutes: int) -> np.ndarray:
    """At a constant burn rate b the whole budget lasts period ÷ b; what is left lasts that ×
    remaining. NaN where nothing burns; 0 where the budget is gone."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(remaining > 0, np.where(burn > 0, remaining * period_minutes / burn, np.nan), 0.0)


def _span(minutes: int) -> str:
    return f"{minutes // 1440}d" if minutes % 1440 == 0 else f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"


def _month_of(minute: int) -> tuple[int, int]:
    dt = minute_start_utc(minute)
    return dt.year, dt.month


def fingerprint(slo: str, alertname: str, labels: dict[str, str]) -> str:
    key = "\x1f".join([slo, alertname, *(f"{k}={labels[k]}" for k in sorted(labels))])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class RollingWindows:
    """One slice's sums of (good, valid) over the last m minutes for each length m, exact
    and kept incrementally (a stage_budget SLO's per-phase windows, an hour long).

    The minutes are stored once, whatever the lengths: one flat int64 array of (minute,
    good so far, valid so far) triples, 24 bytes a minute, and a length's sums are the
    running totals less those just before its oldest minute."""

    def __init__(self, lengths):
        self.lengths = tuple(sorted(set(lengths)))
        self._rows = array("q")
        self._heads = [0] * len(self.lengths)  # per length, the index of its oldest triple inside
        self._good = self._valid = 0  # running totals, through the newest minute
        self._dropped = (0, 0)  # the running totals just before the first triple kept

    def add(self, minute: int, good: int, valid: int) -> None:
        self._good += good
        self._valid += valid
        self._rows.extend((minute, self._good, self._valid))

    def retire_until(self, now_minute: int) -> None:
        """Keep minutes in (now − m, now] for each length m."""
        rows, heads = self._rows, self._heads
        n = len(rows)
        for i, m in enumerate(self.lengths):
            head, cut = heads[i], now_minute - m
            while head < n and rows[head] <= cut:
                head += 3
            heads[i] = head
        oldest = heads[-1]  # the longest length's
        if oldest >= 192 and 2 * oldest >= n:  # amortised: what moves is never more than what was dropped
            self._dropped = (rows[oldest - 2], rows[oldest - 1])
            del rows[:oldest]
            self._heads = [h - oldest for h in heads]

    def sums(self, length: int) -> tuple[int, int]:
        """(good, valid) over the last `length` minutes."""
        head = self._heads[self.lengths.index(length)]
        before_good, before_valid = (self._rows[head - 2], self._rows[head - 1]) if head else self._dropped
        return self._good - before_good, self._valid - before_valid


@dataclass(frozen=True)
class AlertChange:
    state: str  # "firing" or "resolved"
    fingerprint: str
    alertname: str
    severity: str
    slo: str
    labels: dict[str, str]
    at_minute: int
    started_minute: int  # when the condition began (= at_minute for a firing change)
    window: AlertWindow
    long_burn_rate: float | None
    short_burn_rate: float | None
    error_budget_remaining: float
    detail: str = ""  # what explains it, where the SLO can tell (a stage_budget SLO: the phase that overspent)
    # Over the long window: valid events, and those of them undecided (counted good here).
    long_valid_events: int = 0
    long_undecided_events: int = 0

    def undecided_text(self) -> str:
        """What a firing alert's evidence says of its undecided events ("" where none)."""
        if not self.long_undecided_events:
            return ""
        return (f"{self.long_undecided_events:,} of {self.long_valid_events:,} events over {_span(self.window.long_minutes)} "
                "lay in a runtime histogram bucket straddling the threshold: undecided, counted good (it fired on "
                "proven bad events only)")


@dataclass
class SliceStatus:
    slo: str
    labels: dict[str, str]
    minute: int
    sli: float | None  # over the period, undecided events counted bad
    error_budget_remaining: float
    burn_rates: dict[int, float | None]  # by window length in minutes
    minutes_to_exhaustion: float | None
    firing: list[str]
    overspent_phase: PhaseSpend | None = None
    young: list[str] = field(default_factory=list)  # alert windows not judged yet: the slice's history is too short
    sli_upper: float | None = None  # undecided events counted good (= sli where none is undecided)
    undecided_events: int = 0  # over the period


_NEVER = 1 << 62  # a minute no event time reaches
_NO_DATA = -1  # the no-data alert's place among a table's alert windows, for its fingerprint
NO_DATA_WINDOW = "no-data"  # the no-data alert's window name, as `alerts.alert_window` stores it


def _opt(x: float) -> float | None:
    return None if x != x else float(x)  # NaN: a window without valid events


class CountedMinute(NamedTuple):
    """What `SloTable.count` kept of a minute for `SloTable.judge` (a tuple: one is made per
    SLO and minute, and a frozen dataclass cost more to build than counting the minute)."""

    minute: int
    cols: np.ndarray  # the slices with a row in the minute
    seen: np.ndarray  # of those, the ones with valid events
    late: bool  # the table had passed or reached the minute
    again: bool  # the newest minute again: more of its rows


@dataclass
class FeedCounts:
    """One SLO's counts of a feed's minutes, checked and split once for all of them
    (`SloTable.prepare`), so that closing each minute (`SloTable.count_prepared`) only slices
    them: on thin traffic a backlog closes hundreds of minutes in one feed, and each numpy
    call's fixed cost per minute was the stage's cost."""

    cuts: list[int]  # minute k's rows are [cuts[k], cuts[k + 1])
    cols: np.ndarray  # per row, the slice's column
    seen: np.ndarray  # the columns of the rows with valid events
    seen_cuts: list[int]  # minute k's of those are [seen_cuts[k], seen_cuts[k + 1])
    g_seen: np.ndarray  # their columns of the shared window table
    good_seen: np.ndarray  # their events not proven bad (undecided included)
    valid_seen: np.ndarray
    g_undecided: np.ndarray | None  # the shared columns of the rows with undecided events (None: no such row)
    undecided: np.ndarray | None  # and those events
    undecided_cuts: list[int]
    first_at: dict[int, np.ndarray]  # minute → the columns whose history begins at it
    good: np.ndarray  # per row, as `good_seen` (a calendar month's budget adds them minute by minute)
    valid: np.ndarray
    undecided_rows: np.ndarray | None  # per row (None: no undecided events in the feed)


# A table of at most this many columns keeps each minute's window sums whole until the end of
# a feed (`KeptMinutes`: a kilobyte a minute at most); a wider one's slices are picked at each
# minute, so that what a long backlog keeps grows with its rows, not its tables' columns.
KEEP_COLUMNS = 8


def _in_column_order(changes: list[tuple[int, int, AlertChange]], cols: np.ndarray) -> list[AlertChange]:
    """A minute's changes ((column, alert window, change)) in the order of its columns, then of alert windows."""
    if not changes:
        return []
    order = {c: k for k, c in enumerate(cols.tolist())}  # a minute of many slices and no change builds none
    return [c for _, _, c in sorted(changes, key=lambda t: (order[t[0]], t[1]))]


@dataclass
class KeptMinutes:
    """Minutes of one SLO's slices and the window sums they read, kept to be read at once
    after a feed (`SloTable.judge_later`, the status rows of slo/sli.py): on a backlog of thin
    minutes, computing rates, reading a few slices and building their masks minute by minute
    was most of the SLO stage. A narrow table's sums are kept whole (the window table builds
    new ones at every move, so they can be); a wide one's slices are picked at once."""

    minutes: list[int] = field(default_factory=list)
    cols: list[np.ndarray] = field(default_factory=list)
    at: list[np.ndarray] = field(default_factory=list)  # per minute, its slices' rows of the arrays below
    sums: list[np.ndarray] = field(default_factory=list)  # (not proven bad, valid) per window
    undecided: list[np.ndarray | None] = field(default_factory=list)  # None: none seen yet
    first: list[np.ndarray] = field(default_factory=list)  # the slices' first minute with data, as of the minute
    no_data: list[list[tuple[int, int, AlertChange]]] = field(default_factory=list)  # the minute's no-data resolutions
    firing_after: np.ndarray | None = None  # per row, the burn-rate alerts firing after it (set by `judge_later`)
    _stacked: KeptRows | None = None

    def add(self, table: SloTable, minute: int, cols: np.ndarray, no_data: list[tuple[int, int, AlertChange]]) -> None:
        sums, undecided = table.windows.all_sums(), table.shared.undecided_sums()
        at = table.g.take(cols)
        if table.shared.n > KEEP_COLUMNS:  # a wide table: its slices' rows now, not every column kept
            sums = sums.take(at, axis=0)
            undecided = None if undecided is None else undecided.take(at, axis=0)
            at = np.arange(len(cols))
        self.minutes.append(minute)
        self.cols.append(cols)
        self.at.append(at)
        self.sums.append(sums)
        self.undecided.append(undecided)
        self.first.append(table.first_data.take(cols))
        self.no_data.append(no_data)

    def stacked(self, table: SloTable) -> KeptRows:
        """Every minute's slices as rows, with the figures each minute's `SloTable.global_rates` gave them."""
        if self._stacked is None:
            counts = [len(c) for c in self.cols]
            starts = np.cumsum([0, *(len(s) for s in self.sums[:-1])])
            pick = np.concatenate(self.at) + np.repeat(starts, counts)
            cols = np.concatenate(self.cols)
            sums = np.concatenate(self.sums).take(pick, axis=0)
            burns, valids, remaining = rates_of(sums, table.shared.budget.take(table.g.take(cols)), table.shared.period_at)
            undecided = None
            if any(u is not None for u in self.undecided):
                undecided = np.concatenate([np.zeros(s.shape[:2]) if u is None else u
                                            for u, s in zip(self.undecided, self.sums)]).take(pick, axis=0)
            self._stacked = KeptRows(counts, cols, np.repeat(np.asarray(self.minutes, np.int64), counts), sums, burns,
                                     valids, remaining, undecided, np.concatenate(self.first))
        return self._stacked


class KeptRows(NamedTuple):
    """`KeptMinutes` stacked: per row (a slice at a minute), in minute then column order."""

    counts: list[int]  # rows per minute
    cols: np.ndarray
    minutes: np.ndarray
    sums: np.ndarray  # (rows, lengths, 2)
    burns: np.ndarray  # (rows, lengths)
    valids: np.ndarray  # (rows, lengths)
    remaining: np.ndarray
    undecided: np.ndarray | None  # (rows, lengths); None: none seen
    first: np.ndarray


def window_lengths(spec: SloSpec) -> tuple[int, ...]:
    """The window lengths an SLO's table keeps: its period and its alert windows'."""
    return tuple(sorted({spec.period_minutes} | {m for w in spec.alert_windows for m in (w.long_minutes, w.short_minutes)}))


class SloTable:
    """One SLO's budget and alert windows, firing alerts and silences for every slice it has
    seen, column-wise (slice i is column i of every array of its own, and column `g[i]` of
    the window table, which SLOs closing the same minutes share: slo/shared_windows.py)."""

    def __init__(self, spec: SloSpec, shared: SharedWindows | None = None):
        self.spec = spec
        lengths = window_lengths(spec)
        self.shared = shared if shared is not None else SharedWindows(lengths, spec.period_minutes)
        if self.shared.lengths != lengths:
            raise ValueError(f"{spec.name}: window lengths {lengths} differ from the shared table's {self.shared.lengths}")
        self.windows = self.shared.windows
        self.lengths = lengths
        self.g = np.zeros(0, np.int64)  # slice → its column of the shared window table
        self.at = {m: k for k, m in enumerate(self.lengths)}  # window length → its index in `lengths`
        self.n = 0
        self.index: dict[tuple[str, ...], int] = {}  # slice values → column
        self.views: list[SliceView] = []
        self._texts: list[str] = []  # a slice's labels as `slo_status.slice` writes them
        self._alerts = [(aw, f"SLOBurn{aw.severity.capitalize()}", aw.factor(spec.period_minutes))
                        for aw in spec.alert_windows]
        self._long_at = np.array([self.at[aw.long_minutes] for aw in spec.alert_windows], np.int64)
        self._short_at = np.array([self.at[aw.short_minutes] for aw in spec.alert_windows], np.int64)
        self._factors = np.array([factor for _, _, factor in self._alerts])
        self._least_factor = min(self._factors, default=np.inf)
        self._fingerprints: dict[tuple[int, int], str] = {}  # (alert window or _NO_DATA, column) → fingerprint
        self.fired_at = np.full((len(self._alerts), 0), -1, np.int64)  # per alert window and slice; -1: not firing
        self._firing_alerts = 0  # burn-rate alerts firing, over every slice
        self.last_data = np.full(0, -1, np.int64)  # the newest minute with valid events
        self.first_data = np.full(0, -1, np.int64)  # the oldest minute with valid events: the slice's history
        self._history_needed = np.array([aw.history_needed_minutes(spec.young_share) for aw in spec.alert_windows],
                                        np.int64)
        self.no_data_since = np.full(0, -1, np.int64)  # when the no-data alert fired, while it fires
        # At most the newest minute with data of every slice that could go silent: until
        # `no_data_minutes` after it none can, and a minute's silence check reads no array.
        self._silence_bound = _NEVER
        self._silent_slices = 0  # slices whose no-data alert fires: while none, a minute reads no silence array
        # Calendar-month SLOs budget from the first minute of the month (UTC) instead.
        self.month: tuple[int, int] | None = None
        self.month_good = np.zeros(0, np.int64)
        self.month_valid = np.zeros(0, np.int64)
        # Events counted since this table's owner last reset them (Prometheus counters).
        self.events_good = np.zeros(0, np.int64)
        self.events_valid = np.zeros(0, np.int64)
        self.events_undecided = np.zeros(0, np.int64)
        self.month_undecided = np.zeros(0, np.int64)
        # stage_budget SLOs: per slice and phase, samples within budget over the fastest alert's long window.
        self.phase_windows: dict[int, dict[str, RollingWindows]] = {}
        self._fastest_long_minutes = min(w.long_minutes for w in spec.alert_windows)
        self._version = 0  # moves whenever this table's own counts (the calendar month's) may have
        self._rates: tuple[tuple[int, int, int], np.ndarray, np.ndarray, np.ndarray] | None = None

    # ---- slices ----------------------------------------------------------------------------
    def column(self, values: tuple[str, ...]) -> int:
        """The column of a slice, added (with empty windows) when new."""
        i = self.index.get(values)
        if i is None:
            i = self.n
            # Its shared column before it counts as a slice: a scrape (another thread) reading
            # `g[:n]` meanwhile never reads a column not yet its own.
            self.g = _grown(self.g, i + 1, 0)
            self.g[i] = self.shared.add_column(self.spec.objective, self._least_factor)
            self.index[values] = i
            self.n += 1
            self.fired_at = _grown(self.fired_at, self.n, -1)
            self.last_data = _grown(self.last_data, self.n, -1)
            self.first_data = _grown(self.first_data, self.n, -1)
            self.no_data_since = _grown(self.no_data_since, self.n, -1)
            for name in ("month_good", "month_valid", "events_good", "events_valid", "events_undecided", "month_undecided"):
                setattr(self, name, _grown(getattr(self, name), self.n, 0))
            labels = dict(zip(self.spec.slice_by, values))
            self.views.append(SliceView(self, i, labels))
            self._texts.append(",".join(f"{k}={v}" for k, v in labels.items()))
            self._version += 1
        return i

    def columns(self, keys: list[tuple[str, ...]]) -> np.ndarray:
        return np.fromiter((self.column(k) for k in keys), np.int64, len(keys))

    def slice_texts(self) -> list[str]:
        return self._texts

    def reset_event_counts(self) -> None:
        self.events_good[:] = 0
        self.events_valid[:] = 0
        self.events_undecided[:] = 0

    # ---- time --------------------------------------------------------------------------------
    @property
    def now(self) -> int | None:
        return self.windows.now

    def retire_until(self, minute: int) -> None:
        """Move the windows to `minute` without new data (empty minutes in between)."""
        if self.now is not None and minute <= self.now:
            return
        self.shared.advance(minute)
        if self.spec.calendar_month:
            month = _month_of(minute)
            if month != self.month:
                self.month = month
                self.month_good[:] = 0
                self.month_valid[:] = 0
                self.month_undecided[:] = 0
        self._version += 1

    def advance(self, minute: int, cols, good, valid,
                phase_spends: dict[int, list[tuple[str, int, int]]] | None = None,
                judge: bool = True, undecided=None) -> list[AlertChange]:
        """Close `minute` for the slices in `cols` (their good and valid counts, and of the
        valid ones those `undecided`, not counted in good; each slice at most once): alert
        changes, in column order. A minute the table has passed corrects
        its windows and budget, and changes no alert (the newest minute's rows may come in
        several calls: each adds to it); nor does any minute where not `judge`
        (a restart's replay, whose alerts are adopted from the store: `adopt_firing`).

        `count` then `judge`: the SLOs sharing a window table each count the minute, the
        table adds their counts at once, and then each judges it."""
        late = self.now is not None and minute <= self.now
        counted = self.count(minute, cols, good, valid, late, undecided)
        self.shared.flush()
        return self.judge(counted, phase_spends, judge)

    def _checked(self, cols, good, valid, undecided) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Counts as int64 arrays, refused where they cannot be (ValueError), with good then
        every event not proven bad: what burn rates, alerts and the budget count (the module
        docstring); undecided kept beside it, None where there is none (nearly always: on a
        thin minute each numpy call's fixed cost is the stage's cost, so the calls that would
        add zeros are left out)."""
        cols, good, valid = (np.asarray(x, np.int64) for x in (cols, good, valid))
        undecided = None if undecided is None else np.asarray(undecided, np.int64)
        if undecided is not None and not undecided.any():
            undecided = None
        if len(cols) and (good.min() < 0 or (good > valid).any() if undecided is None else
                          good.min() < 0 or undecided.min() < 0 or (good + undecided > valid).any()):
            undecided = np.zeros(len(cols), np.int64) if undecided is None else undecided
            k = int(np.flatnonzero((good < 0) | (undecided < 0) | (valid < 0) | (good + undecided > valid))[0])
            raise ValueError(f"bad counts for {self.spec.name}: good={good[k]} undecided={undecided[k]} valid={valid[k]}")
        return cols, good if undecided is None else good + undecided, valid, undecided

    def count(self, minute: int, cols, good, valid, late: bool, undecided=None) -> CountedMinute:
        """Stage a minute's counts in the shared window table (added at its `flush`) and keep
        this table's own: each slice's history, month and event counts. `late`: whether the
        shared table had passed or reached the minute before any SLO sharing it counted it."""
        cols, good, valid, undecided = self._checked(cols, good, valid, undecided)
        # The newest minute again: more of its rows (a restart reads a big minute in shares).
        again = late and minute == self.now
        if not late:
            self.retire_until(minute)
        data = valid > 0
        every = bool(data.all())  # the usual case: no copies of the columns picked
        seen = cols if every else cols[data]
        g = self.g
        self.shared.stage(minute, g.take(seen), good if every else good[data], valid if every else valid[data],
                          None if undecided is None else (g.take(cols[undecided > 0]), undecided[undecided > 0]))
        # A slice's history begins at its oldest minute with data (-1: none yet).
        first = self.first_data.take(seen)
        earlier = (first < 0) | (first > minute)
        if earlier.any():
            self.first_data[seen[earlier]] = minute
        if self.spec.calendar_month and _month_of(minute) == self.month:
            self.month_good[cols] += good
            self.month_valid[cols] += valid
            if undecided is not None:
                self.month_undecided[cols] += undecided
        self.events_good[cols] += good
        self.events_valid[cols] += valid
        if undecided is not None:
            self.events_undecided[cols] += undecided
        self._version += 1
        return CountedMinute(minute, cols, seen, late, again)

    def prepare(self, cuts: list[int], minutes: list[int], cols, good, valid, undecided=None) -> FeedCounts:
        """A feed's counts (rows in minute order, minute k's rows from cuts[k] to cuts[k + 1],
        each slice at most once a minute) checked and split for `count_prepared`, and added
        to the event counters (what `count` does minute by minute, done once)."""
        cols, good, valid, undecided = self._checked(cols, good, valid, undecided)
        g = self.g
        data = valid > 0
        at = np.concatenate([[0], np.cumsum(data)]).take(cuts).tolist()
        seen = cols[data]
        g_undecided = undecided_at = None
        undecided_cuts: list[int] = []
        if undecided is not None:
            some = undecided > 0
            g_undecided, undecided_at = g.take(cols[some]), undecided[some]
            undecided_cuts = np.concatenate([[0], np.cumsum(some)]).take(cuts).tolist()
        # A slice's history begins at its oldest minute with data: in a feed (minutes in
        # order) at its first row with data, where it had none yet or only later ones. Rows
        # where it would, as of the feed, are the slice's first rows if any: usually none,
        # and then nothing is sorted.
        first_at: dict[int, np.ndarray] = {}
        row_minutes = np.repeat(np.asarray(minutes, np.int64), np.diff(at))
        before = self.first_data.take(seen)
        begin = (before < 0) | (before > row_minutes)
        if begin.any():
            fresh, first_row = np.unique(seen[begin], return_index=True)
            begins = row_minutes[begin].take(first_row)
            for minute in np.unique(begins).tolist():
                first_at[minute] = fresh[begins == minute]
        np.add.at(self.events_good, cols, good)
        np.add.at(self.events_valid, cols, valid)
        if undecided is not None:
            np.add.at(self.events_undecided, cols, undecided)
        return FeedCounts(list(cuts), cols, seen, at, g.take(seen), good[data], valid[data], g_undecided, undecided_at,
                          undecided_cuts, first_at, good, valid, undecided)

    def count_prepared(self, feed: FeedCounts, k: int, minute: int, late: bool) -> CountedMinute:
        """`count` of a prepared feed's minute k (`minute`), its event counters already added."""
        again = late and minute == self.now
        if not late:
            self.retire_until(minute)
        a, b = feed.seen_cuts[k], feed.seen_cuts[k + 1]
        undecided = None
        if feed.undecided is not None:
            x, y = feed.undecided_cuts[k], feed.undecided_cuts[k + 1]
            undecided = (feed.g_undecided[x:y], feed.undecided[x:y])  # type: ignore[index]
        self.shared.stage(minute, feed.g_seen[a:b], feed.good_seen[a:b], feed.valid_seen[a:b], undecided)
        begins = feed.first_at.get(minute)
        if begins is not None:
            self.first_data[begins] = minute
        r, s = feed.cuts[k], feed.cuts[k + 1]
        cols = feed.cols[r:s]
        if self.spec.calendar_month and _month_of(minute) == self.month:
            self.month_good[cols] += feed.good[r:s]
            self.month_valid[cols] += feed.valid[r:s]
            if feed.undecided_rows is not None:
                self.month_undecided[cols] += feed.undecided_rows[r:s]
        self._version += 1
        return CountedMinute(minute, cols, feed.seen[a:b], late, again)

    def judge(self, counted: CountedMinute, phase_spends: dict[int, list[tuple[str, int, int]]] | None = None,
              judge: bool = True, later: KeptMinutes | None = None) -> list[AlertChange]:
        """After the shared table's `flush`: the minute's alert changes, in column order (none
        for a minute passed before, nor where not `judge`). With `later`, the alert windows
        are judged with the feed's other minutes by `judge_later` (the minute is kept there):
        none is returned here."""
        minute, cols, seen = counted.minute, counted.cols, counted.seen
        if counted.late and not counted.again:
            return []
        for i, spends in (phase_spends or {}).items():
            windows = self.phase_windows.setdefault(i, {})
            for phase, over, samples in spends:
                w = windows.setdefault(phase, RollingWindows((self._fastest_long_minutes,)))
                w.retire_until(minute)
                w.add(minute, samples - over, samples)
        self.last_data[seen] = minute
        if len(seen) and minute < self._silence_bound:
            self._silence_bound = minute
        if not judge or counted.again:  # a minute is judged once, when it first closes
            return []
        changes: list[tuple[int, int, AlertChange]] = []
        silent = self.no_data_since.take(seen) if self._silent_slices else ()
        if len(silent) and silent.max() >= 0:  # a slice whose no-data alert fires has data again
            for i in seen[silent >= 0].tolist():
                changes.append((i, _NO_DATA, self._no_data_change("resolved", i, minute)))
                self.no_data_since[i] = -1
                self._silent_slices -= 1
        if later is not None:
            later.add(self, minute, cols, changes)
            return []
        changes += self._evaluate(minute, cols)
        return _in_column_order(changes, cols)

    def can_judge_later(self) -> bool:
        """Whether `judge_later` decides as `judge` does minute by minute: not where a firing
        alert names the phase that overspent (phase windows read at its minute), nor for a
        calendar month's budget (its arrays change in place)."""
        return not self.spec.phase_budgets_ms and not self.spec.calendar_month

    def judge_later(self, later: KeptMinutes) -> list[AlertChange]:
        """The alert changes of the minutes kept in `later` (`judge` with it), in minute order
        and each minute's in column order, decided at once over all of them: after a judged
        minute an alert fires exactly where its condition holds, so whether it fired before
        is the condition at the slice's previous judged minute (or, at its first, whether it
        fires now). Sets `later.firing_after`: per row, the burn-rate alerts firing after its minute."""
        if not later.minutes:
            return []
        rows = later.stacked(self)
        counts, cols, row_minutes, first = rows.counts, rows.cols, rows.minutes, rows.first
        burns, valids = rows.burns, rows.valids
        long_b, short_b = burns.take(self._long_at, axis=1), burns.take(self._short_at, axis=1)
        enough = np.minimum(valids.take(self._long_at, axis=1), valids.take(self._short_at, axis=1)) >= self.spec.min_events
        history = np.where(first >= 0, row_minutes - first + 1, 0)
        hot = (long_b > self._factors) & (short_b > self._factors) & enough & ~(history[:, None] < self._history_needed[None, :])
        # Whether each alert fired before the row's minute: the condition at the slice's
        # previous row, or at its first row the table's state.
        order = np.lexsort((np.arange(len(cols)), cols))
        by_slice = cols[order]
        opens = np.ones(len(cols), bool)
        opens[1:] = by_slice[1:] != by_slice[:-1]
        before_sorted = np.empty_like(hot)
        before_sorted[1:] = hot[order[:-1]]
        before_sorted[opens] = (self.fired_at.take(by_slice[opens], axis=1) >= 0).T
        before = np.empty_like(hot)
        before[order] = before_sorted
        later.firing_after = hot.sum(axis=1)
        changed = hot != before
        burn_changes: dict[int, list[tuple[int, int, AlertChange]]] = {}
        if changed.any():
            remaining, undecided = rows.remaining, rows.undecided
            minute_of = np.repeat(np.arange(len(counts)), counts)
            for r, j in zip(*np.nonzero(changed)):
                i, (aw, name, _), minute = int(cols[r]), self._alerts[j], int(row_minutes[r])
                if hot[r, j]:
                    self.fired_at[j, i] = minute
                    self._firing_alerts += 1
                    long_at = int(self._long_at[j])
                    change = AlertChange(
                        "firing", self.fingerprint_of(int(j), i), name, aw.severity, self.spec.name, self.views[i].labels,
                        minute, minute, aw, _opt(long_b[r, j]), _opt(short_b[r, j]), float(remaining[r]), "",
                        int(round(valids[r, long_at])), 0 if undecided is None else int(round(undecided[r, long_at])))
                else:
                    started = int(self.fired_at[j, i])
                    self.fired_at[j, i] = -1
                    self._firing_alerts -= 1
                    change = AlertChange(
                        "resolved", self.fingerprint_of(int(j), i), name, aw.severity, self.spec.name, self.views[i].labels,
                        minute, started, aw, _opt(long_b[r, j]), _opt(short_b[r, j]), float(remaining[r]))
                burn_changes.setdefault(int(minute_of[r]), []).append((i, int(j), change))
        out: list[AlertChange] = []
        for m, no_data in enumerate(later.no_data):
            changes = no_data + burn_changes.get(m, [])
            if changes:
                out += _in_column_order(changes, later.cols[m])
        return out

    def check_silence(self, now_minute: int) -> list[AlertChange]:
        """Fire the no-data alert of each slice silent for `no_data_minutes`."""
        if now_minute - self._silence_bound < self.spec.no_data_minutes:
            return []
        n = self.n
        silent = ((self.last_data[:n] >= 0) & (self.no_data_since[:n] < 0)
                  & (now_minute - self.last_data[:n] >= self.spec.no_data_minutes))
        out = []
        for i in np.flatnonzero(silent).tolist():
            self.no_data_since[i] = now_minute
            self._silent_slices += 1
            out.append(self._no_data_change("firing", i, now_minute))
        could = (self.last_data[:n] >= 0) & (self.no_data_since[:n] < 0)
        self._silence_bound = int(self.last_data[:n][could].min()) if could.any() else _NEVER
        return out

    def adopt_firing(self, window: str, values: tuple[str, ...], minute: int) -> bool:
        """Mark an alert as firing since `minute` (`window`: an alert window's name, or the
        no-data alert's): what a restart takes from the store instead of judging every minute
        of the replay again. False where the table has no such slice or window."""
        i = self.index.get(values)
        if i is None:
            return False
        if window == NO_DATA_WINDOW:
            self._silent_slices += int(self.no_data_since[i] < 0)
            self.no_data_since[i] = minute
            return True
        for j, (aw, _, _) in enumerate(self._alerts):
            if aw.name == window:
                self._firing_alerts += int(self.fired_at[j, i] < 0)
                self.fired_at[j, i] = minute
                return True
        return False

    # ---- reads -------------------------------------------------------------------------------
    def global_rates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`rates` by column of the shared window table (slice i at `g[i]`): no copies of this
        SLO's columns, for reads of a few slices."""
        burns, valid, remaining = self.shared.rates()
        if self.spec.calendar_month:  # an SLO alone in its table: its columns are its slices
            key = (self.shared.version, self._version, self.n)
            cached = self._rates
            if cached is None or cached[0] != key:
                c_good, c_valid = self.period_counts()
                cached = self._rates = (key, burns, valid, error_budget_remaining(c_valid - c_good, c_valid,
                                                                                  self.spec.objective))
            return burns, valid, cached[3]
        return burns, valid, remaining

    def rates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every slice's burn rate and valid events per window length ((n, lengths), in
        `lengths` order; a burn rate is NaN where the window has no valid events) and budget
        remaining (n,)."""
        burns, valid, remaining = self.global_rates()
        g = self.g[:self.n]
        return burns.take(g, axis=0), valid.take(g, axis=0), remaining.take(g)

    def window_sums(self) -> np.ndarray:
        """Per slice and window length, (not proven bad, valid): (n, lengths, 2)."""
        return self.windows.all_sums().take(self.g[:self.n], axis=0)

    def period_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(not proven bad, valid) per slice over the period."""
        if self.spec.calendar_month:
            return self.month_good[:self.n].astype(float), self.month_valid[:self.n].astype(float)
        sums = self.window_sums()[:, self.at[self.spec.period_minutes]]
        return sums[:, 0], sums[:, 1]

    def period_undecided(self) -> np.ndarray:
        """Undecided events per slice over the period (counted in `period_counts`' first)."""
        if self.spec.calendar_month:
            return self.month_undecided[:self.n].astype(float)
        return self.undecided_sums()[:, self.at[self.spec.period_minutes]]

    def undecided_sums(self) -> np.ndarray:
        """Undecided events per slice and window length ((n, lengths), in `lengths` order)."""
        sums = self.shared.undecided_sums()
        if sums is None:
            return np.zeros((self.n, len(self.lengths)))
        return sums.take(self.g[:self.n], axis=0)

    def status_columns(self, cols: np.ndarray) -> tuple[np.ndarray, ...]:
        """For the slices in `cols`: burn rates (cols, lengths), budget remaining, minutes to
        exhaustion, and over the period the events not proven bad, valid and undecided; read
        from the shared table's columns, each picked once."""
        gc = self.g.take(cols)
        burns, _, remaining = self.global_rates()
        burns, remaining = burns.take(gc, axis=0), remaining.take(gc)
        if self.spec.calendar_month:
            good, valid = self.month_good.take(cols).astype(float), self.month_valid.take(cols).astype(float)
            undecided = self.month_undecided.take(cols).astype(float)
        else:
            k = self.at[self.spec.period_minutes]
            sums = self.windows.all_sums()
            good, valid = sums[:, k, 0].take(gc), sums[:, k, 1].take(gc)
            u = self.shared.undecided_sums()
            undecided = np.zeros(len(cols)) if u is None else u[:, k].take(gc)
        return burns, remaining, self.exhaustion(remaining, burns), good, valid, undecided

    def minutes_to_exhaustion(self, cols: np.ndarray) -> np.ndarray:
        """Per slice, minutes until the budget is gone at the fastest page window's burn rate
        (NaN: not burning; 0: already gone)."""
        burns, _, remaining = self.global_rates()
        gc = self.g.take(cols)
        return minutes_to_exhaustion(remaining.take(gc), burns[gc, self.at[self._fastest_long_minutes]],
                                     self.spec.period_minutes)

    def young(self, minute: int, cols: np.ndarray) -> np.ndarray:
        """(slices × alert windows): True where the slice's history at `minute` is too short
        for the pair to be judged."""
        first = self.first_data.take(cols)
        history = np.where(first >= 0, minute - first + 1, 0)
        return history[:, None] < self._history_needed[None, :]

    def firing_count(self, cols: np.ndarray) -> np.ndarray:
        if not self._firing_alerts:  # nothing firing (most minutes): no array read
            return np.zeros(len(cols), np.int64)
        return (self.fired_at.take(cols, axis=1) >= 0).sum(axis=0)

    def exhaustion(self, remaining: np.ndarray, burns: np.ndarray) -> np.ndarray:
        """`minutes_to_exhaustion` of rows of budgets remaining and burn rates ((rows, lengths)):
        at the fastest page window's burn rate."""
        return minutes_to_exhaustion(remaining, burns[:, self.at[self._fastest_long_minutes]], self.spec.period_minutes)

    def overspent(self, i: int) -> PhaseSpend | None:
        budgets = dict(self.spec.phase_budgets_ms)
        spends = []
        for phase, w in self.phase_windows.get(i, {}).items():
            if phase in budgets:
                if self.now is not None:
                    w.retire_until(self.now)
                good, valid = w.sums(self._fastest_long_minutes)
                spends.append(PhaseSpend(phase, budgets[phase], valid - good, valid))
        return most_overspent(spends)

    def fingerprint_of(self, j: int, i: int) -> str:
        fp = self._fingerprints.get((j, i))
        if fp is None:
            labels = self.views[i].labels
            name = "SLONoData" if j == _NO_DATA else f"{self._alerts[j][1]}:{self._alerts[j][0].name}"
            fp = self._fingerprints[(j, i)] = fingerprint(self.spec.name, name, labels)
        return fp

    # ---- alerts ------------------------------------------------------------------------------
    def _evaluate(self, minute: int, cols: np.ndarray) -> list[tuple[int, int, AlertChange]]:
        """Every alert window of the slices in `cols` at once: (slices × alert windows) masks."""
        # Nothing of this SLO firing, and no slice of the shared table burning above its SLO's
        # smallest factor (checked once a minute for all of them): nothing can change.
        if not self._firing_alerts and not self.shared.any_burning():
            return []
        burns, valids, remaining = self.global_rates()
        # `take`, not fancy indexing: on a thin minute the calls' fixed costs are the stage's
        # cost, and fancy indexing along the second axis costs several times as much.
        gc = self.g.take(cols)  # the slices' columns of the shared window table
        burns = burns.take(gc, axis=0)
        fired = self.fired_at.take(cols, axis=1)
        # Nothing firing and no window burning above the smallest factor: nothing can change
        # (an alert fires only where both its windows burn above its factor), and the masks
        # below are not worth building.
        if not (burns > self._least_factor).any() and not (fired >= 0).any():
            return []
        valids = valids.take(gc, axis=0)
        long_b, short_b = burns.take(self._long_at, axis=1), burns.take(self._short_at, axis=1)
        enough = np.minimum(valids.take(self._long_at, axis=1), valids.take(self._short_at, axis=1)) >= self.spec.min_events
        hot = (long_b > self._factors) & (short_b > self._factors) & enough & ~self.young(minute, cols)
        firing = fired.T >= 0
        # An alert fires while its condition holds, as the generated Prometheus rule does: it
        # resolves once either window cools (the short one, nearly always, a few minutes
        # after the burn stops) or holds fewer than `min_events`.
        fire, resolve = hot & ~firing, firing & ~hot
        changed = fire | resolve
        out = []
        if not changed.any():
            return out
        for k, j in zip(*np.nonzero(changed)):
            i, (aw, name, _) = int(cols[k]), self._alerts[j]
            if fire[k, j]:
                self.fired_at[j, i] = minute
                self._firing_alerts += 1
                spent = self.overspent(i) if self.spec.phase_budgets_ms else None
                long_at = int(self._long_at[j])
                out.append((i, int(j), AlertChange(
                    "firing", self.fingerprint_of(int(j), i), name, aw.severity, self.spec.name, self.views[i].labels,
                    minute, minute, aw, _opt(long_b[k, j]), _opt(short_b[k, j]), float(remaining[gc[k]]),
                    spent.describe() if spent else "", int(round(valids[k, long_at])), self._undecided_at(i, long_at))))
            else:
                started = int(self.fired_at[j, i])
                self.fired_at[j, i] = -1
                self._firing_alerts -= 1
                out.append((i, int(j), AlertChange(
                    "resolved", self.fingerprint_of(int(j), i), name, aw.severity, self.spec.name, self.views[i].labels,
                    minute, started, aw, _opt(long_b[k, j]), _opt(short_b[k, j]), float(remaining[gc[k]]))))
        return out

    def _undecided_at(self, i: int, k: int) -> int:
        sums = self.shared.undecided_sums()
        return 0 if sums is None else int(round(sums[self.g[i], k]))

    def _no_data_change(self, state: str, i: int, minute: int) -> AlertChange:
        window = AlertWindow(NO_DATA_WINDOW, "ticket", 0.0, self.spec.no_data_minutes, self.spec.no_data_minutes)
        since = int(self.no_data_since[i])
        return AlertChange(state, self.fingerprint_of(_NO_DATA, i), "SLONoData", "ticket", self.spec.name,
                           self.views[i].labels, minute, since if since >= 0 else minute, window, None, None,
                           float(self.global_rates()[2][self.g[i]]))

    def nbytes(self) -> int:
        """Bytes this table holds in arrays (the windows' rings, allocated; untouched pages are free)."""
        per_slice = [self.g, self.fired_at, self.last_data, self.first_data, self.no_data_since, self.month_good, self.month_valid,
                     self.events_good, self.events_valid, self.events_undecided, self.month_undecided]
        # This SLO's share of the shared window table (its columns of it).
        shared = self.shared.nbytes() * self.n // max(self.shared.n, 1)
        return shared + sum(a.nbytes for a in per_slice)


class SliceView:
    """One slice of an `SloTable`, as readers (the signal view, /metrics, `slo status`) ask
    for it; it holds no state of its own."""

    __slots__ = ("table", "i", "labels")

    def __init__(self, table: SloTable, i: int, labels: dict[str, str]):
        self.table, self.i, self.labels = table, i, labels

    @property
    def spec(self) -> SloSpec:
        return self.table.spec

    @property
    def last_minute(self) -> int | None:
        return self.table.now

    def sums(self, length: int) -> tuple[float, float]:
        good, valid = self.table.windows.sums(length)
        g = self.table.g[self.i]
        return float(good[g]), float(valid[g])

    def burn(self, minutes: int) -> float | None:
        return _opt(self.table.global_rates()[0][self.table.g[self.i], self.table.at[minutes]])

    def burn_rates(self) -> dict[int, float | None]:
        burns = self.table.global_rates()[0][self.table.g[self.i]]
        return {m: _opt(burns[k]) for k, m in enumerate(self.table.lengths)}

    def budget_remaining(self) -> float:
        return float(self.table.global_rates()[2][self.table.g[self.i]])

    @property
    def firing(self) -> dict[str, tuple[AlertWindow, int]]:
        """Fingerprint → (alert window, fired at minute) of the burn-rate alerts firing."""
        t = self.table
        return {t.fingerprint_of(j, self.i): (aw, int(t.fired_at[j, self.i]))
                for j, (aw, _, _) in enumerate(t._alerts) if t.fired_at[j, self.i] >= 0}

    @property
    def no_data_since(self) -> int | None:
        since = int(self.table.no_data_since[self.i])
        return since if since >= 0 else None

    def status(self) -> SliceStatus:
        t, i = self.table, self.i
        good, valid = t.period_counts()
        undecided = float(t.period_undecided()[i])
        mte = t.minutes_to_exhaustion(np.array([i]))[0]
        return SliceStatus(
            slo=t.spec.name, labels=self.labels, minute=t.now or 0,
            sli=float((good[i] - undecided) / valid[i]) if valid[i] else None,
            sli_upper=float(good[i] / valid[i]) if valid[i] else None,
            undecided_events=int(round(undecided)),
            error_budget_remaining=self.budget_remaining(),
            burn_rates=self.burn_rates(),
            minutes_to_exhaustion=_opt(mte),
            firing=sorted(f"{aw.severity}:{aw.name}" for aw, _ in self.firing.values()),
            overspent_phase=t.overspent(i) if t.spec.phase_budgets_ms else None,
            young=[aw.name for (aw, _, _), y in zip(t._alerts, t.young(t.now or 0, np.array([i]))[0]) if y],
        )
