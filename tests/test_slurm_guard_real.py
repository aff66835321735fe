"""The guardrails' Slurm commands, run as sent, against a real Slurm (tests/real_slurm.py's cluster: 22.05).

The scripts the Lambdas send to the login node (`lambdas.slurmhold`: hold before a stop, release
after a start, requeue on a spot warning) run here under bash with the real scontrol/squeue/
scancel; the node's health check (`node/health-check.sh`, Slurm mode) runs with fake GPU tools and
the real scontrol, and drains the fixture's node. Each test leaves the cluster quiet (`quiet`).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fake_node import logged_calls, run_script, write_stubs
from gpucluster.fleet.slurmhold import (
    REQUEUE_REFUSED_EXIT,
    hold_script,
    release_script,
    requeue_node_script,
)
from real_slurm import Slurm
from test_slurm_real import pytestmark  # noqa: F401  (skip marks)

PARTITION = "train"  # real_slurm's GROUP


def submit(cl: Slurm, name: str, body: str, *options: str) -> str:
    """A batch script of our own (a trap in the script itself), two nodes, output under the fixture."""
    path = cl.root / f"{name}.sbatch"
    path.write_text(
        "#!/bin/bash\n"
        + "".join(f"#SBATCH {o}\n" for o in options)
        + f"#SBATCH --job-name={name}\n#SBATCH --partition={PARTITION}\n"
        f"#SBATCH --output={cl.root}/out/%x-%j.out\n" + body + "\n"
    )
    return cl.run("sbatch", "--parsable", str(path)).stdout.strip().split(";")[0]


def bash(cl: Slurm, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=cl.env, capture_output=True, text=True, timeout=60)


def partition_state(cl: Slurm) -> str:
    shown = cl.run("scontrol", "--oneliner", "show", "partition", PARTITION).stdout
    match = re.search(r"\bState=(\S+)", shown)
    assert match, shown
    return match.group(1)


@pytest.fixture
def held(quiet: Slurm):
    """The cluster; the partition UP again afterwards whatever the test did."""
    yield quiet
    quiet.run("scontrol", "update", f"PartitionName={PARTITION}", "State=UP")


def test_a_held_partition_keeps_a_submitted_job_pending_and_release_starts_it(held: Slurm) -> None:
    cl = held
    done = bash(cl, hold_script([PARTITION], grace_seconds=0))
    assert done.returncode == 0 and "no running job" in done.stdout, done
    assert partition_state(cl) == "DOWN"
    job = submit(cl, "waits", "true", "--nodes=1")  # DOWN still takes submissions
    cl.wait_scheduled()  # several scheduling passes
    assert (cl.job(job).state, cl.job(job).reason) == ("PENDING", "PartitionDown")
    assert bash(cl, release_script([PARTITION])).returncode == 0
    assert partition_state(cl) == "UP"
    cl.wait("the released job to finish", lambda: not cl.job(job).active)
    assert (cl.job(job).state, cl.job(job).exit_code) == ("COMPLETED", 0)


def test_the_hold_signals_a_running_job_then_requeues_it_and_the_start_runs_it_again(held: Slurm) -> None:
    cl = held
    marker = cl.root / "out" / "checkpoints"
    marker.unlink(missing_ok=True)
    body = (
        f"trap 'echo \"USR1 $SLURM_JOB_ID restart $SLURM_RESTART_COUNT\" >> {marker}' USR1\n"
        f'echo "run ${{SLURM_RESTART_COUNT:-0}}" >> {marker}\n'
        # Running long enough to be held the first time; the run after the requeue ends at once.
        "for i in $(seq 1 $(( ${SLURM_RESTART_COUNT:-0} ? 1 : 40 ))); do sleep 0.25; done"
    )
    job = submit(cl, "ckpt", body, "--nodes=2", "--requeue")
    cl.wait("the job to run", lambda: cl.job(job).state == "RUNNING")
    cl.wait("the script to start", lambda: marker.exists())
    done = bash(cl, hold_script([PARTITION], grace_seconds=2))
    assert done.returncode == 0, done
    assert f"requeued {job}" in done.stdout
    assert f"USR1 {job} restart" in marker.read_text()  # the batch script got the checkpoint signal
    cl.wait("the job to be requeued", lambda: cl.job(job).state in ("PENDING", "REQUEUED"))
    shown = cl.run("scontrol", "--oneliner", "show", "job", job).stdout
    assert re.search(r"\bRestarts=1\b", shown), shown
    # A retried hold (Lambda's retry) signals nothing again: the job is no longer running.
    again = bash(cl, hold_script([PARTITION], grace_seconds=0))
    assert again.returncode == 0 and "no running job" in again.stdout
    assert marker.read_text().count("USR1") == 1
    cl.run("scontrol", "update", f"jobid={job}", "starttime=now")  # 22.05's requeue delay (BeginTime)
    cl.wait_scheduled()
    assert cl.job(job).state == "PENDING"  # held by the DOWN partition
    assert bash(cl, release_script([PARTITION])).returncode == 0
    cl.wait("the requeued job to finish", lambda: not cl.job(job).active, timeout=40)
    assert (cl.job(job).state, cl.job(job).exit_code) == ("COMPLETED", 0)
    assert "run 1" in marker.read_text()


def test_a_hold_sent_twice_at_once_signals_each_job_once_and_both_say_requeued(held: Slurm) -> None:
    """A SendCommand retried after it landed, or two stops at once: two holds run together."""
    cl = held
    marker = cl.root / "out" / "twice"
    marker.unlink(missing_ok=True)
    body = (
        f"trap 'echo \"USR1 $SLURM_JOB_ID\" >> {marker}' USR1\n"
        f'echo "run $SLURM_JOB_ID" >> {marker}\n'
        "for i in $(seq 1 80); do sleep 0.25; done"
    )
    jobs = [submit(cl, f"twice{i}", body, "--nodes=1", "--requeue") for i in range(2)]
    cl.wait("both jobs to run", lambda: all(cl.job(j).state == "RUNNING" for j in jobs))
    cl.wait("both scripts to start", lambda: marker.exists() and marker.read_text().count("run ") == 2)
    script = hold_script([PARTITION], grace_seconds=3)
    first = subprocess.Popen(["bash", "-c", script], env=cl.env, stdout=subprocess.PIPE, text=True)
    # The first is in its grace once it has signalled both jobs (they are still RUNNING then).
    cl.wait("the first hold's signals", lambda: marker.read_text().count("USR1") == 2)
    second = subprocess.Popen(["bash", "-c", script], env=cl.env, stdout=subprocess.PIPE, text=True)
    out1, _ = first.communicate(timeout=60)
    out2, _ = second.communicate(timeout=60)
    assert (first.returncode, second.returncode) == (0, 0), (out1, out2)
    assert "requeued" in out1 and "no running job" in out2, (out1, out2)
    assert "not requeued" not in out1 + out2
    for job in jobs:
        assert marker.read_text().count(f"USR1 {job}\n") == 1, marker.read_text()
        cl.wait("the job to be requeued", lambda job=job: cl.job(job).state in ("PENDING", "REQUEUED"))


def test_a_job_that_cannot_be_requeued_is_named_and_the_hold_says_so(held: Slurm) -> None:
    cl = held
    job = submit(cl, "noreq", "sleep 30", "--nodes=1", "--no-requeue")
    cl.wait("the job to run", lambda: cl.job(job).state == "RUNNING")
    done = bash(cl, hold_script([PARTITION], grace_seconds=0))
    assert done.returncode == REQUEUE_REFUSED_EXIT, done
    assert f"not requeued (--no-requeue?): {job}" in done.stdout
    # USR1's default action ends a script that does not trap it (seen here: FAILED); Slurm refused
    # the requeue, so it is not back in the queue. With a trap it would end with its nodes (max 0).
    cl.wait("the job to end", lambda: not cl.job(job).active)
    assert cl.job(job).state == "FAILED"


def test_a_spot_warning_drains_the_node_and_requeues_its_job(quiet: Slurm) -> None:
    cl = quiet
    job = submit(cl, "spot", "sleep 30", "--nodes=2", "--requeue")
    cl.wait("the job to run", lambda: cl.job(job).state == "RUNNING")
    done = bash(
        cl, requeue_node_script("192.0.2.10", "node2", grace_seconds=1, reason="spot interruption warning")
    )
    assert done.returncode == 0, done
    assert f"requeued {job}" in done.stdout
    cl.wait("the job back in the queue", lambda: cl.job(job).state in ("PENDING", "REQUEUED"))
    node = cl.run("scontrol", "--oneliner", "show", "node", "node2").stdout
    assert "DRAIN" in node and "Reason=gpucluster: spot interruption warning" in node, node
    other = cl.run("scontrol", "--oneliner", "show", "node", "node1").stdout
    assert "DRAIN" not in other


def test_a_spot_warning_for_an_instance_slurm_does_not_know_changes_nothing(quiet: Slurm) -> None:
    done = bash(quiet, requeue_node_script("192.0.2.99", "ip-192-0-2-99", grace_seconds=0, reason="spot"))
    assert done.returncode == 4 and "no Slurm node" in done.stdout
    assert set(quiet.node_states().values()) == {"idle"}


XID_DMESG = "[  100.000000] NVRM: Xid (PCI:0000:10:1c): 79, pid=1234, GPU has fallen off the bus."


def test_the_health_check_drains_its_slurm_node_on_an_xid(quiet: Slurm, tmp_path: Path) -> None:
    cl = quiet
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    write_stubs(
        bin_dir,
        log,
        {
            "nvidia-smi": 'case "$*" in *index,ecc*) echo "0, 0, No, No, No";; *) echo 0;; esac',
            "dmesg": f"echo '{XID_DMESG}'",
            "curl": 'case "$*" in *api/token*) echo token;; *instance-id*) echo i-0123456789abcdef0;; '
            "*instance-type*) echo p5.48xlarge;; esac",
            "aws": "exit 0",
            "logger": "exit 0",
            "journalctl": "exit 1",
        },
    )
    (tmp_path / "uptime").write_text("200.00 100.00\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "health-launch.done").write_text("x")
    env = {
        **cl.env,
        "PATH": f"{bin_dir}:{cl.env['PATH']}",
        "GPUCLUSTER_NODE_ENV": "/dev/null",
        "GPUCLUSTER_STATE_DIR": str(state),
        "GPUCLUSTER_UPTIME_FILE": str(tmp_path / "uptime"),
        "GPUCLUSTER_SCHEDULER": "slurm",
        "SLURMD_NODENAME": "node1",
        "GPUCLUSTER_REGION": "us-east-1",
        "GPUCLUSTER_STACK": "t",
        "GPUCLUSTER_CLUSTER": "c",
        "GPUCLUSTER_NODE_GROUP": "train",
        "GPUCLUSTER_METRIC_NAMESPACE": "gpucluster/c",
        "GPUCLUSTER_HEALTH_FATAL": "xid gpu_count ecc",
        "GPUCLUSTER_HEALTH_ON_FAILURE": "replace",
        "GPUCLUSTER_HEALTH_XID_WINDOW_MINUTES": "100000",
        "GPUCLUSTER_HEALTH_HOOK_TIMEOUT_SECONDS": "5",
        "GPUCLUSTER_HEALTH_RETRY_SLEEP": "0",
    }
    done = run_script(tmp_path, "health-check.sh", "periodic", env=env, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    node = cl.run("scontrol", "--oneliner", "show", "node", "node1").stdout
    assert "DRAIN" in node, node
    assert "Reason=gpucluster: xid: Xid 79 on PCI:0000:10:1c" in node, node
    assert "DRAIN" not in cl.run("scontrol", "--oneliner", "show", "node", "node2").stdout
    # No Auto Scaling on a Slurm stack: no lifecycle or instance-health call.
    assert not [c for c in logged_calls(log, "aws") if c.startswith("autoscaling")]
