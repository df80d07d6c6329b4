"""`tailwatch slo status`: replay the store's buckets through the SLO engine and print
each SLO and slice with its SLI, budget left, burn rates per window, firing alerts and the alert
windows its history is still too short to judge."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from tailwatch.slo.sli import replay, span
from tailwatch.slo.spec import REPORTED_KINDS, SloSpec
from tailwatch.slo.alert_windows import minute_start_utc, minute_text
from tailwatch.store.connection import DEFAULT_STORE, connect
from tailwatch.store.queries import newest_minute, recent_bucket_chunks
from tailwatch.cli import CliError
from tailwatch.table import render


def parse_at(text: str, newest_minute: int) -> int:
    """`--at`: an event time as tailwatch prints them (`2026-11-02 01:20`), RFC 3339, or a
    time of day (`01:20`) on the store's newest day. Returns an epoch minute (UTC)."""
    text = text.strip()
    if re.fullmatch(r"\d{1,2}:\d{2}", text):
        day = minute_start_utc(newest_minute).date().isoformat()
        text = f"{day} {int(text.split(':')[0]):02d}:{text.split(':')[1]}"
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise CliError(f"--at: {text!r} is not a time (use 2026-11-02 01:20, 2026-11-02T01:20:00Z or 01:20)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp()) // 60


def print_status(specs: list[SloSpec], store_path: str | None, at: str | None) -> int:
    con = connect(store_path or DEFAULT_STORE, read_only=True)
    try:
        longest = max(s.period_minutes for s in specs)
        newest = newest_minute(con, "sli_minute")
        if newest is None:
            raise CliError("the store has no buckets yet: run the worker first")
        until = parse_at(at, newest) if at else None
        print(f"as of {minute_text((until if until is not None else newest) + 1)} (event time, UTC; the store's newest "
              f"minute is {minute_text(newest)})")
        # Six hours at a time: a month of a busy fleet's buckets at once took gigabytes.
        result = replay(specs, recent_bucket_chunks(con, longest), until)
    finally:
        con.close()
    rows = []
    for (_name, _key), state in sorted(result.evaluator.states.items(), key=lambda kv: kv[0]):
        st = state.status()
        br = {m: st.burn_rates.get(m) for m in sorted({w.long_minutes for w in state.spec.alert_windows})}
        rows.append([
            st.slo, ",".join(f"{k}={v}" for k, v in st.labels.items()) or "-",
            _sli_text(st.sli, st.sli_upper), round(100 * st.error_budget_remaining, 1),
            " ".join(f"{span(m)}:{'-' if b is None else f'{b:.2f}'}" for m, b in br.items()),
            ", ".join(st.firing) or "-",
            ", ".join(st.young) or "-",
        ])
    print(render(["slo", "slice", "sli_% (range: undecided bad–good)", "budget_left_%", "burn_rate (long windows)", "firing",
                  "young (not judged yet)"], rows))
    unmatched = unmatched_lines(specs, {name for name, _key in result.evaluator.states})
    if unmatched:
        print("\n" + "\n".join(unmatched))
    undecided = [(name, state.status()) for (name, _key), state in sorted(result.evaluator.states.items(),
                                                                        key=lambda kv: kv[0])]
    undecided = [(name, st) for name, st in undecided if st.undecided_events]
    if undecided:
        print("\n" + "\n".join(
            f"{name} {','.join(f'{k}={v}' for k, v in st.labels.items()) or '-'}: {st.undecided_events:,} events lay "
            "in a runtime histogram bucket straddling the threshold (undecided: the SLI is a range; alerts and the "
            "budget count them good)" for name, st in undecided))
    fired = [c for c in result.changes if c.state == "firing"]
    print(f"\n{len(fired)} alerts fired over the replayed buckets "
          f"({sum(1 for c in result.changes if c.state == 'resolved')} resolved)")
    return 0


def _sli_text(sli: float | None, upper: float | None) -> float | str | None:
    """The SLI in percent; a range `lower–upper` where undecided events make one."""
    if sli is None:
        return None
    low = round(100 * sli, 3)
    if upper is None or round(100 * upper, 3) == low:
        return low
    return f"{low:g}–{round(100 * upper, 3):g}"


def unmatched_lines(specs: list[SloSpec], with_slices: set[str]) -> list[str]:
    """An SLO with no slice at all: its selector picked none of the store's buckets."""
    out = []
    for spec in specs:
        if spec.name not in with_slices:
            selector = ", ".join(f"{k}={v}" for k, v in spec.selector.items())
            why = " (or no request it picked reported the SLI's field)" if spec.sli_kind in REPORTED_KINDS else ""
            out.append(f"{spec.name}: selector {{{selector}}} matched no data in the store{why}; no slice to show")
    return out
