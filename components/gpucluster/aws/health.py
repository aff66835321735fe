"""Node health on AWS: a GPU node group's launch lifecycle hook, and what its nodes may do about their health.

It owns the AWS side of `health_checks`: the hook that holds every new node in
`Pending:Wait` until the node's own check (`gpucluster.node` health-check.sh)
answers CONTINUE or ABANDON (ABANDON when nobody answers), and the IAM
statements a node needs for that: complete the launch action of its own group,
mark itself Unhealthy in its own group, count health events in its cluster's
namespace, and publish to the stack's topic. Pure: no resources, no AWS call;
`GpuNodeGroup` declares the hook and the role policy from these.
"""

from typing import Any

from gpucluster.node.userdata import LAUNCH_HOOK_NAME
from gpucluster.spec import HealthCheckConfig

LAUNCH_TRANSITION = "autoscaling:EC2_INSTANCE_LAUNCHING"
STACK_TAG = "gpucluster:stack"  # gpucluster.aws.args.STACK_TAG (that module loads Pulumi)
NODE_GROUP_TAG = "gpucluster:node-group"  # gpucluster.aws.nodes.NODE_GROUP_TAG
# Read-only, and without resource-level permissions (Service Authorization Reference, "Amazon EC2
# Auto Scaling": DescribeAutoScalingInstances lists no resource type): how a node finds its group.
FIND_GROUP_ACTION = "autoscaling:DescribeAutoScalingInstances"
# The group metrics the dashboard shows; free at 1-minute granularity (EC2 Auto Scaling user guide,
# "Amazon CloudWatch metrics for Amazon EC2 Auto Scaling": group metrics).
GROUP_METRICS = ("GroupDesiredCapacity", "GroupInServiceInstances", "GroupPendingInstances")


def launch_hook(h: HealthCheckConfig) -> dict[str, Any]:
    """The launch lifecycle hook: nodes wait for their check; silence past the timeout abandons them.

    EC2 Auto Scaling user guide, "Amazon EC2 Auto Scaling lifecycle hooks": the instance
    stays in Pending:Wait until CompleteLifecycleAction or the heartbeat timeout, after
    which the default result applies; ABANDON terminates it and the group launches another.
    """
    return {"name": LAUNCH_HOOK_NAME, "lifecycle_transition": LAUNCH_TRANSITION, "default_result": "ABANDON",
            "heartbeat_timeout": h.launch_timeout_minutes * 60}


def node_health_statements(*, asg_arn: str, identity: str, group: str, namespace: str, region: str,
                           replace: bool, topic_arn: str = "", key_arn: str = "") -> list[dict[str, Any]]:
    """What a node of one group may do about its health, and nothing for any other group.

    Lifecycle and health writes name the group's ARN and require its identity and
    node-group tags, so a role shared by mistake still cannot reach another stack's or
    another group's nodes. IAM cannot narrow SetInstanceHealth to the caller's own
    instance (the action's only resource is the group), so each group has a role of its
    own. Metrics only into the cluster's namespace; the topic's key only through SNS.
    """
    own = {"StringEquals": {f"autoscaling:ResourceTag/{STACK_TAG}": identity,
                            f"autoscaling:ResourceTag/{NODE_GROUP_TAG}": group}}
    writes = ["autoscaling:CompleteLifecycleAction"] + (["autoscaling:SetInstanceHealth"] if replace else [])
    statements: list[dict[str, Any]] = [
        {"Sid": "FindOwnGroup", "Effect": "Allow", "Action": [FIND_GROUP_ACTION], "Resource": "*"},
        {"Sid": "ReportOwnHealth", "Effect": "Allow", "Action": writes, "Resource": [asg_arn],
         "Condition": own},
        {"Sid": "CountHealthEvents", "Effect": "Allow", "Action": ["cloudwatch:PutMetricData"],
         "Resource": "*", "Condition": {"StringEquals": {"cloudwatch:namespace": namespace}}},
    ]
    if topic_arn:
        statements.append({"Sid": "NotifyStackTopic", "Effect": "Allow", "Action": ["sns:Publish"],
                           "Resource": [topic_arn]})
        if key_arn:
            # Publishers to a KMS-encrypted topic need the key (SNS developer guide, "Key management").
            via_sns = {"StringEquals": {"kms:ViaService": f"sns.{region}.amazonaws.com"}}
            statements.append({"Sid": "EncryptForTopic", "Effect": "Allow",
                               "Action": ["kms:GenerateDataKey*", "kms:Decrypt"], "Resource": [key_arn],
                               "Condition": via_sns})
    return statements
