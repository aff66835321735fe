"""Operator actions on a running stack: resume what guardrails stopped, and show group status.

These back `gpucluster resume STACK` and `gpucluster status STACK`. They talk
to AWS with plain boto3 clients (so AWS_ENDPOINT_URL is honoured) and share the
tag contract with the Lambda handlers through `gpucluster.lambdas.scaling`.
Resuming only restores capacity recorded by a guardrail; nothing is ever deleted.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import boto3
from gpucluster.lambdas.scaling import (
    PREVIOUS_DESIRED_TAG,
    STOPPED_BY_TAG,
    ResumeResult,
    group_tags,
    in_service_instance_ids,
    resume_group,
    stack_groups,
)

__all__ = ["GroupStatus", "ResumeResult", "resume_stack", "stack_status"]


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


def resume_stack(
    stack: str,
    *,
    autoscaling_client: Any = None,
    only_stopped_by: Collection[str] | None = None,
) -> list[ResumeResult]:
    """Restore every guardrail-stopped group of the stack to its recorded min/desired.

    The operator's resume undoes any stop, budget included: a person decided.
    `only_stopped_by` narrows it (e.g. {"idle"}). Groups not stopped are skipped.
    """
    autoscaling = autoscaling_client or boto3.client("autoscaling")
    return [
        resume_group(autoscaling, group, only_stopped_by=only_stopped_by)
        for group in stack_groups(autoscaling, stack)
    ]


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
