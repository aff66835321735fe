"""Jobs as Slurm reports them: `squeue`, `sacct` and `scontrol show job` output into records, and
the `scancel` command line.

The commands are built here with a delimiter and no header (`squeue --noheader --format`,
`sacct --noheader --parsable2`), so parsing is splitting, not guessing at column widths: a job name
may hold spaces; the delimiter '|' is one our job names never hold (batch.JOB_NAME), and a name
that does hold it (someone else's `sbatch -J`) is taken as the fields between the known ones.

`sacct` needs accounting (`AccountingStorageType`; on AWS PCS, accounting is a cluster setting).
Without it, `squeue` (pending and running jobs) plus `scontrol show job` (finished jobs, for
`MinJobAge`, 300 s by default) give the same record; `parse_scontrol_job` reads that.
Formats used exist in Slurm 22.05 and 24.11 alike (squeue %i %j %T %D %N %P %r, sacct
JobID,JobName,State,NNodes,ExitCode,NodeList,Partition).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

DELIMITER = "|"

SQUEUE_FIELDS = ("%i", "%j", "%T", "%D", "%N", "%P", "%r")
"""Job id, name, state (long form), node count, node list, partition, reason (squeue man page)."""

SACCT_FIELDS = ("JobID", "JobName", "State", "NNodes", "ExitCode", "NodeList", "Partition")

ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED",
                           "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING",
                           "STAGE_OUT", "RESV_DEL_HOLD"})
"""States of a job that is not finished (squeue man page, "JOB STATE CODES")."""

JOB_ID = re.compile(r"\d+(?:_\d+)?")


class QueueError(ValueError):
    """Output that is not what the command we built prints, or a bad job id (named)."""


@dataclass(frozen=True)
class SlurmJob:
    """One job: what `gpucluster jobs` shows for it."""

    job_id: str
    name: str
    state: str
    """Slurm's state, upper case, without sacct's "by <uid>" (e.g. CANCELLED by 0 -> CANCELLED)."""
    nodes: int
    exit_code: int | None = None
    """The batch script's exit code (None: not finished, or squeue, which has none)."""
    signal: int | None = None
    """The signal that ended it (sacct ExitCode's ":<signal>" part)."""
    node_list: str = ""
    partition: str = ""
    reason: str = ""
    """Why it is pending (squeue %r), e.g. Resources, BeginTime, None."""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def squeue_command(*, partition: str | None = None, job_ids: Sequence[str] = (),
                   user: str | None = None) -> list[str]:
    """`squeue` listing pending and running jobs, one delimited line each, no header."""
    cmd = ["squeue", "--noheader", "--format=" + DELIMITER.join(SQUEUE_FIELDS)]
    if partition:
        cmd.append(f"--partition={partition}")
    if job_ids:
        cmd.append("--jobs=" + ",".join(_checked_ids(job_ids)))
    if user:
        cmd.append(f"--user={user}")
    return cmd


def sacct_command(*, job_ids: Sequence[str] = (), partition: str | None = None,
                  start: str | None = None) -> list[str]:
    """`sacct` of whole jobs (`--allocations`: no .batch/.0 steps), parsable, no header."""
    cmd = ["sacct", "--noheader", "--parsable2", "--allocations",
           "--format=" + ",".join(SACCT_FIELDS)]
    if job_ids:
        cmd.append("--jobs=" + ",".join(_checked_ids(job_ids)))
    if partition:
        cmd.append(f"--partition={partition}")
    if start:
        cmd.append(f"--starttime={start}")
    return cmd


def scancel_command(job_ids: Sequence[str], *, signal: str | None = None,
                    batch_only: bool = False) -> list[str]:
    """`scancel` of `job_ids`; with `signal` (e.g. USR1) the jobs are signalled, not ended.

    `batch_only` (`--batch`) signals only the batch shell, which then decides (e.g. a checkpoint
    trap); without it every step's tasks get the signal too.
    """
    ids = _checked_ids(job_ids)
    if not ids:
        raise QueueError("job id: give at least one job to cancel")
    cmd = ["scancel"]
    if signal is not None:
        if not re.fullmatch(r"(SIG)?[A-Z0-9]{2,8}", signal):
            raise QueueError(f"--signal: {signal!r} is not a signal name such as USR1 or TERM")
        cmd.append(f"--signal={signal}")
    if batch_only:
        cmd.append("--batch")
    return cmd + ids


def shell(cmd: Sequence[str]) -> str:
    """A built command as one shell line (what goes into an SSM command on the login node)."""
    return shlex.join(cmd)


