"""Read queries over the store's bucket tables: the newest and oldest minutes, recent
buckets, and runs of whole minutes in pieces of bounded rows (a stage rebuilding its state
from six hours of a big fleet cannot read them at once).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterator

import duckdb
import polars as pl

from tailwatch.conventions import SLICE_LABELS


def newest_minute(con: duckdb.DuckDBPyConnection, table: str) -> int | None:
    """The newest minute (epoch minutes) a bucket table holds rows of."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    row = con.execute(f"SELECT epoch(max(window_start)) FROM {table}").fetchall()[0]
    return int(row[0]) // 60 if row and row[0] is not None else None


def oldest_minute(con: duckdb.DuckDBPyConnection, table: str) -> int | None:
    """The oldest minute (epoch minutes) a bucket table holds rows of."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    row = con.execute(f"SELECT epoch(min(window_start)) FROM {table}").fetchall()[0]
    return int(row[0]) // 60 if row and row[0] is not None else None


def selector_rows(con: duckdb.DuckDBPyConnection, selector: dict[str, str]) -> int:
    """How many rows of `sli_minute` an SLO's selector picks (label names as the spec checked
    them against conventions.SLICE_LABELS)."""
    labels = [label for label in selector if label in SLICE_LABELS]
    where = " AND ".join(f'"{label}" = ?' for label in labels) or "TRUE"
    return int(con.execute(f"SELECT count(*) FROM sli_minute WHERE {where}",
                           [selector[k] for k in labels]).fetchall()[0][0])


def has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether the store has this table (a store of an older release, opened read-only, may not)."""
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]).fetchall()[0][0])


def recent_buckets(con: duckdb.DuckDBPyConnection, minutes: int, table: str = "sli_minute") -> pl.DataFrame:
    """Rows of the newest `minutes` minutes of `sli_minute` or `gpu_minute` (what SLO
    state and the signal API's view are rebuilt from)."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    return query_frame(
        con, f"SELECT * FROM {table} WHERE window_start >= (SELECT max(window_start) FROM {table}) - to_minutes($1)",
        [minutes])


# Rows of a bucket table read at once when a stage's state is rebuilt from it: a fleet's
# six hours (100,000 busy slices: 36 million rows, histograms included) do not fit in memory.
BUCKET_CHUNK_ROWS = 200_000


@dataclass(frozen=True)
class BucketPiece:
    """Rows of a bucket table to read in one go: the minutes [first_minute, end_minute), or,
    where one minute alone holds more than a piece may, share `part` of its `parts` shares."""

    first_minute: int
    end_minute: int
    part: int = 0
    parts: int = 1


def bucket_pieces(rows_by_minute: list[tuple[int, int]], max_rows: int) -> list[BucketPiece]:
    """Cut (minute, rows) counts, in minute order, into pieces of at most about `max_rows`
    rows: runs of whole minutes, and a minute over the limit in equal shares of its rows
    (each share its own piece, one after the other)."""
    pieces: list[BucketPiece] = []
    first, rows = None, 0
    for minute, n in rows_by_minute:
        if first is not None and rows + n > max_rows:
            pieces.append(BucketPiece(first, minute))
            first, rows = None, 0
        if n > max_rows:
            parts = -(-n // max_rows)
            pieces += [BucketPiece(minute, minute + 1, part, parts) for part in range(parts)]
            continue
        if first is None:
            first = minute
        rows += n
    if first is not None:
        pieces.append(BucketPiece(first, rows_by_minute[-1][0] + 1))
    return pieces


def _rows_by_minute(con: duckdb.DuckDBPyConnection, table: str, since_minute: int) -> list[tuple[int, int]]:
    """(minute, rows) of a bucket table from `since_minute` on, in minute order."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    return [(int(m), int(n)) for m, n in con.execute(
        f"SELECT epoch(window_start)::BIGINT // 60 AS minute, count(*) FROM {table} "
        "WHERE window_start >= make_timestamp($1::BIGINT * 60000000) GROUP BY minute ORDER BY minute",
        [since_minute]).fetchall()]


def minute_runs(con: duckdb.DuckDBPyConnection, since_minute: int, max_rows: int = BUCKET_CHUNK_ROWS,
                table: str = "sli_minute") -> list[tuple[int, int | None]]:
    """[first, end) runs of whole minutes from `since_minute` on, each holding at most about
    `max_rows` rows of `table` (a minute that alone holds more is a run of its own), together
    covering every minute from `since_minute` on (the last run's end is None: open), so that
    rows of other tables in the same minutes are read with them."""
    pieces = bucket_pieces(_rows_by_minute(con, table, since_minute), max_rows)
    firsts = [since_minute, *sorted({p.first_minute for p in pieces if p.first_minute > since_minute})]
    return list(zip(firsts, [*firsts[1:], None]))


def bucket_runs(con: duckdb.DuckDBPyConnection, since_minute: int, request_columns: str = "*",
                max_rows: int = BUCKET_CHUNK_ROWS) -> Iterator[tuple[int, int | None, pl.DataFrame, pl.DataFrame]]:
    """(first, end, sli_minute rows, gpu_minute rows) of `minute_runs` from `since_minute` on,
    in event-time order: both tables' rows of the same whole minutes, at most about `max_rows`
    request rows at a time, for a stage that rebuilds from them as the minutes closed."""
    for lo, hi in minute_runs(con, since_minute, max_rows=max_rows):
        within = "window_start >= $1" + ("" if hi is None else " AND window_start < $2")
        bounds = [_minute_utc(lo)] + ([] if hi is None else [_minute_utc(hi)])
        yield (lo, hi, query_frame(con, f"SELECT {request_columns} FROM sli_minute WHERE {within}", bounds),
               query_frame(con, f"SELECT * FROM gpu_minute WHERE {within}", bounds))


def _minute_utc(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, tz=timezone.utc).replace(tzinfo=None)


def recent_bucket_chunks(con: duckdb.DuckDBPyConnection, minutes: int, table: str = "sli_minute",
                         max_rows: int = BUCKET_CHUNK_ROWS) -> Iterator[pl.DataFrame]:
    """`recent_buckets`, in event-time order, at most about `max_rows` rows at a time (whole
    minutes, or shares of one minute's rows where it alone holds more): a month of a busy
    fleet's rows held at once took gigabytes to rebuild SLO windows from, and so did six hours
    of a big one. The rows of a minute read in shares come in consecutive frames."""
    if table not in ("sli_minute", "gpu_minute"):
        raise ValueError(f"not a bucket table: {table}")
    newest = newest_minute(con, table)
    if newest is None:
        return
    for piece in bucket_pieces(_rows_by_minute(con, table, newest - minutes), max_rows):
        # rowid: any split of the minute's rows serves (the SLO engine adds a minute's shares up).
        share = "" if piece.parts == 1 else f" AND rowid % {piece.parts} = {piece.part}"
        yield query_frame(con, f"SELECT * FROM {table} WHERE window_start >= make_timestamp($1::BIGINT * 60000000) "
                               f"AND window_start < make_timestamp($2::BIGINT * 60000000){share} ORDER BY window_start",
                          [piece.first_minute, piece.end_minute])


def query_frame(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pl.DataFrame:
    """A query's rows as a polars frame. Through `execute`, not `con.sql`: DuckDB 2 refuses
    relation queries on a connection whose previous result was not fetched to the end
    (a `fetchone()` anywhere before), while `execute` starts afresh."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Arrow output on a DB-API result")  # one extra copy: fine here
        return pl.from_arrow(con.execute(sql, params or []).to_arrow_table())
