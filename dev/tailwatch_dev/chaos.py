"""Randomised fault ("chaos") runs of the real pipeline, checked against the log itself.

This module owns the chaos harness. `run_chaos` builds a request and GPU
stream from the public traces in `tests/data` (the Azure LLM code trace and the
Mooncake conversation trace: arrival times and token counts, nothing else), publishes it
live, in event-time chunks, with a librdkafka producer of its own (not
`ingest/producer.py`) into an embedded broker of its own, and runs real `tailwatch
worker` processes and a real Alertmanager. Faults are drawn from a seeded
`random.Random`: SIGKILLs (some before the worker's first checkpoint), a second group
member that joins and leaves, poison records of every kind in random partitions
(2 MB ones included), partitions left silent for minutes, the broker stopped with
SIGSTOP, the broker restarted (its log, kept in memory, lost), Alertmanager taken down and
brought back; and, where `label_flood` asks, a label flood: requests each with a tenant never
seen before, past the workers' cardinality cap.

At the end a fresh worker drains with `--until-idle`, and the store is compared with an
aggregation of what was produced, computed here in DuckDB SQL from the delivered bytes:
every `sli_minute` and `gpu_minute` row, `EXCEPT ALL` both ways (a flood tenant that found no
room expected under `__other__`). No worker code is
imported for that; only `slo/histogram.py`'s constants are shared, and the bin formula,
quantiles and fixed-point sums are written again in SQL. Dead letters are matched to the
poison records by source offset, and every alert in the store's `alerts` table is looked
up in what Alertmanager received. `ChaosReport.table()` prints the result.

Wall time is spent on purpose: the stream is paced so that faults land mid-stream. At
`speedup` 60 one event-minute takes one wall second.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import zlib
import dataclasses
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Sequence

import duckdb
import numpy as np

from tailwatch_dev.trace import MOONCAKE_BLOCK_TOKENS, read_mooncake, read_trace
from tailwatch.slo import histogram  # constants only: the bin and quantile formulas are rewritten in SQL below
from tailwatch_dev.broker import BrokerError, EmbeddedBroker, free_port
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics
from tailwatch_dev.traces import AZURE_CODE_TRACE, MOONCAKE_TRACE
from tailwatch.conventions import CHECKPOINT_DURATION_SECONDS, EVENTS_TOTAL, OVERFLOW_LABEL_VALUE


START_MS = int(datetime(2026, 3, 2, tzinfo=timezone.utc).timestamp() * 1000)  # fixed: runs are replayable
MINUTE_MS = 60_000
PARTITIONS = 4
CHUNK_MS = 20_000  # event time per publish chunk: well under the worker's 60 s idle timeout
GPU_SAMPLE_MS = 10_000
OVERSIZED_BYTES = 2_000_000  # past the worker's producer limit (librdkafka's 1,000,000 default)
PRODUCER_MAX_BYTES = 5_000_000  # our producer lets the oversized records in, as a careless one would

# Seven tenants. Keys go through librdkafka's consistent partitioner (CRC32 of the key), so
# with 4 partitions: initech → 0, wayne and soylent → 1, acme and globex → 2, cyberdyne and
# wonka → 3 (checked against the delivery reports at run time).
TENANTS = ("acme", "globex", "initech", "wayne", "cyberdyne", "soylent", "wonka")
TENANT_WEIGHTS = np.array([0.26, 0.18, 0.14, 0.13, 0.11, 0.10, 0.08])
BURST_TENANT = "acme"  # the heaviest tenant, so its errors move its zones' SLI past the page factor
ZONES = ("eu-west-1a", "eu-west-1b", "eu-west-1c")
REGION = "eu-west-1"

CODE_MODEL, CODE_VERSION = "code-llm-34b", "v2"
CHAT_MODEL, CHAT_STABLE, CHAT_CANARY = "chat-llm-70b", "2025-01", "2025-03"
VOICE_MODEL, VOICE_VERSION = "voice-s2s-1", "1.2"
# node → (zone index, pool prefix, model, version, SKU, memory bytes); 2 GPUs each
NODES = {
    "gpu-node-01": (0, "chat", CHAT_MODEL, CHAT_STABLE, "H100", 85_899_345_920),
    "gpu-node-02": (1, "chat", CHAT_MODEL, CHAT_STABLE, "H100", 85_899_345_920),
    "gpu-node-03": (2, "chat", CHAT_MODEL, CHAT_STABLE, "H100", 85_899_345_920),
    "gpu-node-04": (0, "code", CODE_MODEL, CODE_VERSION, "A100", 42_949_672_960),
    "gpu-node-05": (1, "code", CODE_MODEL, CODE_VERSION, "A100", 42_949_672_960),
    "gpu-node-06": (0, "voice", VOICE_MODEL, VOICE_VERSION, "H100", 85_899_345_920),
}
GPUS_PER_NODE = 2
ROLLOUT_NODE = "gpu-node-02"  # drains, loads the canary and comes back warm mid-run

# Poison kinds and the dead-letter reason the README's contract gives each.
POISON_REASONS = {
    "malformed_json": "malformed_json",
    "invalid_utf8": "invalid_utf8",
    "unknown_schema": "unknown_schema",
    "missing_field": "missing_field",
    "wrong_type": "wrong_type",
    "negative_number": "negative_number",
    "nan_literal": "non_finite_number",
    "infinity": "non_finite_number",
    "empty_value": "malformed_json",
    "tombstone": "malformed_json",
    "oversized": "oversized",
    # A hostile producer: what used to stop, blind or fool the worker.
    "deep_field": "too_deep",  # nested past the recursion limit as an unknown field's value
    "deep_record": "too_deep",  # ... or as the whole record
    "future_ts": "future",  # stamped 2099: it would have moved its partition's frontier there
    "year_9999": "bad_timestamp",  # it crash-looped the worker
    "absurd_record_time": "future",  # the Kafka record's own timestamp is 1970: nothing bounds event time
    "control_char": "invalid_value",  # an ANSI escape in a tenant name
    "joined_first": "malformed_json",  # `{…},{…` of another tenant: with the next, two forged events
    "joined_rest": "malformed_json",
}
# Kinds published as a pair, next to each other in one partition.
POISON_PAIRS = {"joined_first": "joined_rest"}
SLICE_LABELS = ("tenant", "model", "model_version", "zone", "workload", "traffic_class", "deployment", "pool")
LATENCY_FIELDS = ("queue_ms", "first_output_ms", "e2e_ms", "inter_token_ms")
GPU_KEYS = ("node", "gpu_index")
AM_BIN_NAMES = ("prometheus-alertmanager", "alertmanager")


class ChaosSetupError(Exception):
    """A component the run needs is missing or would not start (one line)."""


@dataclass(frozen=True)
class ChaosConfig:
    """The knobs of a run (the defaults are the CI size). Durations passed to the worker
    stay in its own flag syntax ("2m", "60s")."""

    speedup: float = 60.0  # event seconds per wall second
    kills: int = 4  # SIGKILLs in all ...
    early_kills: int = 2  # ... of which these land 1-3 s after a fresh worker starts
    second_workers: int = 1  # times a second group member joins for 8-14 s and leaves (SIGTERM)
    broker_pauses: int = 1  # SIGSTOP for 3-6 s, then SIGCONT
    broker_restarts: int = 1  # stopped and started again on its port: its log (memory only) is gone
    alertmanager_outages: int = 1  # down for 6-12 s around the burst's page, then up on the same port
    poison_per_kind: int = 2
    poison_kinds: Sequence[str] = tuple(POISON_REASONS)
    allowed_lateness: str = "2m"
    idle_timeout: str = "60s"  # passed once `tailwatch worker` has --idle-timeout
    final_until_idle_s: float = 10.0
    final_timeout_s: float = 240.0  # the final worker is killed after this long
    azure_csv: Path = AZURE_CODE_TRACE
    mooncake_jsonl: Path = MOONCAKE_TRACE
    worker_args: Sequence[str] = ()  # appended to every worker's command line
    worker_command: Sequence[str] = ()  # replaces `python -m tailwatch` (empty: that)
    worker_env: dict[str, str] = field(default_factory=dict)  # added to the workers' environment
    instance_ids: bool = False  # pass --instance-id chaos-a / chaos-b instead of the worker's default
    label_flood: int = 0  # requests each with a tenant never seen before (0: no flood)


# ---- the report ---------------------------------------------------------------------------


@dataclass
class KillRecord:
    at_s: float  # wall seconds since publishing began
    worker: str  # incarnation, e.g. "a#2"
    # "startup": 1-3 s after its process started; "joining": 1-3 s after it first answered
    # /healthz (while it joins the group); "mid-stream": at a random instant
    phase: str
    http_up: bool  # /metrics answered just before the kill
    checkpoints_before: int | None  # the worker's checkpoint count then (None: /metrics did not answer)
    events_accepted_before: int | None

    @property
    def before_first_checkpoint(self) -> bool:
        # The worker serves HTTP before it subscribes, so without HTTP it cannot have checkpointed.
        return not self.http_up or self.checkpoints_before == 0


@dataclass
class WorkerRun:
    """One worker process: when it started, how long until it accepted its first event (so
    owned partitions), and how it ended."""

    worker: str
    started_at_s: float  # wall seconds since publishing began
    first_event_after_s: float | None  # from its start (None: it never accepted an event)
    ended_at_s: float | None  # when it was signalled, or seen to have exited on its own
    ended_by: str  # "SIGKILL", "SIGTERM", "exit N" (on its own), "until-idle exit N" (the final run)


@dataclass
class CrashRecord:
    worker: str
    at_s: float
    exit_code: int | None
    log_tail: str


@dataclass
class FaultWindow:
    kind: str  # "broker-pause", "alertmanager-down", "second-worker"
    at_s: float
    duration_s: float


@dataclass
class SilentSpan:
    """A partition that carried no valid event for minutes of event time (measured on what was delivered)."""

    topic: str
    partition: int
    from_ts: str
    to_ts: str
    minutes: float
    keys: list[str]
    poison_inside: int  # poison records published into it meanwhile (it held only invalid records)


@dataclass
class TableCheck:
    table: str
    expected_rows: int
    stored_rows: int
    missing_rows: int  # expected EXCEPT ALL stored
    extra_rows: int  # stored EXCEPT ALL expected
    duplicate_keys: int  # slice-minutes stored more than once
    mismatched_columns: dict[str, int]  # on keys present in both: column → rows that differ


@dataclass
class SliceDiff:
    table: str
    window_start: str
    labels: dict[str, str]
    partition: int | None
    expected: int  # requests (sli_minute) or samples (gpu_minute)
    stored: int
    columns: list[str]  # columns that differ where both sides have the slice-minute


@dataclass
class PoisonCheck:
    kind: str
    topic: str
    partition: int
    offset: int
    size_bytes: int
    expected_reason: str
    stored_reasons: list[str]
    problem: str  # "missing", "wrong reason", "stored 2 times", "size_bytes …", "sha256 …"


@dataclass
class AlertCheck:
    alertname: str
    severity: str
    slo: str
    labels: dict[str, str]
    fired_at: str
    resolved_at: str | None
    am_fingerprint: str
    received_firing: bool  # Alertmanager logged it as received, active
    received_resolved: bool
    active_in_api: bool  # in GET /api/v2/alerts at the end
    notified: bool  # Alertmanager notified the webhook receiver of it (informative: an alert that
    # reaches Alertmanager already resolved is never notified, by Alertmanager's design)

    def problems(self) -> list[str]:
        out = []
        if not (self.received_firing or self.received_resolved):
            out.append("never received")
        if self.resolved_at is None and not self.active_in_api:
            out.append("firing in the store but not active in Alertmanager")
        if self.resolved_at is not None and not self.received_resolved:
            out.append("resolution never received")
        return out


@dataclass
class ChaosReport:
    """What one chaos run did and what it found. `failures()` lists every broken promise;
    `table()` renders it all as text; report.json in the run's folder holds the same."""

    seed: int
    minutes: int
    speedup: float
    out_dir: str
    wall_seconds: float = 0.0
    requests_published: int = 0  # valid request records delivered, duplicates included
    gpu_samples_published: int = 0
    duplicates_published: int = 0  # exact redeliveries (same key, same bytes)
    unique_requests: int = 0
    unique_gpu_samples: int = 0
    undelivered: int = 0  # records our producer could not deliver (left out of the expectation)
    kills: list[KillRecord] = field(default_factory=list)
    workers: list[WorkerRun] = field(default_factory=list)
    membership_changes: int = 0  # joins and leaves of the consumer group the harness caused
    second_worker_runs: int = 0
    worker_crashes: list[CrashRecord] = field(default_factory=list)
    poison_by_kind: dict[str, int] = field(default_factory=dict)
    silent_partitions: list[SilentSpan] = field(default_factory=list)
    broker_pauses: list[FaultWindow] = field(default_factory=list)
    broker_restarts: list[FaultWindow] = field(default_factory=list)
    # What a broker restart took: records the worker had not read before the log went (the store
    # cannot have seen them; left out of the expectation), its log_reset marks, broken promises.
    records_gone_with_the_log: int = 0
    log_reset_marks: int = 0
    restart_problems: list[str] = field(default_factory=list)
    alertmanager_outages: list[FaultWindow] = field(default_factory=list)
    second_workers: list[FaultWindow] = field(default_factory=list)
    final_exit_code: int | None = None
    final_log_tail: str = ""
    group_rescues: int = 0  # times a worker freed the group from the broker's departed leader
    tables: list[TableCheck] = field(default_factory=list)
    events_lost: int = 0
    events_counted_twice: int = 0
    gpu_samples_lost: int = 0
    gpu_samples_counted_twice: int = 0
    divergent_slice_minutes: int = 0
    divergent: list[SliceDiff] = field(default_factory=list)  # the largest, up to 25
    dead_letters_by_reason: dict[str, int] = field(default_factory=dict)
    poison_problems: list[PoisonCheck] = field(default_factory=list)
    unexpected_dead_letters: dict[str, int] = field(default_factory=dict)  # rows at no poison offset, by reason
    late_dead_letters: int = 0
    alerts: list[AlertCheck] = field(default_factory=list)
    pages_fired: int = 0
    burst_paged: bool = False  # llm-realtime-availability paged for the burst's model version
    alertmanager_checked: bool = False
    verification_error: str | None = None  # the comparison itself could not run
    notes: list[str] = field(default_factory=list)
    # The label flood: its requests delivered, the flood tenants that found room (exact in the
    # store), the stream's own label values that did not, and the requests the store holds
    # under tenant `__other__` (None: not checked).
    flood_requests: int = 0
    flood_tenants_admitted: list[str] = field(default_factory=list)
    stream_values_folded: list[str] = field(default_factory=list)
    flood_in_overflow: int | None = None
    stream_folded_requests: int = 0  # the stream's own requests counted under `__other__` (folded values)

    @property
    def poison_total(self) -> int:
        return sum(self.poison_by_kind.values())

    def failures(self) -> list[str]:
        """Everything that breaks the promise, one line each; empty when the run is clean."""
        out = []
        if self.verification_error:
            out.append(f"the store could not be checked: {self.verification_error}")
        if self.worker_crashes:
            out.append(f"the worker exited on its own {len(self.worker_crashes)} times "
                       f"(first: {self.worker_crashes[0].worker} code {self.worker_crashes[0].exit_code})")
        if self.final_exit_code != 0:
            out.append(f"the final `--until-idle` worker exited {self.final_exit_code} (not drained)")
        if self.events_lost or self.events_counted_twice:
            out.append(f"requests: {self.events_lost} lost, {self.events_counted_twice} counted twice")
        if self.gpu_samples_lost or self.gpu_samples_counted_twice:
            out.append(f"GPU samples: {self.gpu_samples_lost} lost, {self.gpu_samples_counted_twice} counted twice")
        for t in self.tables:
            if t.missing_rows or t.extra_rows or t.duplicate_keys:
                out.append(f"{t.table}: {t.missing_rows} expected rows not stored, {t.extra_rows} stored rows not "
                           f"expected, {t.duplicate_keys} keys stored twice; columns differing: {t.mismatched_columns}")
        out.extend(self.restart_problems)
        if self.poison_problems:
            out.append(f"{len(self.poison_problems)} poison records not accounted for in dead_letter")
        if self.unexpected_dead_letters:
            out.append(f"dead letters at no poison offset: {self.unexpected_dead_letters}")
        if self.late_dead_letters:
            out.append(f"{self.late_dead_letters} events dead-lettered as late")
        if self.undelivered:
            out.append(f"{self.undelivered} records were not delivered by the test producer")
        expected_overflow = self.flood_requests - len(self.flood_tenants_admitted)
        if self.flood_requests and self.flood_in_overflow != expected_overflow + self.stream_folded_requests:
            out.append(f"label flood: {self.flood_in_overflow} requests under {OVERFLOW_LABEL_VALUE}, "
                       f"{expected_overflow + self.stream_folded_requests} expected")
        if self.alertmanager_checked:
            if not self.burst_paged:
                out.append("no llm-realtime-availability page fired for the injected error burst")
            for a in self.alerts:
                if a.problems():
                    out.append(f"alert {a.alertname} {a.slo} {a.labels}: {', '.join(a.problems())}")
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)

    def table(self) -> str:
        from tailwatch.table import render

        early = sum(1 for k in self.kills if k.phase != "mid-stream")
        before_cp = sum(1 for k in self.kills if k.before_first_checkpoint)
        pauses = ", ".join(f"{p.duration_s:.1f} s" for p in self.broker_pauses)
        outages = ", ".join(f"{p.duration_s:.1f} s" for p in self.alertmanager_outages)
        silent = "; ".join(f"{s.topic} p{s.partition} {s.minutes:.1f} min"
                           + (f" ({s.poison_inside} poison inside)" if s.poison_inside else "")
                           for s in self.silent_partitions)
        lines = [
            f"chaos run: seed {self.seed}, {self.minutes} event-minutes at {self.speedup:g}x, "
            f"{self.wall_seconds:.0f} s wall",
            f"  stream: {self.unique_requests:,} requests, {self.unique_gpu_samples:,} GPU samples "
            f"({self.requests_published + self.gpu_samples_published:,} valid records delivered, "
            f"{self.duplicates_published:,} exact redeliveries)",
            "faults survived",
            f"  worker kills (SIGKILL)       {len(self.kills)} ({early} early, {before_cp} before any checkpoint)",
            f"  rebalances                   {self.membership_changes} group membership changes "
            f"({self.second_worker_runs} second worker joined and left)",
            f"  poison records               {self.poison_total} ({len(self.poison_by_kind)} kinds: "
            + ", ".join(f"{k} {n}" for k, n in sorted(self.poison_by_kind.items())) + ")",
            f"  silent partitions            {len(self.silent_partitions)} ({silent or '-'})",
            f"  broker pauses (SIGSTOP)      {len(self.broker_pauses)} ({pauses or '-'})",
            f"  broker restarts (log lost)   {len(self.broker_restarts)} ({self.log_reset_marks} partitions marked "
            f"log_reset; {self.records_gone_with_the_log:,} records gone before the worker read them)",
            f"  Alertmanager outages         {len(self.alertmanager_outages)} ({outages or '-'})",
            f"  worker exits on its own      {len(self.worker_crashes)}",
            f"  wedged group rescued         {self.group_rescues} (the broker named a departed leader)",
            *self._flood_lines(),
            "result",
        ]
        if self.verification_error:
            lines.append(f"  NOT CHECKED: {self.verification_error}")
        else:
            lines += [
                f"  events lost                  {self.events_lost}",
                f"  events counted twice         {self.events_counted_twice}",
                f"  GPU samples lost / twice     {self.gpu_samples_lost} / {self.gpu_samples_counted_twice}",
            ]
        lines.append(f"  final --until-idle exit      {self.final_exit_code}")
        for t in self.tables:
            lines.append(f"  {t.table:<28} {t.stored_rows:,} rows stored, {t.expected_rows:,} expected; EXCEPT ALL: "
                         f"{t.missing_rows} missing, {t.extra_rows} extra"
                         + (f", {t.duplicate_keys} keys twice" if t.duplicate_keys else ""))
            if t.mismatched_columns:
                lines.append("    differing columns: " + ", ".join(f"{c} {n}" for c, n in t.mismatched_columns.items()))
        lines.append(f"  dead letters                 {sum(self.dead_letters_by_reason.values())} "
                     f"({', '.join(f'{r} {n}' for r, n in sorted(self.dead_letters_by_reason.items())) or '-'}); "
                     f"poison unaccounted {len(self.poison_problems)}; late {self.late_dead_letters}")
        if self.alertmanager_checked:
            delivered = sum(1 for a in self.alerts if a.received_firing or a.received_resolved)
            lines.append(f"  alerts in the store          {len(self.alerts)} ({self.pages_fired} pages, burst paged: "
                         f"{'yes' if self.burst_paged else 'NO'}); received by "
                         f"Alertmanager {delivered}; still firing and active there "
                         f"{sum(1 for a in self.alerts if a.resolved_at is None and a.active_in_api)}"
                         f"/{sum(1 for a in self.alerts if a.resolved_at is None)}")
        if self.kills:
            lines += ["", "kills",
                      render(["at_s", "worker", "phase", "http_up", "checkpoints_before", "events_accepted_before"],
                             [[round(k.at_s, 1), k.worker, k.phase, "yes" if k.http_up else "no",
                               k.checkpoints_before, k.events_accepted_before] for k in self.kills])]
        if self.workers:
            lines += ["", "worker processes (first event: seconds from its start to its first accepted event)",
                      render(["worker", "started_at_s", "first_event_after_s", "ended_at_s", "ended_by"],
                             [[w.worker, w.started_at_s, w.first_event_after_s, w.ended_at_s, w.ended_by]
                              for w in self.workers])]
        if self.worker_crashes:
            lines += ["", "worker exits on its own"]
            for c in self.worker_crashes[:5]:
                last = c.log_tail.strip().splitlines()[-1:] or [""]
                lines.append(f"  {c.worker} at {c.at_s:.1f} s, code {c.exit_code}: {last[0][:160]}")
        if self.divergent:
            lines += ["", f"diverging slice-minutes: {self.divergent_slice_minutes} (largest {len(self.divergent)})",
                      render(["table", "window_start", "partition", "slice", "expected", "stored", "columns"],
                             [[d.table, d.window_start, d.partition, "/".join(d.labels.values()), d.expected, d.stored,
                               ",".join(d.columns)[:60]] for d in self.divergent])]
        if self.poison_problems:
            lines += ["", "poison not accounted for",
                      render(["kind", "topic", "partition", "offset", "bytes", "expected", "stored", "problem"],
                             [[p.kind, p.topic, p.partition, p.offset, p.size_bytes, p.expected_reason,
                               ",".join(p.stored_reasons), p.problem] for p in self.poison_problems[:25]])]
        bad_alerts = [a for a in self.alerts if a.problems()]
        if bad_alerts:
            lines += ["", "alerts Alertmanager does not have",
                      render(["alertname", "slo", "labels", "fired_at", "resolved_at", "problem"],
                             [[a.alertname, a.slo, json.dumps(a.labels), a.fired_at, a.resolved_at, "; ".join(a.problems())]
                              for a in bad_alerts])]
        if self.final_exit_code != 0 and self.final_log_tail:
            lines += ["", "final worker, last lines:",
                      *("  " + line for line in self.final_log_tail.strip().splitlines()[-8:])]
        if self.notes:
            lines += ["", "notes", *(f"  - {n}" for n in self.notes)]
        lines.append(f"\nfiles: {self.out_dir}")
        return "\n".join(lines)

    def _flood_lines(self) -> list[str]:
        if not self.flood_requests:
            return []
        return [f"  label flood                  {self.flood_requests:,} requests with new tenants; "
                f"{len(self.flood_tenants_admitted)} found room ({', '.join(self.flood_tenants_admitted) or '-'}), "
                f"{self.flood_in_overflow if self.flood_in_overflow is not None else '?'} requests counted under "
                f"{OVERFLOW_LABEL_VALUE} ({self.stream_folded_requests} of them the stream's own: "
                f"{', '.join(self.stream_values_folded) or 'none'})"]


