"""The stream runtime: one loop that owns the source, the checkpoints, the timers, readiness
and the HTTP port, whatever the tier.

Parts plug into it (streams/tiers.py puts them together):
- the **source** (streams/source.py's `Source`): the consumer, partitions, read positions,
  lag; Kafka's, or records held in memory (streams/memory_source.py);
- the **operator** (streams/operator.py): what becomes of each batch, and what each
  checkpoint holds (minute windows, per-partition partials, or whole minutes assembled);
  it never reads the store: at start the runtime asks the sink that holds the resume
  state for the operator's state, typed, and hands it over (`operator.restore`);
- the **sinks** (streams/sink.py), a list the loop calls alike: topics
  (streams/topic_sink.py) always; where the tier keeps one, the store with its stages
  (streams/store_sink.py) and their Alertmanager outboxes (streams/alert_sink.py);
- the **signal view** (streams/signal_stage.py), rebuilt every few seconds and published
  to the **HTTP port** (streams/http_port.py; the worker's is streams/http.py), where the
  tier serves the signal API.

The runtime knows the parts by their interfaces only (here and in streams/sink.py,
streams/operator.py, streams/http_port.py): what they compute (SLOs, signals, plans,
pages) is theirs, and the tier composition builds them from the worker's settings
(streams/tiers.py).

The loop: consume a batch, hand it to the operator, and every `checkpoint_interval_s` (or
at once, when the topics went quiet with something unsaved) take the operator's checkpoint
to every sink. A checkpoint closes at most about `checkpoint_max_rows` rows; while it
left closable minutes open, the loop checkpoints again instead of reading, so a backlog
closes in steps of bounded memory. Delivery: the store, not Kafka's group offsets, is where a worker
resumes; copies to topics are flushed before the checkpoint that covers them commits.
"""

from __future__ import annotations

import gc
import json
import logging
import resource
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, TypeVar

import polars as pl

from tailwatch.ingest.kafka import KafkaSettings
from tailwatch.store.checkpoint import Checkpoint
from tailwatch.streams.http_port import HttpPort
from tailwatch.streams.input_catch_up import InputCatchUp
from tailwatch.streams.metrics import CpuAccount, WorkerMetrics
from tailwatch.streams.operator import Operator
from tailwatch.streams.source import Source
from tailwatch.streams import process_memory, state_size
from tailwatch.streams.sink import Sink
from tailwatch.streams.topic_sink import Undelivered

log = logging.getLogger("tailwatch.worker")
S = TypeVar("S", bound=Sink)


