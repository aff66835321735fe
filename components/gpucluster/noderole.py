"""The GPU node role's own policy documents, and their size: pure, so the spec can check them.

It owns what a process on a node may do in AWS beyond the SSM agent's managed policy: publish
metrics into its cluster's own CloudWatch namespace only (the idle stop alarms on it), read the
instance's tags (the CloudWatch agent's Auto Scaling group dimension), never read SSM
parameters, reach the dataset buckets only under their prefixes and only while the bucket
belongs to the expected account, write job output to the stack's one run log group, pull
the node groups' own ECR images (their repositories only), and answer for the health of its own
group only. `NodeIdentity` (aws/iam.py) attaches the agent, S3 and jobs documents, `GpuNodeGroup`
the health one to its group's role; the stack spec sizes them together against IAM's limit before
anything deploys. No Pulumi import, no AWS call, and no import of the spec (which imports this module).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpucluster.fleet.tags import NODE_GROUP_TAG, STACK_TAG
from gpucluster.parts import S3Grant

# IAM user guide, "IAM and AWS STS quotas": the inline policies of one role hold at most 10,240
# characters together; IAM does not count whitespace.
ROLE_INLINE_POLICIES_MAX_CHARS = 10_240
READ_ACTIONS = ["s3:GetObject"]
WRITE_ACTIONS = ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
# Every way to read a parameter's value. AmazonSSMManagedInstanceCore allows ssm:GetParameter(s)
# on every parameter (the SSM agent resolves `{{ssm:...}}` in documents with them); nodes read
# none (the CloudWatch agent's config is a local file), so the node role denies them all.
PARAMETER_READS = ["ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath",
                   "ssm:GetParameterHistory"]
# The CloudWatch agent's `append_dimensions` take the Auto Scaling group's name from the instance's
# aws:autoscaling:groupName tag: "The IAM User or Role making the calls must have permissions to
# call the EC2 DescribeTags API" (amazon-cloudwatch-agent, plugins/processors/ec2tagger/README.md).
# DescribeTags has no resource-level permissions (Service Authorization Reference, Amazon EC2).
AGENT_TAG_READS = ["ec2:DescribeTags"]
METRIC_NAMESPACE_ROOT = "gpucluster"
ACCOUNT_ID_LENGTH = 12
BUCKET_NAME_MAX = 63  # S3 user guide, "General purpose bucket naming rules"
LONGEST_PARTITION = "aws-us-gov"


def gpu_metric_namespace(cluster_name: str) -> str:
    """The CloudWatch namespace a cluster's nodes publish into, and the only one they may.

    One per cluster, so a node can never feed another cluster's idle alarms (CloudWatch user
    guide, "Using condition keys to limit access to CloudWatch namespaces").
    """
    return f"{METRIC_NAMESPACE_ROOT}/{cluster_name}"


def dataset_grants(bucket_name: Any, prefix: str, checkpoint_prefix: str | None,
                   owner: Any = None) -> list[S3Grant]:
    """Read the data prefix; read and write the checkpoint prefix; nothing else in the bucket."""
    grants = [S3Grant(bucket_name, prefix, write=False, expected_bucket_owner=owner)]
    if checkpoint_prefix:
        grants.append(S3Grant(bucket_name, checkpoint_prefix, write=True, expected_bucket_owner=owner))
    return grants


def _owned(owner: str) -> dict[str, Any]:
    # S3 user guide, "Verifying bucket ownership" / IAM condition key s3:ResourceAccount: a bucket
    # of the same name re-created in another account is neither read nor written.
    return {"StringEquals": {"s3:ResourceAccount": owner}}


Grant = tuple[str, str, bool, str]
"""A resolved grant: (bucket, prefix, write, owner account)."""


def s3_policy_document(grants: Sequence[Grant], partition: str = "aws") -> dict[str, Any]:
    """Least-privilege S3 statements for resolved grants `(bucket, prefix, write, owner account)`.

    Per bucket, listing is limited to its granted prefixes (`s3:prefix`); per owner account, one
    statement reads every granted prefix and one writes the write prefixes. Each statement holds
    only while the bucket belongs to its owner (`s3:ResourceAccount`). Never a `*` resource, never
    a delete action.
    """
    buckets: dict[tuple[str, str], list[str]] = {}
    reads: dict[str, list[str]] = {}
    writes: dict[str, list[str]] = {}
    for i, (bucket, prefix, write, owner) in enumerate(grants):
        if not bucket or "*" in bucket or "*" in prefix:
            raise ValueError(f"S3 grant {i} needs a concrete bucket and prefix, got {bucket!r}/{prefix!r}")
        if not (owner.isdigit() and len(owner) == ACCOUNT_ID_LENGTH):
            raise ValueError(f"S3 grant {i}: the owner must be a 12-digit account id, got {owner!r}")
        prefixes = buckets.setdefault((bucket, owner), [])
        if prefix not in prefixes:
            prefixes.append(prefix)
        objects = f"arn:{partition}:s3:::{bucket}/{prefix}*"
        for table in (reads, writes) if write else (reads,):
            found = table.setdefault(owner, [])
            if objects not in found:
                found.append(objects)
    statements: list[dict[str, Any]] = []
    for i, ((bucket, owner), prefixes) in enumerate(buckets.items()):
        condition = _owned(owner)
        if "" not in prefixes:  # "" is the whole bucket: listing needs no prefix condition
            condition["StringLike"] = {"s3:prefix": [f"{p}*" for p in prefixes]}
        statements.append({"Sid": f"List{i}", "Effect": "Allow", "Action": "s3:ListBucket",
                           "Resource": f"arn:{partition}:s3:::{bucket}", "Condition": condition})
    for sid, table, actions in (("Read", reads, READ_ACTIONS),
                                ("Write", writes, READ_ACTIONS + WRITE_ACTIONS)):
        for i, (owner, resources) in enumerate(table.items()):
            statements.append({"Sid": f"{sid}{i}", "Effect": "Allow", "Action": list(actions),
                               "Resource": resources, "Condition": _owned(owner)})
    return {"Version": "2012-10-17", "Statement": statements}


def agent_policy_document(namespace: str) -> dict[str, Any]:
    """The CloudWatch agent's needs, in place of CloudWatchAgentServerPolicy, and no parameter reads.

    The agent ships only job output files, to the run log group: that grant is the jobs policy's
    (`jobs_policy_document`), not this one. Its config is read from a local file, so no
    `AmazonCloudWatch-*` parameter read either.
    """
    return {"Version": "2012-10-17", "Statement": [
        # PutMetricData has no resource type: its scope is the namespace condition.
        {"Sid": "PublishOwnNamespaceOnly", "Effect": "Allow", "Action": "cloudwatch:PutMetricData",
         "Resource": "*", "Condition": {"StringEquals": {"cloudwatch:namespace": namespace}}},
        {"Sid": "AgentReadsInstanceTags", "Effect": "Allow", "Action": AGENT_TAG_READS, "Resource": "*"},
        {"Sid": "NoParameterReads", "Effect": "Deny", "Action": PARAMETER_READS, "Resource": "*"},
    ]}


# Read-only, and without resource-level permissions (Service Authorization Reference, "Amazon EC2
# Auto Scaling": DescribeAutoScalingInstances lists no resource type): how a node finds its group.
FIND_GROUP_ACTION = "autoscaling:DescribeAutoScalingInstances"


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
    # No Auto Scaling group (`asg_arn` empty: AWS PCS launches a Slurm stack's nodes): no group to act on.
    statements: list[dict[str, Any]] = [
        {"Sid": "FindOwnGroup", "Effect": "Allow", "Action": [FIND_GROUP_ACTION], "Resource": "*"},
        {"Sid": "ReportOwnHealth", "Effect": "Allow", "Action": writes, "Resource": [asg_arn],
         "Condition": own},
    ] if asg_arn else []
    statements.append(
        {"Sid": "CountHealthEvents", "Effect": "Allow", "Action": ["cloudwatch:PutMetricData"],
         "Resource": "*", "Condition": {"StringEquals": {"cloudwatch:namespace": namespace}}})
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


def health_policy_document(**statements: Any) -> dict[str, Any]:
    """`node_health_statements(**statements)` as a policy document."""
    return {"Version": "2012-10-17", "Statement": node_health_statements(**statements)}


# The longest ARNs of what the health policy names, before they exist: a group ARN holds a UUID
# and the group's name (Pulumi's `<cluster>-<group>-asg-<7 hex>`), a KMS key ARN a UUID
# (Service Authorization Reference: autoScalingGroup, key resource types).
_UUID = "00000000-0000-0000-0000-000000000000"
_ACCOUNT = "0" * ACCOUNT_ID_LENGTH


def longest_health_policy(*, identity: str, cluster_name: str, group: str, region: str,
                          replace: bool) -> dict[str, Any]:
    """The health policy of `group` as long as it can be once deployed (any partition, a topic)."""
    arn = f"arn:{LONGEST_PARTITION}"
    asg = f"{cluster_name}-{group}-asg-{'0' * 7}"
    return health_policy_document(
        asg_arn=f"{arn}:autoscaling:{region}:{_ACCOUNT}:autoScalingGroup:{_UUID}:autoScalingGroupName/{asg}",
        identity=identity, group=group, namespace=gpu_metric_namespace(cluster_name), region=region,
        replace=replace, topic_arn=f"{arn}:sns:{region}:{_ACCOUNT}:{cluster_name}-guardrails",
        key_arn=f"{arn}:kms:{region}:{_ACCOUNT}:key/{_UUID}")


# ------------------------------------------------------------------- AWS PCS: node registration

# "IAM instance profiles for AWS Parallel Computing Service",
# https://docs.aws.amazon.com/pcs/latest/userguide/security-instance-profiles.html: the role of a PCS
# node's instance profile is named AWSPCS... or sits under the path /aws-pcs/, and allows
# pcs:RegisterComputeNodeGroupInstance (Resource "*" in AWS's own example policy).
PCS_IAM_PATH = "/aws-pcs/"
PCS_REGISTER_ACTION = "pcs:RegisterComputeNodeGroupInstance"


def pcs_register_policy_document() -> dict[str, Any]:
    """What a node of a Slurm stack needs to join its AWS PCS compute node group, and nothing more."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "RegisterWithPcs", "Effect": "Allow", "Action": [PCS_REGISTER_ACTION], "Resource": "*"}]}


