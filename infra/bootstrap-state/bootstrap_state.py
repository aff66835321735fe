"""Bootstrap a self-managed Pulumi backend and GitHub OIDC roles for gpucluster (boto3, idempotent).

In one AWS account it makes sure there are:
- a KMS key (yearly rotation) with an alias: Pulumi's secrets provider, `awskms://alias/...`;
- the state bucket: versioned, SSE-KMS with that key, all public access blocked, a TLS-only
  policy, ACLs off (bucket owner enforced);
- two permissions boundaries: the *workload* boundary every role a deploy role creates must
  carry (the cluster's node, Lambda and Scheduler roles: no IAM, no data deletion), and the
  *deploy* boundary on the deploy roles themselves (no data deletion, no boundary tampering,
  no role without the workload boundary, no change to the CI roles or the state key and bucket);
- GitHub's OIDC identity provider and the roles it may assume: one deploy role per
  environment, assumable only by `.github/workflows/deploy-stack.yml` on `main` in that
  GitHub environment, and one preview role, assumable only by pull-request jobs of `pr.yml` in
  the `preview` environment. Both need the repository's customised OIDC subject (printed).
  No long-lived keys anywhere.
What a deploy role may do is enumerated per resource type the program creates
(`DEPLOY_ACTIONS`, checked against `gpucluster plan --json` by tests/test_bootstrap_state.py).
It prints what to set in GitHub and the `pulumi login` / `pulumi stack init` commands. It never
deletes or loosens anything else that exists. Usage (with admin credentials, once per account):

    python infra/bootstrap-state/bootstrap_state.py --bucket acme-gpucluster-state \\
        --github-repo acme/gpucluster --region us-east-1 --break-glass-role acme-break-glass
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

GITHUB_OIDC_URL = "https://token.actions.githubusercontent.com"
GITHUB_OIDC_HOST = "token.actions.githubusercontent.com"
AUDIENCE = "sts.amazonaws.com"
# GitHub docs, "OpenID Connect reference" > "Customizing the subject claims": with these keys the
# subject reads `repo:O/R:environment:E:ref:REF:job_workflow_ref:O/R/PATH@REF`, so a trust policy
# can pin the environment, the branch that ran and the workflow file that asked for the token.
SUBJECT_CLAIM_KEYS = ["repo", "context", "ref", "job_workflow_ref"]
DEPLOY_WORKFLOW = ".github/workflows/deploy-stack.yml"
PREVIEW_WORKFLOW = ".github/workflows/pr.yml"
DEPLOY_BRANCH = "main"
PREVIEW_ENVIRONMENT = "preview"
SERVICE_LINKED = ["autoscaling.amazonaws.com", "spot.amazonaws.com", "fsx.amazonaws.com",
                  "s3.data-source.lustre.fsx.amazonaws.com",
                  # EC2 Image Builder user guide, "Using service-linked roles for Image Builder"
                  "imagebuilder.amazonaws.com",
                  # Amazon EKS makes AWSServiceRoleForAmazonEKS at the first CreateCluster and
                  # AWSServiceRoleForAmazonEKSNodegroup at the first managed node group (EKS user guide,
                  # "Using service-linked roles for Amazon EKS"; ledger: eks-deploy-permissions)
                  "eks.amazonaws.com", "eks-nodegroup.amazonaws.com"]
# The services the stacks' roles are passed to: EC2 (node instance profile), Lambda (guardrail
# functions), EventBridge Scheduler (the autostop and spend guard schedules' roles), VPC Flow Logs
# (the flow-log delivery role: CreateFlowLogs passes it, VPC user guide "IAM role for publishing
# flow logs to CloudWatch Logs").
PASSED_TO = ["ec2.amazonaws.com", "lambda.amazonaws.com", "scheduler.amazonaws.com",
             "vpc-flow-logs.amazonaws.com",
             "grafana.amazonaws.com",  # observability.grafana's workspace role
             # EKS: the cluster role (CreateCluster), the system and GPU node roles (CreateNodegroup, and an
             # EC2_LINUX access entry: "the IAM principal creating the access entry must have the
             # iam:PassRole permission", EKS user guide "Create access entries"), the pod roles
             # (CreatePodIdentityAssociation). The service names each call passes to (eks.amazonaws.com,
             # pods.eks.amazonaws.com) are unverified (ledger: eks-deploy-permissions)
             "eks.amazonaws.com", "pods.eks.amazonaws.com"]
# The AWS managed policies the program attaches (components/gpucluster/aws/iam.py MANAGED_POLICIES);
# attaching any other managed policy is refused (`iam:PolicyARN`).
MANAGED_POLICIES = ["AmazonSSMManagedInstanceCore",
                    # the image build instances' (components/gpucluster/aws/images.py BUILD_MANAGED_POLICIES)
                    "EC2InstanceProfileForImageBuilder",
                    # EKS: the nodes' (aws/iam.py EKS_NODE_POLICIES) and the cluster role's (aws/eks.py
                    # CLUSTER_POLICIES)
                    "AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly",
                    "AmazonEKSClusterPolicy"]
# Public SSM parameters the program reads (the Deep Learning AMI id, nodes.py DEFAULT_AMI_PARAMETER).
PUBLIC_PARAMETERS = "parameter/aws/service/*"
STACK_TAG = "gpucluster:stack"
# The name prefix of everything the stacks create (their cluster.name), unless --iam-prefix says otherwise.
DEFAULT_IAM_PREFIX = "gpu-"

# Data deletion that needs the break-glass role (issue 12, item 4): old object versions and whole
# buckets (a plain DeleteObject on a versioned bucket only adds a delete marker), FSx file systems
# and their backups.
# The guard-state table (who stopped which group, the capacity to give back) is data too.
DATA_DELETION = ["s3:DeleteObjectVersion", "s3:DeleteBucket", "fsx:DeleteFileSystem", "fsx:DeleteBackup",
                 "dynamodb:DeleteTable"]

# What an EKS node's role does, through the AWS managed policies the program attaches to it (aws/iam.py
# EKS_NODE_POLICIES: AmazonEKSWorkerNodePolicy, AmazonEKS_CNI_Policy, AmazonEC2ContainerRegistryReadOnly),
# as moto 5.2.5 ships their documents (tests compare them with the boundary): join the cluster, let the pod
# identity agent fetch the pods' credentials, run the VPC CNI's interfaces and addresses, read ECR. The CNI's
# interface writes are on "*" in its policy: the boundary cannot narrow them by name (EC2 ids are AWS's).
EKS_NODE_ACTIONS = [
    "eks:DescribeCluster", "eks-auth:AssumeRoleForPodIdentity",
    "ec2:AssignPrivateIpAddresses", "ec2:UnassignPrivateIpAddresses", "ec2:AttachNetworkInterface",
    "ec2:DetachNetworkInterface", "ec2:CreateNetworkInterface", "ec2:DeleteNetworkInterface",
    "ec2:ModifyNetworkInterfaceAttribute",
    # AmazonEC2ContainerRegistryReadOnly's reads beyond the image pulls below (all Describe/List/Get)
    "ecr:Describe*", "ecr:List*", "ecr:GetRepositoryPolicy", "ecr:GetLifecyclePolicy*",
]
# What AmazonEKSClusterPolicy lets the EKS control plane's role do (the in-tree cloud provider's volumes,
# security groups, routes and Classic/Network Load Balancers; moto 5.2.5's copy of the policy), beyond
# EKS_NODE_ACTIONS and WORKLOAD_ACTIONS (its autoscaling, CreateTags, EC2 describes and kms:DescribeKey are
# there). The cluster role carries the workload boundary like every stack role (the deploy boundary refuses
# any other), so the boundary allows these only to a role named as
# aws/eks.py names it (`eks_workload_caps`: the EksCluster component's `<cluster>-eks-role-*`, plus the
# secrets key's grants). A deploy role could give another role that name: the cap is then these actions,
# still no IAM but ELB's service-linked role, no data deletion.
EKS_CLUSTER_ROLE_ACTIONS = [
    "ec2:AttachVolume", "ec2:AuthorizeSecurityGroupIngress", "ec2:CreateRoute", "ec2:CreateSecurityGroup",
    "ec2:CreateVolume", "ec2:DeleteRoute", "ec2:DeleteSecurityGroup", "ec2:DeleteVolume", "ec2:DetachVolume",
    "ec2:ModifyInstanceAttribute", "ec2:ModifyVolume", "ec2:RevokeSecurityGroupIngress",
    # its 31 Classic and v2 load balancer actions as one wildcard: the boundary holds at most 6,144 characters
    "elasticloadbalancing:*",
    # the secrets key's envelope encryption (aws/eks.py secrets_key_policy)
    "kms:ListGrants", "kms:CreateGrant",
]
EKS_CLUSTER_ROLE_SERVICE_LINKED = "elasticloadbalancing.amazonaws.com"

# What the stacks' own roles may ever do (the workload boundary's allow list): the union of the
# node role (SSM agent, CloudWatch agent, dataset reads and checkpoint writes) and the guardrail
# Lambda and Scheduler roles (components/gpucluster/aws/guardrail_*.py). Sources: the AWS managed
# policies AmazonSSMManagedInstanceCore and CloudWatchAgentServerPolicy (tests compare them).
WORKLOAD_ACTIONS = [
    # Every EC2 describe (read-only metadata) as one wildcard, as autoscaling's: the node role's (its agents,
    # the EKS managed policies), the guardrail Lambdas' (instances, spot prices, Capacity Blocks, PCS
    # updates), the EKS cluster role's and pods' (eks/policies.py); the boundary holds 6,144 characters.
    "ec2:Describe*",
    "autoscaling:Describe*", "autoscaling:UpdateAutoScalingGroup", "autoscaling:CreateOrUpdateTags",
    "autoscaling:DeleteTags", "autoscaling:CompleteLifecycleAction",
    "autoscaling:RecordLifecycleActionHeartbeat", "autoscaling:SetInstanceHealth",
    "cloudwatch:PutMetricData",
    "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams",
    "logs:DescribeLogGroups", "logs:PutRetentionPolicy",
    "ssm:GetCommandInvocation", "ssm:DescribeAssociation", "ssm:GetDeployablePatchSnapshotForInstance",
    "ssm:GetDocument", "ssm:DescribeDocument", "ssm:GetManifest", "ssm:GetParameter", "ssm:GetParameters",
    "ssm:ListAssociations", "ssm:ListInstanceAssociations", "ssm:PutInventory", "ssm:PutComplianceItems",
    "ssm:PutConfigurePackageResult", "ssm:UpdateAssociationStatus", "ssm:UpdateInstanceAssociationStatus",
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel", "ssmmessages:CreateDataChannel", "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    "ec2messages:AcknowledgeMessage", "ec2messages:DeleteMessage", "ec2messages:FailMessage",
    "ec2messages:GetEndpoint", "ec2messages:GetMessages", "ec2messages:SendReply",
    "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules", "xray:GetSamplingTargets",
    "xray:GetSamplingStatisticSummaries",
    "sns:Publish", "kms:GenerateDataKey*", "kms:Decrypt", "lambda:InvokeFunction",
    "s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation", "s3:PutObject", "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
    # the job restart Lambda reads the run log group's end lines (its job records: JobRecords below)
    "logs:FilterLogEvents",
    # the stopping Lambdas' guard state (lambdas.guardstate): items only, through the stack's key
    "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "kms:Encrypt", "kms:DescribeKey",
    # nodes pulling a group's ECR image (gpucluster.noderole.ECR_PULL_ACTIONS)
    "ecr:GetAuthorizationToken", "ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer",
    # observability.prometheus: nodes write to the stack's workspace (noderole.metrics_write_policy_document);
    # observability.grafana: the workspace role queries it (aws/prometheus.py QUERY_ACTIONS)
    "aps:RemoteWrite", "aps:GetLabels", "aps:GetMetricMetadata", "aps:GetSeries", "aps:QueryMetrics",
    "aps:ListWorkspaces",
    # image build instances: EC2InstanceProfileForImageBuilder (its snapshot and tag actions carry
    # its own CreatedBy conditions), and the image test's tags on the stack's own AMIs
    # (gpucluster.aws.images.build_policy_document)
    "imagebuilder:GetComponent", "imagebuilder:GetMarketplaceResource", "ec2:CreateSnapshot",
    "ec2:CreateTags",
    # the autostop Lambda reads its idle alarm again before a stop (lambdas/autostop.py alarm_state_now)
    "cloudwatch:DescribeAlarms",
    # the spend guard's and the spend report's reads (lambdas/spend_guard.py, lambdas/report.py)
    # (spot prices: ec2:Describe* above), a Capacity Block's upfront fee from its reservation
    # (fleet/capacityblocks.py; status too: ec2:Describe*)
    "ce:GetCostAndUsage", "ce:GetCostForecast", "cloudwatch:GetMetricData",
    # ...and the spend guard's price of a type its table lacks (the AWS Price List: no resource types)
    "pricing:GetProducts",
    # AWS PCS (scheduler type slurm): a node registers with its compute node group ("IAM instance profiles
    # for AWS Parallel Computing Service"); the guardrail Lambdas read the cluster's node groups and set
    # a group's scaling to stop and resume it (the node-group seam's PCS backend)
    "pcs:RegisterComputeNodeGroupInstance", "pcs:GetCluster", "pcs:GetComputeNodeGroup",
    "pcs:ListComputeNodeGroups", "pcs:UpdateComputeNodeGroup",
    # ...and the EC2 describes the PCS guide's minimum permissions list for UpdateComputeNodeGroup
    # (gpucluster.fleet.deployment.PCS_UPDATE_DESCRIBES: ec2:Describe* above; its launches and role passing:
    # `pcs_update_caps`)
    *EKS_NODE_ACTIONS,
    # EKS pods (eks/policies.py), each role taken through EKS Pod Identity: the termination handler receives
    # from its queue (on the stacks' queues only: `eks_workload_caps`), the autoscaler reads images and
    # instance requirements (the autoscaler's own minimum policy); their Auto Scaling writes:
    # `eks_workload_caps`
    "ec2:GetInstanceTypesFromInstanceRequirements",
]

# What each resource type the program creates needs from the deploy role (create, read, update,
# delete, tag), by Pulumi type token. IAM types are granted by `iam_statements` with their
# conditions; the rest by `deploy_statements`, each on the resources `SCOPES` names.
DEPLOY_ACTIONS: dict[str, list[str]] = {
    # The guard-state table (pulumi-aws reads it with DescribeTable, DescribeContinuousBackups for
    # point-in-time recovery, DescribeTimeToLive and ListTagsOfResource). No DeleteTable: the
    # table is protected data (DATA_DELETION), like the buckets.
    "aws:dynamodb/table:Table": [
        "dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:UpdateTable",
        "dynamodb:DescribeContinuousBackups", "dynamodb:UpdateContinuousBackups",
        "dynamodb:DescribeTimeToLive", "dynamodb:TagResource", "dynamodb:UntagResource",
        "dynamodb:ListTagsOfResource"],
    "aws:ec2/vpc:Vpc": ["ec2:CreateVpc", "ec2:DeleteVpc", "ec2:ModifyVpcAttribute"],
    "aws:ec2/subnet:Subnet": ["ec2:CreateSubnet", "ec2:DeleteSubnet", "ec2:ModifySubnetAttribute"],
    "aws:ec2/internetGateway:InternetGateway": ["ec2:CreateInternetGateway", "ec2:DeleteInternetGateway",
                                                "ec2:AttachInternetGateway", "ec2:DetachInternetGateway"],
    "aws:ec2/eip:Eip": ["ec2:AllocateAddress", "ec2:ReleaseAddress", "ec2:DisassociateAddress"],
    "aws:ec2/natGateway:NatGateway": ["ec2:CreateNatGateway", "ec2:DeleteNatGateway"],
    "aws:ec2/routeTable:RouteTable": ["ec2:CreateRouteTable", "ec2:DeleteRouteTable"],
    "aws:ec2/route:Route": ["ec2:CreateRoute", "ec2:ReplaceRoute", "ec2:DeleteRoute"],
    "aws:ec2/routeTableAssociation:RouteTableAssociation": [
        "ec2:AssociateRouteTable", "ec2:DisassociateRouteTable", "ec2:ReplaceRouteTableAssociation"],
    "aws:ec2/securityGroup:SecurityGroup": [
        "ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup", "ec2:AuthorizeSecurityGroupIngress",
        "ec2:RevokeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress",
        "ec2:RevokeSecurityGroupEgress"],
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": [
        "ec2:RevokeSecurityGroupIngress", "ec2:RevokeSecurityGroupEgress"],
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": [
        "ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress",
        "ec2:ModifySecurityGroupRules"],
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": [
        "ec2:AuthorizeSecurityGroupEgress", "ec2:RevokeSecurityGroupEgress", "ec2:ModifySecurityGroupRules"],
    # Interface endpoints with private DNS associate a private hosted zone (Service Authorization
    # Reference, "Amazon EC2": CreateVpcEndpoint's dependent action).
    "aws:ec2/vpcEndpoint:VpcEndpoint": ["ec2:CreateVpcEndpoint", "ec2:ModifyVpcEndpoint",
                                        "ec2:DeleteVpcEndpoints", "route53:AssociateVPCWithHostedZone"],
    "aws:ec2/placementGroup:PlacementGroup": ["ec2:CreatePlacementGroup", "ec2:DeletePlacementGroup"],
    "aws:ec2/launchTemplate:LaunchTemplate": [
        "ec2:CreateLaunchTemplate", "ec2:CreateLaunchTemplateVersion", "ec2:ModifyLaunchTemplate",
        "ec2:DeleteLaunchTemplate", "ec2:DeleteLaunchTemplateVersions"],
    # A group with a launch template needs the caller to be allowed ec2:RunInstances on it (EC2 Auto
    # Scaling user guide, "Permissions to use launch templates"); instances start with the role's
    # instance profile, hence iam:PassRole to ec2.amazonaws.com.
    "aws:autoscaling/group:Group": [
        "autoscaling:CreateAutoScalingGroup", "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:DeleteAutoScalingGroup", "autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags",
        "autoscaling:PutLifecycleHook", "autoscaling:DeleteLifecycleHook", "autoscaling:SuspendProcesses",
        "autoscaling:ResumeProcesses", "autoscaling:EnableMetricsCollection",
        "autoscaling:DisableMetricsCollection", "autoscaling:SetInstanceProtection", "ec2:RunInstances"],
    # The launch check's hook, managed apart from the group after creation (aws/nodes.py).
    "aws:autoscaling/lifecycleHook:LifecycleHook": ["autoscaling:PutLifecycleHook",
                                                    "autoscaling:DeleteLifecycleHook"],
    "aws:iam/role:Role": [
        "iam:CreateRole", "iam:DeleteRole", "iam:GetRole", "iam:UpdateRole", "iam:UpdateRoleDescription",
        "iam:UpdateAssumeRolePolicy", "iam:TagRole", "iam:UntagRole", "iam:ListRoleTags",
        "iam:ListRolePolicies", "iam:ListAttachedRolePolicies", "iam:ListInstanceProfilesForRole",
        "iam:PutRolePermissionsBoundary", "iam:PassRole"],
    "aws:iam/rolePolicy:RolePolicy": ["iam:PutRolePolicy", "iam:GetRolePolicy", "iam:DeleteRolePolicy"],
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": [
        "iam:AttachRolePolicy", "iam:DetachRolePolicy", "iam:ListAttachedRolePolicies"],
    "aws:iam/instanceProfile:InstanceProfile": [
        "iam:CreateInstanceProfile", "iam:DeleteInstanceProfile", "iam:GetInstanceProfile",
        "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:TagInstanceProfile",
        "iam:UntagInstanceProfile", "iam:ListInstanceProfileTags"],
    "aws:s3/bucket:Bucket": ["s3:CreateBucket", "s3:ListBucket", "s3:GetBucket*",
                             "s3:GetAccelerateConfiguration",
                             "s3:GetReplicationConfiguration", "s3:PutBucketTagging"],
    "aws:s3/bucketVersioning:BucketVersioning": ["s3:PutBucketVersioning", "s3:GetBucketVersioning"],
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": [
        "s3:PutLifecycleConfiguration", "s3:GetLifecycleConfiguration"],
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": [
        "s3:PutEncryptionConfiguration", "s3:GetEncryptionConfiguration"],
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": [
        "s3:PutBucketPublicAccessBlock", "s3:GetBucketPublicAccessBlock"],
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": [
        "s3:PutBucketOwnershipControls", "s3:GetBucketOwnershipControls"],
    "aws:s3/bucketPolicy:BucketPolicy": ["s3:PutBucketPolicy", "s3:GetBucketPolicy", "s3:DeleteBucketPolicy"],
    # the node scripts bundle (components/gpucluster/aws/nodescripts.py): uploaded with its tags and
    # SHA-256 checksum, read back; retained on delete, so never deleted by a deploy
    "aws:s3/bucketObjectv2:BucketObjectv2": ["s3:PutObject", "s3:GetObject", "s3:GetObjectTagging",
                                             "s3:PutObjectTagging", "s3:GetObjectAttributes"],
    "aws:fsx/lustreFileSystem:LustreFileSystem": [
        "fsx:CreateFileSystem", "fsx:UpdateFileSystem", "fsx:TagResource", "fsx:UntagResource",
        "fsx:ListTagsForResource"],
    # Linking a file system to S3 (FSx for Lustre user guide, "Adding permissions to use data
    # repositories in Amazon S3"): FSx's S3-access service-linked role moves the data; the caller may
    # have FSx create it and set its policies (`iam_statements`) and reads the bucket
    # (DATASET_LINK_ACTIONS for an existing one; the stacks' own buckets: their s3 scope).
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": [
        "fsx:CreateDataRepositoryAssociation", "fsx:UpdateDataRepositoryAssociation",
        "fsx:DeleteDataRepositoryAssociation", "fsx:TagResource", "s3:PutObject"],
    "aws:kms/key:Key": [
        "kms:DescribeKey", "kms:GetKeyPolicy", "kms:GetKeyRotationStatus", "kms:ListResourceTags",
        "kms:PutKeyPolicy", "kms:EnableKeyRotation", "kms:TagResource", "kms:UntagResource",
        "kms:UpdateKeyDescription", "kms:ScheduleKeyDeletion"],
    "aws:kms/alias:Alias": ["kms:CreateAlias", "kms:DeleteAlias", "kms:UpdateAlias"],
    "aws:sns/topic:Topic": ["sns:CreateTopic", "sns:DeleteTopic", "sns:GetTopicAttributes",
                            "sns:SetTopicAttributes", "sns:TagResource", "sns:UntagResource",
                            "sns:ListTagsForResource"],
    "aws:sns/topicPolicy:TopicPolicy": ["sns:SetTopicAttributes", "sns:GetTopicAttributes"],
    # Subscribe and ListSubscriptionsByTopic act on the topic; Unsubscribe, Get/SetSubscriptionAttributes
    # have no resource type (Service Authorization Reference, "Amazon SNS": a subscription is not an IAM
    # resource), so a topic ARN never matches them: they are in UNSCOPED_ACTIONS, on "*".
    "aws:sns/topicSubscription:TopicSubscription": ["sns:Subscribe", "sns:ListSubscriptionsByTopic"],
    "aws:cloudwatch/logGroup:LogGroup": [
        "logs:CreateLogGroup", "logs:DeleteLogGroup", "logs:PutRetentionPolicy", "logs:DeleteRetentionPolicy",
        # the flow-log group is KMS-encrypted (kms_key_id)
        "logs:AssociateKmsKey", "logs:DisassociateKmsKey",
        "logs:TagResource", "logs:UntagResource", "logs:ListTagsForResource", "logs:TagLogGroup",
        "logs:ListTagsLogGroup"],
    "aws:cloudwatch/metricAlarm:MetricAlarm": [
        "cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms", "cloudwatch:TagResource",
        "cloudwatch:UntagResource", "cloudwatch:ListTagsForResource"],
    # the idle alarm: nothing runs OR GPUs idle (aws/guardrail_events.py)
    "aws:cloudwatch/compositeAlarm:CompositeAlarm": [
        "cloudwatch:PutCompositeAlarm", "cloudwatch:DeleteAlarms", "cloudwatch:TagResource",
        "cloudwatch:UntagResource", "cloudwatch:ListTagsForResource"],
    # VPC flow logs to a CloudWatch log group (aws/network.py); the delivery role is passed
    # (PASSED_TO). CreateFlowLogs/DeleteFlowLogs act on the VPC and the flow log (ec2 scope "*").
    "aws:ec2/flowLog:FlowLog": ["ec2:CreateFlowLogs", "ec2:DeleteFlowLogs"],
    "aws:cloudwatch/dashboard:Dashboard": ["cloudwatch:PutDashboard", "cloudwatch:GetDashboard",
                                           "cloudwatch:DeleteDashboards"],
    "aws:cloudwatch/logMetricFilter:LogMetricFilter": ["logs:PutMetricFilter", "logs:DeleteMetricFilter"],
    "aws:cloudwatch/eventRule:EventRule": [
        "events:PutRule", "events:DeleteRule", "events:DescribeRule", "events:EnableRule",
        "events:DisableRule",
        "events:TagResource", "events:UntagResource", "events:ListTagsForResource"],
    "aws:cloudwatch/eventTarget:EventTarget": ["events:PutTargets", "events:RemoveTargets",
                                               "events:ListTargetsByRule"],
    "aws:scheduler/schedule:Schedule": ["scheduler:CreateSchedule", "scheduler:UpdateSchedule",
                                        "scheduler:DeleteSchedule", "scheduler:GetSchedule"],
    "aws:lambda/function:Function": [
        "lambda:CreateFunction", "lambda:DeleteFunction", "lambda:GetFunction",
        "lambda:GetFunctionConfiguration",
        "lambda:UpdateFunctionCode", "lambda:UpdateFunctionConfiguration", "lambda:ListVersionsByFunction",
        "lambda:GetFunctionCodeSigningConfig", "lambda:GetRuntimeManagementConfig",
        "lambda:GetFunctionConcurrency", "lambda:PutFunctionConcurrency", "lambda:DeleteFunctionConcurrency",
        "lambda:TagResource", "lambda:UntagResource", "lambda:ListTags"],
    "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig": [
        "lambda:PutFunctionEventInvokeConfig", "lambda:UpdateFunctionEventInvokeConfig",
        "lambda:GetFunctionEventInvokeConfig", "lambda:DeleteFunctionEventInvokeConfig"],
    "aws:lambda/permission:Permission": ["lambda:AddPermission", "lambda:RemovePermission",
                                         "lambda:GetPolicy"],
    # observability (aws/prometheus.py). AMP with a customer managed key makes grants on it (AMP user
    # guide, "Encryption at rest"): kms:CreateGrant on the stack's own keys (KEY_ADMIN is denied on any
    # other), its data-key use through AMP only (`deploy_statements`).
    "aws:amp/workspace:Workspace": [
        "aps:CreateWorkspace", "aps:DescribeWorkspace", "aps:UpdateWorkspaceAlias", "aps:DeleteWorkspace",
        "aps:TagResource", "aps:UntagResource", "aps:ListTagsForResource", "kms:CreateGrant",
        "kms:DescribeKey"],
    "aws:amp/ruleGroupNamespace:RuleGroupNamespace": [
        "aps:CreateRuleGroupsNamespace", "aps:DescribeRuleGroupsNamespace", "aps:PutRuleGroupsNamespace",
        "aps:DeleteRuleGroupsNamespace", "aps:TagResource", "aps:ListTagsForResource"],
    # A workspace signing in with IAM Identity Center registers a managed application there (Amazon
    # Managed Grafana user guide, "Create a workspace": the permissions it needs).
    "aws:grafana/workspace:Workspace": [
        "grafana:CreateWorkspace", "grafana:DescribeWorkspace", "grafana:UpdateWorkspace",
        "grafana:DeleteWorkspace", "grafana:DescribeWorkspaceConfiguration",
        "grafana:UpdateWorkspaceConfiguration", "grafana:TagResource", "grafana:UntagResource",
        "grafana:ListTagsForResource", "sso:CreateManagedApplicationInstance",
        "sso:DeleteManagedApplicationInstance", "sso:DescribeRegisteredRegions",
        "sso:GetSharedSsoConfiguration", "organizations:DescribeOrganization"],
    "aws:grafana/workspaceSamlConfiguration:WorkspaceSamlConfiguration": [
        "grafana:UpdateWorkspaceAuthentication", "grafana:DescribeWorkspaceAuthentication"],
    # `pulumi up` provisions the dashboards (components/gpucluster/aws/grafana_dashboards.py): a Grafana
    # service account of the stack's workspace and a short-lived token (AMG API reference, service
    # accounts; resource type: the workspace).
    "aws:grafana/workspaceServiceAccount:WorkspaceServiceAccount": [
        "grafana:CreateWorkspaceServiceAccount", "grafana:DeleteWorkspaceServiceAccount",
        "grafana:ListWorkspaceServiceAccounts"],
    "aws:grafana/workspaceServiceAccountToken:WorkspaceServiceAccountToken": [
        "grafana:CreateWorkspaceServiceAccountToken", "grafana:DeleteWorkspaceServiceAccountToken",
        "grafana:ListWorkspaceServiceAccountTokens"],
    # The dynamic resource that posts them calls Grafana's HTTP API with that token: no AWS action.
    "pulumi-python:dynamic:Resource": [],
    # EC2 Image Builder (gpucluster:images): Service Authorization Reference, "Actions defined by EC2
    # Image Builder"; creating a recipe reads its parent image (ec2:DescribeImages, unscoped below).
    "aws:imagebuilder/component:Component": [
        "imagebuilder:CreateComponent", "imagebuilder:DeleteComponent", "imagebuilder:GetComponent",
        "imagebuilder:TagResource", "imagebuilder:UntagResource", "imagebuilder:ListTagsForResource"],
    "aws:imagebuilder/imageRecipe:ImageRecipe": [
        "imagebuilder:CreateImageRecipe", "imagebuilder:DeleteImageRecipe", "imagebuilder:GetImageRecipe",
        "imagebuilder:GetComponent", "imagebuilder:TagResource", "imagebuilder:UntagResource",
        "imagebuilder:ListTagsForResource"],
    "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration": [
        "imagebuilder:CreateInfrastructureConfiguration", "imagebuilder:UpdateInfrastructureConfiguration",
        "imagebuilder:DeleteInfrastructureConfiguration", "imagebuilder:GetInfrastructureConfiguration",
        "imagebuilder:TagResource", "imagebuilder:UntagResource", "imagebuilder:ListTagsForResource"],
    "aws:imagebuilder/distributionConfiguration:DistributionConfiguration": [
        "imagebuilder:CreateDistributionConfiguration", "imagebuilder:UpdateDistributionConfiguration",
        "imagebuilder:DeleteDistributionConfiguration", "imagebuilder:GetDistributionConfiguration",
        "imagebuilder:TagResource", "imagebuilder:UntagResource", "imagebuilder:ListTagsForResource"],
    "aws:imagebuilder/imagePipeline:ImagePipeline": [
        "imagebuilder:CreateImagePipeline", "imagebuilder:UpdateImagePipeline",
        "imagebuilder:DeleteImagePipeline", "imagebuilder:GetImagePipeline",
        "imagebuilder:TagResource", "imagebuilder:UntagResource", "imagebuilder:ListTagsForResource"],
    "aws:budgets/budget:Budget": ["budgets:ModifyBudget", "budgets:ViewBudget", "budgets:TagResource",
                                  "budgets:UntagResource", "budgets:ListTagsForResource"],
    # AWS PCS (gpucluster:scheduler type slurm): the cluster as an `AWS::PCS::Cluster` Cloud Control
    # resource (pulumi-aws's aws:cloudcontrol/resource:Resource, the only Cloud Control resource the program
    # makes: aws-native's Cluster type lacks the cluster's own Slurm settings, see gpucluster.aws.pcs), its
    # node groups and queues by pulumi-aws-native; both go through the Cloud Control API (CLOUD_CONTROL: it
    # calls PCS with the caller's own permissions, so it reaches nothing the role could not). PCS ids are
    # generated, so `deploy_statements` scopes these by the stack tag (`pcs_statements`). Beyond the pcs:
    # actions, as the PCS user guide's "Minimum permissions for AWS PCS" lists them
    # (ledger: pcs-create-permissions): CreateCluster makes the
    # controller's network interface, reads the VPC's security groups and keeps the Slurm key in a Secrets
    # Manager secret it creates and rotates (secretsmanager:RotateSecret, scoped like CreateSecret to the
    # `pcs!` secrets); Create/UpdateComputeNodeGroup check the caller may launch (RunInstances, CreateFleet),
    # tag at launch (TagInstancesOnlyAtLaunch), read the node profile (iam:GetInstanceProfile: the stacks'
    # profiles, aws:iam/instanceProfile) and pass the node role (PassPcsNodeRoles); the EC2 describes are
    # in UNSCOPED_ACTIONS (ec2:Describe*). PCS's service-linked role launches the instances.
    "aws:cloudcontrol/resource:Resource": [
        "pcs:CreateCluster", "pcs:GetCluster", "pcs:UpdateCluster", "pcs:DeleteCluster", "pcs:TagResource",
        "pcs:UntagResource", "pcs:ListTagsForResource", "ec2:CreateNetworkInterface",
        "ec2:GetSecurityGroupsForVpc", "secretsmanager:CreateSecret", "secretsmanager:RotateSecret",
        "secretsmanager:TagResource"],
    "aws-native:pcs:ComputeNodeGroup": [
        "pcs:CreateComputeNodeGroup", "pcs:GetComputeNodeGroup", "pcs:UpdateComputeNodeGroup",
        "pcs:DeleteComputeNodeGroup", "pcs:TagResource", "pcs:UntagResource", "pcs:ListTagsForResource",
        "ec2:RunInstances", "ec2:CreateFleet"],
    "aws-native:pcs:Queue": [
        "pcs:CreateQueue", "pcs:GetQueue", "pcs:UpdateQueue", "pcs:DeleteQueue", "pcs:TagResource",
        "pcs:UntagResource", "pcs:ListTagsForResource"],
    # Amazon EKS (gpucluster:scheduler type eks: aws/eks.py, aws/eks_software.py). Resource types from the
    # Service Authorization Reference (cfn-lint 1.58's Policies.json; condition keys: parliament 1.6.4's
    # copy): CreateCluster has none (CREATES_WITHOUT_RESOURCE_TYPE: "*", only with the stack tag in the
    # request); CreateAddon, CreateAccessEntry, CreateNodegroup and CreatePodIdentityAssociation act on the
    # cluster, the rest on the cluster or the add-on, access entry, node group or association under it
    # (`eks_statements`: the stacks' names, and the stack tag on the resource). DescribeUpdate: the provider
    # waits on the update an Update* call starts. CreateCluster passes the cluster role (PASSED_TO) and
    # makes EKS's service-linked role (SERVICE_LINKED); with secrets encryption the caller needs the key's
    # kms:DescribeKey and kms:CreateGrant (ledger: eks-deploy-permissions); the subnets' and security
    # groups' describes are ec2:Describe* (UNSCOPED_ACTIONS).
    "aws:eks/cluster:Cluster": [
        "eks:CreateCluster", "eks:DescribeCluster", "eks:UpdateClusterConfig", "eks:UpdateClusterVersion",
        "eks:DeleteCluster", "eks:DescribeUpdate", "eks:TagResource", "eks:UntagResource",
        "eks:ListTagsForResource", "kms:DescribeKey", "kms:CreateGrant"],
    "aws:eks/addon:Addon": [
        "eks:CreateAddon", "eks:DescribeAddon", "eks:UpdateAddon", "eks:DeleteAddon", "eks:DescribeUpdate",
        "eks:TagResource", "eks:UntagResource", "eks:ListTagsForResource"],
    # An EC2_LINUX entry passes the node role ("the IAM principal creating the access entry must have the
    # iam:PassRole permission", EKS user guide, "Create access entries"). ListTagsForResource has no
    # access-entry or association resource type: their tags come back with Describe*.
    "aws:eks/accessEntry:AccessEntry": [
        "eks:CreateAccessEntry", "eks:DescribeAccessEntry", "eks:UpdateAccessEntry", "eks:DeleteAccessEntry",
        "eks:TagResource", "eks:UntagResource", "iam:PassRole"],
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": [
        "eks:CreatePodIdentityAssociation", "eks:DescribePodIdentityAssociation",
        "eks:UpdatePodIdentityAssociation", "eks:DeletePodIdentityAssociation", "eks:TagResource",
        "eks:UntagResource", "iam:PassRole", "iam:GetRole"],
    # The system node group: EKS launches it through its node group service-linked role; the caller
    # passes the node role.
    "aws:eks/nodeGroup:NodeGroup": [
        "eks:CreateNodegroup", "eks:DescribeNodegroup", "eks:UpdateNodegroupConfig",
        "eks:UpdateNodegroupVersion", "eks:DeleteNodegroup", "eks:DescribeUpdate", "eks:TagResource",
        "eks:UntagResource", "eks:ListTagsForResource", "iam:PassRole"],
    # The node termination handler's queue (aws/eks_software.py) and its policy (a queue attribute).
    "aws:sqs/queue:Queue": [
        "sqs:CreateQueue", "sqs:GetQueueAttributes", "sqs:SetQueueAttributes", "sqs:GetQueueUrl",
        "sqs:DeleteQueue", "sqs:TagQueue", "sqs:UntagQueue", "sqs:ListQueueTags"],
    "aws:sqs/queuePolicy:QueuePolicy": ["sqs:SetQueueAttributes", "sqs:GetQueueAttributes"],
}
# What an EKS stack deploys through the cluster's Kubernetes API, not through AWS: the charts
# (helm.v3.Release) and the typed objects (aws/eks_software.py). IAM authorises none of it: the deploy
# role administers the cluster because it created it (aws/eks.py, bootstrap_cluster_creator_admin_permissions
# is True), reaching it with the token `aws eks get-token` makes, a presigned sts:GetCallerIdentity
# (ledger: eks-token-format), which needs no permission (STS API reference, GetCallerIdentity); of IAM
# it needs only eks:DescribeCluster (the endpoint and CA), granted above.
KUBERNETES_TYPES = [
    "kubernetes:helm.sh/v3:Release", "kubernetes:core/v1:Namespace",
    # Kueue's objects (apiextensions.CustomResource: typed by their apiVersion and kind; eks/queues.py)
    "kubernetes:kueue.x-k8s.io/v1beta1:ResourceFlavor", "kubernetes:kueue.x-k8s.io/v1beta1:ClusterQueue",
    "kubernetes:kueue.x-k8s.io/v1beta1:LocalQueue",
    "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
    "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding",
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"]
for _token in KUBERNETES_TYPES:
    DEPLOY_ACTIONS[_token] = []
# The Cloud Control API, through which pulumi-aws-native creates, reads, updates and deletes (AWS Cloud
# Control API user guide, "Identity and access management": it acts with the caller's permissions for the
# resource type's own service). Its actions have no resource type (Service Authorization Reference,
# "AWS Cloud Control API"): granted on "*".
CLOUD_CONTROL = ["cloudformation:CreateResource", "cloudformation:GetResource",
                 "cloudformation:UpdateResource", "cloudformation:DeleteResource",
                 "cloudformation:GetResourceRequestStatus", "cloudformation:ListResources"]
CLOUD_CONTROL_READS = ["cloudformation:GetResource", "cloudformation:ListResources",
                       "cloudformation:GetResourceRequestStatus"]
for _token in ("aws:cloudcontrol/resource:Resource", "aws-native:pcs:ComputeNodeGroup",
               "aws-native:pcs:Queue"):
    DEPLOY_ACTIONS[_token] += CLOUD_CONTROL
# A PCS resource's ARN carries its generated id, not a name (arn:...:pcs:<region>:<account>:cluster/<id>,
# its node groups and queues under it), so the stack tag scopes them: a request that creates one must
# carry the tag, and anything else acts only on a resource that has it.
PCS_CREATES = ["pcs:CreateCluster", "pcs:CreateComputeNodeGroup", "pcs:CreateQueue", "pcs:TagResource"]
# Node groups and queues are created *in* a cluster: the Service Authorization Reference authorises
# CreateComputeNodeGroup and CreateQueue on the parent `cluster` resource, whose condition keys are
# aws:ResourceTag/${TagKey} (checked in cfn-lint 1.58's bundled IAM data, data/AdditionalSpecs/Policies.json),
# so the parent's stack tag scopes them: no node group or queue in a cluster of no stack.
PCS_CREATES_IN_A_CLUSTER = ["pcs:CreateComputeNodeGroup", "pcs:CreateQueue"]
PCS_READS = ["pcs:GetCluster", "pcs:GetComputeNodeGroup", "pcs:GetQueue"]
# Creates with no resource type (Service Authorization Reference, "Actions defined by Amazon Managed Service
# for Prometheus / Amazon Managed Grafana / AWS PCS"; cfn-lint's bundled IAM data lists no resource for
# them): an ARN never matches them, so they are granted on "*", only with the stack tag in the request.
CREATES_WITHOUT_RESOURCE_TYPE = ["aps:CreateWorkspace", "grafana:CreateWorkspace", "pcs:CreateCluster",
                                 "eks:CreateCluster"]
# EKS actions not narrowed by the stack tag on the resource (`eks_statements`): tagging and reading tags
# (eks:TagResource's tag-on-create form has no resource tag to read yet), and DescribeCluster, which the
# deploy workflow's `gpucluster doctor` gate asks before the cluster exists (gpucluster.ops.doctor
# EKS_ACTIONS: a name no cluster has answers ResourceNotFoundException only to a caller allowed to ask;
# ledger: eks-describe-authz).
EKS_BY_NAME = ["eks:TagResource", "eks:UntagResource", "eks:ListTagsForResource", "eks:DescribeCluster"]
# What a preview reads of an EKS stack: the cluster and what is under it, by name (no wildcard: eks:Describe*
# would take in DescribeAddonVersions and DescribeClusterVersions, which have no resource type), and the
# cluster list (no resource type).
EKS_READS = ["eks:DescribeCluster", "eks:DescribeAddon", "eks:DescribeAccessEntry", "eks:DescribeNodegroup",
             "eks:DescribePodIdentityAssociation", "eks:DescribeUpdate", "eks:ListTagsForResource",
             "eks:ListAddons", "eks:ListAccessEntries", "eks:ListNodegroups",
             "eks:ListPodIdentityAssociations"]
EKS_LISTS = ["eks:ListClusters"]
# pcs:ListTagsForResource has no resource type and no condition keys (same sources): neither an ARN nor a
# tag condition can ever match it, so it is granted alone, unconditioned, on "*" (it reads tags only).
PCS_TAG_READS = ["pcs:ListTagsForResource"]
PCS_LISTS = ["pcs:ListClusters", "pcs:ListComputeNodeGroups", "pcs:ListQueues"]
# AWS PCS makes its service-linked role at the first CreateCluster ("Using service-linked roles for AWS
# PCS": AWSServiceRoleForPCS, service pcs.amazonaws.com); the node role, under /aws-pcs/, is passed only
# to PCS (CreateComputeNodeGroup) and EC2 (the instances).
PCS_SERVICE = "pcs.amazonaws.com"
PCS_NODE_ROLE_PASSED_TO = [PCS_SERVICE, "ec2.amazonaws.com"]
# EC2 actions whose every resource type (Service Authorization Reference, via cfn-lint's copy) is one
# the program creates and tags: deletes, releases, detaches and attribute rewrites. Creates,
# associations and security-group rule edits stay on "*": which sub-resources each EC2 create tags
# (a launch's volumes and interfaces, PCS's cluster interface) and the default security group Pulumi
# adopts untagged are unverified until a deploy (ledger: ec2-deploy-creates-unscoped).
EC2_ONLY_ON_STACK_RESOURCES = [
    "ec2:DeleteVpc", "ec2:DeleteSubnet", "ec2:DeleteSecurityGroup", "ec2:DeleteRouteTable",
    "ec2:DeleteRoute", "ec2:ReplaceRoute", "ec2:DeleteInternetGateway", "ec2:DetachInternetGateway",
    "ec2:DeleteNatGateway", "ec2:ReleaseAddress", "ec2:DeletePlacementGroup", "ec2:DeleteLaunchTemplate",
    "ec2:DeleteLaunchTemplateVersions", "ec2:ModifyLaunchTemplate", "ec2:DeleteVpcEndpoints",
    "ec2:DeleteFlowLogs", "ec2:ModifyVpcAttribute", "ec2:ModifySubnetAttribute"]

# Actions with no resource-level permissions (the Service Authorization Reference lists no resource
# type for them), granted on "*". Tags on a new KMS key need kms:TagResource not restricted to
# particular keys (KMS developer guide, "Controlling access to tags"); the deploy boundary denies
# every key action on a key without the stack tag, so no existing key can be tagged or taken over.
# `gpucluster doctor`, the deploy workflow's gate, also reads quotas and the cost-allocation tags'
# status (gpucluster.ops.doctor.IAM_ACTIONS).
UNSCOPED_ACTIONS = ["ec2:Describe*", "autoscaling:Describe*", "fsx:Describe*", "kms:ListAliases",
                    "aps:ListWorkspaces", "grafana:ListWorkspaces",
                    "logs:DescribeLogGroups", "logs:DescribeMetricFilters", "cloudwatch:DescribeAlarms",
                    "kms:CreateKey", "kms:TagResource",
                    "servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota",
                    "ce:ListCostAllocationTags",
                    "sns:Unsubscribe", "sns:GetSubscriptionAttributes", "sns:SetSubscriptionAttributes",
                    # `doctor`'s supported-version check on an EKS stack (no resource type)
                    "eks:DescribeClusterVersions",
                    *PCS_LISTS]
# What rewrites a bucket's settings (policy, ACL, lifecycle, public access, encryption, replication):
# never allowed on the state bucket nor on existing dataset buckets.
BUCKET_SETTINGS_WRITES = ["s3:PutBucket*", "s3:DeleteBucket*", "s3:PutLifecycleConfiguration",
                          "s3:PutEncryptionConfiguration", "s3:PutReplicationConfiguration"]
KEY_ADMIN = ["kms:PutKeyPolicy", "kms:ScheduleKeyDeletion", "kms:DisableKey", "kms:CreateGrant",
             "kms:TagResource", "kms:UntagResource", "kms:UpdateKeyDescription", "kms:EnableKeyRotation",
             "kms:DisableKeyRotation", "kms:CreateAlias", "kms:UpdateAlias", "kms:DeleteAlias"]


def scopes(partition: str, account: str, prefix: str, buckets: Sequence[str]) -> dict[str, list[str]]:
    """The resources a service's deploy actions may touch: named with the stacks' prefix where the
    API allows (EC2 and FSx ids are generated by AWS, so those services get "*")."""
    p, a = partition, account
    return {
        "ec2": ["*"], "route53": ["*"], "fsx": ["*"],
        "autoscaling": [f"arn:{p}:autoscaling:*:{a}:autoScalingGroup:*:autoScalingGroupName/{prefix}*"],
        # the buckets the stacks create; existing dataset buckets get only the FSx link's reads
        # (`dataset_bucket_statements`), never a bucket-configuration write
        "s3": [f"arn:{p}:s3:::{prefix}*"],
        "kms": [f"arn:{p}:kms:*:{a}:alias/{prefix}*", f"arn:{p}:kms:*:{a}:key/*"],
        "sns": [f"arn:{p}:sns:*:{a}:{prefix}*"],
        # the Lambdas' log groups, and the run log group /gpucluster/<org>/<project>/<stack>/<cluster>/run
        "logs": [f"arn:{p}:logs:*:{a}:log-group:/aws/lambda/{prefix}*",
                 f"arn:{p}:logs:*:{a}:log-group:/gpucluster/*/{prefix}*",
                 # an EKS cluster's control-plane logs (aws/eks.py: /aws/eks/<EKS cluster name>/cluster)
                 f"arn:{p}:logs:*:{a}:log-group:/aws/eks/{prefix}*"],
        # Dashboards are global: their ARN has no region (CloudWatch, "Actions, resources, and
        # condition keys").
        "cloudwatch": [f"arn:{p}:cloudwatch:*:{a}:alarm:{prefix}*",
                       f"arn:{p}:cloudwatch::{a}:dashboard/{prefix}*"],
        "events": [f"arn:{p}:events:*:{a}:rule/{prefix}*"],
        "scheduler": [f"arn:{p}:scheduler:*:{a}:schedule/default/{prefix}*"],
        "lambda": [f"arn:{p}:lambda:*:{a}:function:{prefix}*"],
        "budgets": [f"arn:{p}:budgets::{a}:budget/{prefix}*"],
        # Workspace ids are generated by AWS (ws-<uuid>, g-<id>): the account's, any region.
        "aps": [f"arn:{p}:aps:*:{a}:workspace/*", f"arn:{p}:aps:*:{a}:rulegroupsnamespace/*"],
        "grafana": [f"arn:{p}:grafana:*:{a}:/workspaces/*"],
        # Identity Center's and Organizations' reads and the managed application have no resource type.
        "sso": ["*"], "organizations": ["*"],
        # Image Builder names are gpucluster-<cluster>-... (gpucluster.node.bake.recipe_name)
        "imagebuilder": [f"arn:{p}:imagebuilder:*:{a}:{kind}/gpucluster-{prefix}*" for kind in (
            "component", "image-recipe", "infrastructure-configuration", "distribution-configuration",
            "image-pipeline")],
        # lambdas.handlers.state_table_name: named from the identity, not the prefix
        "dynamodb": [f"arn:{p}:dynamodb:*:{a}:table/gpucluster-guard-*"],
        # AWS PCS: every cluster and what lies under it, narrowed by the stack tag (`pcs_statements`)
        "pcs": [f"arn:{p}:pcs:*:{a}:cluster/*"],
        "cloudformation": ["*"],  # CLOUD_CONTROL: no resource type
        # EKS: the stacks' clusters (aws/eks.py eks_cluster_name: `<cluster name>-<hash>`) and what lies
        # under one, narrowed by the stack tag (`eks_statements`); that an add-on's, access entry's, node
        # group's and association's ARN is <kind>/<cluster>/...: unverified (ledger: eks-deploy-permissions)
        "eks": [f"arn:{p}:eks:*:{a}:cluster/{prefix}*",
                *(f"arn:{p}:eks:*:{a}:{kind}/{prefix}*/*"
                  for kind in ("addon", "access-entry", "nodegroup", "podidentityassociation"))],
        # the termination handler's queue (Pulumi names it `<cluster name>-nth-<suffix>`)
        "sqs": [f"arn:{p}:sqs:*:{a}:{prefix}*"],
        # the cluster's Slurm key; its name pattern is the PCS guide's (ledger: pcs-slurm-key-secret-name)
        "secretsmanager": [f"arn:{p}:secretsmanager:*:{a}:secret:pcs!*"],
    }


@dataclass
class Bootstrap:
    """What was found or made, and what GitHub and Pulumi need to be told."""

    bucket: str
    region: str
    key_arn: str
    key_alias: str
    oidc_provider_arn: str
    preview_role_arn: str
    github_repo: str
    workload_boundary_arn: str
    deploy_boundary_arn: str
    deploy_role_arns: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def backend_url(self) -> str:
        return f"s3://{self.bucket}?region={self.region}&awssdk=v2"

    @property
    def secrets_provider(self) -> str:
        return f"awskms://{self.key_alias}?region={self.region}"

    def instructions(self) -> str:
        keys = " ".join(f"-f 'include_claim_keys[]={k}'" for k in SUBJECT_CLAIM_KEYS)
        lines = ["GitHub: customise the repository's OIDC subject (the roles trust nothing else):",
                 f"  gh api -X PUT repos/{self.github_repo}/actions/oidc/customization/sub "
                 f"-F use_default=false {keys}",
                 "GitHub repository variables:",
                 f"  PULUMI_BACKEND_URL   = {self.backend_url}",
                 f"  AWS_REGION           = {self.region}",
                 f"GitHub environment '{PREVIEW_ENVIRONMENT}' (pull-request previews), variable:",
                 f"  AWS_PREVIEW_ROLE_ARN = {self.preview_role_arn}",
                 "GitHub environments (deployment branches: main only; required reviewers on staging "
                 "and prod), variable AWS_ROLE_ARN:"]
        lines += [f"  {env:<8} AWS_ROLE_ARN = {arn}" for env, arn in self.deploy_role_arns.items()]
        lines += ["Every IAM role a stack creates must carry the permissions boundary:",
                  f"  {self.workload_boundary_arn}",
                  "Then, once per stack, from the repository root:",
                  f"  pulumi login '{self.backend_url}'"]
        lines += [f"  pulumi stack init {env} --secrets-provider '{self.secrets_provider}'"
                  for env in self.deploy_role_arns]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _missing(err: ClientError, *codes: str) -> bool:
    return err.response.get("Error", {}).get("Code") in codes


def _document(statements: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def ensure_kms_key(kms: Any, alias: str) -> str:
    """The alias's key ARN, creating a symmetric key with rotation on when the alias is new."""
    try:
        return str(kms.describe_key(KeyId=alias)["KeyMetadata"]["Arn"])
    except ClientError as err:
        if not _missing(err, "NotFoundException"):
            raise
    key = kms.create_key(Description="gpucluster: Pulumi state secrets and state bucket encryption",
                         KeySpec="SYMMETRIC_DEFAULT", KeyUsage="ENCRYPT_DECRYPT",
                         Tags=[{"TagKey": "gpucluster:purpose", "TagValue": "pulumi-state"}])["KeyMetadata"]
    kms.enable_key_rotation(KeyId=key["KeyId"])
    kms.create_alias(AliasName=alias, TargetKeyId=key["KeyId"])
    return str(key["Arn"])


