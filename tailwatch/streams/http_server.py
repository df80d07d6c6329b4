"""The worker's HTTP process (started by streams/http.py): `/metrics`, `/healthz`, `/readyz`
and the signal API, from the last state the worker published.

The server is uvicorn (h11) running a thin ASGI guard in front of the signal API's Litestar
app (`signals/routes.py`): one event loop, so a thousand idle or slow connections cost memory,
not a thousand threads as `http.server` did; chunked bodies, malformed requests and oversized
headers are h11's to answer. What no client may do, with
its own limits here (docs/signal-api.md lists them):
- hold a connection with a slow head: it must finish each request's head within
  HEAD_TIMEOUT_S of connecting or of its last response (uvicorn's keep-alive timer restarts
  on every byte, so one header byte every 2 s would hold it for ever);
- hold one with a slow body: a body must arrive whole within BODY_TIMEOUT_S of its head
  (at least MAX_BODY_BYTES / BODY_TIMEOUT_S bytes a second), and over MAX_BODY_BYTES it is
  refused while it streams in (413);
- make the server read a body it would refuse anyway: a POST to a path that takes none, or
  with a bearer token that is wrong, is answered before its body is read;
- hold the port without a token: a 401 closes its connection after the answer;
- exhaust file descriptors: at most `max_connections` (API config) are open; one more evicts a
  connection that never authenticated (streams/connections.py: one that had its answers
  first, then one that has not finished a request within EVICT_AFTER_S, at most
  EVICTIONS_PER_S a second), so polls on kept-alive authorised connections are always served
  and new ones get in;
- fill the log: each refusal is one count in `tailwatch_http_refused_total{reason}`, never
  a log line or a traceback.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import resource
import socket
import threading
import time
from typing import Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from prometheus_client import generate_latest

from tailwatch.signals.answers import ApiError
from tailwatch.signals.api import MAX_BODY_BYTES, ApiFailure, SignalApi
from tailwatch.signals.config import ApiConfig
from tailwatch.signals.routes import (PARAMETER_TEXT, TOO_LARGE, header, make_app as make_api_app, needs_token, no_route,
                            not_allowed, takes_body)
from tailwatch.streams.connections import ConnectionTable
from tailwatch.streams.http import HttpState, Response, apply_state, decode_state, json_response
from tailwatch.streams.metrics import HttpMetrics

log = logging.getLogger("tailwatch.http")


def metrics_refusal(config: ApiConfig, authorization: str | None) -> Response | None:
    """The exposition carries every tenant's series: with tokens configured, only a token
    for all tenants may read it (Prometheus: `authorization` in the scrape config)."""
    if not config.auth_required:
        return None
    who = config.authenticate(authorization)
    if who is None or who.tenants is not None:
        return json_response(401 if who is None else 403, {"error": "/metrics needs a bearer token scoped to all tenants"})
    return None


class _Served:
    """The child's view: the last state, swapped whole by the pipe reader thread."""

    def __init__(self, api_config: ApiConfig, scrape_conn):
        self.state = HttpState()
        self._scrape_conn = scrape_conn
        self._scrape_lock = threading.Lock()
        self._asked = 0
        self.stale_after_s = api_config.stale_after_s
        self.metrics = HttpMetrics()
        self.api = SignalApi(api_config, lambda: self.state.view, self.readiness,
                             on_flagger_event=lambda phase, kind: self.metrics.flagger_events.labels(phase, kind).inc())
        self.routes = make_api_app(self.api)

    def readiness(self) -> tuple[bool, str]:
        age = time.time() - self.state.published_wall_s
        if self.state.published_wall_s and age > self.stale_after_s:
            return False, f"the worker has published nothing for {age:.0f} s"
        return self.state.ready

    def scrape(self, what: str) -> Response:
        """Ask the worker for `metrics` or `health`: one question at a time on the pipe, each
        numbered, so a late answer to an abandoned question is dropped, never handed on.
        /metrics carries this process's own counters after the worker's."""
        with self._scrape_lock:
            self._asked += 1
            self._scrape_conn.send((self._asked, what))
            deadline = time.monotonic() + 10
            while self._scrape_conn.poll(max(0.0, deadline - time.monotonic())):
                number, answer = self._scrape_conn.recv()
                if number == self._asked:
                    if what == "metrics" and answer[0] == 200:
                        answer = (answer[0], answer[1], answer[2] + generate_latest(self.metrics.registry))
                    return answer
            return json_response(503, {"error": "the worker did not answer within 10 s"})

    def answer_scrape(self, path: str, authorization: str | None) -> Response:
        if path == "/metrics" and (refused := metrics_refusal(self.api.config, authorization)):
            return refused
        return self.scrape(path[1:])

    def refuse_unauthorised(self, method: str, path: str, authorization: str | None) -> Response | None:
        """The 401 for a request without a valid token to a route that needs one, answered
        here: the routes' own answer costs about 45 times the CPU (356 µs against 8 µs), and
        a flood of wrong tokens would spend it on every request. None: no refusal."""
        config = self.api.config
        if not config.auth_required or config.authenticate(authorization) is not None \
                or not needs_token(self.routes, method, path):
            return None
        try:
            self.api.principal(authorization)
        except ApiFailure as failure:
            return json_response(failure.status, failure.answer)
        return None

    def refuse_before_body(self, method: str, path: str, authorization: str | None) -> Response | None:
        """For a request that carries a body: its answer now, before a byte of the body is
        read, when the body cannot change it (no route here takes one, or the bearer token
        sent is wrong); None: read the body."""
        verdict = takes_body(self.routes, method, path)
        if verdict == "no route":
            return json_response(404, no_route(path))
        if verdict != "yes":
            return json_response(405, not_allowed(method))
        if self.api.config.auth_required and authorization:
            try:
                self.api.principal(authorization)
            except ApiFailure as failure:
                return json_response(failure.status, failure.answer)
        return None


