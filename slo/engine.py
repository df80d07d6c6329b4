"""Error budgets, burn rates and multi-window alerts over per-minute SLI counts.

Pure and incremental: `SliceState.advance(minute, good, valid)` adds one minute and
retires the minutes that leave each window, so every window's sums are rolling sums,
never a rescan. Ratios are event-weighted (sum of bad ÷ sum of valid over the window),
and a window without valid events has no burn rate (None), never NaN.

An alert window pair fires while both its long and short windows burn above the factor
and both hold at least `min_events` valid events; once firing, it resolves when the
short window cools (burns at or under the factor, or has no events). One condition
(SLO, window pair, slice) is one alert, identified by its fingerprint.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

from slo.spec import SloSpec
from slo.turn_stages import StageSpend, most_overspent
from slo.windows import AlertWindow, minute_start_utc


def burn_rate(bad: int, valid: int, objective: float) -> float | None:
    """Error ratio over the window ÷ error budget; None when the window has no valid events."""
    if valid <= 0:
        return None
    return (bad / valid) / (1.0 - objective)


def error_budget_remaining(bad: int, valid: int, objective: float) -> float:
    """Share of the compliance window's budget left (1 = untouched, < 0 = overspent)."""
    if valid <= 0:
        return 1.0
    return 1.0 - bad / (valid * (1.0 - objective))


def minutes_to_exhaustion(remaining: float, burn: float | None, period_minutes: int) -> float | None:
    """At a constant burn rate b the whole budget lasts period ÷ b; what is left lasts that × remaining."""
    if burn is None or burn <= 0 or remaining <= 0:
        return None if remaining > 0 else 0.0
    return remaining * period_minutes / burn


def _month_of(minute: int) -> tuple[int, int]:
    dt = minute_start_utc(minute)
    return dt.year, dt.month


def fingerprint(slo: str, alertname: str, labels: dict[str, str]) -> str:
    key = "\x1f".join([slo, alertname, *(f"{k}={labels[k]}" for k in sorted(labels))])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class RollingWindows:
    """Sums of (good, valid) over the last m minutes for each length m, kept incrementally.

    The minutes are stored once, whatever the lengths: one flat int64 array of (minute,
    good so far, valid so far) triples, 24 bytes a minute, and a length's sums are the
    running totals less those just before its oldest minute. A deque of (minute, good,
    valid) tuples per length took about 200 bytes a minute per length; a 30-day SLO keeps
    43,200 minutes, so that was 8.6 MB per SLO and slice, and a worker's memory grew for
    its first month."""

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
    detail: str = ""  # what explains it, where the SLO can tell (a stage_budget SLO: the stage that overspent)


@dataclass
class SliceStatus:
    slo: str
    labels: dict[str, str]
    minute: int
    sli: float | None  # over the compliance window
    error_budget_remaining: float
    burn_rates: dict[int, float | None]  # by window length in minutes
    minutes_to_exhaustion: float | None
    firing: list[str]
    overspent_stage: StageSpend | None = None


