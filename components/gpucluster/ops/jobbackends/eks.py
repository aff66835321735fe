"""The EKS job backend (`scheduler: {type: eks}`): JobSets through Kueue on the stack's Kubernetes API.

A run is a JobSet (`eks.jobset`, created by `ops.eksjobs.submit`) that Kueue admits when its queue has
room for all of its pods; jobs, logs and cancel are the API's JobSets, Kueue's Workloads, the leader
pod's log and a delete. The API client is made on first use (`ops.eksapi.connect`: the cluster by tag,
an EKS token from the caller's AWS credentials). There is no login node and no SSM on the nodes from
here; the launcher's commands are refused with what to use instead. Outcomes: `ops.eksjobs`'s
`Submitted`, `EksQueue`, `LeaderLog`, `EksFollowed`, `EksCancel`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpucluster.ops import Clients, Spinner, no_spinner
from gpucluster.ops.jobbackends import RunRequest

if TYPE_CHECKING:
    from gpucluster.ops.eksjobs import EksCancel, EksFollowed, EksQueue, LeaderLog, Submitted
    from gpucluster.ops.slurmjobs import LoginNode
    from gpucluster.spec import StackSpec

KUBECTL = "use kubectl (the stack's `kubeconfig_command` output sets it up)"
REFUSED = {
    "hostfile": f"hostfile: on an EKS stack pods find each other by DNS (MASTER_ADDR is the leader pod's "
                f"name); {KUBECTL}",
    "login": f"stack {{stack}} has no login node (scheduler type eks): {KUBECTL}",
    "nccl-test": "--nccl-test: the launcher's benchmark; on EKS run nccl-tests as a job (see the Kubernetes "
                 "guide)",
}
"""What an EKS stack cannot do, and what to do instead."""
FOLLOW_POLL_SECONDS = 10.0


def default_name() -> str:
    """A JobSet name when none is given: job-<UTC time> (lower case, as Kubernetes names are)."""
    return datetime.now(UTC).strftime("job-%Y%m%d-%H%M%S")


class EksJobs:
    """Jobs on an EKS stack, through its Kubernetes API as the caller's IAM identity."""

    def __init__(self, spec: StackSpec, clients: Clients,
                 connect: Callable[[], tuple[str, Any]] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec, self.clients, self.sleep = spec, clients, sleep
        self._connect = connect
        self._api: tuple[str, Any] | None = None

    def api(self, progress: Spinner) -> tuple[str, Any]:
        """(cluster name, API client), made once."""
        if self._api is None:
            if self._connect is not None:
                self._api = self._connect()
            else:
                import boto3

                from gpucluster.ops.eksapi import connect

                with progress(f"finding {self.spec.stack}'s EKS cluster in {self.spec.region}"):
                    credentials = boto3.session.Session(region_name=self.spec.region).get_credentials()
                    cluster, api = connect(self.spec.identity, self.clients, credentials)
                self._api = (cluster.name, api)
        return self._api

    def refusal(self, what: str) -> str | None:
        reason = REFUSED.get(what)
        return None if reason is None else reason.format(stack=self.spec.stack)

    def job_id(self, job: str, *, group: str | None, node: str | None = None) -> str:
        """A JobSet name names one job in the stack: no --group or --node."""
        from gpucluster.ops.eksjobs import EksJobError

        for option, value in (("--group", group), ("--node", node)):
            if value is not None:
                raise EksJobError(f"{option}: a JobSet name names one job; give no {option}")
        return job

    def run(self, request: RunRequest, *, progress: Spinner = no_spinner,
            on_start: Callable[[Any], None] = lambda _: None,
            on_change: Callable[..., None] = lambda *_: None) -> Submitted:
        """Create the JobSet; without --detach it refuses (a queued job outlives the command).
        --restart-on-replace: JobSet recreates every pod after one fails (failurePolicy.maxRestarts)."""
        from gpucluster.ops.eksjobs import EksJobError, plan_submit, submit

        if not request.detach:
            raise EksJobError("run: on an EKS stack jobs are queued by Kueue: add --detach, then "
                              "`gpucluster logs --follow`")
        sub = plan_submit(self.spec, request.group, request.command, name=request.name or default_name(),
                          nodes=request.nodes, master_port=request.master_port, workdir=request.workdir,
                          timeout=request.timeout, restart_on_replace=request.restart_on_replace)
        if request.dry_run:
            return sub
        cluster, api = self.api(progress)
        sub.cluster = cluster
        on_start(sub)
        with progress(f"creating JobSet {sub.namespace}/{sub.job_name}"):
            return submit(api, sub)

    def jobs(self, group: str | None, *, progress: Spinner = no_spinner) -> EksQueue:
        from gpucluster.ops.eksjobs import list_jobs

        cluster, api = self.api(progress)
        with progress("listing JobSets and Kueue workloads"):
            return list_jobs(api, cluster, group)

    def logs(self, job: str, *, group: str | None, node: str | None, lines: int,
             progress: Spinner = no_spinner) -> LeaderLog:
        from gpucluster.ops.eksjobs import leader_log

        cluster, api = self.api(progress)
        with progress(f"reading job {job}'s leader pod log"):
            return leader_log(api, cluster, self.job_id(job, group=group, node=node), lines)

    def follow(self, job: str, *, group: str | None, node: str | None, on_output: Callable[[Any], None],
               on_start: Callable[[Any], None] = lambda _: None,
               progress: Spinner = no_spinner) -> EksFollowed:
        """The leader pod's output as it comes (text, to `on_output`) until the pod ends."""
        from gpucluster.ops.eksjobs import follow_log

        cluster, api = self.api(progress)
        return follow_log(api, cluster, self.job_id(job, group=group, node=node), on_output,
                          wait=lambda: self.sleep(FOLLOW_POLL_SECONDS))

    def cancel_question(self, job: str, *, group: str | None) -> str:
        return f"Delete JobSet {job} (its pods are stopped)?"

    def cancel(self, job: str, *, group: str | None, progress: Spinner = no_spinner,
               on_record_removed: Callable[[], None] = lambda: None) -> EksCancel:
        from gpucluster.ops.eksjobs import cancel

        cluster, api = self.api(progress)
        with progress(f"deleting JobSet {job}"):
            return cancel(api, cluster, self.job_id(job, group=group))

    def nodes(self, group: str | None, *, progress: Spinner = no_spinner) -> Any:
        """The group's instances in rank order, as the launcher lists them (the Auto Scaling groups are the
        same); the Kubernetes view is `kubectl get nodes -l gpucluster.io/group=<group>`."""
        from gpucluster.ops.launch import find_nodes

        return find_nodes(self.spec, group, clients=self.clients, progress=progress)

    def login_target(self, *, progress: Spinner = no_spinner) -> LoginNode:
        from gpucluster.ops.run import RunError

        raise RunError(REFUSED["login"].format(stack=self.spec.stack))


def backend(spec: StackSpec, clients: Clients) -> EksJobs:
    return EksJobs(spec, clients)
