"""SLO math: window factors, burn rates, budgets, alert firing and resolution, specs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailwatch.slo.engine import RollingWindows, SloTable, burn_rate, error_budget_remaining, minutes_to_exhaustion
from tailwatch.slo.spec import DEFAULT_SLOS, SLI_KINDS, SpecErrors, load_slos
from tailwatch.slo.alert_windows import default_catalog
from tailwatch.streams.slo_stage import alert_change_rows

THIRTY_DAYS = 30 * 1440


class OneSlice:
    """One slice of an SLO's table, advanced a minute at a time."""

    def __init__(self, spec, labels):
        self.table = SloTable(spec)
        self.view = self.table.views[self.table.column(tuple(labels.values()))]

    def advance(self, minute, good, valid):
        return self.table.advance(minute, [self.view.i], [good], [valid])

    def check_silence(self, minute):
        return self.table.check_silence(minute)

    def __getattr__(self, name):  # status(), burn(), budget_remaining(), firing
        return getattr(self.view, name)


def spec_file(tmp_path, body: str):
    p = tmp_path / "slos.yaml"
    p.write_text(body)
    return p


AVAIL = """
slos:
  - name: llm-avail
    selector: {workload: llm}
    sli: {availability: {}}
    objective: 99.9%
    window: 30d
    min_events: 10
"""


def test_workbook_factors_at_999_over_30_days():
    assert [w.factor(THIRTY_DAYS) for w in default_catalog()] == pytest.approx([14.4, 6.0, 3.0, 1.0])
    assert [(w.long_minutes, w.short_minutes) for w in default_catalog()] == [(60, 5), (360, 30), (1440, 120), (4320, 360)]


def test_burn_rate_hand_computed():
    import numpy as np

    burns = burn_rate(np.array([144.0, 6, 0]), np.array([10_000.0, 1_000, 0]), objective=0.999)
    assert burns[:2] == pytest.approx([14.4, 6.0]) and np.isnan(burns[2])  # no events: no burn rate
    assert error_budget_remaining(np.array([0.0, 5]), np.array([0.0, 10_000]), 0.999) == pytest.approx([1.0, 0.5])
    # Half the budget left, burning at 2x: 30 days × 0.5 ÷ 2 = 7.5 days; not burning: none; spent: 0.
    left = minutes_to_exhaustion(np.array([0.5, 0.5, -0.2]), np.array([2.0, np.nan, 3.0]), THIRTY_DAYS)
    assert left[0] == pytest.approx(7.5 * 1440) and np.isnan(left[1]) and left[2] == 0.0


def test_page_fires_when_both_windows_burn_and_resolves_when_short_window_cools(tmp_path):
    (spec,) = load_slos(spec_file(tmp_path, AVAIL))
    s = OneSlice(spec, {})
    changes = []
    for m in range(120):  # clean traffic: 1,000 per minute
        changes += s.advance(m, 1000, 1000)
    assert changes == []
    for m in range(120, 140):  # 10% errors: burn rate 100 in every minute
        changes += s.advance(m, 900, 1000)
    fired = [c for c in changes if c.state == "firing" and c.window.name == "page-fast"]
    assert len(fired) == 1
    # The 1 h window after k bad minutes: 100k bad of 60,000 → burn k/0.6; over 14.4 from k = 9,
    # that is at minute 128. The 5 m window burns at 100 from the first bad minute.
    first = fired[0]
    assert first.at_minute == 128
    assert first.long_burn_rate == pytest.approx(15.0) and first.short_burn_rate == pytest.approx(100.0)
    changes.clear()
    for m in range(140, 150):
        changes += s.advance(m, 1000, 1000)
    resolved = [c for c in changes if c.state == "resolved" and c.window.name == "page-fast"]
    assert [c.at_minute for c in resolved] == [144]  # the 5-minute window holds no bad minute from 144 on
    assert resolved[0].fingerprint == first.fingerprint


