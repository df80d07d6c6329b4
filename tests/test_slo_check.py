"""Writing an SLO: `slo check` lists every problem at once and echoes what it understood;
a selector that matches no data is named by `slo check --store`, the worker and `slo status`."""

import subprocess
import sys
import pytest

from tailwatch.slo.unmatched import UnmatchedSelectors
from tailwatch.slo.spec import load_slos

SIX_MISTAKES = """
slos:
  - name: a
    runbook: runbooks/nope.md
    objective: 99%
    sli: {latency: {field: first_output_ms, threshold: 300}}
    selector: {workload: llm, colour: red}
  - {name: b, sli: {availability: {}}, objective: 100%, no_data_afer: 5m, min_events: zero}
"""

TWO = """
slos:
  - name: llm-avail
    objective: 99%
    sli: {availability: {}}
    slice_by: [zone]
    selector: {workload: llm}
  - name: typo-avail
    selector: {model: no-such-model}
    sli: {availability: {}}
    objective: 99.5%
"""


def tw(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tailwatch", *args], capture_output=True, text=True, timeout=timeout)


def test_six_mistakes_in_two_slos_are_all_reported_in_one_run(tmp_path):
    path = tmp_path / "slos.yaml"
    path.write_text(SIX_MISTAKES)
    r = tw("slo", "check", str(path))
    assert r.returncode == 1
    problems = [line.split(": ", 1)[1] for line in r.stderr.splitlines() if not line.endswith(" problems")]
    assert len(problems) == 6, r.stderr
    for place in ("slos[0].selector.colour", "slos[0].sli.latency.threshold", "slos[0].runbook: runbooks/nope.md",
                  "slos[1]: unknown field `no_data_afer`", "slos[1].min_events", "slos[1].objective: 100%"):
        assert any(p.startswith(place) for p in problems), (place, problems)
    assert [p[:7] for p in problems] == ["slos[0]"] * 3 + ["slos[1]"] * 3  # each SLO's problems together
    assert r.stderr.splitlines()[-1].endswith("6 problems")


@pytest.mark.slow
def test_a_runbook_beside_the_slo_file_or_packaged_is_found(tmp_path):
    (tmp_path / "runbooks").mkdir()
    (tmp_path / "runbooks" / "ours.md").write_text("# ours\n")
    path = tmp_path / "slos.yaml"
    path.write_text(TWO.replace("slice_by: [zone]", "slice_by: [zone]\n    runbook: runbooks/ours.md"))
    r = tw("slo", "check", str(path))
    assert r.returncode == 0, r.stderr  # the second SLO keeps the packaged runbooks/slo-burn.md
    path.write_text(TWO.replace("slice_by: [zone]", "slice_by: [zone]\n    runbook: runbooks/theirs.md"))
    r = tw("slo", "check", str(path))
    assert r.returncode == 1 and "slos[0].runbook: runbooks/theirs.md (SLO llm-avail) does not exist" in r.stderr


def test_check_echoes_what_it_understood_of_each_slo(tmp_path):
    path = tmp_path / "slos.yaml"
    path.write_text(TWO)
    r = tw("slo", "check", str(path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "llm-avail: availability, objective 99%, rolling 30d" in lines
    assert "    slices by: zone; selector: workload=llm" in lines
    assert "typo-avail: availability, objective 99.5%, rolling 30d" in lines
    # The 30-day catalog's fast page: 2% of the budget in 1 h is a burn rate of 14.4.
    assert "    alert page-fast (page): burn rate >= 14.4 over 1h and 5m (0.02 of the budget)" in lines, lines


def test_an_slo_that_matches_nothing_is_named_after_minutes_with_other_slos_data(tmp_path):
    import polars as pl
    from datetime import datetime, timedelta

    path = tmp_path / "slos.yaml"
    path.write_text(TWO)
    specs = load_slos(path)
    watch = UnmatchedSelectors(specs, after_minutes=3)
    start = datetime(2026, 11, 2)

    def minute(i, model="llama"):
        return pl.DataFrame({"window_start": [start + timedelta(minutes=i)], "workload": ["llm"], "model": [model]})

    assert watch.observe(minute(0)) == [] and watch.observe(minute(1)) == []
    (warning,) = watch.observe(minute(2))
    assert warning.startswith("SLO typo-avail: selector {model=no-such-model} matched no data in 3 closed minutes")
    assert watch.observe(minute(3)) == []  # once
    again = UnmatchedSelectors(specs, after_minutes=3)
    assert again.observe(minute(0)) == [] and again.observe(minute(1, "no-such-model")) == []
    assert again.matched["typo-avail"] and again.observe(minute(2)) == [] and again.observe(minute(3)) == []


def test_the_worker_exposes_whether_each_selector_matched(tmp_path):
    from datetime import datetime

    import polars as pl

    from tailwatch.conventions import SLO_SELECTOR_MATCHED
    from tailwatch.streams.slo_stage import SloStage

    path = tmp_path / "slos.yaml"
    path.write_text(TWO)
    stage = SloStage(load_slos(path))
    row = {"window_start": [datetime(2026, 11, 2)], "workload": ["llm"], "model": ["llama"], "zone": ["a"]}

    def gauge():
        (family,) = [f for f in stage.collector.collect() if f.name == SLO_SELECTOR_MATCHED]
        return {s.labels["slo"]: s.value for s in family.samples}

    assert gauge() == {"llm-avail": 0.0, "typo-avail": 0.0}
    stage.unmatched.observe(pl.DataFrame(row))
    assert gauge() == {"llm-avail": 1.0, "typo-avail": 0.0}
    stage.unmatched.observe(pl.DataFrame({**row, "model": ["no-such-model"]}))
    assert gauge() == {"llm-avail": 1.0, "typo-avail": 1.0}


def test_a_selector_matching_nothing_is_warned_of_by_worker_check_and_status(kafka, tmp_path):
    slos = tmp_path / "slos.yaml"
    slos.write_text(TWO)
    events = tmp_path / "events.jsonl"
    r = tw("simulate", "--scenario", "quiet", "--minutes", "8", "--rate-scale", "0.05", "--out", str(events))
    assert r.returncode == 0, r.stderr
    common = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", kafka.topic_prefix]
    assert tw("produce", str(events), *common).returncode == 0
    store = tmp_path / "s.duckdb"
    r = tw("worker", "--store", str(store), "--slos", str(slos), "--until-idle", "2", "--http-port", "0", *common)
    assert r.returncode == 0, r.stderr[-2000:]
    warned = [line for line in r.stderr.splitlines() if "typo-avail" in line]
    assert len(warned) == 1 and "selector {model=no-such-model} matched no data" in warned[0], r.stderr[-3000:]
    assert "llm-avail" not in r.stderr

    r = tw("slo", "check", str(slos), "--store", str(store))
    assert r.returncode == 0, r.stderr  # a warning, not a problem
    assert "warning: typo-avail: selector {model=no-such-model} matched no data in s.duckdb (0 of its" in r.stdout
    assert "llm-avail" not in r.stderr

    r = tw("slo", "status", "--slos", str(slos), "--store", str(store))
    assert r.returncode == 0, r.stderr
    assert "typo-avail: selector {model=no-such-model} matched no data in the store" in r.stdout
    assert "llm-avail: selector" not in r.stdout
