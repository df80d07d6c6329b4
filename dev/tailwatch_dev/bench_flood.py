"""`tailwatch bench --label-flood`: a producer bug that stamps every request with a new tenant
and model, through the embedded broker and one worker with its default cardinality caps.

A steady tenant (`steady`) sends a request every 10 ms of event time before and during the
flood; the flood is `flood` requests, each with a tenant and a model never seen before. The
worker is running and has read the steady tenant's first minute when the flood is published,
as a live worker would be. While it drains the flood (`--until-idle`), its RSS is sampled ten times a second and `/metrics` is
scraped every half second (latency, status, series). At the end: peak RSS (the kernel's
high-water mark), /metrics latency, the overflow counters, and the store's rows checked
against what was sent: the steady tenant exact, the flood in `__other__` but for the values
that found room.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import duckdb
import numpy as np

from tailwatch.conventions import (LABEL_VALUES_OVERFLOWED_TOTAL, OVERFLOW_LABEL_VALUE, SLICES_OVERFLOWED_TOTAL,
                         TOPIC_REQUESTS)
from tailwatch_dev.broker import EmbeddedBroker, free_port
from tailwatch.ingest.kafka import make_producer, send
from tailwatch.cli import progress, progress_done
from tailwatch_dev.bench import T0_MS, _accepted, fresh

STEADY_TENANT = "steady"
STEADY_EVERY_MS = 10
SCRAPE_EVERY_S = 0.5
SAMPLES_PER_SECOND = 10


def _request(event_id: str, ts_ms: int, tenant: str, model: str) -> bytes:
    return (f'{{"schema":"request.v1","event_id":"{event_id}","ts":{ts_ms},"tenant":"{tenant}","model":"{model}",'
            f'"workload":"llm","status":"ok","zone":"zone-a","pool":"llm-a","e2e_ms":900.0}}').encode()


def flood_records(flood: int, flood_minutes: int) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]], int]:
    """(key, value) in publishing order: a minute of the steady tenant alone; then the flood
    spread over `flood_minutes` with the steady tenant's requests among it. Returns both and
    the steady tenant's count."""
    before, out, steady = [], [], 0
    span_ms = flood_minutes * 60_000
    for i in range(60_000 // STEADY_EVERY_MS):
        before.append((b"steady", _request(f"s{steady}", T0_MS + i * STEADY_EVERY_MS, STEADY_TENANT, "chat-70b")))
        steady += 1
    start = T0_MS + 60_000
    flood_ts = start + (np.arange(flood, dtype=np.int64) * span_ms) // max(flood, 1)
    next_steady = start
    for i, ts in enumerate(flood_ts.tolist()):
        while next_steady <= ts:
            out.append((b"steady", _request(f"s{steady}", next_steady, STEADY_TENANT, "chat-70b")))
            steady += 1
            next_steady += STEADY_EVERY_MS
        out.append((f"f{i}".encode(), _request(f"f{i}", ts, f"bot-{i:06d}", f"model-{i:06d}")))
    return before, out, steady


def _publish(settings, records: list[tuple[bytes, bytes]]) -> None:
    producer = make_producer(settings)
    topic = settings.topic(TOPIC_REQUESTS)
    for n, (key, value) in enumerate(records, 1):
        send(producer, topic, value, key)
        if n % 50_000 == 0:
            producer.poll(0)
    producer.flush(300)


def _scrape(port: int) -> tuple[int | None, float, str]:
    began = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15) as r:
            return r.status, time.monotonic() - began, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, time.monotonic() - began, ""
    except OSError:
        return None, time.monotonic() - began, ""


