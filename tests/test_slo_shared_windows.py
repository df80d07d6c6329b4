"""SLOs that share a window table decide exactly what each SLO decides with a table of its
own: the same alert changes (minutes, values), `slo_status` rows and slice states, minute
by minute, in backlogs, with a minute's rows split over feeds, late rows and a restart."""

from __future__ import annotations

import dataclasses
import math

import msgspec
import numpy as np
import polars as pl
import pytest

from tailwatch.ingest.schema import RequestV1
from tailwatch.slo import engine, sli
from tailwatch.slo.sli import SloEvaluator, status_frame, window_table_key
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.frames import REQUEST_COLUMNS
from tailwatch_dev.simulator import FleetSimulator
from tests.h100_lab import buckets

# SLOs of their own beside the defaults: a low min_events and a short silence, so that thin
# minutes page and go silent, and a calendar-month SLO (a table of its own) on the same rows.
EXTRA = """
slos:
  - {name: llm-avail-thin, selector: {workload: llm, traffic_class: realtime}, sli: {availability: {}}, objective: 99%,
     slice_by: [zone], min_events: 3, no_data_after: 3m, young_window_share: 0.01}
  - {name: llm-first-token-thin, selector: {workload: llm, traffic_class: realtime},
     sli: {latency: {field: first_output_ms, threshold: 900ms}}, objective: 95%, slice_by: [zone, deployment],
     min_events: 3, no_data_after: 3m, young_window_share: 0.01}
  - {name: llm-avail-month, selector: {workload: llm, traffic_class: realtime}, sli: {availability: {}}, objective: 99%,
     window: calendar-month, slice_by: [zone], min_events: 3}
  - {name: asr-avail-week, selector: {workload: asr}, sli: {availability: {}}, objective: 99.5%, window: 7d,
     slice_by: [language], min_events: 3, young_window_share: 0.01}
"""


@pytest.fixture(scope="module")
def fleet_buckets() -> pl.DataFrame:
    sim = FleetSimulator("mixed-fleet", minutes=120, seed=7, rate_scale=0.2, eval_share=0.05)
    values = [msgspec.json.encode(e) for e in sim.events() if isinstance(e, RequestV1)]
    return buckets(values, RequestV1, REQUEST_COLUMNS, REQUESTS).sort("window_start")


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    path = tmp_path_factory.mktemp("slos") / "extra.yaml"
    path.write_text(EXTRA)
    return load_slos(DEFAULT_SLOS) + load_slos(path)


def test_the_default_slos_share_few_window_tables(specs):
    """The 14 defaults share one catalog: those that pick the same rows share a table."""
    shared = SloEvaluator(specs)
    tables = {id(t.shared) for t in shared.tables.values()}
    assert len(tables) < len(specs) - 5, len(tables)
    llm = [t for name, t in shared.tables.items() if name.startswith("llm-realtime-")]
    assert len(llm) == 4 and len({id(t.shared) for t in llm}) == 1
    assert window_table_key(next(s for s in specs if s.name == "llm-avail-month")) is None  # its own
    alone = SloEvaluator(specs, share_windows=False)
    assert len({id(t.shared) for t in alone.tables.values()}) == len(specs)


def _feeds(frame: pl.DataFrame, seed: int, thin: bool, takes=(1, 1, 1, 2, 4)) -> list[tuple[str, pl.DataFrame]]:
    """The buckets as a worker may see them: backlogs of a few minutes (`takes`: how many
    minutes a feed may close), a minute's rows split over two feeds, rows arriving late
    (corrections), and thin traffic (a few rows a minute)."""
    rng = np.random.default_rng(seed)
    if thin:
        frame = frame.filter(pl.Series(rng.random(frame.height) < 0.08))
    minutes = frame.partition_by("window_start", maintain_order=True)
    feeds: list[tuple[str, pl.DataFrame]] = []
    held: list[tuple[int, pl.DataFrame]] = []  # (feed index to arrive at, rows)
    at = 0
    while at < len(minutes):
        take = int(rng.choice(takes))
        chunk = pl.concat(minutes[at:at + take])
        at += take
        if rng.random() < 0.2 and chunk.height > 2:  # some rows late, a few feeds on
            late = pl.Series(rng.random(chunk.height) < 0.3)
            held.append((len(feeds) + int(rng.integers(1, 4)), chunk.filter(late)))
            chunk = chunk.filter(~late)
        if rng.random() < 0.2 and chunk.height > 2:  # the newest minute's rows in two shares
            cut = int(rng.integers(1, chunk.height))
            feeds += [("closed", chunk.slice(0, cut)), ("closed", chunk.slice(cut))]
        else:
            feeds.append(("closed", chunk))
        for due, rows in [h for h in held if h[0] <= len(feeds)]:
            held.remove((due, rows))
            if rows.height:
                feeds.append(("corrected", rows))
    return feeds + [("corrected", rows) for _, rows in held if rows.height]


