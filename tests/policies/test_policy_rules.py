"""Each rule on props that pass and props that fail, written with the engine's input names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpucluster.policy.records import UNKNOWN, Resource, Stack
from gpucluster.policy.rules import rules_by_name

RULES = rules_by_name()
FULL = {"owner": "ml", "cost_center": "cc-1", "environment": "dev"}


def res(type_: str, name: str = "r", *, protect: bool = False, retain: bool = False,
        deps: dict[str, tuple[str, ...]] | None = None, **props: Any) -> Resource:
    """A record as `gpucluster plan` makes one: referenced by `<name>-id` and its name."""
    return Resource(type=type_, name=name, props=props, urn=f"urn:{type_}::{name}", protect=protect,
                    retain_on_delete=retain, ids=(f"{name}-id", name), deps=deps or {})


def resource_messages(policy: str, resource: Resource, config: dict[str, Any] | None = None) -> list[str]:
    rule = RULES[policy]
    return list(rule.check(resource, rule.settings(config)))


def stack_messages(policy: str, resources: list[Resource],
                   config: dict[str, Any] | None = None) -> list[tuple[str | None, str]]:
    rule = RULES[policy]
    return [(r.name if r else None, m) for r, m in rule.check(Stack(resources), rule.settings(config))]


LT = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
ASG = "aws:autoscaling/group:Group"
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_OUT = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
PG = "aws:ec2/placementGroup:PlacementGroup"
BUCKET = "aws:s3/bucket:Bucket"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
BPOLICY = "aws:s3/bucketPolicy:BucketPolicy"
BACL = "aws:s3/bucketAcl:BucketAcl"
VERSIONING = "aws:s3/bucketVersioning:BucketVersioning"
BUDGET = "aws:budgets/budget:Budget"
BUDGET_ACTION = "aws:budgets/budgetAction:BudgetAction"
TOPIC = "aws:sns/topic:Topic"
SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"

SPEC_LT = [{"resourceType": kind, "tags": FULL} for kind in ("instance", "volume")]
ADMIN = json.dumps({"Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})


def doc(*statements: dict[str, Any]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


# -------------------------------------------------------------- resource rules

RESOURCE_CASES: list[tuple[str, Resource, str | None]] = [
    # required-cost-tags
    ("required-cost-tags", res(BUCKET, tags=FULL), None),
    ("required-cost-tags", res(BUCKET, tags={**FULL, "owner": ""}), "missing cost tags: owner"),
    ("required-cost-tags", res("aws:ec2/vpc:Vpc", cidrBlock="10.0.0.0/16"),
     "missing cost tags: owner, cost_center, environment"),
    ("required-cost-tags", res("aws:ec2/route:Route", routeTableId="rt-1"), None),
    ("required-cost-tags", res("aws:ecr/repository:Repository", tags={"owner": "ml"}),
     "missing cost tags: cost_center, environment"),
    ("required-cost-tags", res(ASG, tags=[{"key": k, "value": v, "propagateAtLaunch": True}
                                          for k, v in FULL.items()]), None),
    ("required-cost-tags", res(ASG, tags=[{"key": "owner", "value": "ml", "propagateAtLaunch": True}]),
     "missing cost tags: cost_center, environment"),
    ("required-cost-tags", res(BUCKET, tags=UNKNOWN), None),
    ("required-cost-tags", res(BUCKET, tags={**FULL, "cost_center": UNKNOWN}), None),
    ("required-cost-tags", res(LT, tags=FULL, tagSpecifications=SPEC_LT), None),
    ("required-cost-tags", res(LT, tags=FULL, tagSpecifications=SPEC_LT[1:]),
     "tagSpecifications has no `instance` entry, so launched instances carry no cost tags"),
    ("required-cost-tags", res(LT, tags=FULL, tagSpecifications=[
        SPEC_LT[0], {"resourceType": "volume", "tags": {"owner": "ml"}}]),
     "tagSpecifications `volume` is missing cost tags: cost_center, environment"),
    ("required-cost-tags", res("gpucluster:cluster:GpuCluster"), None),
    # imdsv2-required
    ("imdsv2-required", res(LT, metadataOptions={"httpTokens": "required"}), None),
    ("imdsv2-required", res(LT, metadataOptions={"httpTokens": "optional"}),
     "httpTokens is 'optional', not 'required'"),
    ("imdsv2-required", res(LT), "httpTokens is not set"),
    ("imdsv2-required", res(INSTANCE, metadataOptions={"httpTokens": "required"}), None),
    ("imdsv2-required", res(INSTANCE, metadataOptions={"httpEndpoint": "enabled"}), "httpTokens is not set"),
    ("imdsv2-required", res(LT, metadataOptions={"httpTokens": UNKNOWN}), None),
    ("imdsv2-required", res(BUCKET), None),
    # no-public-ip-on-gpu-nodes
    ("no-public-ip-on-gpu-nodes", res(LT, networkInterfaces=[
        {"deviceIndex": 0.0, "associatePublicIpAddress": "false"}]), None),
    ("no-public-ip-on-gpu-nodes", res(LT, networkInterfaces=[
        {"deviceIndex": 0.0}, {"deviceIndex": 1.0, "associatePublicIpAddress": "true"}]),
     "networkInterfaces[1].associatePublicIpAddress is true"),
    ("no-public-ip-on-gpu-nodes", res(INSTANCE, associatePublicIpAddress=True),
     "associatePublicIpAddress is true"),
    ("no-public-ip-on-gpu-nodes", res(INSTANCE, associatePublicIpAddress=False), None),
    ("no-public-ip-on-gpu-nodes", res(LT, networkInterfaces=UNKNOWN), None),
    # encrypted-volumes
    ("encrypted-volumes", res(LT, blockDeviceMappings=[
        {"deviceName": "/dev/xvda", "ebs": {"encrypted": "true", "volumeSize": 200.0}},
        {"deviceName": "/dev/sdb", "virtualName": "ephemeral0"}]), None),
    ("encrypted-volumes", res(LT, blockDeviceMappings=[
        {"deviceName": "/dev/xvda", "ebs": {"encrypted": "false"}}]),
     "blockDeviceMappings[0] (/dev/xvda) has ebs.encrypted unset or false"),
    ("encrypted-volumes", res(LT, blockDeviceMappings=[
        {"deviceName": "/dev/xvda", "ebs": {"volumeSize": 9.0}}]),
     "ebs.encrypted unset or false"),
    ("encrypted-volumes", res(LT, imageId="ami-1"), "no blockDeviceMappings"),
    ("encrypted-volumes", res("aws:ebs/volume:Volume", encrypted=True, size=10.0), None),
    ("encrypted-volumes", res("aws:ebs/volume:Volume", size=10.0), "encrypted is unset or false"),
    ("encrypted-volumes", res(INSTANCE, rootBlockDevice={"encrypted": True}), None),
    ("encrypted-volumes", res(INSTANCE, rootBlockDevice={"encrypted": False}),
     "rootBlockDevice.encrypted is unset or false"),
    ("encrypted-volumes", res(INSTANCE, rootBlockDevice={"encrypted": True},
                              ebsBlockDevices=[{"deviceName": "/dev/sdf"}]),
     "ebsBlockDevices[0].encrypted is unset or false"),
    # no-open-ingress
    ("no-open-ingress", res(SG, ingress=[{"protocol": "tcp", "fromPort": 22.0, "toPort": 22.0,
                                          "cidrBlocks": ["0.0.0.0/0"]}]), "ingress[0] admits 0.0.0.0/0"),
    ("no-open-ingress", res(SG, ingress=[{"protocol": "-1", "ipv6CidrBlocks": ["::/0"]}]),
     "ingress[0] admits ::/0"),
    ("no-open-ingress", res(SG, ingress=[{"protocol": "-1", "self": True}],
                            egress=[{"protocol": "-1", "cidrBlocks": ["0.0.0.0/0"]}]), None),
    ("no-open-ingress", res(SG_IN, cidrIpv4="0.0.0.0/0", ipProtocol="tcp"), "cidrIpv4 is 0.0.0.0/0"),
    ("no-open-ingress", res(SG_IN, cidrIpv6="::/0", ipProtocol="-1"), "cidrIpv6 is ::/0"),
    ("no-open-ingress", res(SG_IN, cidrIpv4="10.0.0.0/16", ipProtocol="tcp"), None),
    ("no-open-ingress", res(SG_OUT, cidrIpv4="0.0.0.0/0", ipProtocol="tcp"), None),
    ("no-open-ingress", res(SG_RULE, type="ingress", cidrBlocks=["10.0.0.0/8", "0.0.0.0/0"]),
     "ingress rule admits 0.0.0.0/0"),
    ("no-open-ingress", res(SG_RULE, type="egress", cidrBlocks=["0.0.0.0/0"]), None),
    # iam-no-wildcard-admin
    ("iam-no-wildcard-admin", res("aws:iam/policy:Policy", policy=ADMIN),
     "policy Statement[0] allows Action '*' on Resource '*'"),
    ("iam-no-wildcard-admin", res("aws:iam/rolePolicy:RolePolicy", policy=doc(
        {"Effect": "Allow", "Action": ["s3:GetObject", "*"], "Resource": ["arn:aws:s3:::b", "*"]})),
     "allows Action '*' on Resource '*'"),
    ("iam-no-wildcard-admin", res("aws:iam/rolePolicy:RolePolicy", policy=doc(
        {"Effect": "Allow", "Action": "*", "Resource": "arn:aws:s3:::b/*"})), None),
    ("iam-no-wildcard-admin", res("aws:iam/policy:Policy", policy=doc(
        {"Effect": "Allow", "Action": "ec2:Describe*", "Resource": "*"})), None),
    ("iam-no-wildcard-admin", res("aws:iam/policy:Policy", policy=doc(
        {"Effect": "Deny", "Action": "*", "Resource": "*"})), None),
    ("iam-no-wildcard-admin", res("aws:iam/policy:Policy", policy=doc(
        {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"})), "allows NotAction on Resource '*'"),
    ("iam-no-wildcard-admin", res("aws:iam/role:Role", inlinePolicies=[{"name": "x", "policy": ADMIN}]),
     "inlinePolicies[0].policy Statement[0] allows Action '*'"),
    ("iam-no-wildcard-admin", res("aws:iam/role:Role", managedPolicyArns=[
        "arn:aws:iam::aws:policy/AdministratorAccess"]), "managedPolicyArns attaches"),
    ("iam-no-wildcard-admin", res("aws:iam/rolePolicyAttachment:RolePolicyAttachment",
                                  policyArn="arn:aws-us-gov:iam::aws:policy/AdministratorAccess"),
     "attaches arn:aws-us-gov:iam::aws:policy/AdministratorAccess"),
    ("iam-no-wildcard-admin", res("aws:iam/rolePolicyAttachment:RolePolicyAttachment",
                                  policyArn="arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"), None),
    ("iam-no-wildcard-admin", res("aws:iam/policy:Policy", policy=UNKNOWN), None),
    ("iam-no-wildcard-admin", res("aws:iam/policy:Policy", policy={"Statement": {
        "Effect": "Allow", "Action": "*:*", "Resource": "*"}}), "allows Action '*'"),
]


@pytest.mark.parametrize(("policy", "resource", "expected"), RESOURCE_CASES,
                         ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(RESOURCE_CASES)])
def test_resource_rule(policy: str, resource: Resource, expected: str | None) -> None:
    messages = resource_messages(policy, resource)
    if expected is None:
        assert messages == []
    else:
        assert len(messages) == 1 and expected in messages[0], messages


def test_provider_default_tags_count_as_tags() -> None:
    record = Resource(type=BUCKET, name="b", props={"tags": {"owner": "ml"}},
                      default_tags={"cost_center": "cc-1", "environment": "dev"})
    assert resource_messages("required-cost-tags", record) == []


def test_required_tag_keys_come_from_config() -> None:
    record = res(BUCKET, tags=FULL)
    assert resource_messages("required-cost-tags", record, {"required_tags": ["owner", "team"]}) == [
        "missing cost tags: team"]


# ------------------------------------------------------------ environment limits


def group(name: str, types: list[str], max_size: float, base: float = 0, on_demand_pct: float = 0,
          env: str | None = "dev", market: str | None = None) -> list[Resource]:
    """A node group as aws/nodes.py builds it: a launch template and its Auto Scaling group.

    Mixed market: instance types as overrides and the split in instancesDistribution; a capacity
    block: one type and `capacity-block` market options on the template, no mixed policy.
    """
    tags = {**FULL, "environment": env} if env else {}
    template_ref = {"launchTemplateId": f"{name}-lt-id"}
    if market == "capacity-block":
        lt = res(LT, f"{name}-lt", instanceType=types[0], tags=tags,
                 instanceMarketOptions={"marketType": "capacity-block"})
        return [lt, res(ASG, name, maxSize=max_size, launchTemplate={"id": f"{name}-lt-id"})]
    lt = res(LT, f"{name}-lt", tags=tags)
    return [lt, res(ASG, name, maxSize=max_size, mixedInstancesPolicy={
        "launchTemplate": {"launchTemplateSpecification": template_ref,
                           "overrides": [{"instanceType": t} for t in types]},
        "instancesDistribution": {"onDemandBaseCapacity": base,
                                  "onDemandPercentageAboveBaseCapacity": on_demand_pct}})]


def test_environment_limits_pass_for_small_spot_dev() -> None:
    assert stack_messages("environment-limits", group("a10", ["g5.xlarge", "g6.xlarge"], 2)) == []


def test_environment_limits_dev_on_demand_p5() -> None:
    found = stack_messages("environment-limits", group("h100", ["p5.48xlarge"], 2, base=1))
    assert found == [
        ("h100", "p5.48xlarge is not allowed in dev (allowed: g4dn.*, g5.*, g6.*, g6e.*; see the "
                 "environment-limits policy config)"),
        ("h100", "dev is spot-only, but onDemandBaseCapacity is 1"),
        (None, "at maximum size the stack runs 16 GPUs (h100 2 x 8), over the dev limit of 8"),
    ]


def test_environment_limits_on_demand_above_base_breaks_spot_only() -> None:
    found = stack_messages("environment-limits", group("a10", ["g5.xlarge"], 2, on_demand_pct=30))
    assert found == [("a10", "dev is spot-only, but onDemandPercentageAboveBaseCapacity is 30")]


def test_environment_limits_capacity_block_is_not_spot() -> None:
    found = stack_messages("environment-limits", group("a10", ["g5.xlarge"], 1, market="capacity-block"))
    assert found == [("a10", "dev is spot-only, but it buys a Capacity Block (on-demand capacity)")]


def test_environment_limits_count_gpus_over_all_groups() -> None:
    groups = [*group("a", ["g6e.12xlarge"], 10, env="staging", base=1),
              *group("b", ["g5.12xlarge", "g5.48xlarge"], 4, env="staging", base=4)]
    assert stack_messages("environment-limits", groups) == [
        (None, "at maximum size the stack runs 72 GPUs (a 10 x 4, b 4 x 8), over the staging limit of 64")]


def test_environment_limits_unlisted_environment_gets_the_fallback() -> None:
    found = stack_messages("environment-limits", group("a", ["p4d.24xlarge"], 1, env="qa"))
    assert next(m for _, m in found).startswith("p4d.24xlarge is not allowed in qa")


def test_environment_limits_config_overrides_one_environment() -> None:
    config = {"environments": {"dev": {"allowed_instance_types": ["p5.*"], "max_gpus": 16,
                                       "spot_only": False}}}
    assert stack_messages("environment-limits", group("h", ["p5.48xlarge"], 2, base=2), config) == []
    # staging keeps its defaults
    assert stack_messages("environment-limits", group("h", ["p5en.48xlarge"], 1, env="staging"),
                          config)[0][1].startswith("p5en.48xlarge is not allowed in staging")


def test_environment_limits_read_asg_and_launch_template() -> None:
    lt = res(LT, "lt", instanceType="g5.xlarge", instanceMarketOptions={"marketType": "spot"}, tags=FULL)
    spot = res(ASG, "spot", maxSize=2.0, launchTemplate={"id": "lt-id", "version": "$Latest"}, tags=[])
    assert stack_messages("environment-limits", [lt, spot]) == []
    on_demand_lt = res(LT, "lt", instanceType="g5.xlarge", tags=FULL)
    assert stack_messages("environment-limits", [on_demand_lt, spot]) == [
        ("spot", "dev is spot-only, but it has no mixed-instances policy and no spot market options, "
                 "so every node is on-demand")]


def test_environment_limits_default_on_demand_share_is_100_percent() -> None:
    lt = res(LT, "lt", tags=FULL)
    asg = res(ASG, "g", maxSize=2.0, mixedInstancesPolicy={
        "launchTemplate": {"launchTemplateSpecification": {"launchTemplateId": "lt-id"},
                           "overrides": [{"instanceType": "g6.xlarge"}]}})
    assert stack_messages("environment-limits", [lt, asg]) == [
        ("g", "dev is spot-only, but onDemandPercentageAboveBaseCapacity is 100")]


def test_environment_limits_need_an_environment_tag() -> None:
    assert stack_messages("environment-limits", group("h", ["p5.48xlarge"], 9.0, env=None)) == []


# ------------------------------------------------------------ budget and autostop


def gpu_asg(env: str = "dev") -> list[Resource]:
    return [res(LT, "lt", instanceType="g5.xlarge", tags={**FULL, "environment": env}),
            res(ASG, "gpus", maxSize=2.0, launchTemplate={"id": "lt-id"})]


def budget(**props: Any) -> Resource:
    return res(BUDGET, "budget", budgetType="COST", limitAmount="500", **props)


def notify(*topics: str, emails: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return [{"notificationType": "ACTUAL", "threshold": 100.0, "subscriberSnsTopicArns": list(topics),
             "subscriberEmailAddresses": list(emails)}]


TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:alerts"
BUDGET_CASES: list[tuple[str, list[Resource], list[tuple[str | None, str]]]] = [
    ("no GPU groups, no budget", [res(BUCKET, tags=FULL)], []),
    ("CPU-only group",
     [res(LT, "lt", instanceType="m7i.large"), res(ASG, "cpu", launchTemplate={"id": "lt-id"})], []),
    ("GPU group without budget", gpu_asg(), [(None, "GPU groups (gpus) but no aws:budgets/budget:Budget")]),
    ("e-mail only", [*gpu_asg(), budget(notifications=notify(emails=("a@example.com",)))],
     [("budget", "the budget only notifies: add a BudgetAction or a notification to an SNS topic with a "
                 "Lambda subscription that scales the GPU groups to zero")]),
    ("budget action", [*gpu_asg(), budget(notifications=notify(emails=("a@example.com",))),
                       res(BUDGET_ACTION, "act", budgetName="budget", actionType="RUN_SSM_DOCUMENTS")], []),
    ("budget action for another budget", [*gpu_asg(), budget(notifications=[]),
                                          res(BUDGET_ACTION, "act", budgetName="other-budget")],
     [("budget", "the budget only notifies: add a BudgetAction or a notification to an SNS topic with a "
                 "Lambda subscription that scales the GPU groups to zero")]),
    ("SNS topic with a Lambda subscriber",
     [*gpu_asg(), budget(notifications=notify(TOPIC_ARN)), res(TOPIC, "alerts"),
      res(SUBSCRIPTION, "fn", topic=TOPIC_ARN, protocol="lambda", endpoint="arn:aws:lambda:fn")], []),
    ("SNS topic with only an e-mail subscriber",
     [*gpu_asg(), budget(notifications=notify("alerts-id")), res(TOPIC, "alerts"),
      res(SUBSCRIPTION, "mail", topic="alerts-id", protocol="email", endpoint="a@example.com")],
     [("budget", "the budget only notifies: add a BudgetAction or a notification to an SNS topic with a "
                 "Lambda subscription that scales the GPU groups to zero")]),
    ("topic outside the stack",
     [*gpu_asg(), budget(notifications=notify("arn:aws:sns:us-east-1:1:shared"))], []),
]


@pytest.mark.parametrize(("case", "resources", "expected"), BUDGET_CASES, ids=[c[0] for c in BUDGET_CASES])
def test_gpu_budget_with_action(case: str, resources: list[Resource], expected: list[Any]) -> None:
    assert stack_messages("gpu-budget-with-action", resources) == expected


def test_gpu_instance_counts_as_a_gpu_group() -> None:
    found = stack_messages("gpu-budget-with-action", [res(INSTANCE, "box", instanceType="g4dn.xlarge")])
    assert found == [(None, "GPU groups (box) but no aws:budgets/budget:Budget")]


NO_AUTOSTOP = ("dev stack with GPU groups (gpus) has no auto-stop: no idle alarm (a MetricAlarm below a "
               "threshold, with an action) and no stop schedule")
ALARM_PATTERN = json.dumps({"source": ["aws.cloudwatch"], "detail-type": ["CloudWatch Alarm State Change"],
                            "resources": ["idle-id"], "detail": {"state": {"value": ["ALARM"]}}})
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
AUTOSTOP_CASES: list[tuple[str, list[Resource], list[tuple[str | None, str]]]] = [
    ("dev without auto-stop", gpu_asg(), [(None, NO_AUTOSTOP)]),
    ("prod is exempt", gpu_asg("prod"), []),
    ("idle alarm", [*gpu_asg(), res(ALARM, "idle", comparisonOperator="LessThanThreshold", threshold=5.0,
                                    alarmActions=["arn:aws:sns:x"])], []),
    ("alarm without action", [*gpu_asg(), res(ALARM, "idle", comparisonOperator="LessThanThreshold")],
     [(None, NO_AUTOSTOP)]),
    ("high alarm is no idle alarm", [*gpu_asg(), res(ALARM, "hot", comparisonOperator="GreaterThanThreshold",
                                                     alarmActions=["arn:aws:sns:x"])], [(None, NO_AUTOSTOP)]),
    ("EventBridge stop schedule",
     [*gpu_asg(), res(EVENT_RULE, "stop", scheduleExpression="cron(0 19 ? * * *)")], []),
    ("event pattern is no schedule", [*gpu_asg(), res(EVENT_RULE, "spot", eventPattern="{}")],
     [(None, NO_AUTOSTOP)]),
    ("scheduler schedule", [*gpu_asg(), res("aws:scheduler/schedule:Schedule", "stop",
                                            scheduleExpression="cron(0 19 * * ? *)")], []),
    ("scale to zero at night", [*gpu_asg(), res("aws:autoscaling/schedule:Schedule", "night",
                                                desiredCapacity=0.0, recurrence="0 19 * * *")], []),
    # guardrails.py: the idle alarm has no actions of its own; an EventBridge rule sends its ALARM
    # state to the auto-stop Lambda
    ("alarm routed by EventBridge", [*gpu_asg(), res(ALARM, "idle", comparisonOperator="LessThanThreshold"),
                                     res(EVENT_RULE, "idle-rule", eventPattern=ALARM_PATTERN),
                                     res(EVENT_TARGET, "idle-target", rule="idle-rule")], []),
    ("routing rule without a target", [*gpu_asg(), res(ALARM, "idle", comparisonOperator="LessThanThreshold"),
                                       res(EVENT_RULE, "idle-rule", eventPattern=ALARM_PATTERN)],
     [(None, NO_AUTOSTOP)]),
    ("rule routes another alarm", [*gpu_asg(), res(ALARM, "idle", comparisonOperator="LessThanThreshold"),
                                   res(EVENT_RULE, "idle-rule", eventPattern=ALARM_PATTERN.replace(
                                       "idle-id", "other-id")),
                                   res(EVENT_TARGET, "idle-target", rule="idle-rule")],
     [(None, NO_AUTOSTOP)]),
]


@pytest.mark.parametrize(("case", "resources", "expected"), AUTOSTOP_CASES,
                         ids=[c[0] for c in AUTOSTOP_CASES])
def test_nonprod_autostop(case: str, resources: list[Resource], expected: list[Any]) -> None:
    assert stack_messages("nonprod-autostop", resources) == expected


def test_autostop_exemptions_come_from_config() -> None:
    assert stack_messages("nonprod-autostop", gpu_asg("dev"), {"exempt_environments": ["dev"]}) == []


# ---------------------------------------------------------------------- EFA

EFA_NICS = [{"networkCardIndex": float(c), "deviceIndex": 0.0,
             "interfaceType": "efa" if c == 0 else "efa-only", "securityGroups": ["efa-id"]}
            for c in range(4)]


def efa_stack(*, nics: list[dict[str, Any]] | None = None, types: tuple[str, ...] = ("p4d.24xlarge",),
              sg: Resource | None = None, rules: list[Resource] | None = None,
              subnets: list[str] | None = None, placement: str | None = "pg-id",
              strategy: str = "cluster", lt_extra: dict[str, Any] | None = None,
              asg_extra: dict[str, Any] | None = None) -> list[Resource]:
    """A p4d EFA group whose security group, rules and placement can each be swapped out."""
    security_group = sg or res(SG, "efa")
    if rules is None:
        rules = [res(kind, name, securityGroupId="efa-id", referencedSecurityGroupId="efa-id",
                     ipProtocol="-1") for kind, name in ((SG_IN, "in"), (SG_OUT, "out"))]
    asg_props: dict[str, Any] = {
        "maxSize": 4.0, "vpcZoneIdentifiers": subnets or ["subnet-1"],
        "mixedInstancesPolicy": {"launchTemplate": {
            "launchTemplateSpecification": {"launchTemplateId": "lt-id"},
            "overrides": [{"instanceType": t} for t in types]}}}
    if placement:
        asg_props["placementGroup"] = placement
    asg_props.update(asg_extra or {})
    return [security_group, *rules, res(PG, "pg", strategy=strategy),
            res(LT, "lt", networkInterfaces=EFA_NICS if nics is None else nics, **(lt_extra or {})),
            res(ASG, "train", **asg_props)]


CAPACITY_BLOCK_LT = {"instanceMarketOptions": {"marketType": "capacity-block"},
                     "capacityReservationSpecification": {"capacityReservationTarget": {
                         "capacityReservationId": "cr-0123456789abcdef0"}}}
RESERVED_ASG = {"capacityReservationSpecification": {
    "capacityReservationPreference": "capacity-reservations-first",
    "capacityReservationTarget": {"capacityReservationIds": ["cr-0aaaabbbbccccdddd"]}}}
SELF_OUT_MISSING = ("lt", "security group efa has no all-traffic rule outbound to itself; EFA needs both "
                          "directions (EC2 user guide, EFA security group)")
EFA_CASES: list[tuple[str, list[Resource], list[tuple[str | None, str]]]] = [
    ("well wired", efa_stack(), []),
    ("inline self rules", efa_stack(sg=res(SG, "efa", ingress=[{"protocol": "-1", "self": True}],
                                           egress=[{"protocol": "-1", "self": True}]), rules=[]), []),
    ("classic rules", efa_stack(rules=[
        res(SG_RULE, "i", type="ingress", securityGroupId="efa-id", self=True, protocol="-1"),
        res(SG_RULE, "o", type="egress", securityGroupId="efa-id", sourceSecurityGroupId="efa-id",
            protocol="-1")]), []),
    ("no outbound self rule", efa_stack(rules=[
        res(SG_IN, "in", securityGroupId="efa-id", referencedSecurityGroupId="efa-id", ipProtocol="-1")]),
     [SELF_OUT_MISSING]),
    ("outbound to anywhere is not to itself", efa_stack(rules=[
        res(SG_IN, "in", securityGroupId="efa-id", referencedSecurityGroupId="efa-id", ipProtocol="-1"),
        res(SG_OUT, "out", securityGroupId="efa-id", cidrIpv4="0.0.0.0/0", ipProtocol="-1")]),
     [SELF_OUT_MISSING]),
    ("self rule for TCP only", efa_stack(rules=[
        res(SG_IN, "in", securityGroupId="efa-id", referencedSecurityGroupId="efa-id", ipProtocol="-1"),
        res(SG_OUT, "out", securityGroupId="efa-id", referencedSecurityGroupId="efa-id", ipProtocol="tcp")]),
     [SELF_OUT_MISSING]),
    ("self rule on another group", efa_stack(rules=[
        res(SG_IN, "in", securityGroupId="efa-id", referencedSecurityGroupId="efa-id", ipProtocol="-1"),
        res(SG_OUT, "out", securityGroupId="other-id", referencedSecurityGroupId="other-id",
            ipProtocol="-1")]), [SELF_OUT_MISSING]),
    ("security group outside the stack", efa_stack(nics=[
        {**n, "securityGroups": ["sg-0123456789abcdef0"]} for n in EFA_NICS]), []),
    ("no security group", efa_stack(nics=[{k: v for k, v in n.items() if k != "securityGroups"}
                                          for n in EFA_NICS]),
     [("lt", "the EFA interfaces have no security group")]),
    ("primary is efa-only", efa_stack(nics=[{**EFA_NICS[0], "interfaceType": "efa-only"}, *EFA_NICS[1:]]),
     [("lt", "the primary interface (card 0, device 0) is efa-only; it must be efa or ENA")]),
    ("no primary", efa_stack(nics=EFA_NICS[1:]),
     [("lt", "no primary interface (network card 0, device index 0)")]),
    ("two interfaces in one slot", efa_stack(nics=[*EFA_NICS, EFA_NICS[1]]),
     [("lt", "two interfaces on network card 1, device index 0"),
      ("lt", "5 EFA interfaces, but p4d.24xlarge supports at most 4")]),
    ("card beyond the type", efa_stack(nics=[*EFA_NICS[:3], {**EFA_NICS[3], "networkCardIndex": 4.0}]),
     [("lt", "an interface on network card 4, but p4d.24xlarge has 4 network card(s)")]),
    ("type without EFA", efa_stack(nics=EFA_NICS[:1], types=("g5.xlarge",)),
     [("lt", "g5.xlarge does not support EFA")]),
    ("launch template type counts too", efa_stack(types=(), lt_extra={"instanceType": "p5en.48xlarge"}), []),
    ("two subnets", efa_stack(subnets=["subnet-1", "subnet-2"]),
     [("train", "an EFA group must use one subnet; vpcZoneIdentifiers has 2")]),
    ("no placement group", efa_stack(placement=None),
     [("train", "an EFA group needs a cluster placement group (placementGroup is not set)")]),
    ("spread placement group", efa_stack(strategy="spread"),
     [("train", "placement group pg has strategy 'spread'; EFA needs 'cluster'")]),
    ("placement group from the launch template",
     efa_stack(placement=None, lt_extra={"placement": {"groupName": "pg"}}), []),
    ("placement group outside the stack", efa_stack(placement="existing-cluster-pg"), []),
    ("capacity block needs none", efa_stack(placement=None, lt_extra=CAPACITY_BLOCK_LT), []),
    ("capacity block must have none", efa_stack(lt_extra=CAPACITY_BLOCK_LT),
     [("train", "a Capacity Block group must not use a placement group: its instances are already "
                "placed together in an EC2 UltraCluster")]),
    ("capacity reservation needs none", efa_stack(placement=None, asg_extra=RESERVED_ASG), []),
    ("capacity reservation may have one", efa_stack(asg_extra=RESERVED_ASG), []),
    ("capacity reservation not known yet", efa_stack(placement=None, asg_extra={
        "capacityReservationSpecification": {"capacityReservationTarget": {
            "capacityReservationIds": UNKNOWN}}}), []),
]


@pytest.mark.parametrize(("case", "resources", "expected"), EFA_CASES, ids=[c[0] for c in EFA_CASES])
def test_efa_wiring(case: str, resources: list[Resource], expected: list[Any]) -> None:
    assert stack_messages("efa-wiring", resources) == expected


def test_efa_wiring_ignores_launch_templates_without_efa() -> None:
    assert stack_messages("efa-wiring", [res(LT, "lt", networkInterfaces=[{"deviceIndex": 0.0}])]) == []


def test_efa_wiring_resolves_unknown_ids_through_dependencies() -> None:
    """Preview: ids are unknown, the property's dependencies still name the security group."""
    sg_urn = f"urn:{SG}::efa"
    sg = res(SG, "efa")
    only_in = res(SG_IN, "in", securityGroupId=UNKNOWN, referencedSecurityGroupId=UNKNOWN, ipProtocol="-1",
                  deps={"securityGroupId": (sg_urn,), "referencedSecurityGroupId": (sg_urn,)})
    nics = [{**n, "securityGroups": [UNKNOWN]} for n in EFA_NICS]
    stack = efa_stack(sg=sg, rules=[only_in], nics=nics)
    stack[3] = Resource(**{**stack[3].__dict__, "deps": {"networkInterfaces": (sg_urn,)}})
    assert stack_messages("efa-wiring", stack) == [SELF_OUT_MISSING]


