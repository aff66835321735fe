"""Node identity: SSM, GPU metrics of its own cluster only, S3 scoped to the stack's buckets, prefixes and
their owners, the permissions boundary, and an inline size that always fits IAM's limit."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import boto3
import pytest
from moto import mock_aws

from base_config import base, plan_config
from gpucluster.names import autoname
from gpucluster.noderole import (
    ROLE_INLINE_POLICIES_MAX_CHARS,
    agent_policy_document,
    inline_policies_chars,
    node_inline_policies_chars,
    s3_policy_document,
)
from gpucluster.parts import S3Grant
from gpucluster.plan import Plan
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError, generated_bucket_prefix
from iam_eval import allowed
from shipped import planned_config, shipped_plan

POLICY = "aws:iam/rolePolicy:RolePolicy"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
ROLE = "aws:iam/role:Role"
ACCOUNT = "123456789012"  # the mock engine's caller account
BOUNDARY = f"arn:aws:iam::{ACCOUNT}:policy/gpucluster-workload-boundary"


# Each node group runs as a node identity of its own; the first keeps the stack's former shared name.
PROD_IDENTITIES = {"h100-train": "gpu-prod-node-identity", "eval": "gpu-prod-eval-node"}


def node_policy(plan: Plan, part: str, identity: str | None = None) -> dict[str, Any]:
    """An inline policy of one node identity (default: the first group's)."""
    name = identity or f"{plan.spec.cluster.name}-node-identity"
    [policy] = [r for r in plan.of_type(POLICY) if r.name == f"{name}-{part}"]
    return json.loads(policy.inputs["policy"])


def statements(plan: Plan, identity: str | None = None) -> list[dict[str, Any]]:
    """A node role's S3 statements (the guardrail Lambdas have role policies of their own)."""
    return node_policy(plan, "s3", identity)["Statement"]


def user_data(plan: Plan) -> str:
    """The (first) launch template's user data script."""
    lt = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")[0]
    return gzip.decompress(base64.b64decode(lt.inputs["userData"])).decode()


def resources_of(statement: dict[str, Any]) -> list[str]:
    value = statement["Resource"]
    return value if isinstance(value, list) else [value]


def owned(account: str = ACCOUNT, **more: Any) -> dict[str, Any]:
    return {"StringEquals": {"s3:ResourceAccount": account}, **more}


@pytest.fixture(scope="module")
def prod() -> Plan:
    return shipped_plan("prod")


@pytest.fixture(scope="module")
def ssm_core() -> dict[str, Any]:
    """AmazonSSMManagedInstanceCore as AWS publishes it (moto's copy of the managed policies)."""
    with mock_aws(config={"iam": {"load_aws_managed_policies": True}}):
        iam = boto3.client("iam", region_name="us-east-1")
        arn = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
        version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
        document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
    return json.loads(document) if isinstance(document, str) else document


# ------------------------------------------------------------------------------- S3 (items 6, 11)


def test_prod_nodes_get_exactly_the_stacks_buckets_prefixes_and_owner(prod: Plan) -> None:
    corpus = prod.outputs["datasets"]["pretrain-corpus"]["bucket_name"]
    assert corpus.startswith("gpu-prod-pretrain-corpus-")  # created: Pulumi adds a unique suffix
    for identity in PROD_IDENTITIES.values():  # every group's nodes read the stack's datasets
        assert statements(prod, identity) == expected_prod_statements(corpus)


def expected_prod_statements(corpus: str) -> list[dict[str, Any]]:
    return [
        {"Sid": "List0", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{corpus}",
         "Condition": owned(StringLike={"s3:prefix": ["corpus/v3/*", "checkpoints/*"]})},
        {"Sid": "List1", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": "arn:aws:s3:::acme-ml-eval-sets",
         "Condition": owned(StringLike={"s3:prefix": ["eval/*"]})},
        {"Sid": "Read0", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"arn:aws:s3:::{corpus}/corpus/v3/*", f"arn:aws:s3:::{corpus}/checkpoints/*",
                      "arn:aws:s3:::acme-ml-eval-sets/eval/*"],
         "Condition": owned()},
        {"Sid": "Write0", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
         "Resource": [f"arn:aws:s3:::{corpus}/checkpoints/*"], "Condition": owned()},
    ]


