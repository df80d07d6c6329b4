"""The command line as a user meets it: one-line errors, determinism, the trace replay."""

import hashlib
import json
import re
import subprocess
import sys

import duckdb
import pytest

from tests.conftest import AZURE_TRACE, MOONCAKE_TRACE, free_port, need


def tw(*args, input_bytes=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "tailwatch", *args], capture_output=True, timeout=timeout, input=input_bytes)


def one_line_error(result, code=2):
    err = result.stderr.decode().strip()
    assert result.returncode == code, err
    assert "Traceback" not in err
    return err


@pytest.mark.slow
def test_no_broker_says_how_to_start_one(tmp_path):
    port = free_port()
    r = tw("produce", str(tmp_path / "x.jsonl"), "--bootstrap-servers", f"127.0.0.1:{port}")
    assert "no such file" in one_line_error(r)
    (tmp_path / "x.jsonl").write_text("{}\n")
    r = tw("worker", "--bootstrap-servers", f"127.0.0.1:{port}", "--store", str(tmp_path / "s.duckdb"))
    err = one_line_error(r)
    assert len(err.splitlines()) == 1 and f"127.0.0.1:{port}" in err  # the SLO file's notes come once it started


def test_default_broker_hint_names_tailwatch_broker(monkeypatch):
    from tailwatch.ingest.kafka import KafkaSettings, KafkaUnavailable, ensure_reachable
    import tailwatch.ingest.kafka as k

    monkeypatch.setattr(k, "DEFAULT_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    with pytest.raises(KafkaUnavailable, match="tailwatch broker"):
        ensure_reachable(KafkaSettings(bootstrap_servers=k.DEFAULT_BOOTSTRAP))


@pytest.mark.slow
def test_bad_flags_and_config_are_one_line(tmp_path):
    r = tw("worker", "--until-idle", "soon")
    assert r.returncode == 2 and "not a duration" in r.stderr.decode()
    bad = tmp_path / "kafka.properties"
    bad.write_text("security.protocol SASL_SSL\n")
    r = tw("simulate", "--minutes", "1", "--kafka-config", str(bad))
    assert "expected key=value" in one_line_error(r)
    r = tw("simulate", "--scenario", "nope", "--minutes", "1", "--out", str(tmp_path / "e.jsonl"))
    assert "unknown scenario" in one_line_error(r)
    r = tw("sql", "SELECT 1", "--store", str(tmp_path / "missing.duckdb"))
    assert "no store at" in one_line_error(r)


@pytest.mark.slow
def test_collect_gpu_without_a_driver_exits_2_with_one_line():
    r = tw("collect", "gpu", "--print", "--count", "1")
    if r.returncode == 0:
        pytest.skip("an NVIDIA driver is present: the real collector ran")
    err = one_line_error(r)
    assert "no NVIDIA driver" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_simulator_is_deterministic_for_a_seed_and_writes_truth(tmp_path):
    outs = []
    for name in ("a", "b", "c"):
        seed = "5" if name != "c" else "6"
        r = tw("simulate", "--minutes", "3", "--seed", seed, "--out", str(tmp_path / f"{name}.jsonl"),
               "--truth", str(tmp_path / f"{name}.truth"))
        assert r.returncode == 0, r.stderr
        outs.append(hashlib.sha256((tmp_path / f"{name}.jsonl").read_bytes()).hexdigest())
    assert outs[0] == outs[1] != outs[2]
    r = tw("simulate", "--minutes", "120", "--out", str(tmp_path / "full.jsonl"), "--truth", str(tmp_path / "t.jsonl"))
    truth = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert {t["kind"] for t in truth} == {"error_spike", "latency_regression", "retry_storm", "queue_saturation"}
    assert all(t["start"] < t["end"] for t in truth)


def test_trace_replay_keeps_arrivals_and_token_counts(tmp_path):
    need(AZURE_TRACE.is_file(), f"the Azure LLM trace at {AZURE_TRACE}")
    out = tmp_path / "trace.jsonl"
    r = tw("simulate", "--trace", str(AZURE_TRACE), "--minutes", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in out.read_text().splitlines()]
    import csv
    from datetime import datetime

    rows = sorted(csv.DictReader(AZURE_TRACE.open(encoding="utf-8-sig")), key=lambda r: r["TIMESTAMP"][:23])
    t0 = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])
    first5 = [r for r in rows if (datetime.fromisoformat(r["TIMESTAMP"][:26]) - t0).total_seconds() < 300]
    assert len(events) == len(first5)
    assert [e["prompt_tokens"] for e in events] == [int(r["ContextTokens"]) for r in first5]
    gaps = [e["ts"] - events[0]["ts"] for e in events]
    assert gaps == sorted(gaps) and gaps[-1] < 300_000
    assert all(e["schema"] == "request.v1" and e["workload"] == "llm" for e in events)


