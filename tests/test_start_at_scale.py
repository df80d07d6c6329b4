"""A worker starts on a store of any size: the SLO windows are rebuilt from the store's
minutes in pieces of bounded rows (whole minutes, or shares of one minute that alone holds
more), never all at once and never by cutting a piece again and again (real DuckDB file,
real broker, the worker's own process and HTTP port)."""

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import duckdb
import pytest

from tailwatch.store.connection import connect
from tailwatch.store.queries import bucket_runs, minute_runs, recent_bucket_chunks
from tailwatch_dev.broker import free_port

MINUTE = 29_400_000  # 2025-11-24 00:00 UTC, in epoch minutes: past, whenever the test runs
BIG_MINUTE_SLICES = 250_000  # one minute over the rows a rebuild reads at once (store.queries.BUCKET_CHUNK_ROWS)


def test_pieces_are_runs_of_whole_minutes_and_shares_of_a_minute_over_the_limit():
    from tailwatch.store.queries import BucketPiece, bucket_pieces

    counts = [(0, 40), (1, 50), (2, 30), (3, 250), (4, 10), (5, 100), (6, 101)]
    assert bucket_pieces(counts, 100) == [
        BucketPiece(0, 2),  # 90 rows: one more minute would pass 100
        BucketPiece(2, 3),
        BucketPiece(3, 4, 0, 3), BucketPiece(3, 4, 1, 3), BucketPiece(3, 4, 2, 3),  # 250 rows: three shares
        BucketPiece(4, 5),
        BucketPiece(5, 6),  # exactly the limit: whole
        BucketPiece(6, 7, 0, 2), BucketPiece(6, 7, 1, 2),
    ]
    assert bucket_pieces([], 100) == []


def test_a_minute_read_in_shares_gives_every_row_once(tmp_path):
    con = connect(tmp_path / "s.duckdb")
    _fill(con, slices=2_500, minute=MINUTE)
    _fill(con, slices=700, minute=MINUTE + 1)
    frames = list(recent_bucket_chunks(con, 60, max_rows=1_000))
    con.close()
    assert [f.height for f in frames] == [834, 833, 833, 700]  # 2,500 rows in three shares, then a whole minute
    tenants = [t for f in frames[:3] for t in f["tenant"].to_list()]
    assert sorted(tenants) == sorted(f"t{i}" for i in range(2_500))


def _fill(con, slices: int, minute: int, error_every: int = 0) -> None:
    """`slices` rows of one minute of realtime ASR traffic, a request each (every
    `error_every`-th of each of its six slices an error), over three zones and two model versions."""
    errors = f"((i // 6) % {error_every} = 0)::BIGINT" if error_every else "0"
    con.execute(f"""
        INSERT INTO sli_minute BY NAME
        SELECT make_timestamp({minute}::BIGINT * 60000000) AS window_start, 't' || i AS tenant, 'm' AS model,
               'v' || (i % 2) AS model_version, 'zone-' || (i % 3) AS zone, 'asr' AS workload,
               'realtime' AS traffic_class, 'stable' AS deployment, 'asr-pool' AS pool,
               1::BIGINT AS requests, 1 - {errors} AS ok, {errors} AS errors, 0::BIGINT AS timeouts,
               0::BIGINT AS shed, 0::BIGINT AS cancelled, 0::BIGINT AS retries,
               [{{'bin': 40, 'n': 1}}]::STRUCT(bin SMALLINT, n BIGINT)[] AS first_output_ms_hist,
               [{{'bin': 45, 'n': 1}}]::STRUCT(bin SMALLINT, n BIGINT)[] AS e2e_ms_hist
        FROM range({slices}) t(i)""")


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_worker_starts_on_a_store_whose_minute_holds_more_rows_than_a_rebuild_reads_at_once(kafka, tmp_path):
    path = tmp_path / "big.duckdb"
    con = connect(path)
    _fill(con, BIG_MINUTE_SLICES, MINUTE, error_every=2_000)
    _fill(con, 3_000, MINUTE + 1, error_every=1_000)
    # The exact 30-day budget of each slice of the availability SLO (objective 99.9%).
    exact = {(zone, version): 1 - bad / (valid * 0.001) for zone, version, valid, bad in con.execute(
        "SELECT zone, model_version, sum(requests), sum(errors) FROM sli_minute GROUP BY ALL").fetchall()}
    con.close()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
         "--topic-prefix", kafka.topic_prefix, "--store", str(path), "--http-port", str(port),
         "--group", f"g-{uuid.uuid4().hex[:6]}", "--detectors", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline, ready = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = _get(port, "/readyz")
                if ready[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.3)
        if proc.poll() is not None or ready is None or ready[0] != 200:
            proc.kill()
            pytest.fail(f"the worker did not become ready ({ready}): {proc.communicate()[1].decode()[-1500:]}")
        status, metrics = _get(port, "/metrics")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    assert status == 200
    budgets = _budgets(metrics, "asr-realtime-availability")
    assert set(budgets) == set(exact) and len(exact) == 6
    for key, value in exact.items():
        assert budgets[key] == pytest.approx(value, abs=1e-9), key
    assert all(0.3 < v < 0.7 for v in exact.values())  # one error in 2,000: half the budget spent


