"""Every CSV the tool writes, written one way: text a spreadsheet would run stays text.

Tenants, models and versions are whatever producers send. A cell such as `=cmd|' /C calc'!A0`
or `+SUM(1+1)` opened in Excel, LibreOffice or Google Sheets is a formula, run on the reader's
machine (OWASP "CSV injection"). Text that starts with `=`, `+`, `-`, `@`, a tab or a carriage
return gets a leading apostrophe, which spreadsheets read as "this is text" and do not show.
Numeric cells are numbers, not text: -0.25 stays -0.25 and reads back as a number. Every text
cell is quoted (OWASP's advice; Python's writer would leave a lone carriage return unquoted with
"\\n" line ends), so no separator, quote or line break inside one can start another cell.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import polars as pl

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
TEXT_MARK = "'"  # what spreadsheets take as "text follows"
_FORMULA_START_PATTERN = r"^[=+\-@\t\r]"


def text_cell(text: str) -> str:
    """`text` as a cell no spreadsheet runs."""
    return TEXT_MARK + text if text.startswith(FORMULA_STARTS) else text


def cell(value: Any) -> Any:
    """One value as a CSV cell: text made safe, lists and maps as JSON text, numbers and
    times as they are, nothing as empty."""
    if value is None:
        return ""
    if isinstance(value, str):
        return text_cell(value)
    if isinstance(value, (list, dict)):
        return text_cell(json.dumps(value, default=str))
    return value


def csv_text(columns: Sequence[str] | None, rows: Iterable[Sequence[Any]]) -> str:
    """A header (none for formats without one) and rows as CSV text, one line per row ("\\n"
    ends each, none after the last)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    if columns is not None:
        writer.writerow([text_cell(c) for c in columns])
    writer.writerows([cell(v) for v in row] for row in rows)
    return buf.getvalue().removesuffix("\n")


def write_rows(path: str | Path, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    out = Path(path)
    out.write_text(csv_text(columns, rows) + "\n", encoding="utf-8")
    return out


def safe_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with every text column's formula-looking cells marked as text; numeric
    columns untouched."""
    text = [name for name, dtype in frame.schema.items() if dtype in (pl.String, pl.Categorical) or
            isinstance(dtype, pl.Enum)]
    if not text:
        return frame
    return frame.with_columns(
        pl.when(pl.col(name).cast(pl.String).str.contains(_FORMULA_START_PATTERN))
        .then(pl.lit(TEXT_MARK) + pl.col(name).cast(pl.String))
        .otherwise(pl.col(name).cast(pl.String)).alias(name)
        for name in text)


def write_frame(frame: pl.DataFrame, path: str | Path) -> Path:
    out = Path(path)
    safe_frame(frame).write_csv(out, quote_style="non_numeric")
    return out
