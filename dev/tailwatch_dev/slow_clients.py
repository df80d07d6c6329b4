"""Hostile HTTP clients for `tailwatch bench --api` and the tests, two kinds:

- slow bodies (the default): each connection sends a POST head, then drips its body one byte
  every `drip_s` seconds;
- wrong tokens (`--wrong-token`): each connection polls a signal API path with a bearer token
  the server does not know, every `drip_s` seconds, on the same connection while the server
  keeps it (a fleet of pollers left with a rotated-out token, or someone trying to hold the
  port without one).

When the server cuts or closes a connection, another takes its place, so the attack keeps
`connections` open (or trying) for its whole length, opening at most `rate` new connections a
second in all (as slowloris tools pace themselves).

Loopback only, bounded in count and time; it ends by itself. Run as a process of its own so
the attack and the measured client never share an interpreter:
`python -m tools.slow_clients --port P --connections N --seconds S [--wrong-token]`; it prints
one JSON line (connections opened, cut or closed by the server, refused, answers read) when done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

HEAD = b"POST /v1/flagger/confirm-promotion HTTP/1.1\r\nHost: bench\r\nContent-Length: 60000\r\n\r\n{"
WRONG_TOKEN_POLL = b"GET /v1/slos HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer not-a-token\r\n\r\n"


class _Pace:
    """At most `rate` connection attempts a second, shared by every client."""

    def __init__(self, rate: float):
        self.gap, self.next = 1.0 / rate, time.monotonic()

    async def wait(self) -> None:
        now = time.monotonic()
        self.next = max(self.next + self.gap, now)
        if self.next > now:
            await asyncio.sleep(self.next - now)


async def _connect(port: int, counts: dict[str, int], pace: _Pace):
    """A new connection when the pace allows, counted; None when refused (after a pause)."""
    await pace.wait()
    try:
        opened = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        counts["refused"] += 1
        await asyncio.sleep(0.1)
        return None
    counts["opened"] += 1
    return opened


async def _client(port: int, until: float, counts: dict[str, int], pace: _Pace, converse) -> None:
    """Connections one after another until `until`, each opened when the pace allows and spent
    on `converse(reader, writer)`, which says whether the server ended it (counted as cut)."""
    while time.monotonic() < until:
        opened = await _connect(port, counts, pace)
        if opened is None:
            continue
        reader, writer = opened
        try:
            if await converse(reader, writer):
                counts["cut"] += 1
        except OSError:
            counts["cut"] += 1
        finally:
            writer.close()


def _dripping(drip_s: float, until: float, counts: dict[str, int]):
    """A slow body: a POST head, then a body byte every `drip_s`."""

    async def converse(reader, writer) -> bool:
        writer.write(HEAD)
        await writer.drain()
        while time.monotonic() < until:
            try:
                if await asyncio.wait_for(reader.read(4096), drip_s) == b"":
                    return True  # answered and closed, or cut
            except asyncio.TimeoutError:
                writer.write(b" ")
                await writer.drain()
        return False

    return converse


def _polling(poll_s: float, until: float, counts: dict[str, int]):
    """A wrong-token poller: a request now and every `poll_s` on the same connection, until
    the server closes it."""

    async def converse(reader, writer) -> bool:
        while time.monotonic() < until:
            writer.write(WRONG_TOKEN_POLL)
            await writer.drain()
            next_poll = time.monotonic() + poll_s
            while (left := next_poll - time.monotonic()) > 0:
                try:
                    got = await asyncio.wait_for(reader.read(4096), left)
                except asyncio.TimeoutError:
                    break
                if got == b"":
                    return True
                counts["answers"] += got.count(b"HTTP/1.1 ")
        return False

    return converse


async def attack(port: int, connections: int, seconds: float, drip_s: float, rate: float,
                 wrong_token: bool = False) -> dict[str, int]:
    counts = {"opened": 0, "cut": 0, "refused": 0, "answers": 0}
    until, pace = time.monotonic() + seconds, _Pace(rate)
    kind = _polling if wrong_token else _dripping
    await asyncio.gather(*(_client(port, until, counts, pace, kind(drip_s, until, counts)) for _ in range(connections)))
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--drip", type=float, default=2.0, help="seconds between body bytes (or wrong-token polls)")
    p.add_argument("--rate", type=float, default=500.0, help="new connections a second, in all")
    p.add_argument("--wrong-token", action="store_true", help="poll with a wrong bearer token instead of dripping bodies")
    args = p.parse_args()
    print(json.dumps(asyncio.run(attack(args.port, args.connections, args.seconds, args.drip, args.rate,
                                        args.wrong_token))))


if __name__ == "__main__":
    main()
