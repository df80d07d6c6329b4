"""The first traffic step of a canary that has no traffic yet: may it take its first share?

Flagger asks `confirm-traffic-increase` before every weight step, the first included, when
the canary serves nothing and so has no evidence of its own. Holding there for want of
canary data would hold for good (the canary only gets data by taking a step), so the first
step is judged on what there is: the model's stable side, its traffic fresh and no SLO page
firing on a slice that covers it. From the first step on the canary has traffic and its own
verdict decides. Pure: the caller passes the ages, the SLO slices and the pages it read.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailwatch.signals.answers import Alert, Slo

# Slice labels that say whose traffic a slice holds; a slice naming another model or version
# does not speak about this side, one naming neither (a zone, a tenant) covers it.
SIDE_LABELS = ("model", "model_version")


@dataclass(frozen=True)
class StableSide:
    """The model's stable side as the view holds it."""

    model: str
    version: str
    data_age_s: float  # since its traffic last moved


@dataclass(frozen=True)
class FirstStep:
    passes: bool
    reason: str


def covers(labels: dict[str, str], side: StableSide) -> bool:
    """Whether a slice (or a page) with these labels holds the stable side's traffic."""
    wanted = {"model": side.model, "model_version": side.version}
    return all(labels[k] == wanted[k] for k in SIDE_LABELS if k in labels)


def first_step(side: StableSide | None, slos: list[Slo], alerts: list[Alert], stale_after_s: float) -> FirstStep:
    """Passes only on evidence: the stable side's traffic moved within `stale_after_s`, at
    least one SLO slice covers it, and no page fires on any slice that does."""
    if side is None:
        return FirstStep(False, "no canary traffic yet, and no stable traffic of this model in the rollout window "
                                "to judge the first step on")
    if side.data_age_s > stale_after_s:
        return FirstStep(False, f"no canary traffic yet, and the stable side ({side.model} {side.version}) has not "
                                f"moved for {side.data_age_s:.0f} s (bound {stale_after_s:.0f} s)")
    slices = sum(covers(s.labels, side) for slo in slos for s in slo.slices)
    if not slices:
        return FirstStep(False, f"no canary traffic yet, and no SLO slice covers {side.model} {side.version}: "
                                "its health is unknown")
    paging = sorted(f"{a.slo} ({a.window}, {', '.join(f'{k}={v}' for k, v in sorted(a.labels.items()))})"
                    for a in alerts if a.severity == "page" and covers(a.labels, side))
    if paging:
        return FirstStep(False, f"no canary traffic yet, and the stable side ({side.model} {side.version}) is "
                                f"paging: {'; '.join(paging)}")
    return FirstStep(True, f"no canary traffic yet: the first step may proceed, the stable side ({side.model} "
                           f"{side.version}) is healthy ({slices} SLO slices cover it, none paging) and its data "
                           f"{side.data_age_s:.0f} s old; from the first step on the canary's verdict decides")
