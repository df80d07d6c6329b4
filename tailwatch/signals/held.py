"""What the live view (signals/live.py) keeps of closed request minutes between snapshots,
rolled up per minute to the keys its answers group by: per pool, per pool and tenant (the
shedding plan, only the pool window), per model version, and the label sets seen.

Its memory follows the combinations of those keys, not rows: holding the rows (cut to the
columns read) for the rollout window was 4.5 MiB a minute at 20,000 slices (133 MiB once
full, the largest thing a worker held), and a snapshot exploded all their histograms. The
label sets are one row per slice whatever the history (the newest minute each was seen), so
tenants and pool attributes over a window are a filter, not a scan of held minutes.

Every rollup is exact: counts and GPU-seconds add, histograms add bin by bin, and a tenant
or attribute is in a window exactly when its newest minute is; only the order floating-point
sums add in differs from summing the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tailwatch.slo.columns import fresh_strings

MINUTE = "_m"  # epoch minute, Int64
# The `sli_minute` columns the rollups read (selected first).
REQUEST_COLUMNS_READ = ("window_start", "tenant", "model", "model_version", "zone", "workload", "traffic_class",
                        "deployment", "pool", "requests", "errors", "timeouts", "gpu_seconds", "gpu_seconds_reported",
                        "prompt_tokens", "output_tokens", "audio_seconds", "first_output_ms_hist", "e2e_ms_hist",
                        "inter_token_ms_hist", "language", "evals", "word_errors", "reference_words",
                        "successful_audio_ms", "underrun_reported", "underrun_streams")
LABELS = ("pool", "tenant", "model", "model_version", "stable", "zone", "workload", "traffic_class")
VERSION_KEYS = ("model", "model_version", "stable")
# (column, name) of the latency histograms a rollout compares; `field` in `version_bins`.
VERSION_HISTOGRAMS = (("first_output_ms_hist", "fo"), ("e2e_ms_hist", "e2e"), ("inter_token_ms_hist", "itl"))
HIST_TYPE = pl.List(pl.Struct({"bin": pl.Int16, "n": pl.Int64}))
_SUMS = ("requests", "gpu_seconds", "prompt_tokens", "output_tokens", "audio_seconds")
# Sampled evaluations per model version and language slice (rollout gates on quality by slice).
WER_SUMS = ("evals", "word_errors", "reference_words")
# What a rollout's cost per successful audio minute and underrun test read per model version.
SPEECH_SUMS = ("successful_audio_ms", "underrun_reported", "underrun_streams")


@dataclass(frozen=True)
class RequestRollup:
    """Closed (or open) request minutes, rolled up. Every frame carries `_m`; histograms are
    long (one row per bin), as every reader adds them up again over its own window."""

    pools: pl.DataFrame  # (pool, _m): requests, GPU-seconds, tokens, audio seconds
    pool_bins: pl.DataFrame  # (pool, _m, bin): n, of first output
    traffic: pl.DataFrame  # (pool, tenant, traffic_class, _m): requests, gpu_seconds, prompt/output tokens
    versions: pl.DataFrame  # (model, model_version, stable, pool, _m): requests, bad, timeouts, sums, SPEECH_SUMS
    version_bins: pl.DataFrame  # (model, model_version, stable, _m, field, bin): n, of the three latencies
    labels: pl.DataFrame  # one row per label set (LABELS): `_m`, the newest minute it was seen
    version_quality: pl.DataFrame  # (model, model_version, stable, language, _m): evaluations (WER_SUMS), where any

    @property
    def height(self) -> int:
        return self.pools.height

    def newest_minute(self) -> int | None:
        return int(self.pools[MINUTE].max()) if self.pools.height else None

    def _frames(self) -> tuple[pl.DataFrame, ...]:
        return self.pools, self.pool_bins, self.traffic, self.versions, self.version_bins, self.labels, self.version_quality

    def added(self, requests: pl.DataFrame, keep_minutes: int | None = None,
              traffic_minutes: int | None = None) -> RequestRollup:
        """These rows rolled up and added (closed minutes, or a peek at open ones). With
        `keep_minutes`, only the newest that many minutes are kept, the traffic rows of each
        pool's newest `traffic_minutes` only (the shedding plan reads the pool window, nothing
        older), and the label sets' strings are copied (each would pin the buffers of the
        minute it first appeared in). One lazy plan: rolling up, merging and trimming as eager
        steps was about 60 engine calls, 9 ms a closed batch however few its rows."""
        if not requests.height:
            return self
        if keep_minutes is not None:
            newest = max(m for m in (self.newest_minute(), int(requests["window_start"].dt.epoch("s").max()) // 60)
                         if m is not None)
            # Rows older than what is kept are left out before rolling up, not after: a backlog's
            # checkpoints close hours of minutes between two snapshots.
            requests = requests.filter(pl.col("window_start").dt.epoch("s") // 60 > newest - keep_minutes)
        plans = [pl.concat([held.lazy(), new], how="diagonal_relaxed") if held.height else new
                 for held, new in zip(self._frames(), _plans(_rows(requests)))]
        plans[5] = plans[5].group_by(LABELS).agg(pl.col(MINUTE).max())
        if keep_minutes is not None:
            plans = [p.filter(pl.col(MINUTE) > newest - keep_minutes) for p in plans]
            plans[5] = plans[5].with_columns(fresh_strings(_LABEL_STRINGS))
        if traffic_minutes is not None:
            plans[2] = plans[2].filter(pl.col(MINUTE) > pl.col(MINUTE).max().over("pool") - traffic_minutes)
        return RequestRollup(*pl.collect_all(plans))


EMPTY = RequestRollup(*(pl.DataFrame() for _ in range(7)))
NO_QUALITY = pl.DataFrame(schema={"model": pl.String, "model_version": pl.String, "stable": pl.Boolean,
                                  "language": pl.String, MINUTE: pl.Int64, **{c: pl.Int64 for c in WER_SUMS}})
_LABEL_STRINGS = [c for c in LABELS if c != "stable"]


def rollup(requests: pl.DataFrame) -> RequestRollup:
    """`sli_minute` rows rolled up, in buffers of their own (nothing held pins the rows')."""
    return EMPTY.added(requests)


def _rows(requests: pl.DataFrame) -> pl.LazyFrame:
    """The columns read, with the minute, the stable flag, and what a caller's rows lack."""
    return requests.lazy().select(*[c for c in REQUEST_COLUMNS_READ if c in requests.columns]).with_columns(
        minute_col(),
        (pl.col("deployment") == "stable").alias("stable"),  # null: neither side of a rollout, as before
        *[pl.lit(None, dtype=HIST_TYPE).alias(col) for col, _ in VERSION_HISTOGRAMS if col not in requests.columns],
        # Older rows or a test's own frame may lack a sum column: none counted.
        *[pl.lit(0.0).alias(c) for c in _SUMS if c not in requests.columns],
        *[pl.lit(0, pl.Int64).alias(c) for c in (*WER_SUMS, *SPEECH_SUMS) if c not in requests.columns],
        *([] if "language" in requests.columns else [pl.lit("").alias("language")]),
        # Rows not through the work estimate (open minutes, a test's frame) carry only what was reported.
        *([] if "gpu_seconds_reported" in requests.columns else
          [(pl.col("gpu_seconds") if "gpu_seconds" in requests.columns else pl.lit(0.0)).alias("gpu_seconds_reported")]),
    )


def _plans(rows: pl.LazyFrame) -> list[pl.LazyFrame]:
    """The seven frames of a RequestRollup, as plans over the same rows, strings copied."""
    histograms = [col for col, _ in VERSION_HISTOGRAMS]
    pools = rows.group_by("pool", MINUTE).agg(pl.col(c).fill_null(0).sum() for c in _SUMS)
    traffic = rows.group_by("pool", "tenant", "traffic_class", MINUTE).agg(
        pl.col(c).fill_null(0).sum() for c in ("requests", "gpu_seconds", "prompt_tokens", "output_tokens"))
    # A version's cost is what its requests reported: GPU time shared by tokens cannot tell two
    # versions' cost per token apart (planning/work_estimate.py), so it is no evidence for a rollout.
    versions = rows.group_by(*VERSION_KEYS, "pool", MINUTE).agg(
        pl.col("requests").sum(), (pl.col("errors") + pl.col("timeouts")).sum().alias("bad"), pl.col("timeouts").sum(),
        pl.col("gpu_seconds_reported").fill_null(0).sum().alias("gpu_seconds"),
        *[pl.col(c).fill_null(0).sum() for c in ("output_tokens", "audio_seconds", *SPEECH_SUMS)])
    index = ["pool", *VERSION_KEYS, MINUTE]
    bins = (rows.select(*index, *histograms).unpivot(histograms, index=index, variable_name="field", value_name="_h")
            .explode("_h").filter(pl.col("_h").is_not_null()).unnest("_h"))
    version_bins = bins.group_by(*VERSION_KEYS, MINUTE, "field", "bin").agg(pl.col("n").sum())
    pool_bins = bins.filter(pl.col("field") == "first_output_ms_hist").group_by("pool", MINUTE, "bin").agg(pl.col("n").sum())
    labels = rows.select(*LABELS, MINUTE)  # one row per label set once `added` groups them
    # Only rows that carry evaluations: most slices never do, and hold nothing here.
    version_quality = rows.filter(pl.col("evals").fill_null(0) > 0).group_by(*VERSION_KEYS, "language", MINUTE).agg(
        pl.col(c).fill_null(0).sum() for c in WER_SUMS)
    return [pools.with_columns(fresh_strings(["pool"])), pool_bins.with_columns(fresh_strings(["pool"])),
            traffic.with_columns(fresh_strings(["pool", "tenant", "traffic_class"])),
            versions.with_columns(fresh_strings(["model", "model_version", "pool"])),
            version_bins.with_columns(fresh_strings(["model", "model_version", "field"])),
            labels.with_columns(fresh_strings(_LABEL_STRINGS)),
            version_quality.with_columns(fresh_strings(["model", "model_version", "language"]))]


def minute_col() -> pl.Expr:
    """`window_start` as `_m`, the epoch minute."""
    return (pl.col("window_start").dt.epoch("s") // 60).alias(MINUTE)


def summed_bins(bins: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Long histogram rows added up per `keys`: (keys…, bin, n), sorted (what
    `slo.histogram.quantiles_frame` reads presorted)."""
    return bins.group_by(*keys, "bin").agg(pl.col("n").sum()).sort(*keys, "bin")


def concat_frames(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    """Both, by column name; an empty one is left out."""
    frames = [f for f in (a, b) if f.height]
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]
