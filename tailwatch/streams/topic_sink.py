"""The runtime's topic sink: one producer for everything a worker writes to Kafka.

Two kinds of record go through it. Copies (closed buckets and dead letters of a store-backed
worker; resume records): the store or a re-read holds the truth, so a record Kafka refuses
for good is counted and logged once per kind, never fatal. Records that must land (tier
1's partials, frontier markers and dead letters, which only tier 2's store will hold): a
refusal is remembered, and the operator stops before its resume points move past them.
`flush` waits for a paused or unreachable broker rather than let a checkpoint commit past
records never delivered; a worker told to stop waits `STOP_FLUSH_S`, then leaves that
checkpoint uncommitted (`Undelivered`): its records are read again at the next start and
sent then, and the stop fits a container's grace period. The records waiting for delivery
are bounded (`QUEUE_MAX_KBYTES`): `send` waits for room, a stopping worker as long as a
flush.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from confluent_kafka import Producer

from tailwatch.ingest.kafka import KafkaSettings, make_producer, send
from tailwatch.streams.metrics import WorkerMetrics
from tailwatch.streams.sink import Sink

log = logging.getLogger("tailwatch.sink")

STOP_FLUSH_S = 10.0  # how long a stopping worker waits for Kafka to take what it sent


class Undelivered(Exception):
    """Stopping with records Kafka has not taken: the checkpoint covering them is not committed."""


class TopicSink(Sink):
    name = "topics"

    # The copies waiting for delivery, at most (Kafka's own producer default, buffer.memory):
    # a backlog's checkpoint publishes some 100,000 closed rows at once, and with librdkafka's
    # default (1 GiB) all of them sat in the worker's heap until the flush.
    QUEUE_MAX_KBYTES = 32_768

    def __init__(self, kafka: KafkaSettings, metrics: WorkerMetrics, stopping: Callable[[], bool],
                 producer: Callable[..., Producer] | None = None):
        """`producer` makes the producer from `on_refused` and `queue_max_kbytes` (a
        `Connector`'s, streams/source.py); None: ingest/kafka.py's `make_producer` on `kafka`."""
        self.kafka = kafka
        self.metrics = metrics
        self._stopping = stopping
        self._logged: set[tuple[str, str]] = set()
        self.refused: dict[tuple[str, str], int] = {}  # (topic, reason) → records that had to land
        self.must_land: set[str] = set()  # topics whose refusals are remembered (see above)
        make = producer or (lambda **kw: make_producer(kafka, **kw))
        self.producer = make(on_refused=lambda topic, reason: self._failed(topic)(reason),
                             queue_max_kbytes=self.QUEUE_MAX_KBYTES)
        self.gave_up = False  # a stopping flush left records behind: closing waits for nothing more
        self._full_since: float | None = None  # when a stopping send began to wait for room

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None) -> None:
        send(self.producer, topic, value, key, on_error=self._failed(topic), partition=partition,
             while_full=self._while_full)
        self._full_since = None

    def _while_full(self) -> None:
        """The queue is full (the broker is slow, paused or gone): a stopping worker waits
        `STOP_FLUSH_S` for room, as `flush` does, then raises `Undelivered`."""
        if not self._stopping():
            return
        now = time.monotonic()
        self._full_since = self._full_since or now
        if now - self._full_since >= STOP_FLUSH_S:
            self._give_up()

    def _give_up(self) -> None:
        self.gave_up = True
        raise Undelivered(f"stopping with {len(self.producer):,} records Kafka has not taken: the last "
                          "checkpoint is left uncommitted, and the next start reads its records again")

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
        """Everything sent reaches Kafka (or is refused for good) before this returns; a
        stopping worker raises `Undelivered` after `STOP_FLUSH_S` instead."""
        waited_s = stopping_s = 0.0
        while self.producer.flush(1.0) > 0:  # in steps of a second, so that a stop is heard at once
            waited_s += 1.0
            if self._stopping():
                stopping_s += 1.0
                if stopping_s >= STOP_FLUSH_S:
                    self._give_up()
            elif waited_s % 30.0 == 0:
                log.warning("waiting %.0f s for Kafka to take %d records", waited_s, len(self.producer))

    def tick(self, caught_up: bool = False) -> None:
        """From the loop: serve the producer's queue, where librdkafka's log lines wait (a broker
        down adds some twenty a second, and an idle worker sends nothing that would serve them)."""
        self.producer.poll(0)

    def close(self) -> None:
        if not self.gave_up:
            self.producer.flush(10)
        self.producer = None  # its threads would keep dialling a broker that may be gone
