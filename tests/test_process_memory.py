"""The worker's memory by holder: the holders add up to the process's RSS, and memory taken
by each kind of allocation lands under the holder that names it."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tailwatch.store.connection import StoreSession
from tailwatch.streams.process_memory import HOLDERS, process_memory, rss_parts
from tailwatch.streams.state_size import state_bytes


def _rss() -> int:
    parts = rss_parts(Path("/proc/self/status").read_text())
    return parts["VmRSS"]


def test_the_holders_add_up_to_the_resident_set():
    held = process_memory()
    assert set(held) == set(HOLDERS)
    assert all(v >= 0 for v in held.values())
    rss = _rss()
    # Every resident page has one holder, and none is counted that is not resident (glibc's
    # own figures count trimmed and untouched heap too: after the suite's earlier tests its
    # free heap alone once read 374 MB in a process of 497); the two reads of /proc are
    # moments apart.
    assert abs(sum(held.values()) - rss) <= 8 << 20, (held, rss)


@pytest.mark.slow
def test_a_large_array_is_glibc_memory_in_use_and_leaves_with_it():
    before = process_memory()["malloc_in_use"]
    block = np.ones(40_000_000 // 8 * 8)  # 320 MB, touched
    during = process_memory()["malloc_in_use"]
    del block
    gc.collect()
    after = process_memory()["malloc_in_use"]
    assert during - before >= 300_000_000
    assert during - after >= 300_000_000


def test_the_store_cache_is_the_open_files_buffer_pool(tmp_path):
    session = StoreSession(tmp_path / "s.duckdb", release_every_s=3600)
    with session as con:
        con.execute("CREATE TABLE t AS SELECT random() AS x FROM range(2000000)")  # 16 MB that do not compress
        con.execute("SELECT sum(x) FROM t").fetchall()
    cached = session.cache_bytes()
    assert cached > 10_000_000
    assert process_memory(cached)["store_cache"] == cached
    session.close()
    assert session.cache_bytes() == 0


def test_state_counts_a_view_once_with_its_base():
    base = np.zeros(1_000_000, dtype=np.int64)
    parts = state_bytes({"a": {"column": base}, "b": [base[:10], base[5:]]})
    assert parts["a"] >= base.nbytes
    assert parts["b"] < 10_000  # views of an array counted by "a": only the list and view headers


_BATCH = """
import sys, numpy as np
from tailwatch.streams.process_memory import process_memory, settle_malloc
if sys.argv[1] == "settled":
    assert settle_malloc()
big = np.ones(24 << 17)  # 24 MiB
del big  # glibc's default now serves blocks up to 24 MiB from its heap and keeps up to 48 MiB free
block = np.ones(16 << 17)  # 16 MiB: a batch's column
del block
print(process_memory()["malloc_free"])
"""


def _free_after_a_batch(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _BATCH, mode], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    return int(out.stdout.strip())


def test_a_settled_heap_gives_a_freed_batch_back_to_the_kernel():
    """With glibc's defaults a batch-sized block, once a larger one has been freed, comes
    from the heap and stays there free; settled, it comes from the kernel and goes back."""
    assert _free_after_a_batch("default") >= 15 << 20
    assert _free_after_a_batch("settled") < 1 << 20


_FRAGMENTED = """
import json
from pathlib import Path
from tailwatch.streams.process_memory import process_memory, rss_parts, settle_malloc, trim_heap
settle_malloc()
blocks = [bytearray(4000) for _ in range(40_000)]  # 160 MB of heap, every page touched
kept = blocks[::8]  # one block in eight stays in use: the heap cannot shrink from its top
del blocks
before = process_memory(), rss_parts(Path("/proc/self/status").read_text())["VmRSS"]
trimmed = trim_heap()
after = process_memory(trimmed=trimmed), rss_parts(Path("/proc/self/status").read_text())["VmRSS"]
print(json.dumps([trimmed, before, after]))
"""


def test_a_trim_gives_back_the_free_pages_between_blocks_in_use_and_the_holders_still_add_up():
    """Free chunks between live blocks are what no threshold returns: a trim gives their whole
    pages back, and the free heap then counts only what can still be resident."""
    out = subprocess.run([sys.executable, "-c", _FRAGMENTED], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    trimmed, (held_before, rss_before), (held_after, rss_after) = json.loads(out.stdout)
    assert trimmed
    assert held_before["malloc_free"] >= 100 << 20  # 140 MB free, resident, before
    assert rss_before - rss_after >= 100 << 20
    assert held_after["malloc_free"] <= 48 << 20  # glibc still counts 134 MB free
    assert abs(sum(held_after.values()) - rss_after) <= 8 << 20, (held_after, rss_after)
    assert held_after["other_anonymous"] <= held_before["other_anonymous"] + (8 << 20)
