"""Charts for the cost report: matplotlib (Agg, no display) drawn to PNG and returned as
`data:` URIs, so the HTML carries its images inside itself and loads nothing.

Every chart says "no data" in words when it has nothing to draw, rather than an empty frame,
and time axes span the data itself: matplotlib widens a zero-width date range by years (a
run of seven minutes drew axes from 2025 to 2028), so a single point gets half a step each
side and the ticks follow the span (minutes for a short run, hours, days).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import math

import matplotlib

matplotlib.use("Agg")  # no display here, and none wanted: charts go into the HTML file

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import Formatter, PercentFormatter  # noqa: E402

ATTRIBUTED = "#3b6ea8"
IDLE = "#b9c7d8"
FLAG = "#c62828"
GOOD = "#2e7d32"
GREY = "#616161"
PAUSE = "#ef6c00"

plt.rcParams.update({
    "font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "axes.titleweight": "bold",
    "axes.titlesize": 10, "figure.dpi": 110, "svg.fonttype": "none",
})

class _Usd(Formatter):
    """Dollars with as many decimals as the tick step needs, the same on every tick: a
    seven-minute run costs cents, so fixed whole dollars would label every tick $0."""

    _step = 0.0

    def set_locs(self, locs) -> None:  # matplotlib hands over the ticks before formatting them
        self._step = abs(locs[1] - locs[0]) if len(locs) > 1 else 0.0

    def __call__(self, v, pos=None):
        step = self._step or abs(v)
        decimals = 0 if step >= 1 or step == 0 else min(6, max(2, -math.floor(math.log10(step))))
        return f"${v:,.{decimals}f}"


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _no_data(title: str, reason: str, height: float = 3.0) -> str:
    """A labelled panel instead of an empty frame: the reader learns why there is no line."""
    fig, ax = plt.subplots(figsize=(7.2, height))
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"No data: {reason}", ha="center", va="center", color=GREY, fontsize=10, transform=ax.transAxes,
            wrap=True)
    return _png(fig)


def _time_axis(ax, times: list[dt.datetime], step: dt.timedelta) -> None:
    """X limits from the data, half a step of margin each side (so one point is a visible
    range, not a zero-width one that matplotlib would widen to years), ticks to suit."""
    lo, hi = min(times) - step / 2, max(times) + step / 2
    ax.set_xlim(lo, hi)
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def daily_spend(days: list[dt.date], in_use: list[float], idle: list[float], flagged: dict[dt.date, float],
                labels: list[str] | None = None) -> str:
    """Stacked bars per day (fully loaded: GPU time in use + idle GPU time); flagged days outlined
    in red with their rise. `labels` name the bars (a day the data covers in part says so)."""
    if not days or not any(a + i > 0 for a, i in zip(in_use, idle)):
        return _no_data("GPU spend by day, fully loaded", "no GPU cost in this range")
    fig, ax = plt.subplots(figsize=(7.2, 3.0))
    x = list(range(len(days)))
    ax.bar(x, in_use, color=ATTRIBUTED, label="GPU time used by requests")
    ax.bar(x, idle, bottom=in_use, color=IDLE, label="idle GPU time")
    totals = [a + i for a, i in zip(in_use, idle)]
    for xi, day, total in zip(x, days, totals):
        if day in flagged:
            ax.bar([xi], [total], fill=False, edgecolor=FLAG, linewidth=2.2)
            ax.annotate(f"+{flagged[day] * 100:.0f}% spend,\nsuccess flat", (xi, total), textcoords="offset points",
                        xytext=(0, 4), ha="center", va="bottom", color=FLAG, fontweight="bold", fontsize=8.5)
    ax.set_xticks(x, labels or [d.strftime("%a %d %b") for d in days], rotation=0 if len(days) <= 4 else 45,
                  ha="center" if len(days) <= 4 else "right")
    ax.yaxis.set_major_formatter(_Usd())
    # The cost of the data each day holds: a bar of two hours is two hours' spend, not a day's.
    ax.set_ylabel("GPU cost of the day's data (USD)")
    ax.set_title("GPU spend by day, fully loaded")
    ax.set_ylim(0, max(totals + [1e-9]) * 1.28)
    ax.legend(loc="upper left", fontsize=7.5, frameon=False, ncol=2)
    return _png(fig)


def cost_per_turn_trend(times: list[dt.datetime], fully_loaded: list[float | None], attributed: list[float | None],
                        flagged_days: list[dt.date], step: dt.timedelta = dt.timedelta(hours=1)) -> str:
    """Cost per successful turn over time (one point per `step`: a minute, an hour or a day),
    flagged days shaded."""
    title = "Cost per successful turn"
    if not _finite(fully_loaded) and not _finite(attributed):
        return _no_data(title, "no successful turns in this range, so no cost per successful turn")
    fig, ax = plt.subplots(figsize=(7.2, 3.0))
    few = len(times) < 40  # markers, so isolated points (a minute between gaps) still show
    ax.plot(times, [v if v is not None else float("nan") for v in fully_loaded], color=ATTRIBUTED, linewidth=1.6,
            marker="o" if few else None, markersize=3, label="fully loaded")
    ax.plot(times, [v if v is not None else float("nan") for v in attributed], color=GREY, linewidth=1.0,
            linestyle="--", marker="." if few else None, markersize=3, label="attributed")
    for i, day in enumerate(flagged_days):
        start = dt.datetime.combine(day, dt.time())
        ax.axvspan(start, start + dt.timedelta(days=1), color=FLAG, alpha=0.10, lw=0,
                   label="flagged: spend up, success flat" if i == 0 else None)
    _time_axis(ax, times, step)
    ax.yaxis.set_major_formatter(_Usd())  # as many decimals as the ticks' step: never two ticks alike
    ax.set_ylabel("USD per successful turn")
    ax.set_ylim(bottom=0)
    ax.set_title("Cost per successful turn")
    ax.legend(loc="lower left", fontsize=7.5, frameon=False, ncol=3)
    return _png(fig)


def cost_by_tenant(tenants: list[str], in_use: list[float], idle_share: list[float]) -> str:
    """Horizontal stacked bars per tenant: fully loaded cost = GPU time in use + allocated idle."""
    if not tenants or not any(a + i > 0 for a, i in zip(in_use, idle_share)):
        return _no_data("Cost by tenant", "no GPU cost in this range")
    fig, ax = plt.subplots(figsize=(7.2, 0.45 * len(tenants) + 1.0))
    y = list(range(len(tenants)))[::-1]
    ax.barh(y, in_use, color=ATTRIBUTED, label="GPU time used by requests")
    ax.barh(y, idle_share, left=in_use, color=IDLE, label="allocated idle GPU time")
    for yi, a, i in zip(y, in_use, idle_share):
        ax.annotate(f"${a + i:,.2f}", (a + i, yi), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
    ax.set_yticks(y, tenants)
    ax.xaxis.set_major_formatter(_Usd())
    ax.set_xlabel("GPU cost over the range, fully loaded (USD)")
    ax.set_xlim(0, max([a + i for a, i in zip(in_use, idle_share)] + [1e-9]) * 1.18)
    ax.set_title("Cost by tenant")
    ax.legend(loc="lower right", fontsize=7.5, frameon=False)
    return _png(fig)


def goodput_vs_throughput(times: list[dt.datetime], turns: list[int], successful: list[int], per: str,
                          step: dt.timedelta = dt.timedelta(hours=1)) -> str:
    """Throughput (all turns) against goodput (successful turns) over time, goodput ratio beside."""
    if not any(turns):
        return _no_data("Goodput vs throughput", "no turns in this range")
    fig, ax = plt.subplots(figsize=(7.2, 3.0))
    few = len(times) < 40
    ax.plot(times, turns, color=GREY, linewidth=1.4, marker="o" if few else None, markersize=3,
            label=f"throughput: turns per {per}")
    ax.plot(times, successful, color=GOOD, linewidth=1.4, marker="o" if few else None, markersize=3,
            label=f"goodput: successful turns per {per}")
    ax.fill_between(times, successful, turns, where=[t >= s for s, t in zip(successful, turns)], color=FLAG,
                    alpha=0.15, lw=0, label="turns that failed")
    ax.set_ylabel(f"turns per {per}")
    ax.set_ylim(bottom=0, top=max([*turns, *successful]) * 1.08)
    _time_axis(ax, times, step)
    ax2 = ax.twinx()
    # A chain's success can land a minute after its turn: cap the ratio at 100%.
    ratio = [min(s / t, 1.0) if t else float("nan") for s, t in zip(successful, turns)]
    ax2.plot(times, ratio, color=GOOD, linewidth=0.8, linestyle=":", marker="." if few else None,
             label="goodput ratio (right)")
    ax2.set_ylim(0, 1.05)
    ax2.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax2.spines["right"].set_visible(True)
    ax.set_title("Goodput vs throughput")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    # Below the frame: inside it the legend hid the low end of the lines.
    ax.legend(h1 + h2, l1 + l2, loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7.5, frameon=False, ncol=2)
    return _png(fig)


def series_over_time(title: str, ylabel: str, times: list[dt.datetime], series: dict[str, list[float | None]],
                     step: dt.timedelta = dt.timedelta(minutes=1), percent: bool = False,
                     threshold: float | None = None, threshold_label: str = "",
                     bands: list[tuple[dt.datetime, dt.datetime, str]] | None = None) -> str:
    """One line per named series (a model version, a pool) over event time; a dashed line at
    `threshold` (an SLO target) when given; `bands` shade spans (from, to, label), such as the
    minutes a rollout verdict said pause or rollback (red for rollback, amber otherwise)."""
    if not times or not any(_finite(v) for v in series.values()):
        return _no_data(title, "nothing measured in this range")
    fig, ax = plt.subplots(figsize=(7.2, 3.0))
    few = len(times) < 40
    for name, values in series.items():
        ax.plot(times, [v if v is not None else float("nan") for v in values], linewidth=1.4,
                marker="o" if few else None, markersize=3, label=name)
    for start, end, label in bands or []:
        ax.axvspan(start, end, color=FLAG if label.endswith("rollback") else PAUSE, alpha=0.12, lw=0,
                   label=label if label not in ax.get_legend_handles_labels()[1] else None)
    if threshold is not None:
        ax.axhline(threshold, color=FLAG, linestyle="--", linewidth=1.0, label=threshold_label or None)
    _time_axis(ax, times, step)
    if percent:
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=7.5, frameon=False, ncol=3)
    return _png(fig)
