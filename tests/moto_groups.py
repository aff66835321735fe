"""Test helper: Auto Scaling groups of gpucluster stacks in a moto account."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import boto3
from botocore.stub import Stubber

from gpucluster.fleet.tags import STACK_TAG

# The identities of stacks/Pulumi.dev.yaml and Pulumi.prod.yaml (self-managed backend, project gpucluster).
DEV = "organization/gpucluster/dev/gpu-dev"
PROD = "organization/gpucluster/prod/gpu-prod"


def create_stack_groups(autoscaling: Any, groups: Mapping[str, tuple[str, int, int, int]],
                        launch_template: str, zone: str = "us-east-1a") -> None:
    """Create each group `name -> (stack, min, desired, max)`, tagged gpucluster:stack = stack."""
    for name, (stack, min_size, desired, max_size) in groups.items():
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateName": launch_template, "Version": "$Latest"},
            MinSize=min_size, DesiredCapacity=desired, MaxSize=max_size, AvailabilityZones=[zone],
            Tags=[{"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": STACK_TAG,
                   "Value": stack, "PropagateAtLaunch": True}],
        )


def cost_explorer(answer: dict[str, Any] | None = None, error: str | None = None) -> Any:
    """A Cost Explorer client whose ListCostAllocationTags answers `answer` (or fails with `error`)."""
    client = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(client)
    if error:
        stub.add_client_error("list_cost_allocation_tags", error, "not allowed")
    else:
        stub.add_response("list_cost_allocation_tags", answer or {"CostAllocationTags": []},
                          {"TagKeys": ["gpucluster:stack"], "Type": "UserDefined"})
    stub.activate()
    return client


ACTIVE = {"CostAllocationTags": [{"TagKey": "gpucluster:stack", "Type": "UserDefined", "Status": "Active"}]}


def tag_node_group(autoscaling: Any, group: str, node_group: str) -> None:
    """Tag a group with the node group it belongs to, as GpuNodeGroup tags its ASG."""
    autoscaling.create_or_update_tags(Tags=[{
        "ResourceId": group, "ResourceType": "auto-scaling-group", "Key": "gpucluster:node-group",
        "Value": node_group, "PropagateAtLaunch": True}])


def fleet_of(identity: str, region: str = "us-east-1", **clients: Any) -> Any:
    """The `ops.Fleet` of deployment `identity` as `gpucluster` picks it (its guard-state table when
    it has one), with moto's clients in `region` (`clients` replaces some by service name)."""
    from gpucluster.ops import Clients
    from gpucluster.ops.nodegroups import Fleet, deployment_node_groups

    def make(service: str) -> Any:
        return clients.get(service) or boto3.client(service, region_name=region)

    made = Clients(region, make=make)
    return Fleet(identity, made, deployment_node_groups(identity, "none", made))


def tags_fleet(identity: str, autoscaling: Any, **clients: Any) -> Any:
    """The `ops.Fleet` of deployment `identity` on Auto Scaling tags alone (a stack without the guard-state
    table), its clients only these: `autoscaling` and `clients` by service name."""
    from gpucluster.fleet.asg import AutoScalingGroups
    from gpucluster.ops import Clients
    from gpucluster.ops.nodegroups import Fleet

    by_service = {"autoscaling": autoscaling, **clients}
    return Fleet(identity, Clients("us-east-1", make=lambda service: by_service[service]),
                 AutoScalingGroups(autoscaling))
