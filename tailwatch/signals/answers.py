"""What the signal API answers and accepts, as typed msgspec Structs.

The live view (signals/live.py) builds each answer once as one of these, and the worker
encodes each once to the JSON clients receive (signals/served.py), which the handlers in
`signals/api.py` hand out as it is. The OpenAPI document is generated from these types by
the routes of `signals/routes.py`, so the document cannot drift from the answers. The answers forbid unknown fields: a field the view adds and this module
does not know raises where the view is built, rather than vanishing from the API.

Optional details that are absent from an answer (not null: absent) are `UNSET` and left out
of the JSON.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

# A pool, model, version or SLO name in a path.
Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@+-]+$",
                           description="letters, digits and . _ : @ + -, 1 to 128 characters")]
FlaggerCheck = Annotated[Literal["confirm-rollout", "pre-rollout", "rollout", "confirm-traffic-increase", "confirm-promotion",
                                  "post-rollout", "rollback"],
                         Meta(description="the Flagger hook type this URL serves (`event` has a route of its own)")]

Timestamp = Annotated[str, Meta(description="RFC 3339, UTC, event time")]
# stale: the data stopped moving; starting: no view yet; no_data: nothing to answer from (a
# version without traffic, a pool input empty in its window); behind: an input is not read
# to its end yet (a backlog), so what the view holds of it is old.
Reason = Literal["stale", "starting", "no_data", "behind"]
CapacityBasis = Literal["physical", "breach", "measured-above-physical", "configured", "policy-default"]
VerdictName = Literal["promote", "continue", "pause", "rollback"]
MetricVerdictName = Literal["pass", "continue", "pause", "rollback"]
Number = Union[float, None]
DataAge = Annotated[float, Meta(description="seconds since this side's data last moved, on the serving replica's "
                                            "clock; past the staleness bound the answer is stale")]


class ApiError(Struct, omit_defaults=True):
    """Every answer other than 2xx (and 412 from Flagger hooks)."""

    error: str
    reason: Reason | None = None
    as_of: Timestamp | None = None
    hint: str | None = None
    data_age_s: DataAge | None = None  # a stale rollout answer: the age of its older side


class Capacity(Struct, forbid_unknown_fields=True):
    """Per-replica capacity at SLO and the bounds it was chosen from."""

    per_replica_gpu_s_per_s: float
    lower_gpu_s_per_s: Number
    upper_gpu_s_per_s: float
    physical_gpu_s_per_s: Number
    broke_gpu_s_per_s: Number
    basis: CapacityBasis
    reason: str


class PoolSignalsAnswer(Struct, forbid_unknown_fields=True):
    """The signals one autoscale decision read, over `window_minutes` complete minutes."""

    requests_per_s: float
    work_gpu_s_per_s: float
    tokens_per_s: float
    prompt_tokens_per_s: Number
    audio_seconds_per_s: float
    active_streams: int
    queue_age_p95_ms: Number
    first_output_p95_ms: Number
    first_output_slo_ms: Number
    kv_cache_usage_max: Number
    gpu_util_mean_pct: Annotated[Number, Meta(description="NVML utilisation: reported, not used to scale")]
    sm_active_mean_pct: Number
    replicas_by_state: dict[str, int]
    burn_rate: Annotated[Number, Meta(description="the fastest page window of the pool's SLOs")]
    capacity_gpu_s_per_s_per_replica: float
    capacity_basis: CapacityBasis
    utilization_of_capacity: Number
    planning_target_utilization: float
    window_minutes: int
    model: str | UnsetType = UNSET
    zone: str | UnsetType = UNSET
    workload: str | UnsetType = UNSET
    traffic_class: str | UnsetType = UNSET


class Autoscale(Struct, forbid_unknown_fields=True):
    """Desired replicas for a pool. Point KEDA's metrics-api `valueLocation` at
    `desired_replicas` with `targetValue: 1`."""

    pool: str
    desired_replicas: Annotated[int, Meta(ge=0)]
    current_replicas: Annotated[int, Meta(ge=0, description="warm, loading and unknown replicas in the newest minute")]
    reasons: list[str]
    signals: PoolSignalsAnswer
    capacity_basis: Annotated[CapacityBasis, Meta(description="which bound decided the per-replica capacity")]
    capacity: Capacity
    as_of: Timestamp


class InputAbsent(Struct, forbid_unknown_fields=True):
    """A pool answer (autoscale, shed) not given: an input it reads holds nothing in its window."""

    pool: str
    input: Literal["requests", "gpu"]
    reason: str
    as_of: Timestamp


class ShedStep(Struct, forbid_unknown_fields=True):
    """One rung of the degradation ladder, in the policy's order."""

    step: Literal["delay_batch", "shed_over_quota", "shorten_context", "reduce_retrieval_depth",
                  "route_to_smaller_model", "disable_premium_effects", "reject_low_priority"]
    action: str
    load_removed_gpu_s_per_s: Annotated[float, Meta(description="demand this step would remove")]
    share_of_demand: float
    still_over_gpu_s_per_s: Annotated[float, Meta(description="demand left over capacity after this and the steps before")]
    enough: Annotated[bool, Meta(description="the first step after which the demand fits: take the steps up to here")]
    basis: Annotated[str, Meta(description="measured, estimated or configured, and from what")]


