"""The README's five-minute tour, run as a new user runs it: every command of its shell blocks,
as written, in a fresh working directory, with `.venv/bin` on PATH as `source
.venv/bin/activate` puts it there; and what each step must print.

`make demo` is the Makefile's `tailwatch demo` once the virtual environment exists (the test
run has it). The live part uses the README's own ports (the broker's 9092, the worker's 8000).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def tour_commands() -> list[str]:
    text = README.read_text()
    tour = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    commands = ["make demo"] if "`make demo`" in tour else []
    for block in re.findall(r"```sh\n(.*?)```", tour, re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


class Tour:
    def __init__(self, workdir: Path):
        self.cwd = workdir
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.env.pop("VIRTUAL_ENV", None)
        self.background: list[subprocess.Popen] = []
        self.out: dict[str, str] = {}

    def run(self, command: str, timeout: int = 300) -> str:
        argv = shlex.split(command)
        if command == "make demo":
            argv = ["tailwatch", "demo"]
        if argv[:2] == ["source", ".venv/bin/activate"]:
            self.env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{self.env['PATH']}"
            self.env["VIRTUAL_ENV"] = str(ROOT / ".venv")
            return ""
        if argv[0] == "curl":
            url = argv[-1] if argv[-1].startswith("http") else "http://" + argv[-1]
            status, body = _get(url)
            deadline = time.monotonic() + 90
            while status == 503 and b'"behind"' in body and time.monotonic() < deadline:
                # An answer whose input is still being read says so (503, "behind"), as a poller
                # sees right after a start; the tour polls on as KEDA would, the worker's reading
                # slower when the tests share the cores.
                time.sleep(1)
                status, body = _get(url)
            assert status == 200, (command, status, body[:500])
            return body.decode()
        if argv[0] == "tailwatch" and argv[1] in ("broker", "worker"):
            log = open(self.cwd / f"{argv[1]}.log", "wb")
            self.background.append(subprocess.Popen(argv, cwd=self.cwd, env=self._with_venv(), stdout=log,
                                                    stderr=subprocess.STDOUT))
            self._wait_up(argv[1])
            return ""
        done = subprocess.run(argv, cwd=self.cwd, env=self._with_venv(), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, (command, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    def _with_venv(self) -> dict[str, str]:
        # `make demo` runs .venv/bin/tailwatch itself, before the tour activates the venv.
        env = dict(self.env)
        if str(ROOT / ".venv" / "bin") not in env["PATH"].split(":"):
            env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"
        return env

    def _wait_up(self, what: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if what == "broker" and not _port_free(9092):
                return
            if what == "worker":
                status, body = _get("http://localhost:8000/readyz")
                if status == 200:
                    return
            assert all(p.poll() is None for p in self.background), (self.cwd / f"{what}.log").read_text()[-2000:]
            time.sleep(0.5)
        raise AssertionError(f"{what} did not come up: " + (self.cwd / f"{what}.log").read_text()[-2000:])

    def stop(self) -> None:
        for p in reversed(self.background):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.broker
@pytest.mark.timeout(900)
def test_the_readme_tour_runs_as_written_and_says_what_it_should(tmp_path):
    for port in (9092, 8000):
        if not _port_free(port):
            pytest.fail(f"the tour uses port {port}, which something else holds")
    commands = tour_commands()
    assert commands[0] == "make demo" and any(c.startswith("curl") for c in commands), commands
    tour = Tour(tmp_path)
    said: list[tuple[str, str]] = []
    try:
        for command in commands:
            said.append((command, tour.run(command)))
    finally:
        tour.stop()
    out = dict(said)

    # 1. The demo: pages, the canary's one story, the shedding advice, the hostile producer refused.
    demo = out["make demo"]
    assert "Pages raised by the default SLOs" in demo and "2026-11-02 " in demo
    assert "rollback by first_output from 2026-11-02 00:5" in demo and "first sufficient step: delay_batch" in demo
    dead = next(line for line in demo.splitlines() if line.startswith("dead letters by reason"))
    assert "too_deep 1" in dead and "future 1" in dead, dead
    assert (tmp_path / "data" / "tailwatch.duckdb").is_file()
    assert re.fullmatch(r"tailwatch \d+\.\d+\.\d+\n", out["tailwatch --version"])

    # 2. A page and its runbook: the alerts, the SLOs as they stood at a printed time, and the
    # runbook's own queries against the demo's store.
    alerts = next(o for c, o in said if c.startswith("tailwatch sql") and "FROM alerts" in c)
    assert "llm-realtime-first-token" in alerts
    status = next(o for c, o in said if c.startswith("tailwatch slo status --at"))
    assert status.startswith("as of 2026-11-02 01:21") and "llm-realtime-availability" in status
    for sql in re.findall(r'tailwatch sql "(.*?)"', (ROOT / "tailwatch" / "runbooks" / "slo-burn.md").read_text(), re.S):
        rows = tour.run(f"tailwatch sql {shlex.quote(' '.join(sql.split()))}")
        assert len(rows.strip().splitlines()) > 2, (sql, rows)  # a header, a rule, and rows: the demo's data

    # 3. The signal API, live.
    autoscale = json.loads(next(o for c, o in said if "/v1/autoscale/" in c))
    assert autoscale["pool"] == "llm-us-east-1a-realtime" and autoscale["desired_replicas"] >= 1
    rollout = json.loads(next(o for c, o in said if "/v1/rollout/" in c))
    assert rollout["verdict"] in ("promote", "continue", "pause", "rollback") and rollout["data_age_s"] >= 0
    assert "/v1/autoscale/{pool}" in next(o for c, o in said if "openapi.json" in c)

    # 4. The reports.
    assert (tmp_path / "data" / "reports" / "cost" / "report.html").is_file()
    readiness = next(o for c, o in said if c.startswith("tailwatch report readiness"))
    assert readiness.startswith("llama-3.1-70b: blocked") and "canary 2024-11: rollback by first_output" in readiness
