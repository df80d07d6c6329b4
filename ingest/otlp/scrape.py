"""`tailwatch collect prometheus`: scrape DCGM exporter, vLLM, TGI and Triton `/metrics` into
`gpu.v1` and `request.v1`, for teams without an OpenTelemetry Collector.

Each round fetches every URL (a failed one is reported and skipped; the others still
count), parses the text exposition, adds `instance` (host:port) as Prometheus would, and
maps the samples with the same `GpuMapper` as OTLP metrics, so counters become deltas
across rounds and runtime gauges join the GPUs of their pod; the runtimes' latency and
token histograms become the requests they counted (`HistogramRequests`, bucket deltas
between rounds), so a fleet that is only scraped has request SLIs.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from ingest.otlp.gpu import GpuMapper, MappedGpu
from ingest.otlp.histogram_requests import HistogramRequests, MappedHistograms
from ingest.otlp.mapping import OtlpMapping
from ingest.otlp.samples import HistogramPoint, Sample, histograms_from_exposition, samples_from_exposition

ACCEPT = "text/plain;version=0.0.4"
MAX_EXPOSITION_BYTES = 64 * 1024 * 1024


class ScrapeError(Exception):
    """One URL could not be scraped: the reason in one line."""


def fetch(url: str, now_ms: int, timeout_s: float = 5.0) -> tuple[list[Sample], list[HistogramPoint]]:
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
    text = body.decode("utf-8", "replace")
    try:
        samples, histograms = samples_from_exposition(text, now_ms), histograms_from_exposition(text, now_ms)
    except ValueError as exc:
        raise ScrapeError(f"{url}: not a Prometheus text exposition ({str(exc)[:80]})") from None
    instance = urlsplit(url).netloc
    return ([s if "instance" in s.labels else replace(s, labels={**s.labels, "instance": instance}) for s in samples],
            [h if "instance" in h.labels else replace(h, labels={**h.labels, "instance": instance}) for h in histograms])


@dataclass
class ScrapeRound:
    gpu: MappedGpu
    requests: MappedHistograms
    errors: list[str] = field(default_factory=list)  # one line per URL that could not be scraped


class PrometheusScraper:
    def __init__(self, urls: list[str], mapping: OtlpMapping, timeout_s: float = 5.0):
        self.urls = urls
        self.mapper = GpuMapper(mapping.gpu)
        self.histograms = HistogramRequests(mapping.requests)
        self.timeout_s = timeout_s

    def round(self, now_ms: int) -> ScrapeRound:
        """One scrape of every URL at `now_ms`."""
        samples: list[Sample] = []
        histograms: list[HistogramPoint] = []
        errors: list[str] = []
        for url in self.urls:
            try:
                got, hist = fetch(url, now_ms, self.timeout_s)
            except ScrapeError as exc:
                errors.append(str(exc))
                continue
            samples += got
            histograms += hist
        return ScrapeRound(self.mapper.map(samples), self.histograms.map(histograms), errors)
