"""Commands that run work on a deployed stack's nodes: run (and --nccl-test), hostfile, jobs, logs, cancel.

It owns their options, their output (each node's status and output tail, tables, the NCCL
bandwidth table and verdict, `--json` documents) and exit codes (0 fine, 1 a node failed or
the change was declined, 2 invalid input or an AWS error, 130 interrupted). The flows are
`gpucluster.ops.launch` (nodes, job plan, start, restart records), `ops.jobs` (detached jobs)
and `ops.nccl`: a command calls one of them (a plan, then its start) and renders the result.
It must never import another command module.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucluster.cli import common, render
from gpucluster.cli.common import (
    EXIT_BLOCKED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    GroupOption,
    JsonOption,
    RequiredGroup,
    StackArg,
    YesOption,
    aws_call,
    build_spec,
    confirm_or_exit,
    fail_usage,
    head,
    ops_call,
)

if TYPE_CHECKING:
    from gpucluster.ops.joblogs import Ending
    from gpucluster.ops.jobs import NodeAnswers
    from gpucluster.ops.nodes import Node
    from gpucluster.ops.run import JobPlan, NodeResult
    from gpucluster.spec import StackSpec


def result_json(plan: JobPlan, result: NodeResult) -> dict[str, Any]:
    """One node's command in JSON: where it ran, how it ended, the tail of its output."""
    node = plan.ranks[result.rank].node
    return {"rank": result.rank, "instance_id": result.instance_id, "private_ip": node.private_ip,
            "command_id": result.command_id, "status": result.status, "exit_code": result.exit_code,
            "ok": result.ok, "error": result.error or None, "output_tail": result.tail(),
            "truncated": result.truncated}


# --------------------------------------------------------------------------- run


def time_limit(plan: JobPlan, timeout: int | None) -> str:
    """The run's time limit as its first line states it, so nobody learns of the default by losing
    a training run to it: a detached job has none unless given; a plain run stops at --timeout."""
    if plan.detach:
        return f"stopped after {plan.job_timeout_seconds} s (--timeout)" if plan.job_timeout_seconds \
            else "no time limit (detached)"
    how = "--timeout" if timeout else "the default; --timeout N to change, up to 172800"
    return f"stopped after {plan.timeout_seconds:,} s ({how})"


def render_dry_run(plan: JobPlan) -> list[str]:
    """Each rank's script as it would be sent (verbatim: a shell line is not wrapped)."""
    out = render.wrap(f"dry run: {len(plan.ranks)} node(s); each would run (AWS-RunShellScript, timeout "
                      f"{plan.timeout_seconds} s, output to CloudWatch Logs {plan.log_group}):")
    for r in plan.ranks:
        out.append(f"rank {r.rank}: {r.node.instance_id} {r.node.private_ip} ({r.node.instance_type})")
        out += [f"  {line}" for line in plan.script(r)]
    out.append("dry run: nothing sent")
    return out


def label(plan: JobPlan, result: NodeResult) -> str:
    node = plan.ranks[result.rank].node
    return f"rank {result.rank} {result.instance_id} {node.private_ip}"


def cancelled_note(results: list[NodeResult]) -> str:
    """What a launch that failed on a node did to the others: cancelled, the job stopped, or not."""
    failed = [r.rank for r in results if r.status == "CancelFailed"]
    stopped = [r.rank for r in results if "job stop sent" in r.error]
    unstopped = [r.rank for r in results if "job stop not sent" in r.error]
    note = "not started on every node, so cancelled where it was sent"
    if stopped:
        note += f"; the job's stop sent to rank(s) {', '.join(map(str, stopped))}"
    if failed or unstopped:
        note += (f"; NOT cancelled on rank(s) {', '.join(map(str, sorted({*failed, *unstopped})))}: it may "
                 "still run there (see each rank's line)")
    return note


def render_results(plan: JobPlan, results: list[NodeResult]) -> list[str]:
    """Each node's end and its output's tail (the node's own lines verbatim, not wrapped)."""
    out = []
    for r in results:
        exit_text = "" if r.exit_code is None else f", exit {r.exit_code}"
        extra = f" ({r.error})" if r.error else ""
        out += render.wrap(f"{label(plan, r)}: {r.status}{exit_text}{extra}")
        out += [f"  | {line}" for line in r.tail()]
        if r.truncated:
            out += render.wrap(f"(SSM returns only the start of long output: the full output is in "
                               f"CloudWatch Logs, streams {r.log_streams()})", "  | ", hang="")
    return out


