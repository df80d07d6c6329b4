"""What wires tailwatch to the rest of a fleet, as objects of the neighbours' own kinds: a
KEDA ScaledObject per pool (the `metrics-api` scaler on `/v1/autoscale/{pool}`), Argo
Rollouts AnalysisTemplates and a Flagger Canary per model (`signals/recipes.py`), a
PrometheusRule (`rules generate`'s groups), a ServiceMonitor, Grafana dashboards as
ConfigMaps for Grafana's sidecar, an OpenTelemetry Collector config with the kafka exporter,
and a dcgm-exporter counters file with the profiling fields on.
"""

from __future__ import annotations

import json
import re

import yaml

from tailwatch.dashboards.generate import build_all, problems
from tailwatch.deploy.settings import Canary, DeploySettings, Pool
from tailwatch.deploy.workloads import SCRAPE_LABEL, api_url, labels
from tailwatch.ingest.otlp.gpu import DCGM_COUNTERS, DCGM_GAUGES, DCGM_XID
from tailwatch.ingest.otlp.republish import DEFAULT_METRICS_TOPIC, DEFAULT_SPANS_TOPIC
from tailwatch.signals.recipes import argo_templates, flagger_canary
from tailwatch.slo.spec import SloSpec

KEDA_FAILURE_THRESHOLD = 3  # failed polls (15 s apart) before KEDA's fallback applies
GRAFANA_SIDECAR_LABEL = "grafana_dashboard"  # the label kube-prometheus-stack's sidecar looks for
# dcgm-exporter's counters file: the fields gpu.v1 reads, the profiling ones (commented out in
# the stock file) included, and GR_ENGINE_ACTIVE, which the stock file does enable.
DCGM_TYPES = {**{name: "gauge" for name in DCGM_GAUGES}, **{name: "counter" for name in DCGM_COUNTERS},
              DCGM_XID: "gauge", "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge", "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge"}


def keda_fallback(pool: Pool) -> dict:
    """KEDA's `fallback` for a pool: after three failed polls (a 503 is a failed poll) the
    pool keeps the replicas it runs (`currentReplicas`, KEDA >= 2.17), or with
    `fallback_replicas` set keeps them but never fewer than that (`currentReplicasIfHigher`).
    KEDA's default, `static`, would set every pool to `replicas`, scaling a busy pool in or an
    idle one to its maximum. KEDA before 2.17 prunes `behavior` and applies `replicas`
    statically, hence `replicas` there is the safe side: the pool's maximum unless set."""
    if pool.fallback_replicas is not None:
        return {"failureThreshold": KEDA_FAILURE_THRESHOLD, "replicas": pool.fallback_replicas,
                "behavior": "currentReplicasIfHigher"}
    return {"failureThreshold": KEDA_FAILURE_THRESHOLD, "replicas": pool.max_replicas, "behavior": "currentReplicas"}


def keda(s: DeploySettings, pool: Pool) -> list[dict]:
    """A TriggerAuthentication (the `keda` token, from the Secret in the pool's namespace) and
    the ScaledObject: target value 1, since `desired_replicas` is the count itself; a 503
    (stale or not ready data) is a scaler error, so `fallback` holds the replicas the pool
    runs instead of scaling it in or out."""
    auth = f"{s.name}-keda"
    return [
        {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication",
         "metadata": {"name": auth, "namespace": pool.namespace},
         "spec": {"secretTargetRef": [{"parameter": "token", "name": s.tokens_secret, "key": "keda"}]}},
        {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
         "metadata": {"name": pool.target, "namespace": pool.namespace},
         "spec": {
             "scaleTargetRef": {"name": pool.target},
             "minReplicaCount": pool.min_replicas,
             "maxReplicaCount": pool.max_replicas,
             "pollingInterval": 15,
             "fallback": keda_fallback(pool),
             # tailwatch already holds scale-in for its stabilization window
             "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                 "scaleDown": {"stabilizationWindowSeconds": 0}}}},
             "triggers": [{"type": "metrics-api", "metricType": "AverageValue",
                           "metadata": {"url": f"{api_url(s)}/v1/autoscale/{pool.name}",
                                        "valueLocation": "desired_replicas", "targetValue": "1",
                                        "authMode": "bearer"},
                           "authenticationRef": {"name": auth}}],
         }},
    ]


def argo(s: DeploySettings, namespace: str) -> list[dict]:
    out = []
    for template in argo_templates(api_url(s), token_secret=(s.tokens_secret, "argo")):
        template["metadata"]["namespace"] = namespace
        out.append(template)
    return out


def flagger(s: DeploySettings, canary: Canary, token: str | None) -> dict:
    """Flagger sends no headers on webhooks, so the token rides in each hook's metadata: it
    is taken from the environment when the manifests are generated, never from a file."""
    out = flagger_canary(canary.target, canary.namespace, canary.model, canary.version, api_url(s), token=token)
    out["spec"]["service"]["port"] = canary.port
    return out


def prometheus_rule(s: DeploySettings, specs: list[SloSpec]) -> dict:
    """`rules generate`'s groups; with the worker paging, only their recording rules (the
    burn alerts would page a second time through Prometheus)."""
    from tailwatch.alerts.rules import rule_groups

    groups = [g for spec in specs for g in rule_groups(spec)["groups"]]
    if s.paging == "worker":
        groups = [{**g, "rules": kept} for g in groups if (kept := [r for r in g["rules"] if "alert" not in r])]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": f"{s.name}-slos", "namespace": s.namespace, "labels": labels(s, "rules")},
            "spec": {"groups": groups}}


