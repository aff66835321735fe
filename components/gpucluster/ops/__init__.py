"""Day-2 operations against AWS (boto3): one module a concern, clients passed in, no Pulumi import.

Each operation returns a result object and prints nothing, so the CLI, a notebook or a Lambda
can call it alike. What the flows share is here: `Clients` (how an operation gets a boto3
client for a service, in the stack's region) and `Spinner` (how it tells the caller what it
is waiting for: a spinner in the CLI, nothing by default) and `node_groups` (the one place
operations pick the node-group backend they act through).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucluster.fleet.nodegroups import NodeGroups

Clients = Callable[[str], Any]
"""A service name -> a boto3 client in the stack's region."""
Spinner = Callable[[str], AbstractContextManager[Any]]
"""Shows `what` while a block runs (a spinner in the CLI)."""


def no_spinner(_what: str) -> AbstractContextManager[Any]:
    """The default `Spinner`: shows nothing (a notebook, a Lambda, a test)."""
    return nullcontext()


def node_groups(autoscaling_client: Any = None, *, identity: str | None = None,
                dynamodb_client: Any = None, pcs_cluster_id: str | None = None,
                pcs_client: Any = None) -> NodeGroups:
    """The backend the stack's node groups are run by, as the guardrail handlers pick it.

    With the stack's `identity`, its guard-state table (named from the identity by
    `lambdas.handlers.state_table_name`, as the stack creates it) is looked up: when it exists,
    operations go through the stored backend, so a person's start or scale takes part in the
    same conditional writes as the guardrails; a stack without guardrails (or deployed before
    the table) has none, and its groups' tags are the state. A Slurm stack names its PCS cluster
    (`pcs_cluster_id`, the stack's `pcs_cluster_id` output): its node groups are the cluster's
    compute node groups, through the same table (it needs `identity`). Operations read and change node
    groups only through it (`lambdas.nodegroups.NodeGroups`); boto3 loads here, on the first
    operation that needs AWS, not when `ops` is imported.
    """
    import boto3
    from botocore.exceptions import ClientError

    from gpucluster.fleet.deployment import state_table_name
    from gpucluster.fleet.stops import stack_node_groups

    # The table is in the groups' region: the Auto Scaling (or PCS) client's, when one is handed in.
    region = getattr(getattr(autoscaling_client or pcs_client, "meta", None), "region_name", None)

    def client(service: str) -> Any:
        if service == "autoscaling":
            return autoscaling_client or boto3.client(service)
        if service == "dynamodb":
            return dynamodb_client or boto3.client(service, region_name=region)
        if service == "pcs" and pcs_client is not None:
            return pcs_client
        return boto3.client(service, region_name=region)

    table = None
    if identity is not None:
        name = state_table_name(identity)
        try:
            client("dynamodb").describe_table(TableName=name)
            table = name
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
    return stack_node_groups(client, table=table, actor="gpucluster-cli", pcs_cluster_id=pcs_cluster_id,
                             stack=identity)