def run(
    stack: StackArg,
    command: Annotated[list[str] | None, typer.Argument(
        help="The command, after --; arguments are joined with spaces and run by bash on each node "
             "(quote $VARS so your shell leaves them for the node).")] = None,
    group: RequiredGroup = "",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print each node's command and "
                                                            "environment; send nothing.")] = False,
    timeout: Annotated[int | None, typer.Option("--timeout", help="Seconds the command may run on a node "
                                                                  "(default 3600; SSM allows up to 172800; "
                                                                  "with --detach: no limit unless given).")]
    = None,
    detach: Annotated[bool, typer.Option("--detach", help="Start the command as a systemd unit on each "
                                                          "node and return; see jobs, logs, cancel.")]
    = False,
    name: Annotated[str | None, typer.Option("--name", help="With --detach: the job's name (default "
                                                            "job-<UTC time>).")] = None,
    restart_on_replace: Annotated[bool, typer.Option("--restart-on-replace", help=(
        "With --detach: when a spot or health replacement brings the group back to this many nodes, "
        "start the job again on the new nodes, telling it the latest checkpoint."))] = False,
    master_port: Annotated[int, typer.Option("--master-port", help="MASTER_PORT for the rendezvous.")]
    = 29500,
    workdir: Annotated[str | None, typer.Option("--workdir", help="Directory to run in on the nodes.")]
    = None,
    nccl_test: Annotated[bool, typer.Option("--nccl-test", help=(
        "Instead of a command: NCCL's all-reduce benchmark (nccl-tests, from the Deep Learning AMI) across "
        "the group's nodes, its bus bandwidth against the network's."))] = False,
    nccl_max_bytes: Annotated[str, typer.Option("--nccl-max-bytes", help="With --nccl-test: the largest "
                                                                         "message size (8 B up to this).")]
    = "4G",
    nodes: Annotated[int | None, typer.Option("--nodes", help=(
        "Slurm stacks: nodes the batch job asks for (default: the group's desired_nodes, or max_nodes "
        "when that is 0)."))] = None,
    as_json: JsonOption = False,
) -> None:
    """Run CMD on every in-service node of a group through SSM, with torchrun's rank environment.

    Each node gets MASTER_ADDR (rank 0's private IP), MASTER_PORT, NNODES, NODE_RANK,
    NPROC_PER_NODE (its GPUs, or MIG devices), WORLD_SIZE and the group's EFA/NCCL settings.
    Ranks follow launch time, then instance id. Exits 1 when any node fails. With --json, one
    object at the end (each node's status, exit code and output tail; with --nccl-test the bus
    bandwidth per size and the verdict), nothing while it runs.
    """
    from gpucluster.ops.launch import plan_run, start_run

    render.use_json(as_json)
    if not group:
        fail_usage("run", "--group is required (the node group to run on)")
    if nccl_test:
        if command or detach or name or restart_on_replace:
            fail_usage("run", "--nccl-test runs its own benchmark: give no command, --detach, --name or "
                              "--restart-on-replace")
        nccl_test_command(stack, group, dry_run=dry_run, max_bytes=nccl_max_bytes, as_json=as_json)
        return
    if name is not None and not detach:
        fail_usage("run", "--name names a detached job: add --detach")
    if restart_on_replace and not detach:
        fail_usage("run", "--restart-on-replace restarts detached jobs: add --detach")
    spec = build_spec(stack)
    text = " ".join(command or [])
    if spec.scheduler.slurm:
        slurm_run(spec, group, text, detach=detach, dry_run=dry_run, name=name, nodes=nodes,
                  restart_on_replace=restart_on_replace, master_port=master_port, workdir=workdir,
                  timeout=timeout, as_json=as_json)
        return
    if nodes is not None:
        fail_usage("run", "--nodes: only on a Slurm stack (the launcher runs on every in-service node of "
                          "the group)")
    launch = ops_call("run", lambda: plan_run(
        spec, group, text, clients=common.clients(spec), progress=render.progress, detach=detach, name=name,
        restart_on_replace=restart_on_replace, master_port=master_port, workdir=workdir, timeout=timeout),
        None)
    plan, record = launch.plan, launch.record
    top = head(spec, group=group, command=text, job=plan.detach, log_group=plan.log_group,
               master_addr=launch.master_addr, restart_on_replace=restart_on_replace)
    if dry_run:
        where = launch.record_parameter
        if as_json:
            render.emit({**top, "dry_run": True, "ranks": [
                {"rank": r.rank, "instance_id": r.node.instance_id, "private_ip": r.node.private_ip,
                 "instance_type": r.node.instance_type, "script": plan.script(r)} for r in plan.ranks],
                "restart_record": None if record is None else {"parameter": where, "record": record}})
            return
        lines = render_dry_run(plan)
        if record is not None:  # the record as it would be stored, one JSON key a line
            lines[-1:-1] = [*render.wrap(f"restart-on-replace: would record {where}:", hang=""),
                            *json.dumps(record, indent=2, sort_keys=True).splitlines()]
        for line in lines:
            typer.echo(line)
        return
    ssm = common.client(spec, "ssm")
    if not as_json:
        render.say(f"run on {len(plan.ranks)} node(s) of {group}, MASTER_ADDR {launch.master_addr}, "
                   f"{time_limit(plan, timeout)}: {text}")

    def progress(result: NodeResult) -> None:  # each node's status as it changes: no spinner while waiting
        if not as_json:
            render.say(f"{label(plan, result)}: {result.status}")

    outcome = aws_call("run", lambda: start_run(launch, ssm, on_change=progress, progress=render.progress),
                       None)
    job, restart = outcome.job, outcome.restart

    def finish(ok: bool, code: int, note: str, **more: Any) -> None:
        if as_json:
            render.emit({**top, "dry_run": False, "ok": ok, "cancelled": job.cancelled, "note": note,
                         "results": [result_json(plan, r) for r in job.results], **more})
        raise typer.Exit(code)

    if job.cancelled:
        note = cancelled_note(job.results)
        if not as_json:
            for line in render_results(plan, job.results):
                typer.echo(line)
            render.say(f"run: {note}")
        finish(False, EXIT_BLOCKED, note)
    if outcome.interrupted:
        message = "interrupted: the command was cancelled on every node still running it"
        if as_json:
            render.fail([("run", message)], EXIT_INTERRUPTED)
        render.say(f"\n{message}")
        raise typer.Exit(EXIT_INTERRUPTED)
    if as_json:
        note = (f"job {plan.detach} started" if plan.detach else "finished") if job.ok else (
            f"{len(job.failed)} of {len(job.results)} node(s) failed")
        stored = restart is None or restart.ok
        finish(job.ok, EXIT_OK if job.ok and stored else EXIT_BLOCKED, note,
               restart_record=None if restart is None else asdict(restart))
    render.say("")
    for line in render_results(plan, job.results):
        typer.echo(line)
    render.say(f"full output: CloudWatch Logs group {plan.log_group}, a stream per node "
               "(<command id>/<instance id>/...)")
    if restart is not None:
        render.say(f"run: job {plan.detach} started on all {len(job.results)} node(s); follow it with "
                   f"`gpucluster jobs {stack}`, `gpucluster logs {stack} {plan.detach} --follow`, stop it "
                   f"with `gpucluster cancel {stack} {plan.detach}`")
        if restart.message:
            render.say(restart.message)
        if not restart.ok:
            raise typer.Exit(EXIT_BLOCKED)
        return
    if job.ok:
        render.say(f"run: all {len(job.results)} node(s) succeeded")
        return
    render.say(f"run: {len(job.failed)} of {len(job.results)} node(s) failed (ranks "
               f"{', '.join(str(r.rank) for r in job.failed)})")
    raise typer.Exit(EXIT_BLOCKED)


