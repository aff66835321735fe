"""Spend guard handler: every few minutes, month-to-date spend against the limit; over it, compute to zero.

Invoked by an EventBridge Scheduler schedule every CHECK_MINUTES (1-15). It
reads the last settled Cost Explorer figure for the stack's identity tag
(GetCostAndUsage through the day before yesterday, UTC: yesterday may still
be filling in), the stack's in-service instances (type, zone, purchase option,
launch time), the current spot prices of the spot ones
(DescribeSpotPriceHistory; the on-demand price when that fails: spot never
costs more, so the fallback errs towards stopping early), the groups'
GroupInServiceInstances metric (instances that ran since the settled point but
are gone), and accrues the hours since the settled point at the prices
rendered at deploy (PRICES_JSON, `accrual.Prices`). It stops every group of
the stack exactly as the budget action does (`stops.stop_groups` with reason
budget, confirmed after a settle time) when the spend has reached LIMIT_USD,
will reach it before the next check at the current burn rate, or the burn
rate exceeds MAX_USD_PER_HOUR. AWS Budgets stays as the backstop.

A read that fails (throttled, denied, a 5xx) fails the invocation after
anything decidable is done: the schedule's retry or the next tick runs it
again, and the on-failure destination tells the topic. A retry is one run:
stopping is idempotent and a stopped group is left as it is. Never deletes
anything; acts only on groups tagged with GPUCLUSTER_STACK.

Environment: GPUCLUSTER_STACK, LIMIT_USD, PRICES_JSON (required), CHECK_MINUTES,
MAX_USD_PER_HOUR, NOTIFY_TOPIC_ARN (optional).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from .accrual import (
    CAPACITY_BLOCK,
    ON_DEMAND,
    SPOT,
    Decision,
    Instance,
    PriceError,
    Prices,
    Spend,
    accrue,
    cost_period,
    decide,
    settled_through,
    when_limit,
)
from .awsapi import AWS_ERRORS, batches, log_event
from .budget_action import SETTLE_SECONDS
from .nodegroups import BUDGET, NodeGroup, NodeGroups
from .runtime import RUNTIME, ConfigError, GuardrailError, env_number, notify_from_env, stack_from_env
from .stops import confirm_budget_stops, mark_told, raise_if_failed, stack_node_groups, stop_groups
from .tags import STACK_TAG

DEFAULT_CHECK_MINUTES = 5.0
COST_METRIC = "UnblendedCost"
SPOT_PRODUCT = "Linux/UNIX"
METRIC_PERIOD_SECONDS = 300


def settings() -> tuple[float, Prices, float, float | None]:
    """(limit, prices, check minutes, max USD/h) from the environment; ConfigError when unusable."""
    limit = env_number("LIMIT_USD", 0.0)
    if limit <= 0:
        raise ConfigError("LIMIT_USD is not set to a positive number: the spend guard has no limit")
    raw = os.environ.get("PRICES_JSON", "")
    try:
        prices = Prices.from_json(json.loads(raw))
    except (ValueError, PriceError) as exc:
        raise ConfigError(f"PRICES_JSON is not a usable price table: {exc}") from None
    cap = env_number("MAX_USD_PER_HOUR", 0.0)
    return limit, prices, env_number("CHECK_MINUTES", DEFAULT_CHECK_MINUTES), cap or None


def settled_cost(ce: Any, stack: str, now: datetime) -> float:
    """Month-to-date cost of resources tagged with the stack, through `accrual.settled_through`.

    Budgets and Cost Explorer count only costs carrying an activated cost-allocation tag
    (Billing user guide, "Activating user-defined cost allocation tags").
    """
    period = cost_period(now)
    if period is None:
        return 0.0
    total, token = 0.0, None
    while True:
        kwargs: dict[str, Any] = {
            "TimePeriod": period, "Granularity": "MONTHLY", "Metrics": [COST_METRIC],
            "Filter": {"Tags": {"Key": STACK_TAG, "Values": [stack], "MatchOptions": ["EQUALS"]}}}
        if token:
            kwargs["NextPageToken"] = token
        answer = ce.get_cost_and_usage(**kwargs)
        for result in answer.get("ResultsByTime", []):
            total += float(result.get("Total", {}).get(COST_METRIC, {}).get("Amount", 0) or 0)
        token = answer.get("NextPageToken")
        if not token:
            return total


def running_instances(ec2: Any, groups: Sequence[NodeGroup]) -> list[Instance]:
    """The groups' in-service instances with their purchase option and launch time."""
    group_of = {i: g.node_group or g.name for g in groups for i in g.in_service_ids}
    found: list[Instance] = []
    # DescribeInstances takes up to 1000 ids a call; pages cover the rest.
    for batch in batches(sorted(group_of), 1000):
        for page in ec2.get_paginator("describe_instances").paginate(InstanceIds=batch):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    lifecycle = inst.get("InstanceLifecycle")
                    purchase = {"spot": SPOT, "capacity-block": CAPACITY_BLOCK}.get(lifecycle, ON_DEMAND)
                    found.append(Instance(
                        inst["InstanceId"], inst["InstanceType"], purchase, inst["LaunchTime"],
                        group_of.get(inst["InstanceId"], ""),
                        inst.get("Placement", {}).get("AvailabilityZone")))
    return found


