"""Capacity math: the worked examples of DESIGN.md and issue 4, printed with their working."""

import subprocess
import sys

import pytest

from slo import capacity


def test_streams_to_gpus_with_zone_headroom():
    plan = capacity.replicas(10_000 * 0.35, target_utilization=0.7, zones=3)
    assert (plan.base_replicas, plan.with_zone_headroom) == (5_000, 7_500)


def test_one_zone_gets_no_headroom_and_bad_inputs_are_refused():
    assert capacity.replicas(7.0, 0.7, zones=1).with_zone_headroom == 10
    with pytest.raises(ValueError):
        capacity.replicas(1.0, 0.0)
    with pytest.raises(ValueError):
        capacity.replicas(-1.0, 0.5)


def test_kv_cache_bytes_and_fit():
    plan = capacity.kv_cache(layers=32, kv_heads=32, head_dim=128, tokens=8000, bytes_per_value=2)
    assert plan.bytes_per_request == 4_194_304_000
    too_big = capacity.kv_cache(32, 32, 128, 8000, 2, gpu_memory_gib=80, weights_gib=140)
    assert too_big.weights_fit is False and too_big.requests_per_gpu == 0
    fits = capacity.kv_cache(32, 8, 128, 8000, 2, gpu_memory_gib=80, weights_gib=16)
    assert fits.weights_fit and fits.requests_per_gpu == (64 * 2**30) // 1_048_576_000


def test_capacity_command_prints_its_working():
    r = subprocess.run([sys.executable, "-m", "tailwatch", "capacity", "replicas", "--concurrent-streams", "10000",
                        "--gpu-seconds-per-unit", "0.35", "--target-utilization", "0.7", "--zones", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0
    assert "ceil(3,500 ÷ 0.7) = 5,000" in r.stdout and "= 7,500" in r.stdout
    r = subprocess.run([sys.executable, "-m", "tailwatch", "capacity", "kv-cache", "--layers", "32", "--kv-heads", "32",
                        "--head-dim", "128", "--tokens", "8000", "--bytes-per-value", "2",
                        "--gpu-memory-gib", "80", "--weights-gib", "140"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "4,194,304,000 bytes" in r.stdout and "weights alone do not fit" in r.stdout


def test_sustained_capacity_needs_consecutive_held_minutes_and_keeps_the_best_day():
    from slo.capacity import PoolMinute, SustainedCapacity

    c = SustainedCapacity(sustained_minutes=3, history_days=2)
    feed = lambda minute, work, held=True, warm=4: c.observe(PoolMinute("p", minute, work, warm, held))  # noqa: E731
    assert feed(0, 4.0) is None and feed(1, 8.0) is None
    assert feed(2, 6.0) == 1.0  # min over the run of 3: 4 GPU-s/s on 4 warm replicas
    assert feed(3, 8.0, held=False) is None  # latency broke: the run starts over
    assert feed(4, 8.0) is None and feed(5, 8.0) is None
    assert feed(6, 8.0) == 2.0 and c.capacity("p", 6) == 2.0
    assert feed(8, 9.0) is None  # a gap in the minutes is not sustained
    assert feed(1440, 2.0) is None and feed(1441, 2.0) is None and feed(1442, 2.0) == 0.5
    assert c.capacity("p", 1442) == 2.0  # yesterday's peak still counts
    assert c.capacity("p", 3 * 1440) is None  # …until it ages out
    assert feed(10_000, 1.0, warm=0) is None  # no warm replicas: nothing to measure
