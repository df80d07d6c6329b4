"""The deployment file `tailwatch deploy generate --settings FILE` reads: what differs between
installations (image, Kafka, replicas, storage, pools to scale, canaries to judge), every
field with a default so an empty file deploys a working pair of tiers.

    namespace: monitoring
    image: registry.example/tailwatch:0.1.0
    kafka: {bootstrap_servers: "kafka.kafka:9092", client_config_secret: tailwatch-kafka}
    tier1: {replicas: 3}
    tier2: {replicas: 2, storage: 100Gi, storage_class: fast-ssd}
    alertmanager_urls: [http://alertmanager-0.alertmanager:9093, http://alertmanager-1.alertmanager:9093]
    pools:
      - {name: llm-us-east-1a-realtime, target: vllm-llama-70b, namespace: serving, min_replicas: 2, max_replicas: 64}
    canaries:
      - {model: llama-70b, version: v2, target: vllm-llama-70b, namespace: serving}
    pod_labels: {pool: example.com/pool}      # the serving pods' labels the Collector reads
    paging: worker                            # or prometheus_rule (or both)
    release: kube-prometheus-stack            # on every object, with team

Secrets are referenced, never written: `tokens_secret` holds one key per token name (the
signal API reads each from an environment variable), `kafka.client_config_secret` one key
`kafka.properties` (librdkafka's SASL and TLS settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta

from tailwatch.config import ConfigStruct, PositiveCount, load_struct
from tailwatch.config.kubernetes import MAX_LENGTH as K8S_MAX_LENGTH, PATTERN as K8S_PATTERN

# A Kubernetes object name (RFC 1123 label): what every name below becomes part of.
K8sName = Annotated[str, Meta(pattern=K8S_PATTERN, max_length=K8S_MAX_LENGTH)]
LabelValue = Annotated[str, Meta(pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")]
Quantity = Annotated[str, Meta(pattern=r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")]
TOKEN_NAMES = ("keda", "argo", "flagger", "prometheus")  # the callers of the API a deployment wires up


class DeployError(Exception):
    """The deployment file is wrong: one line naming the problem."""


class Resources(ConfigStruct):
    cpu: Quantity = "1"
    memory: Quantity = "2Gi"


class Tier1(ConfigStruct):
    replicas: PositiveCount = 2
    resources: Resources = Resources(cpu="2", memory="2Gi")


class Tier2(ConfigStruct):
    replicas: PositiveCount = 2  # an HA pair: each replica has its own store and pages every Alertmanager
    storage: Quantity = "50Gi"
    storage_class: str | None = None  # the cluster's default
    resources: Resources = Resources(cpu="2", memory="8Gi")


class Kafka(ConfigStruct):
    bootstrap_servers: str = "kafka:9092"
    client_config_secret: K8sName | None = None  # a Secret with key kafka.properties (SASL, TLS)
    topic_prefix: str = "tw."


class Pool(ConfigStruct):
    """A serving pool KEDA scales on `GET /v1/autoscale/{name}`."""

    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9._:@+-]{1,128}$")]
    target: K8sName  # the Deployment serving it
    namespace: K8sName = "default"
    min_replicas: Annotated[int, Meta(ge=0)] = 1
    max_replicas: PositiveCount = 32
    # while tailwatch answers 503 the pool keeps its replicas; set, it also keeps at least this many
    fallback_replicas: PositiveCount | None = None


class Canary(ConfigStruct):
    """A model whose new versions Flagger rolls out on tailwatch's verdict."""

    model: str
    version: str
    target: K8sName
    namespace: K8sName = "default"
    port: Annotated[int, Meta(ge=1, le=65535)] = 8000


class Collector(ConfigStruct):
    """The OpenTelemetry Collector (contrib: it has the kafka exporter) that scrapes DCGM and
    the runtimes and receives their OTLP. One replica: pod discovery is cluster-wide, so a
    second would scrape every pod again."""

    image: str = "otel/opentelemetry-collector-contrib:0.115.1"
    resources: Resources = Resources(cpu="500m", memory="1Gi")


class PodLabels(ConfigStruct):
    """The Kubernetes labels of a serving pod that name its pool, zone, model, version and
    deployment: the Collector copies each into the series it scrapes from that pod. A pod
    without the zone label takes its node's `topology.kubernetes.io/zone`."""

    pool: str = "tailwatch.dev/pool"
    zone: str = "tailwatch.dev/zone"
    model: str = "tailwatch.dev/model"
    version: str = "tailwatch.dev/model-version"
    deployment: str = "tailwatch.dev/deployment"  # stable or canary


class DeploySettings(ConfigStruct):
    namespace: K8sName = "monitoring"
    name: K8sName = "tailwatch"  # prefix of every object
    image: str = "tailwatch:0.1.0"
    kafka: Kafka = Kafka()
    tier1: Tier1 = Tier1()
    tier2: Tier2 = Tier2()
    otlp_adapter: bool = True  # `tailwatch ingest otlp` beside the Collector's kafka exporter
    tokens_secret: K8sName = "tailwatch-api-tokens"
    alertmanager_urls: list[str] = []
    grafana_url: str = "http://grafana.monitoring"
    stale_after: str = "2m"
    pools: list[Pool] = []
    canaries: list[Canary] = []
    pod_labels: PodLabels = PodLabels()
    collector: Collector = Collector()
    # dcgm-exporter's counters ConfigMap goes where the NVIDIA GPU Operator's exporter can mount it
    gpu_operator_namespace: K8sName = "gpu-operator"
    # Who pages: the tier-2 workers through Alertmanager, or Prometheus through the PrometheusRule's
    # alerts (the rule keeps its recording rules either way); `both` pages every burn twice.
    paging: Literal["worker", "prometheus_rule", "both"] = "worker"
    release: LabelValue | None = None  # kube-prometheus-stack selects PrometheusRules and ServiceMonitors by it
    team: LabelValue | None = None


def load_settings(path: str | Path | None) -> DeploySettings:
    if path is None:
        return DeploySettings()
    settings = load_struct(path, DeploySettings, DeployError)
    names = [p.name for p in settings.pools]
    if len(set(names)) != len(names):
        raise DeployError(f"{path}: pools: a pool is named twice")
    return settings