# ----------------------------------------------------------------------- nccl-test


def phase_json(results: list[NodeResult]) -> list[dict[str, Any]]:
    """One phase of the NCCL test in JSON: each node's end and its output's tail."""
    return [{"rank": r.rank, "instance_id": r.instance_id, "status": r.status, "exit_code": r.exit_code,
             "ok": r.ok, "error": r.error or None, "output_tail": r.tail()} for r in results]


def nccl_test_command(stack: str, group: str, *, dry_run: bool, max_bytes: str, as_json: bool) -> None:
    """`run --nccl-test`: the phases of ops.nccl through SSM, then the bandwidth table and verdict."""
    from gpucluster.ops.nccl import execute_nccl_test, human_bytes, prepare_nccl_test

    spec = build_spec(stack)
    refuse(spec, "run", "nccl-test")
    setup = ops_call("run", lambda: prepare_nccl_test(spec, group, clients=common.clients(spec),
                                                      max_bytes=max_bytes, progress=render.progress), None)
    base, expected, efa, gpus = setup.base, setup.expected, setup.efa, setup.gpus_per_node
    top = head(spec, group=group, test="all_reduce_perf", nodes=len(base.ranks), gpus_per_node=gpus,
               instance_type=expected.instance_type, efa=efa, max_bytes=max_bytes)
    if not as_json:
        render.say(f"NCCL all_reduce_perf on {len(base.ranks)} node(s) x {gpus} GPU(s) of {group} "
                   f"({expected.instance_type}, {'EFA on' if efa else 'no EFA: TCP sockets'}), "
                   f"8 B to {max_bytes}B")
    if dry_run:
        phases = setup.dry_run_phases()
        if as_json:
            render.emit({**top, "dry_run": True, "phases": phases})
            return
        for phase, ids in phases.items():
            render.say(f"{phase}: {', '.join(ids)}")
        render.say("dry run: nothing sent")
        return
    run_id = datetime.now(UTC).strftime("nccl-%Y%m%d-%H%M%S")
    if not as_json:
        render.say("Open MPI starts the ranks over SSH: a one-time key, authorised within the group only, "
                   "is removed when the test ends")

    def on_phase(phase: str) -> None:
        if not as_json:
            render.say(f"{phase} ...")

    try:
        result = aws_call("run", lambda: execute_nccl_test(setup, run_id, common.client(spec, "ssm"),
                                                           on_phase=on_phase, progress=render.progress), None)
    except KeyboardInterrupt:
        message = "interrupted: the test key was removed where the revoke phase reached"
        if as_json:
            render.fail([("run", message)], EXIT_INTERRUPTED)
        render.say(f"\n{message}")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    outcome, ok, lines = result.outcome, result.passed, result.findings
    log = f"/var/log/gpucluster/nccl-test-{run_id}.log"
    report = outcome.report
    if as_json:
        peak = report.peak if report else None
        render.emit({
            **top, "dry_run": False, "run_id": run_id, "passed": ok, "findings": lines, "log_on_rank_0": log,
            "failed_phase": outcome.failed_phase, "key_revoked": outcome.revoked,
            "network_gbps": expected.network_gbps, "network_up_to": expected.up_to,
            "expected_busbw_gbs": expected.busbw,
            "peak": None if peak is None else {
                "size_bytes": peak.size, "busbw_gbs": peak.busbw,
                "of_expected": None if not expected.busbw else round(peak.busbw / expected.busbw, 4)},
            "avg_busbw_gbs": report.avg_busbw if report else None,
            "out_of_bounds_ok": report.out_of_bounds_ok if report else None,
            "rows": [{"size_bytes": row.size, "dtype": row.dtype,
                      "busbw_out_of_place_gbs": row.busbw_out_of_place,
                      "busbw_in_place_gbs": row.busbw_in_place, "wrong": row.wrong}
                     for row in (report.rows if report else [])],
            "phases": {phase: phase_json(results) for phase, results in outcome.phases.items()}})
        raise typer.Exit(EXIT_OK if ok else EXIT_BLOCKED)
    for phase, results in outcome.phases.items():
        for r in results:
            if not r.ok:
                render.say(f"{phase} on {r.instance_id}: {r.status}" + (f" ({r.error})" if r.error else ""))
                for line in r.tail(10):  # the node's own lines, verbatim
                    typer.echo(f"  | {line}")
    if report is not None and report.rows:
        rows = [[human_bytes(row.size), f"{row.busbw_out_of_place:.2f}", f"{row.busbw_in_place:.2f}",
                 str(row.wrong)] for row in report.rows]
        headers = ["size", "busbw out-of-place (GB/s)", "busbw in-place (GB/s)", "wrong"]
        for line in render.table(headers, rows):
            typer.echo(line)
    for line in lines:
        render.say(line)
    verdict = render.paint("passed", "good") if ok else render.paint("failed", "bad")
    render.say(f"nccl-test: {verdict} (full output on rank 0: {log})")
    if not ok:
        raise typer.Exit(EXIT_BLOCKED)


