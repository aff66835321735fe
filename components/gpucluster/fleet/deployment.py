"""The guardrail handlers' deployment contract: entry points, environment, IAM actions. Standard library only.

`gpucluster.aws.guardrails` deploys each handler from this table (so the
Pulumi program imports it without boto3) and a test holds the deployed
environment and policies to it. It must never import boto3, Pulumi or a
handler module: it is carried into the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

import hashlib
import re

STATE_TABLE_ENV = "GUARD_STATE_TABLE"
PCS_CLUSTER_ENV = "PCS_CLUSTER_ID"
"""The environment variable naming a Slurm stack's PCS cluster (set: the handler acts on PCS groups)."""
"""The environment variable naming the stack's guard-state table (set: the handler uses `guardstate`)."""


def state_table_name(identity: str) -> str:
    """The guard-state table of a deployment identity: derived, so `ops` finds it without an output.

    DynamoDB table names are 3-255 characters of a-z, A-Z, 0-9, '_', '-', '.' (DynamoDB developer
    guide, "Supported data types and naming rules"); an identity holds '/', so it is folded to '-'
    and a hash of the identity keeps two identities that fold alike apart.
    """
    folded = re.sub(r"[^A-Za-z0-9_.-]+", "-", identity).strip("-")[:200]
    return f"gpucluster-guard-{folded}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


# Lambda handler strings: the deploy zips `components/gpucluster/lambdas` as package `lambdas`
# (beside `gpucluster/fleet/`, the core they call: `gpucluster.aws.guardrail_lambda.lambda_code`).
HANDLERS: dict[str, str] = {
    "budget_action": "lambdas.budget_action.handler",
    "autostop": "lambdas.autostop.handler",
    "spot_interruption": "lambdas.spot_interruption.handler",
    "report": "lambdas.report.handler",
    "capacity_block": "lambdas.capacity_block.handler",
    "job_restart": "lambdas.job_restart.handler",
    "spend_guard": "lambdas.spend_guard.handler",
}

# Environment each handler reads (GPUCLUSTER_STACK is required, the rest optional).
ENVIRONMENT: dict[str, tuple[str, ...]] = {
    "budget_action": ("GPUCLUSTER_STACK", "NOTIFY_TOPIC_ARN", STATE_TABLE_ENV),
    "autostop": (
        "GPUCLUSTER_STACK",
        "PRE_STOP_COMMAND",
        "PRE_STOP_TIMEOUT_SECONDS",
        "MAX_LIFETIME_HOURS",
        "NOTIFY_TOPIC_ARN",
        STATE_TABLE_ENV,
    ),
    "spot_interruption": (
        "GPUCLUSTER_STACK",
        "INTERRUPTION_COMMAND",
        "INTERRUPTION_TIMEOUT_SECONDS",
        "NOTIFY_TOPIC_ARN",
    ),
    "report": (
        "GPUCLUSTER_STACK",
        "NOTIFY_TOPIC_ARN",
        "REPORT_PERIOD",
        "MONTHLY_LIMIT_USD",
        "IDLE_THRESHOLD_PERCENT",
        "GPU_METRIC_NAMESPACE",
    ),
    "capacity_block": (
        "GPUCLUSTER_STACK",
        "CAPACITY_BLOCK_GROUPS",
        "PRE_STOP_COMMAND",
        "PRE_STOP_TIMEOUT_SECONDS",
        "NOTIFY_TOPIC_ARN",
        STATE_TABLE_ENV,
    ),
    "job_restart": ("GPUCLUSTER_STACK", "RUN_LOG_GROUP", "NOTIFY_TOPIC_ARN"),
    "spend_guard": (
        "GPUCLUSTER_STACK",
        "LIMIT_USD",
        "PRICES_JSON",
        "CHECK_MINUTES",
        "MAX_USD_PER_HOUR",
        "NOTIFY_TOPIC_ARN",
        STATE_TABLE_ENV,
    ),
}

