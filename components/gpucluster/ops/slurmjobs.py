"""Day-2 operations on a Slurm stack: jobs through the scheduler on its login node, through SSM.

On a stack with `scheduler: {type: slurm}` work reaches the nodes through Slurm, one way per
stack: `submit` sends `slurm.batch.sbatch_script` to the group's partition (`sbatch`), `list_jobs`
reads `squeue` (and `sacct` with accounting, else `scontrol show job`), `job_output` reads the
job's output file on its batch host, `cancel` runs `scancel`, `slurm_nodes` puts `sinfo` beside
EC2, `usage` reads `sacct` for `spend --by user|job`. Every script runs on the stack's login node
(the running instance tagged STACK_TAG = identity and NODE_GROUP_TAG = login, as `aws.pcs` tags the
login group's launch template) through SSM Run Command (AWS-RunShellScript, as root), carried base64-encoded
(`slurm.remote.remote_command`), so nothing typed is interpolated into a shell line; jobs are
submitted as the AMI's default user (`slurm.remote.JOB_UID`). `refusal` is the one place that
says which launcher-only commands make no sense on a Slurm stack.

It returns result objects and prints nothing; AWS errors are raised for the caller to report;
a request the stack cannot answer (no login node, a bad job id) is a `SlurmError` (one line).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpucluster.fleet.runcommand import Deadline, Invocation, send_command, wait
from gpucluster.fleet.tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP, STACK_TAG
from gpucluster.ops import Clients, Spinner, no_spinner
from gpucluster.ops.run import RunError

if TYPE_CHECKING:
    from gpucluster.pricing import Rate
    from gpucluster.slurm.batch import BatchJob
    from gpucluster.slurm.queue import SlurmJob
    from gpucluster.slurm.remote import JobPlace, NodeBoot, SlurmNode
    from gpucluster.slurm.usage import UsageRow
    from gpucluster.spec import StackSpec

SSM_STDOUT_LIMIT = 24000
"""GetCommandInvocation returns the first 24,000 characters of stdout (API reference)."""
REMOTE_TIMEOUT_SECONDS = 120
"""How long a login-node command may run (AWS-RunShellScript executionTimeout)."""
POLL_SECONDS = 1.0
FOLLOW_POLL_SECONDS = 5.0
FINISHED_DAYS = 7
"""`jobs` lists finished jobs of the last week from sacct."""
# EC2 instance states a node can be in while it still is one (DescribeInstances, instance-state-name).
LIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")

REFUSED = {
    "hostfile": "Slurm allocates the hosts of each job: inside a job, `scontrol show hostnames "
                "\"$SLURM_JOB_NODELIST\"` lists them",
    "scale": "AWS PCS scales a Slurm stack's node groups from the queue between min and max: submit jobs "
             "(`gpucluster run --detach`), or change the group's sizes in the stack file",
    "nccl-test": "--nccl-test starts ranks with our launcher over SSH: submit nccl-tests as a job "
                 "instead (`gpucluster run --detach --group G -- all_reduce_perf ...`)",
    "run": "on a Slurm stack `run` submits a batch job and returns: add --detach, then follow it with "
           "`gpucluster logs STACK JOB --follow`",
}
"""Launcher-only commands and options on a Slurm stack: what to do instead."""


class SlurmError(RunError):
    """A Slurm request the stack cannot answer (no login node, a job that is not there): one line."""


def refusal(spec: StackSpec, what: str) -> str | None:
    """Why `what` (a command, or `nccl-test`) makes no sense on this stack; None when it does. Without the
    command's name: the CLI's one line (`fail_usage`) puts it first, once."""
    if not spec.scheduler.slurm or what not in REFUSED:
        return None
    return f"stack {spec.stack} runs Slurm: {REFUSED[what]}"


# ------------------------------------------------------------------- the login node


@dataclass(frozen=True)
class LoginNode:
    instance_id: str
    private_ip: str | None
    launch_time: datetime | None

    def session_command(self, region: str) -> list[str]:
        """The command that opens a shell on it (Session Manager: no SSH, no open port)."""
        return ["aws", "ssm", "start-session", "--target", self.instance_id, "--region", region]


def stack_instances(ec2: Any, identity: str, *, group: str | None = None,
                    states: tuple[str, ...] = LIVE_STATES) -> list[dict[str, Any]]:
    """The stack's instances (of one node group), every page, selected by the identity tag."""
    filters = [{"Name": f"tag:{STACK_TAG}", "Values": [identity]},
               {"Name": "instance-state-name", "Values": list(states)}]
    if group is not None:
        filters.append({"Name": f"tag:{NODE_GROUP_TAG}", "Values": [group]})
    found = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            found += reservation["Instances"]
    return found


