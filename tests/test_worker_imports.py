"""What a worker imports to start: nothing it needs only later. scipy (half a CPU-second for
scipy.stats) is loaded when an SLO burns with candidate slices, not at every start; the HTTP
server and its framework (uvicorn, Litestar) only in the HTTP process; httpx (with its
command line's click, rich and pygments) once a worker has an Alertmanager to page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_worker_starts_without_scipy_the_http_server_or_httpx():
    code = ("import sys\n"
            "import tailwatch.commands, tailwatch.streams.runtime, tailwatch.streams.slo_stage, "
            "tailwatch.streams.fleet_metrics, tailwatch.streams.detector_stage, tailwatch.streams.signal_stage, "
            "tailwatch.streams.http, tailwatch.streams.tiers, tailwatch.slo.contributors, tailwatch.signals.rollout\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'litestar', 'uvicorn', 'httpx', 'rich'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"