MAX_PATH_CHARS = 1024
HEAD_TIMEOUT_S = 5.0  # to send a request's head, from connecting or from the last response
BODY_TIMEOUT_S = 5.0  # to send a request's body, from the end of its head
KEEP_ALIVE_S = 60  # an idle keep-alive connection is closed after this
EVICT_AFTER_S = 0.5  # at the connection cap, one without a finished request this old may be evicted
EVICTIONS_PER_S = 100  # ... at most this many a second; past that, newcomers are refused
_SCRAPES = ("/metrics", "/healthz")  # asked of the worker: answered off the event loop


class _Refuse(asyncio.Protocol):
    """A connection refused at the cap: counted and cut on arrival."""

    def __init__(self, metrics: HttpMetrics | None):
        self.metrics = metrics

    def connection_made(self, transport) -> None:  # type: ignore[override]
        if self.metrics is not None:
            self.metrics.refused.labels("connection_limit").inc()
        transport.abort()


def _no_token_needed(_authorization: str | None) -> bool:
    return True


class _Guarded(H11Protocol):
    """uvicorn's h11 protocol with the guards of the module doc: a deadline on each head, a
    cap on open connections that evicts one that never authenticated, and a count (not a
    log line) for each refusal."""

    _deadline: asyncio.TimerHandle | None = None
    _deadline_kind = "head"  # the timer armed: for the next head, or for this request's body
    _authorised = False  # the request being answered carried a valid token
    transport = None  # until connection_made
    _cut_on_arrival = False
    # Open connections of this process; make_server sets the cap (the API config's
    # max_connections, within the fd limit).
    open: ConnectionTable["_Guarded"] = ConnectionTable(0, EVICT_AFTER_S, EVICTIONS_PER_S)
    authorise: Callable[[str | None], bool] = staticmethod(_no_token_needed)  # set by make_server
    metrics: HttpMetrics | None = None

    def _count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.refused.labels(reason).inc()

    def _arm(self) -> None:
        self._disarm()
        self._deadline_kind = "head"
        self._deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._head_too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_too_slow(self) -> None:
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self._count("idle_head_timeout" if _Guarded.open.has_finished_a_request(self) else "head_timeout")
            self.transport.close()

    def _body_too_slow(self) -> None:
        # Cut, not answered: a 408 would cost a response for a client that is not reading.
        if self.cycle is not None and self.cycle.more_body and not self.cycle.response_started:
            self._count("body_timeout")
            self.transport.abort()

    def __new__(cls, *args, **kwargs):
        """At the cap, a newcomer takes the place of a connection that never authenticated
        (streams/connections.py), or is refused by a protocol that costs nothing to make
        (uvicorn's builds an h11 connection and its state first)."""
        now = asyncio.get_running_loop().time()
        if cls.open.full:
            evicted = cls.open.evict_for_newcomer(now)
            if evicted is None:
                return _Refuse(cls.metrics)
            if cls.metrics is not None:
                cls.metrics.refused.labels(evicted.reason).inc()
            evicted.connection._cut()
        made = super().__new__(cls)
        # Counted now, not at connection_made: asyncio makes the protocols of a burst of
        # accepted connections before it calls any of them, and each must see the others.
        cls.open.opened(made, now)
        return made

    def _cut(self) -> None:
        if self.transport is None:
            self._cut_on_arrival = True  # evicted between being made and connection_made
        else:
            self.transport.abort()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._cut_on_arrival:
            transport.abort()
            return
        self._arm()

    def handle_events(self) -> None:
        try:
            super().handle_events()
        except Exception:  # noqa: BLE001: a request head h11 accepts and uvicorn cannot read (a non-ASCII path)
            self._count("malformed_request")
            self.transport.close()
            return
        if self.cycle is not None and not self.cycle.response_complete and self._deadline is not None \
                and self._deadline_kind == "head":
            self._disarm()  # a whole head arrived: the app has the request; its body has its own deadline
            self._authorised = _Guarded.authorise(_header(self.headers, b"authorization"))
            if self.cycle.more_body and self.scope.get("method") == "POST":
                self._deadline_kind = "body"
                # Spread a little: a thousand slow bodies that arrived together are not all cut,
                # and all back, in one turn of the event loop.
                self._deadline = self.loop.call_later(BODY_TIMEOUT_S * random.uniform(0.8, 1.0), self._body_too_slow)

    def send_400_response(self, msg: str) -> None:
        self._count("malformed_request")
        super().send_400_response(msg)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        _Guarded.open.answered(self, self._authorised)
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        _Guarded.open.closed(self)
        super().connection_lost(exc)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in headers if key == name), None)


