"""Guardrails under the mock engine: budget, alarms, schedules, rules, Lambdas and their roles.

Each shipped stack is built once (module fixtures) and its recorded inputs are
checked value by value: thresholds and subscribers, alarm windows, the missing-
data rule, schedule expressions and inputs, event patterns, Lambda settings,
and every statement of every role policy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pulumi
import pytest

from gpucluster.aws import guardrail_budget as gb
from gpucluster.aws import guardrail_events as ge
from gpucluster.aws import guardrail_lambda as gl
from gpucluster.aws import guardrails as g
from gpucluster.aws.children import guardrails_args
from gpucluster.aws.guardrails import Guardrails
from gpucluster.fleet.deployment import state_table_name
from gpucluster.plan import MOCK_ACCOUNT, PlannedResource, load_stack, record_resources, run_plan
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec, can_run_spot

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
IDLE = "autostop-idle-"  # the idle alarms' names (the guardrail functions' own alarms are "-watch-")
COMPOSITE = "aws:cloudwatch/compositeAlarm:CompositeAlarm"
BUDGET = "aws:budgets/budget:Budget"
FUNCTION = "aws:lambda/function:Function"
INVOKE_CONFIG = "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig"
KEY = "aws:kms/key:Key"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
PERMISSION = "aws:lambda/permission:Permission"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
RULE = "aws:cloudwatch/eventRule:EventRule"
SCHEDULE = "aws:scheduler/schedule:Schedule"
SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
TOPIC = "aws:sns/topic:Topic"
TOPIC_POLICY = "aws:sns/topicPolicy:TopicPolicy"

# Actions that AWS authorises only on Resource "*" (Service Authorization Reference).
DESCRIBE_ONLY = {"autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
                 "ec2:DescribeInstances", "ssm:GetCommandInvocation",
                 # the spend guard's reads (no resource types either)
                 "ce:GetCostAndUsage", "ec2:DescribeSpotPriceHistory", "cloudwatch:GetMetricData",
                 # ...and a Capacity Block's fee from its reservation (no resource types either)
                 "ec2:DescribeCapacityReservations",
                 # the spend guard's price of a type its table lacks (AWS Price List: no resource types)
                 "pricing:GetProducts",
                 # autostop reads its idle alarm again (on "*": ledger cloudwatch-describe-alarms-resource)
                 "cloudwatch:DescribeAlarms"}


def asg_name(spec: StackSpec, group: str) -> str:
    return f"{spec.cluster.name}-{group}-asg"


def asg_arn(spec: StackSpec, group: str) -> str:
    return (f"arn:aws:autoscaling:{spec.region}:{MOCK_ACCOUNT}:autoScalingGroup:uuid:"
            f"autoScalingGroupName/{asg_name(spec, group)}")


def targets(spec: StackSpec) -> dict[str, tuple[str, str]]:
    return {grp.name: (asg_name(spec, grp.name), asg_arn(spec, grp.name)) for grp in spec.node_groups}


class Built:
    """The resources one Guardrails registered, with lookups by type and name."""

    def __init__(self, spec: StackSpec, resources: list[PlannedResource]) -> None:
        self.spec = spec
        self.resources = resources

    def all(self, type_: str) -> list[PlannedResource]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name_part: str = "") -> PlannedResource:
        found = [r for r in self.all(type_) if name_part in r.name]
        assert len(found) == 1, f"{type_} {name_part!r}: {[r.name for r in found]}"
        return found[0]

    def arn(self, type_: str, name_part: str = "") -> str:
        """The ARN PlanMocks gives a resource: arn:aws:<service>:<region>:<account>:<resource name>."""
        service = type_.split(":")[1].split("/")[0]
        return f"arn:aws:{service}:{self.spec.region}:{MOCK_ACCOUNT}:{self.one(type_, name_part).name}"

    def function(self, module: str) -> PlannedResource:
        return next(r for r in self.all(FUNCTION) if r.inputs["handler"] == gl.HANDLERS[module])

    def policy(self, function_name: str) -> list[dict[str, Any]]:
        """Statements of the role policy of the Lambda named `function_name`."""
        fn = next(r for r in self.all(FUNCTION) if r.inputs["name"] == function_name)
        base = fn.name.removesuffix("-function")
        return json.loads(self.one(ROLE_POLICY, f"{base}-policy").inputs["policy"])["Statement"]

    @property
    def notify_topic(self) -> str:
        return self.arn(TOPIC, "notify-topic")


# stacks/Pulumi.dev.yaml's identity: <organization>/<project>/<stack>/<cluster>
DEV_IDENTITY = "organization/gpucluster/dev/gpu-dev"


def build(spec: StackSpec, *, restart_jobs: bool = True) -> Built:
    """The stack's Guardrails, with args from the one spec -> args mapping (as GpuCluster builds them;
    `restart_jobs=False` leaves out the job restart handler GpuCluster always asks for)."""
    args = guardrails_args(spec, targets(spec))
    args["restart_jobs"] = restart_jobs
    resources, _ = record_resources(lambda: Guardrails(f"{spec.cluster.name}-guardrails", args),
                                    stack=spec.stack, region=spec.region)
    return Built(spec, resources)


def spec_of(config: dict[str, Any], **sections: Any) -> StackSpec:
    """base_config plus `gpucluster:<section>` values."""
    return parse_stack_config({**config, **{f"gpucluster:{k}": v for k, v in sections.items()}},
                              stack="case")


@pytest.fixture(scope="module")
def dev() -> Built:
    return build(load_stack("dev")[2])


@pytest.fixture(scope="module")
def prod() -> Built:
    return build(load_stack("prod")[2])


@pytest.fixture(scope="module")
def staging() -> Built:
    return build(load_stack("staging")[2])


def resources_of(statements: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for s in statements:
        out += s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
    return out


def actions_of(statements: list[dict[str, Any]], resource: str | None = None) -> set[str]:
    return {a for s in statements for a in s["Action"]
            if resource is None or resource in (s["Resource"] if isinstance(s["Resource"], list)
                                                else [s["Resource"]])}


# ------------------------------------------------------------------ pure logic


@pytest.mark.parametrize(("idle", "period", "evaluations"), [
    (5, 60, 5), (14, 60, 14), (15, 300, 3), (30, 300, 6), (33, 60, 33), (120, 300, 24), (1440, 300, 288)])
def test_idle_window(idle: int, period: int, evaluations: int) -> None:
    assert ge.idle_window(idle) == (period, evaluations)


def test_idle_window_covers_every_allowed_idle_time_exactly_within_a_day() -> None:
    for idle in range(5, 1441):
        period, evaluations = ge.idle_window(idle)
        assert period * evaluations == idle * 60
        assert period * evaluations <= 86_400  # CloudWatch: evaluation range at most one day


@pytest.mark.parametrize(("amount", "text"), [(500, "500"), (400000, "400000"), (2.5, "2.50"),
                                               (10_000_000, "10000000")])
def test_usd(amount: float, text: str) -> None:
    assert gb.usd(amount) == text


@pytest.mark.parametrize(("capacity", "max_nodes", "spot"), [
    ({"spot_percent": 100}, 2, True),
    ({"spot_percent": 0}, 2, False),
    ({"on_demand_base": 2, "spot_percent": 100}, 2, False),  # no room above the base
    ({"on_demand_base": 1, "spot_percent": 70}, 6, True),
])
def test_can_run_spot(base_config: dict[str, Any], capacity: dict[str, Any], max_nodes: int,
                      spot: bool) -> None:
    group = {**base_config["gpucluster:node_groups"][0], "capacity": capacity, "max_nodes": max_nodes}
    spec = spec_of(base_config, node_groups=[group])
    assert can_run_spot(spec.node_groups[0]) is spot
    assert guardrails_args(spec, targets(spec))["groups"][0]["can_run_spot"] is spot


def test_timeouts_cover_the_hooks_and_stay_within_lambdas_limit(base_config: dict[str, Any]) -> None:
    longest = spec_of(base_config, autostop={"pre_stop_command": "/hook", "pre_stop_timeout_seconds": 840},
                      spot={"interruption_command": "/hook", "interruption_timeout_seconds": 110})
    assert ge.autostop_timeout(longest.autostop) == 900
    assert ge.spot_timeout(longest.spot) == 140
    bare = spec_of(base_config, autostop={"enabled": True})
    assert ge.autostop_timeout(bare.autostop) == 120
    assert ge.spot_timeout(bare.spot) == 60


def test_a_budget_may_hold_ten_notifications_when_the_action_shares_a_threshold(
        base_config: dict[str, Any]) -> None:
    nine = list(range(10, 100, 10))
    spec = spec_of(base_config, budget={"monthly_limit_usd": 100, "alert_thresholds_percent": nine,
                                        "action_threshold_percent": 90})
    assert spec.budget is not None
    notes = gb.budget_notifications(spec.budget, "notify", "action")
    assert len(notes) == 10
    assert [n["subscriber_sns_topic_arns"] for n in notes if n["threshold"] == 90] == [["action"]]


# ---------------------------------------------------------------- dev (mocked)


def test_dev_budget_filters_on_the_stack_tag_and_merges_the_action_into_the_100_percent_alert(
        dev: Built) -> None:
    budget = dev.one(BUDGET).inputs
    assert (budget["name"], budget["budgetType"], budget["timeUnit"]) == (
        "gpu-dev-monthly", "COST", "MONTHLY")
    assert (budget["limitAmount"], budget["limitUnit"]) == ("700", "USD")
    assert budget["costFilters"] == [{"name": "TagKeyValue",
                                      "values": [f"user:gpucluster:stack${DEV_IDENTITY}"]}]
    action_topic = dev.arn(TOPIC, "action-topic")
    got = [(n["notificationType"], n["threshold"], n["comparisonOperator"], n["thresholdType"],
            n["subscriberSnsTopicArns"], n["subscriberEmailAddresses"]) for n in budget["notifications"]]
    emails = ["ml-platform@example.com"]
    assert got == [
        ("ACTUAL", 50, "GREATER_THAN", "PERCENTAGE", [dev.notify_topic], emails),
        ("ACTUAL", 80, "GREATER_THAN", "PERCENTAGE", [dev.notify_topic], emails),
        ("ACTUAL", 100, "GREATER_THAN", "PERCENTAGE", [action_topic], emails),  # action threshold
        ("FORECASTED", 100, "GREATER_THAN", "PERCENTAGE", [dev.notify_topic], emails),
    ]


def test_only_the_budget_lambda_listens_to_the_action_topic(dev: Built) -> None:
    action_topic = dev.arn(TOPIC, "action-topic")
    subscriptions = [s.inputs for s in dev.all(SUBSCRIPTION) if s.inputs["topic"] == action_topic]
    budget_fn = dev.function("budget_action")
    assert subscriptions == [{"topic": action_topic, "protocol": "lambda",
                              "endpoint": dev.arn(FUNCTION, budget_fn.name)}]
    permission = dev.one(PERMISSION, "budget-action-permission").inputs
    assert permission == {"action": "lambda:InvokeFunction", "function": "gpu-dev-budget-action",
                          "principal": "sns.amazonaws.com", "sourceArn": action_topic}
    assert budget_fn.inputs["environment"]["variables"] == {
        "GPUCLUSTER_STACK": DEV_IDENTITY, "NOTIFY_TOPIC_ARN": dev.notify_topic,
        "GUARD_STATE_TABLE": state_table_name(DEV_IDENTITY)}


def test_topics_are_encrypted_with_a_key_budgets_and_cloudwatch_may_use(dev: Built) -> None:
    key = dev.one(KEY).inputs
    assert key["enableKeyRotation"] is True
    statements = json.loads(key["policy"])["Statement"]
    services = next(s for s in statements if s["Sid"] == "ServicesPublishToEncryptedTopics")
    assert services["Principal"]["Service"] == ["budgets.amazonaws.com", "cloudwatch.amazonaws.com"]
    assert services["Action"] == ["kms:GenerateDataKey*", "kms:Decrypt"]
    # only on this account's behalf (SNS guide, confused-deputy prevention)
    assert services["Condition"] == {"StringEquals": {"aws:SourceAccount": MOCK_ACCOUNT}}
    root = next(s for s in statements if s["Sid"] == "AccountAdministersThroughIam")
    assert root["Principal"] == {"AWS": f"arn:aws:iam::{MOCK_ACCOUNT}:root"}
    for topic in dev.all(TOPIC):
        assert topic.inputs["kmsMasterKeyId"] == dev.arn(KEY)  # never alias/aws/sns


def test_topic_policies_let_budgets_publish_for_this_account_only(dev: Built) -> None:
    notify = json.loads(dev.one(TOPIC_POLICY, "notify-topic-policy").inputs["policy"])["Statement"]
    action = json.loads(dev.one(TOPIC_POLICY, "action-topic-policy").inputs["policy"])["Statement"]
    budgets = {"Sid": "AWSBudgetsPublish", "Effect": "Allow",
               "Principal": {"Service": "budgets.amazonaws.com"}, "Action": "SNS:Publish",
               "Condition": {"StringEquals": {"aws:SourceAccount": MOCK_ACCOUNT},
                             "ArnLike": {"aws:SourceArn": f"arn:aws:budgets::{MOCK_ACCOUNT}:*"}}}
    assert action == [{**budgets, "Resource": dev.arn(TOPIC, "action-topic")}]
    assert notify[0] == {**budgets, "Resource": dev.notify_topic}
    assert notify[1]["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert notify[1]["Condition"]["ArnLike"] == {
        "aws:SourceArn": f"arn:aws:cloudwatch:us-east-1:{MOCK_ACCOUNT}:alarm:*"}


def test_budget_emails_subscribe_to_the_notify_topic(dev: Built) -> None:
    emails = [s.inputs for s in dev.all(SUBSCRIPTION) if s.inputs["protocol"] == "email"]
    assert emails == [{"topic": dev.notify_topic, "protocol": "email", "endpoint": "ml-platform@example.com"}]


def test_dev_idle_alarm_stops_after_15_idle_minutes_and_missing_data_only_notifies(dev: Built) -> None:
    alarm = dev.one(ALARM, IDLE).inputs
    assert (alarm["namespace"], alarm["metricName"], alarm["statistic"]) == (
        "gpucluster/gpu-dev", "nvidia_smi_utilization_gpu", "Maximum")  # the cluster's own namespace
    assert alarm["dimensions"] == {"AutoScalingGroupName": "gpu-dev-dev-a10-asg"}
    assert alarm["name"] == "gpu-dev-dev-a10-asg-gpu-idle"
    assert (alarm["comparisonOperator"], alarm["threshold"]) == ("LessThanThreshold", 5)
    # the second signal: GPUs held and unused; at least an hour, so loading data is not idle
    assert alarm["period"] * alarm["evaluationPeriods"] == 60 * 60
    assert alarm["datapointsToAlarm"] == alarm["evaluationPeriods"]
    assert alarm["treatMissingData"] == "missing"  # not "breaching": no data is never idle
    assert alarm["insufficientDataActions"] == [dev.notify_topic]
    assert not alarm.get("alarmActions")  # stopping goes through the EventBridge rule
    activity = dev.one(ALARM, "no-jobs").inputs
    assert (activity["namespace"], activity["metricName"], activity["statistic"]) == (
        "gpucluster/gpu-dev", "NodeActive", "Maximum")  # any node of the group running something
    assert activity["dimensions"] == {"Stack": DEV_IDENTITY, "NodeGroup": "dev-a10"}
    assert (activity["comparisonOperator"], activity["threshold"]) == ("LessThanThreshold", 1)
    assert (activity["period"], activity["evaluationPeriods"], activity["datapointsToAlarm"]) == (60, 15, 15)
    assert activity["treatMissingData"] == "missing" and not activity.get("alarmActions")
    composite = dev.one(COMPOSITE).inputs
    assert composite["alarmName"] == "gpu-dev-dev-a10-asg-idle"  # the autostop handler's fallback convention
    assert composite["alarmRule"] == (
        'ALARM("gpu-dev-dev-a10-asg-no-jobs") OR ALARM("gpu-dev-dev-a10-asg-gpu-idle")')
    assert not composite.get("alarmActions")


def test_idle_rule_passes_only_alarm_states_of_this_stacks_alarms_to_autostop(dev: Built) -> None:
    rule = dev.one(RULE, "idle-rule")
    pattern = json.loads(rule.inputs["eventPattern"])
    assert pattern == {"source": ["aws.cloudwatch"], "detail-type": ["CloudWatch Alarm State Change"],
                       "resources": [dev.arn(COMPOSITE)], "detail": {"state": {"value": ["ALARM"]}}}
    autostop = dev.function("autostop")
    assert dev.one(TARGET, "idle-target").inputs == {"rule": "gpu-dev-idle",
                                                       "arn": dev.arn(FUNCTION, autostop.name)}
    assert dev.one(PERMISSION, "idle-permission").inputs == {
        "action": "lambda:InvokeFunction", "function": "gpu-dev-autostop",
        "principal": "events.amazonaws.com", "sourceArn": dev.arn(RULE, "idle-rule")}


def test_dev_schedules_run_in_berlin_time_and_name_their_purpose(dev: Built) -> None:
    autostop_arn = dev.arn(FUNCTION, dev.function("autostop").name)
    role_arn = dev.arn(ROLE, "autostop-scheduler-role")
    got = {}
    for schedule in autostop_schedules(dev):
        s = schedule.inputs
        event = json.loads(s["target"]["input"])
        assert (s["target"]["arn"], s["target"]["roleArn"]) == (autostop_arn, role_arn)
        assert s["flexibleTimeWindow"] == {"mode": "OFF"} and s["state"] == "ENABLED"
        assert (event["detail-type"], event["source"], event["detail"]) == (
            "Scheduled Event", "aws.events", {})
        assert event["resources"] == ["<aws.scheduler.schedule-arn>",
                                      f"arn:aws:events:us-east-1:{MOCK_ACCOUNT}:rule/{s['name']}"]
        got[s["name"]] = (s["scheduleExpression"], s.get("scheduleExpressionTimezone"))
    assert got == {"gpu-dev-stop": ("cron(0 19 ? * * *)", "Europe/Berlin"),
                   "gpu-dev-start": ("cron(0 8 ? * MON-FRI *)", "Europe/Berlin"),
                   "gpu-dev-lifetime": ("rate(15 minutes)", None)}


def autostop_schedules(built: Built) -> list[Any]:
    """The auto-stop schedules (the spend guard's own schedule is tested in test_spend_guard_infra)."""
    return [s for s in built.all(SCHEDULE) if "-spend-" not in s.name]


def test_scheduler_role_may_only_invoke_autostop(dev: Built) -> None:
    role = dev.one(ROLE, "autostop-scheduler-role").inputs
    trust = json.loads(role["assumeRolePolicy"])["Statement"]
    assert trust == [{"Effect": "Allow", "Principal": {"Service": "scheduler.amazonaws.com"},
                      "Action": "sts:AssumeRole",
                      "Condition": {"StringEquals": {"aws:SourceAccount": MOCK_ACCOUNT}}}]
    policy = json.loads(dev.one(ROLE_POLICY, "autostop-scheduler-policy").inputs["policy"])["Statement"]
    assert [(s["Action"], s["Resource"]) for s in policy] == [
        (["lambda:InvokeFunction"], [dev.arn(FUNCTION, dev.function("autostop").name)])]


def test_dev_lambdas_settings_and_environment(dev: Built) -> None:
    expected_env = {
        "budget_action": {"GPUCLUSTER_STACK": DEV_IDENTITY, "NOTIFY_TOPIC_ARN": dev.notify_topic,
                          "GUARD_STATE_TABLE": state_table_name(DEV_IDENTITY)},
        "autostop": {"GPUCLUSTER_STACK": DEV_IDENTITY, "NOTIFY_TOPIC_ARN": dev.notify_topic,
                     "GUARD_STATE_TABLE": state_table_name(DEV_IDENTITY),
                     "PRE_STOP_COMMAND": "/usr/local/sbin/gpucluster-checkpoint 100",
                     "PRE_STOP_TIMEOUT_SECONDS": "120", "MAX_LIFETIME_HOURS": "12"},
        "spot_interruption": {"GPUCLUSTER_STACK": DEV_IDENTITY, "NOTIFY_TOPIC_ARN": dev.notify_topic,
                              "INTERRUPTION_COMMAND": "/usr/local/sbin/gpucluster-checkpoint 80",
                              "INTERRUPTION_TIMEOUT_SECONDS": "90"},
    }
    timeouts = {"budget_action": 120, "autostop": 120 + 60, "spot_interruption": 90 + 30}
    for module, env in expected_env.items():
        fn = dev.function(module).inputs
        assert fn["environment"]["variables"] == env
        assert (fn["runtime"], fn["architectures"], fn["memorySize"]) == ("python3.13", ["arm64"], 256)
        assert fn["timeout"] == timeouts[module]
        assert fn["loggingConfig"]["logGroup"] == f"/aws/lambda/{fn['name']}"
        log_group = next(r.inputs for r in dev.all(LOG_GROUP)
                         if r.inputs["name"] == f"/aws/lambda/{fn['name']}")
        assert log_group["retentionInDays"] == 30


def test_lambda_code_is_the_handlers_as_package_lambdas_beside_the_fleet_core() -> None:
    archive = gl.lambda_code()
    handlers = sorted(p.name for p in gl.LAMBDA_DIR.glob("*.py"))
    core = sorted(p.name for p in gl.FLEET_DIR.glob("*.py"))
    assert {h.split(".")[1] + ".py" for h in gl.HANDLERS.values()} | {"__init__.py"} == set(handlers)
    assert {"__init__.py", "awsapi.py", "runtime.py", "runcommand.py", "nodegroups.py", "asg.py",
            "stops.py", "deployment.py"} <= set(core)
    assert sorted(archive.assets) == sorted([f"lambdas/{m}" for m in handlers]
                                            + [f"gpucluster/fleet/{m}" for m in core]
                                            + ["gpucluster/__init__.py"])
    assert isinstance(archive.assets["gpucluster/__init__.py"], pulumi.StringAsset)
    assert all(isinstance(a, pulumi.FileAsset) for n, a in archive.assets.items()
               if n != "gpucluster/__init__.py")
    assert gl.LAMBDA_DIR.parts[-3:] == ("components", "gpucluster", "lambdas")
    assert gl.FLEET_DIR.parts[-3:] == ("components", "gpucluster", "fleet")


def test_every_handler_imports_from_the_archive_alone(tmp_path: Path) -> None:
    """The archive as Lambda unpacks it: each handler imports with nothing of the checkout on the path."""
    for name, asset in gl.lambda_code().assets.items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(asset, pulumi.StringAsset):
            target.write_text(asset.text)
        else:
            target.write_bytes(Path(asset.path).read_bytes())
    handlers = " ".join(sorted(gl.HANDLERS.values()))
    # boto3's folder alone (as the Lambda runtime has it): `-S` skips site, so no .pth of the editable
    # install puts the checkout's gpucluster on the path.
    site_packages = str(Path(boto3.__file__).parents[1])
    script = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        f"sys.path.append({site_packages!r})\n"
        "for target in sys.argv[1:]:\n"
        "    module, _, function = target.rpartition('.')\n"
        "    assert callable(getattr(importlib.import_module(module), function)), target\n"
        "import gpucluster\n"
        f"assert gpucluster.__file__ == {str(tmp_path / 'gpucluster' / '__init__.py')!r}, "
        "gpucluster.__file__\n"
        "assert not [m for m in sys.modules if m.split('.')[0].startswith('pulumi')], 'pulumi loaded'\n")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script, *handlers.split()],
                            capture_output=True, text=True, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr


