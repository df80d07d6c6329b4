"""`tailwatch deploy preflight --api-resources FILE`: before `kubectl apply -k`, which kinds
the generated manifests use that the cluster does not serve, read from the cluster's
`kubectl api-resources -o wide` output, each with the file that holds it (drop that file from
the kustomization, or install the neighbour: KEDA, Argo Rollouts, Flagger, the Prometheus
Operator). A pure reading: no cluster call here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADER = ("NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND")
INSTALLS = {"keda.sh": "KEDA", "argoproj.io": "Argo Rollouts", "flagger.app": "Flagger",
            "monitoring.coreos.com": "the Prometheus Operator (kube-prometheus-stack)"}


class ApiResourcesError(Exception):
    """The file is not `kubectl api-resources` output."""


@dataclass(frozen=True)
class Missing:
    api_version: str
    kind: str
    files: tuple[str, ...]

    def line(self) -> str:
        group = self.api_version.split("/")[0] if "/" in self.api_version else ""
        install = f" (install {INSTALLS[group]})" if group in INSTALLS else ""
        return f"missing {self.kind} {self.api_version}{install}: used by {', '.join(self.files)}"


def served_kinds(text: str) -> set[tuple[str, str]]:
    """(apiVersion, kind) of every resource in `kubectl api-resources` output (plain or
    `-o wide`): columns are found by the header's positions, since SHORTNAMES is often blank."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not all(h in lines[0].split() for h in HEADER):
        raise ApiResourcesError(f"expected a header with {' '.join(HEADER)} (kubectl api-resources -o wide)")
    starts = {m.group(): m.start() for m in re.finditer(r"\S+", lines[0])}
    order = sorted(starts.values())

    def column(line: str, name: str) -> str:
        start = starts[name]
        following = [p for p in order if p > start]
        return line[start:following[0] if following else None].strip()

    return {(column(line, "APIVERSION"), column(line, "KIND")) for line in lines[1:]}


def missing(files: dict[str, list[dict]], served: set[tuple[str, str]]) -> list[Missing]:
    """Every (apiVersion, kind) of the manifests that the cluster does not serve."""
    used: dict[tuple[str, str], list[str]] = {}
    for name, objects in files.items():
        for o in objects:
            holders = used.setdefault((o["apiVersion"], o["kind"]), [])
            if name not in holders:
                holders.append(name)
    return [Missing(v, k, tuple(f)) for (v, k), f in sorted(used.items()) if (v, k) not in served]
