"""`tailwatch collect prometheus`: scrape DCGM exporter, vLLM and Triton `/metrics` into
`gpu.v1`, for teams without an OpenTelemetry Collector.

Each round fetches every URL (a failed one is reported and skipped; the others still
count), parses the text exposition, adds `instance` (host:port) as Prometheus would, and
maps the samples with the same `GpuMapper` as OTLP metrics, so counters become deltas
across rounds and runtime gauges join the GPUs of their pod.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import replace
from urllib.parse import urlsplit

from ingest.otlp.gpu import GpuMapper, MappedGpu
from ingest.otlp.mapping import GpuRules
from ingest.otlp.samples import Sample, samples_from_exposition

ACCEPT = "text/plain;version=0.0.4"
MAX_EXPOSITION_BYTES = 64 * 1024 * 1024


class ScrapeError(Exception):
    """One URL could not be scraped: the reason in one line."""


def fetch(url: str, now_ms: int, timeout_s: float = 5.0) -> list[Sample]:
    request = urllib.request.Request(url, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(MAX_EXPOSITION_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ScrapeError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    if len(body) > MAX_EXPOSITION_BYTES:
        raise ScrapeError(f"{url}: exposition larger than {MAX_EXPOSITION_BYTES:,} bytes")
    try:
        samples = samples_from_exposition(body.decode("utf-8", "replace"), now_ms)
    except ValueError as exc:
        raise ScrapeError(f"{url}: not a Prometheus text exposition ({str(exc)[:80]})") from None
    instance = urlsplit(url).netloc
    return [s if "instance" in s.labels else replace(s, labels={**s.labels, "instance": instance}) for s in samples]


class PrometheusScraper:
    def __init__(self, urls: list[str], rules: GpuRules, timeout_s: float = 5.0):
        self.urls = urls
        self.mapper = GpuMapper(rules)
        self.timeout_s = timeout_s

    def round(self, now_ms: int) -> tuple[MappedGpu, list[str]]:
        """One scrape of every URL at `now_ms`: the GPU samples, and one line per failed URL."""
        samples: list[Sample] = []
        errors: list[str] = []
        for url in self.urls:
            try:
                samples += fetch(url, now_ms, self.timeout_s)
            except ScrapeError as exc:
                errors.append(str(exc))
        return self.mapper.map(samples), errors
