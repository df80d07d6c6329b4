"""Each answer of the signal API is encoded once, in the worker (signals/served.py), and a
client receives those bytes as they are: through the routes in process, and from the HTTP
process over a socket."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request

import msgspec
import pytest

from tailwatch.signals.answers import AlertList, Autoscale, Shed, SloList, Verdict
from tailwatch.signals.live import SignalSnapshot
from tailwatch.signals.served import serve, typed_reads, with_ages
from tailwatch_dev.bench_answer_path import example_snapshot
from tests.conftest import call_api


def _snapshot(now: float) -> SignalSnapshot:
    return example_snapshot(pools=3, now=now, versions=2, slos=2)


def test_the_served_bytes_are_the_typed_answers_encoded():
    snap = _snapshot(1000.0)
    view = serve(snap)
    for pool, scoped in snap.pools.items():
        assert view.pools[pool].json == msgspec.json.encode(scoped.body)
        assert msgspec.json.decode(view.pools[pool].json, type=Autoscale) == scoped.body
        assert msgspec.json.decode(view.shed[pool].json, type=Shed) == snap.shed[pool].body
    assert view.slos == msgspec.json.encode(SloList(snap.slos))
    for slo in snap.slos:
        start, end = view.slo_spans[slo.name]
        assert view.slos[start:end] == msgspec.json.encode(slo)
    assert view.alerts == msgspec.json.encode(AlertList(snap.alerts))
    assert typed_reads(view) == (SloList(snap.slos), AlertList(snap.alerts))


@pytest.mark.parametrize("ages", [{"data_age_s": 1.5}, {"data_age_s": 12.0, "canary_data_age_s": 12.0},
                                  {"data_age_s": 1e-05, "canary_data_age_s": 0.0, "stable_data_age_s": 1e-05}])
def test_a_verdict_with_its_ages_spliced_in_is_the_whole_verdict_encoded(ages):
    verdict = next(iter(_snapshot(1000.0).rollouts.values())).body
    spliced = with_ages(msgspec.json.encode(verdict), ages)
    assert spliced == msgspec.json.encode(msgspec.structs.replace(verdict, **ages))
    assert msgspec.json.decode(spliced, type=Verdict) == msgspec.structs.replace(verdict, **ages)


def test_a_scoped_token_reads_its_slices_of_the_view():
    from tailwatch.signals.api import SignalApi
    from tailwatch.signals.config import ApiConfig, Principal

    view = serve(_snapshot(time.time()))
    tokens = {hashlib.sha256(b"all").hexdigest(): Principal("ops", None),
              hashlib.sha256(b"globex").hexdigest(): Principal("globex", frozenset({"globex"}))}
    api = SignalApi(ApiConfig(tokens=tokens), lambda: view, lambda: (True, "caught up"))
    assert call_api(api, "GET", "/v1/slos", "Bearer all")[2] == view.slos
    status, _ctype, body = call_api(api, "GET", "/v1/slos", "Bearer globex")
    slices = [s["labels"]["tenant"] for slo in json.loads(body)["slos"] for s in slo["slices"]]
    assert status == 200 and slices and set(slices) == {"globex"}, body
    status, _ctype, body = call_api(api, "GET", "/v1/slos/slo-0", "Bearer globex")
    assert status == 200 and {s["labels"]["tenant"] for s in json.loads(body)["slices"]} == {"globex"}
    assert call_api(api, "GET", "/v1/autoscale/pool-0", "Bearer globex")[0] == 404  # acme's pool
    assert call_api(api, "GET", "/v1/alerts", "Bearer globex")[2] == b'{"alerts":[]}'


class _Counting:
    """An encoder that counts what it is asked to encode."""

    def __init__(self, encoder):
        self.encoder, self.calls = encoder, 0

    def encode(self, value):
        self.calls += 1
        return self.encoder.encode(value)


def test_the_routes_encode_no_answer_of_the_view(monkeypatch):
    from tailwatch.signals import routes
    from tailwatch.signals.api import SignalApi
    from tailwatch.signals.config import ApiConfig

    now = time.time()
    view = serve(_snapshot(now))
    api = SignalApi(ApiConfig(), lambda: view, lambda: (True, "caught up"))
    call_api(api, "GET", "/readyz")  # the client's first request builds what it keeps
    counting = _Counting(routes._ENCODER)
    monkeypatch.setattr(routes, "_ENCODER", counting)
    for path, expected in (("/v1/autoscale/pool-1", view.pools["pool-1"].json),
                           ("/v1/shed/pool-2", view.shed["pool-2"].json),
                           ("/v1/slos", view.slos), ("/v1/alerts", view.alerts),
                           ("/v1/slos/slo-1", view.slos[slice(*view.slo_spans["slo-1"])])):
        for _ in range(2):
            status, ctype, body = call_api(api, "GET", path)
            assert (status, ctype, body) == (200, "application/json", expected), path
    status, _ctype, body = call_api(api, "GET", "/v1/rollout/m/v1")
    answer = view.rollouts[("m", "v1")].json
    assert status == 200 and body.startswith(answer[:-1] + b',"data_age_s":'), body
    assert counting.calls == 0


def test_the_http_process_serves_the_bytes_the_worker_published():
    from prometheus_client import CollectorRegistry

    from tailwatch.streams.http import WorkerHttp

    view = serve(_snapshot(time.time()))
    port = WorkerHttp(0, CollectorRegistry())
    port.start(lambda: {"status": "ok"})
    try:
        port.publish_view(view, (True, "caught up"))

        def get(path: str) -> bytes:
            with urllib.request.urlopen(f"{port.url}{path}", timeout=10) as response:
                assert response.status == 200 and response.headers["content-type"] == "application/json"
                return response.read()

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the view crosses the pipe on a thread of the child
            try:
                first = get("/v1/autoscale/pool-0")
                break
            except urllib.error.HTTPError as e:
                assert e.code == 503
                time.sleep(0.05)
        assert first == view.pools["pool-0"].json
        port.publish_unchanged((True, "caught up"))  # a heartbeat: the same bytes hold
        assert get("/v1/autoscale/pool-0") == first
        assert get("/v1/shed/pool-0") == view.shed["pool-0"].json
        assert get("/v1/slos") == view.slos
        verdict = msgspec.json.decode(get("/v1/rollout/m/v0"), type=Verdict)
        ages = {k: getattr(verdict, k) for k in ("data_age_s", "canary_data_age_s", "stable_data_age_s")}
        assert get("/v1/rollout/m/v0").startswith(view.rollouts[("m", "v0")].json[:-1])
        assert msgspec.structs.replace(verdict, data_age_s=msgspec.UNSET, canary_data_age_s=msgspec.UNSET,
                                       stable_data_age_s=msgspec.UNSET) == \
            msgspec.json.decode(view.rollouts[("m", "v0")].json, type=Verdict)
        assert all(0 <= age < 60 for age in ages.values()), ages
    finally:
        port.stop()


def test_an_answer_is_encoded_once_for_as_long_as_it_holds():
    from tailwatch.signals.answers import Autoscale
    from tailwatch.signals.served import ViewEncoder

    snap = _snapshot(1000.0)
    encoder = ViewEncoder()
    first = encoder.serve(snap)
    answers = len(snap.pools) + len(snap.shed) + len(snap.rollouts) + len(snap.slos) + 1  # + the alert list
    assert encoder.encoded == answers
    again = encoder.serve(_snapshot(1002.0))  # equal answers, built again a view later
    assert encoder.encoded == answers and again.pools["pool-0"].json is first.pools["pool-0"].json
    changed = msgspec.structs.replace(snap.pools["pool-1"].body, desired_replicas=9)
    third = encoder.serve(msgspec.structs.replace(snap, pools={**snap.pools, "pool-1": msgspec.structs.replace(
        snap.pools["pool-1"], body=changed)}))
    assert encoder.encoded == answers + 1
    assert msgspec.json.decode(third.pools["pool-1"].json, type=Autoscale).desired_replicas == 9
    assert third == serve(msgspec.structs.replace(snap, pools={**snap.pools, "pool-1": msgspec.structs.replace(
        snap.pools["pool-1"], body=changed)}))


def test_the_live_view_rebuilt_on_the_same_minutes_encodes_nothing_again():
    import polars as pl

    from tailwatch.planning.prices import GpuPrices
    from tailwatch.signals.live import LiveSignals, SignalPolicy
    from tailwatch.streams.signal_stage import SignalStage
    from tests.test_signals import _bucket_rows, _gpu_rows

    live = LiveSignals(SignalPolicy(history_minutes=6, pool_window_minutes=2, rollout_window_minutes=5), [], GpuPrices())
    live.add_closed(_bucket_rows("p", range(0, 6)), _gpu_rows("p", range(0, 6)))
    stage = SignalStage(live)
    first = stage.view(pl.DataFrame(), pl.DataFrame(), {}, wall_s=100.0)
    encoded = stage.encoder.encoded
    assert encoded >= 3 and first.pools["p"].json  # autoscale, shed, the stable verdict, the lists
    second = stage.view(pl.DataFrame(), pl.DataFrame(), {}, wall_s=102.0)
    assert stage.encoder.encoded == encoded
    assert second.pools["p"].json is first.pools["p"].json and second.built_wall_s == 102.0


def test_a_heartbeat_keeps_the_decoded_lists_of_its_view():
    from tailwatch.signals.api import SignalApi
    from tailwatch.signals.config import ApiConfig

    view = serve(_snapshot(time.time()))
    api = SignalApi(ApiConfig(), lambda: view, lambda: (True, "caught up"))
    first = api._typed_reads(view)
    beat = msgspec.structs.replace(view, built_wall_s=view.built_wall_s + 10)  # what a heartbeat makes of it
    assert api._typed_reads(beat) is first
    assert api._typed_reads(serve(_snapshot(time.time()))) is not first
