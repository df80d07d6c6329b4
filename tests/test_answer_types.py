"""A view's answer is built once, in the type the HTTP process serves (signals/live.py
`answer`): converted from the view's mapping, with NumPy scalars as the numbers they hold
and a float that is not finite as null, as a client is sent it."""

import math

import msgspec
import numpy as np
import pytest

from tailwatch.signals.answers import Autoscale, Shed
from tailwatch.signals.live import answer


def _autoscale_body(**signals) -> dict:
    return {"pool": "p", "desired_replicas": np.int64(3), "current_replicas": 2, "reasons": ("work above target",),
            "signals": {"requests_per_s": np.float64(1 / 3), "work_gpu_s_per_s": 1.5, "tokens_per_s": 10.0,
                        "prompt_tokens_per_s": None, "audio_seconds_per_s": 0.0, "active_streams": np.int64(4),
                        "queue_age_p95_ms": math.nan, "first_output_p95_ms": 200.0, "first_output_slo_ms": None,
                        "kv_cache_usage_max": None, "gpu_util_mean_pct": 50.0, "sm_active_mean_pct": None,
                        "replicas_by_state": {"warm": 2}, "burn_rate": math.inf,
                        "capacity_gpu_s_per_s_per_replica": 0.75, "capacity_basis": "physical",
                        "utilization_of_capacity": 1.0, "planning_target_utilization": 0.7, "window_minutes": 5,
                        "model": "m", **signals},
            "capacity_basis": "physical",
            "capacity": {"per_replica_gpu_s_per_s": 0.75, "lower_gpu_s_per_s": None, "upper_gpu_s_per_s": 1.0,
                         "physical_gpu_s_per_s": 1.0, "broke_gpu_s_per_s": None, "basis": "physical", "reason": "r"},
            "as_of": "2026-12-01T00:05:00Z"}


def test_an_answer_is_its_type_with_plain_numbers_and_null_for_what_is_not_finite():
    got = answer(_autoscale_body(), Autoscale)
    assert type(got) is Autoscale and type(got.signals.active_streams) is int and got.desired_replicas == 3
    assert got.signals.requests_per_s == float(f"{1 / 3:.12g}")  # twelve significant digits
    assert got.signals.queue_age_p95_ms is None and got.signals.burn_rate is None
    assert got.reasons == ["work above target"]
    wire = msgspec.json.decode(msgspec.json.encode(got))
    assert wire["signals"]["queue_age_p95_ms"] is None and "zone" not in wire["signals"]


def test_a_view_mapping_that_does_not_fit_its_type_raises():
    with pytest.raises(msgspec.ValidationError):
        answer(_autoscale_body(unknown_signal=1.0), Autoscale)
    with pytest.raises(msgspec.ValidationError):  # a float field that is not finite is no answer
        answer({**_autoscale_body(), "capacity": {**_autoscale_body()["capacity"], "upper_gpu_s_per_s": math.nan}},
               Autoscale)
    with pytest.raises(msgspec.ValidationError):
        answer({"pool": "p"}, Shed)