def parse_squeue(output: str) -> list[SlurmJob]:
    """Records from `squeue_command`'s output."""
    jobs = []
    for line in _lines(output):
        job_id, name, state, nodes, node_list, partition, reason = _fields(line, len(SQUEUE_FIELDS),
                                                                           "squeue")
        jobs.append(SlurmJob(job_id=job_id, name=name, state=_state(state), nodes=_int(nodes, line),
                             node_list=_none_empty(node_list), partition=partition,
                             reason=_none_empty(reason)))
    return jobs


def parse_sacct(output: str) -> list[SlurmJob]:
    """Records from `sacct_command`'s output (steps, if any slipped in, are left out)."""
    jobs = []
    for line in _lines(output):
        job_id, name, state, nodes, exit_code, node_list, partition = _fields(line, len(SACCT_FIELDS),
                                                                              "sacct")
        if "." in job_id:
            continue
        code, sig = _exit_code(exit_code, line)
        jobs.append(SlurmJob(job_id=job_id, name=name, state=_state(state), nodes=_int(nodes, line),
                             exit_code=code, signal=sig, node_list=_none_empty(node_list),
                             partition=partition))
    return jobs


def parse_scontrol_job(output: str) -> SlurmJob:
    """The record of `scontrol show job --oneliner <id>` (works without accounting)."""
    fields = dict(_scontrol_pairs(output))
    missing = [k for k in ("JobId", "JobName", "JobState", "NumNodes") if k not in fields]
    if missing:
        raise QueueError(f"scontrol show job: no {', '.join(missing)} in {output.strip()[:200]!r}")
    code, sig = _exit_code(fields.get("ExitCode", "0:0"), output)
    nodes = fields["NumNodes"].split("-")[0]  # pending: "2-2" or "1-4"
    return SlurmJob(job_id=fields["JobId"], name=fields["JobName"], state=_state(fields["JobState"]),
                    nodes=_int(nodes, output), exit_code=None if fields["JobState"] in ACTIVE_STATES
                    else code, signal=sig, node_list=_none_empty(fields.get("NodeList", "")),
                    partition=fields.get("Partition", ""), reason=_none_empty(fields.get("Reason", "")))


def merged(active: Iterable[SlurmJob], finished: Iterable[SlurmJob]) -> list[SlurmJob]:
    """squeue's live view over sacct's history: one record a job, squeue's when both have it."""
    seen: dict[str, SlurmJob] = {j.job_id: j for j in finished}
    seen.update({j.job_id: j for j in active})
    return sorted(seen.values(), key=lambda j: [int(p) for p in j.job_id.split("_")])


# ------------------------------------------------------------------------- helpers


def _checked_ids(job_ids: Sequence[str]) -> list[str]:
    ids = [str(i).strip() for i in job_ids]
    for i in ids:
        if not JOB_ID.fullmatch(i):
            raise QueueError(f"job id: {i!r} is not a Slurm job id (digits, or <array id>_<task>)")
    return ids


def _lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def _split(line: str, count: int, command: str) -> list[str]:
    parts = line.split(DELIMITER)
    if len(parts) < count:
        raise QueueError(f"{command}: expected {count} '{DELIMITER}'-separated fields, got {line!r}")
    return parts


def delimited_records(output: str, count: int, command: str) -> Iterator[list[str]]:
    """Each non-empty line of `command`'s output as `count` fields; extra delimiters belong to the
    last field (free text: a drain reason, a job name)."""
    for line in _lines(output):
        parts = _split(line, count, command)
        yield [*parts[:count - 1], DELIMITER.join(parts[count - 1:])]


def _fields(line: str, count: int, command: str) -> list[str]:
    """Split on the delimiter; extra delimiters belong to the name (the second field)."""
    parts = _split(line, count, command)
    extra = len(parts) - count
    return [parts[0], DELIMITER.join(parts[1:2 + extra]), *parts[2 + extra:]]


def _state(state: str) -> str:
    return state.split()[0].upper() if state.strip() else "UNKNOWN"


def _int(value: str, line: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise QueueError(f"not a node count: {value!r} in {line.strip()[:200]!r}") from None


def _exit_code(value: str, line: str) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"(\d+):(\d+)", value.strip())
    if not m:
        raise QueueError(f"not an exit code <code>:<signal>: {value!r} in {line.strip()[:200]!r}")
    return int(m.group(1)), int(m.group(2))


def _none_empty(value: str) -> str:
    return "" if value in ("(null)", "None", "") else value


def _scontrol_pairs(output: str) -> Iterable[tuple[str, str]]:
    """key=value words; a value runs to the next ` Key=` (JobName and Command may hold spaces)."""
    text = " ".join(output.split("\n"))
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9:/_]*=|\s*$)",
                         text):
        yield m.group(1), m.group(2)
