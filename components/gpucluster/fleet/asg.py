"""The Auto Scaling backend of the node-group seam: a node group is an Auto Scaling group and its tags.

A stop sets MinSize and DesiredCapacity to 0 and records the stop state in
the group's tags (`STOPPED_BY_TAG`, `PREVIOUS_DESIRED_TAG`, `PREVIOUS_MIN_TAG`,
never propagated to instances); a restore puts the recorded capacity back and
deletes those tags. The Auto Scaling API has no compare-and-set and the
handlers run concurrently: every write is decided on a group described right
before it, and a restore reads the group again after its write so that a
budget stop landing meanwhile wins. It must never delete anything but its own
state tags, never change MaxSize but an EKS group's, and never import Pulumi:
it is carried into the Lambda archive as ``gpucluster.fleet``.

An EKS group carries its configured maximum in `MAX_NODES_TAG` (Pulumi owns
the tag, not MaxSize): a stop zeroes MaxSize too, so the cluster-autoscaler
cannot scale a stopped group back up, and a group at zero nodes whose maximum
is open counts as running (the autoscaler may grow it: `NodeGroup.max_open`);
a restore puts the tag's maximum back; `max_changes` and `apply_max` set it on
a group that runs (after a `pulumi up` changed the tag), and leave a stopped
group at zero.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .awsapi import describe_groups, group_tags, log_event, stack_groups
from .nodegroups import (
    ALREADY_AT_ZERO,
    ALREADY_STOPPED,
    BUDGET,
    ESCALATED,
    STOP_REASONS,
    STOPPED,
    Member,
    NodeGroup,
    ResumeResult,
    StopState,
    resume_decision,
    stop_label,
)
from .tags import (
    MAX_NODES_TAG,
    NODE_GROUP_TAG,
    PREVIOUS_DESIRED_TAG,
    PREVIOUS_MIN_TAG,
    STACK_TAG,
    STATE_TAGS,
    STOPPED_BY_TAG,
)


def configured_max(description: Mapping[str, Any]) -> int | None:
    """The group's `MAX_NODES_TAG` (an EKS group's configured maximum), or None."""
    value = group_tags(description).get(MAX_NODES_TAG, "")
    return int(value) if value.isdigit() else None


def node_group(description: Mapping[str, Any]) -> NodeGroup:
    """A DescribeAutoScalingGroups entry as the seam's value (an EKS group's maximum at least its
    configured one: a stop zeroed MaxSize, not what the group may hold)."""
    tags = group_tags(description)
    configured = configured_max(description)
    return NodeGroup(
        name=description["AutoScalingGroupName"],
        node_group=tags.get(NODE_GROUP_TAG),
        stack=tags.get(STACK_TAG),
        min_size=int(description["MinSize"]),
        desired=int(description["DesiredCapacity"]),
        max_size=max(int(description["MaxSize"]), configured or 0),
        configured_max=configured,
        max_open=configured is not None and int(description["MaxSize"]) > 0,
        stop=StopState(tags.get(STOPPED_BY_TAG), tags.get(PREVIOUS_DESIRED_TAG), tags.get(PREVIOUS_MIN_TAG)),
        members=tuple(
            Member(
                instance_id=i["InstanceId"],
                lifecycle_state=i.get("LifecycleState", "?"),
                health=i.get("HealthStatus", "?"),
                instance_type=i.get("InstanceType"),
                zone=i.get("AvailabilityZone"),
            )
            for i in description.get("Instances", [])
        ),
    )


def _value(group: NodeGroup | Mapping[str, Any]) -> NodeGroup:
    return group if isinstance(group, NodeGroup) else node_group(group)


def set_tags(autoscaling: Any, group_name: str, tags: Mapping[str, str]) -> None:
    """Write tags on the group itself (never propagated to its instances)."""
    autoscaling.create_or_update_tags(
        Tags=[
            {
                "ResourceId": group_name,
                "ResourceType": "auto-scaling-group",
                "Key": key,
                "Value": value,
                # State of the group, not of its instances.
                "PropagateAtLaunch": False,
            }
            for key, value in tags.items()
        ]
    )


def _zero_max(group: NodeGroup) -> dict[str, int]:
    """MaxSize 0 with a stop of an EKS group (it has a configured maximum to come back to), else nothing."""
    return {"MaxSize": 0} if group.configured_max is not None else {}


def _restored_max(group: NodeGroup, desired: int) -> dict[str, int]:
    """An EKS group's MaxSize on a restore: its configured maximum (at least `desired`), else nothing."""
    return {} if group.configured_max is None else {"MaxSize": max(group.configured_max, desired)}


