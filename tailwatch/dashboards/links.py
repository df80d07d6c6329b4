"""Every link the tool writes, built one way: Alertmanager annotations and `generatorURL`,
dashboard links in reports, runbook links, and the dashboards' own data links.

Label values are whatever producers send (128 characters, any of them): a tenant holding `&`,
`#`, `=`, `%`, `/`, a space or non-ASCII text must land on its own slice, not cut the query
short or point the link at another. So each path segment and each query name and value is
percent-encoded whole (`urllib.parse`, RFC 3986: nothing is left unencoded but letters, digits
and `-._~`), and only the base a person configured (`--grafana-url`, `--runbook-url`) is written
as given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import quote, urlencode

# Grafana reads a dashboard variable from `var-<name>` in a link's query.
GRAFANA_VARIABLE_PREFIX = "var-"


def url(base: str, *segments: str, query: Iterable[tuple[str, str]] = ()) -> str:
    """`base` followed by `segments`, each one path segment (a `/` inside one is encoded, not a
    step), then `query` as `name=value` pairs, every part percent-encoded."""
    out = base.rstrip("/")
    for segment in segments:
        out += "/" + quote(segment, safe="")
    pairs = list(query)
    if pairs:
        out += "?" + urlencode(pairs, quote_via=quote, safe="")
    return out


def dashboard_url(grafana_url: str, uid: str, variables: Mapping[str, str] | None = None) -> str:
    """A Grafana dashboard by uid, its variables preset (`?var-tenant=…`)."""
    return url(grafana_url, "d", uid, query=[(GRAFANA_VARIABLE_PREFIX + name, value)
                                            for name, value in (variables or {}).items()])


def runbook_url(runbook_base_url: str, path: str) -> str:
    """`runbooks/slo-burn.md` under the runbook base: each step of the path a segment."""
    return url(runbook_base_url, *[step for step in path.split("/") if step])


def data_link(uid: str, fields: Mapping[str, str], keep_time: bool = True) -> str:
    """A Grafana data link (a panel's field links) to the dashboard `uid`, each variable set
    from a field of the clicked row. Grafana fills these in when the link is followed, so the
    placeholders are written as Grafana spells them, each asking Grafana to percent-encode the
    value it puts there (`:percentencode`), and the time range kept."""
    parts = [f"{quote(GRAFANA_VARIABLE_PREFIX + name, safe='')}=${{__data.fields.{field}:percentencode}}"
             for name, field in fields.items()]
    if keep_time:
        parts.append("${__url_time_range}")
    return url("", "d", uid) + ("?" + "&".join(parts) if parts else "")