# ---------------------------------------------------------------------- hostfile

HOSTFILE_FORMATS = ("mpi", "deepspeed", "plain")


def render_hostfile(found: list[Node], fmt: str) -> list[str]:
    """Open MPI and DeepSpeed both read `<host> slots=<n>` (Open MPI mpirun(1) "Specifying
    Host Nodes"; DeepSpeed "Resource Configuration (multi-node)"); plain is one address a line."""
    ready = [n for n in found if n.in_service and n.private_ip]
    if fmt == "plain":
        return [str(n.private_ip) for n in ready]
    return [f"{n.private_ip} slots={max(1, n.slots)}" for n in ready]


def hostfile(
    stack: StackArg,
    group: RequiredGroup = "",
    fmt: Annotated[str, typer.Option("--format", help="mpi (Open MPI), deepspeed, or plain (one IP a "
                                                      "line).")] = "mpi",
    as_json: JsonOption = False,
) -> None:
    """Print the group's in-service nodes as a host list, in rank order (GPUs, or MIG devices, as
    slots)."""
    from gpucluster.ops.launch import find_nodes

    render.use_json(as_json)
    if not group:
        fail_usage("hostfile", "--group is required")
    if fmt not in HOSTFILE_FORMATS:
        fail_usage("hostfile", f"--format: must be mpi, deepspeed or plain, got {fmt!r}")
    spec = build_spec(stack)
    refuse(spec, "hostfile")
    found = ops_call("hostfile", lambda: find_nodes(spec, group, clients=common.clients(spec),
                                                    progress=render.progress), None)
    lines = render_hostfile(found, fmt)
    if not lines:
        render.fail([("hostfile", f"no node of {group} is in service")], EXIT_BLOCKED)
    if as_json:
        hosts = [{"instance_id": n.instance_id, "private_ip": n.private_ip, "slots": max(1, n.slots)}
                 for n in found if n.in_service and n.private_ip]
        render.emit(head(spec, group=group, format=fmt, hosts=hosts, lines=lines))
        return
    for line in lines:
        typer.echo(line)


