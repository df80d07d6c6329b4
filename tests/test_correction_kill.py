"""SIGKILL a real worker process while it corrects closed minutes with a late backlog, restart
it, and get the store an unkilled run makes.

A correction merges late events into rows already written, records their dedupe hashes and
moves the offsets in one DuckDB transaction: wherever the kill lands, the restarted worker
neither loses a late event nor merges one twice. The backlog is placed after the on-time
traffic in the same partition, so every run reads it late, whatever its timing: requests
from a public trace (Azure LLM inference, tests/data/azure-llm-2023).
"""

import os
import signal
import subprocess
import time

import duckdb
import msgspec
import pytest

from tests.conftest import free_port
from tests.test_faults import produce
from tests.test_late_backlog import SILENT, trace_requests
from tests.test_sigkill import _metric_values, worker_cmd

ORDER = "window_start, tenant, model, model_version, zone, workload, traffic_class, deployment, pool, language, voice"


def corrected(port: int) -> float | None:
    values = _metric_values(port, "tailwatch_corrected_events_total")
    return sum(values) if values else None


@pytest.mark.slow
def test_sigkill_during_corrections_gives_the_unkilled_store(kafka, tmp_path):
    events, _, silent_zone, minute_of = trace_requests()
    enc = msgspec.json.Encoder()
    late = [e for e in events if e.zone == silent_zone and minute_of(e) >= SILENT[0]]
    on_time = [e for e in events if not (e.zone == silent_zone and minute_of(e) >= SILENT[0])]
    produce(kafka, [(0, enc.encode(e)) for e in on_time + late])
    late_beyond_lateness = sum(1 for e in late if minute_of(e) < 40 - 3)

    reference = tmp_path / "reference.duckdb"
    subprocess.run(worker_cmd(kafka, reference, "ref", free_port()), check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    con = duckdb.connect(str(reference), read_only=True)
    assert con.execute("SELECT count(*) FROM dead_letter").fetchone()[0] == 0
    assert con.execute("SELECT sum(requests) FROM sli_minute").fetchone()[0] == len(events)
    con.close()

    killed = tmp_path / "killed.duckdb"
    kills_while_correcting = 0
    for fraction in (0.1, 0.4, 0.7):  # of the late events: each run goes on from the last kill's checkpoint
        port = free_port()
        proc = subprocess.Popen(worker_cmd(kafka, killed, "victim", port, until_idle="30"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        seen = 0.0
        while time.time() < deadline and proc.poll() is None:
            seen = corrected(port) or seen
            if seen >= fraction * late_beyond_lateness / 3:  # this run's own count
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the worker finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills_while_correcting += seen > 0
    assert kills_while_correcting >= 2, "the kills did not land while the worker was correcting"
    subprocess.run(worker_cmd(kafka, killed, "victim", free_port()), check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    con = duckdb.connect()
    con.execute(f"ATTACH '{reference}' AS ref (READ_ONLY)")
    con.execute(f"ATTACH '{killed}' AS got (READ_ONLY)")
    assert con.execute("SELECT count(*) FROM got.dead_letter").fetchone()[0] == 0
    for a, b in (("ref", "got"), ("got", "ref")):
        diff = con.execute(f"SELECT count(*) FROM (SELECT * FROM {a}.sli_minute EXCEPT ALL "
                           f"SELECT * FROM {b}.sli_minute)").fetchone()[0]
        assert diff == 0, f"sli_minute: {diff} rows of {a} are not in {b}"
    assert con.execute("SELECT sum(requests) FROM got.sli_minute").fetchone()[0] == len(events)
    dup = con.execute(f"SELECT count(*) FROM (SELECT {ORDER}, count(*) c FROM got.sli_minute "
                      "GROUP BY ALL HAVING c > 1)").fetchone()[0]
    assert dup == 0
