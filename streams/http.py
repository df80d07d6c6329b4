"""The worker's HTTP port: `/metrics`, `/healthz`, `/readyz` and the signal API, served
by a child process.

Why a process: the worker's hot loop spends long stretches in C code that holds the GIL
(decoding a batch of 20,000 records, building frames), and an HTTP thread in the same
process waits behind it: measured with wrk at 500 requests/s, p99 went from 2 ms with
the worker idle to 120-300 ms with it busy. The child has its own interpreter and answers
the signal API from the last `HttpState` the worker published (the signal snapshot and
readiness). `/metrics` and `/healthz` are asked of the worker on each scrape, over a
second pipe, so they are as fresh as before (a scrape may wait on the worker; a
Prometheus scrape can afford that, an autoscaler's poll should not have to). The child
exits when the worker's end of the pipe closes, so it never outlives it.

The server is uvicorn (h11) running a Starlette app: one event loop, so a thousand idle or
slow connections cost memory, not a thousand threads as `http.server` did; chunked bodies,
malformed requests and oversized headers are h11's to answer. Two limits are ours: a body
over MAX_BODY_BYTES is refused while it streams in (413), and a connection must finish a
request's head within HEAD_TIMEOUT_S of connecting or of its last response (uvicorn's
keep-alive timer restarts on every byte, so a client sending one header byte every 2 s
would hold it for ever).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import Response as HttpResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from signals.api import MAX_BODY_BYTES, Request, Response, SignalApi, json_response
from signals.config import ApiConfig

log = logging.getLogger("tailwatch.http")


@dataclass
class HttpState:
    """What the worker publishes to its HTTP process."""

    snapshot: object = None  # signals.live.SignalSnapshot
    ready: tuple[bool, str] = (False, "starting")
    published_wall_s: float = 0.0
    # A heartbeat from a caught-up worker with nothing new: the last snapshot still holds as
    # of now (no rebuild, no snapshot on the pipe: an idle worker stays idle).
    view_unchanged: bool = False


def _apply(previous: HttpState, received: HttpState) -> HttpState:
    if not received.view_unchanged:
        return received
    snapshot = previous.snapshot
    if snapshot is not None:
        snapshot = dataclasses.replace(snapshot, built_wall_s=received.published_wall_s)
    return HttpState(snapshot, received.ready, received.published_wall_s)


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
        self.api = SignalApi(api_config, lambda: self.state.snapshot, self.readiness)

    @staticmethod
    def answers_in_thread(path: str) -> bool:
        """A scrape waits on the worker (up to 10 s): off the event loop, so polls are not held."""
        return path in ("/metrics", "/healthz")

    def readiness(self) -> tuple[bool, str]:
        age = time.time() - self.state.published_wall_s
        if self.state.published_wall_s and age > self.stale_after_s:
            return False, f"the worker has published nothing for {age:.0f} s"
        return self.state.ready

    def scrape(self, what: str) -> Response:
        """Ask the worker for `metrics` or `health`: one question at a time on the pipe, each
        numbered, so a late answer to an abandoned question is dropped, never handed on."""
        with self._scrape_lock:
            self._asked += 1
            self._scrape_conn.send((self._asked, what))
            deadline = time.monotonic() + 10
            while self._scrape_conn.poll(max(0.0, deadline - time.monotonic())):
                number, answer = self._scrape_conn.recv()
                if number == self._asked:
                    return answer
            return json_response(503, {"error": "the worker did not answer within 10 s"})

    def answer(self, method: str, path: str, authorization: str | None, body: bytes) -> Response:
        bare = path.split("?", 1)[0]
        if method == "GET" and bare == "/metrics" and (refused := metrics_refusal(self.api.config, authorization)):
            return refused
        if method == "GET" and bare in ("/metrics", "/healthz"):
            return self.scrape(bare[1:])
        answer = self.api.handle(Request(method, path, authorization, body))
        if answer is None:
            answer = json_response(404, {"error": f"no route {bare[:100]}", "hint": "GET /openapi.json lists them"})
        return answer


HEAD_TIMEOUT_S = 5.0  # to send a request's head, from connecting or from the last response
KEEP_ALIVE_S = 60  # an idle keep-alive connection is closed after this


class _HeadDeadline(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head (see the module doc)."""

    _deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._head_too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_too_slow(self) -> None:
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # a whole head arrived: the app has the request

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


class _BodyTooLarge(Exception):
    pass


async def _body(request: HttpRequest) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def make_app(served) -> Starlette:
    """`served` answers (method, path, authorization, body) with a Response and says which
    paths it answers slowly (`answers_in_thread`): `_Served` here, the standby's forwarder."""

    async def endpoint(request: HttpRequest) -> HttpResponse:
        try:
            body = await _body(request) if request.method == "POST" else b""
        except _BodyTooLarge:
            answer = json_response(413, {"error": f"request body over {MAX_BODY_BYTES} bytes"})
            return _response(answer, close=True)
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        args = (request.method, path, request.headers.get("authorization"), body)
        if served.answers_in_thread(request.url.path):
            return _response(await run_in_threadpool(served.answer, *args))
        return _response(served.answer(*args))  # a lookup in the last snapshot: no thread hop

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])


