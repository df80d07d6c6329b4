"""OTLP batches on Kafka: bytes ⇄ `TracesData` / `MetricsData`.

The Collector's `kafka` exporter writes one record per batch, as `otlp_proto` (the
protobuf wire layout of `TracesData`, the same as `ExportTraceServiceRequest`) or
`otlp_json` (the protobuf JSON mapping with OTLP's exceptions: trace and span ids as hex,
not base64; enums as integers). The encoding is told by the first byte: a JSON batch is an
object, a protobuf one starts with field 1's tag (0x0a).
"""

from __future__ import annotations

import base64
import json
from typing import TypeVar

import msgspec
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

M = TypeVar("M", TracesData, MetricsData)
ENCODINGS = ("otlp_proto", "otlp_json")
_ID_FIELDS = {"traceId", "spanId", "parentSpanId"}
_json_decoder = msgspec.json.Decoder()


class OtlpDecodeError(Exception):
    """A record that is not an OTLP batch of the expected kind: the reason in one line."""


def encoding_of(raw: bytes) -> str:
    return "otlp_json" if raw.lstrip()[:1] == b"{" else "otlp_proto"


def decode(raw: bytes, kind: type[M]) -> M | dict:
    """A batch as the protobuf message (`otlp_proto`), or as the JSON document
    (`otlp_json`: a dict in OTLP/JSON's own shape; the mapping reads both). The JSON is
    not converted to the message: protobuf's JSON parser costs a hundred times the
    mapping itself."""
    if not raw:
        raise OtlpDecodeError("empty record")
    if encoding_of(raw) == "otlp_json":
        try:
            doc = _json_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise OtlpDecodeError(f"otlp_json: not JSON ({str(exc)[:80]})") from None
        if not isinstance(doc, dict):
            raise OtlpDecodeError("otlp_json: not an object")
        return doc
    try:
        return kind.FromString(raw)
    except (DecodeError, RuntimeError) as exc:
        raise OtlpDecodeError(f"otlp_proto: not a {kind.__name__} ({str(exc)[:80]})") from None


def encode(message: Message, encoding: str = "otlp_proto") -> bytes:
    if encoding == "otlp_proto":
        return message.SerializeToString()
    doc = json_format.MessageToDict(message, use_integers_for_enums=True)
    return json.dumps(_ids_to_hex(doc), separators=(",", ":")).encode()


def _ids_to_hex(node):
    if isinstance(node, dict):
        return {k: (base64.b64decode(v).hex() if k in _ID_FIELDS and isinstance(v, str) else _ids_to_hex(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_ids_to_hex(v) for v in node]
    return node