def tls_only_policy(bucket: str) -> dict[str, Any]:
    arn = f"arn:aws:s3:::{bucket}"
    return _document([{
        "Sid": "DenyPlainHttp", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": [arn, f"{arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}])


def ensure_state_bucket(s3: Any, bucket: str, region: str, key_arn: str) -> None:
    """Create the bucket if needed, then (re)apply versioning, encryption and the blocks."""
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as err:
        if not _missing(err, "404", "NoSuchBucket", "NotFound"):
            raise
        extra = {} if region == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": region}}
        s3.create_bucket(Bucket=bucket, **extra)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [{
        "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key_arn},
        "BucketKeyEnabled": True}]})
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
        "RestrictPublicBuckets": True})
    s3.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls={
        "Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]})
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(tls_only_policy(bucket)))


def ensure_github_oidc(iam: Any, partition: str, account: str) -> str:
    arn = f"arn:{partition}:iam::{account}:oidc-provider/{GITHUB_OIDC_HOST}"
    try:
        iam.get_open_id_connect_provider(OpenIDConnectProviderArn=arn)
        return arn
    except ClientError as err:
        if not _missing(err, "NoSuchEntity"):
            raise
    return str(iam.create_open_id_connect_provider(Url=GITHUB_OIDC_URL, ClientIDList=[AUDIENCE])[
        "OpenIDConnectProviderArn"])


