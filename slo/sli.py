"""Good and valid event counts per SLO, slice and minute, from `sli_minute` rows.

Vectorised over a polars frame of buckets; `replay` then feeds the counts, minute by
minute in event time, through one `SliceState` per slice. The same function serves a
replay of the store (`tailwatch slo status --at`) and, minute by minute, a live stream.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import polars as pl

from slo import histogram
from slo.engine import AlertChange, SliceState
from slo.spec import SloSpec
from slo.turn_stages import overspend_counts


def good_valid_exprs(spec: SloSpec) -> tuple[pl.Expr, pl.Expr]:
    """The SLO's good and valid counts of one bucket row."""
    not_cancelled = pl.col("requests") - pl.col("cancelled")
    if spec.sli_kind == "availability":
        return pl.col("ok"), not_cancelled
    if spec.sli_kind == "stream_completion":
        return pl.col("streams_completed").fill_null(0), (pl.col("streams") - pl.col("streams_cancelled")).fill_null(0)
    bound = histogram.last_good_bin(spec.threshold_ms)  # type: ignore[arg-type]
    hist = pl.col(f"{spec.latency_field}_hist")
    good = hist.list.eval(pl.element().filter(pl.element().struct.field("bin") <= bound).struct.field("n")).list.sum()
    total = hist.list.eval(pl.element().struct.field("n")).list.sum()
    if spec.sli_kind in ("latency", "stage_budget"):
        return good.cast(pl.Int64), total
    # Goodput: the first-output histogram also holds attempts the client cancelled after
    # their first token (an LLM stream abandoned mid-answer), which valid leaves out;
    # capped so that good never exceeds valid (it used to crash the engine).
    return pl.min_horizontal(good.cast(pl.Int64), not_cancelled), not_cancelled


def _selects(spec: SloSpec) -> pl.Expr:
    """True for the bucket rows that the SLO's selector picks (a null label never matches)."""
    picked = pl.lit(True)
    for label, value in spec.selector.items():
        picked = picked & (pl.col(label) == value).fill_null(False)
    return picked


def good_valid(spec: SloSpec, buckets: pl.DataFrame) -> pl.DataFrame:
    """Rows (window_start, *slice_by, good, valid) for the buckets that the SLO selects."""
    good, valid = good_valid_exprs(spec)
    counted = spec.selected(buckets).select("window_start", *spec.slice_by, good.alias("good"), valid.alias("valid"))
    return counted.group_by("window_start", *spec.slice_by).agg(pl.col("good").sum(), pl.col("valid").sum())


# Past this many grouped rows (a restart replaying a month of buckets), each SLO walks its
# own rows instead of all of them being made Python tuples at once.
MATERIALISE_ROWS = 100_000

SloRow = tuple[int, tuple[str, ...], int, int]  # minute, slice values, good, valid


