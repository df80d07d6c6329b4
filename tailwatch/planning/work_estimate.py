"""GPU time for requests that do not report it: a pool-minute's busy GPU-seconds shared among
its slices by a work estimate (tokens, audio seconds, or wall time).

The rules (docs/reports.md): where any request of a pool-minute reported `gpu_seconds`, those
stand (`reported`); otherwise the pool's busy GPU-seconds (each GPU's minute × its mean
utilisation, the whole minute where utilisation is unknown) go to its slices in proportion to
- `tokens`: prompt tokens × w + output tokens, w being what a prompt token costs in output
  tokens: the least-squares fit (no intercept) of busy GPU-seconds on prompt and output tokens
  over the pool's minutes of the hour, `DEFAULT_PROMPT_WEIGHT` with fewer than
  `MIN_FIT_MINUTES` minutes, tokens that move together or a fit that is not positive;
- `audio`: audio seconds;
- `wall_time`: requests × median end-to-end latency.
A pool-minute without GPU rows gets nothing (`no_gpu_telemetry`).

`store/attribution.py` states the same rules in SQL for the reports over the store (where the
hour is complete); `WorkEstimate` applies them to the minutes a worker closes, with the hour's
fit as far as it has come (until it has `MIN_FIT_MINUTES` minutes, the pool's last fit, or the
default before its first).
"""

from __future__ import annotations

import polars as pl

# A prompt is read in one parallel pass; each output token takes a forward pass of its own: a
# prompt token costs a few hundredths of an output token. Used only where a fit is not possible.
DEFAULT_PROMPT_WEIGHT = 0.05
MIN_FIT_MINUTES = 10
BASES = ("reported", "tokens", "audio", "wall_time", "no_gpu_telemetry")


def prompt_weight(n: int, a: float, b: float, c: float, d: float, e: float) -> float | None:
    """w from the normal equations of busy = wp·prompt + wo·output over n minutes, with
    a = Σp², b = Σp·o, c = Σo², d = Σp·busy, e = Σo·busy: w = wp / wo; None when the minutes
    cannot support a fit."""
    num, den = c * d - b * e, a * e - b * d
    if n >= MIN_FIT_MINUTES and a * c - b * b > 1e-6 * a * c and num > 0 and den > 0:
        return num / den
    return None


def pool_busy(gpu: pl.DataFrame) -> pl.DataFrame:
    """Busy GPU-seconds per pool-minute (`window_start`, `_pool`, `_busy`) of closed
    `gpu_minute` rows: each GPU's minute × its mean utilisation, the whole minute where that
    is unknown."""
    if not gpu.height:
        return pl.DataFrame(schema={"window_start": pl.Datetime("us"), "_pool": pl.String, "_busy": pl.Float64})
    return gpu.with_columns(pl.col("pool").cast(pl.String).fill_null("").alias("_pool")).group_by("window_start", "_pool").agg(
        (pl.col("util_pct_mean").cast(pl.Float64).clip(0, 100).fill_null(100) * 0.6).sum().alias("_busy"))


