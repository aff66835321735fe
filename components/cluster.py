"""GpuCluster: the one component a stack builds, composing every part of a cluster.

It owns the order in which parts are built and what each part is handed
(network ids to node groups, bucket ARNs to node IAM, ASG names to the
guardrails), and the stack's outputs. It must not build resources itself:
each part is a ComponentResource of its own module, parented to this one.
"""

from __future__ import annotations

from typing import Any

import pulumi

from components.spec import StackSpec


class GpuCluster(pulumi.ComponentResource):
    """A GPU cluster described by a validated StackSpec."""

    outputs: dict[str, Any]

    def __init__(self, name: str, spec: StackSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpucluster:cluster:GpuCluster", name, None, opts)
        self.spec = spec
        self.outputs = {
            "cluster_name": spec.cluster.name,
            "region": spec.region,
            "node_groups": {
                group.name: {
                    "instance_types": list(group.instance_types),
                    "efa": group.efa_enabled,
                    "availability_zones": spec.azs_of(group),
                }
                for group in spec.node_groups
            },
        }
        self.register_outputs(self.outputs)
