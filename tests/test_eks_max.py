"""`gpucluster start` on an EKS stack sets the configured maximum of the groups that run.

Pulumi does not own an EKS group's MaxSize after creating it (a guard's stop zeroes it; `pulumi up`
must not reopen a stopped group), so a `pulumi up` that changed `max_nodes` changes only the group's
`gpucluster:max-nodes` tag. `start` lists the groups that run with another maximum and sets it, a
group stopped meanwhile stays at zero, and an AWS error fails that group only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from typer.testing import CliRunner

from gpucluster.cli import app
from gpucluster.fleet.asg import AutoScalingGroups, MaxChange, scale_to_zero
from gpucluster.fleet.tags import MAX_NODES_TAG, NODE_GROUP_TAG, STACK_TAG
from gpucluster.ops import Clients, stopstart
from gpucluster.ops.nodegroups import Fleet
from gpucluster.ops.stopstart import MaxResult, apply_start, apply_stop, plan_start_on, plan_stop_on

REGION = "us-east-1"
STACK = "organization/gpucluster/k8s/gpu-k8s"


@pytest.fixture
def autoscaling() -> Iterator[Any]:
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        ec2.create_launch_template(LaunchTemplateName="gpu", LaunchTemplateData={
            "ImageId": "ami-12345678", "InstanceType": "g5.xlarge"})
        client = boto3.client("autoscaling", region_name=REGION)
        for name, configured in (("k8s-train", "4"), ("k8s-eval", "2")):
            client.create_auto_scaling_group(
                AutoScalingGroupName=name, MinSize=0, MaxSize=int(configured), DesiredCapacity=1,
                LaunchTemplate={"LaunchTemplateName": "gpu", "Version": "$Latest"},
                AvailabilityZones=[f"{REGION}a"],
                Tags=[{"Key": key, "Value": value, "PropagateAtLaunch": False} for key, value in (
                    (STACK_TAG, STACK), (NODE_GROUP_TAG, name.removeprefix("k8s-")),
                    (MAX_NODES_TAG, configured))])
        yield client


def fleet(autoscaling: Any, *, eks: bool = True) -> Fleet:
    clients = Clients(REGION, make=lambda service: autoscaling)
    return Fleet(STACK, clients, AutoScalingGroups(autoscaling), eks=eks)


def up_changed_max_nodes(client: Any, name: str, maximum: int) -> None:
    """What `pulumi up` does to an EKS group when max_nodes changes: its tag, never MaxSize."""
    client.create_or_update_tags(Tags=[{"ResourceId": name, "ResourceType": "auto-scaling-group",
                                        "Key": MAX_NODES_TAG, "Value": str(maximum),
                                        "PropagateAtLaunch": False}])


def max_size(client: Any, name: str) -> int:
    [g] = client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return int(g["MaxSize"])


def test_start_sets_the_configured_maximum_of_a_group_that_runs(autoscaling: Any) -> None:
    up_changed_max_nodes(autoscaling, "k8s-train", 8)
    plan = plan_start_on(fleet(autoscaling))
    assert plan.todo == [] and plan.maxima == (MaxChange("k8s-train", "train", 4, 8),)
    assert max_size(autoscaling, "k8s-train") == 4  # the plan changes nothing
    outcome = apply_start(plan)
    assert outcome.maxima == [MaxResult("k8s-train", "set")]
    assert max_size(autoscaling, "k8s-train") == 8
    assert plan_start_on(fleet(autoscaling)).maxima == ()  # done: nothing left to set


def test_start_narrowed_to_a_group_sets_only_that_one(autoscaling: Any) -> None:
    up_changed_max_nodes(autoscaling, "k8s-train", 8)
    up_changed_max_nodes(autoscaling, "k8s-eval", 3)
    assert [c.group for c in plan_start_on(fleet(autoscaling), "eval").maxima] == ["k8s-eval"]


def test_a_stack_that_is_not_eks_is_never_read_for_maxima(autoscaling: Any) -> None:
    up_changed_max_nodes(autoscaling, "k8s-train", 8)
    assert plan_start_on(fleet(autoscaling, eks=False)).maxima == ()


def test_a_stopped_group_is_started_with_its_new_maximum_not_listed(autoscaling: Any) -> None:
    groups = AutoScalingGroups(autoscaling)
    groups.stop(groups.read_groups(["k8s-train"])[0], "manual")
    up_changed_max_nodes(autoscaling, "k8s-train", 8)
    plan = plan_start_on(fleet(autoscaling))
    assert [c.group for c in plan.todo] == ["k8s-train"] and plan.maxima == ()
    apply_start(plan)
    assert max_size(autoscaling, "k8s-train") == 8


def test_a_stop_landing_after_the_plan_keeps_the_group_at_zero(autoscaling: Any) -> None:
    up_changed_max_nodes(autoscaling, "k8s-train", 8)
    groups = AutoScalingGroups(autoscaling)
    real = autoscaling

    class StopAfterTheWrite:
        """A budget stop lands between start's MaxSize write and its read of the stop state."""

        def update_auto_scaling_group(self, **kwargs: Any) -> Any:
            answer = real.update_auto_scaling_group(**kwargs)
            if kwargs.get("MaxSize") == 8:
                scale_to_zero(real, groups.read_groups(["k8s-train"])[0], "budget")
            return answer

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    wrapped = StopAfterTheWrite()
    racing = Fleet(STACK, Clients(REGION, make=lambda service: wrapped), AutoScalingGroups(real), eks=True)
    outcome = apply_start(plan_start_on(racing))
    assert outcome.maxima == [MaxResult("k8s-train", "skipped", "stopped meanwhile: left at 0")]
    assert max_size(real, "k8s-train") == 0


