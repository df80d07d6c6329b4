"""The interface between the runtime (streams/runtime.py) and what it runs on its records.

An operator turns the records the source reads into checkpoints. Three exist, one per
tier: minute windows over the producers' topics (streams/window_operator.py, tier `all`),
per-partition windows published as partials (streams/partial_publisher.py, tier 1), and
whole minutes assembled from those partials (streams/assembly.py, tier 2). The runtime
owns the loop, the source, the timers, readiness and the sinks; an operator owns its
state and says, at each checkpoint, what the store sink commits (or, without a store,
publishes it itself through the topic sink).
"""

from __future__ import annotations

from typing import Protocol

import duckdb
import polars as pl

from tailwatch.ingest import deadletter
from tailwatch.store.checkpoint import Checkpoint
from tailwatch.streams.source import Source


class Operator(Protocol):
    topics: list[str]  # what the source reads
    watched: list[str]  # topics whose partition sets the operator needs beside those
    whole_topic: str  # the topic every partition of which the signal API needs to answer for a pool
    by_group: bool  # the source joins a consumer group (partitions shared); else it reads every partition
    buckets_closed: int
    minutes_closed: int  # request minutes closed (the bench's cost per closed minute)
    closing_behind: bool  # the last checkpoint left closable minutes open (its bound): the next comes before more is read

    def start(self, source: Source, con: duckdb.DuckDBPyConnection | None) -> None:
        """Before the first record: put the state back where the last run left it, from the
        store (`con`), or, for an operator without one, from Kafka."""
        ...

    def start_offsets(self, source: Source, partitions: dict[str, list[int]]) -> dict[tuple[str, int], int | None]:
        """Where each partition just taken starts reading (None: its beginning)."""
        ...

    def revoked(self, source: Source, topic: str, partition: int) -> None:
        """A partition went to another member of the group."""
        ...

    def mark_gap(self, letter: deadletter.DeadLetter) -> None:
        """A partition's log was reset under its read position (streams/log_reset.py): the
        gap's dead letter goes out, and into the store, with the next checkpoint."""
        ...

    def process(self, topic: str, batch: list) -> None:
        """A batch of one topic's records, in partition order."""
        ...

    def tick(self, source: Source, now: float) -> None:
        """Once per loop (monotonic `now`): pause or resume partitions, follow new partitions."""
        ...

    def has_unsaved(self, source: Source) -> bool:
        ...

    def checkpoint(self, source: Source, close_all: bool) -> Checkpoint | None:
        """Close what can close (everything, with `close_all`) and say what the store sink
        commits; None when there is nothing new, or nothing for a store."""
        ...

    def committed(self, cp: Checkpoint) -> None:
        """The store holds `cp`."""
        ...

    def undrained(self, source: Source) -> list[str]:
        """Why `--until-idle` may not end yet (empty: drained)."""
        ...

    def open_minutes(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """A peek at the open request and GPU minutes (the signal view reads it)."""
        ...

    def update_gauges(self) -> None:
        ...

    def progress_line(self, events: int, rate_per_s: float) -> str:
        ...
