"""What a stack actually cost and how much of its GPU time was idle: the arithmetic the spend report
handler (`lambdas.report`) and `gpucluster spend` share.

Cost comes from Cost Explorer (`GetCostAndUsage`, every page), filtered on the stack's identity tag
and grouped by the node-group tag and the purchase option; costs without a node-group tag are the
non-GPU remainder. Idle GPU time comes from the utilisation the nodes publish to CloudWatch (the
series the idle alarms watch): a period is idle when even the group's busiest GPU stays below the
threshold, and each sample is one GPU-minute, priced at what the group paid per GPU-hour in the
same days. It only reads; it never changes or deletes anything, never imports Pulumi.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from .awsapi import batches, group_tags, stack_groups
from .runtime import RUNTIME
from .tags import NODE_GROUP_TAG, STACK_TAG

# The node group of every resource a node group creates (gpucluster.aws.nodes.NODE_GROUP_TAG).
# What nodes publish GPU utilisation as (gpucluster.node.userdata: GPU_UTILIZATION_METRIC,
# GPU_METRIC_DIMENSION, GPU_METRIC_PERIOD_SECONDS; a test keeps them equal). The namespace is the
# cluster's own (gpucluster.noderole.gpu_metric_namespace): callers pass it, the Lambda reads it
# from GPU_METRIC_NAMESPACE in its environment.
GPU_UTILIZATION_METRIC = "nvidia_smi_utilization_gpu"
GPU_METRIC_DIMENSION = "AutoScalingGroupName"
GPU_SAMPLE_SECONDS = 60
DEFAULT_IDLE_THRESHOLD_PERCENT = 5.0
# Amortized: Savings Plan and reserved usage at its effective rate, the way the estimate prices
# a committed base (Cost Explorer user guide, "Understanding your AWS cost datasets").
COST_METRIC = "AmortizedCost"
FORECAST_METRIC = "AMORTIZED_COST"
# GetCostAndUsage groups by at most two keys (API reference, GroupBy).
GROUP_BY = [{"Type": "TAG", "Key": NODE_GROUP_TAG}, {"Type": "DIMENSION", "Key": "PURCHASE_TYPE"}]
# PURCHASE_TYPE values ("On Demand Instances", "Spot Instances", "Savings Plans", "Standard
# Reserved Instances", ...) by the words they contain; the first match wins, and a value none
# matches is kept as AWS wrote it.
PURCHASE_OPTIONS = (("spot", "spot"), ("savings plan", "savings_plan"), ("capacity block", "capacity_block"),
                    ("reserved", "reserved"), ("on demand", "on_demand"), ("on-demand", "on_demand"))
PURCHASE_LABELS = {"on_demand": "on-demand", "spot": "spot", "savings_plan": "Savings Plan covered",
                   "reserved": "reserved", "capacity_block": "Capacity Block"}
# CloudWatch keeps 1-minute data 15 days, 5-minute data 63 days, hourly data 455 days
# (CloudWatch user guide, "Metrics retention"): the finest the window's start still has.
RETENTION = ((timedelta(days=15), 60), (timedelta(days=63), 300), (timedelta(days=455), 3600))
MAX_QUERIES_PER_CALL = 500  # GetMetricData MetricDataQueries (API reference)
REPORT_PERIODS = ("weekly", "monthly")


def purchase_option(value: str) -> str:
    """A PURCHASE_TYPE value as one of PURCHASE_LABELS' keys, or as it is."""
    lowered = value.lower()
    return next((key for needle, key in PURCHASE_OPTIONS if needle in lowered), value)


def purchase_label(option: str) -> str:
    return PURCHASE_LABELS.get(option, option)


# ----------------------------------------------------------------- Cost Explorer


@dataclass(frozen=True)
class CostRow:
    """One Cost Explorer group of one time period: a node group (None: no GPU group) and a purchase option."""

    start: date
    node_group: str | None
    purchase: str
    usd: float
    estimated: bool = False


def tag_filter(identity: str) -> dict[str, Any]:
    """Costs carrying the stack's identity tag (a user-defined cost allocation tag, once activated)."""
    return {"Tags": {"Key": STACK_TAG, "Values": [identity]}}


