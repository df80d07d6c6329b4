"""The signal API over HTTP: routes, bearer tokens and tenant scopes, staleness, errors.

It answers from the latest `SignalSnapshot` the worker swapped in, so a request costs a
dictionary lookup, a conversion to its answer type and a JSON encode. Each route is one
`ApiRoute`: its handler's annotations (path parameters, body, return type) are what the
dispatcher validates and what `signals/openapi.py` documents. Every error is an `ApiError`
with a line a person reads. A tenant-scoped token gets 404 for anything holding another
tenant's traffic, with the same message as for a name that does not exist, so scopes leak
nothing.
"""

from __future__ import annotations

import logging
import re
import time
import typing
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable

import msgspec

from signals.answers import (
    AlertList,
    ApiError,
    Autoscale,
    FlaggerCheck,
    FlaggerEventCounted,
    FlaggerEventPayload,
    FlaggerPayload,
    Inconclusive,
    Name,
    Readiness,
    Reason,
    Shed,
    Slo,
    SloList,
    Verdict,
)
from conventions import FLAGGER_EVENT_TYPES, FLAGGER_EVENTS_TOTAL, FLAGGER_PHASES
from signals.config import ApiConfig, Principal
from signals.live import SignalSnapshot

Response = tuple[int, str, bytes]
MAX_BODY_BYTES = 64 * 1024
MAX_PATH_CHARS = 1024
# Flagger webhook type → the verdicts that answer 2xx (Flagger takes 200-202 as passing); an
# inconclusive answer is named by its reason (no_data, stale, starting). Per Flagger's docs and
# its scheduler: a failed `pre-rollout` or `rollout` hook counts toward `threshold` and rolls
# back after it, so only `rollback` fails there; the gates (`confirm-rollout`,
# `confirm-traffic-increase`, `confirm-promotion`) halt without counting anything; a
# `rollback` hook's 2xx tells Flagger to roll back now; a failed `post-rollout` hook is only
# logged, so it always passes and carries the final verdict. `confirm-rollout` runs before the
# canary has traffic, so having no data yet passes; data that stopped moving (or a worker still
# starting) holds the rollout until tailwatch can judge it.
INCONCLUSIVE = typing.get_args(Reason)
FLAGGER_PASSES = {
    "confirm-rollout": ("promote", "continue", "pause", "no_data"),
    "pre-rollout": ("promote", "continue", "pause", *INCONCLUSIVE),
    "rollout": ("promote", "continue", "pause", *INCONCLUSIVE),
    "confirm-traffic-increase": ("promote", "continue"),
    "confirm-promotion": ("promote",),
    "post-rollout": ("promote", "continue", "pause", "rollback", *INCONCLUSIVE),
    "rollback": ("rollback",),
}


def literal_choices(hint) -> tuple[str, ...]:
    """The names a `Literal` type (possibly `Annotated`) allows; empty for other types."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()


FLAGGER_CHECKS = literal_choices(FlaggerCheck)
assert set(FLAGGER_CHECKS) == set(FLAGGER_PASSES)
_ENCODER = msgspec.json.Encoder()
log = logging.getLogger("tailwatch.api")


def json_response(status: int, body: object) -> Response:
    return status, "application/json", _ENCODER.encode(body)


def error(status: int, message: str, **extra) -> Response:
    return json_response(status, ApiError(message, **extra))


class ApiFailure(Exception):
    """A handler's non-2xx answer."""

    def __init__(self, status: int, message: str, **extra):
        super().__init__(message)
        self.status, self.answer = status, ApiError(message, **extra)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    authorization: str | None
    body: bytes


