"""The worker's HTTP port: `/metrics`, `/healthz`, and any routes later rooms add.

A small threaded stdlib server: routes map a path to a handler returning
(status, content type, body bytes). It runs beside the consume loop in a daemon thread.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Response = tuple[int, str, bytes]
Route = Callable[[], Response]


def json_response(status: int, body: object) -> Response:
    return status, "application/json", json.dumps(body).encode()


class WorkerHttp:
    def __init__(self, port: int, registry: CollectorRegistry, health: Callable[[], dict], host: str = "127.0.0.1"):
        self.routes: dict[str, Route] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: json_response(200, health()),
        }
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (stdlib name)
                route = routes.get(self.path.split("?", 1)[0])
                status, ctype, body = route() if route else json_response(404, {"error": f"no route {self.path[:100]}"})
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # keep access logs out of the worker's output
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="worker-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
