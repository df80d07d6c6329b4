"""`tailwatch deploy generate` and the container image: every manifest valid against the
vendored Kubernetes v1.34 and CRD schemas (strict: an unknown field fails, as kubectl's
strict validation and kubeconform -strict fail it), and wired to what tailwatch really
accepts: each container's command line parses, each config file loads, each URL is a route
of the signal API, the rules pass promtool, the dcgm-exporter file enables what gpu.v1 reads.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tailwatch.deploy.generate import FLAGGER_TOKEN_ENV, write
from tailwatch.deploy.neighbours import keda
from tailwatch.deploy.settings import DeploySettings, Pool, load_settings
from tailwatch.deploy.workloads import CONFIG_DIR, USER_ID
from tailwatch.ingest.otlp.gpu import DCGM_COUNTERS, DCGM_GAUGES, DCGM_XID
from tailwatch.ingest.otlp.republish import DEFAULT_METRICS_TOPIC, DEFAULT_SPANS_TOPIC
from tailwatch.signals.answers import Autoscale
from tailwatch.signals.api import FLAGGER_CHECKS, SignalApi
from tailwatch.signals.config import ApiConfig, load_api_config
from tailwatch.signals.routes import make_app, takes_body
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = Path(__file__).parent / "data" / "schemas"
CRD_FILES = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobject_v1alpha1",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentication_v1alpha1",
    ("argoproj.io/v1alpha1", "AnalysisTemplate"): "argoproj.io_analysistemplate_v1alpha1",
    ("flagger.app/v1beta1", "Canary"): "flagger.app_canary_v1beta1",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrule_v1",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitor_v1",
}
SETTINGS = """
namespace: monitoring
image: registry.example/tailwatch:0.1.0
kafka: {bootstrap_servers: "kafka-0.kafka:9092,kafka-1.kafka:9092", client_config_secret: tailwatch-kafka}
tier1: {replicas: 3}
tier2: {replicas: 2, storage: 100Gi, storage_class: fast-ssd}
alertmanager_urls: [http://alertmanager-0.alertmanager:9093, http://alertmanager-1.alertmanager:9093]
pools:
  - {name: llm-us-east-1a-realtime, target: vllm-llama-70b, namespace: serving, min_replicas: 2, max_replicas: 64}
  - {name: asr-eu-west-4a-realtime, target: whisper, namespace: speech, fallback_replicas: 6}
canaries:
  - {model: llama-70b, version: v2, target: vllm-llama-70b, namespace: serving}
"""


class Validators:
    """(apiVersion, kind) → a strict validator, from the vendored schemas only."""

    def __init__(self):
        defs_doc = json.loads(gzip.open(SCHEMAS / "kubernetes-v1.34.0-strict" / "_definitions.json.gz").read())
        self.defs_doc = defs_doc
        self.by_kind: dict[tuple[str, str], str] = {}
        for name, schema in defs_doc["$defs"].items():
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                self.by_kind.setdefault((api_version, gvk["kind"]), name)

    def k8s(self, definition: str) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator({**self.defs_doc, "$ref": f"#/$defs/{definition}"})

    def errors(self, obj: dict) -> list[str]:
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key in CRD_FILES:
            schema = strict(json.loads(gzip.open(SCHEMAS / "crds" / f"{CRD_FILES[key]}.json.gz").read()))
            found = list(jsonschema.Draft7Validator(schema).iter_errors(obj))
            # A CRD's schema leaves metadata open: the API server checks it as ObjectMeta.
            found += list(self.k8s("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta").iter_errors(obj["metadata"]))
        elif key in self.by_kind:
            found = list(self.k8s(self.by_kind[key]).iter_errors(obj))
        else:
            return [f"no schema for {key}"]
        return [f"{obj['kind']}/{obj['metadata'].get('name')}: {'.'.join(map(str, e.absolute_path))}: "
                f"{e.message[:200]}" for e in found]


def strict(schema):
    """Unknown fields refused wherever the schema lists the known ones and does not keep
    unknown ones (kubeconform's -strict)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def validators() -> Validators:
    return Validators()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("deploy")
    settings_file = out.parent / "deploy.yaml"
    settings_file.write_text(SETTINGS)
    settings = load_settings(settings_file)
    specs = load_slos(DEFAULT_SLOS)
    prices = "default_usd_per_gpu_hour: 2.5\nusd_per_gpu_hour: {H100: 3.9}\n"
    written = write(settings, specs, Path(DEFAULT_SLOS).read_text(), prices, None, out,
                    environ={FLAGGER_TOKEN_ENV: "flagger-token-for-the-test"})
    objects = {p.name: [o for o in yaml.safe_load_all(p.read_text()) if o] for p in written.files}
    return settings, written, objects


def every(objects: dict) -> list[dict]:
    return [o for name, docs in objects.items() if name != "kustomization.yaml" for o in docs]


def of_kind(objects: dict, kind: str) -> list[dict]:
    return [o for o in every(objects) if o["kind"] == kind]


def test_every_manifest_is_valid_against_its_vendored_schema(generated, validators):
    _settings, written, objects = generated
    kinds = sorted({o["kind"] for o in every(objects)})
    problems = [p for o in every(objects) for p in validators.errors(o)]
    print(f"{len(every(objects))} objects of {len(kinds)} kinds validated: {', '.join(kinds)}")
    assert problems == []
    assert {"StatefulSet", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "ServiceAccount", "Namespace",
            "ScaledObject", "TriggerAuthentication", "AnalysisTemplate", "Canary", "PrometheusRule",
            "ServiceMonitor"} <= set(kinds)
    assert written.objects == len(every(objects))


def test_the_validation_fails_on_a_misspelt_or_mistyped_field(generated, validators):
    """The check can fail: one unknown field or a wrong type, in a core object and in a CRD."""
    _s, _w, objects = generated
    sts = copy.deepcopy(of_kind(objects, "StatefulSet")[0])
    sts["spec"]["replica"] = 3
    scaled = copy.deepcopy(of_kind(objects, "ScaledObject")[0])
    scaled["spec"]["triggers"][0]["authRef"] = {"name": "x"}
    canary = copy.deepcopy(of_kind(objects, "Canary")[0])
    canary["spec"]["analysis"]["threshold"] = "three"
    monitor = copy.deepcopy(of_kind(objects, "ServiceMonitor")[0])
    monitor["metadata"]["labels"] = {"a": 1}
    for broken in (sts, scaled, canary, monitor):
        assert validators.errors(broken), broken["kind"]


def test_kustomization_names_every_file_and_nothing_else(generated):
    _s, written, objects = generated
    kustomization = objects["kustomization.yaml"][0]
    assert sorted(kustomization["resources"]) == sorted(p.name for p in written.files if p.name != "kustomization.yaml")
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in every(objects)]
    assert len(names) == len(set(names)), "an object written twice"


def test_each_container_command_line_is_one_tailwatch_accepts(generated):
    _s, _w, objects = generated
    workloads = [w for w in of_kind(objects, "StatefulSet") + of_kind(objects, "Deployment")
                 if w["spec"]["template"]["spec"]["containers"][0]["image"].startswith("registry.example/tailwatch")]
    assert len(workloads) == 3
    for w in workloads:
        container = w["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"] for e in container["env"]}
        args = [re.sub(r"\$\((\w+)\)", lambda m: "pod-0" if m.group(1) in env else m.group(0), a)
                for a in container["args"]]
        parsed = build_parser().parse_args(args)  # exits (SystemExit) on a flag tailwatch lacks
        if parsed.command == "worker":
            assert parsed.http_host == "0.0.0.0" and parsed.api_config == f"{CONFIG_DIR}/api.yaml"
            # where Kafka is comes from the Secret's file, with its credentials
            assert parsed.bootstrap_servers is None and parsed.kafka_config == "/etc/tailwatch/kafka/kafka.properties"
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        for value in args:
            if value.startswith("/etc/tailwatch/"):
                assert str(Path(value).parent) in mounted, value
        assert container["securityContext"]["runAsUser"] == USER_ID
    tier1 = next(w for w in workloads if w["metadata"]["name"].endswith("tier1"))
    assert "--instance-id" in tier1["spec"]["template"]["spec"]["containers"][0]["args"]  # static membership
    tier2 = next(w for w in workloads if w["metadata"]["name"].endswith("tier2"))
    assert tier2["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert tier2["spec"]["replicas"] == 2
    args = tier2["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args.count("--alertmanager-url") == 2


def test_the_config_map_files_load_and_tokens_come_from_the_secret(generated, tmp_path, monkeypatch):
    settings, _w, objects = generated
    config = next(o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"] == "tailwatch-config")
    for name, text in config["data"].items():
        (tmp_path / name).write_text(text)
    tier2 = next(o for o in of_kind(objects, "StatefulSet") if o["metadata"]["name"].endswith("tier2"))
    env = tier2["spec"]["template"]["spec"]["containers"][0]["env"]
    from_secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
    for variable, ref in from_secret.items():
        assert ref["name"] == settings.tokens_secret
        monkeypatch.setenv(variable, f"secret-{ref['key']}")
    api = load_api_config(tmp_path / "api.yaml")
    assert api.auth_required
    assert {api.authenticate(f"Bearer secret-{k}").name for k in ("keda", "argo", "flagger", "prometheus")} == \
        {"keda", "argo", "flagger", "prometheus"}
    assert api.authenticate("Bearer secret-other") is None
    assert [s.name for s in load_slos(tmp_path / "slos.yaml")] == [s.name for s in load_slos(DEFAULT_SLOS)]
    from tailwatch.planning.prices import load_prices

    assert load_prices(tmp_path / "prices.yaml").usd_per_gpu_hour["H100"] == 3.9


_APP = make_app(SignalApi(ApiConfig(), lambda: None, lambda: (True, "")))


def _route_exists(path: str, method: str = "GET") -> bool:
    """The real router resolves it to a handler (not a 404 or 405)."""
    return takes_body(_APP, method, path) in ("yes", "no body")


def test_keda_argo_and_flagger_point_at_routes_that_answer(generated):
    settings, _w, objects = generated
    url = f"http://tailwatch.monitoring.svc:8000"
    scaled = of_kind(objects, "ScaledObject")
    assert sorted(o["spec"]["triggers"][0]["metadata"]["url"] for o in scaled) == sorted(
        f"{url}/v1/autoscale/{p.name}" for p in settings.pools)
    for o in scaled:
        trigger = o["spec"]["triggers"][0]
        assert _route_exists(trigger["metadata"]["url"].removeprefix(url))
        assert trigger["metadata"]["valueLocation"] in Autoscale.__struct_fields__
        auth = trigger["authenticationRef"]["name"]
        assert any(a["metadata"] == {"name": auth, "namespace": o["metadata"]["namespace"]}
                   for a in of_kind(objects, "TriggerAuthentication"))
    assert next(o for o in scaled if o["metadata"]["namespace"] == "speech")["spec"]["fallback"]["replicas"] == 6
    templates = of_kind(objects, "AnalysisTemplate")
    assert {t["metadata"]["namespace"] for t in templates} == {"serving"}
    for t in templates:
        secret = t["spec"]["args"][2]["valueFrom"]["secretKeyRef"]
        assert secret == {"name": settings.tokens_secret, "key": "argo"}
        web = t["spec"]["metrics"][0]["provider"]["web"]["url"]
        assert _route_exists(web.replace("{{args.model}}", "m").replace("{{args.version}}", "v").removeprefix(url))
    (canary,) = of_kind(objects, "Canary")
    hooks = canary["spec"]["analysis"]["webhooks"]
    assert sorted(h["type"] for h in hooks) == sorted([*FLAGGER_CHECKS, "event"])
    for h in hooks:
        assert _route_exists(h["url"].removeprefix(url), "POST")
        if h["type"] != "event":
            assert h["metadata"]["token"] == "flagger-token-for-the-test"


# KEDA's rule for the replicas a ScaledObject is set to once a scaler failed
# `failureThreshold` polls in a row, per `fallback.behavior` (ScaledObject reference, 2.17+;
# the vendored CRD's enum): (replicas it runs, fallback.replicas) -> replicas.
KEDA_FALLBACK_REPLICAS = {
    "static": lambda current, replicas: replicas,
    "currentReplicas": lambda current, replicas: current,
    "currentReplicasIfHigher": lambda current, replicas: max(current, replicas),
    "currentReplicasIfLower": lambda current, replicas: min(current, replicas),
}


def _docs_keda_scaled_object() -> dict:
    section = (ROOT / "docs" / "signal-api.md").read_text().split("## KEDA", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return next(o for o in yaml.safe_load_all(block) if o and o["kind"] == "ScaledObject")


def test_keda_fallback_holds_the_replicas_a_pool_runs_as_the_docs_say(generated, validators):
    settings, _w, objects = generated
    crd = json.loads(gzip.open(SCHEMAS / "crds" / f"{CRD_FILES['keda.sh/v1alpha1', 'ScaledObject']}.json.gz").read())
    assert set(KEDA_FALLBACK_REPLICAS) == set(crd["properties"]["spec"]["properties"]["fallback"]["properties"][
        "behavior"]["enum"])
    docs_words = " ".join((ROOT / "docs" / "signal-api.md").read_text().split())
    assert "The fallback holds the replicas the pool runs" in docs_words
    assert "`fallback` holds the replicas the pool runs" in (ROOT / "docs" / "deploy.md").read_text()
    scaled = of_kind(objects, "ScaledObject")
    assert len(scaled) == len(settings.pools)
    for obj in scaled:
        pool = next(p for p in settings.pools if (p.target, p.namespace) == (
            obj["metadata"]["name"], obj["metadata"]["namespace"]))
        fallback = obj["spec"]["fallback"]
        rule = KEDA_FALLBACK_REPLICAS[fallback.get("behavior", "static")]
        for current in range(max(pool.min_replicas, 1), pool.max_replicas + 1):
            floor = pool.fallback_replicas or 0
            assert rule(current, fallback["replicas"]) == max(current, floor), (pool.name, current)
    # The docs' example is what `deploy generate` writes for the pool it shows, and is valid.
    example = _docs_keda_scaled_object()
    assert validators.errors(example) == []
    spec = example["spec"]
    shown = Pool(name="shown", target=spec["scaleTargetRef"]["name"], namespace=example["metadata"]["namespace"],
                 min_replicas=spec["minReplicaCount"], max_replicas=spec["maxReplicaCount"])
    assert keda(DeploySettings(), shown)[1]["spec"]["fallback"] == spec["fallback"]
    assert KEDA_FALLBACK_REPLICAS[spec["fallback"]["behavior"]](10, spec["fallback"]["replicas"]) == 10


def test_prometheus_rule_passes_promtool(generated, tmp_path):
    _s, _w, objects = generated
    (rule,) = of_kind(objects, "PrometheusRule")
    assert len(rule["spec"]["groups"]) >= len(load_slos(DEFAULT_SLOS))
    promtool = shutil.which("promtool")
    if promtool is None:
        assert os.environ.get("CI") != "true", "promtool is missing (CI installs the prometheus package)"
        pytest.skip("promtool not installed")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    run = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_service_monitor_scrapes_each_pod_once_with_the_prometheus_token(generated):
    settings, _w, objects = generated
    (monitor,) = of_kind(objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in of_kind(objects, "Service") if selector.items() <= s["metadata"]["labels"].items()]
    assert sorted(s["metadata"]["name"] for s in selected) == ["tailwatch-tier1", "tailwatch-tier2"]
    assert all(s["spec"]["clusterIP"] == "None" for s in selected)
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == {"name": settings.tokens_secret,
                                                                               "key": "prometheus"}


def test_dashboards_fit_configmaps_for_the_sidecar(generated):
    _s, _w, objects = generated
    boards = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(boards) == 7
    for b in boards:
        ((name, text),) = b["data"].items()
        assert json.loads(text)["uid"] == name.removesuffix(".json")
        assert len(json.dumps(b).encode()) < 1024 * 1024  # the API server's limit on one object


def test_collector_and_dcgm_files_match_what_the_adapter_reads(generated):
    _s, _w, objects = generated
    collector = next(o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("otel-collector"))
    config = yaml.safe_load(collector["data"]["config.yaml"])
    kafka = config["exporters"]["kafka"]
    assert kafka["traces"]["topic"] == DEFAULT_SPANS_TOPIC and kafka["metrics"]["topic"] == DEFAULT_METRICS_TOPIC
    assert kafka["brokers"] == ["kafka-0.kafka:9092", "kafka-1.kafka:9092"]
    for pipeline in config["service"]["pipelines"].values():
        assert set(pipeline["receivers"]) <= set(config["receivers"]) and pipeline["exporters"] == ["kafka"]
    dcgm = next(o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("dcgm-counters"))
    rows = [line.split(",")[0].strip() for line in dcgm["data"]["dcgm-metrics.csv"].splitlines()
            if line and not line.startswith("#")]
    assert set(DCGM_GAUGES) | set(DCGM_COUNTERS) | {DCGM_XID} <= set(rows)
    assert {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"} <= set(rows)


@pytest.mark.slow
def test_defaults_alone_deploy_and_a_bad_settings_file_is_one_line(tmp_path, validators):
    written = write(DeploySettings(), load_slos(DEFAULT_SLOS), Path(DEFAULT_SLOS).read_text(), "", None,
                    tmp_path / "out", environ={})
    objects = [o for p in written.files if p.name != "kustomization.yaml" for o in yaml.safe_load_all(p.read_text())]
    assert [p for o in objects for p in validators.errors(o)] == []
    assert not any(o["kind"] in ("Canary", "ScaledObject") for o in objects)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tier2: {replicas: 0}\npools: [{name: p, target: Not_A_Name}]\n")
    run = subprocess.run([sys.executable, "-m", "tailwatch", "deploy", "generate", "--out", str(tmp_path / "x"),
                          "--settings", str(bad)], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "bad.yaml" in run.stderr


@pytest.mark.slow
def test_canaries_without_a_flagger_token_are_refused(tmp_path):
    settings = tmp_path / "d.yaml"
    settings.write_text(SETTINGS)
    env = {k: v for k, v in os.environ.items() if k != FLAGGER_TOKEN_ENV}
    run = subprocess.run([sys.executable, "-m", "tailwatch", "deploy", "generate", "--out", str(tmp_path / "x"),
                          "--settings", str(settings)], capture_output=True, text=True, env=env)
    assert run.returncode == 2 and FLAGGER_TOKEN_ENV in run.stderr
    run = subprocess.run([sys.executable, "-m", "tailwatch", "deploy", "generate", "--out", str(tmp_path / "y"),
                          "--settings", str(settings)], capture_output=True, text=True,
                         env={**env, FLAGGER_TOKEN_ENV: "t"})
    assert run.returncode == 0, run.stderr
    assert "kubectl apply -k" in run.stdout and "serving/tailwatch-api-tokens (keda, argo)" in run.stdout


def test_the_image_is_multi_stage_non_root_pinned_and_leaves_the_broker_out():
    dockerfile = (ROOT / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert len(froms) >= 2
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", dockerfile, re.M).group(1)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    assert re.findall(r"^USER\s+(\S+)", dockerfile, re.M)[-1] == f"{USER_ID}:{USER_ID}"
    install = re.search(r"pip install (.*)", dockerfile).group(1)
    assert "--constraint constraints.txt" in install and "[" not in install  # no extras: no broker
    pinned = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert pinned and all(re.fullmatch(r"[a-z0-9-]+==[\w.]+", line) for line in pinned)
    assert not any(line.startswith("calfkit") for line in pinned)
    # Every runtime dependency is pinned (the broker is an extra).
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[ ]", d)[0].lower().replace("_", "-") for d in project["dependencies"]}
    assert names <= {line.split("==")[0] for line in pinned}
    assert all("calfkit" not in d for d in project["dependencies"])
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "tests", "dev", ".git", "data"} <= set(ignored)  # dev/: the development tools stay out


def _enabled(csv_text: str) -> set[str]:
    return {line.split(",")[0].strip() for line in csv_text.splitlines() if line.strip() and not line.startswith("#")}


def test_the_generated_counters_file_turns_on_what_the_stock_file_leaves_off():
    """dcgm-exporter's own file enables GR_ENGINE_ACTIVE but comments out SM_ACTIVE and
    SM_OCCUPANCY (and ECC): with it, busy-but-slow and utilisation would lose SM activity."""
    from tailwatch.deploy.neighbours import dcgm_counters_csv

    stock = _enabled((Path(__file__).parent / "data" / "dcgm-exporter" / "default-counters.csv").read_text())
    read = set(DCGM_GAUGES) | set(DCGM_COUNTERS) | {DCGM_XID}
    missing_in_stock = read - stock
    assert {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY"} <= missing_in_stock
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in stock
    ours = _enabled(dcgm_counters_csv())
    assert read <= ours and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in ours
    print(f"fields gpu.v1 reads that the stock file leaves off, on in ours: {', '.join(sorted(missing_in_stock))}")
