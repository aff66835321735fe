"""The exact commands a Slurm stack's day-2 commands send to its login node, run by a real Slurm.

What `gpucluster.ops.slurmjobs` sends through SSM is one line (`slurm.remote.remote_command`)
that decodes and runs a script; here that same line runs under `sh -c` on this host against a
real Slurm 22.05 (Debian's slurm-wlm and munge, as tests/test_slurm_real.py), so the strings are
proven on Slurm, not only parsed from fixtures: a two-node job submitted as an unprivileged user
comes back with its id and runs, `jobs` parses the real squeue and scontrol, `logs` finds and
reads the real output file, `cancel` cancels (and reports scancel's refusal of an unknown job),
`nodes` parses the real sinfo.

The cluster is tests/real_slurm.py's (one per test process, shared with test_slurm_real and the
guard tests; `quiet` leaves it empty and idle after each test), its files under a directory every
user can read, since jobs run as `nobody` (uid 65534): on a PCS login node they run as the AMI's
default user, uid 1000 (slurm.remote.JOB_UID), which this host may not have.
`sacct` needs slurmdbd, which this Slurm has not (see test_slurm_real): the usage parsing is
tested on recorded `--parsable2` output in tests/test_slurm_ops.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from base_config import base
from gpucluster.ops.slurmjobs import plan_submit
from gpucluster.preflight import parse_stack_config
from gpucluster.slurm.remote import (
    CHUNK_BYTES,
    cancel_script,
    captured_script,
    decoded,
    jobs_script,
    locate_script,
    nodes_script,
    parse_cancel,
    parse_captured,
    parse_jobs,
    parse_locate,
    parse_node_boots,
    parse_sinfo,
    parse_submitted,
    parse_tail,
    remote_command,
    submit_script,
    tail_script,
)
from real_slurm import MISSING, Slurm

pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm/munge binaries missing ({', '.join(MISSING)})"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test Slurm runs its daemons as root"),
]

NOBODY = 65534


def stack_config() -> dict:
    config = base()
    config["gpucluster:node_groups"] = [{"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 4}]
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": "ami-0123456789abcdef0"}
    return config


SPEC = parse_stack_config(stack_config(), stack="t")


def on_login(slurm: Slurm, script: str) -> subprocess.CompletedProcess[str]:
    """What SSM's AWS-RunShellScript does with the one line ops sends: /bin/sh runs it."""
    return subprocess.run(["sh", "-c", remote_command(script)], env=slurm.env, capture_output=True, text=True,
                          timeout=60)


def submit(slurm: Slurm, command: str, name: str, nodes: int = 2) -> str:
    sub = plan_submit(SPEC, "train", command, name=name, nodes=nodes, workdir=str(slurm.root / "work"),
                      uid=NOBODY)
    done = on_login(slurm, sub.script)
    assert done.returncode == 0, (done.stdout, done.stderr, slurm.logs())
    return parse_submitted(done.stdout)


def test_a_two_node_job_is_submitted_as_the_job_user_and_runs(quiet: Slurm) -> None:
    cluster = quiet
    sub = plan_submit(SPEC, "train", 'echo "rank $NODE_RANK of $NNODES as $(id -un) on $SLURMD_NODENAME"',
                      name="hello", nodes=2, workdir=str(cluster.root / "work"), uid=NOBODY)
    assert decoded(remote_command(sub.script)) == sub.script == submit_script(sub.sbatch_script, uid=NOBODY)
    done = on_login(cluster, sub.script)
    assert done.returncode == 0, (done.stderr, cluster.logs())
    job_id = parse_submitted(done.stdout)
    cluster.wait("the job to finish", lambda: not cluster.job(job_id).active)
    job = cluster.job(job_id)
    assert (job.state, job.exit_code, job.nodes, job.partition) == ("COMPLETED", 0, 2, "train")
    shown = cluster.run("scontrol", "--oneliner", "show", "job", job_id).stdout
    assert f"UserId=nobody({NOBODY})" in shown  # not root: the uid choice holds
    out = (cluster.root / "work" / f"gpucluster-hello-{job_id}.out").read_text()
    assert sorted(line for line in out.splitlines() if line.startswith("rank")) == [
        "rank 0 of 2 as nobody on node1", "rank 1 of 2 as nobody on node2"]
    assert not list(Path("/tmp").glob("gpucluster-job.*"))  # the submitted copy was removed


def test_a_command_with_quotes_and_dollars_arrives_as_typed(quiet: Slurm) -> None:
    cluster = quiet
    tricky = "printf '%s|%s\\n' \"$NODE_RANK\" 'it'\"'\"'s $HOME; `no` $(neither)'"
    job_id = submit(cluster, tricky, "quotes", nodes=1)
    cluster.wait("the job to finish", lambda: not cluster.job(job_id).active)
    out = (cluster.root / "work" / f"gpucluster-quotes-{job_id}.out").read_text()
    assert "0|it's $HOME; `no` $(neither)" in out.splitlines()


