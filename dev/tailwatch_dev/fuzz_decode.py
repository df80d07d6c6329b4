"""A generation and mutation fuzzer for the record decode path, checked by invariants.

Records are made from the wire contract itself (msgspec's view of `request.v1`, `eval.v1` and
`gpu.v1`: every field's type and bounds), each labelled with what the decoder must do with it.
Evaluations share the requests' topic, so they go through its decoder beside requests:

- valid: every field a value of its type, bounds included (exactly at each bound), unknown
  fields beside them, duplicate keys, escaped unicode, timestamps as epoch ms or RFC 3339;
- invalid: a field past a bound, a value of every other JSON type, a missing required field,
  timestamps from year 0 to 9999 outside the range, nesting past the limit, a control
  character in a name, a record padded past the size limit (up to the broker's 1 MB);
- joined: two records that only parse when concatenated (`{…},{…` then the rest);
- unknown: random byte flips, insertions, deletions and truncations of valid records.

Each batch goes through the reference decoder (`BatchDecoder.decode` and `records_to_frame`)
and through `decode_frame` as the worker calls it (the fast columnar decoder, the reference
for what it declines), with Kafka record timestamps (some absurd), and must keep these
invariants:
1. nothing raises;
2. every record is accepted or rejected, exactly once, with a reason from the closed set;
3. records in = records accepted + records rejected, and the frame holds exactly the
   accepted ones, in order;
4. each record's outcome in the batch equals its outcome decoded alone (so no record can
   change another's: the boundaries hold);
5. valid records are accepted with every field equal to what was written (a duplicate key:
   its last value), invalid and joined ones are rejected;
6. accepted timestamps lie in the event-time range and names hold no control character;
7. the windows' sums of the accepted records (streams/aggregates.py: counts, token and error
   counts, fixed-point GPU- and audio-seconds, GPU means' sums) are never negative and equal a
   reference sum in Python integers, per slice-minute as stamped and with every record of
   the batch crowded into one slice-minute (where values at their bounds pile up);
8. the worker's path (`decode_frame`) gives the reference's frame, value for value, and the
   same rejections with the same reasons and words; so 1-7 hold for it too.

`tailwatch fuzz decode --records N` runs it at length and prints its figures; the default
test suite runs a few seconds of it (tests/test_fuzz_decode.py).
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import msgspec
import polars as pl

from tailwatch.ingest.schema import EVAL_PAIRS, MAX_EVENT_TS_MS, MIN_EVENT_TS_MS, EvalV1, GpuV1, RequestV1

# Values for fields with a pattern (language tags, voice names), each generator picking those
# its field's pattern admits.
PATTERNED = ("", "en", "en-US", "zh-Hant-TW", "es-419", "ja-jp", "neutral", "premium-2", "v.1_a")
from tailwatch.ingest.validate import DEFAULT_MAX_RECORD_BYTES, MAX_DEPTH, REASONS, BatchDecoder
from tailwatch.streams.aggregates import GPM_FIELDS, GPU, MICRO, MILLI, REQUESTS
from tailwatch.streams.frames import GPU_COLUMNS, REQUEST_COLUMNS, column_decoder, decode_frame, records_to_frame
from tailwatch.streams.minute_windows import MINUTE_MS, MinuteWindows

BROKER_MAX_BYTES = 1_048_576  # a Kafka broker's default message.max.bytes
MAX_AHEAD_MS = 5 * 60_000
NOW_MS = 1_795_000_000_000  # the Kafka record timestamps' clock (2026-11), fixed: runs replay
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass
class Case:
    raw: bytes | None
    expect: str  # valid, invalid, joined, unknown
    doc: dict | None = None  # for valid ones: the fields as they must come out
    record_ts: int = NOW_MS
    kind: str = ""


@dataclass
class Report:
    records: int = 0
    batches: int = 0
    seconds: float = 0.0
    by_expect: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    accepted: int = 0
    sums_checked: int = 0  # slice-minute sums compared with their reference (invariant 7)
    fast_accepted: int = 0  # records the fast columnar decoder took itself (invariant 8)
    violations: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        rate = self.records / self.seconds if self.seconds else 0.0
        out = [f"{self.records:,} records in {self.batches:,} batches, {self.seconds:.1f} s ({rate:,.0f} records/s, "
               "generation and every check included)",
               "made: " + ", ".join(f"{k} {v:,}" for k, v in sorted(self.by_expect.items())),
               f"accepted {self.accepted:,}; rejected by reason: "
               + ", ".join(f"{k} {v:,}" for k, v in sorted(self.by_reason.items(), key=lambda kv: -kv[1])),
               f"slice-minute sums checked against a reference: {self.sums_checked:,}",
               f"taken by the fast columnar decoder (same frame as the reference's): {self.fast_accepted:,}",
               f"invariant violations: {len(self.violations)}"]
        out += [f"  {v}" for v in self.violations[:20]]
        return out


# ---- values from the contract ------------------------------------------------------------------

def _bounds(t) -> tuple[float | None, float | None, bool]:
    """(lower, upper, upper is exclusive) of a numeric msgspec type."""
    lo = t.ge if t.ge is not None else t.gt
    if t.le is not None:
        return lo, t.le, False
    return lo, t.lt, t.lt is not None


class Contract:
    """One event type as msgspec sees it: how to make its fields valid or not."""

    def __init__(self, event_type: type[msgspec.Struct]):
        self.event_type = event_type
        self.fields = msgspec.inspect.type_info(event_type).fields
        self.required = [f for f in self.fields if f.required]
        # Names in plain ASCII, as fleets name things (what the fast decoder takes itself), or
        # with letters beyond it (what it leaves to the reference): chosen per record.
        self.plain = False

    def valid_value(self, rng: random.Random, t, name: str, edge: bool):
        if isinstance(t, msgspec.inspect.UnionType):
            options = [x for x in t.types if not isinstance(x, msgspec.inspect.NoneType)]
            if name == "ts":
                return self.valid_ts(rng, edge)
            if len(options) < len(t.types) and rng.random() < 0.2:
                return None
            return self.valid_value(rng, rng.choice(options), name, edge)
        if isinstance(t, msgspec.inspect.LiteralType):
            return rng.choice(t.values)
        if isinstance(t, msgspec.inspect.BoolType):
            return rng.random() < 0.5
        if isinstance(t, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
            lo, hi, exclusive = _bounds(t)
            lo = 0 if lo is None else lo
            hi = 10**12 if hi is None else hi
            is_int = isinstance(t, msgspec.inspect.IntType)
            if edge:
                v = rng.choice([lo, (hi - 1) if exclusive else hi])
            else:
                v = rng.uniform(lo, min(hi, lo + 10_000))
            return int(v) if is_int else float(v)
        if isinstance(t, msgspec.inspect.StrType):
            return self.valid_name(rng, t, edge)
        if isinstance(t, msgspec.inspect.DictType):  # stages: name → ms
            return {rng.choice(["asr_final", "llm_decode", "tts_first_audio", "x_custom"]): round(rng.uniform(0, 5000), 3)
                    for _ in range(rng.randint(0, 4))}
        raise TypeError(f"no generator for {t}")

    @staticmethod
    def valid_ts(rng: random.Random, edge: bool):
        ms = rng.choice([MIN_EVENT_TS_MS, NOW_MS - 1]) if edge else rng.randint(NOW_MS - 86_400_000 * 30, NOW_MS)
        if rng.random() < 0.3:
            return _rfc3339(ms), ms
        return ms, ms

    def valid_name(self, rng: random.Random, t, edge: bool) -> str:
        if t.pattern is not None:  # a patterned name (a language tag, a voice): a value the pattern admits
            admitted = [c for c in PATTERNED if re.search(t.pattern, c)]
            if not admitted:
                raise TypeError(f"no sample admitted by pattern {t.pattern!r}: add one to PATTERNED")
            return rng.choice(admitted)
        lo = t.min_length or 0
        hi = t.max_length or 64
        n = rng.choice([lo, hi]) if edge else rng.randint(max(lo, 1), min(hi, 24))
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_.:" + ("ABC /+" if self.plain else "éßü日本語🙂")
        return "".join(rng.choices(alphabet, k=n))

    def invalid_value(self, rng: random.Random, t, name: str, nullable: bool = False):
        """A value the field refuses: past a bound, or of another JSON type (`nullable`: not
        null, which an optional field takes)."""
        if isinstance(t, msgspec.inspect.UnionType):
            if name == "ts":
                return rng.choice([MIN_EVENT_TS_MS - 1, MAX_EVENT_TS_MS, 10**30, -5, 1.7e12,
                                   _rfc3339_year(rng.choice([1, 1999, 2100, 9999])), "not a time", "2024-13-45T00:00:00Z",
                                   [1], {"t": 1}, True])
            options = [x for x in t.types if not isinstance(x, msgspec.inspect.NoneType)]
            return self.invalid_value(rng, options[0], name, nullable=len(options) < len(t.types))
        if isinstance(t, msgspec.inspect.LiteralType):
            if name == "schema":
                return rng.choice(["request.v9", None, 1])
            return rng.choice(["nope", 5, ["x"]] + ([] if nullable else [None]))
        if isinstance(t, msgspec.inspect.BoolType):
            return rng.choice(["true", 1, [True]])
        if isinstance(t, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
            lo, hi, exclusive = _bounds(t)
            past = []
            if lo is not None:
                past.append(lo - (1 if isinstance(t, msgspec.inspect.IntType) else 0.5))
            if hi is not None:
                past.append(hi if exclusive else hi + 1)
            past += ["12", [1], {"n": 1}, True]
            if isinstance(t, msgspec.inspect.IntType):
                past.append(2.5)
            return rng.choice(past)
        if isinstance(t, msgspec.inspect.StrType):
            over = (t.max_length or 128) + 1
            choices: list = [5, [1], {"s": "x"}, True, "x" * over]
            if t.min_length:
                choices.append("")
            if t.pattern is None:
                choices.append("a\u001b[2Jb")  # a control character in a name
            else:
                choices += ["Not Valid!", "en US", "a\nb"]
            return rng.choice(choices)
        if isinstance(t, msgspec.inspect.DictType):
            return rng.choice([[1], "x", {"Bad Name": 1.0}, {"asr_final": -1}])
        raise TypeError(f"no generator for {t}")


def _rfc3339(ms: int) -> str:
    secs, milli = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{milli:03d}Z"


def _rfc3339_year(year: int) -> str:
    return f"{year:04d}-06-01T00:00:00Z"


# ---- cases ------------------------------------------------------------------------------------

class Generator:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.contracts = {"request.v1": Contract(RequestV1), "eval.v1": Contract(EvalV1), "gpu.v1": Contract(GpuV1)}
        self.n = 0

    def valid_doc(self, schema: str) -> tuple[dict, dict]:
        """(the document written, the fields as the decoder must give them back)."""
        c, rng = self.contracts[schema], self.rng
        self.n += 1
        c.plain = rng.random() < 0.6
        doc, want = {}, {}
        for f in c.fields:
            if f.name == "schema":
                doc["schema"] = want["schema"] = schema
                continue
            if not f.required and rng.random() < 0.5:
                continue
            edge = rng.random() < 0.15
            if f.name == "ts":
                doc["ts"], want["ts"] = c.valid_ts(rng, edge)
                continue
            value = c.valid_value(rng, f.type, f.name, edge)
            if f.name == "event_id":
                value = f"ev-{self.n:x}"
            doc[f.name] = want[f.name] = value
        if schema == "eval.v1":  # its measurements come in pairs, and at least one is there
            for a, b in EVAL_PAIRS:
                if (doc.get(a) is None) != (doc.get(b) is None):
                    for name in (a, b):
                        doc.pop(name, None)
                        want.pop(name, None)
            if all(doc.get(a) is None for a, _ in EVAL_PAIRS) and doc.get("mos") is None:
                doc["mos"] = want["mos"] = 4.0
        return doc, want

    def dumps(self, value) -> bytes:
        """JSON with unicode escaped or raw, at random: the decoder must read both alike."""
        u = self.rng.random()
        if u < 0.3:  # compact, as producers' encoders write (msgspec, orjson)
            return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        return json.dumps(value, ensure_ascii=u < 0.65).encode()

    def case(self) -> Case:
        rng = self.rng
        u = rng.random()
        schema = "request.v1" if u < 0.6 else ("eval.v1" if u < 0.7 else "gpu.v1")
        kind = rng.choices(["valid", "valid_extra", "duplicate_key", "duplicate_key_invalid_first", "invalid_field",
                            "missing", "deep", "control", "padded", "joined", "mutated", "truncated", "empty", "record_ts"],
                           weights=[30, 8, 3, 2, 14, 4, 4, 3, 1, 5, 15, 6, 2, 4])[0]
        doc, want = self.valid_doc(schema)
        c = self.contracts[schema]
        if kind == "valid":
            return Case(self.dumps(doc), "valid", want, kind=kind)
        if kind == "valid_extra":  # unknown fields of every JSON type, nested up to the limit
            doc[rng.choice(["prompt", "meta", "x", "attributes"])] = _nested(rng, rng.randint(1, MAX_DEPTH - 2))
            return Case(self.dumps(doc), "valid", want, kind=kind)
        if kind.startswith("duplicate_key"):  # the last value wins; an invalid one before it is still refused
            # (Not an evaluation's measurements: a last value of null would break its pair, a
            # refusal by the cross-field check that `invalid_field` cases exercise.)
            f = rng.choice([f for f in c.fields if f.name not in ("schema", "ts", "event_id", *_EVAL_MEASURES)])
            valid_first = kind == "duplicate_key"
            first = c.valid_value(rng, f.type, f.name, False) if valid_first else c.invalid_value(rng, f.type, f.name)
            while isinstance(first, str) and CONTROL.search(first):  # judged on the value kept, the last
                first = c.invalid_value(rng, f.type, f.name)
            last = c.valid_value(rng, f.type, f.name, False)
            key = json.dumps(f.name).encode()
            raw = self.dumps(doc)[:-1] + b", " + key + b": " + self.dumps(first) + b", " + key + b": " + self.dumps(last) + b"}"
            if valid_first:
                return Case(raw, "valid", {**want, f.name: last}, kind=kind)
            return Case(raw, "invalid", kind=kind)
        if kind == "invalid_field":
            f = rng.choice([f for f in c.fields if f.name != "event_id"])
            doc[f.name] = c.invalid_value(rng, f.type, f.name)
            if f.name == "schema" and doc[f.name] is None:
                del doc["schema"]
            return Case(self.dumps(doc), "invalid", kind=f"invalid:{f.name}")
        if kind == "missing":
            del doc[rng.choice(c.required).name]
            return Case(self.dumps(doc), "invalid", kind=kind)
        if kind == "deep":
            depth = rng.randint(MAX_DEPTH + 1, 20_000)
            where = rng.random()
            if where < 0.5:
                return Case(self.dumps(doc)[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}", "invalid", kind=kind)
            return Case((b"[" if where < 0.75 else b'{"a":') * depth, "invalid", kind=kind)
        if kind == "control":
            name = rng.choice([f.name for f in c.fields if isinstance(f.type, msgspec.inspect.StrType) and f.type.pattern is None])
            doc[name] = "x" + chr(rng.choice([0, 7, 10, 27, 31, 127, 0x85, 0x9B])) + "y"
            return Case(self.dumps(doc), "invalid", kind=kind)
        if kind == "padded":
            size = rng.randint(DEFAULT_MAX_RECORD_BYTES + 1, BROKER_MAX_BYTES)
            raw = self.dumps(doc)
            return Case(raw[:-1] + b" " * (size - len(raw)) + b"}", "invalid", kind=kind)
        if kind == "joined":  # split a record at one of its commas, hang the first part on another
            other, _ = self.valid_doc(schema)
            other["node" if schema == "gpu.v1" else "tenant"] = "forged"
            a, b = self.dumps(doc), json.dumps(other).encode()
            cut = rng.choice([i for i in range(len(b)) if b[i:i + 2] == b", "])
            self._rest = b[cut + 1:]  # the producer's next record: joined with a comma, `[a,b]` parses
            return Case(a + b"," + b[:cut], "joined", kind=kind)
        if kind == "mutated":
            raw = bytearray(self.dumps(doc))
            for _ in range(rng.randint(1, 4)):
                op, pos = rng.random(), rng.randrange(len(raw))
                if op < 0.4:
                    raw[pos] = rng.randrange(256)
                elif op < 0.7:
                    raw.insert(pos, rng.choice(b'{}[]",:\\0123456789e-.tfn \x00\xff'))
                else:
                    del raw[pos]
            return Case(bytes(raw), "unknown", kind=kind)
        if kind == "truncated":
            raw = self.dumps(doc)
            return Case(raw[:rng.randrange(len(raw))], "invalid", kind=kind)
        if kind == "empty":
            return Case(rng.choice([None, b"", b"null", b"{}", b"[]", b" "]), "invalid", kind=kind)
        # record_ts: a Kafka record timestamp that is absent, absurd, or behind the event
        ts = want["ts"]
        record_ts = rng.choice([-1, 0, 1, MAX_EVENT_TS_MS + 5, ts - MAX_AHEAD_MS - 1, ts - MAX_AHEAD_MS, 2**62])
        ok = MIN_EVENT_TS_MS <= record_ts < MAX_EVENT_TS_MS and ts <= record_ts + MAX_AHEAD_MS
        return Case(self.dumps(doc), "valid" if ok else "invalid", want if ok else None, record_ts=record_ts, kind=kind)

    def batch(self, size: int) -> list[Case]:
        out = []
        while len(out) < size:
            c = self.case()
            if c.expect == "joined" and len(out) + 2 > size:  # its rest would not fit: another case
                continue
            out.append(c)
            if c.expect == "joined":  # the rest of the second record, as the producer's next record
                out.append(Case(self._rest, "joined", kind="joined-rest"))
        return out


def _nested(rng: random.Random, depth: int):
    value: object = rng.choice([1, -2.5e300, "s\u00e9", True, None, "\u0000-escaped"])
    for _ in range(depth - 1):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


# ---- checking ----------------------------------------------------------------------------------

class Checker:
    def __init__(self):
        self.decoders = {"request.v1": BatchDecoder(RequestV1, also=(EvalV1,)), "gpu.v1": BatchDecoder(GpuV1)}
        self.columns = {"request.v1": REQUEST_COLUMNS, "gpu.v1": GPU_COLUMNS}
        self.fast = {schema: column_decoder(d.event_type, self.columns[schema], d.max_record_bytes)
                     for schema, d in self.decoders.items()}
        self.sums = SumCheck()
        self.sums_checked = 0
        self.fast_accepted = 0

    def outcomes(self, schema: str, cases: list[Case]) -> tuple[dict[int, object], list[str]]:
        """Per position: the accepted record (as builtins) or the rejection reason; and any
        invariant violation found on the way (1-3, 6)."""
        problems = []
        values = [c.raw for c in cases]
        try:
            decoded = self.decoders[schema].decode(values)
            frame, late = records_to_frame(decoded.records, self.columns[schema], [0] * len(values),
                                           list(range(len(values))), decoded.indices, [c.record_ts for c in cases],
                                           MAX_AHEAD_MS)
        except BaseException as exc:  # invariant 1
            return {}, [f"raised {type(exc).__name__}: {exc}"[:300]]
        out: dict[int, object] = {}
        for r in decoded.rejected + late:
            if r.index in out:
                problems.append(f"record {r.index} rejected twice")
            if r.reason not in REASONS:
                problems.append(f"record {r.index}: reason {r.reason!r} is not in the closed set")
            out[r.index] = r.reason
        kept = frame["_index"].to_list()
        by_index = dict(zip(decoded.indices, decoded.records))
        for i in kept:
            if i in out:
                problems.append(f"record {i} both accepted and rejected")
            rec = by_index[i]
            out[i] = {name: getattr(rec, name) for name in rec.__struct_fields__}
            if not MIN_EVENT_TS_MS <= rec.ts < MAX_EVENT_TS_MS:
                problems.append(f"record {i}: accepted ts {rec.ts} outside the range")
            names = [v for v in out[i].values() if isinstance(v, str)]
            if any(CONTROL.search(v) for v in names):
                problems.append(f"record {i}: a control character was accepted")
        if set(out) != set(range(len(values))):  # invariants 2, 3
            problems.append(f"records in {len(values)}, accounted for {len(out)}")
        if kept != sorted(kept):
            problems.append("the frame's rows are out of order")
        problems += self._same_as_reference(schema, cases, frame, decoded.rejected + late)
        try:  # invariant 7
            for crowded in (False, True):
                checked, wrong = self.sums.check(schema, frame, crowded)
                self.sums_checked += checked
                problems += wrong
        except BaseException as exc:
            problems.append(f"the windows raised {type(exc).__name__}: {exc}"[:300])
        return out, problems

    def _same_as_reference(self, schema: str, cases: list[Case], frame: pl.DataFrame, rejected: list) -> list[str]:
        """Invariant 8: the worker's path gives the reference's frame and rejections."""
        values, n = [c.raw for c in cases], len(cases)
        try:
            got = decode_frame(self.fast[schema], self.decoders[schema], self.columns[schema], values, [0] * n,
                               list(range(n)), [c.record_ts for c in cases], MAX_AHEAD_MS)
        except BaseException as exc:
            return [f"decode_frame raised {type(exc).__name__}: {exc}"[:300]]
        self.fast_accepted += got.fast_rows
        problems = []
        if got.frame.schema != frame.schema or not got.frame.equals(frame):
            problems.append(f"decode_frame's frame differs from the reference's: {_first_difference(got.frame, frame)}")
        mine = sorted((r.index, r.reason, r.detail) for r in got.rejected)
        theirs = sorted((r.index, r.reason, r.detail) for r in rejected)
        if mine != theirs:
            problems.append(f"decode_frame's rejections differ: {sorted(set(mine) ^ set(theirs))[:3]}")
        return problems

    def alone(self, schema: str, c: Case) -> object:
        """The outcome of one record decoded on its own (the event-time bound applied as
        `records_to_frame` applies it, without building a frame for one record)."""
        try:
            decoded = self.decoders[schema].decode([c.raw])
        except BaseException as exc:
            return f"raised {type(exc).__name__}"
        if decoded.rejected:
            return decoded.rejected[0].reason
        rec = decoded.records[0]
        if not (MIN_EVENT_TS_MS <= c.record_ts < MAX_EVENT_TS_MS and rec.ts <= c.record_ts + MAX_AHEAD_MS):
            return "future"
        return {name: getattr(rec, name) for name in rec.__struct_fields__}


def run(records: int, seed: int = 1, batch_size: int = 500, progress: Callable[[str], None] | None = None,
        alone_every: int = 1) -> Report:
    """Fuzz `records` records in batches; `alone_every`: check batch independence (invariant
    4, each record decoded again on its own) on every n-th batch."""
    gen, check, report = Generator(seed), Checker(), Report()
    began = last = time.monotonic()
    while report.records < records:
        cases = gen.batch(min(batch_size, records - report.records))
        for schema, carried in TOPIC_SCHEMAS.items():
            # A topic carries its schemas: the others' records are simply invalid here.
            batch = [c if _schema_of(c) in (*carried, None) else Case(c.raw, "invalid", kind="other-schema")
                     for c in cases]
            got, problems = check.outcomes(schema, batch)
            report.violations += [f"batch {report.batches} {schema}: {p}" for p in problems]
            if problems and not got:
                continue
            alone = report.batches % alone_every == 0
            for i, c in enumerate(batch):
                outcome = got.get(i)
                if alone:
                    single = check.alone(schema, c)
                    if single != outcome:  # invariant 4
                        report.violations.append(f"batch {report.batches} {schema} record {i} ({c.kind}): "
                                                 f"{_short(outcome)} in the batch, {_short(single.get(0))} alone")
                # Tallied once, under its own topic; a record of no known schema under requests.
                home = "gpu.v1" if _schema_of(c) == "gpu.v1" else "request.v1"
                if schema == home:
                    report.by_expect[c.expect] = report.by_expect.get(c.expect, 0) + 1
                    if isinstance(outcome, str):
                        report.by_reason[outcome] = report.by_reason.get(outcome, 0) + 1
                    elif outcome is not None:
                        report.accepted += 1
                if _schema_of(c) not in carried and c.expect != "invalid":
                    continue
                problem = _expectation(c, outcome)
                if problem:
                    report.violations.append(f"batch {report.batches} {schema} record {i} ({c.kind}): {problem}")
        report.records += len(cases)
        report.batches += 1
        report.sums_checked = check.sums_checked
        report.fast_accepted = check.fast_accepted
        if progress and time.monotonic() - last >= 2.0:
            last = time.monotonic()
            progress(f"fuzz: {report.records:,} of {records:,} records, {len(report.violations)} violations")
    report.seconds = time.monotonic() - began
    return report


# ---- aggregates (invariant 7) ------------------------------------------------------------------

# Per topic: the partial columns that are sums, and what each adds per accepted record, in
# Python integers (fixed point rounded as the windows round it: half to even, as `round` does).
def _fixed(column: str, scale: int):
    return lambda r: round(r[column] * scale) if r[column] is not None else 0


def _whole(column: str):
    return lambda r: r[column] or 0


_REQUEST_INTS = ("prompt_tokens", "output_tokens", "partial_revisions", "underruns", "cached_prompt_tokens",
                 "draft_tokens", "accepted_tokens", "word_errors", "reference_words", "char_errors", "reference_chars")
REFERENCE_SUMS: dict[str, dict[str, Callable[[dict], int]]] = {
    "request.v1": {
        "requests": lambda r: r["status"] is not None,
        "evals": lambda r: r["status"] is None,
        **{c: _whole(c) for c in _REQUEST_INTS},
        "mos_milli": _fixed("mos", MILLI),
        "successful_audio_ms": lambda r: _fixed("audio_seconds", MILLI)(r) if r["status"] == "ok" else 0,
        "_audio_seconds_fixed": _fixed("audio_seconds", MICRO),
        "_gpu_seconds_fixed": _fixed("gpu_seconds", MICRO),
    },
    "gpu.v1": {
        "samples": lambda r: 1,
        **{c: _whole(c) for c in ("xid_errors", "ecc_errors", "preemptions")},
        **{f"_{c}_fixed": _fixed(c, MILLI) for c in ("util_pct", "power_w", *GPM_FIELDS)},
    },
}
_SPECS = {"request.v1": REQUESTS, "gpu.v1": GPU}


class SumCheck:
    """The windows' sums of one batch's accepted records against the reference above."""

    def check(self, schema: str, frame, crowded: bool) -> tuple[int, list[str]]:
        """(slice-minutes compared, problems). `crowded`: every record stamped into one minute
        of one slice first."""
        if frame.height == 0:
            return 0, []
        spec = _SPECS[schema]
        if crowded:
            frame = frame.with_columns(*[pl.lit(frame[k][0]).alias(k) for k in spec.keys],
                                       pl.lit(frame["ts_ms"][0]).alias("ts_ms"))
        windows = MinuteWindows(spec, allowed_lateness_ms=MAX_EVENT_TS_MS)  # nothing is late
        windows.add(frame)
        counts, _hist, _minutes = windows.close_partials(None)
        got = {(row["_minute"], tuple(row[k] for k in spec.keys)): row for row in counts.iter_rows(named=True)}
        want = self.reference(schema, frame)
        problems = []
        if set(got) != set(want):
            problems.append(f"slice-minutes: {len(got)} summed, {len(want)} in the reference")
        for key in set(got) & set(want):
            for column, total in want[key].items():
                value = got[key][column]
                if value is None or value < 0 or int(value) != total:
                    problems.append(f"{schema} {column} of a slice-minute{' (crowded)' if crowded else ''}: "
                                    f"{value} summed, {total} in the reference")
        return len(got), problems

    @staticmethod
    def reference(schema: str, frame) -> dict[tuple, dict[str, int]]:
        """Sums per (minute, slice labels) in Python integers, each event once: requests and
        evaluations by `event_id` within their minute, GPU samples by their whole content."""
        spec, sums = _SPECS[schema], REFERENCE_SUMS[schema]
        out: dict[tuple, dict[str, int]] = {}
        seen: set = set()
        fields = [c for c in frame.columns if not c.startswith("_")]
        for r in frame.iter_rows(named=True):
            minute = r["ts_ms"] // MINUTE_MS
            identity = (minute, r["event_id"]) if schema != "gpu.v1" else (minute, repr([r[c] for c in fields]))
            if identity in seen:
                continue
            seen.add(identity)
            row = out.setdefault((minute, tuple(r[k] for k in spec.keys)), dict.fromkeys(sums, 0))
            for column, value in sums.items():
                row[column] += int(value(r))
        return out


_EVAL_MEASURES = (*(f for pair in EVAL_PAIRS for f in pair), "mos")
# Each topic's decoder (named by its main schema) and the schemas its records may carry.
TOPIC_SCHEMAS = {"request.v1": ("request.v1", "eval.v1"), "gpu.v1": ("gpu.v1",)}


def _first_difference(a: pl.DataFrame, b: pl.DataFrame) -> str:
    if a.schema != b.schema:
        return f"columns {list(a.schema.items())} against {list(b.schema.items())}"[:300]
    if a.height != b.height:
        return f"{a.height} rows against {b.height}"
    for c in a.columns:
        if not a[c].equals(b[c]):
            at = next(i for i, (x, y) in enumerate(zip(a[c].to_list(), b[c].to_list())) if x != y)
            return f"column {c} row {at} (record {b['_index'][at]}): {a[c][at]!r} against {b[c][at]!r}"
    return "?"


def _schema_of(c: Case) -> str | None:
    if c.doc is not None:
        return c.doc["schema"]
    raw = c.raw or b""
    if b'"gpu.v1"' in raw:
        return "gpu.v1"
    if b'"eval.v1"' in raw:
        return "eval.v1"
    if b'"request.v1"' in raw:
        return "request.v1"
    return None


def _expectation(c: Case, outcome) -> str | None:
    """Invariant 5."""
    if c.expect == "valid":
        if not isinstance(outcome, dict):
            return f"a valid record was rejected ({outcome})"
        for k, v in c.doc.items():
            got = outcome.get(k)
            if isinstance(v, float) and isinstance(got, (int, float)) and math.isclose(v, got, rel_tol=1e-12):
                continue
            if got != v:
                return f"field {k} came out as {got!r}, written {v!r}"
    elif c.expect in ("invalid", "joined") and isinstance(outcome, dict):
        return f"an {c.expect} record was accepted"
    return None


def _short(outcome) -> str:
    return outcome if isinstance(outcome, str) or outcome is None else "accepted"
