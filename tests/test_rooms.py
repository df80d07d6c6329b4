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
