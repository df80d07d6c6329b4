"""Every name tailwatch shows the outside world, defined once: Kafka topics, Prometheus
metric families and recording rules.

Exporters, dashboards, alert rules and the tools import these constants; no other module
spells a `tailwatch_*` name or a topic in code (tests/test_conventions.py holds that).
Names follow Prometheus conventions: base units in the name (`_seconds`, `_bytes`,
`_ratio` for 0-1), counters end in `_total` (prometheus-client drops the suffix from a
family's name and adds it back to the sample), histograms are named by their family
(`_bucket`, `_count`, `_sum` are added by the exposition).

Label names are the slice labels below (the wire contract's field names, which the SLOs
slice by and the buckets are cut by) plus the closed sets each family documents beside its
definition.
"""

# ---- the slice of a request: labels, their closed value sets, measured fields ----------------
SLICE_LABELS = ("tenant", "model", "model_version", "zone", "workload", "traffic_class", "deployment", "pool",
                "language", "voice")
# Slice labels added after stores and checkpoints existed: a slice that leaves them empty is
# the slice it was before they existed (same identity in open partials, same rows).
LATER_SLICE_LABELS = ("language", "voice")
WORKLOADS = ("asr", "tts", "llm", "s2s", "embed")
TRAFFIC_CLASSES = ("realtime", "batch", "eval", "replay", "shadow")
DEPLOYMENTS = ("stable", "canary", "shadow")
CLOSED_LABELS = {"workload": WORKLOADS, "traffic_class": TRAFFIC_CLASSES, "deployment": DEPLOYMENTS}
# The value a slice label takes past its cardinality cap (streams/cardinality.py): every value
# the worker had no room for is counted under it, in one overflow slice per closed-label set.
OVERFLOW_LABEL_VALUE = "__other__"
# Appended only: checkpoints number histogram fields by their place here.
LATENCY_FIELDS = ("queue_ms", "first_output_ms", "e2e_ms", "inter_token_ms", "finalization_ms")
# A scraped runtime's histogram says only which bucket a latency fell in: the request then
# carries the bucket's lower bound beside the latency (placed at the upper bound), so an SLO
# whose threshold falls strictly inside the bucket can tell those events undecided, not bad.
# Latency field → its lower-bound field. Appended only: checkpoints number them by place.
LATENCY_LOWER_FIELDS = {"queue_ms": "queue_lower_ms", "first_output_ms": "first_output_lower_ms",
                        "e2e_ms": "e2e_lower_ms", "inter_token_ms": "inter_token_lower_ms"}
# Phases of a cascaded turn: a speech-to-speech turn's budget and an ASR pipeline's steps.
# Names are bounded: a phase outside this list is kept under `other`, so a producer's new
# phase costs one bucket, not a label per name. Appended only: checkpoints number phases by
# their place here.
PHASE_NAMES = ("vad", "asr_partial", "asr_final", "feature_extraction", "acoustic_model", "language_model",
               "post_processing", "retrieval", "llm_first_token", "llm_decode", "tts_first_audio", "playback",
               "tokenize", "network", "other")

# ---- Kafka topics: the suffix after --topic-prefix ("tw." by default) -----------------------
TOPIC_REQUESTS = "requests"      # request.v1 events from serving runtimes and the OTLP adapter
TOPIC_GPU = "gpu"                # gpu.v1 samples from collectors
TOPIC_DEPLOYS = "deploys"        # deploy.v1 markers from rollout controllers
TOPIC_SLI = "sli"                # partial and closed minute buckets, tier 1 to tier 2
TOPIC_ALERTS = "alerts"          # reserved for alert changes (created; nothing writes it yet)
TOPIC_DEADLETTER = "deadletter"  # records refused, each with its reason
TOPIC_SUFFIXES = (TOPIC_REQUESTS, TOPIC_GPU, TOPIC_DEPLOYS, TOPIC_SLI, TOPIC_ALERTS, TOPIC_DEADLETTER)

