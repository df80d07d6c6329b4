"""SLO specifications: the YAML format, the OpenSLO v1 import, and their validation.

`load_slos(path)` returns typed `SloSpec`s or raises `SpecErrors`, which lists every
problem with its place (`slos[2].objective: …`) so that `tailwatch slo check` can name
them all at once.

    slos:
      - name: llm-realtime-first-token
        description: First token within 800 ms for realtime LLM chat
        selector: {workload: llm, traffic_class: realtime}
        sli: {latency: {field: first_output_ms, threshold: 800ms}}
        objective: 99%
        window: 30d            # rolling; or calendar-month
        slice_by: [zone, model_version]
        min_events: 50         # per alert window, for low-traffic slices
        no_data_after: 10m     # a slice silent this long raises SLONoData
        young_window_share: 8.33%  # an alert window is judged once the slice's history covers this share of it
        runbook: runbooks/slo-burn.md
        alert_windows: default # or a list of {name, severity, budget_share, long, short}

SLIs, over the buckets of `sli_minute`:
- availability: good = `ok`; valid = every attempt except client cancellations
  (`cancelled` is the client's choice, not a failure of the service) and refusals for the
  tenant's quota or rate limit (`rejected_quota`: the tenant's doing; overload shedding
  still counts as bad).
- latency: good = values of `field` (`queue_ms`, `first_output_ms`, `e2e_ms`) at or under
  `threshold`; valid = attempts with a value. Exact when the threshold is a histogram
  bin bound; otherwise the bin holding the threshold counts as bad (conservative).
- goodput: good = latency-good values of `field`; valid = attempts except cancellations,
  so an error counts against it like a slow answer.
- stream_completion: good = streams that ended normally (`finish_reason` stop, length or
  content_filter); valid = streams except those the client cancelled. A stream the server
  cut or that timed out is bad even when its HTTP status was 200.
- stage_budget: a latency SLI on the turn (`field`, `threshold`) whose target is split into
  per-phase budgets (`budgets: {asr_final: 300ms, ...}`, adding up to at most the
  threshold); when it burns, the alert names the phase that overspent its share most
  (slo/turn_phases.py).
- underrun_free: good = TTS streams that played without a buffer underrun; valid = streams
  that reported underruns (`underrun_reported`).
- endpointing: good = ASR turns whose endpoint was right; valid = turns that reported it.
- word_accuracy: valid = reference words of the sampled evaluations (eval.v1), good = those
  words less the word errors (per bucket, never below 0). Its error ratio is the WER of
  the slice, a ratio of sums (never an average of per-request WERs), so an objective of 92%
  reads "WER at most 8%" and the burn rate is WER ÷ 8%.
- quota_admission: good = attempts not refused for the tenant's quota or rate limit
  (`rejected_quota`); valid = attempts except client cancellations. Sliced by tenant, its
  error ratio is the tenant's quota rejection rate: a signal for whoever sizes quotas, apart
  from availability (overload shedding is availability's, not this SLI's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import polars as pl
import yaml
from msgspec import UNSET, Meta, UnsetType

from tailwatch.conventions import CLOSED_LABELS, LATENCY_FIELDS, SLICE_LABELS, PHASE_NAMES
from tailwatch.config import ConfigStruct, PositiveCount, every_problem, parse_duration_s, read_text, yaml_problem
from tailwatch.slo.runtime_buckets import split_buckets
from tailwatch.slo.alert_windows import YOUNG_SHARE, AlertWindow, catalog_for, catalog_periods, reachable

SLI_KINDS = ("availability", "latency", "goodput", "stream_completion", "stage_budget", "underrun_free", "endpointing",
             "word_accuracy", "quota_admission")
# Kinds counted from the bucket's count columns alone (no latency histogram).
COUNT_KINDS = ("availability", "stream_completion", "underrun_free", "endpointing", "word_accuracy", "quota_admission")
# Kinds over a field only some runtimes report: a bucket whose requests did not report it is
# not the SLO's (no slice, no status row, no no-data alert).
REPORTED_KINDS = ("underrun_free", "endpointing", "word_accuracy")


@dataclass(frozen=True)
class SloSpec:
    name: str
    description: str
    selector: dict[str, str]
    sli_kind: str
    objective: float  # a ratio in (0, 1)
    period_minutes: int  # the SLO period (rolling); calendar months use 30 days for alerting
    calendar_month: bool
    slice_by: tuple[str, ...]
    alert_windows: tuple[AlertWindow, ...]
    min_events: int = 1
    no_data_minutes: int = 10
    latency_field: str | None = None
    threshold_ms: float | None = None
    runbook: str = "runbooks/slo-burn.md"
    phase_budgets_ms: tuple[tuple[str, float], ...] = ()  # stage_budget: (phase, budget) in pipeline order
    young_share: float = YOUNG_SHARE  # a window is judged once the slice's history covers this share of it

    def selected(self, buckets: pl.DataFrame) -> pl.DataFrame:
        """The buckets that the selector picks (one filter: each costs alike on a thin minute)."""
        if not self.selector:
            return buckets
        return buckets.filter(*(pl.col(label) == value for label, value in self.selector.items()))


@dataclass
class SpecErrors(Exception):
    problems: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "; ".join(self.problems)


DEFAULT_SLOS = Path(__file__).with_name("defaults.yaml")


def _objective(value: Any) -> float | None:
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return round(float(value.strip()[:-1]) / 100, 12)
        except ValueError:
            return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(float(value) / 100, 12) if value > 1 else float(value)
    return None


@dataclass(frozen=True)
class SloFileRead:
    """An SLO file as read: the SLOs without problems, every problem with its place, and
    (place, name, runbook) of every entry that could be read at all."""

    specs: list[SloSpec]
    problems: list[str]
    entries: list[tuple[str, str, str]]


def load_slos(path: str | Path) -> list[SloSpec]:
    read = read_slos(path)
    if read.problems:
        raise SpecErrors(read.problems)
    return read.specs


def read_slos(path: str | Path) -> SloFileRead:
    """Every SLO and every problem of the file at once (`tailwatch slo check`)."""
    p = Path(path)
    try:
        docs = [d for d in yaml.safe_load_all(read_text(p, ValueError)) if d is not None]
    except ValueError as exc:
        return SloFileRead([], [str(exc)], [])
    except yaml.YAMLError as exc:
        return SloFileRead([], [yaml_problem(exc)], [])
    if not docs:
        return SloFileRead([], ["no SLOs (the file is empty)"], [])
    errors: list[str] = []
    specs: list[SloSpec] = []
    seen: list[tuple[str, str, str]] = []
    for di, doc in enumerate(docs):
        if isinstance(doc, dict) and doc.get("apiVersion", "").startswith("openslo/"):
            spec = _from_openslo(doc, f"{p.name}[doc {di}]", errors, seen)
            if spec:
                specs.append(spec)
        elif isinstance(doc, dict) and isinstance(doc.get("slos"), list):
            for i, raw in enumerate(doc["slos"]):
                spec = _from_native(raw, f"slos[{i}]", errors, seen)
                if spec:
                    specs.append(spec)
        else:
            errors.append(f"{p.name}[doc {di}]: expected a `slos:` list or an OpenSLO `kind: SLO` document")
    names = [name for _, name, _ in seen]
    for n in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"slo {n!r}: defined more than once")
    return SloFileRead(specs, errors, seen)


class AvailabilitySli(ConfigStruct):
    """Good: `ok`; valid: every attempt except client cancellations."""


class LatencySli(ConfigStruct):
    field: Literal[LATENCY_FIELDS]
    threshold: str | float  # a duration with its unit: 300ms, 1.5s


class StreamCompletionSli(ConfigStruct):
    """Good: streams that ended normally; valid: streams except client cancellations."""


class UnderrunFreeSli(ConfigStruct):
    """Good: TTS streams without an underrun; valid: streams that reported underruns."""


class EndpointingSli(ConfigStruct):
    """Good: ASR turns endpointed right; valid: turns that reported endpointing."""


class WordAccuracySli(ConfigStruct):
    """Good: evaluated reference words not in error; valid: evaluated reference words (1 − WER)."""


class QuotaAdmissionSli(ConfigStruct):
    """Good: attempts not refused for the tenant's quota or rate limit; valid: attempts except cancellations."""


