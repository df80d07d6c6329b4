"""The NVML collector: one `gpu.v1` sample per GPU per interval, through nvidia-ml-py.

Readings follow the DCGM exporter's default fields where NVML has them, in base units
(bytes, watts, °C, MHz). Serving-runtime gauges (queue, KV cache) are not NVML's to
know and stay empty here; runtimes report them. `read_samples` and `GpmReader` are the
only code that touches pynvml, so tests stand in for the driver at exactly that boundary.

Useful utilisation. NVML's `util_pct` is the share of time *some* kernel ran: it reads
100% while most SMs idle (on an H100, batch-64 decode reads 48-100% with SMs active a
third of the time). Where the GPU has GPM (GPU Performance Monitoring: Hopper and later,
driver R525+), `GpmReader` adds SM active, SM occupancy, tensor-pipe active and DRAM
bandwidth, in percent, computed between the GPU's previous GPM sample and this one: each
interval costs one `nvmlGpmSampleGet` per GPU, never a sleep (`collect gpu` takes the
first samples once at start, a second before its first round; GPM wants samples at least
100 ms apart). Where GPM is missing (older GPUs,
MIG mode, no permission, an old driver or nvidia-ml-py) the collector says so once and
carries on with the NVML readings.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tailwatch.ingest.schema import GpuV1

log = logging.getLogger(__name__)


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


def read_samples(nvml, ts_ms: int, node: str, zone: str = "", pool: str = "", last_xid: dict[int, int] | None = None,
                 gpm: GpmReader | None = None) -> list[GpuV1]:
    """One sample per visible GPU. `nvml` is the pynvml module (after `init`); `gpm`, kept
    across intervals, adds GPM's useful utilisation where the GPU has it."""
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
        useful = gpm.read(i, h, name) if gpm is not None else {}
        out.append(GpuV1(
            schema="gpu.v1", ts=ts_ms, node=node, gpu_index=i, zone=zone, pool=pool,
            gpu_uuid=uuid, gpu_sku=gpu_sku_of(name),
            util_pct=float(util.gpu) if util is not None else None,
            mem_used_bytes=int(mem.used) if mem is not None else None,
            mem_total_bytes=int(mem.total) if mem is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            sm_clock_mhz=float(clock) if clock is not None else None,
            ecc_errors=int(ecc) if ecc is not None else None,
            source="nvml", **useful,
        ))
    if gpm is not None:
        gpm.report()
    return out


# ---- GPM: useful utilisation --------------------------------------------------------------

# gpu.v1 field → nvidia-ml-py's GPM metric id (the DCGM exporter's name for the same reading)
GPM_METRICS = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),  # DCGM_FI_PROF_SM_ACTIVE
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),  # DCGM_FI_PROF_SM_OCCUPANCY
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    ("dram_bw_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),  # DCGM_FI_PROF_DRAM_ACTIVE
)


@dataclass
class _GpmGpu:
    """Two sample buffers per GPU, reused: `prev` holds the last interval's sample."""

    prev: Any
    cur: Any
    request: Any  # a reusable nvmlGpmMetricsGet_t
    failing: bool = False  # the last read failed (said once per failure run)
    have_prev: bool = True


