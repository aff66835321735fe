"""Commands that run work on a stack's nodes: run (and --nccl-test), hostfile, jobs, logs, cancel, login.

It owns their options, their output (each node's status and output tail, tables, the NCCL
bandwidth table and verdict, `--json` documents) and exit codes (0 fine, 1 a node failed or
the change was declined, 2 invalid input or an AWS error, 130 interrupted). The work is the
stack's job backend's (`gpucluster.ops.jobbackends`: the launcher or Slurm, chosen from the spec
there): a command calls one of its methods, which returns one outcome, and renders that outcome
as text or as JSON (a `*_text` and a `*_json` function each, which return the exit code). The
NCCL test is the launcher's own flow (`ops.nccl`). It must never import another command module.
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
from gpucluster.ops.eksjobs import EksCancel, EksFollowed, EksQueue, LeaderLog, Submitted
from gpucluster.ops.jobbackends import Batch, NodeLine, Queue

if TYPE_CHECKING:
    from gpucluster.ops.jobbackends import JobBackend, RunRequest
    from gpucluster.ops.joblogs import Ending
    from gpucluster.ops.jobs import FollowSession
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
    # Only what the node confirmed counts as stopped (`ops.run.stop_started`).
    unstopped = [r.rank for r in results
                 if "job stop not sent" in r.error or "job stop not confirmed" in r.error]
    stopped = [r.rank for r in results if "job stop sent" in r.error and r.rank not in unstopped]
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
    from gpucluster.ops.jobbackends import RunRequest

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
    request = RunRequest(group, " ".join(command or []), detach=detach, dry_run=dry_run, name=name,
                         nodes=nodes, restart_on_replace=restart_on_replace, master_port=master_port,
                         workdir=workdir, timeout=timeout)

    def started(outcome: Any) -> None:  # the first line, before anything is sent
        if not as_json:
            for line in run_started(request, outcome):
                render.say(line)

    def changed(plan: JobPlan, result: NodeResult) -> None:  # each node's status: no spinner while waiting
        if not as_json:
            render.say(f"{label(plan, result)}: {result.status}")

    outcome = ops_call("run", lambda: backend(spec).run(request, progress=render.progress, on_start=started,
                                                         on_change=changed), None)
    raise typer.Exit(run_json(spec, request, outcome) if as_json else run_text(spec, stack, request, outcome))


def run_started(request: RunRequest, outcome: Any) -> list[str]:
    """What `run` says before it sends anything (the launcher: where, how long, what)."""
    if isinstance(outcome, Batch | Submitted):
        return []
    plan = outcome.run.plan
    return [f"run on {len(plan.ranks)} node(s) of {request.group}, MASTER_ADDR {outcome.run.master_addr}, "
            f"{time_limit(plan, request.timeout)}: {request.command}"]


def run_exit(outcome: Any) -> int:
    """`run`'s exit code: 0 planned, started or finished everywhere; 1 a node failed, the job was
    cancelled or its restart record not stored, or the scheduler refused; 130 interrupted."""
    if isinstance(outcome, Batch):
        return EXIT_BLOCKED if outcome.refused is not None else EXIT_OK
    if isinstance(outcome, Submitted):
        return EXIT_OK
    done = outcome.outcome
    if done is None:
        return EXIT_OK
    if done.interrupted and not done.job.cancelled:
        return EXIT_INTERRUPTED
    stored = done.restart is None or done.restart.ok
    return EXIT_OK if done.job.ok and not done.job.cancelled and stored else EXIT_BLOCKED


INTERRUPTED = "interrupted: the command was cancelled on every node still running it"


def batch_head(spec: StackSpec, request: RunRequest, batch: Batch) -> dict[str, Any]:
    return head(spec, group=request.group, command=request.command, scheduler=batch.scheduler_name,
                partition=batch.group, job_name=batch.job_name, nodes=batch.nodes,
                run_as_uid=batch.run_as_uid)


def batch_refused(batch: Batch) -> None:
    """A submission the scheduler refused: one line, exit 1 (in either output mode)."""
    if batch.refused is not None:
        render.fail([("run", f"sbatch refused the job on the login node {batch.submitted_on}: "
                             f"{batch.refused}")], EXIT_BLOCKED)


def submitted_head(spec: StackSpec, request: RunRequest, sub: Submitted) -> dict[str, Any]:
    return head(spec, group=request.group, command=request.command, scheduler="eks", job_name=sub.job_name,
                namespace=sub.namespace, nodes=sub.nodes, gpus_per_node=sub.gpus_per_node,
                efa_interfaces_per_node=sub.efa_interfaces)


def run_json(spec: StackSpec, request: RunRequest, outcome: Any) -> int:
    """`run --json`: the plan (a dry run), or each node's end (the launcher), or the job id."""
    if isinstance(outcome, Submitted):
        render.emit({**submitted_head(spec, request, outcome), "dry_run": not outcome.sent,
                     **({"cluster": outcome.cluster} if outcome.sent else {"jobset": outcome.manifest})})
        return run_exit(outcome)
    if isinstance(outcome, Batch):
        batch_refused(outcome)
        if not outcome.sent:
            render.emit({**batch_head(spec, request, outcome), "dry_run": True,
                         "sbatch_script": outcome.batch_script, "login_node_script": outcome.submit_script})
        else:
            render.emit({**batch_head(spec, request, outcome), "dry_run": False, "job_id": outcome.job_id,
                         "login_instance": outcome.submitted_on})
        return run_exit(outcome)
    launch, done = outcome.run, outcome.outcome
    plan, record = launch.plan, launch.record
    top = head(spec, group=request.group, command=request.command, job=plan.detach, log_group=plan.log_group,
               master_addr=launch.master_addr, restart_on_replace=request.restart_on_replace)
    if done is None:
        render.emit({**top, "dry_run": True, "ranks": [
            {"rank": r.rank, "instance_id": r.node.instance_id, "private_ip": r.node.private_ip,
             "instance_type": r.node.instance_type, "script": plan.script(r)} for r in plan.ranks],
            "restart_record": None if record is None else {"parameter": launch.record_parameter,
                                                           "record": record},
            **({"planned_from_stack_file": outcome.planned_from_stack_file}
               if outcome.planned_from_stack_file else {})})
        return EXIT_OK
    job, restart = done.job, done.restart
    more: dict[str, Any] = {}
    if job.cancelled:
        note = cancelled_note(job.results)
    elif done.interrupted:
        render.fail([("run", INTERRUPTED)], EXIT_INTERRUPTED)
    else:
        note = (f"job {plan.detach} started" if plan.detach else "finished") if job.ok else (
            f"{len(job.failed)} of {len(job.results)} node(s) failed")
        more = {"restart_record": None if restart is None else asdict(restart)}
    render.emit({**top, "dry_run": False, "ok": job.ok and not job.cancelled, "cancelled": job.cancelled,
                 "note": note, "results": [result_json(plan, r) for r in job.results], **more})
    return run_exit(outcome)


