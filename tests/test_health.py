"""GPU health checks under the mock engine: the launch hook on every group, and a role per group
whose health permission reaches that group only (its documents evaluated as IAM would)."""

from __future__ import annotations

import base64
import copy
import gzip
import json
from typing import Any

import pytest

from base_config import BASE_CONFIG, plan_config
from gpucluster.aws.health import node_health_statements
from gpucluster.names import autoname
from gpucluster.node.userdata import LAUNCH_HOOK_NAME
from gpucluster.noderole import longest_health_policy, policy_chars
from gpucluster.plan import MOCK_ACCOUNT, Plan, PlannedResource
from iam_eval import allowed
from shipped import planned_config, shipped_plan

ASG = "aws:autoscaling/group:Group"
HOOK = "aws:autoscaling/lifecycleHook:LifecycleHook"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
PROFILE = "aws:iam/instanceProfile:InstanceProfile"
TOPIC = "aws:sns/topic:Topic"
KEY = "aws:kms/key:Key"


def two_groups(**health: Any) -> dict[str, Any]:
    """The base stack with a second group, both with these health settings, and a budget (a topic)."""
    config = copy.deepcopy(BASE_CONFIG)
    first = config["gpucluster:node_groups"][0]
    second = {**copy.deepcopy(first), "name": "infer", "instance_types": ["g6e.12xlarge"]}
    for group in (first, second):
        group["health_checks"] = health
    config["gpucluster:node_groups"] = [first, second]
    config["gpucluster:budget"] = {"monthly_limit_usd": 1000}
    return config


@pytest.fixture(scope="module")
def plan() -> Plan:
    return plan_config(two_groups(interval_minutes=2, launch_timeout_minutes=20))


def by_name(plan: Plan, type_token: str, suffix: str) -> PlannedResource:
    [found] = [r for r in plan.of_type(type_token) if r.name.endswith(suffix)]
    return found


def asg_of(plan: Plan, group: str) -> PlannedResource:
    return by_name(plan, ASG, f"-{group}-asg")


def arn(r: PlannedResource) -> str:
    """The ARN the mock engine gives a resource (gpucluster.plan.PlanMocks)."""
    return f"arn:aws:{r.type.split(':')[1].split('/')[0]}:us-east-1:{MOCK_ACCOUNT}:{r.name}"


def role_documents(plan: Plan, role: PlannedResource) -> list[dict[str, Any]]:
    """Every inline policy attached to `role` (by its physical name or id, as the components pass it)."""
    names = {autoname(role.name), f"{role.name}-id"}
    return [json.loads(p.inputs["policy"]) for p in plan.of_type(ROLE_POLICY) if p.inputs["role"] in names]


def group_role(plan: Plan, group: str) -> PlannedResource:
    """The role inside the instance profile the group's launch template names."""
    profile_arn = by_name(plan, LT, f"-{group}-lt").inputs["iamInstanceProfile"]["arn"]
    [profile] = [p for p in plan.of_type(PROFILE) if profile_arn.endswith(f":{p.name}")]
    [role] = [r for r in plan.of_type(ROLE) if autoname(r.name) == profile.inputs["role"]]
    return role


def user_data(plan: Plan, group: str) -> str:
    return gzip.decompress(base64.b64decode(by_name(plan, LT, f"-{group}-lt").inputs["userData"])).decode()


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_gpu_group_holds_new_nodes_for_their_launch_check(stack: str) -> None:
    plan = shipped_plan(stack)
    for group in plan.spec.node_groups:
        asg = asg_of(plan, group.name)
        hook = {"name": LAUNCH_HOOK_NAME, "lifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
                "defaultResult": "ABANDON", "heartbeatTimeout": 900}
        # At creation, so the group's very first nodes are held too ...
        assert asg.inputs["initialLifecycleHooks"] == [hook]
        # ... and as a resource of its own afterwards: existing groups get it, timeouts change in place.
        managed = by_name(plan, HOOK, f"-{group.name}-launch-check")
        assert managed.inputs == {**hook, "autoscalingGroupName": autoname(asg.name)}  # its physical name
        assert plan.depends_on(managed, asg)
        assert "initialLifecycleHooks" in asg.ignore_changes  # a changed hook never replaces the group
        assert "GPUCLUSTER_HEALTH_CHECKS=true" in user_data(plan, group.name)


def test_hook_timeout_and_interval_follow_the_settings(plan: Plan) -> None:
    for group in ("gpu", "infer"):
        assert by_name(plan, HOOK, f"-{group}-launch-check").inputs["heartbeatTimeout"] == 1200
        script = user_data(plan, group)
        assert "OnUnitActiveSec=2min" in script and "GPUCLUSTER_HEALTH_LAUNCH_TIMEOUT_SECONDS=1200" in script
    assert "GPUCLUSTER_HEALTH_EXPECTED_GPUS=g6e.12xlarge=4" in user_data(plan, "infer")


