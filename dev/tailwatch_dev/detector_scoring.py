"""Scoring detections against a scenario's labelled incidents (pure: no I/O).

Matching rules:
- A detection *hits* an incident of its own kind when its slice labels agree with the
  incident's selector on every label both name (and share at least one, unless the
  selector is empty), and it was raised between the incident's start and its end plus
  a grace period.
- A detection that hits nothing is *explained* when it overlaps, on an agreeing slice,
  any other labelled incident: that detector saw a real failure, just not the one it is
  scored on (a queue saturation also makes the pool look idle-but-slow; the truth's
  `related` lists the ones expected). Neither a hit nor a false alert.
- Anything else is a false alert.

Recall = incidents of the detector's kind hit at least once ÷ incidents of that kind.
Delay = minutes from the incident's start to the end of the minute whose data raised
the first hit (event time: `started_at + 1 − start`), the moment the evidence was complete.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime

DAY_MINUTES = 1440


@dataclass(frozen=True)
class TruthIncident:
    name: str
    kind: str
    start_minute: int  # epoch minute
    end_minute: int  # exclusive
    selector: dict[str, str]
    related: tuple[str, ...] = ()


@dataclass(frozen=True)
class ObservedDetection:
    detector: str
    labels: dict[str, str]
    started_at: int  # epoch minute
    ended_at: int | None


@dataclass
class DetectorScore:
    detector: str
    incidents: int = 0
    hit: int = 0
    detections: int = 0
    false_alerts: int = 0
    explained: int = 0
    delays_minutes: list[int] = field(default_factory=list)
    simulated_minutes: int = 0

    @property
    def recall(self) -> float | None:
        return self.hit / self.incidents if self.incidents else None

    @property
    def false_alerts_per_day(self) -> float | None:
        return self.false_alerts * DAY_MINUTES / self.simulated_minutes if self.simulated_minutes else None

    @property
    def median_delay_minutes(self) -> float | None:
        return statistics.median(self.delays_minutes) if self.delays_minutes else None


def _epoch_minute(iso: str) -> int:
    dt = datetime.fromisoformat(iso)  # Python 3.11 reads the "Z" suffix
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp()) // 60


def parse_truth(truth: list[dict]) -> list[TruthIncident]:
    """The simulator's `truth()` records → incidents with epoch-minute bounds."""
    return [TruthIncident(t["incident"], t["kind"], _epoch_minute(t["start"]), _epoch_minute(t["end"]),
                          dict(t.get("selector") or {}), tuple(t.get("related") or ())) for t in truth]


def agrees(labels: dict[str, str], selector: dict[str, str]) -> bool:
    shared = [k for k in selector if k in labels]
    if selector and not shared:
        return False
    return all(labels[k] == selector[k] for k in shared)


def _hits(d: ObservedDetection, i: TruthIncident, grace_minutes: int) -> bool:
    return d.detector == i.kind and agrees(d.labels, i.selector) \
        and i.start_minute <= d.started_at <= i.end_minute + grace_minutes


def _overlaps(d: ObservedDetection, i: TruthIncident, grace_minutes: int) -> bool:
    end = d.ended_at if d.ended_at is not None else d.started_at
    return agrees(d.labels, i.selector) and d.started_at <= i.end_minute + grace_minutes and end >= i.start_minute


def score(detections: list[ObservedDetection], incidents: list[TruthIncident], detectors: list[str],
          simulated_minutes: int, grace_minutes: int = 5) -> dict[str, DetectorScore]:
    scores = {name: DetectorScore(name, simulated_minutes=simulated_minutes) for name in detectors}
    for i in incidents:
        if i.kind in scores:
            scores[i.kind].incidents += 1
            hits = [d for d in detections if _hits(d, i, grace_minutes)]
            if hits:
                scores[i.kind].hit += 1
                scores[i.kind].delays_minutes.append(min(d.started_at for d in hits) + 1 - i.start_minute)
    for d in detections:
        s = scores.setdefault(d.detector, DetectorScore(d.detector, simulated_minutes=simulated_minutes))
        s.detections += 1
        if any(_hits(d, i, grace_minutes) for i in incidents):
            continue
        if any(_overlaps(d, i, grace_minutes) for i in incidents):
            s.explained += 1
        else:
            s.false_alerts += 1
    return scores


def merge(scores: list[dict[str, DetectorScore]]) -> dict[str, DetectorScore]:
    """Several scenarios' scores per detector, added up (minutes too, for the daily rate)."""
    out: dict[str, DetectorScore] = {}
    for per in scores:
        for name, s in per.items():
            m = out.setdefault(name, DetectorScore(name))
            m.incidents += s.incidents
            m.hit += s.hit
            m.detections += s.detections
            m.false_alerts += s.false_alerts
            m.explained += s.explained
            m.delays_minutes += s.delays_minutes
            m.simulated_minutes += s.simulated_minutes
    return out
