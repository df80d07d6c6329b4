"""Topic creation on the real broker: the cluster's default replication, races between
processes creating the same topics, and the typed error code instead of message text."""

from __future__ import annotations

import threading
import uuid

from confluent_kafka.admin import AdminClient

from tailwatch.conventions import TOPIC_SUFFIXES
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics


def test_two_processes_creating_the_topics_at_once_both_succeed(broker):
    settings = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"adm{uuid.uuid4().hex[:6]}.")
    errors: list[BaseException] = []

    def create() -> None:
        try:
            ensure_topics(settings, partitions=3)
        except BaseException as exc:  # noqa: BLE001 (collected for the assertion)
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    topics = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics
    for suffix in TOPIC_SUFFIXES:
        meta = topics[settings.topic(suffix)]
        # Replication is the broker's default (one broker here: 1 replica), never forced to 1.
        assert len(meta.partitions) == 3 and all(len(p.replicas) == 1 for p in meta.partitions.values())
