"""`deploy generate` writes what a platform team applies in one step: the Collector workload
with its discovery RBAC, dcgm-exporter's counters where the GPU Operator mounts them, the
team's labels on every object, one paging path; and `deploy preflight` names the kinds a
cluster lacks, from its `kubectl api-resources -o wide` output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tailwatch.deploy.generate import FLAGGER_TOKEN_ENV, write
from tailwatch.deploy.settings import load_settings
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tailwatch.cli import main
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
