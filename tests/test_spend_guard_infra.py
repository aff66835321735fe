"""The spend guard's wiring under the mock engine: schedule, environment, role, and the spec keys."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpucluster.fleet.accrual import Prices
from gpucluster.plan import load_stack
from gpucluster.pricing import guard_prices
from gpucluster.spec import SpecError
from test_guardrails import (
    FUNCTION,
    INVOKE_CONFIG,
    ROLE,
    ROLE_POLICY,
    SCHEDULE,
    Built,
    actions_of,
    build,
    check_policy,
    spec_of,
)


@pytest.fixture(scope="module")
def prod() -> Built:
    return build(load_stack("prod")[2])


def spend_schedule(built: Built) -> dict[str, Any]:
    [schedule] = [s.inputs for s in built.all(SCHEDULE) if "-spend-" in s.name]
    return schedule


def test_prod_checks_spend_every_five_minutes_against_its_action_threshold(prod: Built) -> None:
    schedule = spend_schedule(prod)
    assert schedule["name"] == "gpu-prod-spend-guard"
    assert schedule["scheduleExpression"] == "rate(5 minutes)"
    assert schedule["target"]["arn"] == prod.arn(FUNCTION, "spend-handler-function")
    assert schedule["target"]["retryPolicy"] == {"maximumEventAgeInSeconds": 300, "maximumRetryAttempts": 2}
    env = prod.function("spend_guard").inputs["environment"]["variables"]
    assert env["LIMIT_USD"] == "715000"  # 650,000 x 110 %
    assert env["CHECK_MINUTES"] == "5" and "MAX_USD_PER_HOUR" not in env
    prices = json.loads(env["PRICES_JSON"])
    assert prices == guard_prices(prod.spec)
    Prices.from_json(prices)
    assert sum(len(k) + len(v) for k, v in env.items()) < 4096  # Lambda's environment limit


def test_the_spend_guard_role_scales_only_this_stack_and_reads_spend(prod: Built) -> None:
    statements = check_policy(prod, "gpu-prod-spend-guard", scales=True, runs_hooks=False)
    assert actions_of(statements, "*") == {"autoscaling:DescribeAutoScalingGroups", "ce:GetCostAndUsage",
                                           "cloudwatch:GetMetricData", "ec2:DescribeCapacityReservations",
                                           "ec2:DescribeInstances", "ec2:DescribeSpotPriceHistory",
                                           "pricing:GetProducts"}
    assert "autoscaling:DeleteTags" not in actions_of(statements)
    role = prod.one(ROLE, "spend-scheduler-role").inputs
    assert json.loads(role["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "scheduler.amazonaws.com"}
    [invoke] = json.loads(prod.one(ROLE_POLICY, "spend-scheduler-policy").inputs["policy"])["Statement"]
    assert invoke["Action"] == ["lambda:InvokeFunction"]
    assert invoke["Resource"] == [prod.arn(FUNCTION, "spend-handler-function")]
    configs = {c.inputs["functionName"]: c.inputs for c in prod.all(INVOKE_CONFIG)}
    assert configs["gpu-prod-spend-guard"]["destinationConfig"]["onFailure"]["destination"] == \
        prod.notify_topic


def test_check_interval_and_burn_cap_reach_the_function(base_config: dict[str, Any]) -> None:
    built = build(spec_of(base_config, budget={"monthly_limit_usd": 1000, "action_threshold_percent": 90,
                                                "check_minutes": 1, "max_usd_per_hour": 12.5}))
    assert spend_schedule(built)["scheduleExpression"] == "rate(1 minute)"
    assert spend_schedule(built)["target"]["retryPolicy"]["maximumEventAgeInSeconds"] == 60
    env = built.function("spend_guard").inputs["environment"]["variables"]
    assert (env["LIMIT_USD"], env["CHECK_MINUTES"], env["MAX_USD_PER_HOUR"]) == ("900", "1", "12.5")


def test_no_guard_without_a_stop_asked_for(base_config: dict[str, Any]) -> None:
    built = build(spec_of(base_config, budget={"monthly_limit_usd": 1000}))
    assert not [s for s in built.all(SCHEDULE) if "-spend-" in s.name]
    assert not [f for f in built.all(FUNCTION) if "spend-guard" in f.inputs["name"]]


ACTION = {"monthly_limit_usd": 1000, "action_threshold_percent": 100}


@pytest.mark.parametrize(("budget", "path"), [
    ({**ACTION, "check_minutes": 16}, "budget.check_minutes"),
    ({**ACTION, "check_minutes": 0}, "budget.check_minutes"),
    ({"monthly_limit_usd": 1000, "max_usd_per_hour": 10}, "budget.max_usd_per_hour"),
])
def test_bad_spend_guard_keys_name_their_path(base_config: dict[str, Any], budget, path) -> None:
    with pytest.raises(SpecError) as err:
        spec_of(base_config, budget=budget)
    assert path in str(err.value)
