"""The dead-letter record: raw bytes, where they came from, and why they were refused."""

from __future__ import annotations

import base64
from datetime import datetime, timezone

import msgspec
import polars as pl

SCHEMA = "deadletter.v1"


class DeadLetter(msgspec.Struct, gc=False):
    schema: str
    source_topic: str
    source_partition: int
    source_offset: int
    reason: str
    detail: str
    size_bytes: int
    raw_base64: str  # raw bytes may be invalid UTF-8, so they travel encoded
    kafka_ts_ms: int  # the source message's own timestamp, so replays give the same rows


def make(topic: str, partition: int, offset: int, reason: str, detail: str, raw: bytes | None, kafka_ts_ms: int) -> DeadLetter:
    raw = raw or b""
    return DeadLetter(SCHEMA, topic, partition, offset, reason, detail, len(raw), base64.b64encode(raw).decode(), kafka_ts_ms)


_encoder = msgspec.json.Encoder()


def encode(letter: DeadLetter) -> bytes:
    return _encoder.encode(letter)


def to_frame(letters: list[DeadLetter]) -> pl.DataFrame:
    """Rows for the store's `dead_letter` table (no raw bytes: those stay in the topic)."""
    return pl.DataFrame(
        {
            "ts": [datetime.fromtimestamp(d.kafka_ts_ms / 1000, tz=timezone.utc).replace(tzinfo=None) for d in letters],
            "source_topic": [d.source_topic for d in letters],
            "source_partition": [d.source_partition for d in letters],
            "source_offset": [d.source_offset for d in letters],
            "reason": [d.reason for d in letters],
            "detail": [d.detail for d in letters],
            "size_bytes": [d.size_bytes for d in letters],
        },
        schema={"ts": pl.Datetime("us"), "source_topic": pl.String, "source_partition": pl.Int32,
                "source_offset": pl.Int64, "reason": pl.String, "detail": pl.String, "size_bytes": pl.Int64},
    )
