"""`gpucluster verify STACK`: a deployed stack checked in its account after `pulumi up`, read-only.

It owns the command's checklist (one row a check: its result, what it checks, its subject and one
line of detail, the remedy under a failed one), its `--json` document and its exit code: 0 when
every check passes, 1 when any fails or could not run (`unknown`), 2 on bad input or when AWS cannot
be asked at all. The checks are `gpucluster.ops.verify`. `doctor` stays the check before a deploy.
It must never import another command module.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from gpucluster.cli import render
from gpucluster.cli.common import (
    EXIT_BLOCKED,
    EXIT_OK,
    JsonOption,
    StackArg,
    build_spec,
    clients,
    head,
    ops_call,
)

STYLES = {"pass": "good", "fail": "bad", "unknown": "warn"}


JobOption = Annotated[bool, typer.Option(
    "--job", help="On a Slurm stack, also run `srun -N1 hostname` on each partition through the login "
    "node; on an EKS stack, a one-pod GPU job through Kueue on each node group (the one check that starts "
    "something: a group at zero boots a node).")]


def verify(stack: StackArg, as_json: JsonOption = False, job: JobOption = False) -> None:
    """Check a deployed stack in its AWS account (read-only, after `pulumi up`): guardrail roles
    (IAM policy simulator), launch templates (EC2 DryRun), the scripts bundle, the cost tag, the
    notify subscription, schedules, rules, alarms, VPC endpoints without NAT, AMP remote write and
    samples, Grafana, the image pipelines' last builds, and on Slurm the PCS cluster, node groups,
    queues and accounting. Exit 1 when a check fails or cannot run."""
    from gpucluster.ops.verify import counts
    from gpucluster.ops.verify import verify as run_verify

    render.use_json(as_json)
    spec = build_spec(stack)
    result = ops_call("verify", lambda: run_verify(spec, clients(spec), job=job),
                      f"verifying {spec.stack} in its AWS account ({spec.region})")
    code = EXIT_OK if result.passed else EXIT_BLOCKED
    tally = counts(result)
    if as_json:
        render.emit(head(spec, account=result.account, checks=[asdict(c) for c in result.checks],
                         counts=dict(tally), passed=result.passed))
        raise typer.Exit(code)
    for line in render.wrap(f"stack {spec.stack} ({spec.region}, account {result.account}), "
                            f"gpucluster:stack={spec.identity}: the deployed stack checked in its account"):
        render.echo(line)
    for check in result.checks:
        first, *rest = render.wrap(f"{check.result:<7} {check.id}  {check.name}: {check.subject}",
                                   indent="  ", hang="          ")
        render.echo(first.replace(check.result, render.paint(check.result, STYLES[check.result]), 1))
        for line in rest:
            render.echo(line)
        for line in render.wrap(check.detail, indent="            "):
            render.echo(line)
        if check.remedy:
            for line in render.wrap(f"remedy: {check.remedy}", indent="            "):
                render.echo(line)
    summary = f"{tally['pass']} passed, {tally['fail']} failed, {tally['unknown']} could not be checked"
    render.echo(render.paint(summary, "good" if result.passed else "bad"))
    raise typer.Exit(code)
