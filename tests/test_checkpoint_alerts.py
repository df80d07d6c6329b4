"""A checkpoint's alert changes land as if applied one by one, in order (a fire inserts an
open row, a resolve closes every open row of its fingerprint), though written with a
statement per kind: randomized changes, with fingerprints that fire and resolve several
times in one checkpoint and rows left open by earlier ones. Real DuckDB files."""

import random
from datetime import datetime, timedelta

import polars as pl
import pytest

from tailwatch.store.checkpoint import ALERT_CHANGE_SCHEMA, Checkpoint, write_checkpoint
from tailwatch.store.connection import connect

ROWS = ("SELECT fingerprint, alertname, severity, slo, alert_window, labels, fired_at, resolved_at, long_burn_rate, "
        "short_burn_rate, error_budget_remaining, detail FROM alerts")
T0 = datetime(2026, 3, 1)


def changes(rng: random.Random, fingerprints: list[str], n: int, start: int) -> pl.DataFrame:
    rows = []
    for i in range(n):
        fp = rng.choice(fingerprints)
        rows.append({"state": rng.choice(["firing", "firing", "resolved"]), "fingerprint": fp, "alertname": "SLOBurn",
                     "severity": rng.choice(["page", "ticket"]), "slo": "availability", "alert_window": "1h",
                     "labels": f'{{"tenant": "{fp}"}}', "at": T0 + timedelta(minutes=start + i),
                     "long_burn_rate": rng.uniform(0, 20), "short_burn_rate": rng.uniform(0, 20),
                     "error_budget_remaining": rng.uniform(-1, 1), "detail": f"change {start + i}"})
    return pl.DataFrame(rows, schema=ALERT_CHANGE_SCHEMA)


def one_by_one(con, batch: pl.DataFrame) -> None:
    """The meaning of the changes: each applied alone, in order."""
    for c in batch.iter_rows(named=True):
        if c["state"] == "firing":
            con.execute("INSERT INTO alerts (fingerprint, alertname, severity, slo, alert_window, labels, fired_at, "
                        "long_burn_rate, short_burn_rate, error_budget_remaining, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [c["fingerprint"], c["alertname"], c["severity"], c["slo"], c["alert_window"], c["labels"], c["at"],
                         c["long_burn_rate"], c["short_burn_rate"], c["error_budget_remaining"], c["detail"]])
        else:
            con.execute("UPDATE alerts SET resolved_at = ? WHERE fingerprint = ? AND resolved_at IS NULL",
                        [c["at"], c["fingerprint"]])


@pytest.mark.parametrize("seed,fingerprints,per_checkpoint", [(0, 1, 1), (1, 3, 2), (2, 3, 12), (3, 40, 30),
                                                              (4, 200, 60), (5, 2, 40)])
def test_alert_changes_land_as_applied_one_by_one(tmp_path, seed, fingerprints, per_checkpoint):
    rng = random.Random(seed)
    fps = [f"fp{i}" for i in range(fingerprints)]
    written, expected = connect(tmp_path / "written.duckdb"), connect(tmp_path / "expected.duckdb")
    try:
        start = 0
        for _ in range(6):
            batch = changes(rng, fps, rng.randrange(1, per_checkpoint + 1), start)
            start += batch.height
            write_checkpoint(written, Checkpoint(topics=[], next_offsets={}, stage_rows=[("alerts", batch)]))
            one_by_one(expected, batch)
        got, want = written.execute(ROWS).fetchall(), expected.execute(ROWS).fetchall()
        assert len(got) == len(want) > 0
        assert got == want  # in insertion order too
    finally:
        written.close()
        expected.close()


def test_a_fingerprint_fired_resolved_and_fired_again_in_one_checkpoint(tmp_path):
    con = connect(tmp_path / "store.duckdb")
    try:
        rng = random.Random(9)
        batch = changes(rng, ["a"], 3, 0).with_columns(pl.Series("state", ["firing", "resolved", "firing"]))
        write_checkpoint(con, Checkpoint(topics=[], next_offsets={}, stage_rows=[("alerts", batch)]))
        rows = con.execute("SELECT fired_at, resolved_at FROM alerts ORDER BY fired_at").fetchall()
        assert rows == [(T0, T0 + timedelta(minutes=1)), (T0 + timedelta(minutes=2), None)]
    finally:
        con.close()
