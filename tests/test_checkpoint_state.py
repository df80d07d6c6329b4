"""A checkpoint's offsets, watermarks, frontiers and label-cap state land as the upserts they
are (a value given replaces, one not given is kept, a new partition or topic gets a row),
though written as an UPDATE and, only where rows are missing, an insert: randomized
sequences of checkpoints on a real DuckDB file, partitions and topics appearing midway."""

import random

import polars as pl
import pytest

from tailwatch.store.checkpoint import Checkpoint, TopicCheckpoint, load_label_limits, load_offsets, write_checkpoint
from tailwatch.store.connection import connect

TOPICS = ["tw.requests", "tw.gpu", "tw.extra"]


def topic_checkpoint(topic: str, watermarks: dict[int, int], frontier: int | None, limits: bytes | None) -> TopicCheckpoint:
    return TopicCheckpoint(topic=topic, table="sli_minute", closed=pl.DataFrame(), closed_minutes=[], counts=[], hist=[],
                           seen=[], watermarks=watermarks, closed_before_minute=frontier, label_limits=limits)


@pytest.mark.parametrize("seed", range(6))
def test_offsets_frontiers_and_label_caps_land_as_upserts(tmp_path, seed):
    rng = random.Random(seed)
    con = connect(tmp_path / "store.duckdb")
    offsets: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    frontiers: dict[str, int] = {}
    limits: dict[str, bytes] = {}
    try:
        for step in range(12):
            topics = TOPICS[:1 + min(2, step // 4)]  # a topic more every few checkpoints
            parts = 2 + step // 3  # and partitions
            next_offsets = {(t, p): rng.randrange(10**6) for t in topics for p in range(parts) if rng.random() < 0.7}
            tcs = []
            for t in topics:
                wms = {p: rng.randrange(10**12) for p in range(parts) if rng.random() < 0.5}
                frontier = rng.choice([None, rng.randrange(10**7)])
                blob = rng.choice([None, rng.randbytes(rng.randrange(1, 3000))])
                tcs.append(topic_checkpoint(t, wms, frontier, blob))
                for p, wm in wms.items():
                    offsets[(t, p)] = (offsets.get((t, p), (None, None))[0], wm)
                if frontier is not None:
                    frontiers[t] = frontier
                if blob is not None:
                    limits[t] = blob
            for k, o in next_offsets.items():
                offsets[k] = (o, offsets.get(k, (None, None))[1])
            write_checkpoint(con, Checkpoint(topics=tcs, next_offsets=next_offsets))
            stored = {(t, int(p)): (o, w) for t, p, o, w in
                      con.execute("SELECT topic, part, next_offset, watermark_ms FROM _tw_offsets").fetchall()}
            assert stored == offsets
            assert load_offsets(con) == {k: o for k, (o, _) in offsets.items() if o is not None}
            assert dict(con.execute("SELECT topic, closed_before_minute FROM _tw_frontier").fetchall()) == frontiers
            assert {t: load_label_limits(con, t) for t in TOPICS if load_label_limits(con, t) is not None} == limits
        assert len(offsets) > 10 and len(frontiers) == 3 and len(limits) == 3
    finally:
        con.close()
