"""The wire contract: typed event schemas (`request.v1`, `gpu.v1`, `deploy.v1`).

Every field of the data contract (docs/data-contract.md) is declared here with its type and bounds; anything
else a producer sends is dropped at decode time (msgspec ignores unknown fields in the
lenient decoder), so prompts, transcripts and user identifiers cannot get past ingest.
Numbers carry an upper bound as well as a lower one: JSON has no NaN literal, and the
upper bound rejects `1e999` (infinity) and absurd values with the same check.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal, Optional, Union

import msgspec
from tailwatch.conventions import DEPLOYMENTS, TOPIC_DEPLOYS, TOPIC_GPU, TOPIC_REQUESTS, TRAFFIC_CLASSES, WORKLOADS

MAX_MS = 1e9  # about 11.6 days: beyond any request latency
# An OTLP counter's increase in one interval, over a whole fleet (ingest/otlp): not one request's.
MAX_COUNT = 10**12

# What one record can hold, physically. Past these a value is a unit error or garbage, and the
# record is one `out_of_range` dead letter. They also bound every sum the worker keeps: the
# proof that no sum can wrap is in streams/aggregates.py (docs/data-contract.md, "Bounds").
MAX_REQUEST_SECONDS = MAX_MS / 1000  # the longest request: 10⁶ s
# GPUs that one request can hold: an NVL72 rack is 72, the widest expert-parallel deployments a
# few hundred; 1,024 leaves room. A request's GPU-seconds then stay below 1.024 × 10⁹ (in
# micro-seconds 1.024 × 10¹⁵ < 2⁵³: exact in a double, so its fixed-point cast rounds exactly).
MAX_REQUEST_GPUS = 1024
MAX_REQUEST_GPU_SECONDS = MAX_REQUEST_GPUS * MAX_REQUEST_SECONDS
MAX_REQUEST_AUDIO_SECONDS = MAX_REQUEST_SECONDS  # 11.6 days of audio: a longer recording is split into requests
MAX_RECORD_COUNT = 10**9  # tokens, revisions, underruns, errors, words: 100× the largest context window
MAX_GPU_BYTES = 2**50  # 1 PiB of device memory
MAX_GPU_WATTS = 1e5  # 100 kW: a whole 8-GPU node draws about 10 kW
MAX_CLOCK_MHZ = 1e5

NonNegMs = Annotated[float, msgspec.Meta(ge=0, le=MAX_MS)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=MAX_RECORD_COUNT)]
GpuSeconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_REQUEST_GPU_SECONDS)]
AudioSeconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_REQUEST_AUDIO_SECONDS)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_BYTES)]
Watts = Annotated[float, msgspec.Meta(ge=0, le=MAX_GPU_WATTS)]
MHz = Annotated[float, msgspec.Meta(ge=0, le=MAX_CLOCK_MHZ)]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
Pct = Annotated[float, msgspec.Meta(ge=0, le=100)]
Label = Annotated[str, msgspec.Meta(max_length=128)]
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# Event time a record may carry, as epoch milliseconds: from 2000-01-01 up to (not
# including) 2100-01-01 UTC. Outside it a record is refused at decode (`bad_timestamp`):
# no fleet reports from before 2000, and a year past 9999 cannot even be printed.
MIN_EVENT_TS_MS = 946_684_800_000
MAX_EVENT_TS_MS = 4_102_444_800_000
# RFC 3339 string or epoch milliseconds (the range is checked after parsing, for both).
Timestamp = Union[Annotated[int, msgspec.Meta(ge=MIN_EVENT_TS_MS, lt=MAX_EVENT_TS_MS)],
                  Annotated[str, msgspec.Meta(max_length=40)]]

Workload = Literal[WORKLOADS]
TrafficClass = Literal[TRAFFIC_CLASSES]
Deployment = Literal[DEPLOYMENTS]
Status = Literal["ok", "error", "timeout", "shed", "cancelled"]
ReplicaState = Literal["warm", "loading", "cold", "draining"]
GpuSource = Literal["nvml", "runtime", "dcgm", "otlp"]
# How a stream ended: normally (stop, length, content_filter), or not (the client left, the
# server cut it, it timed out). A stream cut mid-answer can still have been an HTTP 200.
FinishReason = Literal["stop", "length", "content_filter", "client_cancel", "server_cut", "timeout"]
COMPLETED_FINISH = ("stop", "length", "content_filter")

# Language of the speech or text, as a BCP 47 tag (language, then up to two subtags: en,
# en-US, zh-Hant-TW); case-insensitive, kept lower-case. The pattern bounds its length and its
# alphabet, so a slice label cannot carry free text.
LanguageTag = Annotated[str, msgspec.Meta(pattern=r"^([A-Za-z]{2,3}(-[A-Za-z0-9]{2,8}){0,2})?$")]
# A TTS voice by its catalogue name or tier (`neutral`, `premium-2`): never a per-user cloned
# voice's id, which would identify a person. Short, and no spaces or free text.
VoiceName = Annotated[str, msgspec.Meta(pattern=r"^([a-z0-9][a-z0-9_.-]{0,47})?$")]
# Why a request was refused or failed, where the runtime knows: the tenant's quota or rate
# limit (the tenant's doing, not the service's), overload shedding, an out-of-memory failure.
StatusReason = Literal["quota", "rate_limit", "overload", "oom", "deadline", "upstream"]
QUOTA_REASONS = ("quota", "rate_limit")
# A TTS request that could not use its voice or model fell back to a neutral voice or a smaller model.
Fallback = Literal["voice", "model"]

# Phases of a cascaded turn: named in conventions.PHASE_NAMES (bounded; others fold into `other`).
MAX_PHASES = 16
PhaseName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")]

REQUEST_SCHEMA = "request.v1"
GPU_SCHEMA = "gpu.v1"
DEPLOY_SCHEMA = "tailwatch.deploy.v1"
EVAL_SCHEMA = "eval.v1"


class RequestV1(msgspec.Struct, gc=False, omit_defaults=True):
    """One finished request attempt, as a serving runtime reports it."""

    schema: Literal["request.v1"]
    event_id: Id
    ts: Timestamp
    tenant: Label
    model: Label
    workload: Workload
    status: Status
    model_version: Label = ""
    zone: Label = ""
    region: Label = ""
    pool: Label = ""
    endpoint: Label = ""
    traffic_class: TrafficClass = "realtime"
    deployment: Deployment = "stable"
    http_status: Optional[Annotated[int, msgspec.Meta(ge=100, le=599)]] = None
    attempt: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1
    retry_of: Optional[Id] = None
    session_id: Optional[Id] = None
    turn_id: Optional[Id] = None
    task_success: Optional[bool] = None
    queue_ms: Optional[NonNegMs] = None
    first_output_ms: Optional[NonNegMs] = None
    inter_token_ms: Optional[NonNegMs] = None
    e2e_ms: Optional[NonNegMs] = None
    # From a runtime's histogram (a scraped fleet): the lower bound of the bucket the latency
    # was counted in; the latency above is that bucket's upper bound, so the true value lies
    # in (lower, latency]. Absent for a measured latency.
    queue_lower_ms: Optional[NonNegMs] = None
    first_output_lower_ms: Optional[NonNegMs] = None
    inter_token_lower_ms: Optional[NonNegMs] = None
    e2e_lower_ms: Optional[NonNegMs] = None
    finish_reason: Optional[FinishReason] = None
    # Phase name → milliseconds spent in it (see PHASE_NAMES), for cascaded turns.
    stages: Optional[Annotated[dict[PhaseName, NonNegMs], msgspec.Meta(max_length=MAX_PHASES)]] = None
    prompt_tokens: Optional[NonNegInt] = None
    output_tokens: Optional[NonNegInt] = None
    audio_seconds: Optional[AudioSeconds] = None
    batch_size: Optional[NonNegInt] = None
    gpu_seconds: Optional[GpuSeconds] = None
    gpu_sku: Label = ""
    language: LanguageTag = ""
    voice: VoiceName = ""
    status_reason: Optional[StatusReason] = None
    # ASR: partial transcripts revised before the final one, an endpoint put in the wrong place
    # (the speaker cut off, or the turn held open), time from end of speech to the final.
    partial_revisions: Optional[NonNegInt] = None
    endpointing_error: Optional[bool] = None
    finalization_ms: Optional[NonNegMs] = None
    # TTS: playback buffer underruns in the stream, the voice found warm in the cache, a fallback.
    underruns: Optional[NonNegInt] = None
    voice_cache_hit: Optional[bool] = None
    fallback: Optional[Fallback] = None
    # LLM: prompt tokens served from the prefix (KV) cache; speculative decoding's drafted and
    # accepted tokens.
    cached_prompt_tokens: Optional[NonNegInt] = None
    draft_tokens: Optional[NonNegInt] = None
    accepted_tokens: Optional[NonNegInt] = None


class GpuV1(msgspec.Struct, gc=False, omit_defaults=True):
    """One GPU / replica sample: NVML readings plus the serving runtime's gauges."""

    schema: Literal["gpu.v1"]
    ts: Timestamp
    node: Id
    gpu_index: Annotated[int, msgspec.Meta(ge=0, le=1024)]
    zone: Label = ""
    pool: Label = ""
    gpu_uuid: Label = ""
    gpu_sku: Label = ""
    util_pct: Optional[Pct] = None
    mem_used_bytes: Optional[Bytes] = None
    mem_total_bytes: Optional[Bytes] = None
    power_w: Optional[Watts] = None
    temp_c: Optional[Annotated[float, msgspec.Meta(ge=-100, le=200)]] = None
    sm_clock_mhz: Optional[MHz] = None
    xid_errors: Optional[NonNegInt] = None
    ecc_errors: Optional[NonNegInt] = None
    model: Label = ""
    model_version: Label = ""
    replica_state: Optional[ReplicaState] = None
    queue_depth: Optional[NonNegInt] = None
    oldest_queue_age_ms: Optional[NonNegMs] = None
    running: Optional[NonNegInt] = None
    active_streams: Optional[NonNegInt] = None
    kv_cache_usage: Optional[Ratio] = None
    preemptions: Optional[NonNegInt] = None
    # Useful utilisation (NVML's GPM on Hopper and later, or DCGM's profiling fields): how
    # much of the GPU works, where util_pct only says that some kernel was running.
    sm_active_pct: Optional[Pct] = None
    sm_occupancy_pct: Optional[Pct] = None
    tensor_active_pct: Optional[Pct] = None
    dram_bw_pct: Optional[Pct] = None
    # DCGM_FI_PROF_GR_ENGINE_ACTIVE: the share of time any kernel ran. Coarser than SM activity,
    # and what a stock dcgm-exporter sends instead of it: the named fallback for sm_active_pct.
    gr_engine_active_pct: Optional[Pct] = None
    # Which source sent the sample; absent: inferred from the fields it carries (NVML
    # readings → nvml, serving-runtime gauges → runtime).
    source: Optional[GpuSource] = None