# ---- the worker's own health (streams/metrics.py) ------------------------------------------
EVENTS_TOTAL = "tailwatch_events_total"
DEAD_LETTERS_TOTAL = "tailwatch_dead_letters_total"
PUBLISH_FAILURES_TOTAL = "tailwatch_publish_failures_total"
CONSUMER_GROUP_RESCUES_TOTAL = "tailwatch_consumer_group_rescues_total"
LOG_RESETS_TOTAL = "tailwatch_log_resets_total"  # labels topic, reason: streams/log_reset.py REASONS
HTTP_RESTARTS_TOTAL = "tailwatch_http_restarts_total"
HTTP_REFUSED_TOTAL = "tailwatch_http_refused_total"
FLAGGER_EVENTS_TOTAL = "tailwatch_flagger_events_total"  # labels phase, event_type: these sets, or `other`
FLAGGER_PHASES = ("Initializing", "Initialized", "Waiting", "Progressing", "WaitingPromotion", "Promoting", "Finalising",
                  "Succeeded", "Failed", "Terminating", "Terminated")  # Flagger's CanaryPhase
FLAGGER_EVENT_TYPES = ("Normal", "Warning")  # Kubernetes event types
LATE_EVENTS_TOTAL = "tailwatch_late_events_total"
CORRECTED_EVENTS_TOTAL = "tailwatch_corrected_events_total"
STATE_BYTES = "tailwatch_state_bytes"
PROCESS_MEMORY_BYTES = "tailwatch_process_memory_bytes"
STORE_MEMORY_LIMIT_BYTES = "tailwatch_store_memory_limit_bytes"
UNKNOWN_FIELDS_DROPPED_TOTAL = "tailwatch_unknown_fields_dropped_total"
BUCKETS_CLOSED_TOTAL = "tailwatch_buckets_closed_total"
BUCKET_CLOSE_DELAY_SECONDS = "tailwatch_bucket_close_delay_seconds"  # histogram
CONSUMER_LAG_MESSAGES = "tailwatch_consumer_lag_messages"
WATERMARK_TIMESTAMP_SECONDS = "tailwatch_watermark_timestamp_seconds"
OPEN_BUCKETS = "tailwatch_open_buckets"
PARTITIONS_PAUSED = "tailwatch_partitions_paused"
DEDUPE_IDS = "tailwatch_dedupe_ids"
STAGE_CPU_SECONDS_TOTAL = "tailwatch_stage_cpu_seconds_total"
# Cardinality caps (streams/cardinality.py): events whose label value had no room (label: a
# slice label), events whose slice had no room, and the values each label holds now.
LABEL_VALUES_OVERFLOWED_TOTAL = "tailwatch_label_values_overflowed_total"
SLICES_OVERFLOWED_TOTAL = "tailwatch_slices_overflowed_total"
LABEL_VALUES = "tailwatch_label_values"
CHECKPOINT_DURATION_SECONDS = "tailwatch_checkpoint_duration_seconds"  # histogram

# ---- the fleet: traffic, latency, GPUs, cost (streams/fleet_metrics.py) ----------------------
# The labels each kind of fleet series carries (dashboards filter by them).
TRAFFIC_LABELS = ("tenant", "model", "model_version", "zone", "workload", "traffic_class", "deployment")
# attribution_basis: how the GPU time was known (planning/work_estimate.py BASES: reported, tokens, audio,
# wall_time, no_gpu_telemetry), so a cost panel can say what it stands on.
GPU_TIME_LABELS = ("tenant", "model", "zone", "workload", "traffic_class", "deployment", "pool", "gpu_sku",
                   "attribution_basis")
