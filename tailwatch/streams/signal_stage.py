"""The signal API's stage: feeds closed minutes to the live view (signals/live.py) and
keeps the measured per-replica capacity in the store.

`pool_capacity` holds, per pool and UTC day, the most work per warm replica the pool
sustained with its latency SLOs held. It is written in the checkpoint transaction, read
back on start, and is what `tailwatch capacity measured` prints.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Callable

import duckdb
import msgspec
import polars as pl

from tailwatch.signals.live import LiveSignals, SignalSnapshot
from tailwatch.signals.served import ServedView, ViewEncoder
from tailwatch.store.queries import bucket_runs, newest_minute, query_frame

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS pool_capacity (
    pool VARCHAR, day DATE, work_gpu_s_per_s_per_replica DOUBLE, sustained_minutes INTEGER
);
"""
_EPOCH_DAY = date(1970, 1, 1)


class SignalStage:
    """Closed minutes into the live view; `view` is what the HTTP process answers from."""

    name = "signals"
    alerts = None  # pages nothing

    def __init__(self, live: LiveSignals, slo_states: Callable[[], list] = list,
                 alert_details: Callable[[], dict[str, str]] = dict):
        self.live = live
        self.slo_states = slo_states  # the SLO stage's states, if the worker runs one
        self.alert_details = alert_details  # and what explains each firing page
        self.encoder = ViewEncoder()  # each answer encoded once, kept while it holds

    def snapshot(self, open_requests: pl.DataFrame, open_gpu: pl.DataFrame, wall_s: float) -> SignalSnapshot:
        """The view from kept buckets, the SLO states and a peek at the open minutes;
        `wall_s` only ages the answers (no decision reads it)."""
        return self.live.snapshot(open_requests, open_gpu, self.slo_states(), wall_s=wall_s,
                                  alert_details=self.alert_details())

    def view(self, open_requests: pl.DataFrame, open_gpu: pl.DataFrame, inputs_behind: dict[str, str],
             wall_s: float) -> ServedView:
        """The snapshot with the inputs the worker is behind on, each answer encoded once to
        the JSON clients receive (signals/served.py): what the HTTP port answers from."""
        snap = self.snapshot(open_requests, open_gpu, wall_s)
        return self.encoder.serve(msgspec.structs.replace(snap, inputs_behind=inputs_behind))

    def collectors(self) -> list:
        return []

    def rebuild(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(SCHEMA_SQL)
        newest = [m for m in (newest_minute(con, "sli_minute"), newest_minute(con, "gpu_minute"))
                  if m is not None]
        if newest:
            # In runs of whole minutes, in order, as they closed: the view keeps its minutes
            # rolled up, and 30 minutes of 100,000 busy slices read at once held 7 GiB at start.
            for _first, _end, requests, gpu in bucket_runs(
                    con, min(newest) - self.live.policy.history_minutes):
                self.live.add_closed(requests, gpu)
        for pool, day, best in load_pool_capacity(con, self.live.policy.capacity_history_days).iter_rows():
            self.live.capacity.restore(pool, (day - _EPOCH_DAY).days, best)

    def on_closed(self, requests: pl.DataFrame, gpu: pl.DataFrame,
                  backlogged: frozenset[str] = frozenset()) -> dict[str, pl.DataFrame]:
        raised = self.live.add_closed(requests, gpu)
        if not raised:
            return {}
        return {"pool_capacity": pl.DataFrame(
            {"pool": [p for p, _, _ in raised], "day": [_EPOCH_DAY + timedelta(days=d) for _, d, _ in raised],
             "work_gpu_s_per_s_per_replica": [b for _, _, b in raised],
             "sustained_minutes": [self.live.policy.sustained_minutes] * len(raised)},
            schema={"pool": pl.String, "day": pl.Date, "work_gpu_s_per_s_per_replica": pl.Float64,
                    "sustained_minutes": pl.Int32})}

    def on_corrected(self, requests: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """The live view answers from recent minutes as they closed; the store has the corrections."""
        return {}

    def committed(self) -> None:
        pass



def load_pool_capacity(con: duckdb.DuckDBPyConnection, days: int) -> pl.DataFrame:
    """Best per pool and day over the newest `days` days of the table (rows only ever rise)."""
    return query_frame(con, """
        SELECT pool, day, max(work_gpu_s_per_s_per_replica) AS best FROM pool_capacity
        WHERE day > (SELECT max(day) FROM pool_capacity) - CAST($1 AS INTEGER) GROUP BY ALL ORDER BY pool, day""", [days])
