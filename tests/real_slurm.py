"""One real Slurm per test process (Debian 12's slurm-wlm 22.05 and munge), shared by the real-Slurm modules.

`running_slurm` starts, under a temporary directory and with no system path or init system:
`munged` with its own key, socket, pid, seed and log; `slurmctld -D`; and two `slurmd -D -N node<i>`
on this host (`NodeHostname=localhost`, a port each), both in a partition named like a gpucluster
node group's queue (`GROUP`: `train`), with 8 `gpu` GRES a node (/dev/null under 8 names) so
`--gpus-per-node=8` is allocated as on a p5.48xlarge. Every client command gets `SLURM_CONF`.
Teardown kills each daemon's process group.

The fixture `slurm` is started once per pytest process (session scope; conftest.py registers this
module as a plugin) for tests/test_slurm_real.py, test_slurm_ops_real.py and test_slurm_guard_real.py:
a start is munged, slurmctld and two slurmd reaching IDLE, seconds a module on a busy machine. Its
directory is under /tmp and munged's socket open to every local user, since test_slurm_ops_real's
jobs run as `nobody`. `quiet` is the isolation between tests: after each, no job is left in the
queue and both nodes are IDLE again (resumed where a test set one down or drained it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from base_config import base
from gpucluster.preflight import parse_stack_config
from gpucluster.slurm.batch import BatchJob, SlurmGroup, sbatch_script, slurm_group
from gpucluster.slurm.queue import parse_scontrol_job, parse_squeue, scancel_command, squeue_command

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
MISSING = [b for b in BINARIES if shutil.which(b) is None]
GROUP = {"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 4}
"""An EFA group of 8-GPU nodes; its queue (partition) is `train`."""
START_TIMEOUT = 60.0


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Slurm:
    root: Path
    env: dict[str, str]
    group: SlurmGroup
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=30)
        if check:
            assert done.returncode == 0, (cmd, done.stdout, done.stderr, self.logs())
        return done

    def submit(self, job: BatchJob) -> str:
        path = self.root / f"{job.name}.sbatch"
        path.write_text(sbatch_script(job, self.group))
        return self.run("sbatch", "--parsable", str(path)).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> Any:
        return parse_scontrol_job(self.run("scontrol", "--oneliner", "show", "job", job_id).stdout)

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            for p in self.procs:
                assert p.poll() is None, f"a Slurm daemon exited ({p.args}): {self.logs()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.logs()}"
            time.sleep(0.25)

    def scheduler_cycles(self) -> int:
        """The main scheduler's completed cycles (`sdiag`, "Main schedule statistics")."""
        main = self.run("sdiag").stdout.split("Main schedule statistics", 1)[1].split("Backfilling", 1)[0]
        match = re.search(r"Total cycles:\s*(\d+)", main)
        assert match, main
        return int(match.group(1))

    def wait_scheduled(self, passes: int = 2) -> None:
        """Until the main scheduler has completed `passes` more cycles than now: what a test waits
        for before it asserts that scheduling left a job where it was (a job in a DOWN partition is
        not evaluated again, so its own LastSchedEval does not move). A cycle is counted when it
        ends, so with 2 the second one began after this call."""
        start = self.scheduler_cycles()
        self.wait(f"{passes} scheduling passes", lambda: self.scheduler_cycles() >= start + passes)

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N|%T").stdout
        return dict(line.split("|", 1) for line in out.split())

    def logs(self) -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.log")))


def slurm_conf(root: Path, ports: list[int], munge_socket: Path, partition: str) -> str:
    """Everything under `root`; two nodes on localhost with a port each; no accounting."""
    return f"""\
ClusterName=gpucluster-test
SlurmctldHost=localhost
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=1
MinJobAge=600
JobRequeue=0
KillWait=2
SlurmdTimeout=30
InactiveLimit=0
NodeName=node1 NodeHostname=localhost Port={ports[2]} CPUs=2 Gres=gpu:8 State=UNKNOWN
NodeName=node2 NodeHostname=localhost Port={ports[3]} CPUs=2 Gres=gpu:8 State=UNKNOWN
PartitionName={partition} Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
"""


SETPRIV = shutil.which("setpriv")


