"""Tier 1, the firehose worker: consume `tw.requests` and `tw.gpu` in batches, decode and
validate them, window them into 1-minute buckets, and checkpoint buckets, state and
offsets into the DuckDB store in one transaction.

Delivery: the store, not Kafka's group offsets, is the source of truth for where to
resume. On partition assignment the worker seeks to the offsets of its last checkpoint,
and the open-minute state it restores is exactly the state those offsets imply, so a
SIGKILL at any moment is followed by the same buckets as an uninterrupted run.
Dead letters and closed buckets are published to their topics before the checkpoint
commits (at-least-once there; consumers dedupe by source offset / slice and minute).
A copy the producer refuses (a record too large, a topic gone) is counted and logged,
never fatal: the store's `dead_letter` table and buckets hold the truth.

Membership: minutes close over every partition of a topic, owned or not
(streams/windows.py), so a partition that is somewhere else for a while (a dead member
not yet expired, a second worker) delays closing instead of making its events late, and
every closed minute is whole: SLOs and detectors always run on it. With `instance_id`
the worker is a static member (`group.instance.id`, KIP-345) and a restart takes its
partitions back at once, on clusters that expire static members that leave.
"""

from __future__ import annotations

import gc
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

import duckdb
import polars as pl
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from alerts.alertmanager import AlertLinks, DeliveryCollector, FiringAlerts
from ingest import deadletter
from ingest.schema import GpuV1, RequestV1
from ingest.validate import DEFAULT_MAX_RECORD_BYTES, LATE, BatchDecoder
import store
from streams.aggregates import GPU, REQUESTS
from streams.alignment import WatermarkAlignment
from streams.frames import DEFAULT_MAX_AHEAD_MS, GPU_COLUMNS, REQUEST_COLUMNS, records_to_frame
from streams.http import HttpState, WorkerHttp
from streams.metrics import WorkerMetrics
from streams.partials import sli_keys
from streams.signal_stage import SignalStage
from streams.slo_stage import SloStage
from streams.windows import MinuteWindows, utc_text
from store.lock import StoreLock
from signals.config import ApiConfig
from signals.live import LiveSignals, SignalSnapshot
from planning.prices import GpuPrices
from ingest.broker import is_embedded, rescue_wedged_group
from ingest.kafka import KafkaSettings, ensure_topics, make_consumer, make_producer, send
from conventions import TOPIC_DEADLETTER, TOPIC_GPU, TOPIC_REQUESTS, TOPIC_SLI

log = logging.getLogger("tailwatch.worker")


@dataclass
class WorkerSettings:
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    store_path: str = store.DEFAULT_STORE
    group_id: str = "tailwatch-worker"
    http_port: int | None = 8000
    until_idle_s: float | None = None
    allowed_lateness_s: float = 300.0
    max_event_ahead_s: float = DEFAULT_MAX_AHEAD_MS / 1000  # event time past its Kafka record's timestamp: `future`
    batch_size: int = 20_000
    checkpoint_interval_s: float = 2.0
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    partitions: int = 4
    publish_sli: bool = True
    progress: Callable[[str], None] | None = None
    stats_file: str | None = None  # JSON run statistics at exit (benchmarks read it)
    slos: list | None = None  # slo.spec.SloSpec: evaluated on every closed minute; None: none
    alertmanager_urls: tuple[str, ...] = ()  # every Alertmanager of the cluster
    store_release_s: float = 20.0  # how often the worker lets go of the DuckDB file for readers
    stages: list = field(default_factory=list)  # streams.stages.Stage: fed each checkpoint's closed minutes
    http_host: str = "127.0.0.1"
    api_config: ApiConfig = field(default_factory=ApiConfig)  # the signal API on the HTTP port
    prices: GpuPrices = field(default_factory=GpuPrices)
    alert_links: AlertLinks = field(default_factory=AlertLinks)  # where pages point: runbooks, Grafana
    signals_refresh_s: float = 2.0  # how often the API's view is rebuilt from buckets and open minutes
    # Event time: a partition read to its end that is this far behind the newest stops holding minutes open.
    idle_timeout_s: float = 60.0
    # Static group membership (KIP-345) on a cluster that expires static members; None: dynamic.
    instance_id: str | None = None
    drain_timeout_s: float = 120.0  # --until-idle: how long to wait for partitions it does not own or has not read
    # Pause a partition whose watermark is this far ahead of the topic's slowest (None: the allowed lateness; 0: never).
    max_watermark_drift_s: float | None = None


