"""resume_stack / stack_status against moto: what `gpucluster resume` and `status` rely on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from gpucluster.cli import app
from gpucluster.lambdas import scaling
from gpucluster.ops.status import GroupStatus, resume_stack, stack_status
from moto import mock_aws
from moto_groups import create_stack_groups
from typer.testing import CliRunner

runner = CliRunner()

# name -> (stack, min, desired, max)
GROUPS = {
    "dev-train": ("dev", 1, 2, 4),
    "dev-infer": ("dev", 0, 1, 2),
    "dev-spare": ("dev", 0, 0, 2),
    "prod-train": ("prod", 1, 1, 2),
}


@pytest.fixture
def autoscaling(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A moto account with a `dev` stack (three groups) and a `prod` group."""
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        boto3.client("ec2").create_launch_template(
            LaunchTemplateName="ops-nodes",
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"},
        )
        client = boto3.client("autoscaling")
        create_stack_groups(client, GROUPS, launch_template="ops-nodes")
        yield client


def _group(client: Any, name: str) -> dict[str, Any]:
    return client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]


def _stop(client: Any, name: str, reason: str) -> None:
    scaling.scale_to_zero(client, _group(client, name), reason)


def test_resume_restores_previous_capacity_and_clears_tags(autoscaling) -> None:
    _stop(autoscaling, "dev-train", "budget")
    _stop(autoscaling, "dev-infer", "idle")

    results = resume_stack("dev", autoscaling_client=autoscaling)

    by_group = {r.group: r for r in results}
    assert set(by_group) == {"dev-infer", "dev-spare", "dev-train"}
    assert (by_group["dev-train"].action, by_group["dev-train"].stopped_by) == ("resumed", "budget")
    assert by_group["dev-spare"].action == "skipped"
    train = _group(autoscaling, "dev-train")
    assert (train["MinSize"], train["DesiredCapacity"], train["MaxSize"]) == (1, 2, 4)
    infer = _group(autoscaling, "dev-infer")
    assert (infer["MinSize"], infer["DesiredCapacity"]) == (0, 1)
    for name in ("dev-train", "dev-infer"):
        assert not set(scaling.STATE_TAGS) & set(scaling.group_tags(_group(autoscaling, name)))


def test_resume_is_idempotent_and_leaves_other_stacks_alone(autoscaling) -> None:
    _stop(autoscaling, "dev-train", "schedule")
    _stop(autoscaling, "prod-train", "budget")
    resume_stack("dev", autoscaling_client=autoscaling)

    again = resume_stack("dev", autoscaling_client=autoscaling)

    assert {r.action for r in again} == {"skipped"}
    assert _group(autoscaling, "dev-train")["DesiredCapacity"] == 2
    prod = _group(autoscaling, "prod-train")
    assert prod["DesiredCapacity"] == 0
    assert scaling.group_tags(prod)[scaling.STOPPED_BY_TAG] == "budget"


def test_resume_can_be_limited_to_some_guardrails(autoscaling) -> None:
    _stop(autoscaling, "dev-train", "budget")
    _stop(autoscaling, "dev-infer", "idle")

    results = resume_stack("dev", autoscaling_client=autoscaling, only_stopped_by={"idle"})

    assert [r.group for r in results if r.action == "resumed"] == ["dev-infer"]
    assert _group(autoscaling, "dev-train")["DesiredCapacity"] == 0


def test_status_reports_capacity_and_who_stopped(autoscaling) -> None:
    _stop(autoscaling, "dev-train", "budget")

    rows = stack_status("dev")  # default client: plain boto3, inside the same moto account

    assert [r.name for r in rows] == ["dev-infer", "dev-spare", "dev-train"]
    by_name = {r.name: r for r in rows}
    assert by_name["dev-train"] == GroupStatus("dev-train", 0, 0, 4, 0, "budget", 2)
    assert by_name["dev-infer"] == GroupStatus("dev-infer", 0, 1, 2, 1, None, None)
    assert by_name["dev-spare"].stopped_by is None


def test_status_of_unknown_stack_is_empty(autoscaling) -> None:
    assert stack_status("staging", autoscaling_client=autoscaling) == []


def test_cli_status_and_resume_of_a_stack(autoscaling: Any) -> None:
    """`gpucluster status dev` / `resume dev`: the stack file gives the region, the tag the groups."""
    _stop(autoscaling, "dev-train", "budget")
    result = runner.invoke(app, ["status", "dev"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines()[2:]}
    assert rows["dev-train"] == ["dev-train", "0", "0", "4", "0", "budget", "2"]
    assert rows["dev-infer"][5:] == ["-", "-"]
    assert "prod-train" not in rows

    result = runner.invoke(app, ["resume", "dev", "--only", "idle"])
    assert result.exit_code == 0, result.output
    assert _group(autoscaling, "dev-train")["DesiredCapacity"] == 0  # a budget stop is not an idle one

    result = runner.invoke(app, ["resume", "dev"])
    assert result.exit_code == 0, result.output
    assert "resumed dev-train (stopped by budget): min 1, desired 2" in result.output
    group = _group(autoscaling, "dev-train")
    assert (group["MinSize"], group["DesiredCapacity"]) == (1, 2)
    assert scaling.STOPPED_BY_TAG not in scaling.group_tags(group)


def test_cli_resume_rejects_unknown_reason() -> None:
    result = runner.invoke(app, ["resume", "dev", "--only", "bored"])
    assert result.exit_code == 2
    assert "--only: unknown reason bored" in result.output


def test_cli_status_without_credentials_is_one_line_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reach real AWS
    result = runner.invoke(app, ["status", "dev"])
    assert result.exit_code == 2
    assert result.output.startswith("status: AWS said:") and "Traceback" not in result.output
