"""On an EKS stack a stop also zeroes the Auto Scaling group's maximum, so the cluster-autoscaler
cannot scale a stopped group back up for a pending pod; a start puts the configured maximum back
(`fleet/asg.py`, the group's `gpucluster:max-nodes` tag). Groups without the tag are unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpucluster.fleet.asg import (
    AutoScalingCapacity,
    AutoScalingGroups,
    MaxChange,
    apply_max,
    max_changes,
    scale_to_zero,
)
from gpucluster.fleet.backends import BACKENDS, Placement
from gpucluster.fleet.guardstate import StoredNodeGroups
from gpucluster.fleet.tags import MAX_NODES_TAG, NODE_GROUP_TAG, STACK_TAG, STOPPED_BY_TAG

REGION = "us-east-1"


@pytest.fixture
def autoscaling() -> Iterator[Any]:
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        ec2.create_launch_template(LaunchTemplateName="gpu-lt", LaunchTemplateData={
            "ImageId": "ami-12345678", "InstanceType": "g5.xlarge"})
        client = boto3.client("autoscaling", region_name=REGION)
        for name, eks in (("eks-gpu", True), ("plain-gpu", False)):
            tags = [{"Key": STACK_TAG, "Value": "t", "PropagateAtLaunch": False},
                    {"Key": NODE_GROUP_TAG, "Value": name, "PropagateAtLaunch": False}]
            if eks:
                tags.append({"Key": MAX_NODES_TAG, "Value": "4", "PropagateAtLaunch": False})
            client.create_auto_scaling_group(
                AutoScalingGroupName=name, MinSize=0, MaxSize=4, DesiredCapacity=2,
                LaunchTemplate={"LaunchTemplateName": "gpu-lt", "Version": "$Latest"},
                AvailabilityZones=[f"{REGION}a"], Tags=tags)
        yield client


def sizes(client: Any, name: str) -> tuple[int, int, int]:
    [g] = client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return g["MinSize"], g["DesiredCapacity"], g["MaxSize"]


def test_a_stop_zeroes_an_eks_group_s_maximum_and_a_start_puts_it_back(autoscaling: Any) -> None:
    capacity = AutoScalingCapacity(autoscaling)
    [eks] = capacity.describe(["eks-gpu"])
    assert eks.max_size == 4
    capacity.resize("eks-gpu", 0, 0)
    assert sizes(autoscaling, "eks-gpu") == (0, 0, 0)  # nothing the autoscaler can scale up to
    [stopped] = AutoScalingCapacity(autoscaling).describe(["eks-gpu"])
    assert (stopped.desired, stopped.max_size) == (0, 4)  # reads as its configured maximum
    # a start by another invocation, which has not read the group yet: the tag is read first
    AutoScalingCapacity(autoscaling).resize("eks-gpu", 1, 2)
    assert sizes(autoscaling, "eks-gpu") == (1, 2, 4)


def test_a_group_without_the_tag_keeps_its_maximum(autoscaling: Any) -> None:
    capacity = AutoScalingCapacity(autoscaling)
    capacity.resize("plain-gpu", 0, 0)
    assert sizes(autoscaling, "plain-gpu") == (0, 0, 4)
    capacity.resize("plain-gpu", 1, 2)
    assert sizes(autoscaling, "plain-gpu") == (1, 2, 4)


def test_an_eks_stack_has_a_node_group_backend(autoscaling: Any) -> None:
    """`gpucluster stop/start/status` on an EKS stack: the registry knows the kind (it did not)."""
    capacity = BACKENDS["eks"].capacity(Placement(lambda service: autoscaling, "t"))
    assert [g.name for g in capacity.describe_stack("t")] == ["eks-gpu", "plain-gpu"]


# ------------------------------------------------- without a guard-state table: the stop state in tags


def stop_tags(client: Any, name: str) -> dict[str, str]:
    [g] = client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return {t["Key"]: t["Value"] for t in g.get("Tags", [])}


def test_a_tags_only_stop_zeroes_an_eks_group_s_maximum_and_a_resume_puts_it_back(autoscaling: Any) -> None:
    """The gap that was: a stack without a guard-state table stopped by tags and left MaxSize open."""
    backend = BACKENDS["eks"].without_table(Placement(lambda service: autoscaling, "t"))  # type: ignore[misc]
    [eks] = backend.read_groups(["eks-gpu"])
    assert backend.stop(eks, "idle") == "stopped"
    assert sizes(autoscaling, "eks-gpu") == (0, 0, 0)
    [stopped] = backend.read_groups(["eks-gpu"])
    assert (stopped.stopped_by, stopped.max_size, stopped.configured_max) == ("idle", 4, 4)
    result = backend.restore(stopped)
    assert (result.action, result.desired_capacity) == ("resumed", 2)
    assert sizes(autoscaling, "eks-gpu") == (0, 2, 4)


def test_a_tags_only_stop_leaves_a_plain_group_s_maximum(autoscaling: Any) -> None:
    backend = BACKENDS["eks"].without_table(Placement(lambda service: autoscaling, "t"))  # type: ignore[misc]
    [plain] = backend.read_groups(["plain-gpu"])
    backend.stop(plain, "idle")
    assert sizes(autoscaling, "plain-gpu") == (0, 0, 4)
    [stopped] = backend.read_groups(["plain-gpu"])
    backend.restore(stopped)
    assert sizes(autoscaling, "plain-gpu") == (0, 2, 4)


def test_a_tags_only_resume_undone_by_a_stop_meanwhile_zeroes_the_maximum_again(autoscaling: Any) -> None:
    backend = AutoScalingGroups(autoscaling)
    [eks] = backend.read_groups(["eks-gpu"])
    backend.stop(eks, "idle")
    real = autoscaling

    class BudgetStopAfterUpdate:
        """A budget stop lands right after the resume's capacity write."""

        def __init__(self) -> None:
            self.updates = 0

        def update_auto_scaling_group(self, **kwargs: Any) -> Any:
            self.updates += 1
            answer = real.update_auto_scaling_group(**kwargs)
            if self.updates == 1:
                [now] = AutoScalingGroups(real).read_groups(["eks-gpu"])
                scale_to_zero(real, now, "budget")
            return answer

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    [stopped] = backend.read_groups(["eks-gpu"])
    result = AutoScalingGroups(BudgetStopAfterUpdate()).restore(stopped)
    assert result.action == "skipped"
    assert sizes(autoscaling, "eks-gpu") == (0, 0, 0)
    assert stop_tags(autoscaling, "eks-gpu")[STOPPED_BY_TAG] == "budget"


