"""A replica joins from another's snapshot: Parquet plus offsets, restored into a new store,
then caught up from Kafka to the same rows as the replica it came from (real broker, real
DuckDB files, the CLI)."""

import json
import subprocess
import sys

import duckdb
import pytest

from tailwatch.store.schema import SCHEMA_VERSION
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.slo.spec import load_slos
from tailwatch.store import snapshot
from tests.test_late_backlog import DEFAULT_SLOS
from tests.test_pipeline import publish, run_worker

ORDER = "window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool, language, voice"


def rows(path, table="sli_minute", order=ORDER):
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_a_replica_restored_from_a_snapshot_catches_up_to_the_same_rows(kafka, tmp_path):
    events = list(FleetSimulator("mixed-fleet", minutes=30, seed=5, rate_scale=0.3).events())
    first = [e for e in events if e.ts < events[0].ts + 15 * 60_000]
    publish(kafka, first)
    a = tmp_path / "a.duckdb"
    slos = load_slos(DEFAULT_SLOS)
    run_worker(kafka, a, slos=slos)
    folder = tmp_path / "snap"
    out = subprocess.run([sys.executable, "-m", "tailwatch", "store", "snapshot", str(folder), "--store", str(a)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    manifest = json.loads((folder / "snapshot.json").read_text())
    con = duckdb.connect(str(a), read_only=True)
    assert manifest["offsets"] == {t: {str(p): o for tp, p, o in con.execute(
        "SELECT topic, part, next_offset FROM _tw_offsets WHERE next_offset IS NOT NULL").fetchall() if tp == t}
        for (t,) in con.execute("SELECT DISTINCT topic FROM _tw_offsets WHERE next_offset IS NOT NULL").fetchall()}
    assert manifest["rows"]["sli_minute"] == con.execute("SELECT count(*) FROM sli_minute").fetchone()[0] > 0
    con.close()

    # The fleet goes on; the original replica reads on, a new one starts from the snapshot.
    publish(kafka, [e for e in events if e not in first])
    later = len(events) - len(first)
    assert run_worker(kafka, a, slos=slos).events_seen == later
    b = tmp_path / "b.duckdb"
    assert snapshot.restore(folder, b).offsets == manifest["offsets"]
    assert run_worker(kafka, b, slos=slos).events_seen == later  # only what came after the snapshot
    assert rows(b) == rows(a)
    # The same from the command line, as a replica's manifest would run it.
    c = tmp_path / "c.duckdb"
    out = subprocess.run([sys.executable, "-m", "tailwatch", "worker", "--store", str(c), "--restore-from", str(folder),
                          "--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", kafka.topic_prefix,
                          "--group", "replica-c", "--http-port", "0", "--until-idle", "2"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert f"restored {c} from {folder}" in out.stderr
    assert rows(c) == rows(a)
    assert rows(b, "gpu_minute", "window_start, node, gpu_index") == rows(a, "gpu_minute", "window_start, node, gpu_index")
    assert rows(b, "slo_status", "window_start, slo, slice") == rows(a, "slo_status", "window_start, slo, slice")


def test_a_store_that_holds_data_is_not_overwritten_by_a_restore(kafka, tmp_path):
    publish(kafka, list(FleetSimulator("mixed-fleet", minutes=5, seed=6, rate_scale=0.2).events()))
    a = tmp_path / "a.duckdb"
    run_worker(kafka, a)
    folder = tmp_path / "snap"
    snapshot.write(a, folder)
    before = rows(a)
    assert snapshot.restore(folder, a) is None
    assert rows(a) == before
    with pytest.raises(snapshot.SnapshotError, match="not an empty folder"):
        snapshot.write(a, folder)


def test_a_snapshot_from_a_newer_release_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "snapshot.json").write_text(json.dumps({
        "schema_version": SCHEMA_VERSION + 1, "written_at": "2026-11-26T00:00:00Z", "newest_minute": None,
        "offsets": {}, "rows": {}}))
    with pytest.raises(snapshot.SnapshotError, match="newer tailwatch"):
        snapshot.restore(folder, tmp_path / "new.duckdb")
    assert not (tmp_path / "new.duckdb").exists()
    with pytest.raises(snapshot.SnapshotError, match="not a tailwatch snapshot"):
        snapshot.restore(tmp_path, tmp_path / "other.duckdb")


@pytest.mark.slow
def test_the_restore_bench_builds_a_fleets_month_with_the_window_operator_and_times_a_start_on_it(tmp_path):
    """`tailwatch bench --restore-fleet`'s store: every slice's request of every hour closed
    into its own minute row, the frontier past the newest minute; the restore bench then
    snapshots, restores and starts a worker on it."""
    from tailwatch_dev.bench_restore import fleet_month_store, run

    path = tmp_path / "fleet.duckdb"
    assert fleet_month_store(path, slices=300, days=2, every_minutes=60) == 300 * 48
    con = duckdb.connect(str(path), read_only=True)
    try:
        per_slice = con.execute("SELECT count(*), min(n), max(n), sum(errors) FROM (SELECT tenant, model, model_version, "
                                "zone, workload, traffic_class, pool, count(*) AS n, sum(requests) AS requests, "
                                "sum(errors) AS errors FROM sli_minute GROUP BY ALL)").fetchone()
        minutes = con.execute("SELECT count(DISTINCT window_start), max(requests) FROM sli_minute").fetchone()
        (frontier,) = con.execute("SELECT closed_before_minute FROM _tw_frontier").fetchone()
        (newest,) = con.execute("SELECT epoch(max(window_start)) // 60 FROM sli_minute").fetchone()
    finally:
        con.close()
    assert per_slice[:3] == (300, 48, 48)  # each slice once an hour, each in a minute of its own
    assert minutes == (2 * 1440, 1)  # staggered: every minute closes with traffic
    assert frontier == newest + 1
    lines = run(str(path))
    assert "14,400 sli_minute rows" in lines[0] and "ready before catch-up" in lines[-1]
