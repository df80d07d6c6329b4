"""The NVML collector: one `gpu.v1` sample per GPU per interval, through nvidia-ml-py.

Readings follow the DCGM exporter's default fields where NVML has them, in base units
(bytes, watts, °C, MHz). Serving-runtime gauges (queue, KV cache) are not NVML's to
know and stay empty here; runtimes report them. `read_samples` is the only code that
touches pynvml, so tests stand in for the driver at exactly that boundary.
"""

from __future__ import annotations

import socket
from typing import Any

from ingest.schema import GpuV1


class NvmlUnavailable(Exception):
    """No NVIDIA driver/GPU here (one line for the user)."""


def _call(fn, *args, default: Any = None):
    try:
        return fn(*args)
    except Exception:  # a reading this GPU does not support stays empty
        return default


def init(nvml) -> None:
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, …
        raise NvmlUnavailable(f"no NVIDIA driver found (NVML: {exc}); the collector needs one — use `tailwatch simulate` instead") from None


def read_samples(nvml, ts_ms: int, node: str, zone: str = "", pool: str = "", last_xid: dict[int, int] | None = None) -> list[GpuV1]:
    """One sample per visible GPU. `nvml` is the pynvml module (after `init`)."""
    out = []
    count = nvml.nvmlDeviceGetCount()
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        name = _call(nvml.nvmlDeviceGetName, h, default="")
        name = name.decode() if isinstance(name, bytes) else name
        uuid = _call(nvml.nvmlDeviceGetUUID, h, default="")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        util = _call(nvml.nvmlDeviceGetUtilizationRates, h)
        mem = _call(nvml.nvmlDeviceGetMemoryInfo, h)
        power_mw = _call(nvml.nvmlDeviceGetPowerUsage, h)
        temp = _call(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        clock = _call(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
        ecc = _call(nvml.nvmlDeviceGetTotalEccErrors, h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        out.append(GpuV1(
            schema="gpu.v1", ts=ts_ms, node=node, gpu_index=i, zone=zone, pool=pool,
            gpu_uuid=uuid, gpu_sku=_sku(name),
            util_pct=float(util.gpu) if util is not None else None,
            mem_used_bytes=int(mem.used) if mem is not None else None,
            mem_total_bytes=int(mem.total) if mem is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            sm_clock_mhz=float(clock) if clock is not None else None,
            ecc_errors=int(ecc) if ecc is not None else None,
        ))
    return out


def _sku(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' → 'H100'; unknown names are kept whole (bounded length)."""
    for token in name.replace("NVIDIA", "").split():
        if token[:1].isalpha() and any(c.isdigit() for c in token):
            return token[:32]
    return name[:32]


def default_node() -> str:
    return socket.gethostname()[:128]
