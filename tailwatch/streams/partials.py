"""Tier 1 → downstream: closed buckets as partials per source partition on `tw.sli`, the
frontier markers that say when a minute is whole, and the assembly of both into the
store's rows.

A tier-1 worker that owns only some partitions of `tw.requests` (or `tw.gpu`) cannot
close a whole minute: another worker holds the rest. It closes its own partitions'
share of each minute instead, one partial per (source partition, minute, slice), with
the partial state that merges exactly (counts and fixed-point sums added, maxima taken,
"newest" labels by the time kept beside them, histogram bins added), and after those a
frontier per source partition it owns: "partition p has closed every minute before m".

Downstream (tier 2), `MinuteAssembler` holds the partials of a minute
until every source partition's frontier has passed it in every `tw.sli` partition
(records of one producer keep their order within a partition, and the frontiers follow
the partials they cover), merges them and finishes them with the same code that closes a
minute in one process (`MinuteWindows.finish`): the rows equal a single worker's.

Why per source partition: which worker owns a partition changes (rebalances, crashes),
but a partition's share of a minute is fixed by its log. So a partial published twice
(a worker that crashed after publishing and before its checkpoint, then the new owner)
is the same record twice, and the assembler drops the copy by its identity (source
partition, minute, slice). Producers that key by tenant (or node) put each slice in one
partition, so this costs no extra rows; unkeyed producers spread a slice-minute over the
partitions, and its partials merge here.

Wire (JSON lines, as every tw.sli record):
- `<spec>_partial.v1`: `source_topic`, `source_partition`, `minute` (epoch minute), the
  slice labels, the partial state columns of the spec (names as in the open-minute
  state), and `hist`: [{field, bin, n}], the latency histogram bins by field number.
- `frontier.v1`: `source_topic`, `source_partition`, `closed_before_minute` (null: the
  partition has closed nothing yet), `watermark_ms` (its newest valid event; null: none),
  `read_to_end` (its owner has consumed it to the log end) and `drained` (its owner closed
  every minute it held on the way out).

Idleness is judged by each tier-1 worker over the whole topic, as one worker does (streams/
partition_windows.py; the watermarks of partitions other workers own come from their resume
records): an idle partition's frontier moves on, and events
that arrive later for minutes it passed are late, dead-lettered there. Here a source
partition stops holding minutes back only when it never had a valid event and its owner
read it to the end (a partition no producer writes to, or one of poison records only), or
when its owner drained it on the way out. A partial that arrives for a minute already
handed out is a copy (a re-publish after a crash or a move) and is dropped (`redelivered`).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import polars as pl

from tailwatch.streams.minute_windows import PARTITION_COL, AggregateSpec, MinuteWindows, slice_id

FRONTIER_SCHEMA = "frontier.v1"
_HIST_DTYPE = pl.List(pl.Struct({"field": pl.Int8, "bin": pl.Int16, "n": pl.Int32}))
_WIRE_NAMES = {"_minute": "minute", PARTITION_COL: "source_partition", "_hist": "hist"}


def partial_schema(spec: AggregateSpec) -> str:
    return f"{spec.name}_partial.v1"


# Closed rows serialised at a time: a backlog's checkpoint closes some 100,000 rows, whose
# JSON held whole (with its encoded copy and its lines) was the worker's largest transient,
# a few hundred MiB on `tailwatch bench --month`.
SLI_CHUNK_ROWS = 4096


def sli_records(rows: pl.DataFrame, spec: AggregateSpec) -> Iterator[tuple[bytes, bytes]]:
    """Each closed row of `spec` as its tw.sli record, (key, JSON line) with the schema
    `<spec>_minute.v1` and `window_start` in epoch ms, `SLI_CHUNK_ROWS` rows serialised at a time."""
    keys = [k for k in spec.keys if k in rows.columns]
    records = rows.with_columns(pl.lit(f"{spec.name}_minute.v1").alias("schema"),
                                pl.col("window_start").dt.epoch("ms").alias("window_start"))
    for chunk in records.iter_slices(SLI_CHUNK_ROWS):
        yield from zip(sli_keys(chunk, keys), json_lines(chunk))


def json_lines(rows: pl.DataFrame) -> list[bytes]:
    """Each row as one JSON object, in bytes: the lines `write_ndjson` writes, byte for byte,
    for about three quarters of its CPU (it runs polars' streaming engine, and its output had
    then to be split into lines)."""
    return rows.select(pl.struct(pl.all()).struct.json_encode().cast(pl.Binary)).to_series().to_list()


def sli_keys(rows: pl.DataFrame, labels: list[str]) -> list[bytes]:
    """The tw.sli key of each row, closed bucket or partial: its slice labels joined by "|",
    so that every record of a slice lands in one tw.sli partition."""
    joined = rows.select(pl.concat_str([pl.col(k).cast(pl.String).fill_null("") for k in labels], separator="|")
                         .cast(pl.Binary))
    return joined.to_series().to_list()


class Frontier(msgspec.Struct, frozen=True):
    source_topic: str
    source_partition: int
    closed_before_minute: int | None
    watermark_ms: int | None = None
    read_to_end: bool = False
    drained: bool = False
    schema: str = FRONTIER_SCHEMA


class _Head(msgspec.Struct):
    """What the assembler reads of every record before it decodes a minute's partials in one
    go (closed-bucket copies from a single-process worker share the topic: no source fields)."""

    schema: str
    source_topic: str | None = None
    source_partition: int | None = None
    minute: int | None = None
    closed_before_minute: int | None = None
    watermark_ms: int | None = None
    read_to_end: bool = False
    drained: bool = False


_decode_head = msgspec.json.Decoder(_Head).decode
_encode = msgspec.json.Encoder().encode


def encode_frontier(source_topic: str, source_partition: int, closed_before_minute: int | None,
                    watermark_ms: int | None = None, read_to_end: bool = False, drained: bool = False) -> bytes:
    return _encode(Frontier(source_topic, source_partition, closed_before_minute, watermark_ms, read_to_end, drained))


def _state_schema(spec: AggregateSpec, columns: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
    """The partial state's columns and types: the spec's partial run over no rows."""
    empty = pl.DataFrame(schema={**columns, "ts_ms": pl.Int64, "_minute": pl.Int64, PARTITION_COL: pl.Int32})
    return dict(empty.group_by("_minute").agg(*[pl.col(k).first() for k in spec.keys], *spec.partial).schema)


def wire_schema(spec: AggregateSpec, columns: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
    state = _state_schema(spec, columns)
    return {"schema": pl.String, "source_topic": pl.String, "source_partition": pl.Int32,
            **{_WIRE_NAMES.get(c, c): t for c, t in state.items()}, "hist": _HIST_DTYPE}


def encode_partials(spec: AggregateSpec, source_topic: str, counts: pl.DataFrame,
                    hist: pl.DataFrame | None) -> list[tuple[bytes, bytes]]:
    """(key, value) per partial: the per-partition windows' `close_partials`, as records.
    Keys are the slice labels, as the store-row copies on tw.sli are keyed."""
    if counts.height == 0:
        return []
    rows = counts
    if hist is not None and hist.height:
        lists = hist.group_by("_minute", "_slice").agg(
            pl.struct(pl.col("field").cast(pl.Int8), pl.col("bin").cast(pl.Int16), pl.col("n").cast(pl.Int32)).alias("_hist"))
        rows = rows.join(lists, on=["_minute", "_slice"], how="left")
    rows = rows.drop("_slice").rename({c: w for c, w in _WIRE_NAMES.items() if c in rows.columns}).with_columns(
        pl.lit(partial_schema(spec)).alias("schema"), pl.lit(source_topic).alias("source_topic"))
    return list(zip(sli_keys(rows, list(spec.keys)), json_lines(rows)))


class MinuteAssembler:
    """Partials of one source topic from every tw.sli partition, held until their minute is
    whole, then merged into the rows a single worker would have closed."""

    def __init__(self, spec: AggregateSpec, columns: dict[str, pl.DataType], source_topic: str,
                 source_partitions: set[int], sli_partitions: set[int]):
        self.spec = spec
        self.source_topic = source_topic
        self.source_partitions = set(source_partitions)
        self.sli_partitions = set(sli_partitions)
        self.schema = wire_schema(spec, columns)
        self.partial_schema = partial_schema(spec)
        self.frontiers: dict[tuple[int, int], Frontier] = {}  # (tw.sli partition, source partition) → newest marker
        self.held: dict[int, list[tuple[int, int, bytes]]] = {}  # minute → (tw.sli partition, offset, record)
        self.done_before: int | None = None  # minutes before this were handed out
        self.redelivered = 0  # partials of minutes already handed out, dropped
        self._windows = MinuteWindows(spec, 0)  # its merge and finish, nothing else

    def add(self, sli_partition: int, value: bytes, offset: int = -1) -> None:
        """One tw.sli record (raises msgspec.DecodeError / ValidationError on a malformed one)."""
        head = _decode_head(value)
        if head.source_topic != self.source_topic or head.source_partition is None:
            return
        if head.schema == FRONTIER_SCHEMA:
            key = (sli_partition, head.source_partition)
            old = self.frontiers.get(key)
            if old is None or (head.closed_before_minute or -(2**62)) >= (old.closed_before_minute or -(2**62)):
                self.frontiers[key] = Frontier(head.source_topic, head.source_partition, head.closed_before_minute,
                                               head.watermark_ms, head.read_to_end, head.drained)
        elif head.schema == self.partial_schema and head.minute is not None:
            if self.done_before is not None and head.minute < self.done_before:
                self.redelivered += 1
            else:
                self.held.setdefault(head.minute, []).append((sli_partition, offset, value))

    def complete_before(self) -> int | None:
        """The first minute not yet whole: every source partition that holds minutes back
        has closed it, in every tw.sli partition (None: not known yet)."""
        cuts = []
        for p in self.source_partitions:
            marks = [self.frontiers.get((q, p)) for q in self.sli_partitions]
            if not marks or any(m is None for m in marks):
                return None
            if all(m.drained or (m.read_to_end and m.watermark_ms is None) for m in marks):
                continue  # drained, or never had a valid event: it holds nothing back
            if any(m.closed_before_minute is None for m in marks):
                return None
            cuts.append(min(m.closed_before_minute for m in marks))
        if cuts:
            return min(cuts)
        # Nothing holds minutes back: every minute held is whole.
        return max(self.held, default=self.done_before if self.done_before is not None else -1) + 1

    def undrained(self) -> list[int]:
        """Source partitions whose minutes may still come: some owner has neither drained
        them nor found them empty (a writer told to stop when idle waits for these)."""
        return sorted(p for p in self.source_partitions
                      if not all((m := self.frontiers.get((q, p))) is not None and (m.drained or (m.read_to_end and m.watermark_ms is None))
                                 for q in self.sli_partitions))

    def take_complete(self) -> tuple[pl.DataFrame, list[int]]:
        """The rows of every whole minute held, and those minutes (handed out once)."""
        before = self.complete_before()
        if before is None:
            return pl.DataFrame(), []
        minutes = sorted(m for m in self.held if m < before)
        if self.done_before is None or before > self.done_before:
            self.done_before = before
        if not minutes:
            return pl.DataFrame(), []
        lines = [line for m in minutes for _q, _o, line in self.held.pop(m)]
        return self.merge(lines), minutes

    def resume_offsets(self) -> dict[int, int]:
        """Per tw.sli partition, the lowest offset of a record still held (a restart re-reads from there)."""
        out: dict[int, int] = {}
        for records in self.held.values():
            for q, offset, _line in records:
                if offset >= 0 and (q not in out or offset < out[q]):
                    out[q] = offset
        return out

    def restore(self, done_before: int | None, frontiers: list[Frontier], sli_partition_of: list[int]) -> None:
        self.done_before = done_before
        self.frontiers = {(q, f.source_partition): f for q, f in zip(sli_partition_of, frontiers)}

    def merge(self, lines: list[bytes]) -> pl.DataFrame:
        f = pl.read_ndjson(b"\n".join(lines), schema=self.schema)
        keys = list(self.spec.keys)
        # A partial published twice (a tier-1 worker that died between publishing and its
        # checkpoint, then the partition's next owner) is the same record twice.
        f = f.unique(subset=["minute", "source_partition", *keys], keep="first", maintain_order=True)
        later = self.spec.later_keys  # a tier-1 worker of an older release sends none: empty
        f = f.rename({w: c for c, w in _WIRE_NAMES.items()}).with_columns(*[pl.col(k).fill_null("") for k in later])
        f = f.with_columns(slice_id(keys, later))
        hist = None
        if self.spec.histogram_fields:
            hist = (f.select("_minute", "_slice", "_hist").explode("_hist").drop_nulls("_hist").unnest("_hist")
                    .select("_minute", "_slice", "field", "bin", "n"))
        return self._windows.merge_partials(f.drop("schema", "source_topic", PARTITION_COL, "_hist"), hist)