def spawn(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A daemon in its own process group; killed with the test process if that dies first (a
    pytest killed by a timeout runs no teardown), where util-linux's setpriv is there to ask it."""
    if SETPRIV is not None:
        cmd = [SETPRIV, "--pdeathsig", "KILL", "--", *cmd]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in reversed(procs):
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


@contextmanager
def running_slurm(root: Path, group: SlurmGroup, *, every_user: bool = False) -> Iterator[Slurm]:
    """munged, slurmctld and two slurmd (node1, node2: 8 "GPUs" each) under `root`, stopped on exit.

    `every_user`: munged's socket reachable by any local user, so jobs can run as `nobody`
    (test_slurm_ops_real); otherwise only root talks to it.
    """
    for d in ("state", "spool/node1", "spool/node2", "munge", "out", "dev"):
        (root / d).mkdir(parents=True)
    (root / "munge").chmod(0o755 if every_user else 0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = root / "munge" / "munge.socket"
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, free_ports(4), munge_socket, group.queue))
    # 8 "GPUs" a node: slurmd wants character devices (a Count-only gpu line registers none in
    # 22.05), so /dev/null under 8 names; nothing here opens them (task/none constrains nothing).
    for i in range(8):
        (root / "dev" / f"nvidia{i}").symlink_to("/dev/null")
    (root / "gres.conf").write_text(f"NodeName=node[1-2] Name=gpu File={root}/dev/nvidia[0-7]\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Slurm(root, env, group)
    try:
        cluster.procs.append(spawn(["munged", "--foreground", "--force", f"--key-file={key}",
                                    f"--socket={munge_socket}", f"--pid-file={root / 'munge' / 'munged.pid'}",
                                    f"--seed-file={root / 'munge' / 'munged.seed'}",
                                    f"--log-file={root / 'munged.log'}"], root / "munged.out.log", env))
        cluster.wait("munged's socket", munge_socket.exists, timeout=10)
        if every_user:
            munge_socket.chmod(0o777)
        cluster.procs.append(spawn(["slurmctld", "-D", "-i", "-f", str(conf)], root / "slurmctld.out.log",
                                   env))
        for node in ("node1", "node2"):
            cluster.procs.append(spawn(["slurmd", "-D", "-N", node, "-f", str(conf)],
                                       root / f"slurmd-{node}.out.log", env))

        def idle() -> bool:
            done = cluster.run("sinfo", "--noheader", "--Node", "--format=%N|%T", check=False)
            return done.returncode == 0 and sorted(done.stdout.split()) == ["node1|idle", "node2|idle"]

        cluster.wait("both nodes idle", idle, timeout=START_TIMEOUT)
        yield cluster
    finally:
        stop(cluster.procs)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Slurm]:
    """The process's cluster (see the module's docstring); skipped where the binaries or root are missing."""
    if MISSING:
        pytest.skip(f"Slurm/munge binaries missing ({', '.join(MISSING)})")
    if os.geteuid() != 0:
        pytest.skip("the test Slurm runs its daemons as root")
    root = Path(tempfile.mkdtemp(prefix="gpucluster-slurm-", dir="/tmp"))
    root.chmod(0o755)
    (root / "work").mkdir()
    (root / "work").chmod(0o777)  # test_slurm_ops_real's jobs (as nobody) write their output here
    spec = parse_stack_config({**base(), "gpucluster:node_groups": [GROUP]}, stack="t")
    group = slurm_group(spec.node_groups[0], stack=spec.identity, cluster=spec.cluster.name,
                        region=spec.region, spot=spec.spot)
    try:
        with running_slurm(root, group, every_user=True) as cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def quiet(slurm: Slurm) -> Iterator[Slurm]:
    """The cluster, left with no job and both nodes up after the test, whatever it did."""
    yield slurm
    ids = [j.job_id for j in parse_squeue(slurm.run(*squeue_command()).stdout)]
    if ids:
        slurm.run(*scancel_command(ids))
    for node, state in slurm.node_states().items():
        if state != "idle":
            slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    slurm.wait("the queue to empty", lambda: not slurm.run(*squeue_command()).stdout.strip())
    slurm.wait("both nodes idle", lambda: set(slurm.node_states().values()) == {"idle"})
