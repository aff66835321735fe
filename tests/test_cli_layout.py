"""The CLI's shape (issue 23): command modules stand alone, share only `cli.common`, borrow no private name.

Read from the source (AST, function-level imports included), so a lazy import counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpucluster.cli import app, entry

CLI = Path(entry.__file__).parent
COMMAND_MODULES = sorted({command.__module__.rsplit(".", 1)[-1] for _, command in entry.COMMANDS}
                         | {"capacity"})  # a typer group of its own


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from gpucluster... import name` and `import gpucluster...` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpucluster"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.startswith("gpucluster")]
    return found


def test_every_command_is_in_the_table_once() -> None:
    names = [name for name, _ in entry.COMMANDS]
    assert len(names) == len(set(names))
    assert [c.name for c in app.registered_commands] == names
    assert [g.name for g in app.registered_groups] == ["capacity"]
    assert set(COMMAND_MODULES) == {"capacity", "doctor", "fleet", "jobs", "planning", "spend"}


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_a_command_module_imports_no_other_command_module(module: str) -> None:
    others = {f"gpucluster.cli.{m}" for m in COMMAND_MODULES if m != module} | {"gpucluster.cli.entry"}
    for source, name in _imports(CLI / f"{module}.py"):
        assert source not in others and f"{source}.{name}" not in others, (module, source, name)


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.name)
def test_no_cli_module_imports_a_private_name_and_none_is_long(path: Path) -> None:
    for source, name in _imports(path):
        assert not name.startswith("_") and not any(part.startswith("_") for part in source.split(".")), (
            path.name, source, name)
    assert len(path.read_text().splitlines()) < 900


def test_common_and_render_import_no_command_module() -> None:
    for shared in ("common.py", "render.py"):
        assert not [s for s, n in _imports(CLI / shared)
                    if s.startswith("gpucluster.cli.") or (s == "gpucluster.cli" and n != "render")]
