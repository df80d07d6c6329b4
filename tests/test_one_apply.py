"""`deploy generate` writes what a platform team applies in one step: the Collector workload
with its discovery RBAC, dcgm-exporter's counters where the GPU Operator mounts them, the
team's labels on every object, one paging path; and `deploy preflight` names the kinds a
cluster lacks, from its `kubectl api-resources -o wide` output. Credentials come from Secrets
only: templates of them, or references to Secrets made outside."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tailwatch.deploy.generate import FLAGGER_TOKEN_ENV, write
from tailwatch.deploy.settings import load_settings
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.cli import main
from tests.conftest import free_port
from tests.test_deploy import SETTINGS, Validators, every, of_kind

API_RESOURCES = Path(__file__).parent / "data" / "kubectl" / "api-resources-wide.txt"


def generate(tmp_path, extra: str = "") -> dict[str, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "deploy.yaml").write_text(SETTINGS + extra)
    written = write(load_settings(tmp_path / "deploy.yaml"), load_slos(DEFAULT_SLOS), Path(DEFAULT_SLOS).read_text(),
                    "default_usd_per_gpu_hour: 2.5\n", None, tmp_path / "out", environ={FLAGGER_TOKEN_ENV: "t"})
    return {p.name: [o for o in yaml.safe_load_all(p.read_text()) if o] for p in written.files}


def _tier2_args(objects) -> list[str]:
    sts = next(o for o in of_kind(objects, "StatefulSet") if o["metadata"]["name"].endswith("tier2"))
    return sts["spec"]["template"]["spec"]["containers"][0]["args"]


def _alerts(objects) -> list[dict]:
    rule = of_kind(objects, "PrometheusRule")[0]
    return [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.slow
def test_the_collector_runs_with_discovery_rbac_and_its_generated_config(tmp_path):
    objects = generate(tmp_path)
    collector = objects["otel-collector.yaml"]
    deployment = next(o for o in collector if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"].startswith("otel/opentelemetry-collector-contrib:")
    config_map = next(o for o in collector if o["kind"] == "ConfigMap")
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    mount = pod["containers"][0]["volumeMounts"][0]["mountPath"]
    assert pod["containers"][0]["args"] == [f"--config={mount}/config.yaml"] and "config.yaml" in config_map["data"]
    role = next(o for o in collector if o["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]
    binding = next(o for o in collector if o["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": deployment["metadata"]["namespace"]}]
    assert any(o["kind"] == "ServiceAccount" and o["metadata"]["name"] == pod["serviceAccountName"] for o in collector)
    service = next(o for o in collector if o["kind"] == "Service")
    assert {p["port"] for p in service["spec"]["ports"]} == {4317, 4318}
    # dcgm-exporter's counters in the GPU Operator's namespace, under the key its env names
    dcgm = objects["dcgm-exporter.yaml"][0]
    assert dcgm["metadata"]["namespace"] == "gpu-operator" and list(dcgm["data"]) == ["dcgm-metrics.csv"]


@pytest.mark.slow
def test_release_and_team_on_every_object_and_one_paging_path(tmp_path):
    validators = Validators()
    objects = generate(tmp_path / "worker", "release: kube-prometheus-stack\nteam: ml-platform\n")
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack"
               and o["metadata"]["labels"]["team"] == "ml-platform" for o in every(objects))
    assert [p for o in every(objects) for p in validators.errors(o)] == []
    # default: the workers page; the PrometheusRule keeps its recording rules and no alert
    rule = of_kind(objects, "PrometheusRule")[0]
    assert _alerts(objects) == [] and any("record" in r for g in rule["spec"]["groups"] for r in g["rules"])
    assert "--alertmanager-url" in _tier2_args(objects)
    by_rule = generate(tmp_path / "rule", "paging: prometheus_rule\n")
    assert len(_alerts(by_rule)) >= 2 and "--alertmanager-url" not in _tier2_args(by_rule)
    both = generate(tmp_path / "both", "paging: both\n")
    assert _alerts(both) and "--alertmanager-url" in _tier2_args(both)


def test_preflight_names_what_the_cluster_lacks(tmp_path, capsys, monkeypatch):
    """The recorded cluster runs kube-prometheus-stack and Argo Rollouts, no KEDA, no Flagger."""
    monkeypatch.setenv(FLAGGER_TOKEN_ENV, "t")
    (tmp_path / "deploy.yaml").write_text(SETTINGS)
    argv = ["deploy", "preflight", "--api-resources", str(API_RESOURCES), "--settings", str(tmp_path / "deploy.yaml")]
    assert main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    print("\n".join(out))
    assert out[:3] == ["missing Canary flagger.app/v1beta1 (install Flagger): used by flagger.yaml",
                       "missing ScaledObject keda.sh/v1alpha1 (install KEDA): used by keda.yaml",
                       "missing TriggerAuthentication keda.sh/v1alpha1 (install KEDA): used by keda.yaml"]
    assert len(out) == 4 and out[3].endswith("kinds the manifests use are served by the cluster")
    # once both are installed, nothing is missing
    full = tmp_path / "full.txt"
    recorded = API_RESOURCES.read_text()
    starts = [m.start() for m in re.finditer(r"\S+", recorded.splitlines()[0])]

    def row(*cells: str) -> str:  # aligned under the header, as kubectl prints it
        line = ""
        for start, cell in zip(starts, cells):
            line = line.ljust(start) + cell
        return line + "\n"

    full.write_text(recorded + row("canaries", "", "flagger.app/v1beta1", "true", "Canary", "get,list", "all")
                    + row("scaledobjects", "so", "keda.sh/v1alpha1", "true", "ScaledObject", "get,list", "")
                    + row("triggerauthentications", "ta", "keda.sh/v1alpha1", "true", "TriggerAuthentication", "get"))
    argv[3] = str(full)
    assert main(argv) == 0


def test_preflight_refuses_a_file_that_is_not_api_resources(tmp_path, capsys):
    bad = tmp_path / "pods.txt"
    bad.write_text("NAME   READY   STATUS\nweb-0   1/1   Running\n")
    assert main(["deploy", "preflight", "--api-resources", str(bad)]) != 0
    assert "kubectl api-resources -o wide" in capsys.readouterr().err


TAILWATCH_IMAGE = "registry.example/tailwatch"


def _tailwatch_containers(objects) -> list[tuple[dict, dict]]:
    """(workload, container) for tailwatch's own StatefulSets and Deployment."""
    return [(w, c) for w in of_kind(objects, "StatefulSet") + of_kind(objects, "Deployment")
            for c in w["spec"]["template"]["spec"]["containers"] if c["image"].startswith(TAILWATCH_IMAGE)]


