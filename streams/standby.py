"""A worker whose store already has a writer stands by, and takes over when it dies.

This is how `worker --tier 2` runs M processes (and how a second `--tier all` on the same
store stops being a second writer): the first to take the store's writer lock
(streams/writer_lock.py) writes; every other one waits on the lock, serving its HTTP port
meanwhile. The signal API and `/readyz` are forwarded to the writer, whose URL the lock
file names, so an autoscaler may poll any tier-2 worker for any pool and gets the
writer's answer; `/healthz` and `/metrics` are the standby's own (`tailwatch_store_writer`
0). No writer answering (a failover under way) is a 503 the caller can retry.

Once the lock is free (the writer ended, or was killed), the standby closes its port and
returns it; the worker then opens the store and runs as a restarted writer does, from
the stored offsets and state, so a takeover is exactly-once like a restart.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
import urllib.parse
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from signals.api import Response, json_response
from signals.config import ApiConfig
from streams.http import listen, make_server, metrics_refusal
from streams.writer_lock import StoreWriterLock

log = logging.getLogger("tailwatch.standby")

POLL_S = 0.5  # how often the lock is tried: the longest a dead writer's store goes unwritten, beyond the restore
FORWARD_TIMEOUT_S = 10.0


class ForwardToWriter:
    """The standby's HTTP answers (the `served` of streams.http.make_app)."""

    def __init__(self, lock: StoreWriterLock, registry: CollectorRegistry, health: Callable[[], dict],
                 api_config: ApiConfig):
        self.lock, self.registry, self.health, self.api_config = lock, registry, health, api_config

    @staticmethod
    def answers_in_thread(path: str) -> bool:
        return True  # every answer waits on a socket

    def answer(self, method: str, path: str, authorization: str | None, body: bytes) -> Response:
        bare = path.split("?", 1)[0]
        if method == "GET" and bare == "/metrics":
            return metrics_refusal(self.api_config, authorization) or (200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
        writer = self.lock.writer()
        if method == "GET" and bare == "/healthz":
            return json_response(200, {**self.health(), "role": "standby",
                                       "writer_pid": writer.pid if writer else None, "writer_url": writer.url if writer else None})
        if writer is None or writer.url is None:
            return json_response(503, {"error": "no store writer serves HTTP yet (starting, or a failover under way); retry"})
        return forward(writer.url, method, path, authorization, body)


def forward(url: str, method: str, path: str, authorization: str | None, body: bytes) -> Response:
    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=FORWARD_TIMEOUT_S)
    headers = {"Authorization": authorization} if authorization else {}
    if body:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=body or None, headers=headers)
        got = conn.getresponse()
        return got.status, got.getheader("Content-Type", "application/json"), got.read()
    except OSError as exc:
        return json_response(503, {"error": f"the store writer at {url} does not answer ({type(exc).__name__}); "
                                            "a failover may be under way; retry"})
    finally:
        conn.close()


def stand_by(lock: StoreWriterLock, host: str, port: int | None, served: ForwardToWriter,
             should_stop: Callable[[], bool]) -> int | None:
    """Serve `served` on host:port until the lock is taken or `should_stop()`; returns the
    port served (the one the writer should serve next), None when there was none."""
    server = thread = sock = None
    if port is not None:
        sock = listen(host, port)
        port = sock.getsockname()[1]
        server = make_server(sock, served)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="standby-http", daemon=True)
        thread.start()
    writer = lock.writer()
    log.info("the store has a writer (pid %s): standing by%s", writer.pid if writer else "unknown",
             f", forwarding the signal API on {host}:{port}" if port is not None else "")
    began = time.monotonic()
    try:
        while not should_stop() and not lock.try_acquire():
            time.sleep(POLL_S)
    finally:
        if server is not None:
            server.should_exit = True
            thread.join(10)
            sock.close()
    if lock.held:
        log.info("took the store over after %.1f s standing by", time.monotonic() - began)
    return port