def test_write_only_under_the_checkpoint_prefix_of_a_bucket_of_the_expected_owner() -> None:
    config = base()
    config["gpucluster:datasets"] = [{"name": "corpus", "bucket_name": "team-corpus", "existing": True,
                                      "prefix": "data/", "checkpoint_prefix": "ckpt/",
                                      "expected_bucket_owner": "210987654321"}]
    plan = plan_config(config)
    found = statements(plan)
    writes = [s for s in found if "s3:PutObject" in s["Action"]]
    assert writes == [{"Sid": "Write0", "Effect": "Allow",
                       "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload",
                                  "s3:ListMultipartUploadParts"],
                       "Resource": ["arn:aws:s3:::team-corpus/ckpt/*"], "Condition": owned("210987654321")}]
    for statement in found:
        assert statement["Condition"]["StringEquals"] == {"s3:ResourceAccount": "210987654321"}
        for resource in resources_of(statement):
            assert resource.startswith("arn:aws:s3:::team-corpus"), resource
        assert not any("Delete" in action for action in statement["Action"])
    # the node scripts name the same owner on every S3 call they make
    assert "\t210987654321\n" in user_data(plan)


@pytest.mark.parametrize("group", sorted(PROD_IDENTITIES))
def test_a_bucket_of_the_same_name_in_another_account_is_neither_read_nor_written(prod: Plan,
                                                                                    group: str) -> None:
    identity = [node_policy(prod, part, PROD_IDENTITIES[group]) for part in ("s3", "agent")]
    eval_sets = "arn:aws:s3:::acme-ml-eval-sets/eval/shard-0"
    assert allowed(identity, None, "s3:GetObject", eval_sets, **{"s3:ResourceAccount": ACCOUNT})
    assert not allowed(identity, None, "s3:GetObject", eval_sets, **{"s3:ResourceAccount": "999999999999"})
    assert not allowed(identity, None, "s3:ListBucket", "arn:aws:s3:::acme-ml-eval-sets",
                       **{"s3:ResourceAccount": "999999999999", "s3:prefix": "eval/"})
    assert not allowed(identity, None, "s3:GetObject", "arn:aws:s3:::acme-ml-eval-sets/private/x",
                       **{"s3:ResourceAccount": ACCOUNT})


def test_nodes_name_the_deploying_account_as_owner_of_every_bucket_they_read(prod: Plan) -> None:
    script = user_data(prod)
    table = script.split("cat > /etc/gpucluster/data-mounts.tsv <<'GPUCLUSTER_FILE_EOF'\n", 1)[1]
    rows = [line.split("\t") for line in table.split("GPUCLUSTER_FILE_EOF", 1)[0].splitlines()]
    assert [(r[1], r[-1]) for r in rows] == [("pretrain-corpus", ACCOUNT), ("eval-sets", ACCOUNT)]


def test_policy_document_is_pure_and_refuses_wildcards_and_unknown_owners() -> None:
    doc = s3_policy_document([("b", "", False, ACCOUNT)], partition="aws-cn")
    assert doc["Statement"][0] == {"Sid": "List0", "Effect": "Allow", "Action": "s3:ListBucket",
                                   "Resource": "arn:aws-cn:s3:::b",
                                   "Condition": owned()}  # whole bucket: no prefix condition
    assert doc["Statement"][1]["Resource"] == ["arn:aws-cn:s3:::b/*"]
    with pytest.raises(ValueError, match="concrete bucket"):
        s3_policy_document([("*", "", False, ACCOUNT)])
    with pytest.raises(ValueError, match="12-digit account"):
        s3_policy_document([("b", "", False, "")])


# ----------------------------------------------------------------------- agent, SSM (item 5)