class GpmReader:
    """GPM metrics per GPU, between the previous interval's sample and this one.

    Keep one reader for the collector's life (the previous sample per GPU lives here) and
    `close()` it before `nvmlShutdown`. Nothing here raises: a GPU without GPM gets no GPM
    fields, said once (`report()` after each round names every GPU found without it in one
    line); a GPM call that fails mid-run leaves that interval empty, said once until it
    reads again, and the next interval starts over from a fresh sample.
    """

    def __init__(self, nvml, say: Callable[[str], None] | None = None):
        self.nvml = nvml
        self.say = say or log.warning
        self.gpus: dict[int, _GpmGpu | None] = {}  # None: no GPM on this GPU (said once)
        self._unavailable: list[str] = []  # GPUs found without GPM this round, not yet said
        self._ids = [(f, getattr(nvml, m, None)) for f, m in GPM_METRICS]
        self._ids = [(f, i) for f, i in self._ids if i is not None]

    def start(self) -> bool:
        """Take every GPU's first GPM sample now (and say which have none), so that the
        first interval's samples already carry GPM fields; True when any GPU has GPM."""
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = _call(nvml.nvmlDeviceGetName, h, default="")
            self.read(i, h, name.decode() if isinstance(name, bytes) else name)
        self.report()
        return any(g is not None for g in self.gpus.values())

    # ---- per GPU, per interval --------------------------------------------------------
    def read(self, index: int, handle, name: str = "") -> dict[str, float]:
        """The GPM fields of `gpu.v1` for this GPU over the last interval ({} when none)."""
        if index not in self.gpus:
            self.gpus[index] = self._open(index, handle, name)
            return {}  # the first sample only starts the interval
        gpu = self.gpus[index]
        if gpu is None:
            return {}
        nvml = self.nvml
        try:
            nvml.nvmlGpmSampleGet(handle, gpu.cur)
        except Exception as exc:
            gpu.have_prev = False  # the next good sample starts a fresh interval
            self._failed(index, gpu, "nvmlGpmSampleGet", exc)
            return {}
        values: dict[str, float] = {}
        if gpu.have_prev:
            try:
                values = self._metrics(gpu)
            except Exception as exc:
                self._failed(index, gpu, "nvmlGpmMetricsGet", exc)
            else:
                if gpu.failing:
                    gpu.failing = False
                    self.say(f"GPM on GPU {index} reads again")
        gpu.prev, gpu.cur, gpu.have_prev = gpu.cur, gpu.prev, True  # this sample starts the next interval
        return values

    def report(self) -> None:
        """Say, in one line, which GPUs found since the last report have no GPM and why."""
        if self._unavailable:
            self.say("GPM (SM active, SM occupancy, tensor active, DRAM bandwidth) unavailable on "
                     + "; ".join(self._unavailable)
                     + ": those fields stay empty, NVML readings go on (utilisation only says a kernel was running)")
            self._unavailable = []

    def close(self) -> None:
        for gpu in self.gpus.values():
            if gpu is not None:
                self._free(gpu.prev, gpu.cur)
        self.gpus.clear()

    # ---- internals --------------------------------------------------------------------
    def _open(self, index: int, handle, name: str) -> _GpmGpu | None:
        reason = self._why_not(handle)
        samples: list = []
        if reason is None:
            nvml = self.nvml
            try:
                for _ in range(2):
                    samples.append(nvml.nvmlGpmSampleAlloc())
                nvml.nvmlGpmSampleGet(handle, samples[0])  # no permission, MIG, … show here
                request = nvml.c_nvmlGpmMetricsGet_t()
            except Exception as exc:
                reason = f"NVML: {_error_text(exc)}"
        if reason is not None:
            self._free(*samples)
            label = f"GPU {index}" + (f" ({name})" if name else "")
            self._unavailable.append(f"{label}: {reason}")
            return None
        return _GpmGpu(prev=samples[0], cur=samples[1], request=request)

    def _why_not(self, handle) -> str | None:
        nvml = self.nvml
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport") or not self._ids:
            return "this nvidia-ml-py has no GPM (upgrade nvidia-ml-py)"
        mig = _call(getattr(nvml, "nvmlDeviceGetMigMode", None) or (lambda h: None), handle)
        if mig and mig[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return "MIG mode is on (GPM is per GPU instance there; not read)"
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
        except Exception as exc:
            code = getattr(exc, "value", None)
            if code == getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
                return "the driver has no GPM (GPM needs R525 or later)"
            if code == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
                return "not supported by this GPU (GPM needs Hopper or later)"
            return f"NVML: {_error_text(exc)}"
        if not getattr(support, "isSupportedDevice", 0):
            return "not supported by this GPU (GPM needs Hopper or later)"
        return None

    def _metrics(self, gpu: _GpmGpu) -> dict[str, float]:
        nvml, req = self.nvml, gpu.request
        req.version = nvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(self._ids)
        req.sample1, req.sample2 = gpu.prev, gpu.cur  # older, newer
        for i, (_field, metric_id) in enumerate(self._ids):
            req.metrics[i].metricId = metric_id
        nvml.nvmlGpmMetricsGet(req)
        ok = getattr(nvml, "NVML_SUCCESS", 0)
        out = {}
        for i, (field, _metric_id) in enumerate(self._ids):
            m = req.metrics[i]
            if m.nvmlReturn == ok and math.isfinite(m.value):
                out[field] = round(min(100.0, max(0.0, float(m.value))), 3)  # counters jitter past the ends
        return out

    def _failed(self, index: int, gpu: _GpmGpu, call: str, exc: Exception) -> None:
        if not gpu.failing:
            gpu.failing = True
            self.say(f"GPM on GPU {index}: {call} failed ({_error_text(exc)}); its GPM fields stay empty until it reads again")

    def _free(self, *samples) -> None:
        for s in samples:
            _call(self.nvml.nvmlGpmSampleFree, s)


def _error_text(exc: Exception) -> str:
    return str(exc).strip() or type(exc).__name__


def gpu_sku_of(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' → 'H100'; unknown names are kept whole (bounded length)."""
    for token in name.replace("NVIDIA", "").split():
        if token[:1].isalpha() and any(c.isdigit() for c in token):
            return token[:32]
    return name[:32]


def default_node() -> str:
    return socket.gethostname()[:128]
