"""The interfaces between the runtime (streams/runtime.py) and what it runs on its records.

An operator turns the records the source reads into checkpoints. Three exist, one per
tier: minute windows over the producers' topics (streams/window_operator.py, tier `all`),
per-partition windows published as partials (streams/partial_publisher.py, tier 1), and
whole minutes assembled from those partials (streams/assembly.py, tier 2). The runtime
owns the loop, the source, the timers, readiness and the sinks; an operator owns its
state and says, at each checkpoint, what the store sink commits (or, without a store,
publishes it itself through the topic sink).

An operator is a few small interfaces, each a class with defaults for what some tier has
no use for, so that an operator writes only what it takes part in:

| interface | methods | default |
| --- | --- | --- |
| `Processing` | `process`, `mark_gap`, `has_unsaved`, `checkpoint`; `committed` | `committed`: nothing (a tier without a store commits nothing) |
| `Restoring` | `restore_scope`, `restore` | nothing to restore (a tier without a store resumes from Kafka) |
| `Following` | `start`, `start_offsets`, `revoked`, `tick` (the source's `OffsetPolicy` and its upkeep) | nothing to prepare, every partition from its beginning, nothing on revocation or per loop |
| `Draining` | `undrained` | — (every tier says when `--until-idle` may end) |
| `Reporting` | `open_minutes`, `update_gauges`, `progress_line` | no open minutes, no gauges |

State, as Flink's operators and bytewax's stateful steps keep it: no operator reads the
store. At start the runtime asks the sink that holds the resume state (the store sink,
which owns the DuckDB file) for what the operator's `restore_scope` names, and hands it
over typed (`store.checkpoint.Restored`: open minutes and label limits per topic, the
newest closed minute per table, the stored read positions, the assembly frontiers)
through `restore`; the read positions go to the source too. What an operator persists
leaves in its checkpoint (`store.checkpoint.Checkpoint`), which the store sink writes in
one transaction (Flink's `snapshotState`); `committed` follows once it is durable
(`notifyCheckpointComplete`). An operator is built from its own settings (a dataclass in
its module, which the tier composition derives from the worker's: streams/tiers.py).
"""

from __future__ import annotations

import polars as pl

from tailwatch.ingest import deadletter
from tailwatch.store.checkpoint import Checkpoint, Restored, RestoreScope
from tailwatch.streams.source import Source


class Processing:
    """Records in, checkpoints out."""

    topics: list[str]  # what the source reads
    whole_topic: str  # the topic every partition of which the signal API needs to answer for a pool
    buckets_closed: int = 0
    minutes_closed: int = 0  # request minutes closed (the bench's cost per closed minute)
    closing_behind: bool = False  # the last checkpoint left closable minutes open (its bound): the next comes before more is read

    def process(self, topic: str, batch: list) -> None:
        """A batch of one topic's records, in partition order."""
        raise NotImplementedError

    def mark_gap(self, letter: deadletter.DeadLetter) -> None:
        """A partition's log was reset under its read position (streams/log_reset.py): the
        gap's dead letter goes out, and into the store, with the next checkpoint."""
        raise NotImplementedError

    def has_unsaved(self, source: Source) -> bool:
        raise NotImplementedError

    def checkpoint(self, source: Source, close_all: bool) -> Checkpoint | None:
        """Close what can close (everything, with `close_all`) and say what the store sink
        commits; None when there is nothing new, or nothing for a store."""
        raise NotImplementedError

    def committed(self, cp: Checkpoint) -> None:
        """The store holds `cp`."""


class Restoring:
    """State put back from the store at start."""

    def restore_scope(self) -> RestoreScope:
        """What `restore` needs read from the store."""
        return RestoreScope()

    def restore(self, state: Restored) -> None:
        """Before the first record: the state where the last committed checkpoint left it."""


class Following:
    """The partitions the source takes and gives up (the source's `OffsetPolicy`), and the
    operator's upkeep of them."""

    by_group: bool = True  # the source joins a consumer group (partitions shared); else it reads every partition
    watched: list[str] = []  # topics whose partition sets the operator needs beside those it reads

    def start(self, source: Source) -> None:
        """Before the first record, after the store is open: what the operator needs of Kafka."""

    def start_offsets(self, source: Source, partitions: dict[str, list[int]]) -> dict[tuple[str, int], int | None]:
        """Where each partition just taken starts reading (None: its beginning)."""
        return {(t, q): None for t, qs in partitions.items() for q in qs}

    def revoked(self, source: Source, topic: str, partition: int) -> None:
        """A partition went to another member of the group."""

    def tick(self, source: Source, now: float) -> None:
        """Once per loop (monotonic `now`): pause or resume partitions, follow new partitions."""


class Draining:
    def undrained(self, source: Source) -> list[str]:
        """Why `--until-idle` may not end yet (empty: drained)."""
        raise NotImplementedError


class Reporting:
    """What the signal view, /metrics and the status line read."""

    def open_minutes(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """A peek at the open request and GPU minutes (the signal view reads it); none by default
        (the view then stands on closed minutes only)."""
        return pl.DataFrame(), pl.DataFrame()

    def update_gauges(self) -> None:
        """After each checkpoint."""

    def progress_line(self, events: int, rate_per_s: float) -> str:
        return f"{events:,} records read ({rate_per_s:,.0f}/s)"


class Operator(Processing, Restoring, Following, Draining, Reporting):
    """Every interface at once: what the runtime holds."""
