"""Node health on AWS: a GPU node group's launch lifecycle hook, and what its nodes may do about their health.

It owns the AWS side of `health_checks`: the hook that holds every new node in
`Pending:Wait` until the node's own check (`gpucluster.node` health-check.sh)
answers CONTINUE or ABANDON (ABANDON when nobody answers), and the IAM
statements a node needs for that: complete the launch action of its own group,
mark itself Unhealthy in its own group, count health events in its cluster's
namespace, and publish to the stack's topic (`gpucluster.noderole`, where the
spec sizes them with the role's other policies). Pure: no resources, no AWS
call; `GpuNodeGroup` declares the hook and the role policy from these.
"""

from typing import TYPE_CHECKING

from gpucluster.node.userdata import LAUNCH_HOOK_NAME
from gpucluster.noderole import health_policy_document, node_health_statements
from gpucluster.spec import NodeGroupConfig

if TYPE_CHECKING:
    from pulumi_aws.autoscaling import GroupInitialLifecycleHookArgsDict

__all__ = ["GROUP_METRICS", "LAUNCH_TRANSITION", "health_policy_document", "launch_hook",
           "node_health_statements"]

LAUNCH_TRANSITION = "autoscaling:EC2_INSTANCE_LAUNCHING"
# The group metrics the dashboard shows; free at 1-minute granularity (EC2 Auto Scaling user guide,
# "Amazon CloudWatch metrics for Amazon EC2 Auto Scaling": group metrics).
GROUP_METRICS = ("GroupDesiredCapacity", "GroupInServiceInstances", "GroupPendingInstances")


def launch_hook(group: NodeGroupConfig) -> "GroupInitialLifecycleHookArgsDict":
    """The launch lifecycle hook: nodes wait for their check; silence past the timeout abandons them.

    EC2 Auto Scaling user guide, "Amazon EC2 Auto Scaling lifecycle hooks": the instance
    stays in Pending:Wait until CompleteLifecycleAction or the heartbeat timeout, after
    which the default result applies; ABANDON terminates it and the group launches another.
    """
    return {"name": LAUNCH_HOOK_NAME, "lifecycle_transition": LAUNCH_TRANSITION, "default_result": "ABANDON",
            "heartbeat_timeout": group.launch_timeout_minutes * 60}