def test_a_page_resolves_when_its_traffic_thins_below_min_events_as_the_prometheus_rule_does(tmp_path):
    """The rule's expression needs `min_events` in both windows: a slice whose traffic all but
    stops while still failing no longer pages (the engine used to wait for the short window
    to cool, which a failing trickle never does)."""
    (spec,) = load_slos(spec_file(tmp_path, AVAIL))
    s = OneSlice(spec, {})
    changes = []
    for m in range(120):
        changes += s.advance(m, 1000, 1000)
    for m in range(120, 140):  # 10% errors: pages at minute 128
        changes += s.advance(m, 900, 1000)
    assert [c.at_minute for c in changes if c.state == "firing" and c.window.name == "page-fast"] == [128]
    changes.clear()
    for m in range(140, 150):  # one request a minute, every one failing: the 5 m window burns at 1,000
        changes += s.advance(m, 0, 1)
    resolved = [c for c in changes if c.state == "resolved" and c.window.name == "page-fast"]
    # The 5-minute window holds fewer than 10 events from minute 144, when the last busy minute leaves it.
    assert [c.at_minute for c in resolved] == [144]
    assert resolved[0].short_burn_rate > 14.4  # still burning: it resolved for want of events


def test_low_traffic_slice_does_not_page(tmp_path):
    (spec,) = load_slos(spec_file(tmp_path, AVAIL.replace("min_events: 10", "min_events: 500")))
    s = OneSlice(spec, {})
    changes = []
    for m in range(10):
        changes += s.advance(m, 0, 5)  # every request fails, but 5 a minute
    assert changes == []


def test_windows_without_events_have_no_burn_rate(tmp_path):
    (spec,) = load_slos(spec_file(tmp_path, AVAIL))
    s = OneSlice(spec, {})
    s.advance(0, 0, 0)
    st_ = s.status()
    assert st_.sli is None and all(b is None for b in st_.burn_rates.values()) and st_.error_budget_remaining == 1.0


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=400),
       st.lists(st.integers(1, 90), min_size=1, max_size=4))
@settings(max_examples=200, deadline=None)
def test_rolling_sums_equal_a_rescan(counts, lengths):
    """Every length's sums equal a rescan of its minutes, minutes without data skipped (as
    a stage window does) and the stored minutes compacted along the way."""
    w = RollingWindows(lengths)
    for minute, (a, b) in enumerate(counts):
        w.retire_until(minute)
        if max(a, b):
            w.add(minute, min(a, b), max(a, b))
        for length in lengths:
            window = [(min(x, y), max(x, y)) for x, y in counts[max(0, minute - length + 1): minute + 1]]
            assert w.sums(length) == (sum(g for g, _ in window), sum(v for _, v in window))
    assert len(w._rows) <= 3 * max(lengths) * 2 + 192  # compacted: bounded by the longest length, not the stream


def test_default_slos_load():
    """The defaults and the shipped examples load and exercise every SLI kind between them
    (the per-tenant quota SLO is an example: its slices grow with the customer base)."""
    specs = load_slos(DEFAULT_SLOS)
    examples = [spec for path in sorted((DEFAULT_SLOS.parent / "examples").glob("*.yaml")) for spec in load_slos(path)]
    assert examples and {s.sli_kind for s in specs + examples} == set(SLI_KINDS)
    assert {s.name for s in specs}.isdisjoint(s.name for s in examples)


def test_check_names_each_problem_with_its_place(tmp_path):
    bad = """
slos:
  - name: a
    selector: {workload: llm, colour: red}
    sli: {latency: {field: first_output_ms, threshold: 300}}
    objective: 100%
    window: 30d
  - name: b
    sli: {availability: {}}
    objective: 99%
    window: 2h
  - name: c
    sli: {availability: {}}
    objective: 99%
    alert_windows: [{name: x, budget_share: 0.02, long: 1h, short: 2h}]
  - name: d
    sli: {availability: {}, latency: {field: e2e_ms, threshold: 1s}}
    objective: 99%
    no_data_afer: 5m
    min_events: zero
    alert_windows: [{long: 1h, budget_share: 2, severity: wake-me}]
"""
    with pytest.raises(SpecErrors) as err:
        load_slos(spec_file(tmp_path, bad))
    problems = err.value.problems
    assert any(p.startswith("slos[0].selector.colour: unknown label") for p in problems)
    assert any(p.startswith("slos[0].sli.latency.threshold") and "needs a unit" in p for p in problems)
    assert any(p.startswith("slos[0].objective") and "below 100%" in p for p in problems)
    assert any(p.startswith("slos[1].alert_windows: no alert window catalog for a 120 min SLO period") for p in problems)
    assert any(p.startswith("slos[2].alert_windows[0].short") and "longer than its long window" in p for p in problems)
    # A typo is refused, not ignored; each field's problem is listed, not only the first.
    assert any(p.startswith("slos[3]: unknown field `no_data_afer`") for p in problems), problems
    assert "slos[3].min_events: expected `int`, got `str`" in problems
    assert f"slos[3].sli: expected exactly one of {', '.join(SLI_KINDS)}" in problems
    assert "slos[3].alert_windows[0].budget_share: expected `float` <= 1.0" in problems, problems


