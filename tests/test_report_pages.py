"""The report pages as a reader sees them: the period they cover, partial days, one cost basis
named alike in both reports, headers that say their unit, and tables that fit a 1,400 px
window in a real browser (headless Chromium). The store is two hours of the demo's fleet,
simulator → topics in memory → real worker → DuckDB file."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess

import pytest

from tailwatch.cli import main
from tests.conftest import need
from tests.test_reports import _store_from

MODEL = "llama-3.1-70b"


@pytest.fixture(scope="module")
def two_hour_store(new_memory, tmp_path_factory):
    """Two hours of the demo's mixed fleet: a slow canary from 00:55, batch jobs in a realtime pool."""
    # A tenth of the demo's traffic: enough requests for the rollout verdict to act on the canary.
    path, _ = _store_from(new_memory, tmp_path_factory, "mixed-fleet", 120, "2026-11-02T00:00:00Z", rate_scale=0.1)
    return path


@pytest.fixture(scope="module")
def pages(two_hour_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("pages")
    assert main(["report", "cost", "--store", str(two_hour_store), "--out", str(out / "cost")]) == 0
    assert main(["report", "readiness", "--model", MODEL, "--store", str(two_hour_store),
                 "--out", str(out / "readiness")]) == 0
    return out


def test_period_words_and_rates():
    from tailwatch.reports import period
    assert period.span_text(dt.timedelta(hours=2)) == "2 h"
    assert period.span_text(dt.timedelta(days=1, hours=3, minutes=20)) == "1 d 3 h 20 min"
    assert period.day_label(dt.date(2026, 11, 2), 120) == "2026-11-02 (2 h of 24)"
    assert period.day_label(dt.date(2026, 11, 2), 7) == "2026-11-02 (7 min of 24 h)"
    assert period.day_label(dt.date(2026, 11, 2), 1440) == "2026-11-02"
    assert period.per_day_rate(10.0, dt.timedelta(hours=2)) is None  # two hours are not a day's spend
    assert period.per_day_rate(10.0, dt.timedelta(days=2)) == pytest.approx(5.0)
    assert period.minute_range_text(dt.datetime(2026, 11, 2), dt.datetime(2026, 11, 2, 2)) \
        == "2026-11-02 00:00 to 01:59 UTC"


@pytest.mark.slow  # two hours of the fleet through a worker first
def test_cost_report_of_two_hours_says_two_hours_not_a_day(pages):
    page = (pages / "cost" / "report.html").read_text()
    sub = re.search(r'<p class=\'sub\' id="period">(.*?)</p>', page).group(1)
    # The first and last minute with data, and the requested range (the default: the last day).
    assert "Data from 2026-11-02 00:00 to 01:59 UTC (2 h), part of the requested range" in sub, sub
    assert "requested 2026-11-02T00:00Z to 2026-11-03T00:00Z" in sub, sub
    assert "2026-11-02 (2 h of 24)" in page  # the day row says it holds two hours
    assert "fleet GPU cost, fully loaded, over 2 h of data" in page
    assert 'id="per-day-rate"' not in page  # no rate from two hours


@pytest.mark.slow  # two hours of the fleet through a worker first
def test_readiness_names_its_period_basis_and_units(pages, two_hour_store, tmp_path):
    page = (pages / "readiness" / "readiness.html").read_text()
    report = json.loads((pages / "readiness" / "readiness.json").read_text())
    sub = re.search(r"<p class='sub' id='period'>(.*?)</p>", page).group(1)
    assert f"data for {MODEL} from 2026-11-02 00:00 to 01:59 UTC (2 h)" in sub, sub
    # Two peaks, named apart; KV cache as a percentage beside the other percentages.
    assert "GPU memory peak (% of the GPU&#39;s)" in page and "GPU memory peak (GiB)" in page
    assert "KV cache use, max (%)" in page
    kv = report["memory"][0]["kv_cache_usage_max"]
    assert kv is not None and 0 < kv <= 1 and f"{100 * kv:,.2f}%" in page
    # The cost basis leads with the one the cost report and the budget judge use, named so.
    first = report["cost"][0]
    assert first["basis"].startswith("fully loaded") and first["version"] == "all"
    assert all(r["basis"].startswith("attributed") for r in report["cost"][1:])
    import polars as pl
    rows = pl.read_csv(pages / "cost" / "cost.csv").filter(pl.col("model") == MODEL)
    assert first["cost per successful turn USD"] == pytest.approx(
        rows["fully_loaded_cost_usd"].sum() / rows["successful_turns"].sum(), rel=1e-9)
    assert "Attributed cost per successful turn" not in page


# Appended to a copy of a report page (never to the product's pages, which carry no script):
# for every table box, whether its table is wider than the box, i.e. scrolls or is clipped.
MEASURE = """<script>
const out = [...document.querySelectorAll('.wide')].map((w, i) => ({
  table: i, heading: (w.previousElementSibling || {}).textContent || '',
  box_px: w.clientWidth, table_px: w.scrollWidth}));
const pre = document.createElement('pre'); pre.id = 'tw-measure'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow  # two hours of the fleet through a worker first
def test_every_table_fits_a_1400px_window_in_chromium(pages, tmp_path):
    """Headless Chromium lays each page out at 1,400 × 4,000 px; a copy of the page with a short
    script appended measures every table against its box (scrollWidth against clientWidth) and
    writes the figures into the DOM, which `--dump-dom` prints once the page has loaded
    (`--virtual-time-budget`). A table wider than its box scrolls sideways or is clipped:
    a column the reader cannot see. The script lives only in the copy."""
    chromium = _chromium()
    need(chromium is not None, "chromium (apt-get install chromium)")
    for name in ("cost/report.html", "readiness/readiness.html"):
        copy = tmp_path / name.replace("/", "-")
        copy.write_text((pages / name).read_text().replace("</body>", MEASURE + "</body>"))
        r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,4000",
                            "--virtual-time-budget=5000", "--dump-dom", copy.as_uri()],
                           capture_output=True, text=True, timeout=60)
        found = re.search(r'<pre id="tw-measure">(.*?)</pre>', r.stdout, re.S)
        assert found, (name, r.stderr[-1500:])
        tables = json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
                            .replace("&quot;", '"'))
        assert len(tables) >= 5, (name, tables)
        wider = [t for t in tables if t["table_px"] > t["box_px"]]
        assert not wider, (name, wider)


@pytest.mark.slow  # two hours of the fleet through a worker first
def test_verdict_chart_shows_the_window_the_verdict_judged(two_hour_store):
    """The canary is slow from 00:55 to 01:25. Minute by minute its p95 recovers at 01:25; the
    rollout verdict compares its trailing 30 minutes and says rollback for longer. The chart
    plots that trailing window, so its line stays high while the verdict band lasts."""
    from tailwatch.reports.readiness import judged_quantile, verdict_bands
    from tailwatch.signals.live import SignalPolicy
    from tailwatch.backtest import backtest_rollout, read_buckets

    requests, gpu = read_buckets(str(two_hour_store), None, None, models=[MODEL])
    policy = SignalPolicy()
    minutes, judged = judged_quantile(requests, "first_output_ms_hist", 0.95, policy.rollout_window_minutes)
    _, per_minute = judged_quantile(requests, "first_output_ms_hist", 0.95, 1)
    steps = backtest_rollout(requests, gpu, MODEL, "2024-11", policy).steps
    bands = verdict_bands(tuple((s.minute, s.verdict) for s in steps))
    rollback = [b for b in bands if b[2] == "rollback"]
    assert rollback, bands
    start = minutes[0]
    recovered = start + 90  # 01:30: five minutes after the slowdown ended
    i = minutes.index(recovered)
    assert per_minute["2024-11"][i] < 1.5 * per_minute["2024-07"][i]  # this minute alone looks healthy
    assert judged["2024-11"][i] > 1.5 * judged["2024-07"][i]  # the window the verdict reads does not
    assert any(a <= recovered < b for a, b, _ in rollback), (recovered, rollback)