# ------------------------------------------------------------- jobs / logs / cancel


def job_name(command: str, name: str) -> str:
    """The job's name as given, or one line saying what a name may be (exit 2)."""
    from gpucluster.ops.run import RunError, check_job_name

    try:
        return check_job_name(name)
    except RunError as err:
        fail_usage(command, str(err))


def list_jobs(stack: StackArg, group: GroupOption = None, as_json: JsonOption = False) -> None:
    """List the detached jobs (`run --detach`) on the stack's nodes, with their state per node."""
    from gpucluster.ops.jobs import list_jobs as jobs_on_nodes

    render.use_json(as_json)
    spec = build_spec(stack)
    if spec.scheduler.slurm:
        slurm_jobs(spec, group, as_json)
        return
    listing = ops_call("jobs", lambda: jobs_on_nodes(spec, group, clients=common.clients(spec),
                                                     progress=render.progress), None)
    results = listing.results
    silent = [f"{r.instance_id} ({r.status}{f', {r.error}' if r.error else ''})" for r in listing.silent]
    if as_json:
        render.emit(head(spec, group=group, jobs=[asdict(j) for j in listing.jobs],  # fields: the JSON keys
                         no_answer=[result_json(listing.plan, r) for r in listing.silent]))
        raise typer.Exit(EXIT_BLOCKED if silent else EXIT_OK)
    rows = [[j.job, j.node_group, j.instance_id, j.private_ip or "-", j.state,
             "-" if j.exit_status is None else str(j.exit_status), j.started or "-"] for j in listing.jobs]
    if rows:
        for line in render.table(["job", "node group", "instance", "private IP", "state", "exit", "started"],
                                 sorted(rows)):
            render.say(line)
    else:
        render.say(f"no detached jobs on the {len(results) - len(silent)} node(s) that answered")
    if silent:
        render.say(f"no answer from: {', '.join(silent)}")
        raise typer.Exit(EXIT_BLOCKED)


def logs(
    stack: StackArg,
    job: Annotated[str, typer.Argument(help="The job's name (see `gpucluster jobs`); on a Slurm stack "
                                            "its job id.")],
    group: GroupOption = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node: its rank, instance id or "
                                                            "private IP.")] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", help="Lines of output per node.")] = 200,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream the output from CloudWatch Logs "
                                                                "until the job has ended on every node.")]
    = False,
    as_json: JsonOption = False,
) -> None:
    """Show a detached job's latest output on each node; with --follow, stream it until it ends.

    With --json, one object (each node's output); with --follow --json, JSON Lines: an object a
    log line as it arrives, then one with how the job ended on each node (errors: one line too).
    """
    from gpucluster.ops.jobs import job_logs

    render.use_json(as_json, lines=follow)
    name = job_name("logs", job)
    if not 1 <= lines <= 5000:
        fail_usage("logs", f"--lines: must be 1..5000, got {lines}")
    spec = build_spec(stack)
    if spec.scheduler.slurm:
        slurm_logs(spec, name, group=group, node=node, lines=lines, follow=follow, as_json=as_json)
        return
    if follow:
        follow_logs(spec, name, group, node, as_json)
        return
    answers: NodeAnswers = ops_call("logs", lambda: job_logs(
        spec, name, group, lines=lines, clients=common.clients(spec), node=node, progress=render.progress),
        None)
    plan, results = answers.plan, answers.results
    if as_json:
        render.emit(head(spec, job=name, nodes=[
            {**result_json(plan, r), "output": r.stdout.splitlines()} for r in results]))
        raise typer.Exit(EXIT_BLOCKED if any(not r.ok for r in results) else EXIT_OK)
    for r in results:
        render.say(f"== {r.instance_id} {plan.ranks[r.rank].node.private_ip}: {r.status}"
                   + (f" ({r.error})" if r.error else ""))
        for line in r.stdout.splitlines():
            typer.echo(line)
    if any(not r.ok for r in results):
        raise typer.Exit(EXIT_BLOCKED)


