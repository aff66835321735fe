"""Run one command on every in-service node of a node group, as one multi-node job.

These are the SSM pieces of `gpucluster run` (the flow is `ops.launch`, detached jobs
`ops.jobs`). Each node gets its own SSM Run Command
(`AWS-RunShellScript`: no SSH, no inbound port) with the environment that
torchrun, DeepSpeed and MPI launchers read: MASTER_ADDR (rank 0's private IP),
MASTER_PORT, NNODES, NODE_RANK, NPROC_PER_NODE, WORLD_SIZE, plus the group's
EFA/NCCL settings. Ranks follow `gpucluster.ops.nodes.ranked` (launch time,
then instance id). The full output goes to CloudWatch Logs; `run` waits,
reports each node's status as it changes, and returns every node's exit status
and the tail of its output. A job that cannot start on every node is cancelled
on all of them: a partial launch would only hang at the rendezvous.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucluster import catalog
from gpucluster.fleet.awsapi import AWS_ERRORS
from gpucluster.fleet.jobrecords import RECORD_VERSION, encode_record, rank_environments, start_lines
from gpucluster.fleet.nodepaths import JOB_TOOL
from gpucluster.fleet.runcommand import (
    CANCEL_FAILED,
    FINAL_STATUSES,
    NOT_SENT,
    RETRY_SECONDS,
    TERMINAL_STATUSES,
    Deadline,
    cancel_command,
    describe,
    send_command,
    wait,
)
from gpucluster.ops import OpsError
from gpucluster.ops.nodes import Node

DEFAULT_MASTER_PORT = 29500  # torchrun's default (torch.distributed.run --master-port)
DEFAULT_TIMEOUT_SECONDS = 3600
# AWS-RunShellScript executionTimeout: 1..172800 seconds (document parameter).
MAX_TIMEOUT_SECONDS = 172800
# SendCommand TimeoutSeconds (delivery): at least 30 seconds (API reference).
DELIVERY_TIMEOUT_SECONDS = 120
# GetCommandInvocation returns the first 24,000 characters of stdout and the first 8,000 of
# stderr (API reference, StandardOutputContent / StandardErrorContent); the rest is only in
# CloudWatch Logs, whose streams SSM names <command id>/<instance id>/<plugin>/stdout|stderr.
STDOUT_LIMIT, STDERR_LIMIT = 24000, 8000
TAIL_LINES = 20


class RunError(OpsError):
    """The job cannot be prepared (no nodes in service, a node without an address): one line."""


@dataclass(frozen=True)
class RankedNode:
    """One node of the job: its rank and the environment its command runs with."""

    rank: int
    node: Node
    environment: dict[str, str]


@dataclass(frozen=True)
class JobPlan:
    """What `run` sends: one command per node, each with its own environment."""

    command: str
    ranks: list[RankedNode]
    timeout_seconds: int
    log_group: str
    workdir: str | None = None
    detach: str | None = None
    """A job name: start the command as a systemd unit on each node (gpucluster-job) and return."""
    job_timeout_seconds: int | None = None
    """Detached jobs: stop the unit after this long (none: it runs until it ends or is cancelled)."""

    def script(self, rank: RankedNode) -> list[str]:
        """The AWS-RunShellScript `commands` of one node: exports, then the command under bash.

        The document runs its lines with /bin/sh; the command itself runs under bash
        (`exec`, so its exit status is the node's), as `ssh host CMD` would. A detached
        job hands the command and the exported environment to gpucluster-job instead.
        """
        if self.detach:
            return start_lines(rank.environment, self.detach, self.workdir, self.command,
                               self.job_timeout_seconds)
        lines = [f"export {k}={shlex.quote(v)}" for k, v in rank.environment.items()]
        if self.workdir:
            lines.append(f"cd {shlex.quote(self.workdir)}")
        lines.append(f"exec bash -c {shlex.quote(self.command)}")
        return lines


def plan_job(nodes: Sequence[Node], command: str, *, timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
             master_port: int = DEFAULT_MASTER_PORT, group_environment: Mapping[str, str] | None = None,
             log_group: str, workdir: str | None = None, detach: str | None = None,
             job_timeout_seconds: int | None = None) -> JobPlan:
    """Ranks and environments for `command` on the in-service nodes (in the order given).

    NPROC_PER_NODE is each node's GPU count (the catalog's), or its MIG devices in a MIG group
    (one process a device: `gpucluster-mig exec` gives each local rank its own); WORLD_SIZE their sum.
    """
    if not command.strip():
        raise RunError("no command given (put it after --)")
    if detach is not None:
        check_job_name(detach)
    if not 1 <= timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise RunError(f"--timeout: must be 1..{MAX_TIMEOUT_SECONDS} seconds (SSM's limit), "
                       f"got {timeout_seconds}")
    if not 1 <= master_port <= 65535:
        raise RunError(f"--master-port: must be 1..65535, got {master_port}")
    ready = [n for n in nodes if n.in_service]
    if not ready:
        raise RunError("no node in service (InService and running) to run on; "
                       "see `gpucluster nodes` and `gpucluster start`")
    missing = [n.instance_id for n in ready if not n.private_ip]
    if missing:
        raise RunError(f"no private IP for {', '.join(missing)}")
    unreachable = [f"{n.instance_id} ({n.ssm})" for n in ready if n.unreachable]
    if unreachable:
        raise RunError(f"SSM cannot reach {', '.join(unreachable)}: a job needs every node; wait for "
                       "the agent to come online, or replace the node")
    environments = rank_environments([str(n.private_ip) for n in ready], [n.slots for n in ready],
                                     master_port=master_port, group_environment=group_environment)
    ranks = [RankedNode(rank, node, env)
             for rank, (node, env) in enumerate(zip(ready, environments, strict=True))]
    return JobPlan(command, ranks, timeout_seconds, log_group, workdir, detach, job_timeout_seconds)


# ------------------------------------------------------------------- detached jobs

JOB_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
QUERY_TIMEOUT_SECONDS = 120


def check_job_name(name: str) -> str:
    """Job names become unit names (gpucluster-job-<name>): 1-40 characters of a-z, 0-9, '-'."""
    if not JOB_NAME.fullmatch(name):
        raise RunError(f"job names are 1-40 characters of a-z, 0-9 and '-' (not starting with '-'), "
                       f"got {name!r}")
    return name


def plan_on_nodes(nodes: Sequence[Node], command: str, *, log_group: str) -> JobPlan:
    """The same short command on every in-service node (no rank environment): jobs, logs, cancel."""
    ready = [n for n in nodes if n.in_service]
    if not ready:
        raise RunError("no node in service; see `gpucluster nodes`")
    return JobPlan(command, [RankedNode(rank, n, {}) for rank, n in enumerate(ready)],
                   QUERY_TIMEOUT_SECONDS, log_group)


def job_record(plan: JobPlan, *, node_group: str, master_port: int, group_environment: Mapping[str, str],
               launched_at: str, instance_types: Sequence[str] = ()) -> dict[str, Any]:
    """What `--restart-on-replace` stores (lambdas.job_restart reads it): the job and the node set.

    `gpus` maps every instance type the group may launch (`instance_types`, and the nodes' own) to
    its GPU count, so a replacement of another type of the group gets its NPROC_PER_NODE right.

    RunError when the group spans several Auto Scaling groups (the restart handler watches one) or
    when the record would not fit a Standard SSM parameter.
    """
    if not plan.detach:
        raise RunError("--restart-on-replace restarts detached jobs: add --detach")
    asgs = sorted({r.node.asg for r in plan.ranks})
    if len(asgs) != 1:
        raise RunError(f"--restart-on-replace: the nodes are in {len(asgs)} Auto Scaling groups "
                       f"({', '.join(asgs)}); run the job in one")
    mig = plan.ranks[0].node.mig_per_gpu or 1
    record = {"version": RECORD_VERSION, "job": plan.detach, "node_group": node_group, "asg": asgs[0],
              "command": plan.command, "workdir": plan.workdir, "master_port": master_port,
              "job_timeout_seconds": plan.job_timeout_seconds, "environment": dict(group_environment),
              # processes per node by type: its GPUs, or its MIG devices in a MIG group
              "gpus": {**{t: max(1, c.gpus) * mig for t in instance_types if (c := catalog.get(t))},
                       **{r.node.instance_type: max(1, r.node.slots) for r in plan.ranks}},
              "nodes": [r.node.instance_id for r in plan.ranks], "nnodes": len(plan.ranks),
              "launched_at": launched_at, "restarts": 0}
    try:
        encode_record(record)
    except ValueError as err:
        raise RunError(f"--restart-on-replace: {err}") from None
    return record


@dataclass(frozen=True)
class JobState:
    """One detached job on one node, as `gpucluster-job status` prints it."""

    name: str
    state: str
    """systemd's SubState: running, exited (done, exit 0), failed, ..."""
    exit_status: int | None
    started: str


def parse_job_states(stdout: str) -> list[JobState]:
    """`gpucluster-job status` lines: NAME STATE EXIT STARTED (started with '_' for spaces)."""
    states = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) < 3 or not JOB_NAME.fullmatch(parts[0]):
            continue
        code = int(parts[2]) if parts[2].isdigit() else None
        started = parts[3].replace("_", " ") if len(parts) > 3 else ""
        states.append(JobState(parts[0], parts[1], code, started))
    return states