def deploy_subject(repo: str, environment: str) -> str:
    """The customised subject of a deploy-stack.yml job on main in `environment`, and nothing else.

    `ref` is the branch that ran (a branch calling main's workflow remotely still shows its own ref),
    `job_workflow_ref` the reusable workflow that asked for the token, at that same ref.
    """
    ref = f"refs/heads/{DEPLOY_BRANCH}"
    return f"repo:{repo}:environment:{environment}:ref:{ref}:job_workflow_ref:{repo}/{DEPLOY_WORKFLOW}@{ref}"


def preview_subject(repo: str) -> str:
    """pr.yml on a pull request's merge ref, in the preview environment (a StringLike pattern)."""
    ref = "refs/pull/*/merge"
    return (f"repo:{repo}:environment:{PREVIEW_ENVIRONMENT}:ref:{ref}:"
            f"job_workflow_ref:{repo}/{PREVIEW_WORKFLOW}@{ref}")


def trust_policy(provider_arn: str, subject: str) -> dict[str, Any]:
    """Only GitHub tokens for this audience and this subject (`*` only in `refs/pull/*`) may assume."""
    condition: dict[str, dict[str, str]] = {"StringEquals": {f"{GITHUB_OIDC_HOST}:aud": AUDIENCE}}
    condition.setdefault("StringLike" if "*" in subject else "StringEquals", {})[
        f"{GITHUB_OIDC_HOST}:sub"] = subject
    return _document([{
        "Effect": "Allow", "Principal": {"Federated": provider_arn},
        "Action": "sts:AssumeRoleWithWebIdentity", "Condition": condition}])


