"""The one interface between the runtime (streams/runtime.py) and the worker's HTTP port.

The port is a part like the sinks (streams/sink.py): the tier composition (streams/tiers.py)
builds it from the worker's settings and hands it in through `Parts.http`; the runtime
starts it, publishes to it and stops it, and knows nothing of what it serves. The worker's
own is streams/http.py (a child process serving `/metrics`, `/healthz` and the signal API).

- `start(health)` before the store is restored (a poller is told "starting" rather than
  refused); `health()` is what `/healthz` answers, asked on each scrape;
- `publish_view(view, ready)` each time the signal view is rebuilt: the view as the signal
  stage made it for the port (its answers already encoded), and readiness;
- `publish_unchanged(ready)` as a heartbeat: the last view still holds as of now;
- `stop()` at exit.
"""

from __future__ import annotations

from typing import Callable


class HttpPort:
    """What the runtime calls on the HTTP port; the worker's port overrides every method."""

    url: str = ""  # where it serves, once started (the start line names it)
    port: int | None = None  # the port bound, once started (0 asked: the one the system chose)

    def start(self, health: Callable[[], dict]) -> None:
        """Bind and serve; `health()` answers `/healthz`."""
        raise NotImplementedError

    def publish_view(self, view: object, ready: tuple[bool, str]) -> None:
        """A new view to answer from, with readiness."""
        raise NotImplementedError

    def publish_unchanged(self, ready: tuple[bool, str]) -> None:
        """A heartbeat: the last view still holds as of now (and readiness, which may have changed)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError
