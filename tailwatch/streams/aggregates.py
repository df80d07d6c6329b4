"""What goes into an `sli_minute` and a `gpu_minute` row: the two aggregate specs.

Column names here are the store's contract (see README, "The store").

Turns. A turn is one attempt chain: the first attempt (`attempt` 1 and no `retry_of`) and
its retries (`attempt` > 1, `retry_of` = the first attempt's id). Attempts arrive as
separate events, possibly in different minutes, so both counts are made per event with
no join across events:

- `turns` counts each chain once, at its first attempt. A first attempt the client
  cancelled is not a turn (availability leaves client cancellations out too), unless the
  runtime reports `task_success` on it.
- `successful_turns` counts the attempt that ended the chain `ok` (an `ok` is never
  retried, so a chain has at most one), unless the runtime says `task_success: false`.
- Wherever `task_success` is present its value decides: `true` is a successful turn
  whatever the status, `false` never is. Runtimes that report it (once per turn, on the
  attempt that ended it) keep full control of success; vLLM, TGI and Triton never send
  it, and their turns still count.

So a chain that ends `error`, `timeout` or `shed` (retries exhausted) is a failed turn, and
a chain whose first attempt failed and whose retry the client cancelled is a failed turn
too. Sums over whole chains are exact; a chain that straddles a minute boundary counts its
turn in its first attempt's minute and its success in its last, so one minute's
successful turns can exceed its turns by the chains that crossed into it.
"""

from __future__ import annotations

import polars as pl

from tailwatch.conventions import LATENCY_FIELDS, LATENCY_LOWER_FIELDS, LATER_SLICE_LABELS, SLICE_LABELS, PHASE_NAMES
from tailwatch.ingest.schema import COMPLETED_FINISH, QUOTA_REASONS
from tailwatch.store.schema import QUALITY_COUNTS
from tailwatch.streams.frames import PHASES_COLUMN
from tailwatch.streams.minute_windows import AggregateSpec

REQUEST_COUNTS = ("requests", "ok", "errors", "timeouts", "shed", "cancelled", "retries", "turns", "successful_turns")
# Streams: attempts that say how their stream ended (`finish_reason`). Completed: a normal
# finish; cut: the server ended it mid-answer (an HTTP 200 can hide one); cancelled: the
# client left, which is not the service's failure.
STREAM_COUNTS = ("streams", "streams_completed", "streams_cut", "streams_timed_out", "streams_cancelled")
# Quality and runtime counts (each a sum, so late events merge into closed rows):
# - rejected_quota: refused for the tenant's quota or rate limit (status_reason quota or
#   rate_limit on an attempt that is neither ok nor cancelled), apart from overload shedding;
#   availability leaves them out, as it does client cancellations. ooms: failures the runtime put down to running out of memory.
# - ASR: partial_revisions over asr_partials_reported (requests that said how many), endpointing
#   errors over endpointing_reported.
# - TTS: underruns summed, and streams with any (underrun_streams) over those that reported
#   (underrun_reported); voice cache hits over lookups; fallbacks to a neutral voice or model.
# - LLM: prompt tokens served from the prefix cache; speculative decoding's drafted and accepted tokens.
# - Evaluations (eval.v1): how many, word and character errors over reference words and
#   characters (WER and CER as ratios of sums), MOS samples and their sum in thousandths.
# - successful_audio_ms: audio of ok attempts (ASR heard, TTS spoke), in whole milliseconds:
#   the unit of cost per successful audio minute.
# (Named once, in store.schema.QUALITY_COUNTS.)
MICRO = 1_000_000
MILLI = 1_000
# No sum here can wrap, for any record the contract admits (ingest/schema.py bounds each field)
# and up to this many events in one slice-minute (1.7 million a second into one slice):
# - counts add at most 1 an event: at most 10⁸ a minute, 6 × 10⁹ an hour row.
# - integer fields (tokens, revisions, underruns, word and character counts, GPU error counters,
#   `successful_audio_ms` from audio seconds ≤ 10⁶) add at most MAX_RECORD_COUNT (10⁹) an
#   event, in Int64: ≤ 10¹⁷ a slice-minute, ≤ 6 × 10¹⁸ an hour row (sli_hour merges 60
#   minutes the same way), under 2⁶³ ≈ 9.22 × 10¹⁸. `mos_milli` adds at most 5,000.
# - fixed-point sums (`_fixed_sum`: GPU- and audio-seconds in micro-units, up to 1.024 × 10¹⁵
#   an event; GPU means in milli-units) are Int128 in every partial, merge and checkpoint:
#   2¹²⁷ ≈ 1.7 × 10³⁸ is 10²³ events at the bound, whatever the event rate. Finished rows
#   hold them as doubles (the store's DOUBLE columns), which cannot wrap.
# The store's BIGINT columns hold the Int64 sums above; DuckDB sums BIGINT into HUGEINT.
MAX_EVENTS_PER_SLICE_MINUTE = 10**8
FIXED = pl.Int128


