"""How the reports name the time their figures cover: a span in words, a day that the data
covers only in part, and a per-day rate only where a whole day stands behind it.

A report of two hours must not read as a day's spend: every figure says the period it counts,
and a day with less than 24 hours of data says how many hours it holds.
"""

from __future__ import annotations

import datetime as dt

MINUTES_PER_DAY = 24 * 60


def span_text(span: dt.timedelta) -> str:
    """`2 h`, `7 min`, `1 d 3 h 20 min`: whole minutes, largest unit first, zeros left out."""
    minutes = int(span.total_seconds() // 60)
    days, rest = divmod(minutes, MINUTES_PER_DAY)
    hours, mins = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{mins} min" if mins else ""]
    return " ".join(p for p in parts if p) or "0 min"


def day_label(day: dt.date, minutes_with_data: int) -> str:
    """The day, and how much of it the data covers when not all of it: `2026-11-02 (2 h of 24)`."""
    if minutes_with_data >= MINUTES_PER_DAY:
        return day.isoformat()
    if minutes_with_data < 60:
        return f"{day.isoformat()} ({minutes_with_data} min of 24 h)"
    hours = minutes_with_data / 60
    return f"{day.isoformat()} ({hours:.0f} h of 24)" if minutes_with_data % 60 == 0 \
        else f"{day.isoformat()} ({hours:.1f} h of 24)"


def per_day_rate(total: float, span: dt.timedelta) -> float | None:
    """`total` over `span` as a rate per 24 h; None under a day of data, where a rate would be
    an extrapolation the reader could take for a day's figure."""
    if span < dt.timedelta(days=1):
        return None
    return total / (span / dt.timedelta(days=1))


def minute_range_text(first: dt.datetime, end: dt.datetime) -> str:
    """`2026-11-02 00:00 to 01:59 UTC`: the first and the last minute with data (the day
    repeated only when it changes)."""
    last = end - dt.timedelta(minutes=1)
    tail = last.strftime("%H:%M") if last.date() == first.date() else last.strftime("%Y-%m-%d %H:%M")
    return f"{first.strftime('%Y-%m-%d %H:%M')} to {tail} UTC"
