"""Two teams' `dev` stacks in one account: each deployment's guardrails and CLI act on its own groups only.

Team A deploys from Pulumi Cloud organization `team-a`, project `gpucluster`; team B from a
self-managed backend (organization `organization`), project `research`. Both stacks are called
`dev` (the shipped dev stack, each with its own cluster name: in one account and region the
guardrails' Lambda, topic and budget names must differ anyway). Each deployment is planned as
`pulumi up` would run it; its Auto Scaling group is created in moto with the tags the plan gives
it, and its guardrail Lambdas run with the environment the plan gives them. Then budget, idle,
schedule, spot and resume each act, and the other team's group must not notice. With the bare
stack name as identity (before issue 11, item 13) both groups carried `gpucluster:stack=dev` and
every step below acted on both.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_autostop import alarm_event, schedule_event
from test_budget_action import SNS_EVENT
from test_spot_interruption import interruption_event
from typer.testing import CliRunner

from conftest import shared_client
from gpucluster.cli import app, common
from gpucluster.fleet import asg, awsapi, runtime
from gpucluster.fleet.tags import STOPPED_BY_TAG
from gpucluster.lambdas import autostop, budget_action, spot_interruption
from gpucluster.plan import PlannedResource, load_stack
from gpucluster.project import stacks_dir
from test_identity import deploy

ASG = "aws:autoscaling/group:Group"
LAMBDA = "aws:lambda/function:Function"
PRE_STOP_HOOK = "/usr/local/sbin/gpucluster-checkpoint 100"  # the dev stack's pre_stop_command


@dataclass
class Team:
    """One team's deployment: its stack file, the identity the CLI computes, what the plan built."""

    name: str
    stack_file: Path
    identity: str
    asg_tags: dict[str, str]
    lambda_env: dict[str, dict[str, str]]  # function module -> environment

    @property
    def group(self) -> str:
        return f"{self.name}-dev-a10"


def team(root: Path, name: str, project: str, organization: str | None, cluster: str) -> Team:
    """A Pulumi project `project` holding the shipped dev stack under cluster name `cluster`."""
    config = yaml.safe_load((stacks_dir() / "Pulumi.dev.yaml").read_text())["config"]
    config["gpucluster:cluster"]["name"] = cluster
    if organization:
        config["gpucluster:organization"] = organization
    home = root / name
    (home / "stacks").mkdir(parents=True)
    (home / "Pulumi.yaml").write_text(f"name: {project}\nruntime: python\nstackConfigDir: stacks\n")
    stack_file = home / "stacks" / "Pulumi.dev.yaml"
    stack_file.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    _, cli_config, spec = load_stack(str(stack_file))
    planned = deploy(cli_config, stack="dev", project=project, organization=organization)
    [asg] = [r for r in planned if r.type == ASG]
    return Team(name, stack_file, spec.identity, {t["key"]: t["value"] for t in asg.inputs["tags"]},
                {_module(r): r.inputs["environment"]["variables"] for r in planned if r.type == LAMBDA})


def _module(function: PlannedResource) -> str:
    return function.inputs["handler"].split(".")[1]  # lambdas.<module>.handler


@pytest.fixture(scope="module")
def teams(tmp_path_factory: pytest.TempPathFactory) -> tuple[Team, Team]:
    root = tmp_path_factory.mktemp("teams")
    return (team(root, "a", "gpucluster", "team-a", "vision-dev"),
            team(root, "b", "research", None, "speech-dev"))


