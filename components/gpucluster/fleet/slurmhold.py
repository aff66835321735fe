"""What a stop and a start do to Slurm on a Slurm stack: the exact commands, sent to the login node.

A stop of PCS node groups (budget, the idle fallback, schedule, lifetime, Capacity Block,
`gpucluster stop`) first runs `hold_script` on the stack's login node through SSM Run Command:
1. Each stopped group's partition (named as the group by `aws.pcs`) goes DOWN. slurm.conf(5),
   PartitionName State: DOWN "designates that new jobs may be queued on the partition, but queued
   jobs may not be allocated nodes and run from the partition. Jobs already running on the partition
   continue to run"; INACTIVE would also refuse new submissions ("no new jobs may be queued"). DOWN
   is chosen: a job submitted during a stop is kept, and starts once `release_script` sets the
   partition UP again; nothing a user sends is refused.
2. The jobs running on those partitions (listed once, before anything is signalled) get SIGUSR1 with
   `scancel --signal=USR1 --full` (scancel(1): --full also signals the batch script and its
   children, which signals other than KILL otherwise skip; without it only the job steps, e.g.
   srun's tasks, get the signal): both a `trap` in the batch script and torchrun under srun can
   checkpoint. A script that does not trap USR1 ends at once (the signal's default action; seen on
   22.05: the job FAILED), which a stop would have done to it anyway.
3. After the grace time (the stack's pre-stop timeout) those jobs are requeued, `scontrol requeue`
   (scontrol(1): "Requeue a running, suspended or finished Slurm batch job into pending state"):
   they are killed on their nodes and wait in the queue, held by the DOWN partition, until the
   start. A job submitted with --no-requeue (or without --requeue where JobRequeue=0) is refused
   by Slurm and then ends with its nodes; the script reports those ids and exits 3 so the
   guardrail's notification names them.
The hold is idempotent (issue 34): a SendCommand that timed out after it landed and is retried, or
two invocations at once, each send it. Under a lock (flock(1) on HOLD_DIR/lock, root-only, as SSM
runs the script as root) a second hold waits for the first; each job it signals is recorded first as
"<job id> Restarts=<n> StartTime=<t>" (scontrol show job: the count of the job's requeues and
the start of its current run, so a job id Slurm reuses is a new run), and a job already recorded in
its current run is not signalled again, only requeued if it still runs (the first hold was cut off).
So a job gets SIGUSR1 once per stop, and a hold that finds nothing running says so and repeats what
the last hold did (HOLD_DIR/last), never "not requeued" for jobs the first requeued. A requeued job
runs again with Restarts+1: the next stop signals it again. Only then does the stop set each group's
maximum to 0 (`pcs.PcsCapacity`). A start restores the capacity, then sets the partitions UP.

The login node is found by its tags (our launch template's: STACK_TAG = the identity,
NODE_GROUP_TAG = `login`, set by `aws.pcs`), running. Tested against a real Slurm 22.05
(tests/test_slurm_guard_real.py); the options used exist in 22.05 and in PCS's 24.11+.
Never imports Pulumi: carried into the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Sequence
from typing import Any

from .awsapi import AWS_ERRORS, log_event
from .runcommand import NOT_SENT, CommandResult, run_command
from .tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP, STACK_TAG

# Slurm partition names here are gpucluster node group names: [a-z0-9-]; anything else is refused
# before it reaches a shell.
PARTITION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
REQUEUE_REFUSED_EXIT = 3
DEFAULT_GRACE_SECONDS = 30.0


def _partitions(partitions: Sequence[str]) -> list[str]:
    names = sorted(set(partitions))
    bad = [p for p in names if not PARTITION.match(p)]
    if bad:
        raise ValueError(f"not a Slurm partition name: {bad}")
    return names


def requeue_jobs(*, done: str = "") -> list[str]:
    """Shell lines that requeue each of `$jobs`; a job Slurm refuses to requeue (--no-requeue) is
    named and the script exits REQUEUE_REFUSED_EXIT. `done`: a shell line run before either exit."""
    before = f"{done}; " if done else ""
    return [
        "refused=''",
        'for j in $jobs; do scontrol requeue "$j" || refused="$refused $j"; done',
        'if [ -n "$refused" ]; then echo "gpucluster: not requeued (--no-requeue?):$refused"; '
        f"{before}exit {REQUEUE_REFUSED_EXIT}; fi",
        'echo "gpucluster: requeued" $jobs',
        *([done] if done else []),
    ]


def signal_then_requeue(grace_seconds: float, *, none: str, signalling: str) -> list[str]:
    """Shell lines over `$jobs`: none -> say `none` and exit 0; else SIGUSR1 to every job (its batch
    script and its tasks: --full), the grace time to checkpoint, then each requeued (`requeue_jobs`)."""
    return [
        f'if [ -z "$jobs" ]; then echo "gpucluster: {none}"; exit 0; fi',
        f'echo "gpucluster: {signalling}" $jobs',
        'for j in $jobs; do scancel --signal=USR1 --full "$j" || true; done',
        f"sleep {max(0, int(grace_seconds))}",
        *requeue_jobs(),
    ]


# Where the login node keeps what the holds did (root-only: created 0700 by the root SSM runs; /var/lib
# is writable by root alone, so no user can plant a record that spares a job).
HOLD_DIR = "/var/lib/gpucluster/slurm-hold"
HOLD_BUSY_EXIT = 5


def _once_per_run(listing: str, grace_seconds: float, hold_dir: str, lock_wait_seconds: float) -> list[str]:
    """Under the hold lock, the jobs `listing` prints as `$jobs`: SIGUSR1 only to the jobs no earlier hold has
    signalled in their current run (recorded before the signal), the grace, then every running job
    requeued; what was done is kept in HOLD_DIR/last for a later hold that finds nothing to do."""
    d = shlex.quote(hold_dir)
    record = (f'echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) signalled:${{fresh:- none}}; '
              f'earlier:${{seen:- none}}; requeue refused:${{refused:- none}}" > {d}/last')
    return [
        f"umask 077; mkdir -p {d} && chmod 700 {d} || "
        f'{{ echo "gpucluster: cannot make {hold_dir}"; exit {HOLD_BUSY_EXIT}; }}',
        f"exec 9>>{d}/lock",
        f"flock -w {max(1, int(lock_wait_seconds))} 9 || "
        f'{{ echo "gpucluster: another hold is still running"; exit {HOLD_BUSY_EXIT}; }}',
        # Listed under the lock: a concurrent hold's requeued jobs are PENDING by now.
        f"jobs=$({listing})",
        f'if [ -z "$jobs" ]; then echo "gpucluster: no running job"; '
        f'if [ -f {d}/last ]; then echo "gpucluster: the last hold:" "$(cat {d}/last)"; fi; exit 0; fi',
        f"touch {d}/signalled; fresh=''; seen=''",
        'for j in $jobs; do run="$j $(scontrol --oneliner show job "$j" '
        '| grep -oE "(Restarts|StartTime)=[^ ]*" | tr "\\n" " ")"; '
        f'if grep -qxF "$run" {d}/signalled; then seen="$seen $j"; '
        f'else fresh="$fresh $j"; echo "$run" >> {d}/signalled; fi; done',
        f"tail -n 5000 {d}/signalled > {d}/signalled.new && mv {d}/signalled.new {d}/signalled",
        'if [ -n "$seen" ]; then '
        'echo "gpucluster: signalled already by an earlier hold of this stop:$seen"; fi',
        'if [ -n "$fresh" ]; then echo "gpucluster: signalling jobs$fresh"; '
        'for j in $fresh; do scancel --signal=USR1 --full "$j" || true; done; '
        f"sleep {max(0, int(grace_seconds))}; fi",
        *requeue_jobs(done=record),
    ]


def hold_script(partitions: Sequence[str], grace_seconds: float, *, hold_dir: str = HOLD_DIR,
                lock_wait_seconds: float | None = None) -> str:
    """The shell the login node runs before a stop: partitions DOWN, running jobs signalled once, requeued.

    A second hold waits for the first up to `lock_wait_seconds` (default: the grace plus 30 s, the
    caller's wait for the login node), then exits HOLD_BUSY_EXIT without signalling.
    """
    names = _partitions(partitions)
    joined = ",".join(names)
    wait = grace_seconds + 30.0 if lock_wait_seconds is None else lock_wait_seconds
    lines = ["set -u"]
    lines += [f"scontrol update PartitionName={p} State=DOWN" for p in names]
    # Listed once per hold: a job that starts later cannot (the partitions are DOWN).
    listing = f"squeue --noheader --partition={joined} --states=RUNNING,CONFIGURING --format=%i | sort -u"
    lines += _once_per_run(listing, grace_seconds, hold_dir, wait)
    return "\n".join(lines)


def release_script(partitions: Sequence[str]) -> str:
    """The shell the login node runs after a start: the partitions UP, their held jobs free to start."""
    return "\n".join(["set -eu", *(f"scontrol update PartitionName={p} State=UP"
                                   for p in _partitions(partitions))])


# The Slurm node of an EC2 instance, from the login node: the node whose NodeAddr or NodeHostName is
# the instance's private IP or DNS name (PCS names Slurm nodes itself and points them at the
# instance it launched; ledger: pcs-node-addresses: matching the address does not
# depend on the naming), or whose NodeName is the host name.
NODE_OF = ("scontrol --oneliner show node | awk -v ip={ip} -v host={host} "
           "'{{n=\"\"; a=\"\"; h=\"\"; for (i = 1; i <= NF; i++) {{ "
           "if ($i ~ /^NodeName=/) n = substr($i, 10); if ($i ~ /^NodeAddr=/) a = substr($i, 10); "
           "if ($i ~ /^NodeHostName=/) h = substr($i, 14) }} "
           "if (a == ip || h == host || a == host || n == host) {{ print n; exit }} }}'")


ADDRESS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")


def requeue_node_script(private_ip: str, host: str, grace_seconds: float, reason: str) -> str:
    """The shell the login node runs on a spot warning: drain the instance's node, signal, requeue its jobs.

    Relying on --requeue and the node going down would requeue only after slurmctld gives up on
    the node (SlurmdTimeout, after the instance is gone) and only jobs submitted with --requeue;
    acting on the two-minute warning drains the node at once (no new job lands on it), gives the
    jobs the grace time to checkpoint on SIGUSR1, and requeues them while the node still answers.
    """
    if not (ADDRESS.match(private_ip) and ADDRESS.match(host)):
        raise ValueError(f"not an instance address: {private_ip!r} {host!r}")
    lines = [
        "set -u",
        "node=$(" + NODE_OF.format(ip=shlex.quote(private_ip), host=shlex.quote(host)) + ")",
        f'if [ -z "$node" ]; then echo "gpucluster: no Slurm node for {private_ip} {host}"; exit 4; fi',
        f'scontrol update NodeName="$node" State=DRAIN Reason={shlex.quote("gpucluster: " + reason)}',
        'jobs=$(squeue --noheader --nodelist="$node" --states=RUNNING,CONFIGURING --format=%i | sort -u)',
        *signal_then_requeue(grace_seconds, none="no job on $node", signalling="signalling jobs on $node:"),
    ]
    return "\n".join(lines)


def login_instances(ec2: Any, stack: str) -> list[str]:
    """The stack's running login node(s), by our launch template's tags."""
    filters = [{"Name": f"tag:{STACK_TAG}", "Values": [stack]},
               {"Name": f"tag:{NODE_GROUP_TAG}", "Values": [SLURM_LOGIN_GROUP]},
               {"Name": "instance-state-name", "Values": ["running"]}]
    ids: list[str] = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                tags = {t["Key"]: t.get("Value", "") for t in instance.get("Tags", [])}
                # The filter again, client side: acting on another stack's node is worse than not acting.
                if tags.get(STACK_TAG) == stack and tags.get(NODE_GROUP_TAG) == SLURM_LOGIN_GROUP:
                    ids.append(instance["InstanceId"])
    return sorted(ids)


def on_login_node(ssm: Any, ec2: Any, stack: str, script: str, *, timeout_seconds: float,
                  comment: str) -> CommandResult:
    """Run `script` on one running login node of `stack`; never raises for AWS (the result says what failed).

    No login node running (or EC2 refusing the lookup) comes back as a result with status NotSent,
    so the caller notifies it and still stops: capacity at zero is what the budget needs.
    """
    try:
        nodes = login_instances(ec2, stack)
    except AWS_ERRORS as exc:
        log_event("login node not found", logging.ERROR, stack=stack, error=str(exc))
        return CommandResult({"login": NOT_SENT}, errors={"login": f"login node not found: {exc}"})
    if not nodes:
        log_event("no login node running", logging.ERROR, stack=stack)
        return CommandResult({"login": NOT_SENT}, errors={"login": "no running login node"})
    return run_command(ssm, nodes[:1], script, timeout_seconds=timeout_seconds, comment=comment,
                       poll_seconds=2.0)


def hold_partitions(ssm: Any, ec2: Any, stack: str, partitions: Sequence[str], *,
                    grace_seconds: float, timeout_seconds: float) -> CommandResult:
    """`hold_script` on the stack's login node (what a stop of PCS groups runs first)."""
    return on_login_node(ssm, ec2, stack, hold_script(partitions, grace_seconds),
                         timeout_seconds=timeout_seconds, comment="gpucluster stop: hold partitions, requeue")


def release_partitions(ssm: Any, ec2: Any, stack: str, partitions: Sequence[str], *,
                       timeout_seconds: float = 60.0) -> CommandResult:
    """`release_script` on the stack's login node (what a start of PCS groups runs after the capacity)."""
    return on_login_node(ssm, ec2, stack, release_script(partitions), timeout_seconds=timeout_seconds,
                         comment="gpucluster start: release partitions")
