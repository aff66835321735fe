"""The Slurm commands' builders (`lambdas.slurmhold`): what reaches a shell is checked first.

The commands themselves run against a real Slurm in tests/test_slurm_guard_real.py.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

import pytest

from fake_node import logged_calls, write_stubs
from gpucluster.fleet import stops
from gpucluster.fleet.slurmhold import (
    HOLD_BUSY_EXIT,
    REQUEUE_REFUSED_EXIT,
    hold_script,
    release_script,
    requeue_node_script,
)


@pytest.mark.parametrize("bad", ["train;reboot", "a b", "$(id)", "", "-x"])
def test_a_partition_name_no_slurm_group_can_have_never_reaches_a_shell(bad: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm partition name"):
        hold_script(["train", bad], grace_seconds=1)
    with pytest.raises(ValueError, match="not a Slurm partition name"):
        release_script([bad])


@pytest.mark.parametrize(("ip", "host"), [("10.0.0.1; reboot", "h"), ("10.0.0.1", "$(id)"), ("", "h")])
def test_an_address_that_is_not_one_never_reaches_a_shell(ip: str, host: str) -> None:
    with pytest.raises(ValueError, match="not an instance address"):
        requeue_node_script(ip, host, grace_seconds=1, reason="spot")


def test_the_hold_holds_each_partition_once_lists_jobs_once_then_signals_waits_requeues() -> None:
    script = hold_script(["train", "infer", "train"], grace_seconds=12.7)
    lines = script.splitlines()
    assert lines[1:3] == [
        "scontrol update PartitionName=infer State=DOWN",
        "scontrol update PartitionName=train State=DOWN",
    ]
    assert "--partition=infer,train --states=RUNNING,CONFIGURING" in script
    order = [
        script.index(s) for s in ("squeue", "scancel --signal=USR1 --full", "sleep 12", "scontrol requeue")
    ]
    assert order == sorted(order)
    assert release_script(["train", "infer"]).splitlines() == [
        "set -eu",
        "scontrol update PartitionName=infer State=UP",
        "scontrol update PartitionName=train State=UP",
    ]


def test_the_grace_fits_inside_the_wait_for_the_login_node(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[float, float]] = []
    monkeypatch.setattr(
        stops,
        "hold_partitions",
        lambda ssm, ec2, stack, partitions, *, grace_seconds, timeout_seconds: sent.append(
            (grace_seconds, timeout_seconds)
        ),
    )
    monkeypatch.setattr(stops.RUNTIME, "client", lambda service: None)
    monkeypatch.delenv("PCS_CLUSTER_ID", raising=False)
    assert stops.slurm_hold_from_env() is None  # not a Slurm stack: no hold
    monkeypatch.setenv("PCS_CLUSTER_ID", "pcs_x")
    monkeypatch.delenv("PRE_STOP_TIMEOUT_SECONDS", raising=False)
    hold = stops.slurm_hold_from_env()
    assert hold is not None
    hold(["train"])
    monkeypatch.setenv("PRE_STOP_TIMEOUT_SECONDS", "300")
    stops.slurm_hold_from_env()(["train"])  # type: ignore[misc]
    stops.slurm_hold_from_env(timeout_seconds=100)(["train"])  # type: ignore[misc]
    assert sent == [(30.0, 60.0), (300.0, 330.0), (70.0, 100.0)]


# --- the hold sent twice, against a model of the login node's Slurm (fake binaries) -------------
# squeue lists the jobs of $SLURM_STATE/running; `scontrol requeue J` moves J to pending (refused for
# the ids in $SLURM_STATE/norequeue); `scontrol show job J` prints its Restarts and StartTime from
# $SLURM_STATE/runs/J; scancel only logs its call. `sleep` is the real one (the grace: 1-2 s).
SLURM_MODEL = {
    "squeue": 'cat "$SLURM_STATE/running" 2>/dev/null || true',
    "scancel": "exit 0",
    "scontrol": (
        'case "$*" in\n'
        '  requeue*) a="$*"; j="${a##* }"; grep -qx "$j" "$SLURM_STATE/norequeue" 2>/dev/null && exit 1\n'
        '    grep -vx "$j" "$SLURM_STATE/running" > "$SLURM_STATE/r.new"; mv "$SLURM_STATE/r.new" '
        '"$SLURM_STATE/running"; echo "$j" >> "$SLURM_STATE/pending";;\n'
        '  *"show job"*) a="$*"; j="${a##* }"; '
        'echo "JobId=$j JobState=RUNNING $(cat "$SLURM_STATE/runs/$j") Partition=train";;\n'
        "esac"
    ),
}


@pytest.fixture
def login_node(tmp_path: Path) -> dict[str, Path]:
    """The model's state, its call log and the hold's root-only directory, all under tmp_path."""
    state, log = tmp_path / "slurm", tmp_path / "calls.log"
    (state / "runs").mkdir(parents=True)
    write_stubs(tmp_path / "bin", log, SLURM_MODEL)
    return {"state": state, "log": log, "bin": tmp_path / "bin", "dir": tmp_path / "hold"}


def running(node: dict[str, Path], *jobs: tuple[str, int, str]) -> None:
    """Jobs (id, restarts, start time) running on the partition."""
    (node["state"] / "running").write_text("".join(f"{j}\n" for j, _, _ in jobs))
    for j, restarts, start in jobs:
        (node["state"] / "runs" / j).write_text(f"Restarts={restarts} StartTime={start}")


def hold(node: dict[str, Path], grace: float = 0) -> subprocess.Popen[str]:
    script = hold_script(["train"], grace_seconds=grace, hold_dir=str(node["dir"]), lock_wait_seconds=20)
    env = {**os.environ, "PATH": f"{node['bin']}:{os.environ['PATH']}", "SLURM_STATE": str(node["state"])}
    return subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(p: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = p.communicate(timeout=30)
    return p.returncode, out + err


def signalled(node: dict[str, Path]) -> list[str]:
    return [c.split()[-1] for c in logged_calls(node["log"], "scancel")]


def test_two_holds_at_once_signal_each_job_once_and_neither_says_not_requeued(login_node) -> None:
    running(login_node, ("41", 0, "2026-11-29T05:00:00"), ("42", 0, "2026-11-29T05:01:00"))
    first = hold(login_node, grace=2)
    time.sleep(0.5)  # the first is in its grace, holding the lock
    second = hold(login_node, grace=2)
    (rc1, out1), (rc2, out2) = finish(first), finish(second)
    assert signalled(login_node) == ["41", "42"]  # once each, whichever hold ran first
    assert (rc1, rc2) == (0, 0), (out1, out2)
    assert "requeued 41 42" in out1, out1
    # The second waited for the first: the jobs were PENDING by then; it repeats what the first did.
    assert "no running job" in out2 and "signalled: 41 42" in out2, out2
    assert "not requeued" not in out1 + out2
    assert (login_node["dir"].stat().st_mode & 0o777) == 0o700  # the record is root's alone


def test_a_hold_retried_after_a_cut_off_first_requeues_without_signalling_again(login_node) -> None:
    running(login_node, ("7", 0, "2026-11-29T05:00:00"))
    login_node["dir"].mkdir(mode=0o700)
    # The first hold was killed in its grace (SSM's timeout): it had recorded and signalled job 7.
    (login_node["dir"] / "signalled").write_text("7 Restarts=0 StartTime=2026-11-29T05:00:00 \n")
    rc, out = finish(hold(login_node))
    assert rc == 0, out
    assert signalled(login_node) == []
    assert "signalled already by an earlier hold of this stop: 7" in out and "requeued 7" in out


def test_a_job_back_from_a_requeue_is_signalled_again_by_the_next_stop(login_node) -> None:
    running(login_node, ("7", 0, "2026-11-29T05:00:00"))
    assert finish(hold(login_node))[0] == 0
    running(login_node, ("7", 1, "2026-11-29T07:00:00"))  # started again after the start, Restarts=1
    rc, out = finish(hold(login_node))
    assert rc == 0 and "requeued 7" in out, out
    assert signalled(login_node) == ["7", "7"]


def test_a_job_slurm_will_not_requeue_is_named_once_and_not_signalled_twice(login_node) -> None:
    running(login_node, ("9", 0, "2026-11-29T05:00:00"))
    (login_node["state"] / "norequeue").write_text("9\n")
    rc, out = finish(hold(login_node))
    assert rc == REQUEUE_REFUSED_EXIT and "not requeued (--no-requeue?): 9" in out, out
    rc, out = finish(hold(login_node))  # the job trapped USR1 and runs on: named again, not signalled
    assert rc == REQUEUE_REFUSED_EXIT and "signalled already by an earlier hold of this stop: 9" in out
    assert signalled(login_node) == ["9"]


def test_a_second_hold_that_cannot_get_the_lock_in_time_signals_nothing(login_node) -> None:
    running(login_node, ("5", 0, "2026-11-29T05:00:00"))
    login_node["dir"].mkdir(mode=0o700)
    with open(login_node["dir"] / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another hold is running
        script = hold_script(["train"], grace_seconds=0, hold_dir=str(login_node["dir"]), lock_wait_seconds=1)
        env = {**os.environ, "PATH": f"{login_node['bin']}:{os.environ['PATH']}",
               "SLURM_STATE": str(login_node["state"])}
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == HOLD_BUSY_EXIT and "another hold is still running" in done.stdout
    assert signalled(login_node) == []