@dataclass(frozen=True)
class ApiRoute:
    """One operation. The handler takes the caller (`who`), then the path's parameters by
    name, typed (`Name`, `FlaggerCheck`), then `payload` (a Struct decoded from the JSON body)
    when it has one; it returns its answer, or `(status, answer)` where the status varies."""

    method: str
    path: str  # "/v1/autoscale/{pool}"
    handler: Callable
    summary: str
    secured: bool = True  # a bearer token when tokens are configured
    errors: tuple[int, ...] = (400, 401, 404, 503)
    also: dict[int, str] = field(default_factory=dict)  # other statuses answering the same body type
    pattern: re.Pattern = field(init=False)
    params: tuple[tuple[str, object], ...] = field(init=False)  # (name, type) in path order
    payload: type | None = field(init=False)
    wants_authorization: bool = field(init=False)  # checks the token itself (Flagger: header or body)
    answer: object = field(init=False)  # the return annotation: a Struct type, a union, or None (not JSON)

    def __post_init__(self):
        names = re.findall(r"{(\w+)}", self.path)
        hints = typing.get_type_hints(self.handler, include_extras=True)
        answer = hints.get("return")
        if typing.get_origin(answer) is tuple:
            answer = typing.get_args(answer)[1]
        object.__setattr__(self, "pattern", re.compile("^" + re.sub(r"\\{\w+\\}", "([^/]+)", re.escape(self.path)) + "$"))
        object.__setattr__(self, "params", tuple((n, hints[n]) for n in names))
        object.__setattr__(self, "payload", hints.get("payload"))
        object.__setattr__(self, "wants_authorization", "authorization" in hints)
        object.__setattr__(self, "answer", answer)


