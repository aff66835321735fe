"""The stack-file language and what it is built on import downwards only (AST, function-level imports
included): `spec` nothing above it, `preflight` and `names` no component, the components not the
program's mapping. The whole package's import graph is the lead's test; these pin this layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "components" / "gpucluster"


def imported(path: Path) -> set[str]:
    """Every gpucluster module a file imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("gpucluster")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpucluster"):
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def files(*parts: str) -> list[Path]:
    target = PACKAGE.joinpath(*parts)
    return sorted(target.glob("*.py")) if target.is_dir() else [target.with_suffix(".py")]


@pytest.mark.parametrize(("where", "allowed"), [
    (("spec",), ("gpucluster.spec", "gpucluster.catalog", "gpucluster.fleet.tags")),
    (("preflight",), ("gpucluster.spec", "gpucluster.names", "gpucluster.node.", "gpucluster.noderole",
                      "gpucluster.parts")),
    # lambdas.handlers: the handlers' deployment contract, standard library only (the guard-state table name)
    (("names",), ("gpucluster.spec", "gpucluster.node.", "gpucluster.noderole",
                  "gpucluster.fleet.deployment")),
])
def test_a_layer_imports_only_what_is_below_it(where: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    for path in files(*where):
        above = sorted(m for m in imported(path) if not m.startswith(allowed))
        assert above == [], f"{path.relative_to(PACKAGE)} imports {above}"


def test_no_component_imports_the_program_side() -> None:
    """`stack`, `program`, `plan`, `project`, `ops` and `cli` use the components, never the reverse."""
    above = ("gpucluster.stack", "gpucluster.program", "gpucluster.plan", "gpucluster.project",
             "gpucluster.ops", "gpucluster.cli")
    for path in files("aws"):
        found = sorted(m for m in imported(path) if m.startswith(above) and m.split(".")[1] in
                       {a.split(".")[1] for a in above})
        assert found == [], path.name
