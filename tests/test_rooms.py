"""The folders are the architecture, and arrows point down: a room imports only rooms below it
(docs/architecture.md). Every import counts, at the top of a module or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Top to bottom.
ORDER = ("tailwatch", "tailwatch_dev", "deploy", "reports", "streams", "signals", "alerts", "dashboards", "store", "ingest", "detectors",
         "planning", "slo", "config", "conventions", "runbooks")
# The developer tools print through the command line's progress line and tables, and the
# command line runs them (`tailwatch bench`, `eval`, `fuzz`): the two entry-point rooms know
# each other, and nothing below knows either.
BESIDE = {("tailwatch_dev", "tailwatch")}


def _imports(room: str) -> set[tuple[str, str]]:
    """(module path, imported room) for every import of another room."""
    found = set()
    for path in sorted((ROOT / room).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                if top in ORDER and top != room:
                    found.add((str(path.relative_to(ROOT)), top))
    return found


@pytest.mark.slow
def test_every_room_imports_only_rooms_below_it():
    upward = [(module, target) for room in ORDER for module, target in _imports(room)
              if ORDER.index(target) < ORDER.index(room) and (room, target) not in BESIDE]
    assert upward == [], "imports that point up: " + ", ".join(f"{m} → {t}" for m, t in upward)


def test_every_room_is_placed():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(ORDER), sorted(packages ^ set(ORDER))
