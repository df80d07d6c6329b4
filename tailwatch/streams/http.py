"""The worker's HTTP port, its side: `WorkerHttp` starts the child process that serves
`/metrics`, `/healthz`, `/readyz` and the signal API (streams/http_server.py), publishes
state to it and answers its scrapes.

Why a process: the worker's hot loop spends long stretches in C code that holds the GIL
(decoding a batch of 20,000 records, building frames), and an HTTP thread in the same
process waits behind it: measured with wrk at 500 requests/s, p99 went from 2 ms with
the worker idle to 120-300 ms with it busy. The child has its own interpreter and answers
the signal API from the last `HttpState` the worker published (the signal view and
readiness). The view's answers are the JSON clients receive, encoded once in the worker
(signals/served.py): the child hands them out as they are, never decoding one.
`/metrics` and `/healthz` are asked of the worker on each scrape, over a second pipe, so
they are as fresh as before (a scrape may wait on the worker; a
Prometheus scrape can afford that, an autoscaler's poll should not have to). The child
exits when the worker's end of the pipe closes, so it never outlives it.

The server and its web framework (uvicorn, Litestar, the signal API's routes) are the
child's alone: the worker never imports them, which keeps a tenth of a CPU-second off
every worker's start.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing
import threading
import time
from typing import Callable

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tailwatch.signals.config import ApiConfig
from tailwatch.signals.served import ServedView
from tailwatch.streams.http_port import HttpPort

log = logging.getLogger("tailwatch.http")
Response = tuple[int, str, bytes]  # status, content type, body: what the guard and the scrapes answer
_ENCODER = msgspec.json.Encoder()


def json_response(status: int, body: object) -> Response:
    return status, "application/json", _ENCODER.encode(body)


class HttpState(msgspec.Struct):
    """What the worker publishes to its HTTP process, as msgpack bytes: the view's answers
    cross the pipe as the JSON bytes the worker encoded (msgpack `bin`), and stay bytes."""

    view: ServedView | None = None
    ready: tuple[bool, str] = (False, "starting")
    published_wall_s: float = 0.0
    # A heartbeat from a caught-up worker with nothing new: the last view still holds as
    # of now (no rebuild, no view on the pipe: an idle worker stays idle).
    view_unchanged: bool = False


encode_state = msgspec.msgpack.Encoder().encode
decode_state = msgspec.msgpack.Decoder(HttpState).decode


def apply_state(previous: HttpState, received: HttpState) -> HttpState:
    """The child's state once `received` arrives: it, or for a heartbeat the last view re-dated."""
    if not received.view_unchanged:
        return received
    view = previous.view
    if view is not None:
        view = msgspec.structs.replace(view, built_wall_s=received.published_wall_s)
    return HttpState(view, received.ready, received.published_wall_s)


def _child(conn, scrape_conn, host: str, port: int, api_config: ApiConfig) -> None:
    """The child process's entry: the server is imported there, never in the worker."""
    from tailwatch.streams.http_server import serve

    serve(conn, scrape_conn, host, port, api_config)


class PortInUse(OSError):
    """The HTTP port asked for is taken: said in one line with the flag that changes it."""


class WorkerHttp(HttpPort):
    """The worker's side (the runtime's HTTP port part): starts the HTTP process, publishes
    state to it, stops it.

    A child that dies (OOM-killed, a crash in the server) is started again on the same port
    at the next publish, with the last full view: the port is down for a heartbeat, the
    worker never stops consuming for it. `on_restart` hears of each restart."""

    def __init__(self, port: int, registry: CollectorRegistry, host: str = "127.0.0.1",
                 api_config: ApiConfig | None = None, on_restart: Callable[[], None] | None = None):
        self._registry, self._health = registry, (lambda: {})
        self._host, self._api_config = host, api_config or ApiConfig()
        self._on_restart = on_restart or (lambda: None)
        self._last_view: HttpState | None = None  # the last state that carried a view
        self.port = port  # until started: the port asked for

    def start(self, health: Callable[[], dict]) -> None:
        self._health = health
        self._start(self.port)

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
            if value == errno.EADDRINUSE:
                raise PortInUse(value, f"{self._host}:{port} is in use by another process: start with --http-port set to "
                                       "another port, or --http-port 0 for any free one (the start line names it)")
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

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    def publish_view(self, view: ServedView, ready: tuple[bool, str]) -> None:
        self.publish(HttpState(view, ready))

    def publish_unchanged(self, ready: tuple[bool, str]) -> None:
        self.publish(HttpState(None, ready, view_unchanged=True))

    def publish(self, state: HttpState) -> None:
        state.published_wall_s = time.time()
        if not state.view_unchanged:
            self._last_view = state
        if self._conn is not None:
            try:
                self._conn.send_bytes(encode_state(state))
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
            self._conn.send_bytes(encode_state(self._last_view))  # a heartbeat alone would leave the new child without a view
        self._conn.send_bytes(encode_state(state))

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._scrape_conn.close()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