@pytest.fixture
def account(moto_account: str, teams: tuple[Team, Team]) -> Iterator[Any]:
    """Each team's group (2 nodes, the planned tags) and guard-state table in the module's moto account."""
    autoscaling = shared_client("autoscaling")
    dynamodb = shared_client("dynamodb")
    tables = sorted({t.lambda_env["budget_action"]["GUARD_STATE_TABLE"] for t in teams})
    assert len(tables) == 2  # one table per deployment, named from its identity
    for table in tables:
        dynamodb.create_table(
            TableName=table, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "stack", "KeyType": "HASH"},
                       {"AttributeName": "group", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "stack", "AttributeType": "S"},
                                  {"AttributeName": "group", "AttributeType": "S"}])
    for t in teams:
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=t.group, MinSize=1, DesiredCapacity=2, MaxSize=2,
            LaunchTemplate={"LaunchTemplateName": "gpu-nodes", "Version": "$Latest"},
            AvailabilityZones=["us-east-1a"],
            Tags=[{"ResourceId": t.group, "ResourceType": "auto-scaling-group", "Key": k, "Value": v,
                   "PropagateAtLaunch": True} for k, v in t.asg_tags.items()])
    yield autoscaling
    for t in teams:  # test cleanup in the fake account only
        autoscaling.delete_auto_scaling_group(AutoScalingGroupName=t.group, ForceDelete=True)
    for table in tables:
        dynamodb.delete_table(TableName=table)


def lambda_of(t: Team, module: str, monkeypatch: pytest.MonkeyPatch, topic: str) -> None:
    """Give the process the environment the plan gives team `t`'s `module` Lambda."""
    for key, value in t.lambda_env[module].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", topic)  # the planned topic exists only in the plan


def state(account: Any, group: str) -> tuple[int, str | None]:
    [g] = account.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    return int(g["DesiredCapacity"]), awsapi.group_tags(g).get(STOPPED_BY_TAG)


def instances(account: Any, group: str) -> list[str]:
    [g] = account.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    return sorted(awsapi.in_service_instance_ids(g))


def test_the_two_dev_stacks_have_two_identities(teams: tuple[Team, Team]) -> None:
    a, b = teams
    assert (a.identity, b.identity) == ("team-a/gpucluster/dev/vision-dev",
                                        "organization/research/dev/speech-dev")
    for t in teams:  # what the CLI computes is what the plan tags and hands the Lambdas
        assert t.asg_tags["gpucluster:stack"] == t.identity
        assert {env["GPUCLUSTER_STACK"] for env in t.lambda_env.values()} == {t.identity}
        assert set(t.lambda_env) == {"budget_action", "autostop", "spot_interruption", "job_restart",
                                     "spend_guard"}


def test_budget_stops_its_own_group_only(account, teams, recorded, monkeypatch, moto_account) -> None:
    a, b = teams
    lambda_of(a, "budget_action", monkeypatch, moto_account)

    result = budget_action.handler(copy.deepcopy(SNS_EVENT), None)

    assert result["groups"] == [a.group]
    assert state(account, a.group) == (0, "budget")
    assert state(account, b.group) == (2, None)


def test_idle_stops_its_own_group_and_hooks_its_own_nodes(account, teams, recorded, monkeypatch,
                                                           moto_account) -> None:
    a, b = teams
    lambda_of(a, "autostop", monkeypatch, moto_account)
    assert a.lambda_env["autostop"]["PRE_STOP_COMMAND"] == PRE_STOP_HOOK
    a_nodes = instances(account, a.group)

    other = autostop.handler(alarm_event(alarm_name=f"{b.group}-idle",
                                         dimensions={"AutoScalingGroupName": b.group}), None)
    assert other["action"] == "ignored" and state(account, b.group) == (2, None)
    assert recorded.of("ssm", "send_command") == []  # no hook as root on the other team's nodes

    own = autostop.handler(alarm_event(alarm_name=f"{a.group}-idle",
                                       dimensions={"AutoScalingGroupName": a.group}), None)

    assert own["groups"] == [a.group] and state(account, a.group) == (0, "idle")
    [sent] = recorded.of("ssm", "send_command")
    assert sorted(sent["InstanceIds"]) == a_nodes and len(a_nodes) == 2
    assert state(account, b.group) == (2, None)


