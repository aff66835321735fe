"""The one place day-2 operations pick a stack's node-group backend, and the `Fleet` they act on.

`node_groups` reads the stack file: its scheduler kind (`scheduler.type`) picks the backend from
the fleet core's registry (`gpucluster.fleet.backends`), a Slurm stack's PCS cluster is found by
the stack's tag (`ops.pcsclusters`), and the guard-state table by the deployment identity.
`stack_fleet` wraps the backend with the clients that reach it, so a command's plan and its apply
act through the same backend, looked up once. Nothing here changes anything in AWS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucluster.ops import Clients, OpsError
from gpucluster.ops.pcsclusters import stack_pcs_cluster

if TYPE_CHECKING:
    from gpucluster.fleet.nodegroups import NodeGroups
    from gpucluster.spec import StackSpec


class NoNodeGroups(OpsError):
    """The stack's node groups cannot be acted on as deployed (PCS groups without a guard-state table)."""


def node_groups(spec: StackSpec, clients: Clients) -> NodeGroups:
    """The backend the stack's node groups are run by, as its guardrail handlers pick it.

    A Slurm stack's PCS cluster is found by the stack's tag (`ops.pcsclusters`); the backend for
    the stack's scheduler kind then comes from the fleet's registry (`fleet.backends`), over the
    stack's guard-state table when it has one (`deployment_node_groups`).
    """
    cluster = stack_pcs_cluster(spec.identity, clients("pcs")) if spec.scheduler.slurm else None
    return deployment_node_groups(spec.identity, spec.scheduler.type, clients, cluster_id=cluster)


def deployment_node_groups(identity: str, kind: str, clients: Clients, *,
                           cluster_id: str | None = None) -> NodeGroups:
    """The backend of deployment `identity`, whose scheduler is `kind` (`scheduler.type`).

    Its guard-state table (named from the identity by `fleet.deployment.state_table_name`, as the
    stack creates it) is looked up: when it exists, operations go through the stored backend, so
    a person's start or scale takes part in the same conditional writes as the guardrails; a
    stack without guardrails (or deployed before the table) has none, and its groups' tags are
    the state (a PCS stack has no tags: it needs the table, `NoNodeGroups`). A change that meets a
    PCS node group UPDATING (ConflictException) waits for it as the stopping Lambdas do, at most
    PCS_ACTIVE_WAIT_SECONDS from then (`fleet.pcsgroups`), and fails past that. boto3 loads here, on
    the first operation that needs AWS, not when `ops` is imported.
    """
    from botocore.exceptions import ClientError

    from gpucluster.fleet.backends import choose_node_groups
    from gpucluster.fleet.deployment import PCS_ACTIVE_WAIT_SECONDS, state_table_name
    from gpucluster.fleet.runtime import ConfigError

    table: str | None = state_table_name(identity)
    try:
        clients("dynamodb").describe_table(TableName=table)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise
        table = None
    try:
        return choose_node_groups(kind, clients, identity, table=table, actor="gpucluster-cli",
                                  cluster_id=cluster_id, wait_seconds=PCS_ACTIVE_WAIT_SECONDS)
    except ConfigError as exc:
        raise NoNodeGroups(str(exc)) from exc


@dataclass(frozen=True)
class Fleet:
    """A deployed stack's node groups as day-2 operations act on them: the backend chosen once.

    What a plan reads and its apply writes through, so the PCS cluster and the guard-state table
    are looked up once per command (`stack_fleet`); a test builds one around any backend.
    """

    identity: str
    clients: Clients
    groups: NodeGroups
    slurm: bool = False
    """Its work runs on Slurm: a stop holds its partitions first, a start releases them after."""
    eks: bool = False
    """Its groups are an EKS stack's: a start also sets the configured maximum on those that run."""


def stack_fleet(spec: StackSpec, clients: Clients) -> Fleet:
    """The stack's `Fleet`: its node-group backend (`node_groups`) with the clients that reach it."""
    return Fleet(spec.identity, clients, node_groups(spec, clients), slurm=spec.scheduler.slurm,
                 eks=spec.scheduler.eks)
