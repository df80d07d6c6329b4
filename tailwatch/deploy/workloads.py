"""tailwatch's own Kubernetes objects: the tier-1 firehose workers, the tier-2 replicas with
a volume each, the OTLP adapter, their Services and PodDisruptionBudgets, the ConfigMap of
their files, and the Secrets they reference (never create).

Both tiers are StatefulSets: a tier-1 pod's name is its static group membership id
(KIP-345), so a restarted pod takes its partitions back without a rebalance; a tier-2 pod
keeps its store on its own volume and resumes from it. The pods run as the image's non-root
user with a read-only root file system; the HTTP port (metrics, health, signal API) is open
to the cluster, so the API config always carries tokens (read from `tokens_secret`).
"""

from __future__ import annotations

import yaml

from tailwatch.deploy.settings import TOKEN_NAMES, DeploySettings

HTTP_PORT = 8000
CONFIG_DIR = "/etc/tailwatch/config"
KAFKA_DIR = "/etc/tailwatch/kafka"
STORE_DIR = "/var/lib/tailwatch"
USER_ID = 10001  # the image's `tailwatch` user (Dockerfile)
SCRAPE_LABEL = "tailwatch-metrics"  # on the headless Services only: the ServiceMonitor scrapes each pod once


def token_env(name: str) -> str:
    return f"TAILWATCH_TOKEN_{name.upper()}"


def api_url(s: DeploySettings) -> str:
    """The Service every caller polls, and where page readers open the runbooks."""
    return f"http://{s.name}.{s.namespace}.svc:{HTTP_PORT}"


def labels(s: DeploySettings, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": s.name, "app.kubernetes.io/component": component}


def _meta(s: DeploySettings, name: str, component: str, **extra) -> dict:
    return {"name": name, "namespace": s.namespace, "labels": labels(s, component), **extra}


def api_config(s: DeploySettings) -> dict:
    """The signal API config: one token per caller, each read from the Secret via the
    environment, each allowed every tenant (scope a caller with a config of your own)."""
    return {"stale_after": s.stale_after,
            "tokens": [{"name": name, "env": token_env(name), "tenants": "*"} for name in TOKEN_NAMES]}


def config_map(s: DeploySettings, slos_yaml: str, prices_yaml: str, otlp_mapping_yaml: str | None) -> dict:
    data = {"api.yaml": yaml.safe_dump(api_config(s), sort_keys=False), "slos.yaml": slos_yaml,
            "prices.yaml": prices_yaml}
    if otlp_mapping_yaml is not None:
        data["otlp-mapping.yaml"] = otlp_mapping_yaml
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(s, f"{s.name}-config", "config"), "data": data}


def service_account(s: DeploySettings) -> dict:
    # No API access at all: nothing in tailwatch talks to the Kubernetes API.
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(s, s.name, "worker"),
            "automountServiceAccountToken": False}


def _kafka_args(s: DeploySettings) -> list[str]:
    args = ["--bootstrap-servers", s.kafka.bootstrap_servers, "--topic-prefix", s.kafka.topic_prefix]
    if s.kafka.client_config_secret:
        args += ["--kafka-config", f"{KAFKA_DIR}/kafka.properties"]
    return args


def _volumes(s: DeploySettings) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts): the config files, the Kafka client's secret settings, a /tmp."""
    volumes = [{"name": "config", "configMap": {"name": f"{s.name}-config"}}, {"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}, {"name": "tmp", "mountPath": "/tmp"}]
    if s.kafka.client_config_secret:
        volumes.append({"name": "kafka", "secret": {"secretName": s.kafka.client_config_secret}})
        mounts.append({"name": "kafka", "mountPath": KAFKA_DIR, "readOnly": True})
    return volumes, mounts


def _container(s: DeploySettings, args: list[str], resources, mounts: list[dict], probes: bool = True) -> dict:
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    env += [{"name": token_env(n), "valueFrom": {"secretKeyRef": {"name": s.tokens_secret, "key": n}}}
            for n in TOKEN_NAMES]
    container = {
        "name": "tailwatch",
        "image": s.image,
        "args": args,
        "env": env,
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": resources.cpu, "memory": resources.memory},
                      "limits": {"memory": resources.memory}},
        "volumeMounts": mounts,
        "securityContext": {"runAsNonRoot": True, "runAsUser": USER_ID, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    }
    if probes:
        # /healthz: the process answers; /readyz: caught up within the staleness bound. A
        # replica catching up after a restart is alive but not ready: no traffic, no kill.
        container["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10,
                                      "timeoutSeconds": 12, "failureThreshold": 6}
        container["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5,
                                       "failureThreshold": 2}
        container["startupProbe"] = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5,
                                     "failureThreshold": 120}
    return container


def _pod_spec(s: DeploySettings, container: dict, volumes: list[dict], grace_s: int = 60) -> dict:
    return {"serviceAccountName": s.name, "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": grace_s,
            "securityContext": {"runAsNonRoot": True, "runAsUser": USER_ID, "fsGroup": USER_ID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container], "volumes": volumes}


def _worker_args(s: DeploySettings, tier: str) -> list[str]:
    return ["worker", "--tier", tier, "--http-host", "0.0.0.0", "--http-port", str(HTTP_PORT),
            "--api-config", f"{CONFIG_DIR}/api.yaml", *_kafka_args(s)]


def tier1(s: DeploySettings) -> dict:
    name = f"{s.name}-tier1"
    volumes, mounts = _volumes(s)
    args = [*_worker_args(s, "1"), "--instance-id", "$(POD_NAME)"]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(s, name, "tier1"),
        "spec": {"serviceName": name, "replicas": s.tier1.replicas, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": labels(s, "tier1")},
                 "template": {"metadata": {"labels": labels(s, "tier1")},
                              "spec": _pod_spec(s, _container(s, args, s.tier1.resources, mounts), volumes)}},
    }