def _budgets(metrics: str, slo: str) -> dict[tuple[str, str], float]:
    """(zone, model_version) → the SLO's error budget left, from a Prometheus exposition."""
    out = {}
    for line in metrics.splitlines():
        if not line.startswith("tailwatch_slo_error_budget_remaining_ratio{"):
            continue
        labels, value = line.rsplit(" ", 1)
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if named.get("slo") == slo:
            out[(named["zone"], named["model_version"])] = float(value)
    return out


def test_the_restore_bench_writes_a_busy_fleets_hours_one_row_per_slice_and_minute(tmp_path):
    """`tailwatch bench --restore-fleet --hours`: every slice in every minute, the frontier past the newest."""
    from tailwatch_dev.bench_restore import busy_fleet_store

    path = tmp_path / "busy.duckdb"
    assert busy_fleet_store(path, slices=300, hours=2) == 300 * 120
    con = duckdb.connect(str(path), read_only=True)
    try:
        per_minute = con.execute("SELECT min(n), max(n), count(*) FROM (SELECT window_start, count(DISTINCT (tenant, "
                                 "model, model_version, zone, workload, traffic_class, pool)) AS n FROM sli_minute "
                                 "GROUP BY ALL)").fetchone()
        requests, errors = con.execute("SELECT sum(requests), sum(errors) FROM sli_minute").fetchone()
        (frontier,) = con.execute("SELECT closed_before_minute FROM _tw_frontier").fetchone()
        (newest,) = con.execute("SELECT epoch(max(window_start)) // 60 FROM sli_minute").fetchone()
    finally:
        con.close()
    assert per_minute == (300, 300, 120)
    assert requests == 36_000 and 0 < errors < 36_000 * 0.01  # about 0.2% errors
    assert frontier == newest + 1


