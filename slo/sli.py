"""Good and valid event counts per SLO, slice and minute, from `sli_minute` rows.

Vectorised over a polars frame of buckets; `replay` then feeds the counts, minute by
minute in event time, through one `SliceState` per slice. The same function serves a
replay of the store (`tailwatch slo status --at`) and, minute by minute, a live stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from slo import histogram
from slo.engine import AlertChange, SliceState
from slo.spec import SloSpec
from slo.stages import overspend_counts


def good_valid(spec: SloSpec, buckets: pl.DataFrame) -> pl.DataFrame:
    """Rows (window_start, *slice_by, good, valid) for the buckets that the SLO selects."""
    rows = spec.selected(buckets)
    not_cancelled = (pl.col("requests") - pl.col("cancelled")).alias("valid")
    if spec.sli_kind == "availability":
        counted = rows.select("window_start", *spec.slice_by, pl.col("ok").alias("good"), not_cancelled)
    elif spec.sli_kind == "stream_completion":
        counted = rows.select("window_start", *spec.slice_by, pl.col("streams_completed").fill_null(0).alias("good"),
                              (pl.col("streams") - pl.col("streams_cancelled")).fill_null(0).alias("valid"))
    else:
        bound = histogram.last_good_bin(spec.threshold_ms)  # type: ignore[arg-type]
        hist = pl.col(f"{spec.latency_field}_hist")
        good = hist.list.eval(pl.element().filter(pl.element().struct.field("bin") <= bound).struct.field("n")).list.sum()
        total = hist.list.eval(pl.element().struct.field("n")).list.sum()
        if spec.sli_kind in ("latency", "stage_budget"):
            counted = rows.select("window_start", *spec.slice_by, good.cast(pl.Int64).alias("good"), total.alias("valid"))
        else:
            # Goodput: the first-output histogram also holds attempts the client cancelled
            # after their first token (an LLM stream abandoned mid-answer), which valid leaves
            # out; capped so that good never exceeds valid (it used to crash the engine).
            counted = rows.select("window_start", *spec.slice_by,
                                  pl.min_horizontal(good.cast(pl.Int64), not_cancelled).alias("good"), not_cancelled)
    return counted.group_by("window_start", *spec.slice_by).agg(pl.col("good").sum(), pl.col("valid").sum())


@dataclass
class Evaluation:
    """What one feed of buckets produced: alert changes and one status row per slice and minute."""

    changes: list[AlertChange] = field(default_factory=list)
    status: list[dict] = field(default_factory=list)
    counts: dict[str, pl.DataFrame] = field(default_factory=dict)  # per SLO: window_start, slice, good, valid


class SloEvaluator:
    """Every SLO's slice states, fed with closed buckets in event-time order."""

    def __init__(self, specs: list[SloSpec]):
        self.specs = specs
        self.states: dict[tuple[str, tuple], SliceState] = {}

    def feed(self, buckets: pl.DataFrame, until_minute: int | None = None, with_status: bool = True) -> Evaluation:
        out = Evaluation()
        if buckets.height == 0:
            return out
        for spec in self.specs:
            counts = good_valid(spec, buckets).with_columns(
                (pl.col("window_start").dt.epoch("s") // 60).alias("_minute")
            ).sort("_minute")
            if until_minute is not None:
                counts = counts.filter(pl.col("_minute") <= until_minute)
            out.counts[spec.name] = counts
            spends = _stage_spends(spec, buckets) if spec.stage_budgets_ms else {}
            for row in counts.iter_rows(named=True):
                labels = {k: str(row[k]) for k in spec.slice_by}
                key = (spec.name, tuple(labels.values()))
                state = self.states.get(key)
                if state is None:
                    state = self.states[key] = SliceState(spec, labels)
                if spends:
                    state.observe_stages(row["_minute"], spends.get((row["_minute"], key[1]), []))
                out.changes.extend(state.advance(row["_minute"], int(row["good"]), int(row["valid"])))
                if with_status:
                    out.status.append(_status_row(state))
            if counts.height:
                newest = int(counts["_minute"].max())  # type: ignore[arg-type]
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
