"""The OTLP mapping file: where each label that no telemetry standard carries comes from.

Tenant, traffic class, deployment, pool and zone are not in the GenAI conventions, DCGM
or vLLM; a fleet puts them in resource attributes (`OTEL_RESOURCE_ATTRIBUTES`), span
attributes or Kubernetes labels. Each field of `request.v1` / `gpu.v1` that is a label
has a rule: the attribute names to try in order (a span's or data point's own attributes
first, then its resource's), an optional table from the value found to the value written
(`interactive: realtime`), and a default. The built-in rules follow the conventions;
a file overrides field by field:

    requests:
      tenant: {attributes: [tenant.id], default: shared}
      traffic_class: {attributes: [priority], values: {high: realtime, low: batch}}
    gpu:
      pool: {attributes: [k8s.deployment.name, pod]}

`tailwatch otlp check FILE` lists every problem with its place, as `slo check` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

import msgspec

from tailwatch.ingest.otlp.attributes import Attributes, first
from tailwatch.ingest.schema import Deployment, TrafficClass, Workload
from tailwatch.config import ConfigStruct, every_problem, load_struct, read_yaml

AttributeName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
LabelValue = Annotated[str, msgspec.Meta(max_length=128)]


class MappingError(Exception):
    """A bad mapping file: one line naming the file, the place and the problem."""


# Attributes that carry people or their words (OpenTelemetry's user and GenAI content
# conventions). No rule may read them: nothing of a prompt, a completion or a user's
# identity may become a label, however a mapping file is written.
PERSONAL_ATTRIBUTE_PREFIXES = ("enduser.", "user.", "gen_ai.prompt", "gen_ai.completion", "gen_ai.input.",
                               "gen_ai.output.", "gen_ai.system_instructions", "gen_ai.tool.call.arguments",
                               "gen_ai.tool.call.result", "http.request.header.", "url.query", "client.address")


class FieldRule(ConfigStruct):
    attributes: list[AttributeName] = []
    values: dict[str, LabelValue] = {}
    default: LabelValue = ""

    def __post_init__(self):
        personal = [a for a in self.attributes if a.startswith(PERSONAL_ATTRIBUTE_PREFIXES)]
        if personal:
            raise ValueError(f"attribute {personal[0]} carries a person or their words and is never read")

    def pick(self, *scopes: Attributes) -> str:
        found = first(self.attributes, *scopes)
        if found is None:
            return self.default
        text = str(found)[:128]
        return self.values.get(text, text)


# Closed sets: a default or a table value outside the set would make every mapped event a
# dead letter, so the file is refused instead. An empty default leaves the field out of the
# event, and the schema's own default applies (realtime, stable; a workload must be found).
class WorkloadRule(FieldRule):
    values: dict[str, Workload] = {}
    default: Union[Workload, Literal[""]] = ""


class TrafficClassRule(FieldRule):
    values: dict[str, TrafficClass] = {}
    default: Union[TrafficClass, Literal[""]] = ""


class DeploymentRule(FieldRule):
    values: dict[str, Deployment] = {}
    default: Union[Deployment, Literal[""]] = ""


def _rule(*attributes: str, default: str = "", kind: type[FieldRule] = FieldRule) -> FieldRule:
    return kind(attributes=list(attributes), default=default)


class RequestRules(ConfigStruct):
    tenant: FieldRule = _rule("tenant.id", "tenant", default="default")
    # `model_name`: vLLM's pages; `model` and `version`: Triton's. TGI's page names no model:
    # a mapping file gives it (a default, or a table from `instance`).
    model: FieldRule = _rule("gen_ai.response.model", "gen_ai.request.model", "model_name", "model", "service.name",
                             default="unknown")
    model_version: FieldRule = _rule("model_version", "service.version", "version")
    zone: FieldRule = _rule("cloud.availability_zone", "zone")
    region: FieldRule = _rule("cloud.region", "region")
    pool: FieldRule = _rule("pool", "k8s.deployment.name")
    workload: WorkloadRule = _rule("workload", default="llm", kind=WorkloadRule)
    endpoint: FieldRule = _rule("gen_ai.operation.name", "http.route")
    traffic_class: TrafficClassRule = _rule("traffic_class", default="realtime", kind=TrafficClassRule)
    deployment: DeploymentRule = _rule("deployment", default="stable", kind=DeploymentRule)
    gpu_sku: FieldRule = _rule("gpu_sku")


class GpuRules(ConfigStruct):
    node: FieldRule = _rule("node", "Hostname", "hostname", "host.name", "k8s.node.name", "instance", default="unknown")
    zone: FieldRule = _rule("cloud.availability_zone", "zone")
    pool: FieldRule = _rule("pool", "k8s.deployment.name")
    model: FieldRule = _rule("model_name", "model", "service.name")
    model_version: FieldRule = _rule("model_version", "version", "service.version")


class OtlpMapping(ConfigStruct):
    requests: RequestRules = RequestRules()
    gpu: GpuRules = GpuRules()


def load_mapping(path: str | Path | None) -> OtlpMapping:
    if path is None:
        return OtlpMapping()
    return load_struct(path, OtlpMapping, MappingError)


def check_mapping(path: str | Path) -> list[str]:
    """Every problem of a mapping file, each as "place: what is wrong" (empty: it is good)."""
    raw = read_yaml(path, MappingError)
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return ["expected a mapping with sections requests and gpu"]
    sections = {"requests": RequestRules, "gpu": GpuRules}
    problems = [f"unknown section `{k}` (known: {', '.join(sections)})" for k in raw if k not in sections]
    for section, kind in sections.items():
        if section in raw:
            problems += every_problem(raw[section], kind, section)
    return problems
