"""A watcher of the consumer group for the embedded broker only: a worker that holds no
partition for a while sees whether the group is wedged on a departed leader (a bug of the
embedded broker) and frees it, through the development tools' `group_rescue` hook
(`tailwatch_dev.broker.group_rescue`, tailwatch.config.plugins).

The tier composition (streams/tiers.py) asks for the hook, as for every hook of the
development tools, and hands the watcher to the source as a tick watcher; where only the
runtime is installed there is no hook and no watcher. The source itself knows nothing of
it, so nothing on a real cluster's read path works around the embedded broker.
"""

from __future__ import annotations

import logging
from typing import Callable

from tailwatch.ingest.kafka import KafkaSettings

log = logging.getLogger("tailwatch.source")


class GroupRescue:
    RESCUE_AFTER_S = 15.0  # a rebalance takes a few seconds; three times the session timeout and more is not one

    def __init__(self, kafka: KafkaSettings, rescue: Callable[..., str | None],
                 on_rescued: Callable[[], None] = lambda: None):
        self.kafka = kafka
        self.rescue = rescue  # the hook: (bootstrap, client config, group, topics, own member id) -> what was done | None
        self.on_rescued = on_rescued
        self._last_rescue = 0.0

    def __call__(self, source, now: float) -> None:
        """From the source's tick (monotonic `now`)."""
        since = source.unassigned_since
        if not source.by_group or since is None or now - since < self.RESCUE_AFTER_S \
                or now - self._last_rescue < self.RESCUE_AFTER_S:
            return
        self._last_rescue = now
        done = self.rescue(self.kafka.bootstrap_servers, self.kafka.base_config(), source.group_id, source.topics,
                      source.consumer.memberid())
        if done:
            self.on_rescued()
            log.warning("%s", done)
