"""infra/bootstrap-state: state bucket, KMS key, boundaries and GitHub OIDC roles, made against moto,
read back, and evaluated (tests/iam_eval.py) for the escalation paths of issue 12."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
import pytest
from moto import mock_aws

from iam_eval import allowed

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "infra" / "bootstrap-state" / "bootstrap_state.py"
ACCOUNT = "123456789012"
IAM = f"arn:aws:iam::{ACCOUNT}"
WORKLOAD = f"{IAM}:policy/gpucluster-workload-boundary"
DEPLOY = f"{IAM}:policy/gpucluster-deploy-boundary"
BREAK_GLASS = f"{IAM}:role/acme-break-glass"
ADMIN = "arn:aws:iam::aws:policy/AdministratorAccess"
SSM_CORE = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
BUCKET = "acme-gpucluster-state"
STATE = f"arn:aws:s3:::{BUCKET}"
# moto knows AWS managed policies only when asked to load them
MANAGED = {"iam": {"load_aws_managed_policies": True}}
# Role names as Pulumi makes them (`<resource name>-<7 hex>`): a GPU node role, an EKS cluster's role.
NODE_ROLE = f"{IAM}:role/gpu-prod-node-identity-role-4950fcc"
EKS_CLUSTER_ROLE = f"{IAM}:role/gpu-prod-eks-role-0a1b2c3"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("bootstrap_state", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


bootstrap_state = _module()


def run(session: Any) -> Any:
    return bootstrap_state.bootstrap(session, BUCKET, "us-west-2", "acme/gpucluster", ["dev", "prod"],
                                     "acme-break-glass")


def _json(document: Any) -> dict[str, Any]:
    return json.loads(unquote(document)) if isinstance(document, str) else document


class Role:
    """A role as IAM holds it: its identity policies and its boundary, read back from the account."""

    def __init__(self, iam: Any, name: str) -> None:
        role = iam.get_role(RoleName=name)["Role"]
        self.arn = role["Arn"]
        self.trust = _json(role["AssumeRolePolicyDocument"])
        boundary = role.get("PermissionsBoundary", {}).get("PermissionsBoundaryArn")
        self.boundary = managed_document(iam, boundary) if boundary else None
        self.boundary_arn = boundary
        self.inline = {n: _json(iam.get_role_policy(RoleName=name, PolicyName=n)["PolicyDocument"])
                       for n in iam.list_role_policies(RoleName=name)["PolicyNames"]}
        attached = iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]
        self.attached = [p["PolicyArn"] for p in attached]
        self.identity = list(self.inline.values()) + [managed_document(iam, a) for a in self.attached]

    def can(self, action: str, resource: str = "*", **context: Any) -> bool:
        return allowed(self.identity, self.boundary, action, resource, **context)


def managed_document(iam: Any, arn: str) -> dict[str, Any]:
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    return _json(iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"])


@pytest.fixture(scope="module")
def made() -> Any:
    """One fake account, bootstrapped once (loading moto's managed policies takes most of a second)."""
    with mock_aws(config=MANAGED):
        session = boto3.session.Session(region_name="us-west-2")
        yield session, run(session)


@pytest.fixture(scope="module")
def roles(made: Any) -> dict[str, Role]:
    iam = made[0].client("iam")
    return {name: Role(iam, f"gpucluster-{name}") for name in ("preview", "deploy-dev", "deploy-prod")}


def test_state_bucket_is_versioned_encrypted_blocked_and_tls_only(made: Any) -> None:
    aws, result = made
    s3 = aws.client("s3")
    assert s3.get_bucket_location(Bucket=BUCKET)["LocationConstraint"] == "us-west-2"
    assert s3.get_bucket_versioning(Bucket=BUCKET)["Status"] == "Enabled"
    rule = s3.get_bucket_encryption(Bucket=BUCKET)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms",
                                                          "KMSMasterKeyID": result.key_arn}
    assert all(s3.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"].values())
    statement = json.loads(s3.get_bucket_policy(Bucket=BUCKET)["Policy"])["Statement"][0]
    assert statement["Effect"] == "Deny"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert statement["Resource"] == [STATE, f"{STATE}/*"]


def test_kms_key_rotates_and_is_the_secrets_provider(made: Any) -> None:
    aws, result = made
    kms = aws.client("kms")
    key = kms.describe_key(KeyId="alias/gpucluster-state")["KeyMetadata"]
    assert key["Arn"] == result.key_arn
    assert kms.get_key_rotation_status(KeyId=key["KeyId"])["KeyRotationEnabled"] is True
    assert result.secrets_provider == "awskms://alias/gpucluster-state?region=us-west-2"
    assert result.backend_url == "s3://acme-gpucluster-state?region=us-west-2&awssdk=v2"


# ------------------------------------------------------------------ who may assume (item 2)


def test_deploy_roles_trust_only_main_s_deploy_workflow_in_their_environment(made: Any,
                                                                           roles: dict[str, Role]) -> None:
    provider = f"{IAM}:oidc-provider/token.actions.githubusercontent.com"
    assert made[1].oidc_provider_arn == provider
    assert made[0].client("iam").get_open_id_connect_provider(OpenIDConnectProviderArn=provider)[
        "ClientIDList"] == ["sts.amazonaws.com"]
    prod = roles["deploy-prod"].trust
    main_prod = ("repo:acme/gpucluster:environment:prod:ref:refs/heads/main:job_workflow_ref:"
                 "acme/gpucluster/.github/workflows/deploy-stack.yml@refs/heads/main")
    assert prod["Statement"] == [{
        "Effect": "Allow", "Principal": {"Federated": provider}, "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {"token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
                                       "token.actions.githubusercontent.com:sub": main_prod}}}]

    def assumable(role: str, subject: str) -> bool:
        return allowed([roles[role].trust], None, "sts:AssumeRoleWithWebIdentity", "*", **{
            "token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
            "token.actions.githubusercontent.com:sub": subject})

    assert assumable("deploy-prod", main_prod)
    pushed_branch = main_prod.replace("ref:refs/heads/main:", "ref:refs/heads/evil:")
    remote_call = pushed_branch  # a branch calling main's workflow remotely: job_workflow_ref @main, ref evil
    assert not assumable("deploy-prod", pushed_branch) and not assumable("deploy-prod", remote_call)
    assert not assumable("deploy-prod", main_prod.replace("deploy-stack.yml", "other.yml"))
    assert not assumable("deploy-prod", "repo:acme/gpucluster:environment:prod")  # the default subject
    assert not assumable("deploy-dev", main_prod)  # prod's token is not dev's
    assert not assumable("deploy-prod", main_prod.replace("acme/gpucluster", "evil/gpucluster"))


def test_the_preview_role_trusts_only_pull_requests_of_pr_yml_in_the_preview_environment(
        roles: dict[str, Role]) -> None:
    trust = roles["preview"].trust

    def assumable(subject: str) -> bool:
        return allowed([trust], None, "sts:AssumeRoleWithWebIdentity", "*", **{
            "token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
            "token.actions.githubusercontent.com:sub": subject})

    pr = ("repo:acme/gpucluster:environment:preview:ref:refs/pull/42/merge:job_workflow_ref:"
          "acme/gpucluster/.github/workflows/pr.yml@refs/pull/42/merge")
    assert assumable(pr)
    assert not assumable(pr.replace("refs/pull/42/merge", "refs/heads/feature"))
    assert not assumable(pr.replace("environment:preview", "environment:prod"))
    assert not assumable("repo:acme/gpucluster:pull_request")


def test_instructions_name_the_github_settings_and_the_boundary(made: Any) -> None:
    text = made[1].instructions()
    assert ("gh api -X PUT repos/acme/gpucluster/actions/oidc/customization/sub -F use_default=false "
            "-f 'include_claim_keys[]=repo' -f 'include_claim_keys[]=context' -f 'include_claim_keys[]=ref' "
            "-f 'include_claim_keys[]=job_workflow_ref'") in text
    assert f"  {WORKLOAD}" in text
    assert "GitHub environment 'preview'" in text and "deployment branches: main only" in text


