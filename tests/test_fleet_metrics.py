"""The fleet-metrics stage on its own: closed buckets in, Prometheus series out.

Buckets are made offline by the worker's own decode → frame → window path (no broker),
from the simulator, so the counters can be checked against the simulator's totals.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import msgspec
import numpy as np
import polars as pl
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.ingest.validate import BatchDecoder
from tailwatch.planning.prices import GpuPrices
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.aggregates import GPU, REQUESTS
from tailwatch.conventions import LATENCY_LABELS
from tailwatch.streams.fleet_metrics import OTHER_TENANT, FleetMetrics, FleetMetricsConfig
from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS, records_to_frame
from tailwatch.streams.metrics import WorkerMetrics
from tailwatch.streams.slo_stage import SloStage
from tailwatch.streams.minute_windows import MinuteWindows
from tailwatch.alerts.alertmanager import DeliveryCollector, FiringAlerts
from tailwatch.streams.detector_stage import DetectorStage
from tailwatch_dev.bench import synthetic_events
from tests.conftest import need


def closed_buckets(events) -> tuple[pl.DataFrame, pl.DataFrame]:
    """sli_minute and gpu_minute rows of every minute, as the worker would close them."""
    enc = msgspec.json.Encoder()
    return (closed_rows([enc.encode(e) for e in events if isinstance(e, RequestV1)], RequestV1),
            closed_rows([enc.encode(e) for e in events if isinstance(e, GpuV1)], GpuV1))


def closed_rows(values: list[bytes], event_type) -> pl.DataFrame:
    """One topic's JSON values → its closed minute rows."""
    columns, spec = (REQUEST_COLUMNS, REQUESTS) if event_type is RequestV1 else (GPU_COLUMNS, GPU)
    decoded = BatchDecoder(event_type).decode(values)
    frame, _bad = records_to_frame(decoded.records, columns, [0] * len(values), list(range(len(values))),
                                   decoded.indices)
    windows = MinuteWindows(spec, 0)
    windows.add(frame)
    rows, _minutes = windows.close(None)
    return rows


@pytest.fixture(scope="module")
def fleet():
    sim = FleetSimulator("mixed-fleet", minutes=6, seed=3, rate_scale=0.2)
    events = list(sim.events())
    requests, gpu = closed_buckets(events)
    return sim, requests, gpu


def scrape(*collectors) -> dict[str, list]:
    registry = CollectorRegistry()
    for c in collectors:
        registry.register(c)
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def total(families, name: str, **labels) -> float:
    fam = families[name]
    return sum(s.value for s in fam.samples if s.name.endswith(name.split("tailwatch_")[-1] + "_total") or s.name == name
               if all(s.labels.get(k) == v for k, v in labels.items()))


