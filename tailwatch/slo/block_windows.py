"""Windowed (good, valid) sums for many slices at once, in memory that does not grow with the window.

Each slice's counts are kept at a few resolutions, column-wise across slices: every minute
for windows up to an hour, 5-minute blocks for windows up to 6 hours, hour blocks beyond
(`RESOLUTIONS`). A window of m minutes ending at `now` is read at the finest resolution that
serves it: the block holding `now` (whole: every minute of it so far is inside), the whole
blocks behind it, and the share of the oldest block that lies inside the window.

That share is pro-rata (the block's events taken as evenly spread over its minutes); it is
the one approximation. Minute-resolution windows are exact, and so is any window whose
oldest block began before the first event. Otherwise a window is off by at most the part
of its oldest block's events that pro-rata puts on the wrong side of the edge: never more
than one block (an hour of a 30-day window, 1/720 of it at steady traffic), and nothing
when traffic is even within the hour. `tests/test_block_windows.py` holds it to a
brute-force sum.

Memory per slice: 4 bytes × 2 counts × (61 + 73 + 721) slots, 6.8 KB for the default
30-day catalog, whatever the period's traffic. Slices live in chunks of up to `CHUNK` rows;
the newest chunk grows by doubling, so adding slices copies at most one chunk and leaves
at most half of one unused. A past minute still inside a resolution's ring can be added to (late data
corrects its windows); one older than every ring is outside every window already.
"""

from __future__ import annotations

import numpy as np

# (block minutes, the longest window it serves); the last serves every longer one.
RESOLUTIONS: tuple[tuple[int, int], ...] = ((1, 60), (5, 360), (60, 1 << 62))
CHUNK = 8192  # slices per chunk
MIN_ROWS = 64  # a chunk's first allocation


class _Ring:
    """One resolution: per slice, `slots` blocks of `block` minutes (a ring by block number),
    each block a (good, valid) pair of counts. Slot-major ((slots, rows, 2) per chunk), so a
    block of every slice is one contiguous run: reading the few blocks a minute needs copies
    whole runs, and emptying a block writes one."""

    def __init__(self, block: int, slots: int):
        self.block, self.slots = block, slots
        self.chunks: list[np.ndarray] = []  # (slots, rows, 2) uint32 each

    @staticmethod
    def rows_of(chunk: np.ndarray) -> int:
        return chunk.shape[1]

    def make_room(self, n: int) -> None:
        """Rows for n slices: the last chunk grows by doubling up to CHUNK rows, then a new one
        begins (a copy never moves more than one chunk)."""
        while len(self.chunks) * CHUNK < n:
            if self.chunks and self.rows_of(self.chunks[-1]) < CHUNK:
                self._grow_last(CHUNK)
            else:
                self.chunks.append(np.zeros((self.slots, MIN_ROWS, 2), np.uint32))
        need = n - (len(self.chunks) - 1) * CHUNK
        if self.rows_of(self.chunks[-1]) < need:
            self._grow_last(min(CHUNK, max(need, 2 * self.rows_of(self.chunks[-1]))))

    def _grow_last(self, rows: int) -> None:
        last = self.chunks[-1]
        grown = np.zeros((self.slots, rows, 2), np.uint32)
        grown[:, :last.shape[1]] = last
        self.chunks[-1] = grown

    def _rows(self, n: int):
        for k, c in enumerate(self.chunks):
            rows = min(CHUNK, n - k * CHUNK)
            if rows <= 0:
                return
            yield c, rows

    def zero(self, first_block: int, last_block: int, n: int) -> None:
        """Empty blocks first..last (they begin now; their slots held blocks that left every window)."""
        if last_block < first_block:
            return
        count = min(last_block - first_block + 1, self.slots)
        spans = _slot_spans(first_block % self.slots, count, self.slots)
        for c, rows in self._rows(n):
            for a, b in spans:
                c[a:b, :rows] = 0

    def add(self, cols: np.ndarray, block: int, counts: np.ndarray) -> None:
        """Add (good, valid) pairs (uint32), one row per slice in `cols`, to a block."""
        slot = block % self.slots
        if len(self.chunks) == 1:
            self.chunks[0][slot, cols] += counts
            return
        chunk_of = cols // CHUNK
        for k in np.unique(chunk_of):
            pick = chunk_of == k
            self.chunks[k][slot, cols[pick] - k * CHUNK] += counts[pick]

    def columns(self, blocks: list[int], n: int) -> np.ndarray:
        """Per block, the (good, valid) of every slice: (len(blocks), n, 2) floats (counts,
        exact: a window's sums stay far below 2**53)."""
        slots = [b % self.slots for b in blocks]
        if len(self.chunks) == 1:  # the usual case, and on a thin minute each call's fixed cost counts
            # (take, then slice: `take` copies a sliced ring whole first)
            return self.chunks[0].take(slots, axis=0)[:, :n].astype(np.float64)
        parts = [c.take(slots, axis=0)[:, :rows] for c, rows in self._rows(n)]
        if not parts:
            return np.zeros((len(slots), 0, 2))
        return (parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)).astype(np.float64)

    def total(self, first_block: int, last_block: int, n: int) -> np.ndarray:
        """Per slice, the (good, valid) sums of blocks first..last (an empty range sums to zero): (n, 2)."""
        if last_block < first_block:
            return np.zeros((n, 2))
        spans = _slot_spans(first_block % self.slots, last_block - first_block + 1, self.slots)
        parts = [sum(c[x:y, :rows].sum(axis=0, dtype=np.int64) for x, y in spans) for c, rows in self._rows(n)]
        return np.concatenate(parts).astype(np.float64) if parts else np.zeros((0, 2))

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