class AdmittedGroup(Struct, forbid_unknown_fields=True):
    """One tenant and traffic class in the next interval's admission plan."""

    tenant: str
    traffic_class: str
    priority: int
    requests: Annotated[int, Meta(description="expected in the interval, at the measured rate")]
    cost_gpu_s: Annotated[float, Meta(description="GPU-seconds per request, measured")]
    admitted: int
    rejected: int


class AdmissionPlan(Struct, forbid_unknown_fields=True):
    """Seed 000's admission: higher priority first, within a priority the cheaper request
    first, ties by a stable id; a request that does not fit is rejected and the rest go on."""

    interval_s: int
    capacity_gpu_s: Annotated[float, Meta(description="measured capacity × the interval")]
    retry_after_s: Annotated[int, Meta(description="what a rejected client is told (Retry-After)")]
    groups: list[AdmittedGroup]


class Shed(Struct, forbid_unknown_fields=True):
    """How a pool should degrade, in order, with the load each step frees; and who is admitted."""

    pool: str
    under_pressure: bool
    pressure: list[str]
    demand_gpu_s_per_s: float
    capacity_gpu_s_per_s: Annotated[float, Meta(description="per-replica capacity × serving (warm) replicas; loading ones serve nothing")]
    steps: list[ShedStep]
    admission: AdmissionPlan
    as_of: Timestamp


class Side(Struct, forbid_unknown_fields=True):
    """One side of a canary comparison over the rollout window."""

    version: str
    requests: int
    bad: Annotated[int, Meta(description="errors and timeouts")]
    timeouts: int
    first_output_p99_ms: Number
    e2e_p99_ms: Number
    gpu_cost: Annotated[float, Meta(description="currency units over the window")]
    output_tokens: int
    audio_seconds: float
    error_ratio: Number
    timeout_ratio: Number
    cost_per_unit: Number
    cost_unit: str
    inter_token_p99_ms: Annotated[Number, Meta(description="LLM streams: p99 of the mean gap between tokens per answer")] = None
    successful_audio_seconds: Annotated[float, Meta(description="audio of ok attempts (speech)")] = 0.0
    underrun_reported: Annotated[int, Meta(description="TTS streams that reported underruns")] = 0
    underrun_streams: Annotated[int, Meta(description="TTS streams with at least one underrun")] = 0


class WerSlice(Struct, omit_defaults=True, forbid_unknown_fields=True):
    """One language slice of the WER gate: each side's word error rate and evidence."""

    verdict: Literal["pass", "continue", "pause", "rollback", "unjudged", "insufficient"]
    canary_wer: Number
    stable_wer: Number
    canary_evaluations: int
    stable_evaluations: int
    canary_words: int
    stable_words: int
    overdispersion: float | UnsetType = UNSET
    p_value_worse_than_stable: Number | UnsetType = UNSET
    alpha: float | UnsetType = UNSET
    detectable_factor: Annotated[float, Meta(description="the canary ÷ stable WER a pass must have been able to show")] \
        | UnsetType = UNSET
    evidence_needed: Annotated[str, Meta(description="insufficient: how much more canary evidence a judgement needs")] \
        | UnsetType = UNSET


