"""The command table of `gpucluster`: every command registered on `app`, in `--help` order, and `main`.

It owns which function answers which command name, the order `gpucluster --help` lists
them in, building only the invoked command (`app_for`), and the console-script entry
behind `gpucluster.cli.main` (usage errors as JSON with --json). It holds no command and
no rendering; command modules never import it.
"""

from __future__ import annotations

import copy
import sys

import typer

from gpucluster.cli import (
    capacity,
    dashboards,
    doctor,
    fleet,
    images,
    jobs,
    planning,
    prices,
    render,
    spend,
    verify,
)
from gpucluster.cli.common import EXIT_BLOCKED, EXIT_INVALID, Command, app

# (name, function): the order of `gpucluster --help`.
COMMANDS = (
    ("plan", planning.plan), ("cost", planning.cost), ("recommend", planning.recommend),
    ("doctor", doctor.doctor), ("verify", verify.verify), ("status", fleet.status), ("resume", fleet.resume),
    ("init", planning.init), ("nodes", fleet.nodes), ("run", jobs.run), ("hostfile", jobs.hostfile),
    ("scale", fleet.scale), ("stop", fleet.stop), ("start", fleet.start), ("jobs", jobs.list_jobs),
    ("logs", jobs.logs), ("cancel", jobs.cancel), ("login", jobs.login), ("spend", spend.spend),
)
for _name, _command in COMMANDS:
    app.command(_name, cls=Command)(_command)
for _group, _group_name in ((capacity.capacity_app, "capacity"), (dashboards.dashboards_app, "dashboards"),
                            (images.image_app, "image"), (prices.catalog_app, "catalog")):
    for _info in _group.registered_commands:  # their `--help` in the one convention too (common.Command)
        _info.cls = Command
    app.add_typer(_group, name=_group_name)


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
    commands here): one command's run builds that one. Same options, callback and messages.
    """
    name = invoked(args)
    found = [c for c in app.registered_commands
             if (c.name or typer.main.get_command_name(c.callback.__name__)) == name]  # type: ignore[union-attr]
    groups = [g for g in app.registered_groups if g.name == name]
    if name is None or not (found or groups):
        return app
    only = copy.copy(app)  # shallow: the settings and the root callback are the app's own
    only.registered_commands, only.registered_groups = found, groups
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
