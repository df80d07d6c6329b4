"""Minutes older than the retention rolled into hours, inside the checkpoint transaction.

The store keeps minute rows (`sli_minute`, `gpu_minute`) for `--minute-retention` (35 days by
default: longer than the longest SLO window plus the correction horizon, so the SLO windows,
`slo status` and corrections only ever read minutes). Older hours are rolled up, an hour at a
time, and their minutes deleted:

- `sli_hour`: one row per hour and slice, the row the hour would have closed with as one
  window (counts add, histograms add bin by bin, quantiles read again from them; the same
  merge a correction uses), plus `gpu_seconds_attributed`: the GPU-seconds the cost report
  attributes to each minute (store/attribution.py: the requests' own, scaled, or a work
  estimate where they reported none), summed.
- `gpu_hour`: one row per hour and GPU: `gpu_minutes` (minute rows: 60 GPU-seconds each),
  sums and maxima as such, means as the mean of the minute means, the last replica state.
- `attribution_minute`: the cost report's per pool-minute scale of the rolled minutes.
- `rolled_minute`: which rolled minutes held request or GPU rows.
- `slo_status`: rows older than the retention keep the last row of each hour and SLO slice.

So the cost report over any range reads both and gives the figures it gave before the
roll-up (tests/test_rollup.py); backtests and the readiness report replay minutes and start
at the oldest minute kept.
"""

from __future__ import annotations

import duckdb
import polars as pl

from tailwatch.store.queries import newest_minute, query_frame
from tailwatch.store.attribution import attributed_sql
from tailwatch.planning import cost
from tailwatch.conventions import SLICE_LABELS
from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.minute_windows import MINUTE_MS, MinuteWindows

# Rows of one hour handled at once: a big fleet's hour is cut into slice groups of about this many minute rows.
CHUNK_ROWS = 200_000
HOURS_PER_CHECKPOINT = 24  # a store upgraded with months of minutes is rolled over several checkpoints

_GPU_HOUR_SQL = """
INSERT INTO gpu_hour BY NAME
SELECT date_trunc('hour', window_start) AS window_start, node, gpu_index, zone, pool, gpu_sku, model, model_version,
       count(*) AS gpu_minutes, sum(samples)::BIGINT AS samples,
       avg(util_pct_mean) AS util_pct_mean, max(util_pct_max) AS util_pct_max,
       max(mem_used_bytes_max) AS mem_used_bytes_max, max(mem_total_bytes) AS mem_total_bytes,
       avg(power_w_mean) AS power_w_mean, max(temp_c_max) AS temp_c_max,
       sum(xid_errors)::BIGINT AS xid_errors, sum(ecc_errors)::BIGINT AS ecc_errors,
       max(queue_depth_max) AS queue_depth_max, max(oldest_queue_age_ms_max) AS oldest_queue_age_ms_max,
       max(running_max) AS running_max, max(active_streams_max) AS active_streams_max,
       max(kv_cache_usage_max) AS kv_cache_usage_max, sum(preemptions)::BIGINT AS preemptions,
       arg_max(replica_state, window_start) AS replica_state,
       avg(sm_active_pct_mean) AS sm_active_pct_mean, avg(sm_occupancy_pct_mean) AS sm_occupancy_pct_mean,
       avg(tensor_active_pct_mean) AS tensor_active_pct_mean, avg(dram_bw_pct_mean) AS dram_bw_pct_mean,
       avg(gr_engine_active_pct_mean) AS gr_engine_active_pct_mean,
       string_agg(DISTINCT sources, ',' ORDER BY sources) AS sources
FROM gpu_minute WHERE window_start >= $1 AND window_start < $2 GROUP BY ALL
"""


def topics_ready(topics) -> bool:
    """Whether a checkpoint of these topics (store.checkpoint.TopicCheckpoint) may roll hours: each has
    closed a minute, or has read its partitions to the end and seen nothing. A topic whose
    first minutes are still open or unread (GPU samples a day behind the requests in a
    backlog) would find its hours rolled without it, and a rolled hour's cost attribution is
    computed once."""
    return all(t.closed_before_minute is not None or (not t.backlogged and not t.watermarks) for t in topics)


