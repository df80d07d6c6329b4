"""Generated Prometheus rules: promtool checks them, and promtool's unit tests (built from
the stream engine's own answers on the same series) cross-check engine and Prometheus."""

import shutil
import subprocess
import sys

import pytest
import yaml

from tailwatch.alerts.rules import engine_firing, default_scenario
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tests.conftest import need

PROMTOOL = shutil.which("promtool")

# promtool checks and unit-tests the generated rules: minutes of CPU on two cores.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    need(PROMTOOL is not None, "promtool (Debian package prometheus)")
    out = tmp_path_factory.mktemp("rules")
    r = subprocess.run([sys.executable, "-m", "tailwatch", "rules", "generate", "--out", str(out)], capture_output=True)
    assert r.returncode == 0, r.stderr
    return out


def test_generated_rules_pass_promtool_check(generated):
    files = sorted(generated.glob("*.rules.yml"))
    assert len(files) == len(load_slos(DEFAULT_SLOS))
    r = subprocess.run([PROMTOOL, "check", "rules", *map(str, files)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_engine_and_prometheus_fire_and_resolve_together(generated):
    tests = sorted(generated.glob("*.test.yml"))
    r = subprocess.run([PROMTOOL, "test", "rules", *[t.name for t in tests]], capture_output=True, text=True,
                       cwd=generated)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    # The scenario exercises every pair: a fast burn pages, a slow burn tickets, and all recover.
    (spec,) = [s for s in load_slos(DEFAULT_SLOS) if s.name == "llm-realtime-availability"]
    good, bad = [], []
    for p in default_scenario(spec):
        good += [p.valid - p.bad] * p.minutes
        bad += [p.bad] * p.minutes
    firing = engine_firing(spec, {}, good, bad)
    seen = set().union(*firing)
    assert seen == {w.name for w in spec.alert_windows} and firing[-1] == set()


def test_the_cross_check_can_fail(generated, tmp_path):
    """A rule file with a wrong factor must fail the engine-derived promtool test."""
    name = "llm-realtime-availability"
    rules = yaml.safe_load((generated / f"{name}.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("labels", {}).get("window") == "page-fast":
                rule["expr"] = rule["expr"].replace("> 0.072", "> 0.1")  # 14.4x → 20x for a 99.5% SLO
    (tmp_path / f"{name}.rules.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(generated / f"{name}.test.yml", tmp_path)
    r = subprocess.run([PROMTOOL, "test", "rules", f"{name}.test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 and "FAILED" in (r.stdout + r.stderr)


def test_the_tenant_quota_example_tickets_and_never_pages(tmp_path):
    """The quota SLO's rules pass promtool and its unit test; it has ticket windows only."""
    need(PROMTOOL is not None, "promtool (Debian package prometheus)")
    example = DEFAULT_SLOS.parent / "examples" / "tenant-quota.yaml"
    (spec,) = load_slos(example)
    assert spec.sli_kind == "quota_admission" and {w.severity for w in spec.alert_windows} == {"ticket"}
    r = subprocess.run([sys.executable, "-m", "tailwatch", "rules", "generate", "--slos", str(example), "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rules = yaml.safe_load((tmp_path / f"{spec.name}.rules.yml").read_text())
    alerts = [rule for g in rules["groups"] for rule in g["rules"] if "alert" in rule]
    assert alerts and all(a["labels"]["severity"] != "page" for a in alerts)
    r = subprocess.run([PROMTOOL, "test", "rules", f"{spec.name}.test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_prometheus_counts_undecided_events_as_the_engine_does(generated, tmp_path):
    """Undecided events (a scraped bucket straddling the threshold) come as their own outcome:
    the generated rules fire on proven bad events only, and promtool agrees with the engine
    minute by minute on a fleet whose every event is undecided, then one that is proven slow."""
    from tailwatch.alerts.rules import Stretch, promtool_test

    (spec,) = [s for s in load_slos(DEFAULT_SLOS) if s.name == "llm-realtime-first-token"]
    stretches = [Stretch(60, 1000, 0), Stretch(120, 1000, 0, undecided=1000),
                 Stretch(30, 1000, 600, undecided=400), Stretch(420, 1000, 0, undecided=1000)]
    good, bad, undecided = [], [], []
    for p in stretches:
        good += [p.valid - p.bad - p.undecided] * p.minutes
        bad += [p.bad] * p.minutes
        undecided += [p.undecided] * p.minutes
    firing = engine_firing(spec, {}, good, bad, undecided=undecided)
    assert set().union(*firing[:180]) == set()  # two hours of nothing but undecided events: no alert
    assert "page-fast" in set().union(*firing[180:210])  # 60% proven bad pages
    shutil.copy(generated / f"{spec.name}.rules.yml", tmp_path)
    (tmp_path / "undecided.test.yml").write_text(yaml.safe_dump(promtool_test(spec, f"{spec.name}.rules.yml", stretches)))
    r = subprocess.run([PROMTOOL, "test", "rules", "undecided.test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
