"""gpucluster's shape, read from its source: no import cycle, imports flowing down, small modules.

Issue 23's "Done when" checks, over the AST import graph of components/gpucluster
(tests/import_graph.py: function-level and type-only imports included, relative
imports resolved, `from pkg import mod` read as the module). Imports flow down:
cli -> ops/plan -> stack -> aws -> node/preflight -> spec/catalog; the Lambda
handlers and the policy rules stand alone. Each check returns the offenders as
report lines, so a failure names every module, import and line to fix; the
self-tests at the end run the same checks on small packages written to
tmp_path, so none of them can pass for want of reading anything.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

from import_graph import Import, ImportGraph

COMPONENTS = Path(__file__).resolve().parents[1] / "components"
PACKAGE = "gpucluster"
MAX_LINES = 900
ABOVE_SPEC = ("aws", "node", "names", "project", "stack", "ops", "cli", "preflight", "plan", "program")
"""What the stack language must not import: everything that renders, deploys or runs a spec."""
POLICY_RULES = ("gpucluster.policy.rules", "gpucluster.policy.records")
"""The pure side of the policy pack: what CrossGuard and `gpucluster plan` share."""
LAMBDAS = "gpucluster.lambdas"
"""The guardrail handlers: thin entry points, each importing the fleet core and nothing else of gpucluster."""
FLEET = "gpucluster.fleet"
"""The fleet core (node groups, guard state, stops, SSM, Slurm holds): carried into the Lambda archive."""
LAMBDA_RUNTIME = frozenset({"boto3", "botocore"})
"""What a Lambda's Python runtime has besides the standard library."""
CLI = "gpucluster.cli"
CLI_TABLE = "gpucluster.cli.entry"
"""The command table: registers every command module's commands on the app, in `--help` order."""
CLI_SHARED = frozenset({CLI, f"{CLI}.__main__", f"{CLI}.common", f"{CLI}.render", CLI_TABLE})
"""The CLI modules that hold no command: the shared options and helpers, the renderer, the table."""
JOB_BACKENDS = "gpucluster.ops.jobbackends"
"""The job-backend interface and its chooser; each backend is a module below it, which the CLI never names."""


@cache
def repo_graph() -> ImportGraph:
    return ImportGraph(COMPONENTS, PACKAGE)


# ----------------------------------------------------------------------- checks


def chain_text(chain: list[Import]) -> str:
    """`a (line 3) -> b (line 9) -> c`: who imports whom, and where."""
    return " -> ".join([f"{i.source} ({i.where()})" for i in chain] + [chain[-1].target])


def _pulumi(target: str) -> bool:
    top = target.split(".")[0]
    return top == "pulumi" or top.startswith("pulumi_")


def import_cycles(graph: ImportGraph) -> list[str]:
    """Each cycle's modules, then for each module its imports of the cycle's other modules."""
    edges = graph.edges()
    report = []
    for n, cycle in enumerate(graph.cycles(), 1):
        report.append(f"cycle {n} ({len(cycle)} modules): {', '.join(cycle)}")
        for module in cycle:
            inside = [f"{target} ({'; '.join(i.where() for i in statements)})"
                      for target, statements in sorted(edges[module].items()) if target in cycle]
            report.append(f"  {module} -> {'; '.join(inside)}")
    return report


def spec_imports_above_it(graph: ImportGraph) -> list[str]:
    """Modules above the spec that the spec package reaches, directly or through others, with the chain."""
    spec = graph.under(f"{PACKAGE}.spec")
    assert spec, f"no {PACKAGE}.spec in {graph.root}"

    def above(module: str) -> bool:
        return any(module == f"{PACKAGE}.{p}" or module.startswith(f"{PACKAGE}.{p}.") for p in ABOVE_SPEC)

    return [f"{module}: {chain_text(chain)}"
            for module, chain in sorted(graph.reach(spec, above).items()) if above(module)]


def _outside_lambda_runtime(target: str) -> bool:
    top = target.split(".")[0]
    return top not in sys.stdlib_module_names and top not in LAMBDA_RUNTIME


def fleet_imports_outside(graph: ImportGraph) -> list[str]:
    """Imports of the fleet core reaching outside it: any other gpucluster module, Pulumi, or a package
    a Lambda's runtime lacks (the archive carries the core alone)."""
    own = set(graph.under(FLEET))
    assert own, f"no {FLEET} in {graph.root}"
    return [f"{i.source} ({i.where()}) imports {i.target}" for i in graph.imports if i.source in own
            and ((i.internal and i.target not in own)
                 or (not i.internal and _outside_lambda_runtime(i.target)))]


