"""ops.launch without the command line: nodes, a job's plan, its start, cancel paths, restart records.

moto holds the stack's groups and instances (test_jobs' `aws` account); SSM answers through a
botocore Stubber, so each test asserts the calls the operation makes, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from gpucluster.fleet.jobnames import job_parameter_name
from gpucluster.noderole import run_log_group_name
from gpucluster.ops.launch import (
    RestartRecord,
    drop_restart_record,
    find_nodes,
    plan_run,
    record_restart,
    start_run,
)
from gpucluster.ops.nodes import NodesError
from gpucluster.ops.run import DEFAULT_TIMEOUT_SECONDS, QUERY_TIMEOUT_SECONDS, RunError
from gpucluster.plan import load_stack
from test_jobs import PROD, _invocation, _online, _sends, aws  # noqa: F401  (fixture)

SPEC = load_stack("prod")[2]


def _clients(ssm: Any = None) -> Any:
    """The stack's clients as the CLI hands them: moto's, with `ssm` for SSM when given."""
    def client(service: str) -> Any:
        return ssm if service == "ssm" and ssm is not None else boto3.client(service, region_name=SPEC.region)

    return client


class Shown:
    """A `progress` that records what it was asked to show, in order."""

    def __init__(self) -> None:
        self.said: list[str] = []

    @contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        self.said.append(what)
        yield


def test_find_nodes_finds_the_group_s_nodes_and_says_so(aws: dict[str, Any],  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    shown = Shown()
    found = find_nodes(SPEC, "h100-train", clients=_clients(), progress=shown)
    assert len(found) == 3 and {n.node_group for n in found} == {"h100-train"}
    assert shown.said == [f"finding {SPEC.stack}'s nodes in {SPEC.region}"]
    with pytest.raises(NodesError, match="no node group 'nope'"):
        find_nodes(SPEC, "nope", clients=_clients())


def test_plan_run_plans_each_rank_and_the_restart_record(aws: dict[str, Any],  # noqa: F811
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    attached = plan_run(SPEC, "h100-train", "nvidia-smi -L", clients=_clients())
    assert attached.record is None and attached.plan.detach is None
    assert attached.plan.timeout_seconds == DEFAULT_TIMEOUT_SECONDS
    assert attached.plan.log_group == run_log_group_name(SPEC.identity)
    assert attached.master_addr == attached.plan.ranks[0].node.private_ip
    assert attached.plan.ranks[0].environment["FI_PROVIDER"] == "efa"  # the group's EFA settings
    detached = plan_run(SPEC, "h100-train", "torchrun train.py", clients=_clients(), detach=True,
                        name="pretrain", restart_on_replace=True, timeout=7200)
    assert detached.plan.detach == "pretrain" and detached.plan.job_timeout_seconds == 7200
    assert detached.plan.timeout_seconds == QUERY_TIMEOUT_SECONDS  # SSM only starts the unit
    assert detached.record is not None and detached.record["nnodes"] == 3
    assert detached.record["environment"]["GPUCLUSTER_CHECKPOINT_URI"] == "/fsx/checkpoints/"
    assert detached.record_parameter == job_parameter_name(SPEC.identity, "pretrain")
    named = plan_run(SPEC, "h100-train", "true", clients=_clients(), detach=True)
    assert named.plan.detach is not None and named.plan.detach.startswith("job-")
    with pytest.raises(RunError, match="SSM's Standard parameters hold 4096"):
        plan_run(SPEC, "h100-train", "echo " + "x" * 5000, clients=_clients(), detach=True,
                 restart_on_replace=True)


def test_start_run_sends_waits_and_stores_the_restart_record(aws: dict[str, Any],  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    run = plan_run(SPEC, "h100-train", "torchrun train.py", clients=_clients(ssm), detach=True,
                   name="pretrain", restart_on_replace=True)
    stub = Stubber(ssm)
    _sends(stub, 3, instance_ids=[r.node.instance_id for r in run.plan.ranks])
    for n in range(3):
        stub.add_response("get_command_invocation", _invocation("Success", 0, "started job pretrain\n"),
                          {"CommandId": f"{n:036d}", "InstanceId": ANY})
    stub.add_response("put_parameter", {"Version": 1}, {
        "Name": run.record_parameter, "Value": ANY, "Type": "String", "Overwrite": True, "Description": ANY})
    shown, changes = Shown(), []
    with stub:
        outcome = start_run(run, ssm, on_change=lambda r: changes.append((r.rank, r.status)), progress=shown)
        stub.assert_no_pending_responses()
    assert outcome.job.ok and not outcome.interrupted
    assert changes == [(0, "Success"), (1, "Success"), (2, "Success")]
    assert outcome.restart is not None and (outcome.restart.stored, outcome.restart.ok) == (True, True)
    assert outcome.restart.message is not None and "back to 3 node(s)" in outcome.restart.message
    assert shown.said == ["sending the command to 3 node(s)",
                          f"storing the restart record {run.record_parameter}"]


def test_start_run_cancels_everywhere_when_a_node_cannot_start(aws: dict[str, Any],  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    run = plan_run(SPEC, "h100-train", "true", clients=_clients(ssm), detach=True, name="pretrain")
    first = run.plan.ranks[0].node.instance_id
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": "c" * 36}})
        stub.add_client_error("send_command", "InvalidInstanceId", "not a managed node")
        stub.add_response("cancel_command", {}, {"CommandId": "c" * 36, "InstanceIds": [first]})
        outcome = start_run(run, ssm)  # no wait, no restart record: nothing runs
        stub.assert_no_pending_responses()
    assert outcome.job.cancelled and outcome.restart is None
    assert [r.status for r in outcome.job.results] == ["Cancelled", "NotSent", "NotSent"]


def test_start_run_interrupted_cancels_what_still_runs(aws: dict[str, Any],  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    run = plan_run(SPEC, "h100-train", "sleep 1000", clients=_clients(ssm))
    ids = [r.node.instance_id for r in run.plan.ranks]
    stub = Stubber(ssm)
    _sends(stub, 3)
    stub.add_response("get_command_invocation", _invocation("Success", 0, "done\n"))

    def interrupt(_result: Any) -> None:
        raise KeyboardInterrupt  # Ctrl-C as the first node's status arrives

    for n in (1, 2):  # the two still running are cancelled, the finished one is left alone
        stub.add_response("cancel_command", {}, {"CommandId": f"{n:036d}", "InstanceIds": [ids[n]]})
    with stub:
        outcome = start_run(run, ssm, on_change=interrupt)
        stub.assert_no_pending_responses()
    assert outcome.interrupted and outcome.restart is None
    assert [r.status for r in outcome.job.results] == ["Success", "Cancelled", "Cancelled"]


def test_restart_records_stored_dropped_and_refused() -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    name = job_parameter_name("org/proj/prod/c", "pretrain")
    record = {"nnodes": 2, "job": "pretrain"}
    with Stubber(ssm) as stub:
        stub.add_response("delete_parameter", {}, {"Name": name})
        stub.add_client_error("delete_parameter", "ParameterNotFound")
        stub.add_client_error("delete_parameter", "AccessDeniedException")
        stub.add_client_error("put_parameter", "AccessDeniedException", "no")
        assert drop_restart_record(ssm, name) is True
        assert drop_restart_record(ssm, name) is False  # none to drop
        dropped = record_restart(ssm, name, "pretrain", "train", None)
        assert (dropped.stored, dropped.ok) == (False, True)  # the job runs: a warning only
        assert dropped.message == (f"run: warning: could not remove an older restart record {name} "
                                   "(AccessDeniedException); `gpucluster cancel` removes it")
        refused = record_restart(ssm, name, "pretrain", "train", record)
        stub.assert_no_pending_responses()
    assert (refused.stored, refused.ok) == (False, False)
    assert refused.message is not None and "restart-on-replace is off" in refused.message
    # `run --json` shows the record as these keys, in this order
    assert list(asdict(RestartRecord(name))) == ["parameter", "stored", "ok", "message"]
