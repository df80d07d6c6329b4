"""librdkafka's log, through Python's logging, with its repeats folded.

With a broker down, librdkafka logs a failed connection for every attempt: measured on the
embedded broker, one consumer wrote 19 lines a second for as long as the outage lasted
(1,158 in a minute, all the same but for a number). A worker's own lines drown in that, and
a long outage fills the disk that holds the log. Every Kafka client tailwatch makes logs to
`KAFKA_LOG` (`KafkaSettings.base_config`), which lets the first line of each kind through
and then one per `REPEAT_WINDOW_S`, saying how many like it it folded.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable

REPEAT_WINDOW_S = 60.0
MAX_KINDS = 1_000  # kinds remembered at once (a kind is its text without numbers: few in practice)
_NUMBERS = re.compile(r"\d+")
# librdkafka folds some repeats itself and says so inside the line: the same kind of line, with
# that many more like it.
_SUPPRESSED = re.compile(r", (\d+) identical error\(s\) suppressed")


class RepeatFold(logging.Filter):
    """The first record of each kind (its text, numbers aside), then at most one a window."""

    def __init__(self, window_s: Callable[[], float] = lambda: REPEAT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._kinds: dict[str, list] = {}  # kind → [when its last record was let through, folded since]

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        suppressed = _SUPPRESSED.search(text)
        kind = _NUMBERS.sub("#", _SUPPRESSED.sub("", text))
        now = self.clock()
        seen = self._kinds.get(kind)
        window_s = self.window_s()
        if seen is not None and now - seen[0] < window_s:
            seen[1] += 1 + (int(suppressed.group(1)) if suppressed else 0)
            return False
        if seen is None and len(self._kinds) >= MAX_KINDS:
            self._kinds.clear()
        folded = seen[1] if seen is not None else 0
        self._kinds[kind] = [now, 0]
        if folded:
            record.msg, record.args = f"{text} ({folded:,} more like it in the last {now - seen[0]:,.0f} s)", ()
        return True


KAFKA_LOG = logging.getLogger("tailwatch.kafka")
# librdkafka decides what to log (its `debug` property included): nothing it sends is held back
# for its level, only for being a repeat.
KAFKA_LOG.setLevel(logging.DEBUG)
KAFKA_LOG.addFilter(RepeatFold())
