"""The HTTP port is a part like the sinks (streams/http_port.py): the tier composition builds
it from the worker's settings and hands it in through `Parts.http`; the runtime starts it."""

from __future__ import annotations

import pytest

from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.streams.http import WorkerHttp
from tailwatch.streams.http_port import HttpPort
from tailwatch.streams.tiers import WorkerSettings, build


@pytest.mark.parametrize("tier", ["all", "1", "2"])
def test_each_tier_hands_the_runtime_its_http_port_unstarted(tier, tmp_path):
    settings = WorkerSettings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"), http_port=0,
                              store_path=str(tmp_path / "store.duckdb"))
    runtime = build(settings, tier)
    assert isinstance(runtime.http, HttpPort) and isinstance(runtime.http, WorkerHttp)
    assert not hasattr(runtime.http, "_process")  # no process until the runtime starts it
    assert (runtime.signals is None) == (tier == "1")


def test_no_port_asked_no_part(tmp_path):
    settings = WorkerSettings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"), http_port=None,
                              store_path=str(tmp_path / "store.duckdb"))
    assert build(settings, "all").http is None
