"""The signal API's answers: bearer tokens and tenant scopes, staleness, each operation's
answer or `ApiFailure`. The routes over them are `signals/routes.py`.

It answers from the latest `ServedView` the worker published (signals/served.py): each answer
there is the JSON a client receives, encoded once in the worker, so a request costs a
dictionary lookup and the checks of its token and the data's age; a rollout verdict has its
data ages spliced in. Every failure is an `ApiError` with a line a person reads. A
tenant-scoped token gets 404 for anything holding another tenant's traffic, with the same
message as for a name that does not exist, so scopes leak nothing.
"""

from __future__ import annotations

import time
import typing
from typing import Callable

import msgspec

from tailwatch.signals.answers import (
    AlertList,
    ApiError,
    FlaggerCheck,
    FlaggerEventCounted,
    FlaggerEventPayload,
    FlaggerPayload,
    Inconclusive,
    Readiness,
    Reason,
    Slo,
    SloList,
)
from tailwatch.conventions import FLAGGER_EVENT_TYPES, FLAGGER_PHASES
from tailwatch.signals.config import ApiConfig, Principal
from tailwatch.signals.first_step import StableSide, first_step
from tailwatch.signals.served import Answered, ServedView, TypedReads, typed_reads, with_ages

MAX_BODY_BYTES = 64 * 1024
# Flagger webhook type → the verdicts that answer 2xx (Flagger takes 200-202 as passing); an
# inconclusive answer is named by its reason (no_data, stale, starting). Per Flagger's docs and
# its scheduler: a failed `pre-rollout` or `rollout` hook counts toward `threshold` and rolls
# back after it, so only `rollback` fails there; the gates (`confirm-rollout`,
# `confirm-traffic-increase`, `confirm-promotion`) halt without counting anything; a
# `rollback` hook's 2xx tells Flagger to roll back now; a failed `post-rollout` hook is only
# logged, so it always passes and carries the final verdict. `confirm-rollout` runs before the
# canary has traffic, so having no data yet passes; data that stopped moving (or a worker still
# starting) holds the rollout until tailwatch can judge it. `confirm-traffic-increase` with no
# canary traffic yet (its first step) is judged on the stable side instead (SignalApi.flagger).
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


class ApiFailure(Exception):
    """A handler's non-2xx answer."""

    def __init__(self, status: int, message: str, **extra):
        super().__init__(message)
        self.status, self.answer = status, ApiError(message, **extra)


class VerdictJson(typing.NamedTuple):
    """A rollout verdict's name and its JSON (with its data ages) as a client receives it."""

    verdict: str
    json: bytes