def follow_logs(spec: StackSpec, name: str, group: str | None, node: str | None, as_json: bool) -> None:
    """`logs --follow`: which nodes run the job (SSM, `gpucluster-job status`), then their streams.

    Human: the job's lines on stdout as they arrive (`<instance> | ` before each when several
    nodes), what is followed and how it ended on stderr. JSON Lines: `{"event": "line", ...}` per
    log line, then `{"event": "end", ...}`.
    """
    from gpucluster.ops.joblogs import LogLine
    from gpucluster.ops.jobs import follow_job, prepare_follow

    clients = common.clients(spec)
    session = ops_call("logs", lambda: prepare_follow(spec, name, group, clients=clients, node=node,
                                                      progress=render.progress), None)
    plan, results, streams, follower = session.plan, session.results, session.streams, session.follower
    silent = [f"{r.instance_id} ({r.status})" for r in session.silent]
    if follower is None:
        problems = [("logs", f"no answer from: {', '.join(silent)}")] if silent else []
        problems.append(("logs", f"no job {name} on the {len(results) - len(silent)} node(s) that answered "
                                 f"(see `gpucluster jobs {spec.stack}`)"))
        render.fail(problems, EXIT_BLOCKED)
    if silent and not as_json:
        render.say(f"no answer from: {', '.join(silent)}", err=True)
    several = len(streams) > 1

    def show(line: LogLine) -> None:
        if as_json:
            render.emit({"event": "line", "instance_id": streams[line.stream], "timestamp": line.timestamp,
                         "message": line.message})
        else:  # the job's own lines, verbatim
            typer.echo(f"{streams[line.stream]} | {line.message}" if several else line.message)

    if not as_json:
        render.say(f"following job {name} on {len(streams)} node(s) ({len(follower.waiting)} running), "
                   f"CloudWatch Logs {follower.log_group}; Ctrl-C stops following, not the job", err=True)
    try:
        aws_call("logs", lambda: follow_job(session, show, clients=clients), None)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    failed = any(not e.ok for e in follower.endings.values()) or bool(silent)
    ends = sorted(streams.items(), key=lambda item: item[1])
    if as_json:
        render.emit({"event": "end", **head(
            spec, job=name, log_group=follower.log_group, ok=not failed,
            nodes=[ending_json(instance, follower.endings.get(stream)) for stream, instance in ends],
            no_answer=[result_json(plan, r) for r in session.silent])})
    else:
        for stream, instance in ends:
            ending = follower.endings.get(stream)
            render.say(f"{instance}: {ending.describe() if ending else 'had already ended'}", err=True)
    if failed:
        raise typer.Exit(EXIT_BLOCKED)


def ending_json(instance_id: str, ending: Ending | None) -> dict[str, Any]:
    """How the job ended on one node (`logs --follow --json`); None fields: it had already ended."""
    if ending is None:
        return {"instance_id": instance_id, "result": None, "exit_status": None, "ok": None}
    return {"instance_id": instance_id, "result": ending.result, "exit_status": ending.status,
            "ok": ending.ok}


def cancel(
    stack: StackArg,
    job: Annotated[str, typer.Argument(help="The job's name (see `gpucluster jobs`); on a Slurm stack "
                                            "its job id.")],
    group: GroupOption = None,
    yes: YesOption = False,
    as_json: JsonOption = False,
) -> None:
    """Stop a detached job on every node (SIGTERM, then SIGKILL after 90 s); --json needs --yes.

    Its restart-on-replace record goes first, so no replacement starts it again while it stops.
    """
    from gpucluster.ops.jobs import cancel_job

    render.use_json(as_json)
    name = job_name("cancel", job)
    spec = build_spec(stack)
    if spec.scheduler.slurm:
        slurm_cancel(spec, name, group=group, yes=yes, as_json=as_json)
        return
    confirm_or_exit("cancel", f"Stop job {name} on every node of {group or 'the stack'}?", yes)

    def removed() -> None:
        if not as_json:
            render.say(f"{name}: restart-on-replace record removed")

    done = ops_call("cancel", lambda: cancel_job(spec, name, group, clients=common.clients(spec),
                                                 progress=render.progress, on_record_removed=removed), None)
    results = done.results
    if as_json:
        render.emit(head(spec, job=name, group=group, restart_record_removed=done.record_removed,
                         nodes=[{**result_json(done.plan, r), "cancelled": r.ok} for r in results]))
        raise typer.Exit(EXIT_BLOCKED if any(not r.ok for r in results) else EXIT_OK)
    for r in results:
        typer.echo(f"{r.instance_id}: {'cancelled' if r.ok else f'not cancelled ({r.status})'}"
                   + "".join(f"\n  | {line}" for line in r.tail(3) if not r.ok))
    if any(not r.ok for r in results):
        raise typer.Exit(EXIT_BLOCKED)


