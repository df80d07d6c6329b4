"""The fast way in: raw JSON records of one wire schema straight into a polars frame of the
columns the windows take, with no Python object per field (the decoder in `_columnar.c`).

It accepts a record only where it can show the record decodes to exactly what the reference
decoder (`validate.BatchDecoder`: msgspec with the schema's types and bounds) gives, and
declines every other record to that decoder, which decodes it or names its fault: a flat
object of the schema's fields, each once; strings in printable ASCII without escapes (so no
control character can hide in one); numbers in the JSON grammar, within the field's bounds;
literals from the field's closed set; `ts` as epoch milliseconds or in the canonical RFC 3339
spelling. Patterns (a language tag, a voice name) are checked here on the batch's distinct
values, and a record whose value fails is declined too. The contract is read from the
msgspec types in `schema.py`, so it is declared once. tests/test_columnar.py fuzzes that
both ways give the same frame for any input.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

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
INDEX_COLUMN = "_index"


@dataclass(slots=True)
class FastBatch:
    """What the fast path made of a batch: the accepted records' columns in the batch's
    order, with `ts_ms` and `_index` (each record's position in the batch), and the
    positions it left to the reference decoder."""

    frame: pl.DataFrame
    declined: list[int]


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    arrow: pa.DataType


class ColumnDecoder:
    """Raw records of `event_type` into `columns` (name → polars dtype) plus `ts_ms` and
    `_index`; columns the type lacks come back null."""

    def __init__(self, event_type: type[msgspec.Struct], columns: dict[str, pl.DataType], max_record_bytes: int):
        self.columns = columns
        spec, kept, self._patterns = _spec(event_type, columns)
        self._kept = kept
        self._decoder = _columnar.Decoder(spec, max_record_bytes)
        self._absent = [(c, t) for c, t in columns.items() if c not in {k.name for k in kept}]
        self._order = [*columns, TS_COLUMN]

    def decode(self, values: list[bytes | None]) -> FastBatch:
        rows, accepted, declined, buffers = self._decoder.decode(values)
        arrays = [pa.Array.from_buffers(k.arrow, rows, _arrow_buffers(k.arrow, b), null_count=b[2])
                  for k, b in zip(self._kept, buffers)]
        frame = pl.from_arrow(pa.RecordBatch.from_arrays(arrays, names=[k.name for k in self._kept]))
        if self._absent:
            frame = frame.with_columns(pl.Series(c, [None], dtype=t).new_from_index(0, rows) if rows
                                       else pl.Series(c, [], dtype=t) for c, t in self._absent)
        frame = frame.select(self._order).with_columns(
            pl.Series(INDEX_COLUMN, np.frombuffer(accepted, dtype=np.int64)))
        if self._patterns and rows:
            frame, refused = self._check_patterns(frame)
            if refused:
                declined = sorted(declined + refused)
        return FastBatch(frame, declined)

    def _check_patterns(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, list[int]]:
        """Records whose value of a patterned field fails its pattern (checked once per
        distinct value in the batch) are declined: the reference decoder names them."""
        bad = None
        for column, pattern in self._patterns:
            failing = [v for v in frame[column].unique().to_list() if v is not None and not pattern.search(v)]
            if failing:
                hit = pl.col(column).is_in(failing)
                bad = hit if bad is None else bad | hit
        if bad is None:
            return frame, []
        refused = frame.filter(bad)[INDEX_COLUMN].to_list()
        return frame.filter(~bad), refused


def _arrow_buffers(arrow: pa.DataType, b: tuple) -> list:
    values, validity, _nulls, data = b
    head = pa.py_buffer(validity) if validity is not None else None
    if data is not None:  # a string column: offsets, then the bytes
        return [head, pa.py_buffer(values), pa.py_buffer(data)]
    return [head, pa.py_buffer(values)]


def _spec(event_type: type[msgspec.Struct], columns: dict[str, pl.DataType]):
    """The decoder's field table from the schema's msgspec types: (name, kind, nullable,
    default kind, default, column type, column, min length, max length, int bounds, float
    bounds, literals) per field; the kept columns in field order; the patterned columns."""
    spec, kept, patterns = [], [], []
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
                if ctype == _C_NONE:
                    kind = _K_DECLINE  # a pattern is checked on a kept column only
                else:
                    patterns.append((column, re.compile(t.pattern)))
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
                     float(fmin), float(fmax), literals))
    return spec, kept, patterns


def _int_bounds(t: msgspec.inspect.IntType) -> tuple[int, int]:
    lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else -_UNBOUNDED)
    hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else _UNBOUNDED)
    return lo, hi
