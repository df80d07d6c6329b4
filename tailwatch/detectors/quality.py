"""Speech and LLM quality shifts, each a ratio of sums against the slice's own trailing baseline.

- Cold-voice storm, per TTS model and zone: the voice-cache miss ratio (lookups that missed
  over lookups) over the window at least `miss_rise_factor` times its baseline and over
  `miss_ratio_min`, while first output (first audio) p95 is at least `first_output_factor`
  times its baseline: voices evicted or a new voice catalogue, and users hear the cold loads.
  A miss surge without slower first audio is a cache doing its job, not an incident.
- Partial-churn regression, per ASR model and version: partial transcripts revised per
  reporting turn at least `rise_factor` times the baseline (a decoder or endpointing change
  that makes captions flicker).
- Voice-quality drop, per TTS model and voice: the mean MOS proxy of sampled evaluations
  (eval.v1; the sum of scores over their number) over the window at least `drop_points` below
  the baseline's mean: a vocoder, voice or model change that users hear as worse speech
  while latency and errors stay clean.
- Voice-fallback surge, per TTS model and zone: the share of attempts served by a neutral
  voice or a smaller model (`fallback`) over the window at least `rise_factor` times its
  baseline and over `ratio_min`: memory pressure or a failing voice store, heard as the wrong
  voice before any error shows.
- Speculative-acceptance drop, per LLM model and version: drafted tokens the target model
  accepted, over those drafted, at most `(1 − drop_ratio)` times the baseline: a draft model
  out of step with its target (a new target version, a changed prompt mix) costs decode time
  and GPU-seconds while answers stay right.
- Prompt-cache collapse, per LLM model: the share of prompt tokens served from the prefix
  cache at most `(1 − drop_ratio)` times the baseline (a prompt template that moved its
  variable part to the front, a router that stopped pinning sessions): prefill cost and first
  token rise with it.

Each reads only buckets whose requests reported the field (no slice, no detection for a fleet
that never sends it), and the baseline is the ratio of the trailing minutes' sums, not an
average of per-minute ratios.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from tailwatch.config import ConfigStruct, Count, Factor, Fraction, Minutes
from tailwatch.detectors.core import BaselineDetector, SliceBy, SliceMinute, median, ratio

COLD_VOICE = "cold_voice_storm"
PARTIAL_CHURN = "partial_churn"
PROMPT_CACHE = "prompt_cache_collapse"
VOICE_QUALITY = "voice_quality_drop"
VOICE_FALLBACK = "voice_fallback_surge"
SPECULATIVE = "speculative_acceptance_drop"


class ColdVoiceStormConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    miss_rise_factor: Factor = 3.0  # window miss ratio at or above this multiple of the baseline's ...
    miss_ratio_min: Fraction = 0.15  # ... and at or above this
    first_output_factor: Factor = 1.3  # while first-output p95 is at least this multiple of its baseline median
    min_lookups: Count = 100  # voice-cache lookups in the window
    baseline_minutes: Minutes = 60
    min_baseline_minutes: Minutes = 15
    slice_by: SliceBy = ("model", "zone")
    clear_minutes: Minutes = 3


class PartialChurnConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 5
    rise_factor: Factor = 1.5  # revisions per reporting turn at or above this multiple of the baseline
    min_turns: Count = 100  # turns that reported partial_revisions in the window
    baseline_minutes: Minutes = 60
    min_baseline_minutes: Minutes = 15
    slice_by: SliceBy = ("model", "model_version")
    clear_minutes: Minutes = 3


class PromptCacheCollapseConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    drop_ratio: Fraction = 0.5  # cached share of prompt tokens at or below (1 − this) × the baseline
    min_prompt_tokens: Count = 20_000  # prompt tokens in the window
    baseline_share_min: Fraction = 0.05  # a baseline share below this has nothing to collapse
    baseline_minutes: Minutes = 60
    min_baseline_minutes: Minutes = 15
    slice_by: SliceBy = ("model",)
    clear_minutes: Minutes = 3


class VoiceQualityDropConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 10
    drop_points: Annotated[float, Meta(gt=0, le=4)] = 0.3  # mean MOS at least this far below the baseline's
    min_samples: Count = 40  # evaluations in the window (and at least this many in the baseline)
    baseline_minutes: Minutes = 120
    min_baseline_minutes: Minutes = 30
    slice_by: SliceBy = ("model", "voice")
    clear_minutes: Minutes = 5


class VoiceFallbackSurgeConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 5
    rise_factor: Factor = 3.0  # fallback share of attempts at or above this multiple of the baseline's ...
    ratio_min: Fraction = 0.05  # ... and at or above this
    min_requests: Count = 100  # TTS attempts in the window
    baseline_minutes: Minutes = 60
    min_baseline_minutes: Minutes = 15
    slice_by: SliceBy = ("model", "zone")
    clear_minutes: Minutes = 3


class SpeculativeAcceptanceDropConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 5
    drop_ratio: Fraction = 0.3  # acceptance at or below (1 − this) × the baseline's
    min_draft_tokens: Count = 20_000  # drafted tokens in the window
    baseline_acceptance_min: Fraction = 0.1  # below this there is no acceptance to lose
    baseline_minutes: Minutes = 60
    min_baseline_minutes: Minutes = 15
    slice_by: SliceBy = ("model", "model_version")
    clear_minutes: Minutes = 3


def _sums(rows: list[tuple]) -> tuple:
    return tuple(sum(col) for col in zip(*rows))


def _shares(window: list, base: list, min_whole: int) -> tuple[float, float, int] | None:
    """Over readings (whole, part): the part's share of the whole in the window and in the
    baseline (ratios of sums), and the window's whole; None below `min_whole`."""
    (whole, part), (base_whole, base_part) = _sums(window), _sums(base)
    if whole < min_whole:
        return None
    return part / whole, ratio(base_part, base_whole) or 0.0, whole


