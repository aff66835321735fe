"""The seam every guardrail and day-2 operation acts on node groups through: values, rules, interface.

A node group (an Auto Scaling group today; a PCS compute node group or a
stored guard state next) is read as a `NodeGroup` value and changed only
through a `NodeGroups` backend: list a stack's groups by identity, read some
by name, stop one (scale to zero, recording who stopped it and the capacity
to restore), put a stop label back, restore one, set its capacity. The rules
every backend keeps are here as pure functions over the values (`stop_label`:
budget outranks every other reason; `resume_decision`: what a restore may
set), so backends differ only in how they read and write. Backends live one
module each (`asg`); callers never branch on which one they hold. This module
must never call AWS nor import a backend or Pulumi: it is carried into
the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from .tags import PREVIOUS_DESIRED_TAG

BUDGET, IDLE, SCHEDULE, LIFETIME = "budget", "idle", "schedule", "lifetime"
MANUAL = "manual"  # `gpucluster stop`/`start`: a person, through the same stop state as every guardrail
CAPACITY_BLOCK = "capacity-block"  # the group's Capacity Block is about to end
STOP_REASONS = (BUDGET, IDLE, SCHEDULE, LIFETIME, MANUAL, CAPACITY_BLOCK)

# Outcomes of `NodeGroups.stop`.
STOPPED = "stopped"  # capacity went to zero now
ESCALATED = "escalated"  # already at zero, stopped-by upgraded to budget
ALREADY_STOPPED = "already-stopped"  # at zero with a stop recorded: nothing to do
ALREADY_AT_ZERO = "already-at-zero"  # at zero by its own config: nothing to stop or restore
CHANGED = frozenset({STOPPED, ESCALATED})
GONE = "gone"  # the group disappeared while the pre-stop hook ran: nothing to stop

IN_SERVICE = "InService"

# States of a stored guard record (a backend with a store: `guardstate`).
RUNNING, STARTING, STOPPING, STOP_FAILED = "running", "starting", "stopping", "stop-failed"
STATE_STOPPED = "stopped"
GROUP_STATES = (RUNNING, STARTING, STOPPING, STATE_STOPPED, STOP_FAILED)


class StateConflict(RuntimeError):
    """A conditional write lost: the group changed since it was read (the caller re-reads or skips)."""


@dataclass(frozen=True)
class Member:
    """One instance of a node group."""

    instance_id: str
    lifecycle_state: str
    """The backend's view: InService when it counts as able to run work (Pending, Terminating...)."""
    health: str = "?"
    """Healthy or Unhealthy, as the backend holds it."""
    instance_type: str | None = None
    zone: str | None = None


@dataclass(frozen=True)
class StopState:
    """Who stopped a group and the capacity to restore, as recorded (raw: a record may be invalid)."""

    stopped_by: str | None = None
    previous_desired: str | None = None
    previous_min: str | None = None
    state: str | None = None
    """The stored state (RUNNING, STARTING, STOPPING, STOPPED, STOP_FAILED); None: the backend keeps none."""
    version: int | None = None
    """The stored record's version, what a conditional write expects; None: no record (yet)."""
    notified: bool | None = None
    """Whether the stop's notification went out; None: the backend does not know."""
    written_at: float | None = None
    """When the stored record was last written (epoch seconds; 0: before records carried it)."""
    started_by: str | None = None
    """On a `running` record a start wrote: the label of the stop it undid (its tell is `notified`)."""


@dataclass(frozen=True)
class NodeGroup:
    """A node group as described right now: capacity, stop state, members."""

    name: str
    """The backend's name for it (the Auto Scaling group's name)."""
    node_group: str | None
    """The node group's name in the stack file (None when the backend does not carry it)."""
    stack: str | None
    """The deployment identity the group is tagged with."""
    min_size: int
    desired: int
    max_size: int
    stop: StopState = StopState()
    members: tuple[Member, ...] = ()
    configured_max: int | None = None
    """An EKS group's configured maximum (its gpucluster:max-nodes tag): a stop zeroes its MaxSize, a start
    puts this back, and `max_size` reads as it meanwhile; None elsewhere."""
    max_open: bool = False
    """An EKS group whose MaxSize is above zero: the cluster-autoscaler may start nodes in it whenever a pod
    is pending, so even at zero nodes a stop has capacity to remove (its maximum)."""

    @property
    def stopped_by(self) -> str | None:
        return self.stop.stopped_by

    @property
    def running(self) -> bool:
        """True when the group has capacity that a stop would remove (on EKS an open maximum too)."""
        return self.desired > 0 or self.max_open

    @property
    def label(self) -> str:
        """The node group's name, or the backend's name when the group carries none."""
        return self.node_group or self.name

    @property
    def in_service_ids(self) -> list[str]:
        """Instances that can run a hook: only InService ones have a live SSM agent."""
        return [m.instance_id for m in self.members if m.lifecycle_state == IN_SERVICE]

    @property
    def healthy(self) -> int:
        """Nodes in service that the backend holds Healthy (a node that failed its check is not)."""
        return sum(1 for m in self.members if m.lifecycle_state == IN_SERVICE and m.health == "Healthy")


