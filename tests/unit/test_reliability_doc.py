"""docs/reliability.md cannot drift from the tests: each row names a test that exists, and
its case count is what that test runs.

Counts are read from the test's source (no import, no collection): the product of its
``pytest.mark.parametrize`` cases, or for a hypothesis test ``max_examples + explicit
@example``s, written ``N + M``; a plain test is 1.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
ROW = re.compile(r"^\|(?P<what>[^|]+)\|\s*`(?P<test>[^`]+)`\s*\|(?P<cases>[^|]+)\|(.+)\|(.+)\|$")


def rows() -> list[tuple[str, str]]:
    """(test id, cases) of every table row that names a test."""
    found = []
    for line in DOC.read_text().splitlines():
        match = ROW.match(line.strip())
        if match:
            found.append((match["test"], match["cases"].strip()))
    return found


def _module_values(tree: ast.Module) -> dict[str, ast.expr]:
    values: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                values[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            values[node.target.id] = node.value
    return values


def _length(node: ast.expr, values: dict[str, ast.expr]) -> int:
    """Cases in a parametrize argvalues: a literal, a module-level name, or a comprehension
    over one (``[case[1:] for case in CASES]``)."""
    if isinstance(node, ast.Name):
        return _length(values[node.id], values)
    if isinstance(node, ast.List | ast.Tuple):
        return len(node.elts)
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        generator = node.generators[0]
        if not generator.ifs:
            return _length(generator.iter, values)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("items", "keys", "values")
        and isinstance(node.func.value, ast.Name)
    ):
        target = values[node.func.value.id]
        assert isinstance(target, ast.Dict)
        return len(target.keys)
    raise AssertionError(f"cannot count the cases of {ast.unparse(node)}")


def _max_examples(node: ast.expr, values: dict[str, ast.expr]) -> int | None:
    if isinstance(node, ast.Name) and node.id in values:
        return _max_examples(values[node.id], values)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "settings"
    ):
        for keyword in node.keywords:
            if keyword.arg == "max_examples":
                return int(ast.literal_eval(keyword.value))
    return None


def _name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target)


def cases(test_id: str) -> str:
    path, _, name = test_id.partition("::")
    source = ROOT / path
    assert source.is_file(), f"{path} does not exist"
    tree = ast.parse(source.read_text())
    values = _module_values(tree)
    functions = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    ]
    assert functions, f"{test_id}: no such test function"
    decorators = functions[0].decorator_list
    examples = sum(1 for d in decorators if _name(d) == "example")
    if any(_name(d) == "given" for d in decorators):
        generated = [m for d in decorators if (m := _max_examples(d, values)) is not None]
        assert len(generated) == 1, f"{test_id}: give max_examples in one settings(...)"
        return f"{generated[0]} + {examples}"
    counts = [
        _length(d.args[1], values)
        for d in decorators
        if isinstance(d, ast.Call) and _name(d) == "pytest.mark.parametrize"
    ]
    return str(math.prod(counts))


def test_the_table_has_rows() -> None:
    assert len(rows()) >= 10


@pytest.mark.parametrize(("test_id", "written"), rows(), ids=[r[0].split("::")[-1] for r in rows()])
def test_each_row_names_a_test_and_its_case_count(test_id: str, written: str) -> None:
    assert written == cases(test_id), f"{test_id}: the table says {written}"


def test_the_counter_counts() -> None:
    """The counter itself, on tests whose counts are known."""
    assert cases("tests/unit/test_reliability_doc.py::test_the_table_has_rows") == "1"
    assert (
        cases("tests/unit/test_manifests_security.py::test_every_manifest_is_a_valid_object") == "3"
    )
    with pytest.raises(AssertionError, match="no such test"):
        cases("tests/unit/test_reliability_doc.py::test_that_does_not_exist")