def service_monitor(s: DeploySettings) -> dict:
    """Every tailwatch pod, once (the headless Services), with the `prometheus` token: the
    exposition carries every tenant's series, so it takes a token for all tenants."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": s.name, "namespace": s.namespace, "labels": labels(s, "monitoring")},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": s.name, SCRAPE_LABEL: "true"}},
                     "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "12s",
                                    "authorization": {"type": "Bearer", "credentials": {
                                        "name": s.tokens_secret, "key": "prometheus"}}}]}}


def dashboards(s: DeploySettings, specs: list[SloSpec]) -> list[dict]:
    out = []
    for board in build_all(specs):
        found = problems(board)
        if found:
            raise ValueError("dashboard problems: " + "; ".join(found))
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": f"{s.name}-dashboard-{board['uid']}".lower()[:63].rstrip("-"),
                                 "namespace": s.namespace,
                                 "labels": {**labels(s, "dashboards"), GRAFANA_SIDECAR_LABEL: "1"}},
                    "data": {f"{board['uid']}.json": json.dumps(board, sort_keys=True)}})
    return out


# What the Collector writes into each scraped series, from the serving pod's labels (the
# keys are settings): the names the OTLP mapping's built-in rules read.
POD_LABEL_TARGETS = {"pool": "pool", "zone": "zone", "model": "model", "version": "model_version",
                     "deployment": "deployment"}
NODE_ZONE_LABEL = "topology.kubernetes.io/zone"  # well-known: set on every node by its cloud provider


def sd_label(prefix: str, key: str) -> str:
    """The service-discovery meta label of a Kubernetes label key, as Prometheus names it
    (every character outside [a-zA-Z0-9_] becomes `_`)."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def scrape_configs(s: DeploySettings) -> list[dict]:
    """The Collector's Prometheus scrape jobs. `honor_labels: true` keeps each exporter's own
    labels: dcgm-exporter's `pod` is the pod using the GPU (the join to the runtime's
    gauges), Triton's `model` and `version` are its own; what the page lacks comes from the
    target. Only serving pods give pool, zone, model, version and deployment: the exporter's
    own pod labels say nothing of the GPUs' users. Node labels need `attach_metadata`."""
    common = [{"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
              {"source_labels": [sd_label("__meta_kubernetes_node_label_", NODE_ZONE_LABEL)], "regex": "(.+)",
               "target_label": "zone"}]
    serving = [{"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}]
    for field, target in POD_LABEL_TARGETS.items():
        # `(.+)`: a pod without the label leaves the target's value (the node's zone) as it is
        serving.append({"source_labels": [sd_label("__meta_kubernetes_pod_label_", getattr(s.pod_labels, field))],
                        "regex": "(.+)", "target_label": target})
    out = []
    for job, regex, own in (("dcgm", "dcgm-exporter", []), ("serving", "vllm|tgi|triton", serving)):
        keep = {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": regex,
                "action": "keep"}
        out.append({"job_name": job, "scrape_interval": "10s", "honor_labels": True,
                    "kubernetes_sd_configs": [{"role": "pod", "attach_metadata": {"node": True}}],
                    "relabel_configs": [keep, *common, *own]})
    return out


def collector_config(s: DeploySettings) -> dict:
    """The Collector's config: OTLP in from the runtimes, DCGM and vLLM pages scraped, both
    out to Kafka on the topics `ingest otlp` reads, as `otlp_proto`."""
    scrape = scrape_configs(s)
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "0.0.0.0:4317"},
                                             "http": {"endpoint": "0.0.0.0:4318"}}},
                      "prometheus": {"config": {"scrape_configs": scrape}}},
        "processors": {"batch": {"send_batch_size": 512, "send_batch_max_size": 512}},
        "exporters": {"kafka": {"brokers": [b.strip() for b in s.kafka.bootstrap_servers.split(",")],
                                "protocol_version": "2.0.0",
                                "traces": {"topic": DEFAULT_SPANS_TOPIC, "encoding": "otlp_proto"},
                                "metrics": {"topic": DEFAULT_METRICS_TOPIC, "encoding": "otlp_proto"}}},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["kafka"]},
                                  "metrics": {"receivers": ["otlp", "prometheus"], "processors": ["batch"],
                                              "exporters": ["kafka"]}}},
    }
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{s.name}-otel-collector", "namespace": s.namespace,
                         "labels": labels(s, "otel-collector")},
            "data": {"config.yaml": yaml.safe_dump(config, sort_keys=False)}}


def dcgm_counters_csv() -> str:
    lines = ["# dcgm-exporter counters for tailwatch: the fields gpu.v1 reads, profiling ones on.",
             "# Format: DCGM field, Prometheus metric type, help message"]
    lines += [f"{name}, {kind}, read by tailwatch (gpu.v1)." for name, kind in DCGM_TYPES.items()]
    return "\n".join(lines) + "\n"


DCGM_COUNTERS_KEY = "dcgm-metrics.csv"


def dcgm_counters(s: DeploySettings) -> dict:
    """In the GPU Operator's namespace, where its dcgm-exporter can mount it: set the
    ClusterPolicy's `dcgmExporter.config.name` to this ConfigMap's name and the exporter's
    `DCGM_EXPORTER_COLLECTORS` to `/etc/dcgm-exporter/dcgm-metrics.csv` (docs/deploy.md)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{s.name}-dcgm-counters", "namespace": s.gpu_operator_namespace,
                         "labels": labels(s, "dcgm-exporter")},
            "data": {DCGM_COUNTERS_KEY: dcgm_counters_csv()}}