def test_efa_wiring_passes_when_rules_are_unknown() -> None:
    unknown_rule = res(SG_OUT, "out", securityGroupId=UNKNOWN, referencedSecurityGroupId=UNKNOWN,
                       ipProtocol="-1")
    in_rule = res(SG_IN, "in", securityGroupId="efa-id", referencedSecurityGroupId="efa-id", ipProtocol="-1")
    assert stack_messages("efa-wiring", efa_stack(rules=[in_rule, unknown_rule])) == []


# ------------------------------------------------------------------------ S3

TLS = doc({"Effect": "Deny", "Principal": "*", "Action": "s3:*",
           "Resource": ["arn:aws:s3:::d", "arn:aws:s3:::d/*"],
           "Condition": {"Bool": {"aws:SecureTransport": "false"}}})


def bucket_stack(*, bucket: Resource | None = None, drop: tuple[str, ...] = (),
                 **replace: Resource) -> list[Resource]:
    parts = {
        "sse": res(SSE, "sse", bucket="d-id", rules=[
            {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}, "bucketKeyEnabled": True}]),
        "pab": res(PAB, "pab", bucket="d-id", blockPublicAcls=True, blockPublicPolicy=True,
                   ignorePublicAcls=True, restrictPublicBuckets=True),
        "policy": res(BPOLICY, "policy", bucket="d-id", policy=TLS),
        "versioning": res(VERSIONING, "v", bucket="d-id", versioningConfiguration={"status": "Enabled"}),
    }
    parts.update(replace)
    data = bucket or res(BUCKET, "d", protect=True, retain=True, tags=FULL)
    return [data, *(p for k, p in parts.items() if k not in drop)]


