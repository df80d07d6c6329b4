"""The fleet simulator: a mixed GPU inference fleet with scripted incidents.

Deterministic for a seed: the same (scenario, minutes, seed, start) gives byte-identical
events. Streaming ASR, TTS, LLM chat and speech-to-speech pools in three zones, several
tenants, stable and canary versions, realtime and batch traffic, with a diurnal load
curve. Each scenario scripts incidents and writes their labelled truth beside the events.

No identifiers of people: ids are opaque counters derived from the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Iterator

import msgspec
import numpy as np

from tailwatch.ingest.schema import EvalV1, GpuV1, RequestV1

DEFAULT_START = "2026-11-02T00:00:00Z"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
REGION = "us-east-1"


@dataclass(frozen=True)
class ModelProfile:
    workload: str
    model: str
    stable: str
    canary: str | None
    canary_weight: float
    rate_per_s: float  # realtime requests per second per zone at the diurnal peak
    first_output_ms: float  # median
    e2e_ms: float  # median
    gpu_seconds: float  # median GPU-seconds per request
    gpu_sku: str
    endpoint: str
    batch_rate_per_s: float = 0.0
    gpus_per_pool: int = 4


PROFILES = (
    ModelProfile("asr", "whisper-large-v3", "v3.1", "v3.2", 0.1, 5.0, 280, 2400, 0.35, "L4", "/v1/transcribe/stream", 1.5),
    ModelProfile("tts", "voice-tts-2", "2.4", None, 0.0, 4.0, 170, 1300, 0.12, "L4", "/v1/speak"),
    ModelProfile("llm", "llama-3.1-70b", "2024-07", "2024-11", 0.15, 6.0, 420, 5200, 1.6, "H100", "/v1/chat", 2.0, 6),
    ModelProfile("s2s", "duplex-s2s-1", "1.0", None, 0.0, 2.0, 520, 3100, 0.9, "H100", "/v1/converse"),
)
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark")
TENANT_WEIGHTS = np.array([0.30, 0.22, 0.16, 0.14, 0.10, 0.08])
STATUSES = ("ok", "error", "timeout", "shed", "cancelled")
# Speech traffic by language (lower-case BCP 47) and TTS voices by catalogue name.
LANGUAGES = ("en-us", "es-es", "de-de", "ja-jp")
LANGUAGE_CUMULATIVE = np.cumsum([0.55, 0.2, 0.15, 0.1])
VOICES = ("neutral", "premium-1", "premium-2")
# Word error rate of the stable ASR version per language (sampled evaluations draw errors
# binomially over the reference's words, about 2.4 words per second of audio).
WER_BY_LANGUAGE = {"en-us": 0.055, "es-es": 0.07, "de-de": 0.08, "ja-jp": 0.11}
WORDS_PER_AUDIO_SECOND = 2.4
STREAMING_WORKLOADS = ("asr", "tts", "llm", "s2s")  # answers that stream: partial transcripts, audio, tokens
# A speech-to-speech turn until first audio, by phase (shares of first_output_ms), then the
# answer's decode and playback (shares of the rest). Seed 000's cascaded budget.
S2S_FIRST_AUDIO_SHARES = (("vad", 0.06), ("asr_final", 0.24), ("retrieval", 0.08), ("llm_first_token", 0.38),
                          ("tts_first_audio", 0.24))
S2S_AFTER_SHARES = (("llm_decode", 0.45), ("playback", 0.55))
GPM_SKUS = {"H100"}  # GPUs with NVML's GPM (Hopper and later): the others report utilisation only


@dataclass(frozen=True)
class Incident:
    """A scripted failure: what happens, where, and when (minutes from the start)."""

    name: str
    kind: str
    start_min: int
    end_min: int
    selector: dict[str, str]
    error_ratio: float = 0.0
    timeout_ratio: float = 0.0
    latency_factor: float = 1.0
    queue_ms: float = 0.0
    retry_attempts: int = 0
    extra_rate_factor: float = 0.0  # extra load, e.g. batch traffic leaking in
    cost_factor: float = 1.0  # GPU-seconds per request and GPUs in the pool, e.g. a less efficient build
    # Detector scenarios (neutral defaults: incidents without them emit exactly as before).
    leak_traffic_class: str = ""  # extra_rate_factor arrives as this traffic class in the matched (realtime) pool
    flood_tenant: str = ""  # extra_rate_factor arrives as this tenant's traffic in the matched pool
    util_pct_floor: float = 0.0  # GPUs at least this busy (a job occupying the pool)
    util_pct_cap: float = 100.0  # GPUs at most this busy (the bottleneck is elsewhere)
    kv_cache_usage: float = 0.0  # KV-cache usage forced to about this (0: untouched)
    preemptions_per_sample: float = 0.0  # mean preemptions per GPU sample
    cold_replicas: int = 0  # this many replicas of the pool loading (not warm) while it lasts
    prompt_tokens_factor: float = 1.0
    output_tokens_factor: float = 1.0  # answers shrink while HTTP stays 200
    decode_factor: float = 1.0  # generation after the first token slows (inter-token latency), first token untouched
    stream_cut_ratio: float = 0.0  # share of answered streams the server cuts mid-answer (HTTP 200 all the same)
    phase_factors: tuple[tuple[str, float], ...] = ()  # s2s phases that slow, e.g. (("tts_first_audio", 4.0),)
    wer_factors: tuple[tuple[str, float], ...] = ()  # ASR word error rate × factor per language ("" = every other)
    voice_cache_hit_factor: float = 1.0  # TTS voice-cache hit probability × this (a cold-voice storm)
    underrun_factor: float = 1.0  # TTS playback underruns per stream × this
    partial_revisions_factor: float = 1.0  # ASR partial revisions per turn × this (partial churn)
    prompt_cache_factor: float = 1.0  # LLM share of prompt tokens from the prefix cache × this (a collapse)
    mos_shift: float = 0.0  # TTS MOS proxies of sampled evaluations move by this (a voice-quality drop)
    fallback_ratio: float = 0.0  # about this share of TTS attempts served by a smaller model (memory pressure)
    acceptance_factor: float = 1.0  # speculative decoding's accepted share of drafted tokens × this
    # Zone-loss drill: a pool gone, replicas promoted from a warm pool, queueing by load.
    down: bool = False  # the pool is gone (its zone lost): no requests, no GPU samples
    extra_gpus: int = 0  # replicas added to the pool while it lasts (promoted from a warm pool)
    extra_gpus_loading: bool = False  # the added replicas are still loading their model
    queueing: bool = False  # requests queue by the pool's load against its warm GPUs (see _queue_ms)
    labelled: bool = True  # False: background noise, not in the truth
    related: tuple[str, ...] = ()  # other detector kinds whose firing here is explained, not false

    def matches(self, labels: dict[str, str], minute: int) -> bool:
        return self.start_min <= minute < self.end_min and all(labels.get(k) == v for k, v in self.selector.items())


SCENARIOS: dict[str, list[Incident]] = {
    "quiet": [],
    "mixed-fleet": [
        Incident("zone-b-llm-errors", "error_spike", 30, 42, {"workload": "llm", "zone": "us-east-1b", "traffic_class": "realtime"},
                 error_ratio=0.25),
        Incident("llm-canary-slow", "latency_regression", 55, 85, {"workload": "llm", "deployment": "canary"},
                 latency_factor=3.0),
        Incident("asr-retry-storm", "retry_storm", 70, 80, {"workload": "asr", "zone": "us-east-1c"},
                 error_ratio=0.3, retry_attempts=3),
        # Batch jobs sent to a realtime pool: they arrive labelled batch, as a misrouted job would.
        Incident("batch-in-realtime-pool", "queue_saturation", 95, 110, {"pool": "llm-us-east-1a-realtime"},
                 queue_ms=4000, latency_factor=1.6, extra_rate_factor=0.8, timeout_ratio=0.05,
                 leak_traffic_class="batch"),
    ],
    # An ASR canary scored by sampled evaluations (run with --eval-share): better than stable
    # on every language but German, where its WER is 1.8×. Global WER improves; a rollout gate
    # comparing only the global figure would promote it.
    "asr-canary-language-regression": [
        Incident("asr-canary-de-de-wer", "quality_regression", 0, 100_000,
                 {"workload": "asr", "deployment": "canary"}, wer_factors=(("de-de", 1.8), ("", 0.7))),
    ],
    # The same canary, 10% better everywhere: it should go on to promotion.
    "asr-canary-better": [
        Incident("asr-canary-better", "quality_improvement", 0, 100_000,
                 {"workload": "asr", "deployment": "canary"}, wer_factors=(("", 0.9),), labelled=False),
    ],
    # A TTS canary (see SCENARIO_PROFILES) whose streams stutter: six times stable's underruns,
    # latency and errors unchanged. Its rollout must stop on underruns alone.
    "tts-canary-underruns": [
        Incident("tts-canary-underruns", "quality_regression", 0, 100_000,
                 {"workload": "tts", "deployment": "canary"}, underrun_factor=6.0),
    ],
    # The same canary, healthy: it should go on to promotion.
    "tts-canary-healthy": [],
    # From the second day on, every pool spends 38% more GPU time for the same traffic and the
    # same task success (a less efficient build, scaled out to match): what a cost report must flag.
    # Run it for 2+ days; `--rate-scale 0.01 --gpu-samples-per-minute 1` keeps that light.
    "cost-spike": [
        Incident("fleet-gpu-spend-up-38pct", "cost_regression", 1440, 7 * 1440, {}, cost_factor=1.38),
    ],
    # Latency as users feel it: tokens come slowly after a fast first token, streams
    # cut mid-answer behind HTTP 200, and one phase of the speech-to-speech cascade (TTS first
    # audio) slowing until it is the bottleneck of the turn.
    "streaming": [
        Incident("llm-1a-decode-slow", "decode_slowdown", 30, 75, {"workload": "llm", "zone": "us-east-1a"},
                 decode_factor=4.0),
        Incident("llm-1b-streams-cut", "stream_cuts", 40, 70, {"workload": "llm", "zone": "us-east-1b"},
                 stream_cut_ratio=0.2),
        Incident("s2s-tts-first-audio-slow", "stage_bottleneck", 50, 110, {"workload": "s2s"},
                 phase_factors=(("tts_first_audio", 6.0),)),
    ],
}


def _detector_scenarios() -> dict[str, list[Incident]]:
    """Scenarios with labelled truth for the detectors (`tailwatch eval detectors`): each
    incident's kind names the detector that should catch it; `related` names detectors
    whose firing during it is explained. Incidents start after 75 minutes so that trailing
    baselines (60 minutes) exist, and each kind happens twice."""
    # Selectors name the model too, so that a detection by model (anomaly, cost) on the same
    # fault is recognised as the same incident.
    asr_c = {"workload": "asr", "model": "whisper-large-v3", "zone": "us-east-1c"}
    llm_a = {"workload": "llm", "model": "llama-3.1-70b", "zone": "us-east-1a"}
    tts_a = {"workload": "tts", "model": "voice-tts-2", "zone": "us-east-1a", "traffic_class": "realtime"}
    tts_c = {"workload": "tts", "model": "voice-tts-2", "zone": "us-east-1c", "traffic_class": "realtime"}
    return {
        "retry-storm": [
            Incident("asr-1c-retry-storm", "retry_storm", 80, 92, asr_c, error_ratio=0.3, retry_attempts=3,
                     related=("anomaly", "cost_regression")),
            Incident("llm-1a-retry-storm", "retry_storm", 130, 140, llm_a, error_ratio=0.3, retry_attempts=3,
                     related=("anomaly", "cost_regression")),
        ],
        "queue-saturation": [
            Incident("tts-1b-queue", "queue_age", 80, 95, {"pool": "tts-us-east-1b-realtime", "model": "voice-tts-2"}, queue_ms=3000,
                     related=("idle_but_slow", "busy_but_slow", "anomaly")),
            Incident("asr-1a-queue", "queue_age", 130, 145, {"pool": "asr-us-east-1a-realtime", "model": "whisper-large-v3"}, queue_ms=5000,
                     related=("idle_but_slow", "busy_but_slow", "anomaly")),
        ],
        "busy-but-slow": [
            Incident("replay-in-llm-1a-realtime", "busy_but_slow", 80, 100, {"pool": "llm-us-east-1a-realtime", "model": "llama-3.1-70b"},
                     leak_traffic_class="replay", extra_rate_factor=0.8, util_pct_floor=92, queue_ms=2500,
                     latency_factor=1.3, related=("queue_age", "anomaly", "cost_regression")),
            Incident("batch-in-asr-1c-realtime", "busy_but_slow", 130, 150, {"pool": "asr-us-east-1c-realtime", "model": "whisper-large-v3"},
                     leak_traffic_class="batch", extra_rate_factor=1.0, util_pct_floor=90, queue_ms=1800,
                     related=("queue_age", "anomaly", "cost_regression")),
        ],
        "idle-but-slow": [
            Incident("s2s-1b-cpu-bound", "idle_but_slow", 80, 100, {"pool": "s2s-us-east-1b-realtime", "model": "duplex-s2s-1"},
                     util_pct_cap=20, latency_factor=3.0, related=("anomaly",)),
            Incident("tts-1c-dependency", "idle_but_slow", 130, 150, {"pool": "tts-us-east-1c-realtime", "model": "voice-tts-2"},
                     util_pct_cap=15, latency_factor=2.5, related=("anomaly",)),
        ],
        "kv-pressure": [
            Incident("llm-1b-kv-full", "kv_cache_pressure", 80, 100, {"pool": "llm-us-east-1b-realtime", "model": "llama-3.1-70b"},
                     kv_cache_usage=0.96, preemptions_per_sample=1.5, latency_factor=1.2, related=("anomaly",)),
            Incident("llm-1c-batch-kv-full", "kv_cache_pressure", 130, 150, {"pool": "llm-us-east-1c-batch", "model": "llama-3.1-70b"},
                     kv_cache_usage=0.97, preemptions_per_sample=2.0, related=("anomaly",)),
        ],
        "prompt-growth": [
            Incident("llm-prompt-bundle-3x", "prompt_growth", 80, 100, {"model": "llama-3.1-70b"},
                     prompt_tokens_factor=3.0, related=("anomaly", "kv_cache_pressure")),
            Incident("llm-prompt-bundle-3x-again", "prompt_growth", 165, 185, {"model": "llama-3.1-70b"},
                     prompt_tokens_factor=3.0, related=("anomaly", "kv_cache_pressure")),
        ],
        "cold-start": [
            Incident("asr-1b-cold-replicas", "cold_start", 80, 90, {"pool": "asr-us-east-1b-realtime", "model": "whisper-large-v3"}, cold_replicas=3,
                     queue_ms=600, related=("queue_age", "busy_but_slow", "idle_but_slow", "anomaly")),
            Incident("llm-1a-cold-replicas", "cold_start", 130, 138, {"pool": "llm-us-east-1a-realtime", "model": "llama-3.1-70b"}, cold_replicas=4,
                     queue_ms=600, related=("queue_age", "busy_but_slow", "idle_but_slow", "anomaly")),
        ],
        "cost-regression": [
            Incident("asr-build-60pct-more-gpu", "cost_regression", 80, 120, {"model": "whisper-large-v3"},
                     cost_factor=1.6, related=("anomaly",)),
            Incident("s2s-build-60pct-more-gpu", "cost_regression", 150, 190, {"model": "duplex-s2s-1"},
                     cost_factor=1.6, related=("anomaly",)),
        ],
        "silent-degradation": [
            Incident("llm-canary-answers-collapse", "anomaly", 90, 120,
                     {"model": "llama-3.1-70b", "model_version": "2024-11"}, output_tokens_factor=0.05),
            Incident("llm-stable-answers-truncated", "anomaly", 150, 180,
                     {"model": "llama-3.1-70b", "model_version": "2024-07"}, output_tokens_factor=0.3),
        ],
        # Speech and LLM quality: TTS voices loaded cold (misses with slower first audio), ASR
        # captions that flicker, an LLM prefix cache that stops hitting.
        "cold-voice-storm": [
            Incident("tts-1a-cold-voices", "cold_voice_storm", 80, 95, tts_a, voice_cache_hit_factor=0.4,
                     latency_factor=1.6, related=("anomaly", "idle_but_slow", "busy_but_slow")),
            Incident("tts-1c-cold-voices", "cold_voice_storm", 130, 145, tts_c, voice_cache_hit_factor=0.5,
                     latency_factor=1.5, related=("anomaly", "idle_but_slow", "busy_but_slow")),
        ],
        "partial-churn": [
            Incident("asr-stable-churn", "partial_churn", 80, 100, {"model": "whisper-large-v3", "model_version": "v3.1"},
                     partial_revisions_factor=2.5, related=("anomaly",)),
            Incident("asr-canary-churn", "partial_churn", 130, 150, {"model": "whisper-large-v3", "model_version": "v3.2"},
                     partial_revisions_factor=3.0, related=("anomaly",)),
        ],
        "prompt-cache-collapse": [
            Incident("llm-prefix-cache-off", "prompt_cache_collapse", 80, 100, {"model": "llama-3.1-70b"},
                     prompt_cache_factor=0.05, related=("anomaly",)),
            Incident("llm-prefix-cache-halved", "prompt_cache_collapse", 140, 160, {"model": "llama-3.1-70b"},
                     prompt_cache_factor=0.3, related=("anomaly",)),
        ],
        # A vocoder update that sounds worse: every voice of the model, heard in sampled MOS alone.
        "voice-quality-drop": [
            Incident("tts-vocoder-regression", "voice_quality_drop", 80, 110, {"workload": "tts", "model": "voice-tts-2"},
                     mos_shift=-0.7, related=("anomaly",)),
            Incident("tts-vocoder-slight", "voice_quality_drop", 140, 170, {"workload": "tts", "model": "voice-tts-2"},
                     mos_shift=-0.5, related=("anomaly",)),
        ],
        # A TTS pool short of memory serves a smaller model; a draft model out of step with its target.
        "voice-fallback-surge": [
            Incident("tts-1b-model-fallbacks", "voice_fallback_surge", 80, 95,
                     {"workload": "tts", "model": "voice-tts-2", "zone": "us-east-1b"}, fallback_ratio=0.15,
                     related=("anomaly",)),
            Incident("tts-1c-model-fallbacks", "voice_fallback_surge", 130, 145, tts_c, fallback_ratio=0.10,
                     related=("anomaly",)),
        ],
        "speculative-acceptance-drop": [
            Incident("llm-draft-out-of-step", "speculative_acceptance_drop", 80, 100,
                     {"model": "llama-3.1-70b", "model_version": "2024-07"}, acceptance_factor=0.4, related=("anomaly",)),
            Incident("llm-draft-drifting", "speculative_acceptance_drop", 165, 185,  # a baseline clear of the first
                     {"model": "llama-3.1-70b", "model_version": "2024-07"}, acceptance_factor=0.6, related=("anomaly",)),
        ],
        # A tenant floods a pool with no tenant-aware quota: its share of the GPU time climbs and
        # everyone queues behind it (waits by load, M/M/c).
        "tenant-starving": [
            Incident("llm-1b-hooli-flood", "tenant_starving", 80, 100,
                     {"pool": "llm-us-east-1b-realtime", "model": "llama-3.1-70b"}, flood_tenant="hooli",
                     extra_rate_factor=1.2, queueing=True,
                     related=("queue_age", "busy_but_slow", "anomaly", "cost_regression")),
            Incident("llm-1a-stark-flood", "tenant_starving", 130, 150,
                     {"pool": "llm-us-east-1a-realtime", "model": "llama-3.1-70b"}, flood_tenant="stark",
                     extra_rate_factor=1.0, queueing=True,
                     related=("queue_age", "busy_but_slow", "anomaly", "cost_regression")),
        ],
        "quiet-day": [],  # normal diurnal load with noisy tenants (see _noise), nothing to detect
        # One incident of every kind in four hours, on separate slices: what the test suite runs.
        "detector-suite": [
            Incident("suite-retry-storm", "retry_storm", 80, 90, asr_c, error_ratio=0.3, retry_attempts=3,
                     related=("anomaly", "cost_regression")),
            Incident("suite-queue", "queue_age", 95, 105, {"pool": "tts-us-east-1b-realtime", "model": "voice-tts-2"}, queue_ms=3000,
                     related=("idle_but_slow", "anomaly")),
            Incident("suite-busy", "busy_but_slow", 110, 125, {"pool": "llm-us-east-1a-realtime", "model": "llama-3.1-70b"},
                     leak_traffic_class="replay", extra_rate_factor=0.8, util_pct_floor=92, queue_ms=2500,
                     related=("queue_age", "anomaly", "cost_regression")),
            Incident("suite-idle", "idle_but_slow", 130, 145, {"pool": "s2s-us-east-1b-realtime", "model": "duplex-s2s-1"},
                     util_pct_cap=20, latency_factor=3.0, related=("anomaly",)),
            Incident("suite-kv", "kv_cache_pressure", 150, 165, {"pool": "llm-us-east-1b-realtime", "model": "llama-3.1-70b"},
                     kv_cache_usage=0.96, preemptions_per_sample=1.5, related=("anomaly",)),
            Incident("suite-prompt", "prompt_growth", 170, 185, {"model": "llama-3.1-70b"}, prompt_tokens_factor=3.0,
                     related=("anomaly",)),
            Incident("suite-cold", "cold_start", 190, 198, {"pool": "asr-us-east-1a-realtime", "model": "whisper-large-v3"}, cold_replicas=3,
                     queue_ms=600, related=("queue_age", "idle_but_slow", "anomaly")),
            Incident("suite-cost", "cost_regression", 200, 230, {"model": "duplex-s2s-1"}, cost_factor=1.6,
                     related=("anomaly",)),
            Incident("suite-silent", "anomaly", 205, 230, {"model": "llama-3.1-70b", "model_version": "2024-11"},
                     output_tokens_factor=0.05),
            Incident("suite-prompt-cache", "prompt_cache_collapse", 85, 100, {"model": "llama-3.1-70b"},
                     prompt_cache_factor=0.05, related=("anomaly",)),
            Incident("suite-cold-voices", "cold_voice_storm", 115, 130, tts_a, voice_cache_hit_factor=0.4,
                     latency_factor=1.6, related=("anomaly", "idle_but_slow", "busy_but_slow")),
            Incident("suite-partial-churn", "partial_churn", 160, 180, {"model": "whisper-large-v3", "model_version": "v3.1"},
                     partial_revisions_factor=2.5, related=("anomaly",)),
            Incident("suite-voice-quality", "voice_quality_drop", 185, 215, {"workload": "tts", "model": "voice-tts-2"},
                     mos_shift=-0.7, related=("anomaly",)),
            Incident("suite-fallbacks", "voice_fallback_surge", 40, 55,
                     {"workload": "tts", "model": "voice-tts-2", "zone": "us-east-1b"}, fallback_ratio=0.15,
                     related=("anomaly",)),
            Incident("suite-draft", "speculative_acceptance_drop", 55, 75,
                     {"model": "llama-3.1-70b", "model_version": "2024-07"}, acceptance_factor=0.4, related=("anomaly",)),
            Incident("suite-tenant-flood", "tenant_starving", 135, 150,
                     {"pool": "llm-us-east-1c-realtime", "model": "llama-3.1-70b"}, flood_tenant="hooli",
                     extra_rate_factor=1.2, queueing=True,
                     related=("queue_age", "busy_but_slow", "anomaly", "cost_regression")),
        ],
    }


SCENARIOS.update(_detector_scenarios())
NOISY_SCENARIOS = {"quiet-day"}


def _pool(workload: str, zone: str, traffic_class: str) -> str:
    return f"{workload}-{zone}-{traffic_class}"


@dataclass(frozen=True)
class ScenarioShape:
    """When and how big a scenario runs unless the caller says otherwise."""

    start: str = DEFAULT_START
    minutes: int = 120
    rate_scale: float = 1.0


# The zone-loss drill: us-east-1c fails at 13:30, near the diurnal peak (14:00). Its realtime
# traffic moves to the two surviving zones (half each, (z−1)/z of the fleet now carries it
# all), its batch jobs retry against the survivors' realtime endpoints, and three replicas per
# surviving LLM pool are promoted from a warm pool two minutes later, loading for four.
# At this rate the LLM pools run near the planning target before the loss and the speech
# pools far under it, so the drill shows one tight workload and three with headroom.
ZONE_LOST, ZONE_LOSS_AT_MIN, ZONE_LOSS_END_MIN = ZONES[2], 30, 75
WARM_POOL_PROMOTED_AT_MIN, WARM_POOL_LOADING_MIN, WARM_POOL_REPLICAS = 32, 4, 3
SCENARIO_SHAPES = {"zone-loss": ScenarioShape("2026-11-02T13:00:00Z", ZONE_LOSS_END_MIN, 0.33)}
# Scenarios whose fleet differs from PROFILES: the TTS canaries roll out voice-tts-2 2.5 to a
# quarter of its traffic (every other model's events are as in PROFILES).
_TTS_WITH_CANARY = tuple(replace(p, canary="2.5", canary_weight=0.25) if p.workload == "tts" else p for p in PROFILES)
SCENARIO_PROFILES = {"tts-canary-underruns": _TTS_WITH_CANARY, "tts-canary-healthy": _TTS_WITH_CANARY}


def _zone_loss() -> list[Incident]:
    at, end = ZONE_LOSS_AT_MIN, ZONE_LOSS_END_MIN
    survivors = [z for z in ZONES if z != ZONE_LOST]
    moved = 1 / len(survivors)
    out = [Incident("fleet-queueing", "queueing", 0, end, {}, queueing=True, labelled=False),
           Incident(f"zone-lost-{ZONE_LOST}", "zone_loss", at, end, {"zone": ZONE_LOST}, down=True)]
    for zone in survivors:
        out.append(Incident(f"failover-realtime-to-{zone}", "failover", at, end, {"zone": zone, "traffic_class": "realtime"},
                            extra_rate_factor=moved))
        for prof in PROFILES:
            if prof.batch_rate_per_s > 0:  # the lost zone's batch jobs, retried at the survivors' realtime endpoints
                out.append(Incident(f"failover-batch-{prof.workload}-to-{zone}", "failover", at, end,
                                    {"zone": zone, "workload": prof.workload, "traffic_class": "realtime"},
                                    leak_traffic_class="batch", extra_rate_factor=moved * prof.batch_rate_per_s / prof.rate_per_s))
        llm = {"pool": _pool("llm", zone, "realtime")}
        ready = WARM_POOL_PROMOTED_AT_MIN + WARM_POOL_LOADING_MIN
        out += [Incident(f"warm-pool-loading-{zone}", "warm_pool_promotion", WARM_POOL_PROMOTED_AT_MIN, ready, llm,
                         extra_gpus=WARM_POOL_REPLICAS, extra_gpus_loading=True),
                Incident(f"warm-pool-serving-{zone}", "warm_pool_promotion", ready, end, llm, extra_gpus=WARM_POOL_REPLICAS)]
    return out


SCENARIOS["zone-loss"] = _zone_loss()


def _noise(minutes: int, seed: int) -> list[Incident]:
    """Background noise that no detector should page on: a tenant's error burst with
    client retries, a tenant's latency blip, a batch backlog burst. From its own random
    stream, so the fleet's events draw the same numbers as without noise."""
    rng = np.random.default_rng([seed, 0x5EED])
    out: list[Incident] = []
    for start in range(0, minutes, 20):
        at = start + int(rng.integers(0, 20))
        tenant = TENANTS[int(rng.integers(0, len(TENANTS)))]
        prof = PROFILES[int(rng.integers(0, len(PROFILES)))]
        kind = int(rng.integers(0, 3))
        if kind == 0:
            out.append(Incident(f"noise-{at}-errors-{tenant}", "noise", at, at + int(rng.integers(2, 8)),
                                {"tenant": tenant, "workload": prof.workload}, error_ratio=float(rng.uniform(0.01, 0.05)),
                                retry_attempts=2, labelled=False))
        elif kind == 1:
            out.append(Incident(f"noise-{at}-slow-{tenant}", "noise", at, at + int(rng.integers(2, 6)),
                                {"tenant": tenant, "workload": prof.workload},
                                latency_factor=float(rng.uniform(1.2, 1.6)), labelled=False))
        elif prof.batch_rate_per_s > 0:
            zone = ZONES[int(rng.integers(0, len(ZONES)))]
            out.append(Incident(f"noise-{at}-batch-burst", "noise", at, at + int(rng.integers(5, 20)),
                                {"pool": _pool(prof.workload, zone, "batch")}, extra_rate_factor=float(rng.uniform(0.3, 0.8)),
                                labelled=False))
    return out


