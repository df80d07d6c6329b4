"""Hooks the development tools (the tailwatch-dev distribution) lend the runtime, found by
name in the `tailwatch.dev` entry-point group.

The runtime never imports the development tools: where it can use one of their functions
(the embedded broker's wedged-group rescue, the public-trace backtest), it asks for it here
by name and goes without when only the runtime is installed, as in the container image.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Callable

GROUP = "tailwatch.dev"
CONSUMER_CONFIG = "consumer_config"  # (bootstrap, client config) -> consumer settings the cluster's answers need | None
GROUP_RESCUE = "group_rescue"  # (bootstrap, client config, group, topics, own member id) -> what was done | None
BACKTEST_TRACE = "backtest_trace"  # `backtest autoscale --trace`: (trace, week, rate_scale, startup_minutes, format) -> exit code


@cache
def dev_hook(name: str) -> Callable[..., Any] | None:
    """The development tools' function named `name`, or None when they are not installed."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP, name=name):
        return ep.load()
    return None