def good_valid_rows(specs: list[SloSpec], buckets: pl.DataFrame) -> dict[str, Iterable[SloRow]]:
    """Per SLO, (minute, slice values, good, valid) of the buckets it selects, in minute and
    slice order: every SLO in one select and one group-by per distinct `slice_by`, not a
    filter, select and group-by per SLO (a polars call costs the same for the 20 rows of a
    closed minute as for 20,000, and ten SLOs made a hundred calls a minute)."""
    exprs = []
    for i, spec in enumerate(specs):
        good, valid = good_valid_exprs(spec)
        picked = _selects(spec)
        exprs += [picked.alias(f"_p{i}"), pl.when(picked).then(good).alias(f"_g{i}"),
                  pl.when(picked).then(valid).alias(f"_v{i}")]
    labels = sorted({label for spec in specs for label in spec.slice_by})
    counted = buckets.select((pl.col("window_start").dt.epoch("s") // 60).alias("_minute"), *labels, *exprs)
    by_slicing: dict[tuple[str, ...], list[int]] = {}
    for i, spec in enumerate(specs):
        by_slicing.setdefault(spec.slice_by, []).append(i)
    out: dict[str, Iterable[SloRow]] = {}
    for slice_by, members in by_slicing.items():
        g = counted.group_by("_minute", *slice_by).agg(
            *[agg for i in members for agg in (pl.col(f"_p{i}").any(), pl.col(f"_g{i}").sum(), pl.col(f"_v{i}").sum())]
        ).sort("_minute", *slice_by, nulls_last=True)
        width = len(slice_by)
        if g.height <= MATERIALISE_ROWS:
            rows = g.rows()
            for k, i in enumerate(members):
                at = 1 + width + 3 * k
                out[specs[i].name] = [(r[0], tuple(str(v) for v in r[1:1 + width]), int(r[at + 1]), int(r[at + 2]))
                                      for r in rows if r[at]]
        else:
            for i in members:
                out[specs[i].name] = _walk(g.filter(pl.col(f"_p{i}")).select("_minute", *slice_by, f"_g{i}", f"_v{i}"), width)
    return out


def _walk(rows: pl.DataFrame, width: int) -> Iterator[SloRow]:
    for r in rows.iter_rows():
        yield r[0], tuple(str(v) for v in r[1:1 + width]), int(r[-2]), int(r[-1])


@dataclass
class Evaluation:
    """What one feed of buckets produced: alert changes and one status row per slice and minute."""

    changes: list[AlertChange] = field(default_factory=list)
    status: list[dict] = field(default_factory=list)
    events: dict[tuple[str, tuple[str, ...]], list[int]] = field(default_factory=dict)  # (SLO, slice) → [good, valid]


class SloEvaluator:
    """Every SLO's slice states, fed with closed buckets in event-time order."""

    def __init__(self, specs: list[SloSpec]):
        self.specs = specs
        self.states: dict[tuple[str, tuple], SliceState] = {}

    def feed(self, buckets: pl.DataFrame, until_minute: int | None = None, with_status: bool = True) -> Evaluation:
        out = Evaluation()
        if buckets.height == 0:
            return out
        rows_by_slo = good_valid_rows(self.specs, buckets)
        for spec in self.specs:
            spends = _stage_spends(spec, buckets) if spec.stage_budgets_ms else {}
            newest = None
            for minute, values, good, valid in rows_by_slo[spec.name]:
                if until_minute is not None and minute > until_minute:
                    break  # rows come in minute order
                newest = minute
                key = (spec.name, values)
                state = self.states.get(key)
                if state is None:
                    state = self.states[key] = SliceState(spec, dict(zip(spec.slice_by, values)))
                if spends:
                    state.observe_stages(minute, spends.get((minute, values), []))
                out.changes.extend(state.advance(minute, good, valid))
                if with_status:
                    out.status.append(_status_row(state))
                totals = out.events.setdefault(key, [0, 0])
                totals[0] += good
                totals[1] += valid
            if newest is not None:
                for (name, _), state in self.states.items():
                    if name == spec.name:
                        out.changes.extend(state.check_silence(newest))
        return out

    def retire_until(self, minute: int) -> None:
        for state in self.states.values():
            state.retire_until(minute)


def _stage_spends(spec: SloSpec, buckets: pl.DataFrame) -> dict[tuple[int, tuple], list[tuple[str, int, int]]]:
    """(minute, slice values) → [(stage, samples over budget, samples)] of a stage_budget SLO."""
    out: dict[tuple[int, tuple], list[tuple[str, int, int]]] = {}
    rows = overspend_counts(spec, buckets).with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_minute"))
    for row in rows.iter_rows(named=True):
        key = (row["_minute"], tuple(str(row[k]) for k in spec.slice_by))
        out.setdefault(key, []).append((row["stage"], int(row["over"]), int(row["samples"])))
    return out


def _status_row(state: SliceState) -> dict:
    st = state.status()
    return {
        "window_start": st.minute, "slo": st.slo,
        "slice": ",".join(f"{k}={v}" for k, v in st.labels.items()),
        "sli": st.sli, "error_budget_remaining": st.error_budget_remaining,
        "minutes_to_exhaustion": st.minutes_to_exhaustion,
        "burn_rates": {span(m): b for m, b in st.burn_rates.items() if b is not None},
        "firing": len(st.firing),
    }


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


def replay(specs: list[SloSpec], buckets: pl.DataFrame, until_minute: int | None = None) -> Replay:
    """The SLO state after the given buckets (for reads of the store)."""
    ev = SloEvaluator(specs)
    result = ev.feed(buckets, until_minute, with_status=False)
    if buckets.height:
        last = until_minute if until_minute is not None else int(buckets["window_start"].dt.epoch("s").max() // 60)
        ev.retire_until(last)
    return Replay(ev, result.changes)
