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

from slo.sli import good_valid_exprs
from slo.spec import SloSpec

# Labels a contributor may be named by, in the order a tie is broken (bounded sets all).
CONTRIBUTOR_LABELS = ("tenant", "zone", "model_version", "deployment", "pool", "model", "workload", "traffic_class")


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
    rows = spec.selected(buckets)
    if not rows.height:
        return []
    picked = (pl.col("window_start").dt.epoch("s") // 60) == minute
    for label, value in slice_labels.items():
        if label in rows.columns:
            picked = picked & (pl.col(label) == value).fill_null(False)
    good, valid = good_valid_exprs(spec)
    labels = [label for label in CONTRIBUTOR_LABELS if label in rows.columns and label not in spec.slice_by]
    counted = rows.filter(picked).select(*labels, (valid - good).alias("_bad"), valid.alias("_valid"))
    bad_total, valid_total = counted["_bad"].sum(), counted["_valid"].sum()
    if not bad_total or not valid_total:
        return []
    found = []
    for label in labels:
        g = counted.group_by(label).agg(pl.col("_bad").sum(), pl.col("_valid").sum())
        if g.height < 2:
            continue
        value, bad, traffic = g.sort(["_bad", label], descending=[True, False], nulls_last=True).row(0)
        bad_share, traffic_share = bad / bad_total, traffic / valid_total
        if value is not None and bad_share >= min_bad_share and bad_share > traffic_share:
            found.append(Contributor(label, str(value), int(bad), bad_share, traffic_share))
    found.sort(key=lambda c: (-(c.bad_share - c.traffic_share), CONTRIBUTOR_LABELS.index(c.label)))
    return found[:most]


def explain(contributors: list[Contributor]) -> str:
    """One sentence for a page's description; empty when no value stands out."""
    return "; ".join(c.text() for c in contributors)