def test_counters_match_the_simulator(fleet):
    sim, requests, gpu = fleet
    stage = FleetMetrics()
    # Fed minute by minute, GPU rows of a minute with its requests, as checkpoints do.
    for (minute,), part in requests.partition_by("window_start", as_dict=True, maintain_order=True).items():
        stage.on_closed(part, gpu.filter(pl.col("window_start") == minute))
    stage.on_closed(pl.DataFrame(), pl.DataFrame())  # an empty checkpoint has no columns
    fams = scrape(stage.collector)
    req = fams["tailwatch_requests"]
    assert sum(s.value for s in req.samples if s.name == "tailwatch_requests_total") == sim.totals.requests
    for status, n in sim.totals.by_status.items():
        got = sum(s.value for s in req.samples if s.name == "tailwatch_requests_total" and s.labels["outcome"] == status)
        assert got == n, status
    for name, want in (("tailwatch_turns", sim.totals.turns), ("tailwatch_successful_turns", sim.totals.successful_turns),
                       ("tailwatch_output_tokens", sim.totals.output_tokens), ("tailwatch_request_retries", sim.totals.retries)):
        assert sum(s.value for s in fams[name].samples if s.name.endswith("_total")) == want, name
    # Request GPU-seconds carry the SKU learnt from the pool's GPU samples.
    skus = {s.labels["pool"]: s.labels["gpu_sku"] for s in fams["tailwatch_request_gpu_seconds"].samples}
    assert skus and all(sku in ("L4", "H100") for sku in skus.values())
    assert skus["llm-us-east-1a-realtime"] == "H100"
    # 84 GPUs present for 6 minutes: 60 GPU-seconds each per minute.
    fleet_s = sum(s.value for s in fams["tailwatch_gpu_seconds"].samples if s.name.endswith("_total"))
    assert fleet_s == 84 * 6 * 60
    assert sum(s.value for s in fams["tailwatch_gpus"].samples) == 84
    assert {s.labels["state"] for s in fams["tailwatch_gpu_replicas"].samples} == {"warm", "loading", "cold", "draining", "unknown"}
    util = [s.value for s in fams["tailwatch_gpu_utilization_ratio"].samples]
    assert util and all(0 <= u <= 1 for u in util)
    # Latency as a histogram in seconds: cumulative buckets, +Inf = _count = every request
    # the store's sketches hold, whatever the labels are summed over.
    samples = fams["tailwatch_request_latency_seconds"].samples
    for field_name, column in (("e2e", "e2e_ms_hist"), ("queue", "queue_ms_hist")):
        stored = requests.select(pl.col(column).explode().struct.field("n").sum()).item()
        count = sum(s.value for s in samples if s.name.endswith("_count") and s.labels["field"] == field_name)
        inf = sum(s.value for s in samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"
                  and s.labels["field"] == field_name)
        assert count == inf == stored > 0
    series: dict[tuple, list[tuple[float, float]]] = {}
    for s in samples:
        if s.name.endswith("_bucket"):
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            series.setdefault(key, []).append((float(s.labels["le"]), s.value))
    for buckets in series.values():
        counts = [n for _le, n in sorted(buckets)]
        assert counts == sorted(counts)  # cumulative
    mean_e2e = (sum(s.value for s in samples if s.name.endswith("_sum") and s.labels["field"] == "e2e")
                / sum(s.value for s in samples if s.name.endswith("_count") and s.labels["field"] == "e2e"))
    assert 0 < mean_e2e < 60
    price = {s.labels["gpu_sku"]: s.value for s in fams["tailwatch_gpu_price_usd_per_gpu_second"].samples}
    assert price["H100"] == pytest.approx(4.0 / 3600) and price["L4"] == pytest.approx(0.8 / 3600)


def test_useful_utilisation_gauges_where_gpus_report_gpm(fleet):
    """The simulator's H100 pools report GPM (SMs active a share of the utilised time), its
    L4 pools do not: ratios 0-1 for the former, no series (not zeros) for the latter."""
    _sim, requests, gpu = fleet
    stage = FleetMetrics()
    stage.on_closed(requests, gpu)
    fams = scrape(stage.collector)

    def by_pool(name):
        return {s.labels["pool"]: s for s in fams[name].samples}

    gpus, util, profiled = by_pool("tailwatch_gpus"), by_pool("tailwatch_gpu_utilization_ratio"), by_pool("tailwatch_gpus_profiled")
    h100 = {p for p, s in gpus.items() if s.labels["gpu_sku"] == "H100"}
    assert h100 and set(profiled) == h100 and all(profiled[p].value == gpus[p].value for p in h100)
    for name in ("tailwatch_gpu_sm_active_ratio", "tailwatch_gpu_sm_occupancy_ratio", "tailwatch_gpu_tensor_active_ratio",
                 "tailwatch_gpu_dram_bandwidth_ratio"):
        series = by_pool(name)
        assert set(series) == h100, name
        assert all(0 < s.value < 1 for s in series.values()), name
    sm = by_pool("tailwatch_gpu_sm_active_ratio")
    assert all(sm[p].value < util[p].value for p in h100)  # utilisation reads higher than the SMs work
    # A pool whose GPUs stop reporting GPM (e.g. switched to MIG) loses those series at once.
    newest = gpu.filter(pl.col("window_start") == gpu["window_start"].max())
    newest = newest.with_columns(pl.when(pl.col("pool") == "llm-us-east-1a-realtime").then(None)
                                 .otherwise(pl.col(c)).alias(c)
                                 for c in ("sm_active_pct_mean", "sm_occupancy_pct_mean", "tensor_active_pct_mean",
                                           "dram_bw_pct_mean"))
    stage.on_closed(requests.head(0), newest.with_columns(pl.col("window_start") + pl.duration(minutes=1)))
    fams = scrape(stage.collector)
    assert "llm-us-east-1a-realtime" not in by_pool("tailwatch_gpu_sm_active_ratio")
    assert "llm-us-east-1a-realtime" not in by_pool("tailwatch_gpus_profiled")
    assert "llm-us-east-1b-realtime" in by_pool("tailwatch_gpu_sm_active_ratio")