class SliceState:
    """One SLO's budget and alert windows for one slice."""

    def __init__(self, spec: SloSpec, labels: dict[str, str]):
        self.spec = spec
        self.labels = labels
        lengths = {spec.window_minutes}
        for w in spec.alert_windows:
            lengths.update((w.long_minutes, w.short_minutes))
        self.windows = RollingWindows(lengths)
        self.firing: dict[str, tuple[AlertWindow, int]] = {}  # fingerprint → (window, fired at minute)
        self.last_minute: int | None = None
        self.last_data_minute: int | None = None
        self.no_data_since: int | None = None  # minute the no-data alert fired, while it fires
        # Calendar-month SLOs budget from the first minute of the month (UTC) instead.
        self.month: tuple[int, int] | None = None
        self.month_good = 0
        self.month_valid = 0
        # stage_budget SLOs: per stage, samples within its budget over the fastest alert's long window.
        self.stage_windows: dict[str, RollingWindows] = {}
        self._stage_minutes = min(w.long_minutes for w in spec.alert_windows)
        # Per alert window: its alert name, fingerprint and burn-rate factor, which never
        # change for a slice (a SHA-256 per window per minute was a sixth of the SLO stage).
        self._alerts = [
            (aw, name, fingerprint(spec.name, f"{name}:{aw.name}", labels), aw.factor(spec.window_minutes))
            for aw, name in ((aw, f"SLOBurn{aw.severity.capitalize()}") for aw in spec.alert_windows)
        ]
        self._fastest_long_minutes = min(w.long_minutes for w in spec.alert_windows)
        # Per window length, (burn rate, valid events), until the windows next move.
        self._moved: tuple[dict[int, float | None], dict[int, int]] | None = None

    def observe_stages(self, minute: int, spends: list[tuple[str, int, int]]) -> None:
        """(stage, samples over budget, samples) of one minute, before `advance` for that minute."""
        for stage, over, samples in spends:
            w = self.stage_windows.setdefault(stage, RollingWindows((self._stage_minutes,)))
            w.retire_until(minute)
            w.add(minute, samples - over, samples)

    def overspent(self) -> StageSpend | None:
        budgets = dict(self.spec.stage_budgets_ms)
        spends = ((stage, w.sums(self._stage_minutes)) for stage, w in self.stage_windows.items() if stage in budgets)
        return most_overspent(StageSpend(stage, budgets[stage], valid - good, valid) for stage, (good, valid) in spends)

    def advance(self, minute: int, good: int, valid: int) -> list[AlertChange]:
        if good < 0 or valid < 0 or good > valid:
            raise ValueError(f"bad counts for {self.spec.name}: good={good} valid={valid}")
        if self.last_minute is not None and minute <= self.last_minute:
            raise ValueError(f"minute {minute} is not after {self.last_minute}: buckets arrive in order")
        self._moved = None
        self.windows.retire_until(minute)
        if valid:
            self.windows.add(minute, good, valid)
        for w in self.stage_windows.values():
            w.retire_until(minute)
        if self.spec.calendar_month:
            month = _month_of(minute)
            if month != self.month:
                self.month, self.month_good, self.month_valid = month, 0, 0
            self.month_good += good
            self.month_valid += valid
        self.last_minute = minute
        changes = []
        if valid:
            self.last_data_minute = minute
            if self.no_data_since is not None:
                changes.append(self._no_data_change("resolved", minute))
                self.no_data_since = None
        return changes + self._evaluate(minute)

    def check_silence(self, now_minute: int) -> list[AlertChange]:
        """Fire the no-data alert once the slice has been silent for `no_data_minutes`."""
        if self.last_data_minute is None or self.no_data_since is not None:
            return []
        if now_minute - self.last_data_minute < self.spec.no_data_minutes:
            return []
        self.no_data_since = now_minute
        return [self._no_data_change("firing", now_minute)]

    def _no_data_change(self, state: str, minute: int) -> AlertChange:
        window = AlertWindow("no-data", "ticket", 0.0, self.spec.no_data_minutes, self.spec.no_data_minutes)
        fp = fingerprint(self.spec.name, "SLONoData", self.labels)
        started = self.no_data_since if self.no_data_since is not None else minute
        return AlertChange(state, fp, "SLONoData", "ticket", self.spec.name, self.labels, minute, started, window,
                           None, None, self.budget_remaining())

    def retire_until(self, minute: int) -> None:
        """Move the windows to `minute` without new data (for reads between buckets)."""
        self._moved = None
        self.windows.retire_until(minute)

    def burn_rates(self) -> dict[int, float | None]:
        """Per window length, its burn rate now."""
        return self._window_rates()[0]

    def _window_rates(self) -> tuple[dict[int, float | None], dict[int, int]]:
        """Per window length, its burn rate and valid events, computed once per move of the
        windows (the alert windows, the status row and /metrics all read them)."""
        if self._moved is None:
            burns, valids = {}, {}
            for m in self.windows.lengths:
                good, valid = self.windows.sums(m)
                burns[m], valids[m] = burn_rate(valid - good, valid, self.spec.objective), valid
            self._moved = burns, valids
        return self._moved

    def burn(self, minutes: int) -> float | None:
        return self.burn_rates()[minutes]

    def _evaluate(self, minute: int) -> list[AlertChange]:
        changes = []
        remaining = self.budget_remaining()
        burns, valids = self._window_rates()
        for aw, name, fp, factor in self._alerts:
            long_b, short_b = burns[aw.long_minutes], burns[aw.short_minutes]
            hot = (
                long_b is not None and short_b is not None and long_b > factor and short_b > factor
                and min(valids[aw.long_minutes], valids[aw.short_minutes]) >= self.spec.min_events
            )
            if fp not in self.firing and hot:
                self.firing[fp] = (aw, minute)
                spent = self.overspent() if self.spec.stage_budgets_ms else None
                changes.append(AlertChange("firing", fp, name, aw.severity, self.spec.name, self.labels, minute, minute,
                                           aw, long_b, short_b, remaining, spent.describe() if spent else ""))
            elif fp in self.firing and (short_b is None or short_b <= factor):
                _, started = self.firing.pop(fp)
                changes.append(AlertChange("resolved", fp, name, aw.severity, self.spec.name, self.labels, minute,
                                           started, aw, long_b, short_b, remaining))
        return changes

    def budget_remaining(self) -> float:
        good, valid = self._compliance_counts()
        return error_budget_remaining(valid - good, valid, self.spec.objective)

    def _compliance_counts(self) -> tuple[int, int]:
        if self.spec.calendar_month:
            return self.month_good, self.month_valid
        return self.windows.sums(self.spec.window_minutes)

    def status(self) -> SliceStatus:
        good, valid = self._compliance_counts()
        remaining = self.budget_remaining()
        burns = self.burn_rates()
        return SliceStatus(
            slo=self.spec.name, labels=self.labels, minute=self.last_minute or 0,
            sli=(good / valid) if valid else None,
            error_budget_remaining=remaining,
            burn_rates=dict(burns),
            minutes_to_exhaustion=minutes_to_exhaustion(remaining, burns[self._fastest_long_minutes],
                                                        self.spec.window_minutes),
            firing=sorted(f"{aw.severity}:{aw.name}" for aw, _ in self.firing.values()),
            overspent_stage=self.overspent() if self.spec.stage_budgets_ms else None,
        )
