"""The NVML collector, with the driver replaced at its narrowest boundary: the pynvml calls."""

import types

import pytest

from ingest import nvml
from ingest.schema import GpuV1


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
