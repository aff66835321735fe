"""The CLI's command table (issue 23): every command once, from the command modules the import-graph
test (tests/test_architecture.py) keeps apart; the shared modules import no command module.

Read from the source (AST, function-level imports included), so a lazy import counts too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from gpucluster.cli import app, entry
from gpucluster.cli.common import GroupOption, StackArg
from test_architecture import command_modules, repo_graph

CLI = Path(entry.__file__).parent
COMMAND_MODULES = sorted({command.__module__.rsplit(".", 1)[-1] for _, command in entry.COMMANDS}
                         | {"capacity", "dashboards", "images", "prices"})  # typer groups of their own


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
    assert [g.name for g in app.registered_groups] == ["capacity", "dashboards", "image", "catalog"]
    assert set(COMMAND_MODULES) == {"capacity", "dashboards", "doctor", "fleet", "images", "jobs", "planning",
                                    "prices", "spend", "verify"}
    assert {f"gpucluster.cli.{m}" for m in COMMAND_MODULES} == set(command_modules(repo_graph()))


def test_common_and_render_import_no_command_module() -> None:
    for shared in ("common.py", "render.py"):
        assert not [s for s, n in _imports(CLI / shared)
                    if s.startswith("gpucluster.cli.") or (s == "gpucluster.cli" and n != "render")]


# ----------------------------------------------------------------------------------------- --help

TYPE_LABEL = re.compile(r"[{}]|<[\w |.-]+>")  # typer's `{stack}` (a required argument) and `<str>`, `<path>`


def help_problems(text: str) -> list[str]:
    """The usage line and each argument's and option's name column of a `--help`, where they show typer's
    braces or a type label instead of a metavar (`STACK`, `[JOB]`, `--group GROUP`)."""
    lines = text.splitlines()
    usage = next(line for line in lines if line.startswith("Usage:"))
    terms, section = [], None
    for line in lines:
        if line in ("Arguments:", "Options:", "Commands:"):
            section = line
        elif section in ("Arguments:", "Options:") and re.match(r"  \S", line):
            terms.append(re.split(r"\s{2,}", line.strip(), maxsplit=1)[0])
    return [piece for piece in [usage, *terms] if TYPE_LABEL.search(piece)]


def command_paths() -> list[list[str]]:
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    return [[name, *([sub] if sub else [])] for name, command in root.commands.items()
            for sub in (getattr(command, "commands", None) or {"": None})]


def test_every_commands_help_shows_metavars_not_typer_labels() -> None:
    paths = command_paths()
    assert ["image", "build"] in paths and ["plan"] in paths and len(paths) > 20
    runner = CliRunner()
    for path in [[], *paths]:
        done = runner.invoke(app, [*path, "--help"])
        assert done.exit_code == 0, (path, done.output)
        assert help_problems(done.output) == [], path
    image_build = runner.invoke(app, ["image", "build", "--help"]).output
    assert "Usage: root image build [OPTIONS] STACK\n" in image_build


def test_the_help_check_catches_typer_labels() -> None:
    plain = typer.Typer(rich_markup_mode=None)  # plain help, as `gpucluster` prints it

    @plain.command()
    def build(stack: StackArg, group: GroupOption = None, days: int = 7) -> None:
        """A command built with typer's own command class."""

    problems = help_problems(CliRunner().invoke(plain, ["--help"]).output)
    assert problems == ["Usage: build [OPTIONS] {STACK}", "STACK <str>", "--days <int>"]
