"""Test helper: Auto Scaling groups of gpucluster stacks in a moto account."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucluster.lambdas import scaling


def create_stack_groups(autoscaling: Any, groups: Mapping[str, tuple[str, int, int, int]],
                        launch_template: str, zone: str = "us-east-1a") -> None:
    """Create each group `name -> (stack, min, desired, max)`, tagged gpucluster:stack = stack."""
    for name, (stack, min_size, desired, max_size) in groups.items():
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateName": launch_template, "Version": "$Latest"},
            MinSize=min_size, DesiredCapacity=desired, MaxSize=max_size, AvailabilityZones=[zone],
            Tags=[{"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": scaling.STACK_TAG,
                   "Value": stack, "PropagateAtLaunch": True}],
        )


def tag_node_group(autoscaling: Any, group: str, node_group: str) -> None:
    """Tag a group with the node group it belongs to, as GpuNodeGroup tags its ASG."""
    autoscaling.create_or_update_tags(Tags=[{
        "ResourceId": group, "ResourceType": "auto-scaling-group", "Key": "gpucluster:node-group",
        "Value": node_group, "PropagateAtLaunch": True}])
