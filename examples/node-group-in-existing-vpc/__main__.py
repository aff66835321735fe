"""A GPU node group in a VPC you already have: your subnets, your security group.

NodeIdentity gives the nodes a role (SSM, CloudWatch agent) and GpuNodeGroup a
launch template (IMDSv2 only, no public address, encrypted root volume, the
NVMe scratch RAID and the GPU metrics bootstrap) and an Auto Scaling group
whose new nodes wait for their own GPU health check (a launch lifecycle hook;
the role gets a policy to answer it, and to mark a failing node unhealthy, for
this group only; `health_checks: {enabled: false}` in node_group turns it off).
Nothing here creates or changes your VPC. The security group is yours: for a
multi-node group it must allow all traffic within itself (NCCL's ports are not
fixed; EFA requires it), and outbound 443 for SSM, S3 and CloudWatch.
"""

import pulumi

from gpucluster import GpuNodeGroup, NodeIdentity

config = pulumi.Config()
region = pulumi.Config("aws").require("region")
zone = config.require("availability_zone")

identity = NodeIdentity("inference-nodes", {"cluster_name": "research", "tags": {"team": "research"}})

nodes = GpuNodeGroup("inference", {
    "cluster_name": "research",
    "region": region,
    # The value the guardrails and `gpucluster status` find this group by (gpucluster:stack tag).
    "identity": f"{pulumi.get_project()}/{pulumi.get_stack()}",
    "subnet_ids": config.require_object("subnet_ids"),
    "security_group_ids": [config.require("security_group_id")],
    "instance_profile_arn": identity.instance_profile_arn,
    "node_role_name": identity.role_name,  # the profile's role: it may answer this group's health check
    "tags": {"team": "research"},
    "node_group": {
        "name": "l4-inference",
        "instance_types": ["g6.12xlarge", "g6.24xlarge"],
        "min_nodes": 0,
        "desired_nodes": 1,
        "max_nodes": 4,
        "availability_zones": [zone],
        "capacity": {"on_demand_base": 1, "spot_percent": 50},
    },
})

pulumi.export("asg_name", nodes.asg_name)
pulumi.export("launch_template_id", nodes.launch_template_id)
pulumi.export("node_role_arn", identity.role_arn)
