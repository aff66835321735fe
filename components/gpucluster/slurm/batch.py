"""The sbatch script of a job on a node group: Slurm's allocation turned into torchrun's environment.

One task a node (`--ntasks-per-node=1`), every node of the allocation whole (`--exclusive`), the
group's GPUs (`--gpus-per-node`), and for every task the variables torchrun, DeepSpeed and MPI
launchers read, taken from Slurm's own: MASTER_ADDR is the first host of `$SLURM_JOB_NODELIST`
(`scontrol show hostnames`), NNODES is `$SLURM_NNODES`, NODE_RANK is the task's `$SLURM_NODEID`
(set inside `srun`, so each node gets its own), NPROC_PER_NODE the group's GPUs (or MIG devices) a
node and WORLD_SIZE their product. The group's EFA/NCCL settings come from
`gpucluster.node.userdata.efa_environment`, the same source the nodes' /etc/profile.d and
`gpucluster run` use. `srun` then runs the user's command once a node, shell-quoted (shlex).

The layout follows AWS's own examples: awslabs/awsome-distributed-training,
`3.test_cases/pytorch/FSDP/slurm/*.sbatch` (`#SBATCH --nodes/--exclusive`, `head_node_ip` from
`scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1`, `srun` running torchrun once a node with
`--nnodes $SLURM_JOB_NUM_NODES`), and the AWS PCS user guide, "Run a multi-node MPI job with Slurm
in AWS PCS" and "Submit a job with Slurm in AWS PCS" (`sbatch --partition <queue>`: a PCS queue is
the Slurm partition of the same name).

Only options Slurm 22.05 (Debian 12, what the tests run) and 24.11 (what AWS PCS runs) both have
are used: `--gpus-per-node` (19.05+), `--requeue`, `--exclusive`, `--time`, `--output` with `%x`/`%j`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucluster.spec import NodeGroupConfig, SpotConfig

DEFAULT_MASTER_PORT = 29500
"""torchrun's default rendezvous port (PyTorch docs, torchrun `--master-port`)."""

