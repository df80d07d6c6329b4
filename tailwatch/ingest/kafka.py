"""Kafka connection settings and the clients built from them (confluent-kafka).

Every command that touches Kafka goes through `KafkaSettings`: `--bootstrap-servers`
for a real cluster, `--kafka-config FILE` for SASL/TLS and any other librdkafka
property (`key=value` lines), and the topic prefix.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tailwatch.conventions import TOPIC_GPU, TOPIC_REQUESTS, TOPIC_SUFFIXES
from tailwatch.ingest.kafka_log import KAFKA_LOG

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
INPUT_SUFFIXES = (TOPIC_REQUESTS, TOPIC_GPU)  # what producers outside tailwatch write


class KafkaUnavailable(Exception):
    """No broker answers: carries a one-line hint for the user."""


class ConfigError(Exception):
    """A bad flag or config file: carries a one-line message naming the problem."""


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    topic_prefix: str = "tw."
    client_config: dict[str, str] = field(default_factory=dict)

    def topic(self, suffix: str) -> str:
        return f"{self.topic_prefix}{suffix}"

    def base_config(self) -> dict:
        # Idle connections closed by the broker are routine; librdkafka would log each one. What
        # it logs goes through Python's logging, its repeats folded (a broker down: ingest/kafka_log.py).
        return {"bootstrap.servers": self.bootstrap_servers, "log.connection.close": False, "logger": KAFKA_LOG,
                **self.client_config}


def read_client_config(path: str | None) -> dict[str, str]:
    """librdkafka properties from a `key=value` file (blank lines and # comments allowed)."""
    if not path:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--kafka-config: no such file {path}")
    out: dict[str, str] = {}
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:  # never echoed: the line may hold a password
            raise ConfigError(f"{path}:{lineno}: expected key=value (the line is not shown: it may hold a secret)")
        k, v = line.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def ensure_reachable(settings: KafkaSettings, timeout_s: float = 3.0) -> None:
    """Raise KafkaUnavailable with a one-line hint when no broker answers."""
    if not any(_tcp_open(server, timeout_s) for server in settings.bootstrap_servers.split(",")):
        if settings.bootstrap_servers == DEFAULT_BOOTSTRAP:
            raise KafkaUnavailable(
                f"no Kafka broker answers on {DEFAULT_BOOTSTRAP}: start the embedded one with "
                "`tailwatch broker` (or pass --bootstrap-servers HOST:PORT)"
            )
        raise KafkaUnavailable(f"no Kafka broker answers on {settings.bootstrap_servers}")
    quiet = logging.getLogger("tailwatch.kafka.probe")
    quiet.setLevel(logging.CRITICAL)
    try:
        AdminClient({**settings.base_config(), "logger": quiet}).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaUnavailable(f"Kafka at {settings.bootstrap_servers} did not answer: {exc.args[0]}") from None


def _tcp_open(server: str, timeout_s: float) -> bool:
    host, _, port = server.strip().rpartition(":")
    try:
        socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s).close()
        return True
    except (OSError, ValueError):
        return False


def ensure_topics(settings: KafkaSettings, partitions: int = 4, others: tuple[str, ...] = ()) -> None:
    """The prefixed tailwatch topics, and `others` by their full names (the Collector's)."""
    admin = AdminClient(settings.base_config())
    existing = set(admin.list_topics(timeout=10).topics)
    wanted = [t for t in (*(settings.topic(s) for s in TOPIC_SUFFIXES), *others) if t not in existing]
    if not wanted:
        return
    # replication_factor=-1: the cluster's default.replication.factor (KIP-464), not 1, which
    # would leave a real cluster's topics on one broker. The input topics' record timestamps
    # are the broker's (LogAppendTime): event time is bounded by them (streams/frames.py), and
    # a producer's own clock could be forged.
    inputs = {settings.topic(s) for s in INPUT_SUFFIXES}
    futures = admin.create_topics([
        NewTopic(t, num_partitions=partitions, replication_factor=-1,
                 config={"message.timestamp.type": "LogAppendTime"} if t in inputs else {})
        for t in wanted])
    for topic, fut in futures.items():
        try:
            fut.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another process made it first: fine
                raise


