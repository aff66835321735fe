"""Scale a stack's node group by hand: `gpucluster scale` without the command line.

It sets a node group's desired nodes (and brings its minimum down with it) through the stack's
node-group backend (`ops.nodegroups.Fleet`), within the group's maximum (the stack file's). A group a
guardrail or a person stopped is not scaled up: `start` or `resume` restore it with its stop
state. The change is planned first (read-only, for the operator to confirm) and decided again on
the group as described right before its write; with the guard-state table the write is
conditional on the stored state. Nothing is deleted. Stop and start are `ops.stopstart`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucluster.fleet.nodegroups import BUDGET, StateConflict
from gpucluster.ops import OpsError
from gpucluster.ops.nodegroups import Fleet, stack_fleet
from gpucluster.ops.nodes import select_groups

if TYPE_CHECKING:
    from gpucluster.ops import Clients
    from gpucluster.spec import StackSpec


class ScaleError(OpsError):
    """A change the group cannot take (above its maximum, stopped by a guardrail): one line."""


@dataclass(frozen=True)
class ScaleChange:
    """One Auto Scaling group and what `scale` would set it to (nothing is changed yet)."""

    group: str
    node_group: str
    min_now: int
    desired_now: int
    max_size: int
    min_after: int
    desired_after: int

    @property
    def added_nodes(self) -> int:
        return max(0, self.desired_after - self.desired_now)


@dataclass(frozen=True)
class ScalePlan:
    """What `scale` would change (read-only): node group `group` to `desired` nodes."""

    fleet: Fleet
    group: str
    desired: int
    changes: list[ScaleChange]

    @property
    def unchanged(self) -> bool:
        return all(c.desired_now == c.desired_after and c.min_now == c.min_after for c in self.changes)

    @property
    def added_nodes(self) -> int:
        return sum(c.added_nodes for c in self.changes)


def plan_scale_on(fleet: Fleet, node_group: str, desired: int, *, stack: str = "<stack>") -> ScalePlan:
    """What setting `node_group` to `desired` nodes changes; read-only.

    MinSize comes down with desired (never up); desired above MaxSize is refused
    (max_nodes is the stack file's, changed by `pulumi up`), and so is scaling up a
    group a guardrail or a person stopped: `start` or `resume` (of stack name `stack`)
    restore it with its stop state. `plan_scale` for a stack file; this for a `Fleet` in hand.
    """
    if desired < 0:
        raise ScaleError(f"--desired: must be >= 0, got {desired}")
    changes = []
    for group in select_groups(fleet.groups.list_groups(fleet.identity), node_group):
        name, max_size = group.name, group.max_size
        if desired > max_size:
            raise ScaleError(f"--desired {desired} is above {name}'s maximum of {max_size} nodes; "
                             f"raise max_nodes of node group {group.label!r} in the stack "
                             "file and `pulumi up` first")
        stopped_by = group.stopped_by
        if stopped_by and desired > 0:
            how = (f"gpucluster resume {stack} --only budget" if stopped_by == BUDGET
                   else f"gpucluster start {stack} --group {group.label}")
            raise ScaleError(f"{name} is stopped by {stopped_by}; restore it with `{how}`, then scale")
        changes.append(ScaleChange(name, group.label, group.min_size, group.desired, max_size,
                                   min(group.min_size, desired), desired))
    return ScalePlan(fleet, node_group, desired, changes)


def plan_scale(spec: StackSpec, clients: Clients, node_group: str, desired: int) -> ScalePlan:
    """What `gpucluster scale` would change on the stack; read-only."""
    return plan_scale_on(stack_fleet(spec, clients), node_group, desired, stack=spec.stack)


@dataclass(frozen=True)
class ScaleResult:
    group: str
    action: str
    """"scaled" or "skipped"."""
    reason: str = ""


@dataclass(frozen=True)
class ScaleOutcome:
    """What `scale` did: the plan shown and each group's result."""

    plan: ScalePlan
    results: list[ScaleResult]


def apply_scale(plan: ScalePlan) -> ScaleOutcome:
    """Write each planned change, unless the group was stopped since it was shown.

    With the stack's guard-state table the write is conditional on the stored state: a stop
    landing meanwhile wins and the change is reported skipped.
    """
    backend = plan.fleet.groups
    results = []
    for change in plan.changes:
        now = backend.read_groups([change.group])
        if not now:
            results.append(ScaleResult(change.group, "skipped", "the group no longer exists"))
            continue
        label = now[0].stopped_by
        if label and change.desired_after > 0:
            results.append(ScaleResult(change.group, "skipped",
                                       f"stopped by {label} since shown; left stopped"))
            continue
        try:
            backend.set_capacity(change.group, change.min_after, change.desired_after)
        except StateConflict as exc:
            results.append(ScaleResult(change.group, "skipped", str(exc)))
            continue
        results.append(ScaleResult(change.group, "scaled"))
    return ScaleOutcome(plan, results)