def find_login_node(spec: StackSpec, *, clients: Clients, progress: Spinner = no_spinner) -> LoginNode:
    """The stack's running login node (the oldest, when there are several); SlurmError when none."""
    with progress(f"finding {spec.stack}'s Slurm login node in {spec.region}"):
        found = stack_instances(clients("ec2"), spec.identity, group=SLURM_LOGIN_GROUP, states=("running",))
    if not found:
        raise SlurmError(
            f"stack {spec.stack} has no running Slurm login node (an instance tagged {STACK_TAG}="
            f"{spec.identity} and {NODE_GROUP_TAG}={SLURM_LOGIN_GROUP}): deploy it with `pulumi up`, or "
            f"after a stop `gpucluster start {spec.stack}`, then retry")
    first = min(found, key=lambda i: (i.get("LaunchTime") or datetime.max.replace(tzinfo=UTC),
                                      i["InstanceId"]))
    return LoginNode(first["InstanceId"], first.get("PrivateIpAddress"), first.get("LaunchTime"))


# --------------------------------------------------------------- one remote command


@dataclass
class RemoteResult:
    """How one script ended on one instance."""

    instance_id: str
    command_id: str
    status: str
    """SSM's: Success, Failed, TimedOut, Cancelled; `NoAnswer` when we stopped waiting."""
    exit_code: int | None
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == "Success"

    def error_line(self) -> str:
        """The script's own last error line, or SSM's status."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        code = "" if self.exit_code is None or self.exit_code < 0 else f", exit {self.exit_code}"
        return f"{lines[-1].strip()} ({self.status}{code})" if lines else f"{self.status}{code}"


def run_script(ssm: Any, instance_id: str, script: str, *, comment: str,
               timeout_seconds: int = REMOTE_TIMEOUT_SECONDS, poll_seconds: float = POLL_SECONDS,
               sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> RemoteResult:
    """Run `script` under bash on one instance through SSM and wait for its end (bounded).

    The runner's policy (`gpucluster.fleet.runcommand`) within one deadline, the execution
    timeout plus a minute for delivery: a refusal (AccessDenied, InvalidInstanceId), of the send
    or of a poll, is raised as it is, at once; throttling is retried until the deadline (a send
    still refused then raises it); InvocationDoesNotExist right after the send is asked again;
    no final status by the deadline is status NoAnswer.
    """
    from gpucluster.slurm.remote import remote_command

    deadline = Deadline.after(timeout_seconds + 60, sleep=sleep, clock=clock)
    command_id = send_command(ssm, [instance_id], [remote_command(script)], comment=comment,
                              # Delivery timeout: minimum 30 s (API reference, SendCommand.TimeoutSeconds).
                              delivery_timeout=max(30, timeout_seconds), execution_timeout=timeout_seconds,
                              deadline=deadline)
    invocation = Invocation(instance_id, command_id)
    if not wait(ssm, [invocation], deadline, poll_seconds=poll_seconds):
        return RemoteResult(instance_id, command_id, "NoAnswer", None, "", "")
    if invocation.failure is not None:
        raise invocation.failure
    return RemoteResult(instance_id, command_id, invocation.status, invocation.exit_code, invocation.stdout,
                        invocation.stderr)


def run_captured(ssm: Any, instance_id: str, script: str, *, comment: str) -> RemoteResult:
    """`run_script`, with the whole of the script's output however long: SSM returns only its
    first 24,000 characters, so the output is kept in a file on the node and read a page at a time
    (`slurm.remote.captured_script`); the file goes with the last page."""
    from gpucluster.slurm.remote import RemoteError, captured_script, parse_captured, parse_tail, tail_script

    first = run_script(ssm, instance_id, captured_script(script), comment=comment)
    if not first.ok:
        return first
    try:
        page = parse_captured(first.stdout)
        text, offset = [page.text], page.read
        while offset < page.size:
            more = run_script(ssm, instance_id, tail_script(page.path, offset=offset, remove_when_read=True),
                              comment=comment)
            tail = parse_tail(checked(more, "reading the rest of the output"))
            if not tail.read:
                raise SlurmError(f"reading {page.path} on {instance_id}: no progress at byte {offset}")
            text.append(tail.text)
            offset += tail.read
    except RemoteError as err:
        raise SlurmError(str(err)) from None
    return replace(first, stdout="".join(text))


def on_login(spec: StackSpec, script: str, *, clients: Clients, comment: str,
             progress: Spinner = no_spinner, login: LoginNode | None = None,
             paged: bool = False) -> tuple[LoginNode, RemoteResult]:
    """Run `script` on the stack's login node (found, unless given); `paged`: all of a long output."""
    login = login or find_login_node(spec, clients=clients, progress=progress)
    run = run_captured if paged else run_script
    with progress(f"asking Slurm on the login node {login.instance_id}"):
        return login, run(clients("ssm"), login.instance_id, script, comment=comment)


