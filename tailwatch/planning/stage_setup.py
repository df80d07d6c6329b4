"""Measured stage profiles for the planner: what each stage of a cascaded turn did in the
store's buckets (latency quantiles, throughput) joined with how it is deployed (a stage
setup file: device, batch size, workers, GPU SKU), as `StageProfile`s for `stage_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import polars as pl
from msgspec import Meta

from tailwatch.conventions import STAGE_NAMES
from tailwatch.planning.stage_plan import StageProfile
from tailwatch.slo import histogram
from tailwatch.config import ConfigStruct, load_struct
from tailwatch.slo.turn_stages import stage_latency


class StageSetup(ConfigStruct):
    """What the buckets cannot know about a stage: where it runs and how it is deployed."""

    device: Literal["cpu", "gpu", "none"] = "cpu"  # none: not compute (playback), left out of the plan
    batch_size: Annotated[float, Meta(ge=1.0, le=4096.0)] = 1.0
    workers: Annotated[int, Meta(ge=1)] | None = None  # deployed now, when known
    gpu_sku: str | None = None


class StageSetupFile(ConfigStruct):
    stages: dict[str, StageSetup] = {}
    cpu_usd_per_worker_hour: Annotated[float, Meta(ge=0.0)] = 0.10


# Typical deployments (batched GPU stages, CPU glue); a setup file overrides stage by stage.
DEFAULT_STAGE_SETUP = {
    "vad": StageSetup(device="cpu"),
    "asr_partial": StageSetup(device="gpu", batch_size=8, gpu_sku="L4"),
    "asr_final": StageSetup(device="gpu", batch_size=8, gpu_sku="L4"),
    "feature_extraction": StageSetup(device="cpu"),
    "acoustic_model": StageSetup(device="gpu", gpu_sku="L4"),
    "language_model": StageSetup(device="gpu", gpu_sku="H100"),
    "post_processing": StageSetup(device="cpu"),
    "retrieval": StageSetup(device="cpu"),
    "llm_first_token": StageSetup(device="gpu", batch_size=8, gpu_sku="H100"),
    "llm_decode": StageSetup(device="gpu", batch_size=32, gpu_sku="H100"),
    "tts_first_audio": StageSetup(device="gpu", batch_size=4, gpu_sku="L4"),
    "playback": StageSetup(device="none"),
    "tokenize": StageSetup(device="cpu"),
    "network": StageSetup(device="none"),
    "other": StageSetup(device="cpu"),
}


class StageSetupError(Exception):
    """A bad stage setup file (one line)."""


def load_stage_setup(path: str | None) -> StageSetupFile:
    if path is None:
        return StageSetupFile()
    f = load_struct(path, StageSetupFile, StageSetupError)
    unknown = sorted(set(f.stages) - set(STAGE_NAMES))
    if unknown:
        raise StageSetupError(f"{path}: unknown stage {unknown[0]!r} (known: {', '.join(STAGE_NAMES)})")
    return f


@dataclass(frozen=True)
class MeasuredStages:
    profiles: list[StageProfile]  # the compute stages, in pipeline order
    left_out: list[str]  # stages measured but not compute (device none)
    minutes: int  # event-time minutes the profile spans
    turns: int  # turns with stage timings seen (the most samples of any stage)


def measured_profiles(buckets: pl.DataFrame, setup: StageSetupFile) -> MeasuredStages:
    """Per stage: latency quantiles and throughput from the buckets, deployment from the setup.
    Service time is the measured median (it includes waiting inside the stage, so it errs
    towards a slower worker); utilisation is throughput × service time ÷ (workers × batch)
    where the workers are known."""
    if buckets.height == 0:
        return MeasuredStages([], [], 0, 0)
    span_minutes = int((buckets["window_start"].max() - buckets["window_start"].min()).total_seconds() // 60) + 1
    seconds = span_minutes * 60.0
    profiles, left_out = [], []
    latency = stage_latency(buckets)
    for r in latency.iter_rows(named=True):
        s = setup.stages.get(r["stage"]) or DEFAULT_STAGE_SETUP.get(r["stage"], StageSetup())
        if s.device == "none":
            left_out.append(r["stage"])
            continue
        rps = r["samples"] / seconds
        service_ms = max(r["p50_ms"] or 0.0, histogram.MIN_VALUE_MS)
        busy = rps * service_ms / 1000.0 / (s.workers * s.batch_size) if s.workers else None
        profiles.append(StageProfile(
            stage=r["stage"], device=s.device, service_ms=service_ms, batch_size=s.batch_size,
            latency_p50_ms=r["p50_ms"], latency_p95_ms=r["p95_ms"], latency_p99_ms=r["p99_ms"], measured_rps=rps,
            workers=s.workers, utilisation=min(1.0, busy) if busy is not None else None,
            gpu_sku=s.gpu_sku if s.device == "gpu" else None))
    turns = int(latency["samples"].max()) if latency.height else 0
    return MeasuredStages(profiles, left_out, span_minutes, turns)