# ------------------------------------------------------------------ no escalation (item 1)


def test_deploy_roles_carry_the_deploy_boundary_and_no_aws_managed_policy(roles: dict[str, Role]) -> None:
    for name in ("deploy-dev", "deploy-prod"):
        role = roles[name]
        assert role.boundary_arn == DEPLOY
        assert sorted(role.attached) == [f"{IAM}:policy/gpucluster-deploy-iam",
                                         f"{IAM}:policy/gpucluster-deploy-resources-1",
                                         f"{IAM}:policy/gpucluster-deploy-resources-2",
                                         f"{IAM}:policy/gpucluster-deploy-resources-3"]
        assert list(role.inline) == ["pulumi-state"]
    assert roles["preview"].attached == [] and sorted(roles["preview"].inline) == ["preview", "pulumi-state"]


@pytest.mark.parametrize("name", ["deploy-dev", "deploy-prod"])
def test_a_deploy_role_cannot_make_itself_an_administrator(roles: dict[str, Role], name: str) -> None:
    deploy = roles[name]
    new_role = f"{IAM}:role/gpu-prod-node-identity-role-abc1234"
    bounded = {"iam:PermissionsBoundary": WORKLOAD}
    # what the program does stays possible
    assert deploy.can("iam:CreateRole", new_role, **bounded)
    assert deploy.can("iam:PutRolePolicy", new_role, **bounded)
    assert deploy.can("iam:AttachRolePolicy", new_role, **bounded, **{"iam:PolicyARN": SSM_CORE})
    for service in ("ec2.amazonaws.com", "lambda.amazonaws.com", "scheduler.amazonaws.com"):
        assert deploy.can("iam:PassRole", new_role, **{"iam:PassedToService": service})
    # AdministratorAccess on a new role, or any managed policy the program does not use
    assert not deploy.can("iam:AttachRolePolicy", new_role, **bounded, **{"iam:PolicyARN": ADMIN})
    assert not deploy.can("iam:AttachRolePolicy", new_role, **bounded,
                          **{"iam:PolicyARN": "arn:aws:iam::aws:policy/IAMFullAccess"})
    # a role without the boundary, or with another one
    for context in ({}, {"iam:PermissionsBoundary": DEPLOY}, {"iam:PermissionsBoundary": f"{IAM}:policy/x"}):
        assert not deploy.can("iam:CreateRole", new_role, **context)
        assert not deploy.can("iam:PutRolePolicy", new_role, **context)
        assert not deploy.can("iam:AttachRolePolicy", new_role, **context, **{"iam:PolicyARN": SSM_CORE})
    # roles outside the prefix, the CI roles themselves
    for other in (f"{IAM}:role/admin", f"{IAM}:role/gpucluster-deploy-prod"):
        assert not deploy.can("iam:CreateRole", other, **bounded)
        assert not deploy.can("iam:PutRolePolicy", other, **bounded)
        assert not deploy.can("iam:UpdateAssumeRolePolicy", other)
        assert not deploy.can("iam:PassRole", other, **{"iam:PassedToService": "lambda.amazonaws.com"})
    # passing a stack role to a service that would run it with other code paths
    for service in ("cloudformation.amazonaws.com", "codebuild.amazonaws.com", "glue.amazonaws.com"):
        assert not deploy.can("iam:PassRole", new_role, **{"iam:PassedToService": service})
    assert not deploy.can("iam:PassRole", new_role)
    # the boundaries cannot be changed, removed or replaced
    for boundary in (WORKLOAD, DEPLOY):
        for action in ("iam:CreatePolicyVersion", "iam:DeletePolicy", "iam:SetDefaultPolicyVersion",
                       "iam:DeletePolicyVersion"):
            assert not deploy.can(action, boundary)
    assert not deploy.can("iam:DeleteRolePermissionsBoundary", new_role, **bounded)
    assert not deploy.can("iam:PutRolePermissionsBoundary", new_role, **{"iam:PermissionsBoundary": DEPLOY})
    assert not deploy.can("iam:DeleteRolePermissionsBoundary", deploy.arn,
                          **{"iam:PermissionsBoundary": DEPLOY})
    # no new principals, policies or direct role assumption
    for action in ("iam:CreatePolicy", "iam:CreateUser", "iam:CreateAccessKey", "sts:AssumeRole"):
        assert not deploy.can(action, "*") and not deploy.can(action, new_role)


def test_whatever_a_deploy_role_creates_is_capped_by_the_workload_boundary(made: Any) -> None:
    """Worst case: a role made with the boundary and an inline `*:*`: what it could still do."""
    iam = made[0].client("iam")
    boundary = managed_document(iam, WORKLOAD)
    anything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}

    def can(action: str, resource: str = "*", **context: Any) -> bool:
        return allowed([anything], boundary, action, resource, **context)

    for action in ("iam:CreateRole", "iam:PassRole", "iam:AttachRolePolicy", "iam:PutRolePolicy",
                   "sts:AssumeRole", "kms:ScheduleKeyDeletion", "kms:PutKeyPolicy", "s3:PutBucketPolicy",
                   "ec2:RunInstances", "lambda:UpdateFunctionCode", "ssm:PutParameter",
                   "organizations:LeaveOrganization"):
        assert not can(action), action
    assert not can("ssm:PutParameter", "arn:aws:ssm:us-east-1:123456789012:parameter/db-password")
    assert can("ssm:PutParameter", "arn:aws:ssm:us-east-1:123456789012:parameter/gpucluster/o/p/s/c/jobs/j")
    assert not can("s3:DeleteObjectVersion", "arn:aws:s3:::gpu-prod-data/x")
    assert not can("fsx:DeleteFileSystem", "arn:aws:fsx:us-east-1:123456789012:file-system/fs-1")
    # Run Command: only the shell document, only on instances tagged with a stack
    instance = "arn:aws:ec2:us-east-1:123456789012:instance/i-1"
    assert can("ssm:SendCommand", "arn:aws:ssm:us-east-1::document/AWS-RunShellScript")
    assert can("ssm:SendCommand", instance, **{"ssm:resourceTag/gpucluster:stack": "prod"})
    assert not can("ssm:SendCommand", instance)
    assert not can("ssm:SendCommand", "arn:aws:ssm:us-east-1:123456789012:document/Evil")


def test_data_deletion_needs_the_break_glass_role(roles: dict[str, Role], made: Any) -> None:
    deploy = roles["deploy-prod"]
    bucket = "arn:aws:s3:::gpu-prod-pretrain-corpus-4170"
    fs = "arn:aws:fsx:us-east-1:123456789012:file-system/fs-0123"
    assert deploy.can("s3:PutLifecycleConfiguration", bucket)  # Pulumi's lifecycle stays deployable
    assert deploy.can("s3:PutBucketVersioning", bucket)
    assert deploy.can("fsx:UpdateFileSystem", fs)
    assert not deploy.can("s3:DeleteObjectVersion", f"{bucket}/corpus/v3/shard-0")
    assert not deploy.can("s3:DeleteBucket", bucket)
    assert not deploy.can("fsx:DeleteFileSystem", fs)
    assert not deploy.can("fsx:DeleteBackup", "arn:aws:fsx:us-east-1:123456789012:backup/b-1")
    # the boundary's deny exempts exactly the break-glass role (were it to carry the boundary)
    iam = made[0].client("iam")
    boundary = managed_document(iam, DEPLOY)
    deleter = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:DeleteBucket",
                                                       "Resource": "*"}]}
    assert allowed([deleter], boundary, "s3:DeleteBucket", bucket, **{"aws:PrincipalArn": BREAK_GLASS})
    assert not allowed([deleter], boundary, "s3:DeleteBucket", bucket, **{"aws:PrincipalArn": deploy.arn})


