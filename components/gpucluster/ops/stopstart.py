"""Stop and start a stack's node groups by hand, through the guardrails' own stop state.

This is `gpucluster stop` and `start` without the command line, acting on node groups only
through the stack's node-group backend (`ops.nodegroups.Fleet`). A manual stop is a stop like any
guardrail's: `stop_groups` with reason `manual` records who stopped the group and what to
restore, after the stack's pre-stop hook ran on its nodes (as the idle stop runs it), or, on a
Slurm stack, after its partitions were held and their jobs requeued. So `status` shows it,
`resume` undoes it, a schedule start leaves it alone (it only undoes schedule stops) and a
budget stop still outranks it. `start` undoes manual, idle, schedule and lifetime stops, never a
budget stop (that is `resume --only budget`, with its warning). Every change is planned first
(read-only, for the operator to confirm) and decided again on the group as described right
before its write. Nothing is deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from gpucluster.fleet.nodegroups import IDLE, LIFETIME, MANUAL, RUNNING, SCHEDULE, NodeGroup, ResumeResult
from gpucluster.fleet.runcommand import CommandResult
from gpucluster.fleet.stops import StopReport, stop_groups
from gpucluster.ops.nodegroups import Fleet, stack_fleet
from gpucluster.ops.nodes import NodesError, select_groups
from gpucluster.ops.resume import RestorePlan, resume_candidates, resume_stack, shown_of
from gpucluster.ops.status import GroupStatus, stack_status

if TYPE_CHECKING:
    from gpucluster.fleet.asg import MaxChange
    from gpucluster.ops import Clients
    from gpucluster.spec import StackSpec

# What `start` may undo: every stop but the budget's.
START_REASONS = (MANUAL, IDLE, SCHEDULE, LIFETIME)


# ------------------------------------------------------------------------- stop


@dataclass(frozen=True)
class StopCandidate:
    """One group of the selection and whether a stop would change it."""

    group: str
    node_group: str
    desired_now: int
    in_service: int
    stopped_by: str | None

    @property
    def running(self) -> bool:
        return self.desired_now > 0


@dataclass(frozen=True)
class StopPlan:
    """What `stop` would do (read-only): the selected groups, and the hook that runs first."""

    fleet: Fleet
    group: str | None
    candidates: list[StopCandidate]
    pre_stop_command: str | None = None
    hook_timeout_seconds: float = 300.0
    open_at_zero: tuple[str, ...] = ()
    """EKS groups at zero nodes whose maximum is open (the autoscaler may start nodes there): a stop
    closes them too."""

    @property
    def running(self) -> list[StopCandidate]:
        """The groups a stop changes: those running nodes, and on EKS those the autoscaler may grow."""
        return [c for c in self.candidates if c.running or c.group in self.open_at_zero]


@dataclass(frozen=True)
class StopOutcome:
    """What `stop` did: the plan shown, the stop's report (hook, outcomes, errors), the status after."""

    plan: StopPlan
    report: StopReport
    status: list[GroupStatus]


def plan_stop_on(fleet: Fleet, group: str | None = None, *, pre_stop_command: str | None = None,
                 hook_timeout_seconds: float = 300.0) -> StopPlan:
    """The selected groups (all, or node group `group`) of `fleet` and their capacity now; read-only.

    `plan_stop` for a stack file; this for a `Fleet` already in hand (a notebook, a test)."""
    groups = select_groups(fleet.groups.list_groups(fleet.identity), group)
    candidates = [StopCandidate(g.name, g.label, g.desired, len(g.in_service_ids), g.stopped_by)
                  for g in groups]
    return StopPlan(fleet, group, candidates, pre_stop_command, hook_timeout_seconds,
                    tuple(g.name for g in groups if g.running and not g.desired))


def plan_stop(spec: StackSpec, clients: Clients, group: str | None = None) -> StopPlan:
    """What `gpucluster stop` would do on the stack, with its pre-stop hook (`autostop`); read-only."""
    return plan_stop_on(stack_fleet(spec, clients), group, pre_stop_command=spec.autostop.pre_stop_command,
                        hook_timeout_seconds=spec.autostop.pre_stop_timeout_seconds)


