"""`tailwatch deploy generate --out DIR`: every manifest of an installation as YAML files and
a `kustomization.yaml` naming them, so `kubectl apply -k DIR` deploys it in one step.

One file per neighbour, so a cluster without KEDA, Argo Rollouts, Flagger or the Prometheus
Operator drops that file from the kustomization and keeps the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from tailwatch.deploy import collector, neighbours, workloads
from tailwatch.deploy.settings import TOKEN_NAMES, DeployError, DeploySettings
from tailwatch.slo.spec import SloSpec

FLAGGER_TOKEN_ENV = "TAILWATCH_FLAGGER_TOKEN"


@dataclass(frozen=True)
class Written:
    files: list[Path]
    objects: int
    secrets: list[str]  # "namespace/name (keys)": what must exist before the pods start


def manifests(s: DeploySettings, specs: list[SloSpec], slos_yaml: str, prices_yaml: str,
              otlp_mapping_yaml: str | None, flagger_token: str | None) -> dict[str, list[dict]]:
    """File name → the objects in it."""
    if s.canaries and not flagger_token:
        raise DeployError(f"canaries are configured: set {FLAGGER_TOKEN_ENV} to the token Flagger's hooks carry "
                          "(Flagger sends no headers; the token is written into each Canary)")
    own = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": s.namespace}},
           workloads.service_account(s),
           workloads.config_map(s, slos_yaml, prices_yaml, otlp_mapping_yaml if s.otlp_adapter else None),
           workloads.tier1(s), workloads.tier2(s), *workloads.services(s), *workloads.disruption_budgets(s)]
    if s.otlp_adapter:
        own.append(workloads.otlp_adapter(s, otlp_mapping_yaml is not None))
    files = {"tailwatch.yaml": own,
             "prometheus-rule.yaml": [neighbours.prometheus_rule(s, specs)],
             "service-monitor.yaml": [neighbours.service_monitor(s)],
             "grafana-dashboards.yaml": neighbours.dashboards(s, specs),
             "otel-collector.yaml": collector.objects(s, neighbours.collector_config(s)),
             "dcgm-exporter.yaml": [neighbours.dcgm_counters(s)]}
    if s.pools:
        files["keda.yaml"] = _unique([o for pool in s.pools for o in neighbours.keda(s, pool)])
    namespaces = sorted({c.namespace for c in s.canaries}) or [s.namespace]
    files["argo-rollouts.yaml"] = [t for ns in namespaces for t in neighbours.argo(s, ns)]
    if s.canaries:
        files["flagger.yaml"] = [neighbours.flagger(s, c, flagger_token) for c in s.canaries]
    common = {k: v for k, v in (("release", s.release), ("team", s.team)) if v}
    for objects in files.values() if common else ():
        for o in objects:  # on every object: kube-prometheus-stack selects rules and monitors by `release`
            o["metadata"]["labels"] = {**o["metadata"].get("labels", {}), **common}
    return files


def _unique(objects: list[dict]) -> list[dict]:
    """One TriggerAuthentication per namespace, however many pools it serves."""
    seen, out = set(), []
    for o in objects:
        key = (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        if key not in seen:
            seen.add(key)
            out.append(o)
    return out


def required_secrets(s: DeploySettings) -> list[str]:
    """"namespace/name (keys)" for each Secret the manifests reference."""
    keys: dict[tuple[str, str], list[str]] = {(s.namespace, s.tokens_secret): list(TOKEN_NAMES)}
    if s.kafka.client_config_secret:
        keys[(s.namespace, s.kafka.client_config_secret)] = ["kafka.properties"]
    for namespace, key in [(p.namespace, "keda") for p in s.pools] + [(c.namespace, "argo") for c in s.canaries]:
        held = keys.setdefault((namespace, s.tokens_secret), [])
        if key not in held:
            held.append(key)
    return [f"{ns}/{name} ({', '.join(k)})" for (ns, name), k in keys.items()]


def write(s: DeploySettings, specs: list[SloSpec], slos_yaml: str, prices_yaml: str, otlp_mapping_yaml: str | None,
          out_dir: str | Path, environ: dict[str, str] | None = None) -> Written:
    environ = os.environ if environ is None else environ
    files = manifests(s, specs, slos_yaml, prices_yaml, otlp_mapping_yaml, environ.get(FLAGGER_TOKEN_ENV))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, objects in files.items():
        path = out / name
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False, width=120))
        paths.append(path)
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": list(files)}
    (out / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    paths.append(out / "kustomization.yaml")
    return Written(paths, sum(len(o) for o in files.values()), required_secrets(s))
