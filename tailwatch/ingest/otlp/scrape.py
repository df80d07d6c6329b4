"""`tailwatch collect prometheus`: scrape DCGM exporter, vLLM, TGI and Triton `/metrics` into
`gpu.v1` and `request.v1`, for teams without an OpenTelemetry Collector.

Each round fetches every target (a failed one is reported and skipped; the others still
count), parses the text exposition, adds `instance` (host:port) as Prometheus would and the
target's own labels (`zone`, `region`, `pool`, `node`, `gpu`: from `--url URL#node=n1,gpu=0`
or a `file_sd`-shaped targets file), and
maps the samples with the same `GpuMapper` as OTLP metrics, so counters become deltas
across rounds and runtime gauges join the GPUs of their pod; the runtimes' latency and
token histograms become the requests they counted (`HistogramRequests`, bucket deltas
between rounds), so a fleet that is only scraped has request SLIs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

import httpx

from tailwatch.ingest.otlp.gpu import GpuMapper, MappedGpu
from tailwatch.ingest.otlp.histogram_requests import HistogramRequests, MappedHistograms
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.samples import HistogramPoint, Sample, histograms_from_exposition, samples_from_exposition

ACCEPT = "text/plain;version=0.0.4"
MAX_EXPOSITION_BYTES = 64 * 1024 * 1024


# Labels a target may give every series it serves (as Prometheus's target labels): where it
# runs and which GPUs it drives. A series' own label of the same name wins (DCGM's `gpu` is
# per series), as with Prometheus's `honor_labels: true`.
TARGET_LABELS = ("zone", "region", "pool", "node", "gpu")


class ScrapeError(Exception):
    """One URL could not be scraped: the reason in one line."""


@dataclass(frozen=True)
class Target:
    url: str
    labels: dict[str, str] = field(default_factory=dict)


def parse_target(text: str) -> Target:
    """`URL` or `URL#node=n1,zone=eu-west-4a,gpu=0,1` (the fragment never reaches the server;
    `gpu` takes a comma list, so other labels come first or are separated by `;`)."""
    url, _, fragment = text.partition("#")
    labels: dict[str, str] = {}
    key = None
    for part in fragment.replace(";", ",").split(",") if fragment else []:
        if "=" in part:
            key, value = part.split("=", 1)
            key = key.strip()
            if key not in TARGET_LABELS:
                raise ScrapeError(f"{text}: unknown target label {key!r} (known: {', '.join(TARGET_LABELS)})")
            labels[key] = value.strip()
        elif key == "gpu" and part.strip():
            labels["gpu"] += f",{part.strip()}"
        elif part.strip():
            raise ScrapeError(f"{text}: expected label=value, got {part!r}")
    return Target(url, labels)


def read_targets(path: str) -> list[Target]:
    """A targets file in the shape of Prometheus's `file_sd_configs` (JSON or YAML): a list of
    `{targets: [host:port, ...], labels: {...}}`; `__scheme__` and `__metrics_path__` set the
    URL (http and /metrics by default), as they do for Prometheus."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            groups = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise ScrapeError(f"{path}: {str(exc).splitlines()[0][:160]}") from None
    if not isinstance(groups, list):
        raise ScrapeError(f"{path}: expected a list of target groups ({{targets: [...], labels: {{...}}}})")
    out: list[Target] = []
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ScrapeError(f"{path}: group {i}: expected targets: [host:port, ...]")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict):
            raise ScrapeError(f"{path}: group {i}: labels must be a mapping")
        scheme = str(labels.get("__scheme__", "http"))
        metrics_path = str(labels.get("__metrics_path__", "/metrics"))
        unknown = [k for k in labels if not str(k).startswith("__") and k not in TARGET_LABELS]
        if unknown:
            raise ScrapeError(f"{path}: group {i}: unknown label {unknown[0]!r} (known: {', '.join(TARGET_LABELS)})")
        kept = {str(k): str(v) for k, v in labels.items() if k in TARGET_LABELS}
        out += [Target(f"{scheme}://{host}{metrics_path}", kept) for host in group["targets"]]
    return out


def fetch(url: str, now_ms: int, timeout_s: float = 5.0,
          client: httpx.Client | None = None) -> tuple[list[Sample], list[HistogramPoint]]:
    """One target's page as samples and histogram points. The body is read in chunks and cut
    past MAX_EXPOSITION_BYTES, so a target that sends without end costs no more than that."""
    own = client is None
    client = client or httpx.Client(timeout=timeout_s)
    chunks, size = [], 0
    try:
        with client.stream("GET", url, headers={"Accept": ACCEPT}, timeout=timeout_s) as response:
            if not response.is_success:
                raise ScrapeError(f"{url}: HTTP {response.status_code}")
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_EXPOSITION_BYTES:
                    raise ScrapeError(f"{url}: exposition larger than {MAX_EXPOSITION_BYTES:,} bytes")
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {exc}") from None
    finally:
        if own:
            client.close()
    body = b"".join(chunks)
    text = body.decode("utf-8", "replace")
    try:
        samples, histograms = samples_from_exposition(text, now_ms), histograms_from_exposition(text, now_ms)
    except ValueError as exc:
        raise ScrapeError(f"{url}: not a Prometheus text exposition ({str(exc)[:80]})") from None
    return samples, histograms


def _labelled(series: list, target: Target) -> list:
    """Each series with `instance` (host:port, as Prometheus adds it) and the target's labels,
    under its own."""
    extra = {"instance": urlsplit(target.url).netloc, **target.labels}
    return [replace(x, labels={**extra, **x.labels}) for x in series]


@dataclass
class ScrapeRound:
    gpu: MappedGpu
    requests: MappedHistograms
    errors: list[str] = field(default_factory=list)  # one line per URL that could not be scraped


class PrometheusScraper:
    def __init__(self, targets: list[str], mapping: OtlpMapping, timeout_s: float = 5.0, targets_file: str | None = None):
        self.targets = [parse_target(t) for t in targets]
        self.targets_file = targets_file
        self.mapper = GpuMapper(mapping.gpu)
        self.histograms = HistogramRequests(mapping.requests)
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s)  # keeps each target's connection alive between rounds
        self._from_file: list[Target] = read_targets(targets_file) if targets_file else []

    def round(self, now_ms: int) -> ScrapeRound:
        """One scrape of every target at `now_ms` (the targets file is read again each round, as
        Prometheus watches it; a bad file keeps the last good list and says why)."""
        errors: list[str] = []
        if self.targets_file:
            try:
                self._from_file = read_targets(self.targets_file)
            except ScrapeError as exc:
                errors.append(str(exc))
        samples: list[Sample] = []
        histograms: list[HistogramPoint] = []
        for target in [*self.targets, *self._from_file]:
            try:
                got, hist = fetch(target.url, now_ms, self.timeout_s, self._client)
            except ScrapeError as exc:
                errors.append(str(exc))
                continue
            samples += _labelled(got, target)
            histograms += _labelled(hist, target)
        return ScrapeRound(self.mapper.map(samples), self.histograms.map(histograms, samples), errors)
