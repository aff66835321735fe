"""What a deployed stack actually cost, next to what `gpucluster cost` estimated, and its idle waste.

Backs `gpucluster spend STACK`. The actual cost is Cost Explorer's (every page of
GetCostAndUsage, filtered on the stack's identity tag, `StackSpec.identity`),
by node group and purchase option, with the non-GPU remainder; the estimate is the cost
model's for the same UTC days, node groups at desired nodes for the hours the schedules
leave them running (`gpucluster.schedule`); the gap comes with its likely reasons (the
cost allocation tags not active, nodes above desired, less spot than configured, stops
the estimate cannot know). Idle waste is the GPU-hours each group spent below the idle
threshold (CloudWatch, the series the idle alarms watch) at the price it paid. The
arithmetic on AWS answers is shared with the report Lambda (`gpucluster.fleet.spendreport`).
Read-only: clients are passed in (tests hand Stubber or moto clients); nothing is changed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from gpucluster import pricing, schedule
from gpucluster.fleet.awsapi import stack_groups
from gpucluster.fleet.spendreport import (
    CostRow,
    Usage,
    Waste,
    cost_rows,
    gpu_usage,
    idle_waste,
    metric_period,
    node_group_asgs,
    purchase_label,
    totals,
    usage_by_node_group,
)
from gpucluster.fleet.tags import NODE_GROUP_TAG, STACK_TAG
from gpucluster.noderole import gpu_metric_namespace
from gpucluster.ops import OpsError
from gpucluster.ops.awserrors import AWS_ERRORS, describe
from gpucluster.spec import StackSpec

# Cost Explorer keeps 13 months (the last 12 and this one): API reference, GetCostAndUsage TimePeriod.
MAX_DAYS = 366
GAP_SHARE = 0.2       # a gap over 20 % of the estimate ...
GAP_MIN_USD = 5.0     # ... and over $5 is worth explaining
NODE_HOURS_SLACK = 1.1
SPOT_SHARE_SLACK_POINTS = 15.0


class SpendError(OpsError):
    """Bad --days / --month, or a stack that cannot be priced."""


# ---------------------------------------------------------------------- window


@dataclass(frozen=True)
class Window:
    """UTC days [start, end), as Cost Explorer counts them."""

    start: date
    end: date

    @property
    def days(self) -> list[date]:
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days)]

    @property
    def start_time(self) -> datetime:
        return datetime.combine(self.start, time(), UTC)

    @property
    def end_time(self) -> datetime:
        return datetime.combine(self.end, time(), UTC)


def window_for(today: date, days: int | None = None, month: str | None = None) -> Window:
    """--days N: the N whole days before today; --month YYYY-MM: that month, up to today at most."""
    if days is not None and month is not None:
        raise SpendError("give --days or --month, not both")
    if month is not None:
        found = re.fullmatch(r"(\d{4})-(\d{2})", month)
        if not found or not 1 <= int(found.group(2)) <= 12:
            raise SpendError(f"--month: expected YYYY-MM, got {month!r}")
        start = date(int(found.group(1)), int(found.group(2)), 1)
        if start >= today:
            raise SpendError(f"--month {month} has no finished day yet (today is {today.isoformat()})")
        end = min((start.replace(day=28) + timedelta(days=4)).replace(day=1), today)
        if (today - start).days > MAX_DAYS + 31:
            raise SpendError(f"--month {month}: Cost Explorer keeps the last 13 months only")
        return Window(start, end)
    days = 7 if days is None else days
    if not 1 <= days <= MAX_DAYS:
        raise SpendError(f"--days: must be 1..{MAX_DAYS}, got {days}")
    return Window(today - timedelta(days=days), today)


# -------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class Estimate:
    """The cost model's figure for each day of a window: node groups at desired nodes, as scheduled."""

    by_day: dict[date, float]
    by_group: dict[str | None, float]
    """Node group name -> USD; None: everything else (NAT, endpoints, FSx, S3)."""
    running_hours: float
    node_hours: dict[str, float]
    spot_share_percent: dict[str, float]
    node_hour_prices: dict[str, pricing.Rate]
    """Node group name -> its one node-hour price and basis (pricing.node_hour_price)."""

    @property
    def total(self) -> float:
        return sum(self.by_day.values())