def _tag_value(key: str) -> str | None:
    """`gpucluster:node-group$train` -> `train`; `gpucluster:node-group$` (untagged) -> None."""
    _, _, value = key.partition("$")
    return value or None


def cost_rows(ce: Any, identity: str, start: date, end: date, granularity: str = "DAILY") -> list[CostRow]:
    """Every group of every page of GetCostAndUsage for the stack, [start, end) in UTC days."""
    if end <= start:
        return []
    request: dict[str, Any] = {
        "TimePeriod": {"Start": start.isoformat(), "End": end.isoformat()},
        "Granularity": granularity, "Metrics": [COST_METRIC],
        "Filter": tag_filter(identity), "GroupBy": GROUP_BY,
    }
    rows: list[CostRow] = []
    while True:
        page = ce.get_cost_and_usage(**request)
        for result in page.get("ResultsByTime", []):
            day = date.fromisoformat(result["TimePeriod"]["Start"])
            for group in result.get("Groups", []):
                keys = group["Keys"]
                amount = float(group["Metrics"][COST_METRIC]["Amount"])
                rows.append(CostRow(day, _tag_value(keys[0]), purchase_option(keys[1]), amount,
                                    bool(result.get("Estimated"))))
        token = page.get("NextPageToken")
        if not token:
            return rows
        request["NextPageToken"] = token


def cost_forecast(ce: Any, identity: str, start: date, end: date) -> float | None:
    """Cost Explorer's forecast of the stack's cost in [start, end); None when it has too little history."""
    if end <= start:
        return 0.0
    try:
        answer = ce.get_cost_forecast(
            TimePeriod={"Start": start.isoformat(), "End": end.isoformat()}, Metric=FORECAST_METRIC,
            Granularity="MONTHLY", Filter=tag_filter(identity))
    except ce.exceptions.DataUnavailableException:
        return None
    return float(answer["Total"]["Amount"])


def totals(rows: Iterable[CostRow], key: str) -> dict[Any, float]:
    """USD summed by a CostRow attribute (node_group, purchase, start)."""
    out: dict[Any, float] = defaultdict(float)
    for row in rows:
        out[getattr(row, key)] += row.usd
    return dict(out)


# ------------------------------------------------------------------ CloudWatch


@dataclass(frozen=True)
class Usage:
    """GPU-hours the nodes reported and those spent below the idle threshold."""

    gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpu_hours + other.gpu_hours, self.idle_gpu_hours + other.idle_gpu_hours)


def metric_period(start: datetime, now: datetime) -> int:
    """The finest CloudWatch period still kept for data as old as `start`."""
    age = now - start
    return next((seconds for kept, seconds in RETENTION if age <= kept), RETENTION[-1][1])


def gpu_usage(cloudwatch: Any, namespace: str, asg_names: Sequence[str], start: datetime, end: datetime,
              threshold_percent: float, period: int) -> dict[str, dict[date, Usage]]:
    """Per Auto Scaling group and UTC day: GPU-hours reported and GPU-hours idle.

    Two statistics per period of the group's aggregated series: Maximum (idle when even the
    busiest GPU is below the threshold, as the idle alarm reads it) and SampleCount (every
    GPU publishes one sample a GPU_SAMPLE_SECONDS: the GPU-minutes in the period).
    """
    out: dict[str, dict[date, Usage]] = {name: {} for name in asg_names}
    for names in batches(asg_names, MAX_QUERIES_PER_CALL // 2):  # two queries a group
        queries = []
        for i, name in enumerate(names):
            metric = {"Namespace": namespace, "MetricName": GPU_UTILIZATION_METRIC,
                      "Dimensions": [{"Name": GPU_METRIC_DIMENSION, "Value": name}]}
            for stat, prefix in (("Maximum", "m"), ("SampleCount", "n")):
                queries.append({"Id": f"{prefix}{i}", "ReturnData": True,
                                "MetricStat": {"Metric": metric, "Period": period, "Stat": stat}})
        series: dict[str, dict[datetime, float]] = defaultdict(dict)
        request: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": start, "EndTime": end,
                                   "ScanBy": "TimestampAscending"}
        while True:
            page = cloudwatch.get_metric_data(**request)
            for result in page.get("MetricDataResults", []):
                series[result["Id"]].update(zip(result.get("Timestamps", []), result.get("Values", []),
                                                strict=True))
            token = page.get("NextToken")
            if not token:
                break
            request["NextToken"] = token
        for i, name in enumerate(names):
            busiest, samples = series.get(f"m{i}", {}), series.get(f"n{i}", {})
            counted: dict[date, list[float]] = defaultdict(lambda: [0.0, 0.0])
            for when, count in samples.items():
                day = counted[when.astimezone(UTC).date()]
                day[0] += count
                if when in busiest and busiest[when] < threshold_percent:
                    day[1] += count
            out[name] = {d: Usage(n * GPU_SAMPLE_SECONDS / 3600, idle * GPU_SAMPLE_SECONDS / 3600)
                         for d, (n, idle) in counted.items()}
    return out


