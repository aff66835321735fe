"""The shell a Slurm stack's day-2 commands run on its login node (and a job's batch host), and
what those commands print, parsed.

Every script here is plain text, sent through SSM Run Command (AWS-RunShellScript) as one line
that carries it base64-encoded (`remote_command`): the document's shell decodes and runs it with
bash, so nothing a user typed (a command, a job name) is ever interpolated into the shell line SSM
runs, and the same text is what the tests run against a real Slurm. A batch script travels the
same way, base64 inside the submit script, and reaches `sbatch` as a file byte for byte.

Who runs a job. SSM runs as root; Slurm runs a job under the submitter's uid on every node of the
allocation, so that uid must name the same user on the login and the compute nodes. gpucluster
submits as the AMI's default user, uid 1000 (`ec2-user` on Amazon Linux, RHEL and Rocky, `ubuntu`
on Ubuntu: the first user cloud-init creates, ledger: ami-default-user-uid: the cloud-init defaults
of those images), which every node of one AMI family has with that uid, through `runuser -u` (root
only, util-linux). Not `sbatch --uid`: it is for root only and sbatch drops to the user only "after
node allocation is successful" (sbatch(1), 22.05), and later Slurm releases removed it
(ledger: sbatch-uid-removed); `runuser` makes every step, submission included, the user's own.

Pure: builds and parses text, never calls AWS. Options used exist in Slurm 22.05 and 24.11 alike.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
import shlex
from dataclasses import dataclass
from datetime import datetime

from gpucluster.slurm.queue import (
    DELIMITER,
    JOB_ID,
    QueueError,
    SlurmJob,
    delimited_records,
    merged,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue,
    sacct_command,
    shell,
    squeue_command,
)

JOB_UID = 1000
"""The uid jobs run as: the AMI's default user (ec2-user / ubuntu), the same on every node."""

SECTION = "==gpucluster:"
"""Starts a line that names the section of a multi-command script's output that follows."""

REMOTE_PREFIX = 'bash -c "$(echo '
REMOTE_SUFFIX = ' | base64 -d)" gpucluster'
_REMOTE = re.compile(re.escape(REMOTE_PREFIX) + r"([A-Za-z0-9+/=]+)" + re.escape(REMOTE_SUFFIX))

SINFO_FIELDS = ("%N", "%R", "%T", "%o", "%n", "%E")
"""Node name, partition (without sinfo's '*' for the default), state (long), address, hostname,
reason (sinfo man page, `--format`)."""


SLURM_PATH = ('for d in /opt/aws/pcs/scheduler/slurm-*/bin /opt/slurm/bin; do '
              'if [ -d "$d" ]; then PATH="$PATH:$d"; fi; done; export PATH')
"""First line of every script: SSM's shell is not a login shell, so the profile that puts Slurm on
PATH has not run; AWS's PCS Slurm installer puts it under /opt/aws/pcs/scheduler/slurm-<version>
("Software installers to build custom AMIs for AWS PCS", https://docs.aws.amazon.com/pcs/latest/
userguide/working-with_ami_installers.html), /opt/slurm is ParallelCluster's. Appended, so a Slurm
already on PATH (a distribution's, as in the tests) comes first."""


class RemoteError(ValueError):
    """Output that is not what the script prints (named), or a script that cannot be built."""


def remote_command(script: str) -> str:
    """The one AWS-RunShellScript line that runs `script` under bash: base64, decoded on the node.

    `$(...)` inside double quotes is not split or expanded again, so the decoded text reaches
    bash as one argument whatever it holds; base64's alphabet needs no quoting.
    """
    encoded = base64.b64encode(script.encode()).decode()
    return f"{REMOTE_PREFIX}{encoded}{REMOTE_SUFFIX}"


