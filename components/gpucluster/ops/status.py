"""Operator actions on a running stack: resume what guardrails stopped, and show group status.

These back `gpucluster resume STACK` and `gpucluster status STACK`. They talk
to AWS with plain boto3 clients (so AWS_ENDPOINT_URL is honoured) and read and
restore node groups through the Lambdas' own seam (`gpucluster.fleet.nodegroups`).
With `health=True` the status also reads, per group, how many nodes in service
are healthy, the GPU utilisation of the last 15 minutes (the CloudWatch agent's
per-group series) and the last node the group replaced for its health, with
the reason Auto Scaling recorded (read-only, like all of status).
Resuming is planned first (`plan_resume`, read-only, for the operator to see
and confirm) and then done on the groups shown, each described again right
before its write. It only restores capacity recorded by a guardrail; nothing
is ever deleted.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3

from gpucluster.fleet.awsapi import batches
from gpucluster.fleet.nodegroups import STOP_FAILED, ResumeResult, resume_decision
from gpucluster.node.userdata import GPU_METRIC_DIMENSION, GPU_UTILIZATION_METRIC
from gpucluster.ops import node_groups
from gpucluster.ops.nodes import GETTING_READY, NodesError, group_launches

__all__ = ["GroupStatus", "Replacement", "ResumeCandidate", "ResumeResult", "plan_resume", "resume_stack",
           "stack_status"]

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


@dataclass(frozen=True)
class ResumeCandidate:
    """One group of the stack and what `resume` would do to it (nothing is changed yet)."""

    decision: ResumeResult
    """action "resume" (with the min/desired it would restore) or "skipped" (with why)."""
    node_group: str | None
    """From the group's gpucluster:node-group tag; None when the tag is missing."""
    desired_now: int
    max_size: int

    @property
    def group(self) -> str:
        return self.decision.group

    @property
    def added_nodes(self) -> int:
        """Nodes the resume would start on top of what the group runs now."""
        if self.decision.desired_capacity is None:
            return 0
        return max(0, self.decision.desired_capacity - self.desired_now)


def plan_resume(
    stack: str,
    *,
    autoscaling_client: Any = None,
    only_stopped_by: Collection[str] | None = None,
    pcs_cluster_id: str | None = None,
) -> list[ResumeCandidate]:
    """What resuming the stack would do to each of its groups, sorted by name; read-only.

    `pcs_cluster_id`: a Slurm stack's PCS cluster (its `pcs_cluster_id` output): its groups are the
    cluster's compute node groups (`ops.node_groups`)."""
    backend = node_groups(autoscaling_client, identity=stack, pcs_cluster_id=pcs_cluster_id)
    return [
        ResumeCandidate(
            decision=resume_decision(group, only_stopped_by),
            node_group=group.node_group,
            desired_now=group.desired,
            max_size=group.max_size,
        )
        for group in backend.list_groups(stack)
    ]


def resume_stack(
    stack: str,
    *,
    autoscaling_client: Any = None,
    only_stopped_by: Collection[str] | None = None,
    shown: Mapping[str, str | None] | None = None,
    pcs_cluster_id: str | None = None,
    ssm_client: Any = None,
    ec2_client: Any = None,
) -> list[ResumeResult]:
    """Restore every guardrail-stopped group of the stack to its recorded min/desired.

    The operator's resume undoes any stop, budget included: a person decided.
    `only_stopped_by` narrows it (e.g. {"idle"}). Groups not stopped are skipped.
    `shown` (group -> the stopped-by the operator saw and confirmed) limits the
    resume to those groups, and skips any whose stop changed since: a person
    who confirmed undoing an idle stop has not agreed to undo a budget stop.
    Each group is described again right before its write. On a Slurm stack (`pcs_cluster_id`) the
    running groups' partitions are then set UP on the login node (`lambdas.slurmhold`); a release
    that fails raises `SlurmReleaseError` (capacity is back; running resume again releases them).
    """
    backend = node_groups(autoscaling_client, identity=stack, pcs_cluster_id=pcs_cluster_id)
    names = [g.name for g in backend.list_groups(stack)]
    results = []
    for name in names:
        if shown is not None and name not in shown:
            continue
        for group in backend.read_groups([name]):
            label = group.stopped_by
            if shown is not None and label != shown[name]:
                now = f"stopped by {label}" if label else "no longer stopped by a guardrail"
                results.append(ResumeResult(name, "skipped", label,
                                            reason=f"changed since shown: now {now}"))
                continue
            results.append(backend.restore(group, only_stopped_by=only_stopped_by))
    if pcs_cluster_id:
        release_partitions_after(backend, stack, ssm_client, ec2_client)
    return results


class SlurmReleaseError(NodesError):
    """The capacity is back but the partitions stay held: the login node did not set them UP."""


def release_partitions_after(backend: Any, stack: str, ssm_client: Any = None,
                             ec2_client: Any = None) -> None:
    """Set UP the partitions of every running group not stopped (idempotent: a second run is harmless)."""
    from gpucluster.fleet.slurmhold import release_partitions

    partitions = [g.label for g in backend.list_groups(stack) if g.running and not g.stopped_by]
    if not partitions:
        return
    result = release_partitions(ssm_client or boto3.client("ssm"), ec2_client or boto3.client("ec2"), stack,
                                partitions)
    if not result.ok:
        held = ", ".join(partitions)
        raise SlurmReleaseError(f"partitions {held} still held (login node: {result.summary()}); "
                                "run the command again")


def stack_status(
    stack: str,
    *,
    autoscaling_client: Any = None,
    cloudwatch_client: Any = None,
    health: bool = False,
    metric_namespace: str = "",
    now: datetime | None = None,
    pcs_cluster_id: str | None = None,
) -> list[GroupStatus]:
    """Capacity and guardrail state of each group of the stack, sorted by name.

    `health` adds each group's healthy nodes, GPU utilisation (15 minutes, from the cluster's own
    `metric_namespace`, noderole.gpu_metric_namespace) and last health replacement: one
    GetMetricData for all groups, one activity page per group.
    """
    autoscaling = autoscaling_client or boto3.client("autoscaling")
    groups = node_groups(autoscaling, identity=stack, pcs_cluster_id=pcs_cluster_id).list_groups(stack)
    usage: dict[str, tuple[float | None, float | None]] = {}
    if health and groups:
        cloudwatch = cloudwatch_client or boto3.client("cloudwatch")
        usage = gpu_utilization(cloudwatch, metric_namespace, [g.name for g in groups],
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