def lambda_imports_outside(graph: ImportGraph) -> list[str]:
    """Imports of a handler reaching past the fleet core: another handler, any other gpucluster module,
    Pulumi, or a package a Lambda's runtime lacks."""
    own = set(graph.under(LAMBDAS))
    assert own, f"no {LAMBDAS} in {graph.root}"
    core = set(graph.under(FLEET))
    return [f"{i.source} ({i.where()}) imports {i.target}" for i in graph.imports if i.source in own
            and ((i.internal and i.target not in core and i.target != LAMBDAS)
                 or (not i.internal and _outside_lambda_runtime(i.target)))]


def policy_rule_imports_of_pulumi(graph: ImportGraph) -> list[str]:
    """Pulumi, pulumi_policy or AWS SDK imports in the rules or in anything the rules import."""
    rules = [m for p in POLICY_RULES for m in graph.under(p)]
    assert rules, f"none of {', '.join(POLICY_RULES)} in {graph.root}"
    report = []
    for module, chain in sorted(graph.reach(rules).items()):
        for i in graph.imports:
            if i.source == module and not i.internal and (_pulumi(i.target) or i.target.split(".")[0] in (
                    "boto3", "botocore")):
                report.append(f"{module} ({i.where()}) imports {i.target}"
                              + (f", reached by {chain_text(chain)}" if chain else ""))
    return report


def cli_private_imports(graph: ImportGraph) -> list[str]:
    """Private names a CLI module takes from another module, one line per import statement."""
    grouped: dict[tuple[str, int, str, str], list[str]] = defaultdict(list)
    for module in graph.under(CLI):
        for i, name in graph.private_uses(module):
            grouped[(module, i.line, i.where(), i.target)].append(name)
    return [f"{module} ({where}): {', '.join(names)} from {target}"
            for (module, _, where, target), names in sorted(grouped.items())]


def command_modules(graph: ImportGraph, shared: frozenset[str] = CLI_SHARED) -> list[str]:
    """Every CLI module but the shared ones: each holds commands of one concern."""
    return [m for m in graph.under(CLI) if m not in shared]


def command_module_imports(graph: ImportGraph, shared: frozenset[str] = CLI_SHARED) -> list[str]:
    """Imports from one command module of another, or of the command table (which imports them all)."""
    commands = set(command_modules(graph, shared))
    edges = graph.edges()
    return [f"{module} ({'; '.join(i.where() for i in statements)}) imports command module {target}"
            for module in sorted(commands) for target, statements in sorted(edges[module].items())
            if target in commands or target == CLI_TABLE]


def cli_imports_of_job_backends(graph: ImportGraph) -> list[str]:
    """Imports by a CLI module of a job backend's module: the CLI gets its backend from the chooser."""
    edges = graph.edges()
    return [f"{module} ({'; '.join(i.where() for i in statements)}) imports job backend {target}"
            for module in graph.under(CLI) for target, statements in sorted(edges[module].items())
            if target.startswith(JOB_BACKENDS + ".")]


def cli_reads_of_scheduler(graph: ImportGraph) -> list[str]:
    """`.scheduler` read on anything in a CLI module: which scheduler runs the jobs is the job backend's."""
    return [f"{module} (line {node.lineno}): .scheduler" for module in graph.under(CLI)
            for node in ast.walk(graph.modules[module].tree)
            if isinstance(node, ast.Attribute) and node.attr == "scheduler"]


def oversized_modules(graph: ImportGraph) -> list[str]:
    return [f"{graph.relative(name)}: {module.lines} lines" for name, module in sorted(graph.modules.items())
            if module.lines > MAX_LINES]


# ------------------------------------------------------------ gpucluster itself


def test_no_import_cycle_among_gpucluster_modules() -> None:
    report = import_cycles(repo_graph())
    assert not report, ("gpucluster modules import each other in a circle (function-level and type-only "
                        "imports included); each module's imports inside its cycle:\n" + "\n".join(report))


def test_spec_imports_nothing_above_it() -> None:
    report = spec_imports_above_it(repo_graph())
    assert not report, (f"{PACKAGE}.spec must import none of {', '.join(ABOVE_SPEC)} (checks that need "
                        "rendered artefacts belong in preflight); it reaches:\n" + "\n".join(report))


