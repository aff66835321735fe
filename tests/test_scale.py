"""`gpucluster scale`, `stop`, `start` on moto: the guardrails' tags; round trips with resume, schedules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from gpucluster.cli import app, common
from gpucluster.fleet import asg, awsapi, nodegroups
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STATE_TAGS, STOPPED_BY_TAG
from gpucluster.lambdas import autostop
from gpucluster.ops.resume import resume_stack
from gpucluster.ops.scale import plan_scale_on
from gpucluster.ops.stopstart import apply_stop, plan_stop_on
from gpucluster.plan import load_stack
from moto_groups import ACTIVE, cost_explorer, create_stack_groups, fleet_of, tag_node_group
from test_jobs import RecordingSsm

runner = CliRunner()
SPEC = load_stack("dev")[2]
DEV = SPEC.identity
HOOK = SPEC.autostop.pre_stop_command

# name -> (stack identity, min, desired, max)
GROUPS = {"dev-a10": (DEV, 1, 2, 3), "dev-extra": (DEV, 0, 1, 2), "other-a10": ("other", 1, 1, 2)}


@pytest.fixture
def autoscaling(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(common, "cost_explorer", lambda spec: cost_explorer(ACTIVE))  # moto has no CE tags
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        boto3.client("ec2").create_launch_template(LaunchTemplateName="a10-nodes", LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
        client = boto3.client("autoscaling")
        create_stack_groups(client, GROUPS, launch_template="a10-nodes")
        tag_node_group(client, "dev-a10", "dev-a10")  # the dev stack file's node group
        tag_node_group(client, "dev-extra", "extra")
        tag_node_group(client, "other-a10", "dev-a10")  # same node group name, another stack
        yield client


@pytest.fixture
def ssm(autoscaling: Any, monkeypatch: pytest.MonkeyPatch) -> RecordingSsm:
    """The SSM client the CLI uses, recording every SendCommand (moto runs them as Success)."""
    recorder = RecordingSsm(boto3.client("ssm", region_name="us-east-1"))
    real = common.client
    monkeypatch.setattr(common, "client", lambda spec, service: recorder if service == "ssm"
                        else real(spec, service))
    return recorder


def _group(client: Any, name: str) -> dict[str, Any]:
    return client.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]


def _state(client: Any, name: str) -> tuple[int, int, str | None]:
    group = _group(client, name)
    return group["MinSize"], group["DesiredCapacity"], awsapi.group_tags(group).get(STOPPED_BY_TAG)


def _schedule(client: Any, monkeypatch: pytest.MonkeyPatch, purpose: str) -> dict[str, Any]:
    """The autostop Lambda handling the stack's -start or -stop schedule rule."""
    monkeypatch.setenv("GPUCLUSTER_STACK", DEV)
    monkeypatch.delenv("PRE_STOP_COMMAND", raising=False)
    event = {"detail-type": "Scheduled Event", "source": "aws.events",
             "resources": [f"arn:aws:events:us-east-1:123456789012:rule/gpu-dev-{purpose}"]}
    return autostop.handler(event, None)


# --------------------------------------------------------------------------- stop


def test_cli_stop_runs_the_hook_then_stops_with_manual_tags(autoscaling: Any, ssm: RecordingSsm) -> None:
    running = {i["InstanceId"] for name in ("dev-a10", "dev-extra")
               for i in _group(autoscaling, name)["Instances"]}

    result = runner.invoke(app, ["stop", "dev", "--yes"])

    assert result.exit_code == 0, result.output
    assert "stop 2 group(s), 3 node(s):" in result.output
    assert f"pre-stop hook first: {HOOK} (waits at most 120 s)" in result.output
    assert len(ssm.sent) == 1  # one hook command for every node of every group
    sent = ssm.sent[0]
    assert set(sent["InstanceIds"]) == running
    assert sent["Parameters"]["commands"] == ["export GPUCLUSTER_STOP_REASON=manual", HOOK]
    assert "pre-stop hook: ok on every node" in result.output
    assert _state(autoscaling, "dev-a10") == (0, 0, "manual")
    tags = awsapi.group_tags(_group(autoscaling, "dev-a10"))
    assert (tags[PREVIOUS_DESIRED_TAG], tags[PREVIOUS_MIN_TAG]) == ("2", "1")
    assert _state(autoscaling, "dev-extra") == (0, 0, "manual")
    assert _state(autoscaling, "other-a10") == (1, 1, None)  # another stack's group


