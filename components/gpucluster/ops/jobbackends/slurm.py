"""Slurm's job backend (`scheduler: {type: slurm}`): AWS PCS, every request through the login node.

A run is a batch job (`sbatch` on the login node, `ops.slurmjobs.submit`); jobs, output,
cancel and nodes are squeue/sacct, the job's output file on its batch host, scancel and sinfo,
each through SSM on the stack's login node, which this backend finds (by its tags) itself.
Launcher-only commands and options are refused with what to do instead
(`ops.slurmjobs.refusal`). Outcomes: `Batch`, `Queue`, `SchedulerNodes` and the flows' own
`JobOutput`, `Followed`, `CancelOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucluster.ops import Clients, Spinner, no_spinner
from gpucluster.ops.jobbackends import Batch, Queue, RunRequest, SchedulerNodes

if TYPE_CHECKING:
    from gpucluster.ops.slurmjobs import CancelOutcome, Followed, JobOutput, LoginNode
    from gpucluster.spec import StackSpec

SCHEDULER = "slurm"


class SlurmJobs:
    """Jobs on a Slurm stack: what its login node's Slurm commands say and do."""

    def __init__(self, spec: StackSpec, clients: Clients) -> None:
        self.spec, self.clients = spec, clients

    def refusal(self, what: str) -> str | None:
        from gpucluster.ops.slurmjobs import refusal

        return refusal(self.spec, what)

    def job_id(self, job: str, *, group: str | None, node: str | None = None) -> str:
        """A Slurm job id as given (digits); a job id names one job, so no --group or --node."""
        from gpucluster.ops.slurmjobs import SlurmError
        from gpucluster.slurm.queue import JOB_ID

        if not JOB_ID.fullmatch(job):
            raise SlurmError(f"job: on a Slurm stack, a Slurm job id (digits; see `gpucluster jobs`), "
                             f"got {job!r}")
        for option, value in (("--group", group), ("--node", node)):
            if value is not None:
                raise SlurmError(f"{option}: a Slurm job id names one job; give no {option}")
        return job

    def run(self, request: RunRequest, *, progress: Spinner = no_spinner,
            on_start: Callable[[Any], None] = lambda _: None,
            on_change: Callable[..., None] = lambda *_: None) -> Batch:
        """sbatch on the login node, the job id back. Without --detach it refuses: a batch job
        outlives the command, and following its output is `logs --follow`'s job."""
        from gpucluster.ops.slurmjobs import SlurmError, plan_submit, submit
        from gpucluster.slurm.remote import JOB_UID

        if not request.detach:
            raise SlurmError(self.refusal("run") or "add --detach")
        sub = plan_submit(self.spec, request.group, request.command, name=request.name, nodes=request.nodes,
                          restart_on_replace=request.restart_on_replace, master_port=request.master_port,
                          workdir=request.workdir, timeout=request.timeout)
        batch = Batch(SCHEDULER, request.group, sub.job.name, sub.job.nodes, JOB_UID, sub.sbatch_script,
                      sub.script)
        if request.dry_run:
            return batch
        on_start(batch)
        done = submit(self.spec, sub, clients=self.clients, progress=progress)
        batch.sent, batch.job_id, batch.submitted_on = True, done.job_id, done.login.instance_id
        if done.job_id is None:
            batch.refused = done.result.error_line()
        return batch

    def jobs(self, group: str | None, *, progress: Spinner = no_spinner) -> Queue:
        from gpucluster.ops.slurmjobs import list_jobs

        found = list_jobs(self.spec, group, clients=self.clients, progress=progress)
        return Queue(SCHEDULER, group, self.spec.scheduler.accounting, found)

    def logs(self, job: str, *, group: str | None, node: str | None, lines: int,
             progress: Spinner = no_spinner) -> JobOutput:
        from gpucluster.ops.slurmjobs import job_output

        return job_output(self.spec, self.job_id(job, group=group, node=node), lines=lines,
                          clients=self.clients, progress=progress)

    def follow(self, job: str, *, group: str | None, node: str | None, on_output: Callable[[Any], None],
               on_start: Callable[[Any], None] = lambda _: None, progress: Spinner = no_spinner) -> Followed:
        """The job's output file as it grows (text as read, to `on_output`) until the job has ended."""
        from gpucluster.ops.slurmjobs import follow_output

        return follow_output(self.spec, self.job_id(job, group=group, node=node), on_output,
                             clients=self.clients, progress=progress)

    def cancel_question(self, job: str, *, group: str | None) -> str:
        return f"Cancel Slurm job {job}?"

    def cancel(self, job: str, *, group: str | None, progress: Spinner = no_spinner,
               on_record_removed: Callable[[], None] = lambda: None) -> CancelOutcome:
        from gpucluster.ops.slurmjobs import cancel

        return cancel(self.spec, self.job_id(job, group=group), clients=self.clients, progress=progress)

    def nodes(self, group: str | None, *, progress: Spinner = no_spinner) -> SchedulerNodes:
        from gpucluster.ops.slurmjobs import slurm_nodes

        return SchedulerNodes(SCHEDULER, group, slurm_nodes(self.spec, group=group, clients=self.clients,
                                                            progress=progress))

    def login_target(self, *, progress: Spinner = no_spinner) -> LoginNode:
        from gpucluster.ops.slurmjobs import find_login_node

        return find_login_node(self.spec, clients=self.clients, progress=progress)


def backend(spec: StackSpec, clients: Clients) -> SlurmJobs:
    return SlurmJobs(spec, clients)