# ------------------------------------------------------------------------ running


@dataclass
class NodeResult:
    """One node's command: where it stands and what it printed (as far as SSM returns it)."""

    rank: int
    instance_id: str
    command_id: str | None = None
    status: str = "Pending"
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    """Why the command was not sent, or why we stopped waiting."""

    @property
    def ok(self) -> bool:
        return self.status == "Success" and self.exit_code == 0

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES

    def tail(self, lines: int = TAIL_LINES) -> list[str]:
        """The last lines of what SSM returned (stderr after stdout)."""
        text = self.stdout.rstrip("\n")
        if self.stderr.strip():
            text = (text + "\n" if text else "") + self.stderr.rstrip("\n")
        return text.splitlines()[-lines:] if text else []

    @property
    def truncated(self) -> bool:
        """SSM cut the output: what `tail` shows is not the end (CloudWatch Logs has all of it)."""
        return len(self.stdout) >= STDOUT_LIMIT or len(self.stderr) >= STDERR_LIMIT

    def log_streams(self) -> str:
        """Where the full output is: the CloudWatch Logs stream prefix of this invocation."""
        return f"{self.command_id}/{self.instance_id}/"


@dataclass
class JobResult:
    results: list[NodeResult] = field(default_factory=list)
    cancelled: bool = False
    """The launch failed on a node, so every sent command was cancelled."""

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def failed(self) -> list[NodeResult]:
        return [r for r in self.results if not r.ok]


