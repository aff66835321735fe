"""GpuCluster: the one component a stack builds, composing every part of a cluster.

It owns the order in which parts are built and what each part is handed
(network ids to node groups, bucket ARNs to node IAM, ASG names to the
guardrails), and the stack's outputs. It must not build resources itself:
each part is a ComponentResource of its own module, parented to this one.

Order: network, then the datasets (buckets, FSx in a node group's subnet,
and the S3 grants and data mounts the nodes need), then the node identity
(IAM), then one GpuNodeGroup per node group, then the guardrails that act on
those groups' Auto Scaling groups.
"""

from __future__ import annotations

from typing import Any

import pulumi
from gpucluster.aws.datasets import DatasetStore
from gpucluster.aws.guardrails import GroupTarget, Guardrails
from gpucluster.aws.iam import NodeIdentity
from gpucluster.aws.network import ClusterNetwork
from gpucluster.aws.nodes import GpuNodeGroup
from gpucluster.spec import StackSpec


class GpuCluster(pulumi.ComponentResource):
    """A GPU cluster described by a validated StackSpec."""

    outputs: dict[str, Any]
    network: ClusterNetwork
    datasets: DatasetStore
    identity: NodeIdentity
    node_groups: dict[str, GpuNodeGroup]
    """Group name -> its component; `.asg` is the Auto Scaling group the guardrails act on."""

    def __init__(self, name: str, spec: StackSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpucluster:cluster:GpuCluster", name, None, opts)
        self.spec = spec
        child = pulumi.ResourceOptions(parent=self)
        self.network = ClusterNetwork(f"{name}-network", spec, opts=child)
        self.datasets = DatasetStore(
            f"{name}-datasets", spec, vpc_id=self.network.vpc_id, subnet_ids_by_az=self.network.subnet_ids,
            node_security_groups={g: n.security_group.id for g, n in self.network.groups.items()},
            opts=child)
        self.identity = NodeIdentity(f"{name}-node-identity", grants=self.datasets.grants, tags=spec.tags,
                                     opts=child)
        self.node_groups = {
            group.name: GpuNodeGroup(f"{name}-{group.name}", spec=spec, group=group,
                                     network=self.network.groups[group.name],
                                     instance_profile_arn=self.identity.instance_profile.arn,
                                     data_mounts=self.datasets.mounts, opts=child)
            for group in spec.node_groups
        }
        self.guardrails = Guardrails(
            f"{name}-guardrails", spec,
            {g: GroupTarget(asg_name=n.asg.name, asg_arn=n.asg.arn) for g, n in self.node_groups.items()},
            opts=child)
        placement = {g: n.placement_group for g, n in self.network.groups.items()}
        self.outputs = {
            "cluster_name": spec.cluster.name,
            "region": spec.region,
            "vpc_id": self.network.vpc_id,
            "subnet_ids": self.network.subnet_ids,
            "node_groups": {
                group.name: {
                    "instance_types": list(group.instance_types),
                    "efa": group.efa_enabled,
                    "availability_zones": spec.azs_of(group),
                    "asg_name": self.node_groups[group.name].asg.name,
                    "launch_template_id": self.node_groups[group.name].launch_template.id,
                    "security_group_id": self.network.groups[group.name].security_group.id,
                    "placement_group_name": pg.name if (pg := placement[group.name]) else None,
                }
                for group in spec.node_groups
            },
            "datasets": self.datasets.outputs,
            **self.guardrails.outputs,
        }
        self.register_outputs(self.outputs)