def test_deploy_roles_leave_the_state_bucket_key_and_foreign_keys_alone(roles: dict[str, Role],
                                                                       made: Any) -> None:
    deploy, key = roles["deploy-prod"], made[1].key_arn
    for action in ("kms:ScheduleKeyDeletion", "kms:PutKeyPolicy", "kms:TagResource"):
        assert not deploy.can(action, key)
        assert not deploy.can(action, f"arn:aws:kms:us-west-2:{ACCOUNT}:key/foreign")  # untagged
        assert deploy.can(action, f"arn:aws:kms:us-west-2:{ACCOUNT}:key/stack-key",
                          **{"aws:ResourceTag/gpucluster:stack": "prod"})
    for action in ("s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:PutLifecycleConfiguration"):
        assert not deploy.can(action, STATE)
    assert not deploy.can("ec2:CreateTags", "arn:aws:ec2:us-east-1:123456789012:instance/i-foreign")
    assert deploy.can("ec2:CreateTags", "arn:aws:ec2:us-east-1:123456789012:vpc/vpc-1")


def test_deploy_roles_can_run_the_doctor_gate(roles: dict[str, Role]) -> None:
    """deploy-stack.yml runs `gpucluster doctor` with the deploy role: a denied read would only warn
    ("could not check"), and the gate would let an inactive budget tag through."""
    from gpucluster.ops.doctor import IAM_ACTIONS

    for name in ("deploy-dev", "deploy-prod"):
        assert [a for a in IAM_ACTIONS if not roles[name].can(a)] == [], name
    assert not roles["deploy-dev"].can("ce:UpdateCostAllocationTagsStatus")  # reading, not activating


def test_each_deploy_role_writes_only_its_own_stack_s_state(roles: dict[str, Role], made: Any) -> None:
    dev, key = roles["deploy-dev"], made[1].key_arn
    assert dev.can("s3:PutObject", f"{STATE}/.pulumi/stacks/gpucluster/dev.json")
    assert dev.can("s3:PutObject", f"{STATE}/.pulumi/history/gpucluster/dev/dev-1.history.json")
    assert dev.can("s3:DeleteObject", f"{STATE}/.pulumi/locks/organization/gpucluster/dev/l.json")
    assert not dev.can("s3:PutObject", f"{STATE}/.pulumi/stacks/gpucluster/prod.json")
    assert not dev.can("s3:GetObject", f"{STATE}/.pulumi/stacks/gpucluster/prod.json")
    assert not dev.can("s3:DeleteObjectVersion", f"{STATE}/.pulumi/stacks/gpucluster/dev.json")
    assert dev.can("kms:Decrypt", key) and dev.can("kms:Encrypt", key)
    assert dev.can("kms:GenerateDataKey", key, **{"kms:ViaService": "s3.us-west-2.amazonaws.com"})
    assert not dev.can("kms:GenerateDataKey", key)


# ------------------------------------------------------------------ previews (item 3)


def test_the_preview_role_reads_state_writes_only_locks_and_reads_nothing_else(roles: dict[str, Role],
                                                                              made: Any) -> None:
    preview, key = roles["preview"], made[1].key_arn
    for stack in ("dev", "prod"):
        assert preview.can("s3:GetObject", f"{STATE}/.pulumi/stacks/gpucluster/{stack}.json")
        assert preview.can("s3:PutObject", f"{STATE}/.pulumi/locks/organization/gpucluster/{stack}/l.json")
        assert preview.can("s3:DeleteObject", f"{STATE}/.pulumi/locks/organization/gpucluster/{stack}/l.json")
        assert not preview.can("s3:PutObject", f"{STATE}/.pulumi/stacks/gpucluster/{stack}.json")
        assert not preview.can("s3:PutObject", f"{STATE}/.pulumi/history/gpucluster/{stack}/h.json")
        assert not preview.can("s3:DeleteObject", f"{STATE}/.pulumi/stacks/gpucluster/{stack}.json")
    assert preview.can("s3:ListBucket", STATE, **{"s3:prefix": ".pulumi/stacks/gpucluster/"})
    assert not preview.can("s3:ListBucket", STATE, **{"s3:prefix": "other/"})
    assert preview.can("kms:Decrypt", key)
    assert preview.can("kms:GenerateDataKey", key, **{"kms:ViaService": "s3.us-west-2.amazonaws.com"})
    assert not preview.can("kms:Encrypt", key) and not preview.can("kms:GenerateDataKey", key)
    assert not preview.can("kms:Decrypt", f"arn:aws:kms:us-west-2:{ACCOUNT}:key/other")
    assert preview.can("ssm:GetParameter", "arn:aws:ssm:us-west-2::parameter/aws/service/deeplearning/ami/x")
    # what ReadOnlyAccess handed out before
    assert not preview.can("s3:GetObject", "arn:aws:s3:::gpu-prod-pretrain-corpus-4170/corpus/x")
    assert not preview.can("ssm:GetParameter", f"arn:aws:ssm:us-west-2:{ACCOUNT}:parameter/db-password")
    assert not preview.can("secretsmanager:GetSecretValue", "*")
    assert not preview.can("ec2:DescribeInstances", "*")


# ------------------------------------------------------------------ the program fits the roles


@pytest.fixture(scope="module")
def plans() -> list[Any]:
    from shipped import planned_config, shipped_plan
    from test_images import baked_prod
    # and prod baked, with a warm pool: the Image Builder resources and the build role
    baked = baked_prod()
    baked["gpucluster:node_groups"][1].update({"capacity": {"spot_percent": 0}, "warm_pool": {"min_size": 1}})
    from test_pcs import slurm_prod  # and a Slurm prod: the PCS cluster (Cloud Control), node groups, queues
    return [*(shipped_plan(stack) for stack in ("dev", "staging", "prod")), planned_config(baked, "prod"),
            planned_config(slurm_prod(), "prod"), *eks_plans()]


def eks_plans() -> list[Any]:
    """prod on EKS (issue 36): the cluster, add-ons, access entries, system node group, pod roles, the
    termination handler's queue and rules, charts and objects; again without NAT (the private cluster's
    interface endpoints) and with Prometheus (the metrics agent's pod role)."""
    from shipped import planned_config
    from test_eks import eks_prod
    from test_prometheus_stack import DIGEST

    no_nat = eks_prod()
    no_nat["gpucluster:network"]["nat_gateway"] = False
    metrics = eks_prod()
    metrics["gpucluster:observability"] = {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST}}
    return [planned_config(config, "prod") for config in (eks_prod(), no_nat, metrics)]