def _sum(text: str, name: str, label: str | None = None) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and (label is None or f'label="{label}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _status_bytes(pid: int, field: str) -> int:
    """A size from /proc/PID/status: `VmRSS` (resident now), `VmHWM` (the resident peak)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_flood(flood: int = 200_000, flood_minutes: int = 5, worker_args: tuple[str, ...] = ()) -> list[str]:
    workdir = Path(tempfile.mkdtemp(prefix="tailwatch-flood-"))
    broker = EmbeddedBroker(port=free_port())
    broker.start()
    try:
        settings = fresh(broker)
        before, records, steady = flood_records(flood, flood_minutes)
        _publish(settings, before)
        store_path, port = workdir / "flood.duckdb", free_port()
        worker = subprocess.Popen(
            [sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", settings.bootstrap_servers,
             "--topic-prefix", settings.topic_prefix, "--store", str(store_path), "--group", f"flood-{uuid.uuid4().hex[:6]}",
             "--http-port", str(port), "--until-idle", "10", *worker_args],
            stdout=subprocess.DEVNULL, stderr=open(workdir / "worker.log", "wb"))
        started = time.monotonic()
        rss: list[int] = []
        peak = [0]
        scrapes: list[tuple[int | None, float, float]] = []  # status (None: refused), latency, when
        last = [""]
        stop = threading.Event()

        def scraper() -> None:
            while not stop.is_set():
                status, took, text = _scrape(port)
                # Before the port first answers the worker is starting; after it exits, gone: neither is a failure.
                if (status is not None or scrapes) and worker.poll() is None:
                    scrapes.append((status, took, time.monotonic() - started))
                if text:
                    last[0] = text
                stop.wait(SCRAPE_EVERY_S)

        threading.Thread(target=scraper, daemon=True).start()
        while (_accepted(port) or 0) < len(before):
            if worker.poll() is not None or time.monotonic() - started > 300:
                raise RuntimeError(f"the worker did not read the steady tenant's first minute: exit {worker.poll()}")
            time.sleep(0.2)
        threading.Thread(target=_publish, args=(settings, records), daemon=True).start()
        tick = 0
        while worker.poll() is None:
            r = _status_bytes(worker.pid, "VmRSS")
            if r:
                rss.append(r)
            peak[0] = max(peak[0], _status_bytes(worker.pid, "VmHWM"))
            if tick % SAMPLES_PER_SECOND == 0:
                progress(f"  label flood: {time.monotonic() - started:5.0f} s, worker {r / 2**20:,.0f} MiB, "
                         f"{len(scrapes)} scrapes")
            tick += 1
            time.sleep(1.0 / SAMPLES_PER_SECOND)
        stop.set()
        progress_done()
        wall = time.monotonic() - started
        if worker.returncode != 0:
            tail = (workdir / "worker.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"the worker exited with {worker.returncode}: {' '.join(tail)}")
        con = duckdb.connect(str(store_path), read_only=True)
        try:
            total, = con.execute("SELECT sum(requests) FROM sli_minute").fetchone()
            steady_rows, = con.execute("SELECT sum(requests) FROM sli_minute WHERE tenant = ?", [STEADY_TENANT]).fetchone()
            other, = con.execute("SELECT sum(requests) FROM sli_minute WHERE tenant = ?", [OVERFLOW_LABEL_VALUE]).fetchone()
            tenants, = con.execute("SELECT count(DISTINCT tenant) FROM sli_minute").fetchone()
            letters, = con.execute("SELECT count(*) FROM dead_letter").fetchone()
        finally:
            con.close()
        answered = [took for status, took, _ in scrapes if status == 200]
        failed = sum(1 for status, _, _ in scrapes if status != 200)
        statuses = ", ".join(f"{s or 'refused'} at {at:.0f} s" for s, _, at in scrapes if s != 200)
        text = last[0]
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        lat = np.array(answered) if answered else np.array([float("nan")])
        return [
            f"label flood: {flood:,} requests with a new tenant and model each over {flood_minutes} event-minutes, "
            f"{steady:,} of a steady tenant before and among them; one worker, caps "
            f"{' '.join(worker_args) or 'at their defaults'}; {wall:,.0f} s wall",
            f"  worker RSS: peak {peak[0] / 2**20:,.0f} MiB (VmHWM), median of samples {np.median(rss) / 2**20:,.0f} MiB",
            f"  /metrics: {len(scrapes)} scrapes every {SCRAPE_EVERY_S} s while it drained, {failed} not 200{f' ({statuses} of {wall:.0f})' if failed else ''}; latency "
            f"p50 {np.percentile(lat, 50) * 1000:,.0f} ms, p99 {np.percentile(lat, 99) * 1000:,.0f} ms, "
            f"max {lat.max() * 1000:,.0f} ms; {series:,} series in the last answer",
            f"  overflow: tenant {_sum(text, LABEL_VALUES_OVERFLOWED_TOTAL, 'tenant'):,.0f}, model "
            f"{_sum(text, LABEL_VALUES_OVERFLOWED_TOTAL, 'model'):,.0f} events past the label caps, "
            f"{_sum(text, SLICES_OVERFLOWED_TOTAL):,.0f} past the slice cap",
            f"  store: {total:,} requests of {flood + steady:,} sent; {STEADY_TENANT} {steady_rows:,} of {steady:,}; "
            f"{OVERFLOW_LABEL_VALUE} {other or 0:,}; {tenants:,} tenants; {letters:,} dead letters",
            json.dumps({"peak_rss_mib": round(peak[0] / 2**20), "metrics_failed": failed,
                        "metrics_p99_ms": round(float(np.percentile(lat, 99)) * 1000)}),
        ]
    finally:
        broker.stop()