# ------------------------------------------------------------------ Slurm stacks


def refuse(spec: StackSpec, command: str, what: str | None = None) -> None:
    """One line and exit 2 when `what` (default: the command) makes no sense on this stack."""
    from gpucluster.ops.slurmjobs import refusal

    reason = refusal(spec, what or command)
    if reason is not None:
        fail_usage(command, reason)


def slurm_job_id(command: str, job: str, group: str | None, node: str | None = None) -> str:
    """A Slurm job id as given (digits), or one line saying what it must be (exit 2)."""
    from gpucluster.slurm.queue import JOB_ID

    if not JOB_ID.fullmatch(job):
        fail_usage(command, f"job: on a Slurm stack, a Slurm job id (digits; see `gpucluster jobs`), "
                            f"got {job!r}")
    for option, value in (("--group", group), ("--node", node)):
        if value is not None:
            fail_usage(command, f"{option}: a Slurm job id names one job; give no {option}")
    return job


def slurm_run(spec: StackSpec, group: str, text: str, *, detach: bool, dry_run: bool, name: str | None,
              nodes: int | None, restart_on_replace: bool, master_port: int, workdir: str | None,
              timeout: int | None, as_json: bool) -> None:
    """`run --detach` on a Slurm stack: sbatch on the login node, the job id back.

    Without --detach it refuses (one line): a batch job outlives the command, and following its
    output is `logs --follow`'s job.
    """
    from gpucluster.ops.slurmjobs import plan_submit, refusal, submit
    from gpucluster.slurm.remote import JOB_UID

    if not detach:
        fail_usage("run", refusal(spec, "run") or "add --detach")
    sub = ops_call("run", lambda: plan_submit(
        spec, group, text, name=name, nodes=nodes, restart_on_replace=restart_on_replace,
        master_port=master_port, workdir=workdir, timeout=timeout), None)
    top = head(spec, group=group, command=text, scheduler="slurm", partition=group, job_name=sub.job.name,
               nodes=sub.job.nodes, run_as_uid=JOB_UID)
    if dry_run:
        if as_json:
            render.emit({**top, "dry_run": True, "sbatch_script": sub.sbatch_script,
                         "login_node_script": sub.script})
            return
        render.say(f"dry run: would submit to partition {group} on the login node through SSM, as uid "
                   f"{JOB_UID} (`sbatch --parsable`), this batch script:")
        for line in sub.sbatch_script.splitlines():  # verbatim: a shell line is not wrapped
            typer.echo(f"  {line}")
        render.say("dry run: nothing sent")
        return
    done = ops_call("run", lambda: submit(spec, sub, clients=common.clients(spec), progress=render.progress),
                    None)
    if done.job_id is None:
        render.fail([("run", f"sbatch refused the job on the login node {done.login.instance_id}: "
                             f"{done.result.error_line()}")], EXIT_BLOCKED)
    if as_json:
        render.emit({**top, "dry_run": False, "job_id": done.job_id,
                     "login_instance": done.login.instance_id})
        return
    render.say(f"run: submitted job {done.job_id} ({sub.job.name}, {sub.job.nodes} node(s)) to partition "
               f"{group}; follow it with `gpucluster logs {spec.stack} {done.job_id} --follow`, list with "
               f"`gpucluster jobs {spec.stack}`, stop it with `gpucluster cancel {spec.stack} {done.job_id}`")
    typer.echo(done.job_id)


def slurm_jobs(spec: StackSpec, group: str | None, as_json: bool) -> None:
    from gpucluster.ops.slurmjobs import list_jobs as queue

    found = ops_call("jobs", lambda: queue(spec, group, clients=common.clients(spec),
                                           progress=render.progress), None)
    if as_json:
        render.emit(head(spec, group=group, scheduler="slurm", accounting=spec.scheduler.accounting,
                         jobs=[{**asdict(j), "active": j.active} for j in found]))
        return
    if not found:
        off = "" if spec.scheduler.accounting else (" (accounting is off: finished jobs show only while "
                                                    "the controller keeps them)")
        render.say(f"no Slurm jobs{f' in partition {group}' if group else ''}{off}")
        return
    for line in render.slurm_job_lines(found):
        render.say(line)


