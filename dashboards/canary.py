"""Model version / canary: the canary against the stable version on the signals a
rollout decision reads (error ratio, tail latency, turn success, cost per 1k tokens)."""

from __future__ import annotations

from dashboards.common import (
    ERRORS,
    NOT_CANCELLED,
    UID_CANARY,
    Q,
    allocated_cost_usd_per_second,
    dashboard,
    fleet_variables,
    latency_quantile,
    per_unit,
    rate,
    timeseries,
)

BY = "model, deployment"
LEGEND = "{{model}} {{deployment}}"


def build(specs=None):
    panels = [
        timeseries("Requests by model version", "reqps",
                   [Q(rate("tailwatch_requests_total", "model, model_version, deployment"),
                      "{{model}} {{model_version}} ({{deployment}})")], w=12, stacked=True),
        timeseries("Error ratio, canary vs stable", "percentunit", [Q(
            f"{rate('tailwatch_requests_total', BY, outcome=ERRORS)}\n"
            f"/ ({rate('tailwatch_requests_total', BY, outcome=NOT_CANCELLED)} > 0)", LEGEND)], w=12),
        timeseries("First output p95, canary vs stable", "s", [Q(
            latency_quantile("first_output", "0.95", "model, model_version, deployment"),
            "{{model}} {{model_version}} ({{deployment}})")], w=12),
        timeseries("End-to-end p99, canary vs stable", "s", [Q(
            latency_quantile("e2e", "0.99", "model, model_version, deployment"),
            "{{model}} {{model_version}} ({{deployment}})")], w=12),
        timeseries("Inter-token latency p95, canary vs stable", "s", [Q(
            latency_quantile("inter_token", "0.95", "model, model_version, deployment"),
            "{{model}} {{model_version}} ({{deployment}})")], w=12,
            description="A canary that decodes slowly keeps a healthy first token; the gap between tokens shows it."),
        timeseries("Stream completion ratio, canary vs stable", "percentunit", [Q(
            f"{rate('tailwatch_streams_completed_total', BY)}\n"
            f"/ (({rate('tailwatch_streams_total', BY)} - {rate('tailwatch_streams_cancelled_total', BY)}) > 0)", LEGEND)],
            w=12),
        timeseries("Turn success ratio, canary vs stable", "percentunit", [Q(
            f"{rate('tailwatch_successful_turns_total', BY)}\n/ ({rate('tailwatch_turns_total', BY)} > 0)", LEGEND)]),
        timeseries("GPU cost per 1,000 output tokens, canary vs stable", "currencyUSD", [Q(
            per_unit(allocated_cost_usd_per_second(BY), "tailwatch_output_tokens_total", BY, 1000), LEGEND)]),
        timeseries("GPU-seconds per attempt, canary vs stable", "s", [Q(
            f"{rate('tailwatch_request_gpu_seconds_total', BY)}\n/ ({rate('tailwatch_requests_total', BY)} > 0)",
            LEGEND)]),
    ]
    return dashboard(UID_CANARY, "tailwatch / Model version and canary",
                     "Canary against stable on the rollout signals.", panels, fleet_variables())