def scale_to_zero(autoscaling: Any, group: NodeGroup | Mapping[str, Any], reason: str) -> str:
    """Set MinSize and DesiredCapacity to 0 and record why and what to restore.

    `group` (a `NodeGroup` or a DescribeAutoScalingGroups entry) must have been
    described right before the call: the decision is only as fresh as it is.
    Idempotent: a group already at zero is left alone, so previous-desired is
    never overwritten with 0. The one exception is escalation: a budget stop
    relabels a group that another guardrail stopped, so the morning schedule
    cannot restart what the budget shut down. No other reason ever replaces a
    budget label.
    """
    if reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {reason!r}; expected one of {STOP_REASONS}")
    group = _value(group)
    name, stopped_by = group.name, group.stopped_by
    if not group.running:
        if stopped_by is None:
            log_event("group already at zero", group=name, reason=reason)
            return ALREADY_AT_ZERO
        if reason == BUDGET and stopped_by != BUDGET:
            set_tags(autoscaling, name, {STOPPED_BY_TAG: BUDGET})
            log_event("stop escalated to budget", group=name, previous_stopped_by=stopped_by)
            return ESCALATED
        log_event("group already stopped", group=name, stopped_by=stopped_by, reason=reason)
        return ALREADY_STOPPED
    # Capacity is back although tags remain (restarted by hand): a budget label still holds.
    label = stop_label(group, reason)
    # Tags first: if the update then fails, a retry still sees capacity and records it again.
    set_tags(
        autoscaling,
        name,
        {
            STOPPED_BY_TAG: label,
            PREVIOUS_DESIRED_TAG: str(group.desired),
            PREVIOUS_MIN_TAG: str(group.min_size),
        },
    )
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, DesiredCapacity=0,
                                          **_zero_max(group))
    log_event(
        "group scaled to zero",
        group=name,
        stopped_by=label,
        previous_desired=group.desired,
        previous_min=group.min_size,
    )
    return STOPPED


def resume_group(
    autoscaling: Any,
    group: NodeGroup | Mapping[str, Any],
    *,
    only_stopped_by: Collection[str] | None = None,
) -> ResumeResult:
    """Restore min/desired recorded by `scale_to_zero` and remove our state tags.

    `group` must have been described right before the call. `only_stopped_by`
    limits which stops may be undone (the schedule start only undoes schedule
    stops). After restoring capacity the group is read again: if another stop
    (a budget breach) relabelled it meanwhile, capacity goes back to zero and
    that stop's tags stay, so a start never undoes a stop it did not see.
    """
    group = _value(group)
    decision = resume_decision(group, only_stopped_by)
    name = decision.group
    if decision.action != "resume":
        if decision.stopped_by is not None and PREVIOUS_DESIRED_TAG in decision.reason:
            log_event("cannot resume: no previous capacity", logging.WARNING, group=name)
        return decision
    autoscaling.update_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=decision.min_size,
        DesiredCapacity=decision.desired_capacity,
        **_restored_max(group, decision.desired_capacity or 0),
    )
    now = describe_groups(autoscaling, [name])
    label = group_tags(now[0]).get(STOPPED_BY_TAG) if now else None
    # Relabelled (a budget stop escalated it), or stopped again after our update (back at zero):
    # either way another stop's tags are on the group now, and they must stay.
    zeroed = bool(now) and int(now[0]["DesiredCapacity"]) == 0 < (decision.desired_capacity or 0)
    if label is not None and (label != decision.stopped_by or zeroed):
        autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, DesiredCapacity=0,
                                              **_zero_max(group))
        log_event("resume undone: stopped again meanwhile", logging.WARNING, group=name,
                  resumed=decision.stopped_by, stopped_by=label)
        return ResumeResult(name, "skipped", label,
                            reason=f"stopped by {label} while resuming; left stopped")
    tags = group_tags(now[0]) if now else {}
    present = [key for key in STATE_TAGS if key in tags]
    if present:
        autoscaling.delete_tags(
            Tags=[
                {"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": key}
                for key in present
            ]
        )
    log_event(
        "group resumed",
        group=name,
        stopped_by=decision.stopped_by,
        min=decision.min_size,
        desired=decision.desired_capacity,
    )
    return ResumeResult(
        name, "resumed", decision.stopped_by, decision.min_size, decision.desired_capacity
    )


