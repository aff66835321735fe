"""Month-to-date spend as the spend guard measures it: the settled Cost Explorer figure, the in-service
instances, their spot prices and the hours of instances already gone.

The spend guard handler (`lambdas.spend_guard`) decides on it and `gpucluster status` shows the same
figure (`ops.overview`); the maths is `accrual`'s. It reads AWS (errors propagate to the caller,
which decides whether a missing figure fails the run); its only writes are the spend guard's
`Memory` in the guard-state table (the kept settled figure, the instance ledger). Never imports Pulumi.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
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
from .capacityblocks import named_reservations, needed, stack_blocks
from .instanceledger import InstanceLedger, Sighting, gone_hours, settles_on, unrecorded_since
from .nodegroups import NodeGroup, NodeGroups
from .settledcache import SettledCache, settled_figure
from .tags import STACK_TAG

DEFAULT_CHECK_MINUTES = 5.0
COST_METRIC = "UnblendedCost"
SPOT_PRODUCT = "Linux/UNIX"
METRIC_PERIOD_SECONDS = 300


class CostAnswerError(RuntimeError):
    """Cost Explorer answered without a figure: no result rows, no Total, no UnblendedCost, no Amount.

    Read as $0 it would let the guard report "unchanged" while over the limit: the invocation fails
    instead (the retry or the next tick reads again; the on-failure destination tells the topic).
    """


def _amount(result: Any) -> float:
    """The UnblendedCost figure of one ResultsByTime row; CostAnswerError when it holds none."""
    total = result.get("Total") if isinstance(result, dict) else None
    metric = total.get(COST_METRIC) if isinstance(total, dict) else None
    amount = metric.get("Amount") if isinstance(metric, dict) else None
    if not isinstance(amount, str) or not amount.strip():
        others = sorted(total) if isinstance(total, dict) else []
        period = result.get("TimePeriod") if isinstance(result, dict) else None
        raise CostAnswerError(f"Cost Explorer row {period} has no {COST_METRIC} amount "
                              f"(Total holds {others or 'nothing'})")
    try:
        value = float(amount)
    except ValueError:
        raise CostAnswerError(f"Cost Explorer {COST_METRIC} amount {amount!r} is not a number") from None
    if not math.isfinite(value):
        raise CostAnswerError(f"Cost Explorer {COST_METRIC} amount {amount!r} is not a figure")
    return value


def settled_cost(ce: Any, stack: str, now: datetime) -> float:
    """Month-to-date cost of resources tagged with the stack, through `accrual.settled_through`.

    Budgets and Cost Explorer count only costs carrying an activated cost-allocation tag
    (Billing user guide, "Activating user-defined cost allocation tags"). A MONTHLY query over
    a period inside one month answers one row whose Total holds the metric asked for, "0" when
    nothing matched (ledger: ce-empty-answer-has-a-zero-row); anything else is `CostAnswerError`.
    """
    period = cost_period(now)
    if period is None:
        return 0.0
    total, token, rows = 0.0, None, 0
    while True:
        kwargs: dict[str, Any] = {
            "TimePeriod": period, "Granularity": "MONTHLY", "Metrics": [COST_METRIC],
            "Filter": {"Tags": {"Key": STACK_TAG, "Values": [stack], "MatchOptions": ["EQUALS"]}}}
        if token:
            kwargs["NextPageToken"] = token
        answer = ce.get_cost_and_usage(**kwargs)
        results = answer.get("ResultsByTime")
        for result in results if isinstance(results, list) else []:
            total += _amount(result)
            rows += 1
        token = answer.get("NextPageToken")
        if not token:
            if rows == 0:
                raise CostAnswerError(f"Cost Explorer answered no result rows for {period['Start']}.."
                                      f"{period['End']}")
            return total


def running_instances(ec2: Any, groups: Sequence[NodeGroup]) -> list[Instance]:
    """The groups' in-service instances with their purchase option, launch time and reservation."""
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
                        inst.get("Placement", {}).get("AvailabilityZone"), inst.get("CapacityReservationId")))
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