def test_lambda_archive_is_stable_across_runs_and_ignores_build_noise() -> None:
    """A second plan after a local test run (bytecode in lambdas/ and fleet/) shows the same code hash."""
    first = {f.inputs["name"]: f.inputs["code"] for f in run_plan("dev").of_type(FUNCTION)}
    noise = [gl.LAMBDA_DIR / "__pycache__" / "gpucluster-noise.cpython-313.pyc", gl.LAMBDA_DIR / "stray.pyc",
             gl.LAMBDA_DIR / ".coverage", gl.FLEET_DIR / "stray.pyc"]
    try:
        for path in noise:
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(b"noise")
        second = {f.inputs["name"]: f.inputs["code"] for f in run_plan("dev").of_type(FUNCTION)}
    finally:
        for path in noise:
            path.unlink(missing_ok=True)
    assert first == second
    modules = {*gl.lambda_sources(), "gpucluster/__init__.py"}
    for code in second.values():
        assert set(code["files"]) == modules, "only the handler and fleet modules, by content"
        assert len(code["sha256"]) == 64


def test_failed_invocations_notify_and_spot_retries_stay_within_the_warning(dev: Built) -> None:
    configs = {c.inputs["functionName"]: c.inputs for c in dev.all(INVOKE_CONFIG)}
    assert set(configs) == {"gpu-dev-budget-action", "gpu-dev-autostop", "gpu-dev-spot-interruption",
                            "gpu-dev-job-restart", "gpu-dev-spend-guard"}
    for config in configs.values():
        assert config["destinationConfig"] == {"onFailure": {"destination": dev.notify_topic}}
    spot = configs["gpu-dev-spot-interruption"]
    assert (spot["maximumEventAgeInSeconds"], spot["maximumRetryAttempts"]) == (120, 1)


