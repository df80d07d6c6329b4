"""GPU cost math: attributed and fully loaded cost, goodput, unit costs, spend-rise flags.

Pure: frames in, frames out; no store, no clock. `reports.cost_report` feeds it the
store's buckets cut by any period (a day for the tables, an hour for the charts).

Two views of the same dollars:

- **Attributed** cost: what the requests themselves used. Each request reports its own
  `gpu_seconds`; they are priced at the USD per GPU-second of the GPUs of the request's
  pool in that period (`sli_minute` has no `gpu_sku`, so the SKU comes from the pool's
  rows in `gpu_minute`: a pool-period's price is its fleet cost ÷ its fleet GPU-seconds,
  which is the SKU's price for a one-SKU pool and the GPU-seconds-weighted mix for a
  mixed one). A pool seen in no `gpu_minute` row falls back to its model's mix, then to
  the price file's default.
- **Fully loaded** cost: what the fleet cost. Every GPU row in `gpu_minute` is 60
  GPU-seconds of a GPU that was paid for, busy or idle, and belongs to the pool (and
  model) it reported. A pool's fleet cost in a period is allocated to the (tenant, model,
  workload) rows that used that pool in that period, in proportion to their attributed
  GPU-seconds (in proportion to requests when no request reported GPU-seconds).
  Allocation rule in one line: fully loaded cost of a row = pool-period fleet cost × the
  row's share of the pool-period's attributed GPU-seconds. A pool-period with GPU rows and
  no traffic goes to the tenant `(unallocated)`, so nothing is dropped; traffic on a pool
  with no GPU rows in that period keeps its attributed cost as its fully loaded cost
  (there is no fleet figure to load it with).

So the sum of fully loaded cost over tenants equals the fleet total exactly (up to float
rounding): `fleet_total_usd` = Σ pool-periods with GPU rows (fleet GPU-seconds × price)
+ Σ attributed cost on pool-periods without GPU rows.

**Attributed GPU-seconds never exceed the GPU-seconds that existed.** Runtimes that
time-share a GPU (several replicas, or a batch, on one GPU) report each request's wall
time as its `gpu_seconds`; on a real H100 with four replicas these summed to 2.2× the
GPU's time. The requests' `gpu_seconds` only apportion the GPUs' time, so they are scaled:

- per pool and minute (`attribution_scales`): when the requests that completed in that
  minute reported more GPU-seconds than the pool's GPUs had (60 per `gpu_minute` row),
  each is multiplied by fleet ÷ reported, so no GPU-minute is attributed more than 60 s;
- per pool and period (in `allocate_costs`), as a backstop for minutes whose pool sent no
  GPU rows while the period has some: the same cap over the whole period.

A request is booked in the minute it completed (its event time), so a long request's time
counts in its last minute: the cap is on what each minute is attributed, not a replay of
when each request ran. The reported figure stays beside the attributed one
(`gpu_seconds_reported`, `attribution_scale` = attributed ÷ reported, 1 when unscaled).

Idle GPU-seconds of a pool-period = fleet GPU-seconds − attributed GPU-seconds (never
negative, since attributed is capped at the fleet's); its cost is allocated with the same
shares. So on every row and every roll-up, attributed cost + idle cost = fully loaded cost.

Goodput ratio = successful turns ÷ turns: the share of user turns (attempt chains) that
ended `ok`, or in `task_success` where the runtime reports it (see `streams.aggregates`).
Goodput is successful work; throughput is all turns. Unit costs divide the fully loaded
cost: per successful turn, per 1,000 output tokens, per audio-second and per successful audio
minute (audio of ok attempts only: audio a failed attempt heard or spoke is not served). A
zero denominator gives null, never inf or NaN.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import polars as pl

from tailwatch.planning.prices import GpuPrices

UNALLOCATED_TENANT = "(unallocated)"
GROUP_KEYS = ("period", "tenant", "model", "workload")
USAGE_SUMS = ("requests", "turns", "successful_turns", "output_tokens", "audio_seconds", "successful_audio_ms",
              "gpu_seconds", "gpu_seconds_reported")
COST_SUMS = ("attributed_cost_usd", "fully_loaded_cost_usd", "idle_cost_usd", "fully_loaded_gpu_seconds", "idle_gpu_seconds")

USAGE_SCHEMA = {
    "period": None, "tenant": pl.String, "model": pl.String, "workload": pl.String, "pool": pl.String,
    "requests": pl.Int64, "turns": pl.Int64, "successful_turns": pl.Int64, "output_tokens": pl.Int64,
    "audio_seconds": pl.Float64, "successful_audio_ms": pl.Int64, "gpu_seconds": pl.Float64,
    "gpu_seconds_reported": pl.Float64,
}
FLEET_SCHEMA = {"period": None, "pool": pl.String, "model": pl.String, "gpu_sku": pl.String, "gpu_seconds": pl.Float64}


@dataclass(frozen=True)
class CostTables:
    """`detail`: one row per (period, tenant, model, workload) with usage, both costs and unit
    costs. `pools`: one row per (period, pool): fleet vs attributed GPU-seconds and cost.
    `fleet_total_usd`: the fleet's fully loaded cost, which `detail` sums to."""

    detail: pl.DataFrame
    pools: pl.DataFrame
    fleet_total_usd: float


