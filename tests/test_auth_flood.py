"""Clients without a valid token cannot hold the HTTP port against authorised ones: a 401
closes its connection, and at the connection cap a connection that never authenticated goes
before a newcomer is refused. A real worker, its real HTTP process, real sockets on loopback,
with the cap set low (64) so that a few hundred connections stand for thousands."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.test_hostile import TOKEN, _refused, api_port  # noqa: F401 (api_port: a fixture)

CAP = 64


@pytest.fixture(scope="module")
def port(api_port) -> int:
    """A real worker whose API has one token and a cap of 64 connections (tests/test_hostile.py)."""
    return api_port[0]


def _answer_then_eof(port: int, raw: bytes, within_s: float = 2.0) -> tuple[bytes, bool]:
    """What the server sends for `raw`, and whether it closed the connection within `within_s`."""
    with socket.create_connection(("127.0.0.1", port), timeout=within_s) as sock:
        sock.sendall(raw)
        out, deadline = b"", time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                return out, False
            if chunk == b"":
                return out, True
            out += chunk
        return out, False


def _fresh_poll(port: int, timeout_s: float = 2.0) -> float | None:
    """An authorised poll on a new connection: its seconds, or None if it failed or took over `timeout_s`."""
    t0 = time.monotonic()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/slos", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
            ok = r.status == 200
    except (OSError, urllib.error.HTTPError, http.client.HTTPException):
        return None
    took = time.monotonic() - t0
    return took if ok and took <= timeout_s else None


def _poll_on(connection: http.client.HTTPConnection) -> int:
    """An authorised poll on a kept connection: its status."""
    connection.request("GET", "/v1/slos", headers={"Authorization": f"Bearer {TOKEN}"})
    answer = connection.getresponse()
    answer.read()
    return answer.status


@pytest.mark.slow
@pytest.mark.broker
def test_a_401_says_close_and_the_server_closes_the_socket(port):
    for auth in (b"Authorization: Bearer wrong\r\n", b""):
        got, closed = _answer_then_eof(port, b"GET /v1/slos HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n")
        assert got.startswith(b"HTTP/1.1 401") and b"connection: close" in got.lower(), got[:300]
        assert closed, "the server kept the connection of a 401 open"
    # An authorised client keeps its connection: two answers on one socket.
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for _ in range(2):
        kept.request("GET", "/v1/slos", headers={"Authorization": f"Bearer {TOKEN}"})
        answer = kept.getresponse()
        answer.read()
        assert answer.status == 200 and (answer.getheader("connection") or "").lower() != "close"
    kept.close()


@pytest.mark.broker
def test_at_the_cap_a_connection_that_never_authenticated_goes_first(port):
    before = _refused(port)
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=5)  # an authorised poller's connection
    assert _poll_on(kept) == 200
    # Probes without a token (answered 200, kept alive) fill the cap and more.
    probes = []
    for _ in range(CAP + 6):
        probe = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        probe.request("GET", "/healthz")
        probe.getresponse().read()
        probes.append(probe)
    try:
        # A new authorised poll gets in: an unauthenticated probe makes room for it, not the poller.
        assert _fresh_poll(port) is not None
        assert _poll_on(kept) == 200
    finally:
        for probe in probes:
            probe.close()
        kept.close()
    counted = {k: v - before.get(k, 0) for k, v in _refused(port).items()}
    assert counted["evicted_unauthenticated_connection"] >= 7, counted
    assert counted["connection_limit"] == 0, counted


@pytest.mark.broker
def test_wrong_token_pollers_beyond_the_cap_never_lock_out_authorised_polls(port):
    """300 connections (about 5× the cap) polling every second with a wrong token, reconnecting
    when closed (at most 100 new connections a second in all: a flood of new connections past
    what the process can answer is a load balancer's to limit): each authorised poll on a new
    connection, 10 a second, must answer 200 within 2 s, and a kept one every time. Before, the
    first 64 held the cap for as long as they polled, and every new connection was refused."""
    attack = subprocess.Popen([sys.executable, "-m", "tailwatch_dev.slow_clients", "--wrong-token", "--port", str(port),
                               "--connections", "300", "--seconds", "8", "--drip", "1", "--rate", "100"],
                              stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    fresh: list[float | None] = []
    kept_status = []
    pollers = []
    try:
        time.sleep(1.5)  # the attackers are connected and polling
        for i in range(40):  # one new authorised poller every 0.1 s, each on its own connection
            pollers.append(threading.Thread(target=lambda: fresh.append(_fresh_poll(port))))
            pollers[-1].start()
            if i % 5 == 0:
                kept_status.append(_poll_on(kept))
            time.sleep(0.1)
        for poller in pollers:
            poller.join(timeout=5)
        out, _ = attack.communicate(timeout=30)
    finally:
        if attack.poll() is None:
            attack.kill()
        kept.close()
    counts = json.loads(out)
    assert counts["answers"] > 300 and counts["opened"] >= 300, counts  # the attack ran, at full strength
    answered = [s for s in fresh if s is not None]
    assert len(fresh) == 40 and len(answered) >= 0.95 * len(fresh), (sorted(answered), counts)
    assert set(kept_status) == {200}, kept_status


def test_the_table_evicts_the_unauthenticated_first_then_slow_newcomers_and_never_the_authorised():
    from tailwatch.streams.connections import EVICTED_SLOW, EVICTED_UNAUTHENTICATED, ConnectionTable

    table = ConnectionTable(4, evict_after_s=0.5, evictions_per_s=2)
    for name in ("poller", "probe", "slow", "fresh"):
        table.opened(name, now=0.0)
    table.answered("poller", authorised=True)
    table.answered("probe", authorised=False)
    assert table.full
    first = table.evict_for_newcomer(now=0.2)
    assert (first.connection, first.reason) == ("probe", EVICTED_UNAUTHENTICATED)  # at once, whatever its age
    table.opened("next", now=0.2)
    assert table.evict_for_newcomer(now=0.3) is None  # "slow" and "fresh" are not 0.5 s old: refused
    second = table.evict_for_newcomer(now=0.6)
    assert (second.connection, second.reason) == ("slow", EVICTED_SLOW)
    table.opened("n2", now=0.6)
    third = table.evict_for_newcomer(now=0.6)
    assert third.connection == "fresh"
    table.opened("n3", now=0.6)
    assert table.evict_for_newcomer(now=0.61) is None  # two evictions a second: the ration is spent
    table.answered("next", authorised=True)
    table.answered("n2", authorised=True)
    table.answered("n3", authorised=True)
    assert table.evict_for_newcomer(now=5.0) is None  # only authorised connections left: never chosen
    assert len(table) == 4
