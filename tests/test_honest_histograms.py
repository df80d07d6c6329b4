"""Thresholds between a runtime's histogram buckets: a scraped vLLM fleet answering first tokens
in about 1.1 s against the default 1.2 s SLO (vLLM's bounds around it: 1 s and 2.5 s) has
every request undecided, neither proven good nor bad. Through topics in memory and a worker it
pages nothing and reports its SLI as the range 0–100%; a fleet at about 3 s (the bucket from
2.5 to 5 s, wholly over the threshold) is proven bad and still pages, and the evidence of
every page says how many of its events were undecided."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import duckdb
import msgspec
from prometheus_client import generate_latest

from tailwatch.ingest.otlp.histogram_requests import HistogramRequests
from tailwatch.ingest.otlp.mapping import OtlpMapping
from tailwatch.ingest.otlp.samples import HistogramPoint
from tailwatch.signals.answers import SloSlice
from tailwatch.signals.live import slo_reads
from tailwatch.slo.engine import SloTable
from tailwatch.slo.runtime_buckets import RUNTIME_HISTOGRAMS
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.store_sink import StoreSink
from tailwatch.streams.slo_stage import SloStage
from tailwatch.cli import main
from tests.test_pipeline import publish, worker

SLO = "llm-realtime-first-token"
T0_MS = int(datetime(2026, 11, 2, tzinfo=timezone.utc).timestamp() * 1000)
MINUTES, PER_MINUTE = 20, 150
TTFT = next(h for h in RUNTIME_HISTOGRAMS if h.metric == "vllm:time_to_first_token_seconds")
E2E = next(h for h in RUNTIME_HISTOGRAMS if h.metric == "vllm:e2e_request_latency_seconds")


def _scraped_fleet(zone: str, first_token_s: float, e2e_s: float) -> list:
    """The requests `tailwatch collect prometheus` makes of a vLLM page scraped once a minute
    whose requests all answer their first token in `first_token_s` (cumulative buckets, as
    vLLM exports them)."""
    mapper = HistogramRequests(OtlpMapping().requests)
    labels = {"model_name": "llama-70b", "model_version": "v1", "zone": zone, "instance": f"vllm-{zone}:8000"}

    def point(h, seconds: float, done: int, ts_ms: int) -> HistogramPoint:
        bounds = tuple(b / 1000 for b in h.bounds_ms)
        counts = [0] * (len(bounds) + 1)
        counts[next(i for i, b in enumerate(bounds) if seconds <= b)] = done
        return HistogramPoint(h.metric, labels, bounds, tuple(counts), seconds * done, 0, ts_ms, cumulative=True)

    events = []
    for k in range(MINUTES + 1):  # the first scrape is the base
        ts = T0_MS + k * 60_000
        done = k * PER_MINUTE
        mapped = mapper.map([point(TTFT, first_token_s, done, ts), point(E2E, e2e_s, done, ts)], [])
        assert not mapped.refused
        events += mapped.events
    assert len(events) == MINUTES * PER_MINUTE
    return events


def test_a_fleet_between_vllms_bounds_pages_nothing_and_reports_its_sli_as_a_range(memory, tmp_path, capsys):
    healthy = _scraped_fleet("eu-west-4a", 1.1, 4.0)
    slow = _scraped_fleet("eu-west-4b", 3.0, 6.0)
    publish(memory, healthy + slow)
    path = tmp_path / "tw.duckdb"
    w = worker(memory, path, until_idle_s=2.0, slos=load_slos(DEFAULT_SLOS))
    assert w.run() == 0

    con = duckdb.connect(str(path), read_only=True)
    alerts = con.execute("SELECT labels, severity, detail FROM alerts WHERE slo = ?", [SLO]).fetchall()
    by_zone: dict[str, list] = {}
    for labels, severity, detail in alerts:
        by_zone.setdefault(json.loads(labels)["zone"], []).append((severity, detail))
    # Nothing the data proves bad, so nothing fires for the healthy fleet; the slow one pages.
    assert "eu-west-4a" not in by_zone, by_zone
    assert any(severity == "page" for severity, _ in by_zone["eu-west-4b"])
    assert all("undecided" not in (detail or "") for _, detail in by_zone["eu-west-4b"])  # none of its events was
    # Each request knows the bucket it was counted in: (1 s, 2.5 s] and (2.5 s, 5 s].
    assert {(r.first_output_lower_ms, r.first_output_ms) for r in healthy} == {(1000.0, 2500.0)}
    assert {(r.first_output_lower_ms, r.first_output_ms) for r in slow} == {(2500.0, 5000.0)}
    status = con.execute("SELECT slice, min(sli), max(sli), min(sli_upper), max(sli_upper) FROM slo_status "
                         "WHERE slo = ? GROUP BY slice ORDER BY slice", [SLO]).fetchall()
    con.close()
    assert [row[1:] for row in status] == [(0.0, 0.0, 1.0, 1.0), (0.0, 0.0, 0.0, 0.0)]
    assert "eu-west-4a" in status[0][0]

    # /metrics: the SLI's two ends, and the undecided events as an outcome of their own.
    text = generate_latest(w.metrics.registry).decode()

    def value(name: str, zone: str, extra: str = "") -> float:
        line = next(line for line in text.splitlines() if line.startswith(name + "{") and f'slo="{SLO}"' in line
                    and f'zone="{zone}"' in line and extra in line)
        return float(line.rsplit(" ", 1)[1])

    assert value("tailwatch_slo_sli_ratio", "eu-west-4a", 'window="30d"') == 0.0
    assert value("tailwatch_slo_sli_upper_ratio", "eu-west-4a", 'window="30d"') == 1.0
    assert value("tailwatch_slo_sli_upper_ratio", "eu-west-4b", 'window="30d"') == 0.0
    assert value("tailwatch_slo_burn_rate", "eu-west-4a", 'window="1h"') == 0.0
    assert value("tailwatch_slo_events_total", "eu-west-4a", 'outcome="undecided"') == MINUTES * PER_MINUTE
    assert value("tailwatch_slo_events_total", "eu-west-4b", 'outcome="bad"') == MINUTES * PER_MINUTE

    # The signal API's SLO answer, through its typed response.
    slo = next(s for s in w.sink(StoreSink).stages if isinstance(s, SloStage))
    (entry,) = [e for e in slo_reads(slo.states()) if e["name"] == SLO]
    slices = {s.labels["zone"]: s for s in msgspec.convert(entry["slices"], list[SloSlice])}
    assert (slices["eu-west-4a"].sli, slices["eu-west-4a"].sli_upper) == (0.0, 1.0)
    assert slices["eu-west-4a"].undecided_events == MINUTES * PER_MINUTE and slices["eu-west-4b"].undecided_events == 0

    # `slo status` from the store: the range, and how many events were undecided.
    capsys.readouterr()
    assert main(["slo", "status", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(SLO) and "eu-west-4a" in line)
    assert "0–100" in row
    assert f"{SLO} zone=eu-west-4a,model_version=v1: 3,000 events lay in a runtime histogram bucket" in out


def test_a_page_names_how_many_of_its_events_were_undecided():
    """The engine alone (pure): a slice with proven bad events beside undecided ones fires on
    the proven ones and its evidence counts the undecided."""
    spec = next(s for s in load_slos(DEFAULT_SLOS) if s.name == SLO)
    table = SloTable(spec)
    changes = []
    for minute in range(29_000_000, 29_000_010):
        changes += table.advance(minute, [table.column(("v1", "a"))], [700], [1000], undecided=[100])
    # 30% proven bad burns 30x the 1% budget: the fast page fires once its 5 minutes of history are in.
    (fired,) = [c for c in changes if c.state == "firing" and c.severity == "page"]
    assert (fired.at_minute, fired.long_undecided_events, fired.long_valid_events) == (29_000_004, 500, 5000)
    assert "500 of 5,000 events over 1h lay in a runtime histogram bucket" in fired.undecided_text()
    status = table.views[0].status()
    assert (round(status.sli, 3), round(status.sli_upper, 3), status.undecided_events) == (0.7, 0.8, 1000)
    # Undecided events alone burn nothing.
    quiet = SloTable(spec)
    assert not [c for m in range(29_000_000, 29_000_010)
                for c in quiet.advance(m, [quiet.column(("v1", "a"))], [0], [1000], undecided=[1000])]
    assert quiet.rates()[0][0].max() == 0.0



def test_a_minute_counts_its_undecided_events_for_any_threshold_and_keeps_them_through_merges():
    """Measured latencies and scraped ones in one slice-minute: the straddle histogram gives,
    for each threshold, the events whose bucket holds it strictly, and survives being read back
    into partials (a late correction, the hourly roll-up) unchanged."""
    import polars as pl

    from tailwatch.slo.sli import good_valid, undecided_expr
    from tailwatch.slo.spec import load_slos
    from tailwatch.streams.aggregates import REQUESTS
    from tailwatch.streams.minute_windows import MINUTE_MS, MinuteWindows
    from tests.test_minute_windows import T0, frame

    rows = frame([(f"e{i}", T0 + i, 0, "ok", 1100.0) for i in range(10)]  # measured: 1.1 s, good under 1.2 s
                 + [(f"b{i}", T0 + i, 0, "ok", 2500.0) for i in range(30)]  # scraped: (1 s, 2.5 s]
                 + [(f"c{i}", T0 + i, 0, "ok", 5000.0) for i in range(20)])  # scraped: (2.5 s, 5 s]
    lower = [None] * 10 + [1000.0] * 30 + [2500.0] * 20
    rows = rows.with_columns(pl.Series("e2e_lower_ms", lower, pl.Float64))
    w = MinuteWindows(REQUESTS, 5 * MINUTE_MS)
    w.add(rows)
    closed, _ = w.close(None)
    again = w.merge_partials(*w.row_partials(closed))  # what a correction or the roll-up reads back

    def counts(buckets, threshold: str) -> tuple[int, int, int]:
        (spec,) = load_slos_text(f"sli: {{latency: {{field: e2e_ms, threshold: {threshold}}}}}")
        gv = good_valid(spec, buckets).row(0, named=True)
        return gv["good"], int(buckets.select(undecided_expr(spec)).item()), gv["valid"]

    def load_slos_text(sli: str):
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "s.yaml"
            path.write_text(f"slos:\n  - name: x\n    selector: {{workload: llm}}\n    {sli}\n    objective: 99%\n")
            return load_slos(path)

    for buckets in (closed, again):
        assert counts(buckets, "1.2s") == (10, 30, 60)  # the (1, 2.5] bucket straddles 1.2 s
        assert counts(buckets, "3s") == (40, 20, 60)  # the (2.5, 5] bucket straddles 3 s
        # On a bound: the worker's 2% bins cannot tell 2.5 s from a little over it, so that
        # bucket is undecided (counted bad before), the one above it proven bad.
        assert counts(buckets, "2.5s") == (10, 30, 60)
        assert counts(buckets, "800ms") == (0, 0, 60)  # under every bucket: all proven bad
        assert counts(buckets, "6s") == (60, 0, 60)
