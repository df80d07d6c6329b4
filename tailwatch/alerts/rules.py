"""Prometheus recording and alerting rules equivalent to the SLO engine, and their tests.

Over the exporter's counter `tailwatch_slo_events_total{slo, <slice labels>, outcome}`
(outcome good, bad, or undecided: a runtime bucket straddling the threshold, which the error
ratio's denominator holds and its numerator does not, as the engine decides), per SLO:
- recording rules `tailwatch_slo:error_ratio:rate<window>` and `tailwatch_slo:events:increase<window>`
  for every window of the catalog;
- one alerting rule per window pair: both windows' error ratio above factor × (1 −
  objective), both windows holding at least `min_events` events, and the slice's counter
  present `history_needed_minutes` − 1 minutes ago (the engine's young-window rule: a pair
  is not judged on less history than that).

`promtool_test` builds a `promtool test rules` file from a synthetic minute series: it
runs the same series through the stream engine (`slo.engine.SloTable`) and expects,
at every minute where the engine's answer is the same one minute before and after, the
alerts the engine has firing. Prometheus must therefore fire and resolve each alert
within one evaluation interval of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailwatch.slo.engine import SloTable
from tailwatch.slo.sli import span
from tailwatch.slo.spec import SloSpec
from tailwatch.conventions import SLO_ERROR_RATIO_RATE_RULE, SLO_EVENTS_INCREASE_RULE, SLO_EVENTS_TOTAL

COUNTER = SLO_EVENTS_TOTAL


def _sel(spec: SloSpec) -> str:
    return f'slo="{spec.name}"'


def _by(spec: SloSpec) -> str:
    return ", ".join(["slo", *spec.slice_by])


def _annotations(spec: SloSpec, w) -> dict[str, str]:
    factor = w.factor(spec.period_minutes)
    return {
        "summary": f"{spec.name} burns its error budget faster than {factor:.3g}x over "
                   f"{span(w.long_minutes)} and {span(w.short_minutes)}",
        "runbook_url": spec.runbook,
    }


def rule_groups(spec: SloSpec) -> dict:
    windows = sorted({m for w in spec.alert_windows for m in (w.long_minutes, w.short_minutes)})
    recording = []
    for m in windows:
        r = span(m)
        recording.append({
            "record": f"{SLO_ERROR_RATIO_RATE_RULE}{r}",
            "expr": (f'sum by ({_by(spec)}) (rate({COUNTER}{{{_sel(spec)}, outcome="bad"}}[{r}]))\n'
                     f'/ sum by ({_by(spec)}) (rate({COUNTER}{{{_sel(spec)}}}[{r}]))'),
        })
        recording.append({
            "record": f"{SLO_EVENTS_INCREASE_RULE}{r}",
            "expr": f"sum by ({_by(spec)}) (increase({COUNTER}{{{_sel(spec)}}}[{r}]))",
        })
    alerting = []
    budget = round(1 - spec.objective, 12)
    for w in spec.alert_windows:
        factor = w.factor(spec.period_minutes)
        long_r, short_r = span(w.long_minutes), span(w.short_minutes)
        threshold = factor * budget
        cond = lambda r: (  # noqa: E731
            f'({SLO_ERROR_RATIO_RATE_RULE}{r}{{{_sel(spec)}}} > {threshold:.12g}'
            f' and {SLO_EVENTS_INCREASE_RULE}{r}{{{_sel(spec)}}} >= {spec.min_events})'
        )
        needed = w.history_needed_minutes(spec.young_share)
        grown = f"\nand sum by ({_by(spec)}) ({COUNTER}{{{_sel(spec)}}} offset {needed - 1}m)" if needed > 1 else ""
        alerting.append({
            "alert": f"SLOBurn{w.severity.capitalize()}",
            "expr": f"{cond(long_r)}\nand {cond(short_r)}{grown}",
            "labels": {"severity": w.severity, "window": w.name},
            "annotations": _annotations(spec, w),
        })
    # One group: Prometheus evaluates a group's rules in order, so every alert reads the
    # ratios recorded at the same evaluation (two groups could read last minute's).
    return {"groups": [{"name": f"tailwatch-slo-{spec.name}", "interval": "1m", "rules": recording + alerting}]}


@dataclass(frozen=True)
class Stretch:
    """A stretch of synthetic traffic: `minutes` minutes of `valid` events a minute, `bad` of
    them bad and `undecided` neither proven good nor bad."""

    minutes: int
    valid: int
    bad: int
    undecided: int = 0


def default_scenario(spec: SloSpec) -> list[Stretch]:
    """Quiet, a fast burn, quiet, a slow burn, recovery (sized to the SLO's budget)."""
    budget = 1 - spec.objective
    fast_bad = max(1, round(1000 * min(0.9, 30 * budget)))  # 30x budget: pages on every pair
    slow_bad = max(1, round(1000 * min(0.9, 4 * budget)))  # 4x: tickets, no fast page
    return [Stretch(60, 1000, 0), Stretch(30, 1000, fast_bad), Stretch(240, 1000, 0),
            Stretch(480, 1000, slow_bad), Stretch(420, 1000, 0)]  # 420 min: past the 6 h short window


def promtool_test(spec: SloSpec, rule_file: str, stretches: list[Stretch] | None = None) -> dict:
    stretches = stretches or default_scenario(spec)
    labels = {k: f"test-{k}" for k in spec.slice_by}
    good, bad, undecided = [], [], []
    for p in stretches:
        good += [p.valid - p.bad - p.undecided] * p.minutes
        bad += [p.bad] * p.minutes
        undecided += [p.undecided] * p.minutes
    firing_at, ties = engine_firing(spec, labels, good, bad, with_ties=True, undecided=undecided)
    total = len(good)
    label_text = ", ".join([f'slo="{spec.name}"', *(f'{k}="{v}"' for k, v in labels.items())])
    tests = []
    for minute in range(2, total - 1):
        if not (firing_at[minute - 1] == firing_at[minute] == firing_at[minute + 1]):
            continue  # at a transition: Prometheus may differ by one evaluation interval
        if ties[minute - 1] or ties[minute] or ties[minute + 1]:
            continue  # a burn rate exactly at its factor: float rounding decides either side
        if minute % 10 and firing_at[minute] == firing_at[minute - 2]:
            continue  # keep the file small: every 10th stable minute, plus the ones near changes
        for w in spec.alert_windows:
            name = f"SLOBurn{w.severity.capitalize()}"
            fires = w.name in firing_at[minute]
            tests.append({
                "eval_time": f"{minute}m",
                "alertname": name,
                "exp_alerts": [
                    {"exp_labels": {"severity": w.severity, "window": w.name, "slo": spec.name, **labels},
                     "exp_annotations": _annotations(spec, w)}
                ] if fires else [],
            })
    # promtool compares all alerts of one name at one time: merge windows of the same name.
    merged: dict[tuple[str, str], list] = {}
    for t in tests:
        merged.setdefault((t["eval_time"], t["alertname"]), []).extend(t["exp_alerts"])
    alert_tests = [{"eval_time": et, "alertname": n, "exp_alerts": exp} for (et, n), exp in merged.items()]
    return {
        "rule_files": [rule_file],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f'{COUNTER}{{{label_text}, outcome="good"}}', "values": _cumulative(good)},
                {"series": f'{COUNTER}{{{label_text}, outcome="bad"}}', "values": _cumulative(bad)},
                *([{"series": f'{COUNTER}{{{label_text}, outcome="undecided"}}', "values": _cumulative(undecided)}]
                  if any(undecided) else []),
            ],
            "alert_rule_test": alert_tests,
        }],
    }


