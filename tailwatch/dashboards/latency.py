"""Latency: queue, first-output, inter-token and end-to-end percentiles by workload, model
version, zone and traffic class; how answer streams ended; beside them, GPU utilisation split by traffic class and the
oldest queued request, so that "GPUs busy but users waiting" is visible in one row. Below, what speech and LLM
operators watch besides latency: ASR finalization, partial churn and endpointing; TTS underruns, warm voices and
fallbacks; LLM prefix-cache reuse and speculative acceptance; quota refusals per tenant and OOM failures."""

from __future__ import annotations

from tailwatch.dashboards.common import (
    UID_LATENCY,
    per_unit,
    Q,
    dashboard,
    fleet_variables,
    latency_quantile,
    rate,
    sel,
    timeseries,
)
from tailwatch.conventions import (
    GPUS, GPU_UTILIZATION_RATIO, QUEUE_OLDEST_AGE_SECONDS, REQUEST_GPU_SECONDS_TOTAL,
    REQUEST_RETRIES_TOTAL, STREAMS_CANCELLED_TOTAL, STREAMS_COMPLETED_TOTAL, STREAMS_TOTAL,
    ASR_ENDPOINTING_ERRORS_TOTAL, ASR_PARTIAL_REVISIONS_TOTAL, ASR_TURNS_REPORTING_ENDPOINTING_TOTAL,
    ASR_REFERENCE_WORDS_TOTAL, ASR_WORD_ERRORS_TOTAL,
    ASR_TURNS_REPORTING_PARTIALS_TOTAL, CACHED_PROMPT_TOKENS_TOTAL, OOM_FAILURES_TOTAL, PROMPT_TOKENS_TOTAL,
    QUOTA_REJECTIONS_TOTAL, REQUESTS_TOTAL, SPECULATIVE_ACCEPTED_TOKENS_TOTAL, SPECULATIVE_DRAFT_TOKENS_TOTAL, TTS_FALLBACKS_TOTAL,
    TTS_STREAMS_REPORTING_UNDERRUNS_TOTAL, TTS_STREAMS_WITH_UNDERRUNS_TOTAL, TTS_VOICE_CACHE_HITS_TOTAL,
    TTS_VOICE_CACHE_LOOKUPS_TOTAL, TTS_MOS_EVALUATIONS_TOTAL, TTS_MOS_SCORE_TOTAL,
)



def pct(field: str, quantile: str, by: str) -> str:
    """The quantile of each group from the histogram's buckets summed over the group: exact
    aggregation over any labels (to the bucket bounds), unlike a max of per-slice quantiles."""
    return latency_quantile(field, quantile, by)


def busy_gpus_by_traffic_class() -> str:
    """Each pool's busy GPUs (utilisation × GPUs) shared out by the GPU-seconds each
    traffic class used in it: batch work in a realtime pool shows up as batch."""
    used = REQUEST_GPU_SECONDS_TOTAL
    return (f"sum by (traffic_class) (\n"
            f"  {rate(used, 'pool, traffic_class')}\n"
            f"  / on (pool) group_left() (sum by (pool) (rate({used}[$__rate_interval])) > 0)\n"
            f"  * on (pool) group_left() sum by (pool) ({sel(GPU_UTILIZATION_RATIO)} * on (zone, pool, gpu_sku) {GPUS})\n"
            f")")


