"""The runbooks that pages, dashboards and reports link to, packaged with tailwatch (the
image holds them) and served by the worker on its HTTP port as `GET /runbooks/<name>.md`,
so a link written with the worker's address as its base opens wherever the worker is
reachable. Every link is `<base>/runbooks/<name>.md`.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

LINK_DIR = "runbooks"  # the path segment every runbook link carries under its base URL
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}\.md$")


def names() -> list[str]:
    """Every packaged runbook's file name."""
    return sorted(f.name for f in resources.files(__name__).iterdir() if _NAME.match(f.name))


def text(name: str) -> str | None:
    """A runbook's Markdown, or None when no runbook has that name (a path is never read)."""
    if not _NAME.match(name):
        return None
    found = resources.files(__name__) / name
    return found.read_text(encoding="utf-8") if found.is_file() else None


def packaged_base_url() -> str:
    """The `file://` URL under which `runbooks/<name>.md` is this installation's own copy."""
    return Path(__file__).resolve().parents[1].as_uri() + "/"
