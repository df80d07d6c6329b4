"""The one interface between the runtime (streams/runtime.py) and where a worker's results go.

A sink is a part the runtime holds in a list, whatever the tier: the topics
(streams/topic_sink.py), the store and its stages (streams/store_sink.py), the Alertmanager
outboxes (streams/alert_sink.py). Each method has a default that does nothing, so a sink
writes only what it takes part in, and the runtime calls every sink the same way:

- `open()` before the first record; then the sink that holds where a worker resumes
  (`holds_resume_state`, the store sink: one per tier, or none) is asked for the state the
  operator restores (`restored(scope)`, typed: `store.checkpoint.Restored`), which the
  runtime hands the operator, so that no other part reads the store;
- at each checkpoint, `snapshot(cp)` lets a sink add what it holds to the checkpoint
  (what Alertmanager took since the last mark), `commit(cp)` makes the checkpoint durable
  (the store's transaction), and `committed(cp)` follows once every sink has committed
  (the stages hand out what they raised): the order of Flink's snapshotState and
  notifyCheckpointComplete;
- `tick(caught_up)` from the loop; `drain(wait_s)` and `close()` at exit.

A sink says which of its errors mean that something outside the worker holds what it
writes (`held_errors`: another process has the store file): a worker told to stop ends on
one with a line, its state where the last checkpoint left it.
"""

from __future__ import annotations

from prometheus_client.registry import Collector

from tailwatch.store.checkpoint import Checkpoint, Restored, RestoreScope


class Sink:
    """Defaults for every method: a sink overrides what it takes part in."""

    name = "sink"
    # The sink whose store holds the operator's resume state (one per tier, or none: the
    # operator then resumes from Kafka).
    holds_resume_state = False
    # Errors that say another holder kept this sink from writing (see the module's docstring).
    held_errors: tuple[type[BaseException], ...] = ()

    def collectors(self) -> list[Collector]:
        """Prometheus collectors to register on the worker's registry."""
        return []

    def open(self) -> None:
        """Before the first record."""

    def restored(self, scope: RestoreScope) -> Restored:
        """After `open`, of the sink with `holds_resume_state` only: the operator's state as the
        last committed checkpoint left it, as far as `scope` names it."""
        raise NotImplementedError(f"the {self.name} sink holds no resume state")

    def snapshot(self, cp: Checkpoint) -> None:
        """Add what this sink holds to the checkpoint, before any sink commits it."""

    def commit(self, cp: Checkpoint) -> None:
        """Make the checkpoint durable (or publish what it covers)."""

    def committed(self, cp: Checkpoint) -> None:
        """Every sink has committed `cp`."""

    def tick(self, caught_up: bool) -> None:
        """Once per loop; `caught_up`: the worker has read to the end of its input since it started."""

    def drain(self, wait_s: float) -> None:
        """At exit, before the last marks are recorded: wait up to `wait_s` for what is in flight."""

    def close(self) -> None:
        """At exit, after everything else."""

    def memory_holders(self) -> dict[str, object]:
        """What this sink keeps in memory, by the name the state-size metric reports it under."""
        return {}

    def cache_bytes(self) -> int:
        """Bytes of a database's buffer pool this sink holds (process memory by holder)."""
        return 0

    def describe(self) -> str:
        """A phrase for the worker's start line ("" for none)."""
        return ""