def run_text(spec: StackSpec, stack: str, request: RunRequest, outcome: Any) -> int:
    """`run`: the script of each node or the batch script (a dry run), each node's end and output
    tail (the launcher), or the job id (a scheduler). The next commands name the stack as given
    (`stack`, the launcher) or by its name (a scheduler)."""
    if isinstance(outcome, Submitted):
        return submitted_text(spec, outcome)
    if isinstance(outcome, Batch):
        batch_refused(outcome)
        if not outcome.sent:
            render.say(f"dry run: would submit to partition {outcome.group} on the login node through SSM, "
                       f"as uid {outcome.run_as_uid} (`sbatch --parsable`), this batch script:")
            for line in outcome.batch_script.splitlines():  # verbatim: a shell line is not wrapped
                typer.echo(f"  {line}")
            render.say("dry run: nothing sent")
            return EXIT_OK
        render.say(f"run: submitted job {outcome.job_id} ({outcome.job_name}, {outcome.nodes} node(s)) to "
                   f"partition {outcome.group}; follow it with `gpucluster logs {spec.stack} "
                   f"{outcome.job_id} --follow`, list with `gpucluster jobs {spec.stack}`, stop it with "
                   f"`gpucluster cancel {spec.stack} {outcome.job_id}`")
        typer.echo(outcome.job_id)
        return EXIT_OK
    launch, done = outcome.run, outcome.outcome
    plan = launch.plan
    if done is None:
        lines = render_dry_run(plan)
        if outcome.planned_from_stack_file:  # offline, as Slurm's dry run: the stack file's nodes
            lines[:0] = render.wrap(f"dry run: {outcome.planned_from_stack_file}, so planned on the stack "
                                    f"file's {len(plan.ranks)} node(s) of {request.group}; each node's id "
                                    "and "
                                    "address are placeholders until it runs")
        if launch.record is not None:  # the record as it would be stored, one JSON key a line
            lines[-1:-1] = [*render.wrap(f"restart-on-replace: would record {launch.record_parameter}:",
                                         hang=""),
                            *json.dumps(launch.record, indent=2, sort_keys=True).splitlines()]
        for line in lines:
            typer.echo(line)
        return EXIT_OK
    job, restart = done.job, done.restart
    if job.cancelled:
        for line in render_results(plan, job.results):
            typer.echo(line)
        render.say(f"run: {cancelled_note(job.results)}")
    elif done.interrupted:
        render.say(f"\n{INTERRUPTED}")
    else:
        render.say("")
        for line in render_results(plan, job.results):
            typer.echo(line)
        render.say(f"full output: CloudWatch Logs group {plan.log_group}, a stream per node "
                   "(<command id>/<instance id>/...)")
        if restart is not None:
            render.say(f"run: job {plan.detach} started on all {len(job.results)} node(s); follow it with "
                       f"`gpucluster jobs {stack}`, `gpucluster logs {stack} {plan.detach} --follow`, stop "
                       f"it with `gpucluster cancel {stack} {plan.detach}`")
            if restart.message:
                render.say(restart.message)
        elif job.ok:
            render.say(f"run: all {len(job.results)} node(s) succeeded")
        else:
            render.say(f"run: {len(job.failed)} of {len(job.results)} node(s) failed (ranks "
                       f"{', '.join(str(r.rank) for r in job.failed)})")
    return run_exit(outcome)


