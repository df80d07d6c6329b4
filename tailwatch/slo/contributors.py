"""Who holds an SLO's bad events: the label values and the causes a page names, on evidence.

Pure: `sli_minute` rows in, culprits out. For a slice of an SLO at one minute (the minute an
alert fired), each label the SLO does not slice by (tenant, zone, version, ...) is grouped.
A value is named only when its share of the bad events beats its share of the traffic by
more than chance: under "bad events fall as traffic does", the value's count of bad events
is Binomial(bad events, its traffic share); the one-sided tail P(X ≥ its count) is compared
with `alpha` divided by the number of values examined in the slice (Bonferroni), and the
value needs at least `min_bad_events`. "tenant=acme holds 92% of the bad events (240 of 260;
30% of the traffic, p = 3e-80)". Where no value of a label stands out, the page says over
how many values the bad events are spread ("spread over 5 tenants"): 2 bad events on one tenant name nobody.

For availability, the status reasons are a dimension too: a reason (oom, timeout, shed) that
holds at least half of the bad events, with `min_bad_events`, is named
("status_reason=oom on 38 of the 40 bad events"), so an OOM page says OOM however evenly
the tenants are hit.

The detections open at the minute (detectors/: retry storms, queue age, ...) are a dimension
too, each a value whose scope is the rows its labels match (its labels that are no column of
the rows, such as a GPU's node, are not matched on). One covering part of the slice is named
on the same binomial evidence as a label value, counted among the values examined
("retry_storm (tenant=acme) open since 2026-11-02 00:12 holds 90% of the bad events (180 of
200; 20% of the traffic, p = 1e-40)"); one covering the whole slice holds every bad event,
which proves nothing beyond its being open, and is named as such with `min_bad_events`
("queue_age (pool=a) open since 2026-11-02 00:12 over the whole slice").

Bad events are the proven bad ones: events known only as a runtime bucket straddling a
latency threshold (`slo.sli.undecided_expr`) are left out, as the alert that asks is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from tailwatch.slo.binomial import binomial_tail
from tailwatch.slo.sli import good_valid_exprs, undecided_expr, with_later_counts
from tailwatch.slo.spec import SloSpec
from tailwatch.slo.alert_windows import minute_text

# Labels a contributor may be named by, in the order a tie is broken (bounded sets all).
CONTRIBUTOR_LABELS = ("tenant", "zone", "model_version", "language", "voice", "deployment", "pool", "model", "workload",
                      "traffic_class")
_PLURAL = {"tenant": "tenants", "zone": "zones", "model_version": "model versions", "language": "languages",
           "voice": "voices", "deployment": "deployments", "pool": "pools", "model": "models", "workload": "workloads",
           "traffic_class": "traffic classes"}
# Why an availability SLO's bad events failed: reason → its count among the bucket's columns.
# A plain error says nothing a page's summary does not, so only these are named.
_CAUSES = {"oom": pl.col("ooms"), "timeout": pl.col("timeouts"), "shed": pl.col("shed")}

ALPHA = 0.01  # family-wise, per slice: the chance a page names anyone when bad events fall as traffic does
MIN_BAD_EVENTS = 5  # a value or a cause holding fewer is never named, however lopsided


@dataclass(frozen=True)
class Contributor:
    label: str
    value: str
    bad_events: int
    bad_share: float  # of the slice's bad events in the minute
    traffic_share: float  # of its valid events
    bad_total: int = 0  # the slice's bad events in the minute
    p_value: float = 1.0  # one-sided binomial tail, before the Bonferroni correction

    def text(self) -> str:
        return (f"{self.label}={self.value} holds {100 * self.bad_share:.0f}% of the bad events ({self.bad_events:,} of "
                f"{self.bad_total:,}; {100 * self.traffic_share:.0f}% of the traffic, p = {self.p_value:.1g})")


@dataclass(frozen=True)
class Cause:
    """A status reason holding at least half of a slice's bad events."""

    reason: str
    bad_events: int
    bad_total: int

    def text(self) -> str:
        return f"status_reason={self.reason} on {self.bad_events:,} of the {self.bad_total:,} bad events"


