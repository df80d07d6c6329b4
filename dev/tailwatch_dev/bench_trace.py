"""`tailwatch bench --shape dense|sparse --trace FILE`: the worker on a public LLM trace.

The synthetic firehose of `tailwatch bench` floods about one event-minute; a real fleet is
thinner, and there the cost of closing a minute (SLOs, detectors, fleet metrics, the
signal view, the checkpoint) dominates. This bench replays a public trace (the Azure code
trace or the Mooncake conversation trace in `tests/data`) through a librdkafka
producer keyed by tenant into the embedded broker, and drains it with a worker running
every default stage, in two shapes:

- dense: each hour of the trace squeezed into one event-minute (the trace's hour, about
  9,000 to 24,000 requests, per minute);
- sparse: the trace at its own pace, hour after hour (a few hundred requests a minute).

It reports events per CPU-second (from the first event, so the worker's imports and group
join are left out), CPU per closed minute for each stage, and the naive faust agent's rate
on the same events in the same run.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgspec

from tailwatch_dev.trace import TraceReplay, read_any_trace
from tailwatch_dev.bench import run_baseline, worker_processes
from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch_dev.traces import AZURE_CODE_TRACE as DEFAULT_TRACE
from tailwatch.cli import progress, progress_done
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, make_producer, send
from tailwatch.conventions import TOPIC_REQUESTS
HOUR_MS = 3_600_000
SHAPES = ("dense", "sparse")
DEFAULT_HOURS = {"dense": 60, "sparse": 24}  # about 550k and 220k events of the Azure code trace


@dataclass(frozen=True)
class ShapeResult:
    shape: str
    events: int
    event_minutes: int
    cpu_s: float
    minutes_closed: int
    stage_cpu_s: dict[str, float]
    baseline_rate: float | None

    @property
    def rate(self) -> float:
        return self.events / self.cpu_s if self.cpu_s else 0.0

    def lines(self) -> list[str]:
        out = [f"{self.shape}: {self.events:,} events over {self.event_minutes:,} event-minutes, {self.cpu_s:.1f} CPU-s "
               f"→ {self.rate:,.0f} events/CPU-s"
               + (f"; the naive faust agent {self.baseline_rate:,.0f} → {self.rate / self.baseline_rate:.1f}×"
                  if self.baseline_rate else "")]
        if self.minutes_closed:
            per = {k: 1000 * v / self.minutes_closed for k, v in sorted(self.stage_cpu_s.items(), key=lambda kv: -kv[1])}
            staged = sum(self.stage_cpu_s.values())
            out.append(f"  per closed minute ({self.minutes_closed:,}): {1000 * self.cpu_s / self.minutes_closed:.1f} ms in "
                       "all, of which " + ", ".join(f"{k} {v:.2f} ms" for k, v in per.items())
                       + f", the rest (consume, validate, dedupe, window) {1000 * (self.cpu_s - staged) / self.minutes_closed:.2f} ms")
        return out


def shaped(rows: list[tuple[int, int, int]], shape: str, hours: int) -> list[tuple[int, int, int]]:
    """The trace's first hour, `hours` times over: one event-minute per hour (dense) or at
    its own pace, hour after hour (sparse)."""
    first_hour = [r for r in rows if r[0] < HOUR_MS]
    out = []
    for h in range(hours):
        if shape == "dense":
            out += [(h * 60_000 + off // 60, c, g) for off, c, g in first_hour]
        else:
            out += [(h * HOUR_MS + off, c, g) for off, c, g in first_hour]
    return out


def publish_trace(settings: KafkaSettings, rows: list[tuple[int, int, int]], seed: int) -> int:
    replay = TraceReplay(rows=rows, seed=seed)
    producer = make_producer(settings)
    topic = settings.topic(TOPIC_REQUESTS)
    encode = msgspec.json.Encoder().encode
    n = 0
    for n, event in enumerate(replay.events(), 1):
        send(producer, topic, encode(event), event.tenant.encode())
        if n % 50_000 == 0:
            producer.poll(0)
            progress(f"  published {n:,}/{len(rows):,}")
    producer.flush(120)
    progress_done()
    return n


def run(trace: Path, shapes: tuple[str, ...], hours: int | None, baseline_events: int, skip_baseline: bool,
        say=lambda m: print(m, file=sys.stderr, flush=True)) -> list[str]:
    rows = read_any_trace(trace)
    workdir = Path(tempfile.mkdtemp(prefix="tailwatch-bench-trace-"))
    broker = EmbeddedBroker(port=free_port())
    broker.start()
    lines: list[str] = [f"trace {trace.name}: {sum(r[0] < HOUR_MS for r in rows):,} requests in its first hour"]
    try:
        for shape in shapes:
            events = shaped(rows, shape, hours or DEFAULT_HOURS[shape])
            minutes = events[-1][0] // 60_000 + 1
            say(f"{shape}: {len(events):,} events over {minutes:,} event-minutes through a worker with every default stage")
            s = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:6]}.")
            ensure_topics(s, 4)
            total = publish_trace(s, events, seed=7)
            run_ = worker_processes(s, 1, workdir, total, all_stages=True)
            stats = run_["per_worker"][0]
            base_rate = None
            if not skip_baseline:
                n = min(baseline_events, total)
                say(f"{shape}: the naive faust agent on the first {n:,} of the same events")
                base = run_baseline(s, n, workdir, "record")
                base_rate = base["events"] / base["cpu_s"]
            result = ShapeResult(shape, run_["events"], minutes, run_["cpu_s"], stats.get("minutes_closed", 0),
                                 stats.get("stage_cpu_seconds") or {}, base_rate)
            lines += result.lines()
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return lines