def quality_panels() -> list:
    """Speech and LLM quality: each a ratio of two sums, never an average of averages."""
    return [
        timeseries("ASR finalization p95 by model version", "s",
                   [Q(pct("finalization", "0.95", "model, model_version"), "{{model}} {{model_version}}")],
                   description="End of speech to the final transcript."),
        timeseries("ASR partial revisions per turn by model version", "short", [Q(
            per_unit(rate(ASR_PARTIAL_REVISIONS_TOTAL, "model, model_version"), ASR_TURNS_REPORTING_PARTIALS_TOTAL,
                     "model, model_version"), "{{model}} {{model_version}}")],
            description="Partial churn: how often a partial transcript is revised before the final."),
        timeseries("ASR endpointing errors by model version", "percentunit", [Q(
            per_unit(rate(ASR_ENDPOINTING_ERRORS_TOTAL, "model, model_version"), ASR_TURNS_REPORTING_ENDPOINTING_TOTAL,
                     "model, model_version"), "{{model}} {{model_version}}")],
            description="Turns whose speaker was cut off or held open, of those that reported it."),
        timeseries("ASR word error rate by model version (sampled evaluations)", "percentunit", [Q(
            per_unit(rate(ASR_WORD_ERRORS_TOTAL, "model, model_version"), ASR_REFERENCE_WORDS_TOTAL,
                     "model, model_version"), "{{model}} {{model_version}}")],
            description="Word errors over the references' words of eval.v1 samples. Per language: the asr-wer SLO's "
                        "slices on the SLO dashboard, and the rollout gate by language."),
        timeseries("TTS streams with underruns by model and zone", "percentunit", [Q(
            per_unit(rate(TTS_STREAMS_WITH_UNDERRUNS_TOTAL, "model, zone"), TTS_STREAMS_REPORTING_UNDERRUNS_TOTAL,
                     "model, zone"), "{{model}} {{zone}}")],
            description="TTS streams that starved the player at least once, of the streams that reported underruns."),
        timeseries("TTS warm-voice cache hits by model", "percentunit", [Q(
            per_unit(rate(TTS_VOICE_CACHE_HITS_TOTAL, "model"), TTS_VOICE_CACHE_LOOKUPS_TOTAL, "model"), "{{model}}")],
            description="A falling hit ratio with rising first audio is a cold-voice storm."),
        timeseries("TTS MOS proxy by model", "none", [Q(
            per_unit(rate(TTS_MOS_SCORE_TOTAL, "model"), TTS_MOS_EVALUATIONS_TOTAL, "model"), "{{model}}")],
            description="Mean MOS proxy (1 to 5) of sampled evaluations (eval.v1): the sum of scores over their "
                        "number. The voice_quality_drop detector watches it per voice."),
        timeseries("TTS fallbacks by model", "reqps", [Q(rate(TTS_FALLBACKS_TOTAL, "model"), "{{model}}")],
                   description="Requests served by a neutral voice or a smaller model instead of the one asked for."),
        timeseries("LLM prefix-cache hit ratio by model", "percentunit", [Q(
            per_unit(rate(CACHED_PROMPT_TOKENS_TOTAL, "model"), PROMPT_TOKENS_TOTAL, "model"), "{{model}}")],
            description="Prompt tokens served from the prefix cache: a collapse raises prefill cost and first token."),
        timeseries("LLM speculative acceptance by model", "percentunit", [Q(
            per_unit(rate(SPECULATIVE_ACCEPTED_TOKENS_TOTAL, "model"), SPECULATIVE_DRAFT_TOKENS_TOTAL, "model"),
            "{{model}}")],
            description="Draft tokens the target model accepted, over draft tokens proposed: a drop wastes the draft "
                        "model's GPU time."),
        timeseries("Quota refusals by tenant; OOM failures by model", "reqps", [
            Q(rate(QUOTA_REJECTIONS_TOTAL, "tenant"), "quota {{tenant}}"),
            Q(rate(OOM_FAILURES_TOTAL, "model"), "oom {{model}}")],
            description="Refusals for a tenant's quota or rate limit, apart from overload shedding; failures for want of GPU memory."),
        timeseries("Quota rejection ratio by tenant", "percentunit", [Q(
            per_unit(rate(QUOTA_REJECTIONS_TOTAL, "tenant"), REQUESTS_TOTAL, "tenant"), "{{tenant}}")],
            description="A tenant's attempts refused for its quota or rate limit, over its attempts: the quota_admission "
                        "SLI (slo/examples/tenant-quota.yaml tickets on it per tenant)."),
        timeseries("GPU time share by tenant and pool", "percentunit", [Q(
            # An idle pool divides 0 by 0: NaN, which `> 0` drops.
            f"{rate(REQUEST_GPU_SECONDS_TOTAL, 'pool, tenant')}\n/ ignoring (tenant) group_left\n"
            f"{rate(REQUEST_GPU_SECONDS_TOTAL, 'pool')} > 0", "{{pool}} {{tenant}}")],
            description="Each tenant's share of its pool's GPU time (its batch slots): a tenant_starving detection is "
                        "one share climbing while the others' queue age rises (queue panels above)."),
    ]


