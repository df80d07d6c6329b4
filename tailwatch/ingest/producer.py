"""Publishing events to Kafka: typed events from the simulator, or JSON Lines from files.

`publish_lines` validates each line against the schema it names before publishing: a
valid record is re-encoded from its typed form (so fields outside the schema never
reach Kafka from here), a bad one goes to the dead-letter topic with its reason.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import msgspec

from tailwatch.ingest import deadletter
from tailwatch.ingest.schema import EVENT_TYPES, TOPIC_OF_SCHEMA, partition_key
from tailwatch.ingest.validate import UNKNOWN_SCHEMA, BatchDecoder
from tailwatch.ingest.kafka import KafkaSettings, make_producer, send
from tailwatch.conventions import TOPIC_DEADLETTER

_SCHEMA_RE = re.compile(rb'"schema"\s*:\s*"([^"\\]{1,40})"')
_encoder = msgspec.json.Encoder()


@dataclass
class PublishReport:
    published: Counter = field(default_factory=Counter)  # by topic
    rejected: Counter = field(default_factory=Counter)  # by reason
    unknown_fields_dropped: int = 0

    def lines(self) -> list[str]:
        out = [f"published {n:,} to {t}" for t, n in sorted(self.published.items())]
        out += [f"rejected {n:,}: {r}" for r, n in sorted(self.rejected.items())]
        if self.unknown_fields_dropped:
            out.append(f"dropped fields outside the schema from {self.unknown_fields_dropped:,} records")
        return out or ["nothing to publish"]


class EventPublisher:
    def __init__(self, settings: KafkaSettings, producer=None):
        """`producer`: one with confluent_kafka.Producer's calls (a test's topics in memory,
        streams/memory_source.py); None: Kafka's, from `settings`."""
        self.settings = settings
        self.producer = make_producer(settings) if producer is None else producer
        self.report = PublishReport()
        self._lines_before = 0  # line number of the current batch's first line

    def publish_events(self, events: Iterable[msgspec.Struct], progress: Callable[[int], None] | None = None) -> PublishReport:
        for n, event in enumerate(events, 1):
            topic = self.settings.topic(TOPIC_OF_SCHEMA[event.schema])  # type: ignore[attr-defined]
            send(self.producer, topic, _encoder.encode(event), partition_key(event))
            self.report.published[topic] += 1
            if n % 20_000 == 0:
                self.producer.poll(0)
                if progress:
                    progress(n)
        return self.report

    def publish_lines(self, lines: Iterable[bytes], source: str, batch: int = 5_000) -> PublishReport:
        pending: list[bytes] = []
        for line in lines:
            line = line.strip()
            if line:
                pending.append(line)
            if len(pending) >= batch:
                self._publish_batch(pending, source)
                pending = []
        if pending:
            self._publish_batch(pending, source)
        return self.report

    def _publish_batch(self, lines: list[bytes], source: str) -> None:
        groups: dict[str, list[int]] = {}
        for i, line in enumerate(lines):
            m = _SCHEMA_RE.search(line)
            name = m.group(1).decode("ascii", "replace") if m else ""
            groups.setdefault(name if name in EVENT_TYPES else "", []).append(i)
        for name, idx in groups.items():
            if not name:
                for i in idx:
                    self._reject(lines[i], source, self._lines_before + i, UNKNOWN_SCHEMA, "no known `schema` field")
                continue
            decoded = _decoder(name).decode([lines[i] for i in idx])
            topic = self.settings.topic(TOPIC_OF_SCHEMA[name])
            for rec in decoded.records:
                send(self.producer, topic, _encoder.encode(rec), partition_key(rec))
                self.report.published[topic] += 1
            self.report.unknown_fields_dropped += decoded.unknown_fields_dropped
            for r in decoded.rejected:
                self._reject(lines[idx[r.index]], source, self._lines_before + idx[r.index], r.reason, r.detail)
        self._lines_before += len(lines)
        self.producer.poll(0)

    def _reject(self, raw: bytes, source: str, line_index: int, reason: str, detail: str) -> None:
        letter = deadletter.make(f"file:{source}", -1, line_index, reason, detail, raw, 0)
        send(self.producer, self.settings.topic(TOPIC_DEADLETTER), deadletter.encode(letter), b"produce")
        self.report.rejected[reason] += 1

    def close(self) -> None:
        left = self.producer.flush(60)
        if left:
            raise RuntimeError(f"{left} messages were not delivered to Kafka within 60 s")


_decoders: dict[str, BatchDecoder] = {}


def _decoder(schema_name: str) -> BatchDecoder:
    if schema_name not in _decoders:
        _decoders[schema_name] = BatchDecoder(EVENT_TYPES[schema_name])
    return _decoders[schema_name]
