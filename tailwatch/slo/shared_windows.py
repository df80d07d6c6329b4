"""The window table that SLOs closing the same minutes share: their slices' (good, valid)
sums as columns of one `BlockWindows`, and their burn rates and budgets computed once.

On a thin minute each numpy call's fixed cost is the SLO stage's cost, whatever the
slices: moving the windows, summing them and dividing by the budget cost about the same
for one slice as for a hundred. SLOs that share an alert-window catalog (the same window
lengths and period) and pick the same bucket rows (the same selector, and for the kinds a
fleet must report, the same kind) close exactly the same minutes, so their windows move in
step: one table holds all their slices, a minute's counts are added once for all of them
(`stage`, then `flush`), and the rates are computed once (`rates`). Each SLO keeps its
own slices' alert state (`slo.engine.SloTable`), and reads its columns of this table.

An SLO alone (a calendar-month SLO, or one no other SLO shares a catalog and rows with) has
a table of its own: the same code, with one SLO's columns.
"""

from __future__ import annotations

import numpy as np

from tailwatch.slo.block_windows import BlockWindows


def grown(a: np.ndarray, n: int, fill) -> np.ndarray:
    """`a` with room for n entries (doubling, so adding slices stays amortised O(1))."""
    if a.shape[-1] >= n:
        return a
    out = np.full((*a.shape[:-1], max(n, 2 * a.shape[-1], 16)), fill, a.dtype)
    out[..., :a.shape[-1]] = a
    return out


def rates_of(sums: np.ndarray, budget: np.ndarray, period_at: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`SharedWindows.rates` of some rows of window sums ((rows, lengths, 2)) and their SLOs'
    error budgets ((rows,)): each row's figures depend on its own sums alone, so rows of
    several minutes stacked give what each minute's rates gave."""
    good, valid = sums[..., 0], sums[..., 1]
    bad = np.maximum(valid - good, 0.0)
    # The same operations, in the same order, as one SLO's `burn_rate` and
    # `error_budget_remaining` with its objective: a column's figures do not depend on
    # which SLOs share the table.
    with np.errstate(divide="ignore", invalid="ignore"):
        burns = bad / valid / budget[:, None]
        if period_at is None:
            remaining = np.ones(len(sums))
        else:
            k = period_at
            remaining = np.where(valid[:, k] > 0, 1.0 - bad[:, k] / (valid[:, k] * budget), 1.0)
    return burns, valid, remaining


class SharedWindows:
    """Column-wise window sums of every slice of some SLOs (column = one SLO's slice), and
    their burn rates and budgets remaining over the SLOs' shared period."""

    def __init__(self, lengths, period_minutes: int):
        self.windows = BlockWindows(lengths)
        self.lengths = self.windows.lengths
        self.period_at = self.lengths.index(period_minutes) if period_minutes in self.lengths else None
        self.undecided: BlockWindows | None = None  # undecided events per window, from the first one seen
        self.n = 0
        self.budget = np.zeros(0)  # per column, its SLO's error budget (1 − objective)
        self.least_factor = np.zeros(0)  # per column, its SLO's smallest burn-rate factor
        self._burning: tuple[int, bool] | None = None
        self.version = 0  # moves whenever a window's sums may have
        self._rates: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        # A minute's counts, staged by the SLOs sharing the table and added at once.
        self._staged: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._staged_undecided: list[tuple[np.ndarray, np.ndarray]] = []
        self._staged_minute: int | None = None

    @property
    def now(self) -> int | None:
        return self.windows.now

    def add_column(self, objective: float, least_factor: float = np.inf) -> int:
        i = self.n
        self.n += 1
        self.windows.add_slices(1)
        if self.undecided is not None:
            self.undecided.add_slices(1)
        self.budget = grown(self.budget, self.n, 1.0)
        self.budget[i] = 1.0 - objective
        self.least_factor = grown(self.least_factor, self.n, np.inf)
        self.least_factor[i] = least_factor
        self.version += 1
        return i

    def advance(self, minute: int) -> None:
        """Move the windows to `minute` (a minute not after now moves nothing)."""
        if self.windows.now is not None and minute <= self.windows.now:
            return
        self.windows.advance(minute)
        if self.undecided is not None:
            self.undecided.advance(minute)
        self.version += 1

    def stage(self, minute: int, cols: np.ndarray, good: np.ndarray, valid: np.ndarray,
              undecided: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Hold one SLO's counts of `minute` (columns of this table) until `flush`: every SLO
        sharing the table stages its counts of a minute, and they are added in one call."""
        if self._staged_minute is not None and minute != self._staged_minute:
            raise ValueError(f"minute {minute} staged with {self._staged_minute}: flush first")
        self._staged_minute = minute
        if len(cols):
            self._staged.append((cols, good, valid))
        if undecided is not None and len(undecided[0]):
            if self.undecided is None:
                self.undecided = BlockWindows(self.lengths)
                self.undecided.add_slices(self.n)
                self.undecided.advance(self.now)
            self._staged_undecided.append(undecided)

    def flush(self) -> None:
        """Add the staged counts to the windows."""
        minute, staged, undecided = self._staged_minute, self._staged, self._staged_undecided
        if minute is None:
            return
        self._staged, self._staged_undecided, self._staged_minute = [], [], None
        if staged:
            cols, good, valid = staged[0] if len(staged) == 1 else (np.concatenate(x) for x in zip(*staged))
            self.windows.add(cols, minute, good, valid)
        if undecided:
            cols, counts = undecided[0] if len(undecided) == 1 else (np.concatenate(x) for x in zip(*undecided))
            self.undecided.add(cols, minute, counts, counts)  # type: ignore[union-attr]
        self.version += 1

    def rates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every column's burn rate and valid events per window length ((n, lengths); a burn
        rate is NaN where the window has no valid events) and budget remaining over the
        period ((n,); 1 where the period is not among the lengths); computed once per move."""
        cached = self._rates
        if cached is not None and cached[0] == self.version:
            return cached[1], cached[2], cached[3]
        burns, valid, remaining = rates_of(self.windows.all_sums(), self.budget[:self.n], self.period_at)
        self._rates = (self.version, burns, valid, remaining)
        return burns, valid, remaining

    def any_burning(self) -> bool:
        """Whether any column burns above its SLO's smallest factor in some window (no alert
        of a table whose columns do not, and which fires none, can change)."""
        cached = self._burning
        if cached is None or cached[0] != self.version:
            burns = self.rates()[0]
            cached = self._burning = (self.version, bool((burns > self.least_factor[:self.n, None]).any()))
        return cached[1]

    def undecided_sums(self) -> np.ndarray | None:
        """Undecided events per column and window length ((n, lengths)); None until one is seen."""
        return None if self.undecided is None else self.undecided.all_sums()[:self.n, :, 0]

    def nbytes(self) -> int:
        undecided = self.undecided.nbytes() if self.undecided is not None else 0
        return self.windows.nbytes() + undecided + self.budget.nbytes
