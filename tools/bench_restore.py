"""`tailwatch bench --restore STORE`: how long a new replica takes to be ready from another's
snapshot.

Three steps, each timed: `tailwatch store snapshot` of STORE (Parquet and offsets), the
restore into a new store file (`worker --restore-from`), and the worker's start on it: the
open minutes put back and every default stage rebuilt from the store (SLO windows over the
longest SLO period, detectors, fleet metrics, the signal view), which is what the worker does
before it reads its first record. What is left is catching up from Kafka: the records
published since the snapshot, at the worker's throughput (`tailwatch bench`).
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from pathlib import Path

from ingest.kafka import KafkaSettings
from slo.spec import DEFAULT_SLOS, load_slos
from store import snapshot
from streams.runtime import WorkerSettings
from streams.stages import default_stages
from streams.tiers import build


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def run(store_path: str, say=lambda line: None) -> list[str]:
    source = Path(store_path)
    work = Path(tempfile.mkdtemp(prefix="tailwatch-restore-"))
    try:
        folder, restored = work / "snapshot", work / "replica.duckdb"
        say(f"snapshot of {source} ({_size(source) / 2**20:,.0f} MiB)")
        began = time.perf_counter()
        manifest = snapshot.write(source, folder)
        snap_s = time.perf_counter() - began
        say(f"restore into {restored}")
        began = time.perf_counter()
        snapshot.restore(folder, restored)
        restore_s = time.perf_counter() - began
        say("worker start: open minutes and every stage rebuilt from the store")
        # No broker: the start is timed up to the first read (the topic sink's client stays quiet).
        quiet = KafkaSettings(bootstrap_servers="127.0.0.1:1", client_config={"log_level": "0"})
        w = build(WorkerSettings(kafka=quiet, store_path=str(restored), slos=load_slos(DEFAULT_SLOS),
                                 stages=default_stages(), http_port=0))
        began = time.perf_counter()
        w.store.open(lambda con: w.operator.start(w.source, con))
        rebuild_s = time.perf_counter() - began
        w.store.close()
        w.topics.close()
        rows = manifest.rows
        return [
            f"restore bench: {source} ({_size(source) / 2**20:,.0f} MiB; {rows.get('sli_minute', 0):,} sli_minute rows, "
            f"{rows.get('gpu_minute', 0):,} gpu_minute rows, newest minute {manifest.newest_minute})",
            f"  snapshot (Parquet, zstd):      {snap_s:8.1f} s, {_size(folder) / 2**20:,.0f} MiB",
            f"  restore into a new store:      {restore_s:8.1f} s, {_size(restored) / 2**20:,.0f} MiB",
            f"  worker start on it (rebuild):  {rebuild_s:8.1f} s",
            f"  ready before catch-up:         {snap_s + restore_s + rebuild_s:8.1f} s "
            f"(peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB)",
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_rollup(store_path: str, retention_days: int, say=lambda line: None) -> list[str]:
    """`tailwatch bench --rollup STORE`: a copy of STORE rolled up to `retention_days` of minutes,
    checkpoint-sized step by step as a worker would; the time it took and the store's size
    before and after (each compacted by a snapshot and restore, which is what a file's
    size says once DuckDB reuses the blocks the deleted minutes freed)."""
    import store
    from streams.rollup import RollUp

    work = Path(tempfile.mkdtemp(prefix="tailwatch-rollup-"))
    try:
        copy = work / "rolled.duckdb"
        shutil.copyfile(store_path, copy)
        con = store.connect(copy)
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