@pytest.mark.slow
def test_counters_only_increase_and_stale_gauges_go(fleet):
    _sim, requests, gpu = fleet
    stage = FleetMetrics(FleetMetricsConfig(stale_minutes=2))
    minutes = sorted(requests["window_start"].unique())
    last = None
    for m in minutes:
        stage.on_closed(requests.filter(pl.col("window_start") == m), gpu.filter(pl.col("window_start") == m))
        fams = scrape(stage.collector)
        now = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fams["tailwatch_requests"].samples}
        if last:
            assert all(now.get(k, 0) >= v for k, v in last.items())
        last = now
    # Latency is a counter now: a retired model version's buckets stay as they were (rate 0),
    # never move backwards and never vanish mid-scrape like a stale gauge.
    only_early = requests.filter(pl.col("window_start") == minutes[0]).with_columns(pl.lit("v-retired").alias("model_version"))
    stage2 = FleetMetrics(FleetMetricsConfig(stale_minutes=2))
    stage2.on_closed(only_early, gpu.head(0))

    def retired():
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for s in scrape(stage2.collector)["tailwatch_request_latency_seconds"].samples
                if s.labels["model_version"] == "v-retired"}
    before = retired()
    assert before
    stage2.on_closed(requests.filter(pl.col("window_start") == minutes[-1]), gpu.head(0))
    assert retired() == before


def test_tenants_are_capped_into_other(fleet):
    _sim, requests, gpu = fleet
    stage = FleetMetrics(FleetMetricsConfig(max_tenants=2))
    stage.on_closed(requests, gpu)
    tenants = {s.labels["tenant"] for s in scrape(stage.collector)["tailwatch_requests"].samples}
    assert tenants == {"acme", "globex", OTHER_TENANT}  # the two busiest by name, the rest pooled
    total_requests = sum(s.value for s in scrape(stage.collector)["tailwatch_requests"].samples
                         if s.name == "tailwatch_requests_total")
    assert total_requests == requests["requests"].sum()


@pytest.mark.slow
def test_series_stay_within_the_label_set_budget_at_20000_slices():
    """The bench's 20,000 slices (inventory labels that multiply out): named label sets stop
    at the budget, the rest fold into `other`, and every total and every breakdown by a kept
    label stays exact."""
    values = [v for _k, v in synthetic_events(40_000, 20_000, seed=5, events_per_minute=20_000)]
    requests = closed_rows(values, RequestV1)
    no_gpu = pl.DataFrame()

    unbounded = FleetMetrics(FleetMetricsConfig(max_label_sets=10**9))  # read from its dicts: a scrape takes seconds
    unbounded.on_closed(requests, no_gpu)
    stage = FleetMetrics(FleetMetricsConfig(max_label_sets=300))
    stage.on_closed(requests, no_gpu)
    bounded = scrape(stage.collector)

    def label_sets(name):
        return {tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("le", "outcome", "field")))
                for s in bounded[name].samples}

    kept_products = 3 * 4 * 2 * 2  # zones × workloads × traffic classes × deployments in the bench
    for family, name in (("traffic", "tailwatch_requests"), ("request_gpu_seconds", "tailwatch_request_gpu_seconds"),
                         ("latency", "tailwatch_request_latency_seconds")):
        assert unbounded.collector.budgets[family].label_sets() > 3_000  # what the budget is for
        assert len(label_sets(name)) <= 300 + kept_products
    sets = {s.labels["family"]: s.value for s in bounded["tailwatch_fleet_label_sets"].samples}
    assert sets["latency"] == len(label_sets("tailwatch_request_latency_seconds"))
    folded = {s.labels["family"]: s.value for s in bounded["tailwatch_fleet_folded_buckets"].samples}
    assert folded["traffic"] > 0

    def scraped(name, label, sample_suffix="_total", **match):
        out: dict[str, float] = {}
        for s in bounded[name].samples:
            if s.name.endswith(sample_suffix) and all(s.labels.get(k) == v for k, v in match.items()):
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
        return out

    def truth(column, label):
        return dict(requests.group_by(label).agg(pl.col(column).sum()).iter_rows())

    assert scraped("tailwatch_requests", "zone", outcome="ok") == truth("ok", "zone")
    for label in ("workload", "traffic_class", "deployment"):
        assert sum(scraped("tailwatch_requests", label).values()) == requests["requests"].sum()
        assert scraped("tailwatch_requests", label, outcome="error") == truth("errors", label)
    assert scraped("tailwatch_request_gpu_seconds", "zone") == pytest.approx(truth("gpu_seconds", "zone"))
    e2e_by_workload: dict[str, np.ndarray] = {}
    for key, counts in unbounded.collector.latency.items():
        if key[-1] == "e2e":
            workload = key[LATENCY_LABELS.index("workload")]
            e2e_by_workload[workload] = e2e_by_workload.get(workload, 0) + np.cumsum(counts)
    for i, le in ((4, "0.25"), (8, "5.0"), (-1, "+Inf")):
        assert scraped("tailwatch_request_latency_seconds", "workload", "_bucket", le=le, field="e2e") == \
            {w: float(c[i]) for w, c in e2e_by_workload.items()}
    assert "other" in {s.labels["model"] for s in bounded["tailwatch_request_latency_seconds"].samples}


