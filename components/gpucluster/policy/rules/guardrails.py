"""Guardrail rules: a stack with GPU groups has a budget that acts, and non-prod stacks stop when idle.

Owns `gpu-budget-with-action` (a BudgetAction, or a notification to a topic
a Lambda subscribes to) and `nonprod-autostop` (an idle alarm someone acts
on, or a stop schedule). Pure: reads resource records only, never Pulumi or AWS.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.policy.records import EXTERNAL, UNKNOWN, Resource, Stack, dig, items, number
from gpucluster.policy.rules.groups import gpu_groups
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import (
    ASG_SCHEDULE,
    BUDGET,
    BUDGET_ACTION,
    EVENT_RULE,
    EVENT_TARGET,
    METRIC_ALARM,
    SCHEDULER_SCHEDULE,
    SNS_SUBSCRIPTION,
    SNS_TOPIC,
)


@rule("gpu-budget-with-action",
      "A stack with GPU groups has an AWS budget with an action: a BudgetAction, or a notification "
      "to an SNS topic a Lambda subscribes to (scale to zero).",
      "stack")
def gpu_budget_with_action(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    gpu = gpu_groups(stack)
    if not gpu:
        return
    budgets = stack.of_type(BUDGET)
    if not budgets:
        yield None, f"GPU groups ({', '.join(gpu)}) but no aws:budgets/budget:Budget"
    elif not any(_budget_acts(stack, b) for b in budgets):
        for b in budgets:
            yield b, ("the budget only notifies: add a BudgetAction or a notification to an SNS "
                      "topic with a Lambda subscription that scales the GPU groups to zero")


def _budget_acts(stack: Stack, budget: Resource) -> bool:
    for action in stack.of_type(BUDGET_ACTION):
        target = stack.resolve(action, "budgetName", action.props.get("budgetName"), [BUDGET])
        if target is budget or target is UNKNOWN:
            return True
    notifications = items(budget.props.get("notifications"))
    if notifications is UNKNOWN:
        return True
    for notification in notifications:
        topics = items(dig(notification, "subscriberSnsTopicArns"))
        if topics is UNKNOWN:
            return True
        for arn in topics:
            topic = stack.resolve(budget, "notifications", arn, [SNS_TOPIC])
            if topic is UNKNOWN or topic is EXTERNAL or _has_lambda_subscriber(stack, topic):
                return True
    return False


def _has_lambda_subscriber(stack: Stack, topic: Any) -> bool:
    for sub in stack.of_type(SNS_SUBSCRIPTION):
        if sub.props.get("protocol") not in ("lambda", UNKNOWN):
            continue
        target = stack.resolve(sub, "topic", sub.props.get("topic"), [SNS_TOPIC])
        if target is topic or target is UNKNOWN:
            return True
    return False


@rule("nonprod-autostop",
      "A non-prod stack with GPU groups has auto-stop: an idle alarm with an action (its own, or an "
      "EventBridge rule with a target that receives its ALARM state), or a stop schedule.",
      "stack",
      schema={"exempt_environments": {"type": "array", "items": {"type": "string"},
                                      "description": "Environments that need no auto-stop."}},
      defaults={"exempt_environments": ["prod"]})
def nonprod_autostop(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    env = stack.environment()
    if env is None or env in config["exempt_environments"]:
        return
    gpu = gpu_groups(stack)
    if not gpu or _has_autostop(stack):
        return
    yield None, (f"{env} stack with GPU groups ({', '.join(gpu)}) has no auto-stop: no idle alarm "
                 "(a MetricAlarm below a threshold, with an action) and no stop schedule")


def _has_autostop(stack: Stack) -> bool:
    routed = _alarms_routed_by_eventbridge(stack)
    for alarm in stack.of_type(METRIC_ALARM):
        operator = alarm.props.get("comparisonOperator")
        actions = items(alarm.props.get("alarmActions"))
        acted_on = actions is UNKNOWN or bool(actions) or routed is UNKNOWN or bool(routed & set(alarm.ids))
        below = operator is UNKNOWN or (isinstance(operator, str) and operator.startswith("LessThan"))
        if below and acted_on:
            return True
    for schedule in stack.of_type(EVENT_RULE, SCHEDULER_SCHEDULE):
        if schedule.props.get("scheduleExpression"):
            return True
    for action in stack.of_type(ASG_SCHEDULE):
        size = action.props.get("desiredCapacity", action.props.get("maxSize"))
        if size is UNKNOWN or (size is not None and number(size, 1) == 0):
            return True
    return False


def _alarms_routed_by_eventbridge(stack: Stack) -> set[str] | Any:
    """Alarm ids whose ALARM state an EventBridge rule with a target delivers (UNKNOWN: can't tell).

    Guardrails act on idle alarms this way (a `CloudWatch Alarm State Change` rule targeting the
    auto-stop Lambda) rather than through the alarm's own alarmActions.
    """
    targeted = set()
    for target in stack.of_type(EVENT_TARGET):
        rule = stack.resolve(target, "rule", target.props.get("rule"), [EVENT_RULE])
        if rule is UNKNOWN:
            return UNKNOWN
        if isinstance(rule, Resource):
            targeted.add(rule.urn)
    routed: set[str] = set()
    for rule in stack.of_type(EVENT_RULE):
        if rule.urn not in targeted:
            continue
        pattern = rule.props.get("eventPattern")
        if pattern is UNKNOWN:
            return UNKNOWN
        try:
            pattern = json.loads(pattern) if isinstance(pattern, str) else pattern
        except json.JSONDecodeError:
            continue
        if not isinstance(pattern, Mapping) or "CloudWatch Alarm State Change" not in items(
                pattern.get("detail-type")):
            continue
        resources = pattern.get("resources")
        if resources is UNKNOWN or any(r is UNKNOWN for r in items(resources)):
            return UNKNOWN
        routed |= {r for r in items(resources) if isinstance(r, str)}
    return routed
