"""Pages through a real Alertmanager (Debian's prometheus-alertmanager), on loopback.

Alertmanager forwards to a webhook receiver that the test runs, so what is asserted is
what a pager integration would receive: the page, its labels and links, and its
resolution.
"""

import shutil
import time
import uuid

import duckdb
import pytest

from tailwatch.alerts.alertmanager import AlertLinks, AlertmanagerOutbox, to_alertmanager
from tailwatch.ingest.producer import EventPublisher
from tailwatch_dev.simulator import FleetSimulator
from tailwatch.slo.engine import AlertChange
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.slo.alert_windows import default_catalog
from tailwatch.streams.tiers import WorkerSettings, build
from tailwatch_dev.chaos import Webhook as ChaosWebhook, alertmanager_config
from tests.conftest import free_port, need, start_until_ready

AM_BIN = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class Webhook(ChaosWebhook):
    """Collects what Alertmanager posts to its webhook receiver (dev/tailwatch_dev/chaos.py's)."""

    def alerts(self):
        return [a for n in self.notifications for a in n["alerts"]]

    def wait_for(self, predicate, timeout_s=30):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            found = [a for a in self.alerts() if predicate(a)]
            if found:
                return found
            time.sleep(0.2)
        return []


def start_alertmanager(tmp_path, webhook_port, port=None, log_level="info"):
    need(AM_BIN is not None, "prometheus-alertmanager (Debian package)")
    port = port or free_port()
    cfg = tmp_path / f"am-{port}.yml"
    cfg.write_text(alertmanager_config(webhook_port, "[alertname, slo]"))
    return start_until_ready("Alertmanager", [AM_BIN, f"--config.file={cfg}", f"--web.listen-address=127.0.0.1:{port}",
                                              f"--storage.path={tmp_path / f'am-data-{port}'}", "--cluster.listen-address=",
                                              f"--log.level={log_level}"],
                             port, tmp_path / f"am-{port}.log", timeout_s=20)


def start_alertmanager_cluster(tmp_path, webhook_port, size=2):
    """`size` Alertmanagers gossiping as one cluster (each the peer of the first), every one
    notifying the webhook: [(process, URL)], once every instance sees all the others.

    The n-th instance waits n × peer timeout before it notifies, and notifies only what the
    gossiped notification log does not hold yet; that deduplicates only while the peer
    timeout (plus gossip) is shorter than the group interval, as in production (15 s against
    5 m). Scaled down here: 0.5 s against 2 s, gossip every 50 ms."""
    import json
    import urllib.request

    need(AM_BIN is not None, "prometheus-alertmanager (Debian package)")
    cfg = tmp_path / "am-cluster.yml"
    cfg.write_text(alertmanager_config(webhook_port, "['...']", group_interval="2s"))
    members, first_peer = [], None
    try:
        for i in range(size):
            port, gossip = free_port(), free_port()
            argv = [AM_BIN, f"--config.file={cfg}", f"--web.listen-address=127.0.0.1:{port}",
                    f"--storage.path={tmp_path / f'am-data-{port}'}", f"--cluster.listen-address=127.0.0.1:{gossip}",
                    "--cluster.peer-timeout=500ms", "--cluster.gossip-interval=50ms", "--log.level=debug"]
            if first_peer:
                argv.append(f"--cluster.peer={first_peer}")
            members.append(start_until_ready("Alertmanager", argv, port, tmp_path / f"am-{port}.log", timeout_s=20))
            first_peer = first_peer or f"127.0.0.1:{gossip}"
        deadline = time.time() + 30
        for _proc, url in members:
            while len(json.load(urllib.request.urlopen(url + "/api/v2/status", timeout=2))["cluster"]["peers"]) < size:
                assert time.time() < deadline, f"{url} did not see {size} peers"
                time.sleep(0.3)
    except BaseException:  # the instances started so far would outlive the test
        for proc, _url in members:
            proc.kill()
            proc.wait()
        raise
    return members


def change(state, minute, started):
    (spec,) = [s for s in load_slos(DEFAULT_SLOS) if s.name == "llm-realtime-availability"]
    return spec, AlertChange(state, "fp1", "SLOBurnPage", "page", spec.name, {"zone": "us-east-1b", "model_version": "v1"},
                             minute, started, default_catalog()[0], 20.0, 50.0, 0.4)


