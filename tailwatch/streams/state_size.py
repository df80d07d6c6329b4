"""How much memory each part of a worker holds, by name, so that growth has one.

`state_bytes(parts)` walks each part's objects once (arrays by their buffers, polars frames
by their estimated size, everything else by `sys.getsizeof`), counting an object shared by
two parts for the first that reaches it. An estimate of what the state holds, not of the
process's RSS (allocator slack, libraries and the interpreter are not in it); walking is
proportional to the objects held, so the runtime does it seldom.
"""

from __future__ import annotations

import sys
import threading
import types

import numpy as np
import polars as pl

# Not state: code, synchronisation and handles to the outside (and a class that says it is one,
# `OUTSIDE_STATE = True`: the topics in memory a test runs a worker on stand for a broker).
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           threading.Thread, type(threading.Lock()), type(threading.Event()))


def state_bytes(parts: dict[str, object]) -> dict[str, int]:
    """Bytes held by each named part (in order: a part later in the dict does not count
    what an earlier one holds)."""
    seen: set[int] = set()
    return {name: _walk(obj, seen) for name, obj in parts.items()}


def _walk(root: object, seen: set[int]) -> int:
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE) or obj is None or getattr(type(obj), "OUTSIDE_STATE", False):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            total += obj.nbytes if obj.base is None else 0  # a view's buffer belongs to its base
            if obj.base is not None:
                stack.append(obj.base)
            continue
        if isinstance(obj, (pl.DataFrame, pl.Series)):
            total += int(obj.estimated_size())
            continue
        if isinstance(obj, (str, bytes, bytearray, int, float, bool)):
            total += sys.getsizeof(obj)
            continue
        if type(obj).__module__.split(".")[0] in ("duckdb", "confluent_kafka", "prometheus_client", "socket",
                                                   "subprocess", "asyncio", "logging"):
            continue
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            if hasattr(obj, "__dict__"):
                stack.append(vars(obj))
            for slot in getattr(type(obj), "__slots__", ()):
                stack.append(getattr(obj, slot, None))
    return total