def test_group_metrics_are_on_for_the_dashboard(plan: Plan) -> None:
    asg = asg_of(plan, "gpu").inputs
    assert asg["metricsGranularity"] == "1Minute"
    assert {"GroupDesiredCapacity", "GroupInServiceInstances"} <= set(asg["enabledMetrics"])


def test_each_group_runs_as_a_role_of_its_own(plan: Plan) -> None:
    gpu, infer = group_role(plan, "gpu"), group_role(plan, "infer")
    assert gpu.name != infer.name
    # The first group keeps the name of the stack's former shared identity: existing stacks keep the role.
    assert gpu.name == "test-node-identity-role" and infer.name == "test-infer-node-role"
    for role in (gpu, infer):  # each carries the dataset access the shared one had
        assert any(d["Statement"][0]["Sid"] == "FindOwnGroup" for d in role_documents(plan, role))


@pytest.mark.parametrize("action", ["autoscaling:SetInstanceHealth", "autoscaling:CompleteLifecycleAction"])
def test_a_node_reports_health_for_its_own_group_only(plan: Plan, action: str) -> None:
    # The identity the groups really carry: <org>/<project>/<stack>/<cluster>.
    assert plan.spec.identity == "organization/gpucluster/t/test"
    tags = {group: {"autoscaling:ResourceTag/gpucluster:stack": plan.spec.identity,
                    "autoscaling:ResourceTag/gpucluster:node-group": group} for group in ("gpu", "infer")}
    for group in ("gpu", "infer"):  # the tags the conditions read are the groups' own
        asg_tags = {t["key"]: t["value"] for t in asg_of(plan, group).inputs["tags"]}
        assert {k.split("/", 1)[1]: v for k, v in tags[group].items()}.items() <= asg_tags.items()
    for mine, other in (("gpu", "infer"), ("infer", "gpu")):
        docs = role_documents(plan, group_role(plan, mine))
        own_arn, other_arn = arn(asg_of(plan, mine)), arn(asg_of(plan, other))
        assert allowed(docs, None, action, own_arn, **tags[mine])
        assert not allowed(docs, None, action, other_arn, **tags[other])
        # Its own group's ARN, but re-tagged into another stack or group: refused too.
        assert not allowed(docs, None, action, own_arn, **{**tags[mine],
                                                           "autoscaling:ResourceTag/gpucluster:stack": "x"})
        assert not allowed(docs, None, action, own_arn, **tags[other])
        assert not allowed(docs, None, "autoscaling:UpdateAutoScalingGroup", own_arn, **tags[mine])
        assert not allowed(docs, None, "autoscaling:TerminateInstanceInAutoScalingGroup", own_arn,
                           **tags[mine])


def test_health_events_go_to_the_clusters_namespace_and_the_stacks_topic_only(plan: Plan) -> None:
    docs = role_documents(plan, group_role(plan, "gpu"))
    topic = plan.of_type(TOPIC)
    [guardrail_topic] = [t for t in topic if t.name.endswith("-notify-topic")]
    # the guardrail topic's key (the VPC flow-log group has a key of its own)
    [key] = [k for k in plan.of_type(KEY) if "flow-logs" not in k.name]
    put = "cloudwatch:PutMetricData"
    assert allowed(docs, None, put, "*", **{"cloudwatch:namespace": "gpucluster/test"})
    assert not allowed(docs, None, put, "*", **{"cloudwatch:namespace": "gpucluster/other"})
    assert allowed(docs, None, "sns:Publish", arn(guardrail_topic))
    assert not allowed(docs, None, "sns:Publish", "arn:aws:sns:us-east-1:123456789012:someone-elses")
    assert allowed(docs, None, "kms:GenerateDataKey", arn(key),
                   **{"kms:ViaService": "sns.us-east-1.amazonaws.com"})
    assert not allowed(docs, None, "kms:Decrypt", arn(key),
                       **{"kms:ViaService": "s3.us-east-1.amazonaws.com"})
    # The nodes are told the same topic the policy names.
    assert f"GPUCLUSTER_NOTIFY_TOPIC_ARN={arn(guardrail_topic)}" in user_data(plan, "gpu")


def test_the_only_star_is_finding_the_group(plan: Plan) -> None:
    for doc in role_documents(plan, group_role(plan, "gpu")):
        for s in doc["Statement"]:
            if s["Resource"] == "*" and s["Sid"] in ("FindOwnGroup", "CountHealthEvents"):
                assert s["Action"] in (["autoscaling:DescribeAutoScalingInstances"],
                                       ["cloudwatch:PutMetricData"])
                assert s["Sid"] == "FindOwnGroup" or "Condition" in s


