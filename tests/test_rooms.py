"""The folders are the architecture, and arrows point down: a room imports only rooms below it
(docs/architecture.md). Every import counts, at the top of a module or inside a function.

The runtime is one import namespace, `tailwatch.*`: its rooms are `tailwatch/<room>/` and the
command line is the modules directly in `tailwatch/`. The development tools are a
distribution of their own, `tailwatch_dev` (dev/), above the runtime: they import it, it never
imports them, and no cycle runs between them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tailwatch"
DEV = ROOT / "dev" / "tailwatch_dev"
CLI = "tailwatch"  # the command line: the modules directly in tailwatch/
# Top to bottom.
ORDER = ("tailwatch_dev", CLI, "deploy", "reports", "streams", "signals", "alerts", "dashboards", "store", "ingest",
         "detectors", "planning", "slo", "config", "conventions", "runbooks")
ROOMS = ORDER[2:]  # the subpackages of tailwatch/


def _room_of_module(path: Path) -> str:
    if path.is_relative_to(DEV):
        return "tailwatch_dev"
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else CLI


def _room_of_import(module: str, names: list[str]) -> list[str]:
    """The rooms an import statement reaches: `tailwatch.streams.x` → streams, `from tailwatch
    import store` → store, `tailwatch.cli` → the command line, `tailwatch_dev.…` → the tools."""
    parts = module.split(".")
    if parts[0] == "tailwatch_dev":
        return ["tailwatch_dev"]
    if parts[0] != "tailwatch":
        return []
    if len(parts) > 1:
        return [parts[1] if parts[1] in ROOMS else CLI]
    return [n if n in ROOMS else CLI for n in names]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted(DEV.rglob("*.py"))


def _imports() -> set[tuple[str, str, str]]:
    """(module path, its room, imported room) for every import of another room."""
    found = set()
    for path in _modules():
        room = _room_of_module(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [t for a in node.names for t in _room_of_import(a.name, [])]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = _room_of_import(node.module, [a.name for a in node.names])
            else:
                continue
            found |= {(str(path.relative_to(ROOT)), room, t) for t in targets if t != room}
    return found


@pytest.mark.slow
def test_every_room_imports_only_rooms_below_it():
    upward = [(module, target) for module, room, target in _imports() if ORDER.index(target) < ORDER.index(room)]
    assert upward == [], "imports that point up: " + ", ".join(f"{m} → {t}" for m, t in upward)


def test_the_runtime_never_imports_the_development_tools_and_no_cycle_runs_between_rooms():
    edges = {(room, target) for _m, room, target in _imports()}
    into_tools = sorted(m for m, room, target in _imports() if target == "tailwatch_dev")
    assert into_tools == [], f"the runtime imports the development tools: {into_tools}"
    # No cycle in the graph of rooms (depth-first search for a back edge), whatever the order says.
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}

    def cycle_from(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*trail, node, nxt]
            if nxt not in state and (found := cycle_from(nxt, [*trail, node])):
                return found
        state[node] = 2
        return None

    for room in ORDER:
        if room not in state:
            assert (found := cycle_from(room, [])) is None, "an import cycle: " + " → ".join(found)


def test_every_room_is_placed():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages == set(ROOMS), sorted(packages ^ set(ROOMS))


def test_the_runtime_installs_one_top_level_package(tmp_path):
    """A wheel of the runtime puts one name into site-packages, `tailwatch`, and none of the
    development tools: setuptools' own metadata build, as `pip install .` runs it."""
    subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "egg_info", "--egg-base",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True, text=True)
    (info,) = tmp_path.glob("*.egg-info")
    assert (info / "top_level.txt").read_text().split() == ["tailwatch"]
    sources = (info / "SOURCES.txt").read_text().split()
    assert not [s for s in sources if "tailwatch_dev" in s or s.startswith(("tools/", "dev/"))]
    assert "tailwatch/streams/runtime.py" in sources and "tailwatch/runbooks/slo-burn.md" in sources


