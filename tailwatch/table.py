"""Plain-text, CSV and JSON rendering of query results for the terminal."""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any, Sequence

from tailwatch.reports.csv_out import csv_text


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, (list, dict)):
        s = json.dumps(v, default=str)
        return s if len(s) <= 60 else s[:57] + "..."
    return str(v)


def render(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str = "table") -> str:
    if fmt == "json":
        return "\n".join(json.dumps(dict(zip(columns, r)), default=_json_default) for r in rows)
    if fmt == "csv":
        return csv_text(columns, rows)
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) and rows for i in range(len(columns))]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths))).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _json_default(v: Any) -> Any:
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    return str(v)
