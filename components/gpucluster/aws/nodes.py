"""GpuNodeGroup: one node group of the spec as a launch template and an Auto Scaling group.

It owns how GPU nodes are launched: the AMI (the AWS Deep Learning AMI's public
SSM parameter unless overridden), IMDSv2 only, an encrypted gp3 root volume,
the EFA interface layout (`nics.py`), the user data (`bootstrap`), and the
capacity mix: on-demand base, spot above it, instance-type fallbacks, on-demand
capacity reservations and Capacity Blocks. Nodes are ASG capacity, never
resources of their own, so a plan's size does not depend on node counts.
Pulumi sets the desired capacity only at creation: after that it belongs to
the guardrails and to users. It never gives a node a public address.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pulumi
import pulumi_aws as aws
from gpucluster.aws.network import GroupNetwork
from gpucluster.aws.nics import network_interfaces
from gpucluster.node.userdata import encode_user_data, node_bootstrap, render_user_data
from gpucluster.parts import DataMount
from gpucluster.spec import CapacityConfig, NodeGroupConfig, StackSpec

# AWS Deep Learning AMI developer guide, release notes of "AWS Deep Learning Base OSS Nvidia
# Driver GPU AMI (Ubuntu 22.04)" ("Query AMI-ID with SSM Parameter"); x86_64, all our GPU types.
DEFAULT_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id")
ROOT_DEVICE = "/dev/sda1"  # the root device name of Ubuntu AMIs, the DLAMI included
IMDS_HOP_LIMIT = 2  # one hop more than the host, so containers reach IMDSv2 (EC2 user guide, IMDS)
NODE_GROUP_TAG = "gpucluster:node-group"
STACK_TAG = "gpucluster:stack"  # the guardrail Lambdas find groups by this tag (spec.tags sets it)
LATEST = "$Latest"


# ------------------------------------------------------------ pure capacity mapping


def instances_distribution(capacity: CapacityConfig) -> dict[str, Any]:
    """The mixed-instances distribution: on-demand base, then `spot_percent` spot above it.

    EC2 Auto Scaling user guide, "Auto Scaling groups with multiple instance types and
    purchase options": the base is filled on-demand first (where reservations, RIs and
    Savings Plans apply), the percentage splits everything above it.
    """
    return {
        "on_demand_base_capacity": capacity.on_demand_base,
        "on_demand_percentage_above_base_capacity": 100 - int(capacity.spot_percent),
        "on_demand_allocation_strategy": capacity.on_demand_allocation_strategy,
        "spot_allocation_strategy": capacity.spot_allocation_strategy,
    }


def instance_overrides(group: NodeGroupConfig) -> list[dict[str, str]]:
    """One override per instance type, in preference order: the fallbacks when one has no capacity."""
    return [{"instance_type": name} for name in group.instance_types]


def asg_capacity_reservation(capacity: CapacityConfig) -> dict[str, Any] | None:
    """The group-level reservation target of a mixed group with an on-demand capacity reservation.

    EC2 Auto Scaling user guide, "Target Capacity Reservations from your Auto Scaling
    group": set on the group (not the launch template), it applies to on-demand launches
    only, so spot launches above the base are untouched; `capacity-reservations-first`
    falls back to plain on-demand when the reservation is full instead of failing.
    """
    if capacity.market != "mixed" or capacity.capacity_reservation_id is None:
        return None
    return {"capacity_reservation_preference": "capacity-reservations-first",
            "capacity_reservation_target": {"capacity_reservation_ids": [capacity.capacity_reservation_id]}}


def capacity_block_options(capacity: CapacityConfig) -> dict[str, Any]:
    """Launch template settings of a Capacity Block group (empty for mixed groups).

    EC2 Auto Scaling user guide, "Use Capacity Blocks for machine learning workloads": the
    launch template names the market type `capacity-block` and the block's reservation id.
    """
    if capacity.market != "capacity_block":
        return {}
    return {"instance_market_options": {"market_type": "capacity-block"},
            "capacity_reservation_specification": {
                "capacity_reservation_target": {"capacity_reservation_id": capacity.capacity_reservation_id}}}


def node_tags(spec: StackSpec, group: NodeGroupConfig) -> dict[str, str]:
    """Tags of everything a node group creates: stack, cluster, cost tags and the group."""
    return {**spec.tags, NODE_GROUP_TAG: group.name, "Name": f"{spec.cluster.name}-{group.name}"}


def can_hold_spot(group: NodeGroupConfig) -> bool:
    return group.capacity.market == "mixed" and group.capacity.spot_percent > 0


# ------------------------------------------------------------------------ component


class GpuNodeGroup(pulumi.ComponentResource):
    """A node group: its launch template and its Auto Scaling group (`.asg`)."""

    launch_template: aws.ec2.LaunchTemplate
    asg: aws.autoscaling.Group
    network: GroupNetwork

    def __init__(self, name: str, spec: StackSpec, group: NodeGroupConfig, network: GroupNetwork,
                 instance_profile_arn: pulumi.Input[str], data_mounts: Sequence[DataMount] = (),
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpucluster:nodes:GpuNodeGroup", name, None, opts)
        self.network = network
        child = pulumi.ResourceOptions(parent=self)
        tags = node_tags(spec, group)
        self.launch_template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"gpucluster {spec.cluster.name}/{group.name} GPU nodes",
            image_id=self._image_id(group),
            instance_type=group.instance_types[0] if group.capacity.market == "capacity_block" else None,
            iam_instance_profile={"arn": instance_profile_arn},
            user_data=self._user_data(spec, group, data_mounts),
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": IMDS_HOP_LIMIT,
                              "instance_metadata_tags": "disabled"},
            block_device_mappings=[{"device_name": ROOT_DEVICE, "ebs": {
                "volume_size": group.root_volume_size_gib, "volume_type": "gp3", "encrypted": "true",
                "delete_on_termination": "true"}}],
            network_interfaces=[{
                "network_card_index": nic.network_card_index, "device_index": nic.device_index,
                "interface_type": nic.interface_type, "associate_public_ip_address": "false",
                "delete_on_termination": "true", "security_groups": [network.security_group.id],
            } for nic in network_interfaces(group.types[0], group.efa_enabled)],
            tag_specifications=[{"resource_type": kind, "tags": tags}
                                for kind in ("instance", "volume", "network-interface")],
            update_default_version=True,
            tags=tags,
            opts=child,
            **capacity_block_options(group.capacity),
        )
        self.asg = aws.autoscaling.Group(
            f"{name}-asg",
            min_size=group.min_nodes,
            max_size=group.max_nodes,
            desired_capacity=group.desired_nodes,
            vpc_zone_identifiers=network.subnet_ids,
            placement_group=network.placement_group.name if network.placement_group else None,
            capacity_rebalance=can_hold_spot(group) and spec.spot.handle_rebalance,
            wait_for_capacity_timeout="0",  # GPU capacity may take hours: never block `pulumi up`
            tags=[{"key": key, "value": value, "propagate_at_launch": True} for key, value in tags.items()],
            # The guardrail Lambdas set min and desired to 0 when they stop a group (DESIGN.md): if
            # Pulumi owned these fields, the next `pulumi up` would silently restart what they stopped.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["desiredCapacity", "minSize"]),
            **self._capacity(group),
        )
        self.register_outputs({
            "asg_name": self.asg.name,
            "launch_template_id": self.launch_template.id,
            "security_group_id": network.security_group.id,
            "placement_group_name": network.placement_group.name if network.placement_group else None,
        })

    def _image_id(self, group: NodeGroupConfig) -> pulumi.Input[str]:
        if group.ami_id:
            return group.ami_id
        parameter = group.ami_ssm_parameter or DEFAULT_AMI_PARAMETER
        return aws.ssm.get_parameter_output(name=parameter, opts=pulumi.InvokeOptions(parent=self)).value

    @staticmethod
    def _user_data(spec: StackSpec, group: NodeGroupConfig,
                   data_mounts: Sequence[DataMount]) -> pulumi.Output[str]:
        """Render once every bucket/FSx name a mount depends on is known."""
        values = [v for m in data_mounts for v in (m.bucket_name, m.fsx_dns_name, m.fsx_mount_name)]

        def render(resolved: list[Any]) -> str:
            mounts = [replace(m, bucket_name=resolved[3 * i], fsx_dns_name=resolved[3 * i + 1],
                              fsx_mount_name=resolved[3 * i + 2]) for i, m in enumerate(data_mounts)]
            return encode_user_data(render_user_data(node_bootstrap(spec, group, mounts)))

        return pulumi.Output.all(*values).apply(render)

    def _capacity(self, group: NodeGroupConfig) -> dict[str, Any]:
        template = {"launch_template_id": self.launch_template.id, "version": LATEST}
        if group.capacity.market == "capacity_block":
            # A Capacity Block is one instance type in one zone: a plain launch template.
            return {"launch_template": {"id": self.launch_template.id, "version": LATEST}}
        return {
            "mixed_instances_policy": {
                "instances_distribution": instances_distribution(group.capacity),
                "launch_template": {"launch_template_specification": template,
                                    "overrides": instance_overrides(group)},
            },
            "capacity_reservation_specification": asg_capacity_reservation(group.capacity),
        }
