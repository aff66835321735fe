"""Node identity: the IAM role and instance profile every GPU node of a cluster runs as.

It owns what nodes may do in AWS: be managed through SSM (no SSH), publish
CloudWatch agent metrics, read the stack's dataset buckets and write only under
their checkpoint prefixes. S3 access is built from `BucketGrant`s (a bucket name,
plain or an Output, and a prefix), always naming the bucket and prefix; there is
never a `*` resource and never a delete action.
"""

import json
from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import NodeIdentityModel, component_options, identity_checks, type_token, validate

# AWS managed policies: Systems Manager user guide ("Configure instance permissions"),
# CloudWatch user guide ("Create IAM roles to use with the CloudWatch agent").
MANAGED_POLICIES = {
    "ssm": "AmazonSSMManagedInstanceCore",
    "cloudwatch-agent": "CloudWatchAgentServerPolicy",
}
OLD_TYPE = "gpucluster:iam:NodeIdentity"
READ_ACTIONS = ["s3:GetObject"]
WRITE_ACTIONS = ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]


def assume_role_policy() -> str:
    """Trust policy: only EC2 instances may take the role."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                       "Action": "sts:AssumeRole"}],
    })


def s3_policy_document(grants: Sequence[tuple[str, str, bool]], partition: str = "aws") -> dict[str, Any]:
    """Least-privilege S3 statements for resolved grants `(bucket, prefix, write)`.

    Listing is limited to the prefix (`s3:prefix` condition), reads to objects
    under it, writes (put and multipart) to the write prefixes only.
    """
    statements: list[dict[str, Any]] = []
    for i, (bucket, prefix, write) in enumerate(grants):
        if not bucket or "*" in bucket or "*" in prefix:
            raise ValueError(f"S3 grant {i} needs a concrete bucket and prefix, got {bucket!r}/{prefix!r}")
        bucket_arn = f"arn:{partition}:s3:::{bucket}"
        listing: dict[str, Any] = {"Sid": f"List{i}", "Effect": "Allow", "Action": "s3:ListBucket",
                                   "Resource": bucket_arn}
        if prefix:
            listing["Condition"] = {"StringLike": {"s3:prefix": [f"{prefix}*"]}}
        statements.append(listing)
        actions = READ_ACTIONS + (WRITE_ACTIONS if write else [])
        statements.append({"Sid": f"{'Write' if write else 'Read'}{i}", "Effect": "Allow",
                           "Action": actions, "Resource": f"{bucket_arn}/{prefix}*"})
    return {"Version": "2012-10-17", "Statement": statements}


class BucketGrant(TypedDict):
    """Node access to one bucket: read under `prefix`, and with `write` also write there."""

    bucket_name: pulumi.Input[str]
    """The bucket."""
    prefix: NotRequired[str]
    """Folder-like prefix ending in '/'; empty (the default) means the whole bucket, read-only."""
    write: NotRequired[bool]
    """Also put objects (and multipart uploads) under the prefix; never delete."""


class NodeIdentityArgs(TypedDict):
    """The IAM role and instance profile of GPU nodes, with S3 access to exactly the given prefixes."""

    s3_grants: NotRequired[list[BucketGrant]]
    """Buckets and prefixes nodes may read (and write, where `write` is set)."""
    tags: NotRequired[dict[str, str]]
    """Tags of the role and the instance profile."""


class NodeIdentity(pulumi.ComponentResource):
    """The node role, its managed and S3 policies, and the instance profile launch templates use.

    Python users also get `role` (`aws.iam.Role`), `instance_profile` (`aws.iam.InstanceProfile`)
    and `s3_policy` (`aws.iam.RolePolicy`, None without grants).
    """

    role_name: pulumi.Output[str]
    """The node role's name (attach more policies to it)."""
    role_arn: pulumi.Output[str]
    """The node role's ARN."""
    instance_profile_name: pulumi.Output[str]
    """The instance profile's name."""
    instance_profile_arn: pulumi.Output[str]
    """The instance profile's ARN (what GpuNodeGroupArgs.instance_profile_arn takes)."""

    def __init__(self, name: str, args: NodeIdentityArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("NodeIdentity", name, NodeIdentityModel, args, identity_checks)
        super().__init__(type_token("NodeIdentity"), name, None, component_options(opts, OLD_TYPE))
        grants, tags = m.s3_grants, m.tags
        child = pulumi.ResourceOptions(parent=self)
        partition = aws.get_partition_output(opts=pulumi.InvokeOptions(parent=self)).partition
        self.role = aws.iam.Role(f"{name}-role", assume_role_policy=assume_role_policy(),
                                 description="gpucluster GPU nodes: SSM, CloudWatch agent, dataset S3 access",
                                 tags=dict(tags), opts=child)
        for part, policy in MANAGED_POLICIES.items():
            aws.iam.RolePolicyAttachment(
                f"{name}-{part}", role=self.role.name,
                policy_arn=partition.apply(lambda p, policy=policy: f"arn:{p}:iam::aws:policy/{policy}"),
                opts=child)
        self.s3_policy: aws.iam.RolePolicy | None = None
        if grants:
            document = pulumi.Output.all(partition, *[g.bucket_name for g in grants]).apply(
                lambda values: json.dumps(s3_policy_document(
                    [(bucket, g.prefix, g.write) for bucket, g in zip(values[1:], grants, strict=True)],
                    partition=values[0])))
            self.s3_policy = aws.iam.RolePolicy(f"{name}-s3", role=self.role.id, policy=document, opts=child)
        self.instance_profile = aws.iam.InstanceProfile(f"{name}-profile", role=self.role.name,
                                                        tags=dict(tags), opts=child)
        self.role_name = self.role.name
        self.role_arn = self.role.arn
        self.instance_profile_name = self.instance_profile.name
        self.instance_profile_arn = self.instance_profile.arn
        self.register_outputs({"role_name": self.role_name, "role_arn": self.role_arn,
                               "instance_profile_name": self.instance_profile_name,
                               "instance_profile_arn": self.instance_profile_arn})
