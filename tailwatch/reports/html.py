"""The HTML reports' one way to write a page: Jinja2 templates (`reports/templates/`) with
autoescape on, so no value from the store (a tenant, a model name) can become markup; the
shared stylesheet, page frame and table macro; and the number formats both reports use.

Pages are self-contained (inline CSS, charts as data URIs): they are mailed and archived.
"""

from __future__ import annotations

import math

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

ENV = Environment(loader=PackageLoader("reports", "templates"), autoescape=select_autoescape(("html",)),
                  undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)


def render(template: str, **context) -> str:
    return ENV.get_template(template).render(**context)


def usd(x: float | None, unit: bool = False) -> str:
    """Dollars: cents for amounts, and at least 3 significant digits for small unit costs
    (a $/audio-s of 0.0000671 must not read as 0.0001), never in scientific notation."""
    if x is None:
        return "–"
    if x == 0:
        return "0.00"
    if (unit and abs(x) < 100) or abs(x) < 1:
        decimals = max(4, 2 - math.floor(math.log10(abs(x))))
        return f"{x:,.{decimals}f}"
    return f"{x:,.2f}"


def pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x * 100:.{digits}f}"


def count(x: float | None) -> str:
    return "–" if x is None else f"{int(x):,}"


def scale(x: float | None) -> str:
    """1.000 where the requests' own GPU-seconds fit in the GPUs' time; below 1 where scaled down."""
    return "–" if x is None else f"{x:.3f}"


def note(text: str) -> Markup:
    """A cell's small grey aside, after an escaped value."""
    return Markup("<span class='note'>{}</span>").format(text)