class RollUp:
    """Rolls the store's old minutes into hours; the store sink calls it in each checkpoint."""

    def __init__(self, retention_minutes: int):
        self.retention_minutes = retention_minutes  # 0: keep every minute
        self.windows = MinuteWindows(REQUESTS, 0)  # its merge of partials (no events go in)
        self.behind = False  # the last roll stopped at its limit: more hours are due already

    def due(self, con: duckdb.DuckDBPyConnection) -> list[int]:
        """The hours (epoch minutes of their start) to roll in this checkpoint, oldest first:
        every hour that still has minute rows and ends before the retention's edge, counted
        from the newest minute of whichever table is behind (a topic drained later than the
        other must not find its hours rolled already)."""
        if not self.retention_minutes:
            return []
        newest = [newest_minute(con, t) for t in ("sli_minute", "gpu_minute")]
        newest = [m for m in newest if m is not None]
        if not newest:
            return []
        cut = (min(newest) - self.retention_minutes) // 60 * 60
        rows = con.execute(f"""
            SELECT DISTINCT h FROM (
                SELECT epoch(date_trunc('hour', window_start))::BIGINT // 60 AS h FROM sli_minute WHERE window_start < $1
                UNION SELECT epoch(date_trunc('hour', window_start))::BIGINT // 60 FROM gpu_minute WHERE window_start < $1)
            ORDER BY h LIMIT {HOURS_PER_CHECKPOINT}""", [_ts(cut)]).fetchall()
        return [int(h) for (h,) in rows]

    def roll(self, con: duckdb.DuckDBPyConnection) -> int:
        """Roll the due hours (inside the caller's transaction); returns how many."""
        hours = self.due(con)
        for hour in hours:
            self._roll_hour(con, hour)
        self.behind = len(hours) == HOURS_PER_CHECKPOINT
        return len(hours)

    def _roll_hour(self, con: duckdb.DuckDBPyConnection, hour: int) -> None:
        start, end = _ts(hour), _ts(hour + 60)
        scales = cost.attribution_scales(
            query_frame(con, "SELECT window_start AS minute, coalesce(pool, '') AS pool, "
                                   "coalesce(sum(gpu_seconds), 0)::DOUBLE AS gpu_seconds FROM sli_minute "
                                   "WHERE window_start >= $1 AND window_start < $2 GROUP BY ALL", [start, end]),
            query_frame(con, "SELECT window_start AS minute, coalesce(pool, '') AS pool, "
                                   "(count(*) * 60)::DOUBLE AS gpu_seconds FROM gpu_minute "
                                   "WHERE window_start >= $1 AND window_start < $2 GROUP BY ALL", [start, end]))
        # Only pool-minutes whose GPUs reported can scale (elsewhere the report takes 1, as here).
        kept = scales.filter(pl.col("fleet_gpu_seconds").is_not_null())
        if kept.height:
            _insert(con, "attribution_minute", kept)
        rows = con.execute("SELECT count(*) FROM sli_minute WHERE window_start >= $1 AND window_start < $2",
                           [start, end]).fetchall()[0][0]
        groups = max(1, -(-rows // CHUNK_ROWS))
        con.register("_scales", scales.select("minute", pl.col("pool").alias("scaled_pool"), "attribution_scale")
                     .to_arrow())
        try:
            for g in range(groups):
                self._roll_requests(con, start, end, g, groups)
        finally:
            con.unregister("_scales")
        con.execute(_GPU_HOUR_SQL, [start, end])
        # Minutes of an hour rolled before (a topic that drained late) join the ones recorded then.
        minutes = query_frame(con, """
            SELECT window_start, bool_or(r) AS requests, bool_or(g) AS gpu FROM (
                SELECT DISTINCT window_start, true AS r, false AS g FROM sli_minute WHERE window_start >= $1 AND window_start < $2
                UNION ALL
                SELECT DISTINCT window_start, false, true FROM gpu_minute WHERE window_start >= $1 AND window_start < $2
                UNION ALL
                SELECT window_start, requests, gpu FROM rolled_minute WHERE window_start >= $1 AND window_start < $2)
            GROUP BY 1""", [start, end])
        con.execute("DELETE FROM rolled_minute WHERE window_start >= $1 AND window_start < $2", [start, end])
        _insert(con, "rolled_minute", minutes)
        for table in ("sli_minute", "gpu_minute"):
            con.execute(f"DELETE FROM {table} WHERE window_start >= $1 AND window_start < $2", [start, end])
        con.execute("""DELETE FROM slo_status WHERE window_start >= $1 AND window_start < $2 AND window_start <
            (SELECT max(window_start) FROM slo_status s WHERE s.slo = slo_status.slo AND s.slice = slo_status.slice
             AND s.window_start >= $1 AND s.window_start < $2)""", [start, end])

    def _roll_requests(self, con: duckdb.DuckDBPyConnection, start, end, group: int, groups: int) -> None:
        keys = ", ".join(SLICE_LABELS)
        part = f" AND hash({keys}) % {groups} = {group}" if groups > 1 else ""
        minutes = query_frame(con, f"""
            SELECT * FROM sli_minute WHERE window_start >= $1 AND window_start < $2{part}""", [start, end])
        if minutes.height == 0:
            return
        attributed = query_frame(con, f"""
            SELECT {keys}, sum(gpu_seconds_attributed)::DOUBLE AS gpu_seconds_attributed, count(*) AS minutes
            FROM ({attributed_sql("_scales")}) WHERE true{part} GROUP BY ALL""", {"start": start, "end": end})
        w = self.windows
        hourly = minutes.with_columns(pl.col("window_start").dt.truncate("1h"))
        rows = w.merge_partials(*w.row_partials(hourly))
        rows = rows.join(attributed, on=list(SLICE_LABELS), how="left", nulls_equal=True)
        _insert(con, "sli_hour", rows)


def _ts(minute: int):
    return pl.Series([minute * MINUTE_MS], dtype=pl.Datetime("ms")).cast(pl.Datetime("us")).item()


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: pl.DataFrame) -> None:
    con.register("_rows", rows.to_arrow())
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
    finally:
        con.unregister("_rows")