class DeployV1(msgspec.Struct, gc=False, omit_defaults=True):
    """A rollout event for one model version."""

    schema: Literal["tailwatch.deploy.v1"]
    ts: Timestamp
    model: Label
    model_version: Label
    stage: Deployment
    weight: Ratio = 1.0
    pool: Label = ""


class EvalV1(msgspec.Struct, gc=False, omit_defaults=True):
    """One sampled evaluation of a finished request: the request's slice labels and event time,
    and what a scorer found against a reference, as a numerator and a denominator (so slices
    and windows add up to a ratio, never an average of averages). No transcript, reference
    text or audio: counts only.

    Published to the requests topic, keyed by tenant like the request it scores, and stamped
    with that request's time (`ts`), not the scoring time: it lands in the request's
    slice-minute, and a score that arrives after the minute closed is merged into it as a
    late event (up to the correction horizon)."""

    schema: Literal["eval.v1"]
    event_id: Id  # the evaluation's own id: a redelivered evaluation is a duplicate
    ts: Timestamp  # the evaluated request's event time
    tenant: Label
    model: Label
    workload: Workload
    model_version: Label = ""
    zone: Label = ""
    pool: Label = ""
    traffic_class: TrafficClass = "realtime"
    deployment: Deployment = "stable"
    language: LanguageTag = ""
    voice: VoiceName = ""
    request_id: Optional[Id] = None  # the scored request's event_id, for the producer's audit; not stored
    # ASR: substitutions + deletions + insertions against the reference, and the reference's
    # length, in words and in characters (CER for languages written without spaces).
    word_errors: Optional[NonNegInt] = None
    reference_words: Optional[NonNegInt] = None
    char_errors: Optional[NonNegInt] = None
    reference_chars: Optional[NonNegInt] = None
    # TTS: a mean-opinion-score proxy (a MOS predictor's output), 1 to 5.
    mos: Optional[Annotated[float, msgspec.Meta(ge=1, le=5)]] = None


