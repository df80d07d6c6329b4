"""Late events that correct a closed minute: deduped against what the minute already
counted, merged into its row, handed to the stages as a delta.

An event past the allowed lateness but within the correction horizon waits in its
windows (streams/minute_windows.py, `take_late`) until the next checkpoint. There, with the store
open, its copies are dropped: against each other, against the dedupe hashes the store
keeps for closed minutes as long as the horizon, and against the hashes this checkpoint
writes. What is left is aggregated, merged with the stored row of its minute and slice,
and the merged row replaces that row in the checkpoint's transaction, with the offsets
that read the events: a kill at any instant neither loses a correction nor applies it
twice. A merged row is the row the minute would have closed with had the events been on
time: counts add, histograms add bin by bin, quantiles are read again from the merged
histogram. So a run with a late backlog and a replay of the same log end with the same
store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl

from tailwatch.store.checkpoint import Corrected, StoredMinutes
from tailwatch.streams.minute_windows import MinuteWindows


@dataclass
class LateEvents:
    """One topic's late events of closed minutes, as one checkpoint carries them."""

    topic: str
    table: str
    windows: MinuteWindows
    rows: pl.DataFrame  # decoded events with `_minute` and `_dedupe`
    # Copies merged rows to the topics before the checkpoint commits (at least once, as closed ones).
    publish: Callable[[pl.DataFrame], None] = lambda rows: None

    def resolve(self, store: StoredMinutes, seen_now: list[tuple[int, np.ndarray]]) -> Corrected:
        """`store`: the closed minutes, as the checkpoint's transaction sees them (the store
        sink hands it over); `seen_now`: hashes this checkpoint writes (minutes that closed
        since the last one)."""
        w = self.windows
        rows = self.rows.filter(pl.col("_dedupe").is_first_distinct())
        minutes = sorted(set(rows["_minute"].to_list()))
        known = store.seen_hashes(self.topic, minutes)
        wanted = set(minutes)
        for minute, hashes in seen_now:
            if minute in wanted:
                known[minute] = np.concatenate([known.get(minute, np.empty(0, np.uint64)), hashes])
        hashes, of_minute = rows["_dedupe"].to_numpy(), rows["_minute"].to_numpy()
        keep = np.ones(rows.height, dtype=bool)
        for minute, counted in known.items():
            at = of_minute == minute
            keep[at] = ~np.isin(hashes[at], counted)
        fresh = rows.filter(pl.Series(keep))
        duplicates = self.rows.height - fresh.height
        keys = w.spec.keys
        if fresh.height == 0:
            return Corrected(pl.DataFrame(), pl.DataFrame(), keys, [], 0, duplicates)
        delta = w.merge_partials(*w.partials(fresh))
        stored = store.rows_of_minutes(self.table, minutes)
        parts = [w.row_partials(delta)]
        if stored.height:
            parts.append(w.row_partials(stored))
        counts = pl.concat([c for c, _ in parts], how="diagonal_relaxed")
        # Only the stored rows of the slices the late events fall in are replaced.
        touched = parts[0][0].select("_minute", "_slice").unique()
        counts = counts.join(touched, on=["_minute", "_slice"], how="semi")
        hist = pl.concat([h for _, h in parts]).join(touched, on=["_minute", "_slice"], how="semi")
        merged = w.merge_partials(counts, hist)
        self.publish(merged)
        seen = [(int(m), np.sort(part["_dedupe"].to_numpy()))
                for (m,), part in fresh.partition_by("_minute", as_dict=True).items()]
        return Corrected(merged, delta, keys, seen, fresh.height, duplicates)