def submitted_text(spec: StackSpec, sub: Submitted) -> int:
    """`run --detach` on EKS: the JobSet as it would be created (YAML), or the job's name once created."""
    import yaml

    if not sub.sent:
        render.say(f"dry run: would create this JobSet in namespace {sub.namespace} ({sub.nodes} pod(s), "
                   f"one a node, each {sub.gpus_per_node} GPU(s)"
                   + (f" and {sub.efa_interfaces} EFA interface(s)" if sub.efa_interfaces else "") + "):")
        for line in yaml.safe_dump(sub.manifest, sort_keys=False).splitlines():  # verbatim
            typer.echo(f"  {line}")
        render.say("dry run: nothing sent")
        return EXIT_OK
    render.say(f"run: created JobSet {sub.namespace}/{sub.job_name} ({sub.nodes} node(s)) on EKS cluster "
               f"{sub.cluster}; Kueue admits it when the queue has room for all of its pods. Follow it with "
               f"`gpucluster logs {spec.stack} {sub.job_name} --follow`, list with "
               f"`gpucluster jobs {spec.stack}`, stop it with "
               f"`gpucluster cancel {spec.stack} {sub.job_name}`")
    typer.echo(sub.job_name)
    return EXIT_OK


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
    render.use_json(as_json)
    spec = build_spec(stack)
    found = ops_call("jobs", lambda: backend(spec).jobs(group, progress=render.progress), None)
    raise typer.Exit((jobs_json if as_json else jobs_text)(spec, group, found))


def jobs_json(spec: StackSpec, group: str | None, found: Any) -> int:
    """`jobs --json`: the scheduler's jobs, or each node's jobs and the nodes that did not answer."""
    if isinstance(found, EksQueue):
        render.emit(head(spec, group=group, scheduler="eks", cluster=found.cluster,
                         jobs=[{**asdict(j), "active": j.active} for j in found.jobs]))
        return EXIT_OK
    if isinstance(found, Queue):
        render.emit(head(spec, group=group, scheduler=found.scheduler_name, accounting=found.accounting,
                         jobs=[{**asdict(j), "active": j.active} for j in found.jobs]))
        return EXIT_OK
    render.emit(head(spec, group=group, jobs=[asdict(j) for j in found.jobs],  # fields: the JSON keys
                     no_answer=[result_json(found.plan, r) for r in found.silent]))
    return EXIT_BLOCKED if found.silent else EXIT_OK


