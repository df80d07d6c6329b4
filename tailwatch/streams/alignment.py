"""Watermark alignment: which partitions to pause so that none reads far ahead of the slowest.

While a backlog drains (a replay, a worker back after an outage), librdkafka reads a
topic's partitions unevenly. A topic's minutes close at its slowest partition's
watermark, so every minute the faster partitions read meanwhile stays open, in memory and
in every checkpoint's open state: draining synthetic traffic at 100,000 events a minute
over four partitions held 53 open minutes (437 MiB) where the allowed lateness asks for 6.
Flink's answer is watermark alignment (`WatermarkStrategy.withWatermarkAlignment`): a
split more than `maxAllowedWatermarkDrift` ahead of the group's lowest watermark is
paused until the others catch up. The same here, over the partitions one worker reads of
both input topics (keys are (topic, partition)): a backlog drained one topic first would
otherwise close its minutes an hour ahead of the other's.

Pausing changes when a partition's records are read, never which or in what order within
it, and a paused partition holds the frontier at its own watermark like any other; so the
buckets are the ones an unpaused run may produce. Only partitions with records still to
read take part: one read to its end has nothing to pause and must not hold others back,
and one whose read position stopped moving (its leader away) is left out after
`stalled_after_s`, so that a broken partition never freezes the healthy ones. A partition
that has delivered no valid event yet is the slowest of all (it holds every minute open):
librdkafka may hand over one partition's whole backlog before the first record of another.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WatermarkAlignment:
    """One group: the paused partitions, and when each one's read position last moved."""

    max_drift_ms: int
    stalled_after_s: float = 10.0
    paused: set[int] = field(default_factory=set)
    _moved: dict[int, tuple[int, float]] = field(default_factory=dict)  # partition → (position, when it last moved)

    def decide(self, watermarks_ms: dict[int, int], to_read: dict[int, int], now_s: float) -> tuple[set[int], set[int]]:
        """(to pause, to resume), given each partition's watermark, the partitions with
        records still to read and their read positions, and a monotonic clock (only to tell
        a stalled partition)."""
        for part, position in to_read.items():
            last = self._moved.get(part)
            # A paused partition stands still because it is paused: not stalled, waiting.
            if last is None or position != last[0] or part in self.paused:
                self._moved[part] = (position, now_s)
        for part in set(self._moved) - set(to_read):
            del self._moved[part]
        want = self.wanted(watermarks_ms, set(to_read), now_s)
        pause, resume = want - self.paused, self.paused - want
        self.paused = want
        return pause, resume

    def forget(self, part) -> None:
        """A partition no longer read here (revoked): neither paused nor watched."""
        self.paused.discard(part)
        self._moved.pop(part, None)

    def wanted(self, watermarks_ms: dict[int, int], to_read: set[int], now_s: float) -> set[int]:
        live = [p for p in to_read if now_s - self._moved[p][1] < self.stalled_after_s]
        if len(live) < 2:
            return set()
        # A partition with records to read but no valid event yet holds the topic's minutes
        # open from the start: it is the slowest of all.
        lowest = min(watermarks_ms.get(p, -_FAR) for p in live)
        # Resume at half the drift, so a partition does not flap around the line.
        return {p for p in live if p in watermarks_ms
                and watermarks_ms[p] > lowest + (self.max_drift_ms // 2 if p in self.paused else self.max_drift_ms)}


_FAR = 2**62  # no watermark: below every real one