DEFAULT_OUTPUT = "gpucluster-%x-%j.out"
"""sbatch `--output`: %x is the job name, %j its id (sbatch man page, "filename pattern"); relative
paths are relative to the directory sbatch is run in."""

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What we accept as a job name: Slurm stores any string, but a space, quote or newline in an
`#SBATCH --job-name=` line is cut or misparsed, and `squeue -o` output with delimiters would be
ambiguous; 128 characters keep `squeue --format=%j` columns sane."""

QUEUE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
"""A partition / PCS queue name we render (PCS queue names are letters, digits and '-')."""

SBATCH_PATH = re.compile(r"[\w./%@+=:,~-]+")
"""An --output/--chdir value that needs no quoting in an `#SBATCH` line (sbatch splits those lines
on whitespace and its quote handling differs between versions)."""

MAX_TIMEOUT_SECONDS = 365 * 24 * 3600
"""A year: beyond that `--time` is a mistake, not a limit (Slurm's own INFINITE is "no --time")."""


class BatchError(ValueError):
    """A job that cannot be submitted as asked; the message names the option (e.g. `--nodes`)."""


@dataclass(frozen=True)
class SlurmGroup:
    """A node group as Slurm sees it: its partition, size, GPUs a node and what its jobs export."""

    name: str
    queue: str
    """The PCS queue = Slurm partition the group's compute node group serves."""
    max_nodes: int
    gpus_per_node: int
    """GPUs of the group's smallest type (0: a CPU group; no `--gpus-per-node`)."""
    procs_per_node: int
    """Processes a node: GPUs, or MIG devices in a MIG group; 1 on a CPU group."""
    can_run_spot: bool
    environment: Mapping[str, str] = field(default_factory=dict)
    """The group's EFA/NCCL settings (and MIG layout), exported before srun."""


def queue_name(group: str) -> str:
    """The PCS queue (Slurm partition) of node group `group`: the group's own name.

    Group names are 2-24 characters of a-z, 0-9 and '-' (spec.fields.Name), which PCS queue and
    Slurm partition names both accept, so `sbatch -p <group>` is what a user would guess.
    """
    return group


def slurm_group(group: NodeGroupConfig, *, stack: str, cluster: str, region: str,
                spot: SpotConfig) -> SlurmGroup:
    """The Slurm view of a stack's node group (its environment from the nodes' own source)."""
    from gpucluster.node.userdata import efa_environment, group_bootstrap
    from gpucluster.spec.models import can_run_spot

    gpus = min((t.gpus for t in group.types), default=0)
    env = dict(efa_environment(group_bootstrap(group, stack=stack, cluster=cluster, region=region,
                                               spot=spot)))
    if group.mig_layout:
        env["GPUCLUSTER_MIG_LAYOUT"] = ",".join(group.mig_layout)  # each GPU's MIG instances
    return SlurmGroup(name=group.name, queue=queue_name(group.name), max_nodes=group.max_nodes,
                      gpus_per_node=gpus, procs_per_node=max(gpus * group.slots_per_gpu, 1),
                      can_run_spot=can_run_spot(group), environment=env)


@dataclass(frozen=True)
class BatchJob:
    """One job as the user asked for it (`gpucluster run --detach` on a Slurm stack)."""

    name: str
    command: str
    nodes: int
    restart_on_replace: bool = False
    timeout_seconds: int | None = None
    master_port: int = DEFAULT_MASTER_PORT
    output: str = DEFAULT_OUTPUT
    workdir: str | None = None


def slurm_time(seconds: int) -> str:
    """`--time` as days-hours:minutes:seconds, rounded up to the minute (Slurm's granularity)."""
    minutes = -(-seconds // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00"


def check_job(job: BatchJob, group: SlurmGroup) -> None:
    """BatchError naming the option when `job` cannot run on `group` as asked."""
    if not job.command.strip():
        raise BatchError("command: is empty; give the command to run after `--`")
    if "\0" in job.command:
        raise BatchError("command: contains a NUL byte, which no shell can pass on")
    if not JOB_NAME.fullmatch(job.name):
        raise BatchError(f"--name: {job.name!r} is not a job name Slurm takes cleanly: 1-128 letters, "
                         "digits, '.', '_' or '-', starting with a letter or digit")
    if not QUEUE_NAME.fullmatch(group.queue):
        raise BatchError(f"--group: queue {group.queue!r} is not a Slurm partition name")
    if job.nodes < 1:
        raise BatchError(f"--nodes: must be at least 1, got {job.nodes}")
    if job.nodes > group.max_nodes:
        raise BatchError(f"--nodes: {job.nodes} is more than node group {group.name}'s max_nodes "
                         f"({group.max_nodes})")
    if job.timeout_seconds is not None and not 0 < job.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise BatchError(f"--timeout: must be between 1 and {MAX_TIMEOUT_SECONDS} seconds, "
                         f"got {job.timeout_seconds}")
    if not 1024 <= job.master_port <= 65535:
        raise BatchError(f"--master-port: must be between 1024 and 65535, got {job.master_port}")
    for option, value in (("--output", job.output), ("--workdir", job.workdir)):
        if value is not None and not SBATCH_PATH.fullmatch(value):
            raise BatchError(f"{option}: {value!r} must be a path without spaces or quotes (an "
                             "#SBATCH line splits on whitespace)")


def requeues(job: BatchJob, group: SlurmGroup) -> bool:
    """`--requeue`: the group can lose a node to a spot interruption, or the job asked to restart."""
    return group.can_run_spot or job.restart_on_replace


def sbatch_script(job: BatchJob, group: SlurmGroup) -> str:
    """The batch script of `job` on `group` (BatchError: bad input, named by option)."""
    check_job(job, group)
    header = [
        f"--job-name={job.name}",
        f"--partition={group.queue}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
    ]
    if group.gpus_per_node:
        header.append(f"--gpus-per-node={group.gpus_per_node}")
    header += ["--exclusive", f"--output={job.output}"]
    if job.workdir is not None:
        header.append(f"--chdir={job.workdir}")
    if requeues(job, group):
        header.append("--requeue")
    if job.timeout_seconds is not None:
        header.append(f"--time={slurm_time(job.timeout_seconds)}")
    lines = ["#!/bin/bash",
             f"# gpucluster job {job.name} on node group {group.name} (Slurm partition {group.queue}).",
             *(f"#SBATCH {h}" for h in header),
             # No pipefail: `head -n1` closing the pipe early is scontrol's SIGPIPE, not a failure
             # (a large allocation's host list outlasts the pipe buffer); an empty result is checked.
             "set -eu",
             "",
             "# What torchrun/DeepSpeed read, from Slurm's allocation (NODE_RANK is set per task below).",
             'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
             'if [ -z "$MASTER_ADDR" ]; then',
             '  echo "gpucluster: no first host in SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST" >&2',
             "  exit 1",
             "fi",
             f"MASTER_PORT={job.master_port}",
             'NNODES="$SLURM_NNODES"',
             f"NPROC_PER_NODE={group.procs_per_node}",
             "WORLD_SIZE=$((NNODES * NPROC_PER_NODE))",
             "export MASTER_ADDR MASTER_PORT NNODES NPROC_PER_NODE WORLD_SIZE"]
    if group.environment:
        lines += ["", f"# Node group {group.name}'s EFA/NCCL settings (as on its nodes)."]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(group.environment.items())]
    task = 'export NODE_RANK="$SLURM_NODEID"\n' + job.command
    lines += ["",
              "# One task a node; each sees its own NODE_RANK. A failing node ends the step.",
              "srun --nodes=\"$SLURM_NNODES\" --ntasks-per-node=1 --kill-on-bad-exit=1 "
              f"bash -c {shlex.quote(task)}",
              ""]
    return "\n".join(lines)

