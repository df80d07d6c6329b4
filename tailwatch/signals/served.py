"""The signal API's answers as the HTTP process serves them: each encoded once, in the worker.

The live view (signals/live.py) builds each answer once, as its typed Struct
(signals/answers.py). `serve` encodes each once to the JSON a client receives (the signal
stage's `ViewEncoder` once for as long as the answer does not change) and keeps
beside it only what a request checks before handing it out (the tenants it covers, when
its data last moved, its `as_of`). That `ServedView` crosses to the HTTP process as msgpack
(streams/http.py), where the answers arrive as the bytes they are (msgpack `bin`: a copy,
no parse), and `SignalApi` (signals/api.py) answers a request with them as they are.

What a request adds is its own: the status and headers, and a rollout verdict's data ages
(`data_age_s` and each side's), which change by the second and are the verdict's last
fields: spliced in before its closing brace (`with_ages`), the bytes an encoder of the
whole verdict writes. A tenant-scoped token's SLO and alert reads are a projection of the
whole lists; those, and the first traffic step of a canary (signals/first_step.py), read
the typed lists decoded from the view's bytes at most once per view (`TypedReads`).
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from tailwatch.signals.answers import AlertList, InputAbsent, SloList
from tailwatch.signals.live import Scoped, SignalSnapshot

_encode = msgspec.json.Encoder().encode


class Answered(msgspec.Struct, frozen=True, array_like=True):
    """One answer's JSON, as a client receives it, and what a request checks first."""

    json: bytes
    tenants: frozenset[str]
    as_of: str | None  # the answer's own, for the error that says it is stale
    changed_wall_s: float  # when the data behind it last moved; a canary verdict's: the canary's
    baseline_changed_wall_s: float | None = None  # a canary verdict's: when its stable baseline's did
    verdict: str = ""  # a rollout verdict's name (the rollout controllers' pass rules read it)
    canary: bool = False  # a rollout verdict with a canary side (it carries the canary's data age)


class ServedView(msgspec.Struct, frozen=True):
    """The signal view as the HTTP process answers from it (SignalSnapshot, encoded)."""

    built_wall_s: float
    as_of_minute: int | None
    pools: dict[str, Answered]  # autoscale
    shed: dict[str, Answered]
    rollouts: dict[tuple[str, str], Answered]
    models: dict[str, frozenset[str]]  # model → its versions (for 404 messages)
    absent: dict[str, Scoped[InputAbsent]]  # what a pool's 503 says: no answer to encode
    inputs_behind: dict[str, str]
    slos: bytes  # the SloList, every SLO
    slo_spans: dict[str, tuple[int, int]]  # SLO name → where its Slo lies in `slos`
    alerts: bytes  # the AlertList, every alert


class ViewEncoder:
    """`serve` with a memory of the last view: an answer equal to the one under the same name
    in the last view keeps that one's bytes. A test of equality costs about a fifth of an
    encoding, and most answers hold from one view to the next (a pool's rates move once a
    minute, a view is built every few seconds), so an answer is encoded once for as long
    as it does not change."""

    def __init__(self):
        self._last: dict[tuple, tuple[msgspec.Struct, bytes]] = {}  # (table, name) → (answer, its JSON)
        self._next: dict[tuple, tuple[msgspec.Struct, bytes]] = {}
        self.encoded = 0  # answers encoded, over every view (the tests count them)

    def _json(self, key: tuple, body: msgspec.Struct) -> bytes:
        last = self._last.get(key)
        if last is not None and last[0] == body:
            json = last[1]
        else:
            json = _encode(body)
            self.encoded += 1
        self._next[key] = (body, json)
        return json

    def _answered(self, table: str, key, scoped: Scoped, **extra) -> Answered:
        return Answered(self._json((table, key), scoped.body), scoped.tenants, scoped.body.as_of,
                        scoped.changed_wall_s, scoped.baseline_changed_wall_s, **extra)

    def serve(self, snap: SignalSnapshot) -> ServedView:
        """Each answer of `snap` as the bytes a client receives."""
        slos = bytearray(b'{"slos":[')
        spans = {}
        for i, slo in enumerate(snap.slos):
            if i:
                slos += b","
            start = len(slos)
            slos += self._json(("slo", i), slo)
            spans.setdefault(slo.name, (start, len(slos)))
        slos += b"]}"
        view = ServedView(
            built_wall_s=snap.built_wall_s, as_of_minute=snap.as_of_minute,
            pools={pool: self._answered("pool", pool, s) for pool, s in snap.pools.items()},
            shed={pool: self._answered("shed", pool, s) for pool, s in snap.shed.items()},
            rollouts={key: self._answered("rollout", key, s, verdict=s.body.verdict,
                                          canary=s.body.canary is not msgspec.UNSET)
                      for key, s in snap.rollouts.items()},
            models=snap.models, absent=snap.absent, inputs_behind=snap.inputs_behind,
            slos=bytes(slos), slo_spans=spans, alerts=self._json(("alerts",), AlertList(snap.alerts)))
        self._last, self._next = self._next, {}  # answers gone from the view are forgotten
        return view


def serve(snap: SignalSnapshot) -> ServedView:
    """Each answer of `snap` encoded once, to the bytes a client receives."""
    return ViewEncoder().serve(snap)


def with_ages(verdict_json: bytes, ages: dict[str, float]) -> bytes:
    """A verdict's JSON with its data ages, the verdict's last fields (answers.Verdict), in
    their order: the bytes of the whole verdict encoded with them."""
    return verdict_json[:-1] + b"," + _encode(ages)[1:]


class TypedReads(NamedTuple):
    """The SLOs and alerts of one view as typed answers, for the reads that take part of them."""

    slos: SloList
    alerts: AlertList


def typed_reads(view: ServedView) -> TypedReads:
    return TypedReads(msgspec.json.decode(view.slos, type=SloList), msgspec.json.decode(view.alerts, type=AlertList))
