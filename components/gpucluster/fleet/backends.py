"""Which backend runs a deployment's node groups: one registry line per kind of capacity.

A stack's scheduler kind (`scheduler.type` in the stack file: what runs its work, and so what
launches its nodes) says where its node groups' capacity lives: `none`, Auto Scaling groups
(`asg`); `slurm`, an AWS PCS cluster's compute node groups (`pcsgroups`). `BACKENDS` maps each
kind to a factory of its `Capacity`, and `choose_node_groups` builds the `NodeGroups` backend over
it: the guard-state table (`guardstate`) when the deployment has one, else the groups' own tags
for a kind that keeps its stop state there (Auto Scaling), else a `ConfigError`. The handlers
(`stops.stack_node_groups`, from their environment) and `gpucluster.ops` (`ops.nodegroups.node_groups`,
from the stack file) both choose here, so a new kind of node group is one module with a
`Capacity` plus one line in `BACKENDS`. It must never import Pulumi: it is carried into the
Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .asg import AutoScalingCapacity, AutoScalingGroups
from .guardstate import StoredNodeGroups
from .nodegroups import Capacity, NodeGroups
from .pcsgroups import PcsCapacity
from .runtime import ConfigError


@dataclass(frozen=True)
class Placement:
    """Where a deployment's node groups are: what a backend's factory builds its `Capacity` from."""

    client: Callable[[str], Any]
    """A service name -> a boto3 client in the deployment's region."""
    stack: str
    """The deployment identity (the `gpucluster:stack` tag)."""
    cluster_id: str | None = None
    """The scheduler's own cluster, for a kind that has one (a Slurm stack's PCS cluster)."""
    strict_members: bool = False
    """Fail rather than read groups without their instances (what the spend guard prices)."""
    deadline: float | None = None
    """A `RUNTIME.clock()` value a capacity may wait until for a busy group (a handler's); None: no wait."""
    wait_seconds: float | None = None
    """Without a deadline, how long each change may wait for a busy group once it meets one (the CLI's)."""


@dataclass(frozen=True)
class Backend:
    """One kind of node group: its capacity under the guard-state table, and its tags-only backend."""

    capacity: Callable[[Placement], Capacity]
    without_table: Callable[[Placement], NodeGroups] | None = None
    """The backend when the deployment has no guard-state table (the stop state in the groups'
    own tags); None: this kind is stopped and started only through the table."""


def _pcs_capacity(where: Placement) -> Capacity:
    if not where.cluster_id:
        raise ConfigError(f"stack {where.stack}: no PCS cluster named for its Slurm node groups")
    return PcsCapacity(where.client("pcs"), where.cluster_id, where.stack, ec2=where.client("ec2"),
                       strict_members=where.strict_members, deadline=where.deadline,
                       wait_seconds=where.wait_seconds)


BACKENDS: dict[str, Backend] = {
    "none": Backend(capacity=lambda where: AutoScalingCapacity(where.client("autoscaling")),
                    without_table=lambda where: AutoScalingGroups(where.client("autoscaling"))),
    # EKS's GPU node groups are Auto Scaling groups too (self-managed); their MAX_NODES_TAG makes a stop
    # zero the maximum as well, so the cluster-autoscaler cannot bring a stopped group back.
    "eks": Backend(capacity=lambda where: AutoScalingCapacity(where.client("autoscaling")),
                   without_table=lambda where: AutoScalingGroups(where.client("autoscaling"))),
    "slurm": Backend(capacity=_pcs_capacity),
}
"""Scheduler kind (`scheduler.type`) -> where its node groups' capacity lives."""


def choose_node_groups(kind: str, client: Callable[[str], Any], stack: str, *, table: str | None,
                       actor: str, cluster_id: str | None = None,
                       strict_members: bool = False, deadline: float | None = None,
                       wait_seconds: float | None = None) -> NodeGroups:
    """The `NodeGroups` backend of deployment `stack`, whose scheduler is `kind` (`deadline`,
    `wait_seconds`: `Placement`'s).

    Over the guard-state `table` when there is one; without, the kind's tags-only backend, or a
    `ConfigError` for a kind that keeps no stop state of its own (PCS has no tags the guardrails
    write) or a kind nothing is registered for.
    """
    backend = BACKENDS.get(kind)
    if backend is None:
        raise ConfigError(f"no node-group backend for scheduler type {kind!r} "
                          f"(known: {', '.join(sorted(BACKENDS))})")
    where = Placement(client, stack, cluster_id=cluster_id, strict_members=strict_members, deadline=deadline,
                      wait_seconds=wait_seconds)
    if table:
        return StoredNodeGroups(None, client("dynamodb"), table, actor=actor,
                                capacity=backend.capacity(where))
    if backend.without_table is not None:
        return backend.without_table(where)
    named = f"PCS cluster {cluster_id}" if cluster_id else f"{kind} stack {stack}"
    raise ConfigError(f"{named}: its node groups are stopped and started only through the stack's "
                      "guard-state table (a stack with a budget action, autostop or a Capacity Block "
                      "has one); none found")