class PhaseBudgetSli(ConfigStruct):
    threshold: str | float  # the turn's target
    budgets: dict[Literal[PHASE_NAMES], str | float]  # phase → its share of the target, a duration
    field: Literal[LATENCY_FIELDS] = "first_output_ms"


class SliEntry(ConfigStruct):
    availability: AvailabilitySli | None | UnsetType = UNSET
    latency: LatencySli | UnsetType = UNSET
    goodput: LatencySli | UnsetType = UNSET
    stream_completion: StreamCompletionSli | None | UnsetType = UNSET
    stage_budget: PhaseBudgetSli | UnsetType = UNSET
    underrun_free: UnderrunFreeSli | None | UnsetType = UNSET
    endpointing: EndpointingSli | None | UnsetType = UNSET
    word_accuracy: WordAccuracySli | None | UnsetType = UNSET
    quota_admission: QuotaAdmissionSli | None | UnsetType = UNSET

    def __post_init__(self):
        if sum(getattr(self, k) is not UNSET for k in SLI_KINDS) != 1:
            raise ValueError(f"expected exactly one of {', '.join(SLI_KINDS)}")


class AlertWindowEntry(ConfigStruct):
    long: str
    budget_share: Annotated[float, Meta(gt=0.0, le=1.0, description="a fraction of the budget in (0, 1]")]
    short: str | None = None  # default: long ÷ 12
    severity: Literal["page", "ticket"] = "page"
    name: str | None = None


