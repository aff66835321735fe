"""`gpucluster doctor STACK`: a stack checked against the AWS account before `pulumi up`.

It owns the command's options (`--outputs`), its findings table and `--json` document and
its exit code (1 on a blocker); the checks themselves are `gpucluster.ops.doctor`, read-only.
It must never import another command module.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from gpucluster.cli import render
from gpucluster.cli.common import EXIT_BLOCKED, EXIT_OK, JsonOption, StackArg, build_spec, fail_usage


def read_outputs(path: Path) -> set[str]:
    """The Auto Scaling groups a deployed stack owns, from `pulumi stack output --json` (exit 2 if bad)."""
    from gpucluster.ops.doctor import own_group_names

    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object of stack outputs")
        return own_group_names(doc)
    except OSError as err:
        fail_usage("doctor --outputs", f"cannot read {path}: {err.strerror}")
    except json.JSONDecodeError as err:
        fail_usage("doctor --outputs", f"{path} is not JSON ({err.msg}, line {err.lineno})")
    except ValueError as err:
        fail_usage("doctor --outputs", f"{path}: {err}")


def doctor(
    stack: StackArg,
    outputs: Annotated[Path | None, typer.Option(
        "--outputs", metavar="FILE.json",
        help="The stack's outputs (`pulumi stack output --json`; `{}` before its first deploy): "
             "which Auto Scaling groups are its own. Without it, groups are told apart by their "
             "node-group tag.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Check a stack against the AWS account (read-only): offerings, EFA, reservations, quotas, the
    identity and the budget's cost-allocation tag. Exit 1 on a blocker: run it before `pulumi up`."""
    from gpucluster.ops.doctor import DoctorError, has_blocker, run_checks

    render.use_json(as_json)
    spec = build_spec(stack)
    own = read_outputs(outputs) if outputs is not None else None
    try:
        with render.progress(f"checking {spec.stack} against the AWS account ({spec.region})"):
            findings = run_checks(spec, own_groups=own)
    except DoctorError as err:
        fail_usage("doctor", str(err))
    counts = Counter(f.level for f in findings)
    code = EXIT_BLOCKED if has_blocker(findings) else EXIT_OK
    if as_json:
        render.emit({"stack": spec.stack, "region": spec.region, "identity": spec.identity,
                     "findings": [asdict(f) for f in findings],
                     "counts": {level: counts[level] for level in ("ok", "warning", "blocker")},
                     "blocked": code == EXIT_BLOCKED})
        raise typer.Exit(code)
    for line in render.wrap(f"stack {spec.stack} ({spec.region}), gpucluster:stack={spec.identity}: "
                            "pre-flight checks against the AWS account"):
        render.echo(line)
    styles = {"blocker": "bad", "warning": "warn"}
    # The finding wraps in its own column when it has 40 columns, else under its row (a long
    # subject, such as a quota's name, would leave it a ragged strip at the right edge).
    for line in render.table(["level", "check", "subject", "finding"],
                             [[f.level, f.check, f.subject, f.message] for f in findings], min_wrap=40):
        level = line[2:].split(" ", 1)[0]  # a row's first line starts with its level
        render.echo(line.replace(level, render.paint(level, styles[level]), 1) if level in styles else line)
    summary = f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['blocker']} blocker(s)"
    render.echo(render.paint(summary, "bad" if code == EXIT_BLOCKED else "good"))
    raise typer.Exit(code)

