"""Bootstrap a self-managed Pulumi backend and GitHub OIDC roles for gpucluster (boto3, idempotent).

In one AWS account it makes sure there are:
- a KMS key (yearly rotation) with an alias: Pulumi's secrets provider, `awskms://alias/...`;
- the state bucket: versioned, SSE-KMS with that key, all public access blocked, a TLS-only
  policy, ACLs off (bucket owner enforced);
- GitHub's OIDC identity provider, and roles it may assume: one deploy role per environment,
  trusted only by jobs running in that GitHub environment, and one read-only preview role,
  trusted only by pull requests. No long-lived keys anywhere.
It prints what to set in GitHub and the `pulumi login` / `pulumi stack init` commands. It never
deletes or loosens anything that exists. Usage (with admin credentials, once per account):

    python infra/bootstrap-state/bootstrap_state.py --bucket acme-gpucluster-state \\
        --github-repo acme/gpucluster --region us-east-1
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.exceptions import ClientError

GITHUB_OIDC_URL = "https://token.actions.githubusercontent.com"
GITHUB_OIDC_HOST = "token.actions.githubusercontent.com"
# GitHub docs, "Configuring OpenID Connect in Amazon Web Services": audience sts.amazonaws.com,
# subject `repo:OWNER/REPO:environment:NAME` for jobs in an environment, `...:pull_request` for PRs.
AUDIENCE = "sts.amazonaws.com"
SERVICE_LINKED = ["autoscaling.amazonaws.com", "spot.amazonaws.com", "fsx.amazonaws.com",
                  "s3.data-source.lustre.fsx.amazonaws.com"]


@dataclass
class Bootstrap:
    """What was found or made, and what GitHub and Pulumi need to be told."""

    bucket: str
    region: str
    key_arn: str
    key_alias: str
    oidc_provider_arn: str
    preview_role_arn: str
    deploy_role_arns: dict[str, str] = field(default_factory=dict)

    @property
    def backend_url(self) -> str:
        return f"s3://{self.bucket}?region={self.region}&awssdk=v2"

    @property
    def secrets_provider(self) -> str:
        return f"awskms://{self.key_alias}?region={self.region}"

    def instructions(self) -> str:
        lines = ["GitHub repository variables:",
                 f"  PULUMI_BACKEND_URL   = {self.backend_url}",
                 f"  AWS_REGION           = {self.region}",
                 f"  AWS_PREVIEW_ROLE_ARN = {self.preview_role_arn}",
                 "GitHub environments (add required reviewers to staging and prod), variable AWS_ROLE_ARN:"]
        lines += [f"  {env:<8} AWS_ROLE_ARN = {arn}" for env, arn in self.deploy_role_arns.items()]
        lines += ["Then, once per stack, from the repository root:",
                  f"  pulumi login '{self.backend_url}'"]
        lines += [f"  pulumi stack init {env} --secrets-provider '{self.secrets_provider}'"
                  for env in self.deploy_role_arns]
        return "\n".join(lines)


def _missing(err: ClientError, *codes: str) -> bool:
    return err.response.get("Error", {}).get("Code") in codes


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
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "DenyPlainHttp", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": [arn, f"{arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


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


def ensure_github_oidc(iam: Any, account: str) -> str:
    arn = f"arn:aws:iam::{account}:oidc-provider/{GITHUB_OIDC_HOST}"
    try:
        iam.get_open_id_connect_provider(OpenIDConnectProviderArn=arn)
        return arn
    except ClientError as err:
        if not _missing(err, "NoSuchEntity"):
            raise
    return str(iam.create_open_id_connect_provider(Url=GITHUB_OIDC_URL, ClientIDList=[AUDIENCE])[
        "OpenIDConnectProviderArn"])


def trust_policy(provider_arn: str, subject: str) -> dict[str, Any]:
    """Only GitHub tokens for this audience and this exact subject may assume the role."""
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Federated": provider_arn},
        "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {f"{GITHUB_OIDC_HOST}:aud": AUDIENCE,
                                       f"{GITHUB_OIDC_HOST}:sub": subject}}}]}


def state_access_policy(bucket: str, key_arn: str) -> dict[str, Any]:
    """Read and write the Pulumi state (and its locks) and use the secrets key; nothing else."""
    arn = f"arn:aws:s3:::{bucket}"
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation", "s3:GetBucketVersioning"],
         "Resource": arn},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
         "Resource": f"{arn}/*"},
        {"Effect": "Allow", "Resource": key_arn,
         "Action": ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"]},
    ]}


def cluster_iam_policy(account: str, prefix: str) -> dict[str, Any]:
    """IAM for the roles, policies and instance profiles a stack creates (named `<prefix>...`)."""
    names = [f"arn:aws:iam::{account}:{kind}/{prefix}*" for kind in ("role", "policy", "instance-profile")]
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Resource": names, "Action": [
            "iam:CreateRole", "iam:DeleteRole", "iam:GetRole", "iam:TagRole", "iam:UntagRole",
            "iam:UpdateRole", "iam:UpdateAssumeRolePolicy", "iam:PassRole", "iam:ListRoleTags",
            "iam:PutRolePolicy", "iam:GetRolePolicy", "iam:DeleteRolePolicy", "iam:ListRolePolicies",
            "iam:AttachRolePolicy", "iam:DetachRolePolicy", "iam:ListAttachedRolePolicies",
            "iam:ListInstanceProfilesForRole", "iam:CreateInstanceProfile", "iam:DeleteInstanceProfile",
            "iam:GetInstanceProfile", "iam:TagInstanceProfile", "iam:AddRoleToInstanceProfile",
            "iam:RemoveRoleFromInstanceProfile", "iam:CreatePolicy", "iam:DeletePolicy", "iam:GetPolicy",
            "iam:TagPolicy", "iam:GetPolicyVersion", "iam:ListPolicyVersions", "iam:CreatePolicyVersion",
            "iam:DeletePolicyVersion"]},
        {"Effect": "Allow", "Action": "iam:CreateServiceLinkedRole",
         "Resource": f"arn:aws:iam::{account}:role/aws-service-role/*",
         "Condition": {"StringEquals": {"iam:AWSServiceName": SERVICE_LINKED}}},
    ]}


def ensure_role(iam: Any, name: str, trust: dict[str, Any], managed: list[str],
                inline: dict[str, dict[str, Any]]) -> str:
    """Create or update a role to exactly this trust, these managed and these inline policies."""
    try:
        arn = iam.get_role(RoleName=name)["Role"]["Arn"]
        iam.update_assume_role_policy(RoleName=name, PolicyDocument=json.dumps(trust))
    except ClientError as err:
        if not _missing(err, "NoSuchEntity"):
            raise
        arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust),
                              MaxSessionDuration=3600 * 2,
                              Description="gpucluster CI (GitHub OIDC); made by bootstrap_state.py",
                              Tags=[{"Key": "gpucluster:purpose", "Value": "ci"}])["Role"]["Arn"]
    for policy_arn in managed:
        iam.attach_role_policy(RoleName=name, PolicyArn=policy_arn)
    for policy_name, document in inline.items():
        iam.put_role_policy(RoleName=name, PolicyName=policy_name, PolicyDocument=json.dumps(document))
    return str(arn)


def bootstrap(session: Any, bucket: str, region: str, github_repo: str, environments: list[str],
              key_alias: str = "alias/gpucluster-state", role_prefix: str = "gpucluster",
              iam_prefix: str = "gpu-") -> Bootstrap:
    account = session.client("sts", region_name=region).get_caller_identity()["Account"]
    iam = session.client("iam", region_name=region)
    key_arn = ensure_kms_key(session.client("kms", region_name=region), key_alias)
    ensure_state_bucket(session.client("s3", region_name=region), bucket, region, key_arn)
    provider = ensure_github_oidc(iam, account)
    state = {"pulumi-state": state_access_policy(bucket, key_arn)}
    preview = ensure_role(iam, f"{role_prefix}-preview",
                          trust_policy(provider, f"repo:{github_repo}:pull_request"),
                          ["arn:aws:iam::aws:policy/ReadOnlyAccess"], state)
    result = Bootstrap(bucket, region, key_arn, key_alias, provider, preview)
    for env in environments:
        result.deploy_role_arns[env] = ensure_role(
            iam, f"{role_prefix}-deploy-{env}",
            trust_policy(provider, f"repo:{github_repo}:environment:{env}"),
            ["arn:aws:iam::aws:policy/PowerUserAccess"],
            {**state, "cluster-iam": cluster_iam_policy(account, iam_prefix)})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bucket", required=True, help="State bucket name (globally unique).")
    parser.add_argument("--github-repo", required=True, help="owner/name of the repository CI runs in.")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--environments", nargs="+", default=["dev", "staging", "prod"],
                        help="GitHub environments (one per stack) that get a deploy role.")
    parser.add_argument("--key-alias", default="alias/gpucluster-state")
    parser.add_argument("--iam-prefix", default="gpu-",
                        help="Name prefix of the IAM roles the stacks create (their cluster.name).")
    args = parser.parse_args(argv)
    result = bootstrap(boto3.session.Session(), args.bucket, args.region, args.github_repo,
                       args.environments, key_alias=args.key_alias, iam_prefix=args.iam_prefix)
    print(result.instructions())
    return 0


if __name__ == "__main__":
    sys.exit(main())
