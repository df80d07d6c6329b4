"""The generated dashboards against a real Prometheus scraping a live worker.

A real `prometheus` (Debian package) scrapes the worker's `/metrics` every second while
the simulator feeds the mixed-fleet scenario through the embedded broker, paced so that
minutes close over wall-clock time, with malformed records and an unknown field from a
misbehaving producer. Once an SLO page and ticket fire (the zone-b LLM error spike), every
query of every panel and annotation of every generated dashboard goes through
Prometheus's HTTP API, while traffic still flows: range queries for time-series panels
(what Grafana runs for them), instant queries for stat and table panels. Each must
succeed and return at least one series with a finite value. A page's dashboard link is
then followed: its `var-…` presets, put into the SLO-detail dashboard's queries, must
give data too.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from itertools import groupby
from pathlib import Path

import msgspec
import pytest

from tailwatch.alerts.alertmanager import AlertLinks, to_alertmanager
from tailwatch.dashboards.common import QUIET
from tailwatch.dashboards.uids import UID_FLEET, UID_SLO
from tailwatch.dashboards.generate import build_all, problems, queries, write
from tailwatch.ingest.producer import EventPublisher
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.slo.engine import AlertChange
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.streams.fleet_metrics import FleetMetrics
from tailwatch.streams.tiers import WorkerSettings, build
from tailwatch_dev.demo import BAD_RECORDS
from tailwatch.ingest.kafka import KafkaSettings, ensure_topics, send
from tests.conftest import free_port, need, start_until_ready

PROMETHEUS = shutil.which("prometheus")
SCRAPE_S = 1
RATE_WINDOW = "10s"  # what $__rate_interval is for a 1 s scrape and short ranges: ≥ 4 scrapes
SECONDS_PER_MINUTE = 0.35  # wall-clock pacing of one simulated minute
MINUTES = 75


def start_prometheus(tmp_path, target_port: int) -> tuple[subprocess.Popen, str]:
    need(PROMETHEUS is not None, "prometheus (Debian package)")
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""
global:
  scrape_interval: {SCRAPE_S}s
  evaluation_interval: {SCRAPE_S}s
scrape_configs:
  - job_name: tailwatch
    static_configs:
      - targets: ['127.0.0.1:{target_port}']
""")
    return start_until_ready("Prometheus", [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                             port, tmp_path / "prometheus.log")


def api(url: str, path: str, **params) -> dict:
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # a bad query answers 400 with the error in the body
        return json.loads(exc.read())


def concrete(expr: str, variables: dict[str, str], range_s: int) -> str:
    """Substitute what Grafana would: template variables, $__rate_interval, $__range."""
    expr = expr.replace("$__rate_interval", RATE_WINDOW).replace("$__range", f"{range_s}s")
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), ".*"), expr)


def has_finite_value(result: list[dict]) -> bool:
    for series in result:
        values = series.get("values") or [series.get("value")]
        if any(v and math.isfinite(float(v[1])) for v in values):
            return True
    return False