def test_spot_rules_catch_warnings_and_rebalance_advice_for_the_spot_lambda(dev: Built) -> None:
    spot_fn = dev.arn(FUNCTION, dev.function("spot_interruption").name)
    patterns = {}
    for kind, detail_type in (("interruption", "EC2 Spot Instance Interruption Warning"),
                              ("rebalance", "EC2 Instance Rebalance Recommendation")):
        rule = dev.one(RULE, f"spot-{kind}-rule")
        patterns[kind] = json.loads(rule.inputs["eventPattern"])
        assert patterns[kind] == {"source": ["aws.ec2"], "detail-type": [detail_type]}
        assert dev.one(TARGET, f"spot-{kind}-target").inputs == {"rule": rule.inputs["name"], "arn": spot_fn}
        permission = dev.one(PERMISSION, f"spot-{kind}-permission").inputs
        assert (permission["principal"], permission["sourceArn"]) == (
            "events.amazonaws.com", dev.arn(RULE, f"spot-{kind}-rule"))


# ------------------------------------------------------------- role policies


def check_policy(built: Built, function_name: str, *, scales: bool, runs_hooks: bool) -> list[dict[str, Any]]:
    """Every statement names this stack's resources; "*" only for describe-only actions."""
    statements = built.policy(function_name)
    spec = built.spec
    stars = [s for s in statements if s["Resource"] == "*" or "*" in s["Resource"]]
    assert [s["Sid"] for s in stars] == ["DescribeOnlyStar"]
    assert set(stars[0]["Action"]) <= DESCRIBE_ONLY
    for s in statements:
        assert s["Effect"] == "Allow"
        assert not any(a.endswith("*") and a != "kms:GenerateDataKey*" for a in s["Action"]), s
        # Never a delete, except removing the stop-state tags on resume.
        assert not [a for a in s["Action"] if "Delete" in a and a != "autoscaling:DeleteTags"]
    region, account = spec.region, MOCK_ACCOUNT
    logs = next(s for s in statements if s["Sid"] == "WriteOwnLogs")
    assert logs["Resource"] == [f"arn:aws:logs:{region}:{account}:log-group:/aws/lambda/{function_name}:*"]
    assert logs["Action"] == ["logs:CreateLogStream", "logs:PutLogEvents"]
    publish = next(s for s in statements if s["Sid"] == "Notify")
    assert (publish["Action"], publish["Resource"]) == (["sns:Publish"], [built.notify_topic])
    kms = next(s for s in statements if s["Sid"] == "EncryptForTopic")
    assert kms["Resource"] == [built.arn(KEY)]
    asg_arns = sorted(asg_arn(spec, grp.name) for grp in spec.node_groups)
    scaling = [s for s in statements if s["Action"][0].startswith("autoscaling:") and s["Resource"] != "*"]
    if scales:
        assert [s["Sid"] for s in scaling] == ["ScaleThisStacksGroups", "TagStopState"]
        for s in scaling:
            assert sorted(s["Resource"]) == asg_arns
            assert s["Condition"]["StringEquals"] == {
                "autoscaling:ResourceTag/gpucluster:stack": spec.identity}
        assert scaling[1]["Condition"]["ForAllValues:StringEquals"] == {"aws:TagKeys": [
            "gpucluster:stopped-by", "gpucluster:previous-desired", "gpucluster:previous-min"]}
    else:
        assert scaling == []
    send = [s for s in statements if "ssm:SendCommand" in s["Action"]]
    if runs_hooks:
        assert [(s["Resource"], s.get("Condition")) for s in send] == [
            ([f"arn:aws:ssm:{region}::document/AWS-RunShellScript"], None),
            ([f"arn:aws:ec2:{region}:{account}:instance/*"],
             {"StringEquals": {"ssm:resourceTag/gpucluster:stack": spec.identity}})]
        assert "ssm:GetCommandInvocation" in stars[0]["Action"]
    else:
        assert send == [] and "ssm:GetCommandInvocation" not in stars[0]["Action"]
    return statements


