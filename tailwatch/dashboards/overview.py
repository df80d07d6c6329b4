"""Fleet overview: every SLO's budget, burn and alerts; traffic, goodput and errors by
workload and zone; the slice that burns fastest."""

from __future__ import annotations

from collections import Counter

from tailwatch.dashboards.common import (
    ERRORS,
    NOT_CANCELLED,
    UID_FLEET,
    UID_SLO,
    Q,
    dashboard,
    fleet_variables,
    rate,
    stat,
    table,
    thresholds,
    timeseries,
)
from tailwatch.dashboards.links import data_link
from tailwatch.dashboards.why import why_panels
from tailwatch.slo.sli import span
from tailwatch.slo.spec import SloSpec
from tailwatch.conventions import (
    ALERTS_FIRING, REQUESTS_TOTAL, SLO_BURN_RATE, SLO_ERROR_BUDGET_REMAINING_RATIO,
    SUCCESSFUL_TURNS_TOTAL, TURNS_TOTAL,
)


def build(specs: list[SloSpec]):
    slice_labels = sorted({k for s in specs for k in s.slice_by})
    page_windows = sorted({w.long_minutes for s in specs for w in s.alert_windows if w.severity == "page"})
    page_factor = min((w.factor(s.period_minutes) for s in specs for w in s.alert_windows if w.severity == "page"),
                      default=14.4)
    burn_columns = [Q(f'max by (slo) ({SLO_BURN_RATE}{{window="{span(m)}"}})', instant=True,
                      column=f"Burn {span(m)}") for m in page_windows]
    slo_link = [{"title": "SLO detail", "url": data_link(UID_SLO, {"slo": "slo"})}]
    by_slice = ", ".join(["slo", *slice_labels])
    # Each burn column turns red at the page threshold most SLOs have over its window (14.4×
    # over 1h, 6× over 6h); an SLO whose factor is capped to stay reachable pages lower, as its
    # SLO detail draws.
    factor_of = {m: Counter(round(w.factor(s.period_minutes), 6) for s in specs for w in s.alert_windows
                            if w.severity == "page" and w.long_minutes == m).most_common(1)[0][0]
                 for m in page_windows}
    panels = [
        table("SLOs: budget left, burn rate, alerts firing", "percentunit", [
            Q(f"min by (slo) ({SLO_ERROR_BUDGET_REMAINING_RATIO})", instant=True, column="Budget left"),
            *burn_columns,
            Q(f'sum by (slo) ({ALERTS_FIRING}{{severity="page"}})', instant=True, column="Pages"),
            Q(f'sum by (slo) ({ALERTS_FIRING}{{severity="ticket"}})', instant=True, column="Tickets"),
        ], w=16, h=9, links=slo_link,
            description="Per SLO: the worst slice's budget left (red once spent, orange under a quarter), its burn rate "
                        "over each page window (orange above 1×, the budget's pace; red at the page threshold most SLOs have "
                        "over that window: the SLO's detail draws its own), "
                        "and the alerts firing. Click a row for the SLO's detail.",
            column_units={**{q.column: "suffix:×" for q in burn_columns}, "Pages": "short", "Tickets": "short"},
            column_thresholds={"Budget left": thresholds((0, "orange"), (0.25, "green"), base="red"),
                               **{q.column: thresholds((1, "orange"), (factor_of[m], "red"))
                                  for q, m in zip(burn_columns, page_windows)},
                               "Pages": thresholds((1, "red")), "Tickets": thresholds((1, "orange"))}),
        stat("Pages firing", "short", [Q(f'sum({ALERTS_FIRING}{{severity="page"}})', instant=True)], w=4, h=9,
             threshold_steps=thresholds((1, "red")),
             description="SLO alerts of page severity firing now, over every SLO and slice: someone is woken."),
        stat("Tickets firing", "short", [Q(f'sum({ALERTS_FIRING}{{severity="ticket"}})', instant=True)], w=4, h=9,
             threshold_steps=thresholds((1, "orange")),
             description="SLO alerts of ticket severity firing now: a slow burn to fix in working hours."),
        *why_panels(slice_labels),
        table("Slice burning fastest (1h)", "suffix:×", [
            Q(f'topk(1, max by ({by_slice}) ({SLO_BURN_RATE}{{window="1h"}}))', instant=True, column="Burn 1h"),
        ], w=12, h=5, links=slo_link, description="The SLO slice with the highest 1-hour burn rate right now."),
        table("Request slice with the highest error ratio", "percentunit", [
            Q(f"topk(1, {rate(REQUESTS_TOTAL, 'tenant, model, model_version, zone, workload, traffic_class', outcome=ERRORS)}"
              f" / ({rate(REQUESTS_TOTAL, 'tenant, model, model_version, zone, workload, traffic_class', outcome=NOT_CANCELLED)} > 0))",
              instant=True, column="Error ratio"),
        ], w=12, h=5, description="Across all traffic (SLO or not): the slice whose attempts fail most, over the rate window."),
        timeseries("Error budget remaining (worst slice per SLO)", "percentunit",
                   [Q(f"min by (slo) ({SLO_ERROR_BUDGET_REMAINING_RATIO})", "{{slo}}")], w=12,
                   description="Share of each SLO's error budget left over its compliance window, for its worst "
                               "slice: a line falling steeply is a burn; below zero the objective is missed."),
        timeseries("Burn rate over 1h (worst slice per SLO)", "suffix:×",
                   [Q(f'max by (slo) ({SLO_BURN_RATE}{{window="1h"}})', "{{slo}}")], w=12,
                   threshold_steps=thresholds((page_factor, "red")),
                   description=f"The line is the fastest page threshold ({page_factor:g}×)."),
        timeseries("Requests by workload and zone", "reqps",
                   [Q(rate(REQUESTS_TOTAL, "workload, zone"), "{{workload}} {{zone}}")],
                   description="Request attempts per second (retries included) by workload and zone."),
        timeseries("Goodput: successful turns by workload and zone", "cps",
                   [Q(rate(SUCCESSFUL_TURNS_TOTAL, "workload, zone"), "{{workload}} {{zone}}")],
                   description="Turns that succeeded for the user per second: what the fleet delivered, retries "
                               "not counted twice."),
        timeseries("Errors by workload and zone", "reqps",
                   [Q(rate(REQUESTS_TOTAL, "workload, zone", outcome=ERRORS), "{{workload}} {{zone}}")],
                   description="Attempts that ended in error, timeout or shed."),
        timeseries("Error ratio by workload and zone", "percentunit", [Q(
            f"{rate(REQUESTS_TOTAL, 'workload, zone', outcome=ERRORS)}\n"
            f"/ ({rate(REQUESTS_TOTAL, 'workload, zone', outcome=NOT_CANCELLED)} > 0)",
            "{{workload}} {{zone}}")], w=12,
            description="Attempts that failed (error, timeout, shed) over attempts the client did not cancel."),
        timeseries("Turn success ratio by workload", "percentunit", [Q(
            f"{rate(SUCCESSFUL_TURNS_TOTAL, 'workload')}\n/ ({rate(TURNS_TOTAL, 'workload')} > 0)",
            "{{workload}}")], w=12,
            description="Turns that succeeded over all turns, by workload: a turn retried to success counts once, "
                        "as a success."),
    ]
    return dashboard(UID_FLEET, "tailwatch / Fleet overview",
                     "Every SLO with its budget and burn; traffic, goodput and errors by workload and zone.",
                     panels, fleet_variables())


