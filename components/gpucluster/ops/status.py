"""Operator actions on a running stack: resume what guardrails stopped, and show group status.

These back `gpucluster resume STACK` and `gpucluster status STACK`. They talk
to AWS with plain boto3 clients (so AWS_ENDPOINT_URL is honoured) and share the
tag contract with the Lambda handlers through `gpucluster.lambdas.scaling`.
Resuming is planned first (`plan_resume`, read-only, for the operator to see
and confirm) and then done on the groups shown, each described again right
before its write. It only restores capacity recorded by a guardrail; nothing
is ever deleted.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import boto3

from gpucluster.lambdas.scaling import (
    PREVIOUS_DESIRED_TAG,
    STOPPED_BY_TAG,
    ResumeResult,
    describe_groups,
    group_tags,
    in_service_instance_ids,
    resume_decision,
    resume_group,
    stack_groups,
)

__all__ = ["GroupStatus", "ResumeCandidate", "ResumeResult", "plan_resume", "resume_stack",
           "stack_status"]

# The node group a group belongs to (gpucluster.aws.nodes.NODE_GROUP_TAG; not imported: Pulumi).
NODE_GROUP_TAG = "gpucluster:node-group"


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
) -> list[ResumeCandidate]:
    """What resuming the stack would do to each of its groups, sorted by name; read-only."""
    autoscaling = autoscaling_client or boto3.client("autoscaling")
    return [
        ResumeCandidate(
            decision=resume_decision(group, only_stopped_by),
            node_group=group_tags(group).get(NODE_GROUP_TAG),
            desired_now=int(group["DesiredCapacity"]),
            max_size=int(group["MaxSize"]),
        )
        for group in stack_groups(autoscaling, stack)
    ]


def resume_stack(
    stack: str,
    *,
    autoscaling_client: Any = None,
    only_stopped_by: Collection[str] | None = None,
    shown: Mapping[str, str | None] | None = None,
) -> list[ResumeResult]:
    """Restore every guardrail-stopped group of the stack to its recorded min/desired.

    The operator's resume undoes any stop, budget included: a person decided.
    `only_stopped_by` narrows it (e.g. {"idle"}). Groups not stopped are skipped.
    `shown` (group -> the stopped-by the operator saw and confirmed) limits the
    resume to those groups, and skips any whose stop changed since: a person
    who confirmed undoing an idle stop has not agreed to undo a budget stop.
    Each group is described again right before its write.
    """
    autoscaling = autoscaling_client or boto3.client("autoscaling")
    names = [g["AutoScalingGroupName"] for g in stack_groups(autoscaling, stack)]
    results = []
    for name in names:
        if shown is not None and name not in shown:
            continue
        for group in describe_groups(autoscaling, [name]):
            label = group_tags(group).get(STOPPED_BY_TAG)
            if shown is not None and label != shown[name]:
                now = f"stopped by {label}" if label else "no longer stopped by a guardrail"
                results.append(ResumeResult(name, "skipped", label,
                                            reason=f"changed since shown: now {now}"))
                continue
            results.append(resume_group(autoscaling, group, only_stopped_by=only_stopped_by))
    return results


def stack_status(stack: str, *, autoscaling_client: Any = None) -> list[GroupStatus]:
    """Capacity and guardrail state of each group of the stack, sorted by name."""
    autoscaling = autoscaling_client or boto3.client("autoscaling")
    rows = []
    for group in stack_groups(autoscaling, stack):
        tags = group_tags(group)
        previous = tags.get(PREVIOUS_DESIRED_TAG)
        rows.append(
            GroupStatus(
                name=group["AutoScalingGroupName"],
                min_size=int(group["MinSize"]),
                desired_capacity=int(group["DesiredCapacity"]),
                max_size=int(group["MaxSize"]),
                in_service=len(in_service_instance_ids(group)),
                stopped_by=tags.get(STOPPED_BY_TAG),
                previous_desired=int(previous) if previous and previous.isdigit() else None,
            )
        )
    return rows