def test_dev_roles_name_only_this_stacks_resources(dev: Built) -> None:
    budget = check_policy(dev, "gpu-dev-budget-action", scales=True, runs_hooks=False)
    assert actions_of(budget, "*") == {"autoscaling:DescribeAutoScalingGroups"}
    autostop = check_policy(dev, "gpu-dev-autostop", scales=True, runs_hooks=True)
    # DeleteTags to undo a schedule stop (start_schedule); DescribeInstances for the lifetime check.
    assert "autoscaling:DeleteTags" in actions_of(autostop)
    assert "ec2:DescribeInstances" in actions_of(autostop, "*")
    spot = check_policy(dev, "gpu-dev-spot-interruption", scales=False, runs_hooks=True)
    assert actions_of(spot, "*") == {"autoscaling:DescribeAutoScalingGroups",
                                     "autoscaling:DescribeAutoScalingInstances", "ssm:GetCommandInvocation"}


def test_lambda_roles_trust_lambda_only(dev: Built) -> None:
    for role in dev.all(ROLE):
        if "scheduler" in role.name:
            continue
        trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        assert trust == [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                          "Action": "sts:AssumeRole"}]


# ---------------------------------------------------------- prod and staging


def test_prod_budget_action_at_110_percent_goes_to_the_action_topic_only(prod: Built) -> None:
    notes = prod.one(BUDGET).inputs["notifications"]
    action_topic = prod.arn(TOPIC, "action-topic")
    assert [(n["notificationType"], n["threshold"], n["subscriberSnsTopicArns"]) for n in notes] == [
        ("ACTUAL", 50, [prod.notify_topic]), ("ACTUAL", 75, [prod.notify_topic]),
        ("ACTUAL", 90, [prod.notify_topic]), ("ACTUAL", 100, [prod.notify_topic]),
        ("ACTUAL", 110, [action_topic]), ("FORECASTED", 100, [prod.notify_topic])]
    for n in notes:
        assert n["subscriberEmailAddresses"] == ["ml-training@example.com", "finops@example.com"]
    assert prod.one(BUDGET).inputs["limitAmount"] == "650000"


