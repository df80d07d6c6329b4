"""Pages that explain themselves: who holds an SLO slice's bad events at the minute it fired."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
import pytest

from tailwatch.slo.contributors import explain, top_contributors
from tailwatch.slo.spec import load_slos
from tailwatch.streams.slo_stage import SloStage
from tests.test_slo import AVAIL, spec_file

SLO = AVAIL + "    slice_by: [zone]\n"
T0 = datetime(2026, 11, 2)
M0 = int((T0 - datetime(1970, 1, 1)).total_seconds()) // 60  # T0 as an epoch minute


def _rows(minute: int, per_tenant: dict[str, tuple[int, int]], zone: str = "a", version: str = "v1") -> list[dict]:
    """(requests, errors) per tenant in one minute; workload llm."""
    return [{"window_start": T0 + timedelta(minutes=minute), "workload": "llm", "zone": zone, "tenant": tenant,
             "model_version": version, "requests": n, "ok": n - errors, "cancelled": 0}
            for tenant, (n, errors) in per_tenant.items()]


def test_the_tenant_holding_the_bad_events_is_named_with_its_traffic_share(tmp_path):
    (spec,) = load_slos(spec_file(tmp_path, SLO))
    frame = pl.DataFrame(_rows(10, {"acme": (300, 240), "globex": (400, 10), "initech": (300, 10)})
                         + _rows(10, {"acme": (50, 50)}, zone="b"))  # another slice: not counted
    found = top_contributors(spec, frame, {"zone": "a"}, M0 + 10)
    assert [(c.label, c.value) for c in found.named] == [("tenant", "acme")]  # one version: it says nothing
    (acme,) = found.named
    assert acme.bad_events == 240 and abs(acme.bad_share - 240 / 260) < 1e-9 and abs(acme.traffic_share - 0.3) < 1e-9
    assert acme.bad_total == 260 and acme.p_value < 1e-50
    assert explain(found) == f"tenant=acme holds 92% of the bad events (240 of 260; 30% of the traffic, p = {acme.p_value:.1g})"
    # Bad events spread as traffic is: nobody stands out.
    even = pl.DataFrame(_rows(10, {"acme": (300, 30), "globex": (300, 30)}))
    assert top_contributors(spec, even, {"zone": "a"}, M0 + 10).named == ()
    # Another minute: nothing to name.
    assert top_contributors(spec, frame, {"zone": "a"}, M0 + 11) is None


def test_a_page_that_fires_carries_its_contributors_to_alertmanager_and_the_store(tmp_path):
    (spec,) = load_slos(spec_file(tmp_path, SLO))
    stage = SloStage([spec], alertmanager_urls=("http://127.0.0.1:9",))
    healthy = [r for m in range(60) for r in _rows(m, {"acme": (500, 0), "globex": (500, 0)})]
    stage.on_closed(pl.DataFrame(healthy), pl.DataFrame())
    # From minute 60 the new version's errors: one tenant's traffic runs on it.
    bad = [r for m in range(60, 75) for r in _rows(m, {"acme": (500, 200)}, version="v2")
           + _rows(m, {"globex": (500, 0)})]
    out = stage.on_closed(pl.DataFrame(bad), pl.DataFrame())
    fired = out["alerts"].filter(pl.col("state") == "firing")
    assert fired.height >= 1
    detail = fired["detail"][0]
    assert detail.startswith("tenant=acme holds 100% of the bad events (200 of 200; 50% of the traffic, p = 6e-61)"), detail
    assert "model_version=v2 holds 100% of the bad events (200 of 200; 50% of the traffic" in detail
    stage.committed()  # the checkpoint holding them is durable: handed to the outbox
    payloads = [p for p in stage.alerts.outboxes[0].pending if p["labels"]["alertname"].startswith("SLOBurn")]
    assert payloads and payloads[0]["annotations"]["description"] == detail
    # The signal API's /v1/alerts says the same.
    from tailwatch.planning.prices import GpuPrices
    from tailwatch.signals.live import LiveSignals, SignalPolicy

    view = LiveSignals(SignalPolicy(), [spec], GpuPrices()).snapshot(
        pl.DataFrame(), pl.DataFrame(), stage.states(), wall_s=0.0, alert_details=stage.details())
    assert [a.detail for a in view.alerts if a.fingerprint == fired["fingerprint"][0]] == [detail]


def _one_slice_at_a_time(spec, buckets, slice_labels, minute, most=3, alpha=0.01, min_bad_events=5):
    """The reference: one slice filtered out of the minute's rows, each label grouped, each
    value's binomial tail worked out one at a time."""
    from tailwatch.slo.binomial import binomial_tail  # checked against scipy.stats below

    from tailwatch.slo.contributors import CONTRIBUTOR_LABELS, Contributor
    from tailwatch.slo.sli import good_valid_exprs, with_later_counts

    rows = spec.selected(with_later_counts(buckets))
    picked = (pl.col("window_start").dt.epoch("s") // 60) == minute
    for label, value in slice_labels.items():
        picked = picked & (pl.col(label) == value).fill_null(False)
    good, valid = good_valid_exprs(spec)
    labels = [lb for lb in CONTRIBUTOR_LABELS if lb in rows.columns and lb not in spec.slice_by]
    counted = rows.filter(picked).select(*labels, (valid - good).alias("_bad"), valid.alias("_valid"))
    bad_total, valid_total = counted["_bad"].sum(), counted["_valid"].sum()
    if not bad_total or not valid_total:
        return None
    candidates = []
    for label in labels:
        g = counted.group_by(label).agg(pl.col("_bad").sum(), pl.col("_valid").sum()).drop_nulls(label)
        if g.height >= 2:
            candidates += [(label, value, bad, traffic) for value, bad, traffic in g.iter_rows() if bad > 0]
    found = []
    for label, value, bad, traffic in candidates:
        share = traffic / valid_total
        p = float(binomial_tail(bad - 1, bad_total, share))
        if bad >= min_bad_events and p * len(candidates) <= alpha and bad / bad_total > share:
            found.append(Contributor(label, str(value), int(bad), bad / bad_total, share, int(bad_total), p))
    found.sort(key=lambda c: (c.p_value, -(c.bad_share - c.traffic_share), CONTRIBUTOR_LABELS.index(c.label)))
    named = {c.label for c in found}
    holding = [label for label, *_ in candidates]
    spread = tuple((label, holding.count(label)) for label in labels if label not in named and holding.count(label) >= 2)
    return found[:most], spread


def test_every_slice_and_minute_at_once_names_what_one_slice_at_a_time_names(tmp_path):
    """A checkpoint where thousands of pages fire, over the many minutes of a backlog, works
    their contributors out in a few group-bys (it once took 24 s a minute at 20,000 slices
    and 100 SLOs): same answers, minute by minute."""
    import random

    from tailwatch.slo.contributors import contributors_by_minute, contributors_by_slice

    (spec,) = load_slos(spec_file(tmp_path, SLO))
    rng = random.Random(7)
    rows = []
    for minute in (10, 11, 13):
        for zone in "abcdefgh":
            for tenant in ("acme", "globex", "initech", "hooli"):
                for version in ("v1", "v2"):
                    n = rng.randint(1, 400)
                    rows += _rows(minute, {tenant: (n, rng.choice([0, 0, n // 10, n // 2, n]))}, zone=zone,
                                  version=version)
    frame = pl.DataFrame(rows)
    by_minute = contributors_by_minute(spec, frame, [M0 + 10, M0 + 13, M0 + 12])
    assert set(by_minute) <= {M0 + 10, M0 + 13}  # minute 11 not asked for, 12 holds no rows
    named = 0
    for minute in (10, 13):
        every = contributors_by_slice(spec, frame, M0 + minute)
        for zone in "abcdefgh":
            want = _one_slice_at_a_time(spec, frame, {"zone": zone}, M0 + minute)
            for got in (every.get((zone,)), by_minute.get(M0 + minute, {}).get((zone,))):
                assert (got is None) == (want is None), (minute, zone)
                if got is not None:
                    assert list(got.named) == want[0] and got.spread == want[1], (minute, zone)
            named += bool(want and want[0])
    assert named >= 6


def test_a_page_names_the_language_and_the_voice_that_hold_the_bad_events(tmp_path):
    """A TTS availability SLO by zone; German traffic on one voice fails. The page, its
    Alertmanager description and /v1/alerts name the language and the voice with their shares."""
    (spec,) = load_slos(spec_file(tmp_path, SLO))

    def rows(minute: int, failing: bool) -> list[dict]:
        out = []
        for language, voice, n in (("en-us", "neutral", 600), ("de-de", "premium-2", 200), ("es-es", "neutral", 200)):
            errors = n // 2 if failing and language == "de-de" else 0
            out.append({"window_start": T0 + timedelta(minutes=minute), "workload": "llm", "zone": "a",
                        "tenant": "acme", "model_version": "v1", "language": language, "voice": voice,
                        "requests": n, "ok": n - errors, "cancelled": 0})
        return out

    stage = SloStage([spec], alertmanager_urls=("http://127.0.0.1:9",))
    stage.on_closed(pl.DataFrame([r for m in range(60) for r in rows(m, False)]), pl.DataFrame())
    out = stage.on_closed(pl.DataFrame([r for m in range(60, 75) for r in rows(m, True)]), pl.DataFrame())
    fired = out["alerts"].filter(pl.col("state") == "firing")
    assert fired.height >= 1
    detail = fired["detail"][0]
    assert "language=de-de holds 100% of the bad events (100 of 100; 20% of the traffic, p = 1e-70)" in detail, detail
    assert "voice=premium-2 holds 100% of the bad events (100 of 100; 20% of the traffic, p = 1e-70)" in detail, detail
    stage.committed()
    payloads = [p for p in stage.alerts.outboxes[0].pending if p["labels"]["alertname"].startswith("SLOBurn")]
    assert payloads and payloads[0]["annotations"]["description"] == detail
    from tailwatch.planning.prices import GpuPrices
    from tailwatch.signals.live import LiveSignals, SignalPolicy

    view = LiveSignals(SignalPolicy(), [spec], GpuPrices()).snapshot(
        pl.DataFrame(), pl.DataFrame(), stage.states(), wall_s=0.0, alert_details=stage.details())
    assert [a.detail for a in view.alerts if a.fingerprint == fired["fingerprint"][0]] == [detail]


def _failing_rows(minute: int, per_tenant: dict[str, tuple[int, int]], ooms: bool = False) -> list[dict]:
    """(requests, errors) per tenant in one minute of one zone, with the status columns the
    worker's buckets carry; `ooms`: every error ran out of memory."""
    return [{**r, "errors": errors, "timeouts": 0, "shed": 0, "ooms": errors if ooms else 0}
            for r, (_, errors) in zip(_rows(minute, per_tenant), per_tenant.values())]


def _page_detail(spec, healthy: list[dict], failing: list[dict]) -> str:
    stage = SloStage([spec], alertmanager_urls=("http://127.0.0.1:9",))
    stage.on_closed(pl.DataFrame(healthy), pl.DataFrame())
    out = stage.on_closed(pl.DataFrame(failing), pl.DataFrame())
    fired = out["alerts"].filter(pl.col("state") == "firing")
    assert fired.height >= 1
    return fired["detail"][0]


TENANTS = ("acme", "globex", "initech", "hooli", "umbrella")


def test_bad_events_spread_evenly_over_tenants_name_no_tenant(tmp_path):
    """9% of one model's requests fail evenly across five tenants: the page names nobody
    and says over how many tenants the bad events are spread; 2 bad events on one tenant
    (100% of the bad events) are no evidence either."""
    (spec,) = load_slos(spec_file(tmp_path, SLO))
    healthy = [r for m in range(60) for r in _failing_rows(m, {t: (20, 0) for t in TENANTS})]
    # 9 bad events a minute over 100 requests, the extra one moving round the tenants.
    failing = [r for m in range(60, 75)
               for r in _failing_rows(m, {t: (20, 2 if i != m % 5 else 1) for i, t in enumerate(TENANTS)})]
    detail = _page_detail(spec, healthy, failing)
    assert "tenant=" not in detail, detail
    assert "bad events are spread as traffic is over 5 tenants: no value stands out" in detail, detail
    # Two bad events, both on one tenant of five: a tie broken by nothing but chance.
    two = pl.DataFrame(_failing_rows(10, {t: (20, 2 if t == "hooli" else 0) for t in TENANTS}))
    culprits = top_contributors(spec, two, {"zone": "a"}, M0 + 10)
    assert culprits.named == () and culprits.bad_events == 2
    assert "hooli" not in explain(culprits)


def test_a_tenant_holding_more_bad_events_than_its_traffic_is_named_with_its_share_and_p(tmp_path):
    (spec,) = load_slos(spec_file(tmp_path, SLO))
    # acme: 20% of the traffic, 30 of the 39 bad events.
    frame = pl.DataFrame(_failing_rows(10, {"acme": (40, 30), "globex": (40, 3), "initech": (40, 2), "hooli": (40, 2),
                                            "umbrella": (40, 2)}))
    culprits = top_contributors(spec, frame, {"zone": "a"}, M0 + 10)
    (acme,) = culprits.named
    assert (acme.label, acme.value, acme.bad_events, acme.bad_total) == ("tenant", "acme", 30, 39)
    assert acme.traffic_share == pytest.approx(0.2) and acme.p_value < 1e-10
    assert explain(culprits).startswith(f"tenant=acme holds 77% of the bad events (30 of 39; 20% of the traffic, "
                                        f"p = {acme.p_value:.1g})")
    # Below the minimum count, however lopsided: 4 of 4 on one tenant is not named.
    few = pl.DataFrame(_failing_rows(10, {"acme": (40, 4), "globex": (40, 0), "initech": (40, 0)}))
    assert top_contributors(spec, few, {"zone": "a"}, M0 + 10).named == ()


def test_an_oom_burst_page_says_oom(tmp_path):
    """OOMs hit every tenant alike: no tenant stands out, and the page's description names
    the status reason."""
    (spec,) = load_slos(spec_file(tmp_path, SLO))
    healthy = [r for m in range(60) for r in _failing_rows(m, {t: (100, 0) for t in TENANTS})]
    failing = [r for m in range(60, 75) for r in _failing_rows(m, {t: (100, 20) for t in TENANTS}, ooms=True)]
    detail = _page_detail(spec, healthy, failing)
    assert detail.startswith("status_reason=oom on 100 of the 100 bad events"), detail
    assert "tenant=" not in detail


def test_binomial_tail_agrees_with_scipy_stats_binom_sf():
    """The contributors' p-values, computed without scipy (slow to import in a worker): within
    5e-8 of scipy's `binom.sf` (relative) from a handful of events to ten million, edges
    included (k past n, p of 0 and 1), and every decision at the alphas pages use the same."""
    import numpy as np
    from scipy.stats import binom

    from tailwatch.slo.binomial import binomial_tail

    rng = np.random.default_rng(3)
    for most in (3_000, 10_000_000):
        n = rng.integers(1, most, 5_000)
        k = rng.integers(0, most, 5_000) % (n + 3)
        p = rng.random(5_000)
        p[:200], p[200:400] = 0.0, 1.0
        k[400:600] = n[400:600]
        k[600:800] = n[600:800] - 1
        ours, ref = binomial_tail(k, n, p), binom.sf(k, n, p)
        shown = ref > 1e-280  # below, both are as good as zero
        np.testing.assert_allclose(ours[shown], ref[shown], rtol=5e-8, atol=0)
        assert (ours[~shown] < 1e-270).all()
        for alpha in (0.01, 0.01 / 20, 1e-6):
            assert ((ours <= alpha) == (ref <= alpha)).all()
        np.testing.assert_array_equal(binomial_tail(k.astype(float) + 0.5, n, p), ours)  # k is floored


def test_a_worker_that_names_culprits_never_imports_scipy():
    import subprocess
    import sys

    code = ("import sys, numpy as np; from tailwatch.slo.binomial import binomial_tail; "
            "binomial_tail(np.array([3]), np.array([40]), np.array([0.1])); "
            "assert not [m for m in sys.modules if m.startswith('scipy')], 'scipy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_page_names_the_open_detection_whose_scope_holds_its_bad_events(tmp_path):
    """Open detections are a contributor dimension: one on part of the slice is named on the
    binomial evidence label values need, one on the whole slice as open over it; one holding
    no more than its share, or not open at the page's minute, is not named."""
    from tailwatch.slo.contributors import OpenDetection

    (spec,) = load_slos(spec_file(tmp_path, SLO))
    stage = SloStage([spec])
    storm = OpenDetection("retry_storm", {"tenant": "acme"}, M0 + 58)
    quiet = OpenDetection("queue_age", {"tenant": "globex"}, M0 + 58)  # open, but its tenant fails as traffic does
    over = OpenDetection("tenant_starving", {"tenant": "acme"}, M0 + 10, ended_at=M0 + 30)  # closed before the page
    zone_wide = OpenDetection("kv_cache_pressure", {"zone": "a", "node": "gpu-node-7"}, M0 + 59)  # node: no request column
    stage.open_detections = lambda: [storm, quiet, over, zone_wide]
    stage.on_closed(pl.DataFrame([r for m in range(60) for r in _rows(m, {"acme": (500, 0), "globex": (500, 0)})]),
                    pl.DataFrame())
    bad = [r for m in range(60, 75) for r in _rows(m, {"acme": (500, 200), "globex": (500, 1)})]
    fired = stage.on_closed(pl.DataFrame(bad), pl.DataFrame())["alerts"].filter(pl.col("state") == "firing")
    assert fired.height >= 1
    detail = fired["detail"][0]
    assert "retry_storm (tenant=acme) open since 2026-11-02 00:58 holds 100% of the bad events (200 of 201; " \
           "50% of the traffic, p = " in detail, detail
    assert "kv_cache_pressure (node=gpu-node-7,zone=a) open since 2026-11-02 00:59 over the whole slice" in detail
    assert "queue_age" not in detail and "tenant_starving" not in detail
    # No detections open: the page says what the labels prove, and nothing of detections.
    stage2 = SloStage([spec])
    stage2.on_closed(pl.DataFrame([r for m in range(60) for r in _rows(m, {"acme": (500, 0), "globex": (500, 0)})]),
                     pl.DataFrame())
    plain = stage2.on_closed(pl.DataFrame(bad), pl.DataFrame())["alerts"].filter(pl.col("state") == "firing")
    assert "open since" not in plain["detail"][0] and plain["detail"][0].startswith("tenant=acme holds")


def test_the_worker_hands_its_detector_stages_open_detections_to_the_slo_stage(memory, tmp_path):
    """`build` wires them: what the detector stage holds open is what a page is explained with."""
    from tailwatch.detectors.core import Detection
    from tailwatch.slo.contributors import OpenDetection
    from tailwatch.slo.spec import DEFAULT_SLOS
    from tailwatch.streams.detector_stage import detector_stages
    from tailwatch.streams.store_sink import StoreSink
    from tests.test_pipeline import worker

    w = worker(memory, tmp_path / "tw.duckdb", slos=load_slos(DEFAULT_SLOS), stages=detector_stages("default"))
    slo = next(s for s in w.sink(StoreSink).stages if isinstance(s, SloStage))
    (detectors,) = [s for s in w.sink(StoreSink).stages if s.name == "detectors"]
    assert slo.open_detections() == []
    detectors.collector.open = [Detection("retry_storm", {"workload": "llm", "zone": "a"}, M0 + 3)]
    assert slo.open_detections() == [OpenDetection("retry_storm", {"workload": "llm", "zone": "a"}, M0 + 3)]
