"""Tier 1's windows: one `MinuteWindows` per owned source partition, each with its own
close frontier, and the resume point that lets any worker take a partition over.

A tier-1 worker owns some partitions of a topic, and which ones changes (rebalances,
crashes). Each partition's minutes close on that partition's own watermark, so a
partition that moves to a worker whose other partitions are ahead is judged exactly as
before: whether an event is late depends on its partition's log alone.

Taking a partition over without a store: the owner publishes, after the partials and
frontiers they cover, a `Resume` record per partition (streams/tier1.py puts it on
`<topic>.progress`): re-read from `resume_offset` (the first offset of any event in a
minute still open), minutes before `closed_before_minute` are published, and every
offset before `replay_until` was already handled (its dead letters published). The next
owner re-reads from `resume_offset`, drops what it re-reads of published minutes, rebuilds
the open minutes (their events, copies included, all lie after `resume_offset`), and
republishes nothing else. Events before `resume_offset` all belong to closed minutes, so
their timestamps cannot make an event of an open minute late: the re-read judges every
event as the first owner did.
"""

from __future__ import annotations

import msgspec
import polars as pl

from tailwatch.streams.minute_windows import MINUTE_MS, BatchOutcome, MinuteWindows, AggregateSpec


class Resume(msgspec.Struct, frozen=True):
    """Where the next owner of a partition starts (see the module docstring)."""

    source_topic: str
    source_partition: int
    resume_offset: int
    replay_until: int
    closed_before_minute: int | None
    # The partition's newest valid event when this was written: what the frontier markers
    # report until the next owner reads a new one (it never judges lateness, see above).
    watermark_ms: int | None = None
    schema: str = "resume.v1"


