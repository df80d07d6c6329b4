"""Model version / canary: the canary against the stable version on the signals a
rollout decision reads (error ratio, tail latency, turn success, cost per 1k tokens)."""

from __future__ import annotations

from tailwatch.dashboards.common import (
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
from tailwatch.conventions import (
    OUTPUT_TOKENS_TOTAL, REQUESTS_TOTAL, REQUEST_GPU_SECONDS_TOTAL, STREAMS_CANCELLED_TOTAL,
    STREAMS_COMPLETED_TOTAL, STREAMS_TOTAL, SUCCESSFUL_TURNS_TOTAL, TURNS_TOTAL,
)

BY = "model, deployment"
LEGEND = "{{model}} {{deployment}}"


def build(specs=None):
    panels = [
        timeseries("Requests by model version", "reqps",
                   [Q(rate(REQUESTS_TOTAL, "model, model_version, deployment"),
                      "{{model}} {{model_version}} ({{deployment}})")], w=12, stacked=True,
                   description="Attempts per second by model version and deployment: how much of the traffic the "
                               "canary takes at each weight step."),
        timeseries("Error ratio, canary vs stable", "percentunit", [Q(
            f"{rate(REQUESTS_TOTAL, BY, outcome=ERRORS)}\n"
            f"/ ({rate(REQUESTS_TOTAL, BY, outcome=NOT_CANCELLED)} > 0)", LEGEND)], w=12,
            description="Failed attempts (error, timeout, shed) over attempts not cancelled by the client, canary "
                        "beside stable: the rollout gate's error comparison."),
        timeseries("First output p95, canary vs stable", "s", [Q(
            latency_quantile("first_output", "0.95", "model, model_version, deployment"),
            "{{model}} {{model_version}} ({{deployment}})")], w=12,
            description="95th percentile of time to the first token or audio chunk, from the histogram's buckets "
                        "(exact to a bucket's bounds)."),
        timeseries("End-to-end p99, canary vs stable", "s", [Q(
            latency_quantile("e2e", "0.99", "model, model_version, deployment"),
            "{{model}} {{model_version}} ({{deployment}})")], w=12,
            description="99th percentile of a request's whole duration, canary beside stable."),
        timeseries("Inter-token latency p95, canary vs stable", "s", [Q(
            latency_quantile("inter_token", "0.95", "model, model_version, deployment"),
            "{{model}} {{model_version}} ({{deployment}})")], w=12,
            description="A canary that decodes slowly keeps a healthy first token; the gap between tokens shows it."),
        timeseries("Stream completion ratio, canary vs stable", "percentunit", [Q(
            f"{rate(STREAMS_COMPLETED_TOTAL, BY)}\n"
            f"/ (({rate(STREAMS_TOTAL, BY)} - {rate(STREAMS_CANCELLED_TOTAL, BY)}) > 0)", LEGEND)],
            w=12, description="Answer streams that ended normally, of those the client did not cancel: a canary that "
                              "cuts answers behind HTTP 200 shows here."),
        timeseries("Turn success ratio, canary vs stable", "percentunit", [Q(
            f"{rate(SUCCESSFUL_TURNS_TOTAL, BY)}\n/ ({rate(TURNS_TOTAL, BY)} > 0)", LEGEND)],
            description="Turns that succeeded for the user, retries folded in, over all turns."),
        timeseries("GPU cost per 1,000 output tokens, canary vs stable", "currencyUSD", [Q(
            per_unit(allocated_cost_usd_per_second(BY), OUTPUT_TOKENS_TOTAL, BY, 1000), LEGEND)],
            description="Each side's share of its pools' GPU cost (idle included) over the output tokens it "
                        "delivered, per 1,000: the rollout gate's cost comparison."),
        timeseries("GPU-seconds per attempt, canary vs stable", "s", [Q(
            f"{rate(REQUEST_GPU_SECONDS_TOTAL, BY)}\n/ ({rate(REQUESTS_TOTAL, BY)} > 0)",
            LEGEND)],
            description="GPU time a request attempt used on average (reported by the runtime, or attributed from "
                        "pool utilisation where it reports none)."),
    ]
    return dashboard(UID_CANARY, "tailwatch / Model version and canary",
                     "Canary against stable on the rollout signals.", panels, fleet_variables())