def test_prod_is_patient_and_runs_its_hooks(prod: Built) -> None:
    alarm = prod.one(ALARM, "idle-h100-train").inputs
    # prod's idle_minutes is 30 (issue 35); the low-GPU half still waits at least an hour: 12 x 5 min
    assert (alarm["period"], alarm["evaluationPeriods"], alarm["threshold"]) == (300, 12, 3)
    assert alarm["dimensions"] == {"AutoScalingGroupName": "gpu-prod-h100-train-asg"}
    assert prod.one(ALARM, "idle-eval").inputs["dimensions"] == {"AutoScalingGroupName": "gpu-prod-eval-asg"}
    assert autostop_schedules(prod) == []
    assert not [r for r in prod.all(ROLE) if "autostop-scheduler" in r.name]
    autostop = prod.function("autostop").inputs
    assert autostop["timeout"] == 600 + 60
    assert autostop["environment"]["variables"]["PRE_STOP_TIMEOUT_SECONDS"] == "600"
    assert "MAX_LIFETIME_HOURS" not in autostop["environment"]["variables"]
    statements = check_policy(prod, "gpu-prod-autostop", scales=True, runs_hooks=True)
    assert "autoscaling:DeleteTags" not in actions_of(statements)  # no start schedule to undo a stop
    assert "ec2:DescribeInstances" not in actions_of(statements)  # no lifetime check
    spot = prod.function("spot_interruption").inputs
    assert spot["timeout"] == 100 + 30
    assert spot["environment"]["variables"]["INTERRUPTION_TIMEOUT_SECONDS"] == "100"
    assert {r.inputs["name"] for r in prod.all(RULE)} == {
        "gpu-prod-idle", "gpu-prod-spot-interruption", "gpu-prod-spot-rebalance", "gpu-prod-job-restart"}
    check_policy(prod, "gpu-prod-budget-action", scales=True, runs_hooks=False)
    check_policy(prod, "gpu-prod-spot-interruption", scales=False, runs_hooks=True)


