"""The run log group the stack declares, and what the node role may do with it and with ECR images.

Rendered policy documents from the mock engine, evaluated as AWS would (tests/iam_eval.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from base_config import base, plan_config
from gpucluster.noderole import (
    ECR_PULL_ACTIONS,
    ROLE_INLINE_POLICIES_MAX_CHARS,
    EcrRepository,
    ecr_repository,
    jobs_policy_document,
    node_inline_policies_chars,
    run_log_group_name,
)
from gpucluster.plan import Plan
from iam_eval import allowed
from shipped import shipped_plan

ACCOUNT = "123456789012"  # the mock engine's caller account
POLICY = "aws:iam/rolePolicy:RolePolicy"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
IMAGE = f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/team/trainer:v3"


@pytest.fixture(scope="module")
def prod() -> Plan:
    return shipped_plan("prod")


@pytest.fixture(scope="module")
def ecr_plan() -> Plan:
    config = base()
    config["gpucluster:node_groups"][0]["container_image"] = IMAGE
    return plan_config(config)


def jobs_policy(plan: Plan) -> dict[str, Any]:
    [policy] = [r for r in plan.of_type(POLICY) if r.name.endswith("-node-identity-jobs")]
    return json.loads(policy.inputs["policy"])


def node_documents(plan: Plan) -> list[dict[str, Any]]:
    return [json.loads(r.inputs["policy"]) for r in plan.of_type(POLICY) if "-node-identity-" in r.name]


# ------------------------------------------------------------------------- the run log group


def test_the_stack_declares_its_run_log_group_with_retention_and_identity_tags(prod: Plan) -> None:
    identity = prod.spec.identity
    # (the VPC flow-log group is the network's: KMS-encrypted, kept 90 days, tested in test_network.py)
    groups = {r.inputs["name"]: r for r in prod.of_type(LOG_GROUP) if "vpc-flow-logs" not in r.inputs["name"]}
    name = run_log_group_name(identity)
    assert name == f"/gpucluster/{identity}/run"
    group = groups[name]
    assert group.inputs["retentionInDays"] == 30  # as the guardrail Lambdas' log groups
    assert {g.inputs["retentionInDays"] for g in groups.values()} == {30}
    assert "kmsKeyId" not in group.inputs and not any("kmsKeyId" in g.inputs for g in groups.values())
    assert group.inputs["tags"]["gpucluster:stack"] == identity


def test_nodes_write_job_output_to_the_run_log_group_only(prod: Plan) -> None:
    name = run_log_group_name(prod.spec.identity)
    arn = f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:{name}"
    documents = node_documents(prod)

    def can(action: str, resource: str) -> bool:
        return allowed(documents, None, action, resource)

    for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
        assert can(action, f"{arn}:log-stream:i-0abc__var_log_gpucluster_jobs_train.log")
        assert can(action, f"{arn}:log-stream:0123/i-0abc/aws-runShellScript/stdout")  # SSM's streams
        for other in (f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/aws/lambda/gpu-prod-autostop",
                      f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:/gpucluster/other/run",
                      f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:{name}-x"):
            assert not can(action, f"{other}:log-stream:s"), (action, other)
    assert can("logs:DescribeLogStreams", arn)
    assert can("logs:DescribeLogGroups", f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:*")
    for action in ("logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:DeleteLogGroup",
                   "logs:GetLogEvents", "logs:FilterLogEvents"):
        assert not can(action, arn), action


def test_no_ecr_grant_without_an_ecr_image(prod: Plan) -> None:
    """prod pulls nvcr.io/nvidia/pytorch: no ECR statement at all, not even the token."""
    actions = {a for s in jobs_policy(prod)["Statement"] for a in s["Action"]}
    assert not any(a.startswith("ecr:") for a in actions)


# ------------------------------------------------------------------------------------ ECR pulls


@pytest.mark.parametrize(("image", "repository"), [
    (IMAGE, EcrRepository(ACCOUNT, "us-east-1", "team/trainer", "aws")),
    (f"{ACCOUNT}.dkr.ecr.eu-west-1.amazonaws.com/llm@sha256:{'a' * 64}",
     EcrRepository(ACCOUNT, "eu-west-1", "llm", "aws")),
    (f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/ns/img:1.2@sha256:{'b' * 64}",
     EcrRepository(ACCOUNT, "us-east-1", "ns/img", "aws")),
    (f"{ACCOUNT}.dkr.ecr-fips.us-gov-west-1.amazonaws.com/x", EcrRepository(ACCOUNT, "us-gov-west-1", "x",
                                                                             "aws-us-gov")),
    (f"{ACCOUNT}.dkr.ecr.cn-north-1.amazonaws.com.cn/x:latest",
     EcrRepository(ACCOUNT, "cn-north-1", "x", "aws-cn")),
    ("nvcr.io/nvidia/pytorch:24.12-py3", None),
    ("public.ecr.aws/nginx/nginx:1.27", None),  # ECR Public: no login, no private repository
    ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", None),
    (f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com.evil.io/x", None),
])
def test_ecr_repository_of_an_image(image: str, repository: EcrRepository | None) -> None:
    assert ecr_repository(image) == repository


def test_an_ecr_image_lets_nodes_pull_from_its_repository_only(ecr_plan: Plan) -> None:
    document = jobs_policy(ecr_plan)
    repo = f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/team/trainer"
    by_sid = {s["Sid"]: s for s in document["Statement"]}
    assert by_sid["EcrLogin"] == {"Sid": "EcrLogin", "Effect": "Allow",
                                  "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"}
    assert by_sid["PullOwnImages"]["Resource"] == [repo]
    assert sorted(by_sid["PullOwnImages"]["Action"]) == sorted(ECR_PULL_ACTIONS) == [
        "ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    documents = node_documents(ecr_plan)
    for action in ECR_PULL_ACTIONS:
        assert allowed(documents, None, action, repo)
        for other in (f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/team/other",
                      "arn:aws:ecr:us-east-1:999999999999:repository/team/trainer"):
            assert not allowed(documents, None, action, other)
    for action in ("ecr:PutImage", "ecr:InitiateLayerUpload", "ecr:BatchDeleteImage", "ecr:DeleteRepository"):
        assert not allowed(documents, None, action, repo), action


def test_jobs_policy_document_of_several_images_lists_each_repository_once() -> None:
    images = [IMAGE, IMAGE.replace(":v3", ":v4"), "nvcr.io/nvidia/pytorch:24.12-py3",
              f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/eval:1"]
    document = jobs_policy_document(None, images)
    assert document is not None
    [pull] = [s for s in document["Statement"] if s["Sid"] == "PullOwnImages"]
    assert pull["Resource"] == [f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/team/trainer",
                                f"arn:aws:ecr:us-west-2:{ACCOUNT}:repository/eval"]
    assert jobs_policy_document(None, ["nvcr.io/nvidia/pytorch:24.12-py3"]) is None


def test_the_spec_sizes_the_jobs_policy_too() -> None:
    """node_inline_policies_chars counts the jobs policy the role will carry, at its longest."""
    without = node_inline_policies_chars("c", [])
    with_logs = node_inline_policies_chars("c", [], run_log_group="/gpucluster/o/p/s/c/run")
    with_images = node_inline_policies_chars("c", [], run_log_group="/gpucluster/o/p/s/c/run",
                                             images=[IMAGE, f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/e:1"])
    assert without < with_logs < with_images < ROLE_INLINE_POLICIES_MAX_CHARS
