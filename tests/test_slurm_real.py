"""The batch scripts gpucluster generates, run by a real Slurm (Debian 12's slurm-wlm 22.05 and munge).

A module fixture starts, under a temporary directory and with no system path or init system:
`munged` with its own key, socket, pid, seed and log; `slurmctld -D`; and two `slurmd -D -N node<i>`
on this host (`NodeHostname=localhost`, a port each), both in a partition named like a gpucluster
node group's queue, with 8 `gpu` GRES a node (/dev/null under 8 names) so `--gpus-per-node=8` is
allocated as on a p5.48xlarge. Every client command gets `SLURM_CONF`. Teardown kills each
daemon's process group.
The tests run as root (SlurmUser/SlurmdUser root); they skip with the reason when not root or when
the binaries are missing (`.ci/run` installs slurm-wlm and munge, so CI runs them).

No accounting: Debian's 22.05 has no `accounting_storage/filetxt` (removed in 20.11) and
slurmdbd needs MySQL/MariaDB, so `sacct` is not exercised here; finished jobs are read with
`scontrol show job --oneliner` (kept `MinJobAge` seconds) and `gpucluster.slurm.queue.parse_sacct`
is tested on sacct's documented `--parsable2` output in tests/test_slurm_batch.py. AWS PCS has
accounting as a cluster option (slurmdbd managed by AWS).

22.05 vs 24.11 (AWS PCS runs 24.11+): the scripts use only options both have (`--gpus-per-node`,
`--exclusive`, `--requeue`, `--time`, `--output` patterns, `scontrol show hostnames`, `srun
--kill-on-bad-exit`). What this Slurm showed, to check again on 24.11 before relying on it:
- a count-only `gpu` line in gres.conf registers no GPUs in 22.05 (the node is drained "gres/gpu
  count reported lower than configured"): the fixture names 8 character devices instead;
- a requeued batch job waits about two minutes before it is eligible again (EligibleTime, reason
  BeginTime): the test sets `starttime=now` instead of waiting;
- `ReturnToService=2` returns even an operator's DOWN node to service as soon as its slurmd
  answers (so "set down" would not hold): the fixture uses 1, which keeps it down until resumed,
  and RESUME of a node that is already IDLE is refused ("Invalid node state specified");
- no `accounting_storage/filetxt` (see above); PCS has slurmdbd accounting as a cluster option;
- srun reads `SLURM_CPUS_PER_TASK` again from 23.11 on (22.05 does not; Slurm's release notes);
  the scripts set no cpus-per-task.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
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
pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm/munge binaries missing ({', '.join(MISSING)}): "
                       "apt-get install -y slurm-wlm munge (.ci/run installs them)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs its daemons as root "
                       "(SlurmUser/SlurmdUser root); run as root, as CI does"),
]

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


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o755)
    spec = parse_stack_config({**base(), "gpucluster:node_groups": [GROUP]}, stack="t")
    group = slurm_group(spec.node_groups[0], stack=spec.identity, cluster=spec.cluster.name,
                        region=spec.region, spot=spec.spot)
    with running_slurm(root, group) as cluster:
        yield cluster


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


def output_of(slurm: Slurm, job_id: str) -> str:
    return next((slurm.root / "out").glob(f"*-{job_id}.out")).read_text()


RANK_REPORT = ('echo "rank $NODE_RANK host $(hostname) MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT '
               'NNODES=$NNODES NPROC_PER_NODE=$NPROC_PER_NODE WORLD_SIZE=$WORLD_SIZE '
               'FI_PROVIDER=$FI_PROVIDER FI_EFA_USE_DEVICE_RDMA=$FI_EFA_USE_DEVICE_RDMA '
               'NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME SLURM_NODENAME=$SLURMD_NODENAME"')


def test_a_two_node_job_gives_every_task_its_rank_and_the_shared_rendezvous(quiet: Slurm) -> None:
    slurm = quiet
    job_id = slurm.submit(BatchJob(name="ranks", command=RANK_REPORT, nodes=2, master_port=29511,
                                   output=f"{slurm.root}/out/%x-%j.out"))
    slurm.wait("the job to finish", lambda: not slurm.job(job_id).active)
    job = slurm.job(job_id)
    assert (job.state, job.exit_code, job.nodes, job.partition) == ("COMPLETED", 0, 2, "train")
    lines = sorted(line for line in output_of(slurm, job_id).splitlines() if line.startswith("rank "))
    assert len(lines) == 2, output_of(slurm, job_id)
    ranks = [dict(w.split("=", 1) for w in line.split() if "=" in w) for line in lines]
    assert [line.split()[1] for line in lines] == ["0", "1"]
    assert [r["SLURM_NODENAME"] for r in ranks] == ["node1", "node2"]  # rank 0 on the first host
    for r in ranks:
        assert r["MASTER_ADDR"] == "node1"  # the allocation's first host, the same for both
        assert (r["MASTER_PORT"], r["NNODES"], r["NPROC_PER_NODE"], r["WORLD_SIZE"]) == \
            ("29511", "2", "8", "16")
        assert (r["FI_PROVIDER"], r["FI_EFA_USE_DEVICE_RDMA"], r["NCCL_SOCKET_IFNAME"]) == \
            ("efa", "1", "^docker,lo,veth")


def test_a_requeue_job_goes_back_to_the_queue_when_a_node_goes_down_and_finishes_after(quiet: Slurm) -> None:
    slurm = quiet
    marker = slurm.root / "out" / "runs"
    command = f'echo "rank $NODE_RANK" >> {marker}; sleep 3'
    job_id = slurm.submit(BatchJob(name="requeue", command=command, nodes=2, restart_on_replace=True,
                                   output=f"{slurm.root}/out/%x-%j.out"))
    slurm.wait("the job to run", lambda: slurm.job(job_id).state == "RUNNING")
    slurm.run("scontrol", "update", "nodename=node2", "state=down", "reason=test")
    slurm.wait("the job to be requeued", lambda: slurm.job(job_id).state in ("PENDING", "REQUEUED"))
    shown = slurm.run("scontrol", "--oneliner", "show", "job", job_id).stdout
    assert re.search(r"\bRestarts=1\b", shown), shown
    # Slurm holds a requeued batch job back about two minutes (EligibleTime; reason BeginTime) so
    # its nodes can clean up; seen in 22.05. The test makes it eligible now rather than wait.
    assert slurm.job(job_id).reason == "BeginTime", shown
    assert slurm.node_states()["node2"] == "down"  # an operator's DOWN stays down (ReturnToService=1)
    slurm.run("scontrol", "update", f"jobid={job_id}", "starttime=now")
    time.sleep(2)  # a few scheduling passes (sched_interval=1): one node up is not enough for it
    assert slurm.job(job_id).state == "PENDING"
    slurm.run("scontrol", "update", "nodename=node2", "state=resume")
    slurm.wait("the requeued job to finish", lambda: not slurm.job(job_id).active)
    job = slurm.job(job_id)
    assert (job.state, job.exit_code, job.node_list) == ("COMPLETED", 0, "node[1-2]")
    runs = marker.read_text().splitlines()
    assert sorted(runs[-2:]) == ["rank 0", "rank 1"], runs  # the second run had both ranks


def test_jobs_are_read_from_real_squeue_and_cancelled_with_the_built_scancel(quiet: Slurm) -> None:
    slurm = quiet
    running = slurm.submit(BatchJob(name="long", command="sleep 60", nodes=2,
                                    output=f"{slurm.root}/out/%x-%j.out"))
    slurm.wait("the job to run", lambda: slurm.job(running).state == "RUNNING")
    waiting = slurm.submit(BatchJob(name="next", command="true", nodes=1,
                                    output=f"{slurm.root}/out/%x-%j.out"))
    slurm.wait("the second job to be queued", lambda: slurm.job(waiting).state == "PENDING")
    jobs = {j.job_id: j for j in parse_squeue(slurm.run(*squeue_command(partition="train")).stdout)}
    assert (jobs[running].name, jobs[running].state, jobs[running].nodes, jobs[running].node_list,
            jobs[running].partition) == ("long", "RUNNING", 2, "node[1-2]", "train")
    assert (jobs[waiting].name, jobs[waiting].state, jobs[waiting].nodes) == ("next", "PENDING", 1)
    assert jobs[waiting].reason in ("Resources", "Priority")
    slurm.run(*scancel_command([running]))
    slurm.wait("the cancelled job to end", lambda: not slurm.job(running).active)
    assert slurm.job(running).state == "CANCELLED"
    slurm.wait("the next job to finish", lambda: not slurm.job(waiting).active)
    assert (slurm.job(waiting).state, slurm.job(waiting).exit_code) == ("COMPLETED", 0)
    assert [j.job_id for j in parse_squeue(slurm.run(*squeue_command(job_ids=[running])).stdout)] == []
