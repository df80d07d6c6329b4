"""Dashboard uids and the variables they filter on: stable names that pages link to.

Kept apart from the grafanalib definitions so that alert delivery can build links
without importing them.
"""

UID_FLEET = "tailwatch-fleet"
UID_SLO = "tailwatch-slo"
UID_LATENCY = "tailwatch-latency"
UID_CANARY = "tailwatch-canary"
UID_GPU = "tailwatch-gpu"
UID_COST = "tailwatch-cost"
UID_PIPELINE = "tailwatch-pipeline"

# The variables the fleet dashboards filter on; a metric is filtered on those it carries.
FILTER_LABELS = ("tenant", "model", "zone", "workload")

# Where a detector's page sends a person: the dashboard that shows its evidence.
DETECTOR_DASHBOARD = {
    "retry_storm": UID_FLEET,
    "queue_age": UID_LATENCY,
    "busy_but_slow": UID_LATENCY,
    "idle_but_slow": UID_LATENCY,
    "prompt_growth": UID_LATENCY,
    "kv_cache_pressure": UID_GPU,
    "cold_start": UID_GPU,
    "cost_regression": UID_COST,
    "anomaly": UID_CANARY,
    "cold_voice_storm": UID_LATENCY,  # the quality panels: warm-voice hits beside first audio
    "tenant_starving": UID_LATENCY,  # queue age and quota refusals per tenant
    "partial_churn": UID_LATENCY,
    "prompt_cache_collapse": UID_LATENCY,
    "voice_quality_drop": UID_LATENCY,  # the MOS proxy per voice
    "voice_fallback_surge": UID_LATENCY,  # TTS fallbacks by model
    "speculative_acceptance_drop": UID_LATENCY,  # speculative acceptance by model
}
