"""`tailwatch bench --slo`: CPU per minute of event time to evaluate many SLOs over many
live slices, with the incremental engine and beside a naive rescan of each window.

Synthetic buckets: `slices` live slices (tenant × model × zone), one bucket each per
minute; `slos` SLOs, one per model, each sliced by tenant and zone, so that together they
cover every slice. After the history, `minutes` more are timed; the process's RSS and the
windows' arrays are reported beside the CPU.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from datetime import datetime, timedelta

import numpy as np
import polars as pl

from tailwatch.slo.sli import SloEvaluator, good_valid
from tailwatch.slo.spec import SloSpec
from tailwatch.slo.alert_windows import default_catalog
from tailwatch_dev.bench import _rss_bytes

T0 = datetime(2026, 11, 2)


def specs(n: int) -> list[SloSpec]:
    return [
        SloSpec(name=f"slo-{i:03d}", description="", selector={"model": f"model-{i:03d}"}, sli_kind="availability",
                objective=0.999, period_minutes=30 * 1440, calendar_month=False, slice_by=("tenant", "zone"),
                alert_windows=default_catalog(), min_events=10)
        for i in range(n)
    ]


def slice_labels(slices: int, models: int) -> pl.DataFrame:
    idx = np.arange(slices)
    return pl.DataFrame({
        "model": [f"model-{i % models:03d}" for i in idx],
        "tenant": [f"tenant-{(i // models) % 1000:03d}" for i in idx],
        "zone": [f"zone-{(i // (models * 1000)) % 3}" for i in idx],
    })


def minute_buckets(minute: int, labels: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    slices = labels.height
    requests = rng.poisson(50, slices)
    errors = rng.binomial(requests, 0.001)
    return labels.with_columns(
        window_start=pl.lit(T0 + timedelta(minutes=minute)), requests=pl.Series(requests),
        ok=pl.Series(requests - errors), cancelled=pl.lit(0, pl.Int64))


def naive_minute(spec_list: list[SloSpec], history: list[pl.DataFrame]) -> None:
    """Rescan: every window of every slice summed again from the per-minute history."""
    frame = pl.concat(history)
    for spec in spec_list:
        counts = good_valid(spec, frame).with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_m"))
        now = int(counts["_m"].max())  # type: ignore[arg-type]
        lengths = sorted({m for w in spec.alert_windows for m in (w.long_minutes, w.short_minutes)} | {spec.period_minutes})
        for length in lengths:
            counts.filter(pl.col("_m") > now - length).group_by(*spec.slice_by).agg(
                pl.col("good").sum(), pl.col("valid").sum())


NAIVE_HISTORY_MINUTES = 240  # past this, the naive rescan is left out (it would hold every minute)


def _rss_mib() -> float:
    return _rss_bytes(os.getpid()) / 2**20


def run(slos: int = 100, slices: int = 20_000, history: int = 60, minutes: int = 5) -> list[str]:
    """`history` minutes of event time first (a long one in steps, each step a minute of
    traffic: every block of every window is written, so memory is that of full windows),
    then `minutes` timed."""
    rng = np.random.default_rng(1)
    spec_list = specs(slos)
    ev = SloEvaluator(spec_list)
    labels = slice_labels(slices, slos)
    naive_too = history <= NAIVE_HISTORY_MINUTES
    step = 1 if naive_too else 360
    kept: list[pl.DataFrame] = []
    rss_start = _rss_mib()
    for m in range(0, history, step):
        b = minute_buckets(m, labels, rng)
        if naive_too:
            kept.append(b)
        ev.feed(b, with_status=False)
        if (m // step + 1) % 10 == 0:
            print(f"  history: {m + 1:,}/{history:,} minutes", file=sys.stderr, flush=True)
    engine, naive = [], []
    for m in range(history, history + minutes):
        b = minute_buckets(m, labels, rng)
        t = time.process_time()
        ev.feed(b, with_status=True)
        engine.append(time.process_time() - t)
        if naive_too:
            kept.append(b)
            t = time.process_time()
            naive_minute(spec_list, kept)
            naive.append(time.process_time() - t)
    e = float(np.median(engine))
    slo_slices = sum(t.n for t in ev.tables.values())
    per_slice = next(iter(ev.tables.values())).windows.bytes_per_slice()
    windows_mib = slo_slices * per_slice / 2**20
    out = [
        f"SLO engine: {slos} SLOs over {slices:,} live slices ({slo_slices:,} SLO slices, 30-day windows), "
        f"{history:,} minutes of history{'' if step == 1 else f' (a minute of traffic every {step} minutes)'}",
        f"  engine: {e:.3f} CPU-s per minute of event time (median of {minutes}, status rows included)",
        f"  memory: process RSS {_rss_mib():,.0f} MiB, peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} "
        f"MiB ({rss_start:,.0f} MiB before the first minute); "
        f"window rings {windows_mib:,.0f} MiB in use ({per_slice:,} bytes per SLO slice)",
    ]
    if naive:
        n = float(np.median(naive))
        out.append(f"  naive rescan of every window: {n:.3f} CPU-s per minute ({n / e:.1f}x the engine; it grows with history)")
    return out