def checked(result: RemoteResult, what: str) -> str:
    """The script's stdout, or SlurmError with its own error line."""
    if not result.ok:
        raise SlurmError(f"{what} on {result.instance_id} failed: {result.error_line()}")
    return result.stdout


# ---------------------------------------------------------------------------- submit


@dataclass(frozen=True)
class Submission:
    """What `submit` sends: the job, its batch script and the login-node script around it."""

    group: str
    job: BatchJob
    sbatch_script: str
    script: str
    """The submit script (runs the batch script through sbatch as the job user)."""


def plan_submit(spec: StackSpec, group: str, command: str, *, name: str | None = None,
                nodes: int | None = None, restart_on_replace: bool = False, master_port: int = 29500,
                workdir: str | None = None, timeout: int | None = None, uid: int | None = None) -> Submission:
    """The batch script of `command` on node group `group` (SlurmError: the request is wrong).

    Nodes default to the group's desired_nodes, or its max_nodes when that is 0 (a group PCS
    scales from zero): the whole group, as the launcher runs on every node of it.
    """
    from gpucluster.slurm.batch import BatchError, BatchJob, sbatch_script, slurm_group
    from gpucluster.slurm.remote import JOB_UID, submit_script

    config = next((g for g in spec.node_groups if g.name == group), None)
    if config is None:
        known = ", ".join(g.name for g in spec.node_groups)
        raise SlurmError(f"--group: no node group {group!r} in stack {spec.stack} (node groups: {known})")
    job = BatchJob(name=name or datetime.now(UTC).strftime("job-%Y%m%d-%H%M%S"), command=command,
                   nodes=nodes if nodes is not None else (config.desired_nodes or config.max_nodes),
                   restart_on_replace=restart_on_replace, timeout_seconds=timeout, master_port=master_port,
                   workdir=workdir)
    try:
        text = sbatch_script(job, slurm_group(config, stack=spec.identity, cluster=spec.cluster.name,
                                              region=spec.region, spot=spec.spot))
    except BatchError as err:
        raise SlurmError(str(err)) from None
    return Submission(group, job, text, submit_script(text, uid=JOB_UID if uid is None else uid))


@dataclass
class Submitted:
    login: LoginNode
    result: RemoteResult
    job_id: str | None
    """None: sbatch refused (see `result.error_line()`)."""


def submit(spec: StackSpec, submission: Submission, *, clients: Clients,
           progress: Spinner = no_spinner) -> Submitted:
    """sbatch the job on the login node; the job id, or how sbatch refused."""
    from gpucluster.slurm.remote import RemoteError, parse_submitted

    login, result = on_login(spec, submission.script, clients=clients, progress=progress,
                             comment=f"gpucluster run {submission.group}")
    job_id = None
    if result.ok:
        try:
            job_id = parse_submitted(result.stdout)
        except RemoteError as err:
            raise SlurmError(str(err)) from None
    return Submitted(login, result, job_id)


