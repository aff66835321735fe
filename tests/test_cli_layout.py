"""The CLI's command table (issue 23): every command once, from the command modules the import-graph
test (tests/test_architecture.py) keeps apart; the shared modules import no command module.

Read from the source (AST, function-level imports included), so a lazy import counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpucluster.cli import app, entry
from test_architecture import command_modules, repo_graph

CLI = Path(entry.__file__).parent
COMMAND_MODULES = sorted({command.__module__.rsplit(".", 1)[-1] for _, command in entry.COMMANDS}
                         | {"capacity", "dashboards", "images"})  # typer groups of their own


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
    assert [g.name for g in app.registered_groups] == ["capacity", "dashboards", "image"]
    assert set(COMMAND_MODULES) == {"capacity", "dashboards", "doctor", "fleet", "images", "jobs", "planning",
                                    "spend", "verify"}
    assert {f"gpucluster.cli.{m}" for m in COMMAND_MODULES} == set(command_modules(repo_graph()))


def test_common_and_render_import_no_command_module() -> None:
    for shared in ("common.py", "render.py"):
        assert not [s for s, n in _imports(CLI / shared)
                    if s.startswith("gpucluster.cli.") or (s == "gpucluster.cli" and n != "render")]