def test_notify_mode_cannot_mark_nodes_unhealthy() -> None:
    plan = plan_config(two_groups(on_failure="notify"))
    docs = role_documents(plan, group_role(plan, "gpu"))
    tags = {"autoscaling:ResourceTag/gpucluster:stack": plan.spec.identity,
            "autoscaling:ResourceTag/gpucluster:node-group": "gpu"}
    group_arn = arn(asg_of(plan, "gpu"))
    assert not allowed(docs, None, "autoscaling:SetInstanceHealth", group_arn, **tags)
    assert allowed(docs, None, "autoscaling:CompleteLifecycleAction", group_arn, **tags)


def test_nodes_publish_only_to_their_stacks_topic() -> None:
    """Even with no budget, auto-stop or spot guardrail the stack has its topic (the job-restart
    Lambda's): the health policy names that one topic and nothing else."""
    config = copy.deepcopy(BASE_CONFIG)
    config["gpucluster:node_groups"][0]["capacity"] = {"spot_percent": 0}
    plan = planned_config(config)
    [topic] = plan.of_type(TOPIC)
    docs = role_documents(plan, group_role(plan, "gpu"))
    publish = [s["Resource"] for d in docs for s in d["Statement"] if "sns:Publish" in s["Action"]]
    topic_arn = f"arn:aws:sns:us-east-1:123456789012:{topic.name}"  # the mock engine's topic ARN
    assert publish == [[topic_arn]]
    assert f"GPUCLUSTER_NOTIFY_TOPIC_ARN={topic_arn}\n" in user_data(plan, "gpu")


def test_a_stuck_alarm_without_other_guardrails_notifies_the_stacks_topic() -> None:
    """No budget, auto-stop or spot: the stack still has its topic (the job-restart Lambda's), so
    the spec accepts a stuck-job alarm and the alarm notifies that topic."""
    config = copy.deepcopy(BASE_CONFIG)
    config.pop("gpucluster:budget", None)
    config["gpucluster:autostop"] = {"enabled": False}
    config["gpucluster:node_groups"][0]["capacity"] = {"spot_percent": 0}
    config["gpucluster:node_groups"][0]["health_checks"] = {"stuck_alarm_minutes": 30}
    plan = plan_config(config)
    [topic] = plan.of_type(TOPIC)
    [alarm] = [a for a in plan.of_type("aws:cloudwatch/metricAlarm:MetricAlarm") if "stuck" in a.name]
    assert alarm.inputs["alarmActions"] == [f"arn:aws:sns:us-east-1:123456789012:{topic.name}"]


def test_turned_off_there_is_no_hook_and_no_permission() -> None:
    plan = plan_config(two_groups(enabled=False))
    assert plan.of_type(HOOK) == []
    assert "initialLifecycleHooks" not in asg_of(plan, "gpu").inputs
    assert not any(p.name.endswith("-health") for p in plan.of_type(ROLE_POLICY))
    assert "GPUCLUSTER_HEALTH_CHECKS=false" in user_data(plan, "gpu")


def test_statements_are_pure_and_name_the_group() -> None:
    group_arn = "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:u:autoScalingGroupName/g"
    statements = node_health_statements(asg_arn=group_arn, identity="s", group="g", namespace="gpucluster/c",
                                        region="us-east-1", replace=True)
    [report] = [s for s in statements if s["Sid"] == "ReportOwnHealth"]
    assert report == {"Sid": "ReportOwnHealth", "Effect": "Allow",
                      "Action": ["autoscaling:CompleteLifecycleAction", "autoscaling:SetInstanceHealth"],
                      "Resource": [group_arn], "Condition": {"StringEquals": {
                          "autoscaling:ResourceTag/gpucluster:stack": "s",
                          "autoscaling:ResourceTag/gpucluster:node-group": "g"}}}


def test_the_spec_sizes_each_health_policy_at_least_as_long_as_it_deploys(plan: Plan) -> None:
    """The node role size check counts the group's health policy with every ARN at its longest."""
    for group in ("gpu", "infer"):
        [deployed] = [json.loads(p.inputs["policy"]) for p in plan.of_type(ROLE_POLICY)
                      if p.name == f"test-{group}-health"]
        bound = longest_health_policy(identity=plan.spec.identity, cluster_name="test", group=group,
                                      region="us-east-1", replace=True)
        assert [s["Sid"] for s in bound["Statement"]] == [s["Sid"] for s in deployed["Statement"]]
        assert policy_chars(bound) >= policy_chars(deployed)