Progress = Callable[[NodeResult], None]


def send_job(ssm: Any, plan: JobPlan, *, comment: str = "gpucluster run") -> JobResult:
    """Send one command per node; if any send fails, cancel those already sent (nothing half-runs).

    Each send follows the runner's policy (`gpucluster.fleet.runcommand`): a refusal fails it at
    once, throttling is retried for up to RETRY_SECONDS, a send that timed out is never sent twice.
    """
    job = JobResult([NodeResult(r.rank, r.node.instance_id) for r in plan.ranks])
    for rank, result in zip(plan.ranks, job.results, strict=True):
        try:
            result.command_id = send_command(
                ssm, [rank.node.instance_id], plan.script(rank), comment=f"{comment} rank {rank.rank}",
                delivery_timeout=DELIVERY_TIMEOUT_SECONDS, execution_timeout=plan.timeout_seconds,
                log_group=plan.log_group, deadline=Deadline.after(RETRY_SECONDS))
        except AWS_ERRORS as exc:
            result.status, result.error = NOT_SENT, describe(exc)
            break
    if any(r.status == NOT_SENT for r in job.results):
        job.cancelled = True
        for result in job.results:
            if result.command_id:
                cancel(ssm, result)
            elif result.status != NOT_SENT:
                result.status, result.error = NOT_SENT, "not sent: the launch failed on another node"
        if plan.detach:
            stop_started(ssm, plan, job)
    return job


