"""Physical names: what Pulumi and the provider will call each resource, and AWS's limits for them.

The spec accepts only configs whose names fit (`gpucluster.names`). These tests plan the longest
names the spec accepts and check every resource's name against its limit, keep the spec's own
list of names equal to what the program registers, and show the spec's limit is exact: one
character more and a planned name would not fit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from base_config import BASE_CONFIG, plan_config
from gpucluster import names, preflight
from gpucluster.aws import args as args_module
from gpucluster.names import NAME_RULES, autoname, expected_names, physical_name, physical_names
from gpucluster.plan import Plan
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError
from shipped import planned_config, shipped_plan

# Every part of the program that names something: created (named and unnamed) and existing buckets,
# FSx, an EFA group with a placement group, a Capacity Block, a spot group, every guardrail.
FULL: dict[str, Any] = {
    "aws:region": "us-east-1",
    "gpucluster:cluster": {"name": "full",
                           "tags": {"owner": "ml", "cost_center": "cc-1", "environment": "dev"}},
    "gpucluster:network": {"availability_zones": ["us-east-1a", "us-east-1b"], "vpc_cidr": "10.0.0.0/16"},
    "gpucluster:node_groups": [
        {"name": "train", "instance_types": ["p4d.24xlarge"], "max_nodes": 4, "efa": "on",
         "capacity": {"on_demand_base": 1, "spot_percent": 50}},
        {"name": "block", "instance_types": ["p5.48xlarge"], "max_nodes": 2, "efa": "on",
         "capacity": {"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0"}},
        {"name": "serve", "instance_types": ["g5.xlarge"], "max_nodes": 2, "capacity": {"spot_percent": 100}},
    ],
    "gpucluster:datasets": [
        {"name": "corpus", "prefix": "data/", "checkpoint_prefix": "ckpt/", "access": "fsx",
         "fsx": {"deployment_type": "PERSISTENT_2", "throughput_per_unit_mib": 250}},
        {"name": "models", "bucket_name": "acme-models-bucket"},
        {"name": "evals", "bucket_name": "acme-evals", "existing": True, "access": "copy_to_scratch"},
    ],
    "gpucluster:budget": {"monthly_limit_usd": 1000, "action_threshold_percent": 100, "report": "weekly"},
    "gpucluster:autostop": {"stop_schedule": "cron(0 20 ? * MON-FRI *)",
                            "start_schedule": "cron(0 8 ? * MON-FRI *)", "max_lifetime_hours": 24},
    "gpucluster:spot": {"interruption_command": "/opt/hooks/checkpoint.sh"},
    "gpucluster:notifications": {"emails": ["ml@example.com"]},
}
LONGEST = 24  # spec.Name: 2-24 characters


def with_names(cluster: str, part: Callable[[str], str] = lambda n: n) -> dict[str, Any]:
    """FULL with this cluster name and each group and dataset name made by `part`."""
    config = copy.deepcopy(FULL)
    config["gpucluster:cluster"]["name"] = cluster
    for section in ("gpucluster:node_groups", "gpucluster:datasets"):
        for item in config[section]:
            item["name"] = part(item["name"])
    return config


def long_name(base: str, length: int = LONGEST) -> str:
    """`base` padded with a distinct tail to exactly `length` characters."""
    return (base + "-" + "x" * length)[:length - 1] + "z"


def accepted(config: dict[str, Any]) -> bool:
    try:
        parse_stack_config(config, stack="t")
    except SpecError:
        return False
    return True


def longest_accepted_cluster_name() -> str:
    """The longest cluster name the spec accepts for FULL with 24-character group and dataset names."""
    for length in range(LONGEST, 1, -1):
        name = long_name("c", length)
        if accepted(with_names(name, long_name)):
            return name
    raise AssertionError("no cluster name is accepted")


def too_long(plan: Plan) -> list[str]:
    return [f"{p.rule.what} {p.name!r}: {len(p.name)} > {p.rule.limit}"
            for p in physical_names(plan.resources) if not p.fits]


def planned(plan: Plan) -> list[tuple[str, str]]:
    return sorted((p.type, p.name) for p in physical_names(plan.resources))


@pytest.fixture(scope="module")
def longest() -> str:
    return longest_accepted_cluster_name()


@pytest.fixture(scope="module")
def longest_plan(longest: str) -> Plan:
    """The stack with the longest accepted names, planned once for the tests that read it."""
    return plan_config(with_names(longest, long_name))


@pytest.fixture(scope="module")
def full_plan() -> Plan:
    return plan_config(copy.deepcopy(FULL))


def test_the_longest_accepted_names_all_fit_their_aws_limits(longest: str, longest_plan: Plan) -> None:
    config = with_names(longest, long_name)
    plan = longest_plan
    assert too_long(plan) == []
    assert len(physical_names(plan.resources)) > 50, "the plan names IAM roles, targets, buckets, ..."
    # The limit is not met by accident: group and dataset names are as long as the spec allows.
    assert {len(g["name"]) for g in config["gpucluster:node_groups"]} == {LONGEST}
    assert len(longest) >= 16


def test_one_character_more_is_rejected_and_would_not_deploy(longest: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec's limit is exact: the name it rejects really makes a name AWS refuses."""
    config = with_names(long_name("c", len(longest) + 1), long_name)
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    [finding] = err.value.findings
    assert finding.path == "cluster.name"
    assert "AWS allows 64" in finding.message and f"use at most {len(longest)} characters" in finding.message
    assert "\n" not in str(err.value)
    checks = [c for c in preflight.CHECKS if c is not preflight.resource_names]
    monkeypatch.setattr(preflight, "CHECKS", checks)  # plan it anyway
    monkeypatch.setattr(args_module, "CHECKS", checks)
    assert too_long(plan_config(config)) != []


