"""ops.jobs, ops.nccl's flow and ops.overview without the command line.

moto holds the stack's groups and instances (test_jobs' `aws` account); SSM answers through a
botocore Stubber (or test_nccl_test's FakeSsm), so each test asserts the calls made, in order.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gpucluster.fleet.jobnames import job_log_stream, job_parameter_name
from gpucluster.ops.jobs import (
    cancel_job,
    follow_job,
    job_logs,
    list_jobs,
    on_nodes,
    prepare_follow,
    running_instances,
)
from gpucluster.ops.nccl import execute_nccl_test, prepare_nccl_test
from gpucluster.ops.overview import stack_overview
from gpucluster.ops.run import RunError
from gpucluster.plan import load_stack
from test_jobs import _invocation, _online, _sends, aws  # noqa: F401  (fixture)
from test_nccl_test import FakeSsm
from test_ops_launch import Shown, _clients

SPEC = load_stack("prod")[2]
STATUS = "pretrain running - 2025-06-02_10:00:00\neval failed 3 2025-06-01_09:00:00\n"


def _answers(stub: Stubber, *invocations: dict[str, Any]) -> None:
    """One send_command and one get_command_invocation answer per node, in rank order."""
    _sends(stub, len(invocations))
    for invocation in invocations:
        stub.add_response("get_command_invocation", invocation)


def test_list_jobs_reads_every_node_and_names_the_silent(aws: dict[str, Any],  # noqa: F811
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    stub = Stubber(ssm)
    answered = _invocation("Success", 0, STATUS)
    _answers(stub, answered, _invocation("Failed", 1), answered)
    shown = Shown()
    with stub:
        listing = list_jobs(SPEC, "h100-train", clients=_clients(ssm), progress=shown)
        stub.assert_no_pending_responses()
    assert [r.rank for r in listing.silent] == [1]
    assert [(j.job, j.state, j.exit_status) for j in listing.jobs] == [
        ("eval", "failed", 3), ("eval", "failed", 3),
        ("pretrain", "running", None), ("pretrain", "running", None)]
    assert listing.jobs[-1].started == "2025-06-02 10:00:00" and listing.jobs[0].node_group == "h100-train"
    assert shown.said[-1] == "asking 3 node(s) through SSM"


def test_on_nodes_picks_one_node_and_refuses_an_unknown_one(aws: dict[str, Any],  # noqa: F811
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    with pytest.raises(RunError, match=r"--node: no in-service node '9' \(a rank 0\.\.2,"):
        on_nodes(SPEC, "h100-train", "true", clients=_clients(ssm), comment="gpucluster logs", node="9")
    with Stubber(ssm) as stub:
        _answers(stub, _invocation("Success", 0, "step 10 loss 1.5\n"))
        answers = job_logs(SPEC, "pretrain", "h100-train", lines=50, clients=_clients(ssm), node="1")
        stub.assert_no_pending_responses()
    assert [r.stdout for r in answers.results] == ["step 10 loss 1.5\n"]
    assert answers.plan.command.endswith("gpucluster-job logs pretrain 50")


def test_cancel_job_drops_the_record_first_then_stops_it_everywhere(aws: dict[str, Any],  # noqa: F811
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    events: list[str] = []
    ssm.meta.events.register("provide-client-params.ssm",
                             lambda event_name, **_: events.append(event_name.rsplit(".", 1)[-1]))
    with Stubber(ssm) as stub:
        stub.add_response("delete_parameter", {}, {"Name": job_parameter_name(SPEC.identity, "pretrain")})
        _answers(stub, *[_invocation("Success", 0, "cancelled\n")] * 3)
        done = cancel_job(SPEC, "pretrain", "h100-train", clients=_clients(ssm),
                          on_record_removed=lambda: events.append("told"))
        stub.assert_no_pending_responses()
    assert done.record_removed and all(r.ok for r in done.results)
    assert events[:3] == ["DeleteParameter", "told", "SendCommand"]


def test_prepare_follow_finds_the_job_s_nodes_or_none(aws: dict[str, Any],  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = boto3.client("ssm", region_name="us-east-1")
    stub = Stubber(ssm)
    _answers(stub, _invocation("Success", 0, ""), *[_invocation("Success", 0, STATUS)] * 2)
    with stub:
        session = prepare_follow(SPEC, "pretrain", "h100-train", clients=_clients(ssm))
    ids = [r.instance_id for r in session.results]
    assert sorted(session.found) == sorted(ids[1:])  # rank 0 runs no such job
    assert session.follower is not None
    assert session.streams == {job_log_stream(i, "pretrain"): i for i in ids[1:]}
    assert session.follower.waiting == set(session.streams)  # both running
    stub = Stubber(ssm)
    _answers(stub, *[_invocation("Success", 0, "")] * 3)
    with stub:
        none = prepare_follow(SPEC, "other", "h100-train", clients=_clients(ssm))
    assert none.follower is None and not none.found
    with pytest.raises(AssertionError, match="no job to follow"):
        follow_job(none, print, clients=_clients(ssm))


def test_running_instances_are_the_pending_and_running(aws: dict[str, Any]) -> None:  # noqa: F811
    ids = [i["InstanceId"] for r in aws["ec2"].describe_instances()["Reservations"] for i in r["Instances"]]
    aws["ec2"].terminate_instances(InstanceIds=ids[:1])
    assert running_instances(aws["ec2"], ids) == set(ids[1:])


def test_the_nccl_flow_plans_runs_and_judges(aws: dict[str, Any],  # noqa: F811
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _online(monkeypatch)
    ssm = FakeSsm()
    setup = prepare_nccl_test(SPEC, "h100-train", clients=_clients(ssm), max_bytes="1G")
    assert (setup.efa, setup.gpus_per_node, setup.expected.instance_type) == (True, 8, "p5.48xlarge")
    ids = [r.node.instance_id for r in setup.base.ranks]
    assert setup.dry_run_phases() == {"key": ids[:1], "authorize": ids, "run": ids[:1], "revoke": ids}
    phases: list[str] = []
    shown = Shown()
    result = execute_nccl_test(setup, "nccl-x", ssm, on_phase=phases.append, progress=shown)
    assert phases == ["key", "authorize", "run", "revoke"]
    assert shown.said == ["nccl-test: key on 1 node(s)", "nccl-test: authorize on 3 node(s)",
                          "nccl-test: run on 1 node(s)", "nccl-test: revoke on 3 node(s)"]
    assert not result.passed and result.outcome.revoked  # 41.5 GB/s of p5's 400
    assert any("400 GB/s (3200 Gbps): 10%" in line for line in result.findings)


def test_the_overview_reads_groups_dashboard_and_cost_tag(aws: dict[str, Any]) -> None:  # noqa: F811
    ce = boto3.client("ce", region_name="us-east-1")
    shown = Shown()
    with Stubber(ce) as stub:
        stub.add_response("list_cost_allocation_tags", {"CostAllocationTags": [
            {"TagKey": "gpucluster:stack", "Type": "UserDefined", "Status": "Inactive"}]})
        overview = stack_overview(SPEC, clients=_clients(), ce=ce, progress=shown)
        # this Cost Explorer answers the tag check only: the spend is reported unread, never raised
        assert overview.spend is None and overview.spend_error is not None
    assert {g.name for g in overview.groups} == {"prod-h100", "prod-other"}
    assert overview.dashboard_url.startswith("https://") and SPEC.region in overview.dashboard_url
    assert overview.cost_tag_warning is not None
    assert overview.cost_tag_warning.startswith("warning: cost-allocation tag gpucluster:stack is inactive")
    assert shown.said == [f"reading {SPEC.stack}'s Auto Scaling groups and GPU metrics in {SPEC.region}",
                          "checking the budget's cost-allocation tag",
                          "measuring spend so far (Cost Explorer + running instances)",
                          "reading the nodes' boot times (CloudWatch)"]