S3_POLICIES = ("s3-encryption", "s3-public-access-blocked", "s3-tls-only", "s3-data-buckets-protected")
S3_CASES: list[tuple[str, list[Resource], dict[str, list[str]]]] = [
    ("safe bucket", bucket_stack(), {}),
    ("no encryption", bucket_stack(drop=("sse",)), {"s3-encryption": [
        "no default encryption: add a BucketServerSideEncryptionConfiguration with sseAlgorithm one of "
        "aws:kms, aws:kms:dsse, AES256"]}),
    ("inline encryption", bucket_stack(drop=("sse",), bucket=res(BUCKET, "d", protect=True, tags=FULL,
        serverSideEncryptionConfiguration={"rule": {"applyServerSideEncryptionByDefault": {
            "sseAlgorithm": "AES256"}}})), {}),
    ("encryption config for another bucket", bucket_stack(sse=res(SSE, "sse", bucket="other-bucket", rules=[
        {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}])), {"s3-encryption": [
            "no default encryption: add a BucketServerSideEncryptionConfiguration with sseAlgorithm one of "
            "aws:kms, aws:kms:dsse, AES256"]}),
    ("encryption config whose bucket is not known yet", bucket_stack(sse=res(SSE, "sse", rules=[
        {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}])), {}),
    ("no public access block", bucket_stack(drop=("pab",)), {"s3-public-access-blocked": [
        "no BucketPublicAccessBlock (all four settings true)"]}),
    ("partial public access block", bucket_stack(pab=res(PAB, "pab", bucket="d-id", blockPublicAcls=True,
                                                         ignorePublicAcls=True)),
     {"s3-public-access-blocked": [
         "public access block leaves blockPublicPolicy, restrictPublicBuckets off"]}),
    ("public ACL", [*bucket_stack(), res(BACL, "acl", bucket="d-id", acl="public-read")],
     {"s3-public-access-blocked": ["ACL 'public-read' makes the bucket public"]}),
    ("public bucket policy", bucket_stack(policy=res(BPOLICY, "policy", bucket="d-id", policy=doc(
        {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "s3:GetObject",
         "Resource": "arn:aws:s3:::d/*"}))),
     {"s3-public-access-blocked": ["bucket policy Statement[0] allows everyone (Principal '*')"],
      "s3-tls-only": ["no bucket policy statement denies requests without TLS (Effect Deny, Condition Bool "
                      "aws:SecureTransport false)"]}),
    ("no bucket policy", bucket_stack(drop=("policy",)), {"s3-tls-only": [
        "no bucket policy statement denies requests without TLS (Effect Deny, Condition Bool "
        "aws:SecureTransport false)"]}),
    ("TLS condition as a boolean", bucket_stack(policy=res(BPOLICY, "policy", bucket="d-id", policy={
        "Statement": [{"Effect": "Deny", "Principal": "*", "Action": ["s3:*"], "Resource": "*",
                       "Condition": {"Bool": {"aws:SecureTransport": False}}}]})), {}),
    ("bucket policy not known yet",
     bucket_stack(policy=res(BPOLICY, "policy", bucket="d-id", policy=UNKNOWN)), {}),
    ("unprotected, force-destroyed, unversioned",
     bucket_stack(drop=("versioning",), bucket=res(BUCKET, "d", tags=FULL, forceDestroy=True)),
     {"s3-data-buckets-protected": [
         "not protected: set protect=True (and retain_on_delete=True) on the bucket",
         "forceDestroy is true: a delete would empty the bucket first",
         "versioning is not enabled (a BucketVersioning with status Enabled)"]}),
    ("retained on delete counts", bucket_stack(bucket=res(BUCKET, "d", retain=True, tags=FULL)), {}),
    ("versioning suspended", bucket_stack(versioning=res(VERSIONING, "v", bucket="d-id",
                                                         versioningConfiguration={"status": "Suspended"})),
     {"s3-data-buckets-protected": ["versioning is not enabled (a BucketVersioning with status Enabled)"]}),
    ("inline versioning", bucket_stack(drop=("versioning",), bucket=res(BUCKET, "d", protect=True, tags=FULL,
                                                                        versioning={"enabled": True})), {}),
]


