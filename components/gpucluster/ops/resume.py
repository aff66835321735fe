"""Resume what a guardrail or a person stopped: `gpucluster resume` (and `start`'s restore) without the CLI.

Resuming is planned first (`plan_resume`, read-only, for the operator to see and confirm) and
then done on the groups shown (`apply_resume`), each described again right before its write,
through the stack's node-group backend (`ops.nodegroups.Fleet`). It only restores capacity a stop recorded;
nothing is ever deleted. On a Slurm stack the running groups' partitions are then set UP on the
login node (`fleet.slurmhold`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucluster.fleet.nodegroups import ResumeResult, resume_decision
from gpucluster.ops import OpsError
from gpucluster.ops.nodegroups import Fleet, stack_fleet
from gpucluster.ops.status import GroupStatus, stack_status

if TYPE_CHECKING:
    from gpucluster.fleet.asg import MaxChange
    from gpucluster.ops import Clients
    from gpucluster.spec import StackSpec


class SlurmReleaseError(OpsError):
    """The capacity is back but the partitions stay held: the login node did not set them UP."""


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


def resume_candidates(fleet: Fleet, only_stopped_by: Collection[str] | None = None) -> list[ResumeCandidate]:
    """What resuming would do to each of the stack's groups, sorted by name; read-only."""
    return [
        ResumeCandidate(
            decision=resume_decision(group, only_stopped_by),
            node_group=group.node_group,
            desired_now=group.desired,
            max_size=group.max_size,
        )
        for group in fleet.groups.list_groups(fleet.identity)
    ]


def shown_of(candidates: list[ResumeCandidate]) -> dict[str, str | None]:
    """Group -> the stopped-by the operator saw: what a restore holds each group to."""
    return {c.group: c.decision.stopped_by for c in candidates}


@dataclass(frozen=True)
class RestorePlan:
    """What `resume` or `start` would restart (read-only), and the stack it was read from."""

    fleet: Fleet
    candidates: list[ResumeCandidate]
    only_stopped_by: tuple[str, ...] | None = None
    """The stops it may undo (None: any, a person decided)."""
    group: str | None = None
    """The node group the selection was narrowed to (None: every group)."""
    maxima: tuple[MaxChange, ...] = ()
    """`start` on an EKS stack: groups that run whose maximum is not the configured one (after a
    `pulumi up` changed max_nodes: Pulumi does not own an EKS group's MaxSize)."""

    @property
    def todo(self) -> list[ResumeCandidate]:
        """The candidates it would restore."""
        return [c for c in self.candidates if c.decision.action == "resume"]


@dataclass(frozen=True)
class ResumeOutcome:
    """What `resume` did: the plan shown, each group's result, and the groups' status after."""

    plan: RestorePlan
    results: list[ResumeResult]
    status: list[GroupStatus]


def plan_resume(spec: StackSpec, clients: Clients,
                only_stopped_by: Collection[str] | None = None) -> RestorePlan:
    """What resuming the stack would do to each of its groups (`only_stopped_by` narrows it); read-only."""
    fleet = stack_fleet(spec, clients)
    only = tuple(only_stopped_by) if only_stopped_by else None
    return RestorePlan(fleet, resume_candidates(fleet, only), only)


def apply_resume(plan: RestorePlan) -> ResumeOutcome:
    """Restore the groups the plan would restart, unless their stop changed since; then read their status."""
    results = resume_stack(plan.fleet, only_stopped_by=plan.only_stopped_by, shown=shown_of(plan.todo))
    return ResumeOutcome(plan, results, stack_status(plan.fleet))


def resume_stack(
    fleet: Fleet,
    *,
    only_stopped_by: Collection[str] | None = None,
    shown: Mapping[str, str | None] | None = None,
) -> list[ResumeResult]:
    """Restore every stopped group of the stack to its recorded min/desired.

    The operator's resume undoes any stop, budget included: a person decided.
    `only_stopped_by` narrows it (e.g. {"idle"}). Groups not stopped are skipped.
    `shown` (group -> the stopped-by the operator saw and confirmed) limits the
    resume to those groups, and skips any whose stop changed since: a person
    who confirmed undoing an idle stop has not agreed to undo a budget stop.
    Each group is described again right before its write. On a Slurm stack the
    running groups' partitions are then set UP on the login node; a release that fails
    raises `SlurmReleaseError` (capacity is back; running resume again releases them).
    """
    backend = fleet.groups
    names = [g.name for g in backend.list_groups(fleet.identity)]
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
    if fleet.slurm:
        release_partitions_after(fleet)
    return results


def release_partitions_after(fleet: Fleet) -> None:
    """Set UP the partitions of every running group not stopped (idempotent: a second run is harmless)."""
    from gpucluster.fleet.slurmhold import release_partitions

    partitions = [g.label for g in fleet.groups.list_groups(fleet.identity) if g.running and not g.stopped_by]
    if not partitions:
        return
    result = release_partitions(fleet.clients("ssm"), fleet.clients("ec2"), fleet.identity, partitions)
    if not result.ok:
        held = ", ".join(partitions)
        raise SlurmReleaseError(f"partitions {held} still held (login node: {result.summary()}); "
                                "run the command again")