# ------------------------------------------------------------------ jobs / cancel


def list_jobs(spec: StackSpec, group: str | None, *, clients: Clients, progress: Spinner = no_spinner,
              now: datetime | None = None) -> list[SlurmJob]:
    """Pending and running jobs (squeue) and finished ones (sacct's last week, or what the
    controller still holds without accounting), of one partition when `group` is given."""
    from gpucluster.slurm.queue import QueueError
    from gpucluster.slurm.remote import RemoteError, jobs_script, parse_jobs
    from gpucluster.slurm.usage import sacct_time

    if group is not None and group not in {g.name for g in spec.node_groups}:
        raise SlurmError(f"--group: no node group {group!r} in stack {spec.stack}")
    since = sacct_time((now or datetime.now(UTC)) - timedelta(days=FINISHED_DAYS))
    script = jobs_script(partition=group, accounting=spec.scheduler.accounting, since=since)
    _, result = on_login(spec, script, clients=clients, progress=progress, comment="gpucluster jobs",
                         paged=True)
    try:
        return parse_jobs(checked(result, "squeue"), partition=group)
    except (QueueError, RemoteError) as err:
        raise SlurmError(str(err)) from None


@dataclass
class CancelOutcome:
    job_id: str
    cancelled: bool
    """scancel took it: the job was pending or running and is ending."""
    message: str
    """Why not, in a line (unknown job, already ended, scancel's own error)."""
    state: str | None
    """The job's state afterwards (None: the controller does not know it)."""


def cancel(spec: StackSpec, job_id: str, *, clients: Clients,
           progress: Spinner = no_spinner) -> CancelOutcome:
    """scancel the job on the login node: what became of it, or why it was not cancelled."""
    from gpucluster.slurm.queue import QueueError
    from gpucluster.slurm.remote import RemoteError, cancel_script, parse_cancel

    try:
        script = cancel_script(job_id)
    except QueueError as err:
        raise SlurmError(str(err)) from None
    _, result = on_login(spec, script, clients=clients, progress=progress, comment="gpucluster cancel")
    try:
        answer = parse_cancel(checked(result, "scancel"))
    except (QueueError, RemoteError) as err:
        raise SlurmError(str(err)) from None
    after = answer.job.state if answer.job else None
    if answer.before is None:
        return CancelOutcome(job_id, False, "Slurm has no such job (it never existed, or ended longer "
                             "ago than the controller keeps jobs)", after)
    if not answer.before.active:
        return CancelOutcome(job_id, False, f"it had already ended ({answer.before.state})", after)
    if answer.exit_status != 0 or answer.message:
        why = answer.message or f"exit {answer.exit_status}"
        return CancelOutcome(job_id, False, f"scancel refused: {why}", after)
    return CancelOutcome(job_id, True, "", after)


# -------------------------------------------------------------------------- output


@dataclass
class JobOutput:
    job: SlurmJob
    path: str
    instance_id: str
    size: int
    text: str
    truncated: bool = False
    """SSM returned only the first 24,000 characters: fewer lines than asked for."""


def locate_output(spec: StackSpec, job_id: str, *, clients: Clients,
                  progress: Spinner = no_spinner) -> tuple[JobPlace, str]:
    """The job's place (scontrol: StdOut, BatchHost and its address) and the batch host's instance.

    The output file is written by the job's batch host (the first node), on its own disk unless
    the path is on shared storage: it is read there, found among the stack's instances by address.
    """
    from gpucluster.slurm.queue import QueueError
    from gpucluster.slurm.remote import RemoteError, SlurmNode, locate_script, parse_locate

    try:
        script = locate_script(job_id)
    except QueueError as err:
        raise SlurmError(str(err)) from None
    _, result = on_login(spec, script, clients=clients, progress=progress, comment="gpucluster logs")
    try:
        place = parse_locate(result.stdout)
    except (QueueError, RemoteError) as err:
        raise SlurmError(f"job {job_id}: {result.error_line() if not result.ok else err} (the controller "
                         f"keeps a finished job for MinJobAge; see `gpucluster jobs {spec.stack}`)") from None
    if not place.stdout or not place.batch_host:
        raise SlurmError(f"job {job_id} is {place.job.state}: it has no batch host yet, so no output")
    ip = SlurmNode(place.batch_host, (), "", place.node_addr, place.node_hostname, "").private_ip
    found = [i for i in stack_instances(clients("ec2"), spec.identity)
             if ip is not None and i.get("PrivateIpAddress") == ip]
    if not found:
        raise SlurmError(f"job {job_id}'s batch host {place.batch_host} ({ip or 'no address'}) is no "
                         f"instance of stack {spec.stack} now: its output {place.stdout} went with it")
    return place, found[0]["InstanceId"]