# Least-privilege actions per handler, beyond CloudWatch Logs (AWSLambdaBasicExecutionRole).
# Describe* and ssm:GetCommandInvocation need Resource "*"; the mutating autoscaling
# actions can be limited with the condition aws:ResourceTag/gpucluster:stack = <stack>;
# ssm:SendCommand needs the AWS-RunShellScript document ARN and the instance ARNs
# (condition ssm:resourceTag/gpucluster:stack, the tag propagates at launch);
# sns:Publish needs only the notify topic; the guard-state calls only the table, and only items whose
# partition key is the stack (dynamodb:LeadingKeys).
STATE_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query")
IAM_ACTIONS: dict[str, tuple[str, ...]] = {
    "budget_action": (
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:CreateOrUpdateTags",
        "sns:Publish",
        *STATE_ACTIONS,
    ),
    "autostop": (
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:CreateOrUpdateTags",
        "autoscaling:DeleteTags",
        "cloudwatch:DescribeAlarms",
        "ec2:DescribeInstances",
        "ssm:SendCommand",
        "ssm:GetCommandInvocation",
        "sns:Publish",
        *STATE_ACTIONS,
    ),
    "spot_interruption": (
        "autoscaling:DescribeAutoScalingInstances",
        "autoscaling:DescribeAutoScalingGroups",
        "ssm:SendCommand",
        "ssm:GetCommandInvocation",
        "sns:Publish",
    ),
    "report": (
        "autoscaling:DescribeAutoScalingGroups",
        "ce:GetCostAndUsage",
        "ce:GetCostForecast",
        "cloudwatch:GetMetricData",
    ),
    "capacity_block": (
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:CreateOrUpdateTags",
        "ssm:SendCommand",
        "ssm:GetCommandInvocation",
        "sns:Publish",
        *STATE_ACTIONS,
    ),
    "job_restart": (
        "autoscaling:DescribeAutoScalingGroups",
        "ec2:DescribeInstances",
        "ssm:GetParametersByPath",
        "ssm:PutParameter",
        "ssm:SendCommand",
        "logs:FilterLogEvents",
        "sns:Publish",
    ),
    # ce:GetCostAndUsage, ec2:DescribeSpotPriceHistory, cloudwatch:GetMetricData and pricing:GetProducts
    # list no resource types (Service Authorization Reference): Resource "*", like the other reads;
    # ec2:DescribeCapacityReservations (a Capacity Block's fee, fleet.capacityblocks) neither (cfn-lint's
    # AdditionalSpecs/Policies.json, a test reads it).
    "spend_guard": (
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:CreateOrUpdateTags",
        "ec2:DescribeInstances",
        "ec2:DescribeSpotPriceHistory",
        "ec2:DescribeCapacityReservations",
        "ce:GetCostAndUsage",
        "cloudwatch:GetMetricData",
        "pricing:GetProducts",
        "sns:Publish",
        *STATE_ACTIONS,
    ),
}


# On a Slurm stack (PCS_CLUSTER_ID set), what the stopping handlers do besides the above: read and set
# the PCS compute node groups' scaling (pcs:*, only on the stack's cluster and its node groups: the
# Pulumi side scopes them by ARN, `guardrail_lambda.pcs_statements`), and hold/release the partitions
# on the login node (ec2:DescribeInstances to find it, ssm:SendCommand on instances of this stack,
# ssm:GetCommandInvocation for the result).
PCS_ACTIONS = ("pcs:ListComputeNodeGroups", "pcs:GetComputeNodeGroup", "pcs:UpdateComputeNodeGroup")
LOGIN_NODE_ACTIONS = ("ec2:DescribeInstances", "ssm:SendCommand", "ssm:GetCommandInvocation")
# What the PCS user guide's "Minimum permissions for AWS PCS" page ("Minimum permissions to use API
# actions", its UpdateComputeNodeGroup row; ledger: pcs-update-permissions) lists besides the pcs: action:
# pass the node role, read its instance profile, launch and tag (RunInstances, CreateFleet, CreateTags) and
# the EC2 describes below (DescribeImages is in the row's console-only column, so not here); its
# "Minimum permissions to use Capacity Blocks" adds ec2:DescribeCapacityReservations to creating or
# updating a group on a Capacity Block. Whether PCS checks them on an update that changes only
# scalingConfiguration (all a stop or a start sends) is not documented: until measured in an account
# (ledger: pcs-update-permissions) the roles carry them, each scoped to the stack
# (`guardrail_lambda.pcs_update_statements`), so a stop is never refused for lack of them.
PCS_UPDATE_DESCRIBES = ("ec2:DescribeCapacityReservations", "ec2:DescribeInstanceTypeOfferings",
                        "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplates",
                        "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeSecurityGroups",
                        "ec2:DescribeSubnets", "ec2:DescribeVpcs")
PCS_UPDATE_CHECKS = ("iam:PassRole", "iam:GetInstanceProfile", "ec2:RunInstances", "ec2:CreateFleet",
                     "ec2:CreateTags", *PCS_UPDATE_DESCRIBES)
# The handlers that stop or start groups, and so read PCS_CLUSTER_ID on a Slurm stack (the environment
# beyond ENVIRONMENT, set only there).
PCS_IAM_ACTIONS: dict[str, tuple[str, ...]] = {
    **{name: (*PCS_ACTIONS, *PCS_UPDATE_CHECKS, *LOGIN_NODE_ACTIONS)
       for name in ("budget_action", "autostop", "capacity_block", "spend_guard")},
    # A spot warning requeues the node's jobs from the login node; it changes no capacity.
    "spot_interruption": LOGIN_NODE_ACTIONS,
}


# What a Slurm stack's stopping Lambdas get on top of their timeout to wait for a group to be ACTIVE
# (`aws.guardrail_lambda`): a stop right after a schedule start meets a group UPDATING for minutes.
# A chosen allowance (no AWS figure for how long an update takes backs it); a longer wait fails the
# invocation, and the schedule's retry or the next tick stops the group.
PCS_ACTIVE_WAIT_SECONDS = 300
