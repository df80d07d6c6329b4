"""Runbook links that resolve: every runbook a page, dashboard or report names is a file the
package installs (what the image holds), the worker serves each over its real HTTP port,
and a worker's pages default to that port."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tailwatch import runbooks
from tailwatch.alerts.alertmanager import LOCAL_RUNBOOK_BASE_URL, detector_runbook
from tailwatch.detectors.config import DETECTOR_NAMES
from tailwatch.reports.readiness import RUNBOOKS
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos
from tests.conftest import free_port, worker_command

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"runbooks/([a-z0-9-]+\.md)")
PACKAGES = ["alerts", "dashboards", "detectors", "reports", "signals", "slo", "streams"]


def linked_runbooks() -> set[str]:
    """Every runbook name the tool's code and built-in SLOs write into a link."""
    names = {detector_runbook(d).removeprefix("runbooks/") for d in DETECTOR_NAMES}
    names |= {path.removeprefix("runbooks/") for _title, path in RUNBOOKS}
    names |= {spec.runbook.removeprefix("runbooks/") for spec in load_slos(DEFAULT_SLOS)}
    for package in PACKAGES:
        folder = ROOT / "tailwatch" / package
        for source in folder.rglob("*.py"):
            names |= set(LINK.findall(source.read_text()))
        for data in folder.rglob("*.yaml"):
            names |= set(LINK.findall(data.read_text()))
    names.discard("detector-.md")  # the pattern `runbooks/detector-<detector>.md` in a panel's text
    return names


@pytest.mark.slow
def test_every_runbook_link_the_tool_writes_is_a_file_the_package_installs(tmp_path):
    # setuptools' own build of the packages, as `pip install .` in the image runs it
    built = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "egg_info",
                            "--egg-base", str(tmp_path), "build_py", "--build-lib", str(tmp_path / "lib")],
                           cwd=ROOT, check=True, capture_output=True, text=True)
    assert "absent from the `packages` configuration" not in built.stderr, built.stderr[-2000:]
    lib = tmp_path / "lib" / "tailwatch"
    assert all((lib / d).is_dir() for d in ("slo/catalogs", "slo/examples", "reports/templates"))
    installed = {p.name for p in (lib / "runbooks").glob("*.md")}
    linked = linked_runbooks()
    assert len(linked) >= 15 and {"slo-burn.md", "slo-no-data.md", "detector-queue-age.md"} <= linked
    assert linked <= installed, sorted(linked - installed)
    assert set(runbooks.names()) == installed
    # the default base for commands other than the worker: this installation's own copy
    assert all(Path(LOCAL_RUNBOOK_BASE_URL.removeprefix("file://"), "runbooks", n).is_file() for n in linked)


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def test_the_worker_serves_every_runbook_and_its_pages_link_there(broker, tmp_path):
    from tailwatch.cli import build_parser
    from tailwatch.commands import _worker_settings

    port = free_port()
    argv = worker_command(broker.bootstrap, f"t{uuid.uuid4().hex[:8]}.", tmp_path / "store.duckdb", port,
                          "--slos", "none")[3:]  # from `worker` on
    # where the worker's pages point, with no --runbook-url: its own HTTP port
    links = _worker_settings(build_parser().parse_args(argv)).alert_links
    assert links.runbook("runbooks/slo-burn.md") == f"http://127.0.0.1:{port}/runbooks/slo-burn.md"
    worker = subprocess.Popen([sys.executable, "-m", "tailwatch", *argv], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                _get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                time.sleep(0.3)
        for name in sorted(linked_runbooks()):
            status, kind, body = _get(links.runbook(f"runbooks/{name}"))
            assert status == 200 and kind.startswith("text/markdown"), (name, status, body[:200])
            assert body == (ROOT / "tailwatch" / "runbooks" / name).read_text()
        for missing in ("no-such.md", "..%2Fpyproject.toml", "slo-burn.txt", "%2Fetc%2Fpasswd"):
            status, _kind, body = _get(f"http://127.0.0.1:{port}/runbooks/{missing}")
            assert status in (400, 404) and "root" not in body and "[project]" not in body, (missing, status, body[:200])
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_deployed_pages_link_to_the_service_that_serves_the_runbooks():
    from tailwatch.deploy.settings import DeploySettings
    from tailwatch.deploy.workloads import api_url, tier2

    s = DeploySettings(namespace="obs", name="tw")
    args = tier2(s)["spec"]["template"]["spec"]["containers"][0]["args"]
    base = args[args.index("--runbook-url") + 1]
    assert base == "http://tw.obs.svc:8000/" and base.startswith(api_url(s))


def test_data_files_in_folders_are_installed_as_packages_of_their_own():
    """setuptools warns at every install (30 lines each) of data files in a folder inside a
    package (`slo/catalogs/*.yaml` under `slo`): Python could import the folder, so it must be
    a listed package with its own data files."""
    import tomllib

    from setuptools import find_namespace_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(find_namespace_packages(str(ROOT), include=config["packages"]["find"]["include"]))  # pyproject finds namespaces
    for package, globs in config["package-data"].items():
        assert package in packages and not any("/" in g for g in globs), (package, globs)
        assert (ROOT / package.replace(".", "/")).is_dir(), package
    assert {"tailwatch.slo.catalogs", "tailwatch.slo.examples", "tailwatch.reports.templates"} <= packages
