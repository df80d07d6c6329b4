"""The month bench has the worker write its copies compressed (tools/bench_month.py), so that
the embedded broker, which keeps every record in memory, holds a month of them: a reader must
still get the very bytes written, every one, through the real broker. Month records stand in
for the copies here: the same labels, the same repetition a codec feeds on."""

from __future__ import annotations

from dataclasses import replace

from confluent_kafka import Consumer, KafkaError, TopicPartition

from tailwatch.ingest.kafka import make_producer, send
from tailwatch_dev.bench_month import COMPRESSION, month_events


def test_compressed_records_read_back_as_written(kafka):
    settings = replace(kafka, client_config={"compression.type": COMPRESSION})
    topic = settings.topic("requests")
    producer = make_producer(settings)
    published = [value for _m, _i, _e, key, value in month_events(200, 60, 5, seed=7)
                 if send(producer, topic, value, key) is None]
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "month-read-back",
                         "enable.partition.eof": True})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, q, 0) for q in partitions])
    read, ended = [], set()
    while len(ended) < len(partitions):
        for m in consumer.consume(1000, 5.0):
            if m.error() is None:
                read.append(m.value())
            elif m.error().code() == KafkaError._PARTITION_EOF:
                ended.add(m.partition())
    consumer.close()
    assert len(published) == 2_400  # 200 slices, one request each every 5 minutes, for an hour
    assert sorted(read) == sorted(published)