def test_produce_and_sql_round_trip(kafka, tmp_path):
    src = tmp_path / "events.jsonl"
    r = tw("simulate", "--scenario", "quiet", "--minutes", "3", "--rate-scale", "0.1", "--out", str(src))
    assert r.returncode == 0
    lines = src.read_bytes().splitlines()
    lines.insert(3, b'{"schema": "request.v1", "event_id": "x"}')
    lines.insert(5, b"garbage")
    src.write_bytes(b"\n".join(lines) + b"\n")
    common = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", kafka.topic_prefix]
    r = tw("produce", str(src), *common)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    assert "rejected 1: missing_field" in out and "rejected 1: unknown_schema" in out
    store = tmp_path / "s.duckdb"
    r = tw("worker", "--store", str(store), "--until-idle", "6", "--http-port", "0", *common)
    assert r.returncode == 0, r.stderr
    # The worker says where it reads, writes and serves (the port it got for --http-port 0),
    # a status line only when something changed, and why it stopped.
    err = r.stderr.decode().splitlines()
    start = next(line for line in err if line.startswith("tailwatch worker: started: "))
    assert kafka.bootstrap_servers in start and f"store {store}" in start and "SLOs from the built-in set" in start
    port = int(re.search(r"HTTP on http://127\.0\.0\.1:(\d+)", start).group(1))
    assert port > 0
    assert err[-1].startswith("tailwatch worker: stopped (drained): ") and f"store {store}" in err[-1]
    status = [line for line in err if line.startswith("worker: ")]
    assert status and all(a != b for a, b in zip(status, status[1:]))  # never the same line twice running
    assert len(status) <= 6, status  # a 6 s idle tail prints nothing new
    r = tw("sql", "SELECT count(DISTINCT window_start) AS minutes FROM sli_minute", "--store", str(store), "--format", "json")
    assert json.loads(r.stdout) == {"minutes": 3}
    r = tw("sql", "SELECT nope FROM sli_minute", "--store", str(store))
    assert "nope" in one_line_error(r)
    n_good = len(lines) - 2
    con = duckdb.connect(str(store), read_only=True)
    got = con.execute("SELECT (SELECT sum(requests) FROM sli_minute) + (SELECT sum(samples) FROM gpu_minute)").fetchone()[0]
    assert got == n_good