@dataclass
class SimTotals:
    """The simulator's own count of what it emitted, to check the pipeline against."""

    requests: int = 0
    by_status: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STATUSES})
    retries: int = 0
    turns: int = 0
    successful_turns: int = 0
    output_tokens: int = 0
    gpu_samples: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    phase_samples: int = 0
    inter_token_values: int = 0
    # Sampled evaluations by (model_version, language): [evaluations, word errors, reference words].
    evaluations: dict[tuple[str, str], list[int]] = field(default_factory=dict)


def parse_start(start: str) -> int:
    dt = datetime.fromisoformat(start.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


class FleetSimulator:
    def __init__(self, scenario: str = "mixed-fleet", minutes: int | None = None, seed: int = 7,
                 start: str | None = None, rate_scale: float | None = None, gpu_samples_per_minute: int = 6,
                 eval_share: float = 0.0):
        """`minutes`, `start` and `rate_scale` left None take the scenario's shape."""
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(sorted(SCENARIOS))}")
        shape = SCENARIO_SHAPES.get(scenario, ScenarioShape())
        minutes = shape.minutes if minutes is None else minutes
        start = shape.start if start is None else start
        rate_scale = shape.rate_scale if rate_scale is None else rate_scale
        if minutes <= 0:
            raise ValueError("--minutes must be positive")
        self.scenario, self.minutes, self.seed = scenario, minutes, seed
        self.start_ms = parse_start(start)
        self.rate_scale = rate_scale
        if not 1 <= gpu_samples_per_minute <= 60:
            raise ValueError("--gpu-samples-per-minute must be between 1 and 60")
        # Fewer samples per GPU-minute keep multi-day runs light; gpu_minute still has a row per GPU and minute.
        self.gpu_samples_per_minute = gpu_samples_per_minute
        self.profiles = SCENARIO_PROFILES.get(scenario, PROFILES)
        self.incidents = SCENARIOS[scenario] + (_noise(minutes, seed) if scenario in NOISY_SCENARIOS else [])
        self.rng = np.random.default_rng(seed)
        # GPM readings draw from their own stream, so every other event is what it was without them.
        self.gpm_rng = np.random.default_rng([seed, 0x6B1])
        # So do stream endings and phase timings.
        self.stream_rng = np.random.default_rng([seed, 0x57E])
        # Quality fields draw from their own generator, so the rest of a seed's traffic is as before.
        self.quality_rng = np.random.default_rng([seed, 0x9A1])
        # Evaluations too: the share of answered ASR and TTS requests a scorer samples (eval.v1).
        if not 0.0 <= eval_share <= 1.0:
            raise ValueError("--eval-share must be between 0 and 1")
        self.eval_share = eval_share
        self.eval_rng = np.random.default_rng([seed, 0xE7A])
        self.queue_rng = np.random.default_rng([seed, 0x0E0E])  # queueing by load (zone-loss drill)
        self._next_eval_id = 0  # ids of their own: the requests' ids stay what they were
        self.totals = SimTotals()
        self._next_id = 0

    # ---- public ---------------------------------------------------------------------
    def events(self) -> Iterator[msgspec.Struct]:
        """Every event, minute by minute, in event-time order within each minute."""
        for minute in range(self.minutes):
            batch = list(self._minute_requests(minute)) + list(self._minute_gpu(minute))
            batch.sort(key=lambda e: e.ts)  # type: ignore[attr-defined]
            yield from batch

    def truth(self) -> list[dict]:
        return [
            {
                "incident": i.name, "kind": i.kind, "scenario": self.scenario,
                "start": _iso(self.start_ms + i.start_min * 60_000), "end": _iso(self.start_ms + i.end_min * 60_000),
                "selector": i.selector, **({"related": list(i.related)} if i.related else {}),
            }
            for i in self.incidents if i.start_min < self.minutes and i.labelled
        ]

    # ---- requests -------------------------------------------------------------------
    def _id(self) -> str:
        self._next_id += 1
        return f"{self.seed:x}-{self._next_id:x}"

    def _diurnal(self, minute: int) -> float:
        day_min = (self.start_ms // 60_000 + minute) % 1440
        return 0.65 + 0.35 * math.sin(2 * math.pi * (day_min - 480) / 1440)

    def _minute_requests(self, minute: int) -> Iterator[RequestV1]:
        rng = self.rng
        for prof in self.profiles:
            for zone in ZONES:
                for tclass, base_rate in (("realtime", prof.rate_per_s), ("batch", prof.batch_rate_per_s)):
                    if base_rate <= 0:
                        continue
                    pool = _pool(prof.workload, zone, tclass)
                    labels = {"workload": prof.workload, "zone": zone, "traffic_class": tclass, "pool": pool, "model": prof.model}
                    load = 1.0 if tclass == "batch" else self._diurnal(minute)
                    active = [i for i in self.incidents if i.matches(labels, minute)]
                    if any(i.down for i in active):
                        continue
                    extra = sum(i.extra_rate_factor for i in active if not i.leak_traffic_class and not i.flood_tenant)
                    queue_ms = self._pool_queue_ms(prof, base_rate * load, active)
                    n = int(rng.poisson(base_rate * 60 * load * self.rate_scale * (1 + extra)))
                    if n:
                        yield from self._requests(prof, zone, tclass, pool, minute, n, labels, queue_ms)
                    for inc in active:
                        if inc.leak_traffic_class:  # another class's jobs sent into this pool
                            leak = int(rng.poisson(base_rate * 60 * load * self.rate_scale * inc.extra_rate_factor))
                            if leak:
                                yield from self._requests(prof, zone, inc.leak_traffic_class, pool, minute, leak,
                                                          {**labels, "traffic_class": inc.leak_traffic_class}, queue_ms)
                        if inc.flood_tenant:  # one tenant's surge into the pool
                            flood = int(rng.poisson(base_rate * 60 * load * self.rate_scale * inc.extra_rate_factor))
                            if flood:
                                yield from self._requests(prof, zone, tclass, pool, minute, flood, labels, queue_ms,
                                                          tenant=inc.flood_tenant)

    def _pool_gpus(self, prof: ModelProfile, active: list[Incident]) -> tuple[int, int]:
        """(GPUs in the pool, warm ones serving) this minute."""
        gpus = round(prof.gpus_per_pool * math.prod(i.cost_factor for i in active))
        added = sum(i.extra_gpus for i in active)
        loading = max((i.cold_replicas for i in active), default=0) + sum(i.extra_gpus for i in active if i.extra_gpus_loading)
        return gpus + added, max(0, gpus + added - loading)

    def _pool_queue_ms(self, prof: ModelProfile, requests_per_s: float, active: list[Incident]) -> float:
        """Mean queue wait of a pool whose incidents ask for queueing: its expected work (every
        request arriving, failed-over and leaked ones included) against its warm GPUs, a
        request's GPU-seconds standing for its service time on one GPU."""
        if not any(i.queueing for i in active):
            return 0.0
        per_s = requests_per_s * self.rate_scale * (1 + sum(i.extra_rate_factor for i in active))
        service_s = prof.gpu_seconds * math.exp(0.3 ** 2 / 2) * math.prod(i.cost_factor for i in active)  # lognormal mean
        _, warm = self._pool_gpus(prof, active)
        return queue_wait_ms(per_s * service_s / warm if warm else math.inf, warm, service_s * 1000)

    def _requests(self, prof: ModelProfile, zone: str, tclass: str, pool: str, minute: int, n: int,
                  labels: dict[str, str], pool_queue_ms: float = 0.0, tenant: str = "") -> Iterator[RequestV1]:
        rng = self.rng
        t0 = self.start_ms + minute * 60_000
        ts = t0 + np.sort(rng.integers(0, 60_000, n))
        tenants = rng.choice(len(TENANTS), n, p=TENANT_WEIGHTS)
        if tenant:
            tenants[:] = TENANTS.index(tenant)
        canary = rng.random(n) < (prof.canary_weight if prof.canary else 0.0)
        fo = rng.lognormal(math.log(prof.first_output_ms), 0.35, n)
        e2e_extra = rng.lognormal(math.log(prof.e2e_ms - prof.first_output_ms), 0.45, n)
        queue = rng.lognormal(math.log(15), 0.8, n)
        gpu_s = rng.lognormal(math.log(prof.gpu_seconds), 0.3, n)
        out_tokens = rng.integers(40, 400, n) if prof.workload == "llm" else np.zeros(n, dtype=np.int64)
        prompt_tokens = rng.integers(200, 3000, n) if prof.workload == "llm" else np.zeros(n, dtype=np.int64)
        audio_s = rng.uniform(2, 15, n) if prof.workload in ("asr", "tts", "s2s") else np.zeros(n)
        # Waits in a busy pool (queueing incidents only): exponential about the mean, from a
        # stream of their own; the wait comes before the first output as well.
        waited = self.queue_rng.exponential(pool_queue_ms, n) if pool_queue_ms > 0 else np.zeros(n)
        u_status = rng.random(n)
        u_success = rng.random(n)
        u_cancel = rng.random(n)
        for i in range(n):
            deployment = "canary" if canary[i] else "stable"
            version = prof.canary if canary[i] else prof.stable
            lab = {**labels, "deployment": deployment, "model_version": version, "tenant": TENANTS[tenants[i]]}
            active = [inc for inc in self.incidents if inc.matches(lab, minute)]
            err = 0.0004 + sum(inc.error_ratio for inc in active)
            tmo = 0.0001 + sum(inc.timeout_ratio for inc in active)
            lat = math.prod(inc.latency_factor for inc in active)
            decode = math.prod(inc.decode_factor for inc in active)
            q = float(queue[i]) + sum(inc.queue_ms for inc in active) + float(waited[i])
            retries = max((inc.retry_attempts for inc in active), default=1)
            status = "cancelled" if u_cancel[i] < 0.003 else ("error" if u_status[i] < err else ("timeout" if u_status[i] < err + tmo else "ok"))
            session = self._id()
            attempt, first_id, at = 1, None, int(ts[i])
            while True:
                eid = self._id()
                final = status in ("ok", "cancelled") or attempt >= max(retries, 1 if status == "ok" else 2)
                request = self._request(prof, lab, pool, zone, eid, at, status, attempt, first_id, session,
                                        final, bool(u_success[i] < 0.97), float(fo[i]) * lat,
                                        float(e2e_extra[i]) * lat * decode,
                                        q, float(gpu_s[i]) * math.prod(inc.cost_factor for inc in active),
                                        int(prompt_tokens[i] * math.prod(inc.prompt_tokens_factor for inc in active)),
                                        int(out_tokens[i] * math.prod(inc.output_tokens_factor for inc in active)),
                                        float(audio_s[i]), active, float(waited[i]))
                yield request
                if self.eval_share and request.status == "ok" and prof.workload in ("asr", "tts"):
                    scored = self._evaluation(request, active)
                    if scored is not None:
                        yield scored
                if final:
                    break
                first_id = first_id or eid
                attempt += 1
                at += 200 * attempt
                # A retry succeeds unless the incident is still hitting it.
                status = "error" if self.rng.random() < err else "ok"

    def _request(self, prof, lab, pool, zone, eid, ts, status, attempt, retry_of, session, final, succeeded,
                 fo, e2e_extra, queue, gpu_s, prompt, out, audio, active, waited: float = 0.0) -> RequestV1:
        """`queue` includes `waited`, the wait in a busy pool, which also comes before the first output."""
        quality = self._quality(prof, status, lab, prompt, active)
        if quality.get("status_reason") == "quota":
            status = "shed"  # refused at admission for the tenant's quota: nothing was served
        finish = self._finish_reason(prof, status, active)
        phases = None
        if prof.workload == "s2s" and status == "ok":
            phases, fo = self._phases(fo, e2e_extra, active)
        t = self.totals
        t.requests += 1
        t.by_status[status] += 1
        if attempt > 1:
            t.retries += 1
        ok = status == "ok"
        task_success = (ok and succeeded) if final else None
        if final:
            t.turns += 1
            t.successful_turns += int(bool(task_success))
        shaped_out = out if ok else 0
        t.output_tokens += shaped_out
        if finish is not None:
            t.finish_reasons[finish] = t.finish_reasons.get(finish, 0) + 1
        t.phase_samples += len(phases or ())
        t.inter_token_values += int(ok and bool(out))
        return RequestV1(
            schema="request.v1", event_id=eid, ts=ts, tenant=lab["tenant"], model=prof.model,
            workload=prof.workload, status=status, model_version=lab["model_version"], zone=zone, region=REGION,
            pool=pool, endpoint=prof.endpoint, traffic_class=lab["traffic_class"], deployment=lab["deployment"],
            http_status={"ok": 200, "error": 503, "timeout": 504, "shed": 429, "cancelled": 499}[status],
            attempt=attempt, retry_of=retry_of, session_id=session, turn_id=session, task_success=task_success,
            queue_ms=round(queue, 2),
            first_output_ms=round(fo + waited, 2) if ok else None,
            inter_token_ms=round(e2e_extra / max(out, 1), 2) if ok and out else None,
            e2e_ms=round(queue + fo + e2e_extra, 2) if status != "cancelled" else None,
            finish_reason=finish, stages=phases,
            prompt_tokens=prompt or None, output_tokens=shaped_out if prof.workload == "llm" else None,
            audio_seconds=round(audio, 3) if audio else None,
            batch_size=8 if lab["traffic_class"] == "batch" else 1,
            gpu_seconds=round(gpu_s * (1 if ok else 0.5), 4), gpu_sku=prof.gpu_sku, **quality,
        )

    def _evaluation(self, req: RequestV1, active: list[Incident]) -> EvalV1 | None:
        """A scorer's sample of an answered request: ASR word errors against a reference (the
        incidents' `wer_factors` per language), or a TTS MOS proxy; None when not sampled."""
        rng = self.eval_rng
        if rng.random() >= self.eval_share:
            return None
        self._next_eval_id += 1
        eid = f"{self.seed:x}-e{self._next_eval_id:x}"
        labels = {k: getattr(req, k) for k in ("tenant", "model", "workload", "model_version", "zone", "pool",
                                               "traffic_class", "deployment", "language", "voice")}
        if req.workload == "tts":
            return EvalV1(schema="eval.v1", event_id=eid, ts=req.ts, request_id=req.event_id, **labels,
                          mos=round(float(np.clip(rng.normal(4.2 + sum(inc.mos_shift for inc in active), 0.3),
                                                  1.0, 5.0)), 3))
        factor = 1.0
        for inc in active:
            table = dict(inc.wer_factors)
            factor *= table.get(req.language, table.get("", 1.0))
        words = max(1, int(rng.poisson((req.audio_seconds or 1.0) * WORDS_PER_AUDIO_SECOND)))
        errors = int(rng.binomial(words, min(1.0, WER_BY_LANGUAGE.get(req.language, 0.1) * factor)))
        totals = self.totals.evaluations.setdefault((req.model_version, req.language), [0, 0, 0])
        totals[0] += 1
        totals[1] += errors
        totals[2] += words
        return EvalV1(schema="eval.v1", event_id=eid, ts=req.ts, request_id=req.event_id, **labels,
                      word_errors=errors, reference_words=words)

    def _quality(self, prof: ModelProfile, status: str, lab: dict[str, str], prompt: int,
                 active: list[Incident]) -> dict:
        """What speech and LLM runtimes report besides latency: language and voice, ASR churn,
        endpointing and finalization, TTS underruns and warm voices, LLM prefix-cache and
        speculative-decoding tokens, and why a request was refused or failed."""
        rng = self.quality_rng
        u = rng.random(6)
        out: dict = {}
        if prof.workload == "llm" and lab["traffic_class"] == "realtime" and lab["tenant"] == TENANTS[0] and u[0] < 0.01:
            return {"status_reason": "quota"}  # the biggest tenant now and then over its token quota
        if status == "error":
            out["status_reason"] = "oom" if prof.workload == "llm" and u[1] < 0.2 else "upstream"
        if prof.workload in ("asr", "tts", "s2s"):
            out["language"] = LANGUAGES[int(np.searchsorted(LANGUAGE_CUMULATIVE, u[2]))]
        if prof.workload == "asr" and status == "ok":
            churn = math.prod(inc.partial_revisions_factor for inc in active)
            out.update(partial_revisions=int(rng.poisson(1.5 * churn)), endpointing_error=bool(u[3] < 0.01),
                       finalization_ms=round(float(rng.lognormal(math.log(180), 0.4)), 2))
        if prof.workload == "tts":
            out["voice"] = VOICES[int(u[4] * len(VOICES))]
            out["voice_cache_hit"] = bool(u[5] < 0.95 * math.prod(inc.voice_cache_hit_factor for inc in active))
            if status == "ok":
                out["underruns"] = int(rng.poisson(0.002 * math.prod(inc.underrun_factor for inc in active)))
            if not out["voice_cache_hit"] and u[3] < 0.05:
                out["fallback"] = "voice"
            elif u[3] < sum(inc.fallback_ratio for inc in active):
                out["fallback"] = "model"
        if prof.workload == "llm" and prompt:
            reuse = math.prod(inc.prompt_cache_factor for inc in active)
            out["cached_prompt_tokens"] = int(prompt * float(rng.uniform(0.3, 0.7)) * reuse)
            if status == "ok":
                draft = int(rng.integers(50, 300))
                accept = float(rng.uniform(0.55, 0.8)) * math.prod(inc.acceptance_factor for inc in active)
                out.update(draft_tokens=draft, accepted_tokens=int(draft * accept))
        return out

    def _finish_reason(self, prof: ModelProfile, status: str, active: list[Incident]) -> str | None:
        """How a stream ended; None where no stream began (an error or shed answered at once)."""
        if prof.workload not in STREAMING_WORKLOADS:
            return None
        if status == "cancelled":
            return "client_cancel"
        if status == "timeout":
            return "timeout"
        if status != "ok":
            return None
        u = float(self.stream_rng.random())
        cut = sum(inc.stream_cut_ratio for inc in active)
        return "server_cut" if u < cut else ("length" if u < cut + 0.04 else "stop")

    def _phases(self, fo: float, e2e_extra: float, active: list[Incident]) -> tuple[dict[str, float], float]:
        """Phase timings of an answered s2s turn, and its first-audio time (the sum of the phases
        before first audio, which grows with a slowed phase)."""
        factor = {name: f for inc in active for name, f in inc.phase_factors}
        noise = self.stream_rng.lognormal(0.0, 0.2, len(S2S_FIRST_AUDIO_SHARES) + len(S2S_AFTER_SHARES))
        raw = [share * float(z) for (_, share), z in zip(S2S_FIRST_AUDIO_SHARES, noise)]
        phases = {name: round(fo * r / sum(raw) * factor.get(name, 1.0), 2)
                  for (name, _), r in zip(S2S_FIRST_AUDIO_SHARES, raw)}
        first_audio = sum(phases.values())
        for (name, share), z in zip(S2S_AFTER_SHARES, noise[len(S2S_FIRST_AUDIO_SHARES):]):
            phases[name] = round(e2e_extra * share * float(z) * factor.get(name, 1.0), 2)
        return phases, first_audio

    # ---- GPU samples ----------------------------------------------------------------
    def _minute_gpu(self, minute: int) -> Iterator[GpuV1]:
        rng = self.rng
        t0 = self.start_ms + minute * 60_000
        for prof in self.profiles:
            for zone in ZONES:
                for tclass in ("realtime", "batch"):
                    if tclass == "batch" and prof.batch_rate_per_s <= 0:
                        continue
                    pool = _pool(prof.workload, zone, tclass)
                    labels = {"workload": prof.workload, "zone": zone, "traffic_class": tclass, "pool": pool, "model": prof.model}
                    active = [i for i in self.incidents if i.matches(labels, minute)]
                    if any(i.down for i in active):
                        continue
                    load = 1.0 if tclass == "batch" else self._diurnal(minute)
                    base_rate = prof.rate_per_s if tclass == "realtime" else prof.batch_rate_per_s
                    # The oldest waiting request has waited about twice the mean wait.
                    queue_age = sum(i.queue_ms for i in active) + 2 * self._pool_queue_ms(prof, base_rate * load, active)
                    load *= 1 + sum(i.extra_rate_factor for i in active)
                    gpus, _ = self._pool_gpus(prof, active)
                    added = sum(i.extra_gpus for i in active)
                    if added:  # the same work over more GPUs
                        load *= (gpus - added) / gpus
                    for g in range(gpus):
                        node = f"{pool}-n{g // 8}"
                        for s in range(self.gpu_samples_per_minute):
                            util = float(np.clip(rng.normal(55 * load, 6), 0, 100))
                            mem_total = 80 * 2**30 if prof.gpu_sku == "H100" else 24 * 2**30
                            self.totals.gpu_samples += 1
                            sample = GpuV1(
                                schema="gpu.v1", ts=t0 + s * (60_000 // self.gpu_samples_per_minute) + g * 37, node=node, gpu_index=g % 8,
                                zone=zone, pool=pool, gpu_uuid=f"GPU-{pool}-{g:02d}", gpu_sku=prof.gpu_sku,
                                util_pct=round(util, 1), mem_used_bytes=int(mem_total * (0.55 + 0.3 * min(load, 1.2) / 1.2)),
                                mem_total_bytes=mem_total, power_w=round(120 + 4.2 * util, 1),
                                temp_c=round(45 + 0.3 * util, 1), sm_clock_mhz=1755.0, xid_errors=0, ecc_errors=0,
                                model=prof.model, model_version=prof.stable, replica_state="warm",
                                queue_depth=int(rng.poisson(2 * load + queue_age / 400)),
                                oldest_queue_age_ms=round(float(rng.lognormal(math.log(20), 0.5)) + queue_age, 1),
                                running=int(8 * load), active_streams=int(12 * load) if prof.workload != "llm" else 0,
                                kv_cache_usage=round(min(1.0, 0.35 * load + rng.random() * 0.05), 3) if prof.workload == "llm" else None,
                                preemptions=0,
                            )
                            sample = self._gpu_effects(sample, g, gpus, active) if active else sample
                            yield self._gpm(sample) if prof.gpu_sku in GPM_SKUS else sample

    def _gpu_effects(self, sample: GpuV1, g: int, gpus: int, active: list[Incident]) -> GpuV1:
        """What detector scenarios do to a GPU sample (none of it for other incidents)."""
        changes: dict = {}
        floor = max(i.util_pct_floor for i in active)
        cap = min(i.util_pct_cap for i in active)
        util = sample.util_pct or 0.0
        if floor > 0:
            util = max(util, min(100.0, floor + float(self.rng.normal(0, 2))))
        if cap < 100:
            util = min(util, max(0.0, cap - abs(float(self.rng.normal(0, 2)))))
        if util != sample.util_pct:
            changes["util_pct"] = round(util, 1)
        kv = max(i.kv_cache_usage for i in active)
        if kv > 0 and sample.kv_cache_usage is not None:
            changes["kv_cache_usage"] = round(min(1.0, kv + float(self.rng.random()) * 0.03), 3)
        pre = sum(i.preemptions_per_sample for i in active)
        if pre > 0:
            changes["preemptions"] = int(self.rng.poisson(pre))
        promoting = sum(i.extra_gpus for i in active if i.extra_gpus_loading)
        if g < max(i.cold_replicas for i in active) or g >= gpus - promoting:
            changes.update(replica_state="loading", util_pct=round(float(self.rng.uniform(0, 5)), 1),
                           queue_depth=int(self.rng.poisson(6)), running=0, active_streams=0)
        return msgspec.structs.replace(sample, **changes) if changes else sample


    def _gpm(self, sample: GpuV1) -> GpuV1:
        """Useful utilisation where the GPU has GPM (Hopper). Utilisation only says a kernel
        was running; SMs are active for a share of that time which grows with the work
        queued on the GPU, because more concurrent requests make bigger batches (continuous
        batching). At the diurnal peak an LLM pool reads ~55% utilisation with SMs ~26%
        active, tensor pipes ~5% and DRAM bandwidth ~15%, close to batch-64 decode on a real
        H100 (tests/data/h100-lab); a pool flooded with work (utilisation 90%+) has SMs
        over 60% active: saturated, not merely "utilised"."""
        util = sample.util_pct or 0.0
        z = self.gpm_rng.normal(0, 1, 4)
        share = 0.25 + 0.5 * min(1.0, max(0.0, (util - 20) / 80))  # SM-active share of the utilised time

        def pct(x: float) -> float:
            return round(float(np.clip(x, 0, 100)), 1)

        sm = pct(util * share * (1 + 0.05 * z[0]))
        return msgspec.structs.replace(
            sample, sm_active_pct=sm, sm_occupancy_pct=pct(sm * 0.42 * (1 + 0.05 * z[1])),
            tensor_active_pct=pct(sm * (0.2 + 0.8 * max(0.0, share - 0.5)) * (1 + 0.05 * z[2])),
            dram_bw_pct=pct(sm * 0.6 * (1 + 0.05 * z[3])),
        )


def queue_wait_ms(utilization: float, servers: int, service_ms: float) -> float:
    """Mean wait in an M/M/c queue by Sakasegawa's approximation, S·ρ^(√(2(c+1))−1) / (c(1−ρ)).
    At 98% busy and beyond the queue grows for as long as the overload lasts; a minute's
    mean wait is held at that bound, and at a minute with no server at all."""
    if servers <= 0:
        return 60_000.0
    rho = min(max(utilization, 0.0), 0.98)
    return min(60_000.0, service_ms * rho ** (math.sqrt(2 * (servers + 1)) - 1) / (servers * (1 - rho)))


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