def jobs_text(spec: StackSpec, group: str | None, found: Any) -> int:
    """`jobs`: a table of jobs (per node on the launcher); exit 1 when a node did not answer."""
    if isinstance(found, EksQueue):
        if not found.jobs:
            render.say(f"no gpucluster JobSets on EKS cluster {found.cluster}"
                       + (f" for node group {group}" if group else ""))
            return EXIT_OK
        for line in render.table(["job", "namespace", "node group", "nodes", "state", "Kueue", "created"],
                                 [[j.job, j.namespace, j.node_group, str(j.nodes), j.state, j.admission,
                                   j.created or "-"] for j in found.jobs]):
            render.say(line)
        return EXIT_OK
    if isinstance(found, Queue):
        if not found.jobs:
            off = "" if found.accounting else (" (accounting is off: finished jobs show only while the "
                                               "controller keeps them)")
            render.say(f"no Slurm jobs{f' in partition {group}' if group else ''}{off}")
            return EXIT_OK
        for line in render.slurm_job_lines(found.jobs):
            render.say(line)
        return EXIT_OK
    silent = [f"{r.instance_id} ({r.status}{f', {r.error}' if r.error else ''})" for r in found.silent]
    rows = [[j.job, j.node_group, j.instance_id, j.private_ip or "-", j.state,
             "-" if j.exit_status is None else str(j.exit_status), j.started or "-"] for j in found.jobs]
    if rows:
        for line in render.table(["job", "node group", "instance", "private IP", "state", "exit", "started"],
                                 sorted(rows)):
            render.say(line)
    else:
        render.say(f"no detached jobs on the {len(found.results) - len(silent)} node(s) that answered")
    if silent:
        render.say(f"no answer from: {', '.join(silent)}")
        return EXIT_BLOCKED
    return EXIT_OK


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
    render.use_json(as_json, lines=follow)
    name = job_name("logs", job)
    if not 1 <= lines <= 5000:
        fail_usage("logs", f"--lines: must be 1..5000, got {lines}")
    spec = build_spec(stack)
    jobs = backend(spec)
    name = ops_call("logs", lambda: jobs.job_id(name, group=group, node=node), None)
    if follow:
        follow_logs(spec, jobs, name, group, node, as_json)
        return
    out = ops_call("logs", lambda: jobs.logs(name, group=group, node=node, lines=lines,
                                             progress=render.progress), None)
    raise typer.Exit((logs_json if as_json else logs_text)(spec, name, out))


def logs_json(spec: StackSpec, name: str, out: Any) -> int:
    """`logs --json`: the job's output file's tail (a scheduler), or each node's output."""
    from gpucluster.ops.slurmjobs import JobOutput

    if isinstance(out, LeaderLog):
        render.emit(head(spec, job=name, namespace=out.job.namespace, state=out.job.state,
                         admission=out.job.admission, pod=out.pod, output=out.text.splitlines()))
        return EXIT_OK
    if isinstance(out, JobOutput):
        render.emit(head(spec, job_id=name, state=out.job.state, path=out.path, instance_id=out.instance_id,
                         size_bytes=out.size, truncated=out.truncated, output=out.text.splitlines()))
        return EXIT_OK
    render.emit(head(spec, job=name, nodes=[
        {**result_json(out.plan, r), "output": r.stdout.splitlines()} for r in out.results]))
    return EXIT_BLOCKED if any(not r.ok for r in out.results) else EXIT_OK


def logs_text(spec: StackSpec, name: str, out: Any) -> int:
    """`logs`: the job's own lines verbatim on stdout, where they come from on stderr (a scheduler)
    or as a header line per node (the launcher); exit 1 when a node failed to answer."""
    from gpucluster.ops.slurmjobs import JobOutput

    if isinstance(out, LeaderLog):
        where = f"pod {out.job.namespace}/{out.pod} (rank 0)" if out.pod else "no pod yet"
        render.say(f"== job {name} ({out.job.state}; Kueue: {out.job.admission}): {where}", err=True)
        typer.echo(out.text, nl=False)
        return EXIT_OK
    if isinstance(out, JobOutput):
        render.say(f"== job {name} ({out.job.state}): {out.path} on {out.instance_id}", err=True)
        typer.echo(out.text, nl=False)
        if out.truncated:
            render.say("(SSM returns only the first 24,000 characters: ask for fewer --lines, or --follow "
                       "for the whole file)", err=True)
        return EXIT_OK
    for r in out.results:
        render.say(f"== {r.instance_id} {out.plan.ranks[r.rank].node.private_ip}: {r.status}"
                   + (f" ({r.error})" if r.error else ""))
        for line in r.stdout.splitlines():
            typer.echo(line)
    return EXIT_BLOCKED if any(not r.ok for r in out.results) else EXIT_OK


