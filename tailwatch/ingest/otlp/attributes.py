"""OTLP attributes as plain values, and the lookup a mapping rule makes over them."""

from __future__ import annotations

from typing import Any

Attributes = dict[str, Any]


def as_dict(key_values) -> Attributes:
    """A repeated `KeyValue` → {key: str | int | float | bool | list}; nested maps and
    bytes are left out (no field of ours reads them)."""
    out: Attributes = {}
    for kv in key_values:
        out[kv.key] = _value(kv.value)
    return out


def _value(v) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    return None


def first(names: list[str] | tuple[str, ...], *scopes: Attributes) -> Any:
    """The value of the first name present, looked up in each scope in order (a span's own
    attributes before its resource's)."""
    for name in names:
        for scope in scopes:
            value = scope.get(name)
            if value is not None and value != "":
                return value
    return None


def number(names: tuple[str, ...], *scopes: Attributes) -> float | None:
    value = first(names, *scopes)
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