def _state_paths(project: str, stack: str) -> dict[str, str]:
    """Where Pulumi's S3 backend keeps a stack (project layout: pkg/backend/diy, `StackBasePath`,
    `HistoryDir`, `BackupDir`, `stackLockDir` with the stack's `organization/<project>/<stack>` name)."""
    return {"stack": f".pulumi/stacks/{project}/{stack}.json*",
            "history": f".pulumi/history/{project}/{stack}/*",
            "backups": f".pulumi/backups/{project}/{stack}/*",
            "locks": f".pulumi/locks/organization/{project}/{stack}/*"}


def state_access_policy(bucket: str, key_arn: str, region: str, project: str, stacks: Sequence[str],
                        *, write: bool, partition: str = "aws") -> dict[str, Any]:
    """The Pulumi state of these stacks only: a preview (`write=False`) reads it and writes its lock;
    a deploy also writes the stack's checkpoint, history and backups. Objects are SSE-KMS, so writes
    need the state key's data keys, through S3 only."""
    arn = f"arn:{partition}:s3:::{bucket}"
    paths = [_state_paths(project, s) for s in stacks]
    reads = [f"{arn}/.pulumi/meta.yaml"] + [f"{arn}/{p[k]}" for p in paths for k in p
                                            if write or k in ("stack", "locks")]
    writes = [f"{arn}/{p[k]}" for p in paths for k in p if write or k == "locks"]
    kms_direct = ["kms:Decrypt", "kms:DescribeKey"] + (["kms:Encrypt"] if write else [])
    return _document([
        {"Sid": "ListState", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": arn,
         "Condition": {"StringLike": {"s3:prefix": [".pulumi/*"]}}},
        {"Sid": "ReadState", "Effect": "Allow", "Action": "s3:GetObject", "Resource": reads},
        {"Sid": "WriteOwnStateOrLock", "Effect": "Allow", "Action": ["s3:PutObject", "s3:DeleteObject"],
         "Resource": writes},
        {"Sid": "StackSecrets", "Effect": "Allow", "Action": kms_direct, "Resource": key_arn},
        {"Sid": "StateObjectKeysThroughS3", "Effect": "Allow", "Action": "kms:GenerateDataKey",
         "Resource": key_arn,
         "Condition": {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}},
    ])


