"""The NVML collector, with the driver replaced at its narrowest boundary: the pynvml calls."""

import ctypes
import time
import types

import msgspec
import pynvml as real_pynvml  # importing it needs no driver: the fakes use its real structs and constants
import pytest

from tailwatch.ingest import nvml
from tailwatch.ingest.schema import GpuV1


class FakeNvmlError(Exception):
    pass


def fake_pynvml(gpus):
    m = types.SimpleNamespace(NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
                              NVML_VOLATILE_ECC=0)
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    m.nvmlDeviceGetName = lambda h: h["name"]
    m.nvmlDeviceGetUUID = lambda h: h["uuid"]
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=h["util"], memory=10)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=h["used"], total=h["total"], free=h["total"] - h["used"])
    m.nvmlDeviceGetPowerUsage = lambda h: h["power_mw"]
    m.nvmlDeviceGetTemperature = lambda h, kind: h["temp"]
    m.nvmlDeviceGetClockInfo = lambda h, kind: 1980

    def ecc(h, *a):
        if h.get("no_ecc"):
            raise FakeNvmlError("Not Supported")
        return 0

    m.nvmlDeviceGetTotalEccErrors = ecc
    return m


def test_samples_are_in_base_units():
    gpus = [{"name": b"NVIDIA H100 80GB HBM3", "uuid": b"GPU-1", "util": 73, "used": 40 * 2**30, "total": 80 * 2**30,
             "power_mw": 412_345, "temp": 61},
            {"name": "NVIDIA L4", "uuid": "GPU-2", "util": 5, "used": 1, "total": 24 * 2**30, "power_mw": 30_000,
             "temp": 40, "no_ecc": True}]
    samples = nvml.read_samples(fake_pynvml(gpus), ts_ms=1_700_000_000_000, node="n1", zone="z", pool="p")
    assert [type(s) for s in samples] == [GpuV1, GpuV1]
    h100, l4 = samples
    assert (h100.gpu_sku, h100.gpu_index, h100.gpu_uuid) == ("H100", 0, "GPU-1")
    assert h100.power_w == pytest.approx(412.345) and h100.mem_used_bytes == 40 * 2**30 and h100.temp_c == 61
    assert h100.util_pct == 73 and h100.sm_clock_mhz == 1980 and h100.ecc_errors == 0
    assert l4.gpu_sku == "L4" and l4.ecc_errors is None  # unsupported reading stays empty


def test_no_driver_is_a_clear_error():
    m = types.SimpleNamespace()

    def fail():
        raise FakeNvmlError("NVML Shared Library Not Found")

    m.nvmlInit = fail
    with pytest.raises(nvml.NvmlUnavailable, match="no NVIDIA driver"):
        nvml.init(m)


# ---- GPM: useful utilisation ----------------------------------------------------------------

SM, OCC, TENSOR, DRAM = (real_pynvml.NVML_GPM_METRIC_SM_UTIL, real_pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
                         real_pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, real_pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)