class MetricAnswer(Struct, omit_defaults=True, forbid_unknown_fields=True):
    """One metric's verdict (Kayenta-style): the method and the numbers it acted on."""

    verdict: MetricVerdictName
    reason: str
    p_value: Number
    method: str | UnsetType = UNSET
    alpha: float | UnsetType = UNSET
    # the power rule: a pass needs the data to have been able to show this canary ÷ stable factor
    detectable_factor: float | UnsetType = UNSET
    evidence: Annotated[Literal["insufficient"], Meta(description="no harm seen, on too little data to call it a pass")] \
        | UnsetType = UNSET
    evidence_needed: Annotated[str, Meta(description="how much more canary evidence a pass needs")] | UnsetType = UNSET
    # errors (sequential test)
    p_value_worse_than_stable: Number | UnsetType = UNSET
    rate_ratio: float | UnsetType = UNSET
    canary_error_ratio: Number | UnsetType = UNSET
    stable_error_ratio: Number | UnsetType = UNSET
    canary_burn_rate: Number | UnsetType = UNSET
    # burn rate
    short_burn_rate: Number | UnsetType = UNSET
    long_burn_rate: Number | UnsetType = UNSET
    short_requests: int | UnsetType = UNSET
    long_requests: int | UnsetType = UNSET
    stable_short_burn_rate: Number | UnsetType = UNSET
    short_minutes: int | UnsetType = UNSET
    long_minutes: int | UnsetType = UNSET
    threshold: float | UnsetType = UNSET
    # latency (first_output, e2e, inter_token)
    p_value_rank: Number | UnsetType = UNSET
    p_value_tail: Number | UnsetType = UNSET
    auc: Number | UnsetType = UNSET
    p50_ratio: Number | UnsetType = UNSET
    p99_ratio: Number | UnsetType = UNSET
    canary_p99_ms: Number | UnsetType = UNSET
    stable_p99_ms: Number | UnsetType = UNSET
    canary_values: int | UnsetType = UNSET  # values each side had, when too few to judge
    stable_values: int | UnsetType = UNSET
    # latency and cost
    minutes: int | list[int] | UnsetType = UNSET
    # cost
    ratio: Number | UnsetType = UNSET
    lower: Number | UnsetType = UNSET
    upper: Number | UnsetType = UNSET
    confidence: Number | UnsetType = UNSET
    # word error rate by language (wer): each slice, the global figures, the languages that decided
    slices: dict[str, WerSlice] | UnsetType = UNSET
    global_canary_wer: Number | UnsetType = UNSET
    global_stable_wer: Number | UnsetType = UNSET
    languages: list[str] | UnsetType = UNSET
    # underruns (TTS): streams that reported, and the share with at least one underrun
    canary_streams: int | UnsetType = UNSET
    stable_streams: int | UnsetType = UNSET
    canary_underrun_ratio: Number | UnsetType = UNSET
    canary_underrun_ratio_upper: Number | UnsetType = UNSET  # its 95% upper bound, once judged for a pass
    stable_underrun_ratio: Number | UnsetType = UNSET


class Verdict(Struct, omit_defaults=True, forbid_unknown_fields=True):
    """A canary version against its model's stable version."""

    verdict: VerdictName
    reasons: list[str]
    model: str
    version: str
    window_minutes: int
    as_of: Timestamp | None
    canary: Side | UnsetType = UNSET  # absent for the stable version itself
    stable: Side | UnsetType = UNSET
    metrics: dict[str, MetricAnswer] | UnsetType = UNSET  # errors, burn_rate, first_output, e2e, inter_token, cost, wer, underruns
    decided_by: list[str] | UnsetType = UNSET
    confidence: Annotated[Number, Meta(description="1 − the p-value a pause or rollback acted on")] | UnsetType = UNSET
    # How fresh the verdict is: the older side's age (what the staleness bound judges), and each side's.
    data_age_s: DataAge | UnsetType = UNSET
    canary_data_age_s: DataAge | UnsetType = UNSET  # absent for the stable version itself
    stable_data_age_s: DataAge | UnsetType = UNSET


