"""What every `gpucluster` command shares: the typer `app`, its options, exit codes and helpers.

It owns the root callback (`--stacks-dir`, `--version`), the common arguments and options,
the exit codes (0 fine, 1 a finding that blocks, a node or a change that failed or was
declined, 2 invalid input or an AWS error, 130 interrupted), loading a stack (config problems
print one line each, naming the key path, never a traceback), confirmation, the AWS error
wrapper, the stack's clients (`gpucluster.ops.Clients`) and money formatting. Command modules
import it; it must never import a command module (the entry point, `gpucluster.cli.entry`, registers them) and
holds no command of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperOption

from gpucluster import catalog, project
from gpucluster.cli import render
from gpucluster.project import StackFileError, load_stack
from gpucluster.spec import SpecError, StackSpec

if TYPE_CHECKING:
    from gpucluster.ops import Clients
    from gpucluster.plan import Plan

EXIT_OK, EXIT_BLOCKED, EXIT_INVALID = 0, 1, 2
EXIT_INTERRUPTED = 130
# Commands that ask AWS nothing (`cost --live` guards its own clients).
OFFLINE_COMMANDS = frozenset({"plan", "cost", "recommend", "init"})
T = TypeVar("T")

class Command(TyperCommand):
    """Every command's `--help` in one convention: typer writes a required argument as `{stack}` in the
    usage line and every value's type as `<str>`; this writes `STACK`, `[JOB]`, `FILES...` and each
    option's value as its metavar (set where declared, else the option's name in capitals)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperOption) and param.metavar is None and not param.is_flag \
                    and not param.count:
                param.metavar = (param.name or "value").upper()

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            pieces += [usage_name(param)] if isinstance(param, TyperArgument) else param.get_usage_pieces(ctx)
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        options: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(param, TyperArgument):
                arguments.append((usage_name(param), record[1]))
            else:
                options.append(record)
        for title, records in (("Arguments", arguments), ("Options", options)):
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def usage_name(argument: TyperArgument) -> str:
    """An argument as usage lines write it: `STACK`, `[JOB]` when optional, `FILES...` for several."""
    name = argument.metavar or (argument.name or "value").upper()
    name = name if argument.required else f"[{name}]"
    return f"{name}..." if argument.nargs != 1 else name


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Plan, price and operate GPU clusters on AWS built with Pulumi.",
    pretty_exceptions_enable=False,
    # Plain help: typer's rich help shows every flag as `--json <bool>`; this shows `--json`.
    rich_markup_mode=None,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead (errors too).")]
StackArg = Annotated[str, typer.Argument(
    metavar="STACK",
    help="Stack name (Pulumi.<name>.yaml in the project's stack directory, see --stacks-dir) "
         "or a path to a stack file.")]
GroupOption = Annotated[str | None, typer.Option(
    "--group", "-g", metavar="GROUP",
    help="Node group name (as in the stack file), or an Auto Scaling group's name.")]
RequiredGroup = Annotated[str, typer.Option(
    "--group", "-g", metavar="GROUP",
    help="Node group name (as in the stack file), or an Auto Scaling group's name.")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (scripts).")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Only show what would change.")]


def print_version(value: bool) -> None:
    """`--version`: the installed distribution's version (its metadata, not a constant in the code)."""
    if value:
        from importlib.metadata import version

        typer.echo(f"gpucluster {version('gpucluster')}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def root(
    ctx: typer.Context,
    stacks_dir: Annotated[Path | None, typer.Option(
        "--stacks-dir", metavar="DIR",
        help="Read stack files (Pulumi.<name>.yaml) from DIR instead of the stackConfigDir of the "
             "Pulumi.yaml found from the current directory upward.")] = None,
    _version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=print_version,
        help="Print the installed gpucluster's version and exit.")] = False,
) -> None:
    """Plan, price and operate GPU clusters on AWS built with Pulumi."""
    render.use_json("--json" in ctx.args)  # each command sets it again; this covers --stacks-dir
    if ctx.invoked_subcommand not in OFFLINE_COMMANDS:  # these never load boto3
        from gpucluster.ops.awserrors import guard_default_session

        guard_default_session()
    if stacks_dir is not None and not stacks_dir.is_dir():
        fail_usage("--stacks-dir", f"{stacks_dir} is not a directory")
    project.use_stacks_dir(stacks_dir)
    try:
        project.use_project_prices()
        catalog.project_prices()
    except ValueError as err:
        fail_usage(catalog.PRICE_FILE_NAME, str(err))