def test_credentials_are_read_from_secret_templates_only(tmp_path):
    """Tokens and Kafka settings come from Secrets the manifests template (in each namespace
    that reads them): no credential in a ConfigMap or a plain env value, and the Kafka file
    says where the brokers are."""
    validators = Validators()
    objects = generate(tmp_path)
    templates = objects["secrets.yaml"]
    assert [p for o in templates for p in validators.errors(o)] == []
    held = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["stringData"] for o in templates}
    assert {k: sorted(v) for k, v in held.items()} == {
        ("monitoring", "tailwatch-api-tokens"): ["argo", "flagger", "keda", "prometheus"],
        ("monitoring", "tailwatch-kafka"): ["kafka.properties"],
        ("serving", "tailwatch-api-tokens"): ["argo", "keda"],
        ("speech", "tailwatch-api-tokens"): ["keda"]}
    assert all(v == "" for k, data in held.items() if k[1] == "tailwatch-api-tokens" for v in data.values())
    properties = held["monitoring", "tailwatch-kafka"]["kafka.properties"]
    assert "bootstrap.servers=kafka-0.kafka:9092,kafka-1.kafka:9092\n" in properties
    # Every reference to a Secret, from any object, resolves to a template's key in its namespace.
    refs = []
    for o in every(objects):
        text = yaml.safe_dump(o)
        for m in re.finditer(r"secretKeyRef:\n\s+key: (\S+)\n\s+name: (\S+)", text):
            refs.append((o["metadata"]["namespace"], m.group(2), m.group(1)))
    refs += [(a["metadata"]["namespace"], t["name"], t["key"]) for a in of_kind(objects, "TriggerAuthentication")
             for t in a["spec"]["secretTargetRef"]]
    refs += [(m["metadata"]["namespace"], e["authorization"]["credentials"]["name"],
              e["authorization"]["credentials"]["key"]) for m in of_kind(objects, "ServiceMonitor")
             for e in m["spec"]["endpoints"]]
    assert len(refs) > 12 and all(key in held[ns, name] for ns, name, key in refs), refs
    containers = _tailwatch_containers(objects)
    assert len(containers) == 3
    for workload, c in containers:
        # every variable is read from the pod (its name) or a Secret: none carries a value
        assert all("value" not in e and "valueFrom" in e for e in c["env"]), c["env"]
        assert "--bootstrap-servers" not in c["args"]
        kafka = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == "kafka")
        assert kafka == {"name": "kafka", "secret": {"secretName": "tailwatch-kafka"}}
        config = c["args"][c["args"].index("--kafka-config") + 1]
        assert config == f"{next(m['mountPath'] for m in c['volumeMounts'] if m['name'] == 'kafka')}/kafka.properties"
    config_maps = yaml.safe_dump(of_kind(objects, "ConfigMap"))
    assert not re.search(r"sasl\.|password|ssl\.key|bootstrap\.servers", config_maps)
    api = yaml.safe_load(next(o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"] == "tailwatch-config")
                         ["data"]["api.yaml"])
    assert all(set(t) == {"name", "env", "tenants"} for t in api["tokens"])  # a variable's name, never a token


def test_existing_secrets_are_referenced_and_not_templated(tmp_path, capsys, monkeypatch):
    objects = generate(tmp_path / "kafka", "existing_secrets: [tailwatch-kafka]\n")
    assert {o["metadata"]["name"] for o in objects["secrets.yaml"]} == {"tailwatch-api-tokens"}
    assert all(any(v.get("secret", {}).get("secretName") == "tailwatch-kafka"
                   for v in w["spec"]["template"]["spec"]["volumes"]) for w, _c in _tailwatch_containers(objects))
    both = generate(tmp_path / "both", "existing_secrets: [tailwatch-kafka, tailwatch-api-tokens]\n")
    assert "secrets.yaml" not in both and "secrets.yaml" not in both["kustomization.yaml"][0]["resources"]
    assert not of_kind(both, "Secret")
    # the command names what to fill in and what to create
    monkeypatch.setenv(FLAGGER_TOKEN_ENV, "t")
    (tmp_path / "d.yaml").write_text(SETTINGS + "existing_secrets: [tailwatch-kafka]\n")
    assert main(["deploy", "generate", "--settings", str(tmp_path / "d.yaml"), "--out", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    assert "create these Secrets first: monitoring/tailwatch-kafka (kafka.properties)" in out
    assert "fill in secrets.yaml" in out and "serving/tailwatch-api-tokens (keda, argo)" in out
    # a name that is none of the Secrets the manifests read is a typo, refused
    (tmp_path / "typo.yaml").write_text("existing_secrets: [tailwatch-kafak]\n")
    assert main(["deploy", "generate", "--settings", str(tmp_path / "typo.yaml"), "--out", str(tmp_path / "t")]) == 2
    assert "tailwatch-kafak" in capsys.readouterr().err


def _pod_as_the_kubelet_lays_it_out(objects, tmp_path, bootstrap: str, port: int) -> tuple[list[str], dict]:
    """The tier-1 container's (args, environment): each mount a local folder of the files the
    kubelet would put there (the ConfigMap's, the Kafka Secret template's with `bootstrap`),
    the tokens the template's values (empty until filled in)."""
    workload, container = next((w, c) for w, c in _tailwatch_containers(objects)
                               if w["metadata"]["name"].endswith("tier1"))
    held = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["stringData"] for o in objects["secrets.yaml"]}
    config_map = next(o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"] == "tailwatch-config")
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    mounted = {}
    for m in container["volumeMounts"]:
        local = tmp_path / "pod" / m["name"]
        local.mkdir(parents=True)
        mounted[m["mountPath"]] = str(local)
        source = volumes[m["name"]]
        files = {}
        if "configMap" in source:
            files = config_map["data"]
        elif "secret" in source:
            files = dict(held["monitoring", source["secret"]["secretName"]])
            files["kafka.properties"] = re.sub(r"(?m)^bootstrap\.servers=.*$", f"bootstrap.servers={bootstrap}",
                                               files["kafka.properties"])
        for name, text in files.items():
            (local / name).write_text(text)
    args = []
    for a in container["args"]:
        path = next((p for p in mounted if a.startswith(p + "/")), None)
        a = a.replace(path, mounted[path], 1) if path else a
        args.append(a.replace("$(POD_NAME)", "tailwatch-tier1-0"))
    args[args.index("--http-port") + 1] = str(port)
    args[args.index("--http-host") + 1] = "127.0.0.1"
    args[args.index("--topic-prefix") + 1] = f"s{uuid.uuid4().hex[:8]}."
    env = {e["name"]: held["monitoring", ref["name"]][ref["key"]] for e in container["env"]
           if (ref := e["valueFrom"].get("secretKeyRef"))}
    return args, env


def test_a_worker_started_from_the_manifests_reads_kafka_from_the_secret_file(broker, tmp_path):
    """The tier-1 container started for real from the generated manifests, its mounts laid out
    as the kubelet would: with the tokens filled in it finds Kafka from the Secret's file alone;
    with the template's empty tokens it stops, naming the variable, rather than answer
    without authentication."""
    objects = generate(tmp_path)
    port = free_port()
    args, tokens = _pod_as_the_kubelet_lays_it_out(objects, tmp_path, broker.bootstrap, port)
    assert tokens and all(v == "" for v in tokens.values())
    cwd = Path(__file__).resolve().parents[1]
    unfilled = subprocess.run([sys.executable, "-m", "tailwatch", *args], capture_output=True, text=True,
                              env={**os.environ, **tokens}, cwd=cwd, timeout=120)
    assert unfilled.returncode != 0 and "TAILWATCH_TOKEN_" in unfilled.stderr, unfilled.stderr[-2000:]
    filled = {name: f"token-{name.lower()}" for name in tokens}
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tailwatch", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **filled}, cwd=cwd)
    try:
        deadline, healthy = time.time() + 60, False
        while time.time() < deadline and proc.poll() is None and not healthy:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                    healthy = resp.status == 200
            except OSError:
                time.sleep(0.3)
        assert healthy, log.read_text()[-2000:]
        time.sleep(1)
        text = log.read_text()
        print(text.splitlines()[0] if text else "")
        assert broker.bootstrap in text and "127.0.0.1:9092" not in text, text[-2000:]
    finally:
        proc.terminate()
        proc.wait(30)


def test_kafka_config_bootstrap_servers_counts_without_the_flag(tmp_path):
    from tailwatch.ingest.kafka import DEFAULT_BOOTSTRAP
    from tailwatch.cli import build_parser, kafka_settings

    properties = tmp_path / "kafka.properties"
    properties.write_text("bootstrap.servers=kafka-0.kafka:9093\nsecurity.protocol=SASL_SSL\n")
    from_file = kafka_settings(build_parser().parse_args(["worker", "--kafka-config", str(properties)]))
    assert from_file.bootstrap_servers == "kafka-0.kafka:9093"
    assert from_file.client_config == {"security.protocol": "SASL_SSL"}
    flag = kafka_settings(build_parser().parse_args(["worker", "--kafka-config", str(properties),
                                                     "--bootstrap-servers", "other:9092"]))
    assert flag.bootstrap_servers == "other:9092" and flag.base_config()["bootstrap.servers"] == "other:9092"
    assert kafka_settings(build_parser().parse_args(["worker"])).bootstrap_servers == DEFAULT_BOOTSTRAP