@dataclass(frozen=True)
class OpenDetection:
    """A detection as the contributors see it: what raised it, on which labels, and when."""

    detector: str
    labels: dict[str, str]
    started_at: int  # event-time minute
    ended_at: int | None = None  # the first minute clear (None: still open)

    def open_at(self, minute: int) -> bool:
        return self.started_at <= minute and (self.ended_at is None or minute < self.ended_at)

    def name(self) -> str:
        scope = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return f"{self.detector} ({scope}) open since {minute_text(self.started_at)}"


@dataclass(frozen=True)
class DetectionContributor:
    """An open detection whose scope holds the slice's bad events: more than its traffic share
    would (`p_value`), or all of them where it covers the whole slice (`traffic_share` 1)."""

    detection: OpenDetection
    bad_events: int
    bad_total: int
    traffic_share: float
    p_value: float | None = None  # None: it covers the whole slice, no test to make

    def text(self) -> str:
        if self.p_value is None:
            return f"{self.detection.name()} over the whole slice"
        return (f"{self.detection.name()} holds {100 * self.bad_events / self.bad_total:.0f}% of the bad events "
                f"({self.bad_events:,} of {self.bad_total:,}; {100 * self.traffic_share:.0f}% of the traffic, "
                f"p = {self.p_value:.1g})")


@dataclass(frozen=True)
class Culprits:
    """What a page says about a slice's bad events at one minute."""

    bad_events: int
    named: tuple[Contributor, ...] = ()
    causes: tuple[Cause, ...] = ()
    spread: tuple[tuple[str, int], ...] = ()  # (label, values holding bad events) where no value stands out
    detections: tuple[DetectionContributor, ...] = ()

    def text(self) -> str:
        parts = [c.text() for c in self.causes] + [d.text() for d in self.detections] + [c.text() for c in self.named]
        if self.spread:
            over = ", ".join(f"{n} {_PLURAL.get(label, label)}" for label, n in self.spread)
            parts.append(f"the {self.bad_events:,} bad events are spread as traffic is over {over}: no value stands out")
        return "; ".join(parts)


def top_contributors(spec: SloSpec, buckets: pl.DataFrame, slice_labels: dict[str, str], minute: int,
                     most: int = 3, alpha: float = ALPHA, min_bad_events: int = MIN_BAD_EVENTS) -> Culprits | None:
    """The culprits of one slice at `minute` (None where it holds no bad events)."""
    keys = [label for label in spec.slice_by if label in buckets.columns]
    found = contributors_by_slice(spec, buckets, minute, most, alpha, min_bad_events)
    return found.get(tuple(slice_labels.get(k) for k in keys))


def contributors_by_slice(spec: SloSpec, buckets: pl.DataFrame, minute: int, most: int = 3, alpha: float = ALPHA,
                          min_bad_events: int = MIN_BAD_EVENTS) -> dict[tuple, Culprits]:
    """`top_contributors` for every slice of the SLO at `minute` at once, keyed by the slice's
    values of `spec.slice_by` (the labels the rows carry)."""
    return contributors_by_minute(spec, buckets, [minute], most, alpha, min_bad_events).get(minute, {})


