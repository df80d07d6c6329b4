"""The OpenTelemetry Collector's workload: its ServiceAccount with the read access pod
discovery needs (pods and, for the zone, nodes: get, list, watch, cluster-wide), the
Deployment running `otel/opentelemetry-collector-contrib` on the generated config, and the
Service the runtimes send OTLP to (`<name>-otel-collector.<namespace>:4317`).
"""

from __future__ import annotations

from tailwatch.deploy.settings import DeploySettings
from tailwatch.deploy.workloads import labels

CONFIG_DIR = "/etc/otelcol-contrib"  # the contrib image's own config folder
OTLP_PORTS = {"otlp-grpc": 4317, "otlp-http": 4318}


def name_of(s: DeploySettings) -> str:
    return f"{s.name}-otel-collector"


def objects(s: DeploySettings, config_map: dict) -> list[dict]:
    name, meta_labels = name_of(s), labels(s, "otel-collector")
    meta = {"name": name, "namespace": s.namespace, "labels": meta_labels}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": f"{s.namespace}-{name}", "labels": meta_labels},
            "rules": [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": f"{s.namespace}-{name}", "labels": meta_labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": s.namespace}]}
    container = {
        "name": "otel-collector", "image": s.collector.image,
        "args": [f"--config={CONFIG_DIR}/config.yaml"],
        "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"} for port_name, port in OTLP_PORTS.items()],
        "resources": {"requests": {"cpu": s.collector.resources.cpu, "memory": s.collector.resources.memory},
                      "limits": {"memory": s.collector.resources.memory}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {"replicas": 1, "selector": {"matchLabels": meta_labels},
                 "template": {"metadata": {"labels": meta_labels},
                              "spec": {"serviceAccountName": name,
                                       "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                                       "containers": [container],
                                       "volumes": [{"name": "config", "configMap": {
                                           "name": config_map["metadata"]["name"]}}]}}},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
               "spec": {"selector": meta_labels,
                        "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in OTLP_PORTS.items()]}}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
    return [config_map, account, role, binding, deployment, service]
