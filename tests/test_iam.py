"""Node identity: SSM and CloudWatch agent policies, S3 scoped to the stack's buckets and prefixes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from base_config import base, plan_config
from gpucluster.aws.iam import s3_policy_document
from gpucluster.plan import Plan
from shipped import shipped_plan

POLICY = "aws:iam/rolePolicy:RolePolicy"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"


def statements(plan: Plan) -> list[dict[str, Any]]:
    """The node role's S3 statements (the guardrail Lambdas have role policies of their own)."""
    [policy] = [r for r in plan.of_type(POLICY) if r.name.endswith("-node-identity-s3")]
    return json.loads(policy.inputs["policy"])["Statement"]


def resources_of(statement: dict[str, Any]) -> list[str]:
    value = statement["Resource"]
    return value if isinstance(value, list) else [value]


def test_prod_nodes_get_exactly_the_stacks_buckets_and_prefixes() -> None:
    plan = shipped_plan("prod")
    corpus = plan.outputs["datasets"]["pretrain-corpus"]["bucket_name"]
    assert corpus.startswith("gpu-prod-pretrain-corpus-")  # created: Pulumi adds a unique suffix
    found = statements(plan)
    assert found == [
        {"Sid": "List0", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{corpus}",
         "Condition": {"StringLike": {"s3:prefix": ["corpus/v3/*"]}}},
        {"Sid": "Read0", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": f"arn:aws:s3:::{corpus}/corpus/v3/*"},
        {"Sid": "List1", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{corpus}",
         "Condition": {"StringLike": {"s3:prefix": ["checkpoints/*"]}}},
        {"Sid": "Write1", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
         "Resource": f"arn:aws:s3:::{corpus}/checkpoints/*"},
        {"Sid": "List2", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": "arn:aws:s3:::acme-ml-eval-sets",
         "Condition": {"StringLike": {"s3:prefix": ["eval/*"]}}},
        {"Sid": "Read2", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": "arn:aws:s3:::acme-ml-eval-sets/eval/*"},
    ]


def test_write_only_under_the_checkpoint_prefix() -> None:
    config = base()
    config["gpucluster:datasets"] = [{"name": "corpus", "bucket_name": "team-corpus", "existing": True,
                                      "prefix": "data/", "checkpoint_prefix": "ckpt/"}]
    found = statements(plan_config(config))
    writes = [s for s in found if "s3:PutObject" in s["Action"]]
    assert writes == [{"Sid": "Write1", "Effect": "Allow",
                       "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload",
                                  "s3:ListMultipartUploadParts"],
                       "Resource": "arn:aws:s3:::team-corpus/ckpt/*"}]
    for statement in found:
        for resource in resources_of(statement):
            assert resource.startswith("arn:aws:s3:::team-corpus"), resource
            assert resource != "*"
        assert not any("Delete" in action for action in statement["Action"])


def test_managed_policies_and_instance_profile() -> None:
    plan = shipped_plan("dev")
    node = [r for r in plan.resources if "-node-identity" in r.name]
    arns = sorted(r.inputs["policyArn"] for r in node if r.type == ATTACHMENT)
    assert arns == ["arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
                    "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"]
    bucket = plan.outputs["datasets"]["dev-data"]["bucket_name"]
    assert {r for s in statements(plan) for r in resources_of(s)} == {
        f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/datasets/*", f"arn:aws:s3:::{bucket}/checkpoints/*"}
    [role] = [r for r in node if r.type == "aws:iam/role:Role"]
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust == [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                      "Action": "sts:AssumeRole"}]
    [profile] = plan.of_type("aws:iam/instanceProfile:InstanceProfile")
    [lt] = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert lt.inputs["iamInstanceProfile"]["arn"].endswith(profile.name)


def test_policy_document_is_pure_and_refuses_wildcards() -> None:
    doc = s3_policy_document([("b", "", False)], partition="aws-cn")
    assert doc["Statement"][0] == {"Sid": "List0", "Effect": "Allow", "Action": "s3:ListBucket",
                                   "Resource": "arn:aws-cn:s3:::b"}  # whole bucket: no prefix condition
    assert doc["Statement"][1]["Resource"] == "arn:aws-cn:s3:::b/*"
    with pytest.raises(ValueError, match="concrete bucket"):
        s3_policy_document([("*", "", False)])