def decoded(command: str) -> str:
    """The script a `remote_command` line carries (for dry runs and tests)."""
    found = _REMOTE.fullmatch(command)
    if not found:
        raise RemoteError(f"not a gpucluster remote command: {command[:80]!r}")
    try:
        return base64.b64decode(found.group(1), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as err:
        raise RemoteError(f"remote command: not base64 text ({err})") from None


def _as_job_user(uid: int) -> list[str]:
    """Lines that set `user` and `home` to the user of `uid`, or exit 3 saying there is none."""
    return [f"uid={int(uid)}",
            'user=$(getent passwd "$uid" | cut -d: -f1)',
            'home=$(getent passwd "$uid" | cut -d: -f6)',
            'if [ -z "$user" ]; then',
            '  echo "gpucluster: no user with uid $uid on this node to run Slurm jobs as" >&2',
            "  exit 3",
            "fi"]


def submit_script(batch_script: str, *, uid: int = JOB_UID) -> str:
    """Write `batch_script` to a private file, `sbatch --parsable` it as the job user; prints the id.

    sbatch reads the script at submission (the controller keeps its copy), so the file goes when
    the shell ends. The job starts in the user's home unless the script sets --chdir.
    """
    encoded = base64.b64encode(batch_script.encode()).decode()
    return "\n".join([
        "set -eu",
        SLURM_PATH,
        *_as_job_user(uid),
        "script=$(mktemp /tmp/gpucluster-job.XXXXXXXX)",
        "trap 'rm -f \"$script\"' EXIT",
        f"echo {encoded} | base64 -d > \"$script\"",
        'chown "$user" "$script"',
        'cd "$home" 2>/dev/null || cd /tmp',
        'sbatch=$(command -v sbatch)',
        'runuser -u "$user" -- "$sbatch" --parsable "$script"',
        ""])


def parse_submitted(output: str) -> str:
    """The job id `sbatch --parsable` printed (`<id>` or `<id>;<cluster>`)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    job_id = lines[-1].split(";")[0] if lines else ""
    if not JOB_ID.fullmatch(job_id):
        raise RemoteError(f"sbatch: expected a job id, got {output.strip()[:200]!r}")
    return job_id


def _section(name: str) -> str:
    return f"echo {shlex.quote(SECTION + name)}"


def sections(output: str) -> dict[str, str]:
    """A script's output split at its section lines: section name -> the text after it."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        if line.startswith(SECTION):
            current = found.setdefault(line[len(SECTION):].strip(), [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in found.items()}


def jobs_script(*, partition: str | None, accounting: bool, since: str | None) -> str:
    """squeue (pending, running), then finished jobs: sacct from `since` with accounting, else
    `scontrol show job` (what the controller still holds, MinJobAge)."""
    lines = ["set -u", SLURM_PATH, _section("squeue"), shell(squeue_command(partition=partition))]
    if accounting:
        lines += [_section("sacct"), shell(sacct_command(partition=partition, start=since))]
    else:
        lines += [_section("scontrol"), "scontrol --oneliner show job || true"]
    return "\n".join([*lines, ""])


def parse_jobs(output: str, *, partition: str | None = None) -> list[SlurmJob]:
    """One record a job from `jobs_script`'s output, squeue's when it has the job."""
    parts = sections(output)
    if "squeue" not in parts:
        raise RemoteError(f"jobs: no squeue section in {output.strip()[:200]!r}")
    active = parse_squeue(parts["squeue"])
    finished: list[SlurmJob] = []
    if "sacct" in parts:
        finished = parse_sacct(parts["sacct"])
    for line in parts.get("scontrol", "").splitlines():
        if line.strip().startswith("JobId="):
            job = parse_scontrol_job(line)
            if partition is None or job.partition == partition:
                finished.append(job)
    return merged(active, finished)


@dataclass(frozen=True)
class JobPlace:
    """Where a job's output is: the batch host's address and the file (scontrol show job)."""

    job: SlurmJob
    stdout: str
    batch_host: str
    node_addr: str
    node_hostname: str


def locate_script(job_id: str) -> str:
    """The job's record, then its batch host's (for the address the output file is on)."""
    checked = _job_id(job_id)
    return "\n".join([
        "set -u",
        SLURM_PATH,
        _section("job"),
        f"scontrol --oneliner show job {checked}",
        'host=$(scontrol --oneliner show job ' + checked + " | tr ' ' '\\n' | sed -n 's/^BatchHost=//p')",
        _section("node"),
        'if [ -n "$host" ]; then scontrol --oneliner show node "$host"; fi',
        ""])


def parse_locate(output: str) -> JobPlace:
    parts = sections(output)
    text = parts.get("job", "").strip()
    if not text.startswith("JobId="):
        raise RemoteError(f"scontrol show job: {text[:200] or 'no output'}")
    fields = _pairs(text)
    node = _pairs(parts.get("node", ""))
    return JobPlace(job=parse_scontrol_job(text), stdout=fields.get("StdOut", ""),
                    batch_host=fields.get("BatchHost", ""), node_addr=node.get("NodeAddr", ""),
                    node_hostname=node.get("NodeHostName", ""))


CHUNK_BYTES = 20000
"""What one read of a followed file takes at most: SSM returns the first 24,000 characters of a
command's output (API reference, GetCommandInvocation StandardOutputContent), and a UTF-8
character is at least one byte, so a chunk always arrives whole."""


def _chunk(offset: int, *, remove_when_read: bool = False) -> list[str]:
    """Lines printing `$f`'s size, then up to CHUNK_BYTES from byte `offset` with their count first;
    with `remove_when_read`, the file goes once this read reaches its end."""
    lines = [_section("size"),
             'size=$(stat -c %s -- "$f")',
             'echo "$size"',
             "chunk=$(mktemp)",
             "trap 'rm -f \"$chunk\"' EXIT",
             f'tail -c +{int(offset) + 1} -- "$f" | head -c {CHUNK_BYTES} > "$chunk"',
             _section("read"),
             'read=$(stat -c %s -- "$chunk")',
             'echo "$read"']
    if remove_when_read:
        lines.append(f'if [ $(({int(offset)} + read)) -ge "$size" ]; then rm -f -- "$f"; fi')
    return [*lines, _section("output"), 'cat -- "$chunk"']


def tail_script(path: str, *, lines: int | None = None, offset: int | None = None,
                remove_when_read: bool = False) -> str:
    """The file's size, then its last `lines`, or (following, paging) up to CHUNK_BYTES from byte
    `offset` with the count of bytes read first, so the next read starts where this one ended.

    Exit 4 when the file is not there (the job has not started, or wrote elsewhere).
    """
    head = [
        "set -eu",
        SLURM_PATH,
        f"f={shlex.quote(path)}",
        'if [ ! -e "$f" ]; then echo "gpucluster: no file $f on $(hostname)" >&2; exit 4; fi']
    if lines is not None:
        return "\n".join([*head, _section("size"), 'stat -c %s -- "$f"', _section("output"),
                          f'tail -n {int(lines)} -- "$f"', ""])
    return "\n".join([*head, *_chunk(offset or 0, remove_when_read=remove_when_read), ""])


CAPTURE = re.compile(r"/tmp/gpucluster-out\.[A-Za-z0-9]{8}")
"""Where `captured_script` keeps a command's whole output until it has been read."""


def captured_script(script: str) -> str:
    """`script` with its stdout kept in a file on the node: its path and exit status, then the
    first CHUNK_BYTES (as `tail_script` pages). What does not fit in one SSM answer is read with
    `tail_script(path, offset=..., remove_when_read=True)`; the file goes with the last read. The
    script's stderr and exit status stay the command's own."""
    encoded = base64.b64encode(script.encode()).decode()
    return "\n".join([
        "set -u",
        "f=$(mktemp /tmp/gpucluster-out.XXXXXXXX)",
        f'bash -c "$(echo {encoded} | base64 -d)" gpucluster > "$f"',
        "rc=$?",
        _section("capture"),
        'echo "$f"',
        _section("rc"),
        'echo "$rc"',
        *_chunk(0, remove_when_read=True),
        'exit "$rc"',
        ""])


@dataclass(frozen=True)
class Page:
    """The first page of a captured command's output."""

    path: str
    rc: int
    size: int
    read: int
    text: str


def parse_captured(output: str) -> Page:
    head = output.partition(SECTION + "output\n")[0]
    parts = sections(head)
    path = parts.get("capture", "").strip()
    tail = parse_tail(output)
    if not CAPTURE.fullmatch(path) or tail.read is None or not parts.get("rc", "").strip().isdigit():
        raise RemoteError(f"captured output: no file, status or size in {output.strip()[:200]!r}")
    return Page(path, int(parts["rc"]), tail.size, tail.read, tail.text)


@dataclass(frozen=True)
class Tail:
    size: int
    """The file's size in bytes when read."""
    text: str
    read: int | None = None
    """Following: the bytes this read took (the next starts after them)."""


def parse_tail(output: str) -> Tail:
    """What `tail_script` printed; the file's own lines are never parsed."""
    head, marker, text = output.partition(SECTION + "output\n")
    parts = sections(head)
    try:
        size = int(parts.get("size", "").strip())
        read = int(parts["read"].strip()) if "read" in parts else None
    except ValueError:
        raise RemoteError(f"tail: no file size in {output.strip()[:200]!r}") from None
    return Tail(size, text if marker else "", read)


def cancel_script(job_id: str) -> str:
    """The job before, scancel (verbose: 22.05's scancel exits 0 and says nothing for a job id it
    does not know unless asked to tell), its exit status, the job after."""
    checked = _job_id(job_id)
    show = f"scontrol --oneliner show job {checked} 2>&1 || true"
    return "\n".join([
        "set -u",
        SLURM_PATH,
        _section("before"),
        show,
        _section("scancel"),
        f"{shell(['scancel', '--verbose', checked])} 2>&1",
        'echo "exit=$?"',
        _section("job"),
        show,
        ""])


@dataclass(frozen=True)
class CancelAnswer:
    exit_status: int
    message: str
    """scancel's error lines (empty when it reported none)."""
    before: SlurmJob | None
    """The job when asked to cancel it (None: the controller does not know it)."""
    job: SlurmJob | None
    """The job after the cancel (None: the controller no longer has it)."""


def parse_cancel(output: str) -> CancelAnswer:
    parts = sections(output)
    scancel = parts.get("scancel", "").splitlines()
    status = next((line[5:] for line in scancel if line.startswith("exit=")), None)
    if status is None or not status.isdigit():
        raise RemoteError(f"scancel: no exit status in {output.strip()[:200]!r}")
    message = " ".join(line.strip() for line in scancel if "error" in line.lower())

    def job(name: str) -> SlurmJob | None:
        text = parts.get(name, "").strip()
        return parse_scontrol_job(text) if text.startswith("JobId=") else None

    return CancelAnswer(int(status), message, job("before"), job("job"))


def nodes_script(*, accounting: bool = False) -> str:
    """sinfo, a line a node and partition, delimited; then Slurm's own record of each node's boot:
    `scontrol show node` (BootTime, SlurmdStartTime: when slurmd started and registered) and, with
    accounting, the start and nodes of the jobs of the last 14 days (sacct), for its first job."""
    lines = ["set -eu", SLURM_PATH, shell(["sinfo", "--noheader", "--Node",
                                           "--format=" + DELIMITER.join(SINFO_FIELDS)]),
             _section("scontrol"), "scontrol --oneliner show node || true"]
    if accounting:
        lines += [_section("sacct"), shell(["sacct", "--allusers", "--noheader", "--parsable2",
                                            "--allocations",
                                            f"--starttime=now-{BOOT_RECORD_DAYS}days",
                                            "--format=Start,NodeList"]) + " || true"]
    return "\n".join([*lines, ""])


BOOT_RECORD_DAYS = 14


@dataclass(frozen=True)
class NodeBoot:
    """A Slurm node's boot as Slurm recorded it, in seconds after the node booted (BootTime)."""

    registered_seconds: float | None
    """SlurmdStartTime - BootTime: when slurmd started and registered with the controller."""
    first_job_seconds: float | None
    """The first job to start on it since slurmd started (sacct; None without accounting or a job)."""
    booted: datetime | None = None
    """BootTime (the controller's local time, no zone)."""


def _slurm_time(value: str | None) -> datetime | None:
    """Slurm's `2026-11-29T06:02:31` (the controller's local time, like every other); None for
    None/Unknown/empty."""
    try:
        return datetime.strptime((value or "").strip(), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None


def expand_hostlist(hostlist: str) -> list[str]:
    """`gpu-[1-3,05],login-1` -> gpu-1, gpu-2, gpu-3, gpu-05, login-1 (one bracket a name: the form
    Slurm prints for one compute node group's nodes); anything else unchanged."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", hostlist.strip()):
        found = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", part)
        if found is None:
            names.append(part)
            continue
        head, ranges, tail = found.groups()
        for piece in ranges.split(","):
            lo, _, hi = piece.partition("-")
            if not hi:
                names.append(f"{head}{lo}{tail}")
            elif lo.isdigit() and hi.isdigit():
                names += [f"{head}{str(i).zfill(len(lo))}{tail}" for i in range(int(lo), int(hi) + 1)]
    return names


def parse_node_boots(output: str) -> dict[str, NodeBoot]:
    """Node name -> its boot as Slurm recorded it, from `nodes_script`'s scontrol and sacct sections."""
    parts = sections(output)
    starts: dict[str, list[datetime]] = {}
    for line in parts.get("sacct", "").splitlines():
        start, _, nodelist = line.partition(DELIMITER)
        when = _slurm_time(start)
        if when is None or not nodelist.strip() or nodelist.strip() == "None assigned":
            continue
        for host in expand_hostlist(nodelist):
            starts.setdefault(host, []).append(when)
    found: dict[str, NodeBoot] = {}
    for line in parts.get("scontrol", "").splitlines():
        pairs = _pairs(line)
        name = pairs.get("NodeName", "")
        if not name:
            continue
        booted, slurmd = _slurm_time(pairs.get("BootTime")), _slurm_time(pairs.get("SlurmdStartTime"))
        registered = (slurmd - booted).total_seconds() if booted and slurmd and slurmd >= booted else None
        first = min((t for t in starts.get(name, []) if slurmd is not None and t >= slurmd), default=None)
        found[name] = NodeBoot(registered, (first - booted).total_seconds() if first and booted else None,
                               booted)
    return found


@dataclass(frozen=True)
class SlurmNode:
    """One Slurm node as sinfo shows it (a node in two partitions is one record, both named)."""

    name: str
    partitions: tuple[str, ...]
    state: str
    """sinfo's long state: idle, allocated, mixed, drained, down, idle~ (powered down), ..."""
    address: str
    hostname: str
    reason: str

    @property
    def private_ip(self) -> str | None:
        """The node's IPv4 address: its NodeAddr, or a hostname like ip-10-0-1-5 (EC2's)."""
        for value in (self.address, self.hostname):
            if re.fullmatch(r"\d{1,3}(?:\.\d{1,3}){3}", value):
                return value
            found = re.match(r"ip-(\d{1,3})-(\d{1,3})-(\d{1,3})-(\d{1,3})(?:\.|$)", value)
            if found:
                return ".".join(found.groups())
        return None


def parse_sinfo(output: str) -> list[SlurmNode]:
    """Records from `nodes_script`'s output (its sinfo lines, before the first section), one a node."""
    found: dict[str, SlurmNode] = {}
    head = "\n".join(itertools.takewhile(lambda line: not line.startswith(SECTION), output.splitlines()))
    try:
        records = list(delimited_records(head, len(SINFO_FIELDS), "sinfo"))
    except QueueError as err:
        raise RemoteError(str(err)) from None
    for name, partition, state, address, hostname, reason in records:
        before = found.get(name)
        partitions = (*before.partitions, partition) if before else (partition,)
        found[name] = SlurmNode(name, partitions, state, address, hostname,
                                "" if reason == "none" else reason)
    return sorted(found.values(), key=lambda n: _natural(n.name))


def _natural(name: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _job_id(job_id: str) -> str:
    value = str(job_id).strip()
    if not JOB_ID.fullmatch(value):
        raise QueueError(f"job id: {value!r} is not a Slurm job id (digits, or <array id>_<task>)")
    return value


def _pairs(text: str) -> dict[str, str]:
    """scontrol's key=value words; a value runs to the next ` Key=` (names may hold spaces)."""
    flat = " ".join(text.split("\n"))
    return {m.group(1): m.group(2) for m in re.finditer(
        r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9:/_]*=|\s*$)", flat)}