# ---- attribution scaled to the GPU time that existed --------------------------------------

def attribution_scales(reported: pl.DataFrame, fleet: pl.DataFrame) -> pl.DataFrame:
    """Per (minute, pool): the factor that brings the requests' reported GPU-seconds down to
    the GPU-seconds the pool's GPUs had in that minute, never up.

    `reported`: per (`minute`, `pool`) the requests' `gpu_seconds` (from `sli_minute`).
    `fleet`: per (`minute`, `pool`) the GPU-seconds that existed, `gpu_seconds` (60 per
    `gpu_minute` row). Returns one row per `reported` row: `minute`, `pool`,
    `reported_gpu_seconds`, `fleet_gpu_seconds` (null: the pool sent no GPU rows that
    minute), `attribution_scale` in (0, 1]. A minute without GPU rows keeps scale 1 here;
    `allocate_costs` caps its period instead."""
    reported = reported.select(
        "minute", pl.col("pool").fill_null(""), pl.col("gpu_seconds").fill_null(0.0).alias("reported_gpu_seconds"))
    fleet = fleet.select("minute", pl.col("pool").fill_null(""), pl.col("gpu_seconds").alias("fleet_gpu_seconds"))
    return (
        reported.group_by("minute", "pool").agg(pl.col("reported_gpu_seconds").sum())
        .join(fleet.group_by("minute", "pool").agg(pl.col("fleet_gpu_seconds").sum()),
              on=["minute", "pool"], how="left")
        .with_columns(
            pl.when(pl.col("reported_gpu_seconds") > pl.col("fleet_gpu_seconds"))
            .then(pl.col("fleet_gpu_seconds") / pl.col("reported_gpu_seconds"))
            .otherwise(1.0).alias("attribution_scale"))
        .sort("minute", "pool")
    )


