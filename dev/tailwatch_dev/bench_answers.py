"""What building one autoscale answer costs: the view's mapping converted directly into its
type (signals.live.answer, what the worker does) against the same mapping through JSON and
back (signals.answers.typed), interleaved in one run.

    python -m tools.bench_answers [--answers 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from tailwatch.signals.answers import Autoscale, typed
from tailwatch.signals.live import answer, significant


def autoscale_mapping() -> dict:
    """A pool's autoscale mapping as the view makes it: NumPy scalars among the numbers."""
    return {"pool": "p-a100-asr", "desired_replicas": np.int64(7), "current_replicas": 6,
            "reasons": ["work 0.83 of capacity", "queue age p95 410 ms"],
            "signals": {"requests_per_s": np.float64(41.3), "work_gpu_s_per_s": np.float64(5.12),
                        "tokens_per_s": 812.4, "prompt_tokens_per_s": None, "audio_seconds_per_s": 0.0,
                        "active_streams": np.int64(12), "queue_age_p95_ms": 410.0, "first_output_p95_ms": 233.1,
                        "first_output_slo_ms": 500.0, "kv_cache_usage_max": 0.71, "gpu_util_mean_pct": 64.2,
                        "sm_active_mean_pct": math.nan, "replicas_by_state": {"warm": 6, "loading": 0},
                        "burn_rate": 1.3, "capacity_gpu_s_per_s_per_replica": 0.9,
                        "capacity_basis": "measured-above-physical", "utilization_of_capacity": 0.83,
                        "planning_target_utilization": 0.7, "window_minutes": 5, "model": "asr-1", "zone": "z1",
                        "workload": "asr"},
            "capacity_basis": "physical",
            "capacity": {"per_replica_gpu_s_per_s": 0.9, "lower_gpu_s_per_s": 0.5, "upper_gpu_s_per_s": 1.0,
                         "physical_gpu_s_per_s": 1.0, "broke_gpu_s_per_s": None, "basis": "physical",
                         "reason": "measured"},
            "as_of": "2026-12-01T00:05:00Z"}


def per_answer_us(build, answers: int) -> float:
    began = time.perf_counter()
    for _ in range(answers):
        build()
    return (time.perf_counter() - began) / answers * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    body = autoscale_mapping()
    assert answer(body, Autoscale) == typed(significant(body), Autoscale)  # the same answer either way
    direct, through_json = [], []
    for _ in range(args.rounds):
        direct.append(per_answer_us(lambda: answer(body, Autoscale), args.answers))
        through_json.append(per_answer_us(lambda: typed(significant(body), Autoscale), args.answers))
    d, j = statistics.median(direct), statistics.median(through_json)
    print(f"autoscale answer, median of {args.rounds} rounds of {args.answers:,}: converted {d:.1f} us, "
          f"through JSON {j:.1f} us ({d / j:.2f}x)")


if __name__ == "__main__":
    main()