# ---- the stream ---------------------------------------------------------------------------


@dataclass
class Outgoing:
    """One record for our producer."""

    ts_ms: int  # event time (valid records) or the chunk's time (poison)
    topic: str  # "requests" or "gpu"
    key: bytes | None
    value: bytes | None
    kind: str  # "request", "gpu", or a poison kind
    partition: int | None = None  # explicit for poison; None: the producer's partitioner
    duplicate: bool = False
    record_ts_ms: int | None = None  # the Kafka record's timestamp; None: the producer's clock
    log_epoch: int = 0  # broker restarts before it was published: which log its offset is in
    # filled by the delivery report
    delivered_partition: int | None = None
    delivered_offset: int | None = None
    error: str | None = None


@dataclass
class Silence:
    topic: str
    partition: int
    start_ms: int
    end_ms: int
    keys: tuple[str, ...]


@dataclass
class Stream:
    chunks: list[list[Outgoing]]  # in publish order; each is CHUNK_MS of event time
    silences: list[Silence]
    burst: tuple[int, int]  # event ms [start, end) of the error burst


def _crc_partition(key: str) -> int:
    """librdkafka's consistent partitioner: CRC32 of the key modulo the partition count."""
    return zlib.crc32(key.encode()) % PARTITIONS


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _looped(rows: list[tuple], minutes: int) -> list[tuple]:
    """A trace's rows (arrival ms first) for `minutes` of event time: the first ones, and for a
    soak longer than the trace (about an hour), the trace again after itself, whole minutes on."""
    limit = minutes * MINUTE_MS
    period = (rows[-1][0] // MINUTE_MS + 1) * MINUTE_MS
    out = []
    for k in range(-(-limit // period)):
        out += [(r[0] + k * period, *r[1:]) for r in rows if r[0] + k * period < limit]
    return out


def build_stream(seed: int, minutes: int, azure_csv: Path, mooncake_jsonl: Path, rng: random.Random) -> Stream:
    """The valid records, the exact redeliveries and the poison, cut into publish chunks."""
    nrng = np.random.default_rng(seed)
    azure = _looped(read_trace(azure_csv), minutes)
    mooncake = _looped(read_mooncake(mooncake_jsonl), minutes)

    # The error burst: BURST_TENANT's stable chat traffic fails from a quarter of the run, for 8 minutes.
    burst_start = START_MS + max(3, minutes // 4) * MINUTE_MS
    burst = (burst_start, burst_start + 8 * MINUTE_MS)

    # Silences: two requests partitions that do not hold the burst tenant, and one GPU partition.
    by_partition: dict[int, list[str]] = {}
    for t in TENANTS:
        by_partition.setdefault(_crc_partition(t), []).append(t)
    quiet_candidates = sorted(p for p in by_partition if BURST_TENANT not in by_partition[p])
    silences = []
    for p in rng.sample(quiet_candidates, k=min(2, len(quiet_candidates))):
        length = rng.randint(5, 8) * MINUTE_MS + rng.randint(0, 59) * 1000
        start = START_MS + rng.randint(max(4, minutes // 3), max(5, minutes - 14)) * MINUTE_MS + rng.randint(0, 59) * 1000
        silences.append(Silence("requests", p, start, start + length, tuple(by_partition[p])))
    node_parts: dict[int, list[str]] = {}
    for n in NODES:
        node_parts.setdefault(_crc_partition(n), []).append(n)
    gp = rng.choice(sorted(node_parts))
    start = START_MS + rng.randint(max(4, minutes // 3), max(5, minutes - 12)) * MINUTE_MS
    silences.append(Silence("gpu", gp, start, start + rng.randint(5, 7) * MINUTE_MS, tuple(node_parts[gp])))

    def silent(topic: str, key: str, ts: int) -> bool:
        return any(s.topic == topic and key in s.keys and s.start_ms <= ts < s.end_ms for s in silences)

    requests = _requests(nrng, azure, mooncake, burst)
    valid = [r for r in requests if not silent("requests", r["tenant"], r["_ts_ms"])]
    gpu = [g for g in _gpu_samples(nrng, minutes, requests) if not silent("gpu", g["node"], g["_ts_ms"])]
    out: list[Outgoing] = []
    for r in valid:
        ts = r.pop("_ts_ms")
        out.append(Outgoing(ts, "requests", r["tenant"].encode(), _dumps(r), "request"))
    for g in gpu:
        ts = g.pop("_ts_ms")
        out.append(Outgoing(ts, "gpu", g["node"].encode(), _dumps(g), "gpu"))
    out.sort(key=lambda o: o.ts_ms)  # event-time order within every partition

    n_chunks = (max(o.ts_ms for o in out) - START_MS) // CHUNK_MS + 1
    chunks: list[list[Outgoing]] = [[] for _ in range(n_chunks)]
    for o in out:
        chunks[(o.ts_ms - START_MS) // CHUNK_MS].append(o)
    # Exact redeliveries of 1% of the records, one chunk later (at most 40 s out of order:
    # inside the allowed lateness, so they must be dropped as duplicates, never as late).
    for c in range(n_chunks - 1):
        for o in chunks[c]:
            if not o.duplicate and rng.random() < 0.01:
                chunks[c + 1].insert(0, Outgoing(o.ts_ms, o.topic, o.key, o.value, o.kind, duplicate=True))

    # Poison: every kind `poison_per_kind` times is added by the caller (`add_poison`).
    return Stream(chunks, silences, burst)


def _requests(rng: np.random.Generator, azure, mooncake, burst: tuple[int, int]) -> list[dict]:
    """request.v1 documents (plus `_ts_ms`) from both traces: latencies and GPU time from token counts."""
    docs: list[dict] = []
    for source, rows in (("code", azure), ("chat", mooncake)):
        n = len(rows)
        tenants = rng.choice(len(TENANTS), n, p=TENANT_WEIGHTS)
        zones = rng.integers(0, len(ZONES), n)
        queue = rng.lognormal(math.log(15), 0.8, n)
        queue_zero = rng.random(n) < 0.03  # admitted at once: the histogram's zero bin
        fate = rng.random(n)
        u = rng.random((n, 6))
        for i, row in enumerate(rows):
            offset, ctx, gen = row[0], row[1], row[2]
            tenant = TENANTS[tenants[i]]
            zone = ZONES[zones[i]]
            doc: dict = {"schema": "request.v1", "event_id": f"{source}-{i:05x}"}
            if source == "code":
                model, version, workload, deployment = CODE_MODEL, CODE_VERSION, "llm", "stable"
                pool, endpoint, sku, decode_ms = f"code-{zone[-1]}", "/v1/completions", "A100", 22.0
                first = 60 + ctx * 0.12
                traffic = "batch" if u[i, 0] < 0.15 else "realtime"
                reports_success = False  # code-completion runtimes never send task_success
            else:
                cached_tokens = min(ctx, row[3] * MOONCAKE_BLOCK_TOKENS)
                first = 80 + (ctx - cached_tokens) * 0.025 + row[3] * 0.4  # prefill only what the KV cache lacks
                traffic = "realtime"
                if u[i, 0] < 0.12:
                    model, version, workload, deployment = VOICE_MODEL, VOICE_VERSION, "s2s", "stable"
                    pool, endpoint, sku, decode_ms, reports_success = f"voice-{zone[-1]}", "/v1/converse", "H100", 30.0, True
                else:
                    canary = u[i, 1] < 0.10
                    model, workload = CHAT_MODEL, "llm"
                    version, deployment = (CHAT_CANARY, "canary") if canary else (CHAT_STABLE, "stable")
                    pool, endpoint, sku, decode_ms = f"chat-{zone[-1]}", "/v1/chat/completions", "H100", 30.0
                    reports_success = u[i, 2] < 0.6
            q = 0.0 if queue_zero[i] else round(float(queue[i]), 2)
            ts_arrival = START_MS + offset
            in_burst = (source == "chat" and tenant == BURST_TENANT and model == CHAT_MODEL
                        and deployment == "stable" and burst[0] <= ts_arrival < burst[1])
            f = fate[i]
            # Outside the burst the fleet stays within its SLOs (0.2% failed against a 0.5% budget).
            status = ("error" if in_burst and f < 0.85 else
                      "error" if f < 0.001 else "timeout" if f < 0.0015 else "shed" if f < 0.002 else
                      "cancelled" if f < 0.005 else "ok")
            doc.update(_outcome(status, q, first, gen, decode_ms))
            e2e = doc["e2e_ms"]
            doc.update({"ts": 0, "tenant": tenant, "model": model, "model_version": version, "zone": zone,
                        "region": REGION, "pool": pool, "workload": workload, "endpoint": endpoint,
                        "traffic_class": traffic, "deployment": deployment, "attempt": 1,
                        "prompt_tokens": ctx, "gpu_sku": sku, "batch_size": 8})
            if model == VOICE_MODEL and status == "ok":
                doc["audio_seconds"] = round(gen * 0.055, 3)  # spoken answer at about 18 tokens a second
            ts = ts_arrival + int(round(e2e))
            retried = status in ("error", "timeout", "shed") and u[i, 3] < 0.6
            if reports_success and not retried:
                doc["task_success"] = bool(status == "ok" and u[i, 4] > 0.03)
            shared = {k: doc[k] for k in ("tenant", "model", "model_version", "zone", "region", "pool", "workload",
                                          "endpoint", "traffic_class", "deployment", "prompt_tokens", "gpu_sku",
                                          "batch_size")}
            _finish(doc, ts, u[i, 5])
            docs.append(doc)
            if retried:  # the client retries after a backoff; the retry usually works
                r_status = "ok" if u[i, 4] < 0.9 else "error"
                retry: dict = {"schema": "request.v1", "event_id": doc["event_id"] + "-r1"}
                retry.update(_outcome(r_status, round(float(queue[i]) * 0.5, 2), first, gen, decode_ms))
                retry.update(shared)
                retry.update({"ts": 0, "attempt": 2, "retry_of": doc["event_id"]})
                if u[i, 2] < 0.05:
                    del retry["attempt"]  # a runtime that says it only with retry_of
                if model == VOICE_MODEL and r_status == "ok":
                    retry["audio_seconds"] = round(gen * 0.055, 3)
                if reports_success:
                    retry["task_success"] = r_status == "ok"
                r_ts = ts + 300 + int(u[i, 5] * 2700) + int(round(retry["e2e_ms"]))
                _finish(retry, r_ts, u[i, 1])
                docs.append(retry)
    return docs


def _outcome(status: str, queue_ms: float, first_ms: float, gen: int, decode_ms: float) -> dict:
    """Latency, tokens and GPU time of one attempt; values keep at most 4 decimals so that
    every JSON reader parses them to the same double."""
    if status == "ok":
        work = first_ms + gen * decode_ms
        # How the stream ended, from the token count (no new random draw: every other field
        # stays what it was): now and then a stream cut behind HTTP 200, often a length stop.
        finish = "server_cut" if gen % 997 == 0 else "length" if gen % 17 == 0 else "stop"
        return {"status": "ok", "http_status": 200, "queue_ms": queue_ms, "first_output_ms": round(first_ms, 2),
                "inter_token_ms": decode_ms, "e2e_ms": round(queue_ms + work, 2), "output_tokens": gen,
                "gpu_seconds": round(work / 1000 / 8, 4), "finish_reason": finish}
    if status == "error":
        return {"status": "error", "http_status": 503, "queue_ms": queue_ms, "e2e_ms": round(queue_ms + 40.5, 2),
                "output_tokens": 0, "gpu_seconds": 0.001}
    if status == "timeout":
        part = min(gen, int(30_000 / decode_ms))
        return {"status": "timeout", "http_status": 504, "queue_ms": queue_ms, "first_output_ms": round(first_ms, 2),
                "e2e_ms": 30_000.0, "output_tokens": part, "gpu_seconds": round(30.0 / 8, 4), "finish_reason": "timeout"}
    if status == "shed":  # refused at admission: no output, no tokens field at all
        return {"status": "shed", "http_status": 429, "queue_ms": queue_ms, "e2e_ms": round(queue_ms + 1.25, 2)}
    part = gen // 3
    return {"status": "cancelled", "http_status": 499, "queue_ms": queue_ms, "first_output_ms": round(first_ms, 2),
            "e2e_ms": round(queue_ms + first_ms + part * decode_ms, 2), "output_tokens": part,
            "gpu_seconds": round((first_ms + part * decode_ms) / 1000 / 8, 4), "finish_reason": "client_cancel"}


def _finish(doc: dict, ts_ms: int, u: float) -> None:
    """Completion time; and the contract's optional spellings: some records leave defaults
    out, carry ts as RFC 3339, or carry a field outside the schema (dropped at ingest)."""
    doc["_ts_ms"] = ts_ms
    doc["ts"] = ts_ms
    if u < 0.03:
        when = datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc)
        doc["ts"] = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts_ms % 1000:03d}Z"
    if 0.1 < u < 0.4:
        if doc.get("traffic_class") == "realtime":
            del doc["traffic_class"]
        if doc.get("deployment") == "stable":
            del doc["deployment"]
    if 0.5 < u < 0.52:
        doc["kv_blocks"] = int(u * 1000) % 37  # not in request.v1: the worker drops it and keeps the record


def _gpu_samples(rng: np.random.Generator, minutes: int, requests: list[dict]) -> list[dict]:
    """gpu.v1 samples every 10 s per GPU; utilisation follows the pool's request GPU time.

    Two sources per Hopper GPU, as the data contract has them: the NVML collector and the serving
    runtime in one sample that does not name its source (inferred from its fields), and
    DCGM's profiling fields in a sample of its own, 5 s later, with no pool or model labels
    (those must come from the other source's newest sample)."""
    slots = minutes * MINUTE_MS // GPU_SAMPLE_MS + 1
    load: dict[str, np.ndarray] = {}
    for r in requests:
        slot = (r["_ts_ms"] - START_MS) // GPU_SAMPLE_MS
        if 0 <= slot < slots:
            load.setdefault(r["pool"], np.zeros(slots))[slot] += r.get("gpu_seconds", 0.0)
    gpus_per_pool: dict[str, int] = {}
    for node, (z, prefix, *_rest) in NODES.items():
        pool = f"{prefix}-{ZONES[z][-1]}"
        gpus_per_pool[pool] = gpus_per_pool.get(pool, 0) + GPUS_PER_NODE
    rollout = (START_MS + (minutes // 2) * MINUTE_MS, START_MS + (minutes // 2 + 3) * MINUTE_MS)
    out = []
    for n_i, (node, (z, prefix, model, version, sku, mem_total)) in enumerate(NODES.items()):
        zone = ZONES[z]
        pool = f"{prefix}-{zone[-1]}"
        busy = load.get(pool, np.zeros(slots)) / (GPU_SAMPLE_MS / 1000 * gpus_per_pool[pool])
        for g in range(GPUS_PER_NODE):
            noise = rng.normal(0, 4, slots)
            extra = rng.random((slots, 4))
            for k in range(slots):
                ts = START_MS + k * GPU_SAMPLE_MS + 731 * (n_i + 1) + 97 * g  # sources do not sample in lockstep
                util = round(float(np.clip(100 * busy[k] + 12 + noise[k], 0, 100)), 1)
                state, ver = "warm", version
                if node == ROLLOUT_NODE and g == 1:
                    if rollout[0] <= ts < rollout[0] + MINUTE_MS + 20_000:
                        state, util = "draining", round(util / 3, 1)
                    elif rollout[0] + MINUTE_MS + 20_000 <= ts < rollout[1]:
                        state, util, ver = "loading", 0.0, CHAT_CANARY
                    elif ts >= rollout[1]:
                        ver = CHAT_CANARY
                doc: dict = {
                    "schema": "gpu.v1", "ts": ts, "node": node, "gpu_index": g, "zone": zone, "pool": pool,
                    "gpu_uuid": f"GPU-{n_i:02d}{g:02d}-{zlib.crc32(node.encode()) & 0xffff:04x}", "gpu_sku": sku,
                    "util_pct": util, "mem_used_bytes": int(mem_total * (0.55 + 0.3 * extra[k, 0])),
                    "mem_total_bytes": mem_total, "power_w": round(80 + util * 5.5, 1),
                    "temp_c": round(34 + util * 0.4, 1), "sm_clock_mhz": 1755.0,
                    "xid_errors": 1 if extra[k, 1] < 0.002 else 0, "model": model, "model_version": ver,
                    "replica_state": state, "_ts_ms": ts,
                }
                if extra[k, 2] < 0.85:  # the serving runtime's gauges (absent when only NVML reported)
                    depth = int(busy[k] * 6 * extra[k, 3])
                    doc.update({"queue_depth": depth, "oldest_queue_age_ms": round(depth * 35.5, 1),
                                "running": int(busy[k] * 12) + 1, "active_streams": int(busy[k] * 20),
                                "kv_cache_usage": round(min(1.0, busy[k] * 0.8 + 0.1 * extra[k, 3]), 3),
                                "preemptions": 1 if extra[k, 3] > 0.98 else 0})
                if extra[k, 1] > 0.5:
                    doc["ecc_errors"] = 0  # ECC counters only where the GPU reports them
                out.append(doc)
                if sku == "H100":
                    sm = float(np.clip(busy[k] * 80 + noise[k] / 2, 0, 100))
                    out.append({
                        "schema": "gpu.v1", "ts": ts + 5_000, "node": node, "gpu_index": g, "gpu_uuid": doc["gpu_uuid"],
                        "gpu_sku": sku, "source": "dcgm", "sm_active_pct": round(sm, 1),
                        "sm_occupancy_pct": round(sm * 0.6, 1), "tensor_active_pct": round(sm * 0.45, 1),
                        "dram_bw_pct": round(min(100.0, sm * 0.7 + 5), 1), "_ts_ms": ts + 5_000,
                    })
    return out


def poison_value(kind: str, topic: str, n: int, ts_ms: int, key: str | None) -> bytes | None:
    """The raw bytes of one poison record of `kind` for `topic` (None: a tombstone)."""
    if topic == "requests":
        doc: dict = {"schema": "request.v1", "event_id": f"poison-{n:04x}", "ts": ts_ms, "tenant": key or "acme",
                     "model": CHAT_MODEL, "workload": "llm", "status": "ok", "e2e_ms": 65432.1,
                     "prompt_tokens": 100}
        numeric, typed, required = "e2e_ms", "prompt_tokens", "tenant"
    else:
        doc = {"schema": "gpu.v1", "ts": ts_ms, "node": key or "gpu-node-01", "gpu_index": 0,
               "util_pct": 55.5, "power_w": 65432.1}  # within the contract: only its fault is wrong
        numeric, typed, required = "power_w", "gpu_index", "node"
    if kind == "tombstone":
        return None
    if kind == "empty_value":
        return b""
    if kind == "deep_field":
        return _dumps(doc)[:-1] + b', "trace": ' + b"[" * 1500 + b"]" * 1500 + b"}"
    if kind == "deep_record":
        return b'{"a":' * 2000
    if kind == "future_ts":
        doc["ts"] = 4_070_908_800_000  # 2099-01-01: inside the contract's range, far ahead of its record
    elif kind == "year_9999":
        doc["ts"] = "9999-12-31T23:59:59Z"
    elif kind == "control_char":
        doc[required] = "acme\x1b[2J"  # JSON writes it escaped: \u001b
    elif kind == "joined_first":  # this record, then half of one for another tenant
        forged = {**doc, "event_id": f"forged-{n:04x}", required: "forged", "zone": "made-up"}
        text = _dumps(forged)
        return _dumps(doc) + b"," + text[:text.index(b',"zone"')]
    elif kind == "joined_rest":  # the rest of that half: `[first,rest]` parses as two events
        forged = {**doc, "event_id": f"forged-{n - 1:04x}", required: "forged", "zone": "made-up"}
        text = _dumps(forged)
        return text[text.index(b',"zone"') + 1:]
    if kind == "malformed_json":
        text = _dumps(doc)
        return text[: len(text) // 2]
    if kind == "invalid_utf8":
        doc["model"] = "MODEL_PLACEHOLDER"
        return _dumps(doc).replace(b"MODEL_PLACEHOLDER", b"m\xff\xfe")
    if kind == "unknown_schema":
        doc["schema"] = doc["schema"].replace(".v1", ".v9")
    elif kind == "missing_field":
        del doc[required]
    elif kind == "wrong_type":
        doc[typed] = [1, 2]
    elif kind == "negative_number":
        doc[numeric] = -12.5
    elif kind == "nan_literal":
        return _dumps(doc).replace(b"65432.1", b"NaN")
    elif kind == "infinity":
        return _dumps(doc).replace(b"65432.1", b"1e999")
    elif kind == "oversized":
        # A runtime dumping its KV-cache block ids into the record: about 2 MB of numbers.
        ids = ",".join(map(str, range(300_000)))
        body = _dumps(doc)
        return body[:-1] + b',"kv_block_ids":[' + ids.encode() + b"]}"
    return _dumps(doc)


def add_poison(stream: Stream, rng: random.Random, per_kind: int,
               kinds: Sequence[str] = tuple(POISON_REASONS)) -> list[Outgoing]:
    """Poison of every kind, `per_kind` times each, into random partitions of random chunks;
    plus three malformed records into each silent requests partition while it is silent
    (so that partition holds only invalid records for a while)."""
    added = []
    n_chunks = len(stream.chunks)
    n = 0

    def put(chunk: int, kind: str, topic: str, partition: int, at: int | None = None) -> int:
        nonlocal n
        ts = START_MS + chunk * CHUNK_MS
        keys = TENANTS if topic == "requests" else tuple(NODES)
        key = rng.choice(keys) if rng.random() < 0.5 else None  # half without a key, as in the issue
        o = Outgoing(ts, topic, key.encode() if key else None, poison_value(kind, topic, n, ts, key), kind,
                     partition=partition, record_ts_ms=1 if kind == "absurd_record_time" else None)
        n += 1
        at = rng.randint(0, len(stream.chunks[chunk])) if at is None else at
        stream.chunks[chunk].insert(at, o)
        added.append(o)
        return at

    for kind in kinds:
        if kind in POISON_PAIRS.values():
            continue  # published right after its first half
        for _ in range(per_kind):
            topic = "requests" if rng.random() < 0.75 else "gpu"
            chunk, partition = rng.randint(1, max(1, n_chunks - 3)), rng.randrange(PARTITIONS)
            at = put(chunk, kind, topic, partition)
            if kind in POISON_PAIRS:  # one producer, one partition: the two land next to each other
                put(chunk, POISON_PAIRS[kind], topic, partition, at + 1)
    for s in stream.silences:
        if s.topic != "requests":
            continue
        first = min(n_chunks - 1, (s.start_ms - START_MS) // CHUNK_MS + 1)
        last = min(n_chunks - 1, (s.end_ms - START_MS) // CHUNK_MS - 1)  # a short run may end while it is silent
        for _ in range(3):
            put(rng.randint(first, max(first, last)), "malformed_json", "requests", s.partition)
    return added


@dataclass
class LabelFlood:
    """A producer bug: requests each stamped with a tenant never seen before."""

    records: list[Outgoing]
    cap: int  # the workers' --max-label-values: what the stream's own busiest label holds


FLOOD_KEY = b"flood"  # one key, one partition: as one misbehaving producer's records land


def add_label_flood(stream: Stream, rng: random.Random, requests: int) -> LabelFlood:
    """`requests` copies of the stream's own requests, each with a new event id and a tenant
    never seen before, spread over the middle third of the run (every value of the stream has
    been read by then). The workers' cap is the most values any capped label of the stream
    holds, so the stream's values all have room and the flood fills what is left: its first
    tenants to be read are admitted, the rest are counted under `__other__`."""
    valid = [o for chunk in stream.chunks for o in chunk if o.kind in ("request", "gpu") and not o.duplicate]
    docs = [json.loads(o.value) for o in valid if o.kind == "request"]
    values = {label: {d.get(label) for d in docs} - {None, ""} for label in SLICE_LABELS}
    values["node"] = {json.loads(o.value)["node"] for o in valid if o.kind == "gpu"}
    cap = max(len(v) for v in values.values())
    n = len(stream.chunks)
    first, last = n // 3, max(n // 3, 2 * n // 3 - 1)
    picks = []  # (event time, draw, chunk, the request copied)
    for draw in range(requests):
        chunk = rng.randint(first, last)
        own = [o for o in stream.chunks[chunk] if o.kind == "request" and not o.duplicate]
        if own:
            source = rng.choice(own)
            picks.append((source.ts_ms, draw, chunk, source))
    # Named and published in event-time order, each at the end of its chunk (within the
    # allowed lateness of the chunk's other records).
    records = []
    for i, (ts_ms, _, chunk, source) in enumerate(sorted(picks, key=lambda p: p[:2])):
        doc = json.loads(source.value)
        doc.update({"event_id": f"flood-{i:05d}", "tenant": f"flood-{i:05d}"})
        doc.pop("retry_of", None)  # its own turn: the original's chain is not this tenant's
        doc["attempt"] = 1
        o = Outgoing(ts_ms, "requests", FLOOD_KEY, _dumps(doc), "request")
        stream.chunks[chunk].append(o)
        records.append(o)
    return LabelFlood(records, cap)


CAPPED = {"requests": ("tenant", "model", "model_version", "zone", "pool"), "gpu": ("node",)}


def admitted_values(store_path: Path, topics: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """The values the worker's cardinality limiter admitted, per topic suffix and label, as its
    last checkpoint stored them (its msgpack state: version, newest hour, values, slices)."""
    import msgspec

    con = duckdb.connect(str(store_path), read_only=True)
    try:
        rows = dict(con.execute("SELECT topic, state FROM _tw_label_limits").fetchall())
    finally:
        con.close()
    out = {}
    for suffix, topic in topics.items():
        state = msgspec.msgpack.decode(rows[topic]) if topic in rows else [0, None, {}, []]
        out[suffix] = {label: {value for value, _hour in state[2].get(label, [])} for label in CAPPED[suffix]}
    return out


def as_counted(o: Outgoing, admitted: dict[str, dict[str, set[str]]]) -> tuple[bytes, list[str]]:
    """A record as the worker counts it: each capped label whose value found no room reads
    `__other__`. Returns the bytes and the values folded."""
    doc = json.loads(o.value)
    folded = [doc[label] for label in CAPPED[o.topic] if doc.get(label) and doc[label] not in admitted[o.topic][label]]
    if not folded:
        return o.value, []
    for label in CAPPED[o.topic]:
        if doc.get(label) and doc[label] not in admitted[o.topic][label]:
            doc[label] = OVERFLOW_LABEL_VALUE
    return _dumps(doc), folded


# ---- real processes ------------------------------------------------------------------------


def _http_get(url: str, timeout_s: float = 1.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.read()
    except (OSError, urllib.error.URLError):
        return None


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class WorkerProc:
    name: str
    proc: subprocess.Popen
    http_port: int
    log_path: Path
    started: float  # monotonic
    ready: float | None = None  # when /healthz first answered
    signalled: bool = False  # we stopped it: its exit is expected
    first_event: float | None = None  # monotonic: when /metrics first showed an accepted event
    last_probe: float = 0.0
    ended: float | None = None
    ended_by: str = ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def poll_ready(self) -> bool:
        if self.ready is None and _http_get(f"http://127.0.0.1:{self.http_port}/healthz", 0.3) is not None:
            self.ready = time.monotonic()
        return self.ready is not None

    def scrape(self) -> tuple[int | None, int | None]:
        """(checkpoints so far, events accepted so far) from /metrics; None where it did not answer."""
        body = _http_get(f"http://127.0.0.1:{self.http_port}/metrics", 1.0)
        if body is None:
            return None, None
        checkpoints, accepted = 0, 0
        for line in body.decode(errors="replace").splitlines():
            if line.startswith(f"{CHECKPOINT_DURATION_SECONDS}_count"):
                checkpoints = int(float(line.rsplit(" ", 1)[1]))
            elif line.startswith(f"{EVENTS_TOTAL}{{") and 'outcome="accepted"' in line:
                accepted += int(float(line.rsplit(" ", 1)[1]))
        if accepted and self.first_event is None:
            self.first_event = time.monotonic()
        return checkpoints, accepted

    def probe(self) -> None:
        """Once a second until it has accepted an event: when did it start owning partitions?"""
        now = time.monotonic()
        if self.first_event is None and now - self.last_probe >= 1.0 and self.alive() and self.poll_ready():
            self.last_probe = now
            self.scrape()

    def mark_ended(self, how: str) -> None:
        if self.ended is None:
            self.ended, self.ended_by = time.monotonic(), how

    def stop(self, sig: int, wait_s: float) -> int | None:
        self.signalled = True
        if self.alive():
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Webhook:
    """Alertmanager's webhook receiver: what a pager integration would be told."""

    def __init__(self):
        self.notifications: list[dict] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (stdlib name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    received.append(json.loads(body))
                except ValueError:
                    pass
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fingerprints(self) -> set[str]:
        return {a.get("fingerprint", "") for n in self.notifications for a in n.get("alerts", [])}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def alertmanager_config(webhook_port: int, group_by: str, group_interval: str = "1s") -> str:
    """An Alertmanager config that notifies a local webhook within a second or two."""
    return f"""route:
  receiver: hook
  group_by: {group_by}
  group_wait: 1s
  group_interval: {group_interval}
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: http://127.0.0.1:{webhook_port}/
        send_resolved: true
"""


class Alertmanager:
    """A real Alertmanager on a fixed port, stopped and started again on that port. Debug
    logging is on because its log is the only record of alerts it received already
    resolved (its API lists active alerts only, and it never notifies a group whose
    alerts were all resolved before the first notification)."""

    def __init__(self, binary: str, out_dir: Path, webhook_port: int):
        self.binary, self.dir = binary, out_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.dir / "alertmanager.yml"
        # Grouped by every label: one group per alert, so each alert is notified on its own.
        self.config.write_text(alertmanager_config(webhook_port, "['...']"))
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []

    def start(self, timeout_s: float = 20.0) -> None:
        log_path = self.dir / f"alertmanager-{len(self.logs) + 1}.log"
        self.logs.append(log_path)
        deadline = time.monotonic() + timeout_s
        while True:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.binary, f"--config.file={self.config}", f"--web.listen-address=127.0.0.1:{self.port}",
                     f"--storage.path={self.dir / 'data'}", "--cluster.listen-address=", "--log.level=debug"],
                    stdout=log, stderr=subprocess.STDOUT)
            while time.monotonic() < deadline and self.proc.poll() is None:
                if _http_get(self.url + "/-/ready", 0.5) is not None:
                    return
                time.sleep(0.1)
            if self.proc.poll() is None or time.monotonic() >= deadline:
                break
            time.sleep(0.3)  # exited at once: most likely the port is still held; try again
        self.stop()
        raise ChaosSetupError(f"Alertmanager did not become ready: {_log_tail(log_path, 5)}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def received(self) -> dict[str, set[str]]:
        """Fingerprint prefix (7 hex digits, as Alertmanager logs it) → states received."""
        out: dict[str, set[str]] = {}
        pattern = re.compile(r'msg="Received alert" alert=[^\[\s]*\[([0-9a-f]{7})\]\[(active|resolved)\]')
        for path in self.logs:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for m in pattern.finditer(text):
                out.setdefault(m.group(1), set()).add(m.group(2))
        return out

    def active(self) -> list[dict]:
        body = _http_get(self.url + "/api/v2/alerts", 2.0)
        return json.loads(body) if body else []


def am_fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's alert fingerprint (Prometheus model.LabelSet.Fingerprint: FNV-1a 64
    over sorted names and values, each followed by the 0xff separator)."""
    h = 14695981039346656037
    for name in sorted(labels):
        for part in (name.encode(), b"\xff", str(labels[name]).encode(), b"\xff"):
            for byte in part:
                h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def worker_flags(command: Sequence[str], env: dict[str, str], cwd: Path) -> set[str]:
    """The long options `tailwatch worker` accepts, so that flags still being added are passed
    only once they exist (and an older build can be run for comparison)."""
    out = subprocess.run([*command, "worker", "--help"], capture_output=True, text=True, timeout=60, env=env, cwd=cwd)
    return set(re.findall(r"(--[a-z][a-z-]+)", out.stdout))


# ---- the run -------------------------------------------------------------------------------


@dataclass
class _Plan:
    early_kills: list[tuple[str, float]]  # ("startup" | "joining", seconds after process start | first /healthz)
    mid_kills_at_s: list[float]
    second_workers: list[tuple[float, float]]  # (start, lifetime)
    pauses: list[tuple[float, float]]  # (at, duration)
    am_outages: list[tuple[float, float]]
    restarts: list[float] = field(default_factory=list)  # broker restarts


def _plan(rng: random.Random, publish_s: float, burst_at_s: float, kills: int, early_kills: int, second_workers: int,
          broker_pauses: int, am_outages: int, broker_restarts: int = 0) -> _Plan:
    """Fault times in wall seconds since publishing began. Broker pauses keep clear of worker
    starts: a worker that starts against a stopped broker cannot read its topics' metadata,
    which is a different fault from the one being tested."""
    pauses = []
    for _ in range(broker_pauses):
        pauses.append((rng.uniform(0.3, 0.75) * publish_s, rng.uniform(3.0, 6.0)))

    restarts = _restart_times(rng, publish_s, pauses, broker_restarts)

    def clear(t: float) -> bool:
        return all(not (p - 8.0 <= t <= p + d + 1.0) for p, d in pauses) \
            and all(not (r - 8.0 <= t <= r + RESTART_CLEAR_S) for r in restarts)

    def pick(lo: float, hi: float) -> float:
        for _ in range(200):
            t = rng.uniform(lo, hi)
            if clear(t):
                return t
        return hi

    # The first dies while starting, the next while joining the group: both before a checkpoint.
    early = [("startup" if i % 2 == 0 else "joining", rng.uniform(1.0, 3.0)) for i in range(min(early_kills, kills))]
    mids: list[float] = []
    for _ in range(kills - len(early)):
        for _ in range(200):
            t = pick(0.3 * publish_s, 0.9 * publish_s)
            if all(abs(t - m) >= 6.0 for m in mids):
                break
        mids.append(t)
    seconds = [(pick(0.35 * publish_s, 0.55 * publish_s), rng.uniform(8.0, 14.0)) for _ in range(second_workers)]
    outages = [(max(1.0, burst_at_s + rng.uniform(0.5, 2.5)), rng.uniform(6.0, 12.0)) for _ in range(am_outages)]
    return _Plan(early, sorted(mids), seconds, pauses, outages, restarts)


RESTART_CLEAR_S = 25.0  # no kill or second worker this long after a broker restart (see _restart_times)
RESTART_HOLD_S = 8.0  # publishing waits this long after a restart


def _restart_times(rng: random.Random, publish_s: float, pauses: list[tuple[float, float]], n: int) -> list[float]:
    """Broker restarts mid-stream, clear of the pauses. Kills and second workers keep clear of
    them: the oracle reads what the worker had read from the lost log off its log_reset marks,
    which a worker killed before it checkpointed them, or a partition held by a second worker
    with a store of its own, would not leave in the store checked."""
    out: list[float] = []
    for _ in range(n):
        for _ in range(200):
            t = rng.uniform(0.45, 0.7) * publish_s
            if all(not (p - 10.0 <= t <= p + d + 10.0) for p, d in pauses) and all(abs(t - r) >= 30.0 for r in out):
                break
        out.append(t)
    return sorted(out)


class _Chaos:
    """One run: its processes, its fault timeline, and the check at the end."""

    def __init__(self, seed: int, minutes: int, out_dir: Path, say: Callable[[str], None], conf: ChaosConfig,
                 alertmanager_bin: str | None):
        self.seed, self.minutes, self.out, self.say, self.conf = seed, minutes, out_dir, say, conf
        self.speedup = conf.speedup
        self.rng = random.Random(seed)
        self.report = ChaosReport(seed=seed, minutes=minutes, speedup=conf.speedup, out_dir=str(out_dir))
        self.am_bin, self.azure_csv, self.mooncake = alertmanager_bin, Path(conf.azure_csv), Path(conf.mooncake_jsonl)
        self.worker_command = list(conf.worker_command or (sys.executable, "-m", "tailwatch"))
        self.worker_env = {**os.environ, **conf.worker_env}
        self.broker: EmbeddedBroker | None = None
        self.am: Alertmanager | None = None
        self.webhook: Webhook | None = None
        self.workers: list[WorkerProc] = []
        self.a: WorkerProc | None = None
        self.b: WorkerProc | None = None
        self.a_count = 0
        self.b_count = 0
        self.paused_until: float | None = None
        self.log_epoch = 0  # broker restarts so far: offsets of each life of the log are their own
        self.restart_walls: list[float] = []  # wall clock (epoch seconds) at each restart
        self.last_exit_seen = 0.0
        self.t0 = 0.0

    # -- helpers --
    def at(self) -> float:
        return time.monotonic() - self.t0

    def _argv(self, store: Path, port: int, instance: str, until_idle_s: float | None) -> list[str]:
        argv = [*self.worker_command, "worker", "--bootstrap-servers", self.kafka.bootstrap_servers,
                "--topic-prefix", self.kafka.topic_prefix, "--store", str(store), "--group", self.group,
                "--http-port", str(port), "--partitions", str(PARTITIONS), "--allowed-lateness", self.conf.allowed_lateness,
                "--slos", "default"]
        if self.am is not None:
            argv += ["--alertmanager-url", self.am.url]
        if "--idle-timeout" in self.flags:
            argv += ["--idle-timeout", self.conf.idle_timeout]
        if self.conf.instance_ids and "--instance-id" in self.flags:
            argv += ["--instance-id", instance]
        if until_idle_s is not None:
            argv += ["--until-idle", f"{until_idle_s:g}"]
            if "--drain-timeout" in self.flags:
                argv += ["--drain-timeout", "60s"]  # bounded, so a run that cannot drain fails in CI time
        if self.flood is not None:
            argv += ["--max-label-values", str(self.flood.cap)]
        return argv + list(self.conf.worker_args)

    def _spawn(self, name: str, store: Path, instance: str, until_idle_s: float | None = None) -> WorkerProc:
        port = free_port()
        log_path = self.out / "workers" / f"{name.replace('#', '-')}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(self._argv(store, port, instance, until_idle_s), stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.out, env=self.worker_env, start_new_session=True)
        w = WorkerProc(name, proc, port, log_path, time.monotonic())
        self.workers.append(w)
        self.report.membership_changes += 1
        return w

    def start_a(self) -> None:
        self.a_count += 1
        self.a = self._spawn(f"a#{self.a_count}", self.store_a, "chaos-a")
        self.say(f"chaos: {self.at():5.1f} s  worker {self.a.name} started")

    def kill_a(self, phase: str) -> None:
        a = self.a
        checkpoints, accepted = a.scrape()
        a.stop(signal.SIGKILL, 10)
        a.mark_ended("SIGKILL")
        self.report.kills.append(KillRecord(round(self.at(), 2), a.name, phase, checkpoints is not None,
                                            checkpoints, accepted))
        self.report.membership_changes += 1
        self.say(f"chaos: {self.at():5.1f} s  SIGKILL {a.name} ({phase}; {checkpoints} checkpoints, {accepted} accepted)")

    def check_exits(self) -> None:
        """A worker that exits without being told to is a crash: recorded, and `a` is restarted
        (as a supervisor would) unless it keeps crashing."""
        for w in (self.a, self.b):
            if w is None or w.signalled or w.alive():
                continue
            self._record_exit(w)
            self.say(f"chaos: {self.at():5.1f} s  {w.name} exited on its own with code {w.proc.returncode}")
        a = self.a
        if a is not None and a.signalled and not a.alive() and not self.broker_paused() and not self.crash_looping():
            if time.monotonic() - self.last_exit_seen >= self.RESTART_DELAY_S:
                self.start_a()

    RESTART_DELAY_S = 1.0  # a supervisor's pause before restarting a worker that exited on its own
    MAX_CRASHES = 12

    def crash_looping(self) -> bool:
        return len(self.report.worker_crashes) >= self.MAX_CRASHES

    def broker_paused(self) -> bool:
        return self.paused_until is not None

    # -- the run --
    def run(self) -> ChaosReport:
        started = time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            self._setup()
            self._publish_with_faults()
            self._drain()
            self._verify()
        finally:
            self._teardown()
            rel = lambda t: None if t is None else round(t - self.t0, 2)
            self.report.workers = [
                WorkerRun(w.name, rel(w.started), None if w.first_event is None else round(w.first_event - w.started, 2),
                          rel(w.ended), w.ended_by) for w in self.workers]
            self.report.wall_seconds = round(time.monotonic() - started, 1)
            (self.out / "report.json").write_text(self.report.to_json())
        return self.report

    def _setup(self) -> None:
        # The broker is new, so stores and logs of an earlier run in this folder are stale.
        for name in ("worker-a.duckdb", "worker-a.duckdb.wal", "worker-b.duckdb", "worker-b.duckdb.wal", "broker.log"):
            (self.out / name).unlink(missing_ok=True)
        for name in ("workers", "truth", "alertmanager"):
            shutil.rmtree(self.out / name, ignore_errors=True)
        for path in (self.azure_csv, self.mooncake):
            if not Path(path).is_file():
                raise ChaosSetupError(f"trace not found: {path}")
        self.flags = worker_flags(self.worker_command, self.worker_env, self.out)  # the workers' own cwd
        if "--until-idle" not in self.flags:
            raise ChaosSetupError(f"`{' '.join(self.worker_command)} worker --help` does not list --until-idle")
        for flag in ("--idle-timeout", "--drain-timeout") + (("--instance-id",) if self.conf.instance_ids else ()):
            if flag not in self.flags:
                self.report.notes.append(f"`tailwatch worker` has no {flag}: run without it")
        self.say("chaos: building the stream from the Azure code and Mooncake traces")
        self.stream = build_stream(self.seed, self.minutes, Path(self.azure_csv), Path(self.mooncake), self.rng)
        self.poison = add_poison(self.stream, self.rng, self.conf.poison_per_kind, self.conf.poison_kinds)
        self.flood = add_label_flood(self.stream, self.rng, self.conf.label_flood) if self.conf.label_flood else None
        self.broker = EmbeddedBroker(port=free_port(), log_path=self.out / "broker.log")
        try:
            self.broker.start()
        except BrokerError as exc:
            raise ChaosSetupError(f"the embedded broker: {exc}") from None
        self.kafka = KafkaSettings(bootstrap_servers=self.broker.bootstrap, topic_prefix=f"chaos{uuid.uuid4().hex[:6]}.")
        ensure_topics(self.kafka, partitions=PARTITIONS)
        self.group = f"chaos-{self.seed}"
        self.store_a = self.out / "worker-a.duckdb"
        self.store_b = self.out / "worker-b.duckdb"
        if self.am_bin:
            self.webhook = Webhook()
            self.am = Alertmanager(self.am_bin, self.out / "alertmanager", self.webhook.port)
            self.am.start()
        else:
            self.report.notes.append("no Alertmanager binary: outages and delivery not checked")
        self.producer = self._make_producer()

    def _make_producer(self):
        from confluent_kafka import Producer

        return Producer({
            **self.kafka.base_config(),
            "message.max.bytes": PRODUCER_MAX_BYTES,
            "partitioner": "consistent_random",
            "linger.ms": 5,
            # One request in flight per connection: a retried batch cannot overtake a later
            # one, so every partition keeps event-time order even across the broker pause.
            "max.in.flight.requests.per.connection": 1,
            "enable.idempotence": False,
            "acks": "all",
        })

    def _delivered(self, o: Outgoing, err, msg) -> None:
        if err is not None:
            o.error = str(err)
        else:
            o.delivered_partition, o.delivered_offset = msg.partition(), msg.offset()

    def _produce(self, o: Outgoing) -> None:
        o.log_epoch = self.log_epoch
        kwargs = {"key": o.key, "on_delivery": partial(self._delivered, o)}
        if o.partition is not None:
            kwargs["partition"] = o.partition
        if o.record_ts_ms is not None:
            kwargs["timestamp"] = o.record_ts_ms
        while True:
            try:
                self.producer.produce(self.kafka.topic(o.topic), o.value, **kwargs)
                return
            except BufferError:
                self.producer.poll(0.05)

    def _publish_with_faults(self) -> None:
        chunk_wall_s = CHUNK_MS / 1000 / self.speedup
        n = len(self.stream.chunks)
        publish_s = n * chunk_wall_s
        burst_at_s = (self.stream.burst[0] - START_MS) / 1000 / self.speedup
        c = self.conf
        plan = _plan(self.rng, publish_s, burst_at_s, c.kills, c.early_kills, c.second_workers, c.broker_pauses,
                     c.alertmanager_outages if self.am else 0, c.broker_restarts)
        self.say(f"chaos: publishing {n} chunks of {CHUNK_MS // 1000} event-seconds over {publish_s:.0f} s, "
                 f"{sum(len(c) for c in self.stream.chunks):,} records")
        self.t0 = time.monotonic()
        self.start_a()
        early = list(plan.early_kills)
        mids = list(plan.mid_kills_at_s)
        seconds = list(plan.second_workers)
        pauses = list(plan.pauses)
        outages = list(plan.am_outages)
        restarts = list(plan.restarts)
        am_back_at: float | None = None
        b_stop_at: float | None = None
        b_stopping_since: float | None = None
        last_say = 0.0

        def tick() -> None:
            nonlocal am_back_at, b_stop_at, b_stopping_since, last_say
            now = self.at()
            self.producer.poll(0)
            if self.paused_until is not None and now >= self.paused_until:
                os.kill(self.broker.proc.pid, signal.SIGCONT)
                self.paused_until = None
                self.say(f"chaos: {now:5.1f} s  broker resumed (SIGCONT)")
            self.check_exits()
            for w in (self.a, self.b):
                if w is not None:
                    w.probe()
            a = self.a
            # Early kills: the first incarnations die 1-3 s after their process started, or after
            # they first answered /healthz (while joining the group), before their first checkpoint.
            if early and a is not None and a.alive() and not a.signalled:
                phase, delay = early[0]
                since = a.started if phase == "startup" else (a.ready if a.poll_ready() else None)
                if since is not None and time.monotonic() - since >= delay:
                    early.pop(0)
                    self.kill_a(phase)
                    self.start_a()
            elif mids and now >= mids[0] and not early and not self.broker_paused():
                if a is not None and a.alive() and a.poll_ready():
                    mids.pop(0)
                    self.kill_a("mid-stream")
                    time.sleep(self.rng.uniform(0.0, 0.5))
                    self.start_a()
            if seconds and now >= seconds[0][0] and not self.broker_paused() and self.b is None:
                start, life = seconds.pop(0)
                self.b_count += 1
                self.b = self._spawn(f"b#{self.b_count}", self.store_b, "chaos-b")
                self.report.second_worker_runs += 1
                self.report.second_workers.append(FaultWindow("second-worker", round(now, 2), round(life, 2)))
                b_stop_at = now + life
                self.say(f"chaos: {now:5.1f} s  second worker {self.b.name} joins the group for {life:.1f} s")
            if self.b is not None and b_stop_at is not None and now >= b_stop_at and not self.broker_paused():
                # SIGTERM without waiting here: its last checkpoint must not stall the publishing.
                self.b.signalled = True
                self.b.mark_ended("SIGTERM")
                if self.b.alive():
                    self.b.proc.send_signal(signal.SIGTERM)
                    self.report.membership_changes += 1
                b_stop_at, b_stopping_since = None, now
            if self.b is not None and b_stopping_since is not None:
                if not self.b.alive():
                    self.say(f"chaos: {now:5.1f} s  second worker {self.b.name} left (SIGTERM, exit {self.b.proc.returncode})")
                    self.b, b_stopping_since = None, None
                elif now - b_stopping_since > 30.0:
                    self.report.notes.append(f"{self.b.name} did not stop within 30 s of SIGTERM: killed")
                    self.b.stop(signal.SIGKILL, 10)
            if pauses and now >= pauses[0][0] and self.paused_until is None:
                at, dur = pauses.pop(0)
                os.kill(self.broker.proc.pid, signal.SIGSTOP)
                self.paused_until = now + dur
                self.report.broker_pauses.append(FaultWindow("broker-pause", round(now, 2), round(dur, 2)))
                self.say(f"chaos: {now:5.1f} s  broker paused (SIGSTOP) for {dur:.1f} s")
            if restarts and now >= restarts[0] and not self.broker_paused() and self.b is None \
                    and self._worker_has_read():
                restarts.pop(0)
                self._restart_broker()
            if outages and now >= outages[0][0] and am_back_at is None:
                at, dur = outages.pop(0)
                self.am.stop()
                am_back_at = now + dur
                self.report.alertmanager_outages.append(FaultWindow("alertmanager-down", round(now, 2), round(dur, 2)))
                self.say(f"chaos: {now:5.1f} s  Alertmanager down for {dur:.1f} s")
            if am_back_at is not None and now >= am_back_at:
                try:
                    self.am.start()
                    am_back_at = None
                    self.say(f"chaos: {self.at():5.1f} s  Alertmanager back on port {self.am.port}")
                except ChaosSetupError as exc:
                    am_back_at = now + 1.0  # its port may not be free yet: again in a second
                    self.say(f"chaos: {now:5.1f} s  Alertmanager did not come back yet: {exc}")
            if now - last_say >= 5.0:
                last_say = now
                minute = min(self.minutes, int(now * self.speedup / 60))
                self.say(f"chaos: {now:5.1f} s  event minute {minute}/{self.minutes}, "
                         f"worker {self.a.name if self.a else '-'}")

        for c, chunk in enumerate(self.stream.chunks):
            due = self.t0 + c * chunk_wall_s
            while time.monotonic() < due:
                tick()
                time.sleep(min(0.05, max(0.0, due - time.monotonic())))
            for i, o in enumerate(chunk):
                self._produce(o)
                if i % 500 == 499:
                    self.producer.poll(0)
            tick()
        # Faults still pending when the last chunk went out are run now, in order, for a while:
        # a worker that never comes up (a crash loop) leaves its kills undone, and says so.
        deadline = time.monotonic() + (90.0 if restarts else 30.0)  # a restart waits for a worker that has read
        while early or mids or seconds or pauses or restarts or outages or am_back_at is not None or b_stop_at is not None \
                or b_stopping_since is not None or self.paused_until is not None:
            tick()
            if (time.monotonic() >= deadline or self.crash_looping()) and self.paused_until is None \
                    and am_back_at is None and b_stop_at is None and b_stopping_since is None:
                self.report.notes.append(f"faults not run (no live worker to run them on): {len(early) + len(mids)} kills, "
                                         f"{len(seconds)} second workers, {len(pauses)} broker pauses, {len(restarts)} broker "
                                         f"restarts, {len(outages)} "
                                         "Alertmanager outages")
                break
            time.sleep(0.05)
        left = self.producer.flush(60)
        if left:
            self.report.notes.append(f"{left} records still queued in the test producer after 60 s")

    # -- the broker restart --
    def _worker_has_read(self) -> bool:
        """Worker `a` is up and has accepted events (its probe says): a restart before it read
        anything would take nothing from it."""
        a = self.a
        return a is not None and a.alive() and not a.signalled and a.first_event is not None

    def _restart_broker(self) -> None:
        """Stop the broker and start it again on its port: its log, kept in memory, is gone and
        offsets begin again at 0 in topics created anew. Everything published so far is
        delivered first, so each record's offset is known to be in the old log; publishing then
        waits RESTART_HOLD_S, long enough for a running worker to notice (streams/log_reset.py)
        before the new log reaches its old positions, so that its log_reset marks say exactly
        how far it had read the old one."""
        left = self.producer.flush(60)
        if left:
            self.report.notes.append(f"{left} records still queued before the broker restart")
        self.producer = None  # its threads would dial the restarted broker with the old log's topic ids
        started = time.monotonic()
        self.broker.stop()
        try:
            self.broker.start()
        except BrokerError as exc:
            raise ChaosSetupError(f"the embedded broker did not start again: {exc}") from None
        ensure_topics(self.kafka, partitions=PARTITIONS)
        self.log_epoch += 1
        self.restart_walls.append(time.time())
        self.producer = self._make_producer()
        self.report.broker_restarts.append(FaultWindow("broker-restart", round(self.at(), 2),
                                                       round(time.monotonic() - started, 2)))
        self.say(f"chaos: {self.at():5.1f} s  broker restarted: its log is gone; publishing again in {RESTART_HOLD_S:g} s")
        time.sleep(RESTART_HOLD_S)

    def _read_before_restarts(self) -> dict[tuple[str, int, int], int]:
        """(topic suffix, partition, log epoch) → how far the store had read that log when the
        broker restart took it: the offset of its log_reset mark (the first after the restart).
        Without a mark, nothing: a worker that had read the partition and skipped the new log
        in silence then has rows the expectation lacks, and lacks rows it has."""
        r = self.report
        if not self.restart_walls:
            return {}
        with duckdb.connect(str(self.store_a), read_only=True) as con:
            marks = con.execute("SELECT source_topic, source_partition, source_offset, epoch(ts) FROM dead_letter "
                                "WHERE reason = 'log_reset' ORDER BY ts").fetchall()
        r.log_reset_marks = len(marks)
        suffix = {self.kafka.topic(t): t for t in ("requests", "gpu")}
        read: dict[tuple[str, int, int], int] = {}
        for topic, part, offset, at in marks:
            # The log lost by the last restart before the mark (a second of slack for the clocks).
            epoch = max((e for e, wall in enumerate(self.restart_walls) if wall <= at + 1.0), default=None)
            if epoch is None or topic not in suffix:
                r.restart_problems.append(f"a log_reset mark on {topic} partition {part} at offset {offset} "
                                          "that no broker restart explains")
                continue
            read.setdefault((suffix[topic], int(part), epoch), int(offset))
        ends: dict[tuple[str, int, int], int] = {}
        for chunk in self.stream.chunks:
            for o in chunk:
                if o.delivered_offset is not None and o.log_epoch < self.log_epoch:
                    key = (o.topic, o.delivered_partition, o.log_epoch)
                    ends[key] = max(ends.get(key, 0), o.delivered_offset + 1)
        for key, end in sorted(ends.items()):
            if key in read and read[key] > end:
                r.restart_problems.append(f"{self.kafka.topic(key[0])} partition {key[1]}: log_reset mark at offset "
                                          f"{read[key]}, past the lost log's end {end}")
        return read

    def _could_be_stored(self, o: Outgoing, read: dict[tuple[str, int, int], int]) -> bool:
        """Whether the store could have seen `o`: in the log that is, or read from a lost one
        before the broker restart took it."""
        if o.log_epoch == self.log_epoch:
            return True
        return o.delivered_offset < read.get((o.topic, o.delivered_partition, o.log_epoch), 0)

    def _drain(self) -> None:
        if self.b is not None and self.b.alive():
            self.b.mark_ended("SIGTERM")
            self.b.stop(signal.SIGTERM, 30)
        if self.a is not None and self.a.alive():
            self.a.mark_ended("SIGTERM")
            code = self.a.stop(signal.SIGTERM, 60)
            self.report.membership_changes += 1
            self.say(f"chaos: {self.at():5.1f} s  {self.a.name} stopped (SIGTERM, exit {code})")
        self.check_exits_final()
        self.say(f"chaos: {self.at():5.1f} s  final worker: --until-idle {self.conf.final_until_idle_s:g}")
        final = self._spawn("a-final", self.store_a, "chaos-a", until_idle_s=self.conf.final_until_idle_s)
        deadline = time.monotonic() + self.conf.final_timeout_s
        while final.alive() and time.monotonic() < deadline:
            final.probe()
            time.sleep(0.2)
        timed_out = final.alive()
        if timed_out:
            final.stop(signal.SIGKILL, 10)
            self.report.notes.append(f"the final worker did not exit within {self.conf.final_timeout_s:.0f} s: killed")
        code = None if timed_out else final.proc.returncode
        final.signalled = True
        final.mark_ended(f"until-idle exit {code}")
        self.report.final_exit_code = code
        self.report.final_log_tail = _log_tail(final.log_path, 20)
        self.report.group_rescues = sum(
            p.read_text(errors="replace").count("named a departed member as its leader")
            for p in (self.out / "workers").glob("*.log"))
        self.say(f"chaos: {self.at():5.1f} s  final worker exited {code}")

    def check_exits_final(self) -> None:
        for w in (self.a, self.b):
            if w is not None and not w.signalled and not w.alive():
                self._record_exit(w)

    def _record_exit(self, w: WorkerProc) -> None:
        w.signalled = True
        w.mark_ended(f"exit {w.proc.returncode}")
        self.last_exit_seen = time.monotonic()
        self.report.membership_changes += 1
        self.report.worker_crashes.append(CrashRecord(w.name, round(self.at(), 2), w.proc.returncode,
                                                      _log_tail(w.log_path)))

    def _teardown(self) -> None:
        for w in self.workers:
            if w.alive():
                w.stop(signal.SIGKILL, 10)
        if self.broker is not None and self.broker.proc is not None and self.broker.proc.poll() is None:
            try:
                os.kill(self.broker.proc.pid, signal.SIGCONT)  # never leave it stopped
            except ProcessLookupError:
                pass
        if getattr(self, "producer", None) is not None:
            self.producer = None  # its threads would keep dialling a broker about to go
        if self.am is not None:
            self.am.stop()
        if self.webhook is not None:
            self.webhook.close()
        if self.broker is not None:
            self.broker.stop()

    # -- the check --
    def _verify(self) -> None:
        r = self.report
        records = [o for chunk in self.stream.chunks for o in chunk]
        valid = [o for o in records if o.kind in ("request", "gpu")]
        r.undelivered = sum(1 for o in records if o.delivered_offset is None)
        read = self._read_before_restarts() if self.store_a.exists() else {}
        gone = [o for o in records if o.delivered_offset is not None and not self._could_be_stored(o, read)]
        r.records_gone_with_the_log = len(gone)
        if gone:
            valid = [o for o in valid if o.delivered_offset is None or self._could_be_stored(o, read)]
        self._expected_poison = [o for o in self.poison if o.delivered_offset is None or self._could_be_stored(o, read)]
        truth = self.out / "truth"
        truth.mkdir(exist_ok=True)
        files = {"requests": truth / "requests.jsonl", "gpu": truth / "gpu.jsonl"}
        handles = {k: open(v, "wb") for k, v in files.items()}
        # With a label flood, the store holds each value the worker found room for under its
        # name, the rest under `__other__`: which ones is the worker's first-come order, so the
        # expectation takes the admitted sets from the store and checks what they hold.
        admitted = admitted_values(self.store_a, {s: self.kafka.topic(s) for s in CAPPED}) \
            if self.flood is not None and self.store_a.exists() else None
        flood_ids = {id(o) for o in self.flood.records} if self.flood is not None else set()
        stream_folded: set[str] = set()
        try:
            for o in valid:
                if o.delivered_offset is None:
                    continue  # never in the log: not expected in the store either
                value = o.value
                if admitted is not None:
                    value, folded = as_counted(o, admitted)
                    if id(o) in flood_ids:
                        r.flood_requests += 1
                    elif folded:
                        stream_folded.update(folded)
                        r.stream_folded_requests += o.topic == "requests" and not o.duplicate
                handles[o.topic].write(value + b"\n")
                r.duplicates_published += o.duplicate
                if o.topic == "requests":
                    r.requests_published += 1
                else:
                    r.gpu_samples_published += 1
        finally:
            for h in handles.values():
                h.close()
        if admitted is not None:
            r.flood_tenants_admitted = sorted(admitted["requests"]["tenant"] - {
                json.loads(o.value)["tenant"] for chunk in self.stream.chunks for o in chunk
                if o.kind == "request" and id(o) not in flood_ids})
            r.stream_values_folded = sorted(stream_folded)
            if stream_folded:
                r.notes.append(f"the stream's own values counted under {OVERFLOW_LABEL_VALUE}: {sorted(stream_folded)} "
                               "(the worker read a flood tenant before them: first come, first admitted)")
        mismatched = sum(1 for o in valid if o.delivered_partition is not None
                         and o.delivered_partition != _crc_partition(o.key.decode()))
        if mismatched:
            r.notes.append(f"{mismatched} keyed records landed in another partition than CRC32(key) % {PARTITIONS}")
        r.silent_partitions = self._silences(valid)
        for o in self.poison:
            r.poison_by_kind[o.kind] = r.poison_by_kind.get(o.kind, 0) + 1
        (truth / "poison.jsonl").write_text("".join(json.dumps({
            "kind": o.kind, "topic": self.kafka.topic(o.topic), "partition": o.delivered_partition,
            "offset": o.delivered_offset,
            "size_bytes": len(o.value or b""), "expected_reason": POISON_REASONS[o.kind], "error": o.error}) + "\n"
            for o in self.poison))

        if not self.store_a.exists():
            r.verification_error = f"no store at {self.store_a}: the worker never checkpointed"
            return
        con = duckdb.connect()
        try:
            con.execute(f"ATTACH '{self.store_a}' AS got (READ_ONLY)")
            self._compare_tables(con, files)
            if self.flood is not None:
                r.flood_in_overflow = con.execute("SELECT coalesce(sum(requests), 0) FROM got.sli_minute WHERE tenant = ?",
                                                  [OVERFLOW_LABEL_VALUE]).fetchone()[0]
            self._check_dead_letters(con)
            if self.am is not None:
                self._check_alerts(con)
        except duckdb.Error as exc:
            r.verification_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        finally:
            con.close()

    def _silences(self, valid: list[Outgoing]) -> list[SilentSpan]:
        """Gaps of 5 minutes or more between valid events of one partition, from the delivery reports."""
        by_part: dict[tuple[str, int], list[int]] = {}
        keys: dict[tuple[str, int], set[str]] = {}
        for o in valid:
            if o.delivered_partition is None or o.duplicate:
                continue
            by_part.setdefault((o.topic, o.delivered_partition), []).append(o.ts_ms)
            keys.setdefault((o.topic, o.delivered_partition), set()).add(o.key.decode())
        out = []
        for (topic, part), ts in sorted(by_part.items()):
            ts.sort()
            for a, b in zip(ts, ts[1:]):
                if b - a >= 5 * MINUTE_MS:
                    inside = sum(1 for p in self.poison if p.topic == topic and p.delivered_partition == part
                                 and a <= p.ts_ms < b)
                    iso = lambda t: datetime.fromtimestamp(t / 1000, tz=timezone.utc).strftime("%H:%M:%S")
                    out.append(SilentSpan(self.kafka.topic(topic), part, iso(a), iso(b), round((b - a) / MINUTE_MS, 1),
                                          sorted(keys[(topic, part)]), inside))
        return out

    def _compare_tables(self, con: duckdb.DuckDBPyConnection, files: dict[str, Path]) -> None:
        r = self.report
        con.execute(_EXPECTED_SQL.format(requests=files["requests"], gpu=files["gpu"], **_HIST_CONSTANTS))
        r.unique_requests = con.execute("SELECT count(*) FROM req").fetchone()[0]
        r.unique_gpu_samples = con.execute("SELECT count(*) FROM gpu").fetchone()[0]
        diverging: list[tuple] = []  # (table, keys, columns, key values, expected, stored)
        for table, keys, count_col in (("sli_minute", ("window_start", *SLICE_LABELS), "requests"),
                                       ("gpu_minute", ("window_start", *GPU_KEYS), "samples")):
            cols = con.execute(f"SELECT column_name, column_type FROM (DESCRIBE got.{table})").fetchall()
            exp_cols = {c for (c,) in con.execute(f"SELECT column_name FROM (DESCRIBE exp_{table})").fetchall()}
            missing_cols = [c for c, _ in cols if c not in exp_cols]
            if missing_cols:
                r.notes.append(f"{table}: columns not reproduced by the harness, left out of EXCEPT ALL: {missing_cols}")
            cols = [(c, t) for c, t in cols if c in exp_cols]
            sel_got = ", ".join(c for c, _ in cols)
            sel_exp = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t in cols)
            con.execute(f"CREATE TEMP TABLE e_{table} AS SELECT {sel_exp} FROM exp_{table}")
            con.execute(f"CREATE TEMP TABLE g_{table} AS SELECT {sel_got} FROM got.{table}")
            count = lambda sql: con.execute(sql).fetchone()[0]
            k = ", ".join(keys)
            check = TableCheck(
                table=table,
                expected_rows=count(f"SELECT count(*) FROM e_{table}"),
                stored_rows=count(f"SELECT count(*) FROM g_{table}"),
                missing_rows=count(f"SELECT count(*) FROM (SELECT * FROM e_{table} EXCEPT ALL SELECT * FROM g_{table})"),
                extra_rows=count(f"SELECT count(*) FROM (SELECT * FROM g_{table} EXCEPT ALL SELECT * FROM e_{table})"),
                duplicate_keys=count(f"SELECT count(*) FROM (SELECT {k} FROM g_{table} GROUP BY ALL HAVING count(*) > 1)"),
                mismatched_columns={},
            )
            on = " AND ".join(f"e.{c} = g.{c}" for c in keys)
            for c, _ in cols:
                if c in keys:
                    continue
                n = count(f"SELECT count(*) FROM e_{table} e JOIN g_{table} g ON {on} WHERE e.{c} IS DISTINCT FROM g.{c}")
                if n:
                    check.mismatched_columns[c] = n
            r.tables.append(check)
            # Lost and counted twice: per slice-minute, expected events against stored ones.
            per_key = con.execute(f"""
                WITH e AS (SELECT {k}, sum({count_col}) AS n FROM e_{table} GROUP BY ALL),
                     g AS (SELECT {k}, sum({count_col}) AS n FROM g_{table} GROUP BY ALL)
                SELECT {", ".join(f"coalesce(e.{c}, g.{c}) AS {c}" for c in keys)},
                       coalesce(e.n, 0) AS expected, coalesce(g.n, 0) AS stored
                FROM e FULL OUTER JOIN g ON {on}
            """).fetchall()
            lost = sum(max(0, int(row[-2]) - int(row[-1])) for row in per_key)
            twice = sum(max(0, int(row[-1]) - int(row[-2])) for row in per_key)
            if table == "sli_minute":
                r.events_lost, r.events_counted_twice = lost, twice
            else:
                r.gpu_samples_lost, r.gpu_samples_counted_twice = lost, twice
            # Which slice-minutes diverge, in any column: for the report.
            bad = con.execute(f"""
                SELECT DISTINCT {k} FROM (
                    (SELECT * FROM e_{table} EXCEPT ALL SELECT * FROM g_{table})
                    UNION ALL (SELECT * FROM g_{table} EXCEPT ALL SELECT * FROM e_{table}))
            """).fetchall()
            counts = {tuple(row[:-2]): (int(row[-2]), int(row[-1])) for row in per_key}
            for row in bad:
                exp_n, got_n = counts.get(tuple(row), (0, 0))
                diverging.append((table, keys, [c for c, _ in cols], tuple(row), exp_n, got_n))
        r.divergent_slice_minutes = len(diverging)
        diverging.sort(key=lambda d: (-abs(d[4] - d[5]), str(d[3][0]), d[0]))
        for table, keys, names, row, exp_n, got_n in diverging[:25]:
            where = " AND ".join(f"{c} = ?" for c in keys)
            e = con.execute(f"SELECT * FROM e_{table} WHERE {where}", list(row)).fetchone()
            g = con.execute(f"SELECT * FROM g_{table} WHERE {where}", list(row)).fetchone()
            differing = [c for c, a, b in zip(names, e or (), g or ()) if a != b] if e and g else []
            labels = dict(zip(keys[1:], (str(v) for v in row[1:])))
            key = labels.get("tenant") or labels.get("node")
            r.divergent.append(SliceDiff(table, str(row[0]), labels, _crc_partition(key) if key else None,
                                         exp_n, got_n, differing))

    def _check_dead_letters(self, con: duckdb.DuckDBPyConnection) -> None:
        r = self.report
        cols = {c for (c,) in con.execute("SELECT column_name FROM (DESCRIBE got.dead_letter)").fetchall()}
        sha = "sha256" if "sha256" in cols else "NULL"
        rows = con.execute(f"SELECT source_topic, source_partition, source_offset, reason, size_bytes, {sha} "
                           "FROM got.dead_letter").fetchall()
        for _t, _p, _o, reason, _s, _h in rows:
            r.dead_letters_by_reason[reason] = r.dead_letters_by_reason.get(reason, 0) + 1
        rows = [row for row in rows if row[3] != "log_reset"]  # the gaps' marks: _read_before_restarts
        r.late_dead_letters = r.dead_letters_by_reason.get("late", 0)
        at: dict[tuple[str, int, int], list[tuple]] = {}
        for row in rows:
            at.setdefault((row[0], int(row[1]), int(row[2])), []).append(row)
        poison_at = set()
        for o in self._expected_poison:
            if o.delivered_offset is None:
                continue  # counted in `undelivered`
            where = (self.kafka.topic(o.topic), o.delivered_partition, o.delivered_offset)
            poison_at.add(where)
            found = at.get(where, [])
            raw = o.value or b""
            if self.log_epoch and sha != "NULL":  # an offset may be in two lives of the log: the bytes tell them apart
                found = [f for f in found if f[5] == hashlib.sha256(raw).hexdigest()]
            expected = POISON_REASONS[o.kind]
            problem = ""
            if not found:
                problem = "missing"
            elif len(found) > 1:
                problem = f"stored {len(found)} times"
            elif found[0][3] != expected:
                problem = "wrong reason"
            elif found[0][4] != len(raw):
                problem = f"size_bytes {found[0][4]} != {len(raw)}"
            elif found[0][5] is not None and found[0][5] != hashlib.sha256(raw).hexdigest():
                problem = "sha256 differs"
            if problem:
                r.poison_problems.append(PoisonCheck(o.kind, where[0], where[1], where[2], len(raw), expected,
                                                     [f[3] for f in found], problem))
        for where, found in at.items():
            if where not in poison_at:
                for f in found:
                    r.unexpected_dead_letters[f[3]] = r.unexpected_dead_letters.get(f[3], 0) + 1

    def _check_alerts(self, con: duckdb.DuckDBPyConnection) -> None:
        r = self.report
        r.alertmanager_checked = True
        rows = con.execute("SELECT alertname, severity, slo, alert_window, labels, fired_at, resolved_at FROM got.alerts "
                           "ORDER BY fired_at, slo, labels").fetchall()
        expected = []
        for name, severity, slo, window, labels_json, fired, resolved in rows:
            slice_labels = json.loads(labels_json) if labels_json else {}
            labels = {"alertname": name, "severity": severity, "slo": slo, **slice_labels}
            if name != "SLONoData":
                labels["window"] = window
            expected.append((name, severity, slo, slice_labels, fired, resolved, am_fingerprint(labels)))
        r.pages_fired = sum(1 for e in expected if e[1] == "page")
        r.burst_paged = any(e[1] == "page" and e[2] == "llm-realtime-availability"
                            and e[3].get("model_version") == CHAT_STABLE for e in expected)
        # Alerts still firing must be active once Alertmanager is back; the final worker re-sent
        # them on start. Give its delivery a few seconds.
        deadline = time.monotonic() + 15
        while True:
            active = {a.get("fingerprint") for a in self.am.active()}
            if all(e[6] in active for e in expected if e[5] is None) or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        time.sleep(1.5)  # the webhook hears of a group one group_wait later
        received = self.am.received()
        notified = self.webhook.fingerprints()
        for name, severity, slo, slice_labels, fired, resolved, fp in expected:
            states = received.get(fp[:7], set())
            r.alerts.append(AlertCheck(name, severity, slo, slice_labels, str(fired),
                                       None if resolved is None else str(resolved),
                                       fp, "active" in states, "resolved" in states, fp in active, fp in notified))


# Constants as exact doubles: a decimal literal would be read as DECIMAL by DuckDB, and
# a string cast to DOUBLE is correctly rounded, as repr() round-trips. Division by a
# constant is written as multiplication by its reciprocal because that is what polars
# computes for `column / scalar` (measured: the two differ in the last bit for about one
# value in five), and the store's doubles are compared bit for bit.
def _double(x: float) -> str:
    return f"'{x!r}'::DOUBLE"


_GAMMA = (1 + histogram.RELATIVE_ACCURACY) / (1 - histogram.RELATIVE_ACCURACY)
_HIST_CONSTANTS = {
    "min_ms": _double(histogram.MIN_VALUE_MS),
    "zero_bin": str(histogram.ZERO_BIN),
    "log_gamma": _double(math.log(_GAMMA)),
    "inv_log_gamma": _double(1 / math.log(_GAMMA)),
    "inv_gamma_plus_1": _double(1 / (_GAMMA + 1)),
    "inv_micro": _double(1 / 1_000_000),
    "inv_milli": _double(1 / 1_000),
    **{f"newest_{c}": f"(max({{'t': ts_ms, 'v': {c}}}) FILTER (WHERE {c} IS NOT NULL AND {c} <> '')).v"
       for c in ("zone", "pool", "gpu_sku", "model", "model_version", "replica_state")},
    # streams/aggregates.py `_mean`: one division of the fixed-point total by count × 1000.
    **{f"mean_{c}": f"CASE WHEN count({c}) > 0 THEN sum(round({c} * 1000)::BIGINT)::DOUBLE / (count({c}) * 1000)::DOUBLE END"
       for c in ("util_pct", "power_w", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct",
                 "gr_engine_active_pct")},
    "any_nvml": "(" + " OR ".join(f"{c} IS NOT NULL" for c in (
        "util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "temp_c", "xid_errors", "ecc_errors")) + ")",
    "any_runtime": "(" + " OR ".join(f"{c} IS NOT NULL" for c in (
        "replica_state", "queue_depth", "oldest_queue_age_ms", "running", "active_streams", "kv_cache_usage",
        "preemptions")) + ")",
}

# The independent aggregation of the log, in DuckDB SQL, from the README's contract:
# - duplicates: one request per event_id, one GPU sample per (node, gpu_index, ts);
# - ts: epoch milliseconds or RFC 3339; minute = floor(ts / 60 s), window_start in UTC;
# - defaults for fields left out: traffic_class realtime, deployment stable, attempt 1, labels "";
# - retries: attempt > 1 or retry_of set; turns: first attempts, except those the client
#   cancelled without a task_success; successful turns: task_success where given, else status ok
#   (README "Turns");
# - token sums as integers, GPU-seconds and audio-seconds summed in integer micro-units
#   (round(x · 10^6)), GPU means over integer milli-units; sums over nothing are 0, maxima NULL;
# - streams: attempts with a finish_reason; completed = stop, length, content_filter; cut, timed out and
#   cancelled = server_cut, timeout, client_cancel (phase histograms are not reproduced here);
# - latency bins: values ≤ MIN_VALUE_MS in ZERO_BIN, others ceil(ln(v) / ln γ), as [{bin, n}]
#   ordered by bin ([] when the slice-minute has no value); quantile q is the bin holding rank
#   floor(q · (n − 1)), read as 2 γ^bin / (γ + 1) (0 for the zero bin), NULL without values;
# - GPU samples (docs/data-contract.md: several sources per GPU, merged field by field): labels and replica
#   state from the newest sample that has them (ties by value), each gauge over the samples
#   that carry it, `sources` the sources seen (a sample without `source` is NVML's if it
#   carries NVML readings and the runtime's if it carries runtime gauges), in name order.
_EXPECTED_SQL = """
CREATE TEMP TABLE req AS
SELECT DISTINCT ON (event_id)
    event_id,
    coalesce(try_cast(ts AS BIGINT), epoch_ms(try_cast(ts AS TIMESTAMPTZ))) AS ts_ms,
    tenant, model, coalesce(model_version, '') AS model_version, coalesce(zone, '') AS zone, workload,
    coalesce(traffic_class, 'realtime') AS traffic_class, coalesce(deployment, 'stable') AS deployment,
    coalesce(pool, '') AS pool, status, coalesce(attempt, 1) AS attempt, retry_of, task_success,
    queue_ms, first_output_ms, e2e_ms, inter_token_ms, finish_reason, prompt_tokens, output_tokens, audio_seconds,
    gpu_seconds
FROM read_json('{requests}', format = 'newline_delimited', columns = {{
    event_id: 'VARCHAR', ts: 'VARCHAR', tenant: 'VARCHAR', model: 'VARCHAR', model_version: 'VARCHAR',
    zone: 'VARCHAR', workload: 'VARCHAR', traffic_class: 'VARCHAR', deployment: 'VARCHAR', pool: 'VARCHAR',
    status: 'VARCHAR', attempt: 'INTEGER', retry_of: 'VARCHAR', task_success: 'BOOLEAN', queue_ms: 'DOUBLE',
    first_output_ms: 'DOUBLE', e2e_ms: 'DOUBLE', inter_token_ms: 'DOUBLE', finish_reason: 'VARCHAR',
    prompt_tokens: 'BIGINT', output_tokens: 'BIGINT', audio_seconds: 'DOUBLE', gpu_seconds: 'DOUBLE'}});

CREATE TEMP TABLE req_m AS
SELECT *, make_timestamp((ts_ms // 60000) * 60000000) AS window_start,
       (attempt > 1 OR retry_of IS NOT NULL) AS is_retry
FROM req;

CREATE TEMP TABLE req_bins AS
SELECT window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool, field,
       CASE WHEN v <= {min_ms} THEN {zero_bin} ELSE ceil(ln(v) * {inv_log_gamma}) END::SMALLINT AS bin,
       count(*)::BIGINT AS n
FROM (
    SELECT *, 'queue_ms' AS field, queue_ms AS v FROM req_m
    UNION ALL SELECT *, 'first_output_ms', first_output_ms FROM req_m
    UNION ALL SELECT *, 'e2e_ms', e2e_ms FROM req_m
    UNION ALL SELECT *, 'inter_token_ms', inter_token_ms FROM req_m
) WHERE v IS NOT NULL
GROUP BY ALL;

CREATE TEMP TABLE req_hist AS
WITH c AS (
    SELECT *, sum(n) OVER (PARTITION BY window_start, tenant, model, model_version, zone, workload, traffic_class,
                                        deployment, pool, field ORDER BY bin ROWS UNBOUNDED PRECEDING) AS cum,
              sum(n) OVER (PARTITION BY window_start, tenant, model, model_version, zone, workload, traffic_class,
                                        deployment, pool, field) AS total
    FROM req_bins
), q AS (
    SELECT window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool, field,
           list({{'bin': bin, 'n': n}} ORDER BY bin)::STRUCT(bin SMALLINT, n BIGINT)[] AS hist,
           min(bin) FILTER (WHERE cum > floor((total - 1) * 0.5)) AS b50,
           min(bin) FILTER (WHERE cum > floor((total - 1) * 0.95)) AS b95,
           min(bin) FILTER (WHERE cum > floor((total - 1) * 0.99)) AS b99
    FROM c GROUP BY ALL
)
SELECT * EXCLUDE (b50, b95, b99),
       CASE WHEN b50 <= {zero_bin} THEN 0.0 ELSE 2 * exp(b50::DOUBLE * {log_gamma}) * {inv_gamma_plus_1} END AS p50,
       CASE WHEN b95 <= {zero_bin} THEN 0.0 ELSE 2 * exp(b95::DOUBLE * {log_gamma}) * {inv_gamma_plus_1} END AS p95,
       CASE WHEN b99 <= {zero_bin} THEN 0.0 ELSE 2 * exp(b99::DOUBLE * {log_gamma}) * {inv_gamma_plus_1} END AS p99
FROM q;

CREATE TEMP TABLE exp_sli_minute AS
WITH counts AS (
    SELECT window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool,
           count(*) AS requests, count_if(status = 'ok') AS ok, count_if(status = 'error') AS errors,
           count_if(status = 'timeout') AS timeouts, count_if(status = 'shed') AS shed,
           count_if(status = 'cancelled') AS cancelled, count_if(is_retry) AS retries,
           count_if(NOT is_retry AND (status <> 'cancelled' OR task_success IS NOT NULL)) AS turns,
           count_if(coalesce(task_success, status = 'ok')) AS successful_turns,
           coalesce(sum(prompt_tokens), 0) AS prompt_tokens, coalesce(sum(output_tokens), 0) AS output_tokens,
           coalesce(sum(round(audio_seconds * 1000000)::BIGINT), 0)::DOUBLE * {inv_micro} AS audio_seconds,
           coalesce(sum(round(gpu_seconds * 1000000)::BIGINT), 0)::DOUBLE * {inv_micro} AS gpu_seconds,
           count(finish_reason) AS streams,
           -- count_if of nothing but NULLs is NULL in DuckDB, not 0
           count(*) FILTER (finish_reason IN ('stop', 'length', 'content_filter')) AS streams_completed,
           count(*) FILTER (finish_reason = 'server_cut') AS streams_cut,
           count(*) FILTER (finish_reason = 'timeout') AS streams_timed_out,
           count(*) FILTER (finish_reason = 'client_cancel') AS streams_cancelled
    FROM req_m GROUP BY ALL
)
SELECT c.*,
       coalesce(hq.hist, []) AS queue_ms_hist, hq.p50 AS queue_ms_p50, hq.p95 AS queue_ms_p95, hq.p99 AS queue_ms_p99,
       coalesce(hf.hist, []) AS first_output_ms_hist, hf.p50 AS first_output_ms_p50, hf.p95 AS first_output_ms_p95,
       hf.p99 AS first_output_ms_p99,
       coalesce(he.hist, []) AS e2e_ms_hist, he.p50 AS e2e_ms_p50, he.p95 AS e2e_ms_p95, he.p99 AS e2e_ms_p99,
       coalesce(hi.hist, []) AS inter_token_ms_hist, hi.p50 AS inter_token_ms_p50, hi.p95 AS inter_token_ms_p95,
       hi.p99 AS inter_token_ms_p99
FROM counts c
LEFT JOIN (FROM req_hist WHERE field = 'queue_ms') hq
    USING (window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool)
LEFT JOIN (FROM req_hist WHERE field = 'first_output_ms') hf
    USING (window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool)
LEFT JOIN (FROM req_hist WHERE field = 'e2e_ms') he
    USING (window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool)
LEFT JOIN (FROM req_hist WHERE field = 'inter_token_ms') hi
    USING (window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool);

CREATE TEMP TABLE gpu AS
SELECT DISTINCT *  -- a redelivery repeats the whole sample
FROM (
    SELECT coalesce(try_cast(ts AS BIGINT), epoch_ms(try_cast(ts AS TIMESTAMPTZ))) AS ts_ms, * EXCLUDE (ts)
    FROM read_json('{gpu}', format = 'newline_delimited', columns = {{
        ts: 'VARCHAR', node: 'VARCHAR', gpu_index: 'INTEGER', zone: 'VARCHAR', pool: 'VARCHAR', gpu_sku: 'VARCHAR',
        model: 'VARCHAR', model_version: 'VARCHAR', util_pct: 'DOUBLE', mem_used_bytes: 'BIGINT',
        mem_total_bytes: 'BIGINT', power_w: 'DOUBLE', temp_c: 'DOUBLE', xid_errors: 'BIGINT', ecc_errors: 'BIGINT',
        replica_state: 'VARCHAR', queue_depth: 'BIGINT', oldest_queue_age_ms: 'DOUBLE', running: 'BIGINT',
        active_streams: 'BIGINT', kv_cache_usage: 'DOUBLE', preemptions: 'BIGINT', sm_active_pct: 'DOUBLE',
        sm_occupancy_pct: 'DOUBLE', tensor_active_pct: 'DOUBLE', dram_bw_pct: 'DOUBLE',
        gr_engine_active_pct: 'DOUBLE', source: 'VARCHAR'}})
);

CREATE TEMP TABLE exp_gpu_minute AS
SELECT make_timestamp((ts_ms // 60000) * 60000000) AS window_start, node, gpu_index,
       {newest_zone} AS zone, {newest_pool} AS pool, {newest_gpu_sku} AS gpu_sku, {newest_model} AS model,
       {newest_model_version} AS model_version,
       count(*) AS samples,
       {mean_util_pct} AS util_pct_mean,
       max(util_pct) AS util_pct_max, max(mem_used_bytes) AS mem_used_bytes_max, max(mem_total_bytes) AS mem_total_bytes,
       {mean_power_w} AS power_w_mean,
       max(temp_c) AS temp_c_max, coalesce(sum(xid_errors), 0) AS xid_errors, coalesce(sum(ecc_errors), 0) AS ecc_errors,
       max(queue_depth) AS queue_depth_max, max(oldest_queue_age_ms) AS oldest_queue_age_ms_max,
       max(running) AS running_max, max(active_streams) AS active_streams_max,
       max(kv_cache_usage) AS kv_cache_usage_max, coalesce(sum(preemptions), 0) AS preemptions,
       {newest_replica_state} AS replica_state,
       {mean_sm_active_pct} AS sm_active_pct_mean, {mean_sm_occupancy_pct} AS sm_occupancy_pct_mean,
       {mean_tensor_active_pct} AS tensor_active_pct_mean, {mean_dram_bw_pct} AS dram_bw_pct_mean,
       {mean_gr_engine_active_pct} AS gr_engine_active_pct_mean,
       concat_ws(',',
           CASE WHEN bool_or(source = 'dcgm') THEN 'dcgm' END,
           CASE WHEN bool_or(source = 'nvml' OR (source IS NULL AND {any_nvml})) THEN 'nvml' END,
           CASE WHEN bool_or(source = 'otlp') THEN 'otlp' END,
           CASE WHEN bool_or(source = 'runtime' OR (source IS NULL AND {any_runtime})) THEN 'runtime' END) AS sources
FROM gpu GROUP BY ALL;
"""


def run_chaos(seed: int, minutes: int, out_dir: str | Path, progress: Callable[[str], None] | None = None, *,
              alertmanager_bin: str | None = "auto", config: ChaosConfig | None = None, **knobs) -> ChaosReport:
    """One seeded chaos run over `minutes` of event time (5 to 600; past the traces' hour they
    play again), in `out_dir` (stores, logs, the truth files and report.json stay there).

    `progress` gets one line per fault and every few seconds. `alertmanager_bin`: "auto"
    finds Debian's `prometheus-alertmanager`; None runs without Alertmanager (its checks are
    then skipped and said so). The other knobs are `ChaosConfig`'s fields, given as a
    `config` or as keywords (`kills=0`, `worker_env={"PYTHONPATH": ...}` to run another
    build, ...). Raises ChaosSetupError when the broker, a trace or Alertmanager cannot be had."""
    conf = dataclasses.replace(config or ChaosConfig(), **knobs)  # an unknown knob is a TypeError here
    if not 5 <= minutes <= 600:
        raise ValueError("minutes must be between 5 and 600")
    unknown = sorted(set(conf.poison_kinds) - set(POISON_REASONS))
    if unknown:
        raise ValueError(f"unknown poison kinds {unknown}; known: {', '.join(POISON_REASONS)}")
    if alertmanager_bin == "auto":
        alertmanager_bin = next((p for p in map(shutil.which, AM_BIN_NAMES) if p), None)
        if alertmanager_bin is None:
            raise ChaosSetupError("prometheus-alertmanager is not installed (alertmanager_bin=None runs without it)")
    return _Chaos(seed, minutes, Path(out_dir), progress or (lambda _line: None), conf, alertmanager_bin).run()