def build(specs=None):
    panels = [
        timeseries("First output p95 by workload and model version", "s",
                   [Q(pct("first_output", "0.95", "workload, model_version"), "{{workload}} {{model_version}}")],
                   description="95th percentile time to first token or audio, per workload and version, from the "
                               "summed histogram (exact to the bucket bounds)."),
        timeseries("First output p95 by zone", "s",
                   [Q(pct("first_output", "0.95", "workload, zone"), "{{workload}} {{zone}}")],
                   description="95th percentile time to first output per zone: one zone apart is a zone problem."),
        timeseries("First output p95 by traffic class", "s",
                   [Q(pct("first_output", "0.95", "workload, traffic_class"), "{{workload}} {{traffic_class}}")],
                   description="Realtime beside batch: batch slow is fine, realtime slow while batch runs is not."),
        timeseries("Queue p95 by workload and traffic class", "s",
                   [Q(pct("queue", "0.95", "workload, traffic_class"), "{{workload}} {{traffic_class}}")],
                   description="95th percentile time requests waited before a GPU took them."),
        timeseries("End-to-end p95 by workload and model version", "s",
                   [Q(pct("e2e", "0.95", "workload, model_version"), "{{workload}} {{model_version}}")],
                   description="95th percentile of a request's whole duration per workload and version."),
        timeseries("End-to-end p99 by zone", "s",
                   [Q(pct("e2e", "0.99", "workload, zone"), "{{workload}} {{zone}}")],
                   description="99th percentile of a request's whole duration per zone."),
        timeseries("Inter-token latency p95 by model and version", "s",
                   [Q(pct("inter_token", "0.95", "model, model_version"), "{{model}} {{model_version}}")], w=12,
                   description="The mean gap between tokens of each answer, after the first token: slow decode "
                               "shows here while first output stays healthy."),
        timeseries("Stream completion ratio by model and zone", "percentunit", [Q(
            f"{rate(STREAMS_COMPLETED_TOTAL, 'model, zone')}\n"
            f"/ (({rate(STREAMS_TOTAL, 'model, zone')} - {rate(STREAMS_CANCELLED_TOTAL, 'model, zone')}) > 0)",
            "{{model}} {{zone}}")], w=12,
            description="Streams that ended normally, of those the client did not cancel; a stream cut mid-answer "
                        "behind an HTTP 200 counts against it."),
        timeseries("First output p50 / p95 / p99 (all selected slices)", "s", [
            Q(pct("first_output", q, ""), f"p{q[2:].ljust(2, '0')}") for q in ("0.5", "0.95", "0.99")
        ], w=12, description="Median, 95th and 99th percentile time to first output over every selected slice: a "
                             "p99 apart from the p50 is a tail, not the whole fleet slowing."),
        timeseries("Retried attempts by workload and zone", "reqps",
                   [Q(rate(REQUEST_RETRIES_TOTAL, "workload, zone"), "{{workload}} {{zone}}")], w=12,
                   description="A retry storm multiplies load while users wait: compare with queue age below."),
        timeseries("Busy GPUs by traffic class", "short", [
            Q(busy_gpus_by_traffic_class(), "{{traffic_class}}"),
            Q(f"sum({sel(GPUS)})", "GPUs"),
        ], w=12, stacked=False,
            description="Utilisation × GPUs of each pool, shared by the GPU-seconds each traffic class used there."),
        timeseries("Oldest queued request by pool", "s",
                   [Q(f"max by (pool) ({sel(QUEUE_OLDEST_AGE_SECONDS)})", "{{pool}}")], w=12,
                   description="High while utilisation is high: GPUs are busy and users are waiting."),
        *quality_panels(),
    ]
    return dashboard(UID_LATENCY, "tailwatch / Latency",
                     "Queue, first-output and end-to-end percentiles (newest closed minute per slice); utilisation beside queue age.",
                     panels, fleet_variables())
