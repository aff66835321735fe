"""The Slurm commands' builders (`lambdas.slurmhold`): what reaches a shell is checked first.

The commands themselves run against a real Slurm in tests/test_slurm_guard_real.py.
"""

from __future__ import annotations

import pytest

from gpucluster.fleet import stops
from gpucluster.fleet.slurmhold import hold_script, release_script, requeue_node_script


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
