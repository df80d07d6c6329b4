"""What every detector shares: the `Detection` record, open/close tracking, and the
per-minute view of closed buckets that detectors read.

Detectors are pure: closed `sli_minute` / `gpu_minute` rows of one event-time minute
go in, detection events come out. No clock reads, no I/O: minutes are epoch minutes
(event time) passed in by the caller, so a replay of the same buckets gives the same
detections at the same minutes.

A detection is one event while its condition holds: it is raised on the first minute
the condition holds for a slice and ended when the condition has been clear for
`clear_minutes` consecutive minutes (ended_at = the first clear minute), so a condition
that flickers for a minute does not page twice.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from itertools import repeat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Literal, NamedTuple

import polars as pl
from msgspec import Meta

from tailwatch.conventions import SLICE_LABELS

SliceKey = tuple[tuple[str, str], ...]  # sorted (label, value) pairs: hashable, stable order


def slice_key(labels: dict[str, str]) -> SliceKey:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


@dataclass
class Detection:
    """One detected condition on one slice, from the minute it was raised until it cleared."""

    detector: str
    labels: dict[str, str]
    started_at: int  # event-time epoch minute: the last minute of the window that breached
    ended_at: int | None = None  # the first minute the condition was clear (None: still open)
    evidence: dict[str, float | str] = field(default_factory=dict)  # the numbers (and words) that triggered it

    @property
    def detection_id(self) -> str:
        """Deterministic: the same buckets give the same id on a replay or after a restart."""
        labels = ",".join(f"{k}={v}" for k, v in slice_key(self.labels))
        return f"{self.detector}|{labels}|{self.started_at}"


@dataclass(frozen=True)
class DetectionEvent:
    state: Literal["raised", "ended"]
    at_minute: int  # event-time minute of the change
    detection: Detection
    evidence: dict[str, float | str]  # at raise: the triggering numbers; at end: the last numbers seen


@dataclass
class Finding:
    """A detector's verdict for one slice in one minute: the condition holds, with these numbers."""

    labels: dict[str, str]
    evidence: dict[str, float | str]


class Tracker:
    """Opens and closes detections of one detector from its per-minute findings."""

    def __init__(self, detector: str, clear_minutes: int = 1):
        self.detector = detector
        self.clear_minutes = max(1, clear_minutes)
        self.open: dict[SliceKey, Detection] = {}
        self._clear_run: dict[SliceKey, int] = {}  # consecutive clear minutes of an open detection
        self._last_evidence: dict[SliceKey, dict[str, float | str]] = {}

    def update(self, minute: int, findings: Iterable[Finding]) -> list[DetectionEvent]:
        if not findings and not self.open:
            return []  # the common minute: nothing holds and nothing is open
        events: list[DetectionEvent] = []
        holding: set[SliceKey] = set()
        for f in sorted(findings, key=lambda f: slice_key(f.labels)):
            key = slice_key(f.labels)
            holding.add(key)
            self._clear_run[key] = 0
            self._last_evidence[key] = f.evidence
            if key not in self.open:
                d = Detection(self.detector, dict(f.labels), minute, None, dict(f.evidence))
                self.open[key] = d
                events.append(DetectionEvent("raised", minute, d, dict(f.evidence)))
        for key in sorted(self.open):
            if key in holding:
                continue
            run = self._clear_run.get(key, 0) + 1
            self._clear_run[key] = run
            if run >= self.clear_minutes:
                d = self.open.pop(key)
                d.ended_at = minute - run + 1
                self._clear_run.pop(key, None)
                events.append(DetectionEvent("ended", d.ended_at, d, self._last_evidence.pop(key, {})))
        return events

    def adopt(self, detection: Detection) -> None:
        """After a restart: a detection the store says is still open continues as the same one."""
        key = slice_key(detection.labels)
        self.open[key] = detection
        self._clear_run.setdefault(key, 0)


# ---- the per-minute view of closed buckets ----------------------------------------------

