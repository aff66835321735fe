"""The spend guard: an EventBridge Scheduler schedule every `budget.check_minutes` invoking the
spend guard Lambda (`components/gpucluster/lambdas/spend_guard.py`), which stops the stack's groups
when month-to-date spend (settled Cost Explorer + accrued instance-hours x price) crosses the
budget's action threshold or will before the next check, or burns faster than
`budget.max_usd_per_hour`. AWS Budgets and its action stay as the backstop.

It must never delete anything and never build or change a node group: its role reads spend and
instances, and scales this stack's groups to zero exactly as the budget action does.
"""

import json
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import type_token
from gpucluster.aws.guardrail_lambda import (
    BASE_TIMEOUT_SECONDS,
    GuardrailContext,
    GuardrailFunction,
    describe_statement,
    publish_statements,
    scaling_statements,
    scheduler_invoker,
)
from gpucluster.aws.guardrail_state import with_state

# The handler's reads: none of them supports resource-level permissions (Service Authorization
# Reference: "AWS Cost Explorer Service" GetCostAndUsage, "Amazon EC2" DescribeInstances,
# DescribeSpotPriceHistory and DescribeCapacityReservations, "Amazon EC2 Auto Scaling"
# DescribeAutoScalingGroups, "Amazon CloudWatch" GetMetricData, "AWS Price List" GetProducts: the
# service has no resource types, cfn-lint's AdditionalSpecs/Policies.json `pricing`), so Resource "*".
# GetProducts prices a type the rendered table lacks (fleet.pricelist); DescribeCapacityReservations
# reads a Capacity Block's fee (fleet.capacityblocks).
SPEND_GUARD_READS = ("autoscaling:DescribeAutoScalingGroups", "ce:GetCostAndUsage",
                     "cloudwatch:GetMetricData", "ec2:DescribeCapacityReservations", "ec2:DescribeInstances",
                     "ec2:DescribeSpotPriceHistory", "pricing:GetProducts")
SCHEDULE_RETRIES = 2


def check_expression(minutes: int) -> str:
    """EventBridge Scheduler rate expression ("rate(1 minute)" takes the singular unit)."""
    return f"rate({minutes} minute{'s' if minutes != 1 else ''})"


def guard_limit_usd(monthly_limit_usd: float, action_threshold_percent: float) -> float:
    """The spend the guard stops at: the budget action's threshold, in dollars."""
    return round(monthly_limit_usd * action_threshold_percent / 100, 2)


class SpendGuard(pulumi.ComponentResource):
    """A schedule every `budget.check_minutes` and the spend guard Lambda with a least-privilege role.

    Built with `budget.action_threshold_percent` (the user asked for a stop). The schedule's retries
    and event age stay within one check interval: a stale check is replaced by the next one.
    """

    def __init__(self, name: str, ctx: GuardrailContext, prices: dict[str, Any],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("SpendGuard"), name, None, opts)
        budget = ctx.args.budget
        if budget is None or budget.action_threshold_percent is None:
            raise ValueError(f"guardrails of {ctx.identity} have no budget.action_threshold_percent")
        child = pulumi.ResourceOptions(parent=self)
        self.limit_usd = guard_limit_usd(budget.monthly_limit_usd, budget.action_threshold_percent)
        environment: dict[str, pulumi.Input[str]] = {
            **ctx.environment(), "LIMIT_USD": f"{self.limit_usd:g}",
            "CHECK_MINUTES": str(budget.check_minutes),
            "PRICES_JSON": json.dumps(prices, sort_keys=True, separators=(",", ":"))}
        if budget.max_usd_per_hour is not None:
            environment["MAX_USD_PER_HOUR"] = f"{budget.max_usd_per_hour:g}"
        age = max(60, budget.check_minutes * 60)
        self.function = GuardrailFunction(
            f"{name}-handler", ctx, module="spend_guard", function_name=f"{ctx.prefix}-spend-guard",
            timeout=BASE_TIMEOUT_SECONDS, environment=environment,
            statements=[describe_statement(SPEND_GUARD_READS),
                        *scaling_statements(ctx.asg_arns, ctx.identity, delete_tags=False),
                        *publish_statements(ctx.notify_topic_arn, ctx.key_arn),
                        *with_state(ctx, environment)],
            max_event_age_seconds=age, retries=SCHEDULE_RETRIES, opts=child)
        fn = self.function.function
        self.scheduler_role, invoke_policy = scheduler_invoker(name, ctx, self.function,
                                                               "InvokeSpendGuardOnly", child)
        self.schedule = aws.scheduler.Schedule(
            f"{name}-schedule", name=f"{ctx.prefix}-spend-guard", group_name="default",
            description=f"gpucluster {ctx.identity}: spend check every {budget.check_minutes} min",
            schedule_expression=check_expression(budget.check_minutes),
            flexible_time_window={"mode": "OFF"}, state="ENABLED",
            target={"arn": fn.arn, "role_arn": self.scheduler_role.arn, "input": "{}",
                    "retry_policy": {"maximum_event_age_in_seconds": age,
                                     "maximum_retry_attempts": SCHEDULE_RETRIES}},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[invoke_policy]))
        self.register_outputs({"function_name": self.function.function_name,
                               "schedule_name": self.schedule.name, "limit_usd": self.limit_usd})