class Inconclusive(Struct):
    """No verdict for want of data: never an error a rollout controller counts."""

    verdict: Literal["inconclusive"]
    reason: Reason
    error: str
    model: str
    version: str
    data_age_s: DataAge | None = None  # stale: the age of the verdict's older side


class SloSlice(Struct, forbid_unknown_fields=True):
    labels: dict[str, str]
    sli: Annotated[Number, Meta(description="good ÷ valid over the compliance window, undecided events counted bad")]
    error_budget_remaining: float
    burn_rates: Annotated[dict[str, float], Meta(description="window (5m, 1h, ...) → burn rate")]
    minutes_to_exhaustion: Number
    firing: list[str]
    as_of: Timestamp | None
    sli_upper: Annotated[Number, Meta(description="the SLI with undecided events (known only as a runtime bucket "
                                                  "straddling the threshold) counted good; = sli where none is")] = None
    undecided_events: Annotated[int, Meta(description="valid events over the compliance window neither proven good "
                                                      "nor bad")] = 0


class Slo(Struct, forbid_unknown_fields=True):
    name: str
    description: str
    objective: float
    window: str
    slice_by: list[str]
    selector: dict[str, str]
    slices: list[SloSlice]


class SloList(Struct):
    slos: list[Slo]


class Alert(Struct, forbid_unknown_fields=True):
    fingerprint: str | None
    alertname: str
    severity: str
    slo: str
    window: str
    labels: dict[str, str]
    since: Timestamp
    runbook: str
    detail: Annotated[str, Meta(description="who holds the bad events at the minute it fired: label values "
                                            "with their share of them and of the traffic")] | UnsetType = UNSET


class AlertList(Struct):
    alerts: list[Alert]


class Readiness(Struct):
    ready: bool
    reason: str


class FlaggerMetadata(Struct):
    model: Name
    version: Name
    token: Annotated[str, Meta(description="Flagger sends no headers: the bearer token may come here")] | None = None


class FlaggerEventMetadata(Struct, rename="camel", frozen=True):
    event_message: Annotated[str, Meta(max_length=4096)] = ""
    event_type: Annotated[str, Meta(max_length=64, description="Normal or Warning")] = ""
    timestamp: Annotated[str, Meta(max_length=32, description="epoch milliseconds, as Flagger writes it")] = ""


class FlaggerEventPayload(Struct):
    """The body of a Flagger `event` webhook: the canary, its phase, and the event Flagger
    recorded (its own metadata replaces the Canary's webhook metadata, so no token comes)."""

    name: Annotated[str, Meta(max_length=253)] = ""
    namespace: Annotated[str, Meta(max_length=63)] = ""
    phase: Annotated[str, Meta(max_length=32)] = ""
    metadata: FlaggerEventMetadata = FlaggerEventMetadata()


class FlaggerEventCounted(Struct):
    """An event is counted by phase and type (conventions.FLAGGER_EVENTS_TOTAL), never logged:
    the hook takes no token, so anyone who can reach it could otherwise fill the log."""

    counted: bool
    phase: str
    event_type: str


class FlaggerPayload(Struct):
    """The body of a Flagger webhook; the Canary's webhook `metadata` names the model and version."""

    metadata: FlaggerMetadata
    name: str | None = None
    namespace: str | None = None
    phase: str | None = None


def _plain(value):
    """NumPy scalars (the statistics hand some back) as the Python numbers they hold."""
    if hasattr(value, "item") and hasattr(value, "dtype"):
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__}")


_TO_JSON = msgspec.json.Encoder(enc_hook=_plain)


def typed(answer: dict, kind: type[Struct]) -> Struct:
    """A view's mapping as its answer type, through JSON so NumPy scalars read as numbers
    (an int for a float field is fine; a missing required field is a bug in the view and
    raises)."""
    return msgspec.json.decode(_TO_JSON.encode(answer), type=kind)