def test_price_file_sets_the_price_gauge(fleet):
    stage = FleetMetrics(FleetMetricsConfig(prices=GpuPrices({"H100": 3.25}, 1.5)))
    price = {s.labels["gpu_sku"]: s.value for s in scrape(stage.collector)["tailwatch_gpu_price_usd_per_gpu_second"].samples}
    assert price == {"H100": pytest.approx(3.25 / 3600)}


BASE_UNITS_FORBIDDEN = re.compile(r"_(ms|milliseconds|percent|pct|kb|mb|gb|minutes|hours|kilobytes|megabytes)(_|$)")
UNIT_EXCEPTIONS: set[str] = set()


@pytest.mark.slow
def test_exported_metric_names_follow_prometheus_conventions(fleet):
    """Every metric the worker exports: tailwatch_ prefix, counters end in _total and
    nothing else does, base units (seconds, bytes, ratios 0-1), snake case."""
    _sim, requests, gpu = fleet
    stage = FleetMetrics()
    stage.on_closed(requests, gpu)
    slo = SloStage(load_slos(DEFAULT_SLOS))
    slo.on_closed(requests, gpu)
    metrics = WorkerMetrics()
    metrics.registry.register(slo.collector)
    metrics.registry.register(stage.collector)
    detectors = DetectorStage(alertmanager_urls=("http://am:9093",))
    for collector in detectors.collectors():
        metrics.registry.register(collector)
    metrics.registry.register(DeliveryCollector([FiringAlerts(("http://am:9093",), stage="slo"), detectors.alerts]))
    # Touch every labelled pipeline metric so that it has a sample.
    metrics.events.labels("t", "accepted").inc()
    metrics.dead_letters.labels("t", "late").inc()
    metrics.late_events.labels("t").inc()
    metrics.unknown_fields_dropped.labels("t").inc()
    metrics.buckets_closed.labels("t").inc()
    metrics.bucket_close_delay.labels("t").observe(1)
    metrics.consumer_lag.labels("t", "0").set(1)
    metrics.watermark.labels("t").set(1)
    metrics.open_minutes.labels("t").set(1)
    metrics.dedupe_ids.labels("t").set(1)
    seen = 0
    for fam in metrics.registry.collect():
        assert fam.name.startswith("tailwatch_"), fam.name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", fam.name), fam.name
        assert fam.name in UNIT_EXCEPTIONS or not BASE_UNITS_FORBIDDEN.search(fam.name), f"{fam.name}: not a base unit"
        for s in fam.samples:
            seen += 1
            assert re.fullmatch(r"[a-z][a-z0-9_]*", s.name), s.name
            assert not s.name.endswith("_created"), f"{s.name}: _created series are off"
            if fam.type == "counter":
                assert s.name.endswith("_total"), s.name
            elif fam.type == "gauge":
                assert not s.name.endswith("_total"), f"{s.name}: a gauge named like a counter"
            # A ratio is 0-1, except a budget remaining, which goes below zero once overspent.
            if s.name.endswith("_ratio") and "budget_remaining" not in s.name:
                assert 0 <= s.value <= 1 or math.isnan(s.value), f"{s.name}={s.value}: a ratio is 0-1"
            for label in s.labels:
                assert re.fullmatch(r"[a-z][a-z0-9_]*", label) and not label.startswith("__"), label
        if fam.type == "histogram":
            assert fam.name.endswith("_seconds"), f"{fam.name}: histograms here measure time in seconds"
    assert seen > 100
    # And Prometheus' own linter, on the exposition a scrape gets.
    promtool = shutil.which("promtool")
    need(promtool is not None, "promtool (Debian package prometheus)")
    lint = subprocess.run([promtool, "check", "metrics"], input=generate_latest(metrics.registry),
                          capture_output=True, timeout=60)
    assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()[-3000:]