def fake_gpm(m, gpus):
    """GPM at the pynvml boundary. Sample buffers are real ctypes handles (what
    nvmlGpmSampleAlloc returns), put into pynvml's real nvmlGpmMetricsGet_t; each
    nvmlGpmSampleGet records which GPU and which of its samples the buffer now holds, and
    nvmlGpmMetricsGet answers with the GPU's metrics for the interval between sample1 and
    sample2 (`gpm[k]`: between its k-th and k+1-th sample), checking the request as NVML
    does. A GPU dict may ask for failures: `gpm_supported`, `mig`, `deny_gpm` (no
    permission), `old_driver`, `fail_get` / `fail_metrics` (sets of call numbers that raise)."""
    for name in ("NVML_GPM_METRICS_GET_VERSION", "NVML_SUCCESS", "NVML_DEVICE_MIG_ENABLE",
                 "NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_SM_OCCUPANCY", "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
                 "NVML_GPM_METRIC_DRAM_BW_UTIL"):
        setattr(m, name, getattr(real_pynvml, name))
    m.c_nvmlGpmMetricsGet_t = real_pynvml.c_nvmlGpmMetricsGet_t
    held: dict[int, tuple[str, int]] = {}  # sample buffer address → (GPU uuid, sample number)
    m.calls = {"alloc": 0, "free": 0, "get": 0, "metrics": 0}
    by_uuid = {g["uuid"]: g for g in gpus}

    def support(h):
        if h.get("old_driver"):  # what pynvml raises when libnvidia-ml has no such entry point
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return types.SimpleNamespace(version=1, isSupportedDevice=int(h.get("gpm_supported", True)))

    def mig_mode(h):
        if h.get("mig") is None:
            raise FakeNvmlError("Not Supported")
        return [int(h["mig"]), int(h["mig"])]

    def alloc():
        m.calls["alloc"] += 1
        return ctypes.pointer(real_pynvml.struct_c_nvmlGpmSample_t())

    def free(sample):
        m.calls["free"] += 1

    def sample_get(h, sample):
        m.calls["get"] += 1
        h["_gets"] = h.get("_gets", 0) + 1
        if h.get("deny_gpm"):
            raise FakeNvmlError("Insufficient Permissions")
        if h["_gets"] in h.get("fail_get", ()):
            raise FakeNvmlError("Unknown Error")
        n = h.get("_samples", 0)
        h["_samples"] = n + 1
        held[ctypes.addressof(sample.contents)] = (h["uuid"], n)
        return sample

    def metrics_get(req):
        m.calls["metrics"] += 1
        assert req.version == real_pynvml.NVML_GPM_METRICS_GET_VERSION
        (uuid1, k1), (uuid2, k2) = (held[ctypes.addressof(s.contents)] for s in (req.sample1, req.sample2))
        h = by_uuid[uuid1]
        assert uuid1 == uuid2 and k2 == k1 + 1, "sample1 must be the GPU's previous sample, sample2 its newest"
        h["_metrics"] = h.get("_metrics", 0) + 1
        if h["_metrics"] in h.get("fail_metrics", ()):
            raise FakeNvmlError("Unknown Error")
        for i in range(req.numMetrics):
            metric = req.metrics[i]
            value = h["gpm"][k1].get(metric.metricId)
            metric.nvmlReturn, metric.value = (0, value) if value is not None else (real_pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0)
        return req

    m.nvmlGpmQueryDeviceSupport = support
    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlGpmSampleAlloc = alloc
    m.nvmlGpmSampleFree = free
    m.nvmlGpmSampleGet = sample_get
    m.nvmlGpmMetricsGet = metrics_get
    return m


def gpu(uuid: str, name: str = "NVIDIA H100 80GB HBM3", util: int = 90, **extra) -> dict:
    return {"name": name, "uuid": uuid, "util": util, "used": 1, "total": 80 * 2**30, "power_mw": 200_000, "temp": 50,
            **extra}


def interval(sm, occ=None, tensor=None, dram=None) -> dict:
    return {SM: sm, OCC: occ, TENSOR: tensor, DRAM: dram}


GPM_FIELDS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct")


def gpm_of(s: GpuV1) -> tuple:
    return tuple(getattr(s, f) for f in GPM_FIELDS)


def test_gpm_fills_useful_utilisation_from_the_previous_and_the_newest_sample():
    # Batch-1 decode reads 90% utilisation with SMs 3% active; then a matrix-product load (H100 lab, README).
    h100 = gpu("GPU-h", gpm=[interval(3.2, 0.5, 0.1, 2.9), interval(95.7, 14.1, 92.9, 26.0), interval(100.4, 14, -0.2, 26)])
    l4 = gpu("GPU-l", name="NVIDIA L4", gpm_supported=False)
    m = fake_gpm(fake_pynvml([h100, l4]), [h100, l4])
    said: list[str] = []
    gpm = nvml.GpmReader(m, say=said.append)
    assert gpm.start() is True  # the first samples, taken once before the first round
    rounds = [nvml.read_samples(m, 1_700_000_000_000 + 10_000 * r, "n1", gpm=gpm) for r in range(3)]
    assert [gpm_of(r[0]) for r in rounds] == [(3.2, 0.5, 0.1, 2.9), (95.7, 14.1, 92.9, 26.0), (100.0, 14.0, 0.0, 26.0)]
    assert all(r[0].util_pct == 90 and r[0].source == "nvml" for r in rounds)  # NVML's reading stays beside GPM's
    assert all(gpm_of(r[1]) == (None,) * 4 and r[1].util_pct == 90 and r[1].source == "nvml" for r in rounds)
    # One GPM sample per GPU with GPM per interval, no sleeping: start + 3 rounds = 4 gets, 3 metric reads.
    assert m.calls["get"] == 4 and m.calls["metrics"] == 3
    assert len(said) == 1 and "GPU 1 (NVIDIA L4): not supported by this GPU" in said[0] and "GPU 0" not in said[0]
    gpm.close()
    assert m.calls["free"] == m.calls["alloc"] == 2