OPENSLO = """
apiVersion: openslo/v1
kind: SLO
metadata:
  name: llm-first-token
  labels: {workload: llm}
spec:
  description: first token fast
  service: chat
  indicator:
    metadata: {name: ttft}
    spec:
      thresholdMetric:
        metricSource: {type: tailwatch, spec: {query: "first_output_ms <= 800ms"}}
  timeWindow: [{duration: 28d, isRolling: true}]
  budgetingMethod: Occurrences
  objectives: [{displayName: fast, target: 0.99}]
---
apiVersion: openslo/v1
kind: SLO
metadata: {name: llm-availability}
spec:
  indicator:
    metadata: {name: ok}
    spec:
      ratioMetric:
        good: {metricSource: {type: tailwatch, spec: {query: ok}}}
        total: {metricSource: {type: tailwatch, spec: {query: requests}}}
  timeWindow: [{duration: 30d, isRolling: true}]
  objectives: [{target: 0.999}]
"""


def test_openslo_documents_read_into_the_same_model(tmp_path):
    a, b = load_slos(spec_file(tmp_path, OPENSLO))
    assert (a.name, a.sli_kind, a.latency_field, a.threshold_ms, a.objective, a.period_minutes) == (
        "llm-first-token", "latency", "first_output_ms", 800.0, 0.99, 28 * 1440)
    assert a.selector == {"workload": "llm"}
    assert (b.name, b.sli_kind, b.objective) == ("llm-availability", "availability", 0.999)


def test_good_and_valid_from_buckets(tmp_path):
    from datetime import datetime

    import polars as pl

    from tailwatch.slo import histogram
    from tailwatch.slo.sli import good_valid

    bound = histogram.bin_upper_bound_ms(histogram.bin_of(300.0))
    values = [10.0, 100.0, bound, bound * 1.1, 5000.0]  # three at or under the bound
    hist = [{"bin": b, "n": n} for b, n in sorted(histogram.from_values(values).items())]
    frame = pl.DataFrame({
        "window_start": [datetime(2026, 11, 2, 0, 0)] * 2, "workload": ["llm", "asr"], "zone": ["a", "a"],
        "requests": [10, 7], "ok": [8, 7], "cancelled": [1, 0],
        "first_output_ms_hist": [hist, hist],
    })
    body = f"""
slos:
  - {{name: lat, selector: {{workload: llm}}, sli: {{latency: {{field: first_output_ms, threshold: {bound}ms}}}}, objective: 99%, slice_by: [zone]}}
  - {{name: gp, selector: {{workload: llm}}, sli: {{goodput: {{field: first_output_ms, threshold: {bound}ms}}}}, objective: 99%}}
  - {{name: av, selector: {{workload: llm}}, sli: {{availability: {{}}}}, objective: 99%}}
"""
    lat, gp, av = load_slos(spec_file(tmp_path, body))
    assert good_valid(lat, frame).select("good", "valid").row(0) == (3, 5)
    assert good_valid(gp, frame).select("good", "valid").row(0) == (3, 9)  # valid: attempts less cancellations
    assert good_valid(av, frame).select("good", "valid").row(0) == (8, 9)


