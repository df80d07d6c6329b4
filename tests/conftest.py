"""Shared fixtures: the real embedded broker, isolated topic prefixes, free ports.

A test that needs the broker fails under CI=true when the broker cannot start; it
skips only on a developer machine without it.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from tailwatch.broker import BrokerError, EmbeddedBroker
from tailwatch.kafka import KafkaSettings, ensure_topics

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AZURE_TRACE = SHARED_DATA / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(condition: bool, what: str) -> None:
    """Skip when a real component is missing, except under CI, where that is a failure."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} is not available here")


@pytest.fixture(scope="session")
def broker():
    b = EmbeddedBroker(port=free_port())
    try:
        b.start()
    except BrokerError as exc:
        need(False, f"the embedded broker ({exc})")
    yield b
    b.stop()


@pytest.fixture
def kafka(broker) -> KafkaSettings:
    """Settings with a topic prefix of this test's own, so tests never share topics."""
    settings = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.")
    ensure_topics(settings, partitions=2)
    return settings