@pytest.mark.broker  # starts an embedded broker of its own
@pytest.mark.slow
def test_the_demo_runs_end_to_end_with_every_stage(tmp_path):
    """The README's first command, shortened: broker, simulator, worker with its stages, summary."""
    store = tmp_path / "demo.duckdb"
    out = subprocess.run([sys.executable, "-m", "tailwatch", "demo", "--minutes", "112", "--store", str(store),
                          "--port", str(free_port())], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Pages raised by the default SLOs" in out.stdout
    detections = out.stdout.split("Detections", 1)[1].split("GET /v1/autoscale", 1)[0]
    # The ASR retry storm at 01:10 (3 attempts per failure), not the zone-b LLM error spike at
    # 00:30: one retry per failure there makes a retry ratio of 0.08-0.14, whose lower
    # confidence bound never clears 0.1 (an error spike, paged by the SLOs, not a storm).
    storm = [line for line in detections.splitlines() if line.startswith("retry_storm")]
    assert storm and "us-east-1c" in storm[0] and "asr" in storm[0] and "2026-11-02 01:10" in storm[0], detections
    assert "GET /v1/autoscale/{pool}" in out.stdout and "llm-us-east-1a-realtime" in out.stdout
    # Reasons are whole sentences, not cut mid-word.
    reasons = [line for line in out.stdout.split("GET /v1/autoscale", 1)[1].split("GET /v1/rollout", 1)[0].splitlines()
               if line.startswith("  ")]
    assert len(reasons) >= 12 and all("target utilisation" in r for r in reasons if "demand" in r), reasons
    # The slow canary (first output 3x from 00:55): one story, the worst verdict with its metric
    # and when, and the verdict at the end, as `backtest rollout` and the readiness report tell it.
    canary = next(line for line in out.stdout.splitlines() if line.startswith("  llama-3.1-70b 2024-11:"))
    assert "rollback by first_output " in canary and "2026-11-02 00:5" in canary, canary
    # Batch jobs flood llm-us-east-1a-realtime from 01:35: the shed advice at its worst minute
    # says to delay them first.
    shed = out.stdout.split("GET /v1/shed/{pool}", 1)[1]
    assert "llm-us-east-1a-realtime at 2026-11-02 01:" in shed and "first sufficient step: delay_batch" in shed, shed
    # What the demo tells the user to run next works as printed.
    nxt = next(line for line in out.stdout.splitlines() if line.startswith("next: "))
    assert "tailwatch sql" in nxt
    check_readiness_on_the_demo_store(store, tmp_path, canary)


@pytest.mark.broker  # starts an embedded broker of its own
@pytest.mark.slow
def test_the_demo_with_two_tier1_workers_and_the_store_writer_prints_what_one_worker_prints(tmp_path):
    """`demo --workers 2`: two tier-1 processes share the firehose, the tier-2
    writer lands their partials; every SLI, page, detection and signal equals one worker's."""
    runs = {}
    for workers in (1, 2):
        out = subprocess.run([sys.executable, "-m", "tailwatch", "demo", "--minutes", "30", "--workers", str(workers),
                              "--store", str(tmp_path / f"w{workers}" / "demo.duckdb"), "--port", str(free_port())],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[workers] = out
    summary = [out.stdout.split("SLIs per workload", 1)[1].split("\nstore:", 1)[0] for out in runs.values()]
    assert "Pages raised" in summary[0] and summary[0] == summary[1]
    split = [int(n.replace(",", "")) for n in re.findall(r"tier-1 worker \d: ([\d,]+) records read", runs[2].stderr)]
    seen = int(re.findall(r"worker: ([\d,]+) records read", runs[1].stderr)[-1].replace(",", ""))
    # Both shared the log (a worker that takes partitions over in a rebalance re-reads from
    # their resume points, so together they may read more than the log holds).
    assert len(split) == 2 and min(split) > 0 and sum(split) >= seen, runs[2].stderr[-2000:]


def check_readiness_on_the_demo_store(store, tmp_path, demo_canary_line: str):
    """The report blocks on the canary that was rolled back (first output 3x from 00:55), told
    as the demo tells it, and flags the pool that saturated; a model the store never saw is one
    line listing the ones it has."""
    out_dir = tmp_path / "readiness"
    r = subprocess.run([sys.executable, "-m", "tailwatch", "report", "readiness", "--model", "llama-3.1-70b",
                        "--store", str(store), "--out", str(out_dir)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((out_dir / "readiness.json").read_text())
    assert report["verdict"] == "blocked"
    canary = {c["version"]: c for c in report["canaries"]}["2024-11"]
    assert canary["worst verdict"] == "rollback" and canary["minutes"] > 10 and canary["decided by"] == "first_output"
    blocker = next(f["what"] for f in report["findings"] if f["severity"] == "blocker" and f["what"].startswith("canary 2024-11"))
    assert blocker == "canary 2024-11: " + demo_canary_line.split(": ", 1)[1], (blocker, demo_canary_line)
    assert [p["pool"] for p in report["saturated_pools"]] == ["llm-us-east-1a-realtime"]
    assert "01:35" in report["saturated_pools"][0]["when"]
    assert {v["model_version"] for v in report["contract"]["versions"]} == {"2024-07", "2024-11"}
    assert report["contract"]["gpu_skus"] == ["H100"] and report["latency"][0]["inter-token p50 ms"] > 0
    assert any(m.startswith("cold start") for m in report["not_measured"])
    page = (out_dir / "readiness.html").read_text()
    assert "Verdict: blocked" in page and page.count("data:image/png;base64,") == 2 and "Saturated pools" in page
    # Units a person reads, dashboards as absolute links from --grafana-url.
    assert "68719476736" not in page and "GiB" in page and "href='http://grafana.local/d/" in page
    # The same cost per successful turn as the cost report, each labelled.
    cost = subprocess.run([sys.executable, "-m", "tailwatch", "report", "cost", "--store", str(store), "--out",
                           str(tmp_path / "cost")], capture_output=True, text=True, timeout=300)
    assert cost.returncode == 0, cost.stderr[-2000:]
    import polars as pl
    rows = pl.read_csv(tmp_path / "cost" / "cost.csv").filter(pl.col("model") == "llama-3.1-70b")
    fully_loaded = rows["fully_loaded_cost_usd"].sum() / rows["successful_turns"].sum()
    mine = report["cost"][0]
    assert mine["version"] == "all" and mine["basis"].startswith("fully loaded"), mine
    assert abs(mine["cost per successful turn USD"] - fully_loaded) < 1e-9, (mine, fully_loaded)
    unknown = subprocess.run([sys.executable, "-m", "tailwatch", "report", "readiness", "--model", "no-such-model",
                              "--store", str(store), "--out", str(tmp_path / "none")], capture_output=True, text=True)
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    assert "known: duplex-s2s-1, llama-3.1-70b" in unknown.stderr and not (tmp_path / "none").exists()


@pytest.mark.broker  # starts an embedded broker of its own
@pytest.mark.slow
def test_bench_shapes_replay_a_public_trace_through_every_stage():
    """The shape bench on traffic nobody here generated (the Mooncake trace, its first
    trace-hour at its own pace): every request reaches the worker, minutes close, and the
    cost per closed minute is split by stage. Numbers are printed, not asserted."""
    mooncake = MOONCAKE_TRACE
    need(mooncake.is_file(), f"the public trace {mooncake.name} in tests/data")
    r = subprocess.run([sys.executable, "-m", "tailwatch", "bench", "--shape", "sparse", "--trace", str(mooncake),
                        "--hours", "1", "--skip-baseline"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    print(r.stdout)
    first_hour = r.stdout.splitlines()[0]
    assert "12,031 requests in its first hour" in first_hour, r.stdout
    shape = next(line for line in r.stdout.splitlines() if line.startswith("sparse:"))
    assert shape.startswith("sparse: 12,031 events over 59 event-minutes"), shape
    per_minute = next(line for line in r.stdout.splitlines() if "per closed minute" in line)
    for stage in ("detectors", "slo", "checkpoint_write", "fleet_metrics", "signals_view"):
        assert f"{stage} " in per_minute, per_minute


def _leaf_parsers():
    import argparse

    from tailwatch.cli import build_parser

    def walk(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield " ".join(path), parser
        for a in subs:
            for name, child in a.choices.items():
                yield from walk(child, (*path, name))

    return list(walk(build_parser(), ()))


def test_every_command_has_examples_and_every_option_its_help_and_default():
    import argparse

    leaves = _leaf_parsers()
    assert len(leaves) >= 29
    for path, parser in leaves:
        text = parser.format_help()
        examples = text.split("examples:\n", 1)[-1] if "examples:\n" in text else ""
        assert f"  tailwatch {path}" in examples, f"`tailwatch {path} --help` has no example"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"tailwatch {path}: {action.option_strings or action.dest} has no help"
            if action.option_strings and action.default not in (None, False):
                said = parser._get_formatter()._get_help_string(action)
                assert "default" in said, f"tailwatch {path}: {action.option_strings} does not say its default"
    # Every example parses as written (up to a comment or a redirection).
    import shlex

    from tailwatch.cli import all_examples, build_parser

    for path, lines in all_examples().items():
        for line in lines:
            words = shlex.split(line.split("#")[0].split(">")[0])
            assert words[0] == "tailwatch" and " ".join(words[1:]).startswith(path), line
            build_parser().parse_args(words[1:])
    # The default shows in the help text itself, once.
    sql = dict(leaves)["sql"].format_help()
    assert "output format (default: table)" in " ".join(sql.split())


def test_a_mistyped_command_gets_the_nearest_one():
    r = tw("slo", "stauts")
    err = one_line_error(r)
    assert "did you mean 'status'?" in err and len(err.splitlines()) == 1
    assert "did you mean 'worker'?" in one_line_error(tw("wroker"))
    assert "did you mean" not in one_line_error(tw("zzzzzz"))


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`tailwatch … | head -2`: no BrokenPipeError traceback, the exit a Unix tool gives."""
    proc = subprocess.Popen([sys.executable, "-m", "tailwatch", "simulate", "--minutes", "30", "--out", "/dev/stdout"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err
    assert all(line.startswith(b"{") for line in first)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_plan_stages_takes_format_like_every_other_command():
    from tailwatch.cli import build_parser

    assert build_parser().parse_args(["plan", "stages", "--format", "json"]).format == "json"
    assert build_parser().parse_args(["plan", "stages", "--json"]).format == "json"  # the old spelling still works
    assert "--json" not in dict(_leaf_parsers())["plan stages"].format_help()


def test_a_port_in_use_names_the_flag_that_changes_it(kafka, tmp_path):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        r = tw("worker", "--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", kafka.topic_prefix,
               "--store", str(tmp_path / "s.duckdb"), "--http-port", str(port), "--until-idle", "1s")
    finally:
        taken.close()
    err = one_line_error(r)
    assert f"127.0.0.1:{port} is in use" in err and "--http-port 0" in err


def test_helps_point_at_the_page_that_documents_the_topic():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "tailwatch" / "cli.py").read_text()
    assert "README)" not in text  # flags' topics live in docs/configuration.md, which names each section
    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    sections = re.findall(r"docs/configuration\.md, '([^']+)'", text)
    assert len(sections) >= 2
    for section in sections:
        assert f"## {section}" in doc, section