def test_gpm_without_start_fills_from_the_second_round_and_survives_missing_metrics():
    h100 = gpu("GPU-h", gpm=[{SM: 33.0, OCC: 14.0}, {SM: 34.0, OCC: 15.0}])  # tensor, DRAM: not supported
    m = fake_gpm(fake_pynvml([h100]), [h100])
    gpm = nvml.GpmReader(m, say=pytest.fail)  # nothing to say
    first, second, third = (nvml.read_samples(m, 1_700_000_000_000, "n1", gpm=gpm)[0] for _ in range(3))
    assert gpm_of(first) == (None,) * 4  # no previous sample yet
    assert gpm_of(second) == (33.0, 14.0, None, None) and gpm_of(third) == (34.0, 15.0, None, None)
    encoded = msgspec.json.encode(second)  # absent fields are not sent as nulls
    assert b"tensor_active_pct" not in encoded and b'"sm_active_pct":33.0' in encoded


def test_no_gpm_is_said_once_and_nvml_carries_on(caplog):
    old = gpu("GPU-a", name="NVIDIA A100-SXM4-80GB", gpm_supported=False, gpm=[])
    mig = gpu("GPU-m", mig=True, gpm=[])
    denied = gpu("GPU-d", deny_gpm=True, gpm=[])
    old_driver = gpu("GPU-o", old_driver=True, gpm=[])
    gpus = [old, mig, denied, old_driver]
    m = fake_gpm(fake_pynvml(gpus), gpus)
    gpm = nvml.GpmReader(m)  # says through the log (the CLI prints warnings on stderr)
    with caplog.at_level("WARNING", logger="tailwatch.ingest.nvml"):
        assert gpm.start() is False
        rounds = [nvml.read_samples(m, 1_700_000_000_000, "n1", gpm=gpm) for _ in range(3)]
    assert all(gpm_of(s) == (None,) * 4 and s.util_pct == 90 and s.power_w == 200 for r in rounds for s in r)
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    msg = caplog.records[0].getMessage()
    assert "GPU 0 (NVIDIA A100-SXM4-80GB): not supported by this GPU" in msg
    assert "GPU 1 (NVIDIA H100 80GB HBM3): MIG mode is on" in msg
    assert "GPU 2 (NVIDIA H100 80GB HBM3): NVML: Insufficient Permissions" in msg
    assert "GPU 3 (NVIDIA H100 80GB HBM3): the driver has no GPM" in msg
    assert "NVML readings go on" in msg
    assert m.calls["get"] == 1  # the denied GPU was tried once, never again
    assert m.calls["free"] == m.calls["alloc"]  # its buffers were given back at once


def test_an_old_nvidia_ml_py_without_gpm_is_said_once():
    m = fake_pynvml([gpu("GPU-h")])  # no nvmlGpm* functions at all
    said: list[str] = []
    gpm = nvml.GpmReader(m, say=said.append)
    for _ in range(3):
        assert gpm_of(nvml.read_samples(m, 1_700_000_000_000, "n1", gpm=gpm)[0]) == (None,) * 4
    assert len(said) == 1 and "upgrade nvidia-ml-py" in said[0]


def test_a_gpm_call_that_raises_mid_run_leaves_that_interval_empty_and_no_crash():
    # Gets 1 (start), 2 (round 1) work; get 3 (round 2) raises; metric read 3 raises (round 5).
    h100 = gpu("GPU-h", gpm=[interval(float(k), 1, 2, 3) for k in range(10)], fail_get={3}, fail_metrics={3})
    m = fake_gpm(fake_pynvml([h100]), [h100])
    said: list[str] = []
    gpm = nvml.GpmReader(m, say=said.append)
    gpm.start()
    sm = []
    for _ in range(7):
        (s,) = nvml.read_samples(m, 1_700_000_000_000, "n1", gpm=gpm)
        assert s.util_pct == 90 and s.gpu_sku == "H100"  # the NVML sample is always there
        sm.append(s.sm_active_pct)
    # Round 2: the get failed. Round 3: a fresh first sample (no interval across the gap).
    # Round 4: interval 2 (the samples numbered 2 and 3). Round 5: the metric read failed.
    # Round 6: the next interval (its samples are consecutive again).
    assert sm == [0.0, None, None, 2.0, None, 4.0, 5.0]
    assert len(said) == 4 and "nvmlGpmSampleGet failed" in said[0] and "reads again" in said[1]
    assert "nvmlGpmMetricsGet failed" in said[2] and "reads again" in said[3]