def test_every_resource_type_the_program_creates_is_granted(plans: list[Any], roles: dict[str, Role]) -> None:
    types = {r.type for plan in plans for r in plan.resources
             if r.custom and not r.type.startswith("pulumi:providers:")}  # providers call no AWS API
    assert types - set(bootstrap_state.DEPLOY_ACTIONS) == set(), "add the new type to DEPLOY_ACTIONS"
    deploy = roles["deploy-prod"]
    scope = bootstrap_state.scopes("aws", ACCOUNT, "gpu-", [])
    context = {"iam:PermissionsBoundary": WORKLOAD, "iam:PolicyARN": SSM_CORE,
               "iam:PassedToService": "ec2.amazonaws.com", "aws:ResourceTag/gpucluster:stack": "prod",
               "aws:RequestTag/gpucluster:stack": "prod"}  # PCS: tagged at creation, acted on by tag
    samples = {**{s: r[0].replace("*", "x") for s, r in scope.items()},
               "iam": f"{IAM}:role/gpu-prod-x", "kms": f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k"}
    for token, actions in bootstrap_state.DEPLOY_ACTIONS.items():
        for action in actions:
            service = action.split(":")[0]
            resource = samples[service] if service != "iam" or "InstanceProfile" not in action else (
                f"{IAM}:instance-profile/gpu-prod-x")
            if action == "s3:PutObject":
                resource += "/x"
            if action in bootstrap_state.EC2_ONLY_ON_STACK_RESOURCES:  # on the account's, by tag
                resource = f"arn:aws:ec2:us-east-1:{ACCOUNT}:vpc/vpc-1"
            assert deploy.can(action, resource, **context), (token, action, resource)


def test_managed_policies_the_program_attaches_are_the_allowed_ones(plans: list[Any]) -> None:
    from gpucluster.aws.iam import MANAGED_POLICIES
    attached = {r.inputs["policyArn"] for plan in plans
                for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    allowed_arns = {f"arn:aws:iam::aws:policy/{n}" for n in bootstrap_state.MANAGED_POLICIES}
    assert attached <= allowed_arns
    assert set(MANAGED_POLICIES.values()) <= set(bootstrap_state.MANAGED_POLICIES)


def granted_context(statement: dict[str, Any]) -> dict[str, str]:
    """Condition keys a statement requires, each with a value it accepts (the first, wildcards as written)."""
    context: dict[str, str] = {}
    for operator in ("StringEquals", "StringLike", "ArnLike", "ArnEquals"):
        for key, value in statement.get("Condition", {}).get(operator, {}).items():
            context[key] = value[0] if isinstance(value, list) else value
    return context


def test_the_workload_boundary_keeps_what_the_program_s_roles_are_granted(plans: list[Any],
                                                                          made: Any) -> None:
    """Every action of the program's inline policies and attached managed policies, on its own
    resources, passes the boundary: the boundary caps, it never breaks a cluster."""
    iam = made[0].client("iam")
    boundary = managed_document(iam, WORKLOAD)
    # Each document with the role that holds it (aws:PrincipalArn: the boundary allows the EKS cluster role's
    # AmazonEKSClusterPolicy only to that role); a managed policy on the role the program attaches it to.
    documents = [(json.loads(r.inputs["policy"]), f"{IAM}:role/{r.inputs['role']}") for plan in plans
                 for r in plan.of_type("aws:iam/rolePolicy:RolePolicy")]
    holder = {"AmazonEKSClusterPolicy": EKS_CLUSTER_ROLE}
    documents += [(managed_document(iam, f"arn:aws:iam::aws:policy/{n}"), holder.get(n, NODE_ROLE))
                  for n in bootstrap_state.MANAGED_POLICIES]
    checked = 0
    for document, principal in documents:
        for statement in document["Statement"]:
            if statement["Effect"] != "Allow":
                continue
            resources = statement.get("Resource", "*")
            for action in statement["Action"] if isinstance(statement["Action"],
                                                            list) else [statement["Action"]]:
                for resource in resources if isinstance(resources, list) else [resources]:
                    # The request as the grant allows it: the values its own conditions ask for (e.g. a
                    # PassRole only to PCS carries iam:PassedToService), beside the stack's tag.
                    context = {"ssm:resourceTag/gpucluster:stack": "prod", "aws:PrincipalArn": principal,
                               **granted_context(statement)}
                    everything = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
                    assert allowed([everything], boundary, action, resource, **context), (action, resource)
                    checked += 1
    assert checked > 60


def test_policy_sizes_fit_iam_limits(made: Any) -> None:
    """Managed policies hold at most 6,144 characters, a role's inline policies 10,240 together
    (IAM user guide, "IAM and AWS STS quotas"; whitespace is not counted)."""
    iam = made[0].client("iam")
    for name in ("workload-boundary", "deploy-boundary", "deploy-iam", "deploy-resources-1",
                 "deploy-resources-2", "deploy-resources-3"):
        text = json.dumps(managed_document(iam, f"{IAM}:policy/gpucluster-{name}"), separators=(",", ":"))
        assert len(text) <= 6144, (name, len(text))
    for role in ("gpucluster-preview", "gpucluster-deploy-prod"):
        total = sum(len(json.dumps(_json(iam.get_role_policy(RoleName=role, PolicyName=n)["PolicyDocument"]),
                                   separators=(",", ":")))
                    for n in iam.list_role_policies(RoleName=role)["PolicyNames"])
        assert total <= 10240


# ------------------------------------------------------------------ idempotence and the command


def test_running_twice_reuses_everything_and_drops_old_grants(made: Any) -> None:
    aws, first = made
    iam = aws.client("iam")
    iam.attach_role_policy(RoleName="gpucluster-deploy-dev",
                           PolicyArn="arn:aws:iam::aws:policy/PowerUserAccess")
    iam.put_role_policy(RoleName="gpucluster-deploy-dev", PolicyName="cluster-iam",
                        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
                            {"Effect": "Allow", "Action": "iam:*", "Resource": "*"}]}))
    assert run(aws) == first
    assert len(aws.client("kms").list_keys()["Keys"]) == 1
    dev = Role(iam, "gpucluster-deploy-dev")
    assert "arn:aws:iam::aws:policy/PowerUserAccess" not in dev.attached and "cluster-iam" not in dev.inline
    assert len(iam.list_policy_versions(PolicyArn=WORKLOAD)["Versions"]) == 1  # unchanged: no new version


def test_a_changed_policy_gets_a_new_default_version_and_old_ones_are_pruned(made: Any) -> None:
    iam = made[0].client("iam")
    arn = f"{IAM}:policy/gpucluster-test-versions"
    for i in range(7):
        document = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": f"s3:Get{i}",
                                                            "Resource": "*"}]}
        bootstrap_state.ensure_managed_policy(iam, arn, "gpucluster-test-versions", document, "test")
    assert len(iam.list_policy_versions(PolicyArn=arn)["Versions"]) == 5
    assert managed_document(iam, arn)["Statement"][0]["Action"] == "s3:Get6"


