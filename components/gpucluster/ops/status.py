"""What `gpucluster status` shows of each node group: capacity, who stopped it, health and GPU use.

`stack_status` reads a stack's groups through its node-group backend (`ops.nodegroups.Fleet`: the guardrails'
own seam, `gpucluster.fleet.nodegroups`). With `health=True` it also reads, per group, how many
nodes in service are healthy, the GPU utilisation of the last 15 minutes (the CloudWatch agent's
per-group series) and the last node the group replaced for its health, with the reason Auto
Scaling recorded. Read-only: `stop`, `start` and `resume` show it after they changed something.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpucluster.fleet.awsapi import batches
from gpucluster.fleet.nodegroups import STOP_FAILED
from gpucluster.node.userdata import GPU_METRIC_DIMENSION, GPU_UTILIZATION_METRIC
from gpucluster.ops.nodes import GETTING_READY, group_launches

if TYPE_CHECKING:
    from gpucluster.ops.nodegroups import Fleet

UTILIZATION_WINDOW = timedelta(minutes=15)
# What Auto Scaling writes in a scaling activity when it lets a node go for its health (EC2 Auto
# Scaling user guide, "View the reason for health check failures"; an abandoned launch hook, AWS
# knowledge center "lifecycle-actions-code-deploy": "... was abandoned: Lifecycle Action Completed
# with ABANDON Result" or "... was abandoned: Heartbeat Timeout").
REPLACEMENT_REASONS = (
    (("was abandoned", "Heartbeat Timeout"), "abandoned at launch: its health check did not answer in time"),
    (("was abandoned", "ABANDON Result"), "abandoned at launch: failed its health check"),
    (("in response to a user health-check",), "replaced: its health check marked it Unhealthy"),
    (("in response to an EC2 instance status check",), "replaced: failed EC2 status checks"),
    (("in response to an EC2 health check",), "replaced: EC2 health check (stopped or terminated)"),
)


@dataclass(frozen=True)
class Replacement:
    """The last node a group let go for its health."""

    time: str
    """When (ISO 8601, UTC)."""
    instance_id: str | None
    reason: str


@dataclass(frozen=True)
class GroupStatus:
    """One Auto Scaling group of a stack as an operator needs to see it."""

    name: str
    min_size: int
    desired_capacity: int
    max_size: int
    in_service: int
    stopped_by: str | None
    previous_desired: int | None
    node_group: str | None = None
    healthy: int | None = None
    """In service and Healthy (with health=True)."""
    gpu_utilization_avg: float | None = None
    """Mean GPU utilisation over the last 15 minutes, percent (None: no data)."""
    gpu_utilization_max: float | None = None
    """Busiest GPU's utilisation over the last 15 minutes, percent (None: no data)."""
    last_replacement: Replacement | None = None
    getting_ready: int = 0
    """Nodes launched but not yet in service (the launch hook holds them until they can run work)."""
    getting_ready_seconds: float | None = None
    """How long the longest of them has been getting ready (None: none, or unknown)."""
    state: str | None = None
    """The stored guard state (running, starting, stopping, stopped, stop-failed); None: tags only."""

    @property
    def stop_failed(self) -> bool:
        """A stop that could not set capacity to zero: the group may still run and cost."""
        return self.state == STOP_FAILED


