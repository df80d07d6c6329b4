"""Fleet metrics: the closed 1-minute buckets as Prometheus series, for dashboards.

A worker stage (`streams.stages.Stage`) that turns each checkpoint's newly closed
`sli_minute` and `gpu_minute` rows into `/metrics` series. It writes no store rows.

What it exports, and at which aggregation level (only the labels some panel needs):

- traffic counters, labels `TRAFFIC_LABELS` (the slice without `pool`):
  `tailwatch_requests_total{…, outcome}` (ok, error, timeout, shed, cancelled; every
  outcome is exported from the first request of a label set on, zeros included, so an
  error panel is never empty for lack of errors), `tailwatch_request_retries_total`,
  `tailwatch_turns_total`, `tailwatch_successful_turns_total`,
  `tailwatch_prompt_tokens_total`, `tailwatch_output_tokens_total`,
  `tailwatch_audio_seconds_total`, and how answer streams ended: `tailwatch_streams_total`,
  `tailwatch_streams_completed_total`, `_cut_total`, `_timed_out_total`, `_cancelled_total`;
- `tailwatch_request_gpu_seconds_total{GPU_TIME_LABELS}`: GPU time the requests used,
  with the `pool` and `gpu_sku` that cost panels join on (the SKU of a pool is learnt
  from its GPU samples: `sli_minute` has no SKU) and `attribution_basis`: the requests' own
  `gpu_seconds` (`reported`), or, for runtimes that report none, the pool-minute's busy GPU
  time shared by `tokens`, `audio` or `wall_time` (planning/work_estimate.py), counted once
  both topics have closed the minute (`PAIRING_MINUTES`);
- `tailwatch_request_latency_seconds{LATENCY_LABELS, field}` (a histogram: `_bucket`
  with `le` in LATENCY_BUCKETS_S, `_sum`, `_count`): queue, first-output, e2e and
  inter-token latency of
  every closed minute, the stored sketch bins coarsened to Prometheus buckets (a bin goes to
  the first bucket at or above its upper bound, so `le` is never understated), so that
  `histogram_quantile` over `rate(..._bucket)` aggregates over any labels; quantile gauges
  could not be added across slices;
- GPU fleet, labels `zone, pool, gpu_sku`: `tailwatch_gpu_seconds_total` (every GPU
  present in a minute is 60 GPU-seconds: the fleet time that is paid for, idle included),
  `tailwatch_gpu_xid_errors_total`, `tailwatch_gpu_ecc_errors_total`, and gauges of the
  newest closed minute: `tailwatch_gpus`, `tailwatch_gpu_utilization_ratio` (mean),
  `tailwatch_gpu_memory_used_bytes` / `_total_bytes` (sums), `tailwatch_gpu_power_watts`
  (sum), `tailwatch_gpu_temperature_celsius` (max), `tailwatch_gpu_kv_cache_usage_ratio`
  (max), `tailwatch_queue_oldest_age_seconds` (max), `tailwatch_queue_depth_requests`
  (sum), `tailwatch_gpu_replicas{state}` (warm, loading, cold, draining, unknown; zeros included);
  useful utilisation where GPUs report it (NVML's GPM, DCGM's profiling fields), means over
  the GPUs that do, 0-1 like utilisation: `tailwatch_gpu_sm_active_ratio`,
  `tailwatch_gpu_sm_occupancy_ratio`, `tailwatch_gpu_tensor_active_ratio`,
  `tailwatch_gpu_dram_bandwidth_ratio`, and `tailwatch_gpus_profiled` (how many GPUs of
  the pool reported SM activity: the weight for fleet-wide means). A pool without them
  has no such series, not a zero;
- `tailwatch_gpu_price_usd_per_gpu_second{gpu_sku}` from `planning/prices.py`, so that cost is
  PromQL: GPU-seconds × price, joined `on (gpu_sku)`.

Cardinality. Each label is from a closed set (`workload`, `traffic_class`, `deployment`:
schema literals) or bounded by the fleet's inventory (models, versions, zones, pools,
SKUs), except `tenant`, which grows with the customer base. Two budgets bound the series:

- the first `max_tenants` distinct tenants (busiest of their batch first, default 50)
  keep their name; later ones are counted under `tenant="other"`;
- per family (traffic, request GPU time, latency), the first `max_label_sets` label sets
  (default 1,000) keep their labels; a later one has its open-ended labels (`tenant`,
  `model`, `model_version`, `pool`) folded into `other`, keeping `zone`, the closed sets
  and `gpu_sku`. The product of inventory labels is what explodes (13 models × 7 versions ×
  3 zones × 4 workloads × 2 classes × 2 deployments is 4,368 latency label sets, 196,560
  series), and a scrape that renders a million series stalls the worker's HTTP thread. Like
  the OpenTelemetry SDK's cardinality limit with its overflow series, folding keeps every
  total and every breakdown by the kept labels exact; only the named breakdown of the
  newest label sets is lost, and `tailwatch_fleet_label_sets{family}` against
  `tailwatch_fleet_label_sets_limit{family}` shows when that happens.

Assignment is sticky for the process's life (a counter never moves between series) and
starts afresh on restart, as every counter here does: they accumulate closed buckets
since start, which Prometheus' rate() and increase() treat as a counter reset. Gauges of
a label set that has had no closed minute for `stale_minutes` of event time are dropped,
so a retired model version does not linger with its last reading.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import duckdb
import polars as pl
import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from tailwatch.slo import histogram
from tailwatch.planning.prices import GpuPrices
from tailwatch.planning.work_estimate import WorkEstimate, pool_busy
from tailwatch.conventions import (
    AUDIO_SECONDS_TOTAL, FLEET_FOLDED_BUCKETS_TOTAL, FLEET_LABEL_SETS, FLEET_LABEL_SETS_LIMIT, GPUS,
    GPUS_PROFILED, GPU_DRAM_BANDWIDTH_RATIO, GPU_ECC_ERRORS_TOTAL, GPU_KV_CACHE_USAGE_RATIO,
    GPU_MEMORY_TOTAL_BYTES, GPU_MEMORY_USED_BYTES, GPU_POWER_WATTS, GPU_PRICE_USD_PER_GPU_SECOND,
    GPU_REPLICAS, GPU_SECONDS_TOTAL, GPU_SM_ACTIVE_RATIO, GPU_SM_OCCUPANCY_RATIO, GPU_TEMPERATURE_CELSIUS,
    GPU_TENSOR_ACTIVE_RATIO, GPU_UTILIZATION_RATIO, GPU_XID_ERRORS_TOTAL, OUTPUT_TOKENS_TOTAL,
    PROMPT_TOKENS_TOTAL, QUEUE_DEPTH_REQUESTS, QUEUE_OLDEST_AGE_SECONDS, REQUESTS_TOTAL,
    REQUEST_GPU_SECONDS_TOTAL, REQUEST_LATENCY_SECONDS, REQUEST_RETRIES_TOTAL, STREAMS_CANCELLED_TOTAL,
    STREAMS_COMPLETED_TOTAL, STREAMS_CUT_TOTAL, STREAMS_TIMED_OUT_TOTAL, STREAMS_TOTAL,
    SUCCESSFUL_AUDIO_SECONDS_TOTAL, SUCCESSFUL_TURNS_TOTAL, TURNS_TOTAL, GPU_TIME_LABELS, LATENCY_LABELS,
    POOL_LABELS, TRAFFIC_LABELS,
    ASR_ENDPOINTING_ERRORS_TOTAL, ASR_PARTIAL_REVISIONS_TOTAL, ASR_TURNS_REPORTING_ENDPOINTING_TOTAL,
    ASR_REFERENCE_WORDS_TOTAL, ASR_WORD_ERRORS_TOTAL, TTS_MOS_EVALUATIONS_TOTAL, TTS_MOS_SCORE_TOTAL,
    ASR_TURNS_REPORTING_PARTIALS_TOTAL, CACHED_PROMPT_TOKENS_TOTAL, OOM_FAILURES_TOTAL, QUOTA_REJECTIONS_TOTAL,
    SPECULATIVE_ACCEPTED_TOKENS_TOTAL, SPECULATIVE_DRAFT_TOKENS_TOTAL, TTS_FALLBACKS_TOTAL, TTS_STREAMS_REPORTING_UNDERRUNS_TOTAL,
    TTS_STREAMS_WITH_UNDERRUNS_TOTAL, TTS_UNDERRUNS_TOTAL, TTS_VOICE_CACHE_HITS_TOTAL, TTS_VOICE_CACHE_LOOKUPS_TOTAL,
)


# outcome label → sli_minute column
OUTCOME_COLUMNS = {"ok": "ok", "error": "errors", "timeout": "timeouts", "shed": "shed", "cancelled": "cancelled"}
# metric → sli_minute column, summed over TRAFFIC_LABELS
TRAFFIC_COUNTERS = {
    REQUEST_RETRIES_TOTAL: ("retries", "Request attempts after the first (attempt > 1 or retry_of set)."),
    TURNS_TOTAL: ("turns", "User turns: attempt chains, counted at their first attempt (cancellations left out)."),
    SUCCESSFUL_TURNS_TOTAL: ("successful_turns",
                                   "User turns that ended ok, or with task_success where the runtime reports it (goodput)."),
    PROMPT_TOKENS_TOTAL: ("prompt_tokens", "Prompt tokens of every attempt."),
    OUTPUT_TOKENS_TOTAL: ("output_tokens", "Output tokens of successful attempts."),
    AUDIO_SECONDS_TOTAL: ("audio_seconds", "Seconds of audio processed or produced."),
    SUCCESSFUL_AUDIO_SECONDS_TOTAL: ("successful_audio_seconds",
                                     "Seconds of audio of successful attempts (cost per successful audio minute)."),
    STREAMS_TOTAL: ("streams", "Attempts that said how their answer stream ended (finish_reason)."),
    STREAMS_COMPLETED_TOTAL: ("streams_completed", "Streams that ended normally: stop, length or content filter."),
    STREAMS_CUT_TOTAL: ("streams_cut", "Streams the server cut mid-answer (an HTTP 200 can hide one)."),
    STREAMS_TIMED_OUT_TOTAL: ("streams_timed_out", "Streams that timed out."),
    STREAMS_CANCELLED_TOTAL: ("streams_cancelled", "Streams the client cancelled (not the service's failure)."),
    QUOTA_REJECTIONS_TOTAL: ("rejected_quota", "Attempts refused for the tenant's quota or rate limit (not overload)."),
    OOM_FAILURES_TOTAL: ("ooms", "Attempts that failed for want of GPU memory (status_reason oom)."),
    ASR_PARTIAL_REVISIONS_TOTAL: ("partial_revisions", "Partial transcripts revised before the final one."),
    ASR_TURNS_REPORTING_PARTIALS_TOTAL: ("asr_partials_reported", "ASR attempts that reported partial_revisions."),
    ASR_ENDPOINTING_ERRORS_TOTAL: ("endpointing_errors", "ASR turns endpointed wrongly (speaker cut off or held)."),
    ASR_TURNS_REPORTING_ENDPOINTING_TOTAL: ("endpointing_reported", "ASR attempts that reported endpointing_error."),
    TTS_UNDERRUNS_TOTAL: ("underruns", "Playback buffer underruns in TTS streams."),
    TTS_STREAMS_WITH_UNDERRUNS_TOTAL: ("underrun_streams", "TTS streams with at least one underrun."),
    TTS_STREAMS_REPORTING_UNDERRUNS_TOTAL: ("underrun_reported", "TTS streams that reported underruns."),
    TTS_VOICE_CACHE_HITS_TOTAL: ("voice_cache_hits", "TTS attempts whose voice was warm in the cache."),
    TTS_VOICE_CACHE_LOOKUPS_TOTAL: ("voice_cache_lookups", "TTS attempts that reported voice_cache_hit."),
    TTS_FALLBACKS_TOTAL: ("fallbacks", "TTS attempts served by a neutral voice or a smaller model instead."),
    CACHED_PROMPT_TOKENS_TOTAL: ("cached_prompt_tokens", "Prompt tokens served from the prefix (KV) cache."),
    SPECULATIVE_DRAFT_TOKENS_TOTAL: ("draft_tokens", "Tokens drafted by speculative decoding."),
    SPECULATIVE_ACCEPTED_TOKENS_TOTAL: ("accepted_tokens", "Drafted tokens the target model accepted."),
    ASR_WORD_ERRORS_TOTAL: ("word_errors", "Word errors (substitutions, deletions, insertions) in sampled ASR evaluations."),
    ASR_REFERENCE_WORDS_TOTAL: ("reference_words", "Reference words of sampled ASR evaluations (WER's denominator)."),
    TTS_MOS_EVALUATIONS_TOTAL: ("mos_samples", "Sampled TTS evaluations with a MOS proxy (eval.v1 mos)."),
    TTS_MOS_SCORE_TOTAL: ("mos_score", "Sum of the sampled TTS evaluations' MOS proxies (1 to 5 each): over the "
                                       "evaluations, the mean MOS."),
}
LATENCY_FIELDS = {"queue": "queue_ms_hist", "first_output": "first_output_ms_hist", "e2e": "e2e_ms_hist",
                  "inter_token": "inter_token_ms_hist", "finalization": "finalization_ms_hist"}
# Bucket bounds in seconds (+Inf implied): queue waits of tens of ms to first outputs and
# answers of minutes. 14 series per label set and field, against 3 quantile gauges before.
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_BOUNDS_MS = np.array(LATENCY_BUCKETS_S) * 1000.0
REPLICA_STATES = ("warm", "loading", "cold", "draining", "unknown")  # unknown: the GPU's sources send no state
GPU_SECONDS_PER_GPU_MINUTE = 60.0
OTHER_TENANT = "other"
OTHER = "other"
# Labels that survive folding: closed sets or few by nature, and what cost joins on.
KEPT_WHEN_FOLDED = frozenset({"zone", "workload", "traffic_class", "deployment", "gpu_sku", "attribution_basis"})


@dataclass(frozen=True)
class FleetMetricsConfig:
    max_tenants: int = 50
    max_label_sets: int = 1000
    stale_minutes: int = 5
    prices: GpuPrices = field(default_factory=GpuPrices)


class LabelBudget:
    """Sticky admission of one family's label sets up to `limit`; past it, a new label
    set's open-ended labels become `other` (the folded sets are few: products of closed
    sets and zones, so they are not counted against the limit)."""

    def __init__(self, family: str, labels: tuple[str, ...], limit: int):
        self.family = family
        self.limit = limit
        self.folded_positions = [i for i, name in enumerate(labels) if name not in KEPT_WHEN_FOLDED]
        self.named: set[tuple] = set()
        self.folded_sets: set[tuple] = set()
        self.folded_buckets = 0  # closed label-set minutes counted under a folded set

    def admit(self, key: tuple, buckets: int = 1) -> tuple:
        if key in self.named:
            return key
        if len(self.named) < self.limit:
            self.named.add(key)
            return key
        folded = list(key)
        for i in self.folded_positions:
            folded[i] = OTHER
        folded = tuple(folded)
        self.folded_sets.add(folded)
        self.folded_buckets += buckets
        return folded

    def label_sets(self) -> int:
        return len(self.named) + len(self.folded_sets - self.named)


@dataclass
class _Gauge:
    value: float
    minute: int  # event-time epoch minute of the bucket it came from


class FleetCollector:
    """Holds counters and newest-minute gauges; the worker thread writes, the HTTP thread
    reads, under one lock (a snapshot per scrape is cheap at these cardinalities)."""

    def __init__(self, config: FleetMetricsConfig):
        self.config = config
        self.lock = threading.Lock()
        self.requests: dict[tuple, dict[str, float]] = {}  # TRAFFIC labels → outcome → count
        self.traffic: dict[str, dict[tuple, float]] = {name: {} for name in TRAFFIC_COUNTERS}
        self.request_gpu_seconds: dict[tuple, float] = {}
        self.gpu_seconds: dict[tuple, float] = {}
        self.xid_errors: dict[tuple, float] = {}
        self.ecc_errors: dict[tuple, float] = {}
        # (*LATENCY labels, field) → requests per bucket (not cumulative; the last is +Inf), and
        # the sum of their latencies in seconds (bins at their representative value)
        self.latency: dict[tuple, np.ndarray] = {}
        self.latency_sum_s: dict[tuple, float] = {}
        self.pool_gauges: dict[str, dict[tuple, _Gauge]] = {}  # metric → (*POOL labels[, state]) → gauge
        self.skus: set[str] = set()
        self.budgets = {
            "traffic": LabelBudget("traffic", TRAFFIC_LABELS, config.max_label_sets),
            "request_gpu_seconds": LabelBudget("request_gpu_seconds", GPU_TIME_LABELS, config.max_label_sets),
            "latency": LabelBudget("latency", LATENCY_LABELS, config.max_label_sets),
        }

    def describe(self):
        return []

    def collect(self):
        with self.lock:
            yield from self._families()

    def _families(self):
        req = CounterMetricFamily(REQUESTS_TOTAL, "Request attempts in closed minutes, by outcome.",
                                  labels=[*TRAFFIC_LABELS, "outcome"])
        for key, outcomes in self.requests.items():
            for outcome, n in outcomes.items():
                req.add_metric([*key, outcome], n)
        yield req
        for name, (_column, doc) in TRAFFIC_COUNTERS.items():
            fam = CounterMetricFamily(name, doc, labels=list(TRAFFIC_LABELS))
            for key, v in self.traffic[name].items():
                fam.add_metric(list(key), v)
            yield fam
        fam = CounterMetricFamily(REQUEST_GPU_SECONDS_TOTAL, "GPU-seconds used by requests.",
                                  labels=list(GPU_TIME_LABELS))
        for key, v in self.request_gpu_seconds.items():
            fam.add_metric(list(key), v)
        yield fam
        for name, store, doc in (
            (GPU_SECONDS_TOTAL, self.gpu_seconds, "Fleet GPU-seconds (60 per GPU per minute present, idle included)."),
            (GPU_XID_ERRORS_TOTAL, self.xid_errors, "NVIDIA XID errors reported."),
            (GPU_ECC_ERRORS_TOTAL, self.ecc_errors, "Uncorrected ECC errors reported."),
        ):
            fam = CounterMetricFamily(name, doc, labels=list(POOL_LABELS))
            for key, v in store.items():
                fam.add_metric(list(key), v)
            yield fam
        lat = HistogramMetricFamily(REQUEST_LATENCY_SECONDS,
                                    "Latency of requests in closed minutes (field: queue, first_output, e2e).",
                                    labels=[*LATENCY_LABELS, "field"])
        les = [_le(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]
        for key, counts in self.latency.items():
            lat.add_metric(list(key), list(zip(les, np.cumsum(counts).astype(float).tolist())),
                           sum_value=self.latency_sum_s[key])
        yield lat
        for name, (doc, extra) in POOL_GAUGES.items():
            fam = GaugeMetricFamily(name, doc, labels=[*POOL_LABELS, *extra])
            for key, g in self.pool_gauges.get(name, {}).items():
                fam.add_metric(list(key), g.value)
            yield fam
        price = GaugeMetricFamily(GPU_PRICE_USD_PER_GPU_SECOND,
                                  "GPU price per SKU in USD per GPU-second (planning/prices.py).", labels=["gpu_sku"])
        p = self.config.prices
        for sku in sorted(set(p.usd_per_gpu_hour) | self.skus):
            price.add_metric([sku], p.usd_per_gpu_second(sku))
        yield price
        sets = GaugeMetricFamily(FLEET_LABEL_SETS, "Label sets a fleet metric family exports "
                                 "(named and folded into other).", labels=["family"])
        limit = GaugeMetricFamily(FLEET_LABEL_SETS_LIMIT, "Named label sets a family may export "
                                  "before new ones fold into other (--metrics-max-label-sets).", labels=["family"])
        folded = CounterMetricFamily(FLEET_FOLDED_BUCKETS_TOTAL, "Closed label-set minutes counted under "
                                     "a label set folded into other.", labels=["family"])
        for family, budget in self.budgets.items():
            sets.add_metric([family], budget.label_sets())
            limit.add_metric([family], budget.limit)
            folded.add_metric([family], budget.folded_buckets)
        yield from (sets, limit, folded)


# What a request row's GPU time is worked out from (planning/work_estimate.py) and counted by:
# a waiting row holds no more.
_ATTRIBUTED = ("window_start", "requests", "gpu_seconds", "prompt_tokens", "output_tokens", "audio_seconds", "e2e_ms_p50",
               *(k for k in GPU_TIME_LABELS if k not in ("gpu_sku", "attribution_basis")))


def _newer(held: int | None, minute: int) -> int:
    return minute if held is None else max(held, minute)


def _minute_of_expr() -> pl.Expr:
    return pl.col("window_start").dt.epoch("s") // 60


def _minute_of(rows: pl.DataFrame) -> pl.Series:
    return rows.select(_minute_of_expr())["window_start"]


def _busiest_first(grouped: pl.DataFrame, labels: tuple[str, ...]) -> pl.DataFrame:
    """Label sets by requests, most first (then by name, so replays admit the same ones)."""
    return grouped.sort(["requests", *labels], descending=[True, *[False] * len(labels)])


def _le(bound_s: float) -> str:
    return repr(float(bound_s))


# metric → (help, extra labels beyond POOL_LABELS)
POOL_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    GPUS: ("GPUs reporting in the newest closed minute.", ()),
    GPU_UTILIZATION_RATIO: ("Mean GPU utilisation (0-1).", ()),
    GPU_MEMORY_USED_BYTES: ("GPU memory used (sum of per-GPU maxima).", ()),
    GPU_MEMORY_TOTAL_BYTES: ("GPU memory installed.", ()),
    GPU_POWER_WATTS: ("GPU power draw (sum of per-GPU means).", ()),
    GPU_TEMPERATURE_CELSIUS: ("Hottest GPU.", ()),
    GPU_KV_CACHE_USAGE_RATIO: ("Highest KV-cache usage of a replica (0-1).", ()),
    QUEUE_OLDEST_AGE_SECONDS: ("Age of the oldest queued request of any replica.", ()),
    QUEUE_DEPTH_REQUESTS: ("Queued requests (sum of per-replica maxima).", ()),
    GPU_REPLICAS: ("Replicas (one per GPU) by state.", ("state",)),
    GPU_SM_ACTIVE_RATIO: ("Mean share of time SMs were active (GPM SM_UTIL, DCGM_FI_PROF_SM_ACTIVE; 0-1), "
                                      "over the GPUs that report it: how much of the GPU works, where utilisation "
                                      "only says a kernel ran.", ()),
    GPU_SM_OCCUPANCY_RATIO: ("Mean SM occupancy: resident warps over the maximum (GPM SM_OCCUPANCY, "
                                         "DCGM_FI_PROF_SM_OCCUPANCY; 0-1).", ()),
    GPU_TENSOR_ACTIVE_RATIO: ("Mean share of time tensor pipes were active (GPM ANY_TENSOR_UTIL, "
                                          "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE; 0-1).", ()),
    GPU_DRAM_BANDWIDTH_RATIO: ("Mean DRAM bandwidth used over the peak (GPM DRAM_BW_UTIL, "
                                           "DCGM_FI_PROF_DRAM_ACTIVE; 0-1).", ()),
    GPUS_PROFILED: ("GPUs reporting SM activity (GPM or DCGM profiling) in the newest closed minute.", ()),
}
# gpu_minute column (percent) → gauge (ratio): useful utilisation, where the GPUs report it
GPM_GAUGES = {
    "sm_active_pct_mean": GPU_SM_ACTIVE_RATIO,
    "sm_occupancy_pct_mean": GPU_SM_OCCUPANCY_RATIO,
    "tensor_active_pct_mean": GPU_TENSOR_ACTIVE_RATIO,
    "dram_bw_pct_mean": GPU_DRAM_BANDWIDTH_RATIO,
}
PROFILED_GAUGES = {*GPM_GAUGES.values(), GPUS_PROFILED}


class FleetMetrics:
    """The stage: closed buckets → FleetCollector. Writes no store rows."""

    name = "fleet_metrics"
    alerts = None  # pages nothing
    # The two topics close their minutes apart (each over its own partitions): one checkpoint
    # can bring a pool-minute's requests and a later one its GPU samples, or the other way
    # round. The requests' GPU time waits for both: a pool-minute's busy GPU-seconds are held
    # until the requests have closed past it (a day at most), and requests of a pool with GPU
    # telemetry wait (their other counters do not) until the GPU topic has closed their minute,
    # or, read to its end, has fallen this far behind them (taken as absent, as the detectors
    # take it). Counted on what one checkpoint closed, the idle cost panels disagreed with the
    # cost report.
    PAIRING_MINUTES = 60
    BUSY_KEPT_MINUTES = 24 * 60

    def __init__(self, config: FleetMetricsConfig | None = None):
        self.config = config or FleetMetricsConfig()
        self.collector = FleetCollector(self.config)
        self.tenants: set[str] = set()
        self.sku_of_pool: dict[str, str] = {}
        self.newest_minute: int | None = None
        self.work = WorkEstimate()  # GPU time for requests that report none
        self.busy = pool_busy(pl.DataFrame())  # closed GPU pool-minutes' busy time (PAIRING_MINUTES)
        self.gpu_pools: set[str] = set()  # pools whose GPUs report
        self.newest_gpu_minute: int | None = None
        self.newest_request_minute: int | None = None
        self.first_request_minute: int | None = None
        self.waiting: list[pl.DataFrame] = []  # closed request rows whose GPU time waits for their GPU minute

    # ---- Stage protocol ---------------------------------------------------------------
    def collectors(self) -> list[Collector]:
        return [self.collector]

    def rebuild(self, con: duckdb.DuckDBPyConnection) -> None:
        """Counters start from zero; only the SKU of each pool is worth knowing at once."""
        try:
            rows = con.execute("SELECT pool, any_value(gpu_sku) FROM gpu_minute "
                               "WHERE window_start >= (SELECT max(window_start) FROM gpu_minute) - INTERVAL 1 DAY "
                               "GROUP BY pool").fetchall()
        except duckdb.CatalogException:  # a new store: no gpu_minute yet
            return
        self.sku_of_pool.update({pool or "": sku for pool, sku in rows if sku})
        self.gpu_pools.update(pool or "" for pool, _ in rows)
        self.collector.skus.update(self.sku_of_pool.values())

    def on_closed(self, requests: pl.DataFrame, gpu: pl.DataFrame,
                  backlogged: frozenset[str] = frozenset()) -> dict[str, pl.DataFrame]:
        # GPU rows first: they teach the pool → SKU map the request GPU-seconds need.
        with self.collector.lock:
            if gpu.height:
                self._gpu(gpu)
                self._hold_busy(gpu)
            # A topic with records still to read is behind, not absent.
            gpu_behind = "gpu_minute" in backlogged
            if requests.height:
                self._requests(requests)
                self.waiting.append(requests.select(c for c in _ATTRIBUTED if c in requests.columns))
                minutes = _minute_of(requests)
                self.newest_request_minute = _newer(self.newest_request_minute, minutes.max())
                first = minutes.min()
                self.first_request_minute = first if self.first_request_minute is None else min(first, self.first_request_minute)
            self._attribute_ready(gpu_behind)
            self._trim_busy()
            self._drop_stale()
        return {}

    def on_corrected(self, requests: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """Late requests count in the counters and histograms like any (Prometheus sees them now)."""
        with self.collector.lock:  # no GPU rows come with them: an estimated pool's late requests add no GPU time
            self._requests(requests)
            self._request_gpu_seconds(self.work.attribute(requests, pool_busy(pl.DataFrame())))
        return {}

    def _hold_busy(self, gpu: pl.DataFrame) -> None:
        self.newest_gpu_minute = _newer(self.newest_gpu_minute, _minute_of(gpu).max())
        self.gpu_pools.update(gpu["pool"].cast(pl.String).fill_null("").unique().to_list())
        busy = pl.concat([self.busy, pool_busy(gpu)]) if self.busy.height else pool_busy(gpu)
        # A pool-minute closes once per topic: summed, in case a minute's GPU rows came in two closes.
        self.busy = busy.group_by("window_start", "_pool").agg(pl.col("_busy").sum())

    def _trim_busy(self) -> None:
        """Busy time of minutes the requests have closed past is of no more use (their waiting
        rows took theirs); a day past the newest GPU minute, none is kept whatever the requests do."""
        if not self.busy.height:
            return
        keep_after = self.newest_gpu_minute - self.BUSY_KEPT_MINUTES
        if self.newest_request_minute is not None:
            keep_after = max(keep_after, self.newest_request_minute)
        self.busy = self.busy.filter(_minute_of_expr() > keep_after)

    def _attribute_ready(self, gpu_behind: bool) -> None:
        """Count the GPU time of the waiting requests whose pool-minute both topics have closed
        (or whose pool has no GPU telemetry, or whose GPU topic, read to its end, has fallen
        `PAIRING_MINUTES` behind)."""
        if not self.waiting:
            return
        waiting = pl.concat(self.waiting, how="diagonal_relaxed") if len(self.waiting) > 1 else self.waiting[0]
        minute, pool = _minute_of_expr(), pl.col("pool").cast(pl.String).fill_null("")
        # A pool-minute whose requests reported their GPU time needs no GPU samples; before the
        # first GPU minute (a start) every pool may yet turn out to have them.
        reported = pl.col("gpu_seconds").fill_null(0) if "gpu_seconds" in waiting.columns else pl.lit(0.0)
        ready = reported.sum().over("window_start", pool) > 0
        if self.newest_gpu_minute is not None:
            ready = ready | (minute <= self.newest_gpu_minute) | ~pool.is_in(sorted(self.gpu_pools))
            if not gpu_behind:  # read to its end and an hour behind these: its minutes will not come
                ready = ready | (minute <= self.newest_request_minute - self.PAIRING_MINUTES)
        elif not gpu_behind and not self.gpu_pools and \
                self.newest_request_minute - self.first_request_minute >= self.PAIRING_MINUTES:
            ready = pl.lit(True)  # no GPU sample in the first hour, nor in the store: a fleet without them
        flags = waiting.select(ready.alias("_ready"))["_ready"]
        if flags.all():
            taken, self.waiting = waiting, []
        else:
            taken, rest = waiting.filter(flags), waiting.filter(~flags)
            self.waiting = [rest]
        if taken.height:
            # In minute order: the work estimate fits the hour's minutes as they come.
            self._request_gpu_seconds(self.work.attribute(taken.sort("window_start", maintain_order=True), self.busy))

    def committed(self) -> None:
        pass


    # ---- requests ---------------------------------------------------------------------
    def _cap_tenants(self, requests: pl.DataFrame) -> pl.DataFrame:
        # Biggest tenants of the batch first, so a full cap keeps the busy ones by name.
        by_volume = requests.group_by("tenant").agg(pl.col("requests").sum()).sort(["requests", "tenant"], descending=[True, False])
        mapping = {}
        for tenant in by_volume["tenant"]:
            if tenant not in self.tenants and len(self.tenants) < self.config.max_tenants:
                self.tenants.add(tenant)
            mapping[tenant] = tenant if tenant in self.tenants else OTHER_TENANT
        return requests.with_columns(pl.col("tenant").replace_strict(mapping))

    def _requests(self, rows: pl.DataFrame) -> None:
        c = self.collector
        rows = rows.with_columns([pl.col(k).cast(pl.String).fill_null("") for k in (*TRAFFIC_LABELS, "pool")])
        rows = self._cap_tenants(rows)
        # Counted in whole milliseconds (an exact sum); the counter is in seconds.
        rows = rows.with_columns((pl.col("successful_audio_ms").fill_null(0) / 1000 if "successful_audio_ms" in rows.columns
                                  else pl.lit(0.0)).alias("successful_audio_seconds"),
                                 (pl.col("mos_milli").fill_null(0) / 1000 if "mos_milli" in rows.columns
                                  else pl.lit(0.0)).alias("mos_score"))
        sums = [*OUTCOME_COLUMNS.values(), *(col for col, _ in TRAFFIC_COUNTERS.values())]
        traffic = _busiest_first(rows.group_by(TRAFFIC_LABELS).agg(
            pl.len().alias("_buckets"), pl.col("requests").sum(), *[pl.col(s).fill_null(0).sum() for s in sums]),
            TRAFFIC_LABELS)
        budget = c.budgets["traffic"]
        for r in traffic.iter_rows(named=True):
            key = budget.admit(tuple(r[k] for k in TRAFFIC_LABELS), r["_buckets"])
            outcomes = c.requests.setdefault(key, {o: 0.0 for o in OUTCOME_COLUMNS})
            for outcome, column in OUTCOME_COLUMNS.items():
                outcomes[outcome] += r[column]
            for name, (column, _doc) in TRAFFIC_COUNTERS.items():
                c.traffic[name][key] = c.traffic[name].get(key, 0.0) + r[column]
        self._latency(rows)

    def _request_gpu_seconds(self, rows: pl.DataFrame) -> None:
        """Attributed rows (`WorkEstimate.attribute`) → the requests' GPU-seconds counters."""
        c = self.collector
        rows = self._cap_tenants(rows.with_columns([pl.col(k).cast(pl.String).fill_null("") for k in GPU_TIME_LABELS
                                                    if k in rows.columns and k != "gpu_sku"]))
        gpu_time = rows.with_columns(
            pl.col("pool").replace_strict(self.sku_of_pool, default="", return_dtype=pl.String).alias("gpu_sku")
        ).group_by(GPU_TIME_LABELS).agg(pl.len().alias("_buckets"), pl.col("requests").sum(),
                                        pl.col("gpu_seconds").fill_null(0).sum())
        budget = c.budgets["request_gpu_seconds"]
        for r in _busiest_first(gpu_time, GPU_TIME_LABELS).iter_rows(named=True):
            key = budget.admit(tuple(r[k] for k in GPU_TIME_LABELS), r["_buckets"])
            c.request_gpu_seconds[key] = c.request_gpu_seconds.get(key, 0.0) + r["gpu_seconds"]

    def _latency(self, rows: pl.DataFrame) -> None:
        """Every closed minute's histograms, merged across tenants and pools, into the buckets."""
        minute = _minute_of_expr().alias("_minute")
        if rows.height:
            self._advance(int(rows.select(minute.max()).item()))
        # Explode an integer group id, not six string labels per bin (half the CPU at 20,000
        # slices): each label set's bins gathered by the group-by that counts it (no join back).
        columns = list(LATENCY_FIELDS.values())
        groups = _busiest_first(rows.group_by(LATENCY_LABELS).agg(
            pl.len().alias("_buckets"), pl.col("requests").sum(), *[pl.col(c).list.explode(keep_nulls=False, empty_as_null=False) for c in columns]),
            LATENCY_LABELS).with_row_index("_group")
        c = self.collector
        budget = c.budgets["latency"]
        labels_of = {r[0]: budget.admit(r[2:], r[1]) for r in groups.select("_group", "_buckets", *LATENCY_LABELS).iter_rows()}
        # Every field's bins in one long frame, summed per group, field and bin before a bin
        # is placed in its bucket: the buckets and values are then worked out for the few
        # distinct bins, not for every bin of every row (five explodes and four group-bys a
        # field cost more than the bins on thin traffic).
        fields = list(LATENCY_FIELDS)
        long = pl.concat([groups.select("_group", pl.lit(i, dtype=pl.Int32).alias("_field"), pl.col(column).alias("_bins"))
                          for i, column in enumerate(columns)])
        per_bin = long.explode("_bins").drop_nulls("_bins").unnest("_bins").group_by("_group", "_field", "bin").agg(
            pl.col("n").sum()).sort("_group", "_field", "bin")
        if per_bin.height == 0:
            return
        per_bin = per_bin.with_columns(histogram.bin_upper_bound_expr("bin").alias("_upper_ms"),
                                       histogram.bin_value_expr("bin").alias("_value_ms"))
        buckets = np.searchsorted(_BOUNDS_MS, per_bin["_upper_ms"].to_numpy() * (1 - 1e-12)).tolist()
        sums_ms: dict[tuple, float] = {}  # per label set and field: this batch's latencies, added to the sum once
        for g, f, n, value_ms, bucket in zip(*[per_bin[c].to_list() for c in ("_group", "_field", "n", "_value_ms")],
                                             buckets):
            key = (*labels_of[g], fields[f])
            counts = c.latency.get(key)
            if counts is None:
                counts = c.latency[key] = np.zeros(len(LATENCY_BUCKETS_S) + 1)
                c.latency_sum_s[key] = 0.0
            counts[bucket] += n
            sums_ms[key] = sums_ms.get(key, 0.0) + value_ms * n
        for key, sum_ms in sums_ms.items():
            c.latency_sum_s[key] += sum_ms / 1000.0

    # ---- GPUs -------------------------------------------------------------------------
    def _gpu(self, rows: pl.DataFrame) -> None:
        c = self.collector
        rows = rows.with_columns([pl.col(k).cast(pl.String).fill_null("") for k in POOL_LABELS])
        rows = rows.with_columns(_minute_of_expr().alias("_minute"))
        for pool, sku in rows.select("pool", "gpu_sku").unique().iter_rows():
            if sku:
                self.sku_of_pool[pool] = sku
                c.skus.add(sku)
        totals = rows.group_by(POOL_LABELS).agg(
            (pl.len() * GPU_SECONDS_PER_GPU_MINUTE).alias("gpu_seconds"),
            pl.col("xid_errors").fill_null(0).sum(), pl.col("ecc_errors").fill_null(0).sum())
        for r in totals.iter_rows(named=True):
            key = tuple(r[k] for k in POOL_LABELS)
            c.gpu_seconds[key] = c.gpu_seconds.get(key, 0.0) + r["gpu_seconds"]
            c.xid_errors[key] = c.xid_errors.get(key, 0.0) + r["xid_errors"]
            c.ecc_errors[key] = c.ecc_errors.get(key, 0.0) + r["ecc_errors"]
        newest = rows.filter(pl.col("_minute") == pl.col("_minute").max().over(POOL_LABELS))
        self._advance(int(newest["_minute"].max()))
        pools = newest.group_by([*POOL_LABELS, "_minute"]).agg(
            pl.len().alias(GPUS),
            (pl.col("util_pct_mean").mean() / 100).alias(GPU_UTILIZATION_RATIO),
            pl.col("mem_used_bytes_max").sum().alias(GPU_MEMORY_USED_BYTES),
            pl.col("mem_total_bytes").sum().alias(GPU_MEMORY_TOTAL_BYTES),
            pl.col("power_w_mean").sum().alias(GPU_POWER_WATTS),
            pl.col("temp_c_max").max().alias(GPU_TEMPERATURE_CELSIUS),
            pl.col("kv_cache_usage_max").max().alias(GPU_KV_CACHE_USAGE_RATIO),
            (pl.col("oldest_queue_age_ms_max").max() / 1000).alias(QUEUE_OLDEST_AGE_SECONDS),
            pl.col("queue_depth_max").sum().alias(QUEUE_DEPTH_REQUESTS),
            *[(pl.col("replica_state").fill_null("unknown") == s).sum().alias(f"_state_{s}") for s in REPLICA_STATES],
            *[(pl.col(col).cast(pl.Float64).mean() / 100).alias(name) for col, name in GPM_GAUGES.items()
              if col in newest.columns],
            *([pl.col("sm_active_pct_mean").is_not_null().sum().alias(GPUS_PROFILED)]
              if "sm_active_pct_mean" in newest.columns else []),
        )
        for r in pools.iter_rows(named=True):
            key, minute = tuple(r[k] for k in POOL_LABELS), r["_minute"]
            for name, (_doc, extra) in POOL_GAUGES.items():
                gauges = c.pool_gauges.setdefault(name, {})
                if extra:
                    for s in REPLICA_STATES:
                        gauges[(*key, s)] = _Gauge(float(r[f"_state_{s}"]), minute)
                elif r.get(name) is not None and (r[name] or name != GPUS_PROFILED):
                    gauges[key] = _Gauge(float(r[name]), minute)
                elif name in PROFILED_GAUGES:  # the pool's GPUs stopped reporting GPM (e.g. MIG mode): not its last value
                    gauges.pop(key, None)
                # else: e.g. no KV cache outside LLM pools: no series, not a zero

    # ---- staleness --------------------------------------------------------------------
    def _advance(self, minute: int) -> None:
        if self.newest_minute is None or minute > self.newest_minute:
            self.newest_minute = minute

    def _drop_stale(self) -> None:
        if self.newest_minute is None:
            return
        oldest = self.newest_minute - self.config.stale_minutes
        c = self.collector
        c.pool_gauges = {name: {k: g for k, g in gauges.items() if g.minute >= oldest}
                         for name, gauges in c.pool_gauges.items()}