def tier2(s: DeploySettings) -> dict:
    name = f"{s.name}-tier2"
    volumes, mounts = _volumes(s)
    mounts.append({"name": "store", "mountPath": STORE_DIR})
    args = [*_worker_args(s, "2"), "--store", f"{STORE_DIR}/tailwatch.duckdb",
            "--slos", f"{CONFIG_DIR}/slos.yaml", "--prices", f"{CONFIG_DIR}/prices.yaml",
            "--grafana-url", s.grafana_url, "--runbook-url", f"{api_url(s)}/"]
    for url in s.alertmanager_urls if s.paging != "prometheus_rule" else ():
        # every replica pages every instance; Alertmanager deduplicates
        args += ["--alertmanager-url", url]
    claim = {"metadata": {"name": "store"},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": s.tier2.storage}}}}
    if s.tier2.storage_class:
        claim["spec"]["storageClassName"] = s.tier2.storage_class
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(s, name, "tier2"),
        "spec": {"serviceName": name, "replicas": s.tier2.replicas, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": labels(s, "tier2")},
                 "template": {"metadata": {"labels": labels(s, "tier2")},
                              "spec": _pod_spec(s, _container(s, args, s.tier2.resources, mounts), volumes,
                                                grace_s=120)},
                 "volumeClaimTemplates": [claim]},
    }


def otlp_adapter(s: DeploySettings, with_mapping: bool) -> dict:
    """`tailwatch ingest otlp`: the Collector's topics → tw.requests / tw.gpu. Stateless (its
    offsets are the group's), so a Deployment. Without a mapping file, the built-in rules."""
    name = f"{s.name}-otlp"
    volumes, mounts = _volumes(s)
    mapping = ["--mapping", f"{CONFIG_DIR}/otlp-mapping.yaml"] if with_mapping else []
    args = ["ingest", "otlp", *mapping, *_kafka_args(s)]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(s, name, "otlp"),
        "spec": {"replicas": 1, "selector": {"matchLabels": labels(s, "otlp")},
                 "template": {"metadata": {"labels": labels(s, "otlp")},
                              "spec": _pod_spec(s, _container(s, args, s.tier1.resources, mounts, probes=False),
                                                volumes)}},
    }


def services(s: DeploySettings) -> list[dict]:
    """Tier 2's Service is the signal API every caller polls (any replica answers alike);
    each tier's headless Service names its pods for the ServiceMonitor."""
    port = [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}]
    out = [{"apiVersion": "v1", "kind": "Service", "metadata": _meta(s, s.name, "tier2"),
            "spec": {"selector": labels(s, "tier2"), "ports": port}}]
    for tier in ("tier1", "tier2"):
        meta = _meta(s, f"{s.name}-{tier}", tier)
        meta["labels"][SCRAPE_LABEL] = "true"
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": meta,
                    "spec": {"clusterIP": "None", "selector": labels(s, tier), "ports": port}})
    return out


def disruption_budgets(s: DeploySettings) -> list[dict]:
    """A drain takes one pod of a tier at a time: tier 1 rebalances around it, and tier 2
    keeps at least one replica answering and paging."""
    return [{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(s, f"{s.name}-{tier}", tier),
             "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(s, tier)}}}
            for tier in ("tier1", "tier2")]