@dataclass(frozen=True)
class MaxChange:
    """An EKS group that runs whose MaxSize is not its configured maximum (a `pulumi up` changed its
    MAX_NODES_TAG; Pulumi does not own MaxSize there): what `apply_max` would set."""

    group: str
    node_group: str | None
    max_now: int
    max_after: int


def max_changes(autoscaling: Any, stack: str, stopped: Collection[str]) -> list[MaxChange]:
    """Read-only: the groups of deployment `stack` with a configured maximum, not in `stopped` (the
    names the stack's backend holds stopped or stopping), whose MaxSize is not that maximum (at least
    their desired capacity: Auto Scaling refuses a maximum below it)."""
    changes = []
    for description in stack_groups(autoscaling, stack):
        group = node_group(description)
        now = int(description["MaxSize"])
        if group.configured_max is None or group.name in stopped or group.stopped_by:
            continue
        target = max(group.configured_max, group.desired)
        if now != target:
            changes.append(MaxChange(group.name, group.node_group, now, target))
    return changes


def apply_max(autoscaling: Any, change: MaxChange, stopped_now: Callable[[], bool]) -> bool:
    """Set the group's MaxSize to its configured maximum; then ask `stopped_now` (the backend's stop state,
    read after the write): a stop that landed meanwhile gets MaxSize 0 back and False is returned.

    A stop records its state before it zeroes the capacity, so either its zeroing comes after this
    write, or its record is seen here: the group never stays stopped with a maximum the
    cluster-autoscaler could scale up to.
    """
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=change.group, MaxSize=change.max_after)
    if stopped_now():
        autoscaling.update_auto_scaling_group(AutoScalingGroupName=change.group, MaxSize=0)
        log_event("maximum not set: stopped meanwhile", logging.WARNING, group=change.group)
        return False
    log_event("configured maximum set", group=change.group, max_before=change.max_now,
              max_after=change.max_after)
    return True


