"""`tailwatch slo check`'s report: every problem of an SLO file in one pass, what was
understood of each SLO, and warnings about selectors that match no data.

The report is plain lists (`problems`, `warnings`, `understood`) that any further check
appends to; problems make the command exit 1, warnings do not. Reading the file happens
in `check_file` (the store is counted by `store.queries.selector_rows`); what the lines say is built
by pure functions over what was read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tailwatch.slo.sli import span
from tailwatch.slo.spec import SloSpec, read_slos

# Runbook paths as the built-in SLOs write them (`runbooks/slo-burn.md`) are relative to
# the installed package root, where runbooks/ is shipped.
PACKAGED_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class SloCheck:
    """What `slo check` prints: `understood` on stdout, then `warnings` and `problems`."""

    specs: list[SloSpec]
    understood: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def understood_lines(spec: SloSpec) -> list[str]:
    """One SLO as the engine will run it: name, SLI, objective, window, slices, selector,
    and each alert window with the burn rate that fires it."""
    sli = spec.sli_kind
    if spec.latency_field is not None:
        sli += f" ({spec.latency_field} <= {spec.threshold_ms:g} ms)"
    if spec.phase_budgets_ms:
        sli += "; stage budgets " + ", ".join(f"{phase} {ms:g} ms" for phase, ms in spec.phase_budgets_ms)
    window = "calendar month" if spec.calendar_month else f"rolling {span(spec.period_minutes)}"
    selector = ", ".join(f"{k}={v}" for k, v in spec.selector.items()) or "every request (no selector)"
    period = 30 * 1440 if spec.calendar_month else spec.period_minutes
    alerts = [f"    alert {w.name} ({w.severity}): burn rate >= {w.factor(period):.4g} over {span(w.long_minutes)} "
              f"and {span(w.short_minutes)} ({w.budget_share:.4g} of the budget)" for w in spec.alert_windows]
    return [f"{spec.name}: {sli}, objective {100 * spec.objective:.6g}%, {window}",
            f"    slices by: {', '.join(spec.slice_by) or '(one slice)'}; selector: {selector}",
            f"    min events {spec.min_events} per alert window; no data after {spec.no_data_minutes} min; "
            f"runbook {spec.runbook}",
            *alerts]


def runbook_problem(where: str, name: str, runbook: str, slo_dir: Path, packaged_root: Path = PACKAGED_ROOT) -> str | None:
    """A runbook that is neither beside the SLO file nor among the packaged ones, named."""
    if "://" in runbook:  # a published runbook (https://…) is the team's to check
        return None
    if (slo_dir / runbook).is_file() or (packaged_root / runbook).is_file():
        return None
    return (f"{where}.runbook: {runbook} (SLO {name}) does not exist, neither relative to the SLO file ({slo_dir}) "
            f"nor among the packaged runbooks ({packaged_root / 'runbooks'})")


def check_file(path: str | Path) -> SloCheck:
    """Every problem of the file (all SLOs, all fields, the cross-field checks, runbooks) at once."""
    p = Path(path)
    read = read_slos(p)
    report = SloCheck(specs=read.specs, problems=list(read.problems))
    for where, name, runbook in read.entries:
        problem = runbook_problem(where, name, runbook, p.resolve().parent)
        if problem:
            report.problems.append(problem)
    report.problems.sort(key=_entry_order)  # each SLO's problems together, in file order
    for spec in read.specs:
        report.understood += understood_lines(spec)
    return report


def unmatched_selector_warning(spec: SloSpec, rows: int, store_rows: int, store_name: str) -> str | None:
    """A warning when the store has buckets but none of them is this SLO's."""
    if rows or not store_rows:
        return None
    selector = ", ".join(f"{k}={v}" for k, v in spec.selector.items())
    return (f"{spec.name}: selector {{{selector}}} matched no data in {store_name} "
            f"(0 of its {store_rows:,} sli_minute rows); check the label values")


def _entry_order(problem: str) -> int:
    """The entry a problem is of (`slos[2]…`, `file.yaml[doc 1]…`); the file's own problems last."""
    m = re.match(r"^[^\s:]*?\[(?:doc )?(\d+)\]", problem)
    return int(m.group(1)) if m else 1 << 30
