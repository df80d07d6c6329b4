"""`tailwatch report cost`: the GPU cost report for finance and product.

Reads the store read-only (`sli_minute` for traffic and the requests' own GPU-seconds,
`gpu_minute` for the fleet's GPU time), scales the requests' GPU-seconds per pool and minute
to the GPU time that existed (`slo.cost.attribution_scales`), runs the cost math of
`slo.cost` per day (tables, CSV, Parquet, the spend-rise flag) and per minute, hour or day
(trend charts, by how long the data runs), and writes three files:
`report.html` (self-contained: inline CSS, PNG charts as data URIs, nothing loaded from
anywhere), `cost.csv` and `cost.parquet` (one row per day, tenant, model and workload).
Nothing is written unless the range holds data.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

import duckdb
import polars as pl
from markupsafe import Markup

from tailwatch.planning import cost
from tailwatch.planning.prices import DEFAULT_USD_PER_GPU_HOUR, GpuPrices
from tailwatch import store
from tailwatch.reports import html, period
from tailwatch.reports.csv_out import write_frame
from tailwatch.reports.html import count, note, pct, scale, usd
from tailwatch.planning.work_estimate import DEFAULT_PROMPT_WEIGHT
from tailwatch.store.attribution import attributed_sql

BASELINE_DAYS = 7
RISE_THRESHOLD = 0.20
SUCCESS_EPSILON = 0.01
HOURLY_UP_TO_DAYS = 14  # longer ranges chart one point per day
# Shorter data charts one point per minute: an hourly chart of a seven-minute run is one point.
MINUTELY_UP_TO = dt.timedelta(hours=6)
SCALES_VIEW = "tw_attribution_scales"  # the per-minute scales, shown to DuckDB for the usage query
FILES = ("report.html", "cost.csv", "cost.parquet")


class ReportError(Exception):
    """A report cannot be made (a one-line message for the user)."""


class EmptyRange(ReportError):
    """The range holds no data; the message names the range and what the store holds."""


def parse_time(text: str, end: bool = False) -> dt.datetime:
    """RFC 3339 (`2026-11-03T06:00:00Z`) or a date (`2026-11-03`) → naive UTC, as the store keeps
    it. A date given as the end of a range means the whole of that day (the range ends the next
    midnight), so `--from 2026-11-02 --to 2026-11-03` is two days."""
    text = text.strip()
    try:
        if len(text) == 10:
            day = dt.date.fromisoformat(text)
            return dt.datetime.combine(day + dt.timedelta(days=1 if end else 0), dt.time())
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ReportError(f"not a date or RFC 3339 time: {text!r} (use e.g. 2026-11-03 or 2026-11-03T06:00:00Z)") from None
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%MZ")


@dataclass(frozen=True)
class ReportRange:
    start: dt.datetime  # naive UTC, inclusive
    end: dt.datetime  # naive UTC, exclusive

    def __str__(self) -> str:
        return f"{_iso(self.start)} to {_iso(self.end)}"

    @property
    def days(self) -> list[dt.date]:
        first, last = self.start.date(), (self.end - dt.timedelta(microseconds=1)).date()
        return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


@dataclass
class CostReport:
    """Everything the files are made from."""

    store_path: str
    range: ReportRange
    data_range: tuple[dt.datetime, dt.datetime]
    prices: GpuPrices
    prices_source: str
    daily: cost.CostTables
    per_day: pl.DataFrame  # one row per day of the range (and the baseline days before it)
    trend: pl.DataFrame  # per minute, hour or day: costs and turns, for the charts
    trend_unit: str  # "minute", "hour" or "day"
    flags: list[cost.SpendRise]
    scaling: cost.AttributionScaling  # when and by how much attributed GPU-seconds were scaled down
    bases: pl.DataFrame = field(default_factory=pl.DataFrame)  # per pool and basis (attribution_bases)
    # The first minute with data in the range and the end of the last one: what the figures cover.
    covered: tuple[dt.datetime, dt.datetime] | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ReportResult:
    out_dir: Path
    files: list[Path]
    fleet_total_usd: float
    flags: list[cost.SpendRise]
    rows: int
    seconds: float


# ---- reading ------------------------------------------------------------------------------

def _rolled(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store has hour tables (streams/rollup.py): a store of an older release has none."""
    return store.has_table(con, "rolled_minute")