@dataclass(frozen=True)
class ResumeResult:
    """What resuming one group did; `action` is "resumed" or "skipped"."""

    group: str
    action: str
    stopped_by: str | None = None
    min_size: int | None = None
    desired_capacity: int | None = None
    reason: str = ""


class NodeGroups(Protocol):
    """A backend: how one kind of node group is read and changed. Writes decide on fresh reads.

    Every method that takes a `NodeGroup` expects it read right before the call:
    the decision is only as fresh as it is.
    """

    def list_groups(self, stack: str) -> list[NodeGroup]:
        """Every group tagged with the deployment identity `stack`, sorted by name."""
        ...

    def read_groups(self, names: Iterable[str]) -> list[NodeGroup]:
        """Groups by name, sorted; names that no longer exist are simply absent."""
        ...

    def stop(self, group: NodeGroup, reason: str) -> str:
        """Scale to zero, recording `stop_label` and the capacity before; returns an outcome.

        STOPPED, ESCALATED (at zero, relabelled budget), ALREADY_STOPPED or
        ALREADY_AT_ZERO. Idempotent: a group at zero keeps its recorded capacity.
        Raises ValueError for a reason not in STOP_REASONS.
        """
        ...

    def relabel(self, group: NodeGroup, stopped_by: str, previous: StopState) -> None:
        """Record `stopped_by` on a stopped group, plus the previous capacity values given in `previous`."""
        ...

    def restore(self, group: NodeGroup, only_stopped_by: Collection[str] | None = None, *,
                started_by: str | None = None) -> ResumeResult:
        """Put back the recorded capacity and clear the stop state (`resume_decision`).

        Read again after the write: a stop that landed meanwhile wins, capacity
        goes back to zero and its state stays (result "skipped"). `started_by`: the guardrail
        starting it (the schedule), whose tell is recorded untold until `mark_notified`; None, a
        person's start, told by the command's own output.
        """
        ...

    def set_capacity(self, name: str, min_size: int, desired: int) -> None:
        """Set min and desired (max is the stack file's), leaving the stop state alone.

        A backend with a store raises `StateConflict` rather than raise a stopped group.
        """
        ...

    def mark_notified(self, group: NodeGroup) -> None:
        """Record that the stop or start of `group` (as read) was told; a backend without a store: nothing."""
        ...


class Capacity(Protocol):
    """Where a stored backend (`guardstate`) reads and sets a group's capacity: Auto Scaling or AWS PCS.

    Its reads carry the stop state the service itself holds (the Auto Scaling groups' tags: a
    migration source) or none (PCS); its mirror is for people reading the console, never decides.
    """

    stop_zeroes_max: bool
    """A stop sets the maximum to zero too (PCS): while stopped, the recorded maximum is the ceiling."""

    def describe_stack(self, stack: str) -> list[NodeGroup]:
        """Every group of the deployment identity `stack`, sorted by name."""
        ...

    def describe(self, names: Iterable[str]) -> list[NodeGroup]:
        """Groups by name, sorted; names that no longer exist are absent."""
        ...

    def resize(self, name: str, min_size: int, desired: int, *, closing: bool = True) -> None:
        """Set the capacity a group may run (Auto Scaling: min and desired; PCS: min and max). Zero
        capacity closes an EKS group's maximum too unless `closing` is False (a restore or a scale to
        zero nodes: the autoscaler may still grow it)."""
        ...

    def mirror(self, name: str, stopped_by: str, previous: StopState) -> None:
        """Show the stop state where a person looks (tags), or nothing."""
        ...

    def unmirror(self, name: str) -> None:
        """Remove what `mirror` showed."""
        ...


def stop_label(group: NodeGroup, reason: str) -> str:
    """The stopped-by a stop of a running `group` records: budget outranks every other reason."""
    return BUDGET if BUDGET in (reason, group.stopped_by) else reason


def previous_capacity(group: NodeGroup) -> StopState:
    """The previous capacity a stop of `group` (as read now) leaves recorded on it."""
    if group.running:
        return StopState(None, str(group.desired), str(group.min_size))
    return StopState(None, group.stop.previous_desired, group.stop.previous_min)


def _parse_count(value: str | None) -> int | None:
    try:
        count = int(value) if value is not None else None
    except ValueError:
        return None
    return count if count is not None and count >= 0 else None


def resume_decision(group: NodeGroup, only_stopped_by: Collection[str] | None = None) -> ResumeResult:
    """What resuming `group` would do, without doing it: action "resume" or "skipped".

    Desired never goes below what the group runs now nor above its maximum.
    """
    stopped_by = group.stopped_by
    if stopped_by is None:
        return ResumeResult(group.name, "skipped", reason="not stopped by a guardrail")
    if only_stopped_by is not None and stopped_by not in only_stopped_by:
        return ResumeResult(group.name, "skipped", stopped_by, reason=f"stopped by {stopped_by}")
    previous_desired = _parse_count(group.stop.previous_desired)
    if previous_desired is None:
        return ResumeResult(
            group.name, "skipped", stopped_by, reason=f"tag {PREVIOUS_DESIRED_TAG} missing or invalid"
        )
    previous_min = _parse_count(group.stop.previous_min) or 0
    desired = min(max(previous_desired, group.desired), group.max_size)
    return ResumeResult(group.name, "resume", stopped_by, min(previous_min, desired), desired)