LATENCY_LABELS = ("model", "model_version", "zone", "workload", "traffic_class", "deployment")
POOL_LABELS = ("zone", "pool", "gpu_sku")
REQUESTS_TOTAL = "tailwatch_requests_total"
REQUEST_RETRIES_TOTAL = "tailwatch_request_retries_total"
TURNS_TOTAL = "tailwatch_turns_total"
SUCCESSFUL_TURNS_TOTAL = "tailwatch_successful_turns_total"
PROMPT_TOKENS_TOTAL = "tailwatch_prompt_tokens_total"
OUTPUT_TOKENS_TOTAL = "tailwatch_output_tokens_total"
AUDIO_SECONDS_TOTAL = "tailwatch_audio_seconds_total"
SUCCESSFUL_AUDIO_SECONDS_TOTAL = "tailwatch_successful_audio_seconds_total"
STREAMS_TOTAL = "tailwatch_streams_total"
STREAMS_COMPLETED_TOTAL = "tailwatch_streams_completed_total"
STREAMS_CUT_TOTAL = "tailwatch_streams_cut_total"
STREAMS_TIMED_OUT_TOTAL = "tailwatch_streams_timed_out_total"
STREAMS_CANCELLED_TOTAL = "tailwatch_streams_cancelled_total"
REQUEST_GPU_SECONDS_TOTAL = "tailwatch_request_gpu_seconds_total"
# Refusals and failures by reason, and speech and LLM quality counts (streams/aggregates.py).
QUOTA_REJECTIONS_TOTAL = "tailwatch_quota_rejections_total"
OOM_FAILURES_TOTAL = "tailwatch_oom_failures_total"
ASR_PARTIAL_REVISIONS_TOTAL = "tailwatch_asr_partial_revisions_total"
ASR_TURNS_REPORTING_PARTIALS_TOTAL = "tailwatch_asr_turns_reporting_partials_total"
ASR_ENDPOINTING_ERRORS_TOTAL = "tailwatch_asr_endpointing_errors_total"
ASR_TURNS_REPORTING_ENDPOINTING_TOTAL = "tailwatch_asr_turns_reporting_endpointing_total"
TTS_UNDERRUNS_TOTAL = "tailwatch_tts_underruns_total"
TTS_STREAMS_WITH_UNDERRUNS_TOTAL = "tailwatch_tts_streams_with_underruns_total"
TTS_STREAMS_REPORTING_UNDERRUNS_TOTAL = "tailwatch_tts_streams_reporting_underruns_total"
TTS_VOICE_CACHE_HITS_TOTAL = "tailwatch_tts_voice_cache_hits_total"
TTS_VOICE_CACHE_LOOKUPS_TOTAL = "tailwatch_tts_voice_cache_lookups_total"
TTS_FALLBACKS_TOTAL = "tailwatch_tts_fallbacks_total"
CACHED_PROMPT_TOKENS_TOTAL = "tailwatch_cached_prompt_tokens_total"
SPECULATIVE_DRAFT_TOKENS_TOTAL = "tailwatch_speculative_draft_tokens_total"
SPECULATIVE_ACCEPTED_TOKENS_TOTAL = "tailwatch_speculative_accepted_tokens_total"
# Sampled evaluations (eval.v1): ASR word errors over the references' words (WER as a ratio of sums).
ASR_WORD_ERRORS_TOTAL = "tailwatch_asr_word_errors_total"
ASR_REFERENCE_WORDS_TOTAL = "tailwatch_asr_reference_words_total"
# ... and TTS MOS proxies: their number and the sum of their scores (mean MOS as a ratio of sums).
TTS_MOS_EVALUATIONS_TOTAL = "tailwatch_tts_mos_evaluations_total"
TTS_MOS_SCORE_TOTAL = "tailwatch_tts_mos_score_total"
REQUEST_LATENCY_SECONDS = "tailwatch_request_latency_seconds"  # histogram
GPU_SECONDS_TOTAL = "tailwatch_gpu_seconds_total"
GPU_XID_ERRORS_TOTAL = "tailwatch_gpu_xid_errors_total"
GPU_ECC_ERRORS_TOTAL = "tailwatch_gpu_ecc_errors_total"
GPUS = "tailwatch_gpus"
GPUS_PROFILED = "tailwatch_gpus_profiled"
GPU_UTILIZATION_RATIO = "tailwatch_gpu_utilization_ratio"
GPU_SM_ACTIVE_RATIO = "tailwatch_gpu_sm_active_ratio"
GPU_SM_OCCUPANCY_RATIO = "tailwatch_gpu_sm_occupancy_ratio"
GPU_TENSOR_ACTIVE_RATIO = "tailwatch_gpu_tensor_active_ratio"
GPU_DRAM_BANDWIDTH_RATIO = "tailwatch_gpu_dram_bandwidth_ratio"
GPU_MEMORY_USED_BYTES = "tailwatch_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL_BYTES = "tailwatch_gpu_memory_total_bytes"
GPU_POWER_WATTS = "tailwatch_gpu_power_watts"
GPU_TEMPERATURE_CELSIUS = "tailwatch_gpu_temperature_celsius"
GPU_KV_CACHE_USAGE_RATIO = "tailwatch_gpu_kv_cache_usage_ratio"
GPU_REPLICAS = "tailwatch_gpu_replicas"
QUEUE_OLDEST_AGE_SECONDS = "tailwatch_queue_oldest_age_seconds"
QUEUE_DEPTH_REQUESTS = "tailwatch_queue_depth_requests"
GPU_PRICE_USD_PER_GPU_SECOND = "tailwatch_gpu_price_usd_per_gpu_second"
FLEET_LABEL_SETS = "tailwatch_fleet_label_sets"
FLEET_LABEL_SETS_LIMIT = "tailwatch_fleet_label_sets_limit"
FLEET_FOLDED_BUCKETS_TOTAL = "tailwatch_fleet_folded_buckets_total"

