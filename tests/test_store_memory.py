"""The store's DuckDB memory limit: a checkpoint that needs more runs again with it doubled,
at most to four times where it started; past that, one line that names the way out."""

import duckdb
import pytest

from tailwatch.store.checkpoint import Checkpoint, write_checkpoint
from tailwatch.store.connection import StoreError, StoreSession, store_failure

# A query DuckDB cannot spill: one list of a million BIGINTs, built in a buffer that doubles
# (measured: out of memory at 8 and 16 MiB, fine at 32).
NEEDS_32_MIB = "SELECT len(list(i)) FROM range(1000000) t(i)"


def test_a_checkpoint_that_runs_out_of_the_limit_runs_again_with_it_doubled(tmp_path):
    path = tmp_path / "s.duckdb"
    limits: list[int] = []
    session = StoreSession(path, memory_limit_mib=16, on_memory_limit=limits.append)
    with session as con:
        con.execute("CREATE TABLE upkeep_done (attempt INTEGER)")
    attempts = []

    def upkeep(con):
        attempts.append(len(attempts) + 1)
        con.execute("INSERT INTO upkeep_done VALUES (?)", [attempts[-1]])
        assert con.execute(NEEDS_32_MIB).fetchone() == (1_000_000,)

    cp = Checkpoint(topics=[], next_offsets={("tw.requests", 0): 42}, upkeep=[upkeep])
    session.run(lambda con: write_checkpoint(con, cp))
    assert limits == [16, 32] and attempts == [1, 2]
    with session as con:
        # The failed attempt left nothing: its transaction was rolled back whole.
        assert con.execute("SELECT attempt FROM upkeep_done").fetchall() == [(2,)]
        assert con.execute("SELECT next_offset FROM _tw_offsets WHERE topic = 'tw.requests'").fetchall() == [(42,)]
        assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "32.0 MiB"
    session.close()
    # The raised limit outlives the connection: the file is let go and taken again with it.
    with session as con:
        assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "32.0 MiB"
    session.close()


def test_past_four_times_the_limit_the_worker_stops_with_one_line_naming_the_flag(tmp_path):
    path = tmp_path / "s.duckdb"
    limits: list[int] = []
    session = StoreSession(path, memory_limit_mib=4, on_memory_limit=limits.append)
    with pytest.raises(duckdb.OutOfMemoryException) as caught:
        session.run(lambda con: con.execute(NEEDS_32_MIB).fetchone())
    assert limits == [4, 8, 16] and session.memory_limit_mib == session.max_memory_limit_mib == 16
    said = str(store_failure(path, caught.value))
    assert "\n" not in said and "--store-memory-limit" in said and str(path) in said, said
    session.close()


def test_reads_run_again_too_and_other_errors_do_not(tmp_path):
    session = StoreSession(tmp_path / "s.duckdb", memory_limit_mib=16)
    assert session.run(lambda con: con.execute(NEEDS_32_MIB).fetchone()) == (1_000_000,)
    assert session.memory_limit_mib == 32
    calls = []

    def broken(con):
        calls.append(1)
        con.execute("SELECT * FROM no_such_table")

    with pytest.raises(duckdb.CatalogException):
        session.run(broken)
    assert calls == [1] and session.memory_limit_mib == 32
    session.close()


def test_start_up_reads_at_the_ceiling_then_the_limit_comes_back(tmp_path):
    # A restart's restore and rebuild fill Python state as they read, so they are not run
    # twice: they get the ceiling at once, and checkpoints start from the flag again.
    limits: list[int] = []
    session = StoreSession(tmp_path / "s.duckdb", memory_limit_mib=16, on_memory_limit=limits.append)
    rebuilt = []

    def rebuild(con):
        rebuilt.append(con.execute(NEEDS_32_MIB).fetchone()[0])
        return "restored"

    assert session.start(rebuild) == "restored" and rebuilt == [1_000_000]
    assert limits == [16, 64, 16] and session.memory_limit_mib == 16
    with session as con:
        assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == "16.0 MiB"
    session.close()


def test_a_start_up_past_the_ceiling_is_one_line_naming_the_flag(tmp_path):
    from tailwatch.streams.metrics import CpuAccount, WorkerMetrics
    from tailwatch.streams.store_sink import StoreSettings, StoreSink

    class Hungry:
        """A stage whose rebuild needs 32 MiB."""
        name, alerts = "hungry", None

        def rebuild(self, con):
            con.execute(NEEDS_32_MIB).fetchone()

    path = tmp_path / "s.duckdb"
    sink = StoreSink(StoreSettings(str(path), memory_limit_mib=4), stages=[Hungry()], cpu=CpuAccount(WorkerMetrics()))
    with pytest.raises(StoreError) as caught:
        sink.open()
    said = str(caught.value)
    assert "\n" not in said and "--store-memory-limit" in said and str(path) in said, said
    # The file was let go: the next start (with a larger limit) takes it.
    sink = StoreSink(StoreSettings(str(path), memory_limit_mib=16), stages=[Hungry()], cpu=CpuAccount(WorkerMetrics()))
    sink.open()
    sink.close()