# Measurements an evaluation carries in pairs: one without the other is refused.
EVAL_PAIRS = (("word_errors", "reference_words"), ("char_errors", "reference_chars"))


def eval_problem(event: EvalV1) -> str | None:
    """Why an evaluation that decoded cannot be counted, or None."""
    for a, b in EVAL_PAIRS:
        if (getattr(event, a) is None) != (getattr(event, b) is None):
            return f"`{a}` and `{b}` come together"
    if all(getattr(event, f) is None for pair in EVAL_PAIRS for f in pair) and event.mos is None:
        return "an evaluation carries word or character counts or a `mos`"
    return None


EVENT_TYPES: dict[str, type[msgspec.Struct]] = {
    REQUEST_SCHEMA: RequestV1,
    GPU_SCHEMA: GpuV1,
    DEPLOY_SCHEMA: DeployV1,
    EVAL_SCHEMA: EvalV1,
}

# Checks across fields, after each field decoded on its own: a reason to refuse, or None.
EVENT_CHECKS = {EvalV1: eval_problem}

# The topic (after the prefix) that each schema is published to. Evaluations go with the
# requests they score (same topic, same key), so they meet them in the same windows.
TOPIC_OF_SCHEMA = {REQUEST_SCHEMA: TOPIC_REQUESTS, GPU_SCHEMA: TOPIC_GPU, DEPLOY_SCHEMA: TOPIC_DEPLOYS,
                   EVAL_SCHEMA: TOPIC_REQUESTS}

