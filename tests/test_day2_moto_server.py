"""Day-2 commands against a local fake account (a moto server, AWS_ENDPOINT_URL), as the docs suggest for
trying them (issue 37, item 5): figures, or one clean line; never an HTML body, never "AWS said" for what
happened on this machine.

moto's server labels some JSON answers `text/html` (Cost Explorer's): the HTML guard decides on the
body, so `spend` reads them. A call moto does not implement comes back as an error without an AWS
error code, which every command words the same way (ops/awserrors.py `describe`).

Each command runs as its own `python -m gpucluster.cli` process would (environment, exit status,
stdout and stderr), answered by the module's one command child (`cli_child.py`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from cli_child import CliChild


def gpucluster(child: CliChild, *args: str, endpoint: str,
               credentials: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1", "NO_COLOR": "1",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
           "AWS_EC2_METADATA_DISABLED": "true"}
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(name, None)
    if credentials:
        env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    return child.run(list(args), env=env, timeout=180)


def clean(done: subprocess.CompletedProcess[str], command: str) -> None:
    """Figures (exit 0), or exactly one line naming the command (exit 2); no markup, no traceback."""
    out = done.stdout + done.stderr
    for marker in ("<html", "<!DOCTYPE", "Traceback", "AWS said: Unable to locate",
                   "AWS said: Could not connect"):
        assert marker.lower() not in out.lower(), out
    if done.returncode == 2:
        lines = out.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{command}: "), out
    else:
        assert done.returncode == 0, out


def test_spend_reads_cost_explorer_answers_labelled_html(cli_child: CliChild, moto_endpoint: str) -> None:
    done = gpucluster(cli_child, "spend", "dev", endpoint=moto_endpoint)
    clean(done, "spend")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "$" in done.stdout


def test_status_against_an_empty_account(cli_child: CliChild, moto_endpoint: str) -> None:
    clean(gpucluster(cli_child, "status", "dev", endpoint=moto_endpoint), "status")


def test_capacity_search_against_moto(cli_child: CliChild, moto_endpoint: str) -> None:
    clean(gpucluster(cli_child, "capacity", "search", "--type", "p5.48xlarge", "--count", "1", "--days", "1",
                     "--region", "us-east-1", endpoint=moto_endpoint), "capacity search")


@pytest.mark.parametrize("command", [["status", "dev"], ["spend", "dev"],
                                     ["capacity", "search", "--type", "p5.48xlarge", "--count", "1",
                                      "--days", "1", "--region", "us-east-1"]], ids=lambda c: c[0])
def test_local_causes_are_said_as_local(cli_child: CliChild, moto_endpoint: str, command: list[str]) -> None:
    """No credentials, and a closed port: what happened here, not "AWS said"."""
    name = command[0] if command[0] != "capacity" else "capacity search"
    none = gpucluster(cli_child, *command, endpoint=moto_endpoint, credentials=False)
    assert none.returncode == 2
    assert (none.stdout + none.stderr).strip() == (f"{name}: no AWS credentials found (aws configure, "
                                                   "AWS_PROFILE or environment variables)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    unreachable = gpucluster(cli_child, *command, endpoint=closed)
    assert unreachable.returncode == 2
    assert (unreachable.stdout + unreachable.stderr).strip().startswith(
        f"{name}: cannot reach AWS at {closed}/: no network, a firewall, a proxy or a wrong AWS_ENDPOINT_URL")


def test_the_launchers_dry_run_needs_no_deployed_node(cli_child: CliChild, moto_endpoint: str) -> None:
    """Like Slurm's, the launcher's `run --dry-run` shows each rank's script before anything is deployed:
    on the stack file's nodes, saying why, with placeholders for what only a launched node has."""
    command = ["run", "dev", "--group", "dev-a10", "--dry-run", "--", "nvidia-smi"]
    empty = gpucluster(cli_child, *command, endpoint=moto_endpoint)
    assert empty.returncode == 0, empty.stdout + empty.stderr
    lines = empty.stdout.splitlines()
    assert lines[0].startswith("dry run: dev-a10 is not deployed, so planned on the stack file's 1 node(s)")
    assert "rank 0: <node 0> <node 0 IP> (g5.xlarge)" in lines
    assert lines[-1] == "dry run: nothing sent"
    assert any("exec bash -c nvidia-smi" in line for line in lines), lines
    offline = gpucluster(cli_child, *command[:-2], "--json", *command[-2:], endpoint=moto_endpoint,
                         credentials=False)
    assert offline.returncode == 0, offline.stdout + offline.stderr
    document = json.loads(offline.stdout)
    assert document["dry_run"] is True
    assert document["planned_from_stack_file"].startswith("no AWS credentials")
    assert [r["instance_id"] for r in document["ranks"]] == ["<node 0>"]
    wrong = gpucluster(cli_child, "run", "dev", "--group", "nope", "--dry-run", "--", "true",
                       endpoint=moto_endpoint)
    assert wrong.returncode == 2 and (wrong.stdout + wrong.stderr).startswith(
        "run: --group: stack dev has no node group nope (its groups: dev-a10)")