def _data_range(con: duckdb.DuckDBPyConnection) -> tuple[dt.datetime, dt.datetime] | None:
    rolled = "UNION ALL SELECT min(window_start), max(window_start) FROM rolled_minute" if _rolled(con) else ""
    lo, hi = con.execute(
        "SELECT min(lo), max(hi) FROM (SELECT min(window_start) lo, max(window_start) hi FROM sli_minute "
        f"UNION ALL SELECT min(window_start), max(window_start) FROM gpu_minute {rolled})").fetchall()[0]
    return None if lo is None else (lo, hi + dt.timedelta(minutes=1))


def _covered(con: duckdb.DuckDBPyConnection, start: dt.datetime, end: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The first minute with data in [start, end) and the end of the last one."""
    rolled = "UNION ALL SELECT window_start FROM rolled_minute" if _rolled(con) else ""
    lo, hi = con.execute(
        "SELECT min(m), max(m) FROM (SELECT window_start AS m FROM sli_minute UNION ALL "
        f"SELECT window_start FROM gpu_minute {rolled}) WHERE m >= ? AND m < ?", [start, end]).fetchall()[0]
    return lo, hi + dt.timedelta(minutes=1)


def _period(unit: str) -> str:
    return "CAST(date_trunc('day', window_start) AS DATE)" if unit == "day" else f"date_trunc('{unit}', window_start)"


def minute_scales(con, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per pool and minute, the factor that fits the requests' GPU-seconds into the GPUs' (slo.cost);
    for minutes rolled into hours, the factors the roll-up kept."""
    reported = con.sql("""
        SELECT window_start AS minute, coalesce(pool, '') AS pool, coalesce(sum(gpu_seconds), 0)::DOUBLE AS gpu_seconds
        FROM sli_minute WHERE window_start >= ? AND window_start < ? GROUP BY ALL""", params=[start, end]).pl()
    present = con.sql("""
        SELECT window_start AS minute, coalesce(pool, '') AS pool, (count(*) * 60)::DOUBLE AS gpu_seconds
        FROM gpu_minute WHERE window_start >= ? AND window_start < ? GROUP BY ALL""", params=[start, end]).pl()
    scales = cost.attribution_scales(reported, present)
    if not _rolled(con):
        return scales
    kept = con.sql("SELECT * FROM attribution_minute WHERE minute >= ? AND minute < ?", params=[start, end]).pl()
    return pl.concat([kept.select(scales.columns).cast(scales.schema), scales]).sort("minute", "pool") \
        if kept.height else scales


def _usage(con, unit: str, start: dt.datetime, end: dt.datetime, scales: pl.DataFrame) -> pl.DataFrame:
    # The scales are per minute and the usage is summed per period: the attribution
    # (store/attribution.py: the requests' own GPU-seconds scaled, or a work estimate where
    # they reported none) runs per bucket in DuckDB, so a long range never brings every
    # slice-minute into Python. Hours rolled up carry what the same query gave at roll-up.
    sums = """sum(requests)::BIGINT AS requests, sum(turns)::BIGINT AS turns,
                   sum(successful_turns)::BIGINT AS successful_turns,
                   coalesce(sum(output_tokens), 0)::BIGINT AS output_tokens,
                   coalesce(sum(audio_seconds), 0)::DOUBLE AS audio_seconds,
                   coalesce(sum(successful_audio_ms), 0)::BIGINT AS successful_audio_ms,"""
    hours = f"""UNION ALL
            SELECT {_period(unit)} AS period, tenant, model, workload, pool, {sums}
                   coalesce(sum(gpu_seconds_attributed), 0)::DOUBLE AS gpu_seconds,
                   coalesce(sum(gpu_seconds), 0)::DOUBLE AS gpu_seconds_reported
            FROM sli_hour WHERE window_start >= $start AND window_start < $end GROUP BY ALL""" if _rolled(con) else ""
    con.register(SCALES_VIEW, scales.select("minute", pl.col("pool").alias("scaled_pool"), "attribution_scale"))
    try:
        return store.query_frame(con, f"""
            SELECT period, tenant, model, workload, pool, sum(requests)::BIGINT AS requests, sum(turns)::BIGINT AS turns,
                   sum(successful_turns)::BIGINT AS successful_turns, sum(output_tokens)::BIGINT AS output_tokens,
                   sum(audio_seconds)::DOUBLE AS audio_seconds, sum(successful_audio_ms)::BIGINT AS successful_audio_ms,
                   sum(gpu_seconds)::DOUBLE AS gpu_seconds,
                   sum(gpu_seconds_reported)::DOUBLE AS gpu_seconds_reported
            FROM (
            SELECT {_period(unit)} AS period, tenant, model, workload, pool, {sums}
                   coalesce(sum(gpu_seconds_attributed), 0)::DOUBLE AS gpu_seconds,
                   coalesce(sum(gpu_seconds), 0)::DOUBLE AS gpu_seconds_reported
            FROM ({attributed_sql(SCALES_VIEW)}) GROUP BY ALL
            {hours}) GROUP BY ALL""", {"start": start, "end": end})
    finally:
        con.unregister(SCALES_VIEW)


def attribution_bases(con, start: dt.datetime, end: dt.datetime, scales: pl.DataFrame) -> pl.DataFrame:
    """Per pool and basis (store/attribution.py): the minutes attributed that way, their
    GPU-seconds, and the fitted weight of a prompt token in output tokens (tokens basis)."""
    con.register(SCALES_VIEW, scales.select("minute", pl.col("pool").alias("scaled_pool"), "attribution_scale"))
    try:
        return store.query_frame(con, f"""
            SELECT coalesce(pool, '') AS pool, attribution_basis AS basis, count(DISTINCT window_start) AS minutes,
                   sum(gpu_seconds_attributed)::DOUBLE AS gpu_seconds, avg(prompt_token_weight) AS prompt_token_weight
            FROM ({attributed_sql(SCALES_VIEW)}) GROUP BY ALL ORDER BY pool, basis""", {"start": start, "end": end})
    finally:
        con.unregister(SCALES_VIEW)


def _fleet(con, unit: str, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    # Each row is one GPU present for one minute: 60 GPU-seconds paid for, busy or not (an hour
    # row counts its minutes).
    hours = f"""UNION ALL SELECT {_period(unit)} AS period, pool, model, gpu_sku, (sum(gpu_minutes) * 60)::DOUBLE
        FROM gpu_hour WHERE window_start >= ? AND window_start < ? GROUP BY ALL""" if _rolled(con) else ""
    return con.sql(f"""
        SELECT period, pool, model, gpu_sku, sum(gpu_seconds)::DOUBLE AS gpu_seconds FROM (
        SELECT {_period(unit)} AS period, pool, model, gpu_sku, (count(*) * 60)::DOUBLE AS gpu_seconds
        FROM gpu_minute WHERE window_start >= ? AND window_start < ? GROUP BY ALL {hours}) GROUP BY ALL""",
        params=[start, end] + ([start, end] if hours else [])).pl()


def _minutes_per_day(con, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    rolled = "UNION SELECT window_start FROM rolled_minute WHERE window_start >= ? AND window_start < ?" \
        if _rolled(con) else ""
    return con.sql(f"""
        SELECT CAST(date_trunc('day', m) AS DATE) AS period, count(*)::BIGINT AS minutes_with_data
        FROM (SELECT window_start AS m FROM sli_minute WHERE window_start >= ? AND window_start < ?
              UNION SELECT window_start FROM gpu_minute WHERE window_start >= ? AND window_start < ? {rolled})
        GROUP BY 1""", params=[start, end, start, end] + ([start, end] if rolled else [])).pl()


def _per_day(tables: cost.CostTables, minutes: pl.DataFrame) -> pl.DataFrame:
    return (cost.rollup(tables.detail, ["period"])
            .join(minutes, on="period", how="left")
            .with_columns(pl.col("minutes_with_data").fill_null(0)))


def build_report(con: duckdb.DuckDBPyConnection, store_path: str, start: dt.datetime | None, end: dt.datetime | None,
                 prices: GpuPrices, prices_source: str = "defaults",
                 progress: Callable[[str], None] | None = None) -> CostReport:
    say = progress or (lambda _line: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        data = _data_range(con)
    except duckdb.CatalogException:
        raise ReportError(f"{store_path} is not a tailwatch store (no sli_minute/gpu_minute tables)") from None
    if data is None:
        raise EmptyRange(f"the store {store_path} holds no data yet: run `tailwatch worker --store {store_path}` first")
    if start is None and end is None:
        # The last day of data, by event time (the store's newest minute), not the wall clock.
        last_day = (data[1] - dt.timedelta(minutes=1)).date()
        start = dt.datetime.combine(last_day, dt.time())
        end = start + dt.timedelta(days=1)
    elif start is None:  # up to --to: from the first data, or a day before --to if that is earlier
        start = min(data[0], end - dt.timedelta(days=1))  # type: ignore[operator]
    elif end is None:  # from --from: to the last data, or a day after --from if that is later
        end = max(data[1], start + dt.timedelta(days=1))
    if end <= start:
        raise ReportError(f"--to ({_iso(end)}) must be after --from ({_iso(start)})")
    rng = ReportRange(start, end)
    if data[1] <= start or data[0] >= end:
        raise EmptyRange(f"no data from {rng} in {store_path}; the store holds {_iso(data[0])} to {_iso(data[1])}")

    say(f"report cost: reading {rng} from {store_path}")
    # Baseline for the spend-rise flag: whole days before the range's first day.
    base_end = dt.datetime.combine(start.date(), dt.time())
    base_start = base_end - dt.timedelta(days=BASELINE_DAYS)
    # One set of per-minute scales serves the range, its baseline and the trend alike.
    scales = minute_scales(con, base_start, end)
    usage = _usage(con, "day", start, end, scales)
    fleet = _fleet(con, "day", start, end)
    if usage.height == 0 and fleet.height == 0:
        raise EmptyRange(f"no data from {rng} in {store_path}; the store holds {_iso(data[0])} to {_iso(data[1])}")
    base_usage, base_fleet = _usage(con, "day", base_start, base_end, scales), _fleet(con, "day", base_start, base_end)
    minutes = pl.concat([_minutes_per_day(con, base_start, base_end), _minutes_per_day(con, start, end)])
    timings["read_s"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    say(f"report cost: allocating costs ({usage.height:,} usage rows, {fleet.height:,} fleet rows per day)")
    daily = cost.allocate_costs(usage, fleet, prices)
    baseline = cost.allocate_costs(base_usage, base_fleet, prices)
    per_day = pl.concat([_per_day(baseline, minutes), _per_day(daily, minutes)], how="vertical_relaxed").sort("period")
    flags = cost.flag_spend_rises(per_day, days=rng.days, rise_threshold=RISE_THRESHOLD,
                                  success_epsilon=SUCCESS_EPSILON, baseline_days=BASELINE_DAYS)
    # The trend charts also show the baseline days, so a step up at the range's start is visible.
    trend_start = max(base_start, data[0]) if per_day.filter(pl.col("period") < start.date()).height else start
    unit = trend_unit(min(end, data[1]) - max(trend_start, data[0]))
    say(f"report cost: per-{unit} trend for the charts")
    fine = cost.allocate_costs(_usage(con, unit, trend_start, end, scales), _fleet(con, unit, trend_start, end), prices)
    trend = cost.rollup(fine.detail, ["period"])
    in_range = scales.filter((pl.col("minute") >= start) & (pl.col("minute") < end))
    scaling = cost.summarize_scaling(in_range, daily.pools)
    bases = attribution_bases(con, start, end, scales)
    timings["compute_s"] = time.perf_counter() - t1
    return CostReport(store_path=store_path, range=rng, data_range=data, prices=prices, prices_source=prices_source,
                      daily=daily, per_day=per_day, trend=trend, trend_unit=unit, flags=flags, scaling=scaling,
                      bases=bases, covered=_covered(con, start, end), timings=timings)


def model_costs(con: duckdb.DuckDBPyConnection, model: str, start: dt.datetime | None, end: dt.datetime | None,
                prices: GpuPrices) -> dict | None:
    """One model's GPU cost over a range, by this report's rules (so the readiness report and
    this one never disagree): attributed (the GPU time its requests used, scaled to the GPU time
    that existed) and fully loaded (its pools' idle time shared in), in all and per successful
    turn; None without data."""
    data = _data_range(con)
    if data is None:
        return None
    start, end = start or data[0], end or data[1]
    scales = minute_scales(con, start, end)
    tables = cost.allocate_costs(_usage(con, "day", start, end, scales), _fleet(con, "day", start, end), prices)
    mine = tables.detail.filter(pl.col("model") == model)
    if mine.height == 0:
        return None
    return cost.rollup(mine, []).select(
        "attributed_cost_usd", "fully_loaded_cost_usd", "successful_turns",
        "attributed_cost_per_successful_turn_usd", "cost_per_successful_turn_usd").to_dicts()[0]


def trend_unit(span: dt.timedelta) -> str:
    """The charts' time step for data that runs `span`: enough points to show a shape, few
    enough to read (a seven-minute run gets minutes, a fortnight hours, longer days)."""
    if span <= MINUTELY_UP_TO:
        return "minute"
    return "hour" if span <= dt.timedelta(days=HOURLY_UP_TO_DAYS) else "day"


# ---- writing ------------------------------------------------------------------------------

CSV_COLUMNS = (
    ("period", "day"), ("tenant", "tenant"), ("model", "model"), ("workload", "workload"),
    ("requests", "requests"), ("turns", "turns"), ("successful_turns", "successful_turns"),
    ("goodput_ratio", "goodput_ratio"), ("output_tokens", "output_tokens"), ("audio_seconds", "audio_seconds"),
    ("gpu_seconds_reported", "reported_gpu_seconds"), ("gpu_seconds", "attributed_gpu_seconds"),
    ("attribution_scale", "attribution_scale"), ("fully_loaded_gpu_seconds", "fully_loaded_gpu_seconds"),
    ("idle_gpu_seconds", "idle_gpu_seconds"), ("attributed_cost_usd", "attributed_cost_usd"),
    ("idle_cost_usd", "idle_cost_usd"), ("fully_loaded_cost_usd", "fully_loaded_cost_usd"),
    ("cost_per_successful_turn_usd", "cost_per_successful_turn_usd"),
    ("attributed_cost_per_successful_turn_usd", "attributed_cost_per_successful_turn_usd"),
    ("cost_per_1k_output_tokens_usd", "cost_per_1k_output_tokens_usd"),
    ("cost_per_audio_second_usd", "cost_per_audio_second_usd"),
    ("cost_per_successful_audio_minute_usd", "cost_per_successful_audio_minute_usd"), ("idle_ratio", "idle_ratio"),
)


def cost_frame(report: CostReport) -> pl.DataFrame:
    """The rows of cost.csv and cost.parquet: per day, tenant, model and workload."""
    return report.daily.detail.select(pl.col(src).alias(dst) for src, dst in CSV_COLUMNS)


def write_report(report: CostReport, out_dir: str | Path, progress: Callable[[str], None] | None = None) -> list[Path]:
    say = progress or (lambda _line: None)
    out = Path(out_dir)
    t0 = time.perf_counter()
    page = render_html(report, say)  # the slow part (charts) before touching the folder
    report.timings["charts_s"] = time.perf_counter() - t0
    say(f"report cost: writing {', '.join(FILES)} to {out}")
    out.mkdir(parents=True, exist_ok=True)
    frame = cost_frame(report)
    write_frame(frame, out / "cost.csv")
    frame.write_parquet(out / "cost.parquet")
    (out / "report.html").write_text(page, encoding="utf-8")
    return [out / f for f in FILES]


def run_cost_report(store_path: str, start: dt.datetime | None, end: dt.datetime | None, out_dir: str | Path,
                    prices: GpuPrices, prices_source: str = "defaults",
                    progress: Callable[[str], None] | None = None) -> ReportResult:
    t0 = time.perf_counter()
    # A running worker lets go of the store every 20 s: wait for that moment.
    con = store.connect(store_path, read_only=True, wait_s=30.0)
    try:
        report = build_report(con, store_path, start, end, prices, prices_source, progress)
    finally:
        con.close()
    files = write_report(report, out_dir, progress)
    return ReportResult(out_dir=Path(out_dir), files=files, fleet_total_usd=report.daily.fleet_total_usd,
                        flags=report.flags, rows=report.daily.detail.height, seconds=time.perf_counter() - t0)


# ---- HTML (reports/templates/cost.html) ---------------------------------------------------------

SCALE_HEADER = "Attribution scale (attributed ÷ reported GPU-s)"
# The cost basis of the headline, the unit costs and the budget judge, named alike in both reports.
BASIS = "fully loaded"


def render_html(report: CostReport, say: Callable[[str], None]) -> str:
    from tailwatch.reports import charts

    detail = report.daily.detail
    total = cost.rollup(detail, []).row(0, named=True)
    rng_days = set(report.range.days)
    in_range = report.per_day.filter(pl.col("period").is_in(sorted(rng_days)))
    flagged = {f.day: f.rise_ratio for f in report.flags}
    per_day_rows = report.per_day.to_dicts()

    say("report cost: drawing charts (1/4, daily spend)")
    days = [r["period"] for r in per_day_rows]
    labels = [period.day_label(r["period"], r["minutes_with_data"]) for r in per_day_rows]
    chart_daily = charts.daily_spend(
        days, [r["fully_loaded_cost_usd"] - r["idle_cost_usd"] for r in per_day_rows],
        [r["idle_cost_usd"] for r in per_day_rows], flagged, labels=labels)
    say("report cost: drawing charts (2/4, cost per successful turn)")
    trend = report.trend.sort("period").to_dicts()
    times = [r["period"] if isinstance(r["period"], dt.datetime) else dt.datetime.combine(r["period"], dt.time())
             for r in trend]
    step = {"minute": dt.timedelta(minutes=1), "hour": dt.timedelta(hours=1)}.get(report.trend_unit, dt.timedelta(days=1))
    chart_trend = charts.cost_per_turn_trend(times, [r["cost_per_successful_turn_usd"] for r in trend],
                                             [r["attributed_cost_per_successful_turn_usd"] for r in trend],
                                             sorted(flagged), step=step)
    say("report cost: drawing charts (3/4, cost by tenant)")
    tenants = cost.rollup(detail, ["tenant"]).sort("fully_loaded_cost_usd", descending=True).to_dicts()
    chart_tenants = charts.cost_by_tenant([t["tenant"] for t in tenants],
                                          [t["fully_loaded_cost_usd"] - t["idle_cost_usd"] for t in tenants],
                                          [t["idle_cost_usd"] for t in tenants])
    say("report cost: drawing charts (4/4, goodput vs throughput)")
    chart_goodput = charts.goodput_vs_throughput(times, [r["turns"] for r in trend], [r["successful_turns"] for r in trend],
                                                 report.trend_unit, step=step)

    fleet_gs = float(detail["fully_loaded_gpu_seconds"].sum()) if detail.height else 0.0
    idle_share = total["idle_cost_usd"] / total["fully_loaded_cost_usd"] if total["fully_loaded_cost_usd"] else None
    covered = report.covered or (max(report.range.start, report.data_range[0]), min(report.range.end, report.data_range[1]))
    span = covered[1] - covered[0]
    rate = period.per_day_rate(report.daily.fleet_total_usd, span)
    # The fleet total carries its unrounded value, for scripts that check a report. It is the
    # spend over the period with data, said with its length: never a day's unless a day is covered.
    cards = [
        (f"${usd(report.daily.fleet_total_usd)}", f"fleet GPU cost, {BASIS}, over {period.span_text(span)} of data",
         "fleet-total-usd", f"{report.daily.fleet_total_usd:.6f}"),
        *([(f"${usd(rate)} per day", f"rate: {BASIS} cost ÷ {period.span_text(span)} × 24 h", "per-day-rate",
            f"{rate:.6f}")] if rate is not None else []),
        (f"${usd(total['attributed_cost_usd'])}", "attributed to requests", "", ""),
        (f"${usd(total['idle_cost_usd'])} ({pct(idle_share, 0)}%)", "idle GPU cost", "", ""),
        (f"{fleet_gs / 3600:,.1f} GPU-h", "fleet GPU time", "", ""),
        (f"${usd(total['cost_per_successful_turn_usd'], unit=True)}", f"per successful turn, {BASIS}", "", ""),
        (f"{pct(total['goodput_ratio'])}%", f"goodput ({count(total['successful_turns'])} of {count(total['turns'])} turns)",
         "", ""),
    ]

    day_rows, day_classes = [], []
    flag_of_day = {f.day: f for f in report.flags}
    for r in per_day_rows:
        f = flag_of_day.get(r["period"])
        day = period.day_label(r["period"], r["minutes_with_data"])
        day_rows.append([
            day if r["period"] in rng_days else Markup("{} {}").format(day, note("(baseline)")),
            f"{r['minutes_with_data'] / 60:.1f}", usd(r["fully_loaded_cost_usd"]), usd(r["attributed_cost_usd"]),
            usd(r["idle_cost_usd"]), pct(r["idle_cost_usd"] / r["fully_loaded_cost_usd"] if r["fully_loaded_cost_usd"] else None),
            scale(r["attribution_scale"]), count(r["turns"]), pct(r["goodput_ratio"], 2),
            usd(r["cost_per_successful_turn_usd"], unit=True), f"+{f.rise_ratio * 100:.1f} ⚠" if f else "",
        ])
        day_classes.append("flag" if f else "")

    def tenant_row(name: str, t: dict, share: str) -> list:
        return [name, usd(t["fully_loaded_cost_usd"]), usd(t["attributed_cost_usd"]), usd(t["idle_cost_usd"]),
                scale(t["attribution_scale"]), share, count(t["turns"]), pct(t["goodput_ratio"], 2),
                usd(t["cost_per_successful_turn_usd"], unit=True), usd(t["attributed_cost_per_successful_turn_usd"], unit=True)]

    fleet_total = report.daily.fleet_total_usd
    tenant_rows = [tenant_row(t["tenant"], t, pct(t["fully_loaded_cost_usd"] / fleet_total if fleet_total else None))
                   for t in tenants] + [tenant_row("All tenants (= fleet total)", total, "100.0")]
    models = cost.rollup(detail, ["model", "workload"]).sort("fully_loaded_cost_usd", descending=True).to_dicts()
    top = detail.sort("fully_loaded_cost_usd", descending=True).head(40).to_dicts()
    prices = report.prices
    skus = sorted(set(prices.usd_per_gpu_hour) | set(DEFAULT_USD_PER_GPU_HOUR))
    unit_costs = ("$/successful turn", False), ("$/1k output tokens", False), ("$/successful audio-min", False)

    def unit_cells(r: dict) -> list[str]:
        return [usd(r["cost_per_successful_turn_usd"], unit=True), usd(r["cost_per_1k_output_tokens_usd"], unit=True),
                usd(r["cost_per_successful_audio_minute_usd"], unit=True)]

    return html.render(
        "cost.html", range=str(report.range), store_path=report.store_path, data_from=_iso(report.data_range[0]),
        data_to=_iso(report.data_range[1]), covered=period.minute_range_text(*covered), covered_span=period.span_text(span),
        partial=span < report.range.end - report.range.start, basis=BASIS, flags=[f.summary() for f in report.flags],
        biggest_rise=max((f.rise_ratio for f in report.flags), default=0.0), rise_threshold=RISE_THRESHOLD,
        baseline_days=BASELINE_DAYS, success_epsilon=SUCCESS_EPSILON, cards=cards,
        scaling_material=report.scaling.material, overall_scale=report.scaling.overall_scale or 1.0,
        scaling_sentence=report.scaling.sentence(),
        charts=[(chart_daily, "GPU spend by day, fully loaded, split into GPU time used by requests and idle GPU time; "
                              "days the data covers in part say how many hours"),
                (chart_trend, "Cost per successful turn over time, fully loaded and attributed"),
                (chart_tenants, "Fully loaded GPU cost by tenant"),
                (chart_goodput, "Goodput (successful turns) against throughput (all turns) over time")],
        day_headers=[("Day (UTC)", True), ("Data (h)", False), ("Fully loaded ($)", False), ("Attributed ($)", False),
                     ("Idle ($)", False), ("Idle (% of cost)", False), (SCALE_HEADER, False), ("Turns", False),
                     ("Goodput (%)", False), ("Cost per successful turn ($/turn)", False), ("Spend vs baseline (%)", False)],
        day_rows=day_rows, day_classes=day_classes, baseline_note=len(in_range) < len(per_day_rows),
        days_in_range=len(in_range),
        tenant_headers=[("Tenant", True), ("Fully loaded ($)", False), ("Attributed ($)", False), ("Idle share ($)", False),
                        (SCALE_HEADER, False), ("Share of fleet (%)", False), ("Turns", False), ("Goodput (%)", False),
                        ("Fully loaded ($/successful turn)", False), ("Attributed ($/successful turn)", False)],
        tenant_rows=tenant_rows, tenant_classes=[""] * (len(tenant_rows) - 1) + ["total"],
        model_headers=[("Model", True), ("Workload", True), ("Fully loaded ($)", False), ("Attributed ($)", False),
                       ("Idle ($)", False), ("Turns", False), ("Goodput (%)", False), *unit_costs],
        model_rows=[[m["model"], m["workload"], usd(m["fully_loaded_cost_usd"]), usd(m["attributed_cost_usd"]),
                     usd(m["idle_cost_usd"]), count(m["turns"]), pct(m["goodput_ratio"], 2), *unit_cells(m)]
                    for m in models],
        top_headers=[("Day", True), ("Tenant", True), ("Model", True), ("Workload", True), ("Fully loaded ($)", False),
                     ("Attributed ($)", False), ("Successful turns", False), *unit_costs],
        top_rows=[[r["period"], r["tenant"], r["model"], r["workload"], usd(r["fully_loaded_cost_usd"]),
                   usd(r["attributed_cost_usd"]), count(r["successful_turns"]), *unit_cells(r)] for r in top],
        detail_rows=detail.height,
        default_prompt_weight=DEFAULT_PROMPT_WEIGHT,
        basis_headers=[("Pool", True), ("Attributed by", True), ("Minutes", False), ("GPU-seconds", False),
                       ("Prompt token in output tokens", False)],
        basis_rows=[[r["pool"] or "(none)", r["basis"], count(r["minutes"]), count(r["gpu_seconds"]),
                     f"{r['prompt_token_weight']:.4f}" if r["prompt_token_weight"] is not None else "—"]
                    for r in report.bases.to_dicts()],
        unallocated_tenant=cost.UNALLOCATED_TENANT, prices_source=report.prices_source,
        price_headers=[("GPU SKU", True), ("$/GPU-hour", False), ("Source", True)],
        price_rows=[[sku, f"{prices.usd_per_gpu_hour.get(sku, prices.default_usd_per_gpu_hour):,.2f}",
                     "default" if prices.usd_per_gpu_hour.get(sku) == DEFAULT_USD_PER_GPU_HOUR.get(sku)
                     else report.prices_source] for sku in skus]
        + [["any other SKU", f"{prices.default_usd_per_gpu_hour:,.2f}", "fallback"]],
    )