@pytest.mark.gpu
def test_on_a_real_gpu_sm_activity_tells_a_matrix_product_load_from_a_batch_1_loop():
    """On a real Hopper GPU: a bf16 matrix-product load keeps most SMs busy; a batch-1 loop
    of small matrix products, synchronised after each (as decode synchronises after each
    token), keeps the GPU 'utilised' with few SMs active. GPM tells them apart."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import pynvml

    nvml.init(pynvml)
    said: list[str] = []
    gpm = nvml.GpmReader(pynvml, say=said.append)
    try:
        if not gpm.start():
            pytest.skip(f"no GPM on this GPU: {said}")
        time.sleep(0.2)
        device = torch.device("cuda", 0)

        def measure(step, seconds: float = 3.0) -> GpuV1:
            nvml.read_samples(pynvml, 0, "t", gpm=gpm)  # the interval starts here
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                step()
            torch.cuda.synchronize(device)
            return nvml.read_samples(pynvml, 0, "t", gpm=gpm)[0]  # … and ends here

        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

        def matmuls():
            for _ in range(20):
                a @ b
            torch.cuda.synchronize(device)

        x = torch.randn(1, 2048, device=device, dtype=torch.bfloat16)
        w = torch.randn(2048, 2048, device=device, dtype=torch.bfloat16)

        def batch_1():
            x @ w
            torch.cuda.synchronize(device)

        matmuls()  # warm up (cuBLAS handles, clocks)
        batch_1()
        heavy = measure(matmuls)
        light = measure(batch_1)
        print(f"\nmatmul: util {heavy.util_pct}%, SM active {heavy.sm_active_pct}%, tensor {heavy.tensor_active_pct}%"
              f"\nbatch-1 loop: util {light.util_pct}%, SM active {light.sm_active_pct}%, tensor {light.tensor_active_pct}%")
        assert heavy.sm_active_pct is not None and light.sm_active_pct is not None
        assert heavy.sm_active_pct > 80, heavy
        assert light.sm_active_pct < 30, light
        assert heavy.tensor_active_pct > light.tensor_active_pct
    finally:
        gpm.close()
        pynvml.nvmlShutdown()


def test_collect_gpu_reads_gpm_from_its_first_round(monkeypatch, capsys, caplog):
    """`tailwatch collect gpu --print` with the driver faked at the pynvml import: the first
    GPM samples are taken once at start, so every printed round carries GPM where the GPU
    has it; a GPU without says so once; the sample buffers are freed on the way out."""
    import json
    import sys

    from tailwatch.cli import main

    h100 = gpu("GPU-h", gpm=[interval(31.0, 14.0, 6.5, 20.0), interval(33.0, 15.0, 6.6, 22.0)])
    l4 = gpu("GPU-l", name="NVIDIA L4", gpm_supported=False)
    m = fake_gpm(fake_pynvml([h100, l4]), [h100, l4])
    m.nvmlShutdown = lambda: None
    monkeypatch.setitem(sys.modules, "pynvml", m)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    with caplog.at_level("WARNING", logger="tailwatch.ingest.nvml"):
        assert main(["collect", "gpu", "--print", "--count", "2", "--interval", "1s", "--node", "n1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["gpu_index"], r.get("sm_active_pct"), r["source"]) for r in rows] == \
        [(0, 31.0, "nvml"), (1, None, "nvml"), (0, 33.0, "nvml"), (1, None, "nvml")]
    assert rows[0]["tensor_active_pct"] == 6.5 and rows[0]["util_pct"] == 90
    said = [r.getMessage() for r in caplog.records if r.name == "tailwatch.ingest.nvml"]
    assert len(said) == 1 and "GPU 1 (NVIDIA L4): not supported" in said[0]
    assert m.calls["free"] == m.calls["alloc"] == 2
