"""`tailwatch backtest autoscale|rollout`: replay the store's closed minutes through the
signal API's own decisions, so a user can see what it would have said before wiring an
autoscaler or a rollout controller to it.

Read only: the store is opened read-only (a running worker may hold it; DuckDB lets readers
in between its checkpoints). The replay is the worker's: as of minute m, minutes before m are
closed (`LiveSignals.add_closed`, as `streams/signal_stage.py` feeds it) and minute m is the
one still filling (`LiveSignals.snapshot`'s open rows). The answer at m is what a poller
would have read during minute m. SLO pages are not replayed (the burn rate a pool answer
carries is left out); everything else is the live code path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterator

import polars as pl

from tailwatch.alerts.alertmanager import rfc3339
from tailwatch.reports import cost_report
from tailwatch.signals.held import rollup
from tailwatch.signals.live import LiveSignals, SignalPolicy, SignalSnapshot, pool_minutes
from tailwatch.signals.rollout import CanaryStory, VerdictStep, canary_story
from tailwatch.planning.prices import GpuPrices
from tailwatch.slo.spec import SloSpec
from tailwatch.slo.alert_windows import minute_text
from tailwatch.store.connection import connect
from tailwatch.store.queries import has_table, query_frame

_EPOCH = datetime(1970, 1, 1)


class BacktestError(ValueError):
    """Nothing to replay, or a bad bound (one line for the user)."""


def parse_time(text: str | None) -> datetime | None:
    """RFC 3339 (or a date) → naive UTC, as the store keeps its TIMESTAMPs (the cost
    report's parser: one reading of --from/--to across commands)."""
    if text is None:
        return None
    try:
        return cost_report.parse_time(text)
    except cost_report.ReportError as exc:
        raise BacktestError(str(exc)) from None


def _minute_of(ts: datetime) -> int:
    return int((ts - _EPOCH).total_seconds()) // 60


def read_buckets(store_path: str, start: datetime | None = None, end: datetime | None = None,
                 pools: list[str] | None = None, models: list[str] | None = None,
                 warmup_minutes: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`sli_minute` and `gpu_minute` rows in [start − warmup, end), optionally of some pools
    or models only, from a read-only connection."""
    con = connect(store_path, read_only=True, wait_s=30.0)
    try:
        _refuse_rolled(con, start, warmup_minutes)
        out = []
        for table, label in (("sli_minute", "pool"), ("gpu_minute", "pool")):
            where, params = [], []
            if start is not None:
                where.append("window_start >= CAST(? AS TIMESTAMP) - to_minutes(CAST(? AS INTEGER))")
                params += [start, warmup_minutes]
            if end is not None:
                where.append("window_start < CAST(? AS TIMESTAMP)")
                params.append(end)
            if pools:
                where.append(f"{label} IN ({', '.join('?' for _ in pools)})")
                params += pools
            if models:
                where.append(f"model IN ({', '.join('?' for _ in models)})")
                params += models
            sql = f"SELECT * FROM {table}" + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY window_start"
            out.append(query_frame(con, sql, params))
        return out[0], out[1]
    finally:
        con.close()


def _refuse_rolled(con, start: datetime | None, warmup_minutes: int) -> None:
    """Replays need minutes: a range reaching back into hours rolled up (streams/rollup.py) is
    refused in one line naming where the minutes begin."""
    if start is None or not has_table(con, "rolled_minute"):
        return
    rolled = con.execute("SELECT max(window_start) FROM rolled_minute").fetchall()[0][0]
    if rolled is not None and start - timedelta(minutes=warmup_minutes) <= rolled:
        first = rolled + timedelta(minutes=1)
        raise BacktestError(f"minutes before {first:%Y-%m-%dT%H:%MZ} are rolled up into hours (--minute-retention) and "
                            f"replays need minutes: start at {first:%Y-%m-%dT%H:%MZ} or later")


def minutes_of(frame: pl.DataFrame) -> dict[int, pl.DataFrame]:
    """A bucket frame split by its minute (epoch minutes)."""
    if frame.height == 0:
        return {}
    f = frame.with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_bt_m"))
    return {int(m): part.drop("_bt_m") for (m,), part in f.partition_by("_bt_m", as_dict=True).items()}


def replay(requests: pl.DataFrame, gpu: pl.DataFrame, policy: SignalPolicy | None = None,
           specs: list[SloSpec] | None = None, prices: GpuPrices | None = None,
           live: LiveSignals | None = None) -> Iterator[tuple[int, SignalSnapshot]]:
    """(minute, snapshot) for every minute from the first bucket to the last: minutes before
    it closed, it still open, as the worker's signal stage would have served them."""
    live = live or LiveSignals(policy or SignalPolicy(), specs, prices or GpuPrices())
    req, gp = minutes_of(requests), minutes_of(gpu)
    minutes = sorted({*req, *gp})
    if not minutes:
        return
    empty = pl.DataFrame()
    for m in range(minutes[0], minutes[-1] + 1):
        if m - 1 in req or m - 1 in gp:
            live.add_closed(req.get(m - 1, empty), gp.get(m - 1, empty))
        open_req, open_gpu = req.get(m, empty), gp.get(m, empty)
        yield m, live.snapshot(open_req, open_gpu, [], wall_s=60.0 * (m + 1))


# ---- autoscale -----------------------------------------------------------------------------

@dataclass
class PoolBacktest:
    pool: str
    gpu_sku: str = ""
    minutes: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    desired: list[int] = field(default_factory=list)
    waited: list[int] = field(default_factory=list)  # minutes whose queue age or first output p95 broke its SLO
    usd_per_replica_hour: float = 0.0

    @property
    def replica_hours_added(self) -> float:
        return sum(max(0, d - r) for d, r in zip(self.desired, self.running)) / 60

    @property
    def replica_hours_saved(self) -> float:
        return sum(max(0, r - d) for d, r in zip(self.desired, self.running)) / 60

    @property
    def replica_hours_running(self) -> float:
        return sum(self.running) / 60

    def to_row(self) -> list:
        def span(xs):
            return "-" if not xs else (f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}-{max(xs)}")

        def mean(xs):
            return "-" if not xs else f"{sum(xs) / len(xs):.1f}"

        return [self.pool, len(self.minutes), f"{mean(self.running)} ({span(self.running)})",
                f"{mean(self.desired)} ({span(self.desired)})",
                sum(d > r for d, r in zip(self.desired, self.running)), sum(d < r for d, r in zip(self.desired, self.running)),
                len(self.waited), f"{self.replica_hours_running:.2f}", f"{self.replica_hours_added:.2f}",
                f"{self.replica_hours_saved:.2f}",
                f"{(self.replica_hours_added - self.replica_hours_saved) * self.usd_per_replica_hour:+.2f}"]


AUTOSCALE_COLUMNS = ["pool", "minutes", "running (range)", "desired (range)", "min_desired_above", "min_desired_below",
                     "waited_min", "replica_h_run", "replica_h_added", "replica_h_saved", "usd_net"]


def backtest_autoscale(requests: pl.DataFrame, gpu: pl.DataFrame, policy: SignalPolicy | None = None,
                       specs: list[SloSpec] | None = None, prices: GpuPrices | None = None,
                       pools: list[str] | None = None, start_minute: int | None = None) -> dict[str, PoolBacktest]:
    """Per pool, minute by minute from `start_minute` (earlier rows only warm the view up):
    the replicas running, the replicas the autoscaler asked for, and the minutes users waited."""
    policy = policy or SignalPolicy()
    prices = prices or GpuPrices()
    live = LiveSignals(policy, specs, prices)
    out: dict[str, PoolBacktest] = {}
    for m, snap in replay(requests, gpu, live=live):
        if start_minute is not None and m < start_minute:
            continue
        for pool, scoped in snap.pools.items():
            if pools and pool not in pools:
                continue
            body = scoped.body
            if scoped.as_of_minute != m:
                continue  # the pool sent nothing this minute: no new answer
            bt = out.setdefault(pool, PoolBacktest(pool))
            bt.minutes.append(m)
            bt.running.append(body.current_replicas)
            bt.desired.append(body.desired_replicas)
    # Waiting: per closed minute, queue-age p95 over the pool's GPUs or first-output p95 over
    # its SLO (the same test the capacity measurement uses).
    if requests.height and gpu.height and out:
        lo = min(min(bt.minutes) for bt in out.values())
        hi = max(max(bt.minutes) for bt in out.values())
        for pm in pool_minutes(rollup(requests), gpu, lo, hi, live.first_output_slo_ms, policy.autoscale.queue_age_slo_ms):
            if pm.pool in out and not pm.latency_held:
                out[pm.pool].waited.append(pm.minute)
        skus = dict(gpu.sort("window_start").group_by("pool").agg(pl.col("gpu_sku").drop_nulls().last()).iter_rows())
        for pool, bt in out.items():
            bt.gpu_sku = skus.get(pool) or ""
            bt.usd_per_replica_hour = prices.usd_per_gpu_second(bt.gpu_sku) * 3600 * policy.autoscale.gpus_per_replica
    return dict(sorted(out.items()))


def _ranges(minutes: list[int]) -> str:
    if not minutes:
        return "none"
    parts, start, prev = [], minutes[0], minutes[0]
    for m in minutes[1:] + [None]:
        if m is not None and m == prev + 1:
            prev = m
            continue
        parts.append(rfc3339(start)[11:16] + ("" if start == prev else f"-{rfc3339(prev + 1)[11:16]}"))
        if m is not None:
            start = prev = m
    return ", ".join(parts)


# ---- rollout -------------------------------------------------------------------------------

@dataclass(frozen=True)
class RolloutStep:
    minute: int
    verdict: str
    canary_requests: int
    decided_by: tuple[str, ...]
    confidence: float | None
    reason: str


@dataclass
class RolloutBacktest:
    model: str
    version: str
    steps: list[RolloutStep]

    def first(self, verdict: str) -> RolloutStep | None:
        return next((s for s in self.steps if s.verdict == verdict), None)

    def story(self) -> CanaryStory | None:
        """The worst verdict of the window, with its metric, and the verdict now."""
        return canary_story([VerdictStep(s.minute, s.verdict, s.reason, s.decided_by) for s in self.steps])

    @property
    def canary_start(self) -> int | None:
        return self.steps[0].minute if self.steps else None


def backtest_rollout(requests: pl.DataFrame, gpu: pl.DataFrame, model: str, version: str,
                     policy: SignalPolicy | None = None, prices: GpuPrices | None = None,
                     start_minute: int | None = None) -> RolloutBacktest:
    steps = []
    for m, snap in replay(requests, gpu, policy, None, prices):
        if start_minute is not None and m < start_minute:
            continue
        answer = snap.rollouts.get((model, version))
        if answer is None:
            continue
        b = answer.body
        steps.append(RolloutStep(m, b.verdict, b.canary.requests if b.canary else 0, tuple(b.decided_by or ()),
                                 b.confidence or None, (b.reasons or [""])[0]))
    return RolloutBacktest(model, version, steps)


# ---- the commands --------------------------------------------------------------------------

def time_bounds(start: str | None, end: str | None) -> tuple[datetime | None, datetime | None]:
    """--from and --to as naive UTC, the end after the start (the backtests' and the drill's)."""
    a, b = parse_time(start), parse_time(end)
    if a is not None and b is not None and b <= a:
        raise BacktestError(f"--to {end} is not after --from {start}")
    return a, b


def cmd_backtest_autoscale(store_path: str, pools: list[str] | None, start: str | None, end: str | None,
                           specs: list[SloSpec] | None, per_minute: bool = False, fmt: str = "table") -> int:
    from tailwatch.table import render

    a, b = time_bounds(start, end)
    policy = SignalPolicy()
    warmup = policy.history_minutes
    req, gpu = read_buckets(store_path, a, b, pools, warmup_minutes=warmup)
    if not req.height and not gpu.height:
        raise BacktestError(f"{store_path}: no buckets{' for ' + ', '.join(pools) if pools else ''} in that span")
    result = backtest_autoscale(req, gpu, policy, specs, pools=pools,
                                start_minute=_minute_of(a) if a is not None else None)
    if not result:
        raise BacktestError("no pool answered in that span (pools come from gpu_minute and sli_minute rows)")
    first = min(min(bt.minutes) for bt in result.values())
    last = max(max(bt.minutes) for bt in result.values())
    print(f"autoscale backtest, {rfc3339(first)} to {rfc3339(last + 1)} ({last - first + 1} minutes), "
          f"{len(result)} pool(s); desired = the autoscaler's answer during each minute, running = replicas "
          f"reporting warm/loading; usd_net = (added − saved) replica-hours × GPU price × "
          f"{policy.autoscale.gpus_per_replica:g} GPU per replica")
    print(render(AUTOSCALE_COLUMNS, [bt.to_row() for bt in result.values()], fmt))
    if fmt == "table":
        for bt in result.values():
            print(f"\n{bt.pool} ({bt.gpu_sku or 'unknown SKU'}, ${bt.usd_per_replica_hour:.2f}/replica-hour): "
                  f"users waited in {len(bt.waited)} minute(s): {_ranges(bt.waited)}")
            if per_minute:
                waited = set(bt.waited)
                rows = [[rfc3339(m)[11:16], r, d, d - r, "waited" if m in waited else ""]
                        for m, r, d in zip(bt.minutes, bt.running, bt.desired)]
                print(render(["minute", "running", "desired", "change", "users"], rows))
    return 0


def cmd_backtest_rollout(store_path: str, model: str, version: str, start: str | None, end: str | None,
                         fmt: str = "table") -> int:
    from tailwatch.table import render

    a, b = time_bounds(start, end)
    policy = SignalPolicy()
    req, gpu = read_buckets(store_path, a, b, models=[model], warmup_minutes=policy.rollout_window_minutes)
    if not req.height:
        raise BacktestError(f"{store_path}: no requests of model {model!r} in that span")
    bt = backtest_rollout(req, gpu, model, version, policy, start_minute=_minute_of(a) if a is not None else None)
    if not bt.steps:
        versions = sorted(set(req["model_version"].drop_nulls().to_list()))
        raise BacktestError(f"{model} {version}: no traffic in that span (versions seen: {', '.join(versions) or 'none'})")
    rows = [[rfc3339(s.minute)[11:16], s.verdict, s.canary_requests, ",".join(s.decided_by) or "-",
             "-" if s.confidence is None else f"{s.confidence:.4f}", s.reason[:100]] for s in bt.steps]
    print(f"rollout backtest of {model} {version}, {rfc3339(bt.steps[0].minute)} to {rfc3339(bt.steps[-1].minute + 1)}")
    print(render(["minute", "verdict", "canary_requests", "decided_by", "confidence", "reason"], rows, fmt))
    if fmt == "table":
        print(f"{model} {version}: {bt.story().sentence(minute_text)}")
        for word in ("rollback", "promote", "pause"):
            s = bt.first(word)
            print(f"first {word}: " + ("never" if s is None else
                                        f"{rfc3339(s.minute)} ({s.minute - bt.canary_start} min after the canary's "
                                        f"first answer, {s.canary_requests:,} canary requests)"))
    return 0