def _share_dropped(window: list, base: list, min_whole: int, baseline_min: float,
                   drop_ratio: float) -> tuple[float, float, int] | None:
    """(share, baseline share, whole) when the share fell to at most (1 − drop_ratio) of a
    baseline of at least `baseline_min`."""
    got = _shares(window, base, min_whole)
    return got if got and got[1] >= baseline_min and got[0] <= (1 - drop_ratio) * got[1] else None


def _share_rose(window: list, base: list, min_whole: int, rise_factor: float,
                floor: float) -> tuple[float, float, int] | None:
    """(share, baseline share, whole) when the share rose to at least `rise_factor` times the
    baseline's and to at least `floor`."""
    got = _shares(window, base, min_whole)
    return got if got and got[0] >= floor and got[0] >= rise_factor * got[1] else None


class ColdVoiceStormDetector(BaselineDetector):
    name = COLD_VOICE
    cfg: ColdVoiceStormConfig

    def reading(self, s: SliceMinute, seen: bool) -> tuple | None:
        return (s.voice_cache_lookups, s.voice_cache_hits, s.first_output_ms_p95) if s.voice_cache_lookups else None

    def judge(self, window: list, base: list) -> dict | None:
        cfg = self.cfg
        lookups, hits = sum(r[0] for r in window), sum(r[1] for r in window)
        fo = [r[2] for r in window if r[2] is not None]
        base_fo = [r[2] for r in base if r[2] is not None]
        if lookups < cfg.min_lookups or not fo or not base_fo:
            return None
        base_lookups = sum(r[0] for r in base)
        miss, base_miss = (lookups - hits) / lookups, (base_lookups - sum(r[1] for r in base)) / base_lookups
        fo_p95, base_fo_p95 = median(fo), median(base_fo)
        if miss >= cfg.miss_ratio_min and miss >= cfg.miss_rise_factor * base_miss \
                and fo_p95 >= cfg.first_output_factor * base_fo_p95:
            return {"voice_cache_miss_ratio": round(miss, 4), "voice_cache_miss_ratio_baseline": round(base_miss, 4),
                    "first_output_ms_p95": round(fo_p95, 1), "first_output_ms_p95_baseline": round(base_fo_p95, 1),
                    "lookups": lookups}
        return None


