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
import html
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

import duckdb
import polars as pl

from planning import cost
from planning.prices import DEFAULT_USD_PER_GPU_HOUR, GpuPrices
import store
from planning.work_estimate import DEFAULT_PROMPT_WEIGHT
from store.attribution import attributed_sql

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
                   coalesce(sum(audio_seconds), 0)::DOUBLE AS audio_seconds,"""
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
                   sum(audio_seconds)::DOUBLE AS audio_seconds, sum(gpu_seconds)::DOUBLE AS gpu_seconds,
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
                      bases=bases, timings=timings)


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
    ("cost_per_audio_second_usd", "cost_per_audio_second_usd"), ("idle_ratio", "idle_ratio"),
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
    frame.write_csv(out / "cost.csv")
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


# ---- HTML ---------------------------------------------------------------------------------

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#212121;max-width:1180px;margin:24px auto;padding:0 16px;font-size:14px;line-height:1.45}
h1{font-size:22px;margin-bottom:2px}h2{font-size:17px;margin-top:30px;border-bottom:1px solid #e0e0e0;padding-bottom:4px}
.sub{color:#616161;margin-top:0}
.callout{border-left:6px solid #c62828;background:#fdecea;padding:12px 16px;margin:16px 0;border-radius:3px}
.callout h2{margin:0 0 6px 0;border:0;color:#b71c1c;font-size:18px}
.ok{border-left:6px solid #2e7d32;background:#edf7ee;padding:10px 16px;margin:16px 0;border-radius:3px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#f5f7fa;border-radius:4px;padding:8px 12px;min-width:150px}
.card .v{font-size:19px;font-weight:600}.card .k{color:#616161;font-size:12px}
table{border-collapse:collapse;margin:8px 0 4px 0;font-size:13px;width:100%}
th,td{padding:4px 8px;border-bottom:1px solid #eceff1;text-align:right;white-space:nowrap}
th{background:#f5f7fa;font-weight:600;vertical-align:bottom;white-space:normal;min-width:4.5em}
.wide{overflow-x:auto}
td.l,th.l{text-align:left}
tr.flag td{background:#fdecea;font-weight:600}
tr.total td{border-top:2px solid #9e9e9e;font-weight:600}
.charts img{max-width:100%;display:block;margin:10px 0}
.note{color:#616161;font-size:12.5px}
.scaled{border-left:6px solid #ef6c00;background:#fff4e5;padding:8px 14px;margin:12px 0;border-radius:3px}
code{background:#f5f5f5;padding:0 3px}
"""


def _usd(x: float | None, unit: bool = False) -> str:
    """Dollars: cents for amounts, and at least 3 significant digits for small unit costs
    (a $/audio-s of 0.0000671 must not read as 0.0001), never in scientific notation."""
    if x is None:
        return "–"
    if x == 0:
        return "0.00"
    if (unit and abs(x) < 100) or abs(x) < 1:
        decimals = max(4, 2 - math.floor(math.log10(abs(x))))
        return f"{x:,.{decimals}f}"
    return f"{x:,.2f}"


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x * 100:.{digits}f}"


def _int(x: float | None) -> str:
    return "–" if x is None else f"{int(x):,}"


SCALE_HEADER = "Attribution scale (attributed ÷ reported GPU-s)"


def _scale(x: float | None) -> str:
    """1.000 where the requests' own GPU-seconds fit in the GPUs' time; below 1 where scaled down."""
    return "–" if x is None else f"{x:.3f}"