class PartitionWindows:
    """The open minutes of every owned partition of one topic, each partition apart."""

    def __init__(self, spec: AggregateSpec, allowed_lateness_ms: int, idle_timeout_ms: int):
        self.spec = spec
        self.allowed_lateness_ms = allowed_lateness_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.parts: dict[int, MinuteWindows] = {}
        self.replay_until: dict[int, int] = {}  # partition → offsets below it were handled by an earlier owner
        self._resumed_watermark_ms: dict[int, int | None] = {}
        self._first_offset: dict[int, dict[int, int]] = {}  # partition → open minute → lowest offset seen in it

    # ---- ownership ------------------------------------------------------------------
    def take(self, partition: int, resume: Resume | None) -> int | None:
        """Start owning `partition`, from its resume point if it has one; the offset to read from."""
        w = MinuteWindows(self.spec, self.allowed_lateness_ms, self.idle_timeout_ms, per_partition=True)
        self.parts[partition] = w
        self._first_offset[partition] = {}
        if resume is None:
            self.replay_until.pop(partition, None)
            return None
        w.closed_before_minute = resume.closed_before_minute
        self.replay_until[partition] = resume.replay_until
        self._resumed_watermark_ms[partition] = resume.watermark_ms
        return resume.resume_offset

    def drop(self, partition: int) -> None:
        """Let go of a partition: its next owner rebuilds the open minutes from its resume point."""
        self.parts.pop(partition, None)
        self._first_offset.pop(partition, None)
        self.replay_until.pop(partition, None)
        self._resumed_watermark_ms.pop(partition, None)

    def watermark(self, partition: int) -> int | None:
        """The partition's newest valid event, read by this owner or, before it read one, by the last."""
        own = self.parts[partition].watermark_ms.get(partition)
        resumed = self._resumed_watermark_ms.get(partition)
        return own if resumed is None or (own is not None and own > resumed) else resumed

    def replaying(self, partition: int, offset: int) -> bool:
        """Was this offset handled by the partition's earlier owner (its dead letters sent)?"""
        return offset < self.replay_until.get(partition, -1)

    # ---- ingest ---------------------------------------------------------------------
    def add(self, frame: pl.DataFrame) -> BatchOutcome:
        outcomes = []
        minute = pl.col("ts_ms") // MINUTE_MS
        for (part,), rows in frame.partition_by("_partition", as_dict=True, maintain_order=True).items():
            w = self.parts.get(part)
            if w is None:  # revoked while the batch was in flight
                continue
            until = self.replay_until.get(part)
            if until is not None and w.closed_before_minute is not None:
                # Re-read events of minutes already published: handled by the earlier owner.
                rows = rows.filter(~((pl.col("_offset") < until) & (minute < w.closed_before_minute)))
            outcomes.append(w.add(rows))
        # The lowest offset seen in each minute, in one group-by for every partition.
        firsts = frame.group_by("_partition", minute.alias("m")).agg(pl.col("_offset").min())
        for part, m, off in firsts.iter_rows():
            seen = self._first_offset.get(part)
            if seen is None:
                continue
            closed = self.parts[part].closed_before_minute
            if (closed is None or m >= closed) and (m not in seen or off < seen[m]):
                seen[m] = off
        return BatchOutcome(
            accepted=sum(o.accepted for o in outcomes), duplicates=sum(o.duplicates for o in outcomes),
            late_index=[i for o in outcomes for i in o.late_index], late_ts_ms=[t for o in outcomes for t in o.late_ts_ms])

    # ---- closing --------------------------------------------------------------------
    def closable_before(self, read_to_end: set[int], newest_elsewhere_ms: int | None = None) -> dict[int, int | None]:
        """Per owned partition, the first minute that must stay open (None: not known yet).

        A partition closes on its own watermark. One read to its end and idle (no valid
        event, or more than the idle timeout behind the newest partition of the topic)
        closes up to the newest watermark minus the lateness, as one worker does.
        `newest_elsewhere_ms` is the newest watermark of the partitions other workers own
        (as their resume records last said): without it, a worker whose partitions all
        went quiet would never find them idle and would hold every minute downstream."""
        newest = self._newest(newest_elsewhere_ms)
        idle = self.idle(read_to_end, newest_elsewhere_ms)
        out: dict[int, int | None] = {}
        for p in self.parts:
            mark = newest if p in idle else self.watermark(p)
            out[p] = None if mark is None else (mark - self.allowed_lateness_ms) // MINUTE_MS
        return out

    def idle(self, read_to_end: set[int], newest_elsewhere_ms: int | None = None) -> set[int]:
        """The owned partitions `closable_before` moves on with the topic's front."""
        newest = self._newest(newest_elsewhere_ms)
        return {p for p in self.parts if p in read_to_end and (
            (wm := self.watermark(p)) is None or (newest is not None and wm < newest - self.idle_timeout_ms))}

    def _newest(self, newest_elsewhere_ms: int | None) -> int | None:
        return max((m for m in [*map(self.watermark, self.parts), newest_elsewhere_ms] if m is not None), default=None)

    def close(self, before: dict[int, int | None]) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
        """Close each partition's minutes before its cut (a None cut: all of them).
        Returns the partial state (counts, histogram bins) of what closed."""
        counts, hists = [], []
        for p, cut in before.items():
            w = self.parts[p]
            c, h, _minutes = w.close_partials(cut)
            if c is not None:
                counts.append(c)
                if h is not None and h.height:
                    hists.append(h)
            frontier = w.closed_before_minute
            if frontier is not None:
                self._first_offset[p] = {m: o for m, o in self._first_offset[p].items() if m >= frontier}
        if not counts:
            return None, None
        return pl.concat(counts, how="diagonal_relaxed"), (pl.concat(hists) if hists else None)

    def resume_point(self, topic: str, partition: int, next_offset: int) -> Resume:
        w = self.parts[partition]
        firsts = self._first_offset[partition].values()
        # Replay marks only grow: offsets a re-read handled before this owner took over stay handled.
        replay_until = max(next_offset, self.replay_until.get(partition, -1))
        return Resume(topic, partition, min(firsts, default=next_offset), replay_until, w.closed_before_minute,
                      self.watermark(partition))

    # ---- what the worker's gauges read ----------------------------------------------
    @property
    def watermark_ms(self) -> dict[int, int]:
        return {p: wm for w in self.parts.values() for p, wm in w.watermark_ms.items()}

    def open_minutes(self) -> list[int]:
        return sorted({m for w in self.parts.values() for m in w.open_minutes()})

    @property
    def dedupe_ids(self) -> int:
        return sum(w.dedupe_ids for w in self.parts.values())

    def has_unsaved(self) -> bool:
        return any(w.unsaved.counts or w.unsaved.seen for w in self.parts.values())

    def forget_unsaved(self) -> None:
        """Tier 1 keeps no store: the deltas a checkpoint would write are not needed."""
        for w in self.parts.values():
            w.take_unsaved()