def test_every_slo_counted_at_once_equals_each_slo_counted_alone(tmp_path):
    from datetime import datetime

    import polars as pl

    from tailwatch.slo import histogram
    from tailwatch.slo.sli import good_valid, good_valid_rows

    hist = lambda *ms: [{"bin": b, "n": n} for b, n in sorted(histogram.from_values(list(ms)).items())]  # noqa: E731
    t0, t1 = datetime(2026, 11, 2, 0, 0), datetime(2026, 11, 2, 0, 1)
    frame = pl.DataFrame({
        "window_start": [t1, t0, t0, t0, t1, t0],
        "workload": ["llm", "llm", "asr", "llm", "llm", None],
        "zone": ["a", "a", "a", "b", None, "a"],
        "model_version": ["v1", "v2", "v1", "v1", "v1", "v1"],
        "requests": [10, 7, 5, 3, 4, 9], "ok": [8, 7, 5, 1, 4, 9], "cancelled": [1, 0, 0, 0, 1, 0],
        "first_output_ms_hist": [hist(10.0, 900.0), hist(5.0), hist(2000.0), hist(100.0, 100.0), None, hist(1.0)],
    })
    body = """
slos:
  - {name: lat, selector: {workload: llm}, sli: {latency: {field: first_output_ms, threshold: 500ms}}, objective: 99%, slice_by: [zone]}
  - {name: gp, selector: {workload: llm}, sli: {goodput: {field: first_output_ms, threshold: 500ms}}, objective: 99%, slice_by: [zone, model_version]}
  - {name: av, selector: {workload: llm, zone: a}, sli: {availability: {}}, objective: 99%}
  - {name: asr, selector: {workload: asr}, sli: {availability: {}}, objective: 99%, slice_by: [zone]}
"""
    specs = load_slos(spec_file(tmp_path, body))
    together = {name: list(zip(rows.minutes.tolist(), rows.keys, rows.good.tolist(), rows.valid.tolist()))
                for name, rows in good_valid_rows(specs, frame).items()}
    for spec in specs:
        alone = good_valid(spec, frame).with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("m"))
        expected = sorted((r["m"], tuple(str(r[k]) for k in spec.slice_by), r["good"], r["valid"])
                          for r in alone.iter_rows(named=True))
        assert [r[0] for r in together[spec.name]] == sorted(r[0] for r in together[spec.name])  # in minute order
        assert sorted(together[spec.name]) == expected, spec.name
    assert together["asr"] == [(29892960, ("a",), 5, 5)]  # a selector picks only its rows; null labels match none
    assert [r[1] for r in together["lat"]] == [("a",), ("b",), ("a",), ("None",)]  # slices in order, a null last


@pytest.mark.slow
def test_slo_check_command_exit_codes(tmp_path):
    import subprocess
    import sys

    good = subprocess.run([sys.executable, "-m", "tailwatch", "slo", "check", str(DEFAULT_SLOS)], capture_output=True)
    assert good.returncode == 0 and b"no problems" in good.stdout
    bad = spec_file(tmp_path, AVAIL.replace("99.9%", "100%"))
    r = subprocess.run([sys.executable, "-m", "tailwatch", "slo", "check", str(bad)], capture_output=True)
    assert r.returncode == 1 and b"slos[0].objective" in r.stderr and b"Traceback" not in r.stderr


def test_a_silent_slice_raises_no_data_and_resolves_when_data_returns(tmp_path):
    (spec,) = load_slos(spec_file(tmp_path, AVAIL.replace("min_events: 10", "min_events: 10\n    no_data_after: 5m")))
    s = OneSlice(spec, {"zone": "a"})
    s.advance(0, 100, 100)
    assert s.check_silence(4) == []
    fired = s.check_silence(5)
    assert [(c.alertname, c.state, c.at_minute) for c in fired] == [("SLONoData", "firing", 5)]
    assert s.check_silence(9) == []  # one condition, one alert
    back = [c for c in s.advance(12, 100, 100) if c.alertname == "SLONoData"]
    assert [(c.state, c.at_minute, c.started_minute) for c in back] == [("resolved", 12, 5)]


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200)), min_size=1, max_size=150),
       st.sampled_from([0.9, 0.99, 0.999, 0.9999]))
