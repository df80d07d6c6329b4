"""Read positions the log no longer has: when a partition's log was reset under the worker,
and what the worker then says and records.

A Kafka log is reset under a reader when the cluster loses its data (the embedded broker
keeps it in memory only, so a restart empties every topic and offsets start again at 0),
when a topic is deleted and created again (a new topic id, offsets from 0), or when
retention deletes records a stopped worker had not read yet. Its stored read position is
then past the partition's end, before its start, or an offset of a log that no longer
exists. Reading on from it would skip, without a word, every record of the new log below it.

The decision is pure (no Kafka, no clock): `judge` compares a stored position with the log's
start and end and the topic's id. The policy (streams/source.py carries it out) is to read
the partition again from its start, so that every record published after the reset is
counted (events already counted are duplicates by `event_id` and count once), and to mark the
gap with a dead letter of reason `log_reset` naming what was lost: records between the
stored position and the log's start, or whatever the old log held past the position.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailwatch.ingest import deadletter

LOG_RESET = "log_reset"  # the dead-letter reason that marks a gap in what a partition's log held

# Why a stored position is not in the log any more (the counter's `reason` label: a closed set).
PAST_END = "past_end"  # the log ends before it: the log was emptied and began again
BEFORE_START = "before_start"  # retention deleted records that were never read
TOPIC_RECREATED = "topic_recreated"  # the topic's id changed: the log it pointed into is gone
REASONS = (PAST_END, BEFORE_START, TOPIC_RECREATED)


@dataclass(frozen=True)
class LogReset:
    """One partition whose stored read position the log no longer has."""

    topic: str
    partition: int
    stored_offset: int  # where the worker would have read on
    log_start_offset: int  # the log as the cluster has it now (-1: not known)
    log_end_offset: int
    reason: str  # one of REASONS

    def line(self) -> str:
        """The one log line that says so."""
        what = {PAST_END: "is past the log's end", BEFORE_START: "is before the log's start",
                TOPIC_RECREATED: "points into a log that is gone: the topic was created again (its id changed)"}
        return (f"{self.topic} partition {self.partition}: the stored read position {self.stored_offset:,} "
                f"{what[self.reason]} (the log now holds {_offsets(self)}); reading the partition again "
                "from its start and marking the gap with a dead letter (reason log_reset)")

    def dead_letter(self, kafka_ts_ms: int) -> deadletter.DeadLetter:
        """The gap's mark: where it was (topic, partition, the stored position) and why."""
        detail = (f"{self.reason}: stored read position {self.stored_offset}, the log holds {_offsets(self)}; "
                  "records the old log held from this position on, and any before the log's start, were not read")
        return deadletter.make(self.topic, self.partition, self.stored_offset, LOG_RESET, detail, None, kafka_ts_ms)


def _offsets(r: LogReset) -> str:
    if r.log_end_offset < 0:
        return "offsets not known yet"
    start = max(r.log_start_offset, 0)
    if r.log_end_offset > start:
        return f"offsets {start:,} to {r.log_end_offset - 1:,}"
    return f"no record, next offset {r.log_end_offset:,}"


def judge(topic: str, partition: int, stored_offset: int, log_start_offset: int, log_end_offset: int,
          known_topic_id: str | None = None, topic_id: str | None = None) -> LogReset | None:
    """Whether `stored_offset` is a position the log still has. Offsets below 0 mean not known
    (a partition not fetched yet), topic ids None mean not known: nothing is decided on what
    is not known. A position 0 is never past anything: reading from the start skips nothing."""
    if stored_offset <= 0:
        return None
    if known_topic_id is not None and topic_id is not None and topic_id != known_topic_id:
        return LogReset(topic, partition, stored_offset, log_start_offset, log_end_offset, TOPIC_RECREATED)
    if log_end_offset >= 0 and stored_offset > log_end_offset:
        return LogReset(topic, partition, stored_offset, log_start_offset, log_end_offset, PAST_END)
    if log_start_offset > 0 and log_end_offset >= 0 and stored_offset < log_start_offset:
        return LogReset(topic, partition, stored_offset, log_start_offset, log_end_offset, BEFORE_START)
    return None
