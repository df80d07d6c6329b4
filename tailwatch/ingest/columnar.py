"""The fast way in: raw JSON records of one wire schema straight into a polars frame of the
columns the windows take, with no Python object per field (the decoder in `_columnar.c`).

It accepts a record only where it can show the record decodes to exactly what the reference
decoder (`validate.BatchDecoder`: msgspec with the schema's types and bounds) gives, and
declines every other record to that decoder, which decodes it or names its fault: a flat
object of the schema's fields, each once; strings in printable ASCII without escapes (so no
control character can hide in one); numbers in the JSON grammar, within the field's bounds;
literals from the field's closed set; `ts` as epoch milliseconds or in the canonical RFC 3339
spelling. It never judges a pattern (a language tag, a voice name): it takes a patterned
value only once the reference has accepted it in a record (`approve`), and declines the
record otherwise. The contract is read from the
msgspec types in `schema.py`, so it is declared once. tests/test_columnar.py fuzzes that
both ways give the same frame for any input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from tailwatch.ingest import _columnar

# Kinds and column types as the C decoder numbers them.
_K_STR, _K_INT, _K_FLOAT, _K_BOOL, _K_TS, _K_DECLINE = 1, 2, 3, 4, 5, 6
_C_NONE, _C_I32, _C_I64, _C_F64, _C_BOOL, _C_STR = 0, 1, 2, 3, 4, 5
_D_REQUIRED, _D_NULL, _D_VALUE = 0, 1, 2
_CTYPES = {pl.Int32: (_C_I32, pa.int32()), pl.Int64: (_C_I64, pa.int64()), pl.Float64: (_C_F64, pa.float64()),
           pl.Boolean: (_C_BOOL, pa.bool_()), pl.String: (_C_STR, pa.large_string())}
_KIND_OF_CTYPE = {_C_I32: {_K_INT}, _C_I64: {_K_INT, _K_TS}, _C_F64: {_K_FLOAT}, _C_BOOL: {_K_BOOL}, _C_STR: {_K_STR}}
_UNBOUNDED = 2**62
TS_COLUMN = "ts_ms"
PARTITION_COLUMN, OFFSET_COLUMN, INDEX_COLUMN = "_partition", "_offset", "_index"


@dataclass(slots=True)
class FastBatch:
    """What the fast path made of a batch: the accepted records' columns in the batch's
    order, then `ts_ms`, `_partition`, `_offset` and `_index` (each record's position in
    the batch), and the positions it left to the reference decoder."""

    frame: pl.DataFrame  # without the decoder's droppable columns that are null throughout
    declined: list[int]


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    arrow: pa.DataType


class ColumnDecoder:
    """Raw records of `event_type` into `columns` (name → polars dtype) plus `ts_ms`,
    `_partition`, `_offset` and `_index`; columns the type lacks come back null. Values of
    the `case_folded` columns come back in lower case (their letters are ASCII here)."""

    def __init__(self, event_type: type[msgspec.Struct], columns: dict[str, pl.DataType], max_record_bytes: int,
                 case_folded: tuple[str, ...] = (), droppable: tuple[str, ...] = ()):
        self.droppable = droppable  # left out of the frame where null in every accepted record
        spec, kept, self.patterned = _spec(event_type, columns, case_folded)
        self._decoder = _columnar.Decoder(spec, max_record_bytes)
        by_name = {k.name: (i, k) for i, k in enumerate(kept)}
        # The frame's columns in order: a kept column's buffers, or nulls of its type.
        self._layout = [(name, *by_name[name]) if name in by_name else (name, None, _arrow_type(dtype))
                        for name, dtype in (*columns.items(), (TS_COLUMN, pl.Int64))]

    def decode(self, values: list[bytes | None], partitions: Sequence[int], offsets: Sequence[int]) -> FastBatch:
        rows, accepted, declined, buffers = self._decoder.decode(values)
        arrays, names = [], []
        for name, i, k in self._layout:
            if i is None:
                if name in self.droppable:
                    continue
                arrays.append(pa.nulls(rows, k))
            else:
                b = buffers[i]
                if b[2] == rows and name in self.droppable:
                    continue
                arrays.append(pa.Array.from_buffers(k.arrow, rows, _arrow_buffers(b), null_count=b[2]))
            names.append(name)
        index = np.frombuffer(accepted, dtype=np.int64)
        arrays += [_plain(pa.int32(), np.asarray(partitions, dtype=np.int32)[index]),
                   _plain(pa.int64(), np.asarray(offsets, dtype=np.int64)[index]), _plain(pa.int64(), index)]
        names += [PARTITION_COLUMN, OFFSET_COLUMN, INDEX_COLUMN]
        return FastBatch(pl.from_arrow(pa.RecordBatch.from_arrays(arrays, names=names)), declined)

    def approve(self, records: Sequence[msgspec.Struct]) -> None:
        """Values of patterned fields in records the reference accepted: the fast decoder
        takes them from now on (up to its bound per field)."""
        for field, index in self.patterned:
            for value in {getattr(r, field, None) for r in records}:
                if isinstance(value, str) and value.isascii() and value.isprintable():
                    self._decoder.approve(index, value)


def read_messages(messages: Sequence) -> tuple[list[bytes | None], np.ndarray, np.ndarray, np.ndarray]:
    """Each consumed record's value, partition, offset and timestamp (-1 where it has none),
    read in one C pass (confluent-kafka's `Message` accessors, or any object with them)."""
    values, partitions, offsets, stamps = _columnar.read_messages(messages)
    return (values, np.frombuffer(partitions, dtype=np.int32), np.frombuffer(offsets, dtype=np.int64),
            np.frombuffer(stamps, dtype=np.int64))


def _plain(arrow: pa.DataType, values: np.ndarray) -> pa.Array:
    """A NumPy array without nulls as Arrow, sharing its memory (`pa.array` would import
    numpy.ma, 40 ms, on the worker's first batch)."""
    return pa.Array.from_buffers(arrow, len(values), [None, pa.py_buffer(np.ascontiguousarray(values))])


def _arrow_type(dtype: pl.DataType) -> pa.DataType:
    return pl.Series([], dtype=dtype).to_arrow().type


def _arrow_buffers(b: tuple) -> list:
    values, validity, _nulls, data = b
    head = pa.py_buffer(validity) if validity is not None else None
    if data is not None:  # a string column: offsets, then the bytes
        return [head, pa.py_buffer(values), pa.py_buffer(data)]
    return [head, pa.py_buffer(values)]


def _spec(event_type: type[msgspec.Struct], columns: dict[str, pl.DataType], case_folded: tuple[str, ...]):
    """The decoder's field table from the schema's msgspec types: (name, kind, nullable,
    default kind, default, column type, column, min length, max length, int bounds, float
    bounds, literals, lower-cased, patterned) per field; the kept columns in field order;
    the patterned fields (name, position)."""
    spec, kept, patterned = [], [], []
    for f in msgspec.inspect.type_info(event_type).fields:
        t, nullable = f.type, False
        if isinstance(t, msgspec.inspect.UnionType):
            nullable = any(isinstance(u, msgspec.inspect.NoneType) for u in t.types)
            others = [u for u in t.types if not isinstance(u, msgspec.inspect.NoneType)]
            t = others[0] if len(others) == 1 else tuple(others)
        column = TS_COLUMN if f.name == "ts" else f.name
        ctype, arrow = _CTYPES.get(columns.get(column), (_C_NONE, None)) if column != TS_COLUMN else (_C_I64, pa.int64())
        kind, min_len, max_len, imin, imax, fmin, fmax, literals = _K_DECLINE, 0, _UNBOUNDED, -_UNBOUNDED, _UNBOUNDED, -math.inf, math.inf, None
        if f.name == "ts":
            ints = [u for u in t if isinstance(u, msgspec.inspect.IntType)]
            strs = [u for u in t if isinstance(u, msgspec.inspect.StrType)]
            kind, max_len = _K_TS, strs[0].max_length
            imin, imax = _int_bounds(ints[0])
        elif isinstance(t, msgspec.inspect.LiteralType) and all(isinstance(v, str) for v in t.values):
            kind, literals = _K_STR, tuple(t.values)
        elif isinstance(t, msgspec.inspect.StrType):
            kind, min_len = _K_STR, t.min_length or 0
            max_len = t.max_length if t.max_length is not None else _UNBOUNDED
            if t.pattern is not None:
                patterned.append((f.name, len(spec)))
        elif isinstance(t, msgspec.inspect.IntType) and t.multiple_of is None:
            kind = _K_INT
            imin, imax = _int_bounds(t)
        elif isinstance(t, msgspec.inspect.FloatType) and t.multiple_of is None:
            kind = _K_FLOAT
            fmin = -math.inf if t.ge is None and t.gt is None else (t.ge if t.ge is not None else math.nextafter(t.gt, math.inf))
            fmax = math.inf if t.le is None and t.lt is None else (t.le if t.le is not None else math.nextafter(t.lt, -math.inf))
            fmin, fmax = max(fmin, -1.7976931348623157e308), min(fmax, 1.7976931348623157e308)  # finite only
        elif isinstance(t, msgspec.inspect.BoolType):
            kind = _K_BOOL
        if ctype != _C_NONE and kind not in _KIND_OF_CTYPE[ctype]:
            raise TypeError(f"{event_type.__name__}.{f.name} cannot be decoded into a {columns[column]} column")
        if f.required:
            dflt, default = _D_REQUIRED, None
        elif f.default is None:
            dflt, default = _D_NULL, None
        elif f.default is msgspec.NODEFAULT or kind == _K_DECLINE:
            raise TypeError(f"{event_type.__name__}.{f.name}: a default the fast decoder cannot fill")
        else:
            dflt, default = _D_VALUE, f.default
        index = len(kept) if ctype != _C_NONE else -1
        if index >= 0:
            kept.append(_Column(column, arrow))
        spec.append((f.name, kind, int(nullable), dflt, default, ctype, index, min_len, max_len, imin, imax,
                     float(fmin), float(fmax), literals, int(column in case_folded),
                     int(bool(patterned) and patterned[-1][1] == len(spec))))
    return spec, kept, patterned


def _int_bounds(t: msgspec.inspect.IntType) -> tuple[int, int]:
    lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else -_UNBOUNDED)
    hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else _UNBOUNDED)
    return lo, hi