def job_output(spec: StackSpec, job_id: str, *, lines: int, clients: Clients,
               progress: Spinner = no_spinner) -> JobOutput:
    """The last `lines` of the job's output file (on its batch host)."""
    from gpucluster.slurm.remote import RemoteError, parse_tail, tail_script

    place, instance = locate_output(spec, job_id, clients=clients, progress=progress)
    with progress(f"reading {place.stdout} on {instance}"):
        result = run_script(clients("ssm"), instance, tail_script(place.stdout, lines=lines),
                            comment="gpucluster logs")
    try:
        tail = parse_tail(checked(result, f"reading {place.stdout}"))
    except RemoteError as err:
        raise SlurmError(str(err)) from None
    return JobOutput(place.job, place.stdout, instance, tail.size, tail.text,
                     truncated=len(result.stdout) >= SSM_STDOUT_LIMIT)


@dataclass
class Followed:
    job: SlurmJob
    path: str
    instance_id: str
    state: str = ""
    exit_code: int | None = None


def follow_output(spec: StackSpec, job_id: str, on_text: Callable[[str], None], *, clients: Clients,
                  progress: Spinner = no_spinner, poll_seconds: float = FOLLOW_POLL_SECONDS,
                  sleep: Callable[[float], None] = time.sleep) -> Followed:
    """Stream the job's output file as it grows until the job has ended (then the rest of it).

    Each round reads from the last size on the batch host, then asks the controller whether the
    job still runs; a pending job is waited for (it has no file yet).
    """
    from gpucluster.slurm.remote import RemoteError, locate_script, parse_locate, parse_tail, tail_script

    place, instance = locate_output(spec, job_id, clients=clients, progress=progress)
    login = find_login_node(spec, clients=clients)
    ssm = clients("ssm")
    followed = Followed(place.job, place.stdout, instance)
    offset, job = 0, place.job
    while True:
        result = run_script(ssm, instance, tail_script(place.stdout, offset=offset),
                            comment="gpucluster logs")
        more = False
        if result.ok:
            try:
                tail = parse_tail(result.stdout)
            except RemoteError as err:
                raise SlurmError(str(err)) from None
            if tail.text:
                on_text(tail.text)
            offset += tail.read or 0
            more = offset < tail.size  # a long file: read on before asking the controller again
        elif result.exit_code != 4:  # 4: no file yet
            raise SlurmError(f"reading {place.stdout} on {instance}: {result.error_line()}")
        if more:
            continue
        if not job.active:
            break
        sleep(poll_seconds)
        state = run_script(ssm, login.instance_id, locate_script(job_id), comment="gpucluster logs")
        try:
            job = parse_locate(state.stdout).job
        except (RemoteError, ValueError):
            job = replace(job, state="ENDED")  # the controller no longer has it: read the rest, stop
    followed.state, followed.exit_code = job.state, job.exit_code
    return followed


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeView:
    """A Slurm node beside the EC2 instance behind it (either may be missing)."""

    slurm: SlurmNode | None
    instance: dict[str, Any] | None
    boot: NodeBoot | None = None
    """Slurm's own record of the node's boot: registration and first job, seconds after it booted."""

    def as_json(self) -> dict[str, Any]:
        i, s, b = self.instance or {}, self.slurm, self.boot
        tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
        return {"slurm_node": s.name if s else None, "partitions": list(s.partitions) if s else [],
                "slurm_state": s.state if s else None, "reason": (s.reason or None) if s else None,
                "instance_id": i.get("InstanceId"), "node_group": tags.get(NODE_GROUP_TAG),
                "instance_type": i.get("InstanceType"),
                "private_ip": i.get("PrivateIpAddress") or (s.private_ip if s else None),
                "ec2_state": i.get("State", {}).get("Name") if i else None,
                "registered_seconds": b.registered_seconds if b else None,
                "first_job_seconds": b.first_job_seconds if b else None}