class SignalApi:
    def __init__(self, config: ApiConfig, snapshot: Callable[[], SignalSnapshot | None],
                 readiness: Callable[[], tuple[bool, str]], wall_clock: Callable[[], float] = time.time,
                 on_flagger_event: Callable[[str, str], None] | None = None):
        self.config = config
        self.on_flagger_event = on_flagger_event  # (phase, event type), both from closed sets
        self.snapshot = snapshot
        self.readiness = readiness
        self.wall_clock = wall_clock
        self.routes: list[ApiRoute] = [
            ApiRoute("GET", "/v1/autoscale/{pool}", self.autoscale, "Desired replicas for a pool, with its signals and reasons"),
            ApiRoute("GET", "/v1/shed/{pool}", self.shed,
                     "For a pool under pressure: the degradation steps in order with the load each frees, and the "
                     "admission plan for the next interval at measured capacity"),
            ApiRoute("GET", "/v1/rollout/{model}/{version}", self.rollout,
                     "Verdict on a canary version against the model's stable version"),
            ApiRoute("GET", "/v1/argo/{model}/{version}", self.argo,
                     "Argo Rollouts web metric: the verdict, always 200 (stale or missing data is inconclusive)",
                     errors=(400, 401)),
            # Before /v1/flagger/{check}: the first route whose path matches answers.
            ApiRoute("POST", "/v1/flagger/event", self.flagger_event,
                     f"Flagger `event` webhook: counted by phase and type in {FLAGGER_EVENTS_TOTAL}",
                     secured=False, errors=(400, 413)),
            ApiRoute("POST", "/v1/flagger/{check}", self.flagger,
                     "Flagger webhook per hook type: pre-rollout and rollout (fail on rollback), confirm-rollout, "
                     "confirm-traffic-increase and confirm-promotion (gates), post-rollout (always passes), rollback "
                     "(2xx rolls back)", secured=False, errors=(400, 401, 404, 413),
                     also={412: "It does not pass (a gate: hold; rollout: a failed check; rollback: do not roll back)."}),
            ApiRoute("GET", "/v1/slos", self.slos, "Every SLO with its slices"),
            ApiRoute("GET", "/v1/slos/{name}", self.slo, "One SLO: per slice budget remaining, burn rates, SLI"),
            ApiRoute("GET", "/v1/alerts", self.alerts, "Alerts firing now"),
            ApiRoute("GET", "/readyz", self.ready, "Caught up within the staleness bound", secured=False, errors=(),
                     also={503: "Not ready, with the reason."}),
            ApiRoute("GET", "/openapi.json", self.openapi, "This document (OpenAPI 3.1)", secured=False, errors=()),
        ]
        self._openapi: bytes | None = None

    # ---- dispatch -------------------------------------------------------------------
    def handle(self, req: Request) -> Response | None:
        """The answer, or None when no route of this API matches the path."""
        path = req.path.split("?", 1)[0]
        if len(path) > MAX_PATH_CHARS:
            return error(414, f"path longer than {MAX_PATH_CHARS} characters")
        matched = [(route, mo) for route in self.routes if (mo := route.pattern.match(path))]
        if not matched:
            return None
        for route, mo in matched:
            if route.method == req.method:
                try:
                    return self._call(route, [urllib.parse.unquote(g) for g in mo.groups()], req)
                except ApiFailure as failure:
                    return json_response(failure.status, failure.answer)
                except Exception as exc:  # a bug answers JSON with a log line, and the next request is served
                    log.exception("%s %s failed", req.method, path[:200])
                    return error(500, f"internal error ({type(exc).__name__}: {str(exc)[:200]})")
        return error(405, f"{req.method} is not allowed here; use {matched[0][0].method}")

    def refuse_before_body(self, method: str, path: str, authorization: str | None) -> Response | None:
        """For a request that carries a body: its answer now, before a byte of the body is
        read, when the body cannot change it (no route here takes one, or the bearer token
        sent is wrong); None: read the body."""
        bare = path.split("?", 1)[0]
        if len(bare) > MAX_PATH_CHARS:
            return error(414, f"path longer than {MAX_PATH_CHARS} characters")
        matched = [route for route in self.routes if route.pattern.match(bare)]
        route = next((r for r in matched if r.method == method and r.payload is not None), None)
        if route is None:
            if not matched:
                return error(404, f"no route {bare[:100]}", hint="GET /openapi.json lists them")
            return error(405, f"{method} is not allowed here; use {matched[0].method}")
        if self.config.auth_required and (authorization or route.secured):
            try:
                self._principal(authorization)
            except ApiFailure as failure:
                return json_response(failure.status, failure.answer)
        return None

    def _call(self, route: ApiRoute, values: list[str], req: Request) -> Response:
        kwargs = {}
        for (name, hint), value in zip(route.params, values):
            try:
                kwargs[name] = msgspec.convert(value, hint)
            except msgspec.ValidationError:
                choices = literal_choices(hint)
                if choices:  # a fixed set of names: an unknown one is not found, not malformed
                    raise ApiFailure(404, f"no {name} {value[:128]!r} (known: {', '.join(choices)})") from None
                raise ApiFailure(400, "path parameters are 1 to 128 characters of letters, digits and . _ : @ + -") from None
        if route.payload is not None:
            if len(req.body) > MAX_BODY_BYTES:
                raise ApiFailure(413, f"request body over {MAX_BODY_BYTES} bytes")
            kwargs["payload"] = _decode_payload(req.body, route.payload)
        if route.wants_authorization:
            kwargs["authorization"] = req.authorization
        who = self._principal(req.authorization) if route.secured else None
        result = route.handler(who, **kwargs)
        status, body = result if isinstance(result, tuple) else (200, result)
        return json_response(status, body)

    def _principal(self, authorization: str | None) -> Principal:
        if not self.config.auth_required:
            return Principal("anonymous", None)
        if not authorization:
            raise ApiFailure(401, "missing bearer token (Authorization: Bearer <token>)")
        principal = self.config.authenticate(authorization)
        if principal is None:
            raise ApiFailure(401, "invalid bearer token")
        return principal

    def _fresh_snapshot(self) -> SignalSnapshot:
        snap = self.snapshot()
        if snap is None:
            raise ApiFailure(503, "no data yet: the worker has not built its first view", reason="starting")
        age = self.wall_clock() - snap.built_wall_s
        if age > self.config.stale_after_s:
            raise ApiFailure(503, f"the worker's view is {age:.0f} s old (bound {self.config.stale_after_s:.0f} s)",
                             reason="stale")
        return snap

    # ---- handlers -------------------------------------------------------------------
    def _pool_answer(self, who: Principal, pool: str, answers: str) -> Autoscale | Shed:
        """A pool's answer from the snapshot's `answers` table, if visible and fresh."""
        entry = getattr(self._fresh_snapshot(), answers).get(pool)
        if entry is None or not who.sees(entry.tenants):
            raise ApiFailure(404, f"no pool named {pool!r} is visible to this token",
                             hint="pools are the `pool` field of request.v1 and gpu.v1 events")
        age = self.wall_clock() - entry.changed_wall_s
        if age > self.config.stale_after_s:
            # KEDA treats an error as a failed scaler and applies its fallback replicas,
            # rather than scaling in (or shedding) on data that stopped arriving.
            raise ApiFailure(503, f"no new data for pool {pool!r} for {age:.0f} s (bound {self.config.stale_after_s:.0f} s); "
                                  f"newest data is from {entry.body.as_of}", reason="stale", as_of=entry.body.as_of)
        return entry.body

    def autoscale(self, who: Principal, pool: Name) -> Autoscale:
        return self._pool_answer(who, pool, "pools")

    def shed(self, who: Principal, pool: Name) -> Shed:
        return self._pool_answer(who, pool, "shed")

    def rollout(self, who: Principal, model: Name, version: Name) -> Verdict:
        snap = self._fresh_snapshot()
        entry = snap.rollouts.get((model, version))
        if entry is None or not who.sees(entry.tenants):
            if model in snap.models and who.tenants is None:
                known = ", ".join(sorted(snap.models[model])) or "none"
                raise ApiFailure(404, f"model {model!r} has no version {version!r} in the rollout window (known: {known})",
                                 reason="no_data")
            raise ApiFailure(404, f"no model {model!r} version {version!r} is visible to this token", reason="no_data")
        return msgspec.structs.replace(entry.body, **self._fresh_sides(entry, model, version))

    def _fresh_sides(self, entry, model: str, version: str) -> dict[str, float]:
        """The age of each side of a rollout answer; a stale side makes it 503 stale (and an
        inconclusive verdict for a controller): a canary never promotes on frozen data."""
        now = self.wall_clock()
        if entry.baseline_changed_wall_s is None:  # the stable version itself, or no stable traffic
            ages = {"data_age_s": round(now - entry.changed_wall_s, 1)}
            if entry.body.canary is not msgspec.UNSET:
                ages["canary_data_age_s"] = ages["data_age_s"]
        else:
            canary, stable = round(now - entry.changed_wall_s, 1), round(now - entry.baseline_changed_wall_s, 1)
            ages = {"data_age_s": max(canary, stable), "canary_data_age_s": canary, "stable_data_age_s": stable}
        if ages["data_age_s"] > self.config.stale_after_s:
            sides = ", ".join(f"{k.split('_')[0]} {v:.0f} s" for k, v in ages.items() if k != "data_age_s")
            raise ApiFailure(503, f"no new data behind {model} {version} for {ages['data_age_s']:.0f} s "
                                  f"({sides or 'its traffic'}; bound {self.config.stale_after_s:.0f} s); newest data is "
                                  f"from {entry.body.as_of}", reason="stale", as_of=entry.body.as_of,
                             data_age_s=ages["data_age_s"])
        return ages

    def controller_verdict(self, who: Principal, model: str, version: str) -> Verdict | Inconclusive:
        """The verdict a rollout controller acts on. Stale data, or none yet for this version
        (a canary before its first closed minute), is `inconclusive` with the reason, never
        an error: Argo counts errors toward `consecutiveErrorLimit` and Flagger counts them
        as failed checks, and neither should abort or roll back a canary for want of data."""
        try:
            return self.rollout(who, model, version)
        except ApiFailure as failure:
            return Inconclusive("inconclusive", failure.answer.reason or "no_data", failure.answer.error, model, version,
                                failure.answer.data_age_s)

    def argo(self, who: Principal, model: Name, version: Name) -> Verdict | Inconclusive:
        """Argo Rollouts' `web` metric provider: always 200 with a verdict, `inconclusive`
        included, so Argo's `inconclusiveLimit` applies to missing data, not its error limit."""
        return self.controller_verdict(who, model, version)

    def flagger(self, _who: None, check: FlaggerCheck, payload: FlaggerPayload,
                authorization: str | None) -> tuple[int, Verdict | Inconclusive]:
        """Flagger webhooks, one per hook type (FLAGGER_PASSES): `pre-rollout` and `rollout`
        fail only on rollback, `confirm-traffic-increase` and `confirm-promotion` hold on
        anything short of continue and promote, `post-rollout` always passes, `rollback`
        answers 2xx when the canary must be rolled back."""
        meta = payload.metadata
        # Flagger cannot send headers on webhooks; its metadata may carry the token instead.
        who = self._principal(authorization or (f"Bearer {meta.token}" if meta.token is not None else None))
        result = self.controller_verdict(who, meta.model, meta.version)
        outcome = result.reason if result.verdict == "inconclusive" else result.verdict
        return (200 if outcome in FLAGGER_PASSES[check] else 412), result

    def flagger_event(self, _who: None, payload: FlaggerEventPayload) -> FlaggerEventCounted:
        """Flagger's `event` hook (every event it records for a canary): counted with bounded
        labels, so a dashboard can show a rollout's phases beside its SLIs."""
        phase = payload.phase if payload.phase in FLAGGER_PHASES else "other"
        kind = payload.metadata.event_type if payload.metadata.event_type in FLAGGER_EVENT_TYPES else "other"
        if self.on_flagger_event is not None:
            self.on_flagger_event(phase, kind)
        return FlaggerEventCounted(True, phase, kind)

    def slos(self, who: Principal) -> SloList:
        snap = self._fresh_snapshot()
        return SloList([s for s in (_scoped_slo(s, who) for s in snap.slos) if s is not None])

    def slo(self, who: Principal, name: Name) -> Slo:
        snap = self._fresh_snapshot()
        for s in snap.slos:
            if s.name == name:
                scoped = _scoped_slo(s, who)
                if scoped is not None:
                    return scoped
        raise ApiFailure(404, f"no SLO named {name!r} is visible to this token", hint="GET /v1/slos lists them")

    def alerts(self, who: Principal) -> AlertList:
        snap = self._fresh_snapshot()
        return AlertList([a for a in snap.alerts if who.sees_labels(a.labels)])

    def openapi(self, _who: None) -> msgspec.Raw:
        if self._openapi is None:
            from signals.openapi import openapi_document  # it reads this module's routes

            self._openapi = _ENCODER.encode(openapi_document(self.routes))
        return msgspec.Raw(self._openapi)

    def ready(self, _who: None) -> tuple[int, Readiness]:
        ok, reason = self.readiness()
        return (200 if ok else 503), Readiness(ok, reason)


def _decode_payload(body: bytes, kind: type):
    try:
        return msgspec.json.decode(body or b"{}", type=kind)
    except msgspec.ValidationError as exc:
        raise ApiFailure(400, f"the body does not fit {kind.__name__}: {exc}") from None
    except msgspec.DecodeError:
        raise ApiFailure(400, f"the body is not JSON (expected {kind.__name__})") from None
    except RecursionError:
        raise ApiFailure(400, "the body nests deeper than the decoder follows") from None


def _scoped_slo(slo: Slo, who: Principal) -> Slo | None:
    """A scoped token sees only slices cut by tenant, and only its own tenants'."""
    if who.tenants is None:
        return slo
    slices = [s for s in slo.slices if who.sees_labels(s.labels)]
    if not slices:
        return None
    # The selector may name a tenant the token is not scoped to.
    selector = {k: v for k, v in slo.selector.items() if k != "tenant"}
    return msgspec.structs.replace(slo, selector=selector, slices=slices)