def _table(headers: list[tuple[str, bool]], rows: list[list[str]], row_classes: list[str] | None = None) -> str:
    """headers: (text, left-aligned); rows: already formatted and escaped cells."""
    head = "".join(f'<th class="l">{h}</th>' if left else f"<th>{h}</th>" for h, left in headers)
    body = []
    for i, row in enumerate(rows):
        cls = (row_classes or [""] * len(rows))[i]
        cells = "".join(f'<td class="l">{c}</td>' if headers[j][1] else f"<td>{c}</td>" for j, c in enumerate(row))
        body.append(f'<tr class="{cls}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
    return f"<div class='wide'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def render_html(report: CostReport, say: Callable[[str], None]) -> str:
    from reports import charts

    detail = report.daily.detail
    total = cost.rollup(detail, []).row(0, named=True)
    rng_days = set(report.range.days)
    in_range = report.per_day.filter(pl.col("period").is_in(sorted(rng_days)))
    flagged = {f.day: f.rise_ratio for f in report.flags}
    per_day_rows = report.per_day.to_dicts()

    say("report cost: drawing charts (1/4, daily spend)")
    days = [r["period"] for r in per_day_rows]
    chart_daily = charts.daily_spend(
        days, [r["fully_loaded_cost_usd"] - r["idle_cost_usd"] for r in per_day_rows],
        [r["idle_cost_usd"] for r in per_day_rows], flagged)
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

    parts: list[str] = []
    add = parts.append
    add(f"<h1>GPU cost report</h1><p class='sub'>{_e(report.range)} (UTC, event time) · store <code>{_e(report.store_path)}</code>"
        f" · the store holds {_e(_iso(report.data_range[0]))} to {_e(_iso(report.data_range[1]))}</p>")

    if report.flags:
        items = "".join(f"<li>{_e(f.summary())}</li>" for f in report.flags)
        biggest = max(report.flags, key=lambda f: f.rise_ratio)
        add(f"<div class='callout' id=\"spend-rise\"><h2>⚠ GPU spend up {biggest.rise_ratio * 100:.0f}% with flat task"
            f" success</h2><p>Daily GPU spend rose more than {RISE_THRESHOLD * 100:.0f}% against the trailing"
            f" {BASELINE_DAYS}-day baseline while the share of successful turns did not improve by more than"
            f" {SUCCESS_EPSILON * 100:.0f} point: the extra spend bought no extra success.</p><ul>{items}</ul>"
            f"<p class='note'>Look for a less efficient build or model version (GPU-seconds per request up),"
            f" or pools scaled out without more traffic (idle GPU time up): see the daily and per-model tables.</p></div>")
    else:
        add(f"<div class='ok' id=\"no-spend-rise\">No day in this range had GPU spend more than"
            f" {RISE_THRESHOLD * 100:.0f}% above its trailing baseline with flat task success.</div>")

    fleet_gs = float(detail["fully_loaded_gpu_seconds"].sum()) if detail.height else 0.0
    idle_share = total["idle_cost_usd"] / total["fully_loaded_cost_usd"] if total["fully_loaded_cost_usd"] else None
    cards = [
        (f"${_usd(report.daily.fleet_total_usd)}", "fleet GPU cost, fully loaded", "fleet-total-usd",
         f"{report.daily.fleet_total_usd:.6f}"),
        (f"${_usd(total['attributed_cost_usd'])}", "attributed to requests", "", ""),
        (f"${_usd(total['idle_cost_usd'])} ({_pct(idle_share, 0)}%)", "idle GPU cost", "", ""),
        (f"{fleet_gs / 3600:,.1f} GPU-h", "fleet GPU time", "", ""),
        (f"${_usd(total['cost_per_successful_turn_usd'], unit=True)}", "per successful turn, fully loaded", "", ""),
        (f"{_pct(total['goodput_ratio'])}%", f"goodput ({_int(total['successful_turns'])} of {_int(total['turns'])} turns)", "", ""),
    ]
    html_cards = []
    for value, label, elem_id, data in cards:
        # The fleet total carries its unrounded value, for scripts that check a report.
        attrs = f' id="{elem_id}" data-usd="{data}"' if elem_id else ""
        html_cards.append(f"<div class='card'><div class='v'{attrs}>{_e(value)}</div><div class='k'>{_e(label)}</div></div>")
    add("<div class='cards'>" + "".join(html_cards) + "</div>")
    # Say it where the numbers are: attributed figures below are scaled, not the runtimes' own.
    scaled_cls = "scaled" if report.scaling.material else "note"
    add(f"<p class='{scaled_cls}' id=\"attribution-scaling\" data-scale=\"{report.scaling.overall_scale or 1.0:.6f}\">"
        f"{_e(report.scaling.sentence())}</p>")

    add("<h2>Charts</h2><div class='charts'>")
    for src, alt in ((chart_daily, "Daily GPU spend, fully loaded, split into GPU time used by requests and idle GPU time"),
                     (chart_trend, "Cost per successful turn over time, fully loaded and attributed"),
                     (chart_tenants, "Fully loaded GPU cost by tenant"),
                     (chart_goodput, "Goodput (successful turns) against throughput (all turns) over time")):
        add(f'<img src="{src}" alt="{_e(alt)}">')
    add("</div>")

    add("<h2>By day</h2>")
    rows, classes = [], []
    baseline_by_day = {f.day: f for f in report.flags}
    for r in per_day_rows:
        in_r = r["period"] in rng_days
        f = baseline_by_day.get(r["period"])
        rows.append([
            _e(r["period"].isoformat()) + ("" if in_r else " <span class='note'>(baseline)</span>"),
            f"{r['minutes_with_data'] / 60:.1f}", _usd(r["fully_loaded_cost_usd"]), _usd(r["attributed_cost_usd"]),
            _usd(r["idle_cost_usd"]), _pct(r["idle_cost_usd"] / r["fully_loaded_cost_usd"] if r["fully_loaded_cost_usd"] else None),
            _scale(r["attribution_scale"]), _int(r["turns"]), _pct(r["goodput_ratio"], 2),
            _usd(r["cost_per_successful_turn_usd"], unit=True),
            f"+{f.rise_ratio * 100:.1f} ⚠" if f else "",
        ])
        classes.append("flag" if f else "")
    add(_table([("Day (UTC)", True), ("Data (h)", False), ("Fully loaded ($)", False), ("Attributed ($)", False),
                ("Idle ($)", False), ("Idle (% of cost)", False), (SCALE_HEADER, False), ("Turns", False), ("Goodput (%)", False),
                ("Cost per successful turn ($/turn)", False), ("Spend vs baseline (%)", False)], rows, classes))
    if len(in_range) < len(per_day_rows):
        add(f"<p class='note'>Baseline days (before the range) are shown for comparison; every other figure counts"
            f" only the {len(in_range)} day(s) in the range.</p>")

    add("<h2>By tenant</h2>")
    rows = []
    for t in tenants:
        share = t["fully_loaded_cost_usd"] / report.daily.fleet_total_usd if report.daily.fleet_total_usd else None
        rows.append([_e(t["tenant"]), _usd(t["fully_loaded_cost_usd"]), _usd(t["attributed_cost_usd"]),
                     _usd(t["idle_cost_usd"]), _scale(t["attribution_scale"]), _pct(share), _int(t["turns"]),
                     _pct(t["goodput_ratio"], 2),
                     _usd(t["cost_per_successful_turn_usd"], unit=True),
                     _usd(t["attributed_cost_per_successful_turn_usd"], unit=True)])
    rows.append(["All tenants (= fleet total)", _usd(total["fully_loaded_cost_usd"]), _usd(total["attributed_cost_usd"]),
                 _usd(total["idle_cost_usd"]), _scale(total["attribution_scale"]), "100.0", _int(total["turns"]),
                 _pct(total["goodput_ratio"], 2),
                 _usd(total["cost_per_successful_turn_usd"], unit=True),
                 _usd(total["attributed_cost_per_successful_turn_usd"], unit=True)])
    add(_table([("Tenant", True), ("Fully loaded ($)", False), ("Attributed ($)", False), ("Idle share ($)", False),
                (SCALE_HEADER, False), ("Share of fleet (%)", False), ("Turns", False), ("Goodput (%)", False),
                ("Fully loaded ($/successful turn)", False), ("Attributed ($/successful turn)", False)],
               rows, [""] * (len(rows) - 1) + ["total"]))

    add("<h2>By model and workload</h2>")
    rows = []
    for m in cost.rollup(detail, ["model", "workload"]).sort("fully_loaded_cost_usd", descending=True).to_dicts():
        rows.append([_e(m["model"]), _e(m["workload"]), _usd(m["fully_loaded_cost_usd"]), _usd(m["attributed_cost_usd"]),
                     _usd(m["idle_cost_usd"]), _int(m["turns"]), _pct(m["goodput_ratio"], 2),
                     _usd(m["cost_per_successful_turn_usd"], unit=True), _usd(m["cost_per_1k_output_tokens_usd"], unit=True),
                     _usd(m["cost_per_audio_second_usd"], unit=True)])
    add(_table([("Model", True), ("Workload", True), ("Fully loaded ($)", False), ("Attributed ($)", False),
                ("Idle ($)", False), ("Turns", False), ("Goodput (%)", False), ("$/successful turn", False),
                ("$/1k output tokens", False), ("$/audio-s", False)], rows))

    top = detail.sort("fully_loaded_cost_usd", descending=True).head(40).to_dicts()
    add(f"<h2>Largest rows by day, tenant, model and workload</h2><p class='note'>The {len(top)} largest of"
        f" {detail.height:,} rows; all of them are in <code>cost.csv</code> and <code>cost.parquet</code>"
        f" beside this file.</p>")
    rows = [[_e(r["period"]), _e(r["tenant"]), _e(r["model"]), _e(r["workload"]), _usd(r["fully_loaded_cost_usd"]),
             _usd(r["attributed_cost_usd"]), _int(r["successful_turns"]), _usd(r["cost_per_successful_turn_usd"], unit=True),
             _usd(r["cost_per_1k_output_tokens_usd"], unit=True), _usd(r["cost_per_audio_second_usd"], unit=True)]
            for r in top]
    add(_table([("Day", True), ("Tenant", True), ("Model", True), ("Workload", True), ("Fully loaded ($)", False),
                ("Attributed ($)", False), ("Successful turns", False), ("$/successful turn", False),
                ("$/1k output tokens", False), ("$/audio-s", False)], rows))

    add(_method_html(report))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>GPU cost report {_e(report.range)}</title><style>{CSS}</style></head><body>"
            + "".join(parts) + "</body></html>")


