"""Month-to-date spend as the spend guard measures it: the settled Cost Explorer figure, the in-service
instances, their spot prices and the hours of instances already gone.

The spend guard handler (`lambdas.spend_guard`) decides on it and `gpucluster status` shows the same
figure (`ops.overview`); the maths is `accrual`'s. It only reads (AWS errors propagate to the
caller, which decides whether a missing figure fails the run), never imports Pulumi.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from .accrual import (
    CAPACITY_BLOCK,
    ON_DEMAND,
    SPOT,
    Instance,
    Prices,
    Spend,
    accrue,
    cost_period,
    settled_through,
)
from .awsapi import AWS_ERRORS, batches, log_event
from .nodegroups import NodeGroup, NodeGroups
from .tags import STACK_TAG

DEFAULT_CHECK_MINUTES = 5.0
COST_METRIC = "UnblendedCost"
SPOT_PRODUCT = "Linux/UNIX"
METRIC_PERIOD_SECONDS = 300




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
