"""Stages of a cascaded turn: per-stage latency from `stages_hist`, and which stage overspent
its budget when a `stage_budget` SLO burns.

A turn's target (first audio within 1.5 s) is split into shares per stage (VAD, ASR final,
LLM first token, TTS first audio, ...). Buckets keep one histogram per stage and slice-minute,
not the turns themselves, so the attribution is per stage: of the samples of each budgeted
stage, how many ran over that stage's share (exact when a budget is a histogram bin bound,
otherwise the bin holding it counts as over, as for latency SLIs). The stage with the largest
share of samples over its budget is the one that overspent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Iterable, Literal

import polars as pl
from msgspec import Meta

from ingest.schema import STAGE_NAMES
from slo import histogram
from slo.config_file import ConfigStruct, load_struct
from slo.spec import SloSpec
from slo.stage_plan import StageProfile

_ORDER = {name: i for i, name in enumerate(STAGE_NAMES)}


def stage_histograms(buckets: pl.DataFrame, by: Iterable[str] = ()) -> pl.DataFrame:
    """Long rows (*by, stage, bin, n), summed over the given buckets."""
    by = list(by)
    if buckets.height == 0 or "stages_hist" not in buckets.columns:
        return pl.DataFrame(schema={**{k: pl.String for k in by}, "stage": pl.String, "bin": pl.Int16, "n": pl.Int64})
    return (
        buckets.select(*by, "stages_hist").explode("stages_hist").drop_nulls("stages_hist").unnest("stages_hist")
        .group_by(*by, "stage", "bin").agg(pl.col("n").sum())
    )


def stage_latency(buckets: pl.DataFrame, by: Iterable[str] = ()) -> pl.DataFrame:
    """(*by, stage, samples, p50_ms, p95_ms, p99_ms), stages in pipeline order."""
    by = list(by)
    long = stage_histograms(buckets, by)
    if long.height == 0:
        return pl.DataFrame(schema={**{k: pl.String for k in by}, "stage": pl.String, "samples": pl.Int64,
                                    "p50_ms": pl.Float64, "p95_ms": pl.Float64, "p99_ms": pl.Float64})
    keys = [*by, "stage"]
    qs = histogram.quantiles_frame(long, keys, {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99})
    samples = long.group_by(keys).agg(pl.col("n").sum().alias("samples"))
    return (samples.join(qs, on=keys)
            .with_columns(pl.col("stage").replace_strict(_ORDER, default=len(_ORDER)).alias("_order"))
            .sort([*by, "_order"]).drop("_order"))


def overspend_counts(spec: SloSpec, buckets: pl.DataFrame) -> pl.DataFrame:
    """(window_start, *slice_by, stage, over, samples) for the stages the SLO budgets."""
    budgets = pl.DataFrame({"stage": [s for s, _ in spec.stage_budgets_ms],
                            "_bound": [histogram.last_good_bin(ms) for _, ms in spec.stage_budgets_ms]},
                           schema={"stage": pl.String, "_bound": pl.Int16})
    by = ["window_start", *spec.slice_by]
    long = stage_histograms(spec.selected(buckets), by).join(budgets, on="stage")
    return long.group_by(*by, "stage").agg(
        pl.col("n").filter(pl.col("bin") > pl.col("_bound")).sum().alias("over"),
        pl.col("n").sum().alias("samples"),
    )


@dataclass(frozen=True)
class StageSpend:
    stage: str
    budget_ms: float
    over: int  # samples over the stage's budget
    samples: int

    @property
    def share_over(self) -> float:
        return self.over / self.samples if self.samples else 0.0

    def describe(self) -> str:
        return (f"{self.stage} overspent its {self.budget_ms:g} ms share in {self.share_over:.0%} of "
                f"{self.samples:,} samples")


def most_overspent(spends: Iterable[StageSpend]) -> StageSpend | None:
    """The stage with the largest share of samples over its budget (None: none was over)."""
    over = [s for s in spends if s.over > 0]
    return max(over, key=lambda s: (s.share_over, s.over)) if over else None


# ---- measured stage profiles, for the planner ------------------------------------------
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