def test_staging_stops_at_night_in_its_region(staging: Built) -> None:
    schedules = {s.inputs["name"]: s.inputs for s in autostop_schedules(staging)}
    assert list(schedules) == ["gpu-staging-stop"]
    stop = schedules["gpu-staging-stop"]
    assert (stop["scheduleExpression"], stop["scheduleExpressionTimezone"]) == (
        "cron(0 22 ? * * *)", "America/Los_Angeles")
    assert json.loads(stop["target"]["input"])["resources"][1] == (
        f"arn:aws:events:us-west-2:{MOCK_ACCOUNT}:rule/gpu-staging-stop")
    utilisation = staging.one(ALARM, IDLE).inputs
    assert utilisation["period"] * utilisation["evaluationPeriods"] == 3600
    for fn in ("gpu-staging-budget-action", "gpu-staging-autostop", "gpu-staging-spot-interruption"):
        check_policy(staging, fn, scales=fn != "gpu-staging-spot-interruption",
                     runs_hooks=fn != "gpu-staging-budget-action")


# ------------------------------------------------------------------ variants


@pytest.mark.parametrize(("period", "expression"), [("weekly", "cron(0 8 ? * MON *)"),
                                                    ("monthly", "cron(0 8 L * ? *)")])
def test_the_spend_report_reads_and_publishes_only(base_config: dict[str, Any], period: str,
                                                    expression: str) -> None:
    built = build(spec_of(base_config, budget={"monthly_limit_usd": 700, "report": period},
                          autostop={"gpu_utilization_threshold_percent": 7.5}))
    fn = built.function("report").inputs
    assert fn["name"] == "test-spend-report"
    assert fn["environment"]["variables"] == {
        "GPUCLUSTER_STACK": "organization/gpucluster/case/test", "NOTIFY_TOPIC_ARN": built.notify_topic,
        "REPORT_PERIOD": period,
        "MONTHLY_LIMIT_USD": "700", "IDLE_THRESHOLD_PERCENT": "7.5",
        "GPU_METRIC_NAMESPACE": "gpucluster/test"}
    rule = built.one(RULE, "report-rule").inputs
    assert (rule["name"], rule["scheduleExpression"]) == ("test-spend-report", expression)
    target = built.one(TARGET, "report-target").inputs
    assert target["arn"] == built.arn(FUNCTION, "report-handler-function")
    permission = built.one(PERMISSION, "report-permission").inputs
    assert (permission["principal"], permission["sourceArn"]) == ("events.amazonaws.com",
                                                                  built.arn(RULE, "report-rule"))
    statements = built.policy("test-spend-report")
    assert [s["Sid"] for s in statements] == ["WriteOwnLogs", "DescribeOnlyStar", "Notify", "EncryptForTopic"]
    assert actions_of(statements, "*") == {"autoscaling:DescribeAutoScalingGroups", "ce:GetCostAndUsage",
                                           "ce:GetCostForecast", "cloudwatch:GetMetricData"}
    # no report without the key: it is opt-in
    plain = build(spec_of(base_config, budget={"monthly_limit_usd": 700}))
    assert [r for r in plain.all(FUNCTION) if r.inputs["handler"] == gl.HANDLERS["report"]] == []


