"""One writer per store (streams/writer_lock.py, streams/standby.py): a worker whose store
has a writer never opens it, serves its port as a standby (its own health and metrics, the
signal API forwarded, 503 while no writer answers), and writes once the writer is gone.
The two-tier SIGKILL test (tests/test_tiers.py) shows a takeover mid-stream on a public trace.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from streams.worker import Worker, WorkerSettings
from streams.writer_lock import StoreWriterLock
from tests.conftest import free_port
from tests.test_signal_api import get


def _standing_by(port: int, thread: threading.Thread) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and thread.is_alive():
        try:
            return get(port, "/healthz")[1]
        except OSError:
            time.sleep(0.1)
    pytest.fail("the second worker serves no /healthz")


@pytest.mark.broker
def test_a_second_worker_on_a_store_stands_by_answers_503_without_a_writer_and_takes_over(kafka, tmp_path):
    path = tmp_path / "tw.duckdb"
    held = StoreWriterLock(path)
    assert held.try_acquire()
    held.advertise(f"http://127.0.0.1:{free_port()}")  # a writer whose port is down (dying, say)
    port = free_port()
    w = Worker(WorkerSettings(kafka=kafka, store_path=str(path), http_port=port, until_idle_s=1.0,
                              checkpoint_interval_s=0.2, group_id=f"g-{uuid.uuid4().hex[:6]}"))
    codes = []
    t = threading.Thread(target=lambda: codes.append(w.run()), daemon=True)
    t.start()
    health = _standing_by(port, t)
    assert health["role"] == "standby" and health["writer_pid"] == os.getpid() and health["partitions_owned"] == 0
    status, answer = get(port, "/v1/slos")
    assert status == 503 and "does not answer" in answer["error"]
    held.advertise(None)
    assert get(port, "/readyz")[0] == 503
    assert w.metrics.store_writer._value.get() == 0
    time.sleep(1.0)
    assert not path.exists() and t.is_alive()  # a standby never opens the store

    held.release()  # the writer ends: the standby writes
    t.join(60)
    assert codes == [0] and path.exists() and w.metrics.store_writer._value.get() == 1
    assert StoreWriterLock(path).writer() is None  # it let the store go on its way out
    assert StoreWriterLock(path).try_acquire()


@pytest.mark.broker
def test_a_standby_stopped_before_the_writer_ends_exits_without_touching_the_store(kafka, tmp_path):
    path = tmp_path / "tw.duckdb"
    held = StoreWriterLock(path)
    assert held.try_acquire()
    w = Worker(WorkerSettings(kafka=kafka, store_path=str(path), http_port=None, group_id=f"g-{uuid.uuid4().hex[:6]}"))
    codes = []
    t = threading.Thread(target=lambda: codes.append(w.run()), daemon=True)
    t.start()
    time.sleep(1.5)
    w.stop()  # SIGTERM's handler
    t.join(10)
    assert codes == [0] and not path.exists()
    assert held.held and StoreWriterLock(path).writer().pid == os.getpid()  # the writer's lock and name stand