GPM_MEANS = ("sm_active_pct_mean", "sm_occupancy_pct_mean", "tensor_active_pct_mean", "dram_bw_pct_mean",
             "gr_engine_active_pct_mean")
REQUEST_SUMS = ("requests", "ok", "errors", "timeouts", "retries", "turns", "successful_turns",
                "prompt_tokens", "output_tokens", "gpu_seconds")
# Quality counts the quality detectors read (detectors/quality.py); rows from before them count 0.
QUALITY_SUMS = ("voice_cache_hits", "voice_cache_lookups", "partial_revisions", "asr_partials_reported",
                "cached_prompt_tokens", "draft_tokens", "accepted_tokens", "fallbacks", "mos_samples", "mos_milli")
LATENCY_P95 = ("queue_ms_p95", "first_output_ms_p95", "e2e_ms_p95")
LatencyP95 = Literal[LATENCY_P95]
# The sli_minute columns MinuteBatch reads: labels, sums and p95s. Not the histograms,
# which are most of a row's bytes (the detector stage's rebuild reads only these).
REQUEST_COLUMNS_READ = frozenset(("window_start", *SLICE_LABELS, *REQUEST_SUMS, *QUALITY_SUMS, *LATENCY_P95))
POOL_CLASSES = ("pool", "traffic_class")  # the label set behind MinuteBatch.traffic_classes
# The labels a detector slices by: at least one, each an event label.
SliceBy = Annotated[tuple[Literal[SLICE_LABELS], ...], Meta(min_length=1)]


class SliceMinute(NamedTuple):
    """Request counts of one slice (some subset of the SLI labels) in one minute.

    A named tuple: a checkpoint of a busy fleet builds one per slice, label set and minute
    (hundreds of thousands in a month's backlog), and a tuple is made in one call."""

    labels: dict[str, str]
    requests: int = 0
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    retries: int = 0
    turns: int = 0
    successful_turns: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    gpu_seconds: float = 0.0
    # Requests-weighted mean of the buckets' p95s: the store keeps each bucket's p95, and
    # merging histograms per minute for every detector would cost more than it tells here.
    queue_ms_p95: float | None = None
    first_output_ms_p95: float | None = None
    e2e_ms_p95: float | None = None
    voice_cache_hits: int = 0
    voice_cache_lookups: int = 0
    partial_revisions: int = 0
    asr_partials_reported: int = 0
    cached_prompt_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding: tokens drafted ...
    accepted_tokens: int = 0  # ... and those the target model accepted
    fallbacks: int = 0  # TTS attempts served by a neutral voice or a smaller model
    mos_samples: int = 0  # sampled evaluations with a MOS proxy (eval.v1) ...
    mos_milli: int = 0  # ... and their scores' sum in thousandths


_SLICE_MINUTE_FIELDS = SliceMinute._fields[1:]


@dataclass(frozen=True)
class PoolMinute:
    """GPU readings of one pool in one minute (over its GPUs' `gpu_minute` rows)."""

    pool: str
    zone: str
    model: str
    gpus: int
    util_pct_mean: float | None  # mean over GPUs of each GPU's minute mean
    oldest_queue_age_ms_max: float | None  # the oldest queued request anywhere in the pool
    queue_depth_max: int
    kv_cache_usage_mean: float | None  # mean over GPUs of each GPU's minute max
    preemptions: int
    replicas_warm: int
    replicas_loading: int  # loading or cold
    loading_gpus: tuple[str, ...]  # node/gpu_index of replicas not warm (loading, cold)
    queue_depth_not_warm: int  # requests queued behind replicas that are not warm
    gpu_sku: str = ""
    # Useful utilisation (GPM / DCGM profiling), means over the GPUs that reported it; None
    # where none did (older GPUs, MIG, no permission): util_pct_mean is then all there is.
    sm_active_pct_mean: float | None = None
    sm_occupancy_pct_mean: float | None = None
    tensor_active_pct_mean: float | None = None
    dram_bw_pct_mean: float | None = None
    gr_engine_active_pct_mean: float | None = None  # the fallback where SM activity is not sent
    gpm_gpus: int = 0  # GPUs of the pool that reported SM activity this minute


