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

from slo.config_file import read_yaml_mapping

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


def load_prices(path: str | Path | None) -> GpuPrices:
    if path is None:
        return GpuPrices()
    raw = read_yaml_mapping(path, PriceError, "a mapping with usd_per_gpu_hour")
    unknown = set(raw) - {"currency", "default_usd_per_gpu_hour", "usd_per_gpu_hour"}
    if unknown:
        raise PriceError(f"{path}: unknown key {sorted(unknown)[0]!r}")
    if raw.get("currency", "USD") != "USD":
        raise PriceError(f"{path}: currency {raw['currency']!r} is not supported (USD only)")
    prices = dict(DEFAULT_USD_PER_GPU_HOUR)
    for sku, value in (raw.get("usd_per_gpu_hour") or {}).items():
        prices[str(sku)] = _price(value, f"{path}: usd_per_gpu_hour.{sku}")
    fallback = _price(raw.get("default_usd_per_gpu_hour", DEFAULT_FALLBACK_USD_PER_GPU_HOUR), f"{path}: default_usd_per_gpu_hour")
    return GpuPrices(prices, fallback)


def _price(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1000:
        raise PriceError(f"{where} must be a number of dollars per GPU-hour between 0 and 1000, got {value!r}")
    return float(value)
