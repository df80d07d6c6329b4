"""Late events within the correction horizon: merged into their closed minute in a real
DuckDB store, copies dropped, the merged row equal to an on-time close (no Kafka)."""

import polars as pl
import pytest

from tailwatch.store.checkpoint import Checkpoint, StoredMinutes, TopicCheckpoint, write_checkpoint
from tailwatch.store.connection import connect
from tailwatch.store.queries import query_frame
from tailwatch.streams.aggregates import REQUESTS
from tailwatch.streams.corrections import LateEvents
from tailwatch.streams.minute_windows import MINUTE_MS, MinuteWindows
from tests.test_minute_windows import T0, frame

LATENESS = 5 * MINUTE_MS
HORIZON = 24 * 60 * MINUTE_MS


def checkpoint(con, w: MinuteWindows, before: int | None):
    """What the window operator commits: closed rows, open deltas, frontier, late events resolved."""
    rows, minutes = w.close(before)
    unsaved = w.take_unsaved()
    t = TopicCheckpoint(topic="tw.requests", table="sli_minute", closed=rows, closed_minutes=minutes,
                              counts=unsaved.counts, hist=unsaved.hist, seen=unsaved.seen,
                              watermarks=dict(w.watermark_ms), closed_before_minute=w.closed_before_minute,
                              keep_seen_minutes=HORIZON // MINUTE_MS)
    late = w.take_late()
    if late is not None:
        t.corrected = LateEvents(t.topic, t.table, w, late).resolve(StoredMinutes(con), t.seen)
    write_checkpoint(con, Checkpoint(topics=[t], next_offsets={}))
    return t


def stored(con) -> pl.DataFrame:
    return query_frame(con, "SELECT * FROM sli_minute ORDER BY window_start, tenant")


def ev(eid, minute, status="ok", e2e=100.0, part=0, tenant="acme"):
    return (eid, T0 + minute * MINUTE_MS + 1_000, part, status, e2e)


@pytest.fixture
def con(tmp_path):
    c = connect(tmp_path / "tw.duckdb")
    yield c
    c.close()


def test_a_late_backlog_makes_the_row_an_on_time_close_would_have_made(con):
    on_time = [ev(f"a{i}", 0, "ok" if i % 4 else "error", 50.0 + i) for i in range(40)]
    backlog = [ev(f"b{i}", 0, "ok" if i % 3 else "timeout", 400.0 + 10 * i) for i in range(25)]
    w = MinuteWindows(REQUESTS, LATENESS, correction_horizon_ms=HORIZON)
    w.add(frame(on_time))
    w.add(frame([ev("n1", 20)]))  # the topic moves 20 minutes on: minute 0 closes
    checkpoint(con, w, (T0 + 20 * MINUTE_MS - LATENESS) // MINUTE_MS)
    assert stored(con)["requests"].to_list() == [40]

    # The backlog arrives 20 minutes late, with a copy of an on-time event and a copy of its own.
    out = w.add(frame(backlog + [on_time[3], backlog[7]]))
    assert out.late_index == [] and out.to_correct == 27 and out.accepted == 0
    t = checkpoint(con, w, None)
    assert (t.corrected.events, t.corrected.duplicates) == (25, 2)

    truth = MinuteWindows(REQUESTS, LATENESS)
    truth.add(frame(on_time + backlog))
    expected, _ = truth.close(None)
    got = stored(con).filter(pl.col("window_start") == expected["window_start"][0])
    assert got.height == 1
    assert got.select(expected.columns).to_dicts() == expected.to_dicts()


def test_a_late_copy_sent_again_after_its_correction_is_a_duplicate(con):
    w = MinuteWindows(REQUESTS, LATENESS, correction_horizon_ms=HORIZON)
    w.add(frame([ev("a", 0), ev("n", 30)]))
    checkpoint(con, w, (T0 + 30 * MINUTE_MS - LATENESS) // MINUTE_MS)
    w.add(frame([ev("late", 0, "error")]))
    assert checkpoint(con, w, None).corrected.events == 1
    w.add(frame([ev("late", 0, "error")]))  # the producer retried: same event id
    t = checkpoint(con, w, None)
    assert (t.corrected.events, t.corrected.duplicates) == (0, 1)
    row = stored(con).filter(pl.col("window_start") == pl.from_epoch(pl.lit(T0 // 1000), time_unit="s"))
    assert row.select("requests", "errors").row(0) == (2, 1)


def test_a_late_event_of_a_slice_the_minute_never_had_becomes_its_row(con):
    w = MinuteWindows(REQUESTS, LATENESS, correction_horizon_ms=HORIZON)
    w.add(frame([ev("a", 0), ev("n", 30)]))
    checkpoint(con, w, (T0 + 30 * MINUTE_MS - LATENESS) // MINUTE_MS)
    late = frame([ev("other", 0)]).with_columns(pl.lit("globex").alias("tenant"))
    w.add(late)
    checkpoint(con, w, None)
    minute0 = stored(con).filter(pl.col("window_start") == pl.from_epoch(pl.lit(T0 // 1000), time_unit="s"))
    assert sorted(zip(minute0["tenant"], minute0["requests"])) == [("acme", 1), ("globex", 1)]


def test_past_the_horizon_an_event_is_too_late_and_nothing_changes(con):
    w = MinuteWindows(REQUESTS, LATENESS, correction_horizon_ms=60 * MINUTE_MS)
    w.add(frame([ev("a", 0), ev("n", 200)]))
    checkpoint(con, w, (T0 + 200 * MINUTE_MS - LATENESS) // MINUTE_MS)
    out = w.add(frame([ev("old", 0), ev("recent", 150)]))
    assert out.past_horizon and len(out.late_index) == 1 and out.late_ts_ms == [T0 + 1_000]
    assert out.to_correct == 1  # minute 150 is 50 minutes behind: within the hour
    checkpoint(con, w, None)
    assert stored(con)["requests"].sum() == 3


def test_without_a_horizon_late_events_are_dead_letters_as_before(con):
    w = MinuteWindows(REQUESTS, LATENESS)
    w.add(frame([ev("a", 0), ev("n", 30)]))
    checkpoint(con, w, (T0 + 30 * MINUTE_MS - LATENESS) // MINUTE_MS)
    out = w.add(frame([ev("late", 0)]))
    assert len(out.late_index) == 1 and not out.past_horizon and out.to_correct == 0 and not w.holds_late


def test_dedupe_hashes_of_closed_minutes_leave_the_store_past_the_horizon(con):
    w = MinuteWindows(REQUESTS, LATENESS, correction_horizon_ms=HORIZON)
    w.add(frame([ev("a", 0)]))
    checkpoint(con, w, None)
    w.add(frame([ev("b", 2 * 24 * 60)]))  # two days on
    checkpoint(con, w, None)
    minutes = [m for (m,) in con.execute("SELECT DISTINCT minute FROM _tw_open_seen").fetchall()]
    assert minutes == [T0 // MINUTE_MS + 2 * 24 * 60]
