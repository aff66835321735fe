"""Day-two commands on a deployed stack's nodes: nodes, run, hostfile, scale, stop, start.

Registered on `gpucluster.cli.commands.app` (commands.py imports this module).
It owns parsing, rendering and exit codes of these commands (0 fine, 1 a node
or a change failed or was declined, 2 invalid input or an AWS error, 130
interrupted); the work is in `gpucluster.ops.nodes`, `ops.run` and `ops.scale`.
Every command finds the stack's resources by its identity tag
(`StackSpec.identity`), in the stack file's region.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucluster.cli import render
from gpucluster.cli.commands import (
    EXIT_BLOCKED,
    EXIT_OK,
    JsonOption,
    StackArg,
    _aws_call,
    _resume_json,
    _usd,
    app,
    build_spec,
    confirm_or_exit,
    fail_usage,
    node_group_rate,
    render_resume_plan,
    render_status,
    render_table,
)
from gpucluster.noderole import run_log_group_name

if TYPE_CHECKING:
    from gpucluster.ops.nodes import Node
    from gpucluster.ops.run import JobPlan, NodeResult
    from gpucluster.spec import StackSpec

EXIT_INTERRUPTED = 130

GroupOption = Annotated[str | None, typer.Option(
    "--group", "-g", help="Node group name (as in the stack file), or an Auto Scaling group's name.")]
RequiredGroup = Annotated[str, typer.Option(
    "--group", "-g", help="Node group name (as in the stack file), or an Auto Scaling group's name.")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (scripts).")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Only show what would change.")]


def _client(spec: StackSpec, service: str) -> Any:
    """A boto3 client in the stack's region (honours AWS_ENDPOINT_URL)."""
    import boto3

    return boto3.client(service, region_name=spec.region)


def _ops_call(command: str, call: Callable[[], Any], doing: str | None = "asking AWS") -> Any:
    """`_aws_call`, plus a request the stack cannot answer (unknown group...) as one line, exit 2."""
    from gpucluster.ops.nodes import NodesError
    from gpucluster.ops.run import RunError

    try:
        return _aws_call(command, call, doing)
    except (NodesError, RunError) as err:
        fail_usage(command, str(err))


def _nodes(spec: StackSpec, command: str, group: str | None) -> list[Node]:
    from gpucluster.ops.nodes import stack_nodes

    mig = {g.name: len(g.mig_layout) for g in spec.node_groups if g.mig_layout}  # MIG devices are slots
    return _ops_call(command, lambda: stack_nodes(
        spec.identity, node_group=group, autoscaling_client=_client(spec, "autoscaling"),
        ec2_client=_client(spec, "ec2"), ssm_client=_client(spec, "ssm"), mig_per_gpu=mig),
        f"finding {spec.stack}'s nodes in {spec.region}")


def _head(spec: StackSpec, **more: Any) -> dict[str, Any]:
    """The start of every JSON document these commands print: which stack, where."""
    return {"stack": spec.stack, "region": spec.region, "identity": spec.identity, **more}


def _result_json(plan: JobPlan, result: NodeResult) -> dict[str, Any]:
    """One node's command in JSON: where it ran, how it ended, the tail of its output."""
    node = plan.ranks[result.rank].node
    return {"rank": result.rank, "instance_id": result.instance_id, "private_ip": node.private_ip,
            "command_id": result.command_id, "status": result.status, "exit_code": result.exit_code,
            "ok": result.ok, "error": result.error or None, "output_tail": result.tail(),
            "truncated": result.truncated}


def _ago(when: datetime | None) -> str:
    if when is None:
        return "-"
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


# ------------------------------------------------------------------------- nodes


def render_nodes(nodes: list[Node]) -> list[str]:
    return render_table(
        ["instance", "node group", "type", "GPUs", "slots", "zone", "private IP", "lifecycle", "state",
         "health", "launched (UTC)", "SSM"],
        [[n.instance_id, n.node_group, n.instance_type, str(n.gpus),
          f"{n.slots} MIG" if n.mig_per_gpu else str(n.slots), n.zone, n.private_ip or "-",
          n.lifecycle, f"{n.state}/{n.asg_state}", n.health, _ago(n.launch_time), n.ssm]
         for n in nodes])