def test_page_and_resolution_reach_the_receiver(tmp_path):
    hook = Webhook()
    proc, url = start_alertmanager(tmp_path, hook.port)
    try:
        now_min = int(time.time()) // 60
        spec, fired = change("firing", now_min - 3, now_min - 3)
        box = AlertmanagerOutbox(url)
        box.put(to_alertmanager(fired, spec.runbook, AlertLinks()))
        assert box.flush()
        firing = hook.wait_for(lambda a: a["status"] == "firing")
        assert firing, "Alertmanager never notified the page"
        a = firing[0]
        assert a["labels"]["alertname"] == "SLOBurnPage" and a["labels"]["severity"] == "page"
        assert a["labels"]["slo"] == "llm-realtime-availability" and a["labels"]["zone"] == "us-east-1b"
        assert a["annotations"]["runbook_url"].endswith("runbooks/slo-burn.md")
        assert "var-zone=us-east-1b" in a["annotations"]["dashboard_url"]
        assert "20.0x over 1h" in a["annotations"]["summary"]
        _, resolved = change("resolved", now_min - 1, now_min - 3)
        box.put(to_alertmanager(resolved, spec.runbook, AlertLinks()))
        assert box.flush()
        assert hook.wait_for(lambda a: a["status"] == "resolved"), "the resolution never reached the receiver"
    finally:
        proc.kill()


def test_outbox_keeps_changes_while_alertmanager_is_down(tmp_path):
    hook = Webhook()
    port = free_port()
    box = AlertmanagerOutbox(f"http://127.0.0.1:{port}", timeout_s=1, max_backoff_s=1)
    now_min = int(time.time()) // 60
    spec, fired = change("firing", now_min - 2, now_min - 2)
    box.put(to_alertmanager(fired, spec.runbook, AlertLinks()))
    assert not box.flush() and len(box.pending) == 1 and box.failures == 1
    assert not box.flush()  # inside the backoff: no new attempt yet
    assert box.failures == 1
    proc, url = start_alertmanager(tmp_path, hook.port, port=port)
    try:
        deadline = time.time() + 15
        while not box.flush() and time.time() < deadline:
            time.sleep(0.2)
        assert not box.pending and box.delivered == 1
        assert hook.wait_for(lambda a: a["labels"].get("slo") == spec.name)
    finally:
        proc.kill()


@pytest.mark.slow
def test_simulated_incident_pages_through_broker_worker_and_alertmanager(kafka, tmp_path):
    hook = Webhook()
    proc, url = start_alertmanager(tmp_path, hook.port)
    try:
        sim = FleetSimulator("mixed-fleet", minutes=60, seed=7)
        pub = EventPublisher(kafka)
        pub.publish_events(sim.events())
        pub.close()
        store = tmp_path / "tw.duckdb"
        w = build(WorkerSettings(kafka=kafka, store_path=str(store), group_id=f"g-{uuid.uuid4().hex[:6]}",
                                  http_port=None, until_idle_s=2.0, slos=load_slos(DEFAULT_SLOS), alertmanager_urls=(url,)))
        assert w.run() == 0
        # The zone-b LLM error spike (minutes 30-42) pages on the fast window for zone us-east-1b.
        pages = hook.wait_for(lambda a: a["labels"].get("slo") == "llm-realtime-availability"
                              and a["labels"].get("zone") == "us-east-1b" and a["labels"]["severity"] == "page")
        assert pages, f"no page for the zone-b incident; got {[a['labels'] for a in hook.alerts()][:5]}"
        con = duckdb.connect(str(store), read_only=True)
        rows = con.execute("""SELECT alert_window, fired_at, resolved_at FROM alerts
                              WHERE slo = 'llm-realtime-availability' AND labels LIKE '%us-east-1b%'
                              AND alert_window = 'page-fast'""").fetchall()
        assert rows and all(r[2] is not None and r[1] < r[2] for r in rows)
        fired_minute = min(r[1] for r in rows)
        assert fired_minute.hour == 0 and 30 <= fired_minute.minute <= 45  # during the incident, event time
        assert con.execute("SELECT count(*) FROM slo_status").fetchone()[0] > 0
        from prometheus_client import generate_latest

        exposition = generate_latest(w.metrics.registry).decode()
        for name in ("tailwatch_slo_objective_ratio", "tailwatch_slo_sli_ratio", "tailwatch_slo_burn_rate",
                     "tailwatch_slo_error_budget_remaining_ratio", "tailwatch_alerts_firing", "tailwatch_slo_events_total"):
            assert f"\n{name}{{" in exposition, name
        burn_line = next(line for line in exposition.splitlines()
                         if line.startswith("tailwatch_slo_burn_rate{") and 'slo="llm-realtime-availability"' in line)
        assert 'zone="us-east-1b"' in burn_line or 'zone="us-east-1' in burn_line
        assert "tenant=" not in burn_line  # only the SLO's slice labels (and others' left empty)
        resolved = hook.wait_for(lambda a: a["status"] == "resolved" and a["labels"].get("zone") == "us-east-1b"
                                 and a["labels"]["alertname"] == "SLOBurnPage")
        assert resolved, "Alertmanager never reported the page resolved"
    finally:
        proc.kill()


