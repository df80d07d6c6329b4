"""Cardinality caps on slice labels: a producer's flood of new values costs one slice, not the worker.

Owns which values of each open-ended slice label (tenant, model, model_version, zone, pool,
language, voice; a GPU's node) and which slices a worker keeps apart, as Prometheus's sample
limits bound what one scrape may add. Pure: a batch's frame in, the same events out with some
label values rewritten to `__other__` (conventions.OVERFLOW_LABEL_VALUE); no Kafka, no store,
no clock.

- **First seen wins.** A value is admitted when it arrives while its label holds fewer than
  `max_values_per_label` values; later ones are folded into `__other__` and counted. The
  values admitted first stay exact whatever floods in after them. Within one batch, values
  compete in event-time order (their first event, then the value), not in the order the
  partitions happened to be read, so a worker that drains a backlog of several partitions
  admits the tenants that were there first, and a replay admits the same values whenever
  the contenders for the last places arrive in one batch.
- **Slices too.** After the labels are capped, a slice (the tuple of slice labels) past
  `max_slices` has all its open-ended labels folded into `__other__`: admitted tenants times
  admitted models cannot multiply past the cap. The fully folded slices (one per set of the
  closed labels) always have room, so every event is counted somewhere: none is refused.
- **Ageing in event time.** A value or slice unseen for `forget_after_ms` of event time (the
  newest event this limiter has seen, hour by hour) frees its place, so a month of churning
  tenants stays bounded. Hours, not minutes: the state changes at most once an hour per value
  besides admissions, so the checkpoint rewrites it rarely.
- **State in the checkpoint.** `to_bytes`/`from_bytes` carry the admitted sets and their last
  hours; the worker stores them with the offsets they result from, so a restart admits what an
  uninterrupted run would have.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import polars as pl

from tailwatch.conventions import OVERFLOW_LABEL_VALUE

HOUR_MS = 3_600_000
_STATE_VERSION = 1


@dataclass(frozen=True)
class CardinalityLimits:
    """The caps of one worker (worker settings, `--max-label-values`, `--max-slices`,
    `--label-values-forget-after`)."""

    max_values_per_label: int = 5_000
    max_slices: int = 20_000
    forget_after_ms: int = 24 * HOUR_MS  # 0: never forget


@dataclass
class Overflowed:
    """What one batch folded: events per label whose value had no room, and events whose
    slice had no room."""

    events_by_label: dict[str, int] = field(default_factory=dict)
    slice_events: int = 0


class _State(msgspec.Struct, array_like=True):
    version: int
    newest_hour: int | None
    values: dict[str, list[tuple[str, int]]]
    slices: list[tuple[list[str | int | None], int]]


def _unset(value) -> bool:
    return value is None or value == ""


class CardinalityLimiter:
    def __init__(self, capped: tuple[str, ...], slice_labels: tuple[str, ...], limits: CardinalityLimits):
        """`capped`: the open-ended string labels whose values are counted against the cap;
        `slice_labels`: every label of the slice key (capped ones and closed ones)."""
        self.capped = capped
        self.slice_labels = slice_labels
        self.limits = limits
        self.values: dict[str, dict[str, int]] = {label: {} for label in capped}  # value → newest hour seen
        self.slices: dict[tuple, int] = {}  # slice key → newest hour seen
        self.newest_hour: int | None = None
        self.changed = False  # since the last `to_bytes`

    # ---- the batch -------------------------------------------------------------------
    # Up to this many slices in a batch, the per-label and per-slice bookkeeping runs over
    # Python tuples: a dense batch holds tens of slices, and a polars query per capped label
    # cost more than the group-by of the events itself. Past it (a flood), polars.
    PYTHON_SLICES = 512

    def admit(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, Overflowed]:
        """The frame's events, every one kept, with the values and slices past the caps
        folded into `__other__`; and what was folded."""
        out = Overflowed()
        if frame.height == 0:
            return frame, out
        newest = int(frame["ts_ms"].max()) // HOUR_MS
        if self.newest_hour is None or newest > self.newest_hour:
            self.newest_hour = newest
            self._forget()
        keys = [k for k in self.slice_labels if k in frame.columns]
        # A capped label is one of the slice's: its values' newest hours and first times come
        # from the batch's few slices, not from another pass over every event per label.
        combos, folded = _slices(frame, keys), False
        for label in self.capped:
            if label not in frame.columns:
                continue
            if label in keys:
                seen = _values_seen(combos, keys.index(label), label)
            else:  # a label capped outside the slice key: per event
                seen = frame.group_by(label).agg(_HOUR, _FIRST).sort("_first", label).select(label, "_hour").iter_rows()
            refused = self._admit_values(label, seen)
            if refused:
                frame, folded = self.fold_values(frame, label, refused, out), True
        if folded:  # the slices as folded
            combos = _slices(frame, keys)
        refused_keys = self._admit_slices(keys, _slices_in_order(combos, keys))
        if refused_keys:
            key_hash = pl.struct(keys).hash()
            hashes = frame.select(key_hash.alias("_key"), *keys).unique("_key", keep="first", maintain_order=True)
            frame = self.fold_slices(frame, keys, [h for h, *key in hashes.iter_rows() if tuple(key) in refused_keys], out)
        return frame, out

    def fold_values(self, frame: pl.DataFrame, label: str, refused: list[str], out: Overflowed) -> pl.DataFrame:
        """`label`'s `refused` values rewritten to `__other__`, their events counted in `out`."""
        mask = pl.col(label).is_in(pl.Series(refused, dtype=pl.String).implode())
        out.events_by_label[label] = int(frame.select(mask.sum()).item())
        return frame.with_columns(pl.when(mask).then(pl.lit(OVERFLOW_LABEL_VALUE)).otherwise(pl.col(label)).alias(label))

    def fold_slices(self, frame: pl.DataFrame, keys: list[str], refused: list[int], out: Overflowed) -> pl.DataFrame:
        """The events of the slices whose key hashes (a struct of `keys`) are `refused`: every
        capped label set rewritten to `__other__`, the events counted in `out`."""
        mask = pl.struct(keys).hash().is_in(pl.Series(refused, dtype=pl.UInt64).implode())
        out.slice_events = int(frame.select(mask.sum()).item())
        return frame.with_columns(*[
            pl.when(mask & pl.col(k).is_not_null() & (pl.col(k) != "")).then(pl.lit(OVERFLOW_LABEL_VALUE))
            .otherwise(pl.col(k)).alias(k) for k in self.capped if k in frame.columns])

    def _admit_values(self, label: str, seen) -> list[str]:
        known, cap, refused = self.values[label], self.limits.max_values_per_label, []
        for value, hour in seen:
            if _unset(value) or value == OVERFLOW_LABEL_VALUE:
                continue
            last = known.get(value)
            if last is None:
                if len(known) >= cap:
                    refused.append(value)
                    continue
                known[value] = hour
                self.changed = True
            elif hour > last:
                known[value] = hour
                self.changed = True
        return refused

    def _admit_slices(self, keys: list[str], combos) -> set[tuple]:
        """`combos`: (*key, newest hour) per slice, first come first."""
        capped_at = [i for i, k in enumerate(keys) if k in self.values]
        cap, refused = self.limits.max_slices, set()
        for *key, hour in combos:
            key = tuple(key)
            if all(_unset(key[i]) or key[i] == OVERFLOW_LABEL_VALUE for i in capped_at):
                continue  # a fully folded slice: bounded by the closed labels, always has room
            last = self.slices.get(key)
            if last is None:
                if len(self.slices) >= cap:
                    refused.add(key)
                    continue
                self.slices[key] = hour
                self.changed = True
            elif hour > last:
                self.slices[key] = hour
                self.changed = True
        return refused

    def _forget(self) -> None:
        """Free the places of values and slices unseen for `forget_after_ms` of event time."""
        if not self.limits.forget_after_ms or self.newest_hour is None:
            return
        oldest_kept = self.newest_hour - -(-self.limits.forget_after_ms // HOUR_MS)
        for table in (*self.values.values(), self.slices):
            stale = [k for k, last in table.items() if last < oldest_kept]
            for k in stale:
                del table[k]
            self.changed = self.changed or bool(stale)

    # ---- what it holds -----------------------------------------------------------------
    def sizes(self) -> dict[str, int]:
        """Values admitted per capped label, and `slice`: the slices admitted."""
        return {**{label: len(v) for label, v in self.values.items()}, "slice": len(self.slices)}

    # ---- checkpoint --------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        self.changed = False
        return msgspec.msgpack.encode(_State(
            _STATE_VERSION, self.newest_hour,
            {label: list(v.items()) for label, v in self.values.items()},
            [(list(k), h) for k, h in self.slices.items()]))

    def restore(self, blob: bytes | None) -> None:
        """The state `to_bytes` gave (None: a worker that never checkpointed one starts empty).
        Labels no longer capped are dropped; places past a lowered cap stay until they age out."""
        if blob is None:
            return
        state = msgspec.msgpack.decode(blob, type=_State)
        self.newest_hour = state.newest_hour
        self.values = {label: dict(state.values.get(label, [])) for label in self.capped}
        self.slices = {tuple(k): h for k, h in state.slices}
        self.changed = False


# Per slice or value: its newest hour (ageing) and its first event time (who came first).
_HOUR = (pl.col("ts_ms").max() // HOUR_MS).alias("_hour")
_FIRST = pl.col("ts_ms").min().alias("_first")


def _slices(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame | list[tuple]:
    """The batch's slices: (*key, newest hour, first time) each, as tuples where they are few."""
    combos = frame.group_by(keys).agg(_HOUR, _FIRST)
    return combos.rows() if combos.height <= CardinalityLimiter.PYTHON_SLICES else combos


def _values_seen(combos: pl.DataFrame | list[tuple], i: int, label: str) -> list[tuple]:
    """(value, newest hour) of the `i`th slice label, first come first (first time, then the
    value), from the batch's slices. Unset and folded values are left out: they take no place."""
    if isinstance(combos, pl.DataFrame):
        return combos.group_by(label).agg(pl.col("_hour").max(), pl.col("_first").min()).sort(
            "_first", label).select(label, "_hour").rows()
    newest: dict[str, int] = {}
    first: dict[str, int] = {}
    for row in combos:
        value, hour, at = row[i], row[-2], row[-1]
        if _unset(value) or value == OVERFLOW_LABEL_VALUE:
            continue
        if value not in newest:
            newest[value], first[value] = hour, at
        else:
            newest[value], first[value] = max(newest[value], hour), min(first[value], at)
    # polars orders strings by their UTF-8 bytes, Python by code point: the same order.
    return [(v, newest[v]) for v in sorted(newest, key=lambda v: (first[v], v))]


def _slices_in_order(combos: pl.DataFrame | list[tuple], keys: list[str]):
    """(*key, newest hour) per slice, first come first: by first time, then the key, an unset
    (null) label before any value, as polars sorts."""
    if isinstance(combos, pl.DataFrame):
        return combos.sort("_first", *keys).drop("_first").iter_rows()
    return [row[:-1] for row in sorted(combos, key=lambda row: (row[-1], *[(v is not None, v) for v in row[:-2]]))]
