"""Measured phase profiles for the planner: what each phase of a cascaded turn did in the
store's buckets (latency quantiles, throughput) joined with how it is deployed (a phase
setup file: device, batch size, workers, GPU SKU), as `PhaseProfile`s for `phase_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import polars as pl
from msgspec import Meta

from tailwatch.conventions import PHASE_NAMES
from tailwatch.planning.phase_plan import PhaseProfile
from tailwatch.slo import histogram
from tailwatch.config import ConfigStruct, load_struct
from tailwatch.slo.turn_phases import phase_latency


class PhaseSetup(ConfigStruct):
    """What the buckets cannot know about a phase: where it runs and how it is deployed."""

    device: Literal["cpu", "gpu", "none"] = "cpu"  # none: not compute (playback), left out of the plan
    batch_size: Annotated[float, Meta(ge=1.0, le=4096.0)] = 1.0
    workers: Annotated[int, Meta(ge=1)] | None = None  # deployed now, when known
    gpu_sku: str | None = None


class PhaseSetupFile(ConfigStruct):
    stages: dict[str, PhaseSetup] = {}
    cpu_usd_per_worker_hour: Annotated[float, Meta(ge=0.0)] = 0.10


# Typical deployments (batched GPU phases, CPU glue); a setup file overrides phase by phase.
DEFAULT_PHASE_SETUP = {
    "vad": PhaseSetup(device="cpu"),
    "asr_partial": PhaseSetup(device="gpu", batch_size=8, gpu_sku="L4"),
    "asr_final": PhaseSetup(device="gpu", batch_size=8, gpu_sku="L4"),
    "feature_extraction": PhaseSetup(device="cpu"),
    "acoustic_model": PhaseSetup(device="gpu", gpu_sku="L4"),
    "language_model": PhaseSetup(device="gpu", gpu_sku="H100"),
    "post_processing": PhaseSetup(device="cpu"),
    "retrieval": PhaseSetup(device="cpu"),
    "llm_first_token": PhaseSetup(device="gpu", batch_size=8, gpu_sku="H100"),
    "llm_decode": PhaseSetup(device="gpu", batch_size=32, gpu_sku="H100"),
    "tts_first_audio": PhaseSetup(device="gpu", batch_size=4, gpu_sku="L4"),
    "playback": PhaseSetup(device="none"),
    "tokenize": PhaseSetup(device="cpu"),
    "network": PhaseSetup(device="none"),
    "other": PhaseSetup(device="cpu"),
}


class PhaseSetupError(Exception):
    """A bad phase setup file (one line)."""


def load_phase_setup(path: str | None) -> PhaseSetupFile:
    if path is None:
        return PhaseSetupFile()
    f = load_struct(path, PhaseSetupFile, PhaseSetupError)
    unknown = sorted(set(f.stages) - set(PHASE_NAMES))
    if unknown:
        raise PhaseSetupError(f"{path}: unknown stage {unknown[0]!r} (known: {', '.join(PHASE_NAMES)})")
    return f


@dataclass(frozen=True)
class MeasuredPhases:
    profiles: list[PhaseProfile]  # the compute phases, in pipeline order
    left_out: list[str]  # phases measured but not compute (device none)
    minutes: int  # event-time minutes the profile spans
    turns: int  # turns with phase timings seen (the most samples of any phase)


def measured_profiles(buckets: pl.DataFrame, setup: PhaseSetupFile) -> MeasuredPhases:
    """Per phase: latency quantiles and throughput from the buckets, deployment from the setup.
    Service time is the measured median (it includes waiting inside the phase, so it errs
    towards a slower worker); utilisation is throughput × service time ÷ (workers × batch)
    where the workers are known."""
    if buckets.height == 0:
        return MeasuredPhases([], [], 0, 0)
    span_minutes = int((buckets["window_start"].max() - buckets["window_start"].min()).total_seconds() // 60) + 1
    seconds = span_minutes * 60.0
    profiles, left_out = [], []
    latency = phase_latency(buckets)
    for r in latency.iter_rows(named=True):
        s = setup.stages.get(r["stage"]) or DEFAULT_PHASE_SETUP.get(r["stage"], PhaseSetup())
        if s.device == "none":
            left_out.append(r["stage"])
            continue
        rps = r["samples"] / seconds
        service_ms = max(r["p50_ms"] or 0.0, histogram.MIN_VALUE_MS)
        busy = rps * service_ms / 1000.0 / (s.workers * s.batch_size) if s.workers else None
        profiles.append(PhaseProfile(
            stage=r["stage"], device=s.device, service_ms=service_ms, batch_size=s.batch_size,
            latency_p50_ms=r["p50_ms"], latency_p95_ms=r["p95_ms"], latency_p99_ms=r["p99_ms"], measured_rps=rps,
            workers=s.workers, utilisation=min(1.0, busy) if busy is not None else None,
            gpu_sku=s.gpu_sku if s.device == "gpu" else None))
    turns = int(latency["samples"].max()) if latency.height else 0
    return MeasuredPhases(profiles, left_out, span_minutes, turns)