def test_rebuild_learns_pool_skus_from_the_store(fleet):
    import duckdb

    _sim, requests, gpu = fleet
    con = duckdb.connect()
    stage = FleetMetrics()
    stage.rebuild(con)  # a new store: nothing to learn, no error
    con.register("g", gpu.to_arrow())
    con.execute("CREATE TABLE gpu_minute AS SELECT * FROM g")
    stage.rebuild(con)
    assert stage.sku_of_pool["llm-us-east-1a-realtime"] == "H100" and stage.sku_of_pool["tts-us-east-1b-realtime"] == "L4"
    stage.on_closed(requests, gpu.head(0))  # requests before any GPU row of this run: SKUs already known
    skus = {s.labels["gpu_sku"] for s in scrape(stage.collector)["tailwatch_request_gpu_seconds"].samples}
    assert skus == {"H100", "L4"}


def test_latency_buckets_and_sums_are_each_bins_own_whatever_the_batches(fleet):
    """Each stored bin lands in the first bucket at or above its upper bound and adds its
    value × n to the sum, per label set and field, whether the minutes come in one batch or
    one at a time (a bin's bucket is worked out once per distinct bin, not per row)."""
    from tailwatch.conventions import LATENCY_LABELS as LABELS
    from tailwatch.slo import histogram
    from tailwatch.streams.fleet_metrics import _BOUNDS_MS, LATENCY_FIELDS

    _sim, requests, gpu = fleet
    want_counts: dict[tuple, list[int]] = {}
    want_sums: dict[tuple, float] = {}
    for row in requests.iter_rows(named=True):
        for field_name, column in LATENCY_FIELDS.items():
            for b in row[column] or []:
                key = (*(str(row[k] or "") for k in LABELS), field_name)
                counts = want_counts.setdefault(key, [0] * (len(_BOUNDS_MS) + 1))
                counts[int(np.searchsorted(_BOUNDS_MS, histogram.bin_upper_bound_ms(b["bin"]) * (1 - 1e-12)))] += b["n"]
                want_sums[key] = want_sums.get(key, 0.0) + histogram.bin_value_ms(b["bin"]) * b["n"] / 1000
    at_once, by_minute = FleetMetrics(), FleetMetrics()
    at_once.on_closed(requests, gpu)
    for (minute,), part in requests.partition_by("window_start", as_dict=True, maintain_order=True).items():
        by_minute.on_closed(part, gpu.filter(pl.col("window_start") == minute))
    assert len(want_counts) > 10
    for stage in (at_once, by_minute):
        got = stage.collector
        assert {k: v.tolist() for k, v in got.latency.items()} == want_counts
        assert got.latency_sum_s.keys() == want_sums.keys()
        for key, want in want_sums.items():
            assert got.latency_sum_s[key] == pytest.approx(want, rel=1e-12)


def _by_minute(frame: pl.DataFrame) -> list[pl.DataFrame]:
    return [part for _, part in sorted(frame.partition_by("window_start", as_dict=True).items())]


def test_requests_gpu_time_is_the_same_whichever_topic_closes_a_minute_first(fleet):
    """The two topics close minutes apart: a minute's requests in one checkpoint and its GPU
    samples in the next, or the other way round. The requests' GPU-seconds (busy GPU time
    shared by tokens) are those of closing both together; their other counters do not wait."""
    _sim, requests, gpu = fleet
    requests = requests.with_columns(pl.lit(None, dtype=pl.Float64).alias("gpu_seconds"))  # as vLLM reports
    empty_r, empty_g = requests.head(0), gpu.head(0)
    together = FleetMetrics()
    together.on_closed(requests, gpu)
    want = together.collector.request_gpu_seconds
    assert sum(want.values()) > 100 and {k[-1] for k in want} >= {"tokens"}
    r, g = _by_minute(requests), _by_minute(gpu)
    assert len(r) == len(g) >= 5
    requests_first, gpu_first = FleetMetrics(), FleetMetrics()
    for i in range(len(r) + 1):
        requests_first.on_closed(r[i] if i < len(r) else empty_r, g[i - 1] if i else empty_g)
        gpu_first.on_closed(r[i - 1] if i else empty_r, g[i] if i < len(g) else empty_g)
    for stage in (requests_first, gpu_first):
        got = stage.collector.request_gpu_seconds
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-9), key
        assert stage.collector.requests == together.collector.requests
        assert not stage.waiting or not pl.concat(stage.waiting).height


