"""The batch scripts gpucluster generates, run by a real Slurm (Debian 12's slurm-wlm 22.05 and munge).

The cluster is tests/real_slurm.py's (`slurm`, one per test process, shared with the ops and guard
modules; `quiet` leaves it empty and both nodes idle after each test): munged, slurmctld and two
slurmd on this host, in a partition named like a gpucluster node group's queue, 8 `gpu` GRES a node.
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

import pytest

from gpucluster.slurm.batch import BatchJob
from gpucluster.slurm.queue import parse_squeue, scancel_command, squeue_command
from real_slurm import MISSING, Slurm

pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm/munge binaries missing ({', '.join(MISSING)}): "
                       "apt-get install -y slurm-wlm munge (.ci/run installs them)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs its daemons as root "
                       "(SlurmUser/SlurmdUser root); run as root, as CI does"),
]


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
    # Running long enough for node2 to go down under it the first time; the second run ends at once.
    command = f'echo "rank $NODE_RANK" >> {marker}; sleep $(( ${{SLURM_RESTART_COUNT:-0}} ? 0 : 3 ))'
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
    slurm.wait_scheduled()  # a few scheduling passes: one node up is not enough for it
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
