"""The `gpucluster` command: offline plans and the day-two operations of a stack.

It owns argument parsing, output formatting and exit codes (0 fine, 1 a
finding that blocks — a mandatory policy violation —, 2 invalid input). The
work itself lives in the modules it calls; config problems print one line
each, naming the key path, never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from components.planner import Plan, PlannedResource, StackFileError, run_plan
from components.spec import SpecError

if TYPE_CHECKING:
    from policies.records import Violation

EXIT_OK, EXIT_BLOCKED, EXIT_INVALID = 0, 1, 2

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Plan, price and operate GPU clusters on AWS built with Pulumi.",
    pretty_exceptions_enable=False,
)



@app.callback()
def root() -> None:
    """Plan, price and operate GPU clusters on AWS built with Pulumi."""


StackArg = Annotated[str, typer.Argument(
    help="Stack name (stacks/Pulumi.<name>.yaml) or a path to a stack file.")]


def fail_invalid(stack: str, lines: list[str]) -> None:
    """Print every problem on its own line and exit 2."""
    typer.echo(f"invalid stack config: {stack}", err=True)
    for line in lines:
        typer.echo(line, err=True)
    raise typer.Exit(EXIT_INVALID)


def build_plan(stack: str) -> Plan:
    try:
        return run_plan(stack)
    except SpecError as err:
        fail_invalid(stack, [str(f) for f in err.findings])
    except StackFileError as err:
        fail_invalid(stack, [str(err)])
    raise AssertionError("unreachable")


def render_tree(resources: list[PlannedResource]) -> list[str]:
    """Indented tree of `type  name`, children under their parent, in creation order."""
    children: dict[str | None, list[PlannedResource]] = defaultdict(list)
    urns = {r.urn for r in resources}
    for r in resources:
        children[r.parent if r.parent in urns else None].append(r)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for r in children.get(parent, []):
            flags = "".join(f" [{f}]" for f, on in (("protect", r.protect),
                                                   ("retain", r.retain_on_delete)) if on)
            lines.append(f"{'  ' * depth}{r.type}  {r.name}{flags}")
            walk(r.urn, depth + 1)

    walk(None, 0)
    return lines


def check_policies(result: Plan, config_file: Path | None) -> list[Violation]:
    """The policy pack over the plan (exit 2 on a bad policy config file)."""
    from policies.offline import check_plan  # imported late: only `plan` needs the rules
    from policies.settings import PolicyConfigError

    try:
        return check_plan(result, config_file)
    except PolicyConfigError as err:
        typer.echo("invalid policy config", err=True)
        for line in err.problems:
            typer.echo(line, err=True)
        raise typer.Exit(EXIT_INVALID) from None


def render_violations(violations: list[Violation]) -> list[str]:
    """One line per violation: level, policy, resource type and name (or `stack`), message."""
    if not violations:
        return ["policies: no violations"]
    mandatory = sum(v.mandatory for v in violations)
    lines = [f"policies: {len(violations)} violation(s), {mandatory} mandatory"]
    for v in violations:
        where = f"{v.resource_type} {v.resource_name}" if v.resource_type else "stack"
        lines.append(f"  {v.level:<9}  {v.policy}  {where}: {v.message}")
    return lines


@app.command()
def plan(
    stack: StackArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead.")] = False,
    policy_config: Annotated[Path | None, typer.Option(
        "--policy-config", help="Policy pack config JSON (Pulumi's --policy-pack-config format); "
        "default: policies/config/<stack>.json when it exists.")] = None,
) -> None:
    """Show offline what a stack would create and which policies it breaks (no AWS or Pulumi CLI)."""
    result = build_plan(stack)
    violations = check_policies(result, policy_config)
    blocked = EXIT_BLOCKED if any(v.mandatory for v in violations) else EXIT_OK
    if as_json:
        document = result.as_json()
        document["violations"] = [v.as_json() for v in violations]
        typer.echo(json.dumps(document, indent=2, sort_keys=False))
        raise typer.Exit(blocked)
    custom = [r for r in result.resources if r.custom]
    typer.echo(f"stack {result.stack} ({result.spec.region}): {len(custom)} resources in "
               f"{len(result.resources) - len(custom)} components")
    typer.echo("")
    for line in render_tree(result.resources):
        typer.echo(line)
    typer.echo("")
    typer.echo("resources by type:")
    for token, count in sorted(Counter(r.type for r in custom).items()):
        typer.echo(f"  {count:4d}  {token}")
    typer.echo("")
    typer.echo("outputs:")
    for key, value in result.outputs.items():
        typer.echo(f"  {key}: {json.dumps(value)}")
    typer.echo("")
    for line in render_violations(violations):
        typer.echo(line)
    raise typer.Exit(blocked)


def main() -> None:
    """Console-script entry point."""
    sys.exit(app())


if __name__ == "__main__":
    main()