def _bases_table(bases: pl.DataFrame) -> str:
    if bases.height == 0:
        return "<p class='note'>No requests in the range.</p>"
    rows = [[_e(r["pool"] or "(none)"), _e(r["basis"]), _int(r["minutes"]), _int(r["gpu_seconds"]),
             f"{r['prompt_token_weight']:.4f}" if r["prompt_token_weight"] is not None else "—"]
            for r in bases.to_dicts()]
    return _table([("Pool", True), ("Attributed by", True), ("Minutes", False), ("GPU-seconds", False),
                   ("Prompt token in output tokens", False)], rows)


def _method_html(report: CostReport) -> str:
    prices = report.prices
    skus = sorted(set(prices.usd_per_gpu_hour) | set(DEFAULT_USD_PER_GPU_HOUR))
    price_rows = [[_e(s), f"{prices.usd_per_gpu_hour.get(s, prices.default_usd_per_gpu_hour):,.2f}",
                   "default" if prices.usd_per_gpu_hour.get(s) == DEFAULT_USD_PER_GPU_HOUR.get(s) else _e(report.prices_source)]
                  for s in skus]
    price_rows.append(["any other SKU", f"{prices.default_usd_per_gpu_hour:,.2f}", "fallback"])
    return f"""<h2>How the costs are counted</h2>
<p><b>Attributed cost</b> is what the requests themselves used: each request's own <code>gpu_seconds</code>
(scaled down where they claim more than the GPUs had, below) × the price per GPU-second of its pool's GPUs that day. It answers "what did this traffic consume" and leaves
out the GPUs that stood idle.</p>
<p><b>Attributed GPU-seconds never exceed the GPU time that existed.</b> Runtimes that time-share a GPU (several
replicas or a batch on one GPU) report each request's wall time as its <code>gpu_seconds</code>, so together they
can claim more than the GPU had. Per pool and minute, when the requests that completed in that minute reported more
GPU-seconds than the pool's GPUs had (60 per GPU), each is scaled by GPUs' ÷ reported, so no GPU-minute is attributed
more than 60 seconds; a pool-day whose traffic minutes lack GPU rows is capped the same way over the day. The
<i>attribution scale</i> column is attributed ÷ reported GPU-seconds (1.000: unscaled); <code>cost.csv</code> keeps
both figures. So attributed + idle = fully loaded on every row.</p>
<p><b>Without per-request GPU-seconds</b> (vLLM, TGI and Triton report none; nor does an OpenTelemetry span), a
pool-minute's busy GPU-seconds (each GPU's minute × its mean utilisation; the whole minute where utilisation is
unknown) are shared among its requests by a work estimate: <i>tokens</i> (prompt tokens × a weight + output tokens;
the weight, what a prompt token costs in output tokens, is fitted per pool and hour from the pool's own minutes,
{DEFAULT_PROMPT_WEIGHT} when the hour cannot support a fit), <i>audio</i> seconds for speech, or
<i>wall_time</i> (requests × median latency) as the last resort. The basis of each pool:</p>
{_bases_table(report.bases)}
<p><b>Fully loaded cost</b> is what the fleet cost: every GPU present in a minute (a row of
<code>gpu_minute</code>) counts 60 GPU-seconds, busy or idle, at its SKU's price, and belongs to its pool.
Each pool's cost for a day is shared among the tenant, model and workload rows that used the pool that day,
in proportion to their attributed GPU-seconds; idle time is shared the same way. A pool with GPUs and no traffic
that day goes to the tenant <code>{cost.UNALLOCATED_TENANT}</code>; traffic on a pool that reported no GPUs keeps its
attributed cost. So the sum over tenants is the fleet total, to float rounding. Unit costs
(per successful turn, per 1,000 output tokens, per audio-second) use the fully loaded cost unless named
attributed.</p>
<p><b>Goodput</b> is successful work: the share of turns that succeeded. A turn is one attempt chain (a first
attempt and its retries); it succeeded if it ended <code>ok</code>, unless the runtime reported
<code>task_success: false</code>, and wherever a runtime reports <code>task_success</code> its value decides. Chains
whose first attempt the client cancelled are left out. Throughput is all turns. <b>Idle GPU cost</b> is fleet GPU time not used by any request (fleet − attributed GPU-seconds, per pool and day).</p>
<p><b>The spend-rise flag</b> marks a day whose GPU spend (fully loaded, per 24 h of data) is more than
{RISE_THRESHOLD * 100:.0f}% above the pooled trailing {BASELINE_DAYS}-day baseline while the goodput ratio improved by no
more than {SUCCESS_EPSILON * 100:.0f} percentage point. Days with under an hour of data are skipped.</p>
<p>Prices (USD per GPU-hour; source: {_e(report.prices_source)}). <code>sli_minute</code> carries no GPU SKU, so a
request is priced at its pool's GPUs as <code>gpu_minute</code> reports them.</p>
{_table([("GPU SKU", True), ("$/GPU-hour", False), ("Source", True)], price_rows)}
<p class='note'>Generated by <code>tailwatch report cost</code> from event-time buckets; times are UTC.</p>"""
