"""`tailwatch bench --month`: a month of event time through the embedded broker and one worker.

`slices` busy slices each send a request every `every_minutes` minutes (staggered, so every
minute closes with traffic: the sparse shape), with a low error rate and an hour-long
incident on a few slices every few days, for `days` days and 17 minutes (so that the
30-day window's oldest edge falls inside an hour block). The worker runs every default stage
and SLO while the month is published; its RSS and the broker's are sampled ten times a second
and read at event-time days 2, 10, 20 and 30. At the end: CPU-seconds, store size, each
component's state, and every availability SLO slice's 30-day budget left against an exact
count of the events published.

The worker's copies (`tw.sli` and the other topics it writes) travel compressed
(`COMPRESSION`, through its `--kafka-config`): the embedded broker keeps every record in memory
and cannot delete any (it has no DeleteRecords), and uncompressed a month of requests and
copies fills some 17.5 GB of it, three quarters of it the copies. The requests the worker
reads stay as they were: compressed, each fetch of a backlog would bring it several times more
bytes to decompress, and its resident memory would measure that.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import duckdb
import numpy as np

from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.ingest.kafka import KafkaSettings, make_producer, send
from tailwatch.reports.csv_out import write_rows
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.process_memory import HOLDERS
from tailwatch.cli import progress, progress_done
from tailwatch_dev.bench import T0_MS, _accepted, _rss_bytes, fresh, memory_by_holder
from tailwatch.conventions import TOPIC_REQUESTS

WORKLOADS = ("asr", "tts", "llm", "s2s")
DAY_MINUTES = 1440
SAMPLES_PER_SECOND = 10  # the worker's and the broker's RSS
MIN_DAY_S = 10  # a day counts in the flatness figure when the worker spent this long reading it
# lz4: the worker's copies in a fraction of the broker's memory at the least CPU of librdkafka's
# codecs (zstd packs tighter and costs more).
COMPRESSION = "lz4"
# Every month request: its error rate, its first output (lognormal µ, σ of ms), its end-to-end
# time past the first output, and the fields that do not vary (`bench --restore-fleet` too).
ERROR_RATE = 0.002
FIRST_OUTPUT_LOGNORMAL = (5.8, 0.4)
E2E_AFTER_FIRST_OUTPUT_MS = 900
FIXED_FIELDS = {"attempt": 1, "task_success": True, "queue_ms": 12.5, "prompt_tokens": 256, "output_tokens": 120,
                "gpu_seconds": 0.2}


def slice_labels(i: int) -> dict[str, str]:
    w = WORKLOADS[i % 4]
    return {"tenant": f"tenant-{i % 97:03d}", "model": f"model-{i % 13}", "model_version": f"v{i % 7}",
            "zone": f"zone-{i % 3}", "workload": w, "traffic_class": "realtime" if i % 5 else "batch",
            "deployment": "stable", "pool": f"{w}-pool-{i % 29}"}


def month_events(slices: int, minutes: int, every_minutes: int, seed: int):
    """Yield (minute, slice, error, key, value) in event-time order."""
    rng = np.random.default_rng(seed)
    labels = [slice_labels(i) for i in range(slices)]
    text = [",".join(f'"{k}":"{v}"' for k, v in lab.items()) + ',"region":"r1","endpoint":"/v1/x"' for lab in labels]
    fixed = json.dumps(FIXED_FIELDS, separators=(",", ":"))[1:-1]
    incident_slices = rng.choice(slices, size=max(1, slices // 50), replace=False)
    for minute in range(minutes):
        busy = np.arange(minute % every_minutes, slices, every_minutes)
        in_incident = (minute // 60) % 96 == 40  # an hour every four days
        p_error = np.full(len(busy), ERROR_RATE)
        if in_incident:
            p_error[np.isin(busy, incident_slices)] = 0.3
        errors = rng.random(len(busy)) < p_error
        fo = rng.lognormal(*FIRST_OUTPUT_LOGNORMAL, len(busy))
        ts = T0_MS + minute * 60_000 + rng.integers(0, 60_000, len(busy))
        for j, i in enumerate(busy.tolist()):
            yield minute, i, bool(errors[j]), labels[i]["tenant"].encode(), (
                f'{{"schema":"request.v1","event_id":"m{seed}-{minute:x}-{i:x}","ts":{ts[j]},{text[i]},'
                f'"status":"{"error" if errors[j] else "ok"}","http_status":200,{fixed},'
                f'"first_output_ms":{fo[j]:.2f},"e2e_ms":{fo[j] + E2E_AFTER_FIRST_OUTPUT_MS:.2f},"gpu_sku":"H100"}}').encode()


def run_month(slices: int = 1_000, days: int = 30, every_minutes: int = 5, seed: int = 1,
              out: Path | None = None, store_memory_limit_mib: int | None = None) -> list[str]:
    minutes = days * DAY_MINUTES + 17
    per_residue = [len(range(r, slices, every_minutes)) for r in range(every_minutes)]
    total = sum(per_residue[m % every_minutes] for m in range(minutes))
    per_minute = total / minutes
    workdir = Path(tempfile.mkdtemp(prefix="tailwatch-month-"))
    broker = EmbeddedBroker(port=free_port())
    broker.start()
    try:
        settings = fresh(broker)
        kafka_config = workdir / "kafka.properties"
        kafka_config.write_text(f"compression.type={COMPRESSION}\n")  # the worker's copies; its consumer ignores it
        store_path = workdir / "month.duckdb"
        stats = workdir / "stats.json"
        port = free_port()
        worker = subprocess.Popen(
            [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", settings.bootstrap_servers,
             "--topic-prefix", settings.topic_prefix, "--store", str(store_path), "--group", f"month-{uuid.uuid4().hex[:6]}",
             "--http-port", str(port), "--until-idle", "20", "--stats-file", str(stats), "--kafka-config", str(kafka_config),
             *(["--store-memory-limit", str(store_memory_limit_mib)] if store_memory_limit_mib else [])],
            stdout=subprocess.DEVNULL, stderr=open(workdir / "worker.log", "wb"))
        truth: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        published = threading.Event()

        def produce() -> None:
            producer = make_producer(settings)
            topic = settings.topic(TOPIC_REQUESTS)
            ms, ss, es = [], [], []
            for n, (minute, i, error, key, value) in enumerate(month_events(slices, minutes, every_minutes, seed), 1):
                send(producer, topic, value, key)
                ms.append(minute)
                ss.append(i)
                es.append(error)
                if n % 50_000 == 0:
                    producer.poll(0)
            producer.flush(300)
            truth.append((np.array(ms, np.int64), np.array(ss, np.int64), np.array(es, bool)))
            published.set()

        started = time.monotonic()
        threading.Thread(target=produce, daemon=True).start()
        samples: list[tuple[float, int, int]] = []  # (events seen, worker RSS, broker RSS)
        holders: dict[int, dict[str, float]] = {}  # event-time day → the worker's memory by holder
        seen, tick = 0.0, 0
        while worker.poll() is None:
            # RSS ten times a second: within an event-day it swings by hundreds of MiB with the
            # batch in flight and the store's writes, so a day's median wants a few hundred
            # samples (a month runs in some 900 s). The worker's count once a second.
            if tick % SAMPLES_PER_SECOND == 0:
                seen = _accepted(port) or seen
                day = int(seen / per_minute / DAY_MINUTES)
                if day not in holders:
                    holders[day] = memory_by_holder(port)
            rss, broker_rss = _rss_bytes(worker.pid), _rss_bytes(broker.proc.pid) if broker.proc else 0
            if rss:
                samples.append((seen, rss, broker_rss))
            if tick % SAMPLES_PER_SECOND == 0:
                progress(f"  month: day {seen / per_minute / DAY_MINUTES:5.1f} of {minutes / DAY_MINUTES:.1f}, "
                         f"{seen:,.0f}/{total:,} events, worker {rss / 2**20:,.0f} MiB, "
                         f"broker {broker_rss / 2**20:,.0f} MiB{'' if published.is_set() else ' (publishing)'}")
            tick += 1
            time.sleep(1.0 / SAMPLES_PER_SECOND)
        progress_done()
        wall = time.monotonic() - started
        if worker.returncode != 0:
            tail = (workdir / "worker.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"the worker exited with {worker.returncode}: {' '.join(tail)}")
        result = json.loads(stats.read_text())
        published.wait(60)
        minute_of, slice_of, error_of = truth[0]
        store_bytes = sum(f.stat().st_size for f in workdir.glob("month.duckdb*"))
        lines = [
            f"month: {slices:,} busy slices, a request each every {every_minutes} minutes, {minutes:,} event-minutes "
            f"({minutes / DAY_MINUTES:.1f} days), {len(minute_of):,} events, every default stage and SLO",
            f"  worker: {result['events']:,} events in {result['cpu_seconds_processing']:,.0f} CPU-s "
            f"({result['events'] / max(result['cpu_seconds_processing'], 1e-9):,.0f} events/CPU-s, "
            f"{1000 * result['cpu_seconds_processing'] / minutes:.1f} ms per event-minute), {wall:,.0f} s wall",
            "  RSS at event-time day (median of the samples within a quarter day of it): "
            + ", ".join(f"day {d}: worker {w:,.0f} MiB, broker {b:,.0f} MiB" for d, w, b in _marks(samples, per_minute)),
            _spread(samples, per_minute, total),
            "  CPU per event-minute by stage: " + ", ".join(
                f"{name} {1000 * cpu / minutes:.2f} ms" for name, cpu in sorted(
                    result.get("stage_cpu_seconds", {}).items(), key=lambda kv: -kv[1])),
            f"  store: {store_bytes / 2**20:,.0f} MiB on disk after the month",
            "  state at the end: " + ", ".join(f"{k} {v / 2**20:,.1f} MiB" for k, v in result.get("state_bytes", {}).items()),
            *_holder_lines(holders),
        ]
        lines += _budgets(store_path, minute_of, slice_of, error_of, slices)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            # The chart's data, to redraw or compare runs.
            write_rows(out / "month-memory.csv", ("event_day", "worker_rss_mib", "broker_rss_mib"),
                       ((round(seen / per_minute / DAY_MINUTES, 4), round(w / 2**20, 1), round(b / 2**20, 1))
                        for seen, w, b in samples))
            lines.append(f"  chart: {_chart(samples, holders, per_minute, out / 'month-memory.png')} "
                         f"(its data: {out / 'month-memory.csv'})")
        return lines
    finally:
        broker.stop()


def _spread(samples: list[tuple[float, int, int]], per_minute: float, total: int, first_day: int = 3) -> str:
    """The flatness figure: the worker's median RSS per event-time day from `first_day` on,
    lowest and highest, over the days it spent at least `MIN_DAY_S` reading (once the
    publisher is done, the last days of the backlog pass in a few seconds each, a handful of
    samples) and before it had read everything (the drained worker idles lower). Medians,
    because a batch in flight moves a sample by a hundred MiB either way; a trend moves every
    sample of later days."""
    by_day = _by_day([s for s in samples if s[0] < total], per_minute)
    enough = MIN_DAY_S * SAMPLES_PER_SECOND
    medians = {day: float(np.median(v)) / 2**20 for day, v in by_day.items() if day >= first_day and len(v) >= enough}
    brief = [day for day, v in by_day.items() if day >= first_day and len(v) < enough]
    if not medians:
        return f"  worker RSS from day {first_day}: no day read for {MIN_DAY_S} s or more"
    low, high = min(medians, key=medians.get), max(medians, key=medians.get)
    return (f"  worker RSS, median of each event-time day from day {first_day} read for {MIN_DAY_S} s or more "
            f"({len(medians)} days): lowest {medians[low]:,.0f} MiB (day {low}), highest {medians[high]:,.0f} MiB "
            f"(day {high}), spread {medians[high] - medians[low]:,.0f} MiB"
            + (f"; days read in less: {', '.join(map(str, brief))}" if brief else ""))


def _by_day(samples: list[tuple[float, int, int]], per_minute: float) -> dict[int, list[int]]:
    """The worker's RSS samples (bytes) by event-time day, days in order."""
    by_day: dict[int, list[int]] = {}
    for seen, rss, _ in samples:
        by_day.setdefault(int(seen / per_minute / DAY_MINUTES), []).append(rss)
    return dict(sorted(by_day.items()))