# What the stream runtime computes nothing of: the parts that do (the SLO engine, the signal
# view, the planner, the pages) are built by the tier composition (streams/tiers.py) and
# handed to it.
DOMAIN_ROOMS = ("signals", "planning", "alerts", "slo", "detectors")


def _module_path(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def _module_imports(module: str) -> set[str]:
    """Every module `module` (dotted, `tailwatch.…`) imports, at any depth of its body."""
    path = _module_path(module)
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
        if module in seen or not _module_path(module).exists():
            continue
        seen.add(module)
        for name in sorted(_module_imports(module)):
            reached = _room_of_import(name, [])
            if name.startswith("tailwatch.streams."):
                todo.append(name)
            elif reached and reached[0] != "streams":
                rooms.setdefault(reached[0], module)
    return rooms


def test_the_runtime_imports_no_domain_room():
    found = {room: module for room, module in runtime_rooms().items() if room in DOMAIN_ROOMS}
    assert found == {}, "the runtime reaches domain rooms: " + ", ".join(f"{r} (through {m})" for r, m in found.items())


def test_the_domain_room_check_sees_a_room_the_tier_composition_imports():
    # The check can fail: the composition, which builds the domain parts, reaches them.
    assert {"signals", "alerts", "planning"} <= set(runtime_rooms("tailwatch.streams.tiers"))


def test_the_source_knows_nothing_of_the_embedded_broker():
    # The tier composition asks the development tools for their hooks by name, in one place, and
    # hands the source the embedded broker's consumer settings and group rescue (a watcher,
    # streams/group_rescue.py): no source, nor the watcher, imports the tools or asks for a hook.
    for module in ("tailwatch.streams.source", "tailwatch.streams.group_rescue", "tailwatch.streams.memory_source"):
        imports = _module_imports(module)
        assert not any(name.startswith("tailwatch_dev") for name in imports), module
        assert "tailwatch.config.plugins" not in imports, module
    assert "tailwatch.config.plugins" in _module_imports("tailwatch.streams.tiers")


# The store sink owns the DuckDB file: it reads the operator's state for it at start and
# writes its checkpoints. Besides it, only what it runs inside its store session touches the
# database: the stages it feeds and rebuilds from the store, and the roll-up it runs in a
# checkpoint's transaction. The runtime, the source, the operators and their steps see the
# store's state only as typed values (store.checkpoint.Restored, Checkpoint).
STORE_SINK_PARTS = {"store_sink", "stages", "slo_stage", "detector_stage", "fleet_metrics", "signal_stage", "rollup"}
DATABASE_MODULES = ("duckdb", "tailwatch.store.connection", "tailwatch.store.queries")


def _database_imports(module: str) -> list[str]:
    return sorted(name for name in _module_imports(module)
                  if any(name == d or name.startswith(d + ".") for d in DATABASE_MODULES))


def test_no_part_of_the_worker_but_the_store_sink_touches_the_database():
    streams = sorted(p.stem for p in (PACKAGE / "streams").glob("*.py") if p.stem != "__init__")
    assert STORE_SINK_PARTS <= set(streams), sorted(STORE_SINK_PARTS - set(streams))
    found = {m: names for m in streams if m not in STORE_SINK_PARTS
             if (names := _database_imports(f"tailwatch.streams.{m}"))}
    assert found == {}, "parts of the worker that read the store themselves: " + ", ".join(
        f"streams/{m}.py ({', '.join(n)})" for m, n in sorted(found.items()))


def test_the_database_check_sees_the_store_sinks_own_imports():
    # The check can fail: the store sink itself imports what it forbids the others.
    assert {"duckdb", "tailwatch.store.connection"} <= set(_database_imports("tailwatch.streams.store_sink"))
    assert "tailwatch.store.queries" in _database_imports("tailwatch.streams.rollup")
