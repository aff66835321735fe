"""What an operator's IAM identity needs for the day-two commands, as one policy document.

`nodes`, `hostfile`, `run` (and `--nccl-test`), `jobs`, `logs` (and `--follow`),
`cancel`, `scale`, `stop`, `start`, `status` (with its GPU health columns), `resume` and
`image build`, and `verify` (VERIFY_ACTIONS, all read-only; its launch check's DryRun needs
VERIFY_LAUNCH_ACTIONS, left out; its opt-in Slurm `--job` sends a command to the login node, as `run`
does) call only the actions below, and write only to groups and
instances carrying the stack's
identity tag, and to its own job records (`run --restart-on-replace`). The README shows
this document (a test keeps the two equal, and checks every AWS call those commands make
is in it). Pure: no AWS call, no Pulumi.
"""

from __future__ import annotations

from typing import Any

from gpucluster.fleet.deployment import STATE_ACTIONS, state_table_name
from gpucluster.fleet.jobnames import jobs_parameter_path
from gpucluster.fleet.runcommand import RUN_SHELL_DOCUMENT
from gpucluster.fleet.tags import STACK_TAG, STATE_TAGS
from gpucluster.noderole import run_log_group_name

# `gpucluster verify` (ops/verify.py): describes, lists and IAM's policy simulator, nothing that changes
# anything. Resource "*": these reads name resources of many types (functions, roles, topics, schedules,
# alarms, buckets); sts:GetCallerIdentity needs no permission (STS API reference).
VERIFY_ACTIONS = ("lambda:GetFunctionConfiguration", "iam:SimulatePrincipalPolicy", "iam:GetInstanceProfile",
                  "sns:GetTopicAttributes", "sns:ListSubscriptionsByTopic", "kms:DescribeKey",
                  "ec2:DescribeLaunchTemplates", "ec2:DescribeLaunchTemplateVersions",
                  "ec2:DescribeVpcEndpoints", "s3:ListAllMyBuckets", "scheduler:GetSchedule",
                  "events:DescribeRule", "cloudwatch:DescribeAlarms", "aps:ListWorkspaces",
                  "pcs:ListComputeNodeGroups",
                  # the feature checks (ops/verifyfeatures.py): AMP's query API, Grafana, Image Builder, PCS
                  "aps:QueryMetrics", "grafana:ListWorkspaces", "grafana:DescribeWorkspace",
                  "imagebuilder:ListImagePipelineImages", "pcs:ListClusters", "pcs:ListTagsForResource",
                  "pcs:GetCluster", "pcs:ListQueues",
                  # Slurm's ports against the stack's security groups (ops/verifyslurm.py)
                  "ec2:DescribeSecurityGroups", "ec2:DescribeSecurityGroupRules")
# (dynamodb:DescribeTable of the guard-state table: FindGuardState below.)
# An EKS stack: run, jobs, logs, cancel and verify find its cluster by its stack tag (ListClusters,
# DescribeCluster: ops/eksapi.py) and verify reads its add-ons (no resource narrower than the account's
# clusters: the tag is only known once described).
EKS_ACTIONS = ("eks:ListClusters", "eks:DescribeCluster", "eks:ListAddons", "eks:DescribeAddon")
# What `verify`'s launch-template check (RunInstances with DryRun) needs beyond them, and is NOT in the
# operator policy: EC2 authorises a DryRun as the real call, and no IAM condition key this code knows of
# limits ec2:RunInstances to dry runs (ledger: ec2-dry-run-permissions), so it would let an operator launch
# instances. Run verify as a role that may launch (the deploy role) for that check; as the operator it
# fails with UnauthorizedOperation and says so.
VERIFY_LAUNCH_ACTIONS = ("ec2:RunInstances", "iam:PassRole")