class Feed:
    """Publishes the simulator minute by minute, paced, in a thread (the live fleet)."""

    def __init__(self, kafka: KafkaSettings):
        self.kafka = kafka
        self.minutes_sent = 0
        self.done = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        pub = EventPublisher(self.kafka)
        requests = self.kafka.topic("requests")
        for raw in BAD_RECORDS:  # a misbehaving producer: dead letters by reason
            send(pub.producer, requests, raw, b"bad")
        sim = FleetSimulator("mixed-fleet", minutes=MINUTES, seed=11, rate_scale=0.3, eval_share=0.05)
        first = True
        for _minute, events in groupby(sim.events(), key=lambda e: e.ts // 60_000):
            if self.stop.is_set():
                break
            started = time.monotonic()
            batch = list(events)
            if first:  # a field outside the schema, dropped at ingest and counted
                raw = json.loads(json.dumps({f: getattr(batch[0], f) for f in batch[0].__struct_fields__
                                             if getattr(batch[0], f) is not None}))
                raw["prompt"] = "never stored"
                send(pub.producer, self.kafka.topic("requests" if raw["schema"] == "request.v1" else "gpu"),
                     json.dumps(raw).encode(), b"x")
                first = False
            pub.publish_events(batch)
            pub.producer.flush(10)
            self.minutes_sent += 1
            time.sleep(max(0.0, SECONDS_PER_MINUTE - (time.monotonic() - started)))
        pub.close()
        self.done.set()


def live_worker(broker, tmp, feed_class, prefix: str):
    """A worker with its HTTP port scraped by a real Prometheus, fed live by `feed_class`."""
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=f"{prefix}{uuid.uuid4().hex[:8]}.")
    # One partition: the simulator's six tenants all hash to partition 0 of 2 (CRC32), and an
    # empty partition holds every minute open while the worker runs live (no idle close).
    ensure_topics(kafka, partitions=1)
    http_port = free_port()
    # The feed is 45 minutes of a new store: its tickets are judged without the young-window
    # rule, which would hold the 1-day and 3-day windows for 2 and 6 hours of history.
    specs = [dataclasses.replace(s, young_share=0.0) for s in load_slos(DEFAULT_SLOS)]
    worker = build(WorkerSettings(
        kafka=kafka, store_path=str(tmp / "tw.duckdb"), group_id=f"g-{uuid.uuid4().hex[:6]}", http_port=http_port,
        allowed_lateness_s=60.0, checkpoint_interval_s=0.5, slos=specs, stages=[FleetMetrics()],
    ))
    worker_thread = threading.Thread(target=worker.run, daemon=True)
    worker_thread.start()
    prom, url = start_prometheus(tmp, http_port)
    feed = feed_class(kafka)
    started = time.time()

    def stop_worker() -> None:
        """The feed and the worker stopped, its store closed (so a report can read it)."""
        feed.stop.set()
        feed.thread.join(10)
        worker.stop()
        worker_thread.join(30)

    try:
        feed.thread.start()
        yield {"url": url, "worker": worker, "feed": feed, "started": started, "specs": specs, "tmp": tmp,
               "stop_worker": stop_worker}
    finally:
        stop_worker()
        prom.kill()
        prom.wait(10)


@pytest.fixture(scope="module")
def live(broker, tmp_path_factory):
    yield from live_worker(broker, tmp_path_factory.mktemp("dashboards"), Feed, "t")