def follow_logs(spec: StackSpec, jobs: JobBackend, name: str, group: str | None, node: str | None,
                as_json: bool) -> None:
    """`logs --follow`: the job's lines as they arrive, then how it ended.

    Human: the job's lines on stdout as they arrive (`<instance> | ` before each when several
    nodes), what is followed and how it ended on stderr. JSON Lines: `{"event": "line", ...}` per
    log line (a scheduler's job: `{"event": "output", ...}` per piece of its file), then
    `{"event": "end", ...}`.
    """
    def show(item: Any) -> None:
        if isinstance(item, NodeLine):
            if as_json:
                render.emit({"event": "line", "instance_id": item.instance_id, "timestamp": item.timestamp,
                             "message": item.message})
            else:  # the job's own lines, verbatim
                typer.echo(f"{item.instance_id} | {item.message}" if item.several else item.message)
        elif as_json:
            render.emit({"event": "output", "job_id": name, "text": item})
        else:
            typer.echo(item, nl=False)

    def started(session: FollowSession) -> None:
        if not as_json:
            for line in following(name, session):
                render.say(line, err=True)

    try:
        ended = ops_call("logs", lambda: jobs.follow(name, group=group, node=node, on_output=show,
                                                     on_start=started, progress=render.progress), None)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit((followed_json if as_json else followed_text)(spec, name, ended))


def silent_nodes(session: FollowSession) -> list[str]:
    return [f"{r.instance_id} ({r.status})" for r in session.silent]


def following(name: str, session: FollowSession) -> list[str]:
    """What `logs --follow` follows (the launcher), before the first line: on stderr."""
    assert session.follower is not None, "nothing to follow"
    silent, follower = silent_nodes(session), session.follower
    return [*([f"no answer from: {', '.join(silent)}"] if silent else []),
            f"following job {name} on {len(session.streams)} node(s) ({len(follower.waiting)} running), "
            f"CloudWatch Logs {follower.log_group}; Ctrl-C stops following, not the job"]


def no_job_to_follow(spec: StackSpec, name: str, session: FollowSession) -> None:
    """No node that answered runs the job: each node that did not answer, and that, exit 1."""
    if session.follower is None:
        silent = silent_nodes(session)
        problems = [("logs", f"no answer from: {', '.join(silent)}")] if silent else []
        problems.append(("logs", f"no job {name} on the {len(session.results) - len(silent)} node(s) that "
                                 f"answered (see `gpucluster jobs {spec.stack}`)"))
        render.fail(problems, EXIT_BLOCKED)


def follow_failed(ended: Any) -> bool:
    from gpucluster.ops.slurmjobs import Followed

    if isinstance(ended, Followed):
        return ended.state != "COMPLETED"
    if isinstance(ended, EksFollowed):
        return ended.job.state != "Completed"
    assert ended.follower is not None
    return any(not e.ok for e in ended.follower.endings.values()) or bool(ended.silent)


def followed_json(spec: StackSpec, name: str, ended: Any) -> int:
    """`logs --follow --json`'s last line: how the job ended (on each node)."""
    from gpucluster.ops.slurmjobs import Followed

    if isinstance(ended, EksFollowed):
        render.emit({"event": "end", **head(spec, job=name, namespace=ended.job.namespace,
                                            state=ended.job.state, pod=ended.pod,
                                            ok=not follow_failed(ended))})
        return EXIT_BLOCKED if follow_failed(ended) else EXIT_OK
    if isinstance(ended, Followed):
        render.emit({"event": "end", **head(spec, job_id=name, state=ended.state, exit_code=ended.exit_code,
                                            ok=not follow_failed(ended), path=ended.path,
                                            instance_id=ended.instance_id)})
        return EXIT_BLOCKED if follow_failed(ended) else EXIT_OK
    no_job_to_follow(spec, name, ended)
    follower = ended.follower
    ends = sorted(ended.streams.items(), key=lambda item: item[1])
    render.emit({"event": "end", **head(
        spec, job=name, log_group=follower.log_group, ok=not follow_failed(ended),
        nodes=[ending_json(instance, follower.endings.get(stream)) for stream, instance in ends],
        no_answer=[result_json(ended.plan, r) for r in ended.silent])})
    return EXIT_BLOCKED if follow_failed(ended) else EXIT_OK