def make_producer(settings: KafkaSettings, on_refused: Callable[[str, str], None] | None = None,
                  queue_max_kbytes: int | None = None) -> Producer:
    """A producer for batches of records. `on_refused(topic, reason)` hears of each record
    that failed on delivery: one callback for the producer, because a callback per record
    costs librdkafka's binding a state object each (measured on the embedded broker,
    producing and delivering tw.sli-sized records: 3.5 against 2.1 µs a record).
    `queue_max_kbytes` bounds the records waiting for delivery (librdkafka's default, 1 GiB,
    otherwise); only for a producer fed through `send`, which waits for room."""
    def delivered(err, msg) -> None:
        if err is not None:
            on_refused(msg.topic(), _reason(err))

    return Producer({
        **({"on_delivery": delivered} if on_refused is not None else {}),
        "linger.ms": 20,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 1_000_000,
        **({"queue.buffering.max.kbytes": queue_max_kbytes} if queue_max_kbytes else {}),
        "enable.idempotence": False,
        # Every caller wants to hear of failures only (`send`'s on_error): without this each
        # delivered record calls back into Python at the next poll (measured: produce 2.4 →
        # 1.45 µs a record, before the callbacks, on the worker's tw.sli copies).
        "delivery.report.only.error": True,
        **settings.base_config(),
    })


def make_consumer(settings: KafkaSettings, group_id: str, instance_id: str | None = None) -> Consumer:
    """A batch consumer. `instance_id` makes it a static member (KIP-345): a restarted
    process with the same id takes its partitions back at once instead of waiting for the
    dead member's session to time out while the group hands its partitions to others."""
    static = {"group.instance.id": instance_id} if instance_id else {}
    return Consumer({
        "group.id": group_id,
        **static,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        # A dead member's partitions come back after this (plus a rebalance): measured on the
        # embedded broker, a restart after two quick crashes owns every partition in 5 s at
        # 3 s, 12 s at 6 s. Heartbeats run on librdkafka's own thread, so a long checkpoint
        # does not expire the worker.
        "session.timeout.ms": 3000,
        "heartbeat.interval.ms": 1000,
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 10_485_760,
        # The prefetch queue, for all partitions together: a worker behind its topics keeps it
        # full, so all of it is RSS. librdkafka's default (64 MiB) holds seconds of events at
        # the worker's rate; more buys nothing but memory.
        "queued.max.messages.kbytes": 65_536,
        **settings.base_config(),
    })


def send(producer: Producer, topic: str, value: bytes, key: bytes | None = None,
         on_error: Callable[[str], None] | None = None, partition: int | None = None,
         while_full: Callable[[], None] | None = None) -> None:
    """Produce, waiting for room in librdkafka's queue instead of failing when it is full.

    Without `on_error` a record refused at once (larger than the producer's
    `message.max.bytes`, unknown topic) raises; with it, the record is handed to `on_error`
    with the reason, so a caller for whom the topic is a copy (dead letters, closed buckets:
    the store holds the truth) can count it and go on. A record that fails later, on
    delivery, goes to the producer's `on_refused` (see `make_producer`). While the queue is
    full, `while_full` is called before each wait; it may raise to stop waiting (a stopping
    worker's sink does, once it has waited long enough).
    """
    where = {} if partition is None else {"partition": partition}
    while True:
        try:
            producer.produce(topic, value, key=key, **where)
            return
        except BufferError:
            if while_full is not None:
                while_full()  # may raise: a stopping worker gives up on a broker that takes nothing
            producer.poll(0.05)
        except KafkaException as exc:
            if on_error is None:
                raise
            on_error(_reason(exc.args[0] if exc.args else exc))
            return


def _reason(err) -> str:
    return err.name() if hasattr(err, "name") else str(err)


def read_latest(settings: KafkaSettings, topic: str, partitions: list[int], tail: int = 64,
                timeout_s: float = 10.0) -> dict[int, bytes]:
    """The newest record of each partition (absent: an empty partition), read without a group.

    It reads the last `tail` records up to the end rather than the one before the high
    watermark: the embedded broker reports the end of a multi-record batch as its first
    offset + 1, so the record at high - 1 is not always the newest."""
    if not partitions:
        return {}
    consumer = Consumer({**settings.base_config(), "group.id": "tailwatch-read-latest", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        starts = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            if high > low:
                starts.append(TopicPartition(topic, p, max(low, high - tail)))
        out: dict[int, bytes] = {}
        pending = {tp.partition for tp in starts}
        if not starts:
            return out
        consumer.assign(starts)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise KafkaException(f"reading {topic} partitions {sorted(pending)} to their end timed out")
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                err = m.error()
                if err is None:
                    out[m.partition()] = m.value()
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(m.partition())
                else:
                    raise KafkaException(err)
        return out
    finally:
        consumer.close()
