"""GPU fleet: utilisation and useful utilisation (SM active, SM occupancy, tensor pipes,
DRAM bandwidth, where GPUs report GPM or DCGM profiling), memory, power, temperature,
XID/ECC errors, replica states and KV-cache usage, by zone and pool (gauges of the newest
closed minute)."""

from __future__ import annotations

from tailwatch.dashboards.common import (
    RATE,
    UID_GPU,
    Q,
    dashboard,
    fleet_variables,
    sel,
    stat,
    thresholds,
    timeseries,
)
from tailwatch.conventions import (
    GPUS, GPUS_PROFILED, GPU_DRAM_BANDWIDTH_RATIO, GPU_ECC_ERRORS_TOTAL, GPU_KV_CACHE_USAGE_RATIO,
    GPU_MEMORY_TOTAL_BYTES, GPU_MEMORY_USED_BYTES, GPU_POWER_WATTS, GPU_REPLICAS, GPU_SM_ACTIVE_RATIO,
    GPU_SM_OCCUPANCY_RATIO, GPU_TEMPERATURE_CELSIUS, GPU_TENSOR_ACTIVE_RATIO, GPU_UTILIZATION_RATIO,
    GPU_XID_ERRORS_TOTAL, QUEUE_DEPTH_REQUESTS,
)


SM_ACTIVE = ("Share of time the SMs were active (NVML GPM on Hopper and later, or DCGM_FI_PROF_SM_ACTIVE), over the "
             "GPUs that report it: how much of the GPU works. A pool at high utilisation and low SM activity is "
             "held by small kernels, not full.")


