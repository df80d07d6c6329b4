"""`tailwatch bench --restore STORE`: how long a new replica takes to be ready from another's
snapshot (`--restore-fleet`: of a store of a month at --slices busy slices, built here).

Three steps, each timed: `tailwatch store snapshot` of STORE (Parquet and offsets), the
restore into a new store file (`worker --restore-from`), and the worker's start on it: the
open minutes put back and every default stage rebuilt from the store (SLO windows over the
longest SLO period, detectors, fleet metrics, the signal view), which is what the worker does
before it reads its first record. What is left is catching up from Kafka: the records
published since the snapshot, at the worker's throughput (`tailwatch bench`).
"""

from __future__ import annotations

import multiprocessing
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.store import snapshot
from tailwatch.streams.tiers import WorkerSettings, build
from tailwatch.streams.stages import default_stages
from tailwatch.streams.store_sink import StoreSink
from tailwatch.streams.topic_sink import TopicSink


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def run(store_path: str, say=lambda line: None) -> list[str]:
    source = Path(store_path)
    work = Path(tempfile.mkdtemp(prefix="tailwatch-restore-"))
    try:
        folder, restored = work / "snapshot", work / "replica.duckdb"
        say(f"snapshot of {source} ({_size(source) / 2**20:,.0f} MiB)")
        began = time.perf_counter()
        # On the replica it is taken from, not the new one: a process of its own, so that the
        # peak RSS reported is the new replica's (its restore and start).
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            manifest = pool.apply(snapshot.write, (source, folder))
        snap_s = time.perf_counter() - began
        say(f"restore into {restored}")
        began = time.perf_counter()
        snapshot.restore(folder, restored)
        restore_s = time.perf_counter() - began
        say("worker start: open minutes and every stage rebuilt from the store")
        rebuild_s, rebuild_cpu_s = time_start(restored)
        rows = manifest.rows
        return [
            f"restore bench: {source} ({_size(source) / 2**20:,.0f} MiB; {rows.get('sli_minute', 0):,} sli_minute rows, "
            f"{rows.get('gpu_minute', 0):,} gpu_minute rows, newest minute {manifest.newest_minute})",
            f"  snapshot (Parquet, zstd):      {snap_s:8.1f} s, {_size(folder) / 2**20:,.0f} MiB",
            f"  restore into a new store:      {restore_s:8.1f} s, {_size(restored) / 2**20:,.0f} MiB",
            f"  worker start on it (rebuild):  {rebuild_s:8.1f} s ({rebuild_cpu_s:.1f} CPU-s)",
            f"  ready before catch-up:         {snap_s + restore_s + rebuild_s:8.1f} s "
            f"(the new replica's peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB)",
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def time_start(store_path: Path, by_stage: dict[str, tuple[float, float, float]] | None = None) -> tuple[float, float]:
    """A worker's start on a store, up to its first read: (seconds, CPU-seconds of this
    process). `by_stage` gets each stage's rebuild: (seconds, CPU-seconds, this process's peak
    RSS in MiB when it ended)."""
    # No broker: the start is timed up to the first read (the topic sink's client stays quiet).
    quiet = KafkaSettings(bootstrap_servers="127.0.0.1:1", client_config={"log_level": "0"})
    w = build(WorkerSettings(kafka=quiet, store_path=str(store_path), slos=load_slos(DEFAULT_SLOS),
                             stages=default_stages(), http_port=0))
    if by_stage is not None:
        for stage in w.sink(StoreSink).stages:
            stage.rebuild = _timed(stage.name, stage.rebuild, by_stage)
    began, cpu = time.perf_counter(), time.process_time()
    w.restore()
    took = time.perf_counter() - began, time.process_time() - cpu
    w.sink(StoreSink).close()
    w.sink(TopicSink).close()
    return took


def _timed(name: str, rebuild, out: dict[str, tuple[float, float, float]]):
    def timed(con) -> None:
        began, cpu = time.perf_counter(), time.process_time()
        rebuild(con)
        out[name] = (time.perf_counter() - began, time.process_time() - cpu,
                     resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return timed


def run_fleet(slices: int, days: int, every_minutes: int, say=lambda line: None, hours: int | None = None) -> list[str]:
    """`run` on a store built by `fleet_month_store` (or, given `hours`, by `busy_fleet_store`), removed afterwards."""
    from tailwatch.cli import progress, progress_done

    work = Path(tempfile.mkdtemp(prefix="tailwatch-fleet-"))
    try:
        path = work / "fleet.duckdb"
        if hours:
            say(f"a store of {hours} hours at {slices:,} slices busy every minute")
            build, build_args = busy_fleet_store, (path, slices, hours, progress)
        else:
            say(f"a store of {days} days at {slices:,} busy slices, a request each every {every_minutes} minutes")
            build, build_args = fleet_month_store, (path, slices, days, every_minutes, progress)
        began = time.perf_counter()
        # Built in a process of its own, so that the peak RSS reported is the replica's.
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            rows = pool.apply(build, build_args)
        progress_done()
        built = f"store built: {rows:,} sli_minute rows in {time.perf_counter() - began:.0f} s"
        if not hours:
            return [built, *run(str(path), say)]
        # A busy fleet's start alone, on the store as built (a snapshot and restore of it would
        # scale with its rows as the month's do).
        say("worker start: open minutes and every stage rebuilt from the store")
        stages: dict[str, tuple[float, float, float]] = {}
        start_s, start_cpu_s = time_start(path, stages)
        return [built, f"  worker start on it: {start_s:.1f} s ({start_cpu_s:.1f} CPU-s), peak RSS "
                       f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB",
                "  stages rebuilt: " + ", ".join(f"{name} {s:.1f} s ({cpu:.1f} CPU-s; peak RSS then {rss:,.0f} MiB)"
                                                 for name, (s, cpu, rss) in stages.items())]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_rollup(store_path: str, retention_days: int, say=lambda line: None) -> list[str]:
    """`tailwatch bench --rollup STORE`: a copy of STORE rolled up to `retention_days` of minutes,
    checkpoint-sized step by step as a worker would; the time it took and the store's size
    before and after (each compacted by a snapshot and restore, which is what a file's
    size says once DuckDB reuses the blocks the deleted minutes freed)."""
    from tailwatch.store.connection import connect
    from tailwatch.streams.rollup import RollUp

    work = Path(tempfile.mkdtemp(prefix="tailwatch-rollup-"))
    try:
        copy = work / "rolled.duckdb"
        shutil.copyfile(store_path, copy)
        con = connect(copy)
        rollup, hours = RollUp(retention_days * 1440), 0
        say(f"rolling {store_path} up to {retention_days} days of minutes")
        wall, cpu = time.perf_counter(), time.process_time()
        while True:
            con.execute("BEGIN TRANSACTION")
            step = rollup.roll(con)
            con.execute("COMMIT")
            hours += step
            if not step:
                break
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                  for t in ("sli_minute", "sli_hour", "gpu_minute", "gpu_hour", "slo_status")}
        con.close()
        sizes = []
        for name, path in (("before", Path(store_path)), ("after", copy)):
            say(f"compacting the store {name} the roll-up")
            folder, compact = work / f"snap-{name}", work / f"compact-{name}.duckdb"
            snapshot.write(path, folder)
            snapshot.restore(folder, compact)
            sizes.append(_size(compact) / 2**20)
        return [
            f"roll-up bench: {store_path}, minutes kept {retention_days} days",
            f"  rolled {hours:,} hours in {wall:.1f} s ({cpu:.1f} CPU-s, {cpu / max(hours, 1):.2f} CPU-s an hour)",
            "  rows after: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()),
            f"  store (compacted): {sizes[0]:,.0f} MiB before, {sizes[1]:,.0f} MiB after",
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fleet_month_store(path: Path, slices: int, days: int, every_minutes: int, say=lambda line: None) -> int:
    """A store holding `days` of `slices` busy slices (each with a request every `every_minutes`
    minutes, staggered, the labels of `tailwatch bench --month`), closed by the worker's own
    window operator and written by its checkpoint: what a replica of a fleet that size has
    after a month, without a month of broker log to replay. Only the minutes' rows (and the
    frontier) are written; the stages' own tables stay empty. Returns the rows written."""
    import polars as pl

    from tailwatch.store.checkpoint import Checkpoint, TopicCheckpoint, write_checkpoint
    from tailwatch.store.connection import connect
    from tailwatch.conventions import TOPIC_REQUESTS
    from tailwatch.streams.aggregates import REQUESTS
    from tailwatch.streams.frames import REQUEST_COLUMNS
    from tailwatch.streams.minute_windows import MINUTE_MS, MinuteWindows
    from tailwatch_dev.bench import T0_MS
    from tailwatch_dev.bench_month import (E2E_AFTER_FIRST_OUTPUT_MS, ERROR_RATE, FIRST_OUTPUT_LOGNORMAL, FIXED_FIELDS,
                                   slice_labels)

    labels = pl.DataFrame([slice_labels(i) for i in range(slices)])
    columns = {c: t for c, t in REQUEST_COLUMNS.items() if c != "stages"}
    topic = KafkaSettings().topic(TOPIC_REQUESTS)
    rng = np.random.default_rng(1)
    con = connect(path)
    # The month ends where the other benches' event time begins: in the past whenever this runs
    # (a start forgets event time ahead of the wall clock: nothing accepted can stand on it).
    first_minute = T0_MS // MINUTE_MS - days * 1440
    written = 0
    for day in range(days):
        minutes = range(first_minute + day * 1440, first_minute + (day + 1) * 1440)
        busy = [np.arange(m % every_minutes, slices, every_minutes) for m in minutes]
        minute = np.repeat(np.asarray(minutes, dtype=np.int64), [len(b) for b in busy])
        which = np.concatenate(busy)
        n = len(which)
        ts = minute * MINUTE_MS + rng.integers(0, MINUTE_MS, n)
        order = np.argsort(ts, kind="stable")  # in event-time order, as one partition delivers them
        ts, which = ts[order], which[order]
        first_output = rng.lognormal(*FIRST_OUTPUT_LOGNORMAL, n)
        events = labels[which].with_columns(
            pl.Series("event_id", [f"f{day}-{k:x}" for k in range(n)]),
            pl.Series("status", np.where(rng.random(n) < ERROR_RATE, "error", "ok")),
            pl.Series("first_output_ms", first_output), pl.Series("e2e_ms", first_output + E2E_AFTER_FIRST_OUTPUT_MS),
            *[pl.lit(v, columns[k]).alias(k) for k, v in FIXED_FIELDS.items()],
        )
        events = events.with_columns(*[pl.lit(None, t).alias(c) for c, t in columns.items() if c not in events.columns])
        events = events.select(*[pl.col(c).cast(t) for c, t in columns.items()]).with_columns(
            pl.Series("ts_ms", ts), pl.lit(0, pl.Int32).alias("_partition"),
            pl.Series("_offset", np.arange(written, written + n)), pl.Series("_index", np.arange(n)))
        windows = MinuteWindows(REQUESTS, 0)
        windows.add(events)
        rows, closed = windows.close(None)
        cp = Checkpoint(topics=[TopicCheckpoint(
            topic=topic, table="sli_minute", closed=rows, closed_minutes=closed, counts=[], hist=[], seen=[],
            watermarks={0: int(ts.max())}, closed_before_minute=minutes[-1] + 1)], next_offsets={})
        write_checkpoint(con, cp)
        written += rows.height
        say(f"  day {day + 1}/{days}: {written:,} sli_minute rows")
    con.close()
    return written


# Minutes of a busy fleet's rows written by one statement (100,000 slices: a million rows).
BUSY_STEP_ROWS = 1_000_000


def busy_fleet_store(path: Path, slices: int, hours: int, say=lambda line: None) -> int:
    """A store holding `hours` of `slices` slices busy every minute (the labels of `tailwatch
    bench --month`; a request each minute, 0.2% of them errors, first outputs spread over
    bins around 330 ms), written straight into `sli_minute` by DuckDB: the window operator
    closes a million events a minute here far too slowly for a fleet of 100,000 slices, and
    a start reads rows, however they were made. The frontier is set past the newest minute,
    as a checkpoint would leave it. Returns the rows written."""
    from tailwatch.store.connection import connect
    from tailwatch.conventions import TOPIC_REQUESTS
    from tailwatch.streams.minute_windows import MINUTE_MS
    from tailwatch_dev.bench import T0_MS
    from tailwatch_dev.bench_month import WORKLOADS

    first_minute, minutes = T0_MS // MINUTE_MS - hours * 60, hours * 60
    step = max(1, BUSY_STEP_ROWS // slices)
    workload = "[" + ", ".join(f"'{w}'" for w in WORKLOADS) + f"][i % {len(WORKLOADS)} + 1]"
    con = connect(path)
    for at in range(0, minutes, step):
        con.execute(f"""
            INSERT INTO sli_minute BY NAME
            SELECT make_timestamp((m + {first_minute})::BIGINT * 60000000) AS window_start,
                   'tenant-' || lpad((i % 97)::VARCHAR, 3, '0') AS tenant, 'model-' || (i % 13) AS model,
                   'v' || (i % 7) AS model_version, 'zone-' || (i % 3) AS zone, {workload} AS workload,
                   CASE WHEN i % 5 = 0 THEN 'batch' ELSE 'realtime' END AS traffic_class,
                   'stable' AS deployment, {workload} || '-pool-' || (i % 29) AS pool,
                   1::BIGINT AS requests, 1 - e AS ok, e AS errors, 0::BIGINT AS timeouts, 0::BIGINT AS shed,
                   0::BIGINT AS cancelled, 0::BIGINT AS retries, 1::BIGINT AS turns, 1 - e AS successful_turns,
                   256::BIGINT AS prompt_tokens, 120::BIGINT AS output_tokens, 0.2 AS gpu_seconds,
                   [{{'bin': b, 'n': 1}}]::STRUCT(bin SMALLINT, n BIGINT)[] AS first_output_ms_hist,
                   [{{'bin': b + 34, 'n': 1}}]::STRUCT(bin SMALLINT, n BIGINT)[] AS e2e_ms_hist
            FROM (SELECT m, i, (hash(m, i) % 500 = 0)::BIGINT AS e, 139 + (hash(i, m) % 21)::INTEGER AS b
                  FROM range({at}, {min(at + step, minutes)}) r(m), range({slices}) s(i))""")
        say(f"  minute {min(at + step, minutes):,}/{minutes:,}")
    con.execute("INSERT INTO _tw_frontier VALUES (?, ?) ON CONFLICT (topic) DO UPDATE SET closed_before_minute = "
                "excluded.closed_before_minute", [KafkaSettings().topic(TOPIC_REQUESTS), first_minute + minutes])
    (written,) = con.execute("SELECT count(*) FROM sli_minute").fetchone()
    con.close()
    return int(written)