def test_nothing_is_built_without_budget_autostop_or_spot(base_config: dict[str, Any]) -> None:
    group = {**base_config["gpucluster:node_groups"][0], "capacity": {"spot_percent": 0}}
    built = build(spec_of(base_config, node_groups=[group]), restart_jobs=False)
    assert [r.type for r in built.resources] == ["gpucluster:index:Guardrails"]


def test_budget_without_action_or_emails_only_alerts_the_topic(base_config: dict[str, Any]) -> None:
    group = {**base_config["gpucluster:node_groups"][0], "capacity": {"spot_percent": 0}}
    built = build(spec_of(base_config, node_groups=[group], budget={"monthly_limit_usd": 2.5}),
                  restart_jobs=False)
    notes = built.one(BUDGET).inputs["notifications"]
    assert [(n["notificationType"], n["threshold"]) for n in notes] == [
        ("ACTUAL", 50), ("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100)]
    assert all(n["subscriberSnsTopicArns"] == [built.notify_topic] for n in notes)
    assert all("subscriberEmailAddresses" not in n for n in notes)
    assert built.one(BUDGET).inputs["limitAmount"] == "2.50"
    assert built.all(FUNCTION) == [] and len(built.all(TOPIC)) == 1
    # the topic's one subscriber is the stack's notifications address (base config), not a budget one
    assert [r.inputs["endpoint"] for r in built.all(SUBSCRIPTION)] == ["ml@example.com"]


def test_spot_without_a_hook_only_notifies_on_warnings(base_config: dict[str, Any]) -> None:
    built = build(spec_of(base_config), restart_jobs=False)  # spot_percent 100, no spot section
    assert [r.inputs["name"] for r in built.all(RULE)] == ["test-spot-interruption"]
    fn = built.function("spot_interruption").inputs
    assert fn["environment"]["variables"] == {"GPUCLUSTER_STACK": "organization/gpucluster/case/test",
                                              "NOTIFY_TOPIC_ARN": built.notify_topic}
    assert fn["timeout"] == 60
    check_policy(built, "test-spot-interruption", scales=False, runs_hooks=False)


def test_every_group_gets_an_alarm_and_every_role_names_every_group(base_config: dict[str, Any]) -> None:
    groups = [{**base_config["gpucluster:node_groups"][0], "name": name} for name in ("small", "big")]
    spec = spec_of(base_config, node_groups=groups, autostop={"enabled": True, "idle_minutes": 7},
                   budget={"monthly_limit_usd": 100, "action_threshold_percent": 100})
    built = build(spec)
    alarms = {a.inputs["dimensions"]["NodeGroup"]: a.inputs for a in built.all(ALARM) if "no-jobs" in a.name}
    assert set(alarms) == {"small", "big"}
    for alarm in alarms.values():
        assert (alarm["period"], alarm["evaluationPeriods"]) == (60, 7)
    pattern = json.loads(built.one(RULE, "idle-rule").inputs["eventPattern"])
    assert sorted(pattern["resources"]) == sorted(
        built.arn(COMPOSITE, f"composite-{n}") for n in ("small", "big"))
    check_policy(built, "test-budget-action", scales=True, runs_hooks=False)
    check_policy(built, "test-autostop", scales=True, runs_hooks=False)
    assert built.function("autostop").inputs["timeout"] == 120


def test_each_node_group_needs_its_target(base_config: dict[str, Any]) -> None:
    spec = spec_of(base_config)
    with pytest.raises(KeyError, match="gpu"):
        guardrails_args(spec, {"other": ("a", "b")})


# ------------------------------------------------- contract with the handlers


@pytest.fixture(scope="module")
def lambdas() -> Any:
    """The handler package (built on another branch); these checks run once both are merged."""
    return pytest.importorskip("gpucluster.fleet.deployment")


def test_handlers_and_state_tags_match_the_lambda_package(lambdas: Any) -> None:
    from gpucluster.fleet import tags

    assert lambdas.HANDLERS == gl.HANDLERS
    assert tags.STATE_TAGS == gl.STATE_TAGS
    assert tags.STACK_TAG == g.STACK_TAG
    for handler in gl.HANDLERS.values():
        assert (gl.LAMBDA_DIR / f"{handler.split('.')[1]}.py").is_file()


def test_environment_and_iam_cover_what_each_handler_reads_and_calls(
        lambdas: Any, base_config: dict[str, Any]) -> None:
    everything = spec_of(
        base_config, budget={"monthly_limit_usd": 100, "action_threshold_percent": 100, "report": "weekly",
                             "max_usd_per_hour": 50},
        autostop={"enabled": True, "stop_schedule": "cron(0 19 ? * * *)",
                  "start_schedule": "cron(0 8 ? * MON-FRI *)", "max_lifetime_hours": 12,
                  "pre_stop_command": "/hook"},
        spot={"interruption_command": "/hook"},
        node_groups=[*base_config["gpucluster:node_groups"], BLOCK_GROUP])
    built = build(everything)
    for module, names in lambdas.ENVIRONMENT.items():
        fn = built.function(module).inputs
        assert set(fn["environment"]["variables"]) == set(names), module
        assert actions_of(built.policy(fn["name"])) >= set(lambdas.IAM_ACTIONS[module]), module


def test_the_autostop_handler_reads_schedule_and_alarm_events_as_wired(
        lambdas: Any, dev: Built) -> None:
    autostop = pytest.importorskip("gpucluster.lambdas.autostop")
    for schedule in autostop_schedules(dev):
        event = json.loads(schedule.inputs["target"]["input"])
        assert autostop.schedule_rule_name(event) == schedule.inputs["name"]
    assert autostop.IDLE_ALARM_SUFFIX == ge.IDLE_ALARM_SUFFIX
    composite = dev.one(COMPOSITE).inputs
    # A composite alarm's event carries its rule, no metric (CloudWatch user guide, "Alarm events
    # and EventBridge"): the group comes from the name.
    detail = {"alarmName": composite["alarmName"], "state": {"value": "ALARM"},
              "configuration": {"alarmRule": composite["alarmRule"], "description": "x"}}
    assert autostop.alarm_group_names(detail) == ["gpu-dev-dev-a10-asg"]



# ----------------------------------------------------------- Capacity Block expiry (issue 15)

BLOCK = "cr-0123456789abcdef0"
BLOCK_GROUP = {"name": "block", "instance_types": ["p5.48xlarge"], "min_nodes": 0, "desired_nodes": 2,
               "max_nodes": 2, "availability_zones": ["us-east-1a"], "efa": "on", "placement_group": False,
               "capacity": {"market": "capacity_block", "capacity_reservation_id": BLOCK}}


def test_a_block_backed_group_is_stopped_before_its_block_ends(base_config: dict[str, Any]) -> None:
    spec = spec_of(base_config, node_groups=[*base_config["gpucluster:node_groups"], BLOCK_GROUP],
                   autostop={"enabled": False, "pre_stop_command": "/opt/ckpt",
                             "pre_stop_timeout_seconds": 600})
    built = build(spec)
    rule = built.one(RULE, "blocks-rule").inputs
    assert rule["name"] == "test-capacity-block-expiry"
    # EC2 user guide, "Monitor Capacity Blocks using EventBridge"
    assert json.loads(rule["eventPattern"]) == {
        "source": ["aws.ec2"],
        "detail-type": ["Capacity Block Reservation Expiration Warning", "Capacity Block Expiration Warning"],
        "detail": {"capacity-reservation-id": [BLOCK]}}
    fn = built.function("capacity_block").inputs
    env = fn["environment"]["variables"]
    assert json.loads(env["CAPACITY_BLOCK_GROUPS"]) == {BLOCK: [asg_name(spec, "block")]}
    assert (env["PRE_STOP_COMMAND"], env["PRE_STOP_TIMEOUT_SECONDS"]) == ("/opt/ckpt", "480")  # 10 min budget
    assert fn["timeout"] == 480 + 60
    statements = built.policy(fn["name"])
    scale = next(s for s in statements if s["Sid"] == "ScaleThisStacksGroups")
    assert scale["Resource"] == [asg_arn(spec, "block")]             # only the block's group
    assert "autoscaling:DeleteTags" not in actions_of(statements)
    assert {"ssm:SendCommand", "sns:Publish"} <= actions_of(statements)
    target = next(r for r in built.all("aws:cloudwatch/eventTarget:EventTarget")
                  if "-blocks-" in r.name).inputs
    assert target["rule"] == "test-capacity-block-expiry"
    invoke = next(r for r in built.all("aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig")
                  if "-blocks-" in r.name).inputs
    assert invoke["maximumEventAgeInSeconds"] == 600


def test_no_block_expiry_guardrail_without_a_block(dev: Built, prod: Built) -> None:
    for built in (dev, prod):
        assert not [r for r in built.all(RULE) if "-blocks-" in r.name or "capacity-block" in r.name]
        assert not [r for r in built.all(FUNCTION) if r.inputs["handler"] == gl.HANDLERS["capacity_block"]]


TABLE = "aws:dynamodb/table:Table"


def test_the_guard_state_table_is_protected_encrypted_and_named_from_the_identity(dev: Built) -> None:
    table = dev.one(TABLE)
    inputs = table.inputs
    assert inputs["name"] == state_table_name(DEV_IDENTITY)
    assert (inputs["hashKey"], inputs["rangeKey"]) == ("stack", "group")
    assert inputs["billingMode"] == "PAY_PER_REQUEST"
    assert inputs["serverSideEncryption"] == {"enabled": True, "kmsKeyArn": dev.arn(KEY)}
    assert inputs["pointInTimeRecovery"] == {"enabled": True}
    assert inputs["deletionProtectionEnabled"] is True
    assert inputs["tags"]["gpucluster:stack"] == DEV_IDENTITY


def test_only_the_stopping_handlers_reach_the_table_and_only_this_stacks_items(dev: Built) -> None:
    table_arn = dev.arn(TABLE)
    for module in ("budget_action", "autostop", "spot_interruption", "job_restart"):
        fn = dev.function(module).inputs
        state = [s for s in dev.policy(fn["name"]) if s["Sid"] == "GuardStateOfThisStack"]
        if module in ("spot_interruption", "job_restart"):
            assert state == [] and "GUARD_STATE_TABLE" not in fn["environment"]["variables"], module
            continue
        assert state == [{"Sid": "GuardStateOfThisStack", "Effect": "Allow",
                          "Action": ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"],
                          "Resource": [table_arn],
                          "Condition": {"ForAllValues:StringEquals": {
                              "dynamodb:LeadingKeys": [DEV_IDENTITY]}}}]
        key = next(s for s in dev.policy(fn["name"]) if s["Sid"] == "GuardStateKeyThroughDynamoDB")
        assert key["Resource"] == [dev.arn(KEY)]
        assert key["Condition"] == {"StringEquals": {"kms:ViaService": "dynamodb.us-east-1.amazonaws.com"}}


def test_each_function_has_errors_throttles_and_delivery_failure_alarms_to_the_topic(dev: Built) -> None:
    watched = {}
    for alarm in dev.all(ALARM):
        a = alarm.inputs
        if a.get("namespace") != "AWS/Lambda":
            continue
        watched.setdefault(a["dimensions"]["FunctionName"], set()).add(a["metricName"])
        assert a["alarmActions"] == [dev.notify_topic]
        assert (a["threshold"], a["comparisonOperator"], a["treatMissingData"]) == (
            0, "GreaterThanThreshold", "notBreaching")
    functions = {r.inputs["name"] for r in dev.all(FUNCTION)}
    assert set(watched) == functions
    assert all(m == {"Errors", "Throttles", "DestinationDeliveryFailures"} for m in watched.values())