def test_fleet_core_imports_only_itself_the_standard_library_and_boto3() -> None:
    report = fleet_imports_outside(repo_graph())
    assert not report, (f"{FLEET} is carried into the Lambda archive on its own: it may import only its "
                        "own modules, the standard library and boto3:\n" + "\n".join(report))


def test_handlers_import_only_the_fleet_core() -> None:
    report = lambda_imports_outside(repo_graph())
    assert not report, (f"{LAMBDAS} holds thin handlers: each may import the fleet core ({FLEET}), the "
                        "standard library and boto3, never another handler:\n" + "\n".join(report))


def test_policy_rules_import_no_pulumi() -> None:
    report = policy_rule_imports_of_pulumi(repo_graph())
    assert not report, ("the policy rules are pure (pack.py alone speaks pulumi_policy):\n"
                        + "\n".join(report))


def test_no_cli_module_imports_a_private_name() -> None:
    report = cli_private_imports(repo_graph())
    assert not report, ("CLI modules take private names from other modules; make the shared ones public "
                        "in the CLI's shared module:\n" + "\n".join(report))


def test_no_command_module_imports_another() -> None:
    graph = repo_graph()
    report = command_module_imports(graph)
    assert {f"{CLI}.{m}" for m in ("planning", "fleet", "jobs", "capacity")} <= set(command_modules(graph))
    assert not report, (f"command modules ({', '.join(command_modules(graph))}) import each other; they "
                        "share only the CLI's shared module:\n" + "\n".join(report))


def test_no_cli_module_imports_a_job_backend() -> None:
    report = cli_imports_of_job_backends(repo_graph())
    assert not report, "CLI modules naming a job backend (ask ops.jobbackends):\n" + "\n".join(report)


def test_no_cli_module_reads_the_scheduler() -> None:
    report = cli_reads_of_scheduler(repo_graph())
    assert not report, "CLI modules reading spec.scheduler (ask the job backend):\n" + "\n".join(report)


def test_no_module_over_900_lines() -> None:
    report = oversized_modules(repo_graph())
    assert not report, f"modules over {MAX_LINES} lines (split them by concern):\n" + "\n".join(report)


# --------------------------------------------------------- the checks, checked


def write_package(tmp_path: Path, files: dict[str, str]) -> ImportGraph:
    """A `gpucluster` package of `files` (path under the package -> source) and its graph."""
    for name, source in files.items():
        path = tmp_path / "src" / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
    return ImportGraph(tmp_path / "src", PACKAGE)


def targets(graph: ImportGraph, module: str) -> dict[str, list[int]]:
    return {t: [i.line for i in statements] for t, statements in graph.edges()[module].items()}


def test_a_cycle_through_a_function_level_import_is_found_with_its_lines(tmp_path: Path) -> None:
    graph = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from gpucluster.b import helper\n",
        "b.py": """
            def helper() -> None:
                from gpucluster import a  # hidden in a function: still an edge
            """,
        "c.py": "from gpucluster import a\n",
    })
    assert graph.cycles() == [["gpucluster.a", "gpucluster.b"]]
    assert import_cycles(graph) == ["cycle 1 (2 modules): gpucluster.a, gpucluster.b",
                                    "  gpucluster.a -> gpucluster.b (line 1)",
                                    "  gpucluster.b -> gpucluster.a (line 2)"]


def test_relative_imports_resolve_against_the_importing_module(tmp_path: Path) -> None:
    graph = write_package(tmp_path, {
        "__init__.py": "",
        "pkg/__init__.py": "from .other import thing\n",
        "pkg/other.py": "thing = 1\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/sibling.py": "",
        "pkg/sub/mod.py": """
            from ..other import thing
            from . import sibling
            from .. import other
            from ... import VERSION
            """,
    })
    assert targets(graph, "gpucluster.pkg") == {"gpucluster.pkg.other": [1]}
    assert targets(graph, "gpucluster.pkg.sub.mod") == {
        "gpucluster.pkg.other": [1, 3], "gpucluster.pkg.sub.sibling": [2], "gpucluster": [4]}


def test_from_package_import_module_is_the_module(tmp_path: Path) -> None:
    graph = write_package(tmp_path, {
        "__init__.py": "VERSION = '1'\n",
        "names.py": "",
        "catalog/__init__.py": "",
        "user.py": """
            from gpucluster import VERSION, catalog, names
            import gpucluster.names as n
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from gpucluster.names import Rule
            """,
    })
    assert targets(graph, "gpucluster.user") == {"gpucluster": [1], "gpucluster.catalog": [1],
                                                 "gpucluster.names": [1, 2, 5]}
    by_target = {(i.target, i.line): i for i in graph.imports if i.source == "gpucluster.user"}
    assert by_target[("gpucluster", 1)].names == ("VERSION",)
    assert by_target[("gpucluster.names", 1)].bound == "names"
    assert by_target[("gpucluster.names", 2)].bound == "n"
    assert by_target[("gpucluster.names", 5)].type_only