class NotDrained(Exception):
    """`--until-idle` ended without having read every partition to its end (one line)."""


@dataclass
class TopicPipeline:
    """Everything the worker keeps per input topic."""

    topic: str
    table: str
    decoder: BatchDecoder
    columns: dict[str, pl.DataType]
    windows: MinuteWindows
    assigned: set[int] = field(default_factory=set)
    eof: set[int] = field(default_factory=set)
    alignment: WatermarkAlignment | None = None  # None: partitions are never paused


class Worker:
    def __init__(self, settings: WorkerSettings, metrics: WorkerMetrics | None = None):
        self.settings = settings
        self.metrics = metrics or WorkerMetrics()
        lateness_ms = int(settings.allowed_lateness_s * 1000)
        self._max_ahead_ms = int(settings.max_event_ahead_s * 1000)
        drift_s = settings.allowed_lateness_s if settings.max_watermark_drift_s is None else settings.max_watermark_drift_s
        k = settings.kafka
        self.pipelines: dict[str, TopicPipeline] = {}
        for suffix, event_type, columns, spec, table in (
            (TOPIC_REQUESTS, RequestV1, REQUEST_COLUMNS, REQUESTS, "sli_minute"),
            (TOPIC_GPU, GpuV1, GPU_COLUMNS, GPU, "gpu_minute"),
        ):
            topic = k.topic(suffix)
            self.pipelines[topic] = TopicPipeline(
                topic=topic, table=table,
                decoder=BatchDecoder(event_type, settings.max_record_bytes),
                columns=columns, windows=MinuteWindows(spec, lateness_ms, int(settings.idle_timeout_s * 1000)),
                alignment=WatermarkAlignment(int(drift_s * 1000)) if drift_s > 0 else None,
            )
        self.dead_letters: list[deadletter.DeadLetter] = []
        self.next_offsets: dict[tuple[str, int], int] = {}
        self.events_seen = 0
        self.buckets_closed = 0
        self.minutes_closed = 0  # request minutes closed (the bench's cost per closed minute)
        self.last_batch_wall = time.monotonic()
        self._stop = False
        self._stored_offsets: dict[tuple[str, int], int] = {}
        self._assigned_at: float | None = None
        self._unassigned_since: float | None = None  # holding no partition since (monotonic)
        self._last_group_rescue = 0.0
        self._embedded_broker: bool | None = None  # whether the cluster is the embedded broker, once asked
        self._stored_frontiers: dict[str, int | None] = {}
        self._topic_partitions: dict[str, set[int]] = {}  # every partition of each input topic (metadata)
        self._partitions_checked = 0.0
        self._publish_failures_logged: set[tuple[str, str]] = set()
        self.slo = SloStage(settings.slos, settings.alertmanager_urls, settings.alert_links) if settings.slos else None
        if self.slo:
            self.metrics.registry.register(self.slo.collector)
        self.stages = list(settings.stages)
        for stage in self.stages:
            for collector in stage.collectors():
                self.metrics.registry.register(collector)
        paging = [s.alerts for s in (self.slo, *self.stages) if isinstance(getattr(s, "alerts", None), FiringAlerts)]
        self.metrics.registry.register(DeliveryCollector(paging))
        # The signal API's view: rebuilt every few seconds in this thread, read by HTTP threads.
        self.live = LiveSignals(settings.api_config.policy, settings.slos, settings.prices) \
            if settings.http_port is not None else None
        self.signal_snapshot: SignalSnapshot | None = None
        if self.live:
            self.stages.append(SignalStage(self.live))
        self._caught_up_wall: float | None = None
        self._view_dirty = True  # events or closed minutes since the signal view was last built
        self.lag_messages = 0
        self.stage_cpu_s: dict[str, float] = {}
        self.first_event_wall: float | None = None
        self.cpu_at_first_event: float | None = None
        self.last_event_wall: float | None = None

    # ---- lifecycle ------------------------------------------------------------------
    MAX_VIEW_AGE_S = 30.0  # while draining a backlog, the signal API's view is rebuilt at least this often
    HEARTBEAT_S = 10.0  # an idle worker tells its HTTP process this often that the view still holds
    # (or a quarter of the staleness bound, if that is shorter: a view between heartbeats must
    # never look stale, or a pool that went quiet would be reported as a stale worker)

    def stop(self, *_args) -> None:
        self._stop = True

    def health(self) -> dict:
        return {
            "status": "ok",
            "events_seen": self.events_seen,
            "partitions_owned": sum(len(p.assigned) for p in self.inputs.values()),
            "seconds_since_last_batch": round(time.monotonic() - self.last_batch_wall, 3),
        }

    writes_store = True  # tier 1 writes none: it needs no store lock

    def run(self) -> int:
        """Run until stopped (or drained, with `until_idle_s`); the store file is this
        process's alone meanwhile (store/lock.py)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(sig, self.stop)
            except ValueError:  # not the main thread (tests run the worker in one)
                pass
        lock = StoreLock(self.settings.store_path) if self.writes_store else None
        try:
            if lock is not None:
                lock.acquire()
            return self._run(self.settings.http_port)
        finally:
            if lock is not None:
                lock.release()

    def _run(self, http_port: int | None) -> int:
        s = self.settings
        ensure_topics(s.kafka, s.partitions)
        http = None
        if http_port is not None:
            # Before the store: restoring it takes seconds on a big fleet (5 s at 20,000 slices,
            # bench --tiers), and a poller is better told "starting" (503) than refused.
            http = WorkerHttp(http_port, self.metrics.registry, self.health, host=s.http_host, api_config=s.api_config,
                              on_restart=self.metrics.http_restarts.inc)
            self.http_port = http.port
            log.info("serving /metrics, /healthz and the signal API on %s:%d", s.http_host, http.port)
        try:
            self._open_store()
        except BaseException:
            if http:
                http.stop()
            raise
        self.producer = make_producer(s.kafka, on_refused=lambda topic, reason: self._publish_failed(topic)(reason))
        consumer = make_consumer(s.kafka, s.group_id, s.instance_id)
        self._unassigned_since = time.monotonic()
        self._join(consumer)
        self._refresh_partitions(consumer)
        last_checkpoint = time.monotonic()
        last_refresh = last_publish = 0.0
        published_ready = False
        refresh_every_s = s.signals_refresh_s
        last_progress = time.monotonic()
        idle_since = time.monotonic()
        started = time.monotonic()
        undrained: list[str] = []
        # Modules, the restored state and the clients live as long as the run: out of the
        # collector's sight, a full collection costs milliseconds rather than 40 (measured on
        # the Mooncake sparse bench: 11 full collections took 0.47 of 5.8 CPU-s, then 0.06).
        # Collected first, so that no garbage is frozen with them.
        gc.collect()
        gc.freeze()
        try:
            while not self._stop:
                msgs = consumer.consume(num_messages=s.batch_size, timeout=0.5)
                got = self._process(msgs)
                now = time.monotonic()
                self._align_partitions(consumer, now)
                if got:
                    self._view_dirty = True
                    idle_since = now
                    self.last_batch_wall = now
                    if self.first_event_wall is None:
                        self.first_event_wall = now
                        self.cpu_at_first_event = time.process_time()
                    self.last_event_wall = now
                if now - last_checkpoint >= s.checkpoint_interval_s or (not got and self._has_unsaved()):
                    self.checkpoint(consumer, close_all=False)
                    last_checkpoint = now
                # While draining a backlog the view waits, up to MAX_VIEW_AGE_S:
                # the API is not ready then anyway, and each rebuild costs as much as
                # tens of thousands of events.
                backlogged = self.lag_messages > s.batch_size and now - last_refresh < self.MAX_VIEW_AGE_S
                if http and self.live and now - last_refresh >= refresh_every_s and not backlogged and self._view_dirty:
                    began = time.monotonic()
                    self.refresh_signals()
                    self._view_dirty = False
                    ready = self.readiness()
                    http.publish(HttpState(self.signal_snapshot, ready))
                    published_ready = ready[0]
                    last_refresh = last_publish = time.monotonic()
                    # At most a tenth of the worker's time goes to the view.
                    refresh_every_s = max(s.signals_refresh_s, 10 * (last_refresh - began))
                elif http:
                    # Nothing changed but time, or readiness (a worker that just caught up is
                    # ready now, not at the next heartbeat): say the view still holds instead
                    # of rebuilding it.
                    ready = self.readiness()
                    if ready[0] != published_ready or now - last_publish >= min(self.HEARTBEAT_S, s.api_config.stale_after_s / 4):
                        http.publish(HttpState(None, ready, view_unchanged=True))
                        published_ready = ready[0]
                        last_publish = now
                if self.slo:
                    self.slo.deliver()
                for stage in self.stages:
                    stage.deliver()
                self.store.release_if_due()
                if s.progress and now - last_progress >= 1.0:
                    s.progress(self._progress_line(now - started))
                    last_progress = now
                if now - self._partitions_checked >= 30:
                    self._refresh_partitions(consumer)  # topics may gain partitions
                self._rescue_group_if_wedged(consumer, now)
                if self._assigned_at is None:
                    if now - started > 60:
                        raise RuntimeError("the consumer group gave this worker no partitions within 60 s")
                    idle_since = now  # the group join takes a few seconds: idle time counts from assignment
                elif s.until_idle_s is not None and now - max(idle_since, self._assigned_at) >= s.until_idle_s:
                    # Drained means every partition of every input topic read to its end by
                    # this worker; closing all minutes on less would cut them short.
                    undrained = self._undrained(consumer)
                    if not undrained or now - max(idle_since, self._assigned_at) >= s.until_idle_s + s.drain_timeout_s:
                        break
            self.checkpoint(consumer, close_all=s.until_idle_s is not None and not self._stop and not undrained)
            if self.slo:
                self.slo.deliver(wait_s=10.0)
            for stage in self.stages:
                stage.deliver(wait_s=10.0)
            if s.progress:
                s.progress(self._progress_line(time.monotonic() - started))
        finally:
            gc.unfreeze()  # a run inside a longer process (tests, the demo) hands them back
            consumer.close()
            self.producer.flush(10)
            self.producer = None  # its threads would keep dialling a broker that may be gone
            if http:
                http.stop()
            self.store.close()
            if s.stats_file:
                self._write_stats(s.stats_file)
        if undrained and not self._stop:
            raise NotDrained(f"not drained after {s.until_idle_s + s.drain_timeout_s:.0f} s: " + "; ".join(undrained))
        return 0

    @property
    def inputs(self) -> dict[str, TopicPipeline]:
        """The topics this worker consumes (a tier-2 worker reads other topics than it windows)."""
        return self.pipelines

    def _open_store(self) -> None:
        """Open the store, restore open minutes and offsets, and rebuild every stage's state."""
        self.store = store.StoreSession(self.settings.store_path, self.settings.store_release_s)
        with self.store as con:
            self._restore(con)
            if self.slo:
                self.slo.rebuild(con)
            for stage in self.stages:
                stage.rebuild(con)

    def refresh_signals(self) -> None:
        """Rebuild the signal API's view from kept buckets plus a peek at open minutes."""
        started = time.process_time()
        windows = {p.table: p.windows for p in self.pipelines.values()}
        states = list(self.slo.evaluator.states.values()) if self.slo else []
        self.signal_snapshot = self.live.snapshot(windows["sli_minute"].peek(), windows["gpu_minute"].peek(), states,
                                                  wall_s=time.time())
        self._stage_cpu("signals_view", started)

    def readiness(self) -> tuple[bool, str]:
        """Ready when the worker owns every requests partition (a pool's traffic spans them),
        the API has a view, and the worker was caught up (lag within one batch) within the
        staleness bound."""
        bound = self.settings.api_config.stale_after_s
        if self._assigned_at is None:
            return False, "waiting for the consumer group to assign partitions"
        whole_topic = self._whole_topic()
        owned = len(self.inputs[whole_topic].assigned)
        total = len(self._topic_partitions.get(whole_topic, ()))
        if owned < total:
            return False, (f"this worker owns {owned} of {total} partitions of {whole_topic}: "
                           "its answers would count part of each pool's traffic")
        if self.signal_snapshot is None:
            return False, "building the first view of the data"
        if self._caught_up_wall is None:
            return False, f"catching up: {self.lag_messages:,} messages behind"
        behind = time.time() - self._caught_up_wall
        if behind > bound:
            return False, f"{self.lag_messages:,} messages behind; last caught up {behind:.0f} s ago (bound {bound:.0f} s)"
        return True, "caught up"

    def _whole_topic(self) -> str:
        """The topic the signal API must own every partition of to answer for a whole pool."""
        return self.settings.kafka.topic(TOPIC_REQUESTS)

    def _write_stats(self, path: str) -> None:
        import json
        import resource

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
                "stage_cpu_seconds": self.stage_cpu_s,
                "minutes_closed": self.minutes_closed,
            }, fh)

    def _progress_line(self, elapsed_s: float) -> str:
        rate = self.events_seen / elapsed_s if elapsed_s > 0 else 0.0
        return f"worker: {self.events_seen:,} events ({rate:,.0f}/s), {self.buckets_closed:,} buckets closed"

    def _restore(self, con) -> None:
        # Event time accepted is at most its record's time plus the bound; a record's time is
        # at most about now. State past that came from a record refused today (`future`),
        # accepted by an older release: repaired here, once, before anything is read.
        bound_ms = int(time.time() * 1000) + self._max_ahead_ms
        for p in self.pipelines.values():
            r = store.load_topic_state(con, p.topic)
            p.windows.restore(r.counts, r.hist, r.seen, r.watermarks, r.closed_before_minute)
            for line in p.windows.repair_event_time(bound_ms, store.newest_minute(con, p.table)):
                log.warning("%s: %s (event time past %s cannot come from an accepted event)", p.topic, line,
                            utc_text(bound_ms))
        self._stored_offsets = store.load_offsets(con)
        self.next_offsets = dict(self._stored_offsets)

    def _join(self, consumer) -> None:
        """Consume the inputs as a member of the group: partitions may be shared, and move."""
        consumer.subscribe(list(self.inputs), on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer, partitions: list[TopicPartition]) -> None:
        self._assigned_at = time.monotonic()
        if partitions:
            self._unassigned_since = None
        self._refresh_partitions(consumer)
        for tp in partitions:
            tp.offset = self._stored_offsets.get((tp.topic, tp.partition), OFFSET_BEGINNING)
            if tp.topic in self.inputs:
                self.inputs[tp.topic].assigned.add(tp.partition)
        consumer.assign(partitions)

    def _on_revoke(self, consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic in self.inputs:
                self.inputs[tp.topic].assigned.discard(tp.partition)
                self.inputs[tp.topic].eof.discard(tp.partition)
        if not any(p.assigned for p in self.inputs.values()):
            self._unassigned_since = time.monotonic()

    GROUP_RESCUE_AFTER_S = 15.0  # a rebalance takes a few seconds; three times the session timeout and more is not one

    def _rescue_group_if_wedged(self, consumer, now: float) -> None:
        """Holding no partition for a while: see whether the group is wedged on a departed
        leader (a bug of the embedded broker, see `rescue_wedged_group`) and free it."""
        since = self._unassigned_since
        if since is None or now - since < self.GROUP_RESCUE_AFTER_S or now - self._last_group_rescue < self.GROUP_RESCUE_AFTER_S:
            return
        self._last_group_rescue = now
        s = self.settings
        if self._embedded_broker is None:  # asked once: only the embedded broker wedges groups so
            self._embedded_broker = is_embedded(s.kafka.bootstrap_servers, s.kafka.base_config())
        if not self._embedded_broker:
            return
        done = rescue_wedged_group(s.kafka.bootstrap_servers, s.group_id, list(self.pipelines), consumer.memberid())
        if done:
            self.metrics.group_rescues.inc()
            log.warning("%s", done)

    def _refresh_partitions(self, consumer) -> None:
        """Every partition of each input topic, from the cluster's metadata."""
        self._partitions_checked = time.monotonic()
        for topic in self._watched_topics():
            try:
                meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            except Exception as exc:  # metadata is retried on the next tick; the last known set stays
                log.warning("cannot read the partitions of %s: %s", topic, exc)
                continue
            if meta is not None and meta.error is None and meta.partitions:
                self._topic_partitions[topic] = set(meta.partitions)

    def _watched_topics(self) -> list[str]:
        """Topics whose partition sets the worker keeps track of."""
        return list(self.inputs)

    def _partitions_of(self, p: TopicPipeline) -> set[int]:
        """Every partition whose minutes this worker's buckets must wait for: the topic's
        partitions per metadata, plus any it owns or holds a watermark of."""
        held = set(p.windows.watermark_ms) if p.windows is not None else set()
        return self._topic_partitions.get(p.topic, set()) | p.assigned | held

    def _read_to_end(self, consumer, p: TopicPipeline) -> set[int]:
        """Owned partitions consumed up to the log end (EOF seen, or position ≥ high watermark)."""
        return (p.eof & p.assigned) | {part for part, (position, end) in self._positions(consumer, p).items()
                                       if position >= end}

    def _positions(self, consumer, p: TopicPipeline) -> dict[int, tuple[int, int]]:
        """Owned partitions without an EOF seen whose log end is known: partition → (read position, log end)."""
        out = {}
        for part in p.assigned - p.eof:
            try:
                # Cached: the high offset arrives with every fetch response, no extra request.
                low, high = consumer.get_watermark_offsets(TopicPartition(p.topic, part), cached=True)
            except Exception:  # unknown yet: not read to its end
                continue
            if high >= 0:
                out[part] = (self.next_offsets.get((p.topic, part), low), high)
        return out

    def _align_partitions(self, consumer, now: float) -> None:
        """Pause partitions read too far ahead of their topic's slowest, resume them as it
        catches up (streams/alignment.py): a backlog drains without holding tens of minutes open."""
        for p in self.inputs.values():
            a = p.alignment
            if a is None:
                continue
            to_read = {part: position for part, (position, end) in self._positions(consumer, p).items() if position < end}
            pause, resume = a.decide(p.windows.watermark_ms, to_read, now)
            if pause:
                consumer.pause([TopicPartition(p.topic, part) for part in sorted(pause)])
            if resume & p.assigned:
                consumer.resume([TopicPartition(p.topic, part) for part in sorted(resume & p.assigned)])
            self.metrics.partitions_paused.labels(p.topic).set(len(a.paused))

    def _undrained(self, consumer) -> list[str]:
        """Why the worker is not drained: partitions not owned or not read to their end."""
        out = []
        for p in self.inputs.values():
            if p.topic not in self._topic_partitions:
                out.append(f"{p.topic}: the cluster has not said which partitions it has")
                continue
            done = self._read_to_end(consumer, p)
            missing = sorted(self._partitions_of(p) - p.assigned)
            behind = sorted(p.assigned - done)
            if missing:
                out.append(f"{p.topic} partitions {missing} are not assigned to this worker")
            if behind:
                out.append(f"{p.topic} partitions {behind} are not read to their end")
        return out

    # ---- the hot path ---------------------------------------------------------------
    def _process(self, msgs) -> int:
        if not msgs:
            return 0
        # List comprehensions over the C accessors: a statement-per-message loop costs
        # twice as much, and this is the hottest loop of the worker.
        errors = [m.error() for m in msgs]
        if any(e is not None for e in errors):
            for m, err in zip(msgs, errors):
                if err is None:
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    p = self.inputs.get(m.topic())
                    if p is not None:
                        p.eof.add(m.partition())
                elif err.fatal():  # e.g. fenced: another process took this worker's static membership
                    raise RuntimeError(f"Kafka consumer failed: {err.str()}")
                else:
                    log.warning("consumer error: %s", err)
            msgs = [m for m, e in zip(msgs, errors) if e is None]
        topics = [m.topic() for m in msgs]
        first = topics[0] if topics else None
        if all(t == first for t in topics):
            if msgs:
                self._process_topic(self.inputs[first], msgs)
        else:
            for topic in set(topics):
                self._process_topic(self.inputs[topic], [m for m, t in zip(msgs, topics) if t == topic])
        self.events_seen += len(msgs)
        return len(msgs)

    def _process_topic(self, p: TopicPipeline, batch: list) -> None:
        values = [m.value() for m in batch]
        partitions = [m.partition() for m in batch]
        offsets = [m.offset() for m in batch]
        record_ts = [m.timestamp()[1] for m in batch]  # -1 where the record has none
        # Offsets rise within a partition, so the last one seen per partition is its highest.
        for part, last in dict(zip(partitions, offsets)).items():
            key = (p.topic, part)
            if last + 1 > self.next_offsets.get(key, -1):
                self.next_offsets[key] = last + 1
        p.eof.difference_update(partitions)
        decoded = p.decoder.decode(values)
        frame, bad_ts = records_to_frame(decoded.records, p.columns, partitions, offsets, decoded.indices,
                                         record_ts, self._max_ahead_ms)
        rejected = decoded.rejected + bad_ts
        outcome = p.windows.add(frame)
        m = self.metrics
        for r in rejected:
            self._dead_letter(p.topic, batch[r.index], r.reason, r.detail)
        for i in outcome.late_index:
            self._dead_letter(p.topic, batch[i], LATE, "older than the allowed lateness")
        m.events.labels(p.topic, "accepted").inc(outcome.accepted)
        m.events.labels(p.topic, "rejected").inc(len(rejected))
        m.events.labels(p.topic, "late").inc(len(outcome.late_index))
        m.events.labels(p.topic, "duplicate").inc(outcome.duplicates)
        m.late_events.labels(p.topic).inc(len(outcome.late_index))
        if decoded.unknown_fields_dropped:
            m.unknown_fields_dropped.labels(p.topic).inc(decoded.unknown_fields_dropped)

    def _dead_letter(self, topic: str, msg, reason: str, detail: str) -> None:
        _kind, ts_ms = msg.timestamp()
        letter = deadletter.make(topic, msg.partition(), msg.offset(), reason, detail, msg.value(), ts_ms)
        self.dead_letters.append(letter)
        self.metrics.dead_letters.labels(topic, reason).inc()

    # ---- checkpoint ------------------------------------------------------------------
    def _has_unsaved(self) -> bool:
        return bool(self.dead_letters) or any(
            p.windows.unsaved.counts or p.windows.unsaved.seen for p in self.pipelines.values()
        ) or self.next_offsets != self._stored_offsets

    def checkpoint(self, consumer, close_all: bool) -> None:
        started = time.monotonic()
        topics = []
        for p in self.pipelines.values():
            w = p.windows
            if close_all:
                before = None
            elif p.topic not in self._topic_partitions:
                before = None  # until the cluster has said which partitions exist, any may hold anything
            else:
                before = w.closable_before(self._partitions_of(p), self._read_to_end(consumer, p))
            if close_all or (before is not None and (w.closed_before_minute is None or before > w.closed_before_minute)):
                began = time.process_time()
                rows, minutes = w.close(before)
                self._stage_cpu("close_buckets", began)
                if rows.height:
                    self._view_dirty = True
                    self._publish_closed(p, rows)
                    self.metrics.buckets_closed.labels(p.topic).inc(rows.height)
                    self.buckets_closed += rows.height
                    if p.table == "sli_minute":
                        self.minutes_closed += len(minutes)
                    wall = time.time()
                    for minute in minutes:
                        self.metrics.bucket_close_delay.labels(p.topic).observe(max(0.0, wall - (minute + 1) * 60))
            else:
                rows, minutes = pl.DataFrame(), []
            unsaved = w.take_unsaved()
            topics.append(store.TopicCheckpoint(
                topic=p.topic, table=p.table, closed=rows, closed_minutes=minutes,
                counts=unsaved.counts, hist=unsaved.hist, seen=unsaved.seen,
                watermarks=dict(w.watermark_ms), closed_before_minute=w.closed_before_minute,
            ))
        letters = self.dead_letters
        frontiers = {t.topic: t.closed_before_minute for t in topics}
        nothing_new = not letters and self.next_offsets == self._stored_offsets and frontiers == self._stored_frontiers \
            and all(not t.closed.height and not t.counts and not t.seen for t in topics)
        if nothing_new and not close_all:
            self._update_gauges(consumer)  # idle: leave the store file to its readers
            return
        self.dead_letters = []
        dlq = self.settings.kafka.topic(TOPIC_DEADLETTER)
        for d in letters:
            send(self.producer, dlq, deadletter.encode(d), d.source_topic.encode(), on_error=self._publish_failed(dlq))
        self._flush_copies()
        cp = store.Checkpoint(
            topics=topics, next_offsets=dict(self.next_offsets),
            dead_letters=deadletter.to_frame(letters) if letters else None,
        )
        self._commit(consumer, cp, started)

    def _commit(self, consumer, cp: store.Checkpoint, started: float) -> None:
        """Run the SLOs and stages on the checkpoint's closed minutes and write it all in one
        transaction; then hand out what the stages raised."""
        closed = {t.table: t.closed for t in cp.topics}
        # Minutes close over every partition, so each closed minute is whole: SLOs and
        # detectors run on it whichever partitions this worker owns right now.
        if self.slo:
            began = time.process_time()
            cp.slo_status, cp.alert_changes = self.slo.evaluate(closed["sli_minute"])
            cp.stage_rows.extend(self.slo.outbox_rows())
            self._stage_cpu("slo", began)
        if any(f.height for f in closed.values()):
            for stage in self.stages:
                began = time.process_time()
                for table, rows in stage.on_closed(closed["sli_minute"], closed["gpu_minute"]).items():
                    cp.stage_rows.append((table, rows))
                self._stage_cpu(stage.name, began)
        began = time.process_time()
        try:
            with self.store as con:
                store.write_checkpoint(con, cp)
        except duckdb.Error as exc:  # the disk filled, the file broke: one line, not a traceback
            raise store.store_failure(self.settings.store_path, exc) from None
        self._stage_cpu("checkpoint_write", began)
        if self.slo:
            self.slo.committed(cp.alert_changes)
        for stage in self.stages:
            stage.committed()
        self._stored_offsets = dict(cp.next_offsets)
        self._stored_frontiers = {t.topic: t.closed_before_minute for t in cp.topics}
        self.metrics.checkpoint_seconds.observe(time.monotonic() - started)
        self._update_gauges(consumer)

    def _stage_cpu(self, stage: str, began: float) -> None:
        spent = time.process_time() - began
        self.stage_cpu_s[stage] = self.stage_cpu_s.get(stage, 0.0) + spent
        self.metrics.stage_cpu_seconds.labels(stage).inc(spent)

    def _publish_failed(self, topic: str) -> Callable[[str], None]:
        def failed(reason: str) -> None:
            self.metrics.publish_failures.labels(topic, reason).inc()
            if (topic, reason) not in self._publish_failures_logged:  # once per kind: poison can come in floods
                self._publish_failures_logged.add((topic, reason))
                log.warning("Kafka refused a record for %s (%s); the store keeps it, the worker goes on", topic, reason)
        return failed

    def _flush_copies(self) -> None:
        """Dead letters and closed buckets reach their topics before the checkpoint that covers
        them commits (at least once): wait for a paused or unreachable broker rather than
        commit past copies that were never delivered. A record Kafka refused for good is
        done (counted by `_publish_failed`), so this ends once the broker answers."""
        waited_s = 0.0
        while self.producer.flush(5.0) > 0:
            waited_s += 5.0
            if self._stop and waited_s >= 30.0:
                log.error("stopping with %d records not delivered to Kafka", len(self.producer))
                return
            if waited_s % 30.0 == 0:
                log.warning("waiting %.0f s for Kafka to take %d records", waited_s, len(self.producer))

    def _publish_closed(self, p: TopicPipeline, rows: pl.DataFrame) -> None:
        if not self.settings.publish_sli:
            return
        sli = self.settings.kafka.topic(TOPIC_SLI)
        keys = [k for k in p.windows.spec.keys if k in rows.columns]
        lines = rows.with_columns(
            pl.lit(f"{p.windows.spec.name}_minute.v1").alias("schema"),
            pl.col("window_start").dt.epoch("ms").alias("window_start"),
        ).write_ndjson().encode().splitlines()
        failed = self._publish_failed(sli)
        for key, line in zip(sli_keys(rows, keys), lines):
            send(self.producer, sli, line, key, on_error=failed)

    def _update_gauges(self, consumer) -> None:
        m = self.metrics
        lag_total, lag_known = 0, True
        for p in self.inputs.values():
            w = p.windows
            if w is not None:
                if w.watermark_ms:
                    m.watermark.labels(p.topic).set(min(w.watermark_ms.values()) / 1000)
                m.open_minutes.labels(p.topic).set(len(w.open_minutes()))
                m.dedupe_ids.labels(p.topic).set(w.dedupe_ids)
            for part in sorted(p.assigned):
                try:
                    # Cached: the high offset arrives with every fetch response, no extra request.
                    _low, high = consumer.get_watermark_offsets(TopicPartition(p.topic, part), cached=True)
                except Exception:  # lag is best-effort telemetry; never stop the worker for it
                    lag_known = False
                    continue
                if high < 0:
                    lag_known = False
                    continue
                pos = self.next_offsets.get((p.topic, part), 0)
                m.consumer_lag.labels(p.topic, str(part)).set(max(0, high - pos))
                lag_total += max(0, high - pos)
        self.lag_messages = lag_total
        if lag_known and lag_total <= self.settings.batch_size and self._assigned_at is not None:
            self._caught_up_wall = time.time()


def run_worker(settings: WorkerSettings) -> int:
    return Worker(settings).run()

