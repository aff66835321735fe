"""Launching a job on a node group: node discovery, the job's plan, its start, its restart record.

This is `gpucluster run` without the command line: `find_nodes` finds a stack's nodes,
`plan_run` turns a command into each rank's script (and, with restart-on-replace, the
record the restart handler reads), `start_run` sends it through SSM, cancels it on every
node when it cannot start on all, cancels what still runs when interrupted, and stores or
drops the job's restart record. A notebook or another tool runs a job with these two calls.
It returns result objects and prints nothing: progress is the caller's (`progress`,
`on_change`), and it never decides exit codes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpucluster.fleet.awsapi import AWS_ERRORS, error_code
from gpucluster.noderole import run_log_group_name
from gpucluster.ops import Clients, Spinner, no_spinner
from gpucluster.ops.awserrors import describe

if TYPE_CHECKING:
    from gpucluster.ops.nodes import Node
    from gpucluster.ops.run import JobPlan, JobResult, NodeResult
    from gpucluster.spec import StackSpec


def find_nodes(spec: StackSpec, group: str | None, *, clients: Clients,
               progress: Spinner = no_spinner) -> list[Node]:
    """The stack's nodes (of one node group when given) in rank order; MIG devices count as slots."""
    from gpucluster.ops.nodes import stack_nodes

    mig = {g.name: len(g.mig_layout) for g in spec.node_groups if g.mig_layout}
    with progress(f"finding {spec.stack}'s nodes in {spec.region}"):
        return stack_nodes(spec.identity, node_group=group, autoscaling_client=clients("autoscaling"),
                           ec2_client=clients("ec2"), ssm_client=clients("ssm"), mig_per_gpu=mig)


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


# ------------------------------------------------------------------------- the plan


@dataclass
class RunPlan:
    """What `start_run` will send: the job's plan and, with restart-on-replace, its record."""

    identity: str
    group: str
    plan: JobPlan
    record: dict[str, Any] | None
    """What the restart handler reads (None: no restart-on-replace)."""

    @property
    def master_addr(self) -> str:
        return self.plan.ranks[0].environment["MASTER_ADDR"]

    @property
    def record_parameter(self) -> str:
        """The SSM parameter that holds (or would hold) the job's restart record."""
        from gpucluster.fleet.jobnames import job_parameter_name

        return job_parameter_name(self.identity, self.plan.detach or "")


def planned_nodes(spec: StackSpec, group: str) -> list[Node]:
    """The group as its stack file plans it, for a dry run with no deployed node to show: its desired
    nodes (at least one) of its first instance type, in service, with placeholders for what only a
    launched node has (its instance id and address). RunError for a group the stack does not have."""
    from gpucluster.ops.nodes import IN_SERVICE, SSM_ONLINE, Node
    from gpucluster.ops.run import RunError

    config = next((g for g in spec.node_groups if g.name == group), None)
    if config is None:
        raise RunError(f"--group: stack {spec.stack} has no node group {group} "
                       f"(its groups: {', '.join(g.name for g in spec.node_groups)})")
    return [Node(f"<node {i}>", group, group, config.instance_types[0], "-", f"<node {i} IP>", "-", "running",
                 IN_SERVICE, "Healthy", None, SSM_ONLINE, mig_per_gpu=len(config.mig_layout or ()))
            for i in range(max(config.desired_nodes, 1))]


def plan_run(spec: StackSpec, group: str, command: str, *, clients: Clients, progress: Spinner = no_spinner,
             detach: bool = False, name: str | None = None, restart_on_replace: bool = False,
             master_port: int = 29500, workdir: str | None = None, timeout: int | None = None,
             nodes: list[Node] | None = None) -> RunPlan:
    """Find the group's nodes and plan `command` on each (RunError, NodesError: the request is wrong).

    Detached, the job is named `name` (default job-<UTC time>) and its SSM command only starts
    it; `timeout` is then the job's own limit (none when not given). `nodes` given (a dry run's
    `planned_nodes`): planned on those, AWS is not asked.
    """
    from gpucluster.ops.run import DEFAULT_TIMEOUT_SECONDS, QUERY_TIMEOUT_SECONDS, job_record, plan_job

    job_name = (name or datetime.now(UTC).strftime("job-%Y%m%d-%H%M%S")) if detach else None
    found = nodes if nodes is not None else find_nodes(spec, group, clients=clients, progress=progress)
    environment = group_environment(spec, group)
    plan = plan_job(found, command, master_port=master_port,
                    timeout_seconds=QUERY_TIMEOUT_SECONDS if detach else timeout or DEFAULT_TIMEOUT_SECONDS,
                    group_environment=environment, log_group=run_log_group_name(spec.identity),
                    workdir=workdir, detach=job_name, job_timeout_seconds=timeout if detach else None)
    config = next((g for g in spec.node_groups if g.name == group), None)
    record = None
    if restart_on_replace:
        record = job_record(plan, node_group=group, master_port=master_port, group_environment=environment,
                            launched_at=datetime.now(UTC).isoformat(),
                            instance_types=config.instance_types if config else ())
    return RunPlan(spec.identity, group, plan, record)