def test_requests_wait_for_gpu_minutes_only_where_they_may_come(fleet):
    """Before the first GPU minute every pool may have GPUs: requests wait. Once GPUs are
    known, a pool without any does not wait, nor does a pool-minute whose requests reported
    their GPU time; a GPU topic silent for `PAIRING_MINUTES` of the requests' time is taken
    as absent."""
    _sim, requests, gpu = fleet
    unreported = requests.with_columns(pl.lit(None, dtype=pl.Float64).alias("gpu_seconds"))
    stage = FleetMetrics()
    stage.on_closed(unreported, gpu.head(0))
    assert pl.concat(stage.waiting).height == unreported.height and not stage.collector.request_gpu_seconds
    stage.on_closed(unreported.head(0), gpu)
    assert not stage.waiting and {k[-1] for k in stage.collector.request_gpu_seconds} >= {"tokens"}

    stage = FleetMetrics()
    stage.on_closed(unreported.head(0), gpu.head(1))
    no_gpus = unreported.with_columns(pl.lit("pool-without-gpus").alias("pool"))
    stage.on_closed(pl.concat([no_gpus, requests.filter(pl.col("gpu_seconds") > 0)]), gpu.head(0))
    assert not stage.waiting  # neither can gain from waiting

    stage = FleetMetrics()
    stage.on_closed(unreported.head(0), gpu.filter(pl.col("window_start") == gpu["window_start"].min()))
    later = unreported.with_columns(pl.col("window_start") + pl.duration(minutes=FleetMetrics.PAIRING_MINUTES + 10))
    stage.on_closed(later, gpu.head(0))
    assert pl.concat(stage.waiting).height == later.height  # GPU minutes may still close for them
    latest = later.with_columns(pl.col("window_start") + pl.duration(minutes=FleetMetrics.PAIRING_MINUTES + 10))
    stage.on_closed(latest, gpu.head(0))
    held = pl.concat(stage.waiting)
    assert held.height == latest.height  # the earlier ones were let go, as without GPU telemetry
    assert any(k[-1] == "no_gpu_telemetry" for k in stage.collector.request_gpu_seconds)


def test_a_fleet_without_gpu_samples_holds_its_requests_only_for_the_first_hour(fleet):
    _sim, requests, gpu = fleet
    unreported = requests.with_columns(pl.lit(None, dtype=pl.Float64).alias("gpu_seconds"))
    stage = FleetMetrics()
    stage.on_closed(unreported, gpu.head(0))
    assert stage.waiting  # a start: GPU samples may yet come
    an_hour_on = unreported.with_columns(pl.col("window_start") + pl.duration(minutes=FleetMetrics.PAIRING_MINUTES))
    stage.on_closed(an_hour_on, gpu.head(0))
    assert not stage.waiting  # none came in an hour: nothing is held from now on
    stage.on_closed(an_hour_on.with_columns(pl.col("window_start") + pl.duration(minutes=5)), gpu.head(0))
    assert not stage.waiting and all(k[-1] == "no_gpu_telemetry" for k in stage.collector.request_gpu_seconds)


def test_a_close_spanning_more_than_the_pairing_window_loses_no_gpu_time(fleet):
    """A backlog closes hours at once: the GPU time of every minute is still shared out, with
    both topics in one checkpoint, or the requests first while the GPU topic is still being read."""
    _sim, requests, gpu = fleet
    requests = requests.with_columns(pl.lit(None, dtype=pl.Float64).alias("gpu_seconds"))
    span = FleetMetrics.PAIRING_MINUTES * 2
    hours_r = pl.concat([requests.with_columns(pl.col("window_start") + pl.duration(minutes=6 * i)) for i in range(span // 6)])
    hours_g = pl.concat([gpu.with_columns(pl.col("window_start") + pl.duration(minutes=6 * i)) for i in range(span // 6)])
    together = FleetMetrics()
    together.on_closed(hours_r, hours_g)
    want = together.collector.request_gpu_seconds
    assert "no_gpu_telemetry" not in {k[-1] for k in want} and sum(want.values()) > 1000
    requests_first = FleetMetrics()
    requests_first.on_closed(hours_r, hours_g.head(0), frozenset({"gpu_minute"}))
    assert not requests_first.collector.request_gpu_seconds  # the GPU topic is behind: they wait
    requests_first.on_closed(hours_r.head(0), hours_g)
    got = requests_first.collector.request_gpu_seconds
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(v, rel=1e-9) for k, v in want.items())