def wait_for_alerts(url: str, feed: Feed, timeout_s: float = 60.0) -> None:
    """Until both a page and a ticket fire (the zone-b LLM error spike, minutes 30-42)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        severities = {r["metric"].get("severity") for r in
                      api(url, "query", query="tailwatch_alerts_firing > 0").get("data", {}).get("result", [])}
        if {"page", "ticket"} <= severities:
            return
        assert not feed.done.is_set(), "the simulated incident never paged"
        time.sleep(0.5)
    pytest.fail(f"no page and ticket within {timeout_s:.0f} s ({feed.minutes_sent} minutes sent)")


def quiet_panels(dashboards: list[dict]) -> set[str]:
    """Panels that are empty when all is well (no detection open): their no-data text says so."""
    return {f"{d['uid']} / {p['title']}" for d in dashboards for p in d["panels"]
            if (p.get("fieldConfig", {}).get("defaults", {}).get("noValue") or "").startswith(QUIET)}


def run_queries(url: str, dashboards: list[dict], started: float, variables: dict[str, str]) -> tuple[int, list[str]]:
    """Every query through Prometheus; the failures (an error, or no data on a panel that
    should have some: a quiet panel may be empty)."""
    quiet = quiet_panels(dashboards)
    now = time.time()
    range_s = max(60, int(now - started) + 5)
    failures, checked = [], 0
    for d in dashboards:
        for where, expr, instant in queries(d):
            promql = concrete(expr, variables, range_s)
            if instant:
                answer = api(url, "query", query=promql, time=f"{now:.3f}")
            else:
                answer = api(url, "query_range", query=promql, start=f"{now - range_s:.3f}", end=f"{now:.3f}", step="2")
            checked += 1
            if answer.get("status") != "success":
                failures.append(f"{where}: {answer.get('error')}\n    {promql}")
            elif not has_finite_value(answer["data"]["result"]) and where.rsplit(" / ", 1)[0] not in quiet:
                failures.append(f"{where}: no data\n    {promql}")
    return checked, failures


@pytest.mark.alone  # bounds on wall-clock data age: run by itself, after the parallel part
@pytest.mark.slow
def test_every_panel_query_returns_data_from_a_real_prometheus(live):
    url, feed = live["url"], live["feed"]
    wait_for_alerts(url, feed)
    time.sleep(3 * SCRAPE_S)  # a few scrapes after the alerts, so rates over them have two samples
    dashboards = build_all(live["specs"])
    checked, failures = run_queries(url, dashboards, live["started"], {})
    assert not failures, f"{len(failures)} of {checked} queries failed:\n" + "\n".join(failures)
    # The why row's pages table may be empty on a quiet fleet; with a page firing it lists
    # the paging slice, with its SLO and slice labels.
    fleet = next(d for d in dashboards if d["uid"] == UID_FLEET)
    why = next(p for p in fleet["panels"] if p["title"] == "Pages firing by slice")
    rows = api(url, "query", query=why["targets"][0]["expr"])["data"]["result"]
    assert rows and all(r["metric"].get("slo") and r["metric"].get("zone") is not None for r in rows), rows
    panel_count = sum(1 for d in dashboards for _ in d["panels"])
    print(f"\n{len(dashboards)} dashboards, {panel_count} panels, {checked} queries answered with data by Prometheus")
    assert checked >= 80


def test_page_link_presets_the_slo_dashboard_with_data(live):
    """A page's dashboard_url opens the SLO-detail dashboard on its SLO and slice."""
    url = live["url"]
    wait_for_alerts(url, live["feed"])
    firing = api(url, "query", query='tailwatch_alerts_firing{severity="page"} > 0')["data"]["result"]
    labels = firing[0]["metric"]
    spec = next(s for s in live["specs"] if s.name == labels["slo"])
    slice_labels = {k: labels[k] for k in spec.slice_by}
    change = AlertChange("firing", "fp", "SLOBurnPage", "page", spec.name, slice_labels, 0, 0,
                         spec.alert_windows[0], 20.0, 30.0, 0.5)
    link = urllib.parse.urlsplit(to_alertmanager(change, spec.runbook, AlertLinks())["annotations"]["dashboard_url"])
    assert link.path.endswith(f"/d/{UID_SLO}")
    preset = {k.removeprefix("var-"): v for k, v in urllib.parse.parse_qsl(link.query)}
    slo_dashboard = next(d for d in build_all(live["specs"]) if d["uid"] == UID_SLO)
    names = {v["name"] for v in slo_dashboard["templating"]["list"]}
    assert set(preset) <= names, f"link sets {set(preset) - names}, which the SLO dashboard lacks"
    assert preset["slo"] == spec.name and all(preset[k] == v for k, v in slice_labels.items())
    checked, failures = run_queries(url, [slo_dashboard], live["started"], preset)
    assert not failures, "\n".join(failures)
    assert checked >= 10