EXISTING_VPC = {**copy.deepcopy(FULL), "gpucluster:network": {
    "availability_zones": ["us-east-1a"], "existing_vpc_id": "vpc-0123456789abcdef0",
    "existing_subnets": {"us-east-1a": "subnet-0123456789abcdef0"}}}
EXISTING_VPC["gpucluster:node_groups"][2]["availability_zones"] = ["us-east-1a"]


@pytest.mark.parametrize("case", ["dev", "staging", "prod", "full", "longest", "base", "existing-vpc"])
def test_the_specs_names_are_the_programs(case: str, request: pytest.FixtureRequest) -> None:
    """`expected_names` (what the spec checks) lists exactly the names a plan registers."""
    if case in ("dev", "staging", "prod"):
        plan = shipped_plan(case)
    elif case in ("full", "longest"):
        plan = request.getfixturevalue(f"{case}_plan")
    else:
        plan = planned_config(copy.deepcopy({"base": BASE_CONFIG, "existing-vpc": EXISTING_VPC}[case]))
    assert sorted((e.physical.type, e.physical.name) for e in expected_names(plan.spec)) == planned(plan)
    assert too_long(plan) == []


def test_the_binding_names_today() -> None:
    """With every guardrail the spot warning's EventBridge target id binds first; without spot, roles."""
    spec = parse_stack_config(with_names("full"), stack="t")
    worst = max(expected_names(spec), key=lambda e: len(e.physical.name) - e.physical.rule.limit)
    assert worst.physical.type == "aws:cloudwatch/eventTarget:EventTarget"
    assert worst.physical.logical == "full-guardrails-spot-interruption-target"


def test_a_long_name_is_fine_where_nothing_long_is_built() -> None:
    """Only what the stack builds counts: 24 characters deploy without spot or auto-stop."""
    config = copy.deepcopy(BASE_CONFIG)
    config["gpucluster:cluster"]["name"] = long_name("c")
    config["gpucluster:node_groups"][0]["capacity"] = {"spot_percent": 0}
    plan = plan_config(config)
    assert too_long(plan) == []


# ----------------------------------------------------------------------- the naming rules


@pytest.mark.parametrize(("type_", "limit"), [
    ("aws:iam/role:Role", 64), ("aws:lambda/function:Function", 64),
    ("aws:cloudwatch/eventRule:EventRule", 64), ("aws:cloudwatch/eventTarget:EventTarget", 64),
    ("aws:scheduler/schedule:Schedule", 64), ("aws:s3/bucket:Bucket", 63), ("aws:iam/policy:Policy", 128),
    ("aws:sns/topic:Topic", 256), ("aws:cloudwatch/logGroup:LogGroup", 512), ("aws:kms/alias:Alias", 256),
    ("aws:cloudwatch/metricAlarm:MetricAlarm", 255),
])
def test_aws_limits(type_: str, limit: int) -> None:
    assert NAME_RULES[type_].limit == limit


def test_physical_names_as_pulumi_and_the_provider_make_them() -> None:
    role = physical_name("aws:iam/role:Role", "lab-guardrails-spot-handler-role", {})
    assert role is not None and role.name.startswith("lab-guardrails-spot-handler-role-")
    assert len(role.name) == len("lab-guardrails-spot-handler-role") + 8  # "-" and 7 hex
    target = physical_name("aws:cloudwatch/eventTarget:EventTarget", "t", {"rule": "r"})
    assert target is not None and target.name == autoname("t")
    explicit = physical_name("aws:lambda/function:Function", "f", {"name": "lab-autostop"})
    assert explicit is not None and explicit.name == "lab-autostop"
    prefixed = physical_name("aws:s3/bucket:Bucket", "b", {"bucketPrefix": "lab-corpus-"})
    assert prefixed is not None and len(prefixed.name) == len("lab-corpus-") + 26
    lower = physical_name("aws:s3/bucket:Bucket", "Lab-Bucket", {})
    assert lower is not None and lower.name == lower.name.lower()
    assert physical_name("aws:ec2/vpc:Vpc", "v", {}) is None


def test_the_mock_engine_answers_provider_made_names(full_plan: Plan) -> None:
    """Names built from another resource's name (an alarm after its group) are as long as in AWS."""
    plan = full_plan
    alarm = next(r for r in plan.resources if r.name == "full-guardrails-autostop-idle-composite-train")
    assert alarm.inputs["alarmName"] == f"{autoname('full-train-asg')}-idle"
    assert len(alarm.inputs["alarmName"]) == len("full-train-asg-idle") + 8
    assert names.generated_state("aws:iam/role:Role", "r", {"name": "given"}) == {}
