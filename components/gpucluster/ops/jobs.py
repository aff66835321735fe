"""Detached jobs (`run --detach`) on a stack's nodes: their states, their output, following, cancel.

This is `gpucluster jobs`, `logs` and `cancel` without the command line: each asks the
in-service nodes through SSM (`gpucluster-job status|logs|cancel`, node/job.sh) and returns
what every node answered; `prepare_follow` and `follow_job` stream a job's output from
CloudWatch Logs until it has ended everywhere; `cancel_job` drops the job's restart record
first, so no replacement starts it again while it stops. It prints nothing and never
decides exit codes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpucluster.noderole import run_log_group_name
from gpucluster.ops import Clients, Spinner, no_spinner
from gpucluster.ops.launch import drop_restart_record, find_nodes

if TYPE_CHECKING:
    from gpucluster.ops.joblogs import JobFollower, LogLine
    from gpucluster.ops.run import JobPlan, JobState, NodeResult
    from gpucluster.spec import StackSpec


@dataclass
class NodeAnswers:
    """A short command's answers: the plan it ran under (ranks, nodes) and each node's result."""

    plan: JobPlan
    results: list[NodeResult]

    @property
    def silent(self) -> list[NodeResult]:
        """The nodes that did not answer (or whose command failed)."""
        return [r for r in self.results if not r.ok]


def on_nodes(spec: StackSpec, group: str | None, script: str, *, clients: Clients, comment: str,
             node: str | None = None, progress: Spinner = no_spinner) -> NodeAnswers:
    """Run a short gpucluster-job command on the in-service nodes (one, given `node`) and wait.

    `node` is a rank, an instance id or a private IP; none in service matches: RunError.
    """
    from gpucluster.ops.run import RunError, plan_on_nodes, send_job, wait_job

    found = [n for n in find_nodes(spec, group, clients=clients, progress=progress) if n.in_service]
    if node is not None:
        chosen = [n for i, n in enumerate(found) if node in (str(i), n.instance_id, n.private_ip)]
        if not chosen:
            raise RunError(f"--node: no in-service node {node!r} (a rank 0..{len(found) - 1}, an "
                           "instance id or a private IP)")
        found = chosen
    plan = plan_on_nodes(found, script, log_group=run_log_group_name(spec.identity))
    ssm = clients("ssm")
    with progress(f"asking {len(plan.ranks)} node(s) through SSM"):  # one spinner for both
        job = send_job(ssm, plan, comment=comment)
        if not job.cancelled:
            job = wait_job(ssm, job, timeout_seconds=plan.timeout_seconds + 60, poll_seconds=2.0)
    return NodeAnswers(plan, job.results)


@dataclass(frozen=True)
class JobOnNode:
    """One detached job on one node, and which node."""

    job: str
    node_group: str
    instance_id: str
    private_ip: str | None
    state: str
    exit_status: int | None
    started: str | None


@dataclass
class JobListing(NodeAnswers):
    jobs: list[JobOnNode] = field(default_factory=list)
    """Sorted by job, node group, instance."""


def list_jobs(spec: StackSpec, group: str | None, *, clients: Clients,
              progress: Spinner = no_spinner) -> JobListing:
    """Every detached job on the stack's in-service nodes (of one node group), per node."""
    from gpucluster.fleet.nodepaths import JOB_TOOL
    from gpucluster.ops.run import parse_job_states

    answers = on_nodes(spec, group, f"{JOB_TOOL} status", clients=clients, comment="gpucluster jobs",
                       progress=progress)
    found = []
    for r in answers.results:
        if not r.ok:
            continue
        node = answers.plan.ranks[r.rank].node
        found += [JobOnNode(state.name, node.node_group, r.instance_id, node.private_ip, state.state,
                            state.exit_status, state.started or None) for state in parse_job_states(r.stdout)]
    found.sort(key=lambda j: (j.job, j.node_group, j.instance_id))
    return JobListing(answers.plan, answers.results, found)