class AutoScalingGroups:
    """`NodeGroups` over one Auto Scaling client (boto3, moto or a test double)."""

    def __init__(self, autoscaling: Any) -> None:
        self.autoscaling = autoscaling

    def list_groups(self, stack: str) -> list[NodeGroup]:
        return [node_group(g) for g in stack_groups(self.autoscaling, stack)]

    def read_groups(self, names: Iterable[str]) -> list[NodeGroup]:
        return [node_group(g) for g in describe_groups(self.autoscaling, names)]

    def stop(self, group: NodeGroup, reason: str) -> str:
        return scale_to_zero(self.autoscaling, group, reason)

    def relabel(self, group: NodeGroup, stopped_by: str, previous: StopState) -> None:
        recorded = {PREVIOUS_DESIRED_TAG: previous.previous_desired, PREVIOUS_MIN_TAG: previous.previous_min}
        set_tags(self.autoscaling, group.name,
                 {STOPPED_BY_TAG: stopped_by, **{k: v for k, v in recorded.items() if v is not None}})

    def restore(self, group: NodeGroup, only_stopped_by: Collection[str] | None = None, *,
                started_by: str | None = None) -> ResumeResult:
        return resume_group(self.autoscaling, group, only_stopped_by=only_stopped_by)

    def set_capacity(self, name: str, min_size: int, desired: int) -> None:
        """Min and desired; an EKS group's maximum too (its configured one, at least `desired`)."""
        groups = [node_group(d) for d in describe_groups(self.autoscaling, [name])]
        extra = _restored_max(groups[0], desired) if groups and desired > 0 else {}
        self.autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=min_size,
                                                   DesiredCapacity=desired, **extra)

    def mark_notified(self, group: NodeGroup) -> None:
        """Tags cannot say whether a stop was told: nothing recorded (`StopState.notified` stays None)."""


class AutoScalingCapacity:
    """`Capacity` of Auto Scaling groups: what the stored backend (`guardstate`) sets and mirrors on them.

    Reads carry the stop-state tags (a stop recorded before the guard-state table existed);
    the mirror is the same tags, written after the stored record, never read to decide.
    """

    stop_zeroes_max = False  # a stop leaves MaxSize alone (but see MAX_NODES_TAG: it reads as unchanged)

    def __init__(self, autoscaling: Any) -> None:
        self.autoscaling = autoscaling
        self._configured_max: dict[str, int] = {}
        self._plain: set[str] = set()  # groups read without MAX_NODES_TAG

    def describe_stack(self, stack: str) -> list[NodeGroup]:
        return [self._read(g) for g in stack_groups(self.autoscaling, stack)]

    def describe(self, names: Iterable[str]) -> list[NodeGroup]:
        return [self._read(g) for g in describe_groups(self.autoscaling, names)]

    def _read(self, description: Mapping[str, Any]) -> NodeGroup:
        """The group, its maximum the configured one where a stop zeroed it (an EKS group's MAX_NODES_TAG)."""
        group = node_group(description)
        if group.configured_max is None:
            self._plain.add(group.name)
        else:
            self._configured_max[group.name] = group.configured_max
        return group

    def resize(self, name: str, min_size: int, desired: int, *, closing: bool = True) -> None:
        """Min and desired; on a group with MAX_NODES_TAG (EKS) the maximum too: 0 with a stop (zero
        capacity, `closing`), so the cluster-autoscaler cannot bring the group back, else the configured
        maximum (a restore or a scale to zero nodes leaves it open)."""
        if name not in self._configured_max and name not in self._plain:  # not read by this backend yet
            for description in describe_groups(self.autoscaling, [name]):
                self._read(description)
        configured = self._configured_max.get(name)
        if configured is None:
            self.autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=min_size,
                                                       DesiredCapacity=desired)
            return
        maximum = 0 if min_size == desired == 0 and closing else max(configured, desired)
        self.autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=min_size,
                                                   DesiredCapacity=desired, MaxSize=maximum)

    def mirror(self, name: str, stopped_by: str, previous: StopState) -> None:
        tags = {STOPPED_BY_TAG: stopped_by}
        if previous.previous_desired is not None:
            tags[PREVIOUS_DESIRED_TAG] = previous.previous_desired
        if previous.previous_min is not None:
            tags[PREVIOUS_MIN_TAG] = previous.previous_min
        set_tags(self.autoscaling, name, tags)

    def unmirror(self, name: str) -> None:
        now = describe_groups(self.autoscaling, [name])
        present = [k for k in STATE_TAGS if now and any(t["Key"] == k for t in now[0].get("Tags", []))]
        if present:
            self.autoscaling.delete_tags(Tags=[{"ResourceId": name, "ResourceType": "auto-scaling-group",
                                                "Key": key} for key in present])
