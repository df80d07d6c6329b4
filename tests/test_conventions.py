"""Every metric, recording rule and topic name is defined once, in `conventions`, and
the code spells none of them anywhere else."""

import ast
import re
from pathlib import Path

import pytest

from tailwatch import conventions
from tailwatch.streams.metrics import HttpMetrics, WorkerMetrics

ROOT = Path(__file__).resolve().parent.parent


def _sources() -> list[Path]:
    """Every module of the runtime and the development tools but `conventions` itself."""
    return [p for p in sorted((ROOT / "tailwatch").rglob("*.py")) + sorted((ROOT / "dev").rglob("*.py"))
            if "conventions" not in p.parts]
METRIC_NAME = re.compile(r"tailwatch_(?!dev\b)[a-z_]+")  # tailwatch_dev: the development tools' package


def _names() -> dict[str, str]:
    return {k: v for k, v in vars(conventions).items() if k.isupper() and isinstance(v, str)}


def _code_strings(path: Path):
    """String constants of a module's code: docstrings are prose, not names in use."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node


@pytest.mark.slow
def test_no_module_spells_a_metric_name_of_its_own():
    spelled = [f"{p.relative_to(ROOT)}:{node.lineno}: {m}"
               for p in _sources()
               for node in _code_strings(p) for m in METRIC_NAME.findall(node.value)]
    assert not spelled, "metric names belong in conventions/__init__.py:\n" + "\n".join(spelled)


def test_no_module_names_a_topic_of_its_own():
    spelled = []
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "topic"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                spelled.append(f"{p.relative_to(ROOT)}:{node.lineno}: topic({node.args[0].value!r})")
    assert not spelled, "topic suffixes belong in conventions/__init__.py:\n" + "\n".join(spelled)


def test_each_name_is_defined_once_and_follows_prometheus_conventions():
    names = _names()
    # A label value is no metric name: the overflow value of the cardinality caps.
    metrics = {k: v for k, v in names.items() if not k.startswith("TOPIC_") and k != "OVERFLOW_LABEL_VALUE"}
    assert len(set(metrics.values())) == len(metrics), "two constants for one name"
    assert len(set(conventions.TOPIC_SUFFIXES)) == len(conventions.TOPIC_SUFFIXES) == 6
    for const, name in metrics.items():
        if const.endswith("_RULE"):  # level:metric:operation, as Prometheus' recording rule convention
            assert re.fullmatch(r"tailwatch_[a-z_]+:[a-z_]+:[a-z]+", name), name
            continue
        assert re.fullmatch(r"tailwatch_[a-z][a-z0-9_]*", name), name
        assert const == name.removeprefix("tailwatch_").upper(), (const, name)  # the constant reads as the name
        assert not name.endswith(("_bucket", "_count", "_sum", "_created")), name  # the exposition adds those


@pytest.mark.slow
def test_every_name_is_used_and_every_family_the_worker_exposes_is_named():
    used = set()
    for p in _sources():
        tree = ast.parse(p.read_text())
        used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and n.module == "tailwatch.conventions" for a in n.names}
    unused = sorted(set(_names()) - used - {"TOPIC_SUFFIXES", "TOPIC_ALERTS"})  # tw.alerts: reserved, created only
    assert not unused, f"names nothing uses: {unused}"

    defined = set(_names().values())
    exposed = set()
    for registry in (WorkerMetrics().registry, HttpMetrics().registry):
        for family in registry.collect():
            exposed.add(family.name + "_total" if family.type == "counter" else family.name)
    assert len(exposed) == 26 and exposed <= defined, sorted(exposed - defined)
