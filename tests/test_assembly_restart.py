"""Tier 2 restarted from its store (streams/assembly.py) re-reads `tw.sli` from the oldest
record it held, with the frontiers it had read at its checkpoint already restored. Whatever
order the partitions are re-read in, it lands every minute once, whole, in order: the rows
of a replica that was never stopped. Topics in memory (streams/memory_source.py) put the
partitions in the adversarial order; the store is a real DuckDB file."""

from __future__ import annotations

import polars as pl
import pytest

from tailwatch.ingest.schema import RequestV1
from tailwatch.store.checkpoint import load_restored, write_checkpoint
from tailwatch.store.connection import connect
from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.assembly import AssemblySettings, MinuteAssembly
from tailwatch.streams.frames import REQUEST_COLUMNS
from tailwatch.streams.memory_source import MemorySource, MemoryTopics
from tailwatch.streams.metrics import CpuAccount, WorkerMetrics
from tailwatch.streams.topic_sink import TopicSink
from tailwatch.conventions import TOPIC_SLI
from tests.test_partials import SLI_PARTITIONS, azure_values, partitioned, same_rows, single_worker, tier1_records

SOURCE_PARTITIONS = len(SLI_PARTITIONS)  # memory topics have one partition count for all


def _published(memory: MemoryTopics) -> dict[int, list[bytes]]:
    """Twelve minutes of the Azure code trace, as one tier-1 worker owning every partition
    publishes them to tw.sli over six checkpoints; returns the source partitions' logs."""
    logs = partitioned(azure_values(minutes=12), SOURCE_PARTITIONS, keyed=False)
    records = tier1_records(REQUESTS, REQUEST_COLUMNS, RequestV1, logs, sorted(logs), memory.topic("requests"),
                            checkpoints=6)
    for q, value in records:
        memory.produce(memory.topic(TOPIC_SLI), value, partition=q)
    return logs


class Replica:
    """A tier-2 operator with its store, started as the runtime starts it (streams/runtime.py:
    restored, then reading from the stored offsets); what it landed is kept."""

    def __init__(self, memory: MemoryTopics, store):
        self.con = connect(store)
        metrics = WorkerMetrics()
        sink = TopicSink(memory.settings, metrics, stopping=lambda: False, producer=memory.producer)
        self.op = MinuteAssembly(AssemblySettings(kafka=memory.settings), metrics, CpuAccount(metrics), sink)
        self.op.follow({t: set(range(len(memory.logs[t]))) for t in [*self.op.sources, self.op.sli_topic]})
        state = load_restored(self.con, self.op.restore_scope())
        self.source = MemorySource(memory, self.op.topics, self.op.watched)
        self.source.next_offsets.update(state.offsets)
        self.op.restore(state)
        self.source.start(self.op)
        self.rows: list[pl.DataFrame] = []
        self.minutes: list[int] = []

    def read(self, partitions: set[int], records: int | None = None) -> None:
        """Read only these tw.sli partitions, all they hold or `records` of them."""
        sli = self.op.sli_topic
        self.source.pause(sli, set(SLI_PARTITIONS) - partitions)
        self.source.resume(sli, partitions)
        left = records
        while left is None or left > 0:
            batch = self.source.consume(50 if left is None else min(50, left), 0)
            if not batch:
                break
            for topic, records_read in batch.items():
                self.op.process(topic, records_read)
                left = None if left is None else left - len(records_read)

    def checkpoint(self) -> None:
        cp = self.op.checkpoint(self.source, close_all=False)
        if cp is None:
            return
        write_checkpoint(self.con, cp)
        self.op.committed(cp)
        for t in cp.topics:
            if t.table == "sli_minute" and t.closed.height:
                self.rows.append(t.closed)
                self.minutes += t.closed_minutes

    def close(self) -> None:
        self.con.close()


@pytest.mark.parametrize("restart", ["restored", "store-of-earlier-release", "killed-again-while-rereading"])
def test_a_replica_restarted_mid_stream_lands_each_minute_whole_whatever_order_it_rereads_tw_sli(
        new_memory, tmp_path, restart):
    memory = new_memory(SOURCE_PARTITIONS)
    logs = _published(memory)
    store = tmp_path / "replica.duckdb"

    # Before the kill: tw.sli partitions 1 and 2 read to their end, partition 0 a third of
    # its log. Its frontiers cut the minutes: the first ones land, the rest are held, with
    # frontiers of partitions 1 and 2 far ahead of the partials the replica still holds.
    before = Replica(memory, store)
    before.read({1, 2})
    before.read({0}, records=len(memory.logs[before.op.sli_topic][0]) // 3)
    before.checkpoint()
    assert before.minutes, "some minutes landed before the kill"
    held = before.op.assemblers[memory.topic("requests")].held
    assert {1, 2} <= {q for m in held for q, _o, _v in held[m]}  # partials the restart reads last
    before.close()  # killed: the store holds the last checkpoint
    if restart == "store-of-earlier-release":  # it stored no read positions: the log's end bounds them
        con = connect(store)
        con.execute("DELETE FROM _tw_read_offsets")
        con.close()

    # After: partition 0 is re-read (past its position at the kill) before 1 and 2 are,
    # with a checkpoint between, as a fetch may bring one partition's records first.
    after = Replica(memory, store)
    after.read({0})
    after.checkpoint()
    if restart == "killed-again-while-rereading":  # its checkpoint keeps the position still to reach
        assert not after.minutes
        after.close()
        after = Replica(memory, store)
        after.read({0})
        after.checkpoint()
    after.read({1, 2})
    after.checkpoint()
    after.close()

    one = single_worker(REQUESTS, REQUEST_COLUMNS, RequestV1, logs)
    every_minute = sorted({t // 60 for t in one["window_start"].dt.epoch("s").to_list()})
    assert before.minutes + after.minutes == every_minute  # each once, in order
    same_rows(pl.concat(before.rows + after.rows), one, list(REQUESTS.keys))
    assert after.op.assemblers[memory.topic("requests")].redelivered == 0  # no partial dropped as a copy