# ------------------------------------------------------------------- jobs: run logs, ECR images


def run_log_group_name(identity: str) -> str:
    """The stack's run log group, /gpucluster/<identity>/run: `gpucluster run` output (SSM) and
    detached jobs' output (the CloudWatch agent) go there, and nowhere else a node may write.

    Log group names allow a-z, A-Z, 0-9, '_', '-', '/', '.', '#' (CloudWatch Logs API
    reference, CreateLogGroup); anything else in the identity becomes '-'.
    """
    return f"/gpucluster/{re.sub(r'[^A-Za-z0-9_./#-]', '-', identity)}/run"


# Private ECR registries: <account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn] (ECR user guide,
# "Amazon ECR private registry"); a repository name is lowercase letters, digits and ._-/ .
ECR_IMAGE = re.compile(r"(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com"
                       r"(?P<cn>\.cn)?/(?P<repository>[a-z0-9][a-z0-9._/-]*?)(?::[\w][\w.-]{0,127})?"
                       r"(?:@sha256:[0-9a-f]{64})?")
# What pulling an image needs (ECR user guide, "Private repository policy examples" and
# AmazonEC2ContainerRegistryReadOnly): the layer and manifest reads, on the repository only.
# GetAuthorizationToken has no resource type (Service Authorization Reference, Amazon ECR).
ECR_PULL_ACTIONS = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]