class SignalApi:
    def __init__(self, config: ApiConfig, view: Callable[[], ServedView | None],
                 readiness: Callable[[], tuple[bool, str]], wall_clock: Callable[[], float] = time.time,
                 on_flagger_event: Callable[[str, str], None] | None = None):
        self.config = config
        self.on_flagger_event = on_flagger_event  # (phase, event type), both from closed sets
        self.view = view
        self.readiness = readiness
        self.wall_clock = wall_clock
        self._typed: tuple[bytes, bytes, TypedReads] | None = None  # the last view's lists, decoded when first read

    def principal(self, authorization: str | None) -> Principal:
        if not self.config.auth_required:
            return Principal("anonymous", None)
        if not authorization:
            raise ApiFailure(401, "missing bearer token (Authorization: Bearer <token>)")
        principal = self.config.authenticate(authorization)
        if principal is None:
            raise ApiFailure(401, "invalid bearer token")
        return principal

    def _fresh_view(self) -> ServedView:
        snap = self.view()
        if snap is None:
            raise ApiFailure(503, "no data yet: the worker has not built its first view", reason="starting")
        age = self.wall_clock() - snap.built_wall_s
        if age > self.config.stale_after_s:
            raise ApiFailure(503, f"the worker's view is {age:.0f} s old (bound {self.config.stale_after_s:.0f} s)",
                             reason="stale")
        return snap

    def _typed_reads(self, view: ServedView) -> TypedReads:
        """The view's SLOs and alerts as typed answers, decoded once per view (a heartbeat's
        keeps them), and only for a read that takes part of them: a scoped token's, the first
        traffic step's."""
        if self._typed is None or self._typed[0] is not view.slos or self._typed[1] is not view.alerts:
            self._typed = (view.slos, view.alerts, typed_reads(view))
        return self._typed[2]

    # ---- handlers -------------------------------------------------------------------
    def _pool_answer(self, who: Principal, pool: str, answers: str) -> bytes:
        """A pool's answer (its JSON) from the view's `answers` table, if visible, every input
        it reads caught up and present, and fresh."""
        snap = self._fresh_view()
        entry = getattr(snap, answers).get(pool)
        absent = snap.absent.get(pool)
        if (entry is None or not who.sees(entry.tenants)) and (absent is None or not who.sees(absent.tenants)):
            raise ApiFailure(404, f"no pool named {pool!r} is visible to this token",
                             hint="pools are the `pool` field of request.v1 and gpu.v1 events")
        # An input not read to its end, or empty in the pool's window: no answer rather than
        # one on part of the data (KEDA applies its fallback, which holds the replicas).
        if snap.inputs_behind:
            raise ApiFailure(503, "an input of this answer is behind: " + "; ".join(
                f"{topic}: {why}" for topic, why in sorted(snap.inputs_behind.items())), reason="behind")
        if absent is not None:
            raise ApiFailure(503, absent.body.reason, reason="no_data", as_of=absent.body.as_of)
        age = self.wall_clock() - entry.changed_wall_s
        if age > self.config.stale_after_s:
            # KEDA treats an error as a failed scaler and applies its fallback replicas,
            # rather than scaling in (or shedding) on data that stopped arriving.
            raise ApiFailure(503, f"no new data for pool {pool!r} for {age:.0f} s (bound {self.config.stale_after_s:.0f} s); "
                                  f"newest data is from {entry.as_of}", reason="stale", as_of=entry.as_of)
        return entry.json

    def autoscale(self, who: Principal, pool: str) -> bytes:
        """An `Autoscale`, as JSON."""
        return self._pool_answer(who, pool, "pools")

    def shed(self, who: Principal, pool: str) -> bytes:
        """A `Shed`, as JSON."""
        return self._pool_answer(who, pool, "shed")

    def rollout(self, who: Principal, model: str, version: str) -> bytes:
        """A `Verdict`, as JSON, with its data ages."""
        return self._verdict(who, model, version).json

    def _verdict(self, who: Principal, model: str, version: str) -> VerdictJson:
        snap = self._fresh_view()
        entry = snap.rollouts.get((model, version))
        if entry is None or not who.sees(entry.tenants):
            if model in snap.models and who.tenants is None:
                known = ", ".join(sorted(snap.models[model])) or "none"
                raise ApiFailure(404, f"model {model!r} has no version {version!r} in the rollout window (known: {known})",
                                 reason="no_data")
            raise ApiFailure(404, f"no model {model!r} version {version!r} is visible to this token", reason="no_data")
        return VerdictJson(entry.verdict, with_ages(entry.json, self._fresh_sides(entry, model, version)))

    def _fresh_sides(self, entry: Answered, model: str, version: str) -> dict[str, float]:
        """The age of each side of a rollout answer; a stale side makes it 503 stale (and an
        inconclusive verdict for a controller): a canary never promotes on frozen data."""
        now = self.wall_clock()
        if entry.baseline_changed_wall_s is None:  # the stable version itself, or no stable traffic
            ages = {"data_age_s": round(now - entry.changed_wall_s, 1)}
            if entry.canary:
                ages["canary_data_age_s"] = ages["data_age_s"]
        else:
            canary, stable = round(now - entry.changed_wall_s, 1), round(now - entry.baseline_changed_wall_s, 1)
            ages = {"data_age_s": max(canary, stable), "canary_data_age_s": canary, "stable_data_age_s": stable}
        if ages["data_age_s"] > self.config.stale_after_s:
            sides = ", ".join(f"{k.split('_')[0]} {v:.0f} s" for k, v in ages.items() if k != "data_age_s")
            raise ApiFailure(503, f"no new data behind {model} {version} for {ages['data_age_s']:.0f} s "
                                  f"({sides or 'its traffic'}; bound {self.config.stale_after_s:.0f} s); newest data is "
                                  f"from {entry.as_of}", reason="stale", as_of=entry.as_of,
                             data_age_s=ages["data_age_s"])
        return ages

    def controller_verdict(self, who: Principal, model: str, version: str) -> VerdictJson | Inconclusive:
        """The verdict a rollout controller acts on. Stale data, or none yet for this version
        (a canary before its first closed minute), is `inconclusive` with the reason, never
        an error: Argo counts errors toward `consecutiveErrorLimit` and Flagger counts them
        as failed checks, and neither should abort or roll back a canary for want of data."""
        try:
            return self._verdict(who, model, version)
        except ApiFailure as failure:
            return Inconclusive("inconclusive", failure.answer.reason or "no_data", failure.answer.error, model, version,
                                failure.answer.data_age_s)

    def argo(self, who: Principal, model: str, version: str) -> VerdictJson | Inconclusive:
        """Argo Rollouts' `web` metric provider: always 200 with a verdict, `inconclusive`
        included, so Argo's `inconclusiveLimit` applies to missing data, not its error limit."""
        return self.controller_verdict(who, model, version)

    def flagger(self, _who: None, check: FlaggerCheck, payload: FlaggerPayload,
                authorization: str | None) -> tuple[int, VerdictJson | Inconclusive]:
        """Flagger webhooks, one per hook type (FLAGGER_PASSES): `pre-rollout` and `rollout`
        fail only on rollback, `confirm-traffic-increase` and `confirm-promotion` hold on
        anything short of continue and promote, `post-rollout` always passes, `rollback`
        answers 2xx when the canary must be rolled back."""
        meta = payload.metadata
        # Flagger cannot send headers on webhooks; its metadata may carry the token instead.
        who = self.principal(authorization or (f"Bearer {meta.token}" if meta.token is not None else None))
        result = self.controller_verdict(who, meta.model, meta.version)
        if check == "confirm-traffic-increase" and isinstance(result, Inconclusive) and result.reason == "no_data":
            # Flagger asks before the first step too, when the canary has no traffic and so
            # no verdict: that step is judged on the stable side (signals/first_step.py).
            side = self._stable_side(who, meta.model)
            typed = self._typed_reads(self._fresh_view())
            step = first_step(side, [s for s in (_scoped_slo(s, who) for s in typed.slos.slos) if s is not None],
                              [a for a in typed.alerts.alerts if who.sees_labels(a.labels)], self.config.stale_after_s)
            result = msgspec.structs.replace(result, error=step.reason,
                                             data_age_s=round(side.data_age_s, 1) if side else None)
            return (200 if step.passes else 412), result
        outcome = result.reason if isinstance(result, Inconclusive) else result.verdict
        return (200 if outcome in FLAGGER_PASSES[check] else 412), result

    def _stable_side(self, who: Principal, model: str) -> StableSide | None:
        """The model's stable version in the view (its answer compares nothing and has no
        baseline of its own) and how long ago its traffic moved."""
        for (name, version), entry in self._fresh_view().rollouts.items():
            if name == model and entry.baseline_changed_wall_s is None and not entry.canary and who.sees(entry.tenants):
                return StableSide(model, version, self.wall_clock() - entry.changed_wall_s)
        return None

    def flagger_event(self, _who: None, payload: FlaggerEventPayload) -> FlaggerEventCounted:
        """Flagger's `event` hook (every event it records for a canary): counted with bounded
        labels, so a dashboard can show a rollout's phases beside its SLIs."""
        phase = payload.phase if payload.phase in FLAGGER_PHASES else "other"
        kind = payload.metadata.event_type if payload.metadata.event_type in FLAGGER_EVENT_TYPES else "other"
        if self.on_flagger_event is not None:
            self.on_flagger_event(phase, kind)
        return FlaggerEventCounted(True, phase, kind)

    def slos(self, who: Principal) -> bytes | SloList:
        """Every SLO as the view encoded it; a scoped token's, its slices of them."""
        snap = self._fresh_view()
        if who.tenants is None:
            return snap.slos
        return SloList([s for s in (_scoped_slo(s, who) for s in self._typed_reads(snap).slos.slos) if s is not None])

    def slo(self, who: Principal, name: str) -> bytes | Slo:
        snap = self._fresh_view()
        if who.tenants is None:
            span = snap.slo_spans.get(name)
            if span is not None:
                return snap.slos[span[0]:span[1]]
        else:
            for s in self._typed_reads(snap).slos.slos:
                if s.name == name:
                    scoped = _scoped_slo(s, who)
                    if scoped is not None:
                        return scoped
        raise ApiFailure(404, f"no SLO named {name!r} is visible to this token", hint="GET /v1/slos lists them")

    def alerts(self, who: Principal) -> bytes | AlertList:
        snap = self._fresh_view()
        if who.tenants is None:
            return snap.alerts
        return AlertList([a for a in self._typed_reads(snap).alerts.alerts if who.sees_labels(a.labels)])

    def ready(self, _who: None) -> tuple[int, Readiness]:
        ok, reason = self.readiness()
        return (200 if ok else 503), Readiness(ok, reason)


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