def _slot_spans(first_slot: int, count: int, slots: int) -> list[tuple[int, int]]:
    """The slot ranges [a, b) that `count` consecutive blocks from `first_slot` occupy in a ring."""
    end = first_slot + count
    return [(first_slot, end)] if end <= slots else [(first_slot, slots), (0, end - slots)]


class BlockWindows:
    """Per slice, (good, valid) over the last m minutes for each window length m, column-wise."""

    def __init__(self, lengths):
        self.lengths = tuple(sorted(set(lengths)))
        self.rings: list[_Ring] = []
        self._members: list[list[int]] = []  # per ring, the indices into `lengths` it serves
        lower = 0
        for block, serves in RESOLUTIONS:
            mine = [k for k, m in enumerate(self.lengths) if lower < m <= serves]
            lower = serves
            if mine:
                self.rings.append(_Ring(block, -(-self.lengths[mine[-1]] // block) + 1))
                self._members.append(mine)
        self.n = 0  # slices
        self.now: int | None = None  # the newest minute inside the windows
        self._middle: dict[int, tuple[list, np.ndarray]] = {}  # ring → (per window (tail, head), sums (windows, n, 2))
        self._sums: np.ndarray | None = None  # (n, lengths, 2) as of now, until something moves
        self._weight: dict[tuple[int, int], np.ndarray] = {}  # (ring, now's place in its block) → see _weights

    def add_slices(self, count: int) -> None:
        self.n += count
        for ring in self.rings:
            ring.make_room(self.n)
        self._sums = None

    def advance(self, minute: int) -> None:
        """Move `now` forward to `minute`: the blocks that begin are emptied."""
        if self.now is not None and minute <= self.now:
            return
        for ring in self.rings:
            b = ring.block
            first = minute // b - ring.slots + 1 if self.now is None else self.now // b + 1
            ring.zero(max(first, minute // b - ring.slots + 1), minute // b, self.n)
        self.now = minute
        self._sums = None

    def add(self, cols: np.ndarray, minute: int, good: np.ndarray, valid: np.ndarray) -> None:
        """Add one minute's counts for some slices (each at most once). A minute before `now`
        corrects the windows that hold it; one outside every ring is dropped (no window holds it)."""
        if self.now is None or minute > self.now:
            raise ValueError(f"minute {minute} is after now ({self.now}): advance first")
        if not len(cols):
            return
        counts = np.empty((len(cols), 2), np.uint32)  # the rings' own type: added without a cast
        counts[:, 0], counts[:, 1] = good, valid
        for ring in self.rings:
            block = minute // ring.block
            if block > self.now // ring.block - ring.slots:
                ring.add(cols, block, counts)
        if minute < self.now:
            self._middle.clear()  # a past block may sit inside a cached middle
        self._sums = None

    def all_sums(self) -> np.ndarray:
        """Per slice and window length (in `lengths` order), (good, valid) over the minutes
        ending at `now`: (n, lengths, 2) floats (the oldest block's share is pro-rata)."""
        if self._sums is not None:
            return self._sums
        n, now = self.n, self.now
        out = np.zeros((len(self.lengths), n, 2))
        if now is not None:
            for r, (ring, members) in enumerate(zip(self.rings, self._members)):
                head = now // ring.block
                tails = [(now - self.lengths[k] + 1) // ring.block for k in members]
                # One gather a ring: the head, the block before it (what enters the middles
                # when the windows move one block) and each window's oldest block.
                blocks = ring.columns([head, head - 1, *tails], n)  # (2 + windows, n, 2)
                middle = self._middles(r, ring, tails, head, n, blocks)
                # The head whole (unless a window lies inside it) and the share of each
                # window's oldest block inside it: one product over the gathered blocks.
                weights = self._weights(r, now)
                mine = out[members[0]:members[-1] + 1]
                np.matmul(weights, blocks.reshape(len(blocks), -1), out=mine.reshape(len(members), -1))
                mine += middle
        self._sums = out.transpose(1, 0, 2)
        return self._sums

    def _weights(self, r: int, now: int) -> np.ndarray:
        """For ring r at `now`, per window, its weight on each gathered block (head, the block
        before it, each window's oldest): 1 on the head (0 where the window lies inside it)
        and the share of the oldest block inside the window (1 at minute resolution; inside
        the head, its share of what the head holds so far). They depend only on `now`'s place
        in its block, so they are kept per place."""
        ring = self.rings[r]
        b = ring.block
        key = (r, now % b)
        cached = self._weight.get(key)
        if cached is None:
            members = self._members[r]
            head = now // b
            cached = np.zeros((len(members), 2 + len(members)))
            for j, k in enumerate(members):
                oldest = now - self.lengths[k] + 1
                tail = oldest // b
                inside = tail == head
                cached[j, 0] = 0.0 if inside else 1.0
                cached[j, 2 + j] = (now - oldest + 1) / (now - head * b + 1) if inside else ((tail + 1) * b - oldest) / b
            self._weight[key] = cached
        return cached

    def sums(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Per slice, (good, valid) over the `length` minutes ending at `now`."""
        k = self.lengths.index(length)
        s = self.all_sums()
        return s[:, k, 0], s[:, k, 1]

    def _middles(self, r: int, ring: _Ring, tails: list[int], head: int, n: int, blocks: np.ndarray) -> np.ndarray:
        """Per window of ring r and slice, the sums of the whole blocks strictly between its
        tail and the head: (windows, n, 2), kept from minute to minute. `blocks` holds the
        head, the block before it and each tail. A window whose blocks moved (a block
        boundary) adds the blocks that entered and takes away those that left when only a
        few moved and those that left are still in the ring; else it is summed afresh."""
        cached = self._middle.get(r)
        if cached is None:
            keys, sums = [None] * len(tails), np.zeros((len(tails), n, 2))
        else:
            keys, sums = cached
            if sums.shape[1] < n:  # slices added since: none of theirs lie in the middle yet
                sums = np.pad(sums, ((0, 0), (0, n - sums.shape[1]), (0, 0)))
        now_keys = [(t, head) for t in tails]
        if keys == now_keys:
            self._middle[r] = (keys, sums)
            return sums  # nothing moved since (inside a block of a coarse ring)
        # (tails fall as the windows lengthen: the first is the latest)
        if tails[0] < head - 1 and keys == [(t - 1, head - 1) for t in tails]:
            # Every window moved one block (each minute at minute resolution): the old head
            # enters each middle, each new tail leaves it.
            sums = sums + blocks[1] - blocks[2:]
            self._middle[r] = (now_keys, sums)
            return sums
        keys = list(keys)
        moves: list[tuple[int, int, float]] = []  # (window, block, +1 entering or -1 leaving)
        for j, tail in enumerate(tails):
            if keys[j] == (tail, head):
                continue
            if keys[j] is not None:
                old_tail, old_head = keys[j]
                enter = range(max(old_head, tail + 1), head)
                leave = range(old_tail + 1, min(tail, old_head - 1) + 1)
                if len(enter) <= 4 and len(leave) <= 4 and (not leave or leave[0] > head - ring.slots):
                    moves += [(j, b, 1.0) for b in enter] + [(j, b, -1.0) for b in leave]
                    keys[j] = (tail, head)
                    continue
            sums[j] = ring.total(tail + 1, head - 1, n)
            keys[j] = (tail, head)
        if moves:
            # Windows that moved a few blocks (minutes the SLO had no traffic in): the blocks
            # that entered or left any of them, read at once, and one product.
            moved = sorted({b for _, b, _ in moves})
            at = {b: i for i, b in enumerate(moved)}
            weights = np.zeros((len(tails), len(moved)))
            for j, b, sign in moves:
                weights[j, at[b]] += sign
            gathered = ring.columns(moved, n)
            sums = sums + (weights @ gathered.reshape(len(moved), -1)).reshape(sums.shape)
        self._middle[r] = (keys, sums)
        return sums

    def nbytes(self) -> int:
        """Bytes held in the rings."""
        return sum(r.nbytes() for r in self.rings)

    def bytes_per_slice(self) -> int:
        return sum(8 * r.slots for r in self.rings)