def slurm_logs(spec: StackSpec, job: str, *, group: str | None, node: str | None, lines: int, follow: bool,
               as_json: bool) -> None:
    """The job's output file, read on its batch host; --follow streams it until the job ends."""
    from gpucluster.ops.slurmjobs import follow_output, job_output

    job_id = slurm_job_id("logs", job, group, node)
    clients = common.clients(spec)
    if follow:
        def show(text: str) -> None:
            if as_json:
                render.emit({"event": "output", "job_id": job_id, "text": text})
            else:
                typer.echo(text, nl=False)

        try:
            ended = ops_call("logs", lambda: follow_output(spec, job_id, show, clients=clients,
                                                           progress=render.progress), None)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        ok = ended.state == "COMPLETED"
        if as_json:
            render.emit({"event": "end", **head(spec, job_id=job_id, state=ended.state,
                                                exit_code=ended.exit_code, ok=ok, path=ended.path,
                                                instance_id=ended.instance_id)})
        else:
            render.say(f"job {job_id}: {ended.state}"
                       + ("" if ended.exit_code is None else f", exit {ended.exit_code}"), err=True)
        raise typer.Exit(EXIT_OK if ok else EXIT_BLOCKED)
    out = ops_call("logs", lambda: job_output(spec, job_id, lines=lines, clients=clients,
                                              progress=render.progress), None)
    if as_json:
        render.emit(head(spec, job_id=job_id, state=out.job.state, path=out.path, instance_id=out.instance_id,
                         size_bytes=out.size, truncated=out.truncated, output=out.text.splitlines()))
        return
    render.say(f"== job {job_id} ({out.job.state}): {out.path} on {out.instance_id}", err=True)
    typer.echo(out.text, nl=False)
    if out.truncated:
        render.say("(SSM returns only the first 24,000 characters: ask for fewer --lines, or --follow "
                   "for the whole file)", err=True)


def slurm_cancel(spec: StackSpec, job: str, *, group: str | None, yes: bool, as_json: bool) -> None:
    from gpucluster.ops.slurmjobs import cancel as scancel

    job_id = slurm_job_id("cancel", job, group)
    confirm_or_exit("cancel", f"Cancel Slurm job {job_id}?", yes)
    done = ops_call("cancel", lambda: scancel(spec, job_id, clients=common.clients(spec),
                                              progress=render.progress), None)
    if as_json:
        render.emit(head(spec, job_id=job_id, cancelled=done.cancelled, state=done.state,
                         message=done.message or None))
        raise typer.Exit(EXIT_OK if done.cancelled else EXIT_BLOCKED)
    if not done.cancelled:
        render.fail([("cancel", f"job {job_id} not cancelled: {done.message}")], EXIT_BLOCKED)
    render.say(f"job {job_id}: cancelled (Slurm state now {done.state or 'gone'})")


def login(
    stack: StackArg,
    start: Annotated[bool, typer.Option("--start", help="Start the session (runs the AWS CLI with the "
                                                        "Session Manager plugin) instead of printing it.")]
    = False,
    as_json: JsonOption = False,
) -> None:
    """Print the command that opens a shell on a Slurm stack's login node (Session Manager, no SSH).

    There you run sbatch, srun and squeue; become the job user first (`sudo -iu ec2-user`, or
    `ubuntu` on Ubuntu AMIs) so your jobs run as the user every node has.
    """
    import os
    import shlex
    import shutil

    from gpucluster.ops.slurmjobs import find_login_node

    render.use_json(as_json)
    spec = build_spec(stack)
    if not spec.scheduler.slurm:
        fail_usage("login", f"stack {spec.stack} has no Slurm login node (scheduler type none): open a "
                            "shell on a node with `aws ssm start-session --target <instance id>` (see "
                            "`gpucluster nodes`)")
    node = ops_call("login", lambda: find_login_node(spec, clients=common.clients(spec),
                                                     progress=render.progress), None)
    command = node.session_command(spec.region)
    if as_json:
        render.emit(head(spec, instance_id=node.instance_id, private_ip=node.private_ip, command=command))
        return
    if not start:
        typer.echo(shlex.join(command))
        return
    if shutil.which("aws") is None:
        fail_usage("login", f"--start needs the AWS CLI with the Session Manager plugin; run it elsewhere: "
                            f"{shlex.join(command)}")
    os.execvp(command[0], command)
