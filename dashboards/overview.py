"""Fleet overview: every SLO's budget, burn and alerts; traffic, goodput and errors by
workload and zone; the slice that burns fastest."""

from __future__ import annotations

from dashboards.common import (
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
from dashboards.links import data_link
from slo.sli import span
from slo.spec import SloSpec
from conventions import (
    ALERTS_FIRING, REQUESTS_TOTAL, SLO_BURN_RATE, SLO_ERROR_BUDGET_REMAINING_RATIO,
    SUCCESSFUL_TURNS_TOTAL, TURNS_TOTAL,
)


def build(specs: list[SloSpec]):
    slice_labels = sorted({k for s in specs for k in s.slice_by})
    page_windows = sorted({w.long_minutes for s in specs for w in s.alert_windows if w.severity == "page"})
    page_factor = min((w.factor(s.window_minutes) for s in specs for w in s.alert_windows if w.severity == "page"),
                      default=14.4)
    burn_columns = [Q(f'max by (slo) ({SLO_BURN_RATE}{{window="{span(m)}"}})', instant=True) for m in page_windows]
    slo_link = [{"title": "SLO detail", "url": data_link(UID_SLO, {"slo": "slo"})}]
    by_slice = ", ".join(["slo", *slice_labels])
    panels = [
        table("SLOs: budget left, burn rate, alerts firing", "percentunit", [
            Q(f"min by (slo) ({SLO_ERROR_BUDGET_REMAINING_RATIO})", instant=True),
            *burn_columns,
            Q(f'sum by (slo) ({ALERTS_FIRING}{{severity="page"}})', instant=True),
            Q(f'sum by (slo) ({ALERTS_FIRING}{{severity="ticket"}})', instant=True),
        ], w=16, h=9, links=slo_link,
            description="Per SLO: the worst slice's budget left, its burn rate over each page window, and alerts firing. "
                        "Columns: budget left, burn rates (" + ", ".join(span(m) for m in page_windows) + "), pages, tickets.",
            column_units={**{f"Value #{chr(ord('B') + i)}": "suffix:×" for i in range(len(burn_columns))},
                          f"Value #{chr(ord('B') + len(burn_columns))}": "short",
                          f"Value #{chr(ord('C') + len(burn_columns))}": "short"}),
        stat("Pages firing", "short", [Q(f'sum({ALERTS_FIRING}{{severity="page"}})', instant=True)], w=4, h=9,
             threshold_steps=thresholds((1, "red"))),
        stat("Tickets firing", "short", [Q(f'sum({ALERTS_FIRING}{{severity="ticket"}})', instant=True)], w=4, h=9,
             threshold_steps=thresholds((1, "orange"))),
        table("Slice burning fastest (1h)", "suffix:×", [
            Q(f'topk(1, max by ({by_slice}) ({SLO_BURN_RATE}{{window="1h"}}))', instant=True),
        ], w=12, h=5, links=slo_link, description="The SLO slice with the highest 1-hour burn rate right now."),
        table("Request slice with the highest error ratio", "percentunit", [
            Q(f"topk(1, {rate(REQUESTS_TOTAL, 'tenant, model, model_version, zone, workload, traffic_class', outcome=ERRORS)}"
              f" / ({rate(REQUESTS_TOTAL, 'tenant, model, model_version, zone, workload, traffic_class', outcome=NOT_CANCELLED)} > 0))",
              instant=True),
        ], w=12, h=5, description="Across all traffic (SLO or not): the slice whose attempts fail most, over the rate window."),
        timeseries("Error budget remaining (worst slice per SLO)", "percentunit",
                   [Q(f"min by (slo) ({SLO_ERROR_BUDGET_REMAINING_RATIO})", "{{slo}}")], w=12),
        timeseries("Burn rate over 1h (worst slice per SLO)", "suffix:×",
                   [Q(f'max by (slo) ({SLO_BURN_RATE}{{window="1h"}})', "{{slo}}")], w=12,
                   threshold_steps=thresholds((page_factor, "red")),
                   description=f"The line is the fastest page threshold ({page_factor:g}×)."),
        timeseries("Requests by workload and zone", "reqps",
                   [Q(rate(REQUESTS_TOTAL, "workload, zone"), "{{workload}} {{zone}}")]),
        timeseries("Goodput: successful turns by workload and zone", "cps",
                   [Q(rate(SUCCESSFUL_TURNS_TOTAL, "workload, zone"), "{{workload}} {{zone}}")]),
        timeseries("Errors by workload and zone", "reqps",
                   [Q(rate(REQUESTS_TOTAL, "workload, zone", outcome=ERRORS), "{{workload}} {{zone}}")],
                   description="Attempts that ended in error, timeout or shed."),
        timeseries("Error ratio by workload and zone", "percentunit", [Q(
            f"{rate(REQUESTS_TOTAL, 'workload, zone', outcome=ERRORS)}\n"
            f"/ ({rate(REQUESTS_TOTAL, 'workload, zone', outcome=NOT_CANCELLED)} > 0)",
            "{{workload}} {{zone}}")], w=12),
        timeseries("Turn success ratio by workload", "percentunit", [Q(
            f"{rate(SUCCESSFUL_TURNS_TOTAL, 'workload')}\n/ ({rate(TURNS_TOTAL, 'workload')} > 0)",
            "{{workload}}")], w=12),
    ]
    return dashboard(UID_FLEET, "tailwatch / Fleet overview",
                     "Every SLO with its budget and burn; traffic, goodput and errors by workload and zone.",
                     panels, fleet_variables())