def test_a_tags_only_scale_sets_an_eks_group_s_configured_maximum(autoscaling: Any) -> None:
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="eks-gpu", MaxSize=2)
    AutoScalingGroups(autoscaling).set_capacity("eks-gpu", 0, 3)
    assert sizes(autoscaling, "eks-gpu") == (0, 3, 4)
    AutoScalingGroups(autoscaling).set_capacity("plain-gpu", 0, 3)
    assert sizes(autoscaling, "plain-gpu") == (0, 3, 4)


# ------------------------------------------- after a `pulumi up`: the configured maximum of a group that runs


def retag(client: Any, name: str, maximum: int) -> None:
    """What a `pulumi up` that changed max_nodes does to the group: the tag, not MaxSize."""
    client.create_or_update_tags(Tags=[{"ResourceId": name, "ResourceType": "auto-scaling-group",
                                        "Key": MAX_NODES_TAG, "Value": str(maximum),
                                        "PropagateAtLaunch": False}])


def test_a_group_that_runs_with_another_maximum_is_listed_and_a_stopped_one_is_not(autoscaling: Any) -> None:
    retag(autoscaling, "eks-gpu", 8)
    assert max_changes(autoscaling, "t", stopped=()) == [MaxChange("eks-gpu", "eks-gpu", 4, 8)]
    assert max_changes(autoscaling, "t", stopped=["eks-gpu"]) == []  # the backend holds it stopped
    retag(autoscaling, "eks-gpu", 1)  # lowered below what it runs: no lower than its desired (2)
    assert max_changes(autoscaling, "t", stopped=()) == [MaxChange("eks-gpu", "eks-gpu", 4, 2)]
    retag(autoscaling, "eks-gpu", 4)
    assert max_changes(autoscaling, "t", stopped=()) == []
    AutoScalingGroups(autoscaling).stop(AutoScalingGroups(autoscaling).read_groups(["eks-gpu"])[0], "idle")
    retag(autoscaling, "eks-gpu", 8)
    assert max_changes(autoscaling, "t", stopped=()) == []  # its stop-state tags say stopped


