"""GpuCluster: the one component a stack builds, composing every part of a cluster.

It owns the order in which parts are built and what each part is handed
(network ids to node groups, bucket ARNs to node IAM, ASG names to the
guardrails), and the stack's outputs. It must not build resources itself:
each part is a ComponentResource of its own module, parented to this one.

Order: network, then the S3 grants and data mounts the nodes need, then the
node identity (IAM), then one GpuNodeGroup per node group.
"""

from __future__ import annotations

from typing import Any

import pulumi

from components.iam import NodeIdentity
from components.network import ClusterNetwork
from components.nodes import GpuNodeGroup
from components.parts import DataMount, S3Grant
from components.spec import StackSpec


def existing_dataset_grants(spec: StackSpec) -> list[S3Grant]:
    """S3 access to the datasets in buckets that already exist (names known from config).

    Read the data prefix; write only the checkpoint prefix, when one is set.
    """
    grants = []
    for d in spec.datasets:
        if d.existing and d.bucket_name:
            grants.append(S3Grant(bucket_name=d.bucket_name, prefix=d.prefix))
            if d.checkpoint_prefix is not None:
                grants.append(S3Grant(bucket_name=d.bucket_name, prefix=d.checkpoint_prefix, write=True))
    return grants


def existing_dataset_mounts(spec: StackSpec) -> list[DataMount]:
    """Data mounts of existing-bucket datasets that need no created resource (not FSx)."""
    mounts = []
    for d in spec.datasets:
        if d.existing and d.bucket_name and d.access != "fsx":
            path = "" if d.access == "copy_to_scratch" else (d.mount_path or f"/data/{d.name}")
            mounts.append(DataMount(name=d.name, access=d.access, bucket_name=d.bucket_name,
                                    prefix=d.prefix, path=path))
    return mounts


class GpuCluster(pulumi.ComponentResource):
    """A GPU cluster described by a validated StackSpec."""

    outputs: dict[str, Any]
    network: ClusterNetwork
    identity: NodeIdentity
    node_groups: dict[str, GpuNodeGroup]
    """Group name -> its component; `.asg` is the Auto Scaling group the guardrails act on."""

    def __init__(self, name: str, spec: StackSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpucluster:cluster:GpuCluster", name, None, opts)
        self.spec = spec
        child = pulumi.ResourceOptions(parent=self)
        self.network = ClusterNetwork(f"{name}-network", spec, opts=child)
        self.grants: list[S3Grant] = existing_dataset_grants(spec)
        self.mounts: list[DataMount] = existing_dataset_mounts(spec)
        self.identity = NodeIdentity(f"{name}-node-identity", grants=self.grants, tags=spec.tags, opts=child)
        self.node_groups = {
            group.name: GpuNodeGroup(f"{name}-{group.name}", spec=spec, group=group,
                                     network=self.network.groups[group.name],
                                     instance_profile_arn=self.identity.instance_profile.arn,
                                     data_mounts=self.mounts, opts=child)
            for group in spec.node_groups
        }
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
        }
        self.register_outputs(self.outputs)
