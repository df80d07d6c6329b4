"""The runtime's topic sink: one producer for everything a worker writes to Kafka.

Two kinds of record go through it. Copies (closed buckets and dead letters of a store-backed
worker; resume records): the store or a re-read holds the truth, so a record Kafka refuses
for good is counted and logged once per kind, never fatal. Records that must land (tier
1's partials, frontier markers and dead letters, which only tier 2's store will hold): a
refusal is remembered, and the operator stops before its resume points move past them.
`flush` waits for a paused or unreachable broker rather than let a checkpoint commit past
records never delivered.
"""

from __future__ import annotations

import logging
from typing import Callable

from ingest.kafka import KafkaSettings, make_producer, send
from streams.metrics import WorkerMetrics

log = logging.getLogger("tailwatch.sink")


class TopicSink:
    def __init__(self, kafka: KafkaSettings, metrics: WorkerMetrics, stopping: Callable[[], bool]):
        self.kafka = kafka
        self.metrics = metrics
        self._stopping = stopping
        self._logged: set[tuple[str, str]] = set()
        self.refused: dict[tuple[str, str], int] = {}  # (topic, reason) → records that had to land
        self.must_land: set[str] = set()  # topics whose refusals are remembered (see above)
        self.producer = make_producer(kafka, on_refused=lambda topic, reason: self._failed(topic)(reason))

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None) -> None:
        send(self.producer, topic, value, key, on_error=self._failed(topic), partition=partition)

    def _failed(self, topic: str) -> Callable[[str], None]:
        def failed(reason: str) -> None:
            self.metrics.publish_failures.labels(topic, reason).inc()
            if topic in self.must_land:
                self.refused[(topic, reason)] = self.refused.get((topic, reason), 0) + 1
            elif (topic, reason) not in self._logged:  # once per kind: poison can come in floods
                self._logged.add((topic, reason))
                log.warning("Kafka refused a record for %s (%s); the store keeps it, the worker goes on", topic, reason)
        return failed

    def flush(self) -> None:
        """Everything sent reaches Kafka (or is refused for good) before this returns: a
        stopping worker gives up after 30 s, one line in the log."""
        waited_s = 0.0
        while self.producer.flush(5.0) > 0:
            waited_s += 5.0
            if self._stopping() and waited_s >= 30.0:
                log.error("stopping with %d records not delivered to Kafka", len(self.producer))
                return
            if waited_s % 30.0 == 0:
                log.warning("waiting %.0f s for Kafka to take %d records", waited_s, len(self.producer))

    def close(self) -> None:
        self.producer.flush(10)
        self.producer = None  # its threads would keep dialling a broker that may be gone