def data_deletion_deny(partition: str, break_glass_role: str, account: str) -> dict[str, Any]:
    """Old object versions, buckets and file systems: only the break-glass role deletes them."""
    return {"Sid": "DataDeletionNeedsBreakGlass", "Effect": "Deny", "Action": DATA_DELETION, "Resource": "*",
            "Condition": {"ArnNotEquals": {
                "aws:PrincipalArn": f"arn:{partition}:iam::{account}:role/{break_glass_role}"}}}


def pcs_update_caps(partition: str, account: str, prefix: str) -> list[dict[str, Any]]:
    """The workload boundary's cap on what a guardrail role may need for pcs:UpdateComputeNodeGroup (the
    PCS guide's minimum permissions, issue 34; whether PCS checks them on a scaling-only update is
    unverified; ledger: pcs-update-permissions): pass only the stacks' /aws-pcs/ node roles and only to
    PCS, read only their profiles, launch only what carries a stack's tag in the request, from what carries
    one, or with an image, snapshot or subnet. Each guardrail role narrows these to its own stack
    (gpucluster.aws.guardrail_lambda.pcs_update_statements)."""
    iam, ec2 = f"arn:{partition}:iam::{account}", f"arn:{partition}:ec2:*:{account}"
    launch = ["ec2:CreateFleet", "ec2:RunInstances"]
    return [
        {"Sid": "PassStackPcsNodeRolesToPcs", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": f"{iam}:role/aws-pcs/{prefix}*",
         "Condition": {"StringEquals": {"iam:PassedToService": PCS_SERVICE}}},
        {"Sid": "ReadStackPcsNodeProfiles", "Effect": "Allow", "Action": "iam:GetInstanceProfile",
         "Resource": f"{iam}:instance-profile/aws-pcs/{prefix}*"},
        {"Sid": "LaunchOnlyWithAStackTag", "Effect": "Allow", "Action": launch,
         "Resource": [f"{ec2}:{kind}/*" for kind in ("instance", "volume", "network-interface", "fleet")],
         "Condition": {"Null": {f"aws:RequestTag/{STACK_TAG}": "false"}}},
        {"Sid": "LaunchFromAStacksResources", "Effect": "Allow", "Action": launch,
         "Resource": [f"{ec2}:{kind}/*" for kind in ("launch-template", "security-group", "placement-group")],
         "Condition": {"Null": {f"aws:ResourceTag/{STACK_TAG}": "false"}}},
        # an AMI (AWS's or baked) and its snapshots, and a subnet (an existing VPC's) carry no stack tag
        {"Sid": "LaunchWithImagesAndSubnets", "Effect": "Allow", "Action": launch,
         "Resource": [f"arn:{partition}:ec2:*::image/*", f"arn:{partition}:ec2:*::snapshot/*",
                      f"{ec2}:subnet/*"]},
    ]