def _empty(frame: pl.DataFrame | None) -> bool:
    return frame is None or frame.height == 0 or not frame.columns


MINUTE_COL = "_minute"


def with_minute(frame: pl.DataFrame | None, minute: int | None = None) -> pl.DataFrame | None:
    """The rows with their event-time minute in MINUTE_COL: `minute` for all of them, or
    each row's own from `window_start` (kept when the frame already carries it)."""
    if _empty(frame):
        return None
    if minute is not None:
        return frame.with_columns(pl.lit(minute, dtype=pl.Int64).alias(MINUTE_COL))
    if MINUTE_COL in frame.columns:
        return frame
    return frame.with_columns((pl.col("window_start").dt.epoch("s") // 60).cast(pl.Int64).alias(MINUTE_COL))


BY_COL = "_by"  # which label set a summary row is of ("workload,model,zone")


def _by_value(by: tuple[str, ...]) -> str:
    return ",".join(by)


def _weighted_p95s(f: pl.DataFrame) -> list[pl.Expr]:
    """The sums a requests-weighted mean of p95s needs, from raw rows or from summaries."""
    if f"_w_{LATENCY_P95[0]}" in f.columns:
        return [pl.col(f"_{k}_{c}").sum() for c in LATENCY_P95 for k in ("w", "n")]
    return [e for c in LATENCY_P95 for e in (
        (pl.col(c).fill_null(0) * pl.col("requests")).sum().alias(f"_w_{c}"),
        pl.col("requests").filter(pl.col(c).is_not_null()).sum().alias(f"_n_{c}"))]


def summarise(requests: pl.DataFrame, by: tuple[str, ...]) -> pl.DataFrame:
    """Requests per minute and value of the labels `by`: the sums, and for each p95 the
    weighted sum and weight of its requests-weighted mean. Summing summaries again by the
    same labels gives the summary of their rows (rows of one minute may close in several
    checkpoints)."""
    # A label rows were written without (language and voice came later) is empty, as in the store.
    return requests.group_by(MINUTE_COL, *[pl.col(b).fill_null("") if b in requests.columns else pl.lit("").alias(b)
                                           for b in by]).agg(*_sums(requests))


def _sums(requests: pl.DataFrame) -> list[pl.Expr]:
    """What `summarise` sums per group, from raw rows or from summaries."""
    return [*[pl.col(c).sum() for c in REQUEST_SUMS], *[pl.col(c).sum() for c in QUALITY_SUMS if c in requests.columns],
            *_weighted_p95s(requests)]


def summaries(requests: pl.DataFrame | None, label_sets: tuple[tuple[str, ...], ...]) -> pl.DataFrame | None:
    """Closed `sli_minute` rows (with MINUTE_COL) → one summary per label set the detectors
    read, in one frame (BY_COL says which). Held instead of the rows: the detectors never
    need a slice finer than their label sets, and with 20,000 slices an hour of rows held
    while GPU telemetry is absent grew the worker by hundreds of MiB. Summaries already
    (BY_COL present) are returned as they are."""
    if _empty(requests) or BY_COL in requests.columns:
        return requests
    parts = [summarise(requests, by).with_columns(pl.lit(_by_value(by)).alias(BY_COL)) for by in label_sets]
    return pl.concat(parts, how="diagonal_relaxed") if parts else None


def _slice_values(summed: pl.DataFrame, labels: tuple[str, ...]) -> pl.DataFrame:
    """Summed rows → MINUTE_COL, the `labels` columns and SliceMinute's values: nulls as 0,
    each p95 its requests-weighted mean (None where no request reported it)."""
    have = set(summed.columns)
    return summed.select(
        MINUTE_COL, *labels,
        *[(pl.col(c).fill_null(0) if c in have else pl.lit(0)).alias(c) for c in (*REQUEST_SUMS, *QUALITY_SUMS)],
        *[pl.when(pl.col(f"_n_{c}") != 0).then(pl.col(f"_w_{c}") / pl.col(f"_n_{c}")).alias(c) for c in LATENCY_P95],
    )


class MinuteBatch:
    """Closed minutes' `sli_minute` and `gpu_minute` rows, summarised for every minute at
    once: one group-by per label set the detectors ask for, over all the minutes of a
    checkpoint, instead of one per minute (on thin traffic, closing a minute costs more than
    its events; a polars call costs the same for ten rows as for ten thousand). Requests
    come as rows or as `summaries` (then only their label sets can be asked for)."""

    def __init__(self, requests: pl.DataFrame | None, gpu: pl.DataFrame | None, minute: int | None = None,
                 one_summary_per_slice: bool = False):
        """`minute`: every row is of this minute; None: rows carry `window_start`.
        `one_summary_per_slice`: the requests are summaries from one `summaries` call each
        minute (no minute closed in two checkpoints), so none is summed again."""
        self.requests = with_minute(requests, minute)
        self.one_summary_per_slice = one_summary_per_slice
        self.gpu = with_minute(gpu, minute)
        self._slices: dict[tuple[str, ...], dict[int, dict[SliceKey, SliceMinute]]] = {}
        self._readings: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[int, list[tuple]]] = {}
        self._sorted: dict[tuple[str, ...], tuple | None] = {}
        self._pools: dict[int, dict[str, PoolMinute]] | None = None
        self._classes: dict[int, dict[str, dict[str, int]]] | None = None
        self._by: dict[str, pl.DataFrame] | None = None

    def minutes(self) -> list[int]:
        found: set[int] = set()
        for f in (self.requests, self.gpu):
            if f is not None:
                found.update(f[MINUTE_COL].unique().to_list())
        return sorted(found)

    def slices(self, by: tuple[str, ...]) -> dict[int, dict[SliceKey, SliceMinute]]:
        """Per minute, requests summed per value of the labels `by`."""
        if by in self._slices:
            return self._slices[by]
        out: dict[int, dict[SliceKey, SliceMinute]] = {}
        rows = self._rows(by)
        if rows is not None:
            g, keys, labels, runs = rows
            # Column by column, then one object per row (made in C: no Python call a row):
            # named rows and keyword arguments cost more than the sums themselves on a month
            # of a thousand slices.
            objects = list(map(tuple.__new__, repeat(SliceMinute),
                               zip(labels, *[g.get_column(c).to_list() for c in _SLICE_MINUTE_FIELDS])))
            for minute, start, end in runs:
                out[minute] = dict(zip(keys[start:end], objects[start:end]))
        self._slices[by] = out
        return out

    def readings(self, by: tuple[str, ...], fields: tuple[str, ...]) -> dict[int, list[tuple]]:
        """Per minute, (slice key, labels, *fields) of each slice by the labels `by`, in the
        order `slices` gives them: for a detector that reads a few of a slice's numbers, which
        are then all that is taken out of the frame (a SliceMinute holds 26)."""
        cached = self._readings.get((by, fields))
        if cached is not None:
            return cached
        out: dict[int, list[tuple]] = {}
        rows = self._rows(by)
        if rows is not None:
            g, keys, labels, runs = rows
            values = list(zip(keys, labels, *[g.get_column(c).to_list() for c in fields]))
            for minute, start, end in runs:
                out[minute] = values[start:end]
        self._readings[(by, fields)] = out
        return out

    def _rows(self, by: tuple[str, ...]) -> tuple[pl.DataFrame, list[SliceKey], list[dict[str, str]],
                                                  list[tuple[int, int, int]]] | None:
        """The slices by `by` of every minute, sorted by minute and labels: their values, each
        row's slice key and labels, and each minute's run of rows (minute, start, end)."""
        if by in self._sorted:
            return self._sorted[by]
        f = self.requests
        if f is not None and BY_COL in f.columns:
            # Summaries have rows for every label set they were made by whenever there were rows.
            g = self._summed_by().get(_by_value(by))
            if g is None:
                raise ValueError(f"requests were summarised without the label set {by}: "
                                 "a detector must name every label set it reads (label_sets)")
        elif f is not None and f.height:
            g = _slice_values(summarise(f, by), by)
        else:
            g = None
        rows = None
        if g is not None and g.height:
            g = g.sort(MINUTE_COL, *by)
            # A slice's key and labels are made once for all its minutes (and shared by them),
            # then looked up row by row in C (map).
            label_values = list(zip(*[g.get_column(b).cast(pl.String).to_list() for b in by]))
            made = {values: (slice_key(dict(zip(by, values))), dict(zip(by, values))) for values in set(label_values)}
            key_labels = list(map(made.__getitem__, label_values))
            runs, start = [], 0
            for minute, n in Counter(g.get_column(MINUTE_COL).to_list()).items():  # runs: the rows come by minute
                runs.append((minute, start, start + n))
                start += n
            rows = (g, [k for k, _ in key_labels], [named for _, named in key_labels], runs)
        self._sorted[by] = rows
        return rows

    def _summed_by(self) -> dict[str, pl.DataFrame]:
        """The summaries summed again per minute and slice (rows of a minute may come from
        several checkpoints) and turned into SliceMinute's values, per label set (BY_COL):
        one group-by over every label set at once, not one per set the detectors ask for
        (on thin traffic those few-row polars calls were most of building the slices).
        Grouping by BY_COL and every label keeps the sets apart: a label outside a row's
        set is null in it."""
        if self._by is None:
            f = self.requests
            label_cols = [c for c in f.columns if c in SLICE_LABELS]
            summed = f if self.one_summary_per_slice else f.group_by(MINUTE_COL, BY_COL, *label_cols).agg(*_sums(f))
            g = _slice_values(summed, (BY_COL, *label_cols))
            self._by = dict(zip(g.get_column(BY_COL).unique(maintain_order=True).to_list(),
                                g.partition_by(BY_COL, maintain_order=True)))
        return self._by

    def traffic_classes(self) -> dict[int, dict[str, dict[str, int]]]:
        """Per minute, requests per traffic class per pool: who is using each pool."""
        if self._classes is None:
            self._classes = {}
            for minute, slices in self.slices(POOL_CLASSES).items():
                for s in slices.values():
                    self._classes.setdefault(minute, {}).setdefault(s.labels["pool"], {})[s.labels["traffic_class"]] = \
                        int(s.requests)
        return self._classes

    def pools(self) -> dict[int, dict[str, PoolMinute]]:
        if self._pools is not None:
            return self._pools
        self._pools = {}
        if self.gpu is None:
            return self._pools
        gpm = [c for c in GPM_MEANS if c in self.gpu.columns]  # rows from before GPM have none
        g = self.gpu.with_columns(
            not_warm=pl.col("replica_state").is_in(["loading", "cold"]).fill_null(False),
            warm=(pl.col("replica_state") == "warm").fill_null(False),
            gpu_id=pl.concat_str([pl.col("node"), pl.col("gpu_index").cast(pl.String)], separator="/"),
        ).group_by(MINUTE_COL, pl.col("pool").fill_null("")).agg(
            pl.col("zone").drop_nulls().first(), pl.col("model").drop_nulls().first(),
            pl.col("gpu_sku").drop_nulls().first(),
            pl.len().alias("gpus"),
            pl.col("util_pct_mean").mean(),
            pl.col("oldest_queue_age_ms_max").max(),
            pl.col("queue_depth_max").max(),
            pl.col("kv_cache_usage_max").mean(),
            pl.col("preemptions").sum(),
            pl.col("warm").sum().alias("replicas_warm"),
            pl.col("not_warm").sum().alias("replicas_loading"),
            pl.col("gpu_id").filter(pl.col("not_warm")).sort().alias("loading_gpus"),
            pl.col("queue_depth_max").filter(pl.col("not_warm")).sum().alias("queue_depth_not_warm"),
            *[pl.col(c).cast(pl.Float64).mean() for c in gpm],
            *([pl.col("sm_active_pct_mean").is_not_null().sum().alias("gpm_gpus")] if "sm_active_pct_mean" in gpm else []),
        )
        for r in g.sort(MINUTE_COL, "pool").iter_rows(named=True):
            self._pools.setdefault(r[MINUTE_COL], {})[r["pool"]] = PoolMinute(
                pool=r["pool"], zone=r["zone"] or "", model=r["model"] or "", gpus=int(r["gpus"]),
                util_pct_mean=r["util_pct_mean"], oldest_queue_age_ms_max=r["oldest_queue_age_ms_max"],
                queue_depth_max=int(r["queue_depth_max"] or 0), kv_cache_usage_mean=r["kv_cache_usage_max"],
                preemptions=int(r["preemptions"] or 0), replicas_warm=int(r["replicas_warm"]),
                replicas_loading=int(r["replicas_loading"]), loading_gpus=tuple(r["loading_gpus"] or ()),
                queue_depth_not_warm=int(r["queue_depth_not_warm"] or 0), gpu_sku=r["gpu_sku"] or "",
                **{c: r[c] for c in gpm}, gpm_gpus=int(r.get("gpm_gpus") or 0),
            )
        return self._pools


class Minute:
    """One closed event-time minute, as the detectors see it: its rows summarised on demand
    by the label sets they ask for (from the `MinuteBatch` it belongs to, cached there)."""

    def __init__(self, minute: int, requests: pl.DataFrame | None = None, gpu: pl.DataFrame | None = None,
                 batch: MinuteBatch | None = None):
        self.minute = minute
        self.batch = batch if batch is not None else MinuteBatch(requests, gpu, minute)

    def slices(self, by: tuple[str, ...]) -> dict[SliceKey, SliceMinute]:
        """Requests summed per value of the labels `by`."""
        return self.batch.slices(by).get(self.minute, {})

    def readings(self, by: tuple[str, ...], fields: tuple[str, ...]) -> list[tuple]:
        """(slice key, labels, *fields) of each slice by `by` (`MinuteBatch.readings`)."""
        return self.batch.readings(by, fields).get(self.minute, [])

    def traffic_classes(self) -> dict[str, dict[str, int]]:
        """Requests per traffic class per pool: who is using each pool this minute."""
        return self.batch.traffic_classes().get(self.minute, {})

    def pools(self) -> dict[str, PoolMinute]:
        return self.batch.pools().get(self.minute, {})


def median(values: list) -> float:
    """`statistics.median` of a non-empty list, the same number, sorting the list in place:
    the detectors take medians of every slice's baseline each minute, and the library's
    checks and copy cost more than the sort of an hour of readings."""
    values.sort()
    n = len(values)
    half = n // 2
    return values[half] if n % 2 else (values[half - 1] + values[half]) / 2


def ratio(num: float, den: float) -> float | None:
    """num ÷ den, or None when there is nothing to divide by (never a ZeroDivisionError, never NaN)."""
    return num / den if den else None


class History:
    """Per key, the values of recent minutes, trimmed to `keep_minutes`.

    `window(key, minute, k)` is the values of minutes [minute-k+1, minute] that exist,
    or None while the key has been seen for fewer than k minutes (a window must span k
    minutes of the stream before it can breach: "k larger than the input" never fires).
    A key's minutes are held in order (`MinuteSeries`), so a window or a baseline is one
    slice of a list, not a lookup per minute: every detector reads them for every key and
    minute, and a cost baseline is 120 minutes long.
    """

    def __init__(self, keep_minutes: int):
        self.keep_minutes = max(1, keep_minutes)
        self.values: dict[SliceKey, MinuteSeries] = {}
        self.first_minute: dict[SliceKey, int] = {}
        self.labels: dict[SliceKey, dict[str, str]] = {}

    def add(self, key: SliceKey, labels: dict[str, str], minute: int, value: object) -> None:
        self.first_minute.setdefault(key, minute)
        self.labels[key] = labels
        series = self.values.get(key)
        if series is None:
            series = self.values[key] = MinuteSeries()
        series.put(minute, value)

    def trim(self, minute: int) -> None:
        oldest = minute - self.keep_minutes + 1
        for key, series in list(self.values.items()):
            if series.minutes[0] < oldest and not series.drop_before(oldest):
                del self.values[key]
                self.first_minute.pop(key, None)
                self.labels.pop(key, None)

    def window(self, key: SliceKey, minute: int, k: int) -> list | None:
        first = self.first_minute.get(key)
        if first is None or minute - first + 1 < k:
            return None
        series = self.values.get(key)
        return series.between(minute - k + 1, minute) if series is not None else []

    def before(self, key: SliceKey, minute: int, k: int, n: int) -> list:
        """Values of the n minutes before the window [minute-k+1, minute]: a trailing baseline."""
        series = self.values.get(key)
        end = minute - k + 1
        return series.between(end - n, end - 1) if series is not None else []


class MinuteSeries:
    """One key's values by minute, in minute order: two parallel lists."""

    __slots__ = ("minutes", "values")

    def __init__(self):
        self.minutes: list[int] = []
        self.values: list = []

    def put(self, minute: int, value: object) -> None:
        """Set the value of `minute` (minutes come in order; one out of order is put in its place)."""
        ms = self.minutes
        if not ms or minute > ms[-1]:
            ms.append(minute)
            self.values.append(value)
            return
        i = bisect_left(ms, minute)
        if ms[i] == minute:
            self.values[i] = value
        else:
            ms.insert(i, minute)
            self.values.insert(i, value)

    def between(self, first: int, last: int) -> list:
        """The values of minutes first..last, oldest first."""
        ms = self.minutes
        return self.values[bisect_left(ms, first):bisect_right(ms, last)]

    def drop_before(self, minute: int) -> int:
        """Forget minutes before `minute`; how many are left."""
        i = bisect_left(self.minutes, minute)
        del self.minutes[:i], self.values[:i]
        return len(self.minutes)


class BaselineDetector:
    """A detector over one label set (`cfg.slice_by`) that judges each slice's last
    `window_minutes` of readings against the `baseline_minutes` before them (at least
    `min_baseline_minutes` of them). Subclasses say what a minute's reading is (`reading`,
    None: the slice did not report it) and when a window breaches (`judge`: its evidence, or None)."""

    name: str

    def __init__(self, cfg):
        self.cfg = cfg
        self.history = History(cfg.window_minutes + cfg.baseline_minutes)
        self.tracker = Tracker(self.name, cfg.clear_minutes)

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return (tuple(self.cfg.slice_by),)

    def reading(self, s: SliceMinute, seen: bool) -> object | None:
        """This minute's reading of a slice; `seen`: the slice has readings in the history."""
        raise NotImplementedError

    def judge(self, window: list, base: list) -> dict | None:
        raise NotImplementedError

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg, h = self.cfg, self.history
        for key, s in m.slices(tuple(cfg.slice_by)).items():
            value = self.reading(s, key in h.values)
            if value is not None:
                h.add(key, s.labels, m.minute, value)
        h.trim(m.minute)
        findings = []
        for key in sorted(h.values):
            window = h.window(key, m.minute, cfg.window_minutes)
            base = h.before(key, m.minute, cfg.window_minutes, cfg.baseline_minutes)
            if not window or len(base) < cfg.min_baseline_minutes:
                continue
            evidence = self.judge(window, base)
            if evidence is not None:
                findings.append(Finding(h.labels[key], {**evidence, "window_minutes": cfg.window_minutes}))
        return self.tracker.update(m.minute, findings)
