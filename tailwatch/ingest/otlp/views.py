"""One shape for a span whichever encoding carried it: the protobuf message or the
OTLP/JSON document (camelCase keys, hex ids, 64-bit integers as strings, enums as
integers), so the mapping has one code path; and the tolerant readers of OTLP/JSON values
that the metric samples use too (a field of the wrong type reads as absent)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry.proto.trace.v1.trace_pb2 import Status, TracesData

from tailwatch.ingest.otlp.attributes import Attributes, as_dict

STATUS_ERROR = Status.STATUS_CODE_ERROR  # 2
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


@dataclass(slots=True)
class SpanView:
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str
    start_ns: int
    end_ns: int
    attributes: Attributes
    status_code: int
    status_message: str
    events: list[tuple[str, int]]  # (name, time in ns)
    source: object  # the protobuf Span or the JSON object, for a dead letter

    def raw(self) -> bytes:
        return self.source.SerializeToString() if hasattr(self.source, "SerializeToString") else json.dumps(self.source).encode()


def resource_spans(data: TracesData | dict) -> Iterator[tuple[Attributes, list[SpanView]]]:
    """(resource attributes, its spans) per ResourceSpans of a batch."""
    if isinstance(data, dict):
        yield from _json_resource_spans(data)
        return
    for rs in data.resource_spans:
        spans = [SpanView(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_time_unix_nano, s.end_time_unix_nano,
                          as_dict(s.attributes), s.status.code, s.status.message,
                          [(e.name, e.time_unix_nano) for e in s.events], s)
                 for scope in rs.scope_spans for s in scope.spans]
        yield as_dict(rs.resource.attributes), spans


def _json_resource_spans(doc: dict) -> Iterator[tuple[Attributes, list[SpanView]]]:
    for rs in as_list(doc.get("resourceSpans")):
        resource = json_attributes(as_object(as_object(rs).get("resource")).get("attributes"))
        spans = []
        for scope in as_list(as_object(rs).get("scopeSpans")):
            for s in as_list(as_object(scope).get("spans")):
                s = as_object(s)
                status = as_object(s.get("status"))
                code = status.get("code", 0)
                spans.append(SpanView(
                    _hex(s.get("traceId")), _hex(s.get("spanId")), _hex(s.get("parentSpanId")), str(s.get("name", "")),
                    as_int(s.get("startTimeUnixNano")), as_int(s.get("endTimeUnixNano")), json_attributes(s.get("attributes")),
                    _STATUS_NAMES.get(code, 0) if isinstance(code, str) else as_int(code), str(status.get("message", "")),
                    [(str(as_object(e).get("name", "")), as_int(as_object(e).get("timeUnixNano"))) for e in as_list(s.get("events"))],
                    s))
        yield resource, spans


def json_attributes(key_values) -> Attributes:
    out: Attributes = {}
    for kv in as_list(key_values):
        kv = as_object(kv)
        if "key" in kv:
            out[str(kv["key"])] = json_value(as_object(kv.get("value")))
    return out


def json_value(v: dict):
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return as_int(v["intValue"])
    if "doubleValue" in v:
        d = v["doubleValue"]
        return float(d) if isinstance(d, (int, float, str)) else None
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [json_value(as_object(x)) for x in as_list(as_object(v["arrayValue"]).get("values"))]
    return None


def _hex(value) -> bytes:
    try:
        return bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        return b""


def as_int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def as_list(value) -> list:
    return value if isinstance(value, list) else []


def as_object(value) -> dict:
    return value if isinstance(value, dict) else {}