def spot_prices(ec2: Any, instances: Iterable[Instance],
                now: datetime) -> dict[tuple[str, str | None], float]:
    """Current spot price per (type, zone) of the spot instances; {} (on-demand fallback) on error."""
    types = sorted({i.instance_type for i in instances if i.purchase == SPOT})
    if not types:
        return {}
    prices: dict[tuple[str, str | None], tuple[datetime, float]] = {}
    try:
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=types, ProductDescriptions=[SPOT_PRODUCT], StartTime=now - timedelta(hours=1))
        for page in pages:
            for p in page["SpotPriceHistory"]:
                key = (p["InstanceType"], p.get("AvailabilityZone"))
                if key not in prices or p["Timestamp"] > prices[key][0]:
                    prices[key] = (p["Timestamp"], float(p["SpotPrice"]))
    except AWS_ERRORS as exc:
        log_event("spot prices unavailable: pricing spot at on-demand", logging.WARNING, error=str(exc))
        return {}
    return {k: v[1] for k, v in prices.items()}


def group_instance_hours(cloudwatch: Any, groups: Sequence[NodeGroup], since: datetime,
                         now: datetime) -> dict[str, float]:
    """Node group -> in-service instance-hours since `since`, from GroupInServiceInstances.

    gpucluster's groups collect it every minute (aws/health.py GROUP_METRICS); the Average of
    a 5-minute period times its length is that period's instance-hours. CloudWatch keeps
    1-minute data 15 days and 5-minute data 63 days (CloudWatch user guide, "Metrics
    retention"), so a two-day window is always there. A group without the metric counts 0.
    """
    if not groups or now <= since:
        return {}
    queries = [{"Id": f"g{i}", "MetricStat": {
        "Metric": {"Namespace": "AWS/AutoScaling", "MetricName": "GroupInServiceInstances",
                   "Dimensions": [{"Name": "AutoScalingGroupName", "Value": g.name}]},
        "Period": METRIC_PERIOD_SECONDS, "Stat": "Average"}, "ReturnData": True}
        for i, g in enumerate(groups)]
    label = {f"g{i}": g.node_group or g.name for i, g in enumerate(groups)}
    hours: dict[str, float] = {}
    # GetMetricData takes up to 500 queries a call; the groups of a stack are at most 20.
    for page in cloudwatch.get_paginator("get_metric_data").paginate(
            MetricDataQueries=queries, StartTime=since, EndTime=now):
        for result in page["MetricDataResults"]:
            name = label[result["Id"]]
            hours[name] = hours.get(name, 0.0) + sum(result.get("Values", [])) * METRIC_PERIOD_SECONDS / 3600
    return hours


def measure(stack: str, backend: NodeGroups, ec2: Any, ce: Any, cloudwatch: Any, prices: Prices,
            now: datetime) -> tuple[list[NodeGroup], Spend]:
    """The stack's groups and its month-to-date spend now (AWS errors propagate)."""
    groups = backend.list_groups(stack)
    instances = running_instances(ec2, groups)
    settled = settled_cost(ce, stack, now)
    ran = group_instance_hours(cloudwatch, groups, settled_through(now), now)
    return groups, accrue(settled, instances, prices, now, spot_prices(ec2, instances, now), ran)


def _stop(stack: str, backend: NodeGroups, groups: list[NodeGroup], decision: Decision) -> dict[str, Any]:
    report = stop_groups(backend, groups, BUDGET)
    if report.changed:
        RUNTIME.sleep(SETTLE_SECONDS)
        confirm_budget_stops(backend, report)
    summary = {"stack": stack, **report.summary(BUDGET), "spend": decision.as_json()}
    if report.to_tell or report.errors:
        sent = notify_from_env(f"gpucluster {stack}: spend guard stopped compute ({decision.reason})"[:100],
                               summary)
        mark_told(backend, report, sent)
    log_event("spend guard done", **summary)
    raise_if_failed(report, stack)
    return summary


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point for the spend guard's schedule (the event's content is not used)."""
    stack = stack_from_env()
    limit, prices, check_minutes, cap = settings()
    now = RUNTIME.now()
    backend = stack_node_groups(strict_members=True)  # it prices the members: none known is an error
    try:
        groups, spend = measure(stack, backend, RUNTIME.client("ec2"), RUNTIME.client("ce"),
                                RUNTIME.client("cloudwatch"), prices, now)
    except AWS_ERRORS as exc:
        # Without the figures nothing can be decided: fail, so the retry or the next tick
        # runs again and the on-failure destination tells the topic.
        raise GuardrailError(f"stack {stack}: spend guard could not read spend: {exc}") from exc
    except PriceError as exc:
        raise ConfigError(f"stack {stack}: {exc}") from None
    decision = decide(spend, limit, check_minutes, cap, compute_running=any(g.running for g in groups))
    hit = when_limit(now, decision)
    log_event("spend measured", stack=stack, **decision.as_json(),
              settled_usd=round(spend.settled_usd, 2), accrued_usd=round(spend.accrued_usd, 2),
              limit_at=hit.isoformat() if hit else None)
    if not decision.stop:
        return {"action": "unchanged", "stack": stack, "spend": decision.as_json()}
    return _stop(stack, backend, groups, decision)
