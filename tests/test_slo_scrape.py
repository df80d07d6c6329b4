"""/metrics reads the SLO tables on its own thread while the worker adds slices to them: a
slice added between the two never fails the scrape (a label flood adds thousands)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from prometheus_client import CollectorRegistry, generate_latest

from tailwatch.slo.spec import load_slos
from tailwatch.streams.slo_stage import SloStage
from tests.test_slo import AVAIL

SPEC = AVAIL + "    slice_by: [zone]\n"


def test_a_slice_added_while_a_scrape_reads_the_tables_waits_for_the_next_scrape(tmp_path):
    (tmp_path / "slos.yaml").write_text(SPEC)
    stage = SloStage(load_slos(tmp_path / "slos.yaml"))
    stage.on_closed(pl.DataFrame([{"window_start": datetime(2026, 11, 2), "workload": "llm", "zone": z,
                                   "requests": 100, "ok": 99, "cancelled": 0} for z in ("a", "b")]), pl.DataFrame())
    registry = CollectorRegistry()
    for c in stage.collectors():
        registry.register(c)
    (table,) = stage.collector.tables
    read_rates = table.rates

    def rates_then_the_worker_adds_a_slice():
        out = read_rates()
        table.column(("c",))  # the worker's thread, between the scrape's two reads
        return out

    table.rates = rates_then_the_worker_adds_a_slice
    text = generate_latest(registry).decode()
    assert 'zone="a"' in text and 'zone="b"' in text and 'zone="c"' not in text
    del table.rates  # the next scrape sees the new slice
    assert 'zone="c"' in generate_latest(registry).decode()