@app.command()
def nodes(
    stack: StackArg,
    group: GroupOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the stack's nodes: id, group, type, zone, private IP, market, state, health, SSM."""
    render.use_json(as_json)
    spec = build_spec(stack)
    found = _nodes(spec, "nodes", group)
    if as_json:
        render.emit(_head(spec, nodes=[n.as_json() for n in found]))
        return
    if not found:
        render.say(f"stack {spec.stack} ({spec.region}): no nodes"
                   + (f" in node group {group}" if group else "")
                   + f" (groups tagged gpucluster:stack={spec.identity} run none; "
                     f"see `gpucluster status {stack}`)")
        return
    render.say(f"stack {spec.stack} ({spec.region}): {len(found)} node(s), "
               f"{sum(n.in_service for n in found)} in service")
    for line in render_nodes(found):
        render.say(line)


# --------------------------------------------------------------------------- run


def group_environment(spec: StackSpec, node_group: str) -> dict[str, str]:
    """The node group's EFA/NCCL settings (as its nodes' /etc/profile.d has them) and its image."""
    from gpucluster.node.userdata import efa_environment, group_bootstrap

    config = next((g for g in spec.node_groups if g.name == node_group), None)
    if config is None:
        return {}
    env = efa_environment(group_bootstrap(config, stack=spec.identity, cluster=spec.cluster.name,
                                          region=spec.region, spot=spec.spot))
    if config.container_image:
        env["GPUCLUSTER_CONTAINER_IMAGE"] = config.container_image  # pulled at boot
    if config.mig_layout:
        env["GPUCLUSTER_MIG_LAYOUT"] = ",".join(config.mig_layout)  # each GPU's MIG instances
    uri = checkpoint_uri(spec)
    if uri:
        env["GPUCLUSTER_CHECKPOINT_URI"] = uri
    return env


def checkpoint_uri(spec: StackSpec) -> str | None:
    """Where jobs keep checkpoints: the first dataset with a checkpoint_prefix.

    FSx datasets: the node path the file system links to that prefix (exported back
    to S3, gpucluster.aws.datasets); others: s3://bucket/prefix when the bucket's name
    is in the stack file (a created bucket without bucket_name gets its name at deploy
    time: then none).
    """
    for d in spec.datasets:
        if d.checkpoint_prefix is None:
            continue
        if d.access == "fsx" and d.fsx is not None:
            return f"{d.fsx.mount_path.rstrip('/')}/checkpoints/"
        if d.bucket_name:
            return f"s3://{d.bucket_name}/{d.checkpoint_prefix}"
    return None


def render_dry_run(plan: JobPlan) -> list[str]:
    """Each rank's script as it would be sent (verbatim: a shell line is not wrapped)."""
    out = render.wrap(f"dry run: {len(plan.ranks)} node(s); each would run (AWS-RunShellScript, timeout "
                      f"{plan.timeout_seconds} s, output to CloudWatch Logs {plan.log_group}):")
    for r in plan.ranks:
        out.append(f"rank {r.rank}: {r.node.instance_id} {r.node.private_ip} ({r.node.instance_type})")
        out += [f"  {line}" for line in plan.script(r)]
    out.append("dry run: nothing sent")
    return out


def _label(plan: JobPlan, result: NodeResult) -> str:
    node = plan.ranks[result.rank].node
    return f"rank {result.rank} {result.instance_id} {node.private_ip}"


def render_results(plan: JobPlan, results: list[NodeResult]) -> list[str]:
    """Each node's end and its output's tail (the node's own lines verbatim, not wrapped)."""
    out = []
    for r in results:
        exit_text = "" if r.exit_code is None else f", exit {r.exit_code}"
        extra = f" ({r.error})" if r.error else ""
        out += render.wrap(f"{_label(plan, r)}: {r.status}{exit_text}{extra}")
        out += [f"  | {line}" for line in r.tail()]
        if r.truncated:
            out += render.wrap(f"(SSM returns only the start of long output: the full output is in "
                               f"CloudWatch Logs, streams {r.log_streams()})", "  | ", hang="")
    return out


@app.command()
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
    as_json: JsonOption = False,
) -> None:
    """Run CMD on every in-service node of a group through SSM, with torchrun's rank environment.

    Each node gets MASTER_ADDR (rank 0's private IP), MASTER_PORT, NNODES, NODE_RANK,
    NPROC_PER_NODE (its GPUs, or MIG devices), WORLD_SIZE and the group's EFA/NCCL settings.
    Ranks follow launch time, then instance id. Exits 1 when any node fails. With --json, one
    object at the end (each node's status, exit code and output tail; with --nccl-test the bus
    bandwidth per size and the verdict), nothing while it runs.
    """
    from gpucluster.lambdas.jobnames import job_parameter_name
    from gpucluster.ops.run import (
        DEFAULT_TIMEOUT_SECONDS,
        QUERY_TIMEOUT_SECONDS,
        job_record,
        plan_job,
        send_job,
        wait_job,
    )

    render.use_json(as_json)
    if not group:
        fail_usage("run", "--group is required (the node group to run on)")
    if nccl_test:
        if command or detach or name or restart_on_replace:
            fail_usage("run", "--nccl-test runs its own benchmark: give no command, --detach, --name or "
                              "--restart-on-replace")
        _nccl_test(stack, group, dry_run=dry_run, max_bytes=nccl_max_bytes, as_json=as_json)
        return
    if name is not None and not detach:
        fail_usage("run", "--name names a detached job: add --detach")
    if restart_on_replace and not detach:
        fail_usage("run", "--restart-on-replace restarts detached jobs: add --detach")
    spec = build_spec(stack)
    text = " ".join(command or [])
    job_name = (name or datetime.now(UTC).strftime("job-%Y%m%d-%H%M%S")) if detach else None
    found = _nodes(spec, "run", group)
    environment = group_environment(spec, group)
    plan = _ops_call("run", lambda: plan_job(
        found, text, master_port=master_port,
        timeout_seconds=QUERY_TIMEOUT_SECONDS if detach else timeout or DEFAULT_TIMEOUT_SECONDS,
        group_environment=environment, log_group=run_log_group_name(spec.identity),
        workdir=workdir, detach=job_name, job_timeout_seconds=timeout if detach else None))
    config = next((g for g in spec.node_groups if g.name == group), None)
    record = _ops_call("run", lambda: job_record(
        plan, node_group=group, master_port=master_port, group_environment=environment,
        launched_at=datetime.now(UTC).isoformat(),
        instance_types=config.instance_types if config else ())) if restart_on_replace else None
    head = _head(spec, group=group, command=text, job=plan.detach, log_group=plan.log_group,
                 master_addr=plan.ranks[0].environment["MASTER_ADDR"], restart_on_replace=restart_on_replace)
    if dry_run:
        where = job_parameter_name(spec.identity, plan.detach or "")
        if as_json:
            render.emit({**head, "dry_run": True, "ranks": [
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
    ssm = _client(spec, "ssm")
    if not as_json:
        render.say(f"run on {len(plan.ranks)} node(s) of {group}, MASTER_ADDR "
                   f"{plan.ranks[0].environment['MASTER_ADDR']}: {text}")
    job = _aws_call("run", lambda: send_job(ssm, plan, comment=f"gpucluster run {group}"),
                    f"sending the command to {len(plan.ranks)} node(s)")

    def finish(ok: bool, code: int, note: str, **more: Any) -> None:
        if as_json:
            render.emit({**head, "dry_run": False, "ok": ok, "cancelled": job.cancelled, "note": note,
                         "results": [_result_json(plan, r) for r in job.results], **more})
        raise typer.Exit(code)

    if job.cancelled:
        if not as_json:
            for line in render_results(plan, job.results):
                typer.echo(line)
            render.say("run: not started on every node, so cancelled on all (nothing half-runs)")
        finish(False, EXIT_BLOCKED, "not started on every node, so cancelled on all")

    def progress(result: NodeResult) -> None:
        if not as_json:
            render.say(f"{_label(plan, result)}: {result.status}")

    try:
        # Delivery may take up to its own timeout before the execution clock starts. No spinner:
        # each node's status prints as it changes (JSON mode shows none anyway).
        job = _aws_call("run", lambda: wait_job(ssm, job, timeout_seconds=plan.timeout_seconds + 180,
                                                on_change=progress), None)
    except KeyboardInterrupt:
        from gpucluster.ops.run import cancel

        for result in job.results:
            if result.command_id and not result.done:
                cancel(ssm, result)
        message = "interrupted: the command was cancelled on every node still running it"
        if as_json:
            render.fail([("run", message)], EXIT_INTERRUPTED)
        render.say(f"\n{message}")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    restart = _record_restart(spec, ssm, plan.detach, group, record) if job.ok and plan.detach else None
    if as_json:
        note = (f"job {plan.detach} started" if plan.detach else "finished") if job.ok else (
            f"{len(job.failed)} of {len(job.results)} node(s) failed")
        stored = restart is None or restart["ok"]
        finish(job.ok, EXIT_OK if job.ok and stored else EXIT_BLOCKED, note, restart_record=restart)
    render.say("")
    for line in render_results(plan, job.results):
        typer.echo(line)
    render.say(f"full output: CloudWatch Logs group {plan.log_group}, a stream per node "
               "(<command id>/<instance id>/...)")
    if restart is not None:
        render.say(f"run: job {plan.detach} started on all {len(job.results)} node(s); follow it with "
                   f"`gpucluster jobs {stack}`, `gpucluster logs {stack} {plan.detach} --follow`, stop it "
                   f"with `gpucluster cancel {stack} {plan.detach}`")
        if restart["message"]:
            render.say(restart["message"])
        if not restart["ok"]:
            raise typer.Exit(EXIT_BLOCKED)
        return
    if job.ok:
        render.say(f"run: all {len(job.results)} node(s) succeeded")
        return
    render.say(f"run: {len(job.failed)} of {len(job.results)} node(s) failed (ranks "
               f"{', '.join(str(r.rank) for r in job.failed)})")
    raise typer.Exit(EXIT_BLOCKED)


def _phase_json(results: list[NodeResult]) -> list[dict[str, Any]]:
    """One phase of the NCCL test in JSON: each node's end and its output's tail."""
    return [{"rank": r.rank, "instance_id": r.instance_id, "status": r.status, "exit_code": r.exit_code,
             "ok": r.ok, "error": r.error or None, "output_tail": r.tail()} for r in results]


def _nccl_test(stack: str, group: str, *, dry_run: bool, max_bytes: str, as_json: bool) -> None:
    """`run --nccl-test`: the phases of ops.nccl through SSM, then the bandwidth table and verdict."""
    from gpucluster.ops.nccl import (
        assess,
        expectation,
        human_bytes,
        phase_plan,
        plan_nccl_test,
        run_nccl_test,
        ssm_runner,
    )
    from gpucluster.ops.run import JobResult

    spec = build_spec(stack)
    found = _nodes(spec, "run", group)
    base = _ops_call("run", lambda: plan_nccl_test(
        found, log_group=run_log_group_name(spec.identity), group_environment=group_environment(spec, group),
        max_bytes=max_bytes))
    expected = expectation([r.node for r in base.ranks])
    efa = base.ranks[0].environment.get("FI_PROVIDER") == "efa"
    gpus = base.ranks[0].environment["NPROC_PER_NODE"]
    head = _head(spec, group=group, test="all_reduce_perf", nodes=len(base.ranks), gpus_per_node=int(gpus),
                 instance_type=expected.instance_type, efa=efa, max_bytes=max_bytes)
    if not as_json:
        render.say(f"NCCL all_reduce_perf on {len(base.ranks)} node(s) x {gpus} GPU(s) of {group} "
                   f"({expected.instance_type}, {'EFA on' if efa else 'no EFA: TCP sockets'}), "
                   f"8 B to {max_bytes}B")
    if dry_run:
        phases = {phase: [r.node.instance_id for r in phase_plan(base, phase, "nccl-dry-run",
                                                                   first_only=first).ranks]
                  for phase, first in (("key", True), ("authorize", False), ("run", True), ("revoke", False))}
        if as_json:
            render.emit({**head, "dry_run": True, "phases": phases})
            return
        for phase, ids in phases.items():
            render.say(f"{phase}: {', '.join(ids)}")
        render.say("dry run: nothing sent")
        return
    run_id = datetime.now(UTC).strftime("nccl-%Y%m%d-%H%M%S")
    if not as_json:
        render.say("Open MPI starts the ranks over SSH: a one-time key, authorised within the group only, "
                   "is removed when the test ends")
    send = ssm_runner(_client(spec, "ssm"))
    current = {"phase": ""}

    def on_phase(phase: str) -> None:
        current["phase"] = phase
        if not as_json:
            render.say(f"{phase} ...")

    def runner(plan: JobPlan) -> JobResult:  # a spinner per phase (the run phase takes minutes)
        with render.progress(f"nccl-test: {current['phase']} on {len(plan.ranks)} node(s)"):
            return send(plan)

    try:
        outcome = _aws_call("run", lambda: run_nccl_test(base, run_id, runner, on_phase=on_phase), None)
    except KeyboardInterrupt:
        message = "interrupted: the test key was removed where the revoke phase reached"
        if as_json:
            render.fail([("run", message)], EXIT_INTERRUPTED)
        render.say(f"\n{message}")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    ok, lines = assess(outcome, expected)
    log = f"/var/log/gpucluster/nccl-test-{run_id}.log"
    report = outcome.report
    if as_json:
        peak = report.peak if report else None
        render.emit({
            **head, "dry_run": False, "run_id": run_id, "passed": ok, "findings": lines, "log_on_rank_0": log,
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
            "phases": {phase: _phase_json(results) for phase, results in outcome.phases.items()}})
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
        for line in render_table(headers, rows):
            typer.echo(line)
    for line in lines:
        render.say(line)
    verdict = render.paint("passed", "good") if ok else render.paint("failed", "bad")
    render.say(f"nccl-test: {verdict} (full output on rank 0: {log})")
    if not ok:
        raise typer.Exit(EXIT_BLOCKED)


def _record_restart(spec: StackSpec, ssm: Any, job: str, group: str,
                    record: dict[str, Any] | None) -> dict[str, Any]:
    """Store (or, without --restart-on-replace, drop) the job's record for the restart handler.

    A job started again under the same name without the flag must not inherit an older record.
    Returns what `run --json` shows: the parameter, whether it holds this run's record, whether
    that went as asked (`ok`) and the line to print (None: nothing to say).
    """
    from gpucluster.lambdas.awsapi import AWS_ERRORS, error_code
    from gpucluster.lambdas.job_restart import encode_record
    from gpucluster.lambdas.jobnames import job_parameter_name

    name = job_parameter_name(spec.identity, job)
    outcome: dict[str, Any] = {"parameter": name, "stored": False, "ok": True, "message": None}
    if record is None:
        try:
            with render.progress(f"removing an older restart record {name}"):
                _drop_record(ssm, name)
        except AWS_ERRORS as exc:
            outcome["message"] = (f"run: warning: could not remove an older restart record {name} "
                                  f"({error_code(exc) or type(exc).__name__}); `gpucluster cancel` "
                                  "removes it")
        return outcome
    try:
        with render.progress(f"storing the restart record {name}"):
            ssm.put_parameter(Name=name, Value=encode_record(record), Type="String", Overwrite=True,
                              Description=f"gpucluster run --restart-on-replace: job {job} of {group}"[:1024])
    except AWS_ERRORS as exc:
        return {**outcome, "ok": False, "message": (
            f"run: the job runs, but restart-on-replace is off: its record {name} was not stored "
            f"({error_code(exc) or type(exc).__name__}: {exc})")}
    return {**outcome, "stored": True, "message": (
        f"restart-on-replace: when a replacement brings {group} back to {record['nnodes']} node(s), the "
        f"job starts again on the new nodes with GPUCLUSTER_CHECKPOINT_LATEST (record {name})")}


def _drop_record(ssm: Any, name: str) -> bool:
    """Delete a job's restart record; False when there was none."""
    from gpucluster.lambdas.awsapi import AWS_ERRORS, error_code

    try:
        ssm.delete_parameter(Name=name)
    except AWS_ERRORS as exc:
        if error_code(exc) == "ParameterNotFound":
            return False
        raise
    return True


# ---------------------------------------------------------------------- hostfile

HOSTFILE_FORMATS = ("mpi", "deepspeed", "plain")


def render_hostfile(found: list[Node], fmt: str) -> list[str]:
    """Open MPI and DeepSpeed both read `<host> slots=<n>` (Open MPI mpirun(1) "Specifying
    Host Nodes"; DeepSpeed "Resource Configuration (multi-node)"); plain is one address a line."""
    ready = [n for n in found if n.in_service and n.private_ip]
    if fmt == "plain":
        return [str(n.private_ip) for n in ready]
    return [f"{n.private_ip} slots={max(1, n.slots)}" for n in ready]


@app.command()
def hostfile(
    stack: StackArg,
    group: RequiredGroup = "",
    fmt: Annotated[str, typer.Option("--format", help="mpi (Open MPI), deepspeed, or plain (one IP a "
                                                      "line).")] = "mpi",
    as_json: JsonOption = False,
) -> None:
    """Print the group's in-service nodes as a host list, in rank order (GPUs, or MIG devices, as
    slots)."""
    render.use_json(as_json)
    if not group:
        fail_usage("hostfile", "--group is required")
    if fmt not in HOSTFILE_FORMATS:
        fail_usage("hostfile", f"--format: must be mpi, deepspeed or plain, got {fmt!r}")
    spec = build_spec(stack)
    found = _nodes(spec, "hostfile", group)
    lines = render_hostfile(found, fmt)
    if not lines:
        render.fail([("hostfile", f"no node of {group} is in service")], EXIT_BLOCKED)
    if as_json:
        hosts = [{"instance_id": n.instance_id, "private_ip": n.private_ip, "slots": max(1, n.slots)}
                 for n in found if n.in_service and n.private_ip]
        render.emit(_head(spec, group=group, format=fmt, hosts=hosts, lines=lines))
        return
    for line in lines:
        typer.echo(line)


# ------------------------------------------------------------------ scale / stop / start


@app.command()
def scale(
    stack: StackArg,
    group: RequiredGroup = "",
    desired: Annotated[int | None, typer.Option("--desired", help="Nodes the group should run.")] = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Set a node group's desired nodes (within its max_nodes); shows the cost per hour, asks first.

    With --json it cannot ask: adding nodes (or fewer than now) needs --yes, or --dry-run.
    """
    from gpucluster.ops.scale import apply_scale, plan_scale

    render.use_json(as_json)
    if not group:
        fail_usage("scale", "--group is required")
    if desired is None:
        fail_usage("scale", "--desired is required")
    spec = build_spec(stack)
    client = _client(spec, "autoscaling")
    changes = _ops_call("scale", lambda: plan_scale(spec.identity, group, desired,
                                                    autoscaling_client=client),
                        f"reading {spec.stack}'s Auto Scaling groups in {spec.region}")
    rows, total, priced = [], 0.0, []
    for c in changes:
        instance_type, rate = node_group_rate(spec, c.node_group)
        cost = None if rate is None else rate * c.desired_after
        total += cost or 0.0
        rows.append([c.group, c.node_group, str(c.desired_now), str(c.desired_after),
                     f"{c.min_now} -> {c.min_after}", instance_type, "?" if cost is None else _usd(cost)])
        priced.append({**asdict(c), "instance_type": instance_type,
                       "on_demand_usd_per_hour_after": None if cost is None else round(cost, 4)})
    added = sum(c.added_nodes for c in changes)
    unchanged = all(c.desired_now == c.desired_after and c.min_now == c.min_after for c in changes)
    document = _head(spec, group=group, desired=desired, changes=priced, dry_run=dry_run,
                     changed=not unchanged and not dry_run, results=[])
    if not as_json:
        render.say(f"stack {spec.stack} ({spec.region}): scale {group} to {desired} node(s):")
        for line in render_table(["group", "node group", "nodes now", "nodes after", "min",
                                  "instance type", "on-demand $/h after"], rows):
            render.say(line)
        if added:
            render.say(f"cost: ${_usd(total)}/hour (${_usd(total * 24)}/day) at on-demand rates of the "
                       "first instance type; spot nodes cost less")
        if unchanged or dry_run:
            render.say("nothing to change" if unchanged else "dry run: nothing changed")
    if unchanged or dry_run:
        if as_json:
            render.emit(document)
        return
    if added or desired < min(c.desired_now for c in changes):
        confirm_or_exit("scale", f"Scale {group} to {desired} node(s)?", yes)
    results = _aws_call("scale", lambda: apply_scale(changes, autoscaling_client=client),
                        f"scaling {group} to {desired} node(s)")
    if as_json:
        render.emit({**document, "results": [asdict(r) for r in results]})
    else:
        for r in results:
            render.say(f"scaled {r.group} to {desired} node(s)" if r.action == "scaled"
                       else f"not scaled {r.group}: {r.reason}")
    if any(r.action != "scaled" for r in results):
        raise typer.Exit(EXIT_BLOCKED)


@app.command()
def stop(
    stack: StackArg,
    group: GroupOption = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Stop node groups (all, or one): runs the pre-stop hook on their nodes, then scales to zero.

    Recorded as stopped-by `manual`: `status` shows it, `start` or `resume` restore the
    capacity, schedules leave it alone, and a budget stop still outranks it. With --json it
    cannot ask: give --yes, or --dry-run.
    """
    from gpucluster.ops.scale import plan_stop, stop_stack
    from gpucluster.ops.status import stack_status

    render.use_json(as_json)
    spec = build_spec(stack)
    client = _client(spec, "autoscaling")
    candidates = _ops_call("stop", lambda: plan_stop(spec.identity, group, autoscaling_client=client),
                           f"reading {spec.stack}'s Auto Scaling groups in {spec.region}")
    running = [c for c in candidates if c.running]
    hook = spec.autostop.pre_stop_command
    document = _head(spec, group=group, groups=[asdict(c) for c in candidates],
                     to_stop=[c.group for c in running], pre_stop_command=hook, dry_run=dry_run)
    if as_json and (not running or dry_run):
        render.emit({**document, "stopped": {}, "errors": {}, "hook": None, "status": []})
        return
    if not running:
        render.say(f"nothing to stop in stack {spec.stack} ({spec.region})"
                   + (f", node group {group}" if group else "") + ":")
        for c in candidates:
            why = f"stopped by {c.stopped_by}" if c.stopped_by else "at 0 nodes by its own settings"
            render.say(f"  {c.group}: {why}")
        if not candidates:
            render.say(f"  no Auto Scaling group is tagged gpucluster:stack={spec.identity}")
        return
    if not as_json:
        _show_stop(spec, running, hook)
    if dry_run:
        render.say("dry run: nothing changed")
        return
    confirm_or_exit("stop", f"Stop {len(running)} group(s)?", yes)
    doing = f"running the pre-stop hook on {len(running)} group(s), then " if hook else ""
    report = _aws_call("stop", lambda: stop_stack(
        running, autoscaling_client=client, ssm_client=_client(spec, "ssm") if hook else None,
        pre_stop_command=hook, hook_timeout_seconds=spec.autostop.pre_stop_timeout_seconds),
        f"{doing}scaling {len(running)} group(s) to zero")
    rows = _aws_call("stop", lambda: stack_status(spec.identity, autoscaling_client=client))
    if as_json:
        hook_json = None if report.hook is None else {
            "ok": report.hook.ok, "timed_out": report.hook.timed_out, "statuses": report.hook.statuses,
            "errors": report.hook.errors}
        render.emit({**document, "stopped": report.outcomes, "errors": report.errors, "hook": hook_json,
                     "status": [asdict(r) for r in rows]})
        raise typer.Exit(EXIT_BLOCKED if report.errors else EXIT_OK)
    if report.hook is not None:
        failed = ", ".join(f"{i} ({s})" for i, s in report.hook.failed.items())
        timed_out = " (timed out)" if report.hook.timed_out else ""
        render.say("pre-stop hook: " + ("ok on every node" if report.hook.ok
                                        else f"did not succeed on {failed}{timed_out}"))
    for name, outcome in report.outcomes.items():
        render.say(f"{name}: {outcome}")
    for name, error in report.errors.items():
        render.say(f"{name}: not stopped: {error}")
    for line in render_status(rows):
        render.say(line)
    if report.errors:
        raise typer.Exit(EXIT_BLOCKED)


def _show_stop(spec: StackSpec, running: list[Any], hook: str | None) -> None:
    """What `stop` is about to do: the groups, their nodes, the hook, what is erased."""
    render.say(f"stack {spec.stack} ({spec.region}): stop {len(running)} group(s), "
               f"{sum(c.desired_now for c in running)} node(s):")
    for line in render_table(["group", "node group", "nodes now", "in service"],
                             [[c.group, c.node_group, str(c.desired_now), str(c.in_service)]
                              for c in running]):
        render.say(line)
    render.say(f"pre-stop hook first: {hook} (waits at most {spec.autostop.pre_stop_timeout_seconds} s)"
               if hook else "no pre-stop hook (autostop.pre_stop_command): running jobs stop as they are")
    render.say("instance-store scratch is erased; S3 and FSx data are untouched")


@app.command()
def start(
    stack: StackArg,
    group: GroupOption = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Restart stopped node groups (all, or one) at their recorded capacity; never a budget stop.

    With --json it cannot ask: give --yes, or --dry-run.
    """
    from gpucluster.lambdas.nodegroups import BUDGET
    from gpucluster.ops.scale import plan_start, start_stack

    render.use_json(as_json)
    spec = build_spec(stack)
    client = _client(spec, "autoscaling")
    candidates = _ops_call("start", lambda: plan_start(spec.identity, group, autoscaling_client=client),
                           f"reading {spec.stack}'s Auto Scaling groups in {spec.region}")
    todo = [c for c in candidates if c.decision.action == "resume"]
    document = _head(spec, group=group, dry_run=dry_run, groups=[_resume_json(spec, c) for c in candidates],
                     started=[])
    if as_json and (not todo or dry_run):
        render.emit(document)
        return
    if as_json:
        confirm_or_exit("start", f"Restart {len(todo)} group(s)?", yes)  # --json: --yes or exit 2
        results = _aws_call("start", lambda: start_stack(
            spec.identity, {c.group: c.decision.stopped_by for c in todo}, autoscaling_client=client),
            f"restarting {len(todo)} group(s)")
        render.emit({**document, "started": [asdict(r) for r in results]})
        raise typer.Exit(EXIT_BLOCKED if any(r.action != "resumed" for r in results) else EXIT_OK)
    for c in candidates:
        if c.decision.stopped_by == BUDGET:
            render.say(f"{c.group}: stopped by the budget action; start leaves it stopped "
                       f"(`gpucluster resume {stack} --only budget` undoes it, with its warning)")
    if not todo:
        render.say(f"nothing to start in stack {spec.stack} ({spec.region})"
                   + (f", node group {group}" if group else "")
                   + ": no group stopped by manual, idle, schedule or lifetime"
                   + (f" (`gpucluster scale {stack} --group G --desired N` for a group at 0 by "
                      "its own settings)" if candidates else ""))
        raise typer.Exit(EXIT_OK)
    for line in render_resume_plan(spec, todo, action="start"):
        render.say(line)
    if dry_run:
        render.say("dry run: nothing changed")
        return
    confirm_or_exit("start", f"Restart {len(todo)} group(s)?", yes)
    results = _aws_call("start", lambda: start_stack(
        spec.identity, {c.group: c.decision.stopped_by for c in todo}, autoscaling_client=client),
        f"restarting {len(todo)} group(s)")
    before = {c.group: c.desired_now for c in todo}
    for r in results:
        if r.action == "resumed":
            render.say(f"started {r.group} (stopped by {r.stopped_by}): {before.get(r.group, 0)} -> "
                       f"{r.desired_capacity} node(s), min {r.min_size}")
        else:
            render.say(f"not started {r.group}: {r.reason}")
    if any(r.action != "resumed" for r in results):
        raise typer.Exit(EXIT_BLOCKED)


# ------------------------------------------------------------- jobs / logs / cancel


def _on_nodes(spec: StackSpec, command: str, group: str | None, script: str,
              node: str | None = None) -> tuple[JobPlan, list[NodeResult]]:
    """Run a short gpucluster-job command on the in-service nodes (one, with --node) and wait."""
    from gpucluster.ops.run import plan_on_nodes, send_job, wait_job

    found = [n for n in _nodes(spec, command, group) if n.in_service]
    if node is not None:
        chosen = [n for i, n in enumerate(found) if node in (str(i), n.instance_id, n.private_ip)]
        if not chosen:
            fail_usage(command, f"--node: no in-service node {node!r} (a rank 0..{len(found) - 1}, an "
                                "instance id or a private IP)")
        found = chosen
    log_group = run_log_group_name(spec.identity)
    plan = _ops_call(command, lambda: plan_on_nodes(found, script, log_group=log_group))
    ssm = _client(spec, "ssm")
    with render.progress(f"asking {len(plan.ranks)} node(s) through SSM"):  # one spinner for both
        job = _aws_call(command, lambda: send_job(ssm, plan, comment=f"gpucluster {command}"), None)
        if not job.cancelled:
            job = _aws_call(command, lambda: wait_job(ssm, job, timeout_seconds=plan.timeout_seconds + 60,
                                                      poll_seconds=2.0), None)
    return plan, job.results


def _job_name(command: str, name: str) -> str:
    from gpucluster.ops.run import RunError, check_job_name

    try:
        return check_job_name(name)
    except RunError as err:
        fail_usage(command, str(err))


@app.command("jobs")
def list_jobs(stack: StackArg, group: GroupOption = None, as_json: JsonOption = False) -> None:
    """List the detached jobs (`run --detach`) on the stack's nodes, with their state per node."""
    from gpucluster.ops.run import JOB_TOOL, parse_job_states

    render.use_json(as_json)
    spec = build_spec(stack)
    plan, results = _on_nodes(spec, "jobs", group, f"{JOB_TOOL} status")
    rows, silent, found = [], [], []
    for r in results:
        node = plan.ranks[r.rank].node
        if not r.ok:
            silent.append(f"{r.instance_id} ({r.status}{f', {r.error}' if r.error else ''})")
            continue
        for state in parse_job_states(r.stdout):
            rows.append([state.name, node.node_group, r.instance_id, node.private_ip or "-", state.state,
                         "-" if state.exit_status is None else str(state.exit_status), state.started or "-"])
            found.append({"job": state.name, "node_group": node.node_group, "instance_id": r.instance_id,
                          "private_ip": node.private_ip, "state": state.state,
                          "exit_status": state.exit_status, "started": state.started or None})
    if as_json:
        found.sort(key=lambda j: (j["job"], j["node_group"], j["instance_id"]))
        render.emit(_head(spec, group=group, jobs=found, no_answer=[
            _result_json(plan, r) for r in results if not r.ok]))
        raise typer.Exit(EXIT_BLOCKED if silent else EXIT_OK)
    if rows:
        for line in render_table(["job", "node group", "instance", "private IP", "state", "exit", "started"],
                                 sorted(rows)):
            render.say(line)
    else:
        render.say(f"no detached jobs on the {len(results) - len(silent)} node(s) that answered")
    if silent:
        render.say(f"no answer from: {', '.join(silent)}")
        raise typer.Exit(EXIT_BLOCKED)


@app.command()
def logs(
    stack: StackArg,
    job: Annotated[str, typer.Argument(help="The job's name (see `gpucluster jobs`).")],
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
    from gpucluster.ops.run import JOB_TOOL

    render.use_json(as_json, lines=follow)
    name = _job_name("logs", job)
    if not 1 <= lines <= 5000:
        fail_usage("logs", f"--lines: must be 1..5000, got {lines}")
    spec = build_spec(stack)
    if follow:
        _follow(spec, name, group, node, as_json)
        return
    plan, results = _on_nodes(spec, "logs", group, f"{JOB_TOOL} logs {name} {lines}", node)
    if as_json:
        render.emit(_head(spec, job=name, nodes=[
            {**_result_json(plan, r), "output": r.stdout.splitlines()} for r in results]))
        raise typer.Exit(EXIT_BLOCKED if any(not r.ok for r in results) else EXIT_OK)
    for r in results:
        render.say(f"== {r.instance_id} {plan.ranks[r.rank].node.private_ip}: {r.status}"
                   + (f" ({r.error})" if r.error else ""))
        for line in r.stdout.splitlines():
            typer.echo(line)
    if any(not r.ok for r in results):
        raise typer.Exit(EXIT_BLOCKED)


def _running(spec: StackSpec, instance_ids: Iterable[str]) -> set[str]:
    """Which of these instances EC2 still has pending or running."""
    from gpucluster.ops.nodes import describe_instances

    found = describe_instances(_client(spec, "ec2"), list(instance_ids))
    return {i for i, d in found.items() if d.get("State", {}).get("Name") in ("pending", "running")}


def _follow(spec: StackSpec, name: str, group: str | None, node: str | None, as_json: bool) -> None:
    """`logs --follow`: which nodes run the job (SSM, `gpucluster-job status`), then their streams.

    Human: the job's lines on stdout as they arrive (`<instance> | ` before each when several
    nodes), what is followed and how it ended on stderr. JSON Lines: `{"event": "line", ...}` per
    log line, then `{"event": "end", ...}`.
    """
    from gpucluster.ops.joblogs import JobFollower, LogLine, follow, job_log_stream, parse_started
    from gpucluster.ops.run import JOB_TOOL, parse_job_states

    plan, results = _on_nodes(spec, "logs", group, f"{JOB_TOOL} status", node)
    found = {r.instance_id: state for r in results if r.ok
             for state in parse_job_states(r.stdout) if state.name == name}
    silent = [f"{r.instance_id} ({r.status})" for r in results if not r.ok]
    if not found:
        problems = [("logs", f"no answer from: {', '.join(silent)}")] if silent else []
        problems.append(("logs", f"no job {name} on the {len(results) - len(silent)} node(s) that answered "
                                 f"(see `gpucluster jobs {spec.stack}`)"))
        render.fail(problems, EXIT_BLOCKED)
    if silent and not as_json:
        render.say(f"no answer from: {', '.join(silent)}", err=True)
    starts = [t for s in found.values() if (t := parse_started(s.started)) is not None]
    # From a minute before the job's first start (clock skew); without a start time, the last day.
    since = min(starts) if len(starts) == len(found) else datetime.now(UTC) - timedelta(days=1)
    streams = {job_log_stream(i, name): i for i in found}
    follower = JobFollower(_client(spec, "logs"), run_log_group_name(spec.identity), name, streams,
                           int((since - timedelta(minutes=1)).timestamp() * 1000),
                           {s for s, i in streams.items() if found[i].state == "running"})
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
        _aws_call("logs", lambda: follow(follower, show, running=lambda ids: _running(spec, ids)), None)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    failed = any(not e.ok for e in follower.endings.values()) or bool(silent)
    ends = sorted(streams.items(), key=lambda item: item[1])
    if as_json:
        render.emit({"event": "end", **_head(
            spec, job=name, log_group=follower.log_group, ok=not failed,
            nodes=[_ending_json(instance, follower.endings.get(stream)) for stream, instance in ends],
            no_answer=[_result_json(plan, r) for r in results if not r.ok])})
    else:
        for stream, instance in ends:
            ending = follower.endings.get(stream)
            render.say(f"{instance}: {ending.describe() if ending else 'had already ended'}", err=True)
    if failed:
        raise typer.Exit(EXIT_BLOCKED)


def _ending_json(instance_id: str, ending: Any) -> dict[str, Any]:
    """How the job ended on one node (`logs --follow --json`); None fields: it had already ended."""
    if ending is None:
        return {"instance_id": instance_id, "result": None, "exit_status": None, "ok": None}
    return {"instance_id": instance_id, "result": ending.result, "exit_status": ending.status,
            "ok": ending.ok}


@app.command()
def cancel(
    stack: StackArg,
    job: Annotated[str, typer.Argument(help="The job's name (see `gpucluster jobs`).")],
    group: GroupOption = None,
    yes: YesOption = False,
    as_json: JsonOption = False,
) -> None:
    """Stop a detached job on every node (SIGTERM, then SIGKILL after 90 s); --json needs --yes.

    Its restart-on-replace record goes first, so no replacement starts it again while it stops.
    """
    from gpucluster.lambdas.jobnames import job_parameter_name
    from gpucluster.ops.run import JOB_TOOL

    render.use_json(as_json)
    name = _job_name("cancel", job)
    spec = build_spec(stack)
    confirm_or_exit("cancel", f"Stop job {name} on every node of {group or 'the stack'}?", yes)
    record = job_parameter_name(spec.identity, name)
    removed = _aws_call("cancel", lambda: _drop_record(_client(spec, "ssm"), record),
                        f"removing the job's restart record {record}")
    if removed and not as_json:
        render.say(f"{name}: restart-on-replace record removed")
    plan, results = _on_nodes(spec, "cancel", group, f"{JOB_TOOL} cancel {name}")
    if as_json:
        render.emit(_head(spec, job=name, group=group, restart_record_removed=removed, nodes=[
            {**_result_json(plan, r), "cancelled": r.ok} for r in results]))
        raise typer.Exit(EXIT_BLOCKED if any(not r.ok for r in results) else EXIT_OK)
    for r in results:
        typer.echo(f"{r.instance_id}: {'cancelled' if r.ok else f'not cancelled ({r.status})'}"
                   + "".join(f"\n  | {line}" for line in r.tail(3) if not r.ok))
    if any(not r.ok for r in results):
        raise typer.Exit(EXIT_BLOCKED)
