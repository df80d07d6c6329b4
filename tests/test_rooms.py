"""The folders are the architecture, and arrows point down: a room imports only rooms below it
(docs/architecture.md). Every import counts, at the top of a module or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_every_room_imports_only_rooms_below_it():
    upward = [(module, target) for room in ORDER for module, target in _imports(room)
              if ORDER.index(target) < ORDER.index(room) and (room, target) not in BESIDE]
    assert upward == [], "imports that point up: " + ", ".join(f"{m} → {t}" for m, t in upward)


def test_every_room_is_placed():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(ORDER), sorted(packages ^ set(ORDER))


# What the stream runtime computes nothing of: the parts that do (the SLO engine, the signal
# view, the planner, the pages) are built by the tier composition (streams/tiers.py) and
# handed to it.
DOMAIN_ROOMS = ("signals", "planning", "alerts", "slo", "detectors")


def _module_imports(module: str) -> set[str]:
    """Every module `module` (dotted, a file under ROOT) imports, at any depth of its body."""
    path = ROOT / (module.replace(".", "/") + ".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names
                         if (ROOT / node.module.replace(".", "/") / f"{a.name}.py").exists())
    return found


def runtime_rooms(start: str = "tailwatch.streams.runtime") -> dict[str, str]:
    """Room → the first module that brings it in, over the runtime and every streams module it imports."""
    seen, todo, rooms = set(), [start], {}
    while todo:
        module = todo.pop()
        if module in seen or not (ROOT / (module.replace(".", "/") + ".py")).exists():
            continue
        seen.add(module)
        for name in sorted(_module_imports(module)):
            top = name.split(".")[0]
            if top == "streams":
                todo.append(name)
            elif top in ORDER:
                rooms.setdefault(top, module)
    return rooms


def test_the_runtime_imports_no_domain_room():
    found = {room: module for room, module in runtime_rooms().items() if room in DOMAIN_ROOMS}
    assert found == {}, "the runtime reaches domain rooms: " + ", ".join(f"{r} (through {m})" for r, m in found.items())


def test_the_domain_room_check_sees_a_room_the_tier_composition_imports():
    # The check can fail: the composition, which builds the domain parts, reaches them.
    assert {"signals", "alerts", "planning"} <= set(runtime_rooms("tailwatch.streams.tiers"))


def test_the_source_knows_nothing_of_the_embedded_broker():
    # Its group rescue is a watcher the tier composition hands the source (streams/group_rescue.py).
    assert not any(name.startswith("tailwatch_dev.broker") for name in _module_imports("tailwatch.streams.source"))
    assert "tailwatch_dev.broker" in _module_imports("tailwatch.streams.group_rescue")
