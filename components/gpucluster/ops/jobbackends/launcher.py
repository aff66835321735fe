"""The launcher's job backend (`scheduler: {type: none}`): SSM Run Command and a systemd unit per node.

A run goes to every in-service node of a group with torchrun's rank environment
(`ops.launch`); a detached job is a `gpucluster-job` unit, listed, read, followed (CloudWatch
Logs) and cancelled on each node (`ops.jobs`). There is no scheduler and so no login node, and a
run takes the whole group (`--nodes` is Slurm's). Outcomes are the flows' own: `ops.launch.Launched`,
`ops.jobs.JobListing`, `NodeAnswers`, `FollowSession`, `Cancelled`, and a list of `ops.nodes.Node`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from gpucluster.ops import Clients, Spinner, no_spinner
from gpucluster.ops.jobbackends import NodeLine, RunRequest

if TYPE_CHECKING:
    from gpucluster.ops.jobs import Cancelled, FollowSession, JobListing, NodeAnswers
    from gpucluster.ops.launch import Launched
    from gpucluster.ops.nodes import Node
    from gpucluster.ops.slurmjobs import LoginNode
    from gpucluster.spec import StackSpec

REFUSED = {
    "nodes": "--nodes: only on a Slurm stack (the launcher runs on every in-service node of the group)",
    "login": "stack {stack} has no Slurm login node (scheduler type none): open a shell on a node with "
             "`aws ssm start-session --target <instance id>` (see `gpucluster nodes`)",
}
"""What the launcher cannot do, and what to do instead."""


class LauncherJobs:
    """Jobs on a `type: none` stack, through SSM on its nodes."""

    def __init__(self, spec: StackSpec, clients: Clients) -> None:
        self.spec, self.clients = spec, clients

    def refusal(self, what: str) -> str | None:
        reason = REFUSED.get(what)
        return None if reason is None else reason.format(stack=self.spec.stack)

    def job_id(self, job: str, *, group: str | None, node: str | None = None) -> str:
        from gpucluster.ops.run import check_job_name

        return check_job_name(job)

    def run(self, request: RunRequest, *, progress: Spinner = no_spinner,
            on_start: Callable[[Any], None] = lambda _: None,
            on_change: Callable[..., None] = lambda *_: None) -> Launched:
        from gpucluster.ops.launch import Launched, plan_run, start_run
        from gpucluster.ops.run import RunError

        if request.nodes is not None:
            raise RunError(REFUSED["nodes"])
        plan = partial(plan_run, self.spec, request.group, request.command, clients=self.clients,
                       progress=progress, detach=request.detach, name=request.name,
                       restart_on_replace=request.restart_on_replace, master_port=request.master_port,
                       workdir=request.workdir, timeout=request.timeout)
        if request.dry_run:
            return self.dry_run(plan, request.group, progress)
        planned = Launched(plan())
        on_start(planned)
        return replace(planned, outcome=start_run(planned.run, self.clients("ssm"), progress=progress,
                                                  on_change=partial(on_change, planned.run.plan)))

    def dry_run(self, plan: Callable[..., Any], group: str, progress: Spinner) -> Launched:
        """The plan on the group's deployed nodes when AWS shows some in service; else, like Slurm's
        dry run, on the stack file's nodes (`planned_nodes`), offline: no credentials, no network
        or nothing deployed yet still show each rank's script."""
        from gpucluster.ops.awserrors import AWS_ERRORS, local_cause
        from gpucluster.ops.launch import Launched, find_nodes, planned_nodes
        from gpucluster.ops.nodes import NodesError

        found = []
        try:
            found = [n for n in find_nodes(self.spec, group, clients=self.clients, progress=progress)
                     if n.in_service]
            why = None if found else f"no node of {group} in service"
        except NodesError:  # no such group deployed (planned_nodes says whether the stack file has it)
            why = f"{group} is not deployed"
        except AWS_ERRORS as err:
            why = local_cause(err)
            if why is None:  # AWS answered with an error: that is the answer
                raise
        if why is None:
            return Launched(plan(nodes=found))
        return Launched(plan(nodes=planned_nodes(self.spec, group)), planned_from_stack_file=why)

    def jobs(self, group: str | None, *, progress: Spinner = no_spinner) -> JobListing:
        from gpucluster.ops.jobs import list_jobs

        return list_jobs(self.spec, group, clients=self.clients, progress=progress)

    def logs(self, job: str, *, group: str | None, node: str | None, lines: int,
             progress: Spinner = no_spinner) -> NodeAnswers:
        from gpucluster.ops.jobs import job_logs

        return job_logs(self.spec, job, group, lines=lines, clients=self.clients, node=node,
                        progress=progress)

    def follow(self, job: str, *, group: str | None, node: str | None, on_output: Callable[[Any], None],
               on_start: Callable[[Any], None] = lambda _: None,
               progress: Spinner = no_spinner) -> FollowSession:
        """Which nodes run the job (`gpucluster-job status`), then their streams as `NodeLine`s; a
        session without a follower: no node that answered runs it (nothing followed)."""
        from gpucluster.ops.joblogs import LogLine
        from gpucluster.ops.jobs import follow_job, prepare_follow

        session = prepare_follow(self.spec, job, group, clients=self.clients, node=node, progress=progress)
        if session.follower is None:
            return session
        streams, several = session.streams, len(session.streams) > 1

        def tagged(line: LogLine) -> None:
            on_output(NodeLine(streams[line.stream], line.timestamp, line.message, several))

        on_start(session)
        follow_job(session, tagged, clients=self.clients)
        return session

    def cancel_question(self, job: str, *, group: str | None) -> str:
        return f"Stop job {job} on every node of {group or 'the stack'}?"

    def cancel(self, job: str, *, group: str | None, progress: Spinner = no_spinner,
               on_record_removed: Callable[[], None] = lambda: None) -> Cancelled:
        from gpucluster.ops.jobs import cancel_job

        return cancel_job(self.spec, job, group, clients=self.clients, progress=progress,
                          on_record_removed=on_record_removed)

    def nodes(self, group: str | None, *, progress: Spinner = no_spinner) -> list[Node]:
        """The group's nodes in rank order, each with its metrics verdict when the stack writes to
        Prometheus."""
        from gpucluster.ops.launch import find_nodes

        found = find_nodes(self.spec, group, clients=self.clients, progress=progress)
        if not found or not self.spec.observability.prometheus.active:
            return found
        import boto3

        from gpucluster.ops.metrics import metrics_status

        with progress("asking the Prometheus workspace which nodes write"):
            session = boto3.session.Session(region_name=self.spec.region)
            status = metrics_status(self.spec, [n.instance_id for n in found], amp=self.clients("amp"),
                                    credentials=session.get_credentials())
        return [replace(n, metrics=status[n.instance_id]) for n in found]

    def login_target(self, *, progress: Spinner = no_spinner) -> LoginNode:
        from gpucluster.ops.run import RunError

        raise RunError(REFUSED["login"].format(stack=self.spec.stack))


def backend(spec: StackSpec, clients: Clients) -> LauncherJobs:
    return LauncherJobs(spec, clients)