def cancel(ssm: Any, result: NodeResult) -> None:
    """Cancel one node's command; a cancel AWS refuses is reported as such (CancelFailed), not as done.

    A command that finished meanwhile keeps its final status.
    """
    try:
        cancel_command(ssm, str(result.command_id), [result.instance_id], Deadline.after(RETRY_SECONDS))
    except AWS_ERRORS as exc:
        if result.status not in TERMINAL_STATUSES:
            result.status = CANCEL_FAILED
        result.error = f"cancel failed: {describe(exc)}"
        return
    result.status = "Cancelled" if result.status not in TERMINAL_STATUSES else result.status


# How long `run` waits for the job's own stop to report on each node before saying it is unconfirmed.
STOP_CONFIRM_SECONDS = 60.0


def stop_started(ssm: Any, plan: JobPlan, job: JobResult) -> list[int]:
    """Stop a detached job's unit on every node its command reached; the ranks whose stop is confirmed.

    CancelCommand cannot stop a systemd unit the command already started, so each node that got
    the command is also sent the job's own stop (`gpucluster-job cancel <name>`: systemctl stop of
    its unit; on a node where the unit never started it stops nothing), and its result is awaited
    (at most STOP_CONFIRM_SECONDS): only a stop that ended in Success counts as stopped. A stop AWS
    refuses, or one not confirmed in time, is written on that rank's result: it may still run there.
    """
    stops: list[tuple[NodeResult, NodeResult]] = []
    for result in job.results:
        if not result.command_id:
            continue
        try:
            command_id = send_command(
                ssm, [result.instance_id], [f"{JOB_TOOL} cancel {plan.detach}"],
                comment=f"gpucluster run: stop {plan.detach} (launch failed)",
                delivery_timeout=DELIVERY_TIMEOUT_SECONDS, deadline=Deadline.after(RETRY_SECONDS))
        except AWS_ERRORS as exc:
            note = f"job stop not sent: {describe(exc)}"
            result.error = f"{result.error}; {note}" if result.error else note
            continue
        note = f"job stop sent ({JOB_TOOL} cancel, command {command_id})"
        result.error = f"{result.error}; {note}" if result.error else note
        stops.append((result, NodeResult(result.rank, result.instance_id, command_id)))
    wait(ssm, [stop for _, stop in stops], Deadline.after(STOP_CONFIRM_SECONDS), poll_seconds=2.0)
    confirmed = []
    for result, stop in stops:
        if stop.ok:
            confirmed.append(result.rank)
            continue
        why = stop.error or f"{stop.status}{'' if stop.exit_code is None else f', exit {stop.exit_code}'}"
        result.error += f"; job stop not confirmed: {why}"
    return confirmed


def wait_job(ssm: Any, job: JobResult, *, timeout_seconds: float, on_change: Progress | None = None,
             poll_seconds: float = 10.0, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> JobResult:
    """Poll each node's invocation until every one is final, or `timeout_seconds` pass (the runner's loop).

    `on_change` is called with a node's result each time its status changes; a node whose status
    AWS refuses to tell is AccessDenied (or Unreadable) at once, not "still running".
    """
    deadline = Deadline.after(timeout_seconds, sleep=sleep, clock=clock)
    if not wait(ssm, job.results, deadline, poll_seconds=poll_seconds, on_change=on_change):
        for result in job.results:
            if not result.done:
                result.error = "still running when run stopped waiting"
    return job