@dataclass(frozen=True)
class EcrRepository:
    """An ECR repository a node group's container_image lives in."""

    account: str
    region: str
    name: str
    partition: str

    @property
    def arn(self) -> str:
        return f"arn:{self.partition}:ecr:{self.region}:{self.account}:repository/{self.name}"


def ecr_repository(image: str) -> EcrRepository | None:
    """The private ECR repository of an image reference, or None for any other registry."""
    m = ECR_IMAGE.fullmatch(image)
    if m is None:
        return None
    region = m["region"]
    partition = "aws-cn" if m["cn"] else "aws-us-gov" if region.startswith("us-gov-") else "aws"
    return EcrRepository(m["account"], region, m["repository"], partition)


def jobs_policy_document(run_log_group_arn: str | None, images: Iterable[str] = ()) -> dict[str, Any] | None:
    """Job output into the run log group only, and pulls from the node groups' ECR repositories only.

    `run_log_group_arn` is the group's ARN without `:*` (what a LogGroup's `arn` is). The SSM agent
    sends `run` output there itself (it looks the group up with DescribeLogGroups, then creates a
    stream and puts events: amazon-ssm-agent, cloudwatchlogspublisher), the CloudWatch agent sends
    detached jobs' files (CreateLogStream, PutLogEvents). No CreateLogGroup, no retention change:
    the stack declares the group. None when there is neither a group nor an ECR image.
    """
    statements: list[dict[str, Any]] = []
    if run_log_group_arn:
        base, _, _ = run_log_group_arn.partition(":log-group:")
        statements += [
            {"Sid": "WriteRunLogsOnly", "Effect": "Allow",
             "Action": ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"],
             "Resource": [run_log_group_arn, f"{run_log_group_arn}:*"]},
            # DescribeLogGroups lists names by prefix and cannot be narrowed to one group.
            {"Sid": "FindRunLogGroup", "Effect": "Allow", "Action": ["logs:DescribeLogGroups"],
             "Resource": [f"{base}:log-group:*"]}]
    repositories = sorted({r.arn for image in images if (r := ecr_repository(image))})
    if repositories:
        statements += [
            {"Sid": "EcrLogin", "Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
            {"Sid": "PullOwnImages", "Effect": "Allow", "Action": list(ECR_PULL_ACTIONS),
             "Resource": repositories}]
    return {"Version": "2012-10-17", "Statement": statements} if statements else None


def policy_chars(document: dict[str, Any]) -> int:
    """A policy document's size as IAM counts it (whitespace left out), or an upper bound of it."""
    return len(json.dumps(document, separators=(",", ":")))


def inline_policies_chars(documents: Iterable[dict[str, Any]]) -> int:
    return sum(policy_chars(d) for d in documents)


def longest_bucket_name(key: int) -> str:
    """A stand-in for a bucket name not known yet (Pulumi generates it), as long as S3 allows."""
    return f"{key:x>{BUCKET_NAME_MAX}}"


def worst_case_grants(grants: Iterable[S3Grant]) -> list[Grant]:
    """`grants` resolved at their longest: a bucket name not known yet (None or an Output) gets the
    longest name S3 allows, one per object, and an owner not given stands for the deploying account."""
    names: dict[int, str] = {}
    resolved = []
    for g in grants:
        bucket = g.bucket_name if isinstance(g.bucket_name, str) else names.setdefault(
            id(g.bucket_name), longest_bucket_name(len(names)))
        owner = g.expected_bucket_owner if isinstance(g.expected_bucket_owner, str) else None
        resolved.append((bucket, g.prefix, g.write, owner or "0" * ACCOUNT_ID_LENGTH))
    return resolved


def longest_log_group_arn(name: str) -> str:
    """A log group's ARN in the longest partition and region name, with a 12-digit account."""
    return f"arn:{LONGEST_PARTITION}:logs:ap-southeast-5:{'0' * ACCOUNT_ID_LENGTH}:log-group:{name}"


def node_inline_policies_chars(cluster_name: str, grants: Iterable[S3Grant],
                               more: Iterable[dict[str, Any]] = (), *, run_log_group: str | None = None,
                               images: Iterable[str] = (), node_scripts: bool = False) -> int:
    """The most the node role's inline policies can weigh with these grants, the run log group
    (its name), the groups' images and the node scripts bundle's read (`node_scripts`), in any
    partition, and with the `more` documents (a group's `longest_health_policy`) on the same role."""
    resolved = worst_case_grants(grants)
    documents = [agent_policy_document(gpu_metric_namespace(cluster_name)), *more]
    if node_scripts:
        documents.append(scripts_policy_document(longest_bucket_name(0), _ACCOUNT, LONGEST_PARTITION))
    if resolved:
        documents.append(s3_policy_document(resolved, partition=LONGEST_PARTITION))
    jobs = jobs_policy_document(longest_log_group_arn(run_log_group) if run_log_group else None, images)
    if jobs is not None:
        documents.append(jobs)
    return inline_policies_chars(documents)


# ------------------------------------------------------------------- metrics: AMP remote write


def workspace_arn(partition: str, region: str, account: str, workspace_id: str) -> str:
    """An AMP workspace's ARN (Service Authorization Reference, "Amazon Managed Service for Prometheus":
    resource type workspace, arn:${Partition}:aps:${Region}:${Account}:workspace/${WorkspaceId})."""
    return f"arn:{partition}:aps:{region}:{account}:workspace/{workspace_id}"


def metrics_write_policy_document(workspace: str, identity: str | None = None) -> dict[str, Any]:
    """The node's only Prometheus permission: aps:RemoteWrite on the one workspace, nothing to read.

    For the stack's own workspace (`identity` given) the write also requires the workspace's
    gpucluster:stack tag (AMP supports aws:ResourceTag on workspaces), so a role shared by
    mistake cannot feed another stack's workspace of the same ARN after a re-creation.
    """
    statement: dict[str, Any] = {"Sid": "RemoteWriteOwnWorkspaceOnly", "Effect": "Allow",
                                 "Action": ["aps:RemoteWrite"], "Resource": [workspace]}
    if identity is not None:
        statement["Condition"] = {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": identity}}
    return {"Version": "2012-10-17", "Statement": [statement]}


def longest_metrics_write_policy(identity: str) -> dict[str, Any]:
    """The metrics write policy as long as it can be: a workspace ARN in the longest partition, with
    the stack's tag condition (for sizing the node role's inline policies before deploying)."""
    arn = workspace_arn(LONGEST_PARTITION, "ap-southeast-5", _ACCOUNT, "ws-" + _UUID)
    return metrics_write_policy_document(arn, identity)


# ------------------------------------------------------------------- the node scripts bundle


NODE_SCRIPTS_PREFIX = "node-scripts/"
"""Where the stack's node-scripts bucket keeps the bundles (gpucluster.node.bundle.bundle_key)."""


def scripts_policy_document(bucket: str, owner: str, partition: str = "aws",
                            prefix: str = NODE_SCRIPTS_PREFIX) -> dict[str, Any]:
    """What the loader needs to fetch the node scripts bundle (gpucluster.node.bundle) and no more:
    s3:GetObject under the bundle prefix of the stack's node-scripts bucket, while the bucket
    belongs to `owner`. No listing (a missing key reads as AccessDenied, which the loader reports),
    no write, no KMS (the bucket is SSE-S3: aws/nodescripts.py)."""
    if not bucket or "*" in bucket or not prefix.endswith("/"):
        raise ValueError(f"the node scripts grant needs a concrete bucket and a prefix, got "
                         f"{bucket!r}/{prefix!r}")
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadNodeScriptsOnly", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"arn:{partition}:s3:::{bucket}/{prefix}*"], "Condition": _owned(owner)}]}
