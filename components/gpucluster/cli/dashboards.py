"""`gpucluster dashboards`: the stack's Grafana dashboards and Prometheus rules for a team's own Grafana.

It owns the command-line side of gpucluster.ops.dashboards: `export STACK` writes the dashboards'
JSON and the rule file into a directory, and with `--grafana-url` also creates or updates them in
that Grafana (its token from the environment variable `--token-env` names, never an argument, so
it stays out of shell history). Exit codes as everywhere: 0 done, 2 invalid input or a Grafana
that refused, one line each.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from gpucluster.cli import render
from gpucluster.cli.common import EXIT_INVALID, JsonOption, StackArg, build_spec, fail_usage

dashboards_app = typer.Typer(no_args_is_help=True,
                             help="Grafana dashboards and Prometheus rules of a stack, as code.")


@dashboards_app.command("export")
def export(
    stack: StackArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write them into.")] = Path(
        "dashboards"),
    grafana_url: Annotated[str | None, typer.Option(
        "--grafana-url", help="Also create or update them in this Grafana (https://...).")] = None,
    token_env: Annotated[str, typer.Option(
        "--token-env", help="Environment variable holding a Grafana service-account token.")
    ] = "GRAFANA_TOKEN",
    folder_uid: Annotated[str | None, typer.Option(
        "--folder-uid", help="Grafana folder to put them in.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Write the stack's dashboards (Grafana JSON) and recording/alert rules (Prometheus YAML)."""
    # Loaded here, not at import: the HTTP client and the dashboards' renderer would otherwise load on
    # every command, `plan` included (issue 38).
    from gpucluster.ops.dashboards import DashboardsError, export_dashboards, push_dashboards

    render.use_json(as_json)
    spec = build_spec(stack)
    token = ""
    if grafana_url is not None:
        if not grafana_url.startswith(("https://", "http://")):
            fail_usage("dashboards export", f"--grafana-url: must be an http(s) URL, got {grafana_url!r}")
        token = os.environ.get(token_env, "")
        if not token:
            fail_usage("dashboards export", f"--grafana-url needs a service-account token in ${token_env}")
    try:
        done = export_dashboards(spec, out)
    except OSError as err:
        fail_usage("dashboards export", f"--out: cannot write {out}: {err.strerror or err}")
    pushed: list[str] = []
    if grafana_url is not None:
        try:
            pushed = push_dashboards(spec, grafana_url, token, folder_uid=folder_uid)
        except DashboardsError as err:
            render.fail([(None, f"dashboards export: {err}")], EXIT_INVALID)
    if as_json:
        render.emit({"stack": spec.stack, "directory": str(done.directory),
                     "dashboards": [str(p) for p in done.dashboards], "rules": str(done.rules),
                     "grafana": pushed})
        raise typer.Exit(0)
    render.echo(f"wrote {len(done.dashboards)} dashboards and {done.rules.name} to {done.directory}/")
    for url in pushed:
        render.echo(f"  {url}")
    if grafana_url is None:
        render.echo("import each JSON in Grafana (Dashboards > New > Import) with a Prometheus data "
                    "source; load the rules into Prometheus (rule_files) or AMP (a rule groups namespace)")
