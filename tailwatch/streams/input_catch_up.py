"""Whether each input topic is caught up, for readiness and for the answers that read it.

Summed over topics, a worker's lag can be within one batch while one input has not been
read at all: a few thousand GPU samples behind a drained request backlog are "one batch",
and a pool's answer built then has requests and no replicas. So each input is judged on its
own: caught up the first time every partition of it that the worker owns has been read to
its end, and from then on while it stays within one batch of its end (a topic fed without
pause is rarely at its very end when looked at). An input not caught up within the
staleness bound is behind. Pure: the runtime passes what the source says and the time.
"""

from __future__ import annotations


class InputCatchUp:
    """When each input topic was last caught up (wall seconds)."""

    def __init__(self, topics: list[str], batch_size: int):
        self.topics = list(topics)
        self.batch_size = batch_size
        self.caught_up_wall_s: dict[str, float] = {}
        self.lag_messages: dict[str, int] = {t: 0 for t in self.topics}

    def observe(self, owned: dict[str, set[int]], read_to_end: dict[str, set[int]],
                lag: dict[tuple[str, int], int], lag_known: bool, wall_s: float) -> None:
        for topic in self.topics:
            parts = owned.get(topic, set())
            behind = sum(lag.get((topic, part), 0) for part in parts)
            self.lag_messages[topic] = behind
            if not parts:
                continue
            at_end = parts <= read_to_end.get(topic, set())
            within_a_batch = lag_known and topic in self.caught_up_wall_s and behind <= self.batch_size
            if at_end or within_a_batch:
                self.caught_up_wall_s[topic] = wall_s

    def behind(self, owned: dict[str, set[int]], wall_s: float, bound_s: float) -> dict[str, str]:
        """Input topic → why it is not caught up; empty when every one is."""
        out = {}
        for topic in self.topics:
            lag = self.lag_messages.get(topic, 0)
            last = self.caught_up_wall_s.get(topic)
            if not owned.get(topic):
                out[topic] = "this worker owns none of its partitions"
            elif last is None:
                out[topic] = f"not read to its end yet ({lag:,} messages behind)"
            elif wall_s - last > bound_s:
                out[topic] = f"{lag:,} messages behind; last caught up {wall_s - last:.0f} s ago (bound {bound_s:.0f} s)"
        return out
