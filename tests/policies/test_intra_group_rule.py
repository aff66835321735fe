"""The `intra-group-traffic` rule on the planned stacks and on a stack that gets it wrong."""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_stacks import broken_stack

from base_config import base, plan_config
from gpucluster.plan import Plan
from gpucluster.policy.offline import check_plan
from gpucluster.policy.rules import evaluate
from shipped import shipped_plan

POLICY = "intra-group-traffic"


def _found(plan: Plan) -> list[tuple[str | None, str]]:
    return [(v.resource_name, v.message) for v in check_plan(plan) if v.policy == POLICY]


def _without(plan: Plan, suffix: str) -> Plan:
    return replace(plan, resources=[r for r in plan.resources if not r.name.endswith(suffix)])


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_the_shipped_stacks_pass(stack: str) -> None:
    assert _found(shipped_plan(stack)) == []


@pytest.mark.parametrize("missing", ["-self-in", "-self-out"])
def test_a_multi_node_group_without_its_self_rule_fails(missing: str) -> None:
    plan = shipped_plan("staging")  # l40s-4x: up to 6 nodes, no EFA
    assert _found(_without(plan, missing)) == [
        ("gpu-staging-l40s-4x-asg", "up to 6 nodes, but no security group of its launch template allows "
                                    "all traffic to and from itself in both directions: its nodes "
                                    "cannot reach each other (NCCL, MPI)")]


def test_a_single_node_group_needs_no_self_rules() -> None:
    config = base()
    config["gpucluster:node_groups"][0]["max_nodes"] = 1
    config["gpucluster:node_groups"][0]["desired_nodes"] = 1
    plan = plan_config(config)
    assert not [r for r in plan.resources if r.name.endswith(("-self-in", "-self-out"))]
    assert _found(plan) == []


def test_all_traffic_from_outside_the_group_fails() -> None:
    violations = [v for v in evaluate(broken_stack()) if v.policy == POLICY]
    assert sorted((v.resource_name, v.message) for v in violations) == [
        ("b-serve", "b-serve-all admits all traffic into security group b-serve from outside the group"),
        ("b-serve", "up to 3 nodes, but no security group of its launch template allows all traffic to "
                    "and from itself in both directions: its nodes cannot reach each other (NCCL, MPI)"),
    ]
    assert all(v.mandatory for v in violations)