def stack_status(
    fleet: Fleet,
    *,
    health: bool = False,
    metric_namespace: str = "",
    now: datetime | None = None,
) -> list[GroupStatus]:
    """Capacity and guardrail state of each group of the stack, sorted by name.

    `health` adds each group's healthy nodes, GPU utilisation (15 minutes, from the cluster's own
    `metric_namespace`, noderole.gpu_metric_namespace) and last health replacement: one
    GetMetricData for all groups, one activity page per group.
    """
    autoscaling = fleet.clients("autoscaling")
    groups = fleet.groups.list_groups(fleet.identity)
    usage: dict[str, tuple[float | None, float | None]] = {}
    if health and groups:
        usage = gpu_utilization(fleet.clients("cloudwatch"), metric_namespace, [g.name for g in groups],
                                now or datetime.now(UTC))
    rows = []
    for group in groups:
        previous = group.stop.previous_desired
        name = group.name
        extra: dict[str, Any] = {}
        if health:
            avg, peak = usage.get(name, (None, None))
            extra = {"node_group": group.node_group, "healthy": group.healthy,
                     "gpu_utilization_avg": avg, "gpu_utilization_max": peak,
                     "last_replacement": last_replacement(autoscaling, name)}
        waiting = [m.instance_id for m in group.members if m.lifecycle_state in GETTING_READY]
        if waiting:  # only then one more activity page: how long they have been at it
            launches = group_launches(autoscaling, name)
            starts = [t for i in waiting if isinstance(t := launches.get(i, (None, None))[0], datetime)]
            at = now or datetime.now(UTC)
            longest = max((at - t).total_seconds() for t in starts) if starts else None
            extra |= {"getting_ready": len(waiting), "getting_ready_seconds": longest}
        rows.append(
            GroupStatus(
                name=name,
                min_size=group.min_size,
                desired_capacity=group.desired,
                max_size=group.max_size,
                in_service=len(group.in_service_ids),
                stopped_by=group.stopped_by,
                previous_desired=int(previous) if previous and previous.isdigit() else None,
                state=group.stop.state,
                **extra,
            )
        )
    return rows


def gpu_utilization(cloudwatch: Any, namespace: str, asg_names: Sequence[str],
                    now: datetime) -> dict[str, tuple[float | None, float | None]]:
    """(mean, max) GPU utilisation of each group over the last 15 minutes, from 1-minute data.

    The mean is Sum / SampleCount over the window, so every GPU-minute weighs the same.
    """
    queries = []
    for i, name in enumerate(asg_names):
        for stat in ("Sum", "SampleCount", "Maximum"):
            queries.append({"Id": f"{stat.lower()}{i}", "ReturnData": True, "MetricStat": {
                "Metric": {"Namespace": namespace, "MetricName": GPU_UTILIZATION_METRIC,
                           "Dimensions": [{"Name": GPU_METRIC_DIMENSION, "Value": name}]},
                "Period": 60, "Stat": stat}})
    values: dict[str, list[float]] = {}
    for batch in batches(queries, 500):  # GetMetricData takes at most 500 queries
        kwargs: dict[str, Any] = {"MetricDataQueries": batch,
                                  "StartTime": now - UTILIZATION_WINDOW, "EndTime": now}
        while True:
            page = cloudwatch.get_metric_data(**kwargs)
            for result in page.get("MetricDataResults", []):
                values.setdefault(result["Id"], []).extend(result.get("Values", []))
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
    out: dict[str, tuple[float | None, float | None]] = {}
    for i, name in enumerate(asg_names):
        total, count, peaks = (values.get(f"{s}{i}", []) for s in ("sum", "samplecount", "maximum"))
        out[name] = (sum(total) / sum(count) if sum(count) else None, max(peaks) if peaks else None)
    return out


def replacement_reason(activity: Mapping[str, Any]) -> str | None:
    """Why an activity let a node go for its health, or None for any other activity."""
    text = " ".join(str(activity.get(k, "")) for k in ("Description", "StatusMessage", "Cause"))
    for needles, reason in REPLACEMENT_REASONS:
        if all(n in text for n in needles):
            return reason
    return None


def last_replacement(autoscaling: Any, asg_name: str) -> Replacement | None:
    """The newest health replacement among the group's last 100 scaling activities (newest first)."""
    activities = autoscaling.describe_scaling_activities(AutoScalingGroupName=asg_name,
                                                         MaxRecords=100).get("Activities", [])
    for activity in activities:
        reason = replacement_reason(activity)
        if reason is None:
            continue
        # "Launching a new EC2 instance: i-0123..." / "Terminating EC2 instance: i-0123 ..."
        words = str(activity.get("Description", "")).replace(".", " ").split()
        instance = next((w for w in words if w.startswith("i-")), None)
        start = activity.get("StartTime")
        when = (start.astimezone(UTC).isoformat(timespec="seconds") if isinstance(start, datetime)
                else str(start))
        return Replacement(time=when, instance_id=instance, reason=reason)
    return None