def contributors_by_minute(spec: SloSpec, buckets: pl.DataFrame, minutes: list[int], most: int = 3,
                           alpha: float = ALPHA, min_bad_events: int = MIN_BAD_EVENTS,
                           detections: Sequence[OpenDetection] = ()) -> dict[int, dict[tuple, Culprits]]:
    """`contributors_by_slice` for each of `minutes`, in a few group-bys over those minutes'
    rows: a checkpoint where thousands of pages fire, over hundreds of minutes of a backlog,
    costs what one does. Slices without bad events are left out. `detections`: those open
    (or once open) in the store's view, each judged at the minutes it was open."""
    minute = (pl.col("window_start").dt.epoch("s") // 60).alias("_minute")
    # The minutes asked about first: a backlog's checkpoint holds hours of rows, its pages
    # fire at a few of those minutes, and everything below is row by row until the group-bys.
    rows = spec.selected(with_later_counts(buckets.filter(minute.is_in(minutes))))
    if not rows.height:
        return {}
    keys = [label for label in spec.slice_by if label in rows.columns]
    good, valid = good_valid_exprs(spec)
    labels = [label for label in CONTRIBUTOR_LABELS if label in rows.columns and label not in spec.slice_by]
    with_causes = spec.sli_kind == "availability" and all(c in rows.columns for c in ("ooms", "timeouts", "shed"))
    causes = [expr.fill_null(0).alias(f"_cause_{name}") for name, expr in _CAUSES.items()] if with_causes else []
    bad = valid - good - undecided_expr(spec)  # proven bad only
    counted = rows.select(minute, *keys, *labels, bad.alias("_bad"), valid.alias("_valid"), *causes)
    by = ["_minute", *keys]
    slices = counted.group_by(by).agg(pl.col("_bad").sum(), pl.col("_valid").sum(),
                                      *(pl.col(f"_cause_{name}").sum() for name in _CAUSES if with_causes))
    slices = slices.filter((pl.col("_bad") > 0) & (pl.col("_valid") > 0))
    if not slices.height:
        return {}
    totals = slices.select(*by, pl.col("_bad").alias("_bad_total"), pl.col("_valid").alias("_valid_total"))
    # Every value of every label that has two or more values in its slice: a candidate.
    per_value = [counted.group_by(*by, label).agg(pl.col("_bad").sum(), pl.col("_valid").sum())
                 .filter(pl.col(label).is_not_null())
                 .filter(pl.len().over(by) >= 2)
                 .select(*by, pl.lit(label).alias("_label"), pl.col(label).cast(pl.String).alias("_value"), "_bad", "_valid")
                 for label in labels]
    candidates = (pl.concat(per_value) if per_value else pl.DataFrame()).join(totals, on=by, how="inner") \
        if per_value else pl.DataFrame()
    found: dict[int, dict[tuple, Culprits]] = {}
    named: dict[tuple, list[Contributor]] = {}
    spread: dict[tuple, list[tuple[str, int]]] = {}
    scoped = _detection_scopes(counted, totals, by, minutes, detections)
    tested = {}  # slice key → detections tested in it (part of the slice: each one more examined value)
    for key, d, _, valid_d, _, valid_total in scoped:
        if valid_d < valid_total:
            tested[key] = tested.get(key, 0) + 1
    if candidates.height:
        candidates = candidates.filter(pl.col("_bad") > 0).with_columns(pl.len().over(by).alias("_examined"))
        if tested:  # Bonferroni over the label values and the detections examined in the slice
            extra = pl.DataFrame([(*k, n) for k, n in tested.items()], schema=[*by, "_tested"], orient="row",
                                 schema_overrides={c: candidates.schema[c] for c in by})
            candidates = candidates.join(extra, on=by, how="left").with_columns(
                (pl.col("_examined") + pl.col("_tested").fill_null(0)).alias("_examined")).drop("_tested")
        bad, n_bad = candidates["_bad"].to_numpy(), candidates["_bad_total"].to_numpy()
        share = candidates["_valid"].to_numpy() / candidates["_valid_total"].to_numpy()
        p_values = binomial_tail(bad - 1, n_bad, np.clip(share, 0.0, 1.0))
        stands_out = (bad >= min_bad_events) & (p_values * candidates["_examined"].to_numpy() <= alpha) & (bad / n_bad > share)
        candidates = candidates.with_columns(pl.Series("_p", p_values), pl.Series("_named", stands_out),
                                             pl.Series("_share", share))
        for r in candidates.filter(pl.col("_named")).iter_rows(named=True):
            key = (r["_minute"], *(r[k] for k in keys))
            named.setdefault(key, []).append(Contributor(r["_label"], r["_value"], int(r["_bad"]),
                                                         r["_bad"] / r["_bad_total"], r["_share"], int(r["_bad_total"]),
                                                         float(r["_p"])))
        loose = (candidates.group_by(*by, "_label").agg(pl.col("_named").any(), pl.len().alias("_values"))
                 .filter(~pl.col("_named") & (pl.col("_values") >= 2)))
        for r in loose.iter_rows(named=True):
            spread.setdefault((r["_minute"], *(r[k] for k in keys)), []).append((r["_label"], int(r["_values"])))
    examined = dict(tested)
    if candidates.height:
        for r in candidates.select(*by, "_examined").unique(by).iter_rows():
            examined[tuple(r[:-1])] = r[-1]
    by_detection: dict[tuple, list[DetectionContributor]] = {}
    for key, d, bad_d, valid_d, bad_total, valid_total in scoped:
        if bad_d < min_bad_events:
            continue
        share = valid_d / valid_total
        if valid_d >= valid_total:
            by_detection.setdefault(key, []).append(DetectionContributor(d, bad_d, bad_total, 1.0))
            continue
        p = float(binomial_tail(bad_d - 1, bad_total, share))
        if p * max(examined.get(key, 1), 1) <= alpha and bad_d / bad_total > share:
            by_detection.setdefault(key, []).append(DetectionContributor(d, bad_d, bad_total, share, p))
    for r in slices.iter_rows(named=True):
        key = (r["_minute"], *(r[k] for k in keys))
        total = int(r["_bad"])
        reasons = tuple(Cause(name, int(r[f"_cause_{name}"]), total) for name in _CAUSES
                        if with_causes and r[f"_cause_{name}"] >= min_bad_events and 2 * r[f"_cause_{name}"] >= total)
        items = sorted(named.get(key, []), key=lambda c: (c.p_value, -(c.bad_share - c.traffic_share),
                                                           CONTRIBUTOR_LABELS.index(c.label)))[:most]
        loose_labels = tuple(sorted(spread.get(key, []), key=lambda s: CONTRIBUTOR_LABELS.index(s[0])))
        opened = tuple(sorted(by_detection.get(key, []), key=lambda c: (c.p_value or 0.0, c.detection.started_at)))[:most]
        found.setdefault(key[0], {})[key[1:]] = Culprits(total, tuple(items), reasons, loose_labels, opened)
    return found


def _detection_scopes(counted: pl.DataFrame, totals: pl.DataFrame, by: list[str], minutes: list[int],
                      detections: Sequence[OpenDetection]) -> list[tuple[tuple, OpenDetection, int, int, int, int]]:
    """Per slice with bad events and detection open at its minute whose scope matches some of
    its rows: (slice key, detection, bad and valid events in the scope, the slice's bad and
    valid events)."""
    out = []
    for d in detections:
        at = [m for m in minutes if d.open_at(m)]
        if not at or not any(k in counted.columns for k in d.labels):
            continue  # not open then, or no label of it the request rows carry
        picked = pl.col("_minute").is_in(at)
        for k, v in d.labels.items():
            if k in counted.columns:
                picked = picked & (pl.col(k).cast(pl.String) == v).fill_null(False)
        scope = (counted.filter(picked).group_by(by).agg(pl.col("_bad").sum(), pl.col("_valid").sum())
                 .join(totals, on=by, how="inner"))
        for r in scope.iter_rows(named=True):
            if r["_valid"] > 0:
                out.append(((r["_minute"], *(r[k] for k in by[1:])), d, int(r["_bad"]), int(r["_valid"]),
                            int(r["_bad_total"]), int(r["_valid_total"])))
    return out


def explain(culprits: Culprits | None) -> str:
    """One sentence for a page's description; empty when the slice holds no bad events or
    has no label with two values to compare."""
    return culprits.text() if culprits is not None else ""
