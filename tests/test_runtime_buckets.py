"""A latency threshold strictly inside a bucket of a runtime's default histogram (vLLM's first
token: 1 s and 2.5 s around the default 1.2 s SLO) is named, with its bounds, by `slo check`
and by the worker at start: for a scraped fleet that SLI counts the whole bucket bad."""

from __future__ import annotations

import subprocess
import sys

from tailwatch.slo.runtime_buckets import split_buckets
from tailwatch.slo.spec import DEFAULT_SLOS, load_slos, spec_warnings


def test_the_default_first_token_threshold_is_named_with_vllms_bounds_around_it():
    specs = {s.name: s for s in load_slos(DEFAULT_SLOS)}
    (warning,) = [w for w in spec_warnings(specs["llm-realtime-first-token"])]
    assert "1.2 s" in warning and "bounds 1 s and 2.5 s" in warning and "vllm:time_to_first_token_seconds" in warning
    # A threshold on a bound is exact; vLLM serves no ASR, so an ASR threshold is not judged against it.
    assert split_buckets("first_output_ms", 1000.0, "llm") == []
    assert [(b.lower_ms, b.upper_ms) for b in split_buckets("first_output_ms", 1200.0, "llm")] == [(1000.0, 2500.0)]
    assert spec_warnings(specs["asr-realtime-first-partial"]) == []
    assert spec_warnings(specs["llm-realtime-inter-token"]) == []  # 200 ms is one of vLLM's bounds


def test_slo_check_and_the_worker_at_start_say_so(kafka, tmp_path):
    check = subprocess.run([sys.executable, "-m", "tailwatch", "slo", "check", str(DEFAULT_SLOS)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "llm-realtime-first-token: its threshold 1.2 s falls between" in check.stdout
    # The worker says it right after its start line (a worker that cannot start says why in one line).
    worker = subprocess.run([sys.executable, "-m", "tailwatch", "worker", "--bootstrap-servers", kafka.bootstrap_servers,
                             "--topic-prefix", kafka.topic_prefix, "--store", str(tmp_path / "tw.duckdb"),
                             "--http-port", "0", "--until-idle", "1"], capture_output=True, text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr
    lines = worker.stderr.splitlines()
    started = next(i for i, line in enumerate(lines) if line.startswith("tailwatch worker: started: "))
    warned = [line for line in lines[started + 1:started + 3] if line.startswith("tailwatch worker: warning: ")]
    assert any("llm-realtime-first-token" in w and "1 s and 2.5 s" in w for w in warned)
    assert any("asr-wer, window page-fast" in w for w in warned)