def role_documents(plan: Plan, identity: str) -> list[dict[str, Any]]:
    """Every inline policy on a node identity's role (by its physical name or id, as components pass it)."""
    role = f"{identity}-role"
    return [json.loads(p.inputs["policy"]) for p in plan.of_type(POLICY)
            if p.inputs["role"] in (autoname(role), f"{role}-id")]


@pytest.mark.parametrize("group", sorted(PROD_IDENTITIES))
def test_nodes_attach_only_the_ssm_core_policy_and_a_scoped_agent_policy(prod: Plan, group: str) -> None:
    identity = PROD_IDENTITIES[group]
    node = [r for r in prod.resources if r.name.startswith(f"{identity}-")]
    assert sorted(r.inputs["policyArn"] for r in node if r.type == ATTACHMENT) == [
        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"]
    agent = node_policy(prod, "agent", identity)["Statement"]
    assert agent == [
        {"Sid": "PublishOwnNamespaceOnly", "Effect": "Allow", "Action": "cloudwatch:PutMetricData",
         "Resource": "*", "Condition": {"StringEquals": {"cloudwatch:namespace": "gpucluster/gpu-prod"}}},
        {"Sid": "AgentReadsInstanceTags", "Effect": "Allow", "Action": ["ec2:DescribeTags"], "Resource": "*"},
        {"Sid": "NoParameterReads", "Effect": "Deny",
         "Action": ["ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath",
                    "ssm:GetParameterHistory"], "Resource": "*"},
    ]
    # Exactly the agent, S3, jobs (run log group), node scripts and this group's health policies on the role.
    documents = role_documents(prod, identity)
    assert len(documents) == 5
    assert all(node_policy(prod, part, identity) in documents for part in ("agent", "s3", "jobs", "scripts"))
    # `*` only where the action has no resource type (PutMetricData: scoped by its condition;
    # DescribeTags, DescribeAutoScalingInstances), and in the deny
    for document in documents:
        for statement in document["Statement"]:
            if "*" in resources_of(statement) and statement["Effect"] == "Allow":
                sid = statement["Sid"]
                assert sid in ("PublishOwnNamespaceOnly", "AgentReadsInstanceTags", "FindOwnGroup",
                               "CountHealthEvents"), statement
                assert sid not in ("PublishOwnNamespaceOnly", "CountHealthEvents") or statement[
                    "Condition"] == {"StringEquals": {"cloudwatch:namespace": "gpucluster/gpu-prod"}}
    [role] = [r for r in node if r.type == ROLE]
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust == [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                      "Action": "sts:AssumeRole"}]
    # The group's launch template names this identity's profile, and no other group's does.
    [profile] = [r for r in node if r.type == "aws:iam/instanceProfile:InstanceProfile"]
    templates = {lt.name: lt.inputs["iamInstanceProfile"]["arn"]
                 for lt in prod.of_type("aws:ec2/launchTemplate:LaunchTemplate")}
    assert len(templates) == len(prod.spec.node_groups) == len(PROD_IDENTITIES) == 2
    assert [lt for lt, arn in templates.items() if arn.endswith(f":{profile.name}")] == [
        f"gpu-prod-{group}-lt"]


