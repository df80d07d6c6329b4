"""Replay of real arrival times and token counts from an Azure LLM inference trace.

The CSV format is `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure Public Dataset,
"AzureLLMInferenceTrace", CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024). Arrival
offsets are kept and shifted to the simulation start; latencies and GPU time are
derived from the token counts with a simple prefill/decode model, and tenants and zones
are drawn from the seed. Only the token counts and times come from the trace.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import numpy as np

from tailwatch.ingest.schema import RequestV1
from tailwatch_dev.simulator import DEFAULT_START, REGION, TENANT_WEIGHTS, TENANTS, ZONES, SimTotals, parse_start

PREFILL_MS_PER_TOKEN = 0.12
DECODE_MS_PER_TOKEN = 28.0
MOONCAKE_BLOCK_TOKENS = 512  # tokens per `hash_ids` block in the Mooncake traces


class TraceError(ValueError):
    """The trace file cannot be read (one line for the user)."""


def read_trace(path: str | Path) -> list[tuple[int, int, int]]:
    """(arrival ms since first row, context tokens, generated tokens), in arrival order."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"--trace: no such file {path}")
    rows = []
    with _open_text(p) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip().lstrip("\ufeff") for h in header[:3]] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise TraceError(f"{path}: expected the header TIMESTAMP,ContextTokens,GeneratedTokens")
        for lineno, row in enumerate(reader, 2):
            try:
                ts = datetime.fromisoformat(row[0].strip()[:26]).replace(tzinfo=timezone.utc)
                rows.append((int(ts.timestamp() * 1000), int(row[1]), int(row[2])))
            except (ValueError, IndexError):
                raise TraceError(f"{path}:{lineno}: cannot read {','.join(row)[:80]!r}") from None
    if not rows:
        raise TraceError(f"{path}: no rows")
    rows.sort(key=lambda r: r[0])  # stable: rows of one millisecond keep their file order
    t0 = rows[0][0]
    return [(t - t0, c, g) for t, c, g in rows]


def read_mooncake(path: str | Path) -> list[tuple[int, int, int, int]]:
    """(arrival ms since first row, prompt tokens, output tokens, prompt blocks already seen)
    from a Mooncake JSONL trace (`timestamp`, `input_length`, `output_length`, `hash_ids`),
    in arrival order. A prompt's prefix is reusable only up to its first unseen block."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"--trace: no such file {path}")
    seen: set[int] = set()
    rows = []
    with _open_text(p) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                ids = r.get("hash_ids") or []
                cached = 0
                for h in ids:
                    if h not in seen:
                        break
                    cached += 1
                seen.update(ids)
                rows.append((int(r["timestamp"]), int(r["input_length"]), int(r["output_length"]), cached))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise TraceError(f"{path}:{lineno}: expected a JSON object with timestamp, input_length, "
                                 "output_length") from None
    if not rows:
        raise TraceError(f"{path}: no rows")
    rows.sort(key=lambda r: r[0])  # stable: rows of one millisecond keep their file order
    t0 = rows[0][0]
    return [(t - t0, c, g, k) for t, c, g, k in rows]


PREFIX_WARMUP_MS = 5 * 60_000


def is_azure_csv(path: str | Path) -> bool:
    """An Azure LLM inference trace (CSV, no prefix blocks); otherwise a Mooncake JSONL trace."""
    return Path(path).name.removesuffix(".gz").endswith(".csv")


def read_prefix_reuse(path: str | Path, warmup_ms: int = PREFIX_WARMUP_MS) -> list[tuple[int, int, int, float]]:
    """(arrival ms, prompt tokens, output tokens, cached prompt tokens) in arrival order: the
    prompt's prefix already seen in the trace, in whole blocks and at most the prompt (the
    reuse a prefix cache large enough to keep the trace's hour would serve), from a Mooncake
    trace; NaN (not reported) for a trace that has no block ids (the Azure traces).

    A trace starts with its cache empty (its first minute reuses 5% of prompt tokens, its
    hour 37%), which no running fleet sees: the requests of the first `warmup_ms` only warm
    the cache and are left out, and the rest arrive from 0."""
    if is_azure_csv(path):
        return [(t, c, g, math.nan) for t, c, g in read_trace(path)]
    return [(t - warmup_ms, c, g, float(min(c, k * MOONCAKE_BLOCK_TOKENS)))
            for t, c, g, k in read_mooncake(path) if t >= warmup_ms]


def _open_text(path: Path):
    """A trace file as text, gzip-compressed (`.gz`) or not."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return path.open(newline="")


def read_any_trace(path: str | Path) -> list[tuple[int, int, int]]:
    """(arrival ms from the first request, prompt tokens, output tokens) of an Azure LLM
    inference trace CSV or a Mooncake JSONL trace (either gzip-compressed or not), in arrival order."""
    if is_azure_csv(path):
        return read_trace(path)
    return [(t, c, g) for t, c, g, _cached in read_mooncake(path)]


class TraceReplay:
    """LLM requests at the trace's own arrival times and token counts."""

    def __init__(self, path: str | Path | None = None, minutes: int | None = None, seed: int = 7,
                 start: str = DEFAULT_START, model: str = "llama-3.1-70b", version: str = "2024-07",
                 rows: list[tuple[int, int, int]] | None = None):
        """From an Azure trace file, or from `rows` already read and shaped (the bench)."""
        self.rows = rows if rows is not None else read_trace(path)
        if minutes is not None:
            self.rows = [r for r in self.rows if r[0] < minutes * 60_000]
        self.seed, self.model, self.version = seed, model, version
        self.start_ms = parse_start(start)
        self.rng = np.random.default_rng(seed)
        self.totals = SimTotals()

    def truth(self) -> list[dict]:
        return []

    def events(self) -> Iterator[RequestV1]:
        rng = self.rng
        n = len(self.rows)
        tenants = rng.choice(len(TENANTS), n, p=TENANT_WEIGHTS)
        zones = rng.integers(0, len(ZONES), n)
        queue = rng.lognormal(math.log(12), 0.7, n)
        fails = rng.random(n)
        for i, (offset_ms, ctx, gen) in enumerate(self.rows):
            ok = bool(fails[i] >= 0.005)
            first = 60 + ctx * PREFILL_MS_PER_TOKEN
            e2e = float(queue[i]) + first + gen * DECODE_MS_PER_TOKEN
            zone = ZONES[zones[i]]
            t = self.totals
            t.requests += 1
            t.by_status["ok" if ok else "error"] += 1
            t.turns += 1
            t.successful_turns += int(ok)
            t.output_tokens += gen if ok else 0
            yield RequestV1(
                schema="request.v1", event_id=f"trace-{self.seed:x}-{i:x}", ts=self.start_ms + offset_ms,
                tenant=TENANTS[tenants[i]], model=self.model, workload="llm", status="ok" if ok else "error",
                model_version=self.version, zone=zone, region=REGION, pool=f"llm-{zone}-realtime",
                endpoint="/v1/completions", traffic_class="realtime", deployment="stable",
                http_status=200 if ok else 503, attempt=1, task_success=ok,
                queue_ms=round(float(queue[i]), 2), first_output_ms=round(first, 2) if ok else None,
                inter_token_ms=DECODE_MS_PER_TOKEN if ok else None, e2e_ms=round(e2e, 2),
                prompt_tokens=ctx, output_tokens=gen if ok else 0,
                gpu_seconds=round((first + gen * DECODE_MS_PER_TOKEN) / 1000 / 8, 4), gpu_sku="H100",
            )