@dataclass
class RuntimeSettings:
    """The loop's own settings. Each part has its own; the tier composition (streams/tiers.py)
    derives them all from the worker's settings."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)  # the topics made sure of at start
    group_id: str = "tailwatch-worker"
    partitions: int = 4  # of each topic made at start
    batch_size: int = 20_000
    checkpoint_interval_s: float = 2.0
    until_idle_s: float | None = None
    drain_timeout_s: float = 120.0  # --until-idle: how long to wait for partitions it does not own or has not read
    state_every_s: float = 60.0  # how often the state's memory is measured for /metrics (a walk of its objects)
    stale_after_s: float = 30.0  # readiness: caught up within this long
    view_refresh_s: float = 2.0  # how often the signal view is rebuilt from buckets and open minutes
    stats_file: str | None = None  # JSON run statistics at exit (benchmarks read it)
    progress: Callable[[str], None] | None = None  # a status line, when what it says changed
    announce: Callable[[str], None] | None = None  # the start and stop lines
    start_notes: tuple[str, ...] = ()  # what the parts add to the start line ("12 SLOs from slos.yaml")


class SignalView(Protocol):
    """The view the HTTP port answers from, built from kept buckets and a peek at open minutes
    (streams/signal_stage.py), its answers encoded for the port. The runtime hands it on as it is."""

    def view(self, open_requests: pl.DataFrame, open_gpu: pl.DataFrame, inputs_behind: dict[str, str],
             wall_s: float) -> object:
        ...


class NotDrained(Exception):
    """`--until-idle` ended without having read every partition to its end (one line)."""


@dataclass
class Parts:
    """What a tier plugs into the runtime."""

    operator: Operator
    sinks: list[Sink]  # the topics always; the store and the Alertmanager where the tier keeps a store
    signals: SignalView | None = None  # None: no signal API on the HTTP port (only /metrics, /healthz)
    http: HttpPort | None = None  # None: no HTTP port


class Runtime:
    MAX_VIEW_AGE_S = 30.0  # while draining a backlog, the signal API's view is rebuilt at least this often
    HEARTBEAT_S = 10.0  # an idle worker tells its HTTP process this often that the view still holds
    # (or a quarter of the staleness bound, if that is shorter: a view between heartbeats must
    # never look stale, or a pool that went quiet would be reported as a stale worker)
    HEAP_CHECK_EVERY_S = 10.0  # how often glibc's free heap is looked at, and trimmed past its bound

    def __init__(self, settings: RuntimeSettings, metrics: WorkerMetrics, cpu: CpuAccount, parts: Parts,
                 source: Source):
        self.settings = settings
        self.metrics = metrics
        self.cpu = cpu
        self.operator = parts.operator
        self.sinks = parts.sinks
        self.signals = parts.signals
        self.http = parts.http  # the HTTP port part; None: none
        self.source = source
        for sink in self.sinks:
            for collector in sink.collectors():
                metrics.registry.register(collector)
        # Without a sink that holds the resume state, the operator resumes from Kafka and
        # publishes its checkpoints itself (tier 1).
        self.state_sink: Sink | None = next((sink for sink in self.sinks if sink.holds_resume_state), None)
        self.resumes_from_store = self.state_sink is not None
        # Another process holds what a sink writes: a stopping worker ends on it in one line.
        self._held: tuple[type[BaseException], ...] = tuple(e for sink in self.sinks for e in sink.held_errors)
        self.signal_snapshot: object | None = None  # the signal view last built
        self.events_seen = 0
        self.http_port: int | None = None
        self.lag_messages = 0
        self.lag_known = False  # until the source has said how far behind every owned partition is
        self.last_batch_wall = time.monotonic()
        self.first_event_wall: float | None = None
        self.cpu_at_first_event: float | None = None
        self.last_event_wall: float | None = None
        self._caught_up_wall: float | None = None
        self.inputs = InputCatchUp(source.topics, settings.batch_size)  # each input topic on its own
        self._view_dirty = True  # events or closed minutes since the signal view was last built
        self._state_measured = self._heap_checked = time.monotonic()
        self._stop = False

    def sink(self, kind: type[S]) -> S:
        """The sink of this kind (tests and tools reach the store or its stages through it)."""
        return next(sink for sink in self.sinks if isinstance(sink, kind))

    @property
    def buckets_closed(self) -> int:
        return self.operator.buckets_closed

    @property
    def stopping(self) -> bool:
        return self._stop

    def stop(self, *_args) -> None:
        self._stop = True

    def health(self) -> dict:
        out = {
            "status": "ok",
            "events_seen": self.events_seen,
            "partitions_owned": sum(len(parts) for parts in self.source.assigned.values()),
            "seconds_since_last_batch": round(time.monotonic() - self.last_batch_wall, 3),
        }
        if self.signals is not None:
            # False between reading events (or closing minutes) and the next rebuild of the API's
            # view, which waits up to a tenth of the worker's time: what the API answers then
            # does not yet hold everything read.
            out["view_current"] = not self._view_dirty
        return out

    # ---- lifecycle --------------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped (or drained, with `until_idle_s`)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(sig, self.stop)
            except ValueError:  # not the main thread (tests run the worker in one)
                pass
        s = self.settings
        self.source.ensure_topics(s.partitions)
        http = None
        if self.http is not None:
            # Before the store: restoring it takes seconds on a big fleet (5 s at 20,000 slices,
            # bench --tiers), and a poller is better told "starting" (503) than refused.
            http = self.http
            http.start(self.health)
            self.http_port = http.port
            log.info("serving /metrics, /healthz and the signal API on %s", http.url)
        try:
            self.restore()
            self.source.start(self.operator)
        except BaseException as exc:
            if http:
                http.stop()
            for sink in self.sinks:
                sink.close()
            if isinstance(exc, self._held) and self._stop:  # stopped while another process held the file
                log.error("%s", exc)
                return 0
            raise
        # Modules, the restored state and the clients live as long as the run: out of the
        # collector's sight, a full collection costs milliseconds rather than 40 (measured on
        # the Mooncake sparse bench: 11 full collections took 0.47 of 5.8 CPU-s, then 0.06).
        # Collected first, so that no garbage is frozen with them.
        gc.collect()
        gc.freeze()
        self._measure_memory()  # from the first scrape on: the restored state, and what starting took
        undrained: list[str] = []
        started = time.monotonic()
        if s.announce:
            s.announce(self._start_line(http))
        try:
            store_busy = False
            try:
                undrained = self._loop(http, started)
                self._checkpoint(close_all=s.until_idle_s is not None and not self._stop and not undrained)
            except (Undelivered, *self._held) as exc:
                # Stopping, and Kafka takes nothing or another process holds the store: the
                # store stays at its last checkpoint, which the next start resumes from.
                log.error("%s", exc)
                store_busy = isinstance(exc, self._held)
            # Pages still go out; with the store held, what was delivered is not recorded
            # and the next start sends it again (Alertmanager takes a page twice as once).
            try:
                self._drain(wait_s=10.0, record=not store_busy)
            except self._held as exc:
                log.error("%s", exc)
            if s.progress:
                elapsed = time.monotonic() - started
                s.progress(self.operator.progress_line(self.events_seen, self.events_seen / elapsed if elapsed else 0.0))
            if s.announce:
                why = ("stopped by a signal" if self._stop else "not drained" if undrained
                       else "drained" if s.until_idle_s is not None else "stopped")
                s.announce(f"stopped ({why}): {self.events_seen:,} records read in {_duration_text(time.monotonic() - started)}"
                           + "".join(f"; {d} at its last checkpoint" for d in
                                     (sink.describe() for sink in self.sinks if sink.holds_resume_state) if d))
        finally:
            gc.unfreeze()  # a run inside a longer process (tests, the demo) hands them back
            self.source.close()
            if http:
                http.stop()
            for sink in self.sinks:
                sink.close()
            if s.stats_file:
                self._write_stats(s.stats_file)
        if undrained and not self._stop:
            raise NotDrained(f"not drained after {s.until_idle_s + s.drain_timeout_s:.0f} s: " + "; ".join(undrained))
        return 0

    def restore(self) -> None:
        """Open the sinks and put the operator back where the last committed checkpoint left it:
        the state the sink holding it reads from its store, or, without one, nothing here (the
        operator reads where each partition resumes from Kafka as it is taken)."""
        for sink in self.sinks:
            sink.open()
        self.operator.start(self.source)
        if self.state_sink is not None:
            state = self.state_sink.restored(self.operator.restore_scope())
            self.source.next_offsets.update(state.offsets)  # where reading goes on: the store's offsets
            self.operator.restore(state)

    def _start_line(self, http: HttpPort | None) -> str:
        s = self.settings
        parts = [f"started: reading {', '.join(self.source.topics)} from {s.kafka.bootstrap_servers} as group {s.group_id}"]
        parts.extend(d for d in (sink.describe() for sink in self.sinks) if d)
        parts.extend(s.start_notes)
        parts.append(f"HTTP on {http.url}" if http else "no HTTP port")
        return "; ".join(parts)

    def _loop(self, http: HttpPort | None, started: float) -> list[str]:
        """Until stopped or drained; returns why it is not drained (empty: it is, or it was stopped)."""
        s = self.settings
        last_checkpoint = time.monotonic()
        # Never yet: the first view and heartbeat are due at once (0.0 would make them wait until
        # the host's monotonic clock passed the interval, up to an hour after a boot).
        last_refresh = last_publish = float("-inf")
        view_waits_from = time.monotonic()  # the backlog rule's clock: from the last rebuild, or the start
        published_ready = False
        refresh_every_s = s.view_refresh_s
        last_progress = idle_since = time.monotonic()
        last_events, last_line = self.events_seen, ""
        while not self._stop:
            # Minutes left open by a checkpoint's bound close before more is read.
            closing_behind = self.operator.closing_behind
            by_topic = {} if closing_behind else self.source.consume(s.batch_size, 0.5)
            got = 0
            for topic, batch in by_topic.items():
                self.operator.process(topic, batch)
                got += len(batch)
            self.events_seen += got
            now = time.monotonic()
            self.operator.tick(self.source, now)
            if closing_behind:
                idle_since = now  # closing a backlog is work, not idleness
            if got:
                self._view_dirty = True
                idle_since = self.last_batch_wall = self.last_event_wall = now
                if self.first_event_wall is None:
                    self.first_event_wall = now
                    self.cpu_at_first_event = time.process_time()
            if now - last_checkpoint >= s.checkpoint_interval_s or closing_behind or (
                    not got and self.operator.has_unsaved(self.source)):
                self._checkpoint(close_all=False)
                last_checkpoint = now
            if http is not None:
                # While draining a backlog the view waits, up to MAX_VIEW_AGE_S: the API is not
                # ready then anyway, and each rebuild costs as much as tens of thousands of events.
                # A lag not yet known counts as a backlog: a worker starting on one would
                # otherwise build a view after its first batch, before its first checkpoint
                # measured the lag.
                backlogged = (not self.lag_known or self.lag_messages > s.batch_size) and \
                    now - view_waits_from < self.MAX_VIEW_AGE_S
                ready = self.readiness()
                # A worker turning ready rebuilds the view first: ready on an older view would
                # answer for less than it caught up to (an input "behind", a new pool unknown).
                turning_ready = ready[0] and not published_ready
                if self.signals and self._view_dirty and (
                        turning_ready or (now - last_refresh >= refresh_every_s and not backlogged)):
                    began = time.monotonic()
                    self.refresh_signals()
                    self._view_dirty = False
                    ready = self.readiness()
                    http.publish_view(self.signal_snapshot, ready)
                    published_ready = ready[0]
                    last_refresh = last_publish = view_waits_from = time.monotonic()
                    # At most a tenth of the worker's time goes to the view.
                    refresh_every_s = max(s.view_refresh_s, 10 * (last_refresh - began))
                else:
                    # Nothing changed but time, or readiness (a worker that just caught up is
                    # ready now, not at the next heartbeat): say the view still holds instead
                    # of rebuilding it.
                    if ready[0] != published_ready or now - last_publish >= min(self.HEARTBEAT_S, s.stale_after_s / 4):
                        http.publish_unchanged(ready)
                        published_ready = ready[0]
                        last_publish = now
            for sink in self.sinks:
                sink.tick(caught_up=self._caught_up_wall is not None)
            if s.progress and now - last_progress >= 1.0:
                # Only when something changed (an idle worker says nothing), at the rate since the last line.
                # Nothing before the first record: a "0 records (0/s)" line while the group joins says nothing.
                line = self.operator.progress_line(self.events_seen, (self.events_seen - last_events) / (now - last_progress))
                if line != last_line and self.events_seen:
                    s.progress(line)
                    last_line = line
                last_events, last_progress = self.events_seen, now
            self.source.tick(now)
            assigned_at = self.source.assigned_at
            if assigned_at is None:
                if now - started > 60:
                    raise RuntimeError("the consumer group gave this worker no partitions within 60 s")
                idle_since = now  # the group join takes a few seconds: idle time counts from assignment
            # Only after a poll that read nothing and with no closable minutes left behind: with
            # `until_idle_s` 0 the time test alone would end the run mid-backlog, and the drain's
            # checkpoint would then close it all at once, past `checkpoint_max_rows`.
            elif s.until_idle_s is not None and not got and not self.operator.closing_behind and \
                    now - max(idle_since, assigned_at) >= s.until_idle_s:
                undrained = self.operator.undrained(self.source)
                if not undrained or now - max(idle_since, assigned_at) >= s.until_idle_s + s.drain_timeout_s:
                    return undrained
        return []

    def _checkpoint(self, close_all: bool) -> None:
        started = time.monotonic()
        cp = self.operator.checkpoint(self.source, close_all)
        if cp is not None:
            if any(t.closed.height for t in cp.topics):
                self._view_dirty = True
            for sink in self.sinks:
                sink.snapshot(cp)
            for sink in self.sinks:
                sink.commit(cp)
            self.operator.committed(cp)
            for sink in self.sinks:
                sink.committed(cp)
        if cp is not None or not self.resumes_from_store:  # an operator without a store published its own
            self.metrics.checkpoint_seconds.observe(time.monotonic() - started)
        self.operator.update_gauges()
        self._update_lag()
        if time.monotonic() - self._state_measured >= self.settings.state_every_s:
            self._measure_memory()
        elif time.monotonic() - self._heap_checked >= self.HEAP_CHECK_EVERY_S:
            self._heap_checked = time.monotonic()
            free = process_memory.free_heap_bytes()
            if free is not None and free > process_memory.TRIM_ABOVE_BYTES:
                process_memory.trim_heap()

    def _drain(self, wait_s: float, record: bool) -> None:
        """At exit: wait up to `wait_s` for what the sinks have in flight (pages), then record
        the marks they hold (a restart resends only what is past them)."""
        deadline = time.monotonic() + wait_s
        for sink in self.sinks:
            sink.drain(max(0.0, deadline - time.monotonic()))
        marks = Checkpoint(topics=[], next_offsets={}, stage_rows=[])
        for sink in self.sinks:
            sink.snapshot(marks)
        if marks.stage_rows and record:
            for sink in self.sinks:
                sink.commit(marks)

    def _measure_memory(self) -> None:
        for component, size in self.state_bytes().items():
            self.metrics.state_bytes.labels(component).set(size)
        for holder, size in self.process_memory().items():
            self.metrics.process_memory.labels(holder).set(size)

    def state_bytes(self) -> dict[str, int]:
        """Memory each part holds: open minutes (the operator), each stage, the signal view."""
        self._state_measured = time.monotonic()
        held = {name: part for sink in self.sinks for name, part in sink.memory_holders().items()
                if part is not self.signals}
        return state_size.state_bytes({"open_minutes": self.operator, **held,
                                       "signal_view": (self.signals, self.signal_snapshot)})

    def process_memory(self) -> dict[str, int]:
        """The process's resident memory by holder (streams/process_memory.py), read just after
        a trim of the heap: free heap is then only what stays resident."""
        cache = sum(sink.cache_bytes() for sink in self.sinks)
        trimmed = process_memory.trim_heap()
        self._heap_checked = time.monotonic()
        return process_memory.process_memory(cache, trimmed=trimmed)

    def _update_lag(self) -> None:
        lag, known = self.source.lag()
        for (topic, part), behind in lag.items():
            self.metrics.consumer_lag.labels(topic, str(part)).set(behind)
        self.lag_messages = sum(lag.values())
        self.lag_known = known
        if known and self.lag_messages <= self.settings.batch_size and self.source.assigned_at is not None:
            self._caught_up_wall = time.time()
        before = set(self._inputs_behind())
        self.inputs.observe(self.source.assigned, {t: self.source.read_to_end(t) for t in self.source.topics}, lag,
                            known, time.time())
        if set(self._inputs_behind()) != before:
            self._view_dirty = True  # the view says which inputs are behind: rebuild it when that changes

    def _inputs_behind(self) -> dict[str, str]:
        return self.inputs.behind(self.source.assigned, time.time(), self.settings.stale_after_s)

    # ---- the signal view and readiness ---------------------------------------------------
    def refresh_signals(self) -> None:
        """Rebuild the signal API's view from kept buckets plus a peek at open minutes."""
        began = self.cpu.began()
        self.signal_snapshot = self.signals.view(*self.operator.open_minutes(), self._inputs_behind(), wall_s=time.time())
        self.cpu.spent("signals_view", began)

    def readiness(self) -> tuple[bool, str]:
        """Ready when the worker owns every partition of the topic a pool's traffic spans, the
        API has a view, and the worker was caught up (lag within one batch) within the
        staleness bound."""
        if self.signals is None:
            return False, "this worker serves no signal API (tier 1): ask a tier-2 worker"
        bound = self.settings.stale_after_s
        if self.source.assigned_at is None:
            return False, "waiting for the consumer group to assign partitions"
        if self.source.gone:
            return False, (f"{', '.join(sorted(self.source.gone))}: the topic is gone (deleted); waiting for it "
                           "to be created again, then reading it from the start")
        if self.source.resetting:
            where = ", ".join(f"{t} partition {q}" for t, q in sorted(self.source.resetting))
            return False, (f"reading {where} again from the start: the log no longer has the stored read "
                           "position (a dead letter of reason log_reset marks the gap)")
        whole = self.operator.whole_topic
        owned = len(self.source.assigned.get(whole, ()))
        total = len(self.source.partitions.get(whole, ()))
        if owned < total:
            return False, (f"this worker owns {owned} of {total} partitions of {whole}: "
                           "its answers would count part of each pool's traffic")
        if self.signal_snapshot is None:
            return False, "building the first view of the data"
        if self._caught_up_wall is None:
            return False, f"catching up: {self.lag_messages:,} messages behind"
        behind = time.time() - self._caught_up_wall
        if behind > bound:
            return False, f"{self.lag_messages:,} messages behind; last caught up {behind:.0f} s ago (bound {bound:.0f} s)"
        inputs = self._inputs_behind()
        if inputs:
            return False, "; ".join(f"{topic}: {why}" for topic, why in sorted(inputs.items()))
        return True, "caught up"

    def _write_stats(self, path: str) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with open(path, "w") as fh:
            json.dump({
                "events": self.events_seen,
                "first_event_monotonic": self.first_event_wall,
                "last_event_monotonic": self.last_event_wall,
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                # From the first event on: what the stream costs, without imports and the group join.
                "cpu_seconds_processing": time.process_time() - (self.cpu_at_first_event or 0.0),
                "max_rss_bytes": usage.ru_maxrss * 1024,
                "stage_cpu_seconds": self.cpu.seconds,
                "minutes_closed": self.operator.minutes_closed,
                "state_bytes": self.state_bytes(),
                "process_memory_bytes": self.process_memory(),
            }, fh)


def _duration_text(seconds: float) -> str:
    """`42 s`, `3 min 5 s`, `2 h 4 min`: a run's length as a person reads it."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"