def test_schedules_stop_and_start_their_own_groups(account, teams, recorded, monkeypatch,
                                                   moto_account) -> None:
    a, b = teams
    b_nodes = instances(account, b.group)
    lambda_of(a, "autostop", monkeypatch, moto_account)
    autostop.handler(schedule_event("vision-dev-stop"), None)
    assert state(account, a.group) == (0, "schedule") and state(account, b.group) == (2, None)
    assert not {i for c in recorded.of("ssm", "send_command") for i in c["InstanceIds"]} & set(b_nodes)

    lambda_of(b, "autostop", monkeypatch, moto_account)
    autostop.handler(schedule_event("speech-dev-stop"), None)
    assert state(account, b.group) == (0, "schedule")

    lambda_of(a, "autostop", monkeypatch, moto_account)
    started = autostop.handler(schedule_event("vision-dev-start"), None)

    assert started["groups"] == [a.group]
    assert state(account, a.group) == (2, None)
    assert state(account, b.group) == (0, "schedule")  # team B's morning is not team A's


def test_spot_hooks_run_on_its_own_nodes_only(account, teams, recorded, monkeypatch, moto_account) -> None:
    a, b = teams
    lambda_of(a, "spot_interruption", monkeypatch, moto_account)
    theirs, mine = instances(account, b.group)[0], instances(account, a.group)[0]

    assert spot_interruption.handler(interruption_event(theirs), None)["action"] == "ignored"
    assert recorded.of("ssm", "send_command") == []

    result = spot_interruption.handler(interruption_event(mine), None)

    assert (result["action"], result["group"]) == ("hook-run", a.group)
    assert [c["InstanceIds"] for c in recorded.of("ssm", "send_command")] == [[mine]]


def test_status_and_resume_from_each_stack_file_see_their_own_group(account, teams, recorded,
                                                                    monkeypatch) -> None:
    from test_operations import ACTIVE, cost_explorer

    a, b = teams
    monkeypatch.setattr(common, "cost_explorer", lambda spec: cost_explorer(ACTIVE))
    for t in teams:
        asg.scale_to_zero(account, account.describe_auto_scaling_groups(
            AutoScalingGroupNames=[t.group])["AutoScalingGroups"][0], "budget")
    runner = CliRunner()

    status = runner.invoke(app, ["status", str(b.stack_file)])
    assert status.exit_code == 0, status.output
    assert f"gpucluster:stack={b.identity}" in status.output
    assert b.group in status.output and a.group not in status.output

    resumed = runner.invoke(app, ["resume", str(a.stack_file), "--yes"])

    assert resumed.exit_code == 0, resumed.output
    assert f"resumed {a.group} (stopped by budget): 0 -> 2 node(s), min 1" in resumed.output
    assert b.group not in resumed.output
    assert state(account, a.group) == (2, None)
    assert state(account, b.group) == (0, "budget")  # `resume dev` never restarts the other team's dev


def test_the_spend_guard_stops_its_own_group_only(account, teams, recorded, monkeypatch,
                                                  moto_account) -> None:
    """Team a's guard, with the environment its plan renders, over its limit: b's group runs on."""
    from test_spend_guard import cost_explorer

    from gpucluster.fleet.accrual import cost_period
    from gpucluster.lambdas import spend_guard

    a, b = teams
    lambda_of(a, "spend_guard", monkeypatch, moto_account)
    now = datetime.now(UTC)
    if cost_period(now) is None:
        pytest.skip("the first two days of a month have no settled figure to stub")
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: now)
    limit = float(a.lambda_env["spend_guard"]["LIMIT_USD"])
    recorded.fakes["ce"] = cost_explorer(limit + 1, stack=a.identity, now=now)
    result = spend_guard.handler({}, None)
    assert result["groups"] == [a.group]
    assert state(account, a.group) == (0, "budget") and state(account, b.group) == (2, None)
