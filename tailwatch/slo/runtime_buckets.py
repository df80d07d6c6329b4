"""The latency histogram bounds serving runtimes export by default, per SLI field, and the
bucket a threshold falls strictly inside.

A fleet that is scraped, not traced, reports each latency only as the bucket it fell in
(ingest/otlp/histogram_requests.py places it at the bucket's upper bound). A threshold
strictly between two bounds splits a bucket whose requests may be on either side: the SLI
counts them all bad, so it is a lower bound, and on traffic inside that bucket it can page
while every request met the threshold. `slo check` and the worker at start name such a
threshold and the bounds around it (`slo.spec.spec_warnings`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeHistogram:
    runtime: str
    metric: str
    field: str  # the request field it fills (conventions.LATENCY_FIELDS)
    bounds_ms: tuple[float, ...]
    workloads: tuple[str, ...] = ("llm",)  # what the runtime serves: an ASR SLO is not read from vLLM


# vLLM's defaults as its /metrics page carries them (tests/data/vllm, vLLM 0.32).
_VLLM_E2E_MS = (300.0, 500.0, 800.0, 1000.0, 1500.0, 2000.0, 2500.0, 5000.0, 10000.0, 15000.0, 20000.0, 30000.0,
                40000.0, 50000.0, 60000.0, 120000.0, 240000.0, 480000.0, 960000.0, 1920000.0, 7680000.0)
RUNTIME_HISTOGRAMS = (
    RuntimeHistogram("vLLM", "vllm:time_to_first_token_seconds", "first_output_ms",
                     (1.0, 5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0,
                      7500.0, 10000.0, 20000.0, 40000.0, 80000.0, 160000.0, 640000.0, 2560000.0)),
    RuntimeHistogram("vLLM", "vllm:e2e_request_latency_seconds", "e2e_ms", _VLLM_E2E_MS),
    RuntimeHistogram("vLLM", "vllm:request_queue_time_seconds", "queue_ms", _VLLM_E2E_MS),
    RuntimeHistogram("vLLM", "vllm:request_time_per_output_token_seconds", "inter_token_ms",
                     (10.0, 25.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 400.0, 500.0, 750.0, 1000.0, 2500.0,
                      5000.0, 7500.0, 10000.0, 20000.0, 40000.0, 80000.0)),
)


@dataclass(frozen=True)
class SplitBucket:
    histogram: RuntimeHistogram
    lower_ms: float
    upper_ms: float


def split_buckets(field: str, threshold_ms: float, workload: str | None = None) -> list[SplitBucket]:
    """Every runtime histogram of `field` (of a runtime serving `workload`, or any where None)
    with a bucket that `threshold_ms` falls strictly inside."""
    out = []
    for h in RUNTIME_HISTOGRAMS:
        if h.field != field or threshold_ms in h.bounds_ms or (workload is not None and workload not in h.workloads):
            continue
        for lower, upper in zip(h.bounds_ms, h.bounds_ms[1:]):
            if lower < threshold_ms < upper:
                out.append(SplitBucket(h, lower, upper))
    return out
