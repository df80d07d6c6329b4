"""Latency and token histograms → `request.v1`: SLIs for fleets that send metrics, not spans.

GenAI metrics over OTLP (every generation of the conventions) and the latency histograms a
serving runtime exposes on `/metrics` (vLLM, TGI, Triton) count requests per bucket. This
turns each interval's bucket counts back into the requests they counted, so the worker's
SLIs, budgets, dashboards and reports need no second path:

- Points are grouped by their labels (without `error.type` and `gen_ai.token.type`) and
  their end time; in a group, the request-duration histogram says how many requests
  there were and, through `error.type`, how each ended; the other histograms give those
  requests their first-output, inter-token and queue times and their token counts.
- A running total (cumulative temporality, every Prometheus histogram) is differenced
  against the previous reading of its series; the first reading of a series sets the base
  (as the GPU counters do), so the interval before it is not counted; a smaller count is a
  reset and counts from zero.
- Precision, stated in docs/opentelemetry.md: a latency is placed at its bucket's upper
  bound, so a latency SLI is exact when its threshold is a bucket bound and otherwise
  counts the bucket holding the threshold as bad (as the worker's own bins do); values
  above the last bound take the mean the histogram's sum leaves for them. Token counts add
  up to the histogram's sum exactly, each inside its bucket. Which request got which first
  output time is unknowable from histograms: SLIs over one field are exact, goodput (which
  joins an error with a latency) is an estimate.
- Event ids are the series, the interval and the request's place in it, so a batch read
  twice gives the same ids, which the worker drops as duplicates.
- vLLM's finished-request counter (`vllm:request_success_total{finished_reason}`) says how
  many of the interval's requests ended by stop, length, abort or error; those endings are
  given to its requests as `finish_reason` (an abort also makes the request `cancelled`, an
  error `error`), so stream completion and errors exist for a fleet that is only scraped.
  The counts are exact; which request ended how is not known (failures go to requests
  without a first output first).
- vLLM's token counters (`TOKEN_COUNTERS`: prompt tokens found in the prefix cache,
  speculative decoding's drafted and accepted tokens) and the GenAI counter of cache-read
  input tokens are shared out over the requests of
  the interval with the same labels, in proportion to their prompt or output tokens, as
  whole tokens adding up to the counter's increase. vLLM counts them when a request is
  scheduled and the histograms when it finishes, so an increase in an interval where no
  request finished waits for the next one that has some: no token is lost, some are
  counted an interval late. The prefix-cache hit ratio is then `cached_prompt_tokens` over
  `prompt_tokens` like any request's, with no second path.
- TGI and Triton count finished requests by outcome (`REQUEST_COUNTERS`); their histograms
  count successes only (TGI) or exist only when enabled (Triton). For them the counters'
  increases are the interval's requests, failures with their status and no latency; the
  histograms give the successes their latencies. A latency a runtime does not export stays
  absent.

Bounds on what one record may ask for: a point must be a well-formed histogram (bounds
increasing, counts adding up) and count at most `MAX_REQUESTS_PER_POINT` requests in its
interval, a record at most `MAX_REQUESTS_PER_BATCH`; anything else is refused with its reason
and the rest of the batch goes on. At most `MAX_SERIES` running totals are remembered, so a
producer inventing series cannot grow the adapter without bound.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from tailwatch.ingest.otlp.genai_versions import defined_by
from tailwatch.ingest.otlp.mapping import RequestRules
from tailwatch.ingest.otlp.samples import HistogramPoint, Sample
from tailwatch.ingest.otlp.spans import failure_status
from tailwatch.ingest.schema import MAX_COUNT, RequestV1

Role = Literal["e2e", "first_output", "inter_token", "queue", "prompt_tokens", "output_tokens"]


@dataclass(frozen=True)
class HistogramName:
    role: Role
    scale: float  # to milliseconds (latency) or tokens
    source: str  # who defines the name, and in which version: the docs table is made from these
    per_request: bool = True  # False: one value per streamed chunk, not per answer


S = 1000.0  # seconds → ms
# OpenTelemetry GenAI names: which release defines each is in genai_versions.py (checked
# against the registry text in tests/test_semconv_versions.py).
NAMES: dict[str, HistogramName] = {
    "gen_ai.server.request.duration": HistogramName("e2e", S, defined_by("gen_ai.server.request.duration")),
    "gen_ai.client.operation.duration": HistogramName("e2e", S, defined_by("gen_ai.client.operation.duration")),
    "gen_ai.client.inference.duration": HistogramName("e2e", S, defined_by("gen_ai.client.inference.duration")),
    "gen_ai.server.time_to_first_token": HistogramName("first_output", S, defined_by("gen_ai.server.time_to_first_token")),
    "gen_ai.client.operation.time_to_first_chunk": HistogramName(
        "first_output", S, defined_by("gen_ai.client.operation.time_to_first_chunk")),
    "gen_ai.client.inference.time_to_first_chunk": HistogramName(
        "first_output", S, defined_by("gen_ai.client.inference.time_to_first_chunk")),
    "gen_ai.server.time_per_output_token": HistogramName(
        "inter_token", S, defined_by("gen_ai.server.time_per_output_token")),
    "gen_ai.client.operation.time_per_output_chunk": HistogramName(
        "inter_token", S, defined_by("gen_ai.client.operation.time_per_output_chunk"), per_request=False),
    "gen_ai.client.inference.time_per_output_chunk": HistogramName(
        "inter_token", S, defined_by("gen_ai.client.inference.time_per_output_chunk"), per_request=False),
    "gen_ai.client.inference.operation.input_tokens": HistogramName(
        "prompt_tokens", 1.0, defined_by("gen_ai.client.inference.operation.input_tokens")),
    "gen_ai.client.inference.operation.output_tokens": HistogramName(
        "output_tokens", 1.0, defined_by("gen_ai.client.inference.operation.output_tokens")),
    # (gen_ai.client.token.usage, split by gen_ai.token.type, is read in TOKEN_USAGE below)
    # vLLM's /metrics (v0.6 to v0.11): one observation per finished request.
    "vllm:e2e_request_latency_seconds": HistogramName("e2e", S, "vLLM /metrics"),
    "vllm:time_to_first_token_seconds": HistogramName("first_output", S, "vLLM /metrics"),
    "vllm:request_time_per_output_token_seconds": HistogramName("inter_token", S, "vLLM /metrics (v0.11+)"),
    "vllm:inter_token_latency_seconds": HistogramName("inter_token", S, "vLLM /metrics (v0.10+)", per_request=False),
    "vllm:time_per_output_token_seconds": HistogramName("inter_token", S, "vLLM /metrics (before v0.11)", per_request=False),
    "vllm:request_queue_time_seconds": HistogramName("queue", S, "vLLM /metrics"),
    "vllm:request_prompt_tokens": HistogramName("prompt_tokens", 1.0, "vLLM /metrics"),
    "vllm:request_generation_tokens": HistogramName("output_tokens", 1.0, "vLLM /metrics"),
    # Hugging Face TGI's /metrics.
    "tgi_request_duration": HistogramName("e2e", S, "TGI /metrics"),
    "tgi_request_queue_duration": HistogramName("queue", S, "TGI /metrics"),
    "tgi_request_mean_time_per_token_duration": HistogramName("inter_token", S, "TGI /metrics"),
    "tgi_request_input_length": HistogramName("prompt_tokens", 1.0, "TGI /metrics"),
    "tgi_request_generated_tokens": HistogramName("output_tokens", 1.0, "TGI /metrics"),
    # Triton's /metrics (histograms are opt-in: --metrics-config histogram_latencies=true).
    "nv_inference_first_response_histogram_ms": HistogramName("first_output", 1.0, "Triton /metrics"),
}
# vLLM's running totals of tokens (V1 engine; counter names as samples carry them, without
# `_total`), by the request field they fill. For one field the first name present wins: newer
# vLLM has the cached total (local and external caches), then the local hits, then their
# first V1 name.
VLLM_V1 = "vLLM /metrics, V1 engine (page captured from vLLM 0.32 in tests/data/vllm)"
TOKEN_COUNTERS: dict[str, tuple[str, str]] = {
    "vllm:prompt_tokens_cached": ("cached_prompt_tokens", f"{VLLM_V1}: local and external caches"),
    "vllm:prefix_cache_hits": ("cached_prompt_tokens", VLLM_V1),
    "vllm:gpu_prefix_cache_hits": ("cached_prompt_tokens", "vLLM /metrics, V1 engine before the `gpu_` prefix was dropped"),
    "vllm:spec_decode_num_draft_tokens": ("draft_tokens", VLLM_V1),
    "vllm:spec_decode_num_accepted_tokens": ("accepted_tokens", VLLM_V1),
    # The GenAI counters of input tokens served from the provider's cache (per series also split
    # by `gen_ai.token.modality`, summed here). A counter knows no request: like vLLM's, its
    # increase is shared over the interval's requests of the same labels, so per minute and
    # slice the cached total is exact and each request holds a share in proportion to its
    # input tokens. The sibling counters of input, output, cache-write and reasoning tokens
    # are not read: the per-operation token histograms give each request its input and output
    # tokens, and no request field holds cache writes or reasoning tokens.
    "gen_ai.client.inference.usage.cache_read.input_tokens": (
        "cached_prompt_tokens", defined_by("gen_ai.client.inference.usage.cache_read.input_tokens")),
    "gen_ai.client.inference.usage.detailed.cache_read.input_tokens": (
        "cached_prompt_tokens", defined_by("gen_ai.client.inference.usage.detailed.cache_read.input_tokens")),
}
TOKEN_FIELD_WEIGHT = {"cached_prompt_tokens": "prompt_tokens", "draft_tokens": "output_tokens",
                      "accepted_tokens": "output_tokens"}  # what a request's share is in proportion to
# vLLM's finished requests by how they ended (`finished_reason`), as `finish_reason` and, for
# an abort or an error, the request's status: a scraped fleet's stream completion and errors.
FINISH_COUNTER = "vllm:request_success"
FINISH_LABEL = "finished_reason"
VLLM_FINISH: dict[str, tuple[str, str]] = {
    "stop": ("stop", "ok"), "length": ("length", "ok"),
    "repetition": ("stop", "ok"),  # the request asked vLLM to stop a repeating answer
    "abort": ("client_cancel", "cancelled"), "error": ("server_cut", "error"),
}
# Runtimes that count finished requests by outcome, failures included, where their latency
# histograms count successes only (TGI) or there are none by default (Triton): the counters'
# increases are the interval's requests, exact; the histograms only give them latencies. A
# failure carries no latency, as neither runtime measures one for it.
@dataclass(frozen=True)
class RequestCounter:
    outcome_label: str  # the label naming how a request failed; "" for a success counter
    statuses: dict[str, tuple[str, int | None]]  # outcome → (status, the HTTP status the runtime answers)
    source: str


TGI_SOURCE = "TGI /metrics (router/src/server.rs, router/src/infer/mod.rs, backends/v3)"
TRITON_SOURCE = "Triton /metrics (core src/metrics.cc, src/metric_model_reporter.cc)"
REQUEST_COUNTERS: dict[str, RequestCounter] = {
    "tgi_request_success": RequestCounter("", {"": ("ok", None)}, TGI_SOURCE),
    # TGI's answers to each failure (its InferError → StatusCode): overload 429, a request it
    # cannot take 422, a generation that failed or stopped early 424 or 500; `dropped` is a
    # client that went away before its answer.
    "tgi_request_failure": RequestCounter("err", {
        "overloaded": ("shed", 429), "validation": ("error", 422), "template": ("error", 422),
        "generation": ("error", 424), "incomplete": ("error", 500), "dropped": ("cancelled", None)}, TGI_SOURCE),
    "nv_inference_request_success": RequestCounter("", {"": ("ok", None)}, TRITON_SOURCE),
    # Triton's failure reasons: REJECTED by the queue policy (full, or timed out in the queue),
    # CANCELED by the client, BACKEND (the model failed), OTHER.
    "nv_inference_request_failure": RequestCounter("reason", {
        "REJECTED": ("shed", None), "CANCELED": ("cancelled", None), "BACKEND": ("error", None),
        "OTHER": ("error", None)}, TRITON_SOURCE),
}
UNKNOWN_FAILURE = ("error", None)  # an outcome a newer runtime adds: a failure all the same
TOKEN_USAGE = "gen_ai.client.token.usage"  # OTEL: one histogram, input and output told by gen_ai.token.type
TOKEN_TYPES: dict[str, Role] = {"input": "prompt_tokens", "output": "output_tokens"}
NAMES_SOURCE = {**{n: h.source for n, h in NAMES.items()}, TOKEN_USAGE: defined_by(TOKEN_USAGE),
                # Prometheus names as a page shows them (with `_total`); OTLP names as sent
                **{n if n.startswith("gen_ai.") else f"{n}_total": source for n, (_, source) in TOKEN_COUNTERS.items()},
                f"{FINISH_COUNTER}_total": VLLM_V1, **{n: c.source for n, c in REQUEST_COUNTERS.items()}}
# Labels that split one group of requests into the histograms' series: not the requests' own.
SPLIT_LABELS = ("error.type", "gen_ai.token.type", "gen_ai.token.modality")
MAX_REQUESTS_PER_POINT = 200_000  # one interval of one series; beyond it the point is refused
MAX_REQUESTS_PER_BATCH = 1_000_000  # one record; points past it are refused, so no record can exhaust memory
MAX_BUCKETS = 512
MAX_SERIES = 100_000  # running totals remembered; past it the oldest half is forgotten (their next reading is a base)


@dataclass
class MappedHistograms:
    events: list[RequestV1] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (reason, detail)
    skipped: int = 0  # points of histograms no request field reads


@dataclass
class _Delta:
    role: Role
    scale: float
    per_request: bool
    bounds: tuple[float, ...]
    counts: list[int]
    total: float
    start_ms: int
    error_type: str


@dataclass
class _Group:
    labels: dict[str, str]
    start_ms: int
    end_ms: int
    deltas: list[_Delta] = field(default_factory=list)
    counted: dict[tuple[str, int | None], int] | None = None  # (status, HTTP status) → requests, from REQUEST_COUNTERS


class HistogramRequests:
    """Holds the previous reading of each running-total series across batches."""

    def __init__(self, rules: RequestRules):
        self.rules = rules
        self._previous: dict[tuple, HistogramPoint] = {}
        self._previous_totals: dict[tuple, float] = {}  # token counters' last readings
        self._pending: dict[tuple, dict[str, float]] = {}  # per labels, token counts not yet shared out
        self._pending_finish: dict[tuple, dict[str, int]] = {}  # per labels, finished requests not yet given out
        self._previous_requests: dict[tuple, tuple[float, int]] = {}  # request counters' last (reading, time)
        self._requests_read: dict[tuple, int] = {}  # per labels (less the outcome), when a request counter was last read

    def map(self, points: list[HistogramPoint], counters: list[Sample] = ()) -> MappedHistograms:
        """Requests from a batch's histogram points; `counters`, the batch's other samples,
        give them their share of vLLM's token counters."""
        out = MappedHistograms()
        self._take_token_counters(counters, out)
        groups: dict[tuple, _Group] = {}
        budget = MAX_REQUESTS_PER_BATCH
        for point in points:
            known = _known(point)
            if known is None:
                out.skipped += 1
                continue
            problem = _malformed(point)
            if problem:
                out.refused.append(("otlp_histogram_invalid", f"{point.name}: {problem}"))
                continue
            delta = self._delta(point, *known)
            if delta is None:
                continue
            observed = sum(delta.counts)
            if observed > MAX_REQUESTS_PER_POINT:
                out.refused.append(("otlp_histogram_invalid", f"{point.name}: {observed:,} observations in "
                                    f"one interval (at most {MAX_REQUESTS_PER_POINT:,})"))
                continue
            budget -= observed
            if budget < 0:
                out.refused.append(("otlp_histogram_invalid", f"{point.name}: more than {MAX_REQUESTS_PER_BATCH:,} "
                                    "observations in one batch"))
                continue
            labels = {k: v for k, v in point.labels.items() if k not in SPLIT_LABELS}
            key = (tuple(sorted(labels.items())), point.ts_ms)
            group = groups.setdefault(key, _Group(labels, delta.start_ms, point.ts_ms))
            group.start_ms = min(group.start_ms, delta.start_ms)
            group.deltas.append(delta)
        for key, (start_ms, end_ms, counted) in self._take_request_counters(counters, out).items():
            budget -= sum(counted.values())
            if budget < 0:
                out.refused.append(("otlp_metric_invalid", f"request counters: more than {MAX_REQUESTS_PER_BATCH:,} "
                                    "requests in one batch"))
                continue
            # A runtime that has no latency histogram (Triton by default) still has its requests.
            group = groups.setdefault(key, _Group(dict(key[0]), start_ms, end_ms))
            group.start_ms = min(group.start_ms, start_ms)
            group.counted = counted
        for key, group in groups.items():
            self._requests(key, group, out)
        return out

    def _take_request_counters(self, counters: list[Sample], out: MappedHistograms
                               ) -> dict[tuple, tuple[int, int, dict[tuple[str, int | None], int]]]:
        """Each request counter's increase since its last reading, by labels (less the outcome
        label) and scrape time: the interval's start, its end and its requests by outcome."""
        found: dict[tuple, tuple[int, int, dict[tuple[str, int | None], int]]] = {}
        read_now: dict[tuple, int] = {}
        for c in counters:
            known = REQUEST_COUNTERS.get(c.name)
            if known is None or not math.isfinite(c.value) or c.value < 0:
                continue
            labels = tuple(sorted((k, v) for k, v in c.labels.items()
                                  if k not in SPLIT_LABELS and k != known.outcome_label))
            if not c.cumulative:  # a delta (a Collector's cumulativetodelta): the requests of the point
                before = (0.0, c.ts_ms)
            else:
                before = self._running_total(c, labels, read_now)
            if before is None:
                continue
            increase = c.value - before[0] if c.value >= before[0] else c.value  # smaller: a reset
            if increase > MAX_REQUESTS_PER_POINT:
                out.refused.append(("otlp_metric_invalid", f"{c.name}: {increase:.3g} requests in one interval "
                                    f"(at most {MAX_REQUESTS_PER_POINT:,})"))
                continue
            outcome = known.statuses.get(c.labels.get(known.outcome_label, ""), UNKNOWN_FAILURE)
            start, _, counted = found.setdefault((labels, c.ts_ms), (before[1], c.ts_ms, {}))
            found[(labels, c.ts_ms)] = (min(start, before[1]), c.ts_ms, counted)
            counted[outcome] = counted.get(outcome, 0) + int(round(increase))
        for key, ts_ms in read_now.items():  # after the batch: its other series are not new to it
            self._requests_read[key] = max(ts_ms, self._requests_read.pop(key, 0))  # re-inserted: newest last
        _forget_oldest(self._requests_read)
        return found

    def _running_total(self, c: Sample, labels: tuple, read_now: dict[tuple, int]) -> tuple[float, int] | None:
        """The previous (reading, time) of a request counter's series, or None for a base reading."""
        series = (c.name, tuple(sorted(c.labels.items())))
        before = self._previous_requests.pop(series, None)
        self._previous_requests[series] = (c.value, c.ts_ms)  # re-inserted: least recently read first
        _forget_oldest(self._previous_requests)
        read_before = self._requests_read.get(labels)
        read_now[labels] = max(c.ts_ms, read_now.get(labels, 0))
        if before is None and read_before is not None and read_before < c.ts_ms:
            # A new outcome on a target already read: TGI (the Rust metrics crate) writes a
            # series only once it has counted something, so it started from zero since then.
            before = (0.0, read_before)
        if before is None or c.ts_ms <= before[1]:
            return None  # the first reading is the base; an older or repeated one adds nothing
        return before

    def _take_token_counters(self, counters: list[Sample], out: MappedHistograms) -> None:
        """Each token counter's increase since its last reading, added to what its labels'
        requests have still to be given (per field, from the first name present). An increase
        no request field could hold is refused alone: the requests keep their other fields."""
        found: dict[tuple, dict[str, dict[str, float]]] = {}  # labels → field → name → increase
        for c in counters:
            known = TOKEN_COUNTERS.get(c.name)
            if c.name == FINISH_COUNTER and c.labels.get(FINISH_LABEL) in VLLM_FINISH:
                known = (FINISH_LABEL, VLLM_V1)
            if known is None or not math.isfinite(c.value) or c.value < 0:
                continue
            increase = c.value
            if c.cumulative:
                series = (c.name, tuple(sorted(c.labels.items())))
                before = self._previous_totals.pop(series, None)
                self._previous_totals[series] = c.value  # re-inserted: least recently read first
                _forget_oldest(self._previous_totals)
                if before is None:
                    continue  # the first reading is the base
                increase = c.value - before if c.value >= before else c.value  # smaller: a reset
            if increase > MAX_COUNT:
                unit = "requests" if known[0] == FINISH_LABEL else "tokens"
                out.refused.append(("otlp_metric_invalid", f"{c.name}: an increase of {increase:.3g} {unit} in one "
                                    f"interval (at most {MAX_COUNT:,})"))
                continue
            labels = tuple(sorted((k, v) for k, v in c.labels.items() if k not in SPLIT_LABELS and k != FINISH_LABEL))
            if known[0] == FINISH_LABEL:
                ended = self._pending_finish.pop(labels, {})
                self._pending_finish[labels] = ended
                reason = c.labels[FINISH_LABEL]
                ended[reason] = ended.get(reason, 0) + int(round(increase))
                continue
            by_name = found.setdefault(labels, {}).setdefault(known[0], {})
            by_name[c.name] = by_name.get(c.name, 0.0) + increase  # summed over a split label (modality)
        _forget_oldest(self._pending_finish)
        for labels, fields in found.items():
            pending = self._pending.pop(labels, {})
            self._pending[labels] = pending
            for fld, by_name in fields.items():
                name = next(n for n in TOKEN_COUNTERS if n in by_name)
                pending[fld] = pending.get(fld, 0.0) + by_name[name]
        _forget_oldest(self._pending)

    def _share_tokens(self, labels: tuple, fields: list[dict]) -> None:
        """Give these requests what their labels' token counters have counted since the last
        requests were given theirs."""
        pending = self._pending.get(labels)
        if not pending or not fields:
            return
        for fld, amount in pending.items():
            weights = [f.get(TOKEN_FIELD_WEIGHT[fld]) or 0 for f in fields]
            for f, share in zip(fields, _shares(int(round(amount)), weights if sum(weights) else [1] * len(fields))):
                f[fld] = share
        del self._pending[labels]

    def _share_finishes(self, labels: tuple, fields: list[dict], order: list[int]) -> None:
        """Tell these requests how they ended, from what vLLM's finished-request counter counted
        for their labels. Which request ended how is unknowable from counters: an abort or error
        goes to a request without a first output where there is one (a request that failed
        rarely started its answer), a normal end to the others. More endings than requests wait
        for the next interval's requests; requests beyond them say nothing of their ending."""
        ended = self._pending_finish.get(labels)
        if not ended or not fields:
            return
        failing = [r for r in VLLM_FINISH if VLLM_FINISH[r][1] != "ok"]
        # One pass each way over the requests (an interval may hold 200,000 of them).
        back = iter([i for i in reversed(order) if fields[i]["status"] == "ok"])
        front = iter([i for i in order if fields[i]["status"] == "ok"] + [i for i in order if fields[i]["status"] != "ok"])
        taken: set[int] = set()
        for reason in [*failing, *(r for r in VLLM_FINISH if r not in failing)]:
            queue = back if reason in failing else front
            while ended.get(reason, 0) > 0:
                i = next(queue, None)
                if i is None:
                    break
                if i in taken:
                    continue
                taken.add(i)
                finish, status = VLLM_FINISH[reason]
                fields[i]["finish_reason"] = finish
                if status != "ok" and fields[i]["status"] == "ok":
                    fields[i]["status"] = status
                ended[reason] -= 1
        if not any(ended.values()):
            del self._pending_finish[labels]

    def _delta(self, point: HistogramPoint, role: Role, scale: float, per_request: bool) -> _Delta | None:
        error_type = point.labels.get("error.type", "")
        if not point.cumulative:
            return _Delta(role, scale, per_request, point.bounds, list(point.counts), point.total,
                          point.start_ms or point.ts_ms, error_type)
        series = (point.name, tuple(sorted(point.labels.items())))
        before = self._previous.pop(series, None)
        self._previous[series] = point  # re-inserted: the dict's order is least recently read first
        _forget_oldest(self._previous)
        if before is None or point.ts_ms <= before.ts_ms:
            return None  # the first reading is the base; an older or repeated one adds nothing
        if before.bounds != point.bounds or any(b > a for a, b in zip(point.counts, before.counts)):
            # a reset (or new buckets): everything since the series started again
            return _Delta(role, scale, per_request, point.bounds, list(point.counts), point.total, before.ts_ms,
                          error_type)
        return _Delta(role, scale, per_request, point.bounds, [a - b for a, b in zip(point.counts, before.counts)],
                      max(point.total - before.total, 0.0), before.ts_ms, error_type)

    def _requests(self, key: tuple, group: _Group, out: MappedHistograms) -> None:
        by_role: dict[Role, list[_Delta]] = {}
        for d in group.deltas:
            by_role.setdefault(d.role, []).append(d)
        durations = by_role.get("e2e", [])
        statuses: list[str] = []
        e2e: list[float] = []
        for d in sorted(durations, key=lambda d: d.error_type):
            values = _latencies(d)
            e2e += values
            statuses += [_status(d.error_type)] * len(values)
        first_output = [v for d in by_role.get("first_output", []) for v in _latencies(d)]
        failed: list[tuple[str, int | None]] = []
        if group.counted is None:
            n = max(len(e2e), len(first_output))
        else:
            # The runtime's counters are the number of requests; its histograms (successes only
            # for TGI, every first response for Triton) only give them latencies.
            failed = [outcome for outcome, k in sorted(group.counted.items(), key=str) if outcome[0] != "ok"
                      for _ in range(k)]
            n = max(len(e2e), group.counted.get(("ok", None), 0)) + len(failed)
        if n == 0:
            return  # tokens alone, or an interval without requests: nothing to count
        statuses += ["ok"] * (n - len(failed) - len(statuses))
        http_statuses = [None] * len(statuses) + [code for _, code in failed]
        statuses += [status for status, _ in failed]
        # The first-output histograms count answers that started (the server's: successful ones), so
        # their values go to the requests that ended ok first.
        order = sorted(range(n), key=lambda i: statuses[i] != "ok")
        fields: list[dict] = [{"status": statuses[i]} if http_statuses[i] is None else
                              {"status": statuses[i], "http_status": http_statuses[i]} for i in range(n)]
        for i, value in enumerate(e2e):
            fields[i]["e2e_ms"] = value
        _assign(fields, order, "first_output_ms", first_output)
        _assign(fields, order, "queue_ms", [v for d in by_role.get("queue", []) for v in _latencies(d)])
        inter = by_role.get("inter_token", [])
        per_answer = [v for d in inter if d.per_request for v in _latencies(d)]
        if not per_answer and inter:
            per_answer = _per_chunk_as_answers(inter, sum(1 for s in statuses if s == "ok"))
        _assign(fields, order, "inter_token_ms", per_answer)
        for role in ("prompt_tokens", "output_tokens"):
            _assign(fields, order, role, [v for d in by_role.get(role, []) for v in _tokens(d)])
        self._share_tokens(key[0], fields)
        self._share_finishes(key[0], fields, order)
        labels = group.labels
        base = {name: value for name in RequestRules.__struct_fields__ if (value := getattr(self.rules, name).pick(labels))}
        digest = hashlib.blake2b(repr(key).encode(), digest_size=12).hexdigest()
        span = max(group.end_ms - group.start_ms, 0)
        for i, f in enumerate(fields):
            event = {"schema": "request.v1", "event_id": f"h{digest}{i:06x}",
                     # spread over [start, end), so a minute gets the requests of its part of the interval
                     "ts": group.start_ms + (span * i) // n if span else group.end_ms, **base, **f}
            if event["status"] == "cancelled":
                event.pop("e2e_ms", None)
            try:
                out.events.append(msgspec.convert(event, RequestV1))
            except msgspec.ValidationError as exc:
                out.refused.append(("otlp_histogram_invalid", str(exc)[:300]))
                return  # one bad label makes every request of the group bad: one reason is enough


def _forget_oldest(remembered: dict) -> None:
    """Past `MAX_SERIES` entries, forget the least recently read half (their next reading is a base)."""
    if len(remembered) > MAX_SERIES:
        for stale in list(remembered)[:MAX_SERIES // 2]:
            del remembered[stale]


def _shares(total: int, weights: list[float]) -> list[int]:
    """`total` split in proportion to `weights` as whole numbers adding up to it (largest
    remainders take the units rounding dropped)."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: exact[i] - out[i], reverse=True)[:total - sum(out)]:
        out[i] += 1
    return out


def _known(point: HistogramPoint) -> tuple[Role, float, bool] | None:
    name = point.name.lower() if point.name.lower().startswith("gen_ai.") else point.name
    if name == TOKEN_USAGE:
        role = TOKEN_TYPES.get(point.labels.get("gen_ai.token.type", ""))
        return (role, 1.0, True) if role else None
    known = NAMES.get(name)
    return (known.role, known.scale, known.per_request) if known else None


def _malformed(point: HistogramPoint) -> str:
    if len(point.bounds) > MAX_BUCKETS:
        return f"{len(point.bounds)} bucket bounds (at most {MAX_BUCKETS})"
    if len(point.counts) != len(point.bounds) + 1:
        return f"{len(point.counts)} bucket counts for {len(point.bounds)} bounds"
    if any(not math.isfinite(b) for b in point.bounds) or any(b >= a for b, a in zip(point.bounds, point.bounds[1:])) \
            or (point.bounds and point.bounds[0] < 0):
        return "bucket bounds not finite, increasing and non-negative"
    if any(c < 0 for c in point.counts) or not math.isfinite(point.total) or point.total < 0:
        return "a negative or non-finite count or sum"
    return ""


def _latencies(d: _Delta) -> list[float]:
    """Each observation at its bucket's upper bound, in ms; above the last bound, at the mean
    the sum leaves for them (never below the last bound)."""
    out: list[float] = []
    for bound, count in zip(d.bounds, d.counts):
        out += [bound * d.scale] * count
    above = d.counts[-1] if d.counts else 0
    if above:
        floor = d.bounds[-1] if d.bounds else 0.0
        left = d.total - sum(b * c for b, c in zip(d.bounds, d.counts))  # an upper-bound estimate of the rest
        out += [max(floor, left / above) * d.scale] * above
    return [round(v, 6) for v in out]


def _tokens(d: _Delta) -> list[int]:
    """Integer counts inside their buckets adding up to the histogram's sum: each starts at its
    bucket's lower bound and the rest of the sum is shared in proportion to the buckets' widths."""
    lows: list[float] = []
    highs: list[float] = []
    edges = (0.0, *d.bounds)
    for i, count in enumerate(d.counts):
        lo = edges[i]
        hi = d.bounds[i] if i < len(d.bounds) else max(lo, d.total)
        lows += [lo] * count
        highs += [hi] * count
    if not lows:
        return []
    room = [h - lo for lo, h in zip(lows, highs)]
    extra = min(max(d.total - sum(lows), 0.0), sum(room))
    values = [lo + (extra * r / sum(room) if sum(room) else 0.0) for lo, r in zip(lows, room)]
    out = [int(v) for v in values]
    # largest remainders take the units rounding dropped, so the counts add up to the sum
    short = int(round(d.total)) - sum(out)
    for i in sorted(range(len(values)), key=lambda i: values[i] - out[i], reverse=True)[:max(short, 0)]:
        out[i] += 1
    return out


def _per_chunk_as_answers(deltas: list[_Delta], answers: int) -> list[float]:
    """A per-chunk gap histogram says how gaps spread, not how answers' mean gaps do: the
    answers take evenly spaced quantiles of the gaps, an estimate the docs name (it spreads
    wider than per-answer means would, so it errs towards bad)."""
    values = [v for d in deltas for v in _latencies(d)]
    if not values or not answers:
        return []
    values.sort()
    return [values[min(len(values) - 1, (2 * i + 1) * len(values) // (2 * answers))] for i in range(answers)]


def _assign(fields: list[dict], order: list[int], name: str, values: list) -> None:
    for i, value in zip(order, values):
        fields[i][name] = value


def _status(error_type: str) -> str:
    """`error.type` as the span mapping reads it (a status code or an error's name); empty is success."""
    if not error_type:
        return "ok"
    return failure_status(error_type, int(error_type) if error_type.isdigit() else None)
