"""The operator's IAM policy: its guide shows it, and it allows every call the day-two commands make."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from moto import mock_aws
from typer.testing import CliRunner

from gpucluster.cli import app
from gpucluster.ops.permissions import EKS_ACTIONS, VERIFY_ACTIONS, allowed_actions, operator_policy
from gpucluster.plan import load_stack
from moto_groups import create_stack_groups, tag_node_group

GUIDE = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "run-a-job.md").read_text()
runner = CliRunner()
# Services whose IAM action prefix is not their endpoint's (Service Authorization Reference).
IAM_PREFIX = {"monitoring": "cloudwatch"}


def test_the_run_a_job_guide_shows_the_operator_policy() -> None:
    section = GUIDE.split("# Run a job", 1)[1]
    block = section.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(block) == operator_policy("STACK_IDENTITY")
    assert block == json.dumps(operator_policy("STACK_IDENTITY"), indent=2)


def test_writes_are_scoped_to_the_stack() -> None:
    policy = operator_policy("acme/prod", "us-east-1", "123456789012")
    for statement in policy["Statement"]:
        writes = {a for a in statement["Action"] if a in (
            "ssm:SendCommand", "autoscaling:UpdateAutoScalingGroup", "autoscaling:CreateOrUpdateTags",
            "autoscaling:DeleteTags", "ssm:PutParameter", "ssm:DeleteParameter", "dynamodb:PutItem")}
        if writes and statement["Sid"] != "RunShellDocument":
            # by a tag condition, or by a resource under the stack's own path (its job records)
            scope = json.dumps(statement.get("Condition", {})) + json.dumps(statement["Resource"])
            assert "acme/prod" in scope, statement["Sid"]
    assert "*" not in allowed_actions(policy) and not any(a.endswith("*") for a in allowed_actions(policy))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every AWS operation a boto3 client makes, as an IAM action; moto's missing DescribeInstanceInformation
    (every node Online) and ListCostAllocationTags (the stack tag active) are answered here."""
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    made: list[str] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> Any:
        service = model.service_model.endpoint_prefix
        made.append(f"{IAM_PREFIX.get(service, service)}:{model.name}")
        if model.name == "ListCostAllocationTags":  # moto lacks it too: the tag is active
            return (AWSResponse("https://ce", 200, {}, None),
                    {"CostAllocationTags": [{"TagKey": "gpucluster:stack", "Type": "UserDefined",
                                             "Status": "Active"}]})
        if model.name == "DescribeInstanceInformation":
            ids = json.loads(params["body"])["Filters"][0]["Values"]  # the serialised request
            return (AWSResponse("https://ssm", 200, {}, None),
                    {"InstanceInformationList": [{"InstanceId": i, "PingStatus": "Online"} for i in ids]})
        return None

    with mock_aws():
        boto3.setup_default_session()
        boto3.DEFAULT_SESSION.events.register("before-call", record)  # type: ignore[union-attr]
        boto3.client("ec2").create_launch_template(LaunchTemplateName="a10-nodes", LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
        autoscaling = boto3.client("autoscaling")
        dev = load_stack("dev")[2].identity
        create_stack_groups(autoscaling, {"dev-a10": (dev, 0, 2, 3)}, launch_template="a10-nodes")
        tag_node_group(autoscaling, "dev-a10", "dev-a10")
        made.clear()
        yield made
    boto3.DEFAULT_SESSION = None


IMAGE_BUILD_ACTIONS = {"imagebuilder:ListImagePipelines", "imagebuilder:StartImagePipelineExecution",
                       "imagebuilder:GetImage", "ec2:DescribeImages"}


def test_every_call_the_commands_make_is_allowed(calls: list[str]) -> None:
    for args in (["nodes", "dev"], ["hostfile", "dev", "-g", "dev-a10"],
                 ["run", "dev", "-g", "dev-a10", "--", "true"],
                 ["run", "dev", "-g", "dev-a10", "--detach", "--name", "t", "--restart-on-replace", "--",
                  "true"],
                 ["cancel", "dev", "t", "--yes"],
                 ["scale", "dev", "-g", "dev-a10", "--desired", "3", "--yes"],
                 ["stop", "dev", "--yes"], ["status", "dev"], ["start", "dev", "--yes"],
                 ["stop", "dev", "--yes"], ["resume", "dev", "--yes"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
    allowed = allowed_actions(operator_policy("dev"))
    assert set(calls) <= allowed, set(calls) - allowed
    # and nothing in the policy is there for no reason
    # (the guard-state items and key are used only when the stack has its table: here it has none;
    # image build: Image Builder is not in moto; tests/test_image_build.py checks its calls are allowed;
    # DescribeSpotPriceHistory: status prices spot nodes at the spot price; these nodes are on-demand;
    # DescribeCapacityReservations: status reads a Capacity Block's fee; this stack buys none;
    # verify: tests/test_verify.py checks every call it makes is allowed;
    # EKS: this stack is not one; tests/test_eks_checks.py checks what finding its cluster calls)
    assert allowed - set(calls) <= {"ssm:CancelCommand", "logs:GetLogEvents", "logs:FilterLogEvents",
                                    "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "kms:Decrypt",
                                    "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey",
                                    "ec2:DescribeSpotPriceHistory", "ec2:DescribeCapacityReservations",
                                    *IMAGE_BUILD_ACTIONS, *VERIFY_ACTIONS, *EKS_ACTIONS}