class VllmFeed(Feed):
    """The public Azure code trace as a vLLM fleet reports it, paced: requests with tokens and
    latencies but no gpu_seconds, task_success or finish_reason; GPUs with utilisation only
    (stock dcgm-exporter: no profiling fields, no runtime gauges)."""

    def _run(self):
        from tests.test_cost_estimate import vllm_events

        _truth, requests, gpus = vllm_events()
        requests = [msgspec.structs.replace(r, task_success=None) for r in requests]
        pub = EventPublisher(self.kafka)
        for _minute, events in groupby(sorted([*requests, *gpus], key=lambda e: e.ts), key=lambda e: e.ts // 60_000):
            if self.stop.is_set():
                break
            started = time.monotonic()
            pub.publish_events(list(events))
            pub.producer.flush(10)
            self.minutes_sent += 1
            time.sleep(max(0.0, VLLM_SECONDS_PER_MINUTE - (time.monotonic() - started)))
        if not self.stop.is_set():
            # A request and a GPU sample hours on close every minute of the trace (the marker's
            # own minute stays open): the worker's counters then hold all of the trace.
            later = requests[-1].ts + VLLM_MARKER_AFTER_MS
            pub.publish_events([msgspec.structs.replace(requests[-1], event_id="marker", ts=later),
                                msgspec.structs.replace(gpus[-1], ts=later)])
            pub.producer.flush(10)
        pub.close()
        self.done.set()


VLLM_SECONDS_PER_MINUTE = 0.6
VLLM_MARKER_AFTER_MS = 3 * 3_600_000


@pytest.fixture(scope="module")
def vllm_live(broker, tmp_path_factory):
    yield from live_worker(broker, tmp_path_factory.mktemp("vllm-dashboards"), VllmFeed, "v")


@pytest.mark.alone  # bounds on wall-clock data age: run by itself, after the parallel part
def test_a_vllm_fleet_gets_data_or_the_reason_on_every_panel(vllm_live):
    """What a fleet of vLLM servers sends (no per-request GPU time, no stream endings, no
    profiling fields): every query has data or its panel names the field it lacks, and the cost
    panels have data (GPU time shared by tokens)."""
    url, feed = vllm_live["url"], vllm_live["feed"]
    deadline = time.time() + 60
    while feed.minutes_sent < 25 and time.time() < deadline:
        time.sleep(0.2)
    assert feed.minutes_sent >= 25 and not feed.done.is_set()
    dashboards = build_all(vllm_live["specs"])
    checked, failures = run_queries(url, dashboards, vllm_live["started"], {})
    reasons = {f"{d['uid']} / {p['title']}": (p.get("options", {}).get("noValue")
                                              or p.get("fieldConfig", {}).get("defaults", {}).get("noValue"))
               for d in dashboards for p in d["panels"]}
    # An annotation without data draws nothing (no page fired): it is not a panel that reads empty.
    failures = [f for f in failures if " / annotation " not in f.split("\n")[0]]
    without_data = [f.split("\n")[0].rsplit(" / ", 1)[0] for f in failures]
    unexplained = [w for w in without_data if not (reasons.get(w) or "").startswith("No data: needs")]
    print(f"\nvLLM-shaped fleet: {checked} queries, {checked - len(failures)} with data, "
          f"{len(failures)} without data and with their reason, {len(unexplained)} unexplained")
    assert not unexplained, "\n".join(f for f in failures if f.split("\n")[0].rsplit(" / ", 1)[0] in unexplained)
    # Cost per successful turn and GPU spend have data though no request carries gpu_seconds.
    cost = {f"tailwatch-cost / {t}" for t in ("GPU spend per hour", "GPU cost per successful turn",
                                              "GPU cost per successful turn by model", "GPU cost per successful turn by tenant",
                                              "GPU cost per 1,000 output tokens by model", "GPU spend per hour by tenant")}
    assert cost <= set(reasons) and not cost & set(without_data), cost & set(without_data)
    assert checked - len(failures) >= 70


def over_the_worker_life(expr: str) -> str:
    """A panel's PromQL with each `rate(counter[$__rate_interval])` read as the counter's total
    since the worker started: the panel's value over all of the traffic (every ratio of rates
    is then a ratio of totals), without rate()'s extrapolation at a window's edges."""
    return re.sub(r"\brate\(([^\[\]]+)\[\$__rate_interval\]\)", r"(\1)", expr)


def panel_values(url: str, dashboard: dict, title: str, label: str | None) -> dict[str, float]:
    """label value (or "" for a single-value panel) → the panel's value over the worker's life."""
    (target,) = next(p for p in dashboard["panels"] if p["title"] == title)["targets"]
    promql = concrete(over_the_worker_life(target["expr"]), {}, 60)
    assert "rate(" not in promql, promql
    answer = api(url, "query", query=promql)
    assert answer["status"] == "success", answer
    return {(r["metric"].get(label, "") if label else ""): float(r["value"][1]) for r in answer["data"]["result"]}


def test_a_vllm_fleets_cost_panels_equal_the_cost_report(vllm_live):
    """No request carries GPU-seconds: the cost panels price the GPU minutes the GPU samples
    show (idle included) as the cost report does from the same worker's store, and agree with
    it: cost per successful turn in all and by model, per 1,000 output tokens by model, spend
    and idle cost, to the rounding of floats; by
    tenant within the token weight's fit (below)."""
    import duckdb
    import polars as pl

    from tailwatch.dashboards.common import UID_COST
    from tailwatch.planning import cost
    from tailwatch.planning.prices import GpuPrices
    from tailwatch.reports.cost_report import build_report

    url, feed = vllm_live["url"], vllm_live["feed"]
    assert feed.done.wait(120) and not feed.stop.is_set(), "the trace was not sent in full"
    # until every minute of the trace is closed and scraped: the turn counter holds still
    turns, still_since = None, time.time()
    while time.time() - still_since < 4 * SCRAPE_S:
        result = api(url, "query", query="sum(tailwatch_successful_turns_total)")["data"]["result"]
        now_turns = float(result[0]["value"][1]) if result else None
        if now_turns != turns:
            turns, still_since = now_turns, time.time()
        time.sleep(0.5)
    board = next(d for d in build_all(vllm_live["specs"]) if d["uid"] == UID_COST)
    per_turn = panel_values(url, board, "GPU cost per successful turn", None)[""]
    by_model = panel_values(url, board, "GPU cost per successful turn by model", "model")
    by_tenant = panel_values(url, board, "GPU cost per successful turn by tenant", "tenant")
    spend_per_hour = panel_values(url, board, "GPU spend per hour", None)[""]
    idle_per_hour = panel_values(url, board, "Idle GPU cost per hour", None)[""]
    per_1k_tokens = panel_values(url, board, "GPU cost per 1,000 output tokens by model", "model")

    vllm_live["stop_worker"]()
    con = duckdb.connect(str(vllm_live["tmp"] / "tw.duckdb"), read_only=True)
    first = con.execute("SELECT min(window_start) FROM sli_minute").fetchall()[0][0]
    # the trace's 40 minutes, not the marker's minute hours later
    report = build_report(con, "tw.duckdb", first, first + dt.timedelta(hours=2), GpuPrices())
    con.close()
    detail = report.daily.detail
    total = cost.rollup(detail, []).to_dicts()[0]
    by_model_report = cost.rollup(detail, ["model"]).to_dicts()
    models = {r["model"]: r["cost_per_successful_turn_usd"] for r in by_model_report}
    models_1k = {r["model"]: r["cost_per_1k_output_tokens_usd"] for r in by_model_report}
    tenants = {r["tenant"]: r["cost_per_successful_turn_usd"] for r in cost.rollup(detail, ["tenant"]).to_dicts()}
    print(f"\ncost per successful turn: panel ${per_turn:.8f}, report ${total['cost_per_successful_turn_usd']:.8f} "
          f"({int(total['successful_turns'])} turns, report spend ${total['fully_loaded_cost_usd']:.4f}, "
          f"panel ${spend_per_hour / 3600:.4f})")
    for name in sorted(tenants):
        print(f"  tenant {name}: panel ${by_tenant.get(name, float('nan')):.8f}, report ${tenants[name]:.8f}")
    assert turns == total["successful_turns"] > 100
    assert per_turn == pytest.approx(total["cost_per_successful_turn_usd"], rel=1e-6)
    assert spend_per_hour / 3600 == pytest.approx(total["fully_loaded_cost_usd"], rel=1e-6)
    assert idle_per_hour / 3600 == pytest.approx(total["idle_cost_usd"], rel=1e-6)
    assert per_1k_tokens == pytest.approx(models_1k, rel=1e-6)
    assert set(by_model) == set(models)
    for name, value in models.items():
        assert by_model[name] == pytest.approx(value, rel=1e-6), name
    # Tenants share a pool's busy time by tokens, a prompt token weighted by a fit of the pool's
    # hour: the live panel has the hour's fit as far as it has come, the report the whole
    # hour's (store/attribution.py), so a tenant's share moves by the difference of the two.
    assert set(by_tenant) == set(tenants)
    for name, value in tenants.items():
        assert by_tenant[name] == pytest.approx(value, rel=0.025), name


def test_dashboard_json_structure(tmp_path):
    specs = load_slos(DEFAULT_SLOS)
    paths = write(specs, tmp_path)
    assert len(paths) == 7
    uids = set()
    for path in paths:
        d = json.loads(path.read_text())
        assert problems(d) == [], path.name
        uids.add(d["uid"])
        assert d["schemaVersion"] >= 36 and d["title"].startswith("tailwatch / ")
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
        for p in d["panels"]:
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        if d["uid"] not in (UID_SLO, "tailwatch-pipeline"):
            assert {"tenant", "model", "zone", "workload"} <= set(variables), d["uid"]
            assert variables["tenant"]["allValue"] == ".*" and "label_values(" in variables["tenant"]["query"]
    assert len(uids) == 7
    # Regenerating gives byte-identical files: stable uids and ids, so re-imports replace.
    again = write(specs, tmp_path / "again")
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]