def eks_workload_caps(partition: str, account: str, prefix: str) -> list[dict[str, Any]]:
    """The workload boundary's EKS statements: the cluster role's AmazonEKSClusterPolicy (and its secrets
    key's grants) only to a role named as aws/eks.py names the cluster role, with ELB's service-linked role;
    the autoscaler's and termination handler's Auto Scaling writes only on a stack's tagged groups; the
    termination handler's receive and delete only on the stacks' queues (eks/policies.py)."""
    cluster_role = {"ArnLike": {
        "aws:PrincipalArn": f"arn:{partition}:iam::{account}:role/{prefix}*-eks-role-*"}}
    return [
        {"Sid": "EksClusterRole", "Effect": "Allow", "Action": EKS_CLUSTER_ROLE_ACTIONS, "Resource": "*",
         "Condition": cluster_role},
        {"Sid": "EksClusterRoleElb", "Effect": "Allow", "Action": "iam:CreateServiceLinkedRole",
         "Resource": "*", "Condition": {**cluster_role, "StringEquals": {
             "iam:AWSServiceName": EKS_CLUSTER_ROLE_SERVICE_LINKED}}},
        {"Sid": "EksScaleStackGroups", "Effect": "Allow",
         "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
         "Resource": f"arn:{partition}:autoscaling:*:{account}:*",
         "Condition": {"Null": {f"aws:ResourceTag/{STACK_TAG}": "false"}}},
        {"Sid": "EksTerminationQueues", "Effect": "Allow",
         "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"],
         "Resource": f"arn:{partition}:sqs:*:{account}:{prefix}*"},
    ]


def workload_boundary(partition: str, account: str, break_glass_role: str,
                      prefix: str = DEFAULT_IAM_PREFIX) -> dict[str, Any]:
    """The most any role a deploy role creates can ever do: no IAM but passing the stacks' PCS node roles
    to PCS (`pcs_update_caps`), no STS, no data deletion; Run Command only with AWS-RunShellScript on
    instances tagged with a stack (deploy roles cannot tag instances, so they cannot aim it elsewhere)."""
    return _document([
        {"Sid": "ClusterWorkloads", "Effect": "Allow", "Action": WORKLOAD_ACTIONS, "Resource": "*"},
        *pcs_update_caps(partition, account, prefix),
        *eks_workload_caps(partition, account, prefix),
        {"Sid": "RunShellDocument", "Effect": "Allow", "Action": "ssm:SendCommand",
         "Resource": f"arn:{partition}:ssm:*::document/AWS-RunShellScript"},
        {"Sid": "OnStackInstances", "Effect": "Allow", "Action": "ssm:SendCommand",
         "Resource": f"arn:{partition}:ec2:*:{account}:instance/*",
         "Condition": {"Null": {f"ssm:resourceTag/{STACK_TAG}": "false"}}},
        # the job restart Lambda's records (`gpucluster run --restart-on-replace`), and no other parameter
        {"Sid": "JobRecords", "Effect": "Allow", "Action": ["ssm:GetParametersByPath", "ssm:PutParameter"],
         "Resource": f"arn:{partition}:ssm:*:{account}:parameter/gpucluster/*"},
        data_deletion_deny(partition, break_glass_role, account),
    ])


def deploy_boundary(partition: str, account: str, break_glass_role: str, role_prefix: str,
                    boundary_arns: Sequence[str], workload_arn: str, bucket: str,
                    key_arn: str, dataset_buckets: Sequence[str] = ()) -> dict[str, Any]:
    """The deploy roles' own boundary: whatever is attached to them later, these denies hold."""
    iam = f"arn:{partition}:iam::{account}"
    datasets = ([{"Sid": "DatasetBucketsKeepTheirSettings", "Effect": "Deny",
                  "Resource": [f"arn:{partition}:s3:::{b}" for b in dataset_buckets],
                  "Action": BUCKET_SETTINGS_WRITES}] if dataset_buckets else [])
    return _document([
        *datasets,
        # a cap, not a grant: what a deploy role can do is its identity policies (deploy_statements)
        {"Sid": "CapOnly", "Effect": "Allow", "Action": "*", "Resource": "*"},
        data_deletion_deny(partition, break_glass_role, account),
        {"Sid": "BoundariesAreFixed", "Effect": "Deny", "Resource": list(boundary_arns), "Action": [
            "iam:CreatePolicyVersion", "iam:DeletePolicy", "iam:DeletePolicyVersion",
            "iam:SetDefaultPolicyVersion", "iam:TagPolicy", "iam:UntagPolicy"]},
        {"Sid": "NoRoleWithoutTheWorkloadBoundary", "Effect": "Deny",
         "Action": ["iam:CreateRole", "iam:PutRolePolicy", "iam:AttachRolePolicy",
                    "iam:PutRolePermissionsBoundary"],
         "NotResource": f"{iam}:role/aws-service-role/*",
         "Condition": {"StringNotEquals": {"iam:PermissionsBoundary": workload_arn}}},
        {"Sid": "BoundariesStay", "Effect": "Deny", "Resource": "*",
         "Action": ["iam:DeleteRolePermissionsBoundary", "iam:DeleteUserPermissionsBoundary"]},
        {"Sid": "CiRolesAreTheAdminsJob", "Effect": "Deny", "Resource": f"{iam}:role/{role_prefix}-*",
         "NotAction": ["iam:GetRole", "iam:ListRoleTags"]},
        {"Sid": "NoNewPrincipalsOrPolicies", "Effect": "Deny", "Resource": "*", "Action": [
            "iam:CreateUser", "iam:CreateAccessKey", "iam:CreateLoginProfile", "iam:CreateGroup",
            "iam:CreatePolicy", "iam:CreateOpenIDConnectProvider", "iam:CreateSAMLProvider",
            "iam:UpdateOpenIDConnectProviderThumbprint", "sts:AssumeRole"]},
        {"Sid": "StateBucketIsTheAdminsJob", "Effect": "Deny", "Resource": f"arn:{partition}:s3:::{bucket}",
         "Action": BUCKET_SETTINGS_WRITES},
        {"Sid": "StateKeyIsTheAdminsJob", "Effect": "Deny", "Resource": key_arn, "Action": KEY_ADMIN},
        {"Sid": "OnlyKeysOfAStack", "Effect": "Deny", "Action": KEY_ADMIN,
         "Resource": f"arn:{partition}:kms:*:{account}:key/*",
         "Condition": {"Null": {f"aws:ResourceTag/{STACK_TAG}": "true"}}},
    ])


