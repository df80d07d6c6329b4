"""The "why" row of the fleet overview and the SLO detail: who hurts and why, now."""

from __future__ import annotations

from tailwatch.dashboards.common import QUIET, UID_SLO, Q, table
from tailwatch.dashboards.links import data_link
from tailwatch.conventions import ALERTS_FIRING, DETECTION_STARTED_TIMESTAMP_SECONDS

WHY_HIDDEN = ("Time", "__name__", "instance", "job")


def why_panels(slice_labels: list[str], matchers: str = "") -> list:
    """The "why" row: detections open now with their slice and evidence, and the pages firing
    by slice (their culprits are in each page's description in Alertmanager, and on the
    slice's SLO detail)."""
    selector = f"{{{matchers}}}" if matchers else ""
    page = 'severity="page"'
    page_selector = "{" + ", ".join(x for x in (matchers, page) if x) + "}"
    return [
        table("Why: detections open now", "dateTimeAsIso",
              [Q(f"{DETECTION_STARTED_TIMESTAMP_SECONDS}{selector}", instant=True, column="Since")], w=14, h=8,
              hidden=WHY_HIDDEN, quiet=f"{QUIET}: no detector sees anything wrong",
              description="Every condition a detector sees now (retry storm, saturated queue, busy but slow GPUs, "
                          "KV-cache pressure, a tenant starving the others, …), with the slice it holds on and the "
                          "numbers it was raised on (evidence). Runbook: runbooks/detector-<detector>.md."),
        table("Pages firing by slice", "short",
              [Q(f"{ALERTS_FIRING}{page_selector} > 0", instant=True, column="Pages")], w=10, h=8,
              hidden=(*WHY_HIDDEN, "severity"), quiet=f"{QUIET}: no page firing", links=[{"title": "SLO detail", "url": data_link(
                  UID_SLO, {"slo": "slo", **{k: k for k in slice_labels}})}],
              description="The slices paging now, by SLO. Click a row for its burn rates; the page in Alertmanager "
                          "names the culprit (the tenant, zone, status reason or detection holding the bad events) "
                          "when one stands out."),
    ]