def test_cli_stop_of_one_group_asks_and_no_changes_nothing(autoscaling: Any, ssm: RecordingSsm) -> None:
    extra = {i["InstanceId"] for i in _group(autoscaling, "dev-extra")["Instances"]}
    result = runner.invoke(app, ["stop", "dev", "--group", "extra"], input="n\n")
    assert result.exit_code == 1, result.output
    assert "Stop 1 group(s)? [y/N]" in result.output and "stop cancelled: nothing changed" in result.output
    assert ssm.sent == [] and _state(autoscaling, "dev-extra") == (0, 1, None)

    result = runner.invoke(app, ["stop", "dev", "--group", "extra", "--dry-run"])
    assert result.exit_code == 0 and "dry run: nothing changed" in result.output
    assert ssm.sent == [] and _state(autoscaling, "dev-extra") == (0, 1, None)

    result = runner.invoke(app, ["stop", "dev", "--group", "extra"], input="y\n")
    assert result.exit_code == 0, result.output
    assert _state(autoscaling, "dev-extra") == (0, 0, "manual")
    assert _state(autoscaling, "dev-a10") == (1, 2, None)
    assert [set(c["InstanceIds"]) for c in ssm.sent] == [extra]  # the hook ran on its node only


# ------------------------------------------------------------ round trips with resume


def test_manual_stop_round_trips_with_resume(autoscaling: Any) -> None:
    report = apply_stop(plan_stop_on(fleet_of(DEV, autoscaling=autoscaling), "dev-a10")).report
    assert report.changed == ["dev-a10"]
    assert _state(autoscaling, "dev-a10") == (0, 0, "manual")

    results = resume_stack(fleet_of(DEV, autoscaling=autoscaling), only_stopped_by={"manual"})

    assert [(r.group, r.action) for r in results if r.action == "resumed"] == [("dev-a10", "resumed")]
    assert _state(autoscaling, "dev-a10") == (1, 2, None)
    assert not set(STATE_TAGS) & set(awsapi.group_tags(_group(autoscaling, "dev-a10")))


