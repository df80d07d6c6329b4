"""Metric samples → `gpu.v1`: DCGM exporter, vLLM and Triton names, per GPU and time.

- DCGM readings (labels `gpu`, `UUID`, `modelName`, `Hostname`, `pod`) become one `dcgm`
  sample per GPU and sample time, in base units (MiB → bytes, 0-1 profiling ratios → %);
  `DCGM_FI_DEV_XID_ERRORS` holds the last XID code, so a change to a non-zero code counts
  one error; ECC totals become deltas.
- Triton's GPU gauges (`nv_gpu_*`, label `gpu_uuid`) become `runtime` samples of that GPU.
- Serving-runtime gauges (vLLM's queue, running, KV cache and preemptions; Triton's pending
  requests) become `runtime` samples joined to the GPUs of the same pod, learnt from DCGM's
  `pod` label (a runtime's own pod is `pod` or `k8s.pod.name`); else to the GPUs its scrape
  target names (`gpu` label: `0` or `0,1`); else, on a node with one GPU, to that GPU, and on
  a node with several, to its lowest-numbered one. A node with no GPU known (the runtime's
  `instance` is not a node DCGM reported) makes no row: that would be a GPU that does not
  exist, counted in the fleet's GPUs and the GPU-seconds cost divides; the sample is refused
  `otlp_metric_unmapped` with the labels that would join it.
- Running totals become deltas against the previous reading of the same series (a reset,
  a smaller value, starts again from zero); the first reading of a series sets the base.

The worker merges the sources of one GPU and minute field by field (docs/data-contract.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import msgspec

from tailwatch.ingest.nvml import gpu_sku_of
from tailwatch.ingest.otlp.mapping import GpuRules
from tailwatch.ingest.otlp.samples import Sample
from tailwatch.ingest.schema import GpuV1

MIB = 1024 * 1024
# metric → (gpu.v1 field, scale)
DCGM_GAUGES = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": ("_fb_free_bytes", MIB),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_bw_pct", 100.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active_pct", 100.0),
}
DCGM_COUNTERS = {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_errors"}
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"
TRITON_GPU = {
    "nv_gpu_utilization": ("util_pct", 100.0),
    "nv_gpu_memory_used_bytes": ("mem_used_bytes", 1.0),
    "nv_gpu_memory_total_bytes": ("mem_total_bytes", 1.0),
    "nv_gpu_power_usage": ("power_w", 1.0),
}
RUNTIME_GAUGES = {
    "vllm:num_requests_waiting": "queue_depth",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",  # 0-1 despite the name
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # its name before vLLM 0.10
    "nv_inference_pending_request_count": "queue_depth",
}
RUNTIME_COUNTERS = {"vllm:num_preemptions": "preemptions"}
INTEGER_FIELDS = {"mem_used_bytes", "mem_total_bytes", "queue_depth", "running", "xid_errors", "ecc_errors", "preemptions"}
POD_LABELS = ("pod", "k8s.pod.name")
# OpenTelemetry instrument names are case-insensitive (the Python SDK writes them lower-case);
# Prometheus keeps DCGM's upper case. Names are matched lower-cased.
_CANONICAL = {n.lower(): n for n in (*DCGM_GAUGES, *DCGM_COUNTERS, DCGM_XID, *TRITON_GPU, *RUNTIME_GAUGES,
                                     *RUNTIME_COUNTERS)}
_NAMES = frozenset(_CANONICAL.values())


@dataclass
class MappedGpu:
    samples: list[GpuV1] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (reason, detail)
    skipped: int = 0  # samples of metrics no gpu.v1 field reads


class GpuMapper:
    """Holds what spans batches: the previous reading of each running total, the last XID
    code of each GPU, and which GPUs each pod uses."""

    def __init__(self, rules: GpuRules):
        self.rules = rules
        self.previous: dict[tuple, float] = {}
        self.last_xid: dict[tuple[str, int], float] = {}
        self.gpus_of_pod: dict[tuple[str, str], set[int]] = {}
        self.gpus_of_node: dict[str, set[int]] = {}
        self.index_of_uuid: dict[str, int] = {}
        self.triton_uuids: dict[str, list[str]] = {}

    def map(self, samples: list[Sample]) -> MappedGpu:
        out = MappedGpu()
        rows: dict[tuple[str, int, int, str], dict] = {}  # (node, gpu index, ts, source) → fields
        runtime: list[tuple[Sample, str, str]] = []
        for s in samples:
            name = s.name if s.name in _NAMES else _CANONICAL.get(s.name.lower())
            if name is None:
                out.skipped += 1
                continue
            if name != s.name:
                s = replace(s, name=name)
            if name in DCGM_GAUGES or name in DCGM_COUNTERS or name == DCGM_XID:
                self._dcgm(s, rows, out)
            elif name in TRITON_GPU:
                self._triton_gpu(s, rows, out)
            else:
                value = self._delta(s) if name in RUNTIME_COUNTERS else s.value
                if value is not None:
                    runtime.append((s, RUNTIME_GAUGES.get(name) or RUNTIME_COUNTERS[name], value))
        for s, fld, value in runtime:  # after the GPUs of this batch are known
            self._runtime(s, fld, value, rows, out)
        for (node, index, ts_ms, source), fields in rows.items():
            free = fields.pop("_fb_free_bytes", None)
            if free is not None and "mem_used_bytes" in fields:
                fields["mem_total_bytes"] = fields["mem_used_bytes"] + free
            for k in INTEGER_FIELDS & fields.keys():
                fields[k] = int(round(fields[k]))
            record = {"schema": "gpu.v1", "ts": ts_ms, "node": node, "gpu_index": index, "source": source, **fields}
            try:
                out.samples.append(msgspec.convert(record, GpuV1))
            except msgspec.ValidationError as exc:
                out.refused.append(("otlp_metric_invalid", f"{node} gpu {index}: {str(exc)[:200]}"))
        return out

    # ---- sources ------------------------------------------------------------------------
    def _dcgm(self, s: Sample, rows: dict, out: MappedGpu) -> None:
        try:
            index = int(s.labels.get("gpu", ""))
        except ValueError:
            out.refused.append(("otlp_metric_unmapped", f"{s.name} without a gpu index label"))
            return
        node = self.rules.node.pick(s.labels)
        row = self._row(rows, s, node, index, "dcgm")
        uuid = s.labels.get("UUID") or s.labels.get("uuid") or ""
        if uuid:
            row["gpu_uuid"] = uuid[:128]
            self.index_of_uuid[uuid] = index
        if s.labels.get("modelName"):
            row["gpu_sku"] = gpu_sku_of(s.labels["modelName"])
        pod = _pod(s.labels)
        if pod:
            self.gpus_of_pod.setdefault((node, pod), set()).add(index)
        self.gpus_of_node.setdefault(node, set()).add(index)
        if s.name == DCGM_XID:
            last = self.last_xid.get((node, index))
            self.last_xid[(node, index)] = s.value
            row["xid_errors"] = row.get("xid_errors", 0) + (1 if last is not None and s.value != last and s.value else 0)
        elif s.name in DCGM_COUNTERS:
            delta = self._delta(s)
            if delta is not None:
                row[DCGM_COUNTERS[s.name]] = delta
        else:
            fld, scale = DCGM_GAUGES[s.name]
            row[fld] = s.value * scale

    def _triton_gpu(self, s: Sample, rows: dict, out: MappedGpu) -> None:
        uuid = s.labels.get("gpu_uuid", "")
        node = self.rules.node.pick(s.labels)
        if not uuid:
            out.refused.append(("otlp_metric_unmapped", f"{s.name} without gpu_uuid"))
            return
        index = self.index_of_uuid.get(uuid)
        if index is None:  # no DCGM reading of this GPU: numbered in the order the node's GPUs appear
            seen = self.triton_uuids.setdefault(node, [])
            seen.append(uuid)
            index = self.index_of_uuid[uuid] = len(seen) - 1
        row = self._row(rows, s, node, index, "runtime")
        row["gpu_uuid"] = uuid[:128]
        fld, scale = TRITON_GPU[s.name]
        row[fld] = s.value * scale

    def _runtime(self, s: Sample, fld: str, value: float, rows: dict, out: MappedGpu) -> None:
        node = self.rules.node.pick(s.labels)
        pod = _pod(s.labels)
        gpus = self.gpus_of_pod.get((node, pod)) if pod else None
        if not gpus:
            gpus = _gpu_list(s.labels.get("gpu", ""))  # a scrape target's own `gpu` label: 0 or 0,1
        if not gpus:
            on_node = self.gpus_of_node.get(node, set())
            if not on_node:
                # No GPU of this node is known: a row here would be a GPU that does not exist, counted
                # in the fleet's GPUs and in the GPU-seconds cost divides. Say how to join it instead.
                out.refused.append(("otlp_metric_unmapped", f"{s.name} from {node}: no GPU known on that node; give "
                                    "the target node= (as DCGM names it) and gpu= labels, or a pod label"))
                return
            gpus = on_node if len(on_node) == 1 else {min(on_node)}
        for index in sorted(gpus):
            row = self._row(rows, s, node, index, "runtime")
            if fld == "kv_cache_usage" and value > 1:
                value = value / 100  # a runtime that reports percent
            row[fld] = row.get(fld, 0) + value if fld == "preemptions" else value
            model = self.rules.model.pick(s.labels)
            if model:
                row["model"] = model
                row["model_version"] = self.rules.model_version.pick(s.labels)

    def _row(self, rows: dict, s: Sample, node: str, index: int, source: str) -> dict:
        row = rows.setdefault((node, index, s.ts_ms, source), {})
        if "zone" not in row:
            row["zone"] = self.rules.zone.pick(s.labels)
            row["pool"] = self.rules.pool.pick(s.labels)
        return row

    def _delta(self, s: Sample) -> float | None:
        if not s.cumulative:
            return s.value
        key = (s.name, tuple(sorted(s.labels.items())))
        last = self.previous.get(key)
        self.previous[key] = s.value
        if last is None:
            return None
        return s.value - last if s.value >= last else s.value


def _gpu_list(text: str) -> set[int]:
    try:
        return {int(part) for part in text.split(",") if part.strip()} if text else set()
    except ValueError:
        return set()


def _pod(labels: dict[str, str]) -> str:
    for name in POD_LABELS:
        if labels.get(name):
            return labels[name]
    return ""