def _daily_medians(samples: list[tuple[float, int, int]], per_minute: float) -> dict[int, float]:
    """The worker's median RSS (MiB) for each event-time day that has samples."""
    return {day: float(np.median(v)) / 2**20 for day, v in _by_day(samples, per_minute).items()}


def _holder_lines(holders: dict[int, dict[str, float]]) -> list[str]:
    """A line per event-time day: what held the worker's memory as the day began (MiB), so a
    rise has a name (streams/process_memory.py says what each holder is), and the store's
    memory limit then (raised where a checkpoint needed more)."""
    names = [*HOLDERS, "state", "store_limit"]
    lines = ["  worker memory by holder as each event-time day began (MiB): " + ", ".join(names)]
    for day in sorted(holders):
        if holders[day]:
            lines.append(f"    day {day:2d}: " + ", ".join(f"{holders[day].get(n, 0.0):,.0f}" for n in names))
    return lines


def _chart(samples: list[tuple[float, int, int]], holders: dict[int, dict[str, float]], per_minute: float,
           path: Path) -> Path:
    """The month's memory as a picture: the worker's RSS sampled ten times a second with its daily
    median, what held it as each day began (stacked), and the embedded broker's RSS below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    day = np.array([seen / per_minute / DAY_MINUTES for seen, _, _ in samples])
    worker = np.array([rss for _, rss, _ in samples]) / 2**20
    broker = np.array([b for _, _, b in samples]) / 2**20
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=(3, 1.4))
    days = sorted(d for d in holders if holders[d])
    if days:  # each day's holders drawn across that day (the last one repeated to close its step)
        xs = [*days, days[-1] + 1]
        top.stackplot(xs, *[[holders[d].get(h, 0.0) for d in [*days, days[-1]]] for h in HOLDERS], labels=HOLDERS,
                      step="post", alpha=0.45)
    top.plot(day, worker, color="#616161", lw=0.4, alpha=0.6, label="worker RSS (10 a second)")
    medians = _daily_medians(samples, per_minute)
    top.plot([d + 0.5 for d in medians], list(medians.values()), color="#c62828", lw=2, marker="o", ms=3,
             label="its median per day")
    top.set_ylabel("MiB")
    top.set_title("tailwatch worker over a month of event time: resident memory, and what held it")
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    bottom.plot(day, broker, color="#3b6ea8", lw=0.8)
    bottom.set_ylabel("broker MiB")
    bottom.set_xlabel("event-time day")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _marks(samples: list[tuple[float, int, int]], per_minute: int) -> list[tuple[int, float, float]]:
    out = []
    for day in (2, 10, 20, 30):
        near = [(w, b) for seen, w, b in samples if abs(seen / per_minute / DAY_MINUTES - day) <= 0.25]
        if near:
            out.append((day, float(np.median([w for w, _ in near])) / 2**20, float(np.median([b for _, b in near])) / 2**20))
    return out


def _budgets(store_path: Path, minute_of: np.ndarray, slice_of: np.ndarray, error_of: np.ndarray,
             slices: int) -> list[str]:
    """Each availability SLO slice's budget left in its newest `slo_status` row against an
    exact count over the 30 days ending at that row's minute."""
    labels = [slice_labels(i) for i in range(slices)]
    con = duckdb.connect(str(store_path), read_only=True)
    try:
        rows = con.execute(
            "SELECT slo, slice, epoch(window_start)::BIGINT // 60 - ? AS minute, error_budget_remaining FROM slo_status "
            "QUALIFY row_number() OVER (PARTITION BY slo, slice ORDER BY window_start DESC) = 1",
            [T0_MS // 60_000]).fetchall()
    finally:
        con.close()
    worst_budget, worst_events, compared = 0.0, 0.0, 0
    for spec in (s for s in load_slos(DEFAULT_SLOS) if s.sli_kind == "availability"):
        for slo, slice_text, minute, remaining in rows:
            if slo != spec.name:
                continue
            key = dict(part.split("=", 1) for part in slice_text.split(",")) if slice_text else {}
            members = [i for i, lab in enumerate(labels)
                       if all(lab.get(k) == v for k, v in spec.selector.items()) and all(lab[k] == v for k, v in key.items())]
            window = (minute_of > minute - spec.period_minutes) & (minute_of <= minute) & np.isin(slice_of, members)
            valid, bad = int(window.sum()), int((window & error_of).sum())
            exact = 1.0 - bad / (valid * (1 - spec.objective)) if valid else 1.0
            worst_budget = max(worst_budget, abs(remaining - exact))
            worst_events = max(worst_events, abs(remaining - exact) * (1 - spec.objective))  # Δbad ÷ valid
            compared += 1
    return [f"  30-day budgets: {compared} availability SLO slices against an exact count; largest difference in budget "
            f"left {100 * worst_budget:.3f} points, {100 * worst_events:.4f}% of the window's events"]
