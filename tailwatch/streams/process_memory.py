"""The worker process's resident memory by holder, so that growth outside its state has a name.

`streams/state_size.py` counts what the worker's own objects hold; this splits the process's
RSS as the kernel and the C allocator see it:

- `file`: pages mapped from files (the interpreter's and the libraries' code), shared memory;
- `malloc_in_use` and `malloc_free`: glibc's heap, what its callers hold and what it keeps
  free for reuse (fragmentation shows here). librdkafka's fetch buffers and the prefetch
  queue, numpy's arrays and Python's large objects come from it;
- `store_cache`: the store's buffer pool (DuckDB's own accounting, while the worker has the
  file open; DuckDB allocates it with its bundled jemalloc);
- `other_anonymous`: the rest of the anonymous memory: Python's small-object arenas, the
  allocators bundled with polars and DuckDB (jemalloc) and Arrow (mimalloc), thread stacks.

Reading it costs a /proc read and one pass over glibc's arenas (well under a millisecond);
the runtime does it when it measures its state. On a system without glibc (musl) the two
malloc figures are absent and their bytes count as `other_anonymous`.

`settle_malloc()` sets glibc's heap up for a process that lives for months: measured on
`tailwatch bench --month`, glibc's default held 170-300 MiB free between batches, rising and
falling by a hundred MiB within an event-day (`malloc_free`), because its mmap threshold
grows with every large block freed until batch-sized arrays come from the heap and fragment
it, and each thread gets an arena of its own. With the settings below it held 20-41 MiB free
through a month of the same traffic; a 1 MiB threshold held about as little but cost a tenth
of the sparse replay's CPU, 4 MiB none.

`trim_heap()` gives the kernel the whole free pages inside glibc's heap, which no threshold
returns: the free chunks between blocks still in use. On the ten-million-event memory run
glibc counted 420-430 MiB free from 2.5 M events on while the state stayed flat; trimmed when
more than `TRIM_ABOVE_BYTES` is free, as the runtime does, the run's RSS was 34-128 MiB lower
at each mark (a trim of 115 MiB in 5,000 chunks takes 13 ms). After a
trim glibc still counts the released pages as free, so `process_memory(trimmed=True)`
bounds the free heap by what can still be resident: at most two pages a free chunk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

HOLDERS = ("file", "malloc_in_use", "malloc_free", "store_cache", "other_anonymous")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def _mallinfo2():
    fn = getattr(_LIBC, "mallinfo2", None)  # glibc 2.33 and later
    if fn is None:
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


_MALLINFO2 = _mallinfo2()


# mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_PAGE_BYTES = 4096
TRIM_ABOVE_BYTES = 32 << 20  # free heap worth a trim: the pages it re-faults cost less than they hold


def settle_malloc() -> bool:
    """Blocks of 4 MiB and more straight from the kernel and back to it when freed (a fixed
    threshold: glibc stops raising it), free heap tops over 4 MiB returned, at most two arenas
    (librdkafka's threads would each grow one). Called once, early, by the worker; False where
    the C library is not glibc."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, 4 << 20), (_M_TRIM_THRESHOLD, 4 << 20), (_M_ARENA_MAX, 2)))


def free_heap_bytes() -> int | None:
    """Bytes glibc's heap holds free (resident or given back page by page); None without glibc."""
    return None if _MALLINFO2 is None else _MALLINFO2().fordblks


def trim_heap() -> bool:
    """malloc_trim(0): every whole free page of every arena back to the kernel (the chunks
    stay free in glibc's bins; touching them again faults fresh zero pages in). False where
    the C library is not glibc."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is None or _MALLINFO2 is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


def rss_parts(status_text: str) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and RssShmem from /proc/<pid>/status, in bytes."""
    out = {}
    for line in status_text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem", "VmRSS"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def process_memory(store_cache_bytes: int = 0, trimmed: bool = False) -> dict[str, int]:
    """This process's RSS by holder (HOLDERS, in bytes); `store_cache_bytes` from the store's
    own accounting (store.cache_bytes), 0 while the file is let go. `trimmed`: the heap was
    trimmed just before, so a free chunk holds at most its first and last page."""
    try:
        rss = rss_parts(Path("/proc/self/status").read_text())
    except OSError:
        return {}
    anonymous = rss.get("RssAnon", 0)
    out = {"file": rss.get("RssFile", 0) + rss.get("RssShmem", 0)}
    left = max(0, anonymous - store_cache_bytes)
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        # glibc counts as its own heap pages that are not resident: free chunks it has given
        # back page by page (a trim), blocks never yet touched. The holders are of the
        # resident set, so each takes at most what is left of the anonymous memory.
        out["malloc_in_use"] = min(info.uordblks + info.hblkhd, left)
        left -= out["malloc_in_use"]
        free = info.fordblks
        if trimmed:
            free = min(free, info.ordblks * 2 * _PAGE_BYTES + info.fsmblks)
        out["malloc_free"] = min(free, left)
        left -= out["malloc_free"]
    out["store_cache"] = store_cache_bytes
    out["other_anonymous"] = left
    return out