# ------------------------------------------------------------------------ starting


@dataclass
class RestartRecord:
    """What became of a detached job's restart record (`run --json` shows it as is)."""

    parameter: str
    stored: bool = False
    """The parameter holds this run's record."""
    ok: bool = True
    """It went as asked: stored with restart-on-replace, no older record left without."""
    message: str | None = None
    """The line to tell the user (None: nothing to say)."""


@dataclass
class RunOutcome:
    job: JobResult
    restart: RestartRecord | None = None
    """Detached jobs that started on every node: their restart record."""
    interrupted: bool = False
    """Ctrl-C while waiting: the command was cancelled on every node still running it."""


@dataclass
class Launched:
    """`run` through the launcher: the plan, and what happened (None: a dry run, nothing sent)."""

    run: RunPlan
    outcome: RunOutcome | None = None
    planned_from_stack_file: str | None = None
    """A dry run planned on `planned_nodes`: why (no node in service, or AWS could not be asked)."""


def start_run(run: RunPlan, ssm: Any, *, on_change: Callable[[NodeResult], None] | None = None,
              progress: Spinner = no_spinner) -> RunOutcome:
    """Send the job to every node and wait; a job that cannot start on all is cancelled on all.

    A detached job that started everywhere gets its restart record stored (or an older one
    dropped, without restart-on-replace). Ctrl-C while waiting cancels the command wherever it
    still runs and returns `interrupted`.
    """
    from gpucluster.ops.run import cancel, send_job, wait_job

    plan = run.plan
    with progress(f"sending the command to {len(plan.ranks)} node(s)"):
        job = send_job(ssm, plan, comment=f"gpucluster run {run.group}")
    if job.cancelled:
        return RunOutcome(job)
    try:
        # Delivery may take up to its own timeout before the execution clock starts.
        job = wait_job(ssm, job, timeout_seconds=plan.timeout_seconds + 180, on_change=on_change)
    except KeyboardInterrupt:
        for result in job.results:
            if result.command_id and not result.done:
                cancel(ssm, result)
        return RunOutcome(job, interrupted=True)
    restart = None
    if job.ok and plan.detach:
        restart = record_restart(ssm, run.record_parameter, plan.detach, run.group, run.record,
                                 progress=progress)
    return RunOutcome(job, restart)


def record_restart(ssm: Any, parameter: str, job: str, group: str, record: dict[str, Any] | None, *,
                   progress: Spinner = no_spinner) -> RestartRecord:
    """Store (or, without restart-on-replace, drop) the job's record for the restart handler.

    A job started again under the same name without the flag must not inherit an older record.
    """
    from gpucluster.fleet.jobrecords import encode_record

    if record is None:
        outcome = RestartRecord(parameter)
        try:
            with progress(f"removing an older restart record {parameter}"):
                drop_restart_record(ssm, parameter)
        except AWS_ERRORS as exc:
            outcome.message = (f"run: warning: could not remove an older restart record {parameter} "
                               f"({error_code(exc) or type(exc).__name__}); `gpucluster cancel` removes it")
        return outcome
    try:
        with progress(f"storing the restart record {parameter}"):
            ssm.put_parameter(Name=parameter, Value=encode_record(record), Type="String", Overwrite=True,
                              Description=f"gpucluster run --restart-on-replace: job {job} of {group}"[:1024])
    except AWS_ERRORS as exc:
        return RestartRecord(parameter, ok=False, message=(
            f"run: the job runs, but restart-on-replace is off: its record {parameter} was not stored "
            f"({describe(exc)})"))
    return RestartRecord(parameter, stored=True, message=(
        f"restart-on-replace: when a replacement brings {group} back to {record['nnodes']} node(s), the "
        f"job starts again on the new nodes with GPUCLUSTER_CHECKPOINT_LATEST (record {parameter})"))


def drop_restart_record(ssm: Any, parameter: str) -> bool:
    """Delete a job's restart record; False when there was none."""
    try:
        ssm.delete_parameter(Name=parameter)
    except AWS_ERRORS as exc:
        if error_code(exc) == "ParameterNotFound":
            return False
        raise
    return True