def operator_policy(identity: str, region: str = "REGION", account: str = "ACCOUNT_ID",
                    partition: str = "aws") -> dict[str, Any]:
    """The least-privilege policy of someone who operates the stack `identity`.

    Describe calls, GetCommandInvocation/CancelCommand and CloudWatch's GetMetricData have
    no resource-level permissions (Service Authorization Reference), hence "*". SendCommand is
    authorised on the document and on every target instance, so the instance
    statement's tag condition keeps it on this stack's nodes (Systems Manager user
    guide, "Restricting Run Command access based on tags"). Auto Scaling writes are
    limited to groups tagged with the stack, and tag writes to the stop-state tags.
    """
    owned = {"StringEquals": {f"autoscaling:ResourceTag/{STACK_TAG}": identity}}
    state_table = f"arn:{partition}:dynamodb:{region}:{account}:table/{state_table_name(identity)}"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadTheStack", "Effect": "Allow", "Resource": "*",
         "Action": ["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances",
                    "ssm:DescribeInstanceInformation", "ssm:GetCommandInvocation", "ssm:CancelCommand",
                    # status: is the budget's cost-allocation tag active (Cost Explorer, account-wide)?
                    "ce:ListCostAllocationTags",
                    # status: each group's last health replacement, and its GPU use of the last 15 min
                    "autoscaling:DescribeScalingActivities", "cloudwatch:GetMetricData",
                    # status, nodes: the groups' measured boot times (which series exist, then read)
                    "cloudwatch:ListMetrics",
                    # status: spend so far, as the spend guard measures it (no resource types either;
                    # a Capacity Block's fee from its reservation)
                    "ce:GetCostAndUsage", "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeCapacityReservations", *EKS_ACTIONS]},
        {"Sid": "RunShellDocument", "Effect": "Allow", "Action": ["ssm:SendCommand"],
         "Resource": [f"arn:{partition}:ssm:{region}::document/{RUN_SHELL_DOCUMENT}"]},
        {"Sid": "OnThisStacksInstances", "Effect": "Allow", "Action": ["ssm:SendCommand"],
         "Resource": [f"arn:{partition}:ec2:{region}:{account}:instance/*"],
         "Condition": {"StringEquals": {f"ssm:resourceTag/{STACK_TAG}": identity}}},
        {"Sid": "ScaleThisStacksGroups", "Effect": "Allow", "Action": ["autoscaling:UpdateAutoScalingGroup"],
         "Resource": "*", "Condition": owned},
        {"Sid": "TagStopState", "Effect": "Allow",
         "Action": ["autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"], "Resource": "*",
         "Condition": {**owned, "ForAllValues:StringEquals": {"aws:TagKeys": list(STATE_TAGS)}}},
        {"Sid": "ReadRunOutput", "Effect": "Allow", "Action": ["logs:GetLogEvents", "logs:FilterLogEvents"],
         "Resource": [f"arn:{partition}:logs:{region}:{account}:log-group:{run_log_group_name(identity)}:*"]},
        # image build: find the stack's pipelines, start them (tagged with the stack: Image Builder
        # authorizes on aws:ResourceTag), follow the build, read the AMI's test tags
        {"Sid": "ReadImageBuilds", "Effect": "Allow", "Resource": "*",
         "Action": ["imagebuilder:ListImagePipelines", "imagebuilder:GetImage", "ec2:DescribeImages"]},
        {"Sid": "BuildThisStacksImages", "Effect": "Allow",
         "Action": ["imagebuilder:StartImagePipelineExecution"],
         "Resource": [f"arn:{partition}:imagebuilder:{region}:{account}:image-pipeline/*"],
         "Condition": {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": identity}}},
        # the stack's guard state (lambdas.guardstate): status reads it, stop/start/scale/resume write it
        # conditionally, only this stack's items (dynamodb:LeadingKeys); DescribeTable finds the table
        {"Sid": "FindGuardState", "Effect": "Allow", "Action": ["dynamodb:DescribeTable"],
         "Resource": [state_table]},
        {"Sid": "GuardStateOfThisStack", "Effect": "Allow", "Action": list(STATE_ACTIONS),
         "Resource": [state_table],
         "Condition": {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [identity]}}},
        # the table is encrypted with the stack's guardrail key, used through DynamoDB only
        {"Sid": "GuardStateKeyThroughDynamoDB", "Effect": "Allow",
         "Action": ["kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey"],
         "Resource": [f"arn:{partition}:kms:{region}:{account}:key/*"],
         "Condition": {"StringEquals": {"kms:ViaService": f"dynamodb.{region}.amazonaws.com",
                                        f"aws:ResourceTag/{STACK_TAG}": identity}}},
        # run --detach [--restart-on-replace] stores or drops a job's record, cancel drops it
        {"Sid": "JobRecords", "Effect": "Allow", "Action": ["ssm:DeleteParameter", "ssm:PutParameter"],
         "Resource": [f"arn:{partition}:ssm:{region}:{account}:parameter{jobs_parameter_path(identity)}/*"]},
        # verify: read the deployed stack and ask IAM's policy simulator about its roles
        {"Sid": "VerifyTheDeployedStack", "Effect": "Allow", "Action": list(VERIFY_ACTIONS), "Resource": "*"},
    ]}


def allowed_actions(policy: dict[str, Any]) -> set[str]:
    return {action for statement in policy["Statement"] for action in statement["Action"]}