class WorkEstimate:
    """Per pool, the running sums of the current hour's fit."""

    def __init__(self):
        self.sums: dict[str, tuple[int, list[float]]] = {}  # pool → (hour, [n, a, b, c, d, e])
        self.last_fit: dict[str, float] = {}  # pool → its latest fitted weight

    def attribute(self, requests: pl.DataFrame, busy: pl.DataFrame) -> pl.DataFrame:
        """`requests` (closed `sli_minute` rows) with `gpu_seconds` set to what each row is
        attributed, `gpu_seconds_reported` (the requests' own figure) and `attribution_basis`;
        `busy`: `pool_busy` of the `gpu_minute` rows of their minutes (a pool-minute absent
        from it has no GPU telemetry)."""
        pool = pl.col("pool").cast(pl.String).fill_null("")
        # What a caller's rows lack (an older store's, a test's own) counts as not reported.
        absent = [c for c in ("gpu_seconds", "prompt_tokens", "output_tokens", "audio_seconds", "e2e_ms_p50")
                  if c not in requests.columns]
        rows = requests.with_columns(pl.lit(None, dtype=pl.Float64).alias(c) for c in absent).with_columns(
            pool.alias("_pool"), pl.col("gpu_seconds").alias("gpu_seconds_reported"))
        per_pm = rows.group_by("window_start", "_pool").agg(
            pl.col("gpu_seconds").fill_null(0).sum().alias("_reported"),
            pl.col("prompt_tokens").fill_null(0).sum().cast(pl.Float64).alias("_prompt"),
            pl.col("output_tokens").fill_null(0).sum().cast(pl.Float64).alias("_output"),
            pl.col("audio_seconds").fill_null(0).sum().alias("_audio"))
        if busy.height:
            per_pm = per_pm.join(busy, on=["window_start", "_pool"], how="left")
        else:
            per_pm = per_pm.with_columns(pl.lit(None, dtype=pl.Float64).alias("_busy"))
        per_pm = per_pm.sort("window_start").with_columns(
            pl.when(pl.col("_reported") > 0).then(pl.lit("reported"))
            .when(pl.col("_busy").is_null()).then(pl.lit("no_gpu_telemetry"))
            .when(pl.col("_prompt") + pl.col("_output") > 0).then(pl.lit("tokens"))
            .when(pl.col("_audio") > 0).then(pl.lit("audio"))
            .otherwise(pl.lit("wall_time")).alias("attribution_basis"))
        weights = []
        for minute, p, prompt, output, busy, basis in per_pm.select(
                "window_start", "_pool", "_prompt", "_output", "_busy", "attribution_basis").iter_rows():
            if basis != "tokens":
                weights.append(None)
                continue
            hour = int(minute.timestamp()) // 3600
            current = self.sums.get(p)
            if current is None or current[0] != hour:
                current = self.sums[p] = (hour, [0, 0.0, 0.0, 0.0, 0.0, 0.0])
            s = current[1]
            s[0] += 1
            s[1] += prompt * prompt
            s[2] += prompt * output
            s[3] += output * output
            s[4] += prompt * busy
            s[5] += output * busy
            fitted = prompt_weight(*s)
            if fitted is not None:
                self.last_fit[p] = fitted
            weights.append(self.last_fit.get(p, DEFAULT_PROMPT_WEIGHT))
        per_pm = per_pm.with_columns(pl.Series("_weight", weights, dtype=pl.Float64))
        rows = rows.join(per_pm.select("window_start", "_pool", "_busy", "_weight", "attribution_basis"),
                         on=["window_start", "_pool"], how="left")
        work = (pl.when(pl.col("attribution_basis") == "tokens")
                .then(pl.col("_weight") * pl.col("prompt_tokens").fill_null(0) + pl.col("output_tokens").fill_null(0))
                .when(pl.col("attribution_basis") == "audio").then(pl.col("audio_seconds").fill_null(0))
                .when(pl.col("attribution_basis") == "wall_time")
                .then(pl.col("requests") * pl.col("e2e_ms_p50").fill_null(1.0))
                .otherwise(0.0).cast(pl.Float64))
        rows = rows.with_columns(work.alias("_work"))
        share = pl.col("_busy") * pl.col("_work") / pl.col("_work").sum().over("window_start", "_pool")
        return rows.with_columns(
            pl.when(pl.col("attribution_basis") == "reported").then(pl.col("gpu_seconds").fill_null(0))
            .when(pl.col("attribution_basis") == "no_gpu_telemetry").then(0.0)
            .otherwise(share.fill_nan(0.0).fill_null(0.0)).alias("gpu_seconds")
        ).drop("_pool", "_busy", "_weight", "_work", *(c for c in absent if c != "gpu_seconds"))