# The slice labels (SLICE_LABELS), their closed value sets (CLOSED_LABELS) and the latency
# fields (LATENCY_FIELDS) are named in conventions/.


def parse_ts_ms(ts: int | str) -> int:
    """Epoch milliseconds of a `Timestamp`: an epoch-ms integer or an RFC 3339 string (naive = UTC).
    Raises ValueError for a string that is not one, or whose time is outside the range above."""
    if isinstance(ts, int):
        ms = ts
    else:
        if not (ts.isascii() and ts.isprintable()):  # fromisoformat lets a trailing NUL through
            raise ValueError("ts is neither epoch milliseconds nor RFC 3339 (a character outside printable ASCII)")
        try:
            dt = datetime.fromisoformat(ts.replace("Z", "+00:00").replace("z", "+00:00"))
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            ms = int(dt.timestamp() * 1000)
        except (ValueError, OverflowError, OSError) as exc:  # year 0, 9999 with an offset, NUL, ...
            raise ValueError(f"ts is neither epoch milliseconds nor RFC 3339 ({type(exc).__name__})") from None
    if not MIN_EVENT_TS_MS <= ms < MAX_EVENT_TS_MS:
        raise ValueError("ts is outside 2000-01-01 .. 2100-01-01 UTC")
    return ms


def partition_key(event: msgspec.Struct) -> bytes:
    """The Kafka key of an event: tenant for requests, node for GPU samples, model for deploys."""
    if isinstance(event, (RequestV1, EvalV1)):
        return event.tenant.encode()
    if isinstance(event, GpuV1):
        return event.node.encode()
    return event.model.encode()