def test_main_prints_what_github_and_pulumi_need(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws(config=MANAGED):
        assert bootstrap_state.main(["--bucket", "acme-state", "--github-repo", "acme/gpucluster",
                                     "--break-glass-role", "acme-break-glass"]) == 0
    out = capsys.readouterr().out
    assert "PULUMI_BACKEND_URL   = s3://acme-state?region=us-east-1&awssdk=v2" in out
    assert f"staging  AWS_ROLE_ARN = arn:aws:iam::{ACCOUNT}:role/gpucluster-deploy-staging" in out
    assert ("pulumi stack init prod --secrets-provider 'awskms://alias/gpucluster-state?region=us-east-1'"
            in out)


@pytest.mark.parametrize(("argv", "message"), [
    (["--iam-prefix", "gpu"], "--iam-prefix: 'gpu' would cover the CI roles"),
    (["--break-glass-role", "bad name!"], "--break-glass-role: 'bad name!' is not a valid name"),
])
def test_main_rejects_bad_arguments_in_one_line(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--bucket", "b", "--github-repo", "acme/gpucluster", "--break-glass-role", "bg"]
    with pytest.raises(SystemExit) as exit_:
        bootstrap_state.main(base + argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------- issue 24 item 6 (parliament, SNS)


@pytest.fixture(scope="module")
def with_datasets() -> Any:
    """An account bootstrapped with an existing dataset bucket passed as --dataset-bucket."""
    with mock_aws(config=MANAGED):
        session = boto3.session.Session(region_name="us-west-2")
        bootstrap_state.bootstrap(session, BUCKET, "us-west-2", "acme/gpucluster", ["prod"],
                                  "acme-break-glass", dataset_buckets=["acme-imagenet"])
        yield Role(session.client("iam"), "gpucluster-deploy-prod")


def test_an_existing_dataset_bucket_gets_only_what_the_fsx_link_needs(with_datasets: Role) -> None:
    deploy, bucket = with_datasets, "arn:aws:s3:::acme-imagenet"
    # FSx for Lustre user guide, "Adding permissions to use data repositories in Amazon S3": the bucket
    # reads of the link; the data moves through FSx's service-linked role, never the deploy role
    for action in ("s3:GetBucketLocation", "s3:GetBucketPolicy", "s3:ListBucket"):
        assert deploy.can(action, bucket), action
    for action, resource in (("s3:PutObject", f"{bucket}/export/x"), ("s3:GetObject", f"{bucket}/x"),
                             ("s3:DeleteObject", f"{bucket}/x"), ("s3:GetObjectAcl", f"{bucket}/x"),
                             ("s3:GetBucketAcl", bucket), ("s3:ListBucketVersions", bucket)):
        assert not deploy.can(action, resource), action
    slr = (f"{IAM}:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/"
           "AWSServiceRoleForFSxS3Access_fs-1")
    assert deploy.can("iam:CreateServiceLinkedRole", slr,
                      **{"iam:AWSServiceName": "s3.data-source.lustre.fsx.amazonaws.com"})
    assert deploy.can("iam:AttachRolePolicy", slr) and deploy.can("iam:PutRolePolicy", slr)
    for action in ("s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:PutLifecycleConfiguration",
                   "s3:PutBucketPublicAccessBlock", "s3:PutEncryptionConfiguration", "s3:PutBucketAcl",
                   "s3:PutBucketVersioning", "s3:PutBucketTagging", "s3:DeleteBucket",
                   "s3:PutReplicationConfiguration", "s3:PutBucketOwnershipControls"):
        assert not deploy.can(action, bucket), action
    # the buckets the stacks create keep their settings deployable
    assert deploy.can("s3:PutBucketPolicy", "arn:aws:s3:::gpu-prod-checkpoints-1")
    assert deploy.can("s3:PutBucketPublicAccessBlock", "arn:aws:s3:::gpu-prod-checkpoints-1")


def test_even_a_broader_grant_cannot_rewrite_a_dataset_bucket(with_datasets: Role) -> None:
    anything = {"Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    for action in ("s3:PutBucketPolicy", "s3:PutLifecycleConfiguration", "s3:PutBucketPublicAccessBlock"):
        assert not allowed([anything], with_datasets.boundary, action, "arn:aws:s3:::acme-imagenet")


def test_subscription_actions_are_granted_where_iam_can_match_them(roles: dict[str, Role]) -> None:
    """Subscribe and ListSubscriptionsByTopic act on a topic; Unsubscribe and the subscription
    attributes have no resource type (Service Authorization Reference, "Amazon SNS"), so only "*"
    matches them: granted on a topic ARN they would be denied at `pulumi up`."""
    deploy = roles["deploy-prod"]
    topic = f"arn:aws:sns:us-east-1:{ACCOUNT}:gpu-prod-guardrails"
    assert deploy.can("sns:Subscribe", topic) and deploy.can("sns:ListSubscriptionsByTopic", topic)
    assert not deploy.can("sns:Subscribe", f"arn:aws:sns:us-east-1:{ACCOUNT}:foreign-topic")
    for action in ("sns:Unsubscribe", "sns:GetSubscriptionAttributes", "sns:SetSubscriptionAttributes"):
        assert deploy.can(action, "*"), action
    statements = [s for document in deploy.identity for s in document["Statement"]]
    scoped = {a for s in statements if s.get("Resource", "*") != "*"
              for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
    assert not scoped & {"sns:Unsubscribe", "sns:GetSubscriptionAttributes", "sns:SetSubscriptionAttributes"}


def test_flow_logs_and_the_composite_idle_alarm_are_deployable(roles: dict[str, Role]) -> None:
    deploy = roles["deploy-prod"]
    assert deploy.can("ec2:CreateFlowLogs", "*")
    assert deploy.can("iam:PassRole", f"{IAM}:role/gpu-prod-network-flow-logs-role",
                      **{"iam:PassedToService": "vpc-flow-logs.amazonaws.com"})
    group = f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/gpucluster/vpc-flow-logs/gpu-prod"
    assert deploy.can("logs:CreateLogGroup", group) and deploy.can("logs:AssociateKmsKey", group)
    alarm = f"arn:aws:cloudwatch:us-east-1:{ACCOUNT}:alarm:gpu-prod-x"
    assert deploy.can("cloudwatch:PutCompositeAlarm", alarm)


# ------------------------------------------------------------------ AWS PCS (issue 28)

PCS_CLUSTER = f"arn:aws:pcs:us-east-1:{ACCOUNT}:cluster/pcs_abc123"
PCS_GROUP = f"{PCS_CLUSTER}/computenodegroup/pcs_def456"
PCS_QUEUE = f"{PCS_CLUSTER}/queue/pcs_ghi789"
PCS_NODE_ROLE = f"{IAM}:role/aws-pcs/gpu-prod-node-identity-role-abc1234"
TAGGED = {"aws:ResourceTag/gpucluster:stack": "prod"}


def test_a_deploy_role_runs_pcs_only_on_the_stacks_tagged_resources(roles: dict[str, Role]) -> None:
    deploy = roles["deploy-prod"]
    # CreateCluster has no resource type: authorised on "*", only with the tag in the request
    assert deploy.can("pcs:CreateCluster", "*", **{"aws:RequestTag/gpucluster:stack": "prod"})
    assert not deploy.can("pcs:CreateCluster", "*")  # untagged: refused
    # node groups and queues are authorised on their parent cluster: a stack's, with the tag in the request
    for action in ("pcs:CreateComputeNodeGroup", "pcs:CreateQueue"):
        assert deploy.can(action, PCS_CLUSTER, **{"aws:RequestTag/gpucluster:stack": "prod"},
                          **TAGGED), action
        assert not deploy.can(action, PCS_CLUSTER, **TAGGED), action  # untagged: refused
    for resource in (PCS_CLUSTER, PCS_GROUP, PCS_QUEUE):
        for verb in ("Get", "Update", "Delete"):
            kind = "Cluster" if resource == PCS_CLUSTER else (
                "ComputeNodeGroup" if "computenodegroup" in resource else "Queue")
            assert deploy.can(f"pcs:{verb}{kind}", resource, **TAGGED), (verb, resource)
            assert not deploy.can(f"pcs:{verb}{kind}", resource), (verb, resource)  # not a stack's
        assert deploy.can("pcs:UntagResource", resource, **TAGGED)
        assert not deploy.can("pcs:UntagResource", resource)
    # nothing PCS beyond what the program does: no node registration, no other account's clusters
    assert not deploy.can("pcs:RegisterComputeNodeGroupInstance", PCS_GROUP, **TAGGED)
    # (CreateCluster names no ARN at all: IAM authorises it against "*" only, so the account shows in
    # what is created in a cluster)
    assert not deploy.can("pcs:CreateComputeNodeGroup", "arn:aws:pcs:us-east-1:999999999999:cluster/x",
                          **{"aws:RequestTag/gpucluster:stack": "prod"}, **TAGGED)
    assert deploy.can("pcs:ListClusters", "*")
    # pulumi-aws-native goes through Cloud Control (which acts with these same permissions)
    for action in ("cloudformation:CreateResource", "cloudformation:GetResourceRequestStatus"):
        assert deploy.can(action, "*")
    assert not deploy.can("cloudformation:CreateStack", "*")
    # the cluster's Slurm key secret: created, never read back
    secret = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:pcs!slurm-secret-pcs_abc123-AbCdEf"
    assert deploy.can("secretsmanager:CreateSecret", secret)
    assert not deploy.can("secretsmanager:GetSecretValue", secret)
    other = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:db"
    assert not deploy.can("secretsmanager:CreateSecret", other)


def test_the_pcs_node_role_is_made_bounded_and_passed_only_to_pcs_and_ec2(roles: dict[str, Role]) -> None:
    deploy = roles["deploy-prod"]
    bounded = {"iam:PermissionsBoundary": WORKLOAD}
    assert deploy.can("iam:CreateRole", PCS_NODE_ROLE, **bounded)
    assert not deploy.can("iam:CreateRole", PCS_NODE_ROLE)
    assert deploy.can("iam:PutRolePolicy", PCS_NODE_ROLE, **bounded)
    assert deploy.can("iam:CreateInstanceProfile", f"{IAM}:instance-profile/aws-pcs/gpu-prod-node-profile")
    for service in ("pcs.amazonaws.com", "ec2.amazonaws.com"):
        assert deploy.can("iam:PassRole", PCS_NODE_ROLE, **{"iam:PassedToService": service}), service
    for service in ("lambda.amazonaws.com", "scheduler.amazonaws.com", "cloudformation.amazonaws.com"):
        assert not deploy.can("iam:PassRole", PCS_NODE_ROLE, **{"iam:PassedToService": service}), service
    assert not deploy.can("iam:PassRole", PCS_NODE_ROLE)
    # the stacks' other roles are not passed to PCS, and /aws-pcs/ roles outside the prefix not at all
    assert not deploy.can("iam:PassRole", f"{IAM}:role/gpu-prod-guardrails-role",
                          **{"iam:PassedToService": "pcs.amazonaws.com"})
    assert not deploy.can("iam:PassRole", f"{IAM}:role/aws-pcs/someone-elses",
                          **{"iam:PassedToService": "pcs.amazonaws.com"})
    # PCS's service-linked role, and no other through this grant
    slr = f"{IAM}:role/aws-service-role/pcs.amazonaws.com/AWSServiceRoleForPCS"
    assert deploy.can("iam:CreateServiceLinkedRole", slr, **{"iam:AWSServiceName": "pcs.amazonaws.com"})
    assert not deploy.can("iam:CreateServiceLinkedRole", f"{IAM}:role/aws-service-role/x.amazonaws.com/X",
                          **{"iam:AWSServiceName": "x.amazonaws.com"})
    assert not deploy.can("iam:CreateServiceLinkedRole", slr,
                          **{"iam:AWSServiceName": "elasticmapreduce.amazonaws.com"})


def test_the_pcs_statements_are_exactly_these(roles: dict[str, Role]) -> None:
    """Nothing broader than the tag-scoped PCS grants: no pcs:* and no PCS action on "*" but the lists."""
    statements = [s for document in roles["deploy-prod"].identity for s in document["Statement"]]
    pcs = [s for s in statements if any(str(a).startswith("pcs:") for a in
                                        (s["Action"] if isinstance(s["Action"], list) else [s["Action"]]))]
    by_sid = {s["Sid"]: s for s in pcs}
    assert set(by_sid) == {"StackPcsCreateInStackClusters", "StackPcsTagOnCreate", "StackPcsTagged",
                           "PcsTagReads", "CreatesWithoutResourceType", "ReadsWithoutResourceScope"}
    assert by_sid["StackPcsCreateInStackClusters"]["Condition"] == {
        "Null": {"aws:RequestTag/gpucluster:stack": "false", "aws:ResourceTag/gpucluster:stack": "false"}}
    assert by_sid["StackPcsTagOnCreate"]["Condition"] == {
        "Null": {"aws:RequestTag/gpucluster:stack": "false"}}
    assert by_sid["StackPcsTagged"]["Condition"] == {"Null": {"aws:ResourceTag/gpucluster:stack": "false"}}
    assert by_sid["CreatesWithoutResourceType"]["Condition"] == {
        "Null": {"aws:RequestTag/gpucluster:stack": "false"}}
    assert sorted(by_sid["StackPcsCreateInStackClusters"]["Action"]) == [
        "pcs:CreateComputeNodeGroup", "pcs:CreateQueue"]
    assert by_sid["StackPcsTagOnCreate"]["Action"] == ["pcs:TagResource"]
    assert by_sid["PcsTagReads"] == {"Sid": "PcsTagReads", "Effect": "Allow",
                                     "Action": ["pcs:ListTagsForResource"], "Resource": "*"}
    unscoped = [a for a in by_sid["ReadsWithoutResourceScope"]["Action"] if a.startswith("pcs:")]
    assert unscoped == ["pcs:ListClusters", "pcs:ListComputeNodeGroups", "pcs:ListQueues"]
    assert not any("pcs:*" in s["Action"] for s in pcs)


def test_the_preview_role_reads_pcs_and_changes_nothing(roles: dict[str, Role]) -> None:
    preview = roles["preview"]
    for action, resource in (("pcs:GetCluster", PCS_CLUSTER), ("pcs:GetComputeNodeGroup", PCS_GROUP),
                             ("pcs:GetQueue", PCS_QUEUE)):
        assert preview.can(action, resource, **TAGGED)
        assert not preview.can(action, resource)  # not a stack's
    assert preview.can("pcs:ListClusters", "*") and preview.can("cloudformation:GetResource", "*")
    for action in ("pcs:CreateCluster", "pcs:UpdateComputeNodeGroup", "pcs:DeleteCluster", "pcs:TagResource",
                   "pcs:DeleteQueue", "pcs:RegisterComputeNodeGroupInstance", "cloudformation:CreateResource",
                   "cloudformation:UpdateResource", "cloudformation:DeleteResource"):
        assert not preview.can(action, PCS_CLUSTER, **TAGGED), action
        assert not preview.can(action, "*", **TAGGED), action


def test_the_workload_boundary_lets_pcs_nodes_register_and_the_guard_scale(made: Any) -> None:
    iam = made[0].client("iam")
    boundary = managed_document(iam, WORKLOAD)
    anything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    for action in ("pcs:RegisterComputeNodeGroupInstance", "pcs:GetComputeNodeGroup",
                   "pcs:UpdateComputeNodeGroup", "pcs:ListComputeNodeGroups"):
        assert allowed([anything], boundary, action, PCS_GROUP), action
    for action in ("pcs:CreateCluster", "pcs:DeleteCluster", "pcs:DeleteComputeNodeGroup",
                   "pcs:CreateComputeNodeGroup", "pcs:TagResource"):
        assert not allowed([anything], boundary, action, PCS_GROUP), action


# ------------------------------------------------------------------ agreeing with AWS (issues 33, 34)


def _resource_types() -> dict[str, dict[str, list[str]]]:
    """Each IAM action's resource types, from cfn-lint's bundled copy of the Service Authorization
    Reference (service prefix -> lower-case action name -> resource types; none: only "*" matches)."""
    from cfnlint_data import service_authorization

    data = service_authorization()
    return {service: {a: spec.get("Resources", []) for a, spec in body["Actions"].items()}
            for service, body in data.items()}


def _statements_of(*documents: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for document in documents for s in document["Statement"]]


def test_no_action_without_a_resource_type_is_granted_on_an_arn(roles: dict[str, Role], made: Any) -> None:
    """An action with no resource type is authorised only against "*": granted on an ARN it never applies
    (the scanners' finding of issue 33: aps/grafana CreateWorkspace, pcs CreateCluster and
    ListTagsForResource, the s3:Get*/List* of a dataset bucket). The roles and the workload boundary."""
    import fnmatch

    types = _resource_types()
    boundary = managed_document(made[0].client("iam"), WORKLOAD)
    found = []
    for statement in _statements_of(*roles["deploy-prod"].identity, *roles["preview"].identity, boundary):
        resources = statement.get("Resource", "*")
        if statement["Effect"] != "Allow" or resources in ("*", ["*"]) or "Action" not in statement:
            continue
        for action in statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]:
            service, name = action.split(":")
            known = types[service]
            matched = [a for a in known if fnmatch.fnmatchcase(a, name.lower())]
            assert matched, f"{action}: not an action of the Service Authorization Reference"
            found += [(statement.get("Sid"), action, a) for a in matched if not known[a]]
    assert found == []


def test_creates_without_a_resource_type_need_the_stack_tag_in_the_request(roles: dict[str, Role]) -> None:
    deploy = roles["deploy-prod"]
    tagged = {"aws:RequestTag/gpucluster:stack": "prod"}
    for action in ("aps:CreateWorkspace", "grafana:CreateWorkspace", "pcs:CreateCluster"):
        assert deploy.can(action, "*", **tagged), action
        assert not deploy.can(action, "*"), action  # no stack tag: refused
        assert not roles["preview"].can(action, "*", **tagged), action


def test_pcs_node_groups_and_queues_only_in_a_stack_s_cluster(roles: dict[str, Role]) -> None:
    deploy = roles["deploy-prod"]
    tagged = {"aws:RequestTag/gpucluster:stack": "prod"}
    foreign = f"arn:aws:pcs:us-east-1:{ACCOUNT}:cluster/pcs_someone_elses"
    for action in ("pcs:CreateComputeNodeGroup", "pcs:CreateQueue"):
        assert deploy.can(action, PCS_CLUSTER, **tagged, **TAGGED), action
        assert not deploy.can(action, foreign, **tagged), action  # a cluster of no stack
        assert not deploy.can(action, PCS_CLUSTER, **TAGGED), action  # the new one untagged


def test_pcs_tags_are_read_without_a_condition_no_key_can_meet(roles: dict[str, Role]) -> None:
    """pcs:ListTagsForResource has no resource type and no condition keys: only "*", unconditioned."""
    for name in ("deploy-prod", "preview"):
        assert roles[name].can("pcs:ListTagsForResource", "*"), name
        grants = [s for s in _statements_of(*roles[name].identity)
                  if "pcs:ListTagsForResource" in s["Action"]]
        assert [(s["Resource"], s.get("Condition")) for s in grants] == [("*", None)], name


def test_the_cluster_s_slurm_secret_is_rotated_and_instances_tagged_only_at_launch(
        roles: dict[str, Role]) -> None:
    """The PCS guide's minimum permissions as issue 34 quotes them: CreateCluster rotates its secret,
    Create/UpdateComputeNodeGroup tag what they launch."""
    deploy = roles["deploy-prod"]
    secret = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:pcs!slurm-secret-pcs_abc123-AbCdEf"
    assert deploy.can("secretsmanager:RotateSecret", secret)
    other = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:db"
    assert not deploy.can("secretsmanager:RotateSecret", other)
    instance = f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/i-0abc"
    for action in ("RunInstances", "CreateFleet"):
        assert deploy.can("ec2:CreateTags", instance, **{"ec2:CreateAction": action}), action
    assert not deploy.can("ec2:CreateTags", instance)  # never an existing instance
    assert not deploy.can("ec2:CreateTags", instance, **{"ec2:CreateAction": "CreateTags"})
    assert deploy.can("iam:GetInstanceProfile", f"{IAM}:instance-profile/aws-pcs/gpu-prod-node-profile")


def test_the_workload_boundary_caps_what_a_pcs_update_may_check(made: Any) -> None:
    """A guardrail role's UpdateComputeNodeGroup may need PassRole, GetInstanceProfile and the launch
    actions (issue 34): the boundary allows them only for the stacks' PCS node roles, passed to PCS, and
    launches that carry a stack's tag."""
    boundary = managed_document(made[0].client("iam"), WORKLOAD)
    anything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}

    def can(action: str, resource: str, **context: str) -> bool:
        return allowed([anything], boundary, action, resource, **context)

    to_pcs = {"iam:PassedToService": "pcs.amazonaws.com"}
    assert can("iam:PassRole", PCS_NODE_ROLE, **to_pcs)
    assert not can("iam:PassRole", PCS_NODE_ROLE, **{"iam:PassedToService": "ec2.amazonaws.com"})
    assert not can("iam:PassRole", f"{IAM}:role/aws-pcs/someone-elses", **to_pcs)
    assert not can("iam:PassRole", f"{IAM}:role/gpu-prod-guardrails-role", **to_pcs)
    assert can("iam:GetInstanceProfile", f"{IAM}:instance-profile/aws-pcs/gpu-prod-node-profile")
    assert not can("iam:GetInstanceProfile", f"{IAM}:instance-profile/other")
    ec2 = f"arn:aws:ec2:us-east-1:{ACCOUNT}"
    for action in ("ec2:RunInstances", "ec2:CreateFleet"):
        assert can(action, f"{ec2}:instance/*", **{"aws:RequestTag/gpucluster:stack": "prod"}), action
        assert not can(action, f"{ec2}:instance/*"), action
        assert can(action, f"{ec2}:launch-template/lt-1", **TAGGED), action
        assert not can(action, f"{ec2}:launch-template/lt-1"), action
        assert can(action, "arn:aws:ec2:us-east-1::image/ami-0abc"), action
    for action in ("iam:CreateRole", "iam:PutRolePolicy", "iam:PassRole"):
        assert not can(action, f"{IAM}:role/gpu-prod-x", **to_pcs), action  # still no IAM otherwise


def test_what_the_role_creates_only_with_the_stack_tag_is_planned_with_it() -> None:
    """CreateWorkspace (AMP, Grafana), CreateCluster, CreateComputeNodeGroup and CreateQueue are granted
    only with the stack tag in the request: every one the program plans carries it (Slurm prod with
    Prometheus and Grafana)."""
    from base_config import plan_config
    from test_pcs import slurm_prod
    from test_prometheus_stack import DIGEST

    config = slurm_prod()
    config["gpucluster:observability"] = {
        "prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST},
        "grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"]}}
    plan = plan_config(config, stack="prod")
    tagged = ("aws:amp/workspace:Workspace", "aws:grafana/workspace:Workspace",
              "aws-native:pcs:ComputeNodeGroup", "aws-native:pcs:Queue")
    for token in tagged:
        assert plan.of_type(token), token
        for r in plan.of_type(token):
            assert r.inputs["tags"][bootstrap_state.STACK_TAG] == plan.spec.identity, r.name
    # The cluster: a Cloud Control resource whose CloudFormation document carries the tags (a map).
    [cluster] = plan.of_type("aws:cloudcontrol/resource:Resource")
    assert cluster.inputs["typeName"] == "AWS::PCS::Cluster"
    assert json.loads(cluster.inputs["desiredState"])["Tags"][bootstrap_state.STACK_TAG] == plan.spec.identity


def test_ec2_deletes_and_rewrites_only_on_a_stack_s_resources(roles: dict[str, Role]) -> None:
    """Deletes, releases and attribute rewrites of network resources need the stack tag on the resource
    (EC2 ids are AWS's, so no name scope); creates stay on "*" (ledger: ec2-deploy-creates-unscoped)."""
    deploy = roles["deploy-prod"]
    ec2 = f"arn:aws:ec2:us-east-1:{ACCOUNT}"
    for action, resource in (("ec2:DeleteVpc", "vpc/vpc-1"), ("ec2:DeleteSubnet", "subnet/subnet-1"),
                             ("ec2:DeleteSecurityGroup", "security-group/sg-1"),
                             ("ec2:ReleaseAddress", "elastic-ip/eipalloc-1"),
                             ("ec2:ModifyLaunchTemplate", "launch-template/lt-1"),
                             ("ec2:DeleteVpcEndpoints", "vpc-endpoint/vpce-1"),
                             ("ec2:DeleteRoute", "route-table/rtb-1")):
        assert deploy.can(action, f"{ec2}:{resource}", **TAGGED), action
        assert not deploy.can(action, f"{ec2}:{resource}"), action  # someone else's network
    assert deploy.can("ec2:CreateVpc", "*") and deploy.can("ec2:CreateSecurityGroup", "*")


def test_every_network_resource_the_program_deletes_by_tag_carries_it() -> None:
    """What Ec2ChangesOnlyOnStackResources lets the deploy role delete must be tagged when the program makes
    it, or `pulumi destroy` (and every replacement) would be refused: shipped dev and prod, Slurm prod."""
    from shipped import planned_config, shipped_plan
    from test_pcs import slurm_prod

    kinds = {"aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet", "aws:ec2/securityGroup:SecurityGroup",
             "aws:ec2/routeTable:RouteTable", "aws:ec2/internetGateway:InternetGateway",
             "aws:ec2/natGateway:NatGateway", "aws:ec2/eip:Eip", "aws:ec2/placementGroup:PlacementGroup",
             "aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/vpcEndpoint:VpcEndpoint",
             "aws:ec2/flowLog:FlowLog"}
    seen = set()
    for plan in (shipped_plan("dev"), shipped_plan("prod"), planned_config(slurm_prod(), stack="prod")):
        for r in plan.resources:
            if r.type in kinds:
                seen.add(r.type)
                tags = r.inputs.get("tags") or {}
                assert tags.get(bootstrap_state.STACK_TAG) == plan.spec.identity, r.name
    assert seen == kinds, sorted(kinds - seen)  # the check saw each kind it vouches for


# ------------------------------------------------------------------ Amazon EKS (issue 36)

EKS_CLUSTER = f"arn:aws:eks:us-east-1:{ACCOUNT}:cluster/gpu-prod-0960e8ea"
EKS_ADDON = f"arn:aws:eks:us-east-1:{ACCOUNT}:addon/gpu-prod-0960e8ea/vpc-cni/0a1b"
EKS_FOREIGN = f"arn:aws:eks:us-east-1:{ACCOUNT}:cluster/someone-elses"


def test_a_deploy_role_runs_eks_only_on_the_stacks_tagged_clusters(roles: dict[str, Role]) -> None:
    deploy = roles["deploy-prod"]
    # CreateCluster has no resource type: on "*", only with the stack tag in the request
    assert deploy.can("eks:CreateCluster", "*", **{"aws:RequestTag/gpucluster:stack": "prod"})
    assert not deploy.can("eks:CreateCluster", "*")
    for action, resource in (("eks:UpdateClusterConfig", EKS_CLUSTER), ("eks:DeleteCluster", EKS_CLUSTER),
                             ("eks:UpdateClusterVersion", EKS_CLUSTER), ("eks:CreateAddon", EKS_CLUSTER),
                             ("eks:CreateAccessEntry", EKS_CLUSTER), ("eks:CreateNodegroup", EKS_CLUSTER),
                             ("eks:CreatePodIdentityAssociation", EKS_CLUSTER),
                             ("eks:DeleteAddon", EKS_ADDON)):
        assert deploy.can(action, resource, **TAGGED), action
        assert not deploy.can(action, resource), action  # untagged: not a stack's
        assert not deploy.can(action, EKS_FOREIGN, **TAGGED), action  # not the stacks' names
    assert deploy.can("eks:TagResource", EKS_CLUSTER) and not deploy.can("eks:TagResource", EKS_FOREIGN)
    # `doctor`'s EKS checks, in the deploy workflow's gate, before the cluster exists (no tag to read)
    from gpucluster.ops.doctor import EKS_ACTIONS
    assert deploy.can("eks:DescribeClusterVersions", "*") and "eks:DescribeClusterVersions" in EKS_ACTIONS
    assert deploy.can("eks:DescribeCluster", EKS_CLUSTER) and "eks:DescribeCluster" in EKS_ACTIONS
    assert not deploy.can("eks:DescribeCluster", EKS_FOREIGN)
    assert not deploy.can("eks:AssociateAccessPolicy", EKS_CLUSTER, **TAGGED)  # nothing the program does not
    assert not deploy.can("eks:AccessKubernetesApi", EKS_CLUSTER, **TAGGED)
    # the cluster's control-plane log group, its secrets key's grant, EKS's service-linked roles
    assert deploy.can("logs:CreateLogGroup",
                      f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/eks/gpu-prod-0960e8ea/cluster")
    assert not deploy.can("logs:CreateLogGroup",
                          f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/eks/x/cluster")
    assert deploy.can("kms:CreateGrant", f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k", **TAGGED)
    assert not deploy.can("kms:CreateGrant", f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k")  # not a stack's key
    for service in ("eks.amazonaws.com", "eks-nodegroup.amazonaws.com"):
        assert deploy.can("iam:CreateServiceLinkedRole", f"{IAM}:role/aws-service-role/{service}/X",
                          **{"iam:AWSServiceName": service}), service
    # the termination handler's queue
    queue = f"arn:aws:sqs:us-east-1:{ACCOUNT}:gpu-prod-software-nth-1a2b3c4"
    assert deploy.can("sqs:CreateQueue", queue) and deploy.can("sqs:SetQueueAttributes", queue)
    assert not deploy.can("sqs:SetQueueAttributes", f"arn:aws:sqs:us-east-1:{ACCOUNT}:orders")
    assert not deploy.can("sqs:SendMessage", queue) and not deploy.can("sqs:ReceiveMessage", queue)


def test_a_deploy_role_passes_stack_roles_to_eks_and_its_pods_only(roles: dict[str, Role]) -> None:
    deploy = roles["deploy-prod"]
    for role in (EKS_CLUSTER_ROLE, NODE_ROLE, f"{IAM}:role/gpu-prod-software-autoscaler-1a2b3c4"):
        for service in ("eks.amazonaws.com", "pods.eks.amazonaws.com"):
            assert deploy.can("iam:PassRole", role, **{"iam:PassedToService": service}), (role, service)
    assert not deploy.can("iam:PassRole", f"{IAM}:role/admin", **{"iam:PassedToService": "eks.amazonaws.com"})
    assert not deploy.can("iam:PassRole", NODE_ROLE, **{"iam:PassedToService": "eks-fargate.amazonaws.com"})


def test_the_preview_role_reads_eks_and_changes_nothing(roles: dict[str, Role]) -> None:
    preview = roles["preview"]
    for action, resource in (("eks:DescribeCluster", EKS_CLUSTER), ("eks:DescribeAddon", EKS_ADDON),
                             ("eks:ListAddons", EKS_CLUSTER), ("eks:ListClusters", "*")):
        assert preview.can(action, resource), action
    assert not preview.can("eks:DescribeCluster", EKS_FOREIGN)
    for action in ("eks:CreateCluster", "eks:DeleteCluster", "eks:UpdateClusterConfig", "eks:CreateAddon",
                   "eks:CreateAccessEntry", "eks:TagResource", "eks:CreatePodIdentityAssociation"):
        assert not preview.can(action, EKS_CLUSTER, **TAGGED), action
        assert not preview.can(action, "*", **{"aws:RequestTag/gpucluster:stack": "prod"}), action


def test_the_workload_boundary_lets_eks_roles_work_and_keeps_the_cluster_policy_to_the_cluster_role(
        made: Any) -> None:
    boundary = managed_document(made[0].client("iam"), WORKLOAD)
    anything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}

    def can(action: str, resource: str = "*", **context: str) -> bool:
        return allowed([anything], boundary, action, resource, **context)

    # a node: join, pod credentials, the VPC CNI, ECR reads
    for action in ("eks:DescribeCluster", "eks-auth:AssumeRoleForPodIdentity", "ec2:AssignPrivateIpAddresses",
                   "ec2:CreateNetworkInterface", "ecr:DescribeImages"):
        assert can(action, **{"aws:PrincipalArn": NODE_ROLE}), action
    # the control plane's cloud provider: only the cluster role
    for action in ("elasticloadbalancing:CreateLoadBalancer", "ec2:CreateSecurityGroup", "ec2:AttachVolume",
                   "kms:CreateGrant"):
        assert can(action, **{"aws:PrincipalArn": EKS_CLUSTER_ROLE}), action
        assert not can(action, **{"aws:PrincipalArn": NODE_ROLE}), action
        assert not can(action), action
    assert can("iam:CreateServiceLinkedRole", **{"aws:PrincipalArn": EKS_CLUSTER_ROLE,
                                                 "iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"})
    assert not can("iam:CreateServiceLinkedRole", **{"aws:PrincipalArn": EKS_CLUSTER_ROLE,
                                                     "iam:AWSServiceName": "eks.amazonaws.com"})
    assert not can("iam:CreateRole", **{"aws:PrincipalArn": EKS_CLUSTER_ROLE})
    # the autoscaler's and termination handler's writes: a stack's tagged groups, the stacks' queues
    group = f"arn:aws:autoscaling:us-east-1:{ACCOUNT}:autoScalingGroup:1:autoScalingGroupName/gpu-prod-x"
    assert can("autoscaling:SetDesiredCapacity", group, **TAGGED)
    assert not can("autoscaling:SetDesiredCapacity", group)
    assert not can("autoscaling:TerminateInstanceInAutoScalingGroup", group)
    assert can("sqs:ReceiveMessage", f"arn:aws:sqs:us-east-1:{ACCOUNT}:gpu-prod-software-nth-1a2b3c4")
    assert not can("sqs:ReceiveMessage", f"arn:aws:sqs:us-east-1:{ACCOUNT}:orders")
    assert not can("sqs:SendMessage", f"arn:aws:sqs:us-east-1:{ACCOUNT}:gpu-prod-software-nth-1a2b3c4")


def test_every_eks_resource_the_program_makes_carries_the_stack_tag(plans: list[Any]) -> None:
    """StackEksTagged acts only on EKS resources with the stack tag, CreateCluster only with it in the
    request: every cluster, add-on, access entry, node group and association planned carries it."""
    seen = set()
    for plan in plans:
        for r in plan.resources:
            if r.type.startswith("aws:eks/"):
                seen.add(r.type)
                assert r.inputs["tags"][bootstrap_state.STACK_TAG] == plan.spec.identity, r.name
    assert seen == {t for t in bootstrap_state.DEPLOY_ACTIONS if t.startswith("aws:eks/")}