# ------------------------------------------------------------------ failing, asking


def fail_invalid(stack: str, problems: list[tuple[str | None, str]]) -> NoReturn:
    """Every problem on its own line (`path: message`), or as JSON with --json; exit 2."""
    render.fail(problems, EXIT_INVALID, title=f"invalid stack config: {stack}")


def fail_usage(command: str, message: str) -> NoReturn:
    """One line naming what is wrong with the command's arguments (or JSON with --json), exit 2."""
    render.fail([(command, message)], EXIT_INVALID)


def confirm_or_exit(command: str, question: str, yes: bool, declined: str | None = None) -> None:
    """Ask before anything that costs money or stops work (unless --yes); no, or no answer
    (stdin closed), prints `declined` and exits 1 with nothing changed. With --json it cannot
    ask: without --yes that is a usage error (exit 2)."""
    if yes:
        return
    if render.json_mode():
        fail_usage(command, "--json cannot ask for confirmation: add --yes")
    try:
        agreed = typer.confirm(question, default=False)
    except typer.Abort:
        typer.echo(f"\nno answer: pass --yes to {command} without asking")
        agreed = False
    if not agreed:
        typer.echo(declined or f"{command} cancelled: nothing changed")
        raise typer.Exit(EXIT_BLOCKED)


def aws_call(command: str, call: Callable[[], T], doing: str | None = "asking AWS") -> T:
    """Run an AWS call (a spinner saying `doing` after a second; None: no spinner, the caller
    shows progress); no credentials, an AWS error, an answer that cannot be parsed (an HTML page
    from a proxy) or an error without a code: one line, never markup (JSON with --json), exit 2."""
    from gpucluster.ops.awserrors import AWS_ERRORS, describe, from_parser

    try:
        with render.progress(doing) if doing else nullcontext():
            return call()
    except AWS_ERRORS as err:
        fail_usage(command, describe(err))
    except Exception as err:
        if not from_parser(err):
            raise
        fail_usage(command, describe(err))


def ops_call(command: str, call: Callable[[], T], doing: str | None = "asking AWS") -> T:
    """`aws_call`, plus a request the stack cannot answer (any `ops.OpsError`: an unknown group, no PCS
    cluster...) as one line, exit 2."""
    from gpucluster.ops import OpsError

    try:
        return aws_call(command, call, doing)
    except OpsError as err:
        fail_usage(command, str(err))


# --------------------------------------------------------------------- stacks


def valid(stack: str, load: Callable[[str], T]) -> T:
    """`load(stack)`, or every config problem on its own line and exit 2."""
    try:
        return load(stack)
    except SpecError as err:
        fail_invalid(stack, [(f.path, f.message) for f in err.findings])
    except StackFileError as err:
        fail_invalid(stack, [(None, str(err))])


def run_plan(stack: str) -> Plan:
    """The stack planned under the mock engine (imported here: only `plan` pays for Pulumi)."""
    from gpucluster.plan import run_plan as plan_stack

    return plan_stack(stack)


def build_plan(stack: str) -> Plan:
    return valid(stack, run_plan)


def build_spec(stack: str) -> StackSpec:
    """The validated spec of a stack, without running the program (exit 2 when invalid)."""
    return valid(stack, lambda name: load_stack(name)[2])


def head(spec: StackSpec, **more: Any) -> dict[str, Any]:
    """The start of the day-two commands' JSON documents: which stack, where."""
    return {"stack": spec.stack, "region": spec.region, "identity": spec.identity, **more}


# ---------------------------------------------------------------------- clients


def client(spec: StackSpec, service: str) -> Any:
    """A boto3 client in the stack's region (`ops.make_client`: AWS_ENDPOINT_URL works); tests replace it."""
    from gpucluster.ops import make_client

    return make_client(service, spec.region)


def clients(spec: StackSpec) -> Clients:
    """The stack's `ops.Clients`, each built by `client` when first asked (so a test's replacement counts)."""
    from gpucluster.ops import Clients

    return Clients(spec.region, make=lambda service: client(spec, service))


def cost_explorer(spec: StackSpec) -> Any:
    """The stack's Cost Explorer client (its one endpoint region, `ops.CE_REGION`); tests replace it."""
    return client(spec, "ce")


# ----------------------------------------------------------------------- money


def usd(value: float) -> str:
    """Dollars as every table prints them: thousands separated, two decimals."""
    return f"{value:,.2f}"
