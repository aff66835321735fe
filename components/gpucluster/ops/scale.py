"""Scale, stop and start a stack's node groups by hand, through the guardrails' own tag contract.

This backs `gpucluster scale`, `stop` and `start`, acting on node groups only
through the Lambdas' seam (`gpucluster.fleet.nodegroups`, the Auto Scaling
backend behind it). A manual stop is a stop like any guardrail's: `stop_groups`
with reason `manual` records who stopped the
group and what to restore, after the stack's pre-stop hook ran on its nodes
(as the idle stop runs it). So `status` shows it, `resume` undoes it, a
schedule start leaves it alone (it only undoes schedule stops) and a budget stop
still outranks it. `start` undoes manual, idle, schedule and lifetime stops,
never a budget stop (that is `resume --only budget`, with its warning). Every
change is planned first (read-only, for the operator to confirm) and decided
again on the group as described right before its write. Nothing is deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import boto3

from gpucluster.fleet.nodegroups import BUDGET, IDLE, LIFETIME, MANUAL, SCHEDULE, StateConflict
from gpucluster.fleet.stops import StopReport, stop_groups
from gpucluster.ops import node_groups
from gpucluster.ops.nodes import NodesError, select_groups
from gpucluster.ops.status import ResumeCandidate, ResumeResult, plan_resume, resume_stack

# What `start` may undo: every stop but the budget's.
START_REASONS = (MANUAL, IDLE, SCHEDULE, LIFETIME)


class ScaleError(NodesError):
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


def plan_scale(identity: str, node_group: str, desired: int, *,
               autoscaling_client: Any = None, stack: str = "<stack>") -> list[ScaleChange]:
    """What setting `node_group` to `desired` nodes changes; read-only.

    MinSize comes down with desired (never up); desired above MaxSize is refused
    (max_nodes is the stack file's, changed by `pulumi up`), and so is scaling up a
    group a guardrail or a person stopped: `start` or `resume` restore it with its tags.
    """
    if desired < 0:
        raise ScaleError(f"--desired: must be >= 0, got {desired}")
    backend = node_groups(autoscaling_client, identity=identity)
    changes = []
    for group in select_groups(backend.list_groups(identity), node_group):
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
    return changes


@dataclass(frozen=True)
class ScaleResult:
    group: str
    action: str
    """"scaled" or "skipped"."""
    reason: str = ""


def apply_scale(changes: list[ScaleChange], *, autoscaling_client: Any = None,
                identity: str | None = None) -> list[ScaleResult]:
    """Write each planned change, unless the group was stopped since it was shown.

    With the stack's `identity` and its guard-state table, the write is conditional on the
    stored state: a stop landing meanwhile wins and the change is reported skipped.
    """
    backend = node_groups(autoscaling_client, identity=identity)
    results = []
    for change in changes:
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
    return results


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


def plan_stop(identity: str, node_group: str | None = None, *,
              autoscaling_client: Any = None, pcs_cluster_id: str | None = None) -> list[StopCandidate]:
    """The selected groups and their capacity now; read-only."""
    backend = node_groups(autoscaling_client, identity=identity, pcs_cluster_id=pcs_cluster_id)
    return [StopCandidate(g.name, g.label, g.desired, len(g.in_service_ids), g.stopped_by)
            for g in select_groups(backend.list_groups(identity), node_group)]


def stop_stack(candidates: list[StopCandidate], *, autoscaling_client: Any = None, ssm_client: Any = None,
               pre_stop_command: str | None = None, hook_timeout_seconds: float = 300.0,
               identity: str | None = None, pcs_cluster_id: str | None = None,
               ec2_client: Any = None) -> StopReport:
    """Run the pre-stop hook on the running groups' nodes, then scale them to zero (reason manual).

    The groups are read again first; `stop_groups` reads them once more
    after the hook, so a budget stop that lands meanwhile keeps its label. On a Slurm stack
    (`pcs_cluster_id`) the hook is Slurm's: the partitions are held and their jobs signalled and
    requeued on the login node (grace: `hook_timeout_seconds`), as a guardrail's stop does.
    """
    backend = node_groups(autoscaling_client, identity=identity, pcs_cluster_id=pcs_cluster_id)
    groups = backend.read_groups([c.group for c in candidates if c.running])
    if pcs_cluster_id and identity:
        from gpucluster.fleet.slurmhold import hold_partitions

        ssm, ec2 = ssm_client or boto3.client("ssm"), ec2_client or boto3.client("ec2")
        stack = identity

        def hold(partitions: list[str]) -> Any:
            return hold_partitions(ssm, ec2, stack, partitions, grace_seconds=hook_timeout_seconds,
                                   timeout_seconds=hook_timeout_seconds + 30.0)

        return stop_groups(backend, groups, MANUAL, slurm_hold=hold)
    ssm = (ssm_client or boto3.client("ssm")) if pre_stop_command else None
    return stop_groups(backend, groups, MANUAL, ssm=ssm, pre_stop_command=pre_stop_command,
                       hook_timeout_seconds=hook_timeout_seconds)


# ------------------------------------------------------------------------ start


def plan_start(identity: str, node_group: str | None = None, *,
               autoscaling_client: Any = None, pcs_cluster_id: str | None = None) -> list[ResumeCandidate]:
    """What `start` would restore in the selection (budget stops left out); read-only."""
    autoscaling = autoscaling_client or (None if pcs_cluster_id else boto3.client("autoscaling"))
    candidates = plan_resume(identity, autoscaling_client=autoscaling, only_stopped_by=START_REASONS,
                             pcs_cluster_id=pcs_cluster_id)
    if node_group is None:
        return candidates
    chosen = [c for c in candidates if node_group in (c.node_group, c.group)]
    if not chosen:
        known = ", ".join(sorted({c.node_group or c.group for c in candidates})) or "none deployed"
        raise NodesError(f"no node group {node_group!r} in this stack (node groups: {known})")
    return chosen


def start_stack(identity: str, shown: Mapping[str, str | None], *,
                autoscaling_client: Any = None, pcs_cluster_id: str | None = None,
                ssm_client: Any = None, ec2_client: Any = None) -> list[ResumeResult]:
    """Restore the shown groups to their recorded capacity (a stop that changed since is skipped);
    on a Slurm stack then set their partitions UP (`ops.status.resume_stack`)."""
    return resume_stack(identity, autoscaling_client=autoscaling_client,
                        only_stopped_by=START_REASONS, shown=shown, pcs_cluster_id=pcs_cluster_id,
                        ssm_client=ssm_client, ec2_client=ec2_client)
