"""The worker's HTTP port: `/metrics`, `/healthz`, and the signal API (signals/api.py).

A small threaded stdlib server with HTTP/1.1 keep-alive (pollers reuse connections). Fixed
routes map a path to a handler returning (status, content type, body bytes); anything else
goes to the API's dispatcher, which sees the method, the Authorization header and the body.
Request bodies are bounded before they are read.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Response = tuple[int, str, bytes]
Route = Callable[[], Response]
# (method, path, Authorization header, body) → answer, or None when no route matches.
Dispatch = Callable[[str, str, "str | None", bytes], "Response | None"]
MAX_BODY_BYTES = 64 * 1024


def json_response(status: int, body: object) -> Response:
    return status, "application/json", json.dumps(body).encode()


class WorkerHttp:
    def __init__(self, port: int, registry: CollectorRegistry, health: Callable[[], dict], host: str = "127.0.0.1",
                 api: Dispatch | None = None):
        self.routes: dict[str, Route] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: json_response(200, health()),
        }
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, method: str) -> None:
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    self._send(json_response(413, {"error": f"request body over {MAX_BODY_BYTES} bytes"}), close=True)
                    return
                body = self.rfile.read(length) if length > 0 else b""
                route = routes.get(path) if method == "GET" else None
                answer = route() if route else None
                if answer is None and api is not None:
                    answer = api(method, self.path, self.headers.get("Authorization"), body)
                if answer is None:
                    answer = json_response(404, {"error": f"no route {path[:100]}", "hint": "GET /openapi.json lists them"})
                self._send(answer)

            def _send(self, answer: Response, close: bool = False) -> None:
                status, ctype, body = answer
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Bearer realm="tailwatch"')
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (stdlib name)
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._answer("POST")

            def log_message(self, *args) -> None:  # keep access logs (and tokens in paths) out of the output
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
