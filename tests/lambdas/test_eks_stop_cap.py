"""On an EKS stack a stop also zeroes the Auto Scaling group's maximum, so the cluster-autoscaler
cannot scale a stopped group back up for a pending pod; a start puts the configured maximum back
(`fleet/asg.py`, the group's `gpucluster:max-nodes` tag). Groups without the tag are unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpucluster.fleet.asg import AutoScalingCapacity
from gpucluster.fleet.backends import BACKENDS, Placement
from gpucluster.fleet.tags import MAX_NODES_TAG, NODE_GROUP_TAG, STACK_TAG

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
