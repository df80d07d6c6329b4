"""OTLP spans → `request.v1`: one event per request span.

Which spans are requests:
- GenAI semantic conventions (`gen_ai.operation.name`, `gen_ai.request.model`, ...; which
  release defines each name: `genai_versions.py`) and vLLM's
  `llm_request` span with its older names (`gen_ai.usage.prompt_tokens`, latencies in
  seconds under `gen_ai.latency.*`);
- Triton: every span of a request carries `model_name`, `model_version` and `request_id`; the
  request is the outermost of them in the trace, and its queue time is read from the
  `QUEUE_START` / `COMPUTE_START` timestamps (span events) of the whole group.
- a cascaded turn (speech-to-speech): a span whose children name a phase in `tailwatch.stage`
  (or `stage`); each child's duration is that phase's time (summed when a phase repeats),
  and the turn's event carries them in `stages`. Children are joined by trace and parent id
  within one batch (the Collector's `groupbytrace` processor keeps a trace in one batch).
Other spans (HTTP handlers, database calls) are skipped, not dead-lettered.

Stream endings: `gen_ai.response.finish_reasons` becomes `finish_reason` (stop, end_turn,
tool_calls → stop; length, max_tokens → length; content_filter; abort → client_cancel).

Outcome: `error.type`, the span status and the HTTP status decide `status` (429 shed,
408/504 timeout, 499 or an aborted stream cancelled, other failures error; a cancelled
request has no end-to-end latency, as in request.v1). Seconds become
milliseconds; the event id is the trace and span ids (so a batch read twice gives the same
ids, which the worker drops as duplicates); a conversation id becomes an opaque hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import msgspec
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from tailwatch.ingest.otlp.attributes import Attributes, first, number
from tailwatch.ingest.otlp.genai_versions import defined_by
from tailwatch.ingest.otlp.mapping import RequestRules
from tailwatch.ingest.otlp.views import STATUS_ERROR, SpanView, resource_spans
from tailwatch.ingest.schema import RequestV1

GENAI_MARKERS = ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.input_tokens",
                 "gen_ai.usage.prompt_tokens", "gen_ai.request.id", "gen_ai.latency.e2e", "gen_ai.provider.name",
                 "gen_ai.system")
VLLM_SPAN = "llm_request"
TRITON_MARKERS = ("model_name", "request_id")

INPUT_TOKENS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
OUTPUT_TOKENS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
HTTP_STATUS = ("http.response.status_code", "http.status_code")
E2E_S = ("gen_ai.latency.e2e",)
FIRST_TOKEN_S = ("gen_ai.response.time_to_first_chunk", "gen_ai.latency.time_to_first_token",
                 "gen_ai.server.time_to_first_token", "gen_ai.response.time_to_first_token")
QUEUE_S = ("gen_ai.latency.time_in_queue",)
DECODE_S = ("gen_ai.latency.time_in_model_decode",)
PER_OUTPUT_TOKEN_S = ("gen_ai.server.time_per_output_token",)
# Input tokens served from the provider's cache (included in the input tokens). Its sibling
# `gen_ai.usage.cache_creation.input_tokens` (tokens written to the cache) fills no request
# field and is not read.
CACHED_INPUT_TOKENS = ("gen_ai.usage.cache_read.input_tokens",)
# Every span attribute read for a request field, with who defines it (docs/opentelemetry.md is
# made to match this table, and tests/test_otlp_generations.py sends each through the SDK).
SPAN_ATTRIBUTE_SOURCES = {
    "gen_ai.usage.input_tokens": defined_by("gen_ai.usage.input_tokens"),
    "gen_ai.usage.output_tokens": defined_by("gen_ai.usage.output_tokens"),
    "gen_ai.usage.prompt_tokens": f"{defined_by('gen_ai.usage.prompt_tokens')}; vLLM's llm_request span",
    "gen_ai.usage.completion_tokens": f"{defined_by('gen_ai.usage.completion_tokens')}; vLLM's llm_request span",
    "gen_ai.usage.cache_read.input_tokens": defined_by("gen_ai.usage.cache_read.input_tokens"),
    "gen_ai.response.time_to_first_chunk": defined_by("gen_ai.response.time_to_first_chunk"),
    "gen_ai.server.time_to_first_token": "a metric in the conventions; read when an instrumentation sets it on the span",
    "gen_ai.response.time_to_first_token": "Sentry's conventions",
    "gen_ai.server.time_per_output_token": "a metric in the conventions; read when an instrumentation sets it on the span",
    "gen_ai.latency.time_to_first_token": "vLLM's llm_request span",
    "gen_ai.latency.e2e": "vLLM's llm_request span",
    "gen_ai.latency.time_in_queue": "vLLM's llm_request span",
    "gen_ai.latency.time_in_model_decode": "vLLM's llm_request span",
}
CANCELLED_FINISH = {"abort", "aborted", "cancelled", "canceled"}
PHASE_ATTRIBUTES = ("tailwatch.stage", "stage")
FINISH_REASONS = {
    **dict.fromkeys(("stop", "eos", "end_turn", "stop_sequence", "tool_calls", "tool_use", "function_call"), "stop"),
    **dict.fromkeys(("length", "max_tokens", "max_output_tokens"), "length"),
    **dict.fromkeys(("content_filter", "safety", "refusal"), "content_filter"),
    **dict.fromkeys(CANCELLED_FINISH, "client_cancel"),
    # No convention names these; tailwatch's own encoder (and a runtime that wants them seen) does.
    "server_cut": "server_cut", "timeout": "timeout",
}
# finish_reason → the name written to gen_ai.response.finish_reasons (ingest/otlp/encode.py).
OTLP_FINISH_NAME = {"stop": "stop", "length": "length", "content_filter": "content_filter", "client_cancel": "abort",
                    "server_cut": "server_cut", "timeout": "timeout"}


@dataclass
class MappedSpans:
    events: list[RequestV1] = field(default_factory=list)
    refused: list[tuple[str, str, bytes]] = field(default_factory=list)  # (reason, detail, the span's bytes)
    skipped: int = 0  # spans that are not requests


def requests_from_traces(data: TracesData | dict, rules: RequestRules) -> MappedSpans:
    """A decoded batch (`wire.decode`: the protobuf message or the OTLP/JSON document)."""
    out = MappedSpans()
    groups = list(resource_spans(data))
    phases = _phase_children(groups)
    for resource, spans in groups:
        triton: dict[tuple[bytes, str], list[SpanView]] = {}
        for span in spans:
            attrs = span.attributes
            turn_phases = phases.get((span.trace_id, span.span_id))
            if span.name == VLLM_SPAN or any(k in attrs for k in GENAI_MARKERS) or turn_phases:
                fields = _genai_fields(span)
                if turn_phases:
                    fields["stages"] = turn_phases
                _add(out, span, fields, resource, rules)
            elif all(k in attrs for k in TRITON_MARKERS):
                triton.setdefault((span.trace_id, str(attrs["request_id"])), []).append(span)
            elif first(PHASE_ATTRIBUTES, attrs) is None:
                out.skipped += 1  # a phase span is not skipped: its time is in its turn's event
        for group in triton.values():
            ids = {s.span_id for s in group}
            roots = [s for s in group if s.parent_span_id not in ids]
            span = min(roots or group, key=lambda s: s.start_ns)
            out.skipped += len(group) - 1
            _add(out, span, _triton_fields(span, group), resource, rules)
    return out


def _phase_children(groups: list[tuple[Attributes, list[SpanView]]]) -> dict[tuple[bytes, bytes], dict[str, float]]:
    """(trace id, parent span id) → {stage: ms} from the spans that name a phase."""
    out: dict[tuple[bytes, bytes], dict[str, float]] = {}
    for _resource, spans in groups:
        for span in spans:
            phase = first(PHASE_ATTRIBUTES, span.attributes)
            duration = _duration_ms(span)
            if phase is None or not span.parent_span_id or duration is None:
                continue
            name = str(phase).strip().lower().replace("-", "_").replace(" ", "_")[:32] or "other"
            times = out.setdefault((span.trace_id, span.parent_span_id), {})
            times[name] = round(times.get(name, 0.0) + duration, 6)
    return out


def _add(out: MappedSpans, span: SpanView, fields: dict, resource: Attributes, rules: RequestRules) -> None:
    attrs = span.attributes
    if not span.span_id or not span.end_ns:
        out.refused.append(("otlp_span_incomplete", "a request span without a span id or an end time", span.raw()))
        return
    event = {
        "schema": "request.v1",
        "event_id": span.trace_id.hex() + span.span_id.hex(),
        "ts": span.end_ns // 1_000_000,
        **{name: value for name in RequestRules.__struct_fields__ if (value := getattr(rules, name).pick(attrs, resource))},
        **{k: v for k, v in fields.items() if v is not None},
    }
    http = number(HTTP_STATUS, attrs)
    if http is not None and 100 <= http <= 599:
        event["http_status"] = int(http)
    event["status"] = _status(span, attrs, event.get("http_status"))
    finish = _finish_reason(attrs)
    if finish is not None:
        event["finish_reason"] = finish
    if event["status"] == "cancelled":
        event.pop("e2e_ms", None)  # the client left: how long until then is not the service's latency
    conversation = first(("gen_ai.conversation.id",), attrs)
    if conversation is not None:
        event["session_id"] = hashlib.sha256(str(conversation).encode()).hexdigest()[:32]
    try:
        out.events.append(msgspec.convert(event, RequestV1))
    except msgspec.ValidationError as exc:
        out.refused.append(("otlp_span_invalid", str(exc)[:300], span.raw()))


def _genai_fields(span: SpanView) -> dict:
    attrs = span.attributes
    duration_ms = _duration_ms(span)
    e2e_s = number(E2E_S, attrs)
    prompt = number(INPUT_TOKENS, attrs)
    output = number(OUTPUT_TOKENS, attrs)
    per_token_s = number(PER_OUTPUT_TOKEN_S, attrs)
    decode_s = number(DECODE_S, attrs)
    if per_token_s is None and decode_s is not None and output is not None and output >= 2:
        per_token_s = decode_s / (output - 1)  # the mean gap between tokens after the first
    return {
        "e2e_ms": _ms(e2e_s) if e2e_s is not None else duration_ms,
        "first_output_ms": _ms(number(FIRST_TOKEN_S, attrs)),
        "queue_ms": _ms(number(QUEUE_S, attrs)),
        "inter_token_ms": _ms(per_token_s),
        "prompt_tokens": int(prompt) if prompt is not None else None,
        "output_tokens": int(output) if output is not None else None,
        "cached_prompt_tokens": int(cached) if (cached := number(CACHED_INPUT_TOKENS, attrs)) is not None else None,
    }


def _triton_fields(span: SpanView, group: list[SpanView]) -> dict:
    stamps: dict[str, int] = {}
    for s in group:
        for name, time_ns in s.events:
            if name not in stamps or time_ns < stamps[name]:
                stamps[name] = time_ns
    queue_ms = None
    if "QUEUE_START" in stamps and "COMPUTE_START" in stamps and stamps["COMPUTE_START"] >= stamps["QUEUE_START"]:
        queue_ms = (stamps["COMPUTE_START"] - stamps["QUEUE_START"]) / 1e6
    return {"e2e_ms": _duration_ms(span), "queue_ms": queue_ms}


def _status(span: SpanView, attrs: Attributes, http: int | None) -> str:
    finish = attrs.get("gen_ai.response.finish_reasons")
    reasons = {str(r).lower() for r in (finish if isinstance(finish, list) else [finish] if finish else [])}
    failed = span.status_code == STATUS_ERROR or "error.type" in attrs or (http is not None and http >= 500)
    status = failure_status(f"{attrs.get('error.type', '')} {span.status_message}" if failed else "", http)
    if status == "error" and reasons & CANCELLED_FINISH:
        return "cancelled"
    return status if failed or status != "error" else "ok"


def failure_status(text: str, http: int | None = None) -> str:
    """What an error's text (`error.type`, a status message) and HTTP status say a request
    was: shed, timed out, cancelled by the client, or an error."""
    text = text.lower()
    if http == 429 or any(w in text for w in ("overload", "rate_limit", "shed", "capacity")):
        return "shed"
    if http in (408, 504) or "timeout" in text:
        return "timeout"
    if http == 499 or "cancel" in text:
        return "cancelled"
    return "error"


def _finish_reason(attrs: Attributes) -> str | None:
    finish = attrs.get("gen_ai.response.finish_reasons")
    for reason in (finish if isinstance(finish, list) else [finish] if finish else []):
        mapped = FINISH_REASONS.get(str(reason).lower())
        if mapped is not None:
            return mapped
    return None


def _duration_ms(span: SpanView) -> float | None:
    if span.end_ns >= span.start_ns > 0:
        return (span.end_ns - span.start_ns) / 1e6
    return None


def _ms(seconds: float | None) -> float | None:
    # to the nanosecond: 4.03905 s × 1000 is 4039.0499999999997, not the 4039.05 ms measured
    return round(seconds * 1000, 6) if seconds is not None else None