GOOD = {
    "__init__.py": '"""The public API."""\n',
    "catalog/__init__.py": "import yaml\n",
    "spec/__init__.py": "from gpucluster.spec.models import StackSpec\n",
    "spec/models.py": """
        from gpucluster import catalog
        from . import findings

        class StackSpec: ...
        """,
    "spec/findings.py": "",
    "names.py": "from gpucluster.spec import StackSpec\n",
    "node/__init__.py": "",
    "node/userdata.py": "from gpucluster.spec import StackSpec\n",
    "preflight.py": """
        from gpucluster import names, spec

        def check() -> None:
            from gpucluster.node import userdata
        """,
    "aws/__init__.py": "",
    "aws/nodes.py": "import pulumi\nfrom gpucluster import preflight\nfrom gpucluster.node import userdata\n",
    "stack.py": "from gpucluster.aws import nodes\n",
    "fleet/__init__.py": "",
    "fleet/shared.py": "import boto3\nimport json\n",
    "fleet/stops.py": "from . import shared\nfrom .shared import batches\n",
    "lambdas/__init__.py": "",
    "lambdas/autostop.py": "from gpucluster.fleet import stops\nfrom gpucluster.fleet.shared import batches\n"
                           "import json\n",
    "ops/__init__.py": "",
    "ops/scale.py": "import boto3\nfrom gpucluster.fleet import shared\nfrom gpucluster import stack\n",
    "ops/jobbackends/__init__.py": "BACKENDS = {'none': 'gpucluster.ops.jobbackends.launcher'}\n",
    "ops/jobbackends/launcher.py": "from gpucluster.ops.jobbackends import BACKENDS\n",
    "policy/__init__.py": "",
    "policy/records.py": "from collections.abc import Mapping\n",
    "policy/rules/__init__.py": "from gpucluster.policy.rules import iam\nRULES = [iam.rule]\n",
    "policy/rules/iam.py": "from gpucluster import catalog\nfrom gpucluster.policy.records import Mapping\n",
    "policy/pack.py": "import pulumi_policy\nfrom gpucluster.policy.rules import RULES\n",
    "cli/__init__.py": """
        def __getattr__(name: str) -> object:
            from gpucluster.cli.main import app
            return app
        """,
    "cli/shared.py": "import typer\n\napp = typer.Typer()\n\ndef fail() -> None: ...\n",
    "cli/plan.py": """
        from gpucluster.cli.shared import app, fail

        @app.command()
        def plan() -> None:
            from gpucluster.ops import scale
            from gpucluster.ops.jobbackends import job_backend
            job_backend(spec).refusal("plan")
        """,
    "cli/nodes.py": """
        from gpucluster.cli import shared

        @shared.app.command("nodes")
        def nodes() -> None:
            shared.fail()
        """,
    "cli/main.py": """
        from gpucluster.cli.shared import app
        from gpucluster.cli import nodes, plan  # registers their commands
        """,
    "long.py": "x = 1\n" * MAX_LINES,
}


def test_every_check_passes_on_a_package_laid_out_as_designed(tmp_path: Path) -> None:
    graph = write_package(tmp_path, GOOD)
    shared = frozenset({"gpucluster.cli", "gpucluster.cli.shared", "gpucluster.cli.main"})
    assert command_modules(graph, shared) == ["gpucluster.cli.nodes", "gpucluster.cli.plan"]
    assert targets(graph, "gpucluster.cli.plan") == {"gpucluster.cli.shared": [1],
                                                     "gpucluster.ops.scale": [5],
                                                     "gpucluster.ops.jobbackends": [6]}
    for check in (import_cycles, spec_imports_above_it, fleet_imports_outside, lambda_imports_outside,
                  policy_rule_imports_of_pulumi, cli_private_imports, oversized_modules,
                  cli_imports_of_job_backends, cli_reads_of_scheduler):
        assert check(graph) == [], check.__name__
    assert command_module_imports(graph, shared) == []