def job_logs(spec: StackSpec, name: str, group: str | None, *, lines: int, clients: Clients,
             node: str | None = None, progress: Spinner = no_spinner) -> NodeAnswers:
    """The last `lines` of a detached job's output on each node (or one)."""
    from gpucluster.fleet.nodepaths import JOB_TOOL

    return on_nodes(spec, group, f"{JOB_TOOL} logs {name} {lines}", clients=clients,
                    comment="gpucluster logs", node=node, progress=progress)


@dataclass
class Cancelled(NodeAnswers):
    record_removed: bool = False
    """The job had a restart record, now deleted."""


def cancel_job(spec: StackSpec, name: str, group: str | None, *, clients: Clients,
               progress: Spinner = no_spinner,
               on_record_removed: Callable[[], None] | None = None) -> Cancelled:
    """Stop a detached job on every node; its restart record goes first (`on_record_removed` then)."""
    from gpucluster.fleet.jobnames import job_parameter_name
    from gpucluster.fleet.nodepaths import JOB_TOOL

    parameter = job_parameter_name(spec.identity, name)
    with progress(f"removing the job's restart record {parameter}"):
        removed = drop_restart_record(clients("ssm"), parameter)
    if removed and on_record_removed is not None:
        on_record_removed()
    answers = on_nodes(spec, group, f"{JOB_TOOL} cancel {name}", clients=clients, comment="gpucluster cancel",
                       progress=progress)
    return Cancelled(answers.plan, answers.results, removed)


# ------------------------------------------------------------------------ following


@dataclass
class FollowSession(NodeAnswers):
    """Which nodes run the job (their `gpucluster-job status`), and the follower of their streams."""

    found: dict[str, JobState] = field(default_factory=dict)
    """Instance id -> the job's state there (empty: no such job on the nodes that answered)."""
    streams: dict[str, str] = field(default_factory=dict)
    """Log stream -> instance id."""
    follower: JobFollower | None = None


def prepare_follow(spec: StackSpec, name: str, group: str | None, *, clients: Clients,
                   node: str | None = None, progress: Spinner = no_spinner) -> FollowSession:
    """Ask the nodes which run job `name`, and set up following their CloudWatch Logs streams.

    From a minute before the job's first start (clock skew); without a start time, the last day.
    """
    from gpucluster.fleet.nodepaths import JOB_TOOL
    from gpucluster.ops.joblogs import JobFollower, job_log_stream, parse_started
    from gpucluster.ops.run import parse_job_states

    answers = on_nodes(spec, group, f"{JOB_TOOL} status", clients=clients, comment="gpucluster logs",
                       node=node, progress=progress)
    found = {r.instance_id: state for r in answers.results if r.ok
             for state in parse_job_states(r.stdout) if state.name == name}
    session = FollowSession(answers.plan, answers.results, found)
    if not found:
        return session
    starts = [t for s in found.values() if (t := parse_started(s.started)) is not None]
    since = min(starts) if len(starts) == len(found) else datetime.now(UTC) - timedelta(days=1)
    session.streams = {job_log_stream(i, name): i for i in found}
    session.follower = JobFollower(clients("logs"), run_log_group_name(spec.identity), name, session.streams,
                                   int((since - timedelta(minutes=1)).timestamp() * 1000),
                                   {s for s, i in session.streams.items() if found[i].state == "running"})
    return session


def follow_job(session: FollowSession, on_line: Callable[[LogLine], None], *, clients: Clients) -> None:
    """Stream the job's lines to `on_line` until it has ended (or its node is gone) on every node."""
    from gpucluster.ops.joblogs import follow

    assert session.follower is not None, "no job to follow"
    follow(session.follower, on_line, running=lambda ids: running_instances(clients("ec2"), ids))


def running_instances(ec2: Any, instance_ids: Iterable[str]) -> set[str]:
    """Which of these instances EC2 still has pending or running."""
    from gpucluster.ops.nodes import describe_instances

    found = describe_instances(ec2, list(instance_ids))
    return {i for i, d in found.items() if d.get("State", {}).get("Name") in ("pending", "running")}