THROTTLED = ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "call")


class RefusingWrites:
    """UpdateAutoScalingGroup of k8s-eval is refused (throttled, denied); everything else is moto's."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def update_auto_scaling_group(self, **kwargs: Any) -> Any:
        if kwargs["AutoScalingGroupName"] == "k8s-eval":
            raise THROTTLED
        return self.real.update_auto_scaling_group(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class RefusingReads(AutoScalingGroups):
    """The stop state of k8s-eval cannot be read after the write."""

    def read_groups(self, names: Any) -> Any:
        names = list(names)
        if "k8s-eval" in names:
            raise THROTTLED
        return super().read_groups(names)


@pytest.mark.parametrize("failing", ["write", "read"])
def test_an_aws_error_fails_that_group_only(autoscaling: Any, failing: str) -> None:
    """The write refused, or the stop state read after it: that group's result says so, the other
    group is still set, and nothing raises out of `start`."""
    up_changed_max_nodes(autoscaling, "k8s-train", 8)
    up_changed_max_nodes(autoscaling, "k8s-eval", 3)
    plan = plan_start_on(fleet(autoscaling))
    client = RefusingWrites(autoscaling) if failing == "write" else autoscaling
    groups = AutoScalingGroups(autoscaling) if failing == "write" else RefusingReads(autoscaling)
    racing = Fleet(STACK, Clients(REGION, make=lambda service: client), groups, eks=True)
    outcome = apply_start(replace(plan, fleet=racing))
    results = {r.group: r for r in outcome.maxima}
    assert results["k8s-train"] == MaxResult("k8s-train", "set")
    assert results["k8s-eval"].action == "failed" and "Throttling" in results["k8s-eval"].reason
    assert max_size(autoscaling, "k8s-train") == 8
    assert max_size(autoscaling, "k8s-eval") == (2 if failing == "write" else 3)


def test_the_start_command_lists_then_sets_the_maxima(autoscaling: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Text: each group's line in the plan and its result; JSON: `maxima` (only when there are some)."""
    runner = CliRunner()
    monkeypatch.setattr(stopstart, "plan_start", lambda spec, clients, group=None: plan_start_on(
        fleet(autoscaling), group))
    assert "maxima" not in json.loads(runner.invoke(app, ["start", "dev", "--json", "--dry-run"]).output)
    up_changed_max_nodes(autoscaling, "k8s-train", 8)
    dry = json.loads(runner.invoke(app, ["start", "dev", "--json", "--dry-run"]).output)
    assert dry["maxima"] == [{"group": "k8s-train", "node_group": "train", "max_now": 4, "max_after": 8}]
    assert max_size(autoscaling, "k8s-train") == 4
    result = runner.invoke(app, ["start", "dev", "--yes"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "k8s-train: runs with maximum 4; start sets its configured 8" in said
    assert "maximum of k8s-train: 4 -> 8" in said
    assert max_size(autoscaling, "k8s-train") == 8


def test_gpucluster_stop_closes_a_group_the_autoscaler_took_to_zero(autoscaling: Any) -> None:
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="k8s-eval", DesiredCapacity=0)
    plan = plan_stop_on(fleet(autoscaling))
    assert [c.group for c in plan.running] == ["k8s-eval", "k8s-train"]
    assert plan.open_at_zero == ("k8s-eval",)
    apply_stop(plan)
    assert (max_size(autoscaling, "k8s-eval"), max_size(autoscaling, "k8s-train")) == (0, 0)
    assert plan_stop_on(fleet(autoscaling)).running == []  # closed: nothing left to stop


def test_status_says_which_groups_run_with_another_maximum() -> None:
    """`status` is read-only: it names the group and the command that sets it; JSON `maxima` only then."""
    from gpucluster.cli.fleet import status_json, status_lines
    from gpucluster.ops.overview import StackOverview
    from gpucluster.plan import load_stack

    spec = load_stack("dev")[2]
    plain = StackOverview([], "https://example.invalid/dashboard", None)
    assert "maxima" not in status_json(spec, plain)
    drifted = StackOverview([], "https://example.invalid/dashboard", None,
                            maxima=[MaxChange("k8s-train", "train", 4, 8)])
    said = " ".join(" ".join(status_lines("dev", spec, drifted)).split())
    assert ("k8s-train runs with maximum 4, not its configured 8 (max_nodes): "
            "`gpucluster start dev --group train` sets it") in said
    assert status_json(spec, drifted)["maxima"] == [
        {"group": "k8s-train", "node_group": "train", "max_now": 4, "max_after": 8}]