BAD = {
    "__init__.py": "",
    "catalog/__init__.py": "",
    "spec.py": """
        from gpucluster import catalog, noderole

        def size_check() -> None:
            from gpucluster import names
        """,
    "noderole.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from gpucluster.project import Path
        """,
    "project.py": "",
    "names.py": "from gpucluster.spec import StackSpec\n",
    "fleet/__init__.py": "",
    "fleet/stops.py": "import boto3\nimport yaml\nfrom gpucluster.lambdas import autostop\n",
    "lambdas/__init__.py": "",
    "lambdas/autostop.py": "import boto3\nimport pulumi\nfrom gpucluster.spec import STACK_TAG\n",
    "lambdas/report.py": "from gpucluster.fleet import stops\nfrom gpucluster.lambdas import autostop\n",
    "policy/__init__.py": "",
    "policy/rules.py": "from gpucluster.policy import helpers\n",
    "policy/helpers.py": "def engine() -> None:\n    import pulumi_aws\n",
    "cli/__init__.py": "",
    "cli/commands.py": """
        import typer
        app = typer.Typer()

        def _usd() -> str: ...

        @app.command()
        def plan() -> None: ...

        from gpucluster.cli import jobs as _jobs  # registers
        """,
    "cli/jobs.py": """
        from gpucluster.cli.commands import _usd, app
        from gpucluster.cli import commands

        def run() -> None:
            commands._aws_call()

        app.command("run")(run)

        def cancel(spec) -> None:
            from gpucluster.ops.jobbackends import slurm
            from gpucluster.ops.jobbackends.launcher import backend
            if spec.scheduler.slurm:
                slurm.backend(spec).cancel()
        """,
    "ops/__init__.py": "",
    "ops/jobbackends/__init__.py": "",
    "ops/jobbackends/slurm.py": "",
    "ops/jobbackends/launcher.py": "",
    "big.py": "x = 1\n" * (MAX_LINES + 1),
}


@pytest.mark.parametrize(("check", "report"), [
    (import_cycles, [
        "cycle 1 (2 modules): gpucluster.cli.commands, gpucluster.cli.jobs",
        "  gpucluster.cli.commands -> gpucluster.cli.jobs (line 9)",
        "  gpucluster.cli.jobs -> gpucluster.cli.commands (line 1; line 2)",
        "cycle 2 (2 modules): gpucluster.names, gpucluster.spec",
        "  gpucluster.names -> gpucluster.spec (line 1)",
        "  gpucluster.spec -> gpucluster.names (line 4)"]),
    (spec_imports_above_it, [
        "gpucluster.names: gpucluster.spec (line 4) -> gpucluster.names",
        "gpucluster.project: gpucluster.spec (line 1) -> gpucluster.noderole (line 3, type-only) -> "
        "gpucluster.project"]),
    (fleet_imports_outside, ["gpucluster.fleet.stops (line 2) imports yaml",
                             "gpucluster.fleet.stops (line 3) imports gpucluster.lambdas.autostop"]),
    (lambda_imports_outside, ["gpucluster.lambdas.autostop (line 2) imports pulumi",
                              "gpucluster.lambdas.autostop (line 3) imports gpucluster.spec",
                              "gpucluster.lambdas.report (line 2) imports gpucluster.lambdas.autostop"]),
    (policy_rule_imports_of_pulumi, [
        "gpucluster.policy.helpers (line 2) imports pulumi_aws, reached by gpucluster.policy.rules "
        "(line 1) -> gpucluster.policy.helpers"]),
    (cli_private_imports, ["gpucluster.cli.jobs (line 1): _usd from gpucluster.cli.commands",
                           "gpucluster.cli.jobs (line 5): _aws_call from gpucluster.cli.commands"]),
    (command_module_imports, [
        "gpucluster.cli.commands (line 9) imports command module gpucluster.cli.jobs",
        "gpucluster.cli.jobs (line 1; line 2) imports command module gpucluster.cli.commands"]),
    (oversized_modules, [f"src/gpucluster/big.py: {MAX_LINES + 1} lines"]),
    (cli_imports_of_job_backends, [
        "gpucluster.cli.jobs (line 11) imports job backend gpucluster.ops.jobbackends.launcher",
        "gpucluster.cli.jobs (line 10) imports job backend gpucluster.ops.jobbackends.slurm"]),
    (cli_reads_of_scheduler, ["gpucluster.cli.jobs (line 12): .scheduler"]),
])
def test_every_check_names_the_offenders_of_a_package_that_breaks_it(
        tmp_path: Path, check: object, report: list[str]) -> None:
    assert check(write_package(tmp_path, BAD)) == report  # type: ignore[operator]
