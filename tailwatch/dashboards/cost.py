"""Cost and goodput: GPU cost per successful turn, per 1,000 output tokens and per
successful audio minute, idle GPU cost, by tenant, model and workload. All PromQL over GPU-seconds
and the price per SKU (`tailwatch_gpu_price_usd_per_gpu_second`), idle time allocated as
the cost report does (see `dashboards.common.allocated_cost_usd_per_second`)."""

from __future__ import annotations

from tailwatch.dashboards.common import (
    PRICE,
    RATE,
    UID_COST,
    Q,
    allocated_cost_usd_per_second,
    dashboard,
    fleet_variables,
    per_unit,
    rate,
    sel,
    stat,
    table,
    timeseries,
)
from tailwatch.conventions import (
    GPU_SECONDS_TOTAL, OUTPUT_TOKENS_TOTAL, REQUEST_GPU_SECONDS_TOTAL, SUCCESSFUL_AUDIO_SECONDS_TOTAL,
    SUCCESSFUL_TURNS_TOTAL, TURNS_TOTAL,
)


def idle_cost_usd_per_hour() -> str:
    """Per pool: (fleet GPU-seconds − request GPU-seconds) × price, never below zero
    (batched requests can use more GPU-seconds than the wall clock gives a GPU)."""
    fleet = f"sum by (zone, pool, gpu_sku) (rate({sel(GPU_SECONDS_TOTAL)}[{RATE}]))"
    used = f"sum by (pool) (rate({REQUEST_GPU_SECONDS_TOTAL}[{RATE}]))"
    return (f"sum by (zone, pool) (\n"
            f"  clamp_min(({fleet} - on (pool) group_left() {used}) or {fleet}, 0)\n"
            f"  * on (gpu_sku) group_left() {PRICE}\n"
            f") * 3600")


def build(specs=None):
    turns = SUCCESSFUL_TURNS_TOTAL
    panels = [
        stat("GPU spend per hour", "currencyUSD",
             [Q(f"sum({allocated_cost_usd_per_second('workload')}) * 3600", instant=True)], w=6,
             description="Filtered traffic's share of its pools' cost, idle included."),
        stat("Idle GPU cost per hour", "currencyUSD", [Q(f"sum({idle_cost_usd_per_hour()})", instant=True)], w=6,
             description="What the selected pools' GPUs cost per hour while no request used them."),
        stat("GPU cost per successful turn", "currencyUSD",
             [Q(f"sum({allocated_cost_usd_per_second('workload')}) / (sum({rate(turns, 'workload')}) > 0)",
                instant=True)], w=6,
             description="GPU cost (idle included) over the turns that succeeded: failed and retried turns make "
                         "every good one dearer."),
        stat("Goodput: turn success ratio", "percentunit",
             [Q(f"sum({rate(turns, 'workload')}) / (sum({rate(TURNS_TOTAL, 'workload')}) > 0)",
                instant=True)], w=6, description="Turns that succeeded over all turns."),
        timeseries("GPU cost per successful turn by workload", "currencyUSD",
                   [Q(per_unit(allocated_cost_usd_per_second("workload"), turns, "workload"), "{{workload}}")], w=12,
                   description="GPU cost, idle included, over successful turns, by workload."),
        timeseries("GPU cost per successful turn by model", "currencyUSD",
                   [Q(per_unit(allocated_cost_usd_per_second("model"), turns, "model"), "{{model}}")], w=12,
                   description="GPU cost, idle included, over successful turns, by model."),
        table("GPU cost per successful turn by tenant", "currencyUSD",
              [Q(per_unit(allocated_cost_usd_per_second("tenant"), turns, "tenant"), instant=True,
                 column="Cost per successful turn")], w=8, h=9,
              description="Each tenant's share of its pools' GPU cost over its successful turns, now."),
        timeseries("GPU cost per 1,000 output tokens by model", "currencyUSD",
                   [Q(per_unit(allocated_cost_usd_per_second("model"), OUTPUT_TOKENS_TOTAL, "model", 1000),
                      "{{model}}")], h=9,
                   description="GPU cost, idle included, over output tokens delivered, per 1,000 (LLM models)."),
        # Audio of failed attempts is no product: a canary that fails more costs more per minute served.
        timeseries("GPU cost per successful audio minute by model", "currencyUSD",
                   [Q(per_unit(allocated_cost_usd_per_second("model"), SUCCESSFUL_AUDIO_SECONDS_TOTAL, "model", 60),
                      "{{model}}")], h=9,
                   description="GPU cost over minutes of audio that succeeded (ASR heard, TTS spoken), by model."),
        timeseries("GPU spend per hour by tenant", "currencyUSD",
                   [Q(f"{allocated_cost_usd_per_second('tenant')} * 3600", "{{tenant}}")], w=12, stacked=True,
                   description="Each tenant's share of GPU cost per hour, idle shared in proportion to use; stacked "
                               "to the fleet's spend."),
        timeseries("Idle GPU cost per hour by pool", "currencyUSD", [Q(idle_cost_usd_per_hour(), "{{pool}}")],
                   w=12, stacked=True,
                   description="Per pool, GPU-seconds paid for but not used by requests, times the SKU's price."),
        timeseries("Goodput: successful turns by tenant", "cps", [Q(rate(turns, "tenant"), "{{tenant}}")], w=12,
                   description="Successful turns per second by tenant: the useful work the cost pays for."),
        timeseries("GPU-seconds: fleet against used by requests", "s", [
            Q(f"sum(rate({sel(GPU_SECONDS_TOTAL)}[{RATE}]))", "fleet (paid)"),
            Q(f"sum({rate(REQUEST_GPU_SECONDS_TOTAL, 'workload')})", "used by requests"),
        ], w=12, description="GPU-seconds per second: the gap is idle time."),
        timeseries("GPU time used, by how it is known", "s",
                   [Q(f"sum by (attribution_basis) (rate({sel(REQUEST_GPU_SECONDS_TOTAL)}[{RATE}]))",
                      "{{attribution_basis}}")], w=12, stacked=True,
                   description="reported: the requests' own gpu_seconds. For runtimes that report none (vLLM, TGI, "
                               "Triton, OpenTelemetry), each pool-minute's busy GPU time (GPUs × utilisation) shared "
                               "by tokens (prompt tokens weighted by a per-pool fit), audio seconds, or wall_time; "
                               "no_gpu_telemetry: the pool sent no GPU rows, so nothing is attributed. Every cost "
                               "panel here stands on this."),
    ]
    return dashboard(UID_COST, "tailwatch / Cost and goodput", "GPU cost per unit of useful work, and idle cost.",
                     panels, fleet_variables(), time_from="now-24h")
