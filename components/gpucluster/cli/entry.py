"""The command table of `gpucluster`: every command by name, in `--help` order, and `main`.

It owns which function answers which command name, the order `gpucluster --help` lists
them in, building only the invoked command (`app_for`), and the console-script entry
behind `gpucluster.cli.main` (usage errors as JSON with --json). It holds no command and
no rendering; command modules never import it.

A run imports only the module of the command it invokes (`gpucluster plan` loads no job
backend, capacity or image code: 19 modules, a twentieth of a plan); `app` (every command
registered, for `--help`, a typo and the tests) and `COMMANDS` are built on first use.
"""

from __future__ import annotations

import copy
import importlib
import sys
from typing import Any

import typer

from gpucluster.cli import render
from gpucluster.cli.common import EXIT_BLOCKED, EXIT_INVALID, Command
from gpucluster.cli.common import app as _bare

# (name, command module, function): the order of `gpucluster --help`.
TABLE = (
    ("plan", "planning", "plan"), ("cost", "planning", "cost"), ("recommend", "planning", "recommend"),
    ("doctor", "doctor", "doctor"), ("verify", "verify", "verify"), ("status", "fleet", "status"),
    ("resume", "fleet", "resume"), ("init", "planning", "init"), ("nodes", "fleet", "nodes"),
    ("run", "jobs", "run"), ("hostfile", "jobs", "hostfile"), ("scale", "fleet", "scale"),
    ("stop", "fleet", "stop"), ("start", "fleet", "start"), ("jobs", "jobs", "list_jobs"),
    ("logs", "jobs", "logs"), ("cancel", "jobs", "cancel"), ("login", "jobs", "login"),
    ("spend", "spend", "spend"),
)
# (name, command module, its typer group), after the commands.
GROUPS = (("capacity", "capacity", "capacity_app"), ("dashboards", "dashboards", "dashboards_app"),
          ("image", "images", "image_app"), ("catalog", "prices", "catalog_app"))


def _attribute(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"gpucluster.cli.{module}"), name)


def _register(target: typer.Typer, names: set[str] | None) -> None:
    """Register on `target` the commands and groups named in `names` (every one for None), in table order."""
    for name, module, function in TABLE:
        if names is None or name in names:
            target.command(name, cls=Command)(_attribute(module, function))
    for name, module, attribute in GROUPS:
        if names is None or name in names:
            group = _attribute(module, attribute)
            for info in group.registered_commands:  # their `--help` in the one convention (common.Command)
                info.cls = Command
            target.add_typer(group, name=name)


def _whole_app() -> typer.Typer:
    """`app` with every command registered (once per process)."""
    if not (_bare.registered_commands or _bare.registered_groups):
        _register(_bare, None)
    return _bare


def __getattr__(name: str) -> Any:
    if name == "app":
        return _whole_app()
    if name == "COMMANDS":  # (name, function) of every command, in `--help` order
        return tuple((command, _attribute(module, function)) for command, module, function in TABLE)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def invoked(args: list[str]) -> str | None:
    """The command `args` name (`plan` in `--stacks-dir d plan prod`); None for none or an option."""
    words = iter(args)
    for word in words:
        if word == "--stacks-dir":
            next(words, None)
        elif not word.startswith("--stacks-dir="):
            return None if word.startswith("-") else word
    return None


def app_for(args: list[str]) -> typer.Typer:
    """`app` with only the command `args` invoke, or the whole app (no command, `--help`, a typo).

    typer builds every registered command from its signature on each run (20 ms for the twenty
    commands here), and the command table would import every command module: one command's run
    imports and builds that one. Same options, callback and messages.
    """
    name = invoked(args)
    if name is None or name not in {n for n, _, _ in TABLE} | {n for n, _, _ in GROUPS}:
        return _whole_app()
    only = copy.copy(_bare)  # shallow: the settings and the root callback are the app's own
    only.registered_commands, only.registered_groups = [], []
    _register(only, {name})
    return only


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point; with --json, a usage error (a bad option) is JSON too."""
    args = sys.argv[1:] if argv is None else argv
    run = app_for(args)
    if "--json" not in args:
        sys.exit(run(args))
    try:
        code = run(args, standalone_mode=False)
    except typer.TyperException as err:  # usage errors: unknown option, missing argument, bad value
        render.use_json(True)
        message = err.format_message() if hasattr(err, "format_message") else str(err)
        try:
            render.fail([(None, message)], getattr(err, "exit_code", EXIT_INVALID))
        except typer.Exit as exit_:
            code = exit_.exit_code
    except typer.Abort:
        code = EXIT_BLOCKED
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