def engine_firing(spec: SloSpec, labels: dict[str, str], good: list[int], bad: list[int], with_ties: bool = False,
                  undecided: list[int] | None = None):
    """Which window pairs the stream engine has firing after each minute (and, with
    `with_ties`, whether any window's burn rate sits exactly at a factor that minute).

    The counter's sample at minute m holds the events of minute m−1..m, so Prometheus at
    minute m sees minutes up to m; the engine is fed the same minutes.
    """
    table = SloTable(spec)
    i = table.column(tuple(labels.get(k, "") for k in spec.slice_by))
    state = table.views[i]
    firing: list[set[str]] = [set()]
    ties = [False]
    factors = {(w.long_minutes, w.short_minutes): w.factor(spec.period_minutes) for w in spec.alert_windows}
    for minute in range(1, len(good)):
        und = undecided[minute] if undecided else 0
        table.advance(minute, [i], [good[minute]], [good[minute] + bad[minute] + und], undecided=[und])
        firing.append({aw.name for aw, _ in state.firing.values()})
        tie = False
        for (long_m, short_m), factor in factors.items():
            for m in (long_m, short_m):
                b = state.burn(m)
                tie |= b is not None and abs(b - factor) <= 1e-6 * factor
        ties.append(tie)
    return (firing, ties) if with_ties else firing


def _cumulative(per_minute: list[int]) -> str:
    total, out = 0, []
    for i, n in enumerate(per_minute):
        if i:
            total += n
        out.append(str(total))
    return " ".join(out)