# ---- SLOs and alerts (streams/slo_stage.py, alerts/) ---------------------------------------
SLO_OBJECTIVE_RATIO = "tailwatch_slo_objective_ratio"
SLO_SLI_RATIO = "tailwatch_slo_sli_ratio"
SLO_SLI_UPPER_RATIO = "tailwatch_slo_sli_upper_ratio"
SLO_BURN_RATE = "tailwatch_slo_burn_rate"
SLO_ERROR_BUDGET_REMAINING_RATIO = "tailwatch_slo_error_budget_remaining_ratio"
SLO_EVENTS_TOTAL = "tailwatch_slo_events_total"
# 1 once an SLO's selector has matched a bucket since the worker started (its rebuild included).
SLO_SELECTOR_MATCHED = "tailwatch_slo_selector_matched"
ALERTS_FIRING = "tailwatch_alerts_firing"
ALERTS_DELIVERED_TOTAL = "tailwatch_alerts_delivered_total"
ALERTS_REFUSED_TOTAL = "tailwatch_alerts_refused_total"
ALERTS_PENDING = "tailwatch_alerts_pending"
# Prometheus-side recording rules over SLO_EVENTS_TOTAL; the window ("5m", "1h") is appended.
SLO_ERROR_RATIO_RATE_RULE = "tailwatch_slo:error_ratio:rate"
SLO_EVENTS_INCREASE_RULE = "tailwatch_slo:events:increase"

# ---- anomaly and fleet detectors (streams/detector_stage.py) -------------------------------
DETECTIONS_TOTAL = "tailwatch_detections_total"
DETECTIONS_ACTIVE = "tailwatch_detections_active"
# One series per open detection: detector, the slice labels, and `evidence` (fixed at raise).
DETECTION_STARTED_TIMESTAMP_SECONDS = "tailwatch_detection_started_timestamp_seconds"
DETECTOR_PROCESSED_TIMESTAMP_SECONDS = "tailwatch_detector_processed_timestamp_seconds"
ANOMALY_MODEL_VERSION = "tailwatch_anomaly_model_version"
