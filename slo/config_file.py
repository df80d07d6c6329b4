"""Reading a YAML config file into a mapping, with one-line errors naming the file.

Every config file of tailwatch (prices, the signal API, detectors) starts the same way:
read it, parse it, insist on a mapping. The caller's exception type carries the message,
so each command reports it with its own flag.
"""

from __future__ import annotations

from pathlib import Path

import yaml


def read_yaml_mapping(path: str | Path, error: type[Exception], expected: str = "a mapping") -> dict:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise error(f"{path}: not valid YAML{where}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise error(f"{path}: expected {expected}")
    return raw