def followed_text(spec: StackSpec, name: str, ended: Any) -> int:
    """`logs --follow`: how the job ended (on each node), on stderr."""
    from gpucluster.ops.slurmjobs import Followed

    if isinstance(ended, EksFollowed):
        render.say(f"job {name}: {ended.job.state}" + ("" if ended.pod else " (no pod ran)"), err=True)
        return EXIT_BLOCKED if follow_failed(ended) else EXIT_OK
    if isinstance(ended, Followed):
        render.say(f"job {name}: {ended.state}"
                   + ("" if ended.exit_code is None else f", exit {ended.exit_code}"), err=True)
        return EXIT_BLOCKED if follow_failed(ended) else EXIT_OK
    no_job_to_follow(spec, name, ended)
    for stream, instance in sorted(ended.streams.items(), key=lambda item: item[1]):
        ending = ended.follower.endings.get(stream)
        render.say(f"{instance}: {ending.describe() if ending else 'had already ended'}", err=True)
    return EXIT_BLOCKED if follow_failed(ended) else EXIT_OK


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
    render.use_json(as_json)
    name = job_name("cancel", job)
    spec = build_spec(stack)
    jobs = backend(spec)
    name = ops_call("cancel", lambda: jobs.job_id(name, group=group), None)
    confirm_or_exit("cancel", jobs.cancel_question(name, group=group), yes)

    def removed() -> None:
        if not as_json:
            render.say(f"{name}: restart-on-replace record removed")

    done = ops_call("cancel", lambda: jobs.cancel(name, group=group, progress=render.progress,
                                                  on_record_removed=removed), None)
    raise typer.Exit((cancel_json if as_json else cancel_text)(spec, name, group, done))


def cancel_json(spec: StackSpec, name: str, group: str | None, done: Any) -> int:
    """`cancel --json`: what became of the job (on each node)."""
    from gpucluster.ops.slurmjobs import CancelOutcome

    if isinstance(done, EksCancel):
        render.emit(head(spec, job=name, namespace=done.namespace, deleted=done.deleted, state=done.state,
                         message=done.message or None))
        return EXIT_OK if done.deleted else EXIT_BLOCKED
    if isinstance(done, CancelOutcome):
        render.emit(head(spec, job_id=name, cancelled=done.cancelled, state=done.state,
                         message=done.message or None))
        return EXIT_OK if done.cancelled else EXIT_BLOCKED
    render.emit(head(spec, job=name, group=group, restart_record_removed=done.record_removed,
                     nodes=[{**result_json(done.plan, r), "cancelled": r.ok} for r in done.results]))
    return EXIT_BLOCKED if any(not r.ok for r in done.results) else EXIT_OK


def cancel_text(spec: StackSpec, name: str, group: str | None, done: Any) -> int:
    """`cancel`: a line for the job (on each node); exit 1 where it was not cancelled."""
    from gpucluster.ops.slurmjobs import CancelOutcome

    if isinstance(done, EksCancel):
        if not done.deleted:
            render.fail([("cancel", f"job {name} not deleted ({done.state}): {done.message}")], EXIT_BLOCKED)
        render.say(f"job {name}: JobSet deleted (now {done.state}"
                   + ("; its pods are stopping" if done.state == "deleting" else "") + ")")
        return EXIT_OK
    if isinstance(done, CancelOutcome):
        if not done.cancelled:
            render.fail([("cancel", f"job {name} not cancelled: {done.message}")], EXIT_BLOCKED)
        render.say(f"job {name}: cancelled (Slurm state now {done.state or 'gone'})")
        return EXIT_OK
    for r in done.results:
        typer.echo(f"{r.instance_id}: {'cancelled' if r.ok else f'not cancelled ({r.status})'}"
                   + "".join(f"\n  | {line}" for line in r.tail(3) if not r.ok))
    return EXIT_BLOCKED if any(not r.ok for r in done.results) else EXIT_OK


# ------------------------------------------------------------------ the job backend


def backend(spec: StackSpec) -> JobBackend:
    """The stack's job backend, with clients in its region (chosen from the spec in `ops.jobbackends`)."""
    from gpucluster.ops.jobbackends import job_backend

    return job_backend(spec, common.clients(spec))


def refuse(spec: StackSpec, command: str, what: str | None = None) -> None:
    """One line and exit 2 when `what` (default: the command) makes no sense on this stack."""
    reason = backend(spec).refusal(what or command)
    if reason is not None:
        fail_usage(command, reason)


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


    render.use_json(as_json)
    spec = build_spec(stack)
    node = ops_call("login", lambda: backend(spec).login_target(progress=render.progress), None)
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
