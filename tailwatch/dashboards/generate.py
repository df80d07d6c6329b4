"""Build every dashboard for a set of SLOs, check its structure, and write Grafana JSON.

`tailwatch dashboards generate --slos FILE --out DIR` writes one `<uid>.json` per
dashboard, importable as is (Dashboards → Import, or file provisioning); each asks for
a Prometheus data source through its `datasource` variable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from grafanalib._gen import DashboardEncoder

from tailwatch.dashboards import canary, cost, gpu, latency, overview, pipeline, slo_detail
from tailwatch.slo.spec import SloSpec

BUILDERS = (overview, slo_detail, latency, canary, gpu, cost, pipeline)


def build_all(specs: list[SloSpec]) -> list[dict]:
    """Every dashboard as Grafana JSON (a dict)."""
    return [_to_json(module.build(specs)) for module in BUILDERS]


def _to_json(dashboard) -> dict:
    data = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
    for var in data["templating"]["list"]:
        # grafanalib copies `default` into text and value; Grafana's "All" is text All, value $__all.
        if var.get("current", {}).get("value") == "$__all":
            var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return data


def panels(dashboard: dict) -> Iterator[dict]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def queries(dashboard: dict) -> Iterator[tuple[str, str, bool]]:
    """(where, PromQL, instant) for every panel target and every annotation query."""
    for p in panels(dashboard):
        for t in p.get("targets", []):
            yield f"{dashboard['uid']} / {p['title']} / {t['refId']}", t["expr"], bool(t.get("instant"))
    for a in dashboard["annotations"]["list"]:
        if a.get("expr"):
            yield f"{dashboard['uid']} / annotation {a['name']}", a["expr"], False


def problems(dashboard: dict) -> list[str]:
    """What would make Grafana import it badly or show a panel wrongly."""
    out: list[str] = []
    uid = dashboard.get("uid")
    if not uid:
        out.append("no uid")
    ids = [p.get("id") for p in panels(dashboard)]
    if None in ids or len(set(ids)) != len(ids):
        out.append(f"{uid}: panel ids missing or repeated: {ids}")
    boxes = []
    for p in panels(dashboard):
        where = f"{uid} / {p.get('title')!r}"
        ds = p.get("datasource") or {}
        if not ds.get("uid") or not ds.get("type"):
            out.append(f"{where}: no datasource")
        for t in p.get("targets", []):
            if not (t.get("datasource") or {}).get("uid") or not t.get("expr"):
                out.append(f"{where}: target {t.get('refId')} without datasource or expr")
        if not p.get("targets"):
            out.append(f"{where}: no query")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            out.append(f"{where}: no unit")
        if not (p.get("description") or "").strip():
            out.append(f"{where}: no description")
        if p.get("type") == "table":
            targets = p.get("targets", [])
            shown = ["Value"] if len(targets) == 1 else [f"Value #{t.get('refId')}" for t in targets]
            renamed = {k for tr in p.get("transformations", []) if tr.get("id") == "organize"
                       for k in tr.get("options", {}).get("renameByName", {})}
            if set(shown) - renamed:
                out.append(f"{where}: columns {sorted(set(shown) - renamed)} have no name")
        gp = p.get("gridPos") or {}
        if not all(isinstance(gp.get(k), int) for k in "xywh") or gp["x"] < 0 or gp["x"] + gp["w"] > 24 or gp["w"] <= 0 or gp["h"] <= 0:
            out.append(f"{where}: gridPos {gp} outside the 24-column grid")
            continue
        for other_where, o in boxes:
            if gp["x"] < o["x"] + o["w"] and o["x"] < gp["x"] + gp["w"] and gp["y"] < o["y"] + o["h"] and o["y"] < gp["y"] + gp["h"]:
                out.append(f"{where}: overlaps {other_where}")
        boxes.append((where, gp))
    names = [v["name"] for v in dashboard["templating"]["list"]]
    if "datasource" not in names:
        out.append(f"{uid}: no datasource variable")
    return out


def write(specs: list[SloSpec], out_dir: str | Path) -> list[Path]:
    """Build, check and write every dashboard; raises ValueError naming every problem."""
    dashboards = build_all(specs)
    found = [p for d in dashboards for p in problems(d)]
    if found:
        raise ValueError("dashboard problems: " + "; ".join(found))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in dashboards:
        path = out / f"{d['uid']}.json"
        path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
        paths.append(path)
    return paths
