"""SLOs whose selector matches nothing: a misspelt label value (`model: lama-3`) selects no
bucket, and such an SLO is otherwise silent everywhere (no slice, no status, no page).

`UnmatchedSelectors` watches the closed minutes a process reads and says once, per SLO,
when its selector has matched no row in `after_minutes` closed minutes in which some other
SLO's selector did match (so an idle fleet or a worker still starting warns of nothing).
"""

from __future__ import annotations

import polars as pl

from tailwatch.slo.spec import SloSpec

# Closed minutes of other SLOs' data before an SLO that matched nothing is named: enough
# that a worker's first minutes are not judged, few enough to tell at start.
UNMATCHED_AFTER_MINUTES = 5


class UnmatchedSelectors:
    """Per SLO: whether its selector has matched a row yet (`matched`, read by the worker's
    gauge), and the minutes it has missed."""

    def __init__(self, specs: list[SloSpec], after_minutes: int = UNMATCHED_AFTER_MINUTES):
        self.specs = specs
        self.after_minutes = after_minutes
        self.matched = {s.name: False for s in specs}
        self.missed_minutes = {s.name: set() for s in specs}
        self.warned: set[str] = set()

    def observe(self, buckets: pl.DataFrame) -> list[str]:
        """Closed minutes' `sli_minute` rows; returns the warnings now due (each SLO at most once)."""
        waiting = [s for s in self.specs if not self.matched[s.name]]
        if not waiting or buckets.height == 0:
            return []
        judging = any(s.name not in self.warned for s in waiting)  # else only "matched at last?" is asked
        if not judging:
            # One select for all of them (a filter each cost as much as the SLO engine's
            # minute on a thin backlog where some selectors never match).
            hits = buckets.select(_picks(s).any().alias(f"_{k}") for k, s in enumerate(waiting)).row(0)
            for spec, hit in zip(waiting, hits):
                if hit:
                    self.matched[spec.name] = True
            return []
        minutes_of = {s.name: set(s.selected(buckets).get_column("window_start").unique().to_list()) for s in self.specs}
        out = []
        for spec in waiting:
            if minutes_of[spec.name]:
                self.matched[spec.name] = True
                continue
            if spec.name in self.warned:
                continue
            others = set().union(*(m for name, m in minutes_of.items() if name != spec.name))
            self.missed_minutes[spec.name] |= others
            if len(self.missed_minutes[spec.name]) >= self.after_minutes:
                self.warned.add(spec.name)
                selector = ", ".join(f"{k}={v}" for k, v in spec.selector.items())
                out.append(f"SLO {spec.name}: selector {{{selector}}} matched no data in "
                           f"{len(self.missed_minutes[spec.name])} closed minutes in which other SLOs had data; "
                           "it will never page until its label values match (check them with `tailwatch slo check "
                           "--store`)")
        return out


def _picks(spec: SloSpec) -> pl.Expr:
    """True for the rows `spec.selected` keeps (a null label value never matches)."""
    if not spec.selector:
        return pl.lit(True)
    return pl.all_horizontal([(pl.col(label) == value).fill_null(False) for label, value in spec.selector.items()])