@pytest.mark.parametrize("group", sorted(PROD_IDENTITIES))
def test_a_node_cannot_fake_another_cluster_s_gpu_metric_or_touch_logs_or_parameters(
        prod: Plan, ssm_core: dict[str, Any], group: str) -> None:
    """The node role as AWS evaluates it: the SSM core policy plus every inline policy of its role."""
    identity = [ssm_core, *role_documents(prod, PROD_IDENTITIES[group])]

    def can(action: str, resource: str = "*", **context: str) -> bool:
        return allowed(identity, None, action, resource, **context)

    assert can("cloudwatch:PutMetricData", **{"cloudwatch:namespace": "gpucluster/gpu-prod"})
    for namespace in ("gpucluster/gpu-dev", "CWAgent", "AWS/EC2"):
        assert not can("cloudwatch:PutMetricData", **{"cloudwatch:namespace": namespace}), namespace
    for action in ("logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:PutLogEvents",
                   "logs:DeleteRetentionPolicy"):
        assert not can(action, f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/lambda/gpu-prod-autostop")
    parameter = f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter/"
    for name in ("db-password", "AmazonCloudWatch-linux"):
        assert not can("ssm:GetParameter", parameter + name)  # the SSM core policy alone would allow it
        assert allowed([ssm_core], None, "ssm:GetParameter", parameter + name)
    assert can("ssmmessages:OpenDataChannel") and can("ssm:UpdateInstanceInformation")  # SSM still works
    assert can("ec2:DescribeTags")


def test_metric_namespace_of_agent_role_and_alarm_is_one(prod: Plan) -> None:
    """The agent publishes where its role may and the idle alarms look: one contract, three places."""
    assert '"namespace":"gpucluster/gpu-prod"' in user_data(prod)  # the agent config, compact JSON
    # The guardrail functions' own alarms (AWS/Lambda Errors, Throttles...) watch no GPU metric.
    alarms = [a for a in prod.of_type("aws:cloudwatch/metricAlarm:MetricAlarm")
              if a.inputs["namespace"] != "AWS/Lambda"]
    assert alarms and {a.inputs["namespace"] for a in alarms} == {"gpucluster/gpu-prod"}
    for identity in PROD_IDENTITIES.values():
        assert agent_policy_document("gpucluster/gpu-prod") == node_policy(prod, "agent", identity)


# --------------------------------------------------------------------------------- boundary


def test_without_a_boundary_key_no_role_carries_one() -> None:
    plan = planned_config(base())
    assert plan.of_type(ROLE) and all("permissionsBoundary" not in r.inputs for r in plan.of_type(ROLE))


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_role_a_shipped_stack_creates_carries_the_workload_boundary(stack: str) -> None:
    """The shipped stacks deploy through infra/bootstrap-state's roles, which refuse any role
    without `gpucluster-workload-boundary` (its `iam:PermissionsBoundary` condition)."""
    roles = shipped_plan(stack).of_type(ROLE)
    names = {r.name.rsplit("-", 2)[-2] for r in roles}
    assert {"identity", "handler"} <= names  # the node role and the guardrail Lambdas' at least
    for role in roles:
        assert role.inputs.get("permissionsBoundary") == BOUNDARY, role.name


def test_scheduler_role_carries_the_boundary_too() -> None:
    config = base()
    config["gpucluster:cluster"]["permissions_boundary"] = "team-boundary"
    config["gpucluster:autostop"] = {"idle_minutes": 30, "stop_schedule": "cron(0 19 ? * * *)"}
    roles = plan_config(config).of_type(ROLE)
    assert any("scheduler" in r.name for r in roles)
    assert {r.inputs.get("permissionsBoundary") for r in roles} == {
        f"arn:aws:iam::{ACCOUNT}:policy/team-boundary"}


@pytest.mark.parametrize("value", ["arn:aws:iam::1:policy/x", "a b", "x" * 129, ""])
def test_a_bad_boundary_name_is_one_line_naming_the_key(value: str) -> None:
    config = base()
    config["gpucluster:cluster"]["permissions_boundary"] = value
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    [line] = str(err.value).splitlines()
    assert line.startswith("cluster.permissions_boundary: must be an IAM policy name"), line


# ------------------------------------------------------------------------------ size (item 11)


def datasets_config(count: int, prefix_chars: int = 20) -> dict[str, Any]:
    """`count` datasets at their longest: 63-character bucket names, a data and a checkpoint prefix."""
    config = base()
    config["gpucluster:datasets"] = [
        {"name": f"d{i}", "bucket_name": f"{i:x>63}".replace("x", "b"), "existing": True,
         "prefix": "p" * (prefix_chars - 1) + "/", "checkpoint_prefix": "c" * (prefix_chars - 1) + "/",
         "access": "copy_to_scratch", "expected_bucket_owner": f"{i + 100000000000}"}
        for i in range(count)]
    return config


def largest_accepted(prefix_chars: int) -> int:
    count = 0
    while True:
        try:
            parse_stack_config(datasets_config(count + 1, prefix_chars), stack="t")
        except SpecError:
            return count
        count += 1


def node_inline_chars(plan: Plan) -> int:
    """Every inline policy on the (first) group's node role: agent, S3, jobs, node scripts and the
    group's health policy."""
    documents = role_documents(plan, f"{plan.spec.cluster.name}-node-identity")
    assert len(documents) == 5
    return inline_policies_chars(documents)


def test_the_most_datasets_the_spec_accepts_fit_the_node_role() -> None:
    """Worst case: each dataset a bucket of its own owner, with the longest names; the spec's
    bound is the real document's size (give or take the longest partition), not a guess."""
    most = largest_accepted(prefix_chars=20)
    assert most >= 5
    plan = plan_config(datasets_config(most))
    assert node_inline_chars(plan) <= ROLE_INLINE_POLICIES_MAX_CHARS
    # Tight: one more dataset (about 1000 characters) would not fit; the spec counts every ARN at its
    # longest (partition, the group's and the key's UUID ARNs), a few hundred more than the mock's.
    # (1,278 left with the node scripts read on the role: less than a dataset at its longest)
    assert node_inline_chars(plan) > ROLE_INLINE_POLICIES_MAX_CHARS - 1300
    with pytest.raises(SpecError) as err:
        parse_stack_config(datasets_config(most + 1), stack="t")
    [line] = str(err.value).splitlines()
    assert line.startswith("datasets: ") and f"IAM allows {ROLE_INLINE_POLICIES_MAX_CHARS}" in line


def test_datasets_with_the_longest_prefixes_are_sized_and_refused_when_they_do_not_fit() -> None:
    """Prefixes at their 512-character cap: fewer datasets fit, the plan of the most accepted fits,
    and one more is refused by the size check (not by a per-key rule)."""
    most = largest_accepted(prefix_chars=512)
    assert 1 <= most < largest_accepted(prefix_chars=20)
    assert node_inline_chars(plan_config(datasets_config(most, prefix_chars=512))) \
        <= ROLE_INLINE_POLICIES_MAX_CHARS
    with pytest.raises(SpecError, match=rf"^datasets: the node role's policies for {most + 1} dataset\(s\)"):
        parse_stack_config(datasets_config(most + 1, prefix_chars=512), stack="t")


def test_unnamed_buckets_are_sized_at_the_longest_name_pulumi_can_generate() -> None:
    """A created bucket without bucket_name is `<prefix>` plus 26 characters (the mock engine's and
    the provider's unique suffix): never longer than the 63 the spec counts."""
    cluster, names = "abcdefghijklmnopqrstuvwx", [f"dataset-{i:02d}-abcdefghijklmn" for i in range(8)]
    generated = [generated_bucket_prefix(cluster, n) + "4" * 26 for n in names]
    assert all(len(g) <= 63 for g in generated)
    real = [S3Grant(g, "data/", False) for g in generated] + [S3Grant(g, "ckpt/", True) for g in generated]
    resolved = [(g.bucket_name, g.prefix, g.write, ACCOUNT) for g in real]
    actual = inline_policies_chars([agent_policy_document(f"gpucluster/{cluster}"),
                                    s3_policy_document(resolved)])
    unknown = [object() for _ in names]  # Outputs: names known only at deploy time
    counted = node_inline_policies_chars(cluster, [S3Grant(u, "data/", False) for u in unknown]
                                         + [S3Grant(u, "ckpt/", True) for u in unknown])
    assert actual <= counted


def test_node_identity_args_are_sized_too() -> None:
    """A NodeIdentity built outside a stack file is held to the same limit (ArgsError, not a failed up)."""
    from gpucluster.aws.args import ArgsError, NodeIdentityModel, identity_checks, validate
    grants = [{"bucket_name": f"{i:x>63}", "prefix": "p" * 200 + "/", "write": False} for i in range(30)]
    with pytest.raises(ArgsError, match=r"s3_grants: the node role's policies for 30 grant\(s\)"):
        validate("NodeIdentity", "n", NodeIdentityModel, {"cluster_name": "cl", "s3_grants": grants},
                 identity_checks)