def test_jobs_logs_and_cancel_read_and_drive_the_real_slurm(quiet: Slurm) -> None:
    cluster = quiet
    running = submit(cluster, 'echo "started $NODE_RANK"; sleep 60', "long")
    cluster.wait("the job to run", lambda: cluster.job(running).state == "RUNNING")
    done = submit(cluster, "echo done", "short", nodes=1)  # waits for the long one: two nodes busy
    listed = on_login(cluster, jobs_script(partition="train", accounting=False, since=None))
    assert listed.returncode == 0, listed.stderr
    jobs = {j.job_id: j for j in parse_jobs(listed.stdout, partition="train")}
    assert (jobs[running].name, jobs[running].state, jobs[running].nodes) == ("long", "RUNNING", 2)
    assert (jobs[done].name, jobs[done].state) == ("short", "PENDING")
    # With accounting asked for but no slurmdbd, sacct fails: the listing still has squeue's jobs.
    listed = on_login(cluster, jobs_script(partition=None, accounting=True, since="2026-01-01T00:00:00"))
    assert {j.job_id for j in parse_jobs(listed.stdout)} >= {running, done}

    located = on_login(cluster, locate_script(running))
    place = parse_locate(located.stdout)
    assert place.stdout == f"{cluster.root}/work/gpucluster-long-{running}.out"
    assert (place.batch_host, place.node_addr, place.job.state) == ("node1", "localhost", "RUNNING")
    cluster.wait("both tasks' lines", lambda: Path(place.stdout).exists() and
                 Path(place.stdout).read_text().count("started") == 2)
    tail = parse_tail(on_login(cluster, tail_script(place.stdout, lines=5)).stdout)
    assert sorted(tail.text.splitlines()) == ["started 0", "started 1"] and tail.read is None
    assert tail.size == len(Path(place.stdout).read_bytes())
    first = parse_tail(on_login(cluster, tail_script(place.stdout, offset=0)).stdout)
    assert (first.size, first.read, first.text) == (tail.size, tail.size, Path(place.stdout).read_text())
    rest = parse_tail(on_login(cluster, tail_script(place.stdout, offset=tail.size - 2)).stdout)
    assert (rest.read, rest.text) == (2, first.text[-2:])  # from a byte offset: the last line's end
    big = cluster.root / "work" / "big.out"
    big.write_bytes(b"x" * 50_000)
    chunk = parse_tail(on_login(cluster, tail_script(str(big), offset=10)).stdout)
    assert (chunk.size, chunk.read, len(chunk.text)) == (50_000, CHUNK_BYTES, CHUNK_BYTES)
    missing = on_login(cluster, tail_script(f"{cluster.root}/work/none.out", lines=5))
    assert missing.returncode == 4 and "no file" in missing.stderr

    answer = parse_cancel(on_login(cluster, cancel_script(running)).stdout)
    assert (answer.exit_status, answer.message) == (0, "")
    assert answer.before is not None and answer.before.state == "RUNNING"
    assert answer.job is not None and answer.job.state in ("CANCELLED", "COMPLETING")
    cluster.wait("the cancelled job to end", lambda: cluster.job(running).state == "CANCELLED")
    cluster.wait("the next job to finish", lambda: not cluster.job(done).active)
    # 22.05's scancel exits 0 for a job it does not know; with --verbose it says so on stderr.
    unknown = parse_cancel(on_login(cluster, cancel_script("999999")).stdout)
    assert (unknown.before, unknown.job) == (None, None)
    assert "Invalid job id" in unknown.message
    again = parse_cancel(on_login(cluster, cancel_script(running)).stdout)  # already ended
    assert again.before is not None and again.before.state == "CANCELLED" and not again.before.active


def test_nodes_parse_the_real_sinfo(quiet: Slurm) -> None:
    cluster = quiet
    done = on_login(cluster, nodes_script())
    assert done.returncode == 0, done.stderr
    nodes = parse_sinfo(done.stdout)
    assert [(n.name, n.partitions, n.state, n.address, n.hostname, n.reason) for n in nodes] == [
        ("node1", ("train",), "idle", "localhost", "localhost", ""),
        ("node2", ("train",), "idle", "localhost", "localhost", "")]
    # Slurm's own record of each node's boot: slurmd started (registered) after the host booted; no
    # job has run since, and without slurmdbd the accounting section's sacct fails and is skipped
    boots = parse_node_boots(done.stdout)
    assert set(boots) == {"node1", "node2"}
    assert all(b.registered_seconds is not None and b.registered_seconds >= 0 and b.first_job_seconds is None
               for b in boots.values())
    accounted = on_login(cluster, nodes_script(accounting=True))
    assert accounted.returncode == 0 and [n.name for n in parse_sinfo(accounted.stdout)] == ["node1", "node2"]
    cluster.run("scontrol", "update", "nodename=node2", "state=drain", "reason=gpucluster: xid 79")
    try:
        drained = {n.name: n for n in parse_sinfo(on_login(cluster, nodes_script()).stdout)}
        assert (drained["node2"].state, drained["node2"].reason) == ("drained", "gpucluster: xid 79")
    finally:
        cluster.run("scontrol", "update", "nodename=node2", "state=resume")


def test_a_long_output_is_kept_on_the_node_and_read_a_page_at_a_time(quiet: Slurm) -> None:
    cluster = quiet
    done = on_login(cluster, captured_script("set -eu\nseq 1 30000\necho oops >&2\nexit 3\n"))
    assert done.returncode == 3 and done.stderr == "oops\n"  # the script's own status and stderr
    page = parse_captured(done.stdout)
    whole = "".join(f"{n}\n" for n in range(1, 30001))
    assert (page.rc, page.size, page.read, page.text) == (3, len(whole), CHUNK_BYTES, whole[:CHUNK_BYTES])
    text, offset = [page.text], page.read
    while offset < page.size:
        script = tail_script(page.path, offset=offset, remove_when_read=True)
        tail = parse_tail(on_login(cluster, script).stdout)
        text.append(tail.text)
        offset += tail.read or 0
    assert "".join(text) == whole
    assert not Path(page.path).exists()  # the last page removed it
    small = parse_captured(on_login(cluster, captured_script(nodes_script())).stdout)
    assert (small.size, small.read, small.rc) == (small.read, len(small.text.encode()), 0)
    assert [n.name for n in parse_sinfo(small.text)] == ["node1", "node2"]
    assert not Path(small.path).exists()  # one page: gone at once
