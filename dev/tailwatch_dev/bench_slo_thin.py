"""`python -m tailwatch_dev.bench_slo_thin`: CPU per closed minute of the 14 default SLOs, fed
one minute at a time as a live worker feeds them, on thin and on dense traffic.

Thin: 5 bucket rows a minute (one slice each of realtime ASR, TTS, LLM and speech-to-speech,
and batch ASR, from the simulator's quiet fleet), 60 minutes to fill the windows, then 300
timed. Dense: the same 5 rows in 4,000 zones (20,000 rows a minute), 20 minutes, then 10
timed. CPU time (`time.process_time`), best of N runs (thin) or of the timed minutes (dense).

"engine" is the SLO engine alone: the minutes' counts (the polars select and group-by that
every SLO's counts come from, and the turn phases' spends) are computed beforehand, so what
is timed is closing the windows, judging the alerts and building the status parts.
"stage" is `SloStage.on_closed` whole (counts, status frame and alert rows included).
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta

import msgspec
import polars as pl

from tailwatch.ingest.schema import RequestV1
from tailwatch.slo import sli
from tailwatch.slo.sli import SloEvaluator
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.frames import REQUEST_COLUMNS
from tailwatch.streams.slo_stage import SloStage
from tailwatch_dev.simulator import FleetSimulator

POOLS = (("asr", "realtime"), ("tts", "realtime"), ("llm", "realtime"), ("s2s", "realtime"), ("asr", "batch"))


def thin_rows() -> pl.DataFrame:
    """One simulated minute's bucket row of each pool in POOLS."""
    from tests.h100_lab import buckets  # the worker's decode and windows, as the tests build buckets

    sim = FleetSimulator("quiet", minutes=2, seed=3, rate_scale=0.05, gpu_samples_per_minute=1)
    values = [msgspec.json.encode(e) for e in sim.events() if isinstance(e, RequestV1)]
    rows = buckets(values, RequestV1, REQUEST_COLUMNS, REQUESTS)
    first = rows.filter(pl.col("window_start") == rows["window_start"].min())
    return pl.concat([first.filter((pl.col("workload") == w) & (pl.col("traffic_class") == c)).head(1) for w, c in POOLS])


def minutes_of(rows: pl.DataFrame, count: int) -> list[pl.DataFrame]:
    t0 = rows["window_start"][0]
    return [rows.with_columns(window_start=pl.lit(t0 + timedelta(minutes=k)).cast(rows["window_start"].dtype))
            for k in range(count)]


class CountsGiven:
    """The evaluator's counting replaced by counts computed beforehand (for the engine alone)."""

    def __init__(self, specs, minutes: list[pl.DataFrame]):
        ev = SloEvaluator(specs)
        self.counted = {id(m): sli._counted_by(m, ev._countings(m)) for m in minutes}
        self.spends = {(id(m), s.name): sli._phase_spends(s, m) for m in minutes for s in specs if s.phase_budgets_ms}

    def __enter__(self):
        self.saved = sli._counted_by, sli._phase_spends, SloEvaluator._countings
        sli._counted_by = lambda buckets, countings: self.counted[id(buckets)]
        sli._phase_spends = lambda spec, buckets: self.spends[(id(buckets), spec.name)]
        SloEvaluator._countings = lambda self_, buckets: []
        return self

    def __exit__(self, *exc):
        sli._counted_by, sli._phase_spends, SloEvaluator._countings = self.saved


def run(runs: int = 7) -> list[str]:
    specs = load_slos(DEFAULT_SLOS)
    rows = thin_rows()
    warm, timed = 60, 300
    minutes = minutes_of(rows, warm + timed)

    def thin(close) -> float:
        for m in minutes[:warm]:
            close(m)
        t = time.process_time()
        for m in minutes[warm:]:
            close(m)
        return (time.process_time() - t) / timed

    stage = min(thin(lambda m, s=SloStage(specs): s.on_closed(m, pl.DataFrame())) for _ in range(runs))
    with CountsGiven(specs, minutes):
        engine = min(thin(SloEvaluator(specs).feed) for _ in range(runs))
    wide = pl.concat([rows.with_columns(zone=pl.lit(f"zone-{z:04d}")) for z in range(4000)])
    dense_minutes = minutes_of(wide, 30)
    with CountsGiven(specs, dense_minutes):
        ev = SloEvaluator(specs)
        per = []
        for k, m in enumerate(dense_minutes):
            t = time.process_time()
            ev.feed(m)
            if k >= 20:
                per.append(time.process_time() - t)
    slo_slices = sum(t.n for t in ev.tables.values())
    return [
        f"thin: 14 default SLOs, {rows.height} bucket rows a minute, {timed} minutes timed after {warm}, best of {runs}",
        f"  engine {engine * 1e3:.3f} ms per closed minute; stage (SloStage.on_closed) {stage * 1e3:.3f} ms",
        f"dense: {wide.height:,} bucket rows a minute ({slo_slices:,} SLO slices), 10 minutes timed after 20",
        f"  engine {min(per) * 1e3:.1f} ms per closed minute (best), {sorted(per)[len(per) // 2] * 1e3:.1f} (median)",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7, help="thin runs, the best taken")
    print("\n".join(run(p.parse_args().runs)))


if __name__ == "__main__":
    main()