def _response(answer: Response, close: bool = False) -> HttpResponse:
    status, ctype, body = answer
    headers = {"WWW-Authenticate": 'Bearer realm="tailwatch"'} if status == 401 else {}
    if close:
        headers["Connection"] = "close"
    return HttpResponse(body, status_code=status, media_type=ctype, headers=headers)


def make_server(sock: socket.socket, served) -> uvicorn.Server:
    config = uvicorn.Config(make_app(served), http=_HeadDeadline, loop="asyncio", lifespan="off",
                            timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=16 * 1024,
                            backlog=2048, access_log=False, server_header=False, log_level="warning")
    return uvicorn.Server(config)


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    # Accepted connections inherit it: uvicorn writes a response's head and body apart,
    # and with Nagle on the body waits for the client's delayed ACK (44 ms a request).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _child(conn, scrape_conn, host: str, port: int, api_config: ApiConfig) -> None:
    served = _Served(api_config, scrape_conn)
    try:
        sock = listen(host, port)
    except OSError as exc:
        conn.send(("error", exc.errno, exc.strerror or str(exc)))
        return
    conn.send(("bound", sock.getsockname()[1], ""))

    def read() -> None:
        while True:
            try:
                served.state = _apply(served.state, conn.recv())
            except (EOFError, OSError):
                os._exit(0)  # the worker is gone: so is its port

    threading.Thread(target=read, name="http-state", daemon=True).start()
    make_server(sock, served).run(sockets=[sock])


class WorkerHttp:
    """The worker's side: starts the HTTP process, publishes state to it, stops it.

    A child that dies (OOM-killed, a crash in the server) is started again on the same port
    at the next publish, with the last full view: the port is down for a heartbeat, the
    worker never stops consuming for it. `on_restart` hears of each restart."""

    def __init__(self, port: int, registry: CollectorRegistry, health: Callable[[], dict], host: str = "127.0.0.1",
                 api_config: ApiConfig | None = None, on_restart: Callable[[], None] | None = None):
        self._registry, self._health = registry, health
        self._host, self._api_config = host, api_config or ApiConfig()
        self._on_restart = on_restart or (lambda: None)
        self._last_view: HttpState | None = None  # the last state that carried a snapshot
        self._start(port)

    def _start(self, port: int) -> None:
        self._conn = None  # until the child is up: a publish meanwhile starts it again
        ctx = multiprocessing.get_context("spawn")  # no fork: the worker holds Kafka threads and a DuckDB file
        conn, child_conn = ctx.Pipe()
        self._scrape_conn, child_scrape = ctx.Pipe()
        self._process = ctx.Process(target=_child, args=(child_conn, child_scrape, self._host, port, self._api_config),
                                    name="tailwatch-http", daemon=True)
        self._process.start()
        child_conn.close()
        child_scrape.close()
        if not conn.poll(60):
            self._process.kill()
            conn.close()
            raise OSError(0, "the HTTP process did not start within 60 s")
        kind, value, message = conn.recv()
        if kind == "error":
            self._process.join(5)
            conn.close()
            raise OSError(value, message)
        self._conn, self.port = conn, value
        threading.Thread(target=self._answer_scrapes, args=(self._scrape_conn,), name="http-scrapes", daemon=True).start()

    def _answer_scrapes(self, scrape_conn) -> None:
        while True:
            try:
                number, what = scrape_conn.recv()
            except (EOFError, OSError):
                return
            try:
                if what == "metrics":
                    answer = (200, CONTENT_TYPE_LATEST, generate_latest(self._registry))
                else:
                    answer = json_response(200, self._health())
            except Exception as exc:  # a collector that fails must not end every later scrape
                log.exception("answering /%s failed", what)
                answer = json_response(500, {"error": f"/{what} failed: {type(exc).__name__}"})
            try:
                scrape_conn.send((number, answer))
            except OSError:
                return

    def publish(self, state: HttpState) -> None:
        state.published_wall_s = time.time()
        if not state.view_unchanged:
            self._last_view = state
        if self._conn is not None:
            try:
                self._conn.send(state)
                return
            except OSError:  # BrokenPipeError: the child is gone
                self._process.join(1)
                log.warning("the HTTP process exited (code %s); serving port %d from a new one",
                            self._process.exitcode, self.port)
                self._conn.close()
        self._scrape_conn.close()
        try:
            self._start(self.port)
        except OSError as exc:  # the port taken meanwhile, say: try again at the next publish
            log.error("could not start the HTTP process again on port %d: %s", self.port, exc)
            return
        self._on_restart()
        if state.view_unchanged and self._last_view is not None:
            self._conn.send(self._last_view)  # a heartbeat alone would leave the new child without a view
        self._conn.send(state)

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._scrape_conn.close()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