def apply_stop(plan: StopPlan) -> StopOutcome:
    """Run the pre-stop hook on the running groups' nodes, scale them to zero (reason manual), read status.

    The groups are read again first; `stop_groups` reads them once more after the hook, so a
    budget stop that lands meanwhile keeps its label. On a Slurm stack the hook is Slurm's: the
    partitions are held and their jobs signalled and requeued on the login node (grace: the hook's
    timeout), as a guardrail's stop does.
    """
    fleet, timeout = plan.fleet, plan.hook_timeout_seconds
    groups = fleet.groups.read_groups([c.group for c in plan.running])
    if fleet.slurm:
        from gpucluster.fleet.slurmhold import hold_partitions

        ssm, ec2 = fleet.clients("ssm"), fleet.clients("ec2")

        def hold(partitions: list[str]) -> CommandResult:
            return hold_partitions(ssm, ec2, fleet.identity, partitions, grace_seconds=timeout,
                                   timeout_seconds=timeout + 30.0)

        report = stop_groups(fleet.groups, groups, MANUAL, slurm_hold=hold)
    else:
        hook = plan.pre_stop_command
        report = stop_groups(fleet.groups, groups, MANUAL, ssm=fleet.clients("ssm") if hook else None,
                             pre_stop_command=hook, hook_timeout_seconds=timeout)
    return StopOutcome(plan, report, stack_status(fleet))


# ------------------------------------------------------------------------ start


@dataclass(frozen=True)
class StartOutcome:
    """What `start` did: the plan shown and each group's result; the maxima it set (`RestorePlan.maxima`)."""

    plan: RestorePlan
    results: list[ResumeResult]
    maxima: list[MaxResult] = field(default_factory=list)
    """What it did to each group of `RestorePlan.maxima`."""


@dataclass(frozen=True)
class MaxResult:
    """One group's configured maximum, as `start` left it."""

    group: str
    action: str
    """"set", "skipped" (a stop landed meanwhile: left at zero) or "failed" (an AWS error, in `reason`)."""
    reason: str = ""


def plan_start_on(fleet: Fleet, group: str | None = None) -> RestorePlan:
    """What `start` would restore in `fleet`'s selection (budget stops left out); read-only.

    `plan_start` for a stack file; this for a `Fleet` already in hand (a notebook, a test)."""
    candidates = resume_candidates(fleet, START_REASONS)
    if group is not None:
        chosen = [c for c in candidates if group in (c.node_group, c.group)]
        if not chosen:
            known = ", ".join(sorted({c.node_group or c.group for c in candidates})) or "none deployed"
            raise NodesError(f"no node group {group!r} in this stack (node groups: {known})")
        candidates = chosen
    return RestorePlan(fleet, candidates, START_REASONS, group, tuple(start_maxima(fleet, group)))


def start_maxima(fleet: Fleet, group: str | None = None) -> list[MaxChange]:
    """An EKS stack's groups that run (all, or node group `group`) whose MaxSize is not their configured
    maximum; read-only. Nothing on other stacks (their MaxSize is Pulumi's)."""
    if not fleet.eks:
        return []
    from gpucluster.fleet.asg import max_changes

    held = [g.name for g in fleet.groups.list_groups(fleet.identity) if _held(g)]
    return [c for c in max_changes(fleet.clients("autoscaling"), fleet.identity, held)
            if group is None or group in (c.node_group, c.group)]


def _held(group: NodeGroup) -> bool:
    """Stopped, or on its way there or back, as the stack's backend holds it."""
    return bool(group.stopped_by) or group.stop.state not in (None, RUNNING)


def plan_start(spec: StackSpec, clients: Clients, group: str | None = None) -> RestorePlan:
    """What `gpucluster start` would restore on the stack; read-only."""
    return plan_start_on(stack_fleet(spec, clients), group)


def apply_start(plan: RestorePlan) -> StartOutcome:
    """Restore the shown groups to their recorded capacity (a stop that changed since is skipped);
    on a Slurm stack then set their partitions UP (`ops.resume.resume_stack`)."""
    results = resume_stack(plan.fleet, only_stopped_by=plan.only_stopped_by, shown=shown_of(plan.todo))
    return StartOutcome(plan, results, apply_maxima(plan.fleet, plan.maxima))


def apply_maxima(fleet: Fleet, maxima: Sequence[MaxChange]) -> list[MaxResult]:
    """Set each group's configured maximum (`fleet.asg.apply_max`: one stopped meanwhile stays at zero).
    An AWS error fails that group only (said in its result; `start` again reads it afresh)."""
    from gpucluster.fleet.asg import apply_max
    from gpucluster.ops.awserrors import AWS_ERRORS, describe

    def stopped_now(name: str) -> bool:
        return any(_held(g) for g in fleet.groups.read_groups([name]))

    results = []
    for change in maxima:
        try:
            done = apply_max(fleet.clients("autoscaling"), change, partial(stopped_now, change.group))
        except AWS_ERRORS as err:
            results.append(MaxResult(change.group, "failed", describe(err)))
            continue
        results.append(MaxResult(change.group, "set") if done else
                       MaxResult(change.group, "skipped", "stopped meanwhile: left at 0"))
    return results