class SloEntry(ConfigStruct):
    """One SLO as written in a `slos:` list (see the module doc)."""

    name: Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", description="lower-case letters, digits, - and _")]
    sli: SliEntry
    objective: str | float  # 99.9% or 0.999
    description: str = ""
    selector: dict[str, str] = {}
    slice_by: list[str] = []
    window: str = "30d"  # rolling, or calendar-month
    min_events: PositiveCount = 1
    no_data_after: str = "10m"
    runbook: str = "runbooks/slo-burn.md"
    alert_windows: Literal["default"] | list[AlertWindowEntry] = "default"
    young_window_share: str | float = YOUNG_SHARE  # judge a window once the slice's history covers this share of it


# Stand-ins for required fields that are missing or wrong, so that the other fields' checks
# still run and one `slo check` lists every problem; an entry using one is never returned.
_STAND_INS = {"name": "x", "sli": {"availability": {}}, "objective": 0.99}


def _salvaged(raw: dict, problems: list[str], where: str) -> SloEntry | None:
    """The entry with its refused fields left out (stand-ins for required ones), or None."""
    if not isinstance(raw, dict):
        return None
    bad = {p[len(where) + 1:].split(":")[0].split(".")[0].split("[")[0] for p in problems if p.startswith(where + ".")}
    known = {f.encode_name for f in msgspec.structs.fields(SloEntry)}
    kept = {k: v for k, v in raw.items() if k in known and k not in bad}
    try:
        return msgspec.convert({**{k: v for k, v in _STAND_INS.items() if k not in kept}, **kept}, SloEntry)
    except msgspec.ValidationError:
        return None


