"""`gpucluster image build`: the stack's pipelines found by name, started once per request, followed to
the AMI and the driver/CUDA the image test recorded. Image Builder is not in moto: botocore Stubber."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import ANY, Stubber
from typer.testing import CliRunner

from gpucluster.cli import app, common
from gpucluster.node.bake import recipe_name
from gpucluster.ops.images import ImageBuild, ImageBuildError, start_builds, wait_builds
from gpucluster.preflight import parse_stack_config

REPO = Path(__file__).parent.parent
runner = CliRunner()
PIPELINE = "arn:aws:imagebuilder:us-east-1:123456789012:image-pipeline/p"
BUILD = "arn:aws:imagebuilder:us-east-1:123456789012:image/r/1.0.0/1"
AMI = "ami-0fedcba9876543210"


def config() -> dict[str, Any]:
    cfg = yaml.safe_load((REPO / "stacks/Pulumi.prod.yaml").read_text())["config"]
    cfg["gpucluster:images"] = {"bake": True, "groups": {"eval": {"bake": False}}}
    return cfg


@pytest.fixture
def spec() -> Any:
    return parse_stack_config(config(), stack="prod")


def stubbed(service: str) -> tuple[Any, Stubber]:
    client = boto3.client(service, region_name="us-east-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    return client, Stubber(client)


def expect_pipeline(stub: Stubber, name: str, found: bool = True) -> None:
    stub.add_response("list_image_pipelines",
                      {"imagePipelineList": [{"arn": PIPELINE, "name": name}] if found else []},
                      {"filters": [{"name": "name", "values": [name]}]})


def test_start_finds_the_stacks_own_pipeline_and_starts_it_once(spec: Any) -> None:
    ib, stub = stubbed("imagebuilder")
    name = recipe_name("gpu-prod", spec.identity, "h100-train")
    expect_pipeline(stub, name)
    stub.add_response("start_image_pipeline_execution", {"imageBuildVersionArn": BUILD},
                      {"imagePipelineArn": PIPELINE, "clientToken": "tok-h100-train"})
    with stub:
        [build] = start_builds(spec, ib, token="tok")
    stub.assert_no_pending_responses()
    assert build == ImageBuild("h100-train", PIPELINE, BUILD)


def test_another_stacks_pipeline_is_never_started(spec: Any) -> None:
    ib, stub = stubbed("imagebuilder")
    name = recipe_name("gpu-prod", spec.identity, "h100-train")
    # A pipeline of the same cluster name in another stack carries another identity hash.
    assert name != recipe_name("gpu-prod", spec.identity + "x", "h100-train")
    expect_pipeline(stub, name, found=False)
    with stub, pytest.raises(ImageBuildError, match="no image pipeline for node group 'h100-train'"):
        start_builds(spec, ib)
    stub.assert_no_pending_responses()  # nothing started


def test_a_throttled_start_is_not_a_second_build(spec: Any) -> None:
    ib, stub = stubbed("imagebuilder")
    expect_pipeline(stub, recipe_name("gpu-prod", spec.identity, "h100-train"))
    stub.add_client_error("start_image_pipeline_execution", "ThrottlingException", http_status_code=400)
    with stub, pytest.raises(Exception, match="ThrottlingException"):
        start_builds(spec, ib, token="tok")
    # The retry sends the same client token: Image Builder starts no second build for it.
    expect_pipeline(stub, recipe_name("gpu-prod", spec.identity, "h100-train"))
    stub.add_response("start_image_pipeline_execution", {"imageBuildVersionArn": BUILD},
                      {"imagePipelineArn": PIPELINE, "clientToken": "tok-h100-train"})
    with stub:
        start_builds(spec, ib, token="tok")


def test_wait_follows_to_the_ami_and_the_recorded_driver() -> None:
    ib, ib_stub = stubbed("imagebuilder")
    ec2, ec2_stub = stubbed("ec2")
    ib_stub.add_response("get_image", {"image": {"state": {"status": "BUILDING"}}},
                         {"imageBuildVersionArn": BUILD})
    ib_stub.add_response("get_image", {"image": {"state": {"status": "AVAILABLE"}, "outputResources": {
        "amis": [{"region": "us-east-1", "image": AMI}]}}}, {"imageBuildVersionArn": BUILD})
    ec2_stub.add_response("describe_images", {"Images": [{"ImageId": AMI, "Tags": [
        {"Key": "gpucluster:gpus", "Value": "1"}, {"Key": "gpucluster:driver", "Value": "550.127.05"},
        {"Key": "gpucluster:cuda", "Value": "12.4"}]}]}, {"ImageIds": [AMI]})
    slept: list[float] = []
    with ib_stub, ec2_stub:
        [done] = wait_builds([ImageBuild("h100-train", PIPELINE, BUILD)], ib, ec2, "us-east-1",
                             sleep=slept.append, clock=lambda: 0.0)
    assert slept == [60.0]
    assert done.status == "AVAILABLE" and done.ami_id == AMI
    assert done.pin() == {"ami_id": AMI, "driver": "550.127.05", "cuda": "12.4"}


def test_a_failed_build_says_why() -> None:
    ib, stub = stubbed("imagebuilder")
    failed = {"image": {"state": {"status": "FAILED", "reason": "CheckBaked: missing: dcgm"}}}
    stub.add_response("get_image", failed, {"imageBuildVersionArn": BUILD})
    with stub:
        [done] = wait_builds([ImageBuild("h100-train", PIPELINE, BUILD)], ib, None, "us-east-1",
                             sleep=lambda _: None, clock=lambda: 0.0)
    assert (done.status, done.reason, done.pin()) == ("FAILED", "CheckBaked: missing: dcgm", None)


def test_the_command_asks_prints_the_pin_and_the_json(write_stack: Callable[..., Path],
                                                      monkeypatch: pytest.MonkeyPatch, spec: Any) -> None:
    path = write_stack(config(), "prod")
    ib, ib_stub = stubbed("imagebuilder")
    ec2, ec2_stub = stubbed("ec2")
    monkeypatch.setattr(common, "client", lambda _spec, service: {"imagebuilder": ib, "ec2": ec2}[service])
    declined = runner.invoke(app, ["image", "build", str(path)], input="n\n")
    assert declined.exit_code == 1
    assert "build 1 image(s) (h100-train) on g6.xlarge: about $1.21" in declined.output
    identity = parse_stack_config(config(), stack="prod").identity
    expect_pipeline(ib_stub, recipe_name("gpu-prod", identity, "h100-train"))
    ib_stub.add_response("start_image_pipeline_execution", {"imageBuildVersionArn": BUILD},
                         {"imagePipelineArn": PIPELINE, "clientToken": ANY})
    ib_stub.add_response("get_image", {"image": {"state": {"status": "AVAILABLE"}, "outputResources": {
        "amis": [{"region": "us-east-1", "image": AMI}]}}}, {"imageBuildVersionArn": BUILD})
    ec2_stub.add_response("describe_images", {"Images": [{"ImageId": AMI, "Tags": [
        {"Key": "gpucluster:driver", "Value": "550.127.05"}, {"Key": "gpucluster:cuda", "Value": "12.4"}]}]},
        {"ImageIds": [AMI]})
    with ib_stub, ec2_stub:
        done = runner.invoke(app, ["image", "build", str(path), "--wait", "--yes"])
    assert done.exit_code == 0, done.output
    assert "ami_id: ami-0fedcba9876543210" in done.output and "driver: 550.127.05" in done.output
    unbaked = runner.invoke(app, ["image", "build", str(path), "--group", "eval", "--yes"])
    assert unbaked.exit_code == 2 and "node group 'eval' is not baked" in unbaked.output
    assert len(unbaked.output.strip().splitlines()) == 1


def test_the_operator_policy_allows_exactly_what_the_command_calls(spec: Any) -> None:
    from gpucluster.ops.permissions import allowed_actions, operator_policy

    made: list[str] = []

    def record(service: str) -> Callable[..., None]:
        prefix = {"imagebuilder": "imagebuilder", "ec2": "ec2"}[service]
        return lambda model, **_: made.append(f"{prefix}:{model.name}")

    ib, ib_stub = stubbed("imagebuilder")
    ec2, ec2_stub = stubbed("ec2")
    ib.meta.events.register("before-parameter-build", record("imagebuilder"))
    ec2.meta.events.register("before-parameter-build", record("ec2"))
    expect_pipeline(ib_stub, recipe_name("gpu-prod", spec.identity, "h100-train"))
    ib_stub.add_response("start_image_pipeline_execution", {"imageBuildVersionArn": BUILD},
                         {"imagePipelineArn": PIPELINE, "clientToken": ANY})
    ib_stub.add_response("get_image", {"image": {"state": {"status": "AVAILABLE"}, "outputResources": {
        "amis": [{"region": "us-east-1", "image": AMI}]}}}, {"imageBuildVersionArn": BUILD})
    ec2_stub.add_response("describe_images", {"Images": [{"ImageId": AMI}]}, {"ImageIds": [AMI]})
    with ib_stub, ec2_stub:
        wait_builds(start_builds(spec, ib), ib, ec2, "us-east-1", sleep=lambda _: None, clock=lambda: 0.0)
    policy = operator_policy(spec.identity)
    assert set(made) == {"imagebuilder:ListImagePipelines", "imagebuilder:StartImagePipelineExecution",
                         "imagebuilder:GetImage", "ec2:DescribeImages"}
    assert set(made) <= allowed_actions(policy)
    [start] = [st for st in policy["Statement"] if st["Sid"] == "BuildThisStacksImages"]
    assert start["Condition"] == {"StringEquals": {"aws:ResourceTag/gpucluster:stack": spec.identity}}
