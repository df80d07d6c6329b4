"""Helpers for polars frames that outlive the batch they were cut from, shared by every room
that holds rows (streams, detectors, signals); here because `slo/` is the lowest room all of
them import."""

from __future__ import annotations

from typing import Sequence

import polars as pl


def compact_strings(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame with its string columns copied into buffers of their own.

    A polars string column cut from another (a group-by's keys, a filter, a gather) points
    into the source's buffers and keeps all of them alive: a closed minute's few thousand
    label values held the label columns of every batch that fed it (tens of MB a minute
    with 20,000 slices), and the detectors hold closed minutes for up to an hour. Copying
    costs about 75 ns a value; do it where rows start to outlive their batch.
    """
    strings = [c for c, t in frame.schema.items() if t == pl.String]
    if not strings or frame.height == 0:
        return frame
    return frame.with_columns(fresh_strings(strings))


def fresh_strings(columns: Sequence[str]) -> list[pl.Expr]:
    """`compact_strings` as expressions, for a lazy plan: these string columns, copied."""
    # concat_str writes fresh values; cast/rechunk/clone would keep the shared buffers.
    return [pl.concat_str([pl.col(c), pl.lit("")]).alias(c) for c in columns]