def build(specs=None):
    panels = [
        stat("GPUs", "short", [Q(f"sum({sel(GPUS)})", instant=True)],
             description="GPUs that sent samples in the newest closed minute."),
        stat("Mean utilisation", "percentunit", [Q(
            f"sum({sel(GPU_UTILIZATION_RATIO)} * on (zone, pool, gpu_sku) {GPUS})"
            f" / sum({sel(GPUS)})", instant=True)],
             description="NVML utilisation: the share of time some kernel ran. It reads high while most SMs idle."),
        stat("Mean SM active", "percentunit", [Q(
            f"sum({sel(GPU_SM_ACTIVE_RATIO)} * on (zone, pool, gpu_sku) {GPUS_PROFILED})"
            f" / sum({sel(GPUS_PROFILED)})", instant=True)],
             description=SM_ACTIVE),
        stat("GPUs reporting SM activity", "short", [Q(f"sum({sel(GPUS_PROFILED)})", instant=True)],
             description="GPUs with GPM (Hopper and later, not in MIG mode) or DCGM profiling; the others "
                         "report utilisation only."),
        stat("XID errors (range)", "short",
             [Q(f"sum(increase({sel(GPU_XID_ERRORS_TOTAL)}[$__range]))", instant=True)],
             threshold_steps=thresholds((1, "red")),
             description="XID errors (driver-reported GPU faults) over the dashboard's time range."),
        stat("ECC errors (range)", "short",
             [Q(f"sum(increase({sel(GPU_ECC_ERRORS_TOTAL)}[$__range]))", instant=True)],
             threshold_steps=thresholds((1, "red")),
             description="Memory ECC errors over the dashboard's time range: a GPU that keeps them is drained."),
        timeseries("Utilisation by pool", "percentunit",
                   [Q(f"max by (zone, pool) ({sel(GPU_UTILIZATION_RATIO)})", "{{pool}}")], w=12,
                   description="NVML utilisation of each pool's busiest SKU group: the share of time a kernel ran."),
        timeseries("SM active by pool", "percentunit",
                   [Q(f"max by (zone, pool) ({sel(GPU_SM_ACTIVE_RATIO)})", "{{pool}}")], w=12,
                   description=SM_ACTIVE),
        timeseries("Busy but idle SMs: utilisation − SM active", "percentunit", [Q(
            f"max by (zone, pool) ({sel(GPU_UTILIZATION_RATIO)})"
            f" - max by (zone, pool) ({sel(GPU_SM_ACTIVE_RATIO)})", "{{pool}}")], w=6,
                   description="Time a kernel ran without keeping the SMs busy. Large: the GPUs are held by small "
                               "kernels (small batches, per-token synchronisation); batch more before adding GPUs."),
        timeseries("Tensor pipes active by pool", "percentunit",
                   [Q(f"max by (zone, pool) ({sel(GPU_TENSOR_ACTIVE_RATIO)})", "{{pool}}")], w=6,
                   description="Share of cycles the tensor cores were busy (GPM or DCGM profiling)."),
        timeseries("SM occupancy by pool", "percentunit",
                   [Q(f"max by (zone, pool) ({sel(GPU_SM_OCCUPANCY_RATIO)})", "{{pool}}")], w=6,
                   description="Resident warps over the maximum the SMs can hold."),
        timeseries("DRAM bandwidth by pool", "percentunit",
                   [Q(f"max by (zone, pool) ({sel(GPU_DRAM_BANDWIDTH_RATIO)})", "{{pool}}")], w=6,
                   description="Memory bandwidth used over the GPU's peak: high with SMs idle is memory-bound decode."),
        timeseries("Memory used by pool", "percentunit", [Q(
            f"sum by (pool) ({sel(GPU_MEMORY_USED_BYTES)})"
            f" / sum by (pool) ({sel(GPU_MEMORY_TOTAL_BYTES)})", "{{pool}}")], w=12,
                   description="GPU memory in use over GPU memory, per pool (weights, KV cache and activations)."),
        timeseries("Memory used by zone", "bytes",
                   [Q(f"sum by (zone) ({sel(GPU_MEMORY_USED_BYTES)})", "{{zone}}")],
                   description="GPU memory in use, summed per zone."),
        timeseries("Power by zone", "watt", [Q(f"sum by (zone) ({sel(GPU_POWER_WATTS)})", "{{zone}}")],
                   description="Board power drawn by the zone's GPUs."),
        timeseries("Hottest GPU by zone", "celsius",
                   [Q(f"max by (zone) ({sel(GPU_TEMPERATURE_CELSIUS)})", "{{zone}}")],
                   threshold_steps=thresholds((83, "red")),
                   description="The hottest GPU in each zone; the line is where data-centre GPUs start to slow."),
        timeseries("XID and ECC errors by pool", "short", [
            Q(f"sum by (pool) (increase({sel(GPU_XID_ERRORS_TOTAL)}[{RATE}]))", "XID {{pool}}"),
            Q(f"sum by (pool) (increase({sel(GPU_ECC_ERRORS_TOTAL)}[{RATE}]))", "ECC {{pool}}"),
        ], description="XID and ECC errors per pool over each rate window: a pool failing requests with these is "
                       "a hardware fault, not load."),
        timeseries("Replicas by state", "short",
                   [Q(f"sum by (state) ({sel(GPU_REPLICAS)})", "{{state}}")], stacked=True,
                   description="Serving replicas by state (ready, loading, draining …), as the runtimes report."),
        timeseries("KV-cache usage by pool (fullest replica)", "percentunit",
                   [Q(f"max by (pool) ({sel(GPU_KV_CACHE_USAGE_RATIO)})", "{{pool}}")],
                   threshold_steps=thresholds((0.9, "red")),
                   description="KV-cache usage of each pool's fullest replica: past the line, requests queue or are "
                               "preempted."),
        timeseries("GPUs by zone and SKU", "short",
                   [Q(f"sum by (zone, gpu_sku) ({sel(GPUS)})", "{{zone}} {{gpu_sku}}")], w=12,
                   description="GPUs sending samples by zone and SKU: a drop is GPUs lost or telemetry gone."),
        timeseries("Queued requests by zone", "short",
                   [Q(f"sum by (zone) ({sel(QUEUE_DEPTH_REQUESTS)})", "{{zone}}")], w=12,
                   description="Requests waiting in the runtimes' queues, by zone."),
    ]
    return dashboard(UID_GPU, "tailwatch / GPU fleet", "GPU health and capacity by zone and pool.", panels,
                     fleet_variables())