def node_group_asgs(groups: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Auto Scaling groups -> the node group each belongs to (its node-group tag, else its own name)."""
    return {g["AutoScalingGroupName"]: group_tags(g).get(NODE_GROUP_TAG) or g["AutoScalingGroupName"]
            for g in groups}


def usage_by_node_group(usage: Mapping[str, Mapping[date, Usage]],
                        asgs: Mapping[str, str]) -> dict[str, Usage]:
    """Each group's usage over all days, summed per node group."""
    out: dict[str, Usage] = defaultdict(Usage)
    for asg, days in usage.items():
        for day_usage in days.values():
            out[asgs.get(asg, asg)] = out[asgs.get(asg, asg)] + day_usage
    return dict(out)


# ----------------------------------------------------------------------- waste


@dataclass(frozen=True)
class GroupWaste:
    """One node group's idle GPU-hours and what they cost at the price the group paid."""

    group: str
    usage: Usage
    cost_usd: float
    usd_per_gpu_hour: float | None
    basis: str

    @property
    def idle_usd(self) -> float:
        return self.usage.idle_gpu_hours * (self.usd_per_gpu_hour or 0.0)

    def as_json(self) -> dict[str, Any]:
        return {"group": self.group, "gpu_hours": round(self.usage.gpu_hours, 2),
                "idle_gpu_hours": round(self.usage.idle_gpu_hours, 2), "cost_usd": round(self.cost_usd, 2),
                "usd_per_gpu_hour": (None if self.usd_per_gpu_hour is None
                                     else round(self.usd_per_gpu_hour, 4)),
                "idle_usd": round(self.idle_usd, 2), "basis": self.basis}


@dataclass(frozen=True)
class Waste:
    groups: tuple[GroupWaste, ...]
    gpu_spend_usd: float

    @property
    def idle_usd(self) -> float:
        return sum(g.idle_usd for g in self.groups)

    @property
    def share_percent(self) -> float | None:
        """Idle cost as a share of GPU spend (costs carrying a node-group tag)."""
        return 100 * self.idle_usd / self.gpu_spend_usd if self.gpu_spend_usd > 0 else None

    def as_json(self) -> dict[str, Any]:
        share = self.share_percent
        return {"idle_usd": round(self.idle_usd, 2), "gpu_spend_usd": round(self.gpu_spend_usd, 2),
                "share_of_gpu_spend_percent": None if share is None else round(share, 1),
                "groups": [g.as_json() for g in self.groups]}


def idle_waste(cost_by_group: Mapping[str | None, float], usage_by_group: Mapping[str, Usage],
               fallback_usd_per_gpu_hour: Mapping[str, float] | None = None) -> Waste:
    """Idle GPU-hours of each group priced at what it paid per GPU-hour (its cost / its GPU-hours).

    Where Cost Explorer has no cost for a group (tag not active, data not in yet), the
    fallback rate is used (the estimate's, from `gpucluster spend`), said in `basis`.
    """
    fallback = fallback_usd_per_gpu_hour or {}
    names = sorted({g for g in cost_by_group if g is not None} | set(usage_by_group))
    groups = []
    for name in names:
        usage, cost = usage_by_group.get(name, Usage()), cost_by_group.get(name, 0.0)
        if cost > 0 and usage.gpu_hours > 0:
            rate: float | None = cost / usage.gpu_hours
            basis = f"paid: ${cost:,.2f} over {usage.gpu_hours:,.1f} GPU-hours"
        elif name in fallback:
            rate, basis = fallback[name], "estimate (no billed cost for the group in these days)"
        else:
            rate, basis = None, "no price: no billed cost and no estimate"
        groups.append(GroupWaste(name, usage, cost, rate, basis))
    gpu_spend = sum(v for k, v in cost_by_group.items() if k is not None)
    return Waste(tuple(groups), gpu_spend)


# --------------------------------------------------------------------- handler


def report_window(period: str, today: date) -> tuple[date, date]:
    """The days a report covers: the 7 before today (weekly), or this month before today (monthly)."""
    if period == "monthly":
        return today.replace(day=1), today
    return today - timedelta(days=7), today


def next_month(day: date) -> date:
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1)


