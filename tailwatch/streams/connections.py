"""Who keeps a connection when the HTTP port is at its cap: the table of open connections and
the choice of the one to evict for a newcomer (streams/http_server.py owns the sockets).

A connection is in one of three states:
- new: it has not finished a request yet (connecting, sending its head or its body);
- unauthenticated: it finished requests, none with a valid bearer token (a wrong or missing
  token, a probe of /healthz, a 404), so nothing it does needs it kept;
- authorised: it finished a request with a valid token (or the API has no tokens): a poller
  that reuses its connection (KEDA, Prometheus, wrk), never evicted.

At the cap, a newcomer evicts the oldest unauthenticated connection, at once: it has had its
answer, and keeping it would let anyone without a token hold the port (a 401 kept its
connection alive and made it as safe as a poller's). Failing that, the oldest new connection
that has not finished a request within `evict_after_s` (a slow client's), at most
`evictions_per_s` a second; failing that, the newcomer is refused. Authorised connections are
never chosen, so pollers are served through any flood of clients without a token.

Pure: the caller passes `now` (its event loop's clock).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, Hashable, TypeVar

C = TypeVar("C", bound=Hashable)

EVICTED_UNAUTHENTICATED = "evicted_unauthenticated_connection"
EVICTED_SLOW = "evicted_slow_connection"


@dataclass(frozen=True)
class Eviction(Generic[C]):
    connection: C
    reason: str  # EVICTED_UNAUTHENTICATED or EVICTED_SLOW: the refusal counter's label


class ConnectionTable(Generic[C]):
    """Open connections by state, each oldest first, and the eviction ration (a token bucket)."""

    def __init__(self, limit: int, evict_after_s: float, evictions_per_s: float):
        self.limit = limit
        self.evict_after_s = evict_after_s
        self.evictions_per_s = evictions_per_s
        self._new: OrderedDict[C, float] = OrderedDict()  # → when it connected
        self._unauthenticated: OrderedDict[C, None] = OrderedDict()
        self._authorised: OrderedDict[C, None] = OrderedDict()
        self._bucket = (0.0, float(evictions_per_s))  # (when, tokens then)

    def __len__(self) -> int:
        return len(self._new) + len(self._unauthenticated) + len(self._authorised)

    def __contains__(self, connection: C) -> bool:
        return connection in self._new or connection in self._unauthenticated or connection in self._authorised

    @property
    def full(self) -> bool:
        return 0 < self.limit <= len(self)

    def opened(self, connection: C, now: float) -> None:
        self._new[connection] = now

    def answered(self, connection: C, authorised: bool) -> None:
        """A request on `connection` was answered; `authorised`: it carried a valid token."""
        if connection in self._authorised:
            return  # once authorised, kept so: a poller's later 404 does not make it evictable
        if not (self._new.pop(connection, None) is not None or connection in self._unauthenticated):
            return  # evicted or closed meanwhile
        if authorised:
            self._unauthenticated.pop(connection, None)
            self._authorised[connection] = None
        else:
            self._unauthenticated[connection] = None  # moved to the end: the oldest answered goes first

    def has_finished_a_request(self, connection: C) -> bool:
        return connection in self._unauthenticated or connection in self._authorised

    def closed(self, connection: C) -> None:
        self._new.pop(connection, None)
        self._unauthenticated.pop(connection, None)
        self._authorised.pop(connection, None)

    def evict_for_newcomer(self, now: float) -> Eviction[C] | None:
        """The connection a newcomer at the cap takes the place of, removed from the table
        (the caller cuts it), or None: the newcomer is refused."""
        if self._unauthenticated:
            connection, _ = self._unauthenticated.popitem(last=False)
            return Eviction(connection, EVICTED_UNAUTHENTICATED)
        oldest = next(iter(self._new.items()), None)
        if oldest is None or now - oldest[1] < self.evict_after_s or not self._take_token(now):
            return None
        del self._new[oldest[0]]
        return Eviction(oldest[0], EVICTED_SLOW)

    def _take_token(self, now: float) -> bool:
        """Slow clients that reconnect at once must not make every eviction the next one (a
        loop that costs a core): at most `evictions_per_s` of them a second."""
        at, tokens = self._bucket
        tokens = min(float(self.evictions_per_s), tokens + (now - at) * self.evictions_per_s)
        if tokens < 1.0:
            self._bucket = (now, tokens)
            return False
        self._bucket = (now, tokens - 1.0)
        return True