async def _read_body(receive, declared: int | None) -> tuple[bytes | None, str | None]:
    """(the body, None), (None, a refusal reason), or (None, None) when the client left or
    was cut at its deadline (`_Guarded._body_too_slow`): nobody to answer then."""
    if declared is not None and declared > MAX_BODY_BYTES:
        return None, "body_too_large"
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None, "body_too_large"
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), None


def make_app(served: _Served):
    """The ASGI app: the scrapes and the body guards here, then the signal API's routes."""
    routes = served.routes
    closes_unauthorised = served.api.config.auth_required  # without tokens nothing is 401

    async def app(scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; a websocket upgrade is refused by uvicorn's h11 protocol
        method, path = scope["method"], scope["path"]
        authorization = header(scope, b"authorization")
        if path in _SCRAPES and method == "GET":  # a scrape waits on the worker (up to 10 s): off the event loop
            answer = await asyncio.get_running_loop().run_in_executor(None, served.answer_scrape, path, authorization)
            await _send(send, answer)
            return
        if len(path) > MAX_PATH_CHARS:
            await _send(send, json_response(414, ApiError(f"path longer than {MAX_PATH_CHARS} characters")))
            return
        if b"%2f" in (scope.get("raw_path") or b"").lower():  # a slash inside a name: no name has one
            await _send(send, json_response(400, ApiError(PARAMETER_TEXT)))
            return
        if method != "POST" and (refused := served.refuse_unauthorised(method, path, authorization)) is not None:
            await _send(send, refused)  # a 401: the connection closes after it
            return
        if method == "POST":
            # Before a byte of the body: a path that takes none, or a wrong token, is refused now.
            early = served.refuse_before_body(method, path, authorization)
            if early is not None:
                served.metrics.refused.labels("refused_before_body").inc()
                await _send(send, early, close=True)
                return
            declared = header(scope, b"content-length")
            body, refusal = await _read_body(receive, int(declared) if declared and declared.isdigit() else None)
            if refusal is not None:
                served.metrics.refused.labels(refusal).inc()
                await _send(send, json_response(413, TOO_LARGE), close=True)
                return
            if body is None:
                return
            receive = _replay(body)
        if closes_unauthorised:
            send = _closing_after_401(send)
        await routes(scope, receive, send)  # a lookup in the last view: no thread hop

    return app


def _closing_after_401(send):
    """`send` for the routes' answer: a 401 asks the client to close (`Connection: close`),
    and h11 then closes the connection once the answer is out, so a client without a valid
    token holds no connection between its requests."""

    async def closing(message: dict) -> None:
        if message["type"] == "http.response.start" and message["status"] == 401:
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return closing


def _replay(body: bytes):
    """A `receive` that hands the app the body already read, whole, once."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _send(send, answer: Response, close: bool = False) -> None:
    status, ctype, body = answer
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="tailwatch"'))
    if close or status == 401:  # a client without a valid token holds no connection
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def make_server(sock: socket.socket, served: _Served) -> uvicorn.Server:
    _Guarded.metrics = served.metrics
    _Guarded.open = ConnectionTable(min(served.api.config.max_connections, _raise_fd_limit() - 64),
                                    EVICT_AFTER_S, EVICTIONS_PER_S)
    api_config = served.api.config
    _Guarded.authorise = staticmethod(
        (lambda authorization: api_config.authenticate(authorization) is not None) if api_config.auth_required
        else _no_token_needed)
    config = uvicorn.Config(make_app(served), http=_Guarded, loop="asyncio", lifespan="off",
                            timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=16 * 1024,
                            backlog=2048, access_log=False, server_header=False, log_level="error",
                            proxy_headers=False)
    return uvicorn.Server(config)


def _raise_fd_limit() -> int:
    """The soft file-descriptor limit raised to the hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    # Accepted connections inherit it: uvicorn writes a response's head and body apart,
    # and with Nagle on the body waits for the client's delayed ACK (44 ms a request).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _CountAcceptFailures(logging.Filter):
    """asyncio logs a failed accept (no file descriptor left) with a traceback, each time:
    counted instead."""

    def __init__(self, metrics: HttpMetrics):
        super().__init__()
        self.metrics = metrics

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("socket.accept() out of system resource"):
            self.metrics.refused.labels("accept_failed").inc()
            return False
        return True


def serve(conn, scrape_conn, host: str, port: int, api_config: ApiConfig) -> None:
    """The HTTP process: bind, say so on `conn`, read states from it, serve until it closes."""
    served = _Served(api_config, scrape_conn)
    logging.getLogger("asyncio").addFilter(_CountAcceptFailures(served.metrics))
    # The collector's pauses were the tail of every poll's latency: under 20,000 slow clients
    # (bench --api) a full collection over the live connections took up to 110 ms with the
    # default thresholds (p99 23 ms against 3 ms idle). The startup heap is frozen out of
    # its sight and young collections run five times less often: p99 7.5 ms.
    gc.collect()
    gc.freeze()
    gc.set_threshold(5_000, 100, 1_000)
    try:
        sock = listen(host, port)
    except OSError as exc:
        conn.send(("error", exc.errno, exc.strerror or str(exc)))
        return
    conn.send(("bound", sock.getsockname()[1], ""))

    def read() -> None:
        while True:
            try:
                served.state = apply_state(served.state, decode_state(conn.recv_bytes()))
            except (EOFError, OSError):
                os._exit(0)  # the worker is gone: so is its port

    threading.Thread(target=read, name="http-state", daemon=True).start()
    make_server(sock, served).run(sockets=[sock])
