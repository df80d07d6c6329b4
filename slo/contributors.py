"""Who holds an SLO's bad events: the label values a page names so that on-call does not dig.

Pure: `sli_minute` rows in, contributors out. For a slice of an SLO at one minute (the minute
an alert fired), each label the SLO does not slice by (tenant, zone, version, ...) is grouped,
and a value is named when it holds most of the bad events and more than its share of the
traffic: "tenant=acme holds 82% of the bad events (31% of the traffic)". A label with one
value in the slice says nothing and is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from slo.sli import good_valid_exprs, with_later_counts
from slo.spec import SloSpec

# Labels a contributor may be named by, in the order a tie is broken (bounded sets all).
CONTRIBUTOR_LABELS = ("tenant", "zone", "model_version", "language", "voice", "deployment", "pool", "model", "workload",
                      "traffic_class")


@dataclass(frozen=True)
class Contributor:
    label: str
    value: str
    bad_events: int
    bad_share: float  # of the slice's bad events in the minute
    traffic_share: float  # of its valid events

    def text(self) -> str:
        return (f"{self.label}={self.value} holds {100 * self.bad_share:.0f}% of the bad events "
                f"({100 * self.traffic_share:.0f}% of the traffic)")


def top_contributors(spec: SloSpec, buckets: pl.DataFrame, slice_labels: dict[str, str], minute: int,
                     most: int = 3, min_bad_share: float = 0.5) -> list[Contributor]:
    """The label values that hold at least `min_bad_share` of the slice's bad events at
    `minute`, and more than their share of its traffic; at most `most`, the largest excess first."""
    keys = [label for label in spec.slice_by if label in buckets.columns]
    found = contributors_by_slice(spec, buckets, minute, most, min_bad_share)
    return found.get(tuple(slice_labels.get(k) for k in keys), [])


def contributors_by_slice(spec: SloSpec, buckets: pl.DataFrame, minute: int, most: int = 3,
                          min_bad_share: float = 0.5) -> dict[tuple, list[Contributor]]:
    """`top_contributors` for every slice of the SLO at `minute` at once, keyed by the slice's
    values of `spec.slice_by` (the labels the rows carry)."""
    return contributors_by_minute(spec, buckets, [minute], most, min_bad_share).get(minute, {})


def contributors_by_minute(spec: SloSpec, buckets: pl.DataFrame, minutes: list[int], most: int = 3,
                           min_bad_share: float = 0.5) -> dict[int, dict[tuple, list[Contributor]]]:
    """`contributors_by_slice` for each of `minutes`, in a few group-bys over those minutes'
    rows: a checkpoint where thousands of pages fire, over hundreds of minutes of a backlog,
    costs what one does."""
    rows = spec.selected(with_later_counts(buckets))
    if not rows.height:
        return {}
    keys = [label for label in spec.slice_by if label in rows.columns]
    good, valid = good_valid_exprs(spec)
    labels = [label for label in CONTRIBUTOR_LABELS if label in rows.columns and label not in spec.slice_by]
    minute = (pl.col("window_start").dt.epoch("s") // 60).alias("_minute")
    counted = rows.select(minute, *keys, *labels, (valid - good).alias("_bad"), valid.alias("_valid")).filter(
        pl.col("_minute").is_in(minutes))
    if not counted.height:
        return {}
    by = ["_minute", *keys]
    totals = {tuple(r[:-2]): (r[-2], r[-1]) for r in counted.group_by(by).agg(
        pl.col("_bad").sum(), pl.col("_valid").sum()).iter_rows()}
    found: dict[int, dict[tuple, list[Contributor]]] = {}
    for label in labels:
        per_value = counted.group_by(*by, label).agg(pl.col("_bad").sum(), pl.col("_valid").sum())
        # Where the label has one value in the slice it says nothing; otherwise its value with the most bad events.
        top = (per_value.filter(pl.len().over(by) >= 2)
               .sort([*by, "_bad", label], descending=[*(False for _ in by), True, False], nulls_last=True)
               .group_by(by, maintain_order=True).first())
        for r in top.iter_rows(named=True):
            at, key = r["_minute"], tuple(r[k] for k in keys)
            bad_total, valid_total = totals.get((at, *key), (0, 0))
            value, bad, traffic = r[label], r["_bad"], r["_valid"]
            if not bad_total or not valid_total or value is None:
                continue
            bad_share, traffic_share = bad / bad_total, traffic / valid_total
            if bad_share >= min_bad_share and bad_share > traffic_share:
                found.setdefault(at, {}).setdefault(key, []).append(
                    Contributor(label, str(value), int(bad), bad_share, traffic_share))
    for per_slice in found.values():
        for key, items in per_slice.items():
            items.sort(key=lambda c: (-(c.bad_share - c.traffic_share), CONTRIBUTOR_LABELS.index(c.label)))
            per_slice[key] = items[:most]
    return found


def explain(contributors: list[Contributor]) -> str:
    """One sentence for a page's description; empty when no value stands out."""
    return "; ".join(c.text() for c in contributors)
