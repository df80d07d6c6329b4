"""Cost without per-request GPU-seconds: a vLLM fleet reports tokens and its GPUs' utilisation,
never GPU time per request. The public Azure code trace (token counts and arrival times from
the trace, GPU time per request from its prefill/decode model) is sent that way through the
real broker and worker, and the cost report shares each pool-minute's busy GPU time by tokens,
with the basis named; checked against the GPU time each request really took."""

from __future__ import annotations

import datetime as dt
import shutil
from collections import defaultdict

import duckdb
import msgspec
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tailwatch.ingest.schema import GpuV1
from tailwatch_dev.trace import TraceReplay, read_any_trace
from tailwatch.reports.cost_report import SCALES_VIEW, attribution_bases, build_report, minute_scales, render_html
from tailwatch.planning.prices import GpuPrices
from tailwatch.store.queries import query_frame
from tailwatch.store.attribution import attributed_sql
from tailwatch.streams.rollup import RollUp
from tailwatch.streams.fleet_metrics import FleetMetrics
from tests.test_fleet_metrics import closed_buckets, scrape
from tests.test_pipeline import publish, run_worker
from tailwatch_dev.traces import AZURE_CODE_TRACE

GPUS_PER_POOL = 4


def vllm_events() -> tuple[list, list, list]:
    """(the trace's requests with their true GPU-seconds, the same as vLLM reports them, GPU minutes)."""
    truth = list(TraceReplay(rows=read_any_trace(AZURE_CODE_TRACE), seed=3).events())  # 40 minutes
    busy: dict[tuple[str, str, int], float] = defaultdict(float)  # (zone, pool, minute) → true GPU-seconds
    for r in truth:
        busy[(r.zone, r.pool, r.ts // 60_000)] += r.gpu_seconds
    gpus = [GpuV1(schema="gpu.v1", ts=minute * 60_000 + 30_000, node=f"{pool}-node", gpu_index=i, zone=zone,
                  pool=pool, gpu_sku="H100", util_pct=round(min(100.0, 100 * seconds / (GPUS_PER_POOL * 60)), 4),
                  source="dcgm")
            for (zone, pool, minute), seconds in busy.items() for i in range(GPUS_PER_POOL)]
    # What vLLM reports: no gpu_seconds on any request.
    return truth, [msgspec.structs.replace(r, gpu_seconds=None) for r in truth], gpus


@pytest.fixture(scope="module")
def vllm_store(new_memory, tmp_path_factory):
    truth, requests, gpus = vllm_events()
    # One more request and GPU minute three hours on, so that the trace's hour can be rolled up.
    later = truth[-1].ts + 3 * 3_600_000
    requests.append(msgspec.structs.replace(requests[0], event_id="later", ts=later))
    gpus.append(msgspec.structs.replace(gpus[0], ts=later))
    settings = new_memory(partitions=1)
    publish(settings, sorted([*requests, *gpus], key=lambda e: e.ts))
    path = tmp_path_factory.mktemp("vllm") / "store.duckdb"
    run_worker(settings, path)
    return path, truth


def trace_hours(con) -> tuple[dt.datetime, dt.datetime]:
    first = con.execute("SELECT min(window_start) FROM sli_minute").fetchall()[0][0]
    start = first.replace(minute=0)
    return start, start + dt.timedelta(hours=1)


def attributed_rows(con, start, end) -> pl.DataFrame:
    scales = minute_scales(con, start, end)
    con.register(SCALES_VIEW, scales.select("minute", pl.col("pool").alias("scaled_pool"), "attribution_scale"))
    try:
        return query_frame(con, f"SELECT * FROM ({attributed_sql(SCALES_VIEW)})", {"start": start, "end": end})
    finally:
        con.unregister(SCALES_VIEW)


def test_busy_gpu_time_is_shared_by_tokens_close_to_what_each_slice_took(vllm_store):
    path, truth = vllm_store
    con = duckdb.connect(str(path), read_only=True)
    rows = attributed_rows(con, *trace_hours(con))
    con.close()
    assert rows.height > 100 and set(rows["attribution_basis"]) == {"tokens"}
    weight = rows["prompt_token_weight"].unique().to_list()
    assert all(0 < w < 0.05 for w in weight), weight  # the trace's model: 0.12 ms a prompt token, 28 an output token

    true = defaultdict(float)
    for r in truth:
        true[(r.ts // 60_000, r.pool, r.tenant, r.zone)] += r.gpu_seconds
    got = {(int(m.timestamp()) // 60, p, t, z): a for m, p, t, z, a in rows.select(
        "window_start", "pool", "tenant", "zone", "gpu_seconds_attributed").iter_rows()}
    assert set(got) == set(true)
    total = sum(true.values())
    # The pool-minute's busy GPU time is all attributed, and nothing more.
    assert sum(got.values()) == pytest.approx(total, rel=1e-6)
    token_error = sum(abs(got[k] - true[k]) for k in true) / total
    # Against a split by request count, which ignores how long each answer was:
    count = defaultdict(int)
    per_pool_minute = defaultdict(int)
    busy = defaultdict(float)
    for r in truth:
        count[(r.ts // 60_000, r.pool, r.tenant, r.zone)] += 1
        per_pool_minute[(r.ts // 60_000, r.pool)] += 1
        busy[(r.ts // 60_000, r.pool)] += r.gpu_seconds
    by_count = {k: busy[k[:2]] * n / per_pool_minute[k[:2]] for k, n in count.items()}
    count_error = sum(abs(by_count[k] - true[k]) for k in true) / total
    print(f"attribution error against the truth: by tokens {token_error:.4f}, by request count {count_error:.4f}")
    assert token_error < 0.10 and token_error < count_error / 3, (token_error, count_error)


def test_the_cost_report_prices_a_vllm_fleet_and_names_its_basis(vllm_store):
    path, _truth = vllm_store
    con = duckdb.connect(str(path), read_only=True)
    report = build_report(con, str(path), *trace_hours(con), GpuPrices())
    bases = attribution_bases(con, report.range.start, report.range.end, minute_scales(con, report.range.start,
                                                                                       report.range.end))
    con.close()
    detail = report.daily.detail
    assert detail["attributed_cost_usd"].sum() > 0
    per_turn = detail.filter(pl.col("successful_turns") > 0)["attributed_cost_per_successful_turn_usd"]
    assert per_turn.null_count() == 0 and (per_turn > 0).all()
    assert set(bases["basis"]) == {"tokens"} and bases["minutes"].sum() >= 3
    page = render_html(report, lambda _line: None)
    assert "Attributed by" in page and "<td class=\"l\">tokens</td>" in page


def test_an_hour_rolled_up_keeps_the_estimate_the_report_made(vllm_store, tmp_path):
    path, _truth = vllm_store
    copy = tmp_path / "rolled.duckdb"
    shutil.copy(path, copy)
    con = duckdb.connect(str(copy))
    hour = trace_hours(con)
    before = build_report(con, str(copy), *hour, GpuPrices()).daily.detail
    con.execute("BEGIN")
    assert RollUp(60).roll(con) >= 1
    con.execute("COMMIT")
    assert con.execute("SELECT count(*) FROM sli_minute WHERE window_start < ?", [hour[1]]).fetchall()[0][0] == 0
    after = build_report(con, str(copy), *hour, GpuPrices()).daily.detail
    con.close()
    assert after["attributed_cost_usd"].sum() > 0
    assert_frame_equal(before.sort("tenant", "model", "workload"), after.sort("tenant", "model", "workload"),
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9)


def test_the_live_gpu_time_counter_shares_busy_time_by_tokens_with_its_basis(vllm_store):
    """The worker's fleet metrics (dashboards' cost panels) apply the same rules to the minutes
    they close, with the hour's fit as far as it has come."""
    path, truth = vllm_store
    _truth, requests, gpus = vllm_events()
    req_rows, gpu_rows = closed_buckets([*requests, *gpus])
    stage = FleetMetrics()
    for (minute,), part in req_rows.partition_by("window_start", as_dict=True, maintain_order=True).items():
        stage.on_closed(part, gpu_rows.filter(pl.col("window_start") == minute))
    samples = [s for s in scrape(stage.collector)["tailwatch_request_gpu_seconds"].samples if s.name.endswith("_total")]
    assert {s.labels["attribution_basis"] for s in samples} == {"tokens"}
    live, true = defaultdict(float), defaultdict(float)
    for s in samples:
        live[s.labels["tenant"]] += s.value
    for r in truth:
        true[r.tenant] += r.gpu_seconds
    assert sum(live.values()) == pytest.approx(sum(true.values()), rel=1e-6)  # all of the busy time, no more
    con = duckdb.connect(str(path), read_only=True)
    report = attributed_rows(con, *trace_hours(con)).group_by("tenant").agg(pl.col("gpu_seconds_attributed").sum())
    con.close()
    for tenant, attributed in report.iter_rows():
        assert live[tenant] == pytest.approx(attributed, rel=0.02), tenant  # the report's fit saw the whole hour
        assert live[tenant] == pytest.approx(true[tenant], rel=0.03), tenant


@pytest.mark.slow
def test_a_busy_vllm_pool_is_not_read_as_idle_by_the_autoscaler(vllm_store):
    """Demand is GPU time; requests that report none must not make a busy pool's demand zero
    (which would ask KEDA for the minimum). The backtest replays what the live view answers."""
    from tailwatch.backtest import read_buckets, replay

    path, truth = vllm_store
    requests, gpu = read_buckets(str(path))
    busy = defaultdict(float)
    for r in truth:
        busy[(r.pool, r.ts // 60_000)] += r.gpu_seconds
    checked = 0
    for minute, snap in replay(requests, gpu):
        for pool, scoped in snap.pools.items():
            demand = scoped.body.signals.work_gpu_s_per_s
            window = [busy.get((pool, m), 0.0) for m in range(minute - 5, minute)]
            if len(window) == 5 and all(window) and scoped.as_of_minute == minute:
                assert demand == pytest.approx(sum(window) / 300, rel=0.02), (pool, minute)
                checked += 1
    assert checked > 50