@settings(max_examples=100, deadline=None)
def test_engine_invariants(counts, objective):
    """Burn rates are None or finite and ≥ 0; budget ≤ 1; alerts alternate firing/resolved per fingerprint."""
    import math

    from tailwatch.slo.spec import SloSpec

    spec = SloSpec(name="p", description="", selector={}, sli_kind="availability", objective=objective,
                   period_minutes=THIRTY_DAYS, calendar_month=False, slice_by=(), alert_windows=default_catalog(),
                   min_events=1)
    s = OneSlice(spec, {})
    last_state: dict[str, str] = {}
    for minute, (a, b) in enumerate(counts):
        for c in s.advance(minute, min(a, b), max(a, b)):
            assert last_state.get(c.fingerprint, "resolved") != c.state
            last_state[c.fingerprint] = c.state
        for m, rate in s.status().burn_rates.items():
            assert rate is None or (math.isfinite(rate) and rate >= 0)
        assert s.budget_remaining() <= 1.0


def test_calendar_month_budget_starts_afresh_each_month(tmp_path):
    from datetime import datetime, timezone

    (spec,) = load_slos(spec_file(tmp_path, AVAIL.replace("window: 30d", "window: calendar-month")))
    assert spec.calendar_month and spec.period_minutes == THIRTY_DAYS
    s = OneSlice(spec, {})
    last_of_oct = int(datetime(2026, 10, 31, 23, 58, tzinfo=timezone.utc).timestamp()) // 60
    s.advance(last_of_oct, 990, 1000)  # 1% bad: ten times the 0.1% budget
    assert s.budget_remaining() == pytest.approx(-9.0)
    s.advance(last_of_oct + 2, 1000, 1000)  # 00:00 on 1 November: a new month, a new budget
    assert s.budget_remaining() == 1.0 and s.status().sli == 1.0
    assert s.burn(60) == pytest.approx(5.0)  # alert windows still roll across the boundary


def test_goodput_good_never_exceeds_valid_when_cancelled_streams_had_a_first_token():
    from datetime import datetime

    import polars as pl

    from tailwatch.slo import histogram
    from tailwatch.slo.sli import good_valid

    spec = next(s for s in load_slos(DEFAULT_SLOS) if s.sli_kind == "goodput")
    row = {label: "x" for label in spec.slice_by} | dict(spec.selector)
    frame = pl.DataFrame([{**row, "window_start": datetime(2026, 1, 1), "requests": 7, "cancelled": 1, "ok": 6,
                           # 7 fast first tokens; one of those streams was then cancelled by its client
                           "first_output_ms_hist": [{"bin": histogram.bin_of(50.0), "n": 7}]}])
    got = good_valid(spec, frame)
    assert got["good"].to_list() == [6] and got["valid"].to_list() == [6]


def test_alert_history_is_the_same_whether_changes_reach_the_store_one_by_one_or_together(tmp_path):
    # One change takes a statement with parameters, several an Arrow table: same rows, and a
    # fire, resolve and fire again of one fingerprint land in that order either way.
    from tailwatch.slo.engine import AlertChange
    from tailwatch.store.checkpoint import Checkpoint, write_checkpoint
    from tailwatch.store.connection import connect

    window = default_catalog()[0]

    def change(state: str, fingerprint: str, minute: int, long_burn_rate: float | None = 14.5) -> AlertChange:
        return AlertChange(state, fingerprint, "SLOBurnPage", "page", "availability",
                           {"tenant": "acme", "slo": "availability"}, minute, minute, window,
                           long_burn_rate, None, 0.25)

    changes = [change("firing", "a", 10), change("firing", "b", 10), change("resolved", "a", 12),
               change("firing", "a", 13, None), change("resolved", "b", 14)]

    def history(batches: list[list[AlertChange]], name: str) -> list[tuple]:
        con = connect(tmp_path / name)
        for batch in batches:
            write_checkpoint(con, Checkpoint(topics=[], next_offsets={}, stage_rows=[("alerts", alert_change_rows(batch))]))
        return con.execute("SELECT * FROM alerts ORDER BY fingerprint, fired_at").fetchall()

    one_by_one = history([[c] for c in changes], "one.duckdb")
    assert one_by_one == history([changes], "together.duckdb")
    assert [(r[0], r[6].minute, r[7] and r[7].minute) for r in one_by_one] == [("a", 10, 12), ("a", 13, None), ("b", 10, 14)]


