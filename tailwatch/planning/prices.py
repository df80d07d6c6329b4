"""GPU prices per SKU: the one place cost math gets its dollars from.

Defaults are on-demand cloud list prices per GPU-hour (rounded, late 2026); a YAML file
overrides them:

    currency: USD
    default_usd_per_gpu_hour: 2.00   # SKUs not listed
    usd_per_gpu_hour:
      H100: 4.00
      L4: 0.80
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from typing import Annotated, Literal

from msgspec import Meta

from tailwatch.config import ConfigStruct, load_struct

DEFAULT_USD_PER_GPU_HOUR = {"H200": 5.00, "H100": 4.00, "A100": 2.50, "L40S": 1.60, "A10G": 1.00, "L4": 0.80, "T4": 0.50}
DEFAULT_FALLBACK_USD_PER_GPU_HOUR = 2.00


class PriceError(Exception):
    """The price file is unreadable or wrong (a one-line message naming the problem)."""


@dataclass(frozen=True)
class GpuPrices:
    usd_per_gpu_hour: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_USD_PER_GPU_HOUR))
    default_usd_per_gpu_hour: float = DEFAULT_FALLBACK_USD_PER_GPU_HOUR

    def usd_per_gpu_second(self, gpu_sku: str | None) -> float:
        return self.usd_per_gpu_hour.get(gpu_sku or "", self.default_usd_per_gpu_hour) / 3600.0


UsdPerGpuHour = Annotated[float, Meta(ge=0.0, lt=1000.0, description="dollars per GPU-hour")]


class PriceFile(ConfigStruct):
    currency: Literal["USD"] = "USD"
    default_usd_per_gpu_hour: UsdPerGpuHour = DEFAULT_FALLBACK_USD_PER_GPU_HOUR
    usd_per_gpu_hour: dict[str, UsdPerGpuHour] = {}  # over the defaults, per SKU


def load_prices(path: str | Path | None) -> GpuPrices:
    if path is None:
        return GpuPrices()
    f = load_struct(path, PriceFile, PriceError)
    return GpuPrices({**DEFAULT_USD_PER_GPU_HOUR, **f.usd_per_gpu_hour}, f.default_usd_per_gpu_hour)
