"""Config files: YAML read into msgspec Structs, with one-line errors naming the file and
the place.

Every config file of tailwatch (prices, the signal API, detectors, SLOs) is a Struct
deriving from `ConfigStruct`: unknown keys are refused, types are checked, and the ranges
the math needs are `Meta` constraints on the fields (`Minutes`, `Ratio`, `Positive` ...),
so a bad value is a one-line error at load time, not a worker that dies on its first data.
The caller's exception type carries the message, so each command reports it with its own
flag.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import yaml
from msgspec import Meta, Struct

T = TypeVar("T")


class ConfigStruct(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A section of a config file: unknown keys are an error, every field has a default."""


# The ranges the math needs (a division, a ceiling, a window), named once.
Minutes = Annotated[int, Meta(ge=1, le=525_600, description="minutes, 1 to a year")]
WindowMinutes = Annotated[int, Meta(ge=1, le=1440, description="minutes, 1 to a day")]
Days = Annotated[int, Meta(ge=1, le=366)]
Count = Annotated[int, Meta(ge=0)]
PositiveCount = Annotated[int, Meta(ge=1)]
Ratio = Annotated[float, Meta(gt=0.0, le=1.0, description="in (0, 1]")]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0, description="in [0, 1]")]
Objective = Annotated[float, Meta(gt=0.0, lt=1.0, description="in (0, 1)")]
Alpha = Annotated[float, Meta(gt=0.0, le=0.5, description="a significance level in (0, 0.5]")]
Positive = Annotated[float, Meta(gt=0.0)]
NonNegative = Annotated[float, Meta(ge=0.0)]
Factor = Annotated[float, Meta(ge=1.0, description="a multiple, at least 1")]
Percent = Annotated[float, Meta(ge=0.0, le=100.0)]

_AT = re.compile(r"^(.*) - at `\$(.*)`$")


def convert(raw: Any, kind: type[T], where: str, error: type[Exception], at: str = "") -> T:
    """`raw` (parsed YAML) as `kind`, or `error` naming the file (`where`), the place of the
    first problem (under `at`, the place of `raw` in its file) and what is wrong there:
    msgspec's "Expected `int` >= 1 - at `$.autoscale.zones`" becomes
    "api.yaml: autoscale.zones: expected `int` >= 1"."""
    raw = raw if raw is not None else {}
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise error(f"{where}: {describe(exc, raw, kind, at)}") from None


def describe(exc: msgspec.ValidationError, raw: Any, kind: Any, at: str = "") -> str:
    """A conversion error as "place: what is wrong", the place under `at`; a Kubernetes name
    that is none is said in words, with the name that would do."""
    from tailwatch.config.kubernetes import PATTERN, RULE, kubernetes_name

    m = _AT.match(str(exc))
    message, place = (m.group(1), m.group(2).lstrip(".")) if m else (str(exc), "")
    value = _value_at(raw, place) if PATTERN in message else None
    if isinstance(value, str):
        try:
            hint = f"; '{kubernetes_name(value)}' would do"
        except ValueError:
            hint = ""
        message = f"{value!r} is not {RULE}{hint}"
    place = ".".join(p for p in (at, _name_key(place, raw, kind)) if p).replace(".[", "[")
    return f"{place + ': ' if place else ''}{message[:1].lower()}{message[1:]}"


def every_problem(raw: Any, kind: type[ConfigStruct], at: str) -> list[str]:
    """Every field's problem in a mapping meant for `kind`, each with its place, rather than
    the first (`tailwatch slo check` lists them all): unknown keys, missing required ones,
    and each value converted to its field's type; then the Struct's own checks."""
    if not isinstance(raw, dict):
        return [f"{at}: expected a mapping"]
    fields = {f.encode_name: f for f in msgspec.structs.fields(kind)}
    out = [f"{at}: unknown field `{k}` (known: {', '.join(fields)})" for k in raw if k not in fields]
    out += [f"{at}: missing required field `{n}`" for n, f in fields.items() if f.required and n not in raw]
    for name, value in raw.items():
        if name in fields:
            try:
                msgspec.convert(value, fields[name].type)
            except msgspec.ValidationError as exc:
                out.append(describe(exc, value, fields[name].type, f"{at}.{name}"))
    if not out:
        try:
            msgspec.convert(raw, kind)
        except msgspec.ValidationError as exc:
            out.append(describe(exc, raw, kind, at))
    return out


def _value_at(raw: Any, place: str) -> Any:
    """The value at msgspec's `$.canaries[0].target` place in `raw`, or None."""
    value = raw
    for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", place):
        if index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        elif key and isinstance(value, dict):
            value = value.get(key)
        else:
            return None
    return value


def _name_key(place: str, raw: Any, kind: Any) -> str:
    """msgspec writes a mapping's key as `[...]` (`replica_shape[...]`); the key is found by
    converting with that mapping cut down to one entry at a time (every section has
    defaults, so the rest still converts). `raw` is put back as it was."""
    head, found, tail = place.partition("[...]")
    if not found or not re.fullmatch(r"[\w.]*", head):
        return place
    root = {"": raw}  # so that the mapping always has a holder, the file itself included
    *parents, name = ["", *head.split(".")] if head else [""]
    holder: Any = root
    for part in parents:
        holder = holder.get(part) if isinstance(holder, dict) else None
    mapping = holder.get(name) if isinstance(holder, dict) else None
    if not isinstance(mapping, dict):
        return place
    try:
        for key, value in mapping.items():
            holder[name] = {key: value}
            try:
                msgspec.convert(root[""], kind)
            except msgspec.ValidationError:
                return f"{head}.{key}{tail}" if head else f"{key}{tail}"
    finally:
        holder[name] = mapping
    return place


def parse_duration_s(text: Any, bare_unit: str | None = None) -> float | None:
    """Seconds in a duration such as 500ms, 90s, 2m, 1h, 7d or 2w; None if it is not one.
    The one parser for flags and files. A bare number is read in `bare_unit` where one is
    natural (a flag documented in seconds, `stale_after`), refused where it is ambiguous
    (a latency threshold: 300 could be ms or s)."""
    if isinstance(text, bool):
        return None
    m = _DURATION.match(str(text))
    if not m or (m.group(2) is None and bare_unit is None):
        return None
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2) or bare_unit]



_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line: the line and column, and what the parser found there."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}not valid YAML ({problem})"


def read_text(path: str | Path, error: type[Exception]) -> str:
    """A config file's text, or `error` with one line saying why not (missing, a directory,
    unreadable), the file's name not included: the caller says which file."""
    p = Path(path)
    if p.is_dir():
        raise error("a directory, not a file")
    try:
        return p.read_text()
    except FileNotFoundError:
        raise error("no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read it: {getattr(exc, 'strerror', None) or exc}") from None


def read_yaml(path: str | Path, error: type[Exception]) -> Any:
    try:
        text = read_text(path, ValueError)
        return yaml.safe_load(text)
    except ValueError as exc:
        raise error(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: {yaml_problem(exc)}") from None


def load_struct(path: str | Path, kind: type[T], error: type[Exception]) -> T:
    """A YAML file as the Struct `kind`; an empty file is every default."""
    raw = read_yaml(path, error)
    if raw is not None and not isinstance(raw, dict):
        raise error(f"{path}: expected a mapping")
    return convert(raw, kind, str(path), error)