@pytest.mark.slow
def test_pages_raised_while_alertmanager_is_down_survive_the_worker_and_arrive_later(kafka, tmp_path):
    """The outbox is in the store: a page that fired and resolved while Alertmanager was
    down, in a worker that ended before it could deliver, is delivered by the next worker."""
    sim = FleetSimulator("mixed-fleet", minutes=60, seed=7)
    pub = EventPublisher(kafka)
    pub.publish_events(sim.events())
    pub.close()
    store, am_port, group = tmp_path / "tw.duckdb", free_port(), f"g-{uuid.uuid4().hex[:6]}"
    url = f"http://127.0.0.1:{am_port}"  # nothing listens there yet
    settings = dict(kafka=kafka, store_path=str(store), group_id=group, http_port=None, until_idle_s=2.0,
                    slos=load_slos(DEFAULT_SLOS), alertmanager_urls=(url,))
    assert build(WorkerSettings(**settings)).run() == 0
    con = duckdb.connect(str(store), read_only=True)
    fired = con.execute("SELECT count(*) FROM alerts WHERE alertname = 'SLOBurnPage'").fetchone()[0]
    undelivered = con.execute("SELECT count(*) FROM _tw_alert_outbox WHERE stage = 'slo'").fetchone()[0]
    assert fired > 0 and undelivered >= fired and con.execute("SELECT count(*) FROM _tw_alert_delivered").fetchone()[0] == 0
    con.close()

    proc, _ = start_alertmanager(tmp_path, Webhook().port, port=am_port, log_level="debug")
    try:
        assert build(WorkerSettings(**settings)).run() == 0  # nothing new to read: it only delivers
        log = (tmp_path / f"am-{am_port}.log").read_text()
        received = [line for line in log.splitlines() if "Received alert" in line and "SLOBurnPage" in line]
        assert len(received) >= fired, log[-2000:]
        con = duckdb.connect(str(store), read_only=True)
        assert con.execute("SELECT max(seq) FROM _tw_alert_delivered WHERE stage = 'slo'").fetchone()[0] == undelivered - 1
    finally:
        proc.kill()


