"""SLO detail, templated on `slo` and its slice labels: the SLI against its objective,
the error budget burning down over the compliance window, the burn rate of each alert
window pair with its page or ticket threshold drawn, and alert annotations.

Pages link here: `alerts.alertmanager.AlertLinks` builds `/d/tailwatch-slo?var-slo=…&var-<slice label>=…`,
so every slice label of every SLO is a variable of this dashboard.
"""

from __future__ import annotations

from tailwatch.dashboards.why import why_panels
from tailwatch.dashboards.common import (
    RATE,
    UID_SLO,
    Q,
    dashboard,
    datasource_variable,
    label_variable,
    promql_annotation,
    stat,
    thresholds,
    timeseries,
)
from tailwatch.slo.sli import span
from tailwatch.slo.spec import SloSpec
from tailwatch.conventions import (
    ALERTS_FIRING, SLO_BURN_RATE, SLO_ERROR_BUDGET_REMAINING_RATIO, SLO_EVENTS_TOTAL, SLO_OBJECTIVE_RATIO,
    SLO_SLI_RATIO, SLO_SLI_UPPER_RATIO,
)

SEVERITY_COLOR = {"page": "red", "ticket": "orange"}


def slice_labels(specs: list[SloSpec]) -> list[str]:
    return sorted({k for s in specs for k in s.slice_by})


def build(specs: list[SloSpec]):
    labels = slice_labels(specs)
    match = ", ".join(['slo=~"$slo"', *(f'{k}=~"${k}"' for k in labels)])
    legend = " ".join(f"{{{{{k}}}}}" for k in labels)
    compliance = sorted({s.period_minutes for s in specs})
    compliance_re = "|".join(span(m) for m in compliance)
    panels = [
        timeseries("SLI over the compliance window against the objective", "percentunit", [
            Q(f'{SLO_SLI_RATIO}{{{match}, window=~"{compliance_re}"}}', f"SLI {legend}"),
            Q(f'{SLO_SLI_UPPER_RATIO}{{{match}, window=~"{compliance_re}"}}', f"SLI, undecided counted good {legend}"),
            Q(f"max by (slo) ({SLO_OBJECTIVE_RATIO}{{{match}}})", "objective"),
        ], w=12, description="Good ÷ valid events over the SLO's compliance window, per slice; the objective as a line. "
                             "Where a scraped runtime's bucket straddles the threshold its events are undecided: the "
                             "SLI lies between the SLI (undecided counted bad) and its upper line."),
        stat("Error budget left (worst slice)", "percentunit",
             [Q(f"min({SLO_ERROR_BUDGET_REMAINING_RATIO}{{{match}}})", instant=True)], w=6, h=8,
             threshold_steps=thresholds((0.25, "orange"), (0.5, "green"), base="red"),
             description="The selected slices' smallest share of error budget left over the compliance window."),
        stat("Alerts firing", "short",
             [Q(f"sum({ALERTS_FIRING}{{{match}}})", instant=True)], w=6, h=8,
             threshold_steps=thresholds((1, "red")),
             description="Pages and tickets firing now on the selected slices."),
        timeseries("Error budget burn-down", "percentunit",
                   [Q(f"{SLO_ERROR_BUDGET_REMAINING_RATIO}{{{match}}}", legend or "{{slo}}")], w=24,
                   timeFrom=span(max(compliance)),
                   description="Share of the compliance window's error budget left, over that window."),
    ]
    pairs: dict[tuple[str, int, int, str], set[float]] = {}
    for s in specs:
        for w in s.alert_windows:
            pairs.setdefault((w.name, w.long_minutes, w.short_minutes, w.severity), set()).add(
                round(w.factor(s.period_minutes), 6))
    for (name, long_m, short_m, severity), factors in sorted(pairs.items(), key=lambda kv: kv[0][1]):
        steps = thresholds(*((f, SEVERITY_COLOR[severity]) for f in sorted(factors)))
        panels.append(timeseries(
            f"Burn rate, {name}: {span(long_m)} and {span(short_m)} ({severity})", "suffix:×",
            [Q(f'{SLO_BURN_RATE}{{{match}, window=~"{span(long_m)}|{span(short_m)}"}}',
               f"{{{{window}}}} {legend}")],
            w=12, threshold_steps=steps,
            description=(f"Fires a {severity} while both windows burn above "
                         + " or ".join(f"{f:g}×" for f in sorted(factors))
                         + " (the line; one per distinct SLO period, or objective where a factor is capped to stay reachable)."),
        ))
    panels += [
        timeseries("Alerts firing by severity", "short",
                   [Q(f"sum by (severity) ({ALERTS_FIRING}{{{match}}})", "{{severity}}")], w=12,
                   description="Pages and tickets firing over time on the selected slices."),
        timeseries("SLI events by outcome", "cps",
                   [Q(f"sum by (outcome) (rate({SLO_EVENTS_TOTAL}{{{match}}}[{RATE}]))", "{{outcome}}")], w=12,
                   description="Good and bad SLI events per second: a burn with few events is noise, not an outage."),
        *why_panels(labels, ", ".join(f'{k}=~"${k}"' for k in labels)),
    ]
    variables = [datasource_variable(),
                 label_variable("slo", SLO_OBJECTIVE_RATIO, "SLO", include_all=False),
                 *(label_variable(k, SLO_OBJECTIVE_RATIO, selector='{slo=~"$slo"}') for k in labels)]
    tags = ",".join(["severity", *labels])
    annotations = [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        promql_annotation("Pages", f'{ALERTS_FIRING}{{{match}, severity="page"}} > 0', "red",
                          "page: {{slo}}", tags),
        promql_annotation("Tickets", f'{ALERTS_FIRING}{{{match}, severity="ticket"}} > 0', "orange",
                          "ticket: {{slo}}", tags),
    ]
    return dashboard(UID_SLO, "tailwatch / SLO detail", "One SLO and its slices: SLI, budget, burn rates, alerts.",
                     panels, variables, annotations=annotations, time_from="now-24h")


