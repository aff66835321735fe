"""The IAM documents of the pods on an EKS stack that call AWS (each role taken by EKS Pod Identity),
and the termination handler's queue policy and EventBridge patterns, as plain dicts.

- Trust: only the EKS Pod Identity service principal, only for this cluster's one service account in its
  namespace, by the session tags EKS Pod Identity sends (EKS user guide, "Create IAM role with trust
  policy required by EKS Pod Identity": `sts:AssumeRole` and `sts:TagSession`, the request tags
  eks-cluster-arn, kubernetes-namespace and kubernetes-service-account, and its example trust policy
  conditioned on `aws:RequestTag/...`; ledger: eks-pod-identity-conditions).
- cluster-autoscaler: the autoscaler's own "minimum" policy (its AWS README, "IAM Policy"), with the
  writes (SetDesiredCapacity, TerminateInstanceInAutoScalingGroup) only on the stack's Auto Scaling
  groups and only while they carry the stack tag (Service Authorization Reference, "Amazon EC2 Auto
  Scaling": both actions take the autoScalingGroup resource and aws:ResourceTag).
- aws-node-termination-handler (queue mode): receive and delete on its queue, the describes it reads,
  CompleteLifecycleAction on the stack's groups (its README, "Queue Processor ... IAM policy").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpucluster.spec import STACK_TAG

VERSION = "2012-10-17"
EKS_PODS_PRINCIPAL = "pods.eks.amazonaws.com"


def pod_identity_trust(cluster_arn: str, namespace: str, service_account: str) -> dict[str, Any]:
    """Only pods of `service_account` in `namespace` on this cluster, as EKS Pod Identity tags the session
    (a role per service account: another pod of the cluster cannot take it)."""
    return {"Version": VERSION, "Statement": [{
        "Sid": "EksPodIdentityOfThisServiceAccount", "Effect": "Allow",
        "Principal": {"Service": EKS_PODS_PRINCIPAL}, "Action": ["sts:AssumeRole", "sts:TagSession"],
        "Condition": {"StringEquals": {"aws:RequestTag/eks-cluster-arn": cluster_arn,
                                       "aws:RequestTag/kubernetes-namespace": namespace,
                                       "aws:RequestTag/kubernetes-service-account": service_account}}}]}


def _own_groups(asg_arns: Sequence[str], identity: str) -> dict[str, Any]:
    return {"Resource": sorted(asg_arns),
            "Condition": {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": identity}}}


def autoscaler_policy(asg_arns: Sequence[str], identity: str) -> dict[str, Any]:
    return {"Version": VERSION, "Statement": [
        {"Sid": "ScaleOwnGroupsOnly", "Effect": "Allow",
         "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
         **_own_groups(asg_arns, identity)},
        # Describe and list calls have no resource-level permissions (Service Authorization Reference).
        {"Sid": "Describe", "Effect": "Allow", "Resource": "*", "Action": [
            "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
            "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
            "autoscaling:DescribeTags", "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
            "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements"]}]}


def termination_handler_policy(queue_arn: str, asg_arns: Sequence[str], identity: str) -> dict[str, Any]:
    return {"Version": VERSION, "Statement": [
        {"Sid": "OwnQueue", "Effect": "Allow", "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage"],
         "Resource": [queue_arn]},
        {"Sid": "CompleteOwnLifecycleHooks", "Effect": "Allow",
         "Action": ["autoscaling:CompleteLifecycleAction"], **_own_groups(asg_arns, identity)},
        {"Sid": "Describe", "Effect": "Allow", "Resource": "*", "Action": [
            "autoscaling:DescribeAutoScalingInstances", "autoscaling:DescribeTags",
            "ec2:DescribeInstances"]}]}


def queue_policy(queue_arn: str, rule_arns: Sequence[str]) -> dict[str, Any]:
    """Only this stack's EventBridge rules may send (aws:SourceArn; EventBridge user guide, "Amazon SQS
    permissions"), and only over TLS."""
    return {"Version": VERSION, "Statement": [
        {"Sid": "OwnRulesOnly", "Effect": "Allow", "Principal": {"Service": "events.amazonaws.com"},
         "Action": "sqs:SendMessage", "Resource": queue_arn,
         "Condition": {"ArnEquals": {"aws:SourceArn": sorted(rule_arns)}}},
        {"Sid": "TlsOnly", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue_arn,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


def event_patterns(asg_names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What the termination handler's queue receives, by rule (its README, "Queue Processor": the
    EventBridge rules; event shapes: EC2 and EC2 Auto Scaling user guides, "EventBridge")."""
    return {
        "spot-interruption": {"source": ["aws.ec2"],
                              "detail-type": ["EC2 Spot Instance Interruption Warning"]},
        "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
        "instance-state": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
        "scheduled-change": {"source": ["aws.health"], "detail-type": ["AWS Health Event"],
                             "detail": {"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]}},
        "asg-lifecycle": {"source": ["aws.autoscaling"],
                          "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
                          "detail": {"AutoScalingGroupName": sorted(asg_names)}},
    }
