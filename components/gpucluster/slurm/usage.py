"""GPU-hours and their cost per user and per job, from Slurm accounting (`sacct`).

`gpucluster spend STACK --by user|job` runs `usage_script` on the login node and prices what it
prints. The sacct fields used (sacct(1), "--format"; all in Slurm 22.05 and 24.11):
JobID, User, Partition, NNodes, ElapsedRaw (seconds), Start, End (`Unknown` while running),
State, AllocTRES (`gres/gpu=<n>` is the job's GPUs) and JobName, last since it may hold the
delimiter. `--allocations` keeps whole jobs (no .batch/.0 steps), `--allusers` everyone's (the
login node's root sees them all), `--parsable2 --noheader` no padding and no header. The window
is clipped per job: a job that started before the window counts only its hours inside it. Times
are read as UTC (the script sets TZ=UTC and SLURM_TIME_FORMAT=standard for sacct).

A job's cost is its node-hours (clipped hours x NNodes) at its partition's node group's price
per node-hour, the same price `gpucluster cost` gives the group (the caller passes it in); a
partition that is no node group's is shown unpriced. Pure: builds and parses text.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gpucluster.slurm.queue import DELIMITER, QueueError, delimited_records
from gpucluster.slurm.remote import SLURM_PATH

USAGE_FIELDS = ("JobID", "User", "Partition", "NNodes", "ElapsedRaw", "Start", "End", "State",
                "AllocTRES", "JobName")
NOT_A_TIME = frozenset({"Unknown", "None", ""})
GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")


def sacct_time(when: datetime) -> str:
    """A UTC time as sacct's --starttime/--endtime take it (YYYY-MM-DDTHH:MM:SS)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def usage_command(start: datetime, end: datetime) -> list[str]:
    return ["sacct", "--noheader", "--parsable2", "--allocations", "--allusers",
            f"--starttime={sacct_time(start)}", f"--endtime={sacct_time(end)}",
            "--format=" + ",".join(USAGE_FIELDS)]


def usage_script(start: datetime, end: datetime) -> str:
    """sacct of every job that ran between `start` and `end`, in UTC."""
    return "\n".join(["set -eu", SLURM_PATH, "export TZ=UTC SLURM_TIME_FORMAT=standard",
                      shlex.join(usage_command(start, end)), ""])


@dataclass(frozen=True)
class JobUsage:
    """One job's use of the window."""

    job_id: str
    user: str
    name: str
    partition: str
    state: str
    nodes: int
    gpus: int
    """AllocTRES gres/gpu (0: none recorded)."""
    hours: float
    """Wall hours inside the window."""

    @property
    def node_hours(self) -> float:
        return self.hours * self.nodes

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus


def _time(value: str) -> datetime | None:
    if value in NOT_A_TIME:
        return None
    try:
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    except ValueError:
        raise QueueError(f"sacct: not a time: {value!r}") from None


def parse_usage(output: str, start: datetime, end: datetime, now: datetime) -> list[JobUsage]:
    """Each job's hours inside [start, end) from `usage_script`'s output (a running job: to now)."""
    jobs = []
    for record in delimited_records(output, len(USAGE_FIELDS), "sacct"):
        job_id, user, partition, nodes, elapsed, began, ended, state, tres, name = record
        if "." in job_id:
            continue
        try:
            count, seconds = int(nodes), int(elapsed)
        except ValueError:
            raise QueueError(f"sacct: not a node count or seconds in {DELIMITER.join(record)!r}") from None
        first, last = _time(began), _time(ended)
        if first is None:  # never started (pending, cancelled while pending)
            hours = 0.0
        else:
            if last is None:  # running: until now; otherwise (no End recorded) its elapsed time
                last = now if state.startswith("RUNNING") else datetime.fromtimestamp(
                    first.timestamp() + seconds, UTC)
            hours = max(0.0, (min(last, end) - max(first, start)).total_seconds()) / 3600
        gpus = GPU_TRES.search(tres)
        jobs.append(JobUsage(job_id=job_id, user=user, name=name, partition=partition,
                             state=state.split()[0] if state.strip() else "UNKNOWN", nodes=count,
                             gpus=int(gpus.group(1)) if gpus else 0, hours=hours))
    return jobs


@dataclass(frozen=True)
class UsageRow:
    """One line of `spend --by user|job`."""

    key: str
    """The user, or the job id."""
    jobs: int
    node_hours: float
    gpu_hours: float
    usd: float | None
    """None: some of its hours ran on a partition that is no node group's (unpriced)."""
    detail: str = ""
    """--by job: the job's name, user, partition and state."""


def priced(jobs: Iterable[JobUsage], by: str, usd_per_node_hour: Mapping[str, float]) -> list[UsageRow]:
    """Rows by user or by job, largest GPU-hours first; hours at each partition's node-hour price."""
    if by not in ("user", "job"):
        raise ValueError(f"--by: must be user or job, got {by!r}")
    groups: dict[str, list[JobUsage]] = defaultdict(list)
    for job in jobs:
        if job.hours <= 0:
            continue
        groups[job.user if by == "user" else job.job_id].append(job)
    rows = []
    for key, items in groups.items():
        prices = [usd_per_node_hour.get(j.partition) for j in items]
        usd = None if any(p is None for p in prices) else sum(
            j.node_hours * p for j, p in zip(items, prices, strict=True) if p is not None)
        detail = "" if by == "user" else (f"{items[0].name} ({items[0].user}, {items[0].partition}, "
                                          f"{items[0].state})")
        rows.append(UsageRow(key, len(items), sum(j.node_hours for j in items),
                             sum(j.gpu_hours for j in items), usd, detail))
    return sorted(rows, key=lambda r: (-r.gpu_hours, -r.node_hours, r.key))