def test_apply_max_sets_the_maximum_unless_a_stop_landed_meanwhile(autoscaling: Any) -> None:
    change = MaxChange("eks-gpu", "eks-gpu", 4, 8)
    assert apply_max(autoscaling, change, lambda: False) is True
    assert sizes(autoscaling, "eks-gpu") == (0, 2, 8)

    def stop_lands() -> bool:  # a stop zeroed the group before our write, recorded before it
        return True

    autoscaling.update_auto_scaling_group(AutoScalingGroupName="eks-gpu", MinSize=0, DesiredCapacity=0)
    assert apply_max(autoscaling, change, stop_lands) is False
    assert sizes(autoscaling, "eks-gpu") == (0, 0, 0)


# ------------------------------------ a group the autoscaler took to zero nodes: its maximum is still open


def guard_table() -> StoredNodeGroups:
    """The stored backend over a fresh guard-state table (as the stack creates it) in the moto account."""
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    dynamodb.create_table(
        TableName="guard", BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "stack", "KeyType": "HASH"},
                   {"AttributeName": "group", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "stack", "AttributeType": "S"},
                              {"AttributeName": "group", "AttributeType": "S"}])
    return StoredNodeGroups(None, dynamodb, "guard", actor="test",
                            capacity=AutoScalingCapacity(boto3.client("autoscaling", region_name=REGION)))


@pytest.mark.parametrize("table", [True, False])
def test_a_stop_closes_an_eks_group_at_zero_nodes_and_a_start_reopens_it(autoscaling: Any,
                                                                         table: bool) -> None:
    """The cluster-autoscaler starts nodes in a group at zero whenever a pod is pending: a guard's stop has
    its maximum to close (it reported "already at zero" and left it open), and a start opens it again."""
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="eks-gpu", DesiredCapacity=0)
    backend = guard_table() if table else AutoScalingGroups(autoscaling)
    [eks] = backend.read_groups(["eks-gpu"])
    assert eks.running and eks.max_open
    assert backend.stop(eks, "budget") == "stopped"
    assert sizes(autoscaling, "eks-gpu") == (0, 0, 0)
    [stopped] = backend.read_groups(["eks-gpu"])
    assert not stopped.running and stopped.stopped_by == "budget"
    assert backend.stop(stopped, "idle") == "already-stopped"  # closed: nothing left to stop
    result = backend.restore(stopped)
    assert (result.action, result.desired_capacity) == ("resumed", 0)
    assert sizes(autoscaling, "eks-gpu") == (0, 0, 4)
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="plain-gpu", DesiredCapacity=0)
    [plain] = backend.read_groups(["plain-gpu"])
    assert backend.stop(plain, "budget") == "already-at-zero"  # not EKS: nothing grows it by itself
    assert sizes(autoscaling, "plain-gpu") == (0, 0, 4)


@pytest.mark.parametrize("table", [True, False])
def test_a_scale_to_zero_nodes_leaves_an_eks_group_open(autoscaling: Any, table: bool) -> None:
    """`gpucluster scale --desired 0` is not a stop: the autoscaler may grow the group again."""
    backend = guard_table() if table else AutoScalingGroups(autoscaling)
    backend.set_capacity("eks-gpu", 0, 0)
    assert sizes(autoscaling, "eks-gpu") == (0, 0, 4)
