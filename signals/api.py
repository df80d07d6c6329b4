"""The signal API over HTTP: routes, bearer tokens and tenant scopes, staleness, errors.

It answers from the latest `SignalSnapshot` the worker swapped in, so a request costs a
dictionary lookup and a JSON encode. Every error is JSON with an `error` line a person
reads. A tenant-scoped token gets 404 for anything holding another tenant's traffic, with
the same message as for a name that does not exist, so scopes leak nothing.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable

from signals.config import ApiConfig, Principal
from signals.live import SignalSnapshot
from signals.openapi import openapi_document

Response = tuple[int, str, bytes]
MAX_BODY_BYTES = 64 * 1024
MAX_PATH_CHARS = 1024
_NAME = re.compile(r"^[A-Za-z0-9._:@+-]{1,128}$")
# Flagger webhook type → the verdicts that answer 2xx. Flagger counts a failed `rollout` hook
# toward `threshold` and rolls back after it, so only `rollback` fails there; the gates
# (`confirm-traffic-increase`, `confirm-promotion`) halt without counting, so `pause` and an
# inconclusive answer hold there; a `rollback` hook's 2xx tells Flagger to roll back now.
FLAGGER_PASSES = {
    "rollout": ("promote", "continue", "pause", "inconclusive"),
    "traffic-increase": ("promote", "continue"),
    "promotion": ("promote",),
    "rollback": ("rollback",),
}
FLAGGER_CHECKS = tuple(FLAGGER_PASSES)


def json_response(status: int, body: object) -> Response:
    return status, "application/json", json.dumps(body, separators=(",", ":")).encode()


def error(status: int, message: str, **extra) -> Response:
    return json_response(status, {"error": message, **extra})


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    authorization: str | None
    body: bytes


class SignalApi:
    def __init__(self, config: ApiConfig, snapshot: Callable[[], SignalSnapshot | None],
                 readiness: Callable[[], tuple[bool, str]], wall_clock: Callable[[], float] = time.time):
        self.config = config
        self.snapshot = snapshot
        self.readiness = readiness
        self.wall_clock = wall_clock
        self._openapi = json.dumps(openapi_document()).encode()
        # (method, pattern, handler, needs a token)
        self.routes: list[tuple[str, re.Pattern, Callable[..., Response], bool]] = [
            ("GET", re.compile(r"^/v1/autoscale/([^/]+)$"), self.autoscale, True),
            ("GET", re.compile(r"^/v1/rollout/([^/]+)/([^/]+)$"), self.rollout, True),
            ("GET", re.compile(r"^/v1/argo/([^/]+)/([^/]+)$"), self.argo, True),
            ("POST", re.compile(r"^/v1/flagger/([^/]+)$"), self.flagger, False),  # token checked in the handler
            ("GET", re.compile(r"^/v1/slos$"), self.slos, True),
            ("GET", re.compile(r"^/v1/slos/([^/]+)$"), self.slo, True),
            ("GET", re.compile(r"^/v1/alerts$"), self.alerts, True),
            ("GET", re.compile(r"^/readyz$"), self.ready, False),
            ("GET", re.compile(r"^/openapi.json$"), self.openapi, False),
        ]

    # ---- dispatch -------------------------------------------------------------------
    def handle(self, req: Request) -> Response | None:
        """The answer, or None when no route of this API matches the path."""
        path = req.path.split("?", 1)[0]
        if len(path) > MAX_PATH_CHARS:
            return error(414, f"path longer than {MAX_PATH_CHARS} characters")
        matched = [(m, pat.match(path), h, auth) for m, pat, h, auth in self.routes]
        matched = [(m, mo, h, auth) for m, mo, h, auth in matched if mo]
        if not matched:
            return None
        for method, mo, handler, needs_token in matched:
            if method != req.method:
                continue
            params = [urllib.parse.unquote(g) for g in mo.groups()]
            for p in params:
                if not _NAME.match(p):
                    return error(400, "path parameters are 1 to 128 characters of letters, digits and . _ : @ + -")
            principal = None
            if needs_token:
                principal, denied = self._principal(req.authorization)
                if denied:
                    return denied
            return handler(req, principal, *params)
        return error(405, f"{req.method} is not allowed here; use {matched[0][0]}")

    def _principal(self, authorization: str | None) -> tuple[Principal | None, Response | None]:
        if not self.config.auth_required:
            return Principal("anonymous", None), None
        if not authorization:
            return None, error(401, "missing bearer token (Authorization: Bearer <token>)")
        principal = self.config.authenticate(authorization)
        if principal is None:
            return None, error(401, "invalid bearer token")
        return principal, None

    def _fresh_snapshot(self) -> tuple[SignalSnapshot | None, Response | None]:
        snap = self.snapshot()
        if snap is None:
            return None, error(503, "no data yet: the worker has not built its first view", reason="starting")
        age = self.wall_clock() - snap.built_wall_s
        if age > self.config.stale_after_s:
            return None, error(503, f"the worker's view is {age:.0f} s old (bound {self.config.stale_after_s:.0f} s)",
                               reason="stale")
        return snap, None

    # ---- handlers -------------------------------------------------------------------
    def autoscale(self, _req: Request, who: Principal, pool: str) -> Response:
        snap, failed = self._fresh_snapshot()
        if failed:
            return failed
        entry = snap.pools.get(pool)
        if entry is None or not who.sees(entry.tenants):
            return error(404, f"no pool named {pool!r} is visible to this token",
                         hint="pools are the `pool` field of request.v1 and gpu.v1 events")
        age = self.wall_clock() - entry.changed_wall_s
        if age > self.config.stale_after_s:
            # KEDA treats an error as a failed scaler and applies its fallback replicas,
            # rather than scaling in on data that stopped arriving.
            return error(503, f"no new data for pool {pool!r} for {age:.0f} s (bound {self.config.stale_after_s:.0f} s); "
                              f"newest data is from {entry.body['as_of']}", reason="stale", as_of=entry.body["as_of"])
        return json_response(200, entry.body)

    def rollout(self, _req: Request, who: Principal, model: str, version: str) -> Response:
        snap, failed = self._fresh_snapshot()
        if failed:
            return failed
        entry = snap.rollouts.get((model, version))
        if entry is None or not who.sees(entry.tenants):
            if model in snap.models and who.tenants is None:
                known = ", ".join(sorted(snap.models[model])) or "none"
                return error(404, f"model {model!r} has no version {version!r} in the rollout window (known: {known})",
                             reason="no_data")
            return error(404, f"no model {model!r} version {version!r} is visible to this token", reason="no_data")
        return json_response(200, entry.body)

    def controller_verdict(self, who: Principal, model: str, version: str) -> dict:
        """The verdict a rollout controller acts on. Stale data, or none yet for this version
        (a canary before its first closed minute), is `inconclusive` with the reason, never
        an error: Argo counts errors toward `consecutiveErrorLimit` and Flagger counts them
        as failed checks, and neither should abort or roll back a canary for want of data."""
        status, _ctype, body = self.rollout(None, who, model, version)
        result = json.loads(body)
        if status == 200:
            return result
        return {"verdict": "inconclusive", "reason": result.get("reason", "no_data"), "error": result.get("error", ""),
                "model": model, "version": version}

    def argo(self, _req: Request, who: Principal, model: str, version: str) -> Response:
        """Argo Rollouts' `web` metric provider: always 200 with a verdict, `inconclusive`
        included, so Argo's `inconclusiveLimit` applies to missing data, not its error limit."""
        return json_response(200, self.controller_verdict(who, model, version))

    def flagger(self, req: Request, _who, check: str) -> Response:
        """Flagger webhooks, one per hook type (see FLAGGER_PASSES): `rollout` fails only on
        rollback, `traffic-increase` and `promotion` hold on anything short of continue and
        promote, `rollback` answers 2xx when the canary must be rolled back."""
        if check not in FLAGGER_CHECKS:
            return error(404, f"no flagger check {check!r} (known: {', '.join(FLAGGER_CHECKS)})")
        if len(req.body) > MAX_BODY_BYTES:
            return error(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            payload = json.loads(req.body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error(400, "the body is not JSON (expected Flagger's webhook payload)")
        meta = payload.get("metadata") if isinstance(payload, dict) else None
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k), str) for k in ("model", "version")):
            return error(400, "metadata.model and metadata.version are required (set them in the Canary's webhook)")
        # Flagger cannot send headers on webhooks; its metadata may carry the token instead.
        authorization = req.authorization or (f"Bearer {meta['token']}" if isinstance(meta.get("token"), str) else None)
        who, denied = self._principal(authorization)
        if denied:
            return denied
        for p in (meta["model"], meta["version"]):
            if not _NAME.match(p):
                return error(400, "metadata.model and metadata.version are 1 to 128 characters of letters, digits and . _ : @ + -")
        result = self.controller_verdict(who, meta["model"], meta["version"])
        status, ctype, body = json_response(200, result)
        return (200 if result["verdict"] in FLAGGER_PASSES[check] else 412), ctype, body

    def slos(self, _req: Request, who: Principal) -> Response:
        snap, failed = self._fresh_snapshot()
        if failed:
            return failed
        return json_response(200, {"slos": [s for s in (_scoped_slo(s, who) for s in snap.slos) if s is not None]})

    def slo(self, _req: Request, who: Principal, name: str) -> Response:
        snap, failed = self._fresh_snapshot()
        if failed:
            return failed
        for s in snap.slos:
            if s["name"] == name:
                scoped = _scoped_slo(s, who)
                if scoped is not None:
                    return json_response(200, scoped)
        return error(404, f"no SLO named {name!r} is visible to this token", hint="GET /v1/slos lists them")

    def alerts(self, _req: Request, who: Principal) -> Response:
        snap, failed = self._fresh_snapshot()
        if failed:
            return failed
        return json_response(200, {"alerts": [a for a in snap.alerts if who.sees_labels(a["labels"])]})

    def openapi(self, _req: Request, _who) -> Response:
        return 200, "application/json", self._openapi

    def ready(self, _req: Request, _who) -> Response:
        ok, reason = self.readiness()
        return json_response(200 if ok else 503, {"ready": ok, "reason": reason})


def _scoped_slo(slo: dict, who: Principal) -> dict | None:
    """A scoped token sees only slices cut by tenant, and only its own tenants'."""
    if who.tenants is None:
        return slo
    slices = [s for s in slo["slices"] if who.sees_labels(s["labels"])]
    if not slices:
        return None
    # The selector may name a tenant the token is not scoped to.
    selector = {k: v for k, v in slo["selector"].items() if k != "tenant"}
    return {**slo, "selector": selector, "slices": slices}