def slurm_nodes(spec: StackSpec, *, group: str | None = None, clients: Clients,
                progress: Spinner = no_spinner) -> list[NodeView]:
    """sinfo's nodes (of one partition) beside the stack's instances, matched by private address.

    PCS keeps a node for every slot of a compute node group's maximum: a powered-down one
    (`idle~`) has no instance; an instance Slurm does not know (booting, the login node) shows
    with no Slurm state.
    """
    from gpucluster.slurm.remote import RemoteError, nodes_script, parse_node_boots, parse_sinfo

    _, result = on_login(spec, nodes_script(accounting=spec.scheduler.accounting), clients=clients,
                         progress=progress, comment="gpucluster nodes", paged=True)
    try:
        output = checked(result, "sinfo")
        found, boots = parse_sinfo(output), parse_node_boots(output)
    except RemoteError as err:
        raise SlurmError(str(err)) from None
    if group is not None:
        found = [n for n in found if group in n.partitions]
    instances = stack_instances(clients("ec2"), spec.identity, group=group)
    by_ip = {i.get("PrivateIpAddress"): i for i in instances if i.get("PrivateIpAddress")}
    views = [NodeView(n, by_ip.pop(n.private_ip, None) if n.private_ip else None, boots.get(n.name))
             for n in found]
    views += [NodeView(None, i) for i in sorted(by_ip.values(), key=lambda i: i["InstanceId"])]
    return views


# --------------------------------------------------------------------------- spend


@dataclass
class Usage:
    by: str
    start: datetime
    end: datetime
    rows: list[UsageRow]
    prices: dict[str, Rate]
    """Partition (node group) -> USD a node-hour and its basis, as `gpucluster cost` prices the group."""

    @property
    def usd(self) -> float:
        return sum(r.usd or 0.0 for r in self.rows)


def node_hour_prices(spec: StackSpec) -> dict[str, Rate]:
    """Each node group's USD a node-hour with its basis: `pricing.node_hour_price`, as `cost` prices it."""
    from gpucluster import pricing

    try:
        return {g.name: pricing.node_hour_price(pricing.price_group(spec, g)) for g in spec.node_groups}
    except pricing.PricingError as err:
        raise SlurmError(f"cannot price stack {spec.stack}: {err}") from None


def usage(spec: StackSpec, by: str, start: datetime, end: datetime, *, clients: Clients,
          progress: Spinner = no_spinner, now: datetime | None = None) -> Usage:
    """GPU-hours and their cost per user or job in [start, end), from sacct on the login node."""
    from gpucluster.slurm.queue import QueueError
    from gpucluster.slurm.usage import parse_usage, priced, usage_script

    if not spec.scheduler.slurm:
        raise SlurmError(f"--by {by}: stack {spec.stack} has no scheduler (scheduler type none): Slurm "
                         "accounting is what --by reads")
    if not spec.scheduler.accounting:
        raise SlurmError(f"--by {by}: stack {spec.stack} has Slurm accounting off (scheduler.accounting: "
                         "false): there is no sacct to read")
    prices = node_hour_prices(spec)
    _, result = on_login(spec, usage_script(start, end), clients=clients, progress=progress,
                         comment="gpucluster spend", paged=True)
    try:
        jobs = parse_usage(checked(result, "sacct"), start, end, now or datetime.now(UTC))
    except QueueError as err:
        raise SlurmError(str(err)) from None
    return Usage(by, start, end, priced(jobs, by, {k: r.usd_per_hour for k, r in prices.items()}), prices)