@dataclass(frozen=True)
class AttributionScaling:
    """When and by how much attributed GPU-seconds were scaled down, for the report's sentence."""

    pool_minutes: int  # pool-minutes where requests reported GPU-seconds and the pool's GPUs reported
    pool_minutes_scaled: int
    pools_scaled: tuple[str, ...]
    first_scaled_minute: dt.datetime | None  # window start
    last_scaled_minute: dt.datetime | None  # window start
    min_scale: float | None  # the tightest minute
    reported_gpu_seconds: float  # the requests' own figure, over the whole range
    attributed_gpu_seconds: float  # after scaling, over the whole range

    @property
    def scaled(self) -> bool:
        return self.reported_gpu_seconds - self.attributed_gpu_seconds > 1e-9 * max(self.reported_gpu_seconds, 1.0)

    @property
    def overall_scale(self) -> float | None:
        return self.attributed_gpu_seconds / self.reported_gpu_seconds if self.reported_gpu_seconds > 0 else None

    @property
    def material(self) -> bool:
        """Scaled by more than 1% in all: worth a reader's attention, not a footnote."""
        return self.scaled and (self.overall_scale or 0.0) < 0.99

    def sentence(self) -> str:
        """What a finance reader needs to know about how "attributed" was measured, in plain words."""
        if not self.scaled:
            return ("Attributed cost is the GPU time each request's server reported using, priced by its GPU model.")
        more = self.reported_gpu_seconds / self.attributed_gpu_seconds - 1 if self.attributed_gpu_seconds > 0 else 0.0
        text = (f"Servers reported {self.reported_gpu_seconds / 3600:,.1f} GPU-hours for these requests, "
                f"{'under 0.1%' if more < 0.001 else f'{more:.1%}'} more than the GPUs that served them existed for: "
                f"servers that share one GPU between "
                f"several requests each count the whole time. Attributed cost counts only GPU time that existed "
                f"({self.attributed_gpu_seconds / 3600:,.1f} GPU-hours), shared between those requests in proportion "
                f"to what they reported.")
        if self.pool_minutes_scaled and self.first_scaled_minute is not None and self.last_scaled_minute is not None:
            pools = ", ".join(self.pools_scaled[:6]) + ("…" if len(self.pools_scaled) > 6 else "")
            first = self.first_scaled_minute.strftime("%Y-%m-%d %H:%M")
            last = (self.last_scaled_minute + dt.timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M")
            text += (f" This applied in {self.pool_minutes_scaled:,} of {self.pool_minutes:,} server-pool minutes"
                     f" ({pools}, {first} to {last} UTC).")
        return text


def summarize_scaling(scales: pl.DataFrame, pools: pl.DataFrame) -> AttributionScaling:
    """`scales` from `attribution_scales` (the range's minutes); `pools` from `allocate_costs`
    (its `reported_gpu_seconds` and `attributed_gpu_seconds` give the totals, backstop included)."""
    matched = scales.filter(pl.col("fleet_gpu_seconds").is_not_null() & (pl.col("reported_gpu_seconds") > 0))
    hit = matched.filter(pl.col("attribution_scale") < 1.0)
    return AttributionScaling(
        pool_minutes=matched.height,
        pool_minutes_scaled=hit.height,
        pools_scaled=tuple(sorted(set(hit["pool"].to_list()))),
        first_scaled_minute=hit["minute"].min() if hit.height else None,  # type: ignore[arg-type]
        last_scaled_minute=hit["minute"].max() if hit.height else None,  # type: ignore[arg-type]
        min_scale=float(hit["attribution_scale"].min()) if hit.height else None,  # type: ignore[arg-type]
        reported_gpu_seconds=float(pools["reported_gpu_seconds"].sum()) if pools.height else 0.0,
        attributed_gpu_seconds=float(pools["attributed_gpu_seconds"].sum()) if pools.height else 0.0,
    )


# ---- the two cost views ---------------------------------------------------------------------

def _usd_per_gpu_second(sku: pl.Expr, prices: GpuPrices) -> pl.Expr:
    return sku.fill_null("").replace_strict(
        prices.usd_per_gpu_hour, default=prices.default_usd_per_gpu_hour, return_dtype=pl.Float64) / 3600.0


def _ratio(num: pl.Expr, den: pl.Expr) -> pl.Expr:
    """num ÷ den, null when den is zero or null (never inf or NaN)."""
    return pl.when(den > 0).then(num / den).otherwise(None)


def allocate_costs(usage: pl.DataFrame, fleet: pl.DataFrame, prices: GpuPrices) -> CostTables:
    """Both cost views per (period, tenant, model, workload); see the module docstring for the rules.

    `usage`: per (period, tenant, model, workload, pool) sums of `requests`, `turns`,
    `successful_turns`, `output_tokens`, `audio_seconds`, `gpu_seconds` (attributed, already
    scaled per minute by `attribution_scales`) and optionally `gpu_seconds_reported` (the
    requests' own figure; taken as `gpu_seconds` when absent), from `sli_minute`.
    `fleet`: per (period, pool, model, gpu_sku) the fleet's `gpu_seconds` (60 per row of
    `gpu_minute`). `period` is any sortable bucket label (a date, an hour, a minute)."""
    if "gpu_seconds_reported" not in usage.columns:
        usage = usage.with_columns(pl.col("gpu_seconds").alias("gpu_seconds_reported"))
    if "successful_audio_ms" not in usage.columns:  # usage from before successful audio was counted
        usage = usage.with_columns(pl.lit(0, pl.Int64).alias("successful_audio_ms"))
    usage = usage.with_columns(
        pl.col(c).fill_null(0) for c in USAGE_SUMS
    ).with_columns(pl.col("pool").fill_null(""), pl.col("tenant").fill_null(""), pl.col("model").fill_null(""))
    fleet = fleet.with_columns(pl.col("pool").fill_null(""), pl.col("model").fill_null(""),
                               pl.col("gpu_seconds").fill_null(0.0))
    fleet = fleet.with_columns((pl.col("gpu_seconds") * _usd_per_gpu_second(pl.col("gpu_sku"), prices)).alias("cost_usd"))
    usage = _cap_to_fleet(usage, fleet)

    def mix(keys: list[str], name: str) -> pl.DataFrame:
        return fleet.group_by(keys).agg(
            _ratio(pl.col("cost_usd").sum(), pl.col("gpu_seconds").sum()).alias(name))

    fleet_pool = fleet.group_by("period", "pool").agg(
        pl.col("gpu_seconds").sum().alias("fleet_gpu_seconds"),
        pl.col("cost_usd").sum().alias("fleet_cost_usd"),
        # The pool's model, for a pool-period nobody used: the one with the most GPU time.
        pl.col("model").sort_by("gpu_seconds", descending=True).first().alias("fleet_model"),
    )
    default_price = prices.default_usd_per_gpu_hour / 3600.0
    priced = (
        usage.join(mix(["period", "pool"], "_p_period_pool"), on=["period", "pool"], how="left")
        .join(mix(["pool"], "_p_pool"), on="pool", how="left")
        .join(mix(["model"], "_p_model"), on="model", how="left")
        .with_columns(pl.coalesce("_p_period_pool", "_p_pool", "_p_model", pl.lit(default_price))
                      .alias("usd_per_gpu_second"))
        .with_columns((pl.col("gpu_seconds") * pl.col("usd_per_gpu_second")).alias("attributed_cost_usd"))
        .drop("_p_period_pool", "_p_pool", "_p_model")
    )
    used = priced.group_by("period", "pool").agg(
        pl.col("gpu_seconds").sum().alias("attributed_gpu_seconds"),
        pl.col("gpu_seconds_reported").sum().alias("reported_gpu_seconds"),
        pl.col("requests").sum().alias("_pool_requests"),
        pl.col("attributed_cost_usd").sum().alias("pool_attributed_cost_usd"),
    )
    pools = (
        fleet_pool.join(used, on=["period", "pool"], how="full", coalesce=True)
        .with_columns(
            pl.col("fleet_gpu_seconds").fill_null(0.0), pl.col("attributed_gpu_seconds").fill_null(0.0),
            pl.col("reported_gpu_seconds").fill_null(0.0),
            pl.col("_pool_requests").fill_null(0), pl.col("pool_attributed_cost_usd").fill_null(0.0),
            pl.col("fleet_cost_usd").is_not_null().alias("has_fleet_data"),
            pl.col("fleet_cost_usd").fill_null(0.0),
        )
        .with_columns(
            # Attributed is capped at the fleet's GPU-seconds, so this only absorbs float rounding.
            (pl.col("fleet_gpu_seconds") - pl.col("attributed_gpu_seconds")).clip(lower_bound=0).alias("idle_gpu_seconds"),
            _ratio(pl.col("attributed_gpu_seconds"), pl.col("reported_gpu_seconds")).alias("attribution_scale"),
            pl.when(pl.col("attributed_gpu_seconds") > 0).then(pl.lit("gpu_seconds"))
            .when(pl.col("_pool_requests") > 0).then(pl.lit("requests"))
            .otherwise(pl.lit("unallocated")).alias("allocated_by"),
        )
        .with_columns(
            (pl.col("idle_gpu_seconds") * _ratio(pl.col("fleet_cost_usd"), pl.col("fleet_gpu_seconds")).fill_null(0.0))
            .alias("idle_cost_usd"),
            pl.when(pl.col("has_fleet_data")).then(pl.col("fleet_cost_usd"))
            .otherwise(pl.col("pool_attributed_cost_usd")).alias("fully_loaded_cost_usd"),
        )
    )
    share = (
        pl.when(pl.col("allocated_by") == "gpu_seconds").then(pl.col("gpu_seconds") / pl.col("attributed_gpu_seconds"))
        .when(pl.col("allocated_by") == "requests").then(pl.col("requests") / pl.col("_pool_requests"))
        .otherwise(0.0)
    )
    rows = priced.join(
        pools.select("period", "pool", "has_fleet_data", "fleet_gpu_seconds", "fleet_cost_usd", "idle_gpu_seconds",
                     "idle_cost_usd", "allocated_by", "attributed_gpu_seconds", "_pool_requests"),
        on=["period", "pool"], how="left", suffix="_pool",
    ).with_columns(share.alias("_share")).with_columns(
        pl.when(pl.col("has_fleet_data")).then(pl.col("fleet_cost_usd") * pl.col("_share"))
        .otherwise(pl.col("attributed_cost_usd")).alias("fully_loaded_cost_usd"),
        pl.when(pl.col("has_fleet_data")).then(pl.col("fleet_gpu_seconds") * pl.col("_share"))
        .otherwise(pl.col("gpu_seconds")).alias("fully_loaded_gpu_seconds"),
        (pl.col("idle_cost_usd") * pl.col("_share")).alias("idle_cost_usd"),
        (pl.col("idle_gpu_seconds") * pl.col("_share")).alias("idle_gpu_seconds"),
    )
    # Fleet time nobody used in that pool-period: kept under its own tenant so totals reconcile.
    pool_workload = usage.group_by("pool").agg(pl.col("workload").drop_nulls().mode().sort().first().alias("workload"))
    unallocated = (
        pools.filter(pl.col("has_fleet_data") & (pl.col("allocated_by") == "unallocated"))
        .join(pool_workload, on="pool", how="left")
        .select(
            "period", pl.lit(UNALLOCATED_TENANT).alias("tenant"), pl.col("fleet_model").alias("model"),
            pl.col("workload").cast(pl.String), "pool",
            *[pl.lit(0, dtype=pl.Int64).alias(c) for c in ("requests", "turns", "successful_turns", "output_tokens",
                                                            "successful_audio_ms")],
            pl.lit(0.0).alias("audio_seconds"), pl.lit(0.0).alias("gpu_seconds"), pl.lit(0.0).alias("gpu_seconds_reported"),
            pl.lit(0.0).alias("attributed_cost_usd"),
            pl.col("fleet_cost_usd").alias("fully_loaded_cost_usd"),
            pl.col("fleet_cost_usd").alias("idle_cost_usd"),
            pl.col("fleet_gpu_seconds").alias("fully_loaded_gpu_seconds"),
            pl.col("fleet_gpu_seconds").alias("idle_gpu_seconds"),
        )
    )
    cols = [*GROUP_KEYS, "pool", *USAGE_SUMS, *COST_SUMS]
    allocated = pl.concat([rows.select(cols), unallocated.select(cols)], how="vertical_relaxed")
    detail = with_unit_costs(
        allocated.group_by(*GROUP_KEYS).agg(*[pl.col(c).sum() for c in (*USAGE_SUMS, *COST_SUMS)])
    ).sort(*GROUP_KEYS, nulls_last=True)
    pools_out = pools.select(
        "period", "pool", "has_fleet_data", "fleet_gpu_seconds", "reported_gpu_seconds", "attributed_gpu_seconds",
        "attribution_scale", "idle_gpu_seconds",
        "fleet_cost_usd", pl.col("pool_attributed_cost_usd").alias("attributed_cost_usd"), "idle_cost_usd",
        "fully_loaded_cost_usd", "allocated_by",
        (pl.col("attribution_scale") < 1.0).fill_null(False).alias("attribution_scaled"),
    ).sort("period", "pool")
    total = float(pools_out["fully_loaded_cost_usd"].sum()) if pools_out.height else 0.0
    return CostTables(detail=detail, pools=pools_out, fleet_total_usd=total)


def _cap_to_fleet(usage: pl.DataFrame, fleet: pl.DataFrame) -> pl.DataFrame:
    """Scale `gpu_seconds` so that no pool-period with GPU rows is attributed more GPU-seconds
    than its GPUs had. After per-minute scaling this changes nothing, except where a pool's
    minutes with traffic lacked GPU rows while other minutes of the period had them."""
    attributed = usage.group_by("period", "pool").agg(pl.col("gpu_seconds").sum().alias("_attributed"))
    present = fleet.group_by("period", "pool").agg(pl.col("gpu_seconds").sum().alias("_fleet"))
    cap = attributed.join(present, on=["period", "pool"], how="inner").filter(
        pl.col("_attributed") > pl.col("_fleet")
    ).select("period", "pool", (pl.col("_fleet") / pl.col("_attributed")).alias("_cap"))
    if cap.height == 0:
        return usage
    return usage.join(cap, on=["period", "pool"], how="left").with_columns(
        (pl.col("gpu_seconds") * pl.col("_cap").fill_null(1.0)).alias("gpu_seconds")
    ).drop("_cap")


def with_unit_costs(frame: pl.DataFrame) -> pl.DataFrame:
    """Ratios of a frame of sums (any roll-up of `detail`): goodput and the unit costs."""
    return frame.with_columns(
        _ratio(pl.col("gpu_seconds"), pl.col("gpu_seconds_reported")).alias("attribution_scale"),
        _ratio(pl.col("successful_turns"), pl.col("turns")).alias("goodput_ratio"),
        _ratio(pl.col("fully_loaded_cost_usd"), pl.col("successful_turns")).alias("cost_per_successful_turn_usd"),
        _ratio(pl.col("attributed_cost_usd"), pl.col("successful_turns")).alias("attributed_cost_per_successful_turn_usd"),
        _ratio(pl.col("fully_loaded_cost_usd") * 1000.0, pl.col("output_tokens")).alias("cost_per_1k_output_tokens_usd"),
        _ratio(pl.col("fully_loaded_cost_usd"), pl.col("audio_seconds")).alias("cost_per_audio_second_usd"),
        _ratio(pl.col("fully_loaded_cost_usd") * 60_000.0, pl.col("successful_audio_ms"))
        .alias("cost_per_successful_audio_minute_usd"),
        _ratio(pl.col("idle_gpu_seconds"), pl.col("fully_loaded_gpu_seconds")).alias("idle_ratio"),
    )


def rollup(detail: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """`detail` summed over everything but `keys`, with its ratios recomputed from the sums."""
    sums = [c for c in (*USAGE_SUMS, *COST_SUMS) if c in detail.columns]
    if keys:
        out = detail.group_by(keys).agg(*[pl.col(c).sum() for c in sums]).sort(keys, nulls_last=True)
    else:
        out = detail.select(*[pl.col(c).sum() for c in sums])
    return with_unit_costs(out)


# ---- spend rises with flat success --------------------------------------------------------

@dataclass(frozen=True)
class SpendRise:
    """A day whose GPU spend rose past the threshold against its trailing baseline while task
    success did not improve: the numbers a reader needs to judge it."""

    day: dt.date
    spend_usd: float  # fully loaded, that day
    daily_spend_usd: float  # normalised to 24 h of data (partial days compare fairly)
    baseline_daily_spend_usd: float
    baseline_days: int
    rise_ratio: float  # daily_spend / baseline − 1
    success_ratio: float | None
    baseline_success_ratio: float | None
    cost_per_successful_turn_usd: float | None
    baseline_cost_per_successful_turn_usd: float | None

    def summary(self) -> str:
        def pct(x: float | None) -> str:
            return "n/a" if x is None else f"{x * 100:.1f}%"

        def usd(x: float | None) -> str:
            return "n/a" if x is None else f"${x:,.4f}"

        return (f"{self.day.isoformat()}: daily GPU spend ${self.daily_spend_usd:,.2f} vs ${self.baseline_daily_spend_usd:,.2f}"
                f" baseline ({self.baseline_days}-day trailing), up {self.rise_ratio * 100:.1f}%, while task success"
                f" was {pct(self.success_ratio)} vs {pct(self.baseline_success_ratio)}; cost per successful turn"
                f" {usd(self.cost_per_successful_turn_usd)} vs {usd(self.baseline_cost_per_successful_turn_usd)}")


def flag_spend_rises(daily: pl.DataFrame, days: list[dt.date] | None = None, rise_threshold: float = 0.20,
                     success_epsilon: float = 0.01, baseline_days: int = 7, min_minutes: int = 60) -> list[SpendRise]:
    """Days whose spend rose more than `rise_threshold` over the trailing baseline while the
    success ratio rose by no more than `success_epsilon` (absolute, 0.01 = 1 point).

    `daily`: one row per day (`period`, a date) with `fully_loaded_cost_usd`, `turns`,
    `successful_turns` and `minutes_with_data` (minutes of the day that hold any bucket).
    Spend is compared per 24 h of data, so a partial first or last day compares fairly; days
    with fewer than `min_minutes` of data are neither flagged nor used as a baseline.
    The baseline is the up to `baseline_days` days before, pooled (Σ spend ÷ Σ minutes).
    `days`: only these days may be flagged (the report's range); the others are baseline."""
    rows = daily.sort("period").to_dicts()
    usable = [r for r in rows if (r.get("minutes_with_data") or 0) >= min_minutes]
    flags: list[SpendRise] = []
    for i, r in enumerate(usable):
        day = r["period"]
        if days is not None and day not in days:
            continue
        base = [b for b in usable[:i] if (day - b["period"]).days <= baseline_days]
        if not base:
            continue
        base_spend = sum(b["fully_loaded_cost_usd"] for b in base)
        base_minutes = sum(b["minutes_with_data"] for b in base)
        if base_spend <= 0 or base_minutes <= 0:
            continue
        baseline_daily = base_spend / base_minutes * 1440
        daily_spend = r["fully_loaded_cost_usd"] / r["minutes_with_data"] * 1440
        rise = daily_spend / baseline_daily - 1
        success = _div(r["successful_turns"], r["turns"])
        base_success = _div(sum(b["successful_turns"] for b in base), sum(b["turns"] for b in base))
        # Spend bought nothing if success did not improve; unknown success counts as not improved.
        improved = success is not None and base_success is not None and success - base_success > success_epsilon
        if rise > rise_threshold and not improved:
            flags.append(SpendRise(
                day=day, spend_usd=r["fully_loaded_cost_usd"], daily_spend_usd=daily_spend,
                baseline_daily_spend_usd=baseline_daily, baseline_days=len(base), rise_ratio=rise,
                success_ratio=success, baseline_success_ratio=base_success,
                cost_per_successful_turn_usd=_div(r["fully_loaded_cost_usd"], r["successful_turns"]),
                baseline_cost_per_successful_turn_usd=_div(base_spend, sum(b["successful_turns"] for b in base)),
            ))
    return flags


def _div(num: float, den: float) -> float | None:
    return num / den if den else None
