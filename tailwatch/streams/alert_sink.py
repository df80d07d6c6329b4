"""The runtime's Alertmanager sink: the outboxes of the stages that page, delivered from the loop.

A stage's changes enter its outbox when the checkpoint holding them commits (the store
sink's `committed`); this sink hands them to their sender threads once the worker has
caught up after a start (what a restarted replica replays is the past, which the replicas
that kept up already paged), and puts the marks of what each Alertmanager took into every
checkpoint, so that a restart resends only what is past them.
"""

from __future__ import annotations

import time
from typing import Sequence

from tailwatch.alerts.alertmanager import DeliveryCollector, FiringAlerts
from tailwatch.store.checkpoint import Checkpoint
from tailwatch.streams.sink import Sink


class AlertSink(Sink):
    name = "alertmanager"

    def __init__(self, outboxes: Sequence[FiringAlerts]):
        self.outboxes = list(outboxes)

    def collectors(self) -> list:
        return [DeliveryCollector(self.outboxes)]

    def snapshot(self, cp: Checkpoint) -> None:
        for outbox in self.outboxes:
            cp.stage_rows.extend(outbox.delivery_rows())

    def tick(self, caught_up: bool) -> None:
        # Pages wait for the first catch-up after a start: their changes then reach
        # Alertmanager at once, in order, ending at the present (sent one by one, an alert
        # resolved meanwhile would fire again there).
        if caught_up:
            for outbox in self.outboxes:
                outbox.deliver()

    def drain(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        for outbox in self.outboxes:
            outbox.deliver(max(0.0, deadline - time.monotonic()))