def test_burn_rate_panels_draw_the_alert_thresholds():
    specs = load_slos(DEFAULT_SLOS)
    slo_dashboard = next(d for d in build_all(specs) if d["uid"] == UID_SLO)
    drawn = {}
    for p in slo_dashboard["panels"]:
        if p["title"].startswith("Burn rate, "):
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"
            drawn[p["title"].split(",")[1].split(":")[0].strip()] = [s["value"] for s in steps[1:]]
    # asr-wer's fast page is capped at 6.25× (a WER above 50%): 14.4× of an 8% budget could never fire.
    assert drawn == {"page-fast": [6.25, 14.4], "page-slow": [6.0], "ticket-fast": [3.0], "ticket-slow": [1.0]}
    variables = {v["name"] for v in slo_dashboard["templating"]["list"]}
    assert {"slo", "zone", "model_version"} <= variables
    assert AlertLinks().dashboard_base_url.endswith(f"/d/{UID_SLO}")


def test_cli_generates_and_the_shipped_json_is_current(tmp_path, capsys):
    from tailwatch.cli import main

    assert main(["dashboards", "generate", "--slos", "default", "--out", str(tmp_path)]) == 0
    assert f"wrote 7 dashboards for {len(load_slos(DEFAULT_SLOS))} SLOs" in capsys.readouterr().out
    shipped = Path(__file__).resolve().parents[1] / "tailwatch" / "dashboards" / "json"
    for path in sorted(tmp_path.glob("*.json")):
        assert (shipped / path.name).read_text() == path.read_text(), \
            f"tailwatch/dashboards/json/{path.name} is stale: run `tailwatch dashboards generate --slos default --out tailwatch/dashboards/json`"
    bad = tmp_path / "bad.yaml"
    bad.write_text("slos: [{name: x}]\n")
    assert main(["dashboards", "generate", "--slos", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "--slos" in capsys.readouterr().err


def test_tables_name_their_columns_and_colour_the_budget():
    """Grafana calls merged value columns "Value #A" … "Value #E"; every table renames them,
    and the fleet table's budget and burn columns carry thresholds."""
    dashboards = build_all(load_slos(DEFAULT_SLOS))
    tables = [(d["uid"], p) for d in dashboards for p in d["panels"] if p["type"] == "table"]
    assert len(tables) >= 6
    for uid, p in tables:
        renames = next(t["options"]["renameByName"] for t in p["transformations"] if t["id"] == "organize")
        expected = ["Value"] if len(p["targets"]) == 1 else [f"Value #{t['refId']}" for t in p["targets"]]
        assert sorted(renames) == sorted(expected) and all(renames.values()), (uid, p["title"], renames)
    fleet = next(p for uid, p in tables if p["title"].startswith("SLOs: budget left"))
    columns = next(t["options"]["renameByName"] for t in fleet["transformations"] if t["id"] == "organize")
    assert list(columns.values())[:2] == ["Budget left", "Burn 1h"] and list(columns.values())[-2:] == ["Pages", "Tickets"]
    by_column = {o["matcher"]["options"]: {x["id"]: x["value"] for x in o["properties"]} for o in fleet["fieldConfig"]["overrides"]}
    budget_steps = by_column["Budget left"]["thresholds"]["steps"]
    assert [s["color"] for s in budget_steps] == ["red", "orange", "green"] and budget_steps[1]["value"] == 0
    assert by_column["Burn 1h"]["thresholds"]["steps"][-1] == {"color": "red", "value": 14.4}
    # A panel without a description, or a table column without a name, is refused at build.
    from tailwatch.dashboards.common import Q as Query, table, timeseries

    with pytest.raises(ValueError, match="no description"):
        timeseries("x", "s", [Query("up")], description=" ")
    with pytest.raises(ValueError, match="column name"):
        table("x", "s", [Query("up", instant=True)], description="d")


def test_the_why_row_lists_open_detections_with_slice_and_evidence():
    """The detectors' open conditions are series with their slice labels and evidence (the
    per-detector gauge has no slice), and the overview and SLO-detail dashboards show them."""
    from prometheus_client import CollectorRegistry
    from tailwatch.detectors.core import Detection
    from tailwatch.streams.detector_stage import OPEN_DETECTION_SERIES, DetectorCollector

    collector = DetectorCollector(["retry_storm", "queue_age"])
    collector.open = [Detection("retry_storm", {"zone": "us-east-1c", "model": "whisper", "workload": "asr"}, 29_000_000 + i,
                                None, {"retry_ratio": 0.3125, "requests": 1234.0, "why": "retries"})
                      for i in range(OPEN_DETECTION_SERIES + 5)]
    registry = CollectorRegistry()
    registry.register(collector)
    samples = [s for m in registry.collect() if m.name == "tailwatch_detection_started_timestamp_seconds" for s in m.samples]
    assert len(samples) == OPEN_DETECTION_SERIES  # bounded, newest first
    newest = max(samples, key=lambda s: s.value)
    assert newest.value == (29_000_000 + OPEN_DETECTION_SERIES + 4) * 60
    assert newest.labels["zone"] == "us-east-1c" and newest.labels["detector"] == "retry_storm"
    assert newest.labels["tenant"] == "" and newest.labels["evidence"] == "requests=1.23e+03 retry_ratio=0.312 why=retries"
    for uid in (UID_FLEET, UID_SLO):
        d = next(d for d in build_all(load_slos(DEFAULT_SLOS)) if d["uid"] == uid)
        why = next(p for p in d["panels"] if p["title"] == "Why: detections open now")
        assert why["targets"][0]["expr"].startswith("tailwatch_detection_started_timestamp_seconds")
        assert why["fieldConfig"]["defaults"]["noValue"].startswith(QUIET)
