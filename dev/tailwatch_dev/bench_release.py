"""`tailwatch bench --shape both --against-release DIR`: this tree's worker against the pinned
baseline release's, on the same public-trace replays, interleaved in one sitting.

Comparing only against the commit before lets a slow loss pass a step at a time; the pinned
release stays put. Each trace and shape is published once into the embedded broker, then
read by a worker of the release and one of this tree in turn (A, B, A, B...), each in a
fresh consumer group of its own: the same events, the same broker, the same minutes. Each
round's events per CPU-second (from the first event) and start-up CPU (imports, store,
group join: everything before the first event) are reported, and the ratio of this tree
to the release as the geometric mean over the rounds.

The release runs from its own checkout, with an environment of its own (`DIR/.venv`, or
`--release-python`): its dependencies are not this tree's.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
from tailwatch_dev.trace import read_any_trace
from tailwatch_dev.bench import worker_processes
from tailwatch_dev.bench_trace import DEFAULT_HOURS, publish_trace, shaped

# The release every speed figure in docs/benchmarks.md is held against (2026-11-25, from
# before the last two waves of changes): pinned, so a loss cannot pass a step at a time.
PINNED_RELEASE = "df0bd42991b6cb2cdd3557550d5adbc7575e832a"
PINNED_RELEASE_DATE = "2026-11-25"


class ReleaseError(Exception):
    """The release's checkout or environment is not there, or is another commit."""


@dataclass
class Side:
    name: str
    rates: list[float] = field(default_factory=list)  # events per CPU-second, a round each
    start_cpu_s: list[float] = field(default_factory=list)


def release_code(tree: Path, python: Path | None) -> tuple[str, Path]:
    """(interpreter, checkout) of the pinned release, checked."""
    tree = tree.resolve()
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0 or head.stdout.strip() != PINNED_RELEASE:
        raise ReleaseError(
            f"{tree} is not a checkout of the pinned release {PINNED_RELEASE[:7]} "
            f"(make one: git worktree add {tree} {PINNED_RELEASE[:7]}; python3 -m venv {tree}/.venv; "
            f"{tree}/.venv/bin/pip install -e '{tree}[bench]')")
    python = python or tree / ".venv" / "bin" / "python"
    if not Path(python).is_file():
        raise ReleaseError(f"no interpreter for the release at {python} (give --release-python)")
    return str(python), tree


def compare(traces: list[Path], shapes: tuple[str, ...], rounds: int, release: tuple[str, Path],
            hours: int | None = None, say=lambda m: print(m, file=sys.stderr, flush=True)) -> list[str]:
    workdir = Path(tempfile.mkdtemp(prefix="tailwatch-bench-release-"))
    broker = EmbeddedBroker(port=free_port(), log_path=str(workdir / "broker.log"))
    broker.start()
    lines = [f"this tree against the pinned release {PINNED_RELEASE[:7]} ({PINNED_RELEASE_DATE}), "
             f"interleaved, {rounds} rounds each; events/CPU-s from the first event, start-up CPU-s before it:"]
    try:
        for trace in traces:
            rows = read_any_trace(trace)
            for shape in shapes:
                events = shaped(rows, shape, hours or DEFAULT_HOURS[shape])
                s = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"r{uuid.uuid4().hex[:6]}.")
                ensure_topics(s, 4)
                say(f"{trace.name} {shape}: publishing {len(events):,} events")
                total = publish_trace(s, events, seed=7)
                sides = {"release": Side("the release"), "this": Side("this tree")}
                for i in range(rounds):
                    for key, code in (("release", release), ("this", None)):
                        run = worker_processes(s, 1, workdir, total, all_stages=True, code=code)
                        stats = run["per_worker"][0]
                        sides[key].rates.append(run["events"] / run["cpu_s"])
                        sides[key].start_cpu_s.append(stats["cpu_seconds"] - stats["cpu_seconds_processing"])
                        say(f"  round {i + 1}/{rounds} {sides[key].name}: {sides[key].rates[-1]:,.0f} events/CPU-s, "
                            f"start-up {sides[key].start_cpu_s[-1]:.2f} CPU-s")
                lines += _lines(f"{trace.name} {shape} ({total:,} events, "
                                f"{events[-1][0] // 60_000 + 1:,} event-minutes)", sides["release"], sides["this"])
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return lines


def _lines(title: str, before: Side, after: Side) -> list[str]:
    ratio = math.prod(a / b for a, b in zip(after.rates, before.rates)) ** (1 / len(before.rates))
    return [
        f"{title}: this tree/release {ratio:.2f}× (geometric mean of the rounds)",
        f"  events/CPU-s: release {' · '.join(f'{r:,.0f}' for r in before.rates)}; "
        f"this tree {' · '.join(f'{r:,.0f}' for r in after.rates)}",
        f"  start-up CPU-s: release {' · '.join(f'{c:.2f}' for c in before.start_cpu_s)}; "
        f"this tree {' · '.join(f'{c:.2f}' for c in after.start_cpu_s)}",
    ]