def _fixed_sum(column: str, scale: int) -> pl.Expr:
    """Sum in integer fixed point: float sums would depend on merge order, and a restart or
    replay merges partials in a different order, so buckets would differ in the last bits.
    Int128, so that no sum can wrap (above)."""
    return (pl.col(column) * scale).round().cast(FIXED).sum().alias(f"_{column}_fixed")


def _status(name: str) -> pl.Expr:
    return (pl.col("status") == name).sum().cast(pl.Int64)


def _finish(reason: str) -> pl.Expr:
    return (pl.col("finish_reason") == reason).sum().cast(pl.Int64)


# A retry says so with attempt > 1 or a retry_of; a producer that sends only one of them
# must not turn its retries into extra turns.
_RETRY = (pl.col("attempt").fill_null(1) > 1) | pl.col("retry_of").is_not_null()
# The first attempt opens the turn; a client that cancelled it never got a turn to judge.
_OPENS_TURN = ~_RETRY & ((pl.col("status") != "cancelled") | pl.col("task_success").is_not_null())
# The runtime's task_success decides where it is given; otherwise the chain's ok attempt.
_ENDS_TURN_OK = pl.col("task_success").fill_null(pl.col("status") == "ok")


REQUESTS = AggregateSpec(
    name="requests",
    keys=SLICE_LABELS,
    later_keys=LATER_SLICE_LABELS,
    dedupe_key=pl.col("event_id").hash(),
    partial=[
        # Evaluations (eval.v1, no status) share the rows but are not requests.
        pl.col("status").is_not_null().sum().cast(pl.Int64).alias("requests"),
        _status("ok").alias("ok"),
        _status("error").alias("errors"),
        _status("timeout").alias("timeouts"),
        _status("shed").alias("shed"),
        _status("cancelled").alias("cancelled"),
        _RETRY.sum().cast(pl.Int64).alias("retries"),
        # Turns by the attempt chain, computable per event (rule in the module docstring).
        _OPENS_TURN.sum().cast(pl.Int64).alias("turns"),
        _ENDS_TURN_OK.sum().cast(pl.Int64).alias("successful_turns"),
        pl.col("finish_reason").is_not_null().sum().cast(pl.Int64).alias("streams"),
        pl.col("finish_reason").is_in(COMPLETED_FINISH).sum().cast(pl.Int64).alias("streams_completed"),
        _finish("server_cut").alias("streams_cut"),
        _finish("timeout").alias("streams_timed_out"),
        _finish("client_cancel").alias("streams_cancelled"),
        pl.col("prompt_tokens").sum().cast(pl.Int64),
        pl.col("output_tokens").sum().cast(pl.Int64),
        # Never an ok or cancelled attempt: availability subtracts it beside cancellations,
        # so the sets must not overlap (valid would drop under good).
        (pl.col("status_reason").is_in(QUOTA_REASONS) & ~pl.col("status").is_in(("ok", "cancelled")))
        .sum().cast(pl.Int64).alias("rejected_quota"),
        (pl.col("status_reason") == "oom").sum().cast(pl.Int64).alias("ooms"),
        pl.col("partial_revisions").sum().cast(pl.Int64),
        pl.col("partial_revisions").is_not_null().sum().cast(pl.Int64).alias("asr_partials_reported"),
        pl.col("endpointing_error").sum().cast(pl.Int64).alias("endpointing_errors"),
        pl.col("endpointing_error").is_not_null().sum().cast(pl.Int64).alias("endpointing_reported"),
        pl.col("underruns").sum().cast(pl.Int64),
        (pl.col("underruns") > 0).sum().cast(pl.Int64).alias("underrun_streams"),
        pl.col("underruns").is_not_null().sum().cast(pl.Int64).alias("underrun_reported"),
        pl.col("voice_cache_hit").sum().cast(pl.Int64).alias("voice_cache_hits"),
        pl.col("voice_cache_hit").is_not_null().sum().cast(pl.Int64).alias("voice_cache_lookups"),
        pl.col("fallback").is_not_null().sum().cast(pl.Int64).alias("fallbacks"),
        pl.col("cached_prompt_tokens").sum().cast(pl.Int64),
        pl.col("draft_tokens").sum().cast(pl.Int64),
        pl.col("accepted_tokens").sum().cast(pl.Int64),
        pl.col("status").is_null().sum().cast(pl.Int64).alias("evals"),
        *[pl.col(c).sum().cast(pl.Int64) for c in ("word_errors", "reference_words", "char_errors", "reference_chars")],
        pl.col("mos").is_not_null().sum().cast(pl.Int64).alias("mos_samples"),
        (pl.col("mos") * MILLI).round().cast(pl.Int64).sum().alias("mos_milli"),
        pl.when(pl.col("status") == "ok").then((pl.col("audio_seconds") * MILLI).round()).cast(pl.Int64).sum()
        .alias("successful_audio_ms"),
        _fixed_sum("audio_seconds", MICRO),
        _fixed_sum("gpu_seconds", MICRO),
    ],
    merge={c: "sum" for c in (*REQUEST_COUNTS, *STREAM_COUNTS, *QUALITY_COUNTS, "prompt_tokens", "output_tokens",
                              "_audio_seconds_fixed", "_gpu_seconds_fixed")},
    finalize=lambda f: f.select(
        "window_start", *SLICE_LABELS, *REQUEST_COUNTS, "prompt_tokens", "output_tokens",
        (pl.col("_audio_seconds_fixed") / MICRO).alias("audio_seconds"),
        (pl.col("_gpu_seconds_fixed") / MICRO).alias("gpu_seconds"),
        *[f"{name}_{part}" for name in LATENCY_FIELDS for part in ("hist", "p50", "p95", "p99")],
        *[pl.col(c).fill_null(0) for c in (*STREAM_COUNTS, *QUALITY_COUNTS)],  # older partials lack them
        f"{PHASES_COLUMN}_hist",
        *[f"{name}_straddle_hist" for name in LATENCY_LOWER_FIELDS],
    ),
    histogram_fields=LATENCY_FIELDS,
    straddle_fields=tuple(LATENCY_LOWER_FIELDS.items()),
    keyed_histogram=(PHASES_COLUMN, PHASE_NAMES),
    # `finalize` undone: every column is a sum, so a late event merges into its closed row.
    unfinalize=lambda f: f.select(
        (pl.col("window_start").dt.epoch("s") // 60).alias("_minute"), *SLICE_LABELS,
        *[pl.col(c).fill_null(0) for c in (*REQUEST_COUNTS, *STREAM_COUNTS, *QUALITY_COUNTS, "prompt_tokens",
                                           "output_tokens")],
        *[(pl.col(c).fill_null(0) * MICRO).round().cast(FIXED).alias(f"_{c}_fixed") for c in ("audio_seconds", "gpu_seconds")],
    ),
)

def _mean(total: str, count: str, scale: int) -> pl.Expr:
    # One division of two exact integers: `total / count / scale` rounded twice, and polars
    # rounded it differently depending on how the column was laid out (a minute closed in
    # one process and the same minute merged from partials differed in the last bit).
    return pl.when(pl.col(count) > 0).then(pl.col(total) / (pl.col(count) * scale))


GPU_KEYS = ("node", "gpu_index")
GPU_LAST = ("zone", "pool", "gpu_sku", "model", "model_version", "replica_state")
GPM_FIELDS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct", "gr_engine_active_pct")
GPU_SOURCES = ("dcgm", "nvml", "otlp", "runtime")  # sorted: the order `sources` lists them in
# A sample that does not say its source is known by what it carries.
_NVML_READINGS = ("util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "temp_c", "xid_errors", "ecc_errors")
_RUNTIME_GAUGES = ("replica_state", "queue_depth", "oldest_queue_age_ms", "running", "active_streams",
                   "kv_cache_usage", "preemptions")
_INFERRED = {"nvml": _NVML_READINGS, "runtime": _RUNTIME_GAUGES}


def _has(column: str) -> pl.Expr:
    return pl.col(column).is_not_null() & (pl.col(column).cast(pl.String) != "")


def _newest_non_empty(column: str) -> list[pl.Expr]:
    """The newest non-empty value of a label and the time it was seen. A node has several
    sources for one GPU (the NVML collector, the serving runtime, DCGM), each sending only
    its own fields: a reading and the labels that describe it are joined, not overwritten
    by whichever sample came last (ties broken by value, so merge order cannot matter)."""
    has = _has(column)
    return [
        pl.col(column).filter(has).sort_by([pl.col("ts_ms").filter(has), pl.col(column).filter(has)]).last().alias(column),
        pl.col("ts_ms").filter(has).max().alias(f"_ts_{column}"),
    ]


def _reported_by(source: str) -> pl.Expr:
    said = pl.col("source") == source
    if source in _INFERRED:
        said = said | (pl.col("source").is_null() & pl.any_horizontal([pl.col(f).is_not_null() for f in _INFERRED[source]]))
    return said.fill_null(False).any().alias(f"_src_{source}")


GPU = AggregateSpec(
    name="gpu",
    keys=GPU_KEYS,
    # A redelivery repeats the whole sample; two sources sampling one GPU in the same
    # millisecond are two samples, not a duplicate.
    dedupe_key=pl.struct(pl.all().exclude("^_.*$")).hash(),
    partial=[
        pl.len().cast(pl.Int64).alias("samples"),
        *[e for c in GPU_LAST for e in _newest_non_empty(c)],
        *[_reported_by(src) for src in GPU_SOURCES],
        _fixed_sum("util_pct", MILLI),
        pl.col("util_pct").count().cast(pl.Int64).alias("_util_n"),
        pl.col("util_pct").max().alias("util_pct_max"),
        pl.col("mem_used_bytes").max().alias("mem_used_bytes_max"),
        pl.col("mem_total_bytes").max().alias("mem_total_bytes"),
        _fixed_sum("power_w", MILLI),
        pl.col("power_w").count().cast(pl.Int64).alias("_power_n"),
        pl.col("temp_c").max().alias("temp_c_max"),
        pl.col("xid_errors").sum().cast(pl.Int64).alias("xid_errors"),
        pl.col("ecc_errors").sum().cast(pl.Int64).alias("ecc_errors"),
        pl.col("queue_depth").max().alias("queue_depth_max"),
        pl.col("oldest_queue_age_ms").max().alias("oldest_queue_age_ms_max"),
        pl.col("running").max().alias("running_max"),
        pl.col("active_streams").max().alias("active_streams_max"),
        pl.col("kv_cache_usage").max().alias("kv_cache_usage_max"),
        pl.col("preemptions").sum().cast(pl.Int64).alias("preemptions"),
        *[e for f in GPM_FIELDS for e in (_fixed_sum(f, MILLI), pl.col(f).count().cast(pl.Int64).alias(f"_{f}_n"))],
    ],
    merge={
        "samples": "sum", **{c: "last" for c in GPU_LAST}, **{f"_ts_{c}": "max" for c in GPU_LAST},
        **{f"_src_{s}": "max" for s in GPU_SOURCES},
        "_util_pct_fixed": "sum", "_util_n": "sum", "util_pct_max": "max", "mem_used_bytes_max": "max",
        "mem_total_bytes": "max", "_power_w_fixed": "sum", "_power_n": "sum", "temp_c_max": "max",
        "xid_errors": "sum", "ecc_errors": "sum", "queue_depth_max": "max",
        "oldest_queue_age_ms_max": "max", "running_max": "max", "active_streams_max": "max",
        "kv_cache_usage_max": "max", "preemptions": "sum",
        **{c: "sum" for f in GPM_FIELDS for c in (f"_{f}_fixed", f"_{f}_n")},
    },
    finalize=lambda f: f.select(
        "window_start", "node", "gpu_index", "zone", "pool", "gpu_sku", "model", "model_version",
        "samples",
        _mean("_util_pct_fixed", "_util_n", MILLI).alias("util_pct_mean"),
        "util_pct_max", "mem_used_bytes_max", "mem_total_bytes",
        _mean("_power_w_fixed", "_power_n", MILLI).alias("power_w_mean"),
        "temp_c_max", "xid_errors", "ecc_errors", "queue_depth_max", "oldest_queue_age_ms_max",
        "running_max", "active_streams_max", "kv_cache_usage_max", "preemptions", "replica_state",
        *[_mean(f"_{f}_fixed", f"_{f}_n", MILLI).alias(f"{f}_mean") for f in GPM_FIELDS],
        pl.concat_str([pl.when(pl.col(f"_src_{s}")).then(pl.lit(s)) for s in GPU_SOURCES],
                      separator=",", ignore_nulls=True).alias("sources"),
    ),
)
