"""The detectors' configuration: one YAML file, one section per detector, every threshold
and window with a documented default (`detectors/defaults.yaml`, the built-in set).

A section names only the settings it changes; the rest keep the defaults of the
detector's config Struct (`ConfigStruct`: constraints in `Meta`, unknown keys refused). An
unknown detector, an unknown setting, a value of the wrong type or out of its range is a
one-line error that names its place (`detectors.yaml: queue_age.window_minutes: expected
`int` >= 1`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


from tailwatch.detectors.anomaly import AnomalyConfig, AnomalyDetector
from tailwatch.detectors.anomaly import NAME as ANOMALY
from tailwatch.detectors.cold_start import NAME as COLD
from tailwatch.detectors.cold_start import ColdStartConfig, ColdStartDetector
from tailwatch.detectors.core import DetectionEvent, Minute
from tailwatch.detectors.cost import NAME as COST
from tailwatch.detectors.cost import CostRegressionConfig, CostRegressionDetector
from tailwatch.detectors.kv_cache import (
    KV,
    PROMPT,
    KvCachePressureConfig,
    KvCachePressureDetector,
    PromptGrowthConfig,
    PromptGrowthDetector,
)
from tailwatch.detectors.quality import (
    COLD_VOICE,
    PARTIAL_CHURN,
    PROMPT_CACHE,
    SPECULATIVE,
    VOICE_FALLBACK,
    VOICE_QUALITY,
    ColdVoiceStormConfig,
    ColdVoiceStormDetector,
    PartialChurnConfig,
    PartialChurnDetector,
    PromptCacheCollapseConfig,
    PromptCacheCollapseDetector,
    SpeculativeAcceptanceDropConfig,
    SpeculativeAcceptanceDropDetector,
    VoiceFallbackSurgeConfig,
    VoiceFallbackSurgeDetector,
    VoiceQualityDropConfig,
    VoiceQualityDropDetector,
)
from tailwatch.detectors.tenants import TENANT_STARVING, TenantStarvingConfig, TenantStarvingDetector
from tailwatch.detectors.queue_age import NAME as QUEUE
from tailwatch.detectors.queue_age import QueueAgeConfig, QueueAgeDetector
from tailwatch.detectors.retry_storm import NAME as RETRY
from tailwatch.detectors.retry_storm import RetryStormConfig, RetryStormDetector
from tailwatch.detectors.utilisation import (
    BUSY,
    IDLE,
    BusyButSlowConfig,
    BusyButSlowDetector,
    IdleButSlowConfig,
    IdleButSlowDetector,
)
from tailwatch.config import convert, read_yaml

DEFAULTS = Path(__file__).with_name("defaults.yaml")

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
    COLD_VOICE: (ColdVoiceStormConfig, ColdVoiceStormDetector),
    PARTIAL_CHURN: (PartialChurnConfig, PartialChurnDetector),
    PROMPT_CACHE: (PromptCacheCollapseConfig, PromptCacheCollapseDetector),
    VOICE_QUALITY: (VoiceQualityDropConfig, VoiceQualityDropDetector),
    VOICE_FALLBACK: (VoiceFallbackSurgeConfig, VoiceFallbackSurgeDetector),
    SPECULATIVE: (SpeculativeAcceptanceDropConfig, SpeculativeAcceptanceDropDetector),
    TENANT_STARVING: (TenantStarvingConfig, TenantStarvingDetector),
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


def parse(doc: object, source: str = "detectors file") -> DetectorsConfig:
    """A detectors document: each section converted to its detector's config Struct, whose
    field types and `Meta` constraints are the rules; the first problem names its place."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise DetectorConfigError(f"{source}: expected a mapping of detector name to settings")
    cfg = DetectorsConfig()
    for name, section in doc.items():
        if name not in REGISTRY:
            raise DetectorConfigError(f"{source}: unknown detector {name!r} (known: {', '.join(DETECTOR_NAMES)})")
        cfg.configs[name] = convert(section, REGISTRY[name][0], source, DetectorConfigError, at=name)
    return cfg


def load(path: str | Path | None = None) -> DetectorsConfig:
    """The built-in defaults (path None), or a file layered over the Structs' defaults."""
    path = Path(path) if path is not None else DEFAULTS
    doc = read_yaml(path, DetectorConfigError)
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

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        """Every label set an enabled detector reads requests by: closed rows are held as
        their summaries by these (`detectors.core.summaries`)."""
        return tuple(sorted({by for d in self.detectors for by in d.label_sets()}))

    def get(self, name: str):
        return next((d for d in self.detectors if d.name == name), None)