@dataclass
class Memory:
    """What the spend guard keeps between ticks in the guard-state table: the settled figure, the instances.

    None of either (a stack without a table: `gpucluster status` on a tags-only stack) reads Cost
    Explorer each time and the groups' GroupInServiceInstances metric for instances gone.
    """

    settled: SettledCache | None = None
    ledger: InstanceLedger | None = None
    check_seconds: float = DEFAULT_CHECK_MINUTES * 60
    cost_explorer_reads: int = 0
    """Cost Explorer reads this measure made (0: the kept figure served)."""
    seen: list[Instance] = field(default_factory=list)
    read: tuple[dict[str, Sighting], int | None] | None = None
    unrecorded: datetime | None = None
    """When the ledger began, while instances that stopped before then (and after the settled point)
    may be missing from the figure; None when nothing is known to be missing."""

    @property
    def gap_untold(self) -> bool:
        """The figure may miss instances stopped before the ledger began and nobody was told yet."""
        return self.unrecorded is not None and self.ledger is not None and not self.ledger.gap_told

    @classmethod
    def in_table(cls, dynamodb: Any, table: str | None, stack: str, check_minutes: float) -> Memory:
        if not table:
            return cls(check_seconds=check_minutes * 60)
        return cls(SettledCache(dynamodb, table, stack), InstanceLedger(dynamodb, table, stack),
                   check_minutes * 60)

    def remember(self, now: datetime, gap_told: bool = False) -> None:
        """Record this tick's instances (after the decision: a failed write fails the invocation then);
        `gap_told`: the instances the ledger may miss were told this tick."""
        if self.ledger is not None:
            self.ledger.record(self.seen, now, settled_through(now), self.read, gap_told)


def unrecorded_note(begun: datetime, since: datetime) -> str:
    """The figure's known gap in one line: instances stopped between the settled point and the ledger."""
    return (f"instances that stopped between {since:%Y-%m-%d %H:%M} and {begun:%Y-%m-%d %H:%M} UTC (before "
            f"the spend guard began recording instances) are not counted until Cost Explorer settles "
            f"them ({settles_on(begun):%Y-%m-%d %H:%M} UTC): the figure may be low until then")


def measure_groups(stack: str, groups: Sequence[NodeGroup], ec2: Any, ce: Any, cloudwatch: Any,
                   prices: Prices, now: datetime, memory: Memory | None = None) -> Spend:
    """The month-to-date spend of `groups` (read just before) now; AWS errors propagate."""
    memory = memory if memory is not None else Memory()
    instances = running_instances(ec2, groups)
    since = settled_through(now)

    def read() -> float:
        memory.cost_explorer_reads += 1 if cost_period(now) is not None else 0
        return settled_cost(ce, stack, now)

    settled, _ = settled_figure(read, memory.settled, now)
    gone: list[tuple[Instance, float]] = []
    ran: dict[str, float] = {}
    if memory.ledger is not None:
        memory.read = memory.ledger.read()
        memory.seen = instances
        gone = gone_hours(memory.read[0], [i.instance_id for i in instances], since, now,
                          memory.check_seconds)
        memory.unrecorded = unrecorded_since(memory.ledger.started, since, now)
    else:
        ran = group_instance_hours(cloudwatch, groups, since, now)
    every = [*instances, *(i for i, _ in gone)]
    # A block's fee is counted once from its reservation: a failed read propagates (its instances
    # priced by the hour could miss a fee paid since the settled point: an under-count).
    blocks = stack_blocks(ec2, stack, named_reservations(prices, every)) if needed(prices, every) else []
    spot = spot_prices(ec2, every, now)
    spend = accrue(settled, instances, prices, now, spot, ran, gone, blocks)
    if memory.unrecorded is not None:
        spend = replace(spend, notes=(*spend.notes, unrecorded_note(memory.unrecorded, since)))
    return spend


def measure(stack: str, backend: NodeGroups, ec2: Any, ce: Any, cloudwatch: Any, prices: Prices,
            now: datetime, memory: Memory | None = None) -> tuple[list[NodeGroup], Spend]:
    """The stack's groups and its month-to-date spend now (AWS errors propagate)."""
    groups = backend.list_groups(stack)
    return groups, measure_groups(stack, groups, ec2, ce, cloudwatch, prices, now, memory)
