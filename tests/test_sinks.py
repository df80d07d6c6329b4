"""The sinks are one list the runtime calls alike (streams/sink.py): a sink of its own added
to a tier sees every checkpoint in order, beside the topics, the store and the Alertmanager."""

from __future__ import annotations


import duckdb

from tailwatch_dev.simulator import FleetSimulator
from tailwatch.streams.alert_sink import AlertSink
from tailwatch.streams.tiers import WorkerSettings, build
from tailwatch.streams.sink import Sink
from tailwatch.streams.store_sink import StoreSink
from tailwatch.streams.topic_sink import TopicSink
from tests.test_pipeline import publish, worker


class RecordingSink(Sink):
    """Writes nothing: remembers the calls it got and the closed request rows it was shown."""

    name = "recording"

    def __init__(self):
        self.calls: list[str] = []
        self.closed_requests = 0

    def open(self) -> None:
        self.calls.append("open")

    def snapshot(self, cp) -> None:
        self.calls.append("snapshot")

    def commit(self, cp) -> None:
        self.calls.append("commit")
        self.closed_requests += sum(int(t.closed["requests"].sum()) for t in cp.topics
                                    if t.table == "sli_minute" and t.closed.height)

    def committed(self, cp) -> None:
        self.calls.append("committed")

    def close(self) -> None:
        self.calls.append("close")


def test_a_tier_is_a_list_of_sinks_and_each_sees_every_checkpoint_in_order(memory, tmp_path):
    sim = FleetSimulator("mixed-fleet", minutes=5, seed=3, rate_scale=0.2)
    publish(memory, list(sim.events()))
    path = tmp_path / "tw.duckdb"
    w = worker(memory, path, until_idle_s=2.0)
    assert [type(s) for s in w.sinks] == [TopicSink, StoreSink, AlertSink]
    recording = RecordingSink()
    w.sinks.append(recording)
    assert w.run() == 0

    calls = recording.calls
    assert calls[0] == "open" and calls[-1] == "close"
    # At exit the sinks are asked for their marks once more; with no page delivered, nothing is written.
    assert calls[-2] == "snapshot"
    checkpoints = calls[1:-2]
    assert checkpoints and len(checkpoints) % 3 == 0
    assert checkpoints == ["snapshot", "commit", "committed"] * (len(checkpoints) // 3)
    # What the sinks were shown is what the store holds: every request, once.
    with duckdb.connect(str(path), read_only=True) as con:
        stored = con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0]
    assert recording.closed_requests == stored == sim.totals.requests


def test_a_worker_without_a_store_resumes_from_kafka(kafka, tmp_path):
    w = build(WorkerSettings(kafka=kafka, store_path=str(tmp_path / "none.duckdb"), http_port=None), tier="1")
    assert [type(s) for s in w.sinks] == [TopicSink]
    assert not w.resumes_from_store
    w.sink(TopicSink).close()
    assert not (tmp_path / "none.duckdb").exists()
