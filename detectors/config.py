"""The detectors' configuration: one YAML file, one section per detector, every threshold
and window with a documented default (`detectors/defaults.yaml`, the built-in set).

A section names only the settings it changes; the rest keep the defaults of the
detector's config dataclass. An unknown detector, an unknown setting or a value of the
wrong type is an error that names its place.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path


from detectors.anomaly import MODELS, AnomalyConfig, AnomalyDetector
from detectors.anomaly import NAME as ANOMALY
from detectors.cold_start import NAME as COLD
from detectors.cold_start import ColdStartConfig, ColdStartDetector
from detectors.core import LATENCY_P95, DetectionEvent, Minute
from detectors.cost import NAME as COST
from detectors.cost import CostRegressionConfig, CostRegressionDetector
from detectors.kv_cache import (
    KV,
    PROMPT,
    KvCachePressureConfig,
    KvCachePressureDetector,
    PromptGrowthConfig,
    PromptGrowthDetector,
)
from detectors.queue_age import NAME as QUEUE
from detectors.queue_age import QueueAgeConfig, QueueAgeDetector
from detectors.retry_storm import NAME as RETRY
from detectors.retry_storm import RetryStormConfig, RetryStormDetector
from detectors.utilisation import (
    BUSY,
    IDLE,
    BusyButSlowConfig,
    BusyButSlowDetector,
    IdleButSlowConfig,
    IdleButSlowDetector,
)
from ingest.schema import SLICE_LABELS
from slo.config_file import read_yaml_mapping

DEFAULTS = Path(__file__).with_name("defaults.yaml")
CHOICES = {"model": MODELS, "latency_field": LATENCY_P95}

# detector name → (config dataclass, detector class), in the order detectors run.
REGISTRY: dict[str, tuple[type, type]] = {
    RETRY: (RetryStormConfig, RetryStormDetector),
    QUEUE: (QueueAgeConfig, QueueAgeDetector),
    BUSY: (BusyButSlowConfig, BusyButSlowDetector),
    IDLE: (IdleButSlowConfig, IdleButSlowDetector),
    KV: (KvCachePressureConfig, KvCachePressureDetector),
    PROMPT: (PromptGrowthConfig, PromptGrowthDetector),
    COLD: (ColdStartConfig, ColdStartDetector),
    COST: (CostRegressionConfig, CostRegressionDetector),
    ANOMALY: (AnomalyConfig, AnomalyDetector),
}
DETECTOR_NAMES = tuple(REGISTRY)


class DetectorConfigError(ValueError):
    """The detectors file is unreadable or wrong (a one-line message naming the place)."""


@dataclass
class DetectorsConfig:
    configs: dict[str, object] = field(default_factory=lambda: {n: c() for n, (c, _) in REGISTRY.items()})

    def enabled(self) -> list[str]:
        return [n for n in DETECTOR_NAMES if self.configs[n].enabled]

    def history_minutes(self) -> int:
        """How many minutes of buckets rebuild the state of every enabled detector."""
        need = 1
        for n in self.enabled():
            c = self.configs[n]
            minutes = getattr(c, "window_minutes", 1) + getattr(c, "baseline_minutes", 0) + getattr(c, "clear_minutes", 1)
            if n == ANOMALY:
                minutes += c.fit_window_minutes
            need = max(need, minutes)
        return need


def _coerce(value, default, where: str):
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise DetectorConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DetectorConfigError(f"{where}: expected an integer, got {value!r}")
        if value < 0 or (value == 0 and where.endswith("minutes")):
            raise DetectorConfigError(f"{where}: must be positive, got {value}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DetectorConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
            raise DetectorConfigError(f"{where}: expected a non-empty list of label names, got {value!r}")
        return tuple(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise DetectorConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise DetectorConfigError(f"{where}: unsupported setting")


def parse(doc: object, source: str = "detectors file") -> DetectorsConfig:
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise DetectorConfigError(f"{source}: expected a mapping of detector name to settings")
    cfg = DetectorsConfig()
    for name, section in doc.items():
        if name not in REGISTRY:
            raise DetectorConfigError(f"{source}: unknown detector {name!r} (known: {', '.join(DETECTOR_NAMES)})")
        section = section or {}
        if not isinstance(section, dict):
            raise DetectorConfigError(f"{source}: {name}: expected a mapping of settings")
        klass = REGISTRY[name][0]
        defaults = {f.name: f.default for f in dataclasses.fields(klass)}
        values = {}
        for key, value in section.items():
            if key not in defaults:
                raise DetectorConfigError(f"{source}: {name}.{key}: unknown setting (known: {', '.join(defaults)})")
            values[key] = _coerce(value, defaults[key], f"{source}: {name}.{key}")
        _check_values(name, values, source)
        cfg.configs[name] = klass(**{**defaults, **values})
    return cfg


def _check_values(name: str, values: dict, source: str) -> None:
    """Settings whose type is right but whose value must come from a fixed set."""
    for key, value in values.items():
        where = f"{source}: {name}.{key}"
        allowed = CHOICES.get(key)
        if allowed is not None and value not in allowed:
            raise DetectorConfigError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
        if key == "slice_by":
            unknown = [v for v in value if v not in SLICE_LABELS]
            if unknown:
                raise DetectorConfigError(f"{where}: {unknown[0]!r} is not a slice label ({', '.join(SLICE_LABELS)})")
        if key == "pool_regex":
            try:
                re.compile(value)
            except re.error as exc:
                raise DetectorConfigError(f"{where}: not a regular expression ({exc})") from None


def load(path: str | Path | None = None) -> DetectorsConfig:
    """The built-in defaults (path None), or a file layered over the dataclass defaults."""
    path = Path(path) if path is not None else DEFAULTS
    doc = read_yaml_mapping(path, DetectorConfigError)
    return parse(doc, str(path))


class DetectorSet:
    """Every enabled detector, fed the same closed minutes in event-time order."""

    def __init__(self, cfg: DetectorsConfig | None = None):
        self.cfg = cfg or DetectorsConfig()
        self.detectors = [REGISTRY[n][1](self.cfg.configs[n]) for n in self.cfg.enabled()]

    def observe(self, minute: Minute) -> list[DetectionEvent]:
        events: list[DetectionEvent] = []
        for d in self.detectors:
            events.extend(d.observe(minute))
        return events

    def get(self, name: str):
        return next((d for d in self.detectors if d.name == name), None)