def test_cli_resume_only_manual_and_status_show_a_manual_stop(autoscaling: Any, ssm: RecordingSsm,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # moto has no ListCostAllocationTags (status's cost-tag check): a Stubber answers it.
    monkeypatch.setattr(common, "cost_explorer", lambda spec: cost_explorer(ACTIVE))
    assert runner.invoke(app, ["stop", "dev", "--group", "dev-a10", "--yes"]).exit_code == 0
    status = runner.invoke(app, ["status", "dev"])
    assert status.exit_code == 0, status.output
    row = next(line.split() for line in status.output.splitlines() if line.startswith("  dev-a10"))
    assert row == ["dev-a10", "0", "0", "3", "0", "manual", "2", "dev-a10"]  # here both are named dev-a10
    result = runner.invoke(app, ["resume", "dev", "--only", "manual", "--yes"])
    assert result.exit_code == 0, result.output
    assert "resumed dev-a10 (stopped by manual): 0 -> 2 node(s), min 1" in result.output
    assert _state(autoscaling, "dev-a10") == (1, 2, None)


# ----------------------------------------------------------- round trips with schedules


def test_schedule_start_leaves_a_manual_stop_alone(autoscaling: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    apply_stop(plan_stop_on(fleet_of(DEV, autoscaling=autoscaling), "dev-a10"))

    summary = _schedule(autoscaling, monkeypatch, "start")

    assert summary["groups"] == []
    assert _state(autoscaling, "dev-a10") == (0, 0, "manual")


def test_start_undoes_a_schedule_stop_and_a_manual_one(autoscaling: Any, ssm: RecordingSsm,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _schedule(autoscaling, monkeypatch, "stop")
    assert _state(autoscaling, "dev-extra") == (0, 0, "schedule")
    assert runner.invoke(app, ["stop", "dev", "--group", "dev-a10", "--yes"]).exit_code == 0
    assert _state(autoscaling, "dev-a10") == (0, 0, "schedule")  # already stopped: label kept

    result = runner.invoke(app, ["start", "dev"], input="y\n")

    assert result.exit_code == 0, result.output
    assert "start restarts 2 group(s), 3 node(s):" in result.output
    assert "started dev-a10 (stopped by schedule): 0 -> 2 node(s), min 1" in result.output
    assert _state(autoscaling, "dev-a10") == (1, 2, None)
    assert _state(autoscaling, "dev-extra") == (0, 1, None)


def test_budget_stop_still_wins(autoscaling: Any, ssm: RecordingSsm, monkeypatch: pytest.MonkeyPatch) -> None:
    assert runner.invoke(app, ["stop", "dev", "--group", "dev-a10", "--yes"]).exit_code == 0
    asg.scale_to_zero(autoscaling, _group(autoscaling, "dev-a10"), nodegroups.BUDGET)  # escalates
    assert _state(autoscaling, "dev-a10") == (0, 0, "budget")

    result = runner.invoke(app, ["start", "dev", "--group", "dev-a10", "--yes"])
    assert result.exit_code == 0, result.output
    assert ("dev-a10: stopped by the budget action; start leaves it stopped (`gpucluster resume dev "
            "--only budget` undoes it, with its warning)") in " ".join(result.output.split())
    assert _state(autoscaling, "dev-a10") == (0, 0, "budget")

    assert runner.invoke(app, ["resume", "dev", "--only", "manual", "--yes"]).exit_code == 0
    assert _state(autoscaling, "dev-a10") == (0, 0, "budget")
    _schedule(autoscaling, monkeypatch, "start")
    assert _state(autoscaling, "dev-a10") == (0, 0, "budget")

    result = runner.invoke(app, ["scale", "dev", "--group", "dev-a10", "--desired", "1", "--yes"])
    assert result.exit_code == 2
    assert "dev-a10 is stopped by budget; restore it with `gpucluster resume dev --only budget`" \
        in result.output

    result = runner.invoke(app, ["stop", "dev", "--group", "dev-a10", "--yes"])
    assert result.exit_code == 0 and "  dev-a10: stopped by budget" in result.output
    assert _state(autoscaling, "dev-a10") == (0, 0, "budget")


def test_a_manual_stop_of_a_budget_restarted_group_keeps_the_budget_label(autoscaling: Any) -> None:
    """Restarted by hand after a budget stop (tags left): stopping again records budget, not manual."""
    asg.scale_to_zero(autoscaling, _group(autoscaling, "dev-extra"), nodegroups.BUDGET)
    autoscaling.update_auto_scaling_group(AutoScalingGroupName="dev-extra", DesiredCapacity=1)
    apply_stop(plan_stop_on(fleet_of(DEV, autoscaling=autoscaling), "extra"))
    assert _state(autoscaling, "dev-extra") == (0, 0, "budget")


# -------------------------------------------------------------------------- scale


def test_cli_scale_shows_cost_asks_and_sets_desired(autoscaling: Any) -> None:
    from gpucluster import catalog

    # dev-a10's node-hour as `cost` prices it: one spot g5.xlarge (on-demand less the g5 spot discount)
    g5 = catalog.get("g5.xlarge")
    assert g5 is not None
    rate = g5.on_demand_price("us-east-1") * (1 - g5.family.spot_discount_percent / 100)
    result = runner.invoke(app, ["scale", "dev", "--group", "dev-a10", "--desired", "3"], input="n\n")
    assert result.exit_code == 1, result.output
    row = next(line.split() for line in result.output.splitlines() if line.startswith("  dev-a10"))
    assert row == ["dev-a10", "dev-a10", "2", "3", "1", "->", "1", "g5.xlarge", f"{3 * rate:,.2f}"]
    assert "Scale dev-a10 to 3 node(s)? [y/N]" in result.output
    assert _state(autoscaling, "dev-a10") == (1, 2, None)

    result = runner.invoke(app, ["scale", "dev", "--group", "dev-a10", "--desired", "3", "--yes"])
    assert result.exit_code == 0, result.output
    assert "scaled dev-a10 to 3 node(s)" in result.output
    assert _state(autoscaling, "dev-a10") == (1, 3, None)
    assert _state(autoscaling, "other-a10") == (1, 1, None)  # same node group name, other stack


def test_scale_down_lowers_min_and_refuses_above_max(autoscaling: Any) -> None:
    result = runner.invoke(app, ["scale", "dev", "--group", "dev-a10", "--desired", "0", "--yes"])
    assert result.exit_code == 0, result.output
    assert _state(autoscaling, "dev-a10") == (0, 0, None)

    result = runner.invoke(app, ["scale", "dev", "--group", "dev-a10", "--desired", "4"])
    assert result.exit_code == 2
    assert result.output == ("scale: --desired 4 is above dev-a10's maximum of 3 nodes; raise max_nodes "
                             "of node group 'dev-a10' in the stack file and `pulumi up` first\n")
    result = runner.invoke(app, ["scale", "dev", "--group", "nope", "--desired", "1"])
    assert result.exit_code == 2 and "no node group 'nope' in this stack" in result.output
    result = runner.invoke(app, ["scale", "dev", "--group", "dev-a10"])
    assert (result.exit_code, result.output) == (2, "scale: --desired is required\n")


def test_scale_write_skips_a_group_stopped_after_it_was_planned(autoscaling: Any) -> None:
    from gpucluster.ops.scale import apply_scale

    plan = plan_scale_on(fleet_of(DEV, autoscaling=autoscaling), "dev-a10", 3)
    asg.scale_to_zero(autoscaling, _group(autoscaling, "dev-a10"), nodegroups.BUDGET)
    results = apply_scale(plan).results
    assert [(r.action, r.reason) for r in results] == [("skipped", "stopped by budget since shown; "
                                                                   "left stopped")]
    assert _state(autoscaling, "dev-a10") == (0, 0, "budget")