@dataclass
class Report:
    stack: str
    period: str
    start: date
    end: date
    month_to_date_usd: float
    forecast_rest_usd: float | None
    budget_usd: float | None
    period_rows: list[CostRow] = field(default_factory=list)
    waste: Waste = field(default_factory=lambda: Waste((), 0.0))

    @property
    def forecast_month_usd(self) -> float | None:
        return None if self.forecast_rest_usd is None else self.month_to_date_usd + self.forecast_rest_usd

    def as_json(self) -> dict[str, Any]:
        by_group = totals(self.period_rows, "node_group")
        gpu_groups = {k: v for k, v in by_group.items() if k is not None}
        top = max(gpu_groups.items(), key=lambda kv: kv[1]) if gpu_groups else None
        forecast = self.forecast_month_usd
        return {
            "stack": self.stack, "report": self.period,
            "period": {"start": self.start.isoformat(), "end": self.end.isoformat()},
            "period_spend_usd": round(sum(by_group.values()), 2),
            "period_by_group_usd": {k or "non-GPU remainder": round(v, 2) for k, v in sorted(
                by_group.items(), key=lambda kv: -kv[1])},
            "month_to_date_usd": round(self.month_to_date_usd, 2),
            "forecast_month_usd": None if forecast is None else round(forecast, 2),
            "budget_usd": self.budget_usd,
            "forecast_of_budget_percent": (round(100 * forecast / self.budget_usd, 1)
                                           if forecast is not None and self.budget_usd else None),
            "top_group": None if top is None else {"name": top[0], "usd": round(top[1], 2)},
            "idle_waste": self.waste.as_json(),
        }

    def subject(self) -> str:
        forecast = self.forecast_month_usd
        ahead = (f", forecast ${forecast:,.0f}" + (f" of ${self.budget_usd:,.0f}" if self.budget_usd else "")
                 if forecast is not None else "")
        return (f"gpucluster {self.stack}: {self.period} spend ${self.month_to_date_usd:,.0f} this month"
                f"{ahead}, idle ${self.waste.idle_usd:,.0f}")


def build_report(stack: str, period: str, now: datetime, budget_usd: float | None,
                 threshold_percent: float) -> Report:
    today = now.astimezone(UTC).date()
    start, end = report_window(period, today)
    ce = RUNTIME.client("ce")
    month_start = today.replace(day=1)
    month_to_date = sum(r.usd for r in cost_rows(ce, stack, month_start, today, "MONTHLY"))
    forecast = cost_forecast(ce, stack, today, next_month(today))
    rows = cost_rows(ce, stack, start, end)
    asgs = node_group_asgs(stack_groups(RUNTIME.client("autoscaling"), stack))
    window_start = datetime.combine(start, time(), UTC)
    usage = gpu_usage(RUNTIME.client("cloudwatch"), os.environ["GPU_METRIC_NAMESPACE"], sorted(asgs),
                      window_start,
                      datetime.combine(end, time(), UTC), threshold_percent,
                      metric_period(window_start, now))
    waste = idle_waste(totals(rows, "node_group"), usage_by_node_group(usage, asgs))
    return Report(stack, period, start, end, month_to_date, forecast, budget_usd, rows, waste)