def estimate_window(cost: pricing.StackCost, spec: StackSpec, window: Window) -> Estimate:
    """Price each UTC day: running hours of the schedules x each group's mix at desired nodes."""
    intervals = schedule.running_intervals(spec.autostop, window.start_time, window.end_time)
    hours = schedule.hours_by_day(intervals, window.days)
    by_day: dict[date, float] = defaultdict(float)
    by_group: dict[str | None, float] = defaultdict(float)
    node_hours: dict[str, float] = {}
    ebs = {o.name: o for o in cost.other if o.kind == "ebs"}
    for g in cost.groups:
        volumes = ebs.get(f"EBS root volumes {g.name}")
        for day in window.days:
            if g.capacity_block:
                # Paid up front for its duration, on days the estimate cannot know: the month's
                # figure (block and root volumes) spread evenly over the month.
                running = 24.0
                month = g.usd_per_month("desired") + (volumes.usd_per_month("desired") if volumes else 0.0)
                usd = month * running / pricing.HOURS_PER_MONTH
            else:
                running = hours[day]
                usd = g.usd_per_hour("desired") * running
                if volumes is not None:
                    usd += volumes.usd_per_month("desired") / pricing.HOURS_PER_MONTH * running
            by_day[day] += usd
            by_group[g.name] += usd
        node_hours[g.name] = g.desired.nodes * sum(hours.values())
    for o in cost.other:
        if o.kind == "ebs":
            continue
        usd = o.usd_per_month("desired") * 24 / pricing.HOURS_PER_MONTH
        for day in window.days:
            by_day[day] += usd
            by_group[None] += usd
    spot = {}
    for g in cost.groups:
        mix = g.usd_per_hour("desired") or g.usd_per_hour("max")
        parts = g.parts("desired") if g.usd_per_hour("desired") else g.parts("max")
        spot[g.name] = 100 * parts["spot"] / mix if mix else 0.0
    prices = {g.name: pricing.node_hour_price(g) for g in cost.groups}
    return Estimate(dict(by_day), dict(by_group), sum(hours.values()), node_hours, spot, prices)


# ---------------------------------------------------------------------- report