def _change(c) -> tuple:
    d = dataclasses.asdict(c)
    d["window"] = c.window.name
    return tuple((k, "nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in sorted(d.items()))


def _state(ev: SloEvaluator) -> list:
    out = []
    for (name, values), view in sorted(ev.states.items()):
        s = view.status()
        burns, valid, remaining = view.table.rates()
        out.append((name, values, repr(dataclasses.asdict(s)), sorted(view.firing.items(), key=lambda kv: kv[0]),
                    view.no_data_since, burns[view.i].tobytes(), valid[view.i].tobytes(), remaining[view.i].tobytes(),
                    view.table.window_sums()[view.i].tobytes(), view.table.undecided_sums()[view.i].tobytes()))
    return out


def _run(specs, feeds, share: bool, restart_at: int, evaluator=SloEvaluator) -> list:
    ev = evaluator(specs, share_windows=share)
    seen: list[pl.DataFrame] = []
    out = []
    for k, (kind, rows) in enumerate(feeds):
        if k == restart_at:  # a restart: the windows replayed unjudged, the firing alerts adopted
            again = evaluator(specs, share_windows=share)
            for part in seen:
                again.feed(part, with_status=False, judge=False)
            for (name, values), view in ev.states.items():
                for aw, at in view.firing.values():
                    assert again.tables[name].adopt_firing(aw.name, values, at)
                if view.no_data_since is not None:
                    assert again.tables[name].adopt_firing("no-data", values, view.no_data_since)
            ev = again
            out.append(("restart", _state(ev)))
        result = ev.feed(rows, with_status=kind == "closed")
        seen.append(rows)
        out.append((kind, [_change(c) for c in result.changes], status_frame(result.status)))
        if k % 7 == 0:
            out.append(("state", _state(ev)))
    out.append(("state", _state(ev)))
    return out


@pytest.mark.parametrize("seed,thin", [(1, False), (2, True), (3, True), (4, False)])
def test_shared_window_tables_decide_as_tables_of_their_own(fleet_buckets, specs, seed, thin):
    feeds = _feeds(fleet_buckets, seed, thin)
    restart_at = len(feeds) * 2 // 3
    shared, alone = _run(specs, feeds, True, restart_at), _run(specs, feeds, False, restart_at)
    assert len(shared) == len(alone)
    changes = 0
    for k, (a, b) in enumerate(zip(shared, alone)):
        assert a[0] == b[0]
        if a[0] in ("closed", "corrected"):
            assert a[1] == b[1], (k, a[0])
            assert a[2].equals(b[2]), (k, a[2], b[2])
            changes += len(a[1])
        else:
            assert a[1] == b[1], (k, a[0])
    assert changes > 0  # alerts fired and resolved on the way


class MinuteByMinute(SloEvaluator):
    """The evaluator closing a backlog's minutes one at a time, each SLO counting, judging and
    reading its status rows at each minute (`SloTable.count`, `judge`, `status_part`), as it
    closes a feed of one minute: what its feed-wide reads and judging (`SloTable.prepare`,
    `judge_later`) are held to."""

    def _close_backlog(self, buckets, fed, minutes, with_status, judge, changes, status):
        for minute in minutes:
            one = []
            for spec, rows in fed:
                at = rows.minutes == minute
                one.append((spec, sli.SloRows(rows.minutes[at], [k for k, x in zip(rows.keys, at) if x], rows.good[at],
                                              rows.valid[at], rows.undecided[at])))
            self._close_minute(buckets, one, minute, with_status, judge, changes, status)


@pytest.mark.parametrize("seed,thin,keep", [(5, True, engine.KEEP_COLUMNS), (6, False, 0), (7, True, 10_000)])
def test_a_backlog_closed_in_one_feed_decides_as_minute_by_minute(fleet_buckets, specs, seed, thin, keep, monkeypatch):
    """Backlogs of up to two hours of minutes in one feed (with late rows and split minutes
    among them): the same alert changes, status rows and slice states as closing each minute
    on its own, whether the minutes' window sums are kept whole (`keep`: up to that many
    columns) or their slices picked at each minute."""
    monkeypatch.setattr(engine, "KEEP_COLUMNS", keep)
    feeds = _feeds(fleet_buckets, seed, thin, takes=(1, 3, 17, 45, 120))
    assert max(rows["window_start"].n_unique() for _, rows in feeds) > 10  # backlogs, not single minutes
    restart_at = len(feeds) // 2
    at_once = _run(specs, feeds, True, restart_at)
    one_by_one = _run(specs, feeds, True, restart_at, evaluator=MinuteByMinute)
    assert len(at_once) == len(one_by_one)
    changes = statuses = 0
    for k, (a, b) in enumerate(zip(at_once, one_by_one)):
        assert a[0] == b[0]
        assert a[1] == b[1], (k, a[0])
        if a[0] in ("closed", "corrected"):
            assert a[2].equals(b[2]), (k, a[2], b[2])
            changes += len(a[1])
            statuses += a[2].height
    assert changes > 0 and statuses > 0  # alerts fired and resolved, status rows written