def iam_statements(partition: str, account: str, prefix: str, workload_arn: str) -> list[dict[str, Any]]:
    """IAM for the stacks' roles and instance profiles (named `<prefix>...`). Creating a role or
    changing its policies needs the workload boundary on it (`iam:PermissionsBoundary`), managed
    policies are the program's AWS managed ones (`iam:PolicyARN`), and roles are passed only to the
    services that run them (`iam:PassedToService`)."""
    iam = f"arn:{partition}:iam::{account}"
    role, profile = f"{iam}:role/{prefix}*", f"{iam}:instance-profile/{prefix}*"
    # AWS PCS accepts a node role (and profile) named AWSPCS* or under the path /aws-pcs/ ("IAM instance
    # profiles for AWS Parallel Computing Service"): the stacks' PCS node role is <prefix>* under /aws-pcs/.
    pcs_role, pcs_profile = f"{iam}:role/aws-pcs/{prefix}*", f"{iam}:instance-profile/aws-pcs/{prefix}*"
    roles = [role, pcs_role]
    bounded = {"StringEquals": {"iam:PermissionsBoundary": workload_arn}}
    managed = [f"arn:{partition}:iam::aws:policy/{name}" for name in MANAGED_POLICIES]
    conditioned = {"iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:AttachRolePolicy",
                   "iam:DetachRolePolicy", "iam:PutRolePermissionsBoundary", "iam:PassRole"}
    plain = sorted({a for actions in DEPLOY_ACTIONS.values() for a in actions if a.startswith("iam:")}
                   - conditioned)
    fsx_s3_role = f"{iam}:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/*"
    return [
        {"Sid": "StackRolesAndProfiles", "Effect": "Allow", "Action": plain,
         "Resource": [role, profile, pcs_role, pcs_profile]},
        {"Sid": "RolesOnlyWithTheBoundary", "Effect": "Allow", "Resource": roles, "Condition": bounded,
         "Action": ["iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy",
                    "iam:PutRolePermissionsBoundary", "iam:DetachRolePolicy"]},
        {"Sid": "OnlyTheProgramsManagedPolicies", "Effect": "Allow", "Action": "iam:AttachRolePolicy",
         "Resource": roles, "Condition": {**bounded, "ArnEquals": {"iam:PolicyARN": managed}}},
        {"Sid": "PassOnlyToTheServicesThatRunThem", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": role, "Condition": {"StringEquals": {"iam:PassedToService": PASSED_TO}}},
        {"Sid": "PassPcsNodeRoles", "Effect": "Allow", "Action": "iam:PassRole", "Resource": pcs_role,
         "Condition": {"StringEquals": {"iam:PassedToService": PCS_NODE_ROLE_PASSED_TO}}},
        {"Sid": "PcsServiceLinkedRole", "Effect": "Allow", "Action": "iam:CreateServiceLinkedRole",
         "Resource": f"{iam}:role/aws-service-role/{PCS_SERVICE}/AWSServiceRoleForPCS",
         "Condition": {"StringEquals": {"iam:AWSServiceName": PCS_SERVICE}}},
        {"Sid": "ServiceLinkedRoles", "Effect": "Allow", "Action": "iam:CreateServiceLinkedRole",
         "Resource": f"{iam}:role/aws-service-role/*",
         "Condition": {"StringEquals": {"iam:AWSServiceName": SERVICE_LINKED}}},
        # FSx sets up its own S3-access service-linked role when a file system links to S3; only the
        # FSx service can assume it (FSx for Lustre user guide, "Adding permissions to use data
        # repositories in Amazon S3").
        {"Sid": "FsxS3AccessServiceLinkedRole", "Effect": "Allow",
         "Action": ["iam:AttachRolePolicy", "iam:PutRolePolicy"], "Resource": fsx_s3_role},
    ]


def deploy_statements(partition: str, account: str, prefix: str,
                      buckets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Everything else the program creates, one statement per service, on that service's scope."""
    by_service: dict[str, set[str]] = {}
    for token, actions in DEPLOY_ACTIONS.items():
        if token.startswith("aws:iam/"):
            continue
        for action in actions:
            if not action.startswith("iam:"):  # an EKS type's PassRole: `iam_statements`, with conditions
                by_service.setdefault(action.split(":")[0], set()).add(action)
    unscoped_creates = {a for actions in by_service.values() for a in actions} & set(
        CREATES_WITHOUT_RESOURCE_TYPE)
    scope = scopes(partition, account, prefix, buckets)
    tag_scoped = set(EC2_ONLY_ON_STACK_RESOURCES)
    statements = [{"Sid": f"Stack{service.capitalize()}", "Effect": "Allow",
                   "Action": sorted(actions - unscoped_creates - tag_scoped),
                   "Resource": scope[service]} for service, actions in sorted(by_service.items())
                  if service not in ("pcs", "eks")]
    # EC2 ids are AWS's, so EC2 has no name scope: what deletes, releases or rewrites a network
    # resource is allowed only on one that carries a stack's tag (every EC2 resource the program makes
    # is tagged at create; tests/test_bootstrap_state.py checks the plans).
    statements.append({"Sid": "Ec2ChangesOnlyOnStackResources", "Effect": "Allow",
                       "Action": sorted(by_service.get("ec2", set()) & tag_scoped),
                       "Resource": f"arn:{partition}:ec2:*:{account}:*",
                       "Condition": {"Null": {f"aws:ResourceTag/{STACK_TAG}": "false"}}})
    statements += pcs_statements(partition, account, sorted(by_service.get("pcs", set()) - unscoped_creates))
    statements += eks_statements(scope["eks"], sorted(by_service.get("eks", set()) - unscoped_creates))
    bucket_objects = [f"{b}/*" for b in scope["s3"]]
    statements += [
        # Creates with no resource type: on "*", only when the request tags the new resource with a stack.
        {"Sid": "CreatesWithoutResourceType", "Effect": "Allow", "Action": sorted(unscoped_creates),
         "Resource": "*", "Condition": {"Null": {f"aws:RequestTag/{STACK_TAG}": "false"}}},
        {"Sid": "ReadsWithoutResourceScope", "Effect": "Allow", "Action": UNSCOPED_ACTIONS, "Resource": "*"},
        # AMP encrypts a workspace with the stack's key through grants, and uses its data keys only
        # when AMP asks (kms:ViaService).
        {"Sid": "StackKeysThroughAmp", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
         "Resource": f"arn:{partition}:kms:*:{account}:key/*",
         "Condition": {"StringLike": {"kms:ViaService": "aps.*.amazonaws.com"}}},
        {"Sid": "FsxLinksReadTheBucket", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": bucket_objects},
        *dataset_bucket_statements(partition, buckets),
        public_parameters(partition),
        # Tags on what the program creates; never on an existing instance, so a deploy role cannot
        # re-tag one into a stack (the workload boundary scopes Run Command by that tag).
        {"Sid": "TagNetworkAndTemplates", "Effect": "Allow", "Action": ["ec2:CreateTags", "ec2:DeleteTags"],
         "NotResource": f"arn:{partition}:ec2:*:*:instance/*"},
        # ...but an instance may be tagged as it is launched (EC2 user guide, "Grant permission to tag
        # resources during creation": ec2:CreateAction), which PCS's minimum permissions for
        # Create/UpdateComputeNodeGroup ask of the caller (issue 34; ledger: pcs-create-permissions).
        {"Sid": "TagInstancesOnlyAtLaunch", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": f"arn:{partition}:ec2:*:{account}:instance/*",
         "Condition": {"StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateFleet"]}}},
    ]
    return statements


def pcs_statements(partition: str, account: str, actions: Sequence[str]) -> list[dict[str, Any]]:
    """The PCS deploy actions, scoped by the stack tag: a node group or queue only with the tag in the
    request and only in a cluster that carries it, tagging at creation only with the tag in the request,
    everything else only on a cluster, node group or queue that carries it (CreateCluster has no resource
    type: `CreatesWithoutResourceType`)."""
    if not actions:
        return []
    clusters = f"arn:{partition}:pcs:*:{account}:cluster/*"
    tag = f"aws:{{}}Tag/{STACK_TAG}"
    return [
        {"Sid": "StackPcsCreateInStackClusters", "Effect": "Allow", "Resource": clusters,
         "Action": [a for a in actions if a in PCS_CREATES_IN_A_CLUSTER],
         "Condition": {"Null": {tag.format("Request"): "false", tag.format("Resource"): "false"}}},
        {"Sid": "StackPcsTagOnCreate", "Effect": "Allow", "Resource": clusters,
         "Action": [a for a in actions if a == "pcs:TagResource"],
         "Condition": {"Null": {tag.format("Request"): "false"}}},
        {"Sid": "StackPcsTagged", "Effect": "Allow", "Resource": clusters,
         "Action": [a for a in actions if a not in PCS_CREATES + PCS_TAG_READS or a == "pcs:TagResource"],
         "Condition": {"Null": {tag.format("Resource"): "false"}}},
        *([pcs_tag_reads()] if set(actions) & set(PCS_TAG_READS) else []),
    ]


def eks_statements(scope: Sequence[str], actions: Sequence[str]) -> list[dict[str, Any]]:
    """The EKS deploy actions on the stacks' clusters and what lies under them (the eks scope: by name),
    each only on a resource that carries the stack tag (every cluster, add-on, access entry, node group
    and association the program makes is tagged: tests/test_bootstrap_state.py), but the tag actions and
    DescribeCluster (EKS_BY_NAME)."""
    if not actions:
        return []
    return [
        {"Sid": "StackEksTagged", "Effect": "Allow", "Resource": list(scope),
         "Action": [a for a in actions if a not in EKS_BY_NAME],
         "Condition": {"Null": {f"aws:ResourceTag/{STACK_TAG}": "false"}}},
        {"Sid": "StackEksByName", "Effect": "Allow", "Resource": list(scope),
         "Action": [a for a in actions if a in EKS_BY_NAME]},
    ]


def eks_read_statements(partition: str, account: str, prefix: str) -> list[dict[str, Any]]:
    """What a preview may read of EKS: the stacks' clusters and what lies under them, and the cluster list;
    nothing that creates or changes. (The charts and objects a preview diffs come from the state: the
    preview role has no access entry on the cluster.)"""
    return [
        {"Sid": "EksReadsOfStacks", "Effect": "Allow", "Action": EKS_READS,
         "Resource": scopes(partition, account, prefix, [])["eks"]},
        {"Sid": "EksLists", "Effect": "Allow", "Action": EKS_LISTS, "Resource": "*"},
    ]


def pcs_tag_reads() -> dict[str, Any]:
    """pcs:ListTagsForResource has no resource type and no condition keys (PCS_TAG_READS): a grant on an
    ARN or under a tag condition never holds, so it stands alone on "*", unconditioned (it reads tags)."""
    return {"Sid": "PcsTagReads", "Effect": "Allow", "Action": PCS_TAG_READS, "Resource": "*"}


def pcs_read_statements(partition: str, account: str) -> list[dict[str, Any]]:
    """What a preview may read of PCS: the stacks' tagged clusters, node groups and queues, their tags, the
    lists, and Cloud Control's reads (pulumi-aws-native reads through it); nothing that creates or changes."""
    return [
        {"Sid": "PcsReadsOfStacks", "Effect": "Allow", "Action": PCS_READS,
         "Resource": f"arn:{partition}:pcs:*:{account}:cluster/*",
         "Condition": {"Null": {f"aws:ResourceTag/{STACK_TAG}": "false"}}},
        pcs_tag_reads(),
        {"Sid": "PcsLists", "Effect": "Allow", "Action": PCS_LISTS + CLOUD_CONTROL_READS, "Resource": "*"},
    ]


# What the deploy role itself needs of an existing `--dataset-bucket` to link FSx for Lustre to it: the
# bucket's region and listing, and its policy (FSx checks the link can be made). The data moves through
# FSx's own service-linked role (s3.data-source.lustre.fsx.amazonaws.com: created through SERVICE_LINKED,
# its policies set through FsxS3AccessServiceLinkedRole), never the caller's, so no object read or write.
# The FSx for Lustre user guide ("Adding permissions to use data repositories in Amazon S3") names the
# service-linked role permissions; that these three bucket reads are all it checks of the caller is not
# confirmed (ledger: fsx-link-caller-permissions; `verify` simulates the reads in an account).
DATASET_LINK_ACTIONS = ["s3:GetBucketLocation", "s3:GetBucketPolicy", "s3:ListBucket"]


def dataset_bucket_statements(partition: str, buckets: Sequence[str]) -> list[dict[str, Any]]:
    """What linking FSx for Lustre to an existing `--dataset-bucket` needs, and nothing more.

    Only bucket reads (DATASET_LINK_ACTIONS), each an action that acts on a bucket ARN: the program
    never changes such a bucket's objects, policy, lifecycle, encryption or public-access settings (it
    does not create those resources for an existing bucket: aws/datasets.py), and the deploy boundary
    denies the settings writes outright (`deploy_boundary`).
    """
    if not buckets:
        return []
    return [{"Sid": "FsxLinkToDatasetBuckets", "Effect": "Allow", "Action": DATASET_LINK_ACTIONS,
             "Resource": [f"arn:{partition}:s3:::{b}" for b in buckets]}]


def packed(statements: Sequence[dict[str, Any]], limit: int = 6144) -> list[dict[str, Any]]:
    """Statements in order, packed into as few policy documents as fit IAM's managed-policy size
    (6,144 characters without whitespace: IAM user guide, "IAM and AWS STS quotas")."""
    documents: list[dict[str, Any]] = []
    for statement in statements:
        if documents and _size(_document([*documents[-1]["Statement"], statement])) <= limit:
            documents[-1]["Statement"].append(statement)
        else:
            documents.append(_document([statement]))
    return documents


def _size(document: dict[str, Any]) -> int:
    return len(json.dumps(document, separators=(",", ":")))


def public_parameters(partition: str) -> dict[str, Any]:
    """The program's one cloud read in a preview: the public AMI parameter (an invoke)."""
    return {"Sid": "PublicAmiParameters", "Effect": "Allow",
            "Action": ["ssm:GetParameter", "ssm:GetParameters"],
            "Resource": f"arn:{partition}:ssm:*::{PUBLIC_PARAMETERS}"}


def ensure_managed_policy(iam: Any, arn: str, name: str, document: dict[str, Any], description: str) -> str:
    """Create the customer managed policy, or make `document` its default version (oldest pruned)."""
    text = json.dumps(document)
    try:
        versions = iam.list_policy_versions(PolicyArn=arn)["Versions"]
    except ClientError as err:
        if not _missing(err, "NoSuchEntity"):
            raise
        return str(iam.create_policy(PolicyName=name, PolicyDocument=text, Description=description,
                                     Tags=[{"Key": "gpucluster:purpose", "Value": "ci"}])["Policy"]["Arn"])
    default = next(v for v in versions if v["IsDefaultVersion"])
    current = iam.get_policy_version(PolicyArn=arn,
                                     VersionId=default["VersionId"])["PolicyVersion"]["Document"]
    if (json.loads(current) if isinstance(current, str) else current) == document:
        return arn
    old = sorted((v for v in versions if not v["IsDefaultVersion"]), key=lambda v: v["CreateDate"])
    if len(versions) >= 5:  # IAM keeps at most five versions of a managed policy
        iam.delete_policy_version(PolicyArn=arn, VersionId=old[0]["VersionId"])
    iam.create_policy_version(PolicyArn=arn, PolicyDocument=text, SetAsDefault=True)
    return arn


def ensure_role(iam: Any, name: str, trust: dict[str, Any], inline: dict[str, dict[str, Any]],
                managed: Sequence[str] = (), boundary: str | None = None) -> str:
    """Create or update a role to this trust, boundary, these managed and exactly these inline policies."""
    try:
        arn = iam.get_role(RoleName=name)["Role"]["Arn"]
        iam.update_assume_role_policy(RoleName=name, PolicyDocument=json.dumps(trust))
    except ClientError as err:
        if not _missing(err, "NoSuchEntity"):
            raise
        extra = {"PermissionsBoundary": boundary} if boundary else {}
        arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust),
                              MaxSessionDuration=3600 * 2,
                              Description="gpucluster CI (GitHub OIDC); made by bootstrap_state.py",
                              Tags=[{"Key": "gpucluster:purpose", "Value": "ci"}], **extra)["Role"]["Arn"]
    if boundary:
        iam.put_role_permissions_boundary(RoleName=name, PermissionsBoundary=boundary)
    attached = {p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]}
    for policy_arn in attached - set(managed):  # e.g. the PowerUserAccess of earlier versions
        iam.detach_role_policy(RoleName=name, PolicyArn=policy_arn)
    for policy_arn in managed:
        iam.attach_role_policy(RoleName=name, PolicyArn=policy_arn)
    for stale in set(iam.list_role_policies(RoleName=name)["PolicyNames"]) - set(inline):
        iam.delete_role_policy(RoleName=name, PolicyName=stale)
    for policy_name, document in inline.items():
        iam.put_role_policy(RoleName=name, PolicyName=policy_name, PolicyDocument=json.dumps(document))
    return str(arn)


def unbounded_prefix_roles(iam: Any, prefix: str, workload_arn: str) -> list[str]:
    """Existing roles under the stacks' prefix without the workload boundary: a deploy role may pass
    them to EC2, Lambda or Scheduler, so they should not exist (or carry the boundary)."""
    found = []
    for page in iam.get_paginator("list_roles").paginate():
        for role in page["Roles"]:
            if role["RoleName"].startswith(prefix):
                detail = iam.get_role(RoleName=role["RoleName"])["Role"]
                if detail.get("PermissionsBoundary", {}).get("PermissionsBoundaryArn") != workload_arn:
                    found.append(role["RoleName"])
    return found


def bootstrap(session: Any, bucket: str, region: str, github_repo: str, environments: list[str],
              break_glass_role: str, key_alias: str = "alias/gpucluster-state",
                  role_prefix: str = "gpucluster",
              iam_prefix: str = DEFAULT_IAM_PREFIX, pulumi_project: str = "gpucluster",
              dataset_buckets: Sequence[str] = ()) -> Bootstrap:
    identity = session.client("sts", region_name=region).get_caller_identity()
    account, partition = identity["Account"], identity["Arn"].split(":")[1]
    iam = session.client("iam", region_name=region)
    key_arn = ensure_kms_key(session.client("kms", region_name=region), key_alias)
    ensure_state_bucket(session.client("s3", region_name=region), bucket, region, key_arn)
    provider = ensure_github_oidc(iam, partition, account)
    policy = f"arn:{partition}:iam::{account}:policy"
    resources = packed(deploy_statements(partition, account, iam_prefix, dataset_buckets))
    names = {"workload": f"{role_prefix}-workload-boundary", "deploy": f"{role_prefix}-deploy-boundary",
             "deploy-iam": f"{role_prefix}-deploy-iam"}
    names |= {f"deploy-resources-{i}": f"{role_prefix}-deploy-resources-{i}"
              for i in range(1, len(resources) + 1)}
    arns = {part: f"{policy}/{name}" for part, name in names.items()}
    ensure_managed_policy(iam, arns["workload"], names["workload"],
                          workload_boundary(partition, account, break_glass_role, iam_prefix),
                          "gpucluster: permissions boundary of every role a stack creates")
    ensure_managed_policy(iam, arns["deploy"], names["deploy"], deploy_boundary(
        partition, account, break_glass_role, role_prefix, list(arns.values()), arns["workload"], bucket,
        key_arn, dataset_buckets), "gpucluster: permissions boundary of the CI deploy roles")
    ensure_managed_policy(iam, arns["deploy-iam"], names["deploy-iam"], _document(
        iam_statements(partition, account, iam_prefix, arns["workload"])), "gpucluster deploy: stack IAM")
    for i, document in enumerate(resources, 1):
        part = f"deploy-resources-{i}"
        ensure_managed_policy(iam, arns[part], names[part], document, "gpucluster deploy: stack resources")

    preview = ensure_role(iam, f"{role_prefix}-preview", trust_policy(provider,
                                                                      preview_subject(github_repo)), {
        "pulumi-state": state_access_policy(bucket, key_arn, region, pulumi_project, environments,
                                            write=False,
                                            partition=partition),
        "preview": _document([public_parameters(partition), *pcs_read_statements(partition, account),
                              *eks_read_statements(partition, account, iam_prefix)])})
    result = Bootstrap(bucket, region, key_arn, key_alias, provider, preview, github_repo,
                       arns["workload"], arns["deploy"])
    for env in environments:
        result.deploy_role_arns[env] = ensure_role(
            iam, f"{role_prefix}-deploy-{env}", trust_policy(provider, deploy_subject(github_repo, env)),
            {"pulumi-state": state_access_policy(bucket, key_arn, region, pulumi_project, [env], write=True,
                                                 partition=partition)},
            managed=[arn for part, arn in arns.items() if part.startswith("deploy-")],
                boundary=arns["deploy"])
    unbounded = unbounded_prefix_roles(iam, iam_prefix, arns["workload"])
    if unbounded:
        result.warnings.append(f"roles named {iam_prefix}* without the workload boundary (a deploy role "
                               f"could pass them): {', '.join(unbounded)}")
    return result


def _name(value: str, what: str, pattern: str = r"[\w+=,.@-]{1,64}") -> str:
    if not re.fullmatch(pattern, value):
        raise argparse.ArgumentTypeError(f"{what}: {value[:80]!r} is not a valid name")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bucket", required=True, help="State bucket name (globally unique).")
    parser.add_argument("--github-repo", required=True, help="owner/name of the repository CI runs in.",
                        type=lambda v: _name(v, "--github-repo", r"[\w.-]+/[\w.-]+"))
    parser.add_argument("--break-glass-role", required=True, type=lambda v: _name(v, "--break-glass-role"),
                        help="Name of the (existing, human-assumed) role that alone may delete dataset "
                             "object versions, buckets and FSx file systems.")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--environments", nargs="+", default=["dev", "staging", "prod"],
                        help="GitHub environments (one per stack) that get a deploy role.")
    parser.add_argument("--key-alias", default="alias/gpucluster-state")
    parser.add_argument("--iam-prefix", default=DEFAULT_IAM_PREFIX,
                        help="Name prefix of everything the stacks create (their cluster.name).")
    parser.add_argument("--pulumi-project", default="gpucluster", help="`name:` in Pulumi.yaml.")
    parser.add_argument("--dataset-bucket", action="append", default=[], dest="dataset_buckets",
                        help="An existing bucket (not named with the prefix) a stack links FSx to; "
                             "repeatable.")
    args = parser.parse_args(argv)
    if "gpucluster-".startswith(args.iam_prefix) or args.iam_prefix.startswith("gpucluster-"):
        parser.error(f"--iam-prefix: {args.iam_prefix!r} would cover the CI roles (gpucluster-*)")
    try:
        result = bootstrap(boto3.session.Session(), args.bucket, args.region, args.github_repo,
                           args.environments, args.break_glass_role, key_alias=args.key_alias,
                           iam_prefix=args.iam_prefix, pulumi_project=args.pulumi_project,
                           dataset_buckets=args.dataset_buckets)
    except (ClientError, BotoCoreError) as err:
        print(f"bootstrap-state: {str(err)[:300]}", file=sys.stderr)
        return 2
    print(result.instructions())
    return 0


if __name__ == "__main__":
    sys.exit(main())