@dataclass(frozen=True)
class Spend:
    """`gpucluster spend`: actual, estimate, gap and why, idle waste."""

    stack: str
    identity: str
    region: str
    window: Window
    rows: tuple[CostRow, ...]
    estimate: Estimate
    waste: Waste
    reasons: tuple[str, ...]
    tag_status: dict[str, str]

    @property
    def actual(self) -> float:
        return sum(r.usd for r in self.rows)

    @property
    def gap(self) -> float:
        return self.actual - self.estimate.total

    @property
    def gap_is_large(self) -> bool:
        return abs(self.gap) > max(GAP_MIN_USD, GAP_SHARE * self.estimate.total)

    @property
    def estimated_days(self) -> bool:
        """Cost Explorer marks the latest days as estimated until the bill settles."""
        return any(r.estimated for r in self.rows)

    def by_group(self) -> dict[str | None, float]:
        return totals(self.rows, "node_group")

    def by_group_and_purchase(self) -> dict[str | None, dict[str, float]]:
        out: dict[str | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for r in self.rows:
            out[r.node_group][r.purchase] += r.usd
        return {k: dict(v) for k, v in out.items()}

    def actual_by_day(self) -> dict[date, float]:
        by_day = totals(self.rows, "start")
        return {day: by_day.get(day, 0.0) for day in self.window.days}

    def as_json(self) -> dict[str, Any]:
        groups = self.by_group_and_purchase()
        names = [g for g in groups if g is not None] + [g for g in self.estimate.by_group if g is not None
                                                         and g not in groups]
        share, prices = self.waste.share_percent, self.estimate.node_hour_prices
        return {
            "stack": self.stack, "identity": self.identity, "region": self.region, "currency": "USD",
            "period": {"start": self.window.start.isoformat(), "end": self.window.end.isoformat(),
                       "days": len(self.window.days)},
            "actual_usd": round(self.actual, 2), "estimate_usd": round(self.estimate.total, 2),
            "gap_usd": round(self.gap, 2),
            "gap_percent": round(100 * self.gap / self.estimate.total, 1) if self.estimate.total else None,
            "gap_is_large": self.gap_is_large, "reasons": list(self.reasons),
            "cost_explorer_estimated": self.estimated_days,
            "node_groups": [{"name": name, "actual_usd": round(sum(groups.get(name, {}).values()), 2),
                             "estimate_usd": round(self.estimate.by_group.get(name, 0.0), 2),
                             "by_purchase_option_usd": {purchase_label(k): round(v, 2)
                                                        for k, v in sorted(groups.get(name, {}).items())}}
                            for name in names],
            "non_gpu": {"actual_usd": round(sum(groups.get(None, {}).values()), 2),
                        "estimate_usd": round(self.estimate.by_group.get(None, 0.0), 2)},
            "daily": [{"day": day.isoformat(), "actual_usd": round(actual, 2),
                       "estimate_usd": round(self.estimate.by_day.get(day, 0.0), 2)}
                      for day, actual in self.actual_by_day().items()],
            "idle_waste": {**self.waste.as_json(),
                           "share_of_gpu_spend_percent": None if share is None else round(share, 1)},
            "cost_allocation_tags": self.tag_status,
            "usd_per_node_hour": {k: round(v.usd_per_hour, 4) for k, v in prices.items()},
            "price_basis": {k: v.basis for k, v in prices.items()},
        }


def tag_status(ce: Any, keys: Sequence[str]) -> dict[str, str]:
    """Each cost allocation tag's status: Active, Inactive, "not seen" (never on a billed resource),
    or why it could not be read."""
    try:
        found: dict[str, str] = {}
        request: dict[str, Any] = {"TagKeys": list(keys)}
        while True:
            page = ce.list_cost_allocation_tags(**request)
            found.update({t["TagKey"]: t["Status"] for t in page.get("CostAllocationTags", [])})
            if not page.get("NextToken"):
                break
            request["NextToken"] = page["NextToken"]
    except AWS_ERRORS as err:
        return {key: f"unknown ({describe(err)})" for key in keys}
    return {key: found.get(key, "not seen") for key in keys}


def explain_gap(spend_rows: Sequence[CostRow], estimate: Estimate, tags: Mapping[str, str],
                usage: Mapping[str, Usage], gpus_per_node: Mapping[str, int],
                desired_now: Mapping[str, tuple[int, int]]) -> list[str]:
    """The likely reasons an actual figure differs from the estimate, most certain first."""
    actual = sum(r.usd for r in spend_rows)
    reasons = []
    stack_tag = tags.get(STACK_TAG, "not seen")
    if stack_tag != "Active":
        reasons.append(f"the cost allocation tag {STACK_TAG} is {stack_tag}, not Active: Cost Explorer "
                       "and the budget see none of the stack's costs (activate it in the Billing console, "
                       "Cost allocation tags; costs count from activation, not before)")
    group_tag = tags.get(NODE_GROUP_TAG, "not seen")
    if group_tag != "Active":
        reasons.append(f"the cost allocation tag {NODE_GROUP_TAG} is {group_tag}: node costs land in "
                       "the non-GPU remainder instead of their group")
    groups = totals(spend_rows, "node_group")
    by_purchase: dict[str | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in spend_rows:
        by_purchase[r.node_group][r.purchase] += r.usd
    for name, planned in estimate.node_hours.items():
        ran = usage.get(name, Usage()).gpu_hours / max(1, gpus_per_node.get(name, 1))
        if ran > planned * NODE_HOURS_SLACK and ran - planned >= 1:
            reasons.append(f"node group {name} ran {ran:,.1f} node-hours, the estimate counts {planned:,.1f} "
                           "(desired_nodes x the scheduled hours): nodes above desired, or running "
                           "outside the schedule")
        configured, now = desired_now.get(name, (0, 0))
        if now > configured:
            reasons.append(f"node group {name} is at {now} desired nodes now, the stack file says "
                           f"{configured}")
        group_cost = groups.get(name, 0.0)
        if group_cost > 0:
            spot = 100 * by_purchase[name].get("spot", 0.0) / group_cost
            expected = estimate.spot_share_percent.get(name, 0.0)
            if expected - spot > SPOT_SHARE_SLACK_POINTS:
                reasons.append(f"node group {name}: spot was {spot:.0f} % of its cost, the configured mix "
                               f"makes it {expected:.0f} %: spot capacity was short and nodes ran on-demand")
    if actual < estimate.total and stack_tag == "Active":
        reasons.append("idle, schedule, lifetime and budget stops only remove hours: the estimate is an "
                       "upper bound; and Cost Explorer's last day can lag up to 24 hours")
    return reasons


def stack_spend(spec: StackSpec, window: Window, *, ce: Any, cloudwatch: Any, autoscaling: Any,
                now: datetime | None = None, cost: pricing.StackCost | None = None) -> Spend:
    """Actual against estimate for `window`, with the gap's reasons and the idle waste."""
    now = now or datetime.now(UTC)
    try:
        cost = cost or pricing.price_stack(spec, pricing.Assumptions(schedule_year=window.start.year))
    except pricing.PricingError as err:
        raise SpendError(f"cannot price stack {spec.stack}: {err}") from None
    ident = spec.identity
    rows = cost_rows(ce, ident, window.start, window.end)
    estimate = estimate_window(cost, spec, window)
    groups = stack_groups(autoscaling, ident)
    asgs = node_group_asgs(groups)
    threshold = spec.autostop.gpu_utilization_threshold_percent
    usage = usage_by_node_group(
        gpu_usage(cloudwatch, gpu_metric_namespace(spec.cluster.name), sorted(asgs), window.start_time,
                  window.end_time, threshold,
                  metric_period(window.start_time, now)), asgs)
    gpus = {g.name: g.types[0].gpus for g in spec.node_groups}
    fallback = {name: rate.usd_per_hour / gpus[name]
                for name, rate in estimate.node_hour_prices.items() if gpus[name]}
    waste = idle_waste(totals(rows, "node_group"), usage, fallback)
    tags = tag_status(ce, [STACK_TAG, NODE_GROUP_TAG])
    desired_now = {}
    configured = {g.name: g.desired_nodes for g in spec.node_groups}
    for group in groups:
        name = asgs.get(group["AutoScalingGroupName"])
        if name in configured:
            desired_now[name] = (configured[name], int(group["DesiredCapacity"]))
    reasons = explain_gap(rows, estimate, tags, usage, gpus, desired_now)
    return Spend(spec.stack, ident, spec.region, window, tuple(rows), estimate, waste, tuple(reasons), tags)
