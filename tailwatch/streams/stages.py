"""The interface between the runtime's store sink and what it feeds with closed minutes.

The SLO engine, the detectors, the fleet metrics and the signal view are stages.
A stage is handed the rows of each checkpoint's newly closed minutes and returns rows for
store tables, which the worker writes in the same checkpoint transaction (so a crash
never leaves a detection without its buckets or the reverse). A stage rebuilds its state
from the store on start; what it pages goes through its outbox (`alerts`), which the store
sink delivers from the runtime's loop.
"""

from __future__ import annotations

from typing import Protocol

import duckdb
import polars as pl
from prometheus_client.registry import Collector

from tailwatch.alerts.alertmanager import FiringAlerts


class Stage(Protocol):
    name: str
    alerts: FiringAlerts | None  # its Alertmanager outbox (the store sink delivers it and marks deliveries), or None

    def collectors(self) -> list[Collector]:
        """Prometheus collectors to register on the worker's registry."""
        ...

    def rebuild(self, con: duckdb.DuckDBPyConnection) -> None:
        """On start: create the stage's tables if missing and rebuild its state from the store."""
        ...

    def on_closed(self, requests: pl.DataFrame, gpu: pl.DataFrame,
                  backlogged: frozenset[str] = frozenset()) -> dict[str, pl.DataFrame]:
        """Newly closed `sli_minute` / `gpu_minute` rows (either may be empty: zero rows and
        possibly no columns) → rows per store table, inserted BY NAME in this checkpoint's
        transaction (`alerts` rows are alert changes: store.ALERT_CHANGE_SCHEMA).
        `backlogged`: the tables whose source still has records to read, whose silence is
        therefore a backlog, not an absence."""
        ...

    def on_corrected(self, requests: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """`sli_minute` rows holding only late events of minutes closed before (streams/corrections.py):
        what to add to the past, as `on_closed`'s output. Nothing fires or resolves for the past."""
        ...

    def committed(self) -> None:
        """The checkpoint holding the last `on_closed` output is durable: hand out what it raised."""
        ...


def default_stages(detectors: str | None = "default", alertmanager_urls: tuple[str, ...] = (),
                   links=None, fleet=None) -> list[Stage]:
    """The stages every worker runs (the command line and the demo alike): fleet metrics
    (`fleet`: a FleetMetricsConfig, default its defaults), and the detectors unless
    `detectors` is `none`. The signal stage is the worker's own."""
    from tailwatch.streams.detector_stage import detector_stages
    from tailwatch.streams.fleet_metrics import FleetMetrics

    return [FleetMetrics(fleet), *detector_stages(detectors, alertmanager_urls, links)]
