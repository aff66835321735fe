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
from typing import Annotated

import typer

from components.planner import Plan, PlannedResource, StackFileError, run_plan
from components.spec import SpecError

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


@app.command()
def plan(
    stack: StackArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead.")] = False,
) -> None:
    """Show offline what a stack would create (no AWS account or Pulumi CLI needed)."""
    result = build_plan(stack)
    if as_json:
        typer.echo(json.dumps(result.as_json(), indent=2, sort_keys=False))
        raise typer.Exit(EXIT_OK)
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


def main() -> None:
    """Console-script entry point."""
    sys.exit(app())


if __name__ == "__main__":
    main()