def test_every_page_goes_to_every_alertmanager_and_one_down_holds_back_nothing(tmp_path):
    """HA as Alertmanager documents it: every alert to every instance, no load balancing.
    The second instance is down when the page fires; the first gets it at once, the second
    as soon as it is back."""
    from tailwatch.alerts.alertmanager import FiringAlerts

    hooks = [Webhook(), Webhook()]
    first, url_first = start_alertmanager(tmp_path, hooks[0].port)
    second_port = free_port()
    alerts = FiringAlerts((url_first, f"http://127.0.0.1:{second_port}"), stage="slo")
    second = None
    try:
        now_min = int(time.time()) // 60
        spec, fired = change("firing", now_min - 2, now_min - 2)
        alerts.change("fp1", True, to_alertmanager(fired, spec.runbook, AlertLinks()), seq=0)
        alerts.deliver()
        assert hooks[0].wait_for(lambda a: a["status"] == "firing"), "the live instance was held back"
        # The sender thread counts the delivery once Alertmanager's answer is read, which on a
        # loaded machine can come after Alertmanager has already notified the receiver.
        deadline = time.monotonic() + 10
        while alerts.counts()[url_first] != (1, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alerts.counts()[url_first] == (1, 0)
        second, _ = start_alertmanager(tmp_path, hooks[1].port, port=second_port)
        alerts.deliver(wait_s=15)
        assert hooks[1].wait_for(lambda a: a["status"] == "firing"), "the instance that came back never got the page"
        assert {t: delivered for t, (delivered, _) in alerts.counts().items()} == {
            url_first: 1, f"http://127.0.0.1:{second_port}": 1}
        marks = alerts.delivery_rows()[0][1]
        assert sorted(marks["target"].to_list()) == sorted([url_first, f"http://127.0.0.1:{second_port}"])
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_a_batch_alertmanager_refuses_is_dropped_and_counted_not_retried_forever(tmp_path):
    hook = Webhook()
    proc, url = start_alertmanager(tmp_path, hook.port)
    try:
        now_min = int(time.time()) // 60
        spec, fired = change("firing", now_min - 2, now_min - 2)
        box = AlertmanagerOutbox(url)
        box.put({"labels": {}, "annotations": {}}, seq=0)  # no labels: Alertmanager answers 400
        box.put(to_alertmanager(fired, spec.runbook, AlertLinks()), seq=1)
        assert box.flush(batch=1)  # the refusal does not block the page queued behind it
        assert (box.refused, box.delivered, box.delivered_seq) == (1, 1, 1)
        assert hook.wait_for(lambda a: a["labels"].get("slo") == spec.name)
    finally:
        proc.kill()


def test_a_restart_resends_to_each_alertmanager_from_its_own_mark(tmp_path):
    from tailwatch.alerts.alertmanager import FiringAlerts
    from tailwatch.store.connection import connect

    con = connect(str(tmp_path / "tw.duckdb"))
    for seq in range(3):
        con.execute("INSERT INTO _tw_alert_outbox VALUES ('slo', ?, ?)", [seq, '{"labels": {"n": "%d"}}' % seq])
    con.execute("INSERT INTO _tw_alert_delivered VALUES ('slo', 2, 'http://am-a:9093')")  # a took everything
    con.execute("INSERT INTO _tw_alert_delivered VALUES ('slo', 0, NULL)")  # the single-URL days: every target
    alerts = FiringAlerts(("http://am-a:9093", "http://am-b:9093/"), stage="slo")
    alerts.restore(con)
    con.close()
    a, b = alerts.outboxes
    assert list(a.pending) == [] and [p["labels"]["n"] for p in b.pending] == ["1", "2"]
    assert alerts._next_seq == 3


def test_deliveries_and_refusals_are_counted_per_alertmanager():
    from prometheus_client import CollectorRegistry, generate_latest

    from tailwatch.alerts.alertmanager import DeliveryCollector, FiringAlerts

    alerts = FiringAlerts(("http://am-a:9093",), stage="detectors")
    alerts.outboxes[0].delivered, alerts.outboxes[0].refused = 5, 2
    registry = CollectorRegistry()
    registry.register(DeliveryCollector([alerts, FiringAlerts((), stage="slo")]))
    text = generate_latest(registry).decode()
    assert 'tailwatch_alerts_delivered_total{alertmanager="http://am-a:9093",stage="detectors"} 5.0' in text
    assert 'tailwatch_alerts_refused_total{alertmanager="http://am-a:9093",stage="detectors"} 2.0' in text


def test_a_hung_alertmanager_never_holds_the_loop_and_retry_after_is_honoured():
    """Delivery runs in the outbox's own thread: `deliver()` returns while the POST hangs on an
    instance that accepted the connection and never answers. An instance that answers 429
    with `Retry-After` is not tried again before then."""
    import socket
    import threading

    from tailwatch.alerts.alertmanager import FiringAlerts

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    accepted = threading.Event()
    conns = []

    def accept() -> None:
        conn, _ = hung.accept()  # and never read or answer
        conns.append(conn)
        accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    alerts = FiringAlerts((f"http://127.0.0.1:{hung.getsockname()[1]}",), stage="slo")
    alerts.outboxes[0].timeout_s = 30.0
    alerts.change("fp", True, {"labels": {"alertname": "A"}}, seq=0)
    alerts.deliver()  # returns: the sender thread is the one that waits
    assert accepted.wait(10), "the sender never connected"
    assert alerts.pending() == {alerts.outboxes[0].target: 1}  # still in flight, the loop free
    for conn in conns:
        conn.close()
    hung.close()

    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Busy(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(429)
            self.send_header("Retry-After", "20")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        box = AlertmanagerOutbox(f"http://127.0.0.1:{server.server_port}", max_backoff_s=60.0)
        box.put({"labels": {"alertname": "A"}}, seq=0)
        before = time.monotonic()
        assert not box.flush() and box.failures == 1
        assert box._next_try - before >= 19.0  # the answer's 20 s, not a jittered half second
        assert not box.flush() and box.failures == 1  # not tried again meanwhile
    finally:
        server.shutdown()
