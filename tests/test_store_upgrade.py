"""Upgrades keep the store: a store written by an earlier release opens with this one, is
migrated to the current schema version in one transaction, keeps every row, and restores the
worker and its stages; a store from a newer release is refused in one line."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import duckdb
import pytest

from tailwatch.store.connection import StoreError, connect
from tailwatch.store.queries import has_table
from tailwatch.store.schema import SCHEMA_VERSION, schema_version
from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.tiers import WorkerSettings, build
from tailwatch.streams.stages import default_stages
from tailwatch.streams.store_sink import StoreSink
from tailwatch.streams.topic_sink import TopicSink

FIXTURES = Path(__file__).parent / "data" / "stores"
TABLES = ("sli_minute", "gpu_minute", "slo_status", "alerts", "_tw_offsets", "_tw_alert_outbox")


def _unpack(name: str, tmp_path: Path) -> Path:
    path = tmp_path / name.removesuffix(".gz")
    with gzip.open(FIXTURES / name, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def _counts(path: Path) -> dict[str, int]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        con.close()


# Each release that changes the schema keeps a store written by the release before it.
@pytest.mark.parametrize("fixture, version", [("schema-1.duckdb.gz", 1), ("schema-2.duckdb.gz", 2),
                                              ("schema-3.duckdb.gz", 3), ("schema-4.duckdb.gz", 4),
                                              ("schema-5.duckdb.gz", 5)])
@pytest.mark.slow
def test_a_store_of_an_earlier_release_is_migrated_and_restores_the_worker(tmp_path, fixture, version):
    path = _unpack(fixture, tmp_path)
    before = _counts(path)
    assert before["sli_minute"] > 1000 and before["slo_status"] > 0 and before["alerts"] > 0
    con = duckdb.connect(str(path), read_only=True)
    assert schema_version(con) == version
    assert (version >= 3) == has_table(con, "sli_hour")
    con.close()

    con = connect(path)  # a writer: migrates
    assert schema_version(con) == SCHEMA_VERSION
    assert has_table(con, "sli_hour") and has_table(con, "rolled_minute")
    # Rows from before language and voice slices are the slices without them; their quality counts are 0.
    if version < 4:
        assert con.execute("SELECT count(*) FROM sli_minute WHERE language != '' OR voice != '' "
                           "OR underrun_reported != 0 OR rejected_quota != 0").fetchall()[0][0] == 0
    # Rows from before evaluations have none.
    assert con.execute("SELECT count(*), sum(evals + word_errors + reference_words + mos_samples) FROM sli_minute "
                       "WHERE evals != 0 OR reference_words != 0").fetchall()[0] == (0, None)
    con.close()
    assert _counts(path) == before

    # Everything a worker rebuilds at start reads the migrated store: the open minutes and
    # offsets, the SLO windows and firing alerts, the detectors, the signal view.
    worker = build(WorkerSettings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix="fx."),
                                  store_path=str(path), slos=load_slos(DEFAULT_SLOS), stages=default_stages(),
                                  http_port=0))
    worker.restore()
    try:
        slo = next(s for s in worker.sink(StoreSink).stages if s.name == "slo")
        assert slo.states() and any(st.sums(60)[1] for st in slo.states())
        assert worker.source.next_offsets and sum(worker.source.next_offsets.values()) > 0
        view = worker.signals.snapshot(*worker.operator.open_minutes(), wall_s=0.0)
        assert view.pools and view.slos
    finally:
        worker.sink(StoreSink).close()
        worker.sink(TopicSink).close()


def test_a_store_from_a_newer_release_is_refused_in_one_line(tmp_path):
    path = tmp_path / "newer.duckdb"
    connect(path).close()
    con = duckdb.connect(str(path))
    con.execute("UPDATE _tw_schema SET version = ?", [SCHEMA_VERSION + 1])
    con.close()
    for read_only in (False, True):
        with pytest.raises(StoreError) as err:
            connect(path, read_only=read_only)
        message = str(err.value)
        assert "\n" not in message and "newer tailwatch" in message and str(path) in message
    assert _counts_schema(path) == SCHEMA_VERSION + 1  # refused, not rewritten


def _counts_schema(path: Path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return schema_version(con)
    finally:
        con.close()