def test_the_alert_windows_come_from_the_catalog_of_the_slo_period(tmp_path):
    """As sloth keeps a window catalog per period (google-28d, google-30d): the same budget shares,
    so a 28-day SLO pages on the same share of its budget at factors of its own."""
    (thirty,) = load_slos(spec_file(tmp_path, AVAIL))
    (four_weeks,) = load_slos(spec_file(tmp_path, AVAIL.replace("window: 30d", "window: 28d")))
    assert [round(w.factor(thirty.period_minutes), 2) for w in thirty.alert_windows] == [14.4, 6.0, 3.0, 1.0]
    assert [round(w.factor(four_weeks.period_minutes), 2) for w in four_weeks.alert_windows] == [13.44, 5.6, 2.8, 0.93]
    (week,) = load_slos(spec_file(tmp_path, AVAIL.replace("window: 30d", "window: 7d")))
    assert [w.long_minutes for w in week.alert_windows] == [14, 84, 336, 1008]


@pytest.mark.slow
def test_a_restart_takes_the_alerts_firing_from_the_store_and_then_decides_as_a_run_that_never_stopped(tmp_path):
    """A restart rebuilds the windows from the store's minutes without judging each of them
    again, and adopts the alerts the store holds as firing: from then on it decides what a
    worker that never stopped decides (pages resolve, silences end, at the same minutes)."""
    from datetime import datetime, timedelta

    import polars as pl

    from tailwatch.store.checkpoint import Checkpoint, write_checkpoint
    from tailwatch.store.connection import connect
    from tailwatch.streams.slo_stage import SloStage

    (spec,) = load_slos(spec_file(tmp_path, AVAIL.replace("min_events: 10", "min_events: 10\n    no_data_after: 5m\n    slice_by: [zone]")))
    t0 = datetime(2026, 11, 2)

    def minute(m: int) -> pl.DataFrame:
        # Zone a burns its budget from minute 100 to 160; zone b is silent from 120 to 200.
        rows = [{"window_start": t0 + timedelta(minutes=m), "workload": "llm", "zone": zone, "requests": 100,
                 "ok": 70 if zone == "a" and 100 <= m < 160 else 100, "cancelled": 0}
                for zone in ("a", "b", "c") if not (zone == "b" and 120 <= m < 200)]
        return pl.DataFrame(rows)

    con = connect(tmp_path / "live.duckdb")
    live = SloStage([spec])
    for m in range(150):
        rows = minute(m)
        out = live.on_closed(rows, pl.DataFrame())
        con.register("closed", rows.to_arrow())
        con.execute("INSERT INTO sli_minute BY NAME SELECT * FROM closed")
        write_checkpoint(con, Checkpoint(topics=[], next_offsets={}, stage_rows=[("alerts", out["alerts"])]))

    def firing(stage: SloStage) -> dict[str, tuple[str, int]]:
        return {fp: (aw.name, at) for v in stage.states() for fp, (aw, at) in v.firing.items()} | \
            {f"no-data:{v.labels['zone']}": ("no-data", v.no_data_since) for v in stage.states() if v.no_data_since is not None}

    restarted = SloStage([spec])
    restarted.rebuild(con)
    before = firing(live)
    assert {name for name, _ in before.values()} >= {"page-fast", "no-data"}, before  # a page and a silence open
    assert firing(restarted) == before
    assert [v.burn_rates() for v in restarted.states()] == [v.burn_rates() for v in live.states()]

    def decided(stage: SloStage, m: int) -> list[tuple]:
        return [(c.fingerprint, c.state, c.at_minute, c.started_minute) for c in stage.evaluator.feed(minute(m)).changes]

    after_live = [c for m in range(150, 600) for c in decided(live, m)]
    after_restart = [c for m in range(150, 600) for c in decided(restarted, m)]
    assert after_restart == after_live
    # What was open at the restart closes after it, in both: the page resolves, the silence ends.
    assert {(state, started) for _, state, _, started in after_live} >= {("resolved", at) for _, at in before.values()}