def _from_native(raw: Any, where: str, errors: list[str],
                 seen: list[tuple[str, str, str]] | None = None) -> SloSpec | None:
    """The SLO in `raw`, or None with every problem of it appended to `errors`; `seen` gets
    (place, name, runbook) of every entry that could be read at all, for checks over files."""
    problems = every_problem(raw, SloEntry, where)
    errors.extend(problems)
    e = _salvaged(raw, problems, where) if problems else msgspec.convert(raw, SloEntry)
    if e is None:
        return None
    if seen is not None:
        seen.append((where, raw.get("name") if isinstance(raw.get("name"), str) else where, e.runbook))
    before = len(errors) - len(problems)
    for label, value in e.selector.items():
        if label not in SLICE_LABELS:
            errors.append(f"{where}.selector.{label}: unknown label (known: {', '.join(SLICE_LABELS)})")
        elif label in CLOSED_LABELS and value not in CLOSED_LABELS[label]:
            errors.append(f"{where}.selector.{label}: unknown value {value!r} (known: {', '.join(CLOSED_LABELS[label])}); "
                          "it would select nothing")
    for label in e.slice_by:
        if label not in SLICE_LABELS:
            errors.append(f"{where}.slice_by: unknown label {label!r} (known: {', '.join(SLICE_LABELS)})")
    kind = next(k for k in SLI_KINDS if getattr(e.sli, k) is not UNSET)
    latency_field, threshold_ms, budgets = None, None, ()
    if kind in ("latency", "goodput", "stage_budget"):
        body = getattr(e.sli, kind)
        latency_field = body.field
        secs = parse_duration_s(body.threshold)
        if secs is None:
            errors.append(f"{where}.sli.{kind}.threshold: {body.threshold!r} needs a unit, e.g. 300ms or 1.5s")
        elif secs <= 0:
            errors.append(f"{where}.sli.{kind}.threshold: must be positive")
        else:
            threshold_ms = round(secs * 1000, 9)
        if kind == "goodput" and latency_field != "first_output_ms":
            # Only first output is recorded for successful attempts alone, so only it
            # can tell "succeeded and fast" from the buckets.
            errors.append(f"{where}.sli.goodput.field: goodput is defined over first_output_ms")
    if kind == "stage_budget":
        budgets = _phase_budgets(e.sli.stage_budget, threshold_ms, f"{where}.sli.stage_budget", errors)
    objective = _objective(e.objective)
    if objective is None:
        errors.append(f"{where}.objective: expected a percentage such as 99.9% or a ratio such as 0.999")
    elif not 0 < objective < 1:
        errors.append(f"{where}.objective: {e.objective} must be above 0% and below 100%")
    calendar = e.window == "calendar-month"
    period_s = 30 * 86400 if calendar else parse_duration_s(e.window)
    if period_s is None:
        errors.append(f"{where}.window: {e.window!r} is not a duration (28d, 30d) or calendar-month")
        period_s = 30 * 86400
    period_minutes = int(period_s // 60)
    windows = _alert_windows(e.alert_windows, period_minutes, f"{where}.alert_windows", errors)
    for w in windows:
        if w.long_minutes > period_minutes:
            errors.append(f"{where}.window: {e.window} is shorter than alert window {w.name} ({w.long_minutes} min)")
    if objective is not None and 0 < objective < 1:
        if e.alert_windows == "default" or not e.alert_windows:
            windows = tuple(reachable(w, period_minutes, objective) for w in windows)
        for w in windows:
            needed = w.error_ratio_needed(period_minutes, objective)
            if needed >= 1:
                errors.append(f"{where}.alert_windows: SLO {e.name}, window {w.name} can never fire: it needs an "
                              f"error ratio above {needed:.1%} (burn factor {w.factor(period_minutes):g} × error "
                              f"budget {1 - objective:.3g}); lower its budget_share or lengthen its long window")
    young_share = _objective(e.young_window_share)
    if young_share is None or not 0 <= young_share <= 1:
        errors.append(f"{where}.young_window_share: a share of a window's span from 0% to 100%")
    no_data_s = parse_duration_s(e.no_data_after)
    if no_data_s is None or no_data_s < 60:
        errors.append(f"{where}.no_data_after: a duration of at least 1m")
        no_data_s = 600
    if len(errors) > before:
        return None
    return SloSpec(
        no_data_minutes=int(no_data_s // 60),
        name=e.name, description=e.description, selector=dict(e.selector),
        sli_kind=kind, objective=objective, period_minutes=period_minutes, calendar_month=calendar,  # type: ignore[arg-type]
        slice_by=tuple(e.slice_by), alert_windows=windows, min_events=e.min_events, latency_field=latency_field,
        threshold_ms=threshold_ms, runbook=e.runbook, phase_budgets_ms=budgets, young_share=young_share,  # type: ignore[arg-type]
    )


def _phase_budgets(body: PhaseBudgetSli, threshold_ms: float | None, where: str,
                   errors: list[str]) -> tuple[tuple[str, float], ...]:
    """(phase, budget ms) in pipeline order (PHASE_NAMES); the shares may not exceed the target."""
    out = []
    for phase in sorted(body.budgets, key=PHASE_NAMES.index):
        secs = parse_duration_s(body.budgets[phase])
        if secs is None or secs <= 0:
            errors.append(f"{where}.budgets.{phase}: {body.budgets[phase]!r} is not a positive duration such as 300ms")
            continue
        out.append((phase, round(secs * 1000, 9)))
    if not body.budgets:
        errors.append(f"{where}.budgets: name at least one stage and its share of the target")
    total = sum(ms for _, ms in out)
    if threshold_ms is not None and total > threshold_ms * (1 + 1e-9):
        errors.append(f"{where}.budgets: the stages' shares add up to {total:g} ms, more than the turn's target "
                      f"of {threshold_ms:g} ms")
    return tuple(out)


def _alert_windows(entries: str | list[AlertWindowEntry], period_minutes: int, where: str,
                   errors: list[str]) -> tuple[AlertWindow, ...]:
    if entries == "default" or not entries:
        catalog = catalog_for(period_minutes)
        if catalog is None:
            errors.append(f"{where}: no alert window catalog for a {period_minutes // 1440 or period_minutes}"
                          f"{'d' if period_minutes >= 1440 else ' min'} SLO period (catalogs: "
                          f"{', '.join(catalog_periods())}, in slo/catalogs/); list alert_windows for it")
            return ()
        return catalog
    out = []
    for i, w in enumerate(entries):
        at = f"{where}[{i}]"
        long_s, short_s = parse_duration_s(w.long), parse_duration_s(w.short) if w.short is not None else None
        if long_s is None:
            errors.append(f"{at}.long: a duration such as 1h")
            continue
        if w.short is not None and short_s is None:
            errors.append(f"{at}.short: a duration such as 5m")
            continue
        if short_s is None:
            short_s = long_s / 12
        if short_s > long_s:
            errors.append(f"{at}.short: {w.short} is longer than its long window {w.long}")
        out.append(AlertWindow(w.name or f"window-{i}", w.severity, float(w.budget_share),
                               max(1, int(long_s // 60)), max(1, int(short_s // 60))))
    return tuple(out) or (catalog_for(period_minutes) or ())


def _from_openslo(doc: dict, where: str, errors: list[str],
                  seen: list[tuple[str, str, str]] | None = None) -> SloSpec | None:
    """OpenSLO v1 `kind: SLO` with an inline ratio or threshold indicator over our fields.

    ratioMetric: good/total (or bad/total) queries name our counters (`ok`, `requests`,
    `errors`, `timeouts`); thresholdMetric: a `<latency field> <= <threshold>` query.
    """
    if doc.get("kind") != "SLO":
        errors.append(f"{where}.kind: only `SLO` documents are read (got {doc.get('kind')!r})")
        return None
    meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    ind = (spec.get("indicator") or {}).get("spec") or {}
    objectives = spec.get("objectives") or [{}]
    obj = objectives[0]
    raw: dict[str, Any] = {
        "name": meta.get("name"),
        "description": spec.get("description", meta.get("displayName", "")),
        "objective": obj.get("target"),
        "selector": (meta.get("labels") or {}),
    }
    tw = spec.get("timeWindow") or [{}]
    tw0 = tw[0] if tw else {}
    if tw0.get("isRolling", True):
        raw["window"] = tw0.get("duration", "30d")
    else:
        raw["window"] = "calendar-month"
    if "ratioMetric" in ind:
        raw["sli"] = {"availability": {}}
    elif "thresholdMetric" in ind:
        q = str(((ind["thresholdMetric"].get("metricSource") or {}).get("spec") or {}).get("query", ""))
        m = re.match(r"^\s*(\w+)\s*<=\s*(\S+)\s*$", q)
        if not m:
            errors.append(f"{where}.spec.indicator.thresholdMetric: query must read `<field> <= <threshold>`")
            return None
        raw["sli"] = {"latency": {"field": m.group(1), "threshold": m.group(2)}}
        raw["objective"] = obj.get("target")
    else:
        errors.append(f"{where}.spec.indicator: a ratioMetric or thresholdMetric is required")
        return None
    labels = raw["selector"]
    raw["selector"] = {k: v for k, v in labels.items() if k in SLICE_LABELS}
    return _from_native(raw, where, errors, seen)


def spec_warnings(spec: SloSpec) -> list[str]:
    """What `slo check` and the worker say about an SLO that loads but does not read as
    written: a window capped to stay reachable (`slo.alert_windows.reachable`), and a latency
    threshold strictly inside a bucket of a runtime's default histogram (`slo.runtime_buckets`)."""
    out = []
    if spec.latency_field is not None and spec.threshold_ms is not None:
        for split in split_buckets(spec.latency_field, spec.threshold_ms, spec.selector.get("workload")):
            out.append(f"SLO {spec.name}: its threshold {_seconds(spec.threshold_ms)} falls between the bucket bounds "
                       f"{_seconds(split.lower_ms)} and {_seconds(split.upper_ms)} of {split.histogram.runtime}'s "
                       f"{split.histogram.metric}: for a fleet scraped from it, requests in that bucket are undecided "
                       f"(neither proven good nor bad), so its SLI is a range and pages count only proven bad "
                       f"requests; set the threshold on a bound for one number")
    for w in spec.alert_windows:
        if w.max_factor is not None:
            uncapped = w.budget_share * spec.period_minutes / w.long_minutes
            out.append(f"SLO {spec.name}, window {w.name}: the catalog's burn factor {uncapped:g} would need an error "
                       f"ratio above {uncapped * (1 - spec.objective):.1%}, which can never happen; capped at "
                       f"{w.factor(spec.period_minutes):g} (fires above an error ratio of "
                       f"{w.error_ratio_needed(spec.period_minutes, spec.objective):.0%})")
    return out


def _seconds(ms: float) -> str:
    return f"{ms / 1000:g} s"
