"""The dead-letter record: a bounded copy of the raw bytes, where they came from, and why
they were refused.

The envelope must fit any producer's size limit whatever the input was (a 2 MB record
must not turn into a 2.7 MB dead letter that the producer refuses, which used to
crash-loop the worker), so it carries the first `RAW_PREFIX_BYTES` of the raw bytes,
their full size and their SHA-256: enough to find the record in the source topic (topic,
partition, offset) and to prove which record it was, never more than about 90 KB.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import datetime, timezone

import msgspec
import polars as pl

from tailwatch.ingest.schema import MAX_EVENT_TS_MS, MIN_EVENT_TS_MS

SCHEMA = "deadletter.v2"
RAW_PREFIX_BYTES = 64 * 1024  # base64 makes it 87,384 bytes: far below librdkafka's 1,000,000 default


class DeadLetter(msgspec.Struct, gc=False):
    schema: str
    source_topic: str
    source_partition: int
    source_offset: int
    reason: str
    detail: str
    size_bytes: int  # of the whole raw record
    sha256: str  # hex digest of the whole raw record
    raw_truncated: bool  # True when raw_prefix_base64 holds only the first RAW_PREFIX_BYTES
    raw_prefix_base64: str  # raw bytes may be invalid UTF-8, so they travel encoded
    kafka_ts_ms: int  # the source message's own timestamp, so replays give the same rows


def make(topic: str, partition: int, offset: int, reason: str, detail: str, raw: bytes | None, kafka_ts_ms: int) -> DeadLetter:
    raw = raw or b""
    return DeadLetter(
        SCHEMA, topic, partition, offset, reason, detail, len(raw), hashlib.sha256(raw).hexdigest(),
        len(raw) > RAW_PREFIX_BYTES, base64.b64encode(raw[:RAW_PREFIX_BYTES]).decode(), kafka_ts_ms,
    )


_encoder = msgspec.json.Encoder()


def encode(letter: DeadLetter) -> bytes:
    return _encoder.encode(letter)


def _record_time(ms: int) -> datetime | None:
    """The source record's timestamp as a time; None when it has none or it is absurd (a
    producer sets its own, and year 292 million does not fit a TIMESTAMP)."""
    if not MIN_EVENT_TS_MS <= ms < MAX_EVENT_TS_MS:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).replace(tzinfo=None)


def to_frame(letters: list[DeadLetter]) -> pl.DataFrame:
    """Rows for the store's `dead_letter` table (no raw bytes: those stay in the topic)."""
    return pl.DataFrame(
        {
            "ts": [_record_time(d.kafka_ts_ms) for d in letters],
            "source_topic": [d.source_topic for d in letters],
            "source_partition": [d.source_partition for d in letters],
            "source_offset": [d.source_offset for d in letters],
            "reason": [d.reason for d in letters],
            "detail": [d.detail for d in letters],
            "size_bytes": [d.size_bytes for d in letters],
            "sha256": [d.sha256 for d in letters],
        },
        schema={"ts": pl.Datetime("us"), "source_topic": pl.String, "source_partition": pl.Int32,
                "source_offset": pl.Int64, "reason": pl.String, "detail": pl.String, "size_bytes": pl.Int64,
                "sha256": pl.String},
    )