@pytest.mark.parametrize(("case", "resources", "expected"), S3_CASES, ids=[c[0] for c in S3_CASES])
def test_s3_rules(case: str, resources: list[Resource], expected: dict[str, list[str]]) -> None:
    for policy in S3_POLICIES:
        assert [m for _, m in stack_messages(policy, resources)] == expected.get(policy, []), policy


LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"


def lifecycle(*rules: dict[str, Any]) -> list[Resource]:
    return [res(BUCKET, "d", protect=True, tags=FULL), res(LIFECYCLE, "lc", bucket="d-id", rules=list(rules))]


OLD_CHECKPOINTS = {"id": "old", "status": "Enabled", "filter": {"prefix": "ckpt/"},
                   "noncurrentVersionExpiration": {"noncurrentDays": 14}}
LIFECYCLE_CASES: list[tuple[str, list[Resource], dict[str, Any] | None, list[str]]] = [
    ("what datasets.py builds", lifecycle(
        {"id": "abort", "status": "Enabled", "filter": {"prefix": ""},
         "abortIncompleteMultipartUpload": {"daysAfterInitiation": 7}}, OLD_CHECKPOINTS), None, []),
    ("current objects expire", lifecycle({"id": "purge", "status": "Enabled", "expiration": {"days": 30}}),
     None, ["rule 'purge' expires current objects: only old versions may expire"]),
    ("on a date, too", lifecycle({"id": "purge", "status": "Enabled", "expiration": {"date": "2030-01-01"}}),
     None, ["rule 'purge' expires current objects: only old versions may expire"]),
    ("removing expired delete markers only", lifecycle(
        {"id": "markers", "status": "Enabled", "expiration": {"expiredObjectDeleteMarker": True}}), None, []),
    ("a disabled rule", lifecycle({"id": "off", "status": "Disabled", "expiration": {"days": 1}}), None, []),
    ("old versions too soon for this stack", lifecycle(OLD_CHECKPOINTS), {"min_noncurrent_days": 30},
     ["rule 'old' expires old versions after 14 days, outside 30..3650 (min_noncurrent_days, "
      "max_noncurrent_days)"]),
    ("old versions kept too long", lifecycle({**OLD_CHECKPOINTS, "noncurrentVersionExpiration": {
        "noncurrentDays": 4000}}), None,
     ["rule 'old' expires old versions after 4000 days, outside 1..3650 (min_noncurrent_days, "
      "max_noncurrent_days)"]),
    ("the deprecated inline rules", [res(BUCKET, "d", protect=True, tags=FULL, lifecycleRules=[
        {"enabled": True, "expiration": {"days": 5}, "noncurrentVersionExpiration": {"days": 0}}])], None,
     ["lifecycleRules[0] expires current objects: only old versions may expire",
      "lifecycleRules[0] expires old versions after 0 days, outside 1..3650 (min_noncurrent_days, "
      "max_noncurrent_days)"]),
    ("rules not known yet", [res(LIFECYCLE, "lc", bucket="d-id", rules=UNKNOWN)], None, []),
]


@pytest.mark.parametrize(("case", "resources", "config", "expected"), LIFECYCLE_CASES,
                         ids=[c[0] for c in LIFECYCLE_CASES])
def test_s3_lifecycle_keeps_data(case: str, resources: list[Resource], config: dict[str, Any] | None,
                                 expected: list[str]) -> None:
    assert [m for _, m in stack_messages("s3-lifecycle-keeps-data", resources, config)] == expected
