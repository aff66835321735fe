"""What a user does with jobs, whatever runs them: the `JobBackend` interface, and the one place it is chosen.

A stack's scheduler decides how work reaches its nodes: the launcher (`scheduler: {type: none}`,
SSM Run Command and a systemd unit per node, `jobbackends.launcher`), Slurm (AWS PCS, through
the login node, `jobbackends.slurm`) or Kubernetes (EKS, JobSets through Kueue, `jobbackends.eks`).
Every job command asks `job_backend(spec, clients)` for the
stack's backend and calls one of its methods, which returns one outcome the CLI renders as text
or JSON: the CLI never branches on the scheduler. A new backend is one module here exposing
`backend(spec, clients)` plus one line in `BACKENDS`; it may return the outcomes below (or the
launcher's and Slurm's own ones) and the commands render it unchanged.

Outcomes shared by every scheduler that queues jobs by id (Slurm, and the next one) live here:
`Batch` (a submission, or its dry run), `Queue` (a listing), `SchedulerNodes`; `NodeLine` is a
line of a job's output tagged with its node, as the launcher follows one stream per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol

from gpucluster.ops import Clients, Spinner, no_spinner

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpucluster.ops.slurmjobs import LoginNode, NodeView
    from gpucluster.slurm.queue import SlurmJob
    from gpucluster.spec import StackSpec

BACKENDS: dict[str, str] = {
    "none": "gpucluster.ops.jobbackends.launcher",
    "slurm": "gpucluster.ops.jobbackends.slurm",
    "eks": "gpucluster.ops.jobbackends.eks",
}
"""Scheduler type (`scheduler.type` in the stack file) -> the module whose `backend(spec, clients)`
runs its jobs: the one place a job backend is chosen."""


def job_backend(spec: StackSpec, clients: Clients) -> JobBackend:
    """The job backend of the stack's scheduler, acting with `clients` (the stack's region)."""
    factory: Callable[[StackSpec, Clients], JobBackend] = import_module(BACKENDS[spec.scheduler.type]).backend
    return factory(spec, clients)


@dataclass(frozen=True)
class RunRequest:
    """`gpucluster run` as asked (without --nccl-test, which is the launcher's own benchmark)."""

    group: str
    command: str
    detach: bool = False
    dry_run: bool = False
    name: str | None = None
    nodes: int | None = None
    restart_on_replace: bool = False
    master_port: int = 29500
    workdir: str | None = None
    timeout: int | None = None


class JobBackend(Protocol):
    """How jobs reach a stack's nodes. Methods raise `RunError` (or a subclass) for a request the
    stack cannot answer (one line for the user) and let AWS errors through; none prints."""

    def refusal(self, what: str) -> str | None:
        """Why `what` (a command: run, hostfile, scale, login; an option: nccl-test, nodes) makes
        no sense on this backend, as the line to print; None when it does."""
        ...

    def job_id(self, job: str, *, group: str | None, node: str | None = None) -> str:
        """`job` (logs, cancel) as this backend names a job, checked against the options given."""
        ...

    def run(self, request: RunRequest, *, progress: Spinner = no_spinner,
            on_start: Callable[[Any], None] = lambda _: None,
            on_change: Callable[..., None] = lambda *_: None) -> Any:
        """Plan the run and (unless a dry run) start it: one outcome. `on_start` gets the outcome so
        far just before anything is sent; `on_change` each node's status as it changes (the launcher:
        its `JobPlan` and the node's `NodeResult`)."""
        ...

    def jobs(self, group: str | None, *, progress: Spinner = no_spinner) -> Any:
        """The stack's jobs (of one node group)."""
        ...

    def logs(self, job: str, *, group: str | None, node: str | None, lines: int,
             progress: Spinner = no_spinner) -> Any:
        """The job's latest output (`lines` per node where it runs on several)."""
        ...

    def follow(self, job: str, *, group: str | None, node: str | None, on_output: Callable[[Any], None],
               on_start: Callable[[Any], None] = lambda _: None, progress: Spinner = no_spinner) -> Any:
        """Stream the job's output to `on_output` until it has ended; how it ended. `on_start` gets
        what will be followed, before the first line."""
        ...

    def cancel_question(self, job: str, *, group: str | None) -> str:
        """What to ask the user before `cancel`."""
        ...

    def cancel(self, job: str, *, group: str | None, progress: Spinner = no_spinner,
               on_record_removed: Callable[[], None] = lambda: None) -> Any:
        """Stop the job; what became of it."""
        ...

    def nodes(self, group: str | None, *, progress: Spinner = no_spinner) -> Any:
        """The stack's nodes (of one node group), as this backend sees them."""
        ...

    def login_target(self, *, progress: Spinner = no_spinner) -> LoginNode:
        """The node a user opens a shell on to work with the scheduler (`login`)."""
        ...


# --------------------------------------------------------------- shared outcomes


@dataclass
class Batch:
    """`run` on a scheduler that queues jobs: the job as submitted (or, `sent` False, as it would be)."""

    scheduler_name: str
    """What `--json` calls the scheduler (`slurm`)."""
    group: str
    """The node group, which is the scheduler's partition."""
    job_name: str
    nodes: int
    run_as_uid: int
    batch_script: str
    submit_script: str
    """What runs on the submitting node to submit `batch_script`."""
    sent: bool = False
    job_id: str | None = None
    submitted_on: str | None = None
    """The instance it was submitted on."""
    refused: str | None = None
    """Sent, but the scheduler refused it: its error line."""


@dataclass
class Queue:
    """`jobs` on a scheduler that queues jobs: its jobs, pending, running and finished."""

    scheduler_name: str
    group: str | None
    accounting: bool
    """The scheduler keeps finished jobs (without it they show only while the controller keeps them)."""
    jobs: list[SlurmJob]


@dataclass
class SchedulerNodes:
    """`nodes` on a scheduler that queues jobs: its nodes beside the instances behind them."""

    scheduler_name: str
    group: str | None
    views: list[NodeView]


@dataclass(frozen=True)
class NodeLine:
    """One line of a job's output as followed on one of its nodes."""

    instance_id: str
    timestamp: int
    message: str
    several: bool
    """The job runs on more than one node (the text output then names the node on each line)."""