@pytest.mark.slow
def test_detectors_rebuilt_in_runs_of_minutes_hold_what_one_read_of_the_history_holds(tmp_path, monkeypatch):
    """The detectors' start reads their history in runs of whole minutes (a big fleet's hours
    at once took gigabytes): a run a minute gives the state of one run for everything, seen
    in the next minute's detections."""
    import functools

    import polars as pl

    from tailwatch.streams.detector_stage import DetectorStage
    from tests.test_detectors import GPU_SCHEMA, REQ_SCHEMA, T0, gpu_row, req_rows

    con = _bucket_store(tmp_path / "d.duckdb", [
        req_rows(T0 + i, tenant=t, requests=100, ok=100 - 30 * (i >= 25), retries=50 * (i >= 25), turns=100,
                 successful_turns=90, output_tokens=5_000, gpu_seconds=20.0)
        for i in range(30) for t in ("acme", "globex")], [gpu_row(T0 + i) for i in range(30)])

    def started(runs):
        with monkeypatch.context() as m:
            m.setattr("tailwatch.streams.detector_stage.bucket_runs", runs)
            stage = DetectorStage()
            stage.rebuild(con)
        out = stage.on_closed(pl.DataFrame([req_rows(T0 + 30, tenant="acme", requests=100, ok=70, retries=50)],
                                           schema_overrides=REQ_SCHEMA),
                              pl.DataFrame([gpu_row(T0 + 30)], schema_overrides=GPU_SCHEMA))
        return (out["detection_events"].to_dicts(), stage.processed_before, stage.max_request_minute,
                stage.max_gpu_minute)

    whole = started(bucket_runs)
    assert len(minute_runs(con, T0, max_rows=1)) == 30
    by_minute = started(functools.partial(bucket_runs, max_rows=1))
    con.close()
    assert by_minute == whole
    assert whole[1] == T0 + 31 and any(e["detector"] == "retry_storm" for e in whole[0])


@pytest.mark.slow
def test_the_signal_view_rebuilt_in_runs_of_minutes_answers_as_one_read_does(tmp_path, monkeypatch):
    """The signal view's start reads its 30 minutes in runs of whole minutes (at 100,000 busy
    slices one read held 7 GiB): a run a minute gives the same answers and measured capacity."""
    import functools

    import polars as pl

    from tailwatch.planning.prices import GpuPrices
    from tailwatch.signals.live import LiveSignals, SignalPolicy
    from tailwatch.streams.signal_stage import SignalStage
    from tests.test_detectors import T0, gpu_row, req_rows

    con = _bucket_store(tmp_path / "v.duckdb", [
        req_rows(T0 + i, tenant=t, requests=100, ok=99, turns=100, successful_turns=99, output_tokens=5_000,
                 gpu_seconds=20.0)
        for i in range(40) for t in ("acme", "globex")], [gpu_row(T0 + i) for i in range(40)])

    def answers(runs):
        with monkeypatch.context() as m:
            m.setattr("tailwatch.streams.signal_stage.bucket_runs", runs)
            stage = SignalStage(LiveSignals(SignalPolicy(), [], GpuPrices()))
            stage.rebuild(con)
        snap = stage.snapshot(pl.DataFrame(), pl.DataFrame(), wall_s=0.0)
        return snap.as_of_minute, sorted(snap.pools), stage.live.capacity_observed_through, \
            stage.live.recent.requests.newest_minute()

    reads: list[int] = []

    def counted(con, since, *args, **kwargs):
        for run in bucket_runs(con, since, *args, **kwargs):
            reads.append(run[2].height)
            yield run

    whole = answers(counted)
    assert len(reads) == 1 and reads[0] == 62  # the newest minute and the 30 before it, two slices each
    by_minute = answers(functools.partial(bucket_runs, max_rows=2))
    con.close()
    assert by_minute == whole and whole[0] == T0 + 39


def _bucket_store(path, request_rows: list[dict], gpu_rows: list[dict]):
    """A store holding these closed request and GPU minute rows (tests.test_detectors' shapes)."""
    import polars as pl

    from tests.test_detectors import GPU_SCHEMA, REQ_SCHEMA

    con = connect(path)
    con.register("_r", pl.DataFrame(request_rows, schema_overrides=REQ_SCHEMA).to_arrow())
    con.register("_g", pl.DataFrame(gpu_rows, schema_overrides=GPU_SCHEMA).to_arrow())
    con.execute("INSERT INTO sli_minute BY NAME SELECT * FROM _r")
    con.execute("INSERT INTO gpu_minute BY NAME SELECT * FROM _g")
    return con
