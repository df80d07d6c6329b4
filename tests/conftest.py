"""Shared fixtures: the real embedded broker, isolated topic prefixes, free ports, and topics
in memory for tests of a worker's logic that need no broker.

A test that needs the broker fails under CI=true when the broker cannot start; it
skips only on a developer machine without it. The broker is one per test process: under
pytest-xdist (`make test`) each process starts its own, and tests share it through topic
prefixes and groups of their own.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tailwatch_dev.broker import BrokerError, EmbeddedBroker, free_port  # noqa: F401 (tests import it from here)
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
from tailwatch.streams.memory_source import MemoryTopics
from tailwatch_dev.traces import AZURE_CODE_TRACE as AZURE_TRACE, H100_LAB, MOONCAKE_TRACE  # noqa: F401 (tests import them from here)


BROKER_FIXTURES = {"broker", "kafka", "own_broker"}  # own_broker: a test that restarts one of its own
MEMORY_FIXTURES = {"memory", "new_memory"}


def pytest_collection_modifyitems(config, items):
    """A test that asks for the broker (the session's, or one of its own) is a `broker` test
    whether or not it says so, so that `make test-fast` (-m "not broker and not slow") starts no
    broker. A test that starts one in a subprocess (`tailwatch demo`, `bench`) says so itself.
    A test on topics in memory (`memory`, or a fixture of its own made with `new_memory`) is
    a `memory` test."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if BROKER_FIXTURES & names:
            item.add_marker(pytest.mark.broker)
        if MEMORY_FIXTURES & names:
            item.add_marker(pytest.mark.memory)


def need(condition: bool, what: str) -> None:
    """Skip when a real component is missing, except under CI, where that is a failure."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} is not available here")


def start_broker() -> EmbeddedBroker:
    """An embedded broker on a free port (the test skips without one, or fails under CI)."""
    b = EmbeddedBroker(port=free_port())
    try:
        b.start()
    except BrokerError as exc:
        need(False, f"the embedded broker ({exc})")
    return b


@pytest.fixture(scope="session")
def broker():
    b = start_broker()
    yield b
    b.stop()


@pytest.fixture
def kafka(broker) -> KafkaSettings:
    """Settings with a topic prefix of this test's own, so tests never share topics."""
    settings = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(settings, partitions=2)
    return settings


def memory_topics(partitions: int = 2) -> MemoryTopics:
    """The tailwatch topics in memory (streams/memory_source.py), under a prefix of their own;
    `build(..., connector=topics)` runs a worker on them, and tests/test_pipeline.py's
    `publish`, `send_raw`, `read_topic` and `run_worker` take them where they take Kafka's settings."""
    topics = MemoryTopics(KafkaSettings(bootstrap_servers="memory", topic_prefix=f"m{uuid.uuid4().hex[:8]}."),
                          partitions=partitions)
    topics.ensure(partitions)
    return topics


@pytest.fixture
def memory() -> MemoryTopics:
    """The `kafka` fixture's topics, in memory: a worker's logic (windows, stages, store,
    signal view) with no broker. Kafka's own behaviour (groups, rebalances, logs reset,
    refusals, restarts from offsets) is the broker tests'."""
    return memory_topics()


@pytest.fixture(scope="session")
def new_memory():
    """`memory_topics`, for a module's fixture that makes a store once on topics of its own."""
    return memory_topics


def start_until_ready(name: str, argv: list[str], port: int, log_path: Path, timeout_s: float = 30.0):
    """Start a Prometheus-family binary and wait for its `/-/ready`; fail the test (with the
    end of its log) if it exits or is not ready in time. Returns (process, base URL)."""
    import subprocess
    import time
    import urllib.request

    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/-/ready", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    proc.kill()
    pytest.fail(f"{name} did not become ready: {log_path.read_text()[-2000:]}")


_API_CLIENTS: dict[int, object] = {}


def call_api(api, method: str, path: str, authorization: str | None = None, body: bytes = b"") -> tuple[int, str, bytes]:
    """One request through the signal API's real routes (Litestar, in process): (status,
    content type, body)."""
    headers = {"authorization": authorization} if authorization else {}
    r = api_client(api).request(method, path, headers=headers, content=body or None)
    return r.status_code, r.headers.get("content-type", ""), r.content


def api_client(api):
    """Litestar's test client over the signal API's real routes for `api`, made once."""
    from litestar.testing import TestClient

    from tailwatch.signals.routes import make_app

    client = _API_CLIENTS.get(id(api))
    if client is None or client.app.state.get("api") is not api:
        app = make_app(api)
        app.state["api"] = api
        client = _API_CLIENTS[id(api)] = TestClient(app)
    return client


def worker_command(bootstrap: str, topic_prefix: str, store: Path, http_port: int, *extra: str) -> list[str]:
    """`tailwatch worker` as a test runs it: its own group, one partition, no detectors."""
    import sys

    return [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", bootstrap, "--topic-prefix", topic_prefix,
            "--store", str(store), "--http-port", str(http_port), "--group", f"g-{uuid.uuid4().hex[:6]}",
            "--partitions", "1", "--detectors", "none", *extra]