class PartialChurnDetector(BaselineDetector):
    name = PARTIAL_CHURN
    cfg: PartialChurnConfig

    def reading(self, s: SliceMinute, seen: bool) -> tuple | None:
        return (s.asr_partials_reported, s.partial_revisions) if s.asr_partials_reported else None

    def judge(self, window: list, base: list) -> dict | None:
        got = _shares(window, base, self.cfg.min_turns)
        if got and got[1] > 0 and got[0] >= self.cfg.rise_factor * got[1]:
            return {"partial_revisions_per_turn": round(got[0], 4), "partial_revisions_per_turn_baseline": round(got[1], 4),
                    "turns": got[2]}
        return None


class PromptCacheCollapseDetector(BaselineDetector):
    name = PROMPT_CACHE
    cfg: PromptCacheCollapseConfig

    def reading(self, s: SliceMinute, seen: bool) -> tuple | None:
        # Once a model has reused its cache, its minutes without any reuse are the evidence.
        return (s.prompt_tokens, s.cached_prompt_tokens) if s.prompt_tokens and (s.cached_prompt_tokens or seen) else None

    def judge(self, window: list, base: list) -> dict | None:
        cfg = self.cfg
        got = _share_dropped(window, base, cfg.min_prompt_tokens, cfg.baseline_share_min, cfg.drop_ratio)
        return {"cached_prompt_share": round(got[0], 4), "cached_prompt_share_baseline": round(got[1], 4),
                "prompt_tokens": got[2]} if got else None


class VoiceQualityDropDetector(BaselineDetector):
    name = VOICE_QUALITY
    cfg: VoiceQualityDropConfig

    def reading(self, s: SliceMinute, seen: bool) -> tuple | None:
        return (s.mos_samples, s.mos_milli) if s.mos_samples else None

    def judge(self, window: list, base: list) -> dict | None:
        (samples, milli), (base_samples, base_milli) = _sums(window), _sums(base)
        if samples < self.cfg.min_samples or base_samples < self.cfg.min_samples:
            return None
        now, before = milli / samples / 1000, base_milli / base_samples / 1000
        if now <= before - self.cfg.drop_points:
            return {"mos_mean": round(now, 3), "mos_mean_baseline": round(before, 3), "evaluations": samples}
        return None


class VoiceFallbackSurgeDetector(BaselineDetector):
    name = VOICE_FALLBACK
    cfg: VoiceFallbackSurgeConfig

    def reading(self, s: SliceMinute, seen: bool) -> tuple | None:
        # TTS attempts only; once a slice has fallen back, its minutes without any are evidence too.
        return (s.requests, s.fallbacks) if s.requests and (s.fallbacks or seen) else None

    def judge(self, window: list, base: list) -> dict | None:
        cfg = self.cfg
        got = _share_rose(window, base, cfg.min_requests, cfg.rise_factor, cfg.ratio_min)
        return {"fallback_ratio": round(got[0], 4), "fallback_ratio_baseline": round(got[1], 4),
                "requests": got[2]} if got else None


class SpeculativeAcceptanceDropDetector(BaselineDetector):
    name = SPECULATIVE
    cfg: SpeculativeAcceptanceDropConfig

    def reading(self, s: SliceMinute, seen: bool) -> tuple | None:
        return (s.draft_tokens, s.accepted_tokens) if s.draft_tokens else None

    def judge(self, window: list, base: list) -> dict | None:
        cfg = self.cfg
        got = _share_dropped(window, base, cfg.min_draft_tokens, cfg.baseline_acceptance_min, cfg.drop_ratio)
        return {"acceptance_ratio": round(got[0], 4), "acceptance_ratio_baseline": round(got[1], 4),
                "draft_tokens": got[2]} if got else None
