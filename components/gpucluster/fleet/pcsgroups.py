"""AWS PCS compute node groups as the capacity of the stored backend (`guardstate`) on a Slurm stack.

On a Slurm stack (`gpucluster:scheduler` type slurm) a node group is an AWS PCS compute node
group of the stack's one PCS cluster, named as the node group (the login group, `login`, is
not a node group: the guardrails never stop it, since holding and releasing the partitions
runs on it). PCS has no desired count: Slurm launches instances between the group's
`scalingConfiguration` minimum and maximum as jobs need them (PCS API reference,
ScalingConfiguration: minInstanceCount, maxInstanceCount). So in the seam's terms a PCS
group's `desired` is its maximum (a group with a maximum above 0 can run, and a stop must
take it away), and a stop sets min = max = 0 (`stop_zeroes_max`): the stored record keeps
the previous min and max (as previous_min / previous_desired), and a restore puts both back.

Calls: ListComputeNodeGroups (names -> ids, on the cluster), GetComputeNodeGroup and
UpdateComputeNodeGroup (by id, so the IAM resource is the ARN of the id the roles were
given). An update while the group is UPDATING (or CREATING) fails with ConflictException
("UpdateComputeNodeGroup", PCS API reference, Errors; the ConflictException shape's own examples
include "a cluster isn't in ACTIVE status"), e.g. right after a schedule start. With a `deadline`
(a handler's: its remaining time, `runtime.invocation_deadline`; a Slurm stack's stopping Lambdas
get PCS_ACTIVE_WAIT_SECONDS more time for it) the update waits: backoff from
BACKOFF_FIRST_SECONDS doubling to BACKOFF_MAX_SECONDS, reading the group (GetComputeNodeGroup's
status) while it is in a passing status (WAIT_STATUSES, of botocore's ComputeNodeGroupStatus),
then updating again; when the next wait would pass the deadline the ConflictException is raised
to the stored backend, which records the stop as failed and raises, so the invocation fails and
the schedule's retry (or the next tick, or the spend guard's next check) tries again; the
on-failure destination tells. A stop never returns as done while the group keeps its maximum. Each
update carries botocore's automatic clientToken (the API's idempotency token), so a retry of
the same call inside botocore is one update. No stop state is mirrored on PCS: its tags
would need pcs:TagResource, and the guard-state table is the state (`gpucluster status` reads
it). A group's members are its live EC2 instances, found by our launch template's tags
(`group_members`). Never deletes anything, never imports Pulumi: carried into the Lambda archive as
``gpucluster.fleet``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from .awsapi import AWS_ERRORS, error_code, log_event
from .deployment import PCS_CLUSTER_ENV
from .nodegroups import IN_SERVICE, Member, NodeGroup, StateConflict, StopState
from .runtime import RUNTIME
from .tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP, STACK_TAG

__all__ = ["PCS_CLUSTER_ENV", "PcsCapacity", "pcs_node_group"]
# Compute node groups that exist no more or are on their way out (ComputeNodeGroupStatus).
GONE_STATUSES = frozenset({"DELETING", "DELETED", "DELETE_FAILED"})
NOT_FOUND = "ResourceNotFoundException"
CONFLICT = "ConflictException"
# Statuses a group passes through on its own (ComputeNodeGroupStatus): an update waits them out.
WAIT_STATUSES = frozenset({"CREATING", "UPDATING", "SUSPENDING", "RESUMING"})
BACKOFF_FIRST_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 60.0


def pcs_node_group(description: Mapping[str, Any], stack: str) -> NodeGroup:
    """A GetComputeNodeGroup `computeNodeGroup` as the seam's value: desired = the maximum."""
    scaling = description.get("scalingConfiguration") or {}
    minimum = int(scaling.get("minInstanceCount", 0))
    maximum = int(scaling.get("maxInstanceCount", 0))
    return NodeGroup(name=description["name"], node_group=description["name"], stack=stack,
                     min_size=minimum, desired=maximum, max_size=maximum, stop=StopState())


# EC2 states of an instance PCS launched that still costs or will (DescribeInstances filter values).
LIVE_STATES = ("pending", "running")


def group_members(ec2: Any, stack: str) -> dict[str, tuple[Member, ...]]:
    """Node group -> its live instances, by our launch template's tags (set by `aws.pcs`).

    PCS launches from our launch template, so its instances carry STACK_TAG and NODE_GROUP_TAG;
    a running one counts as in service (it can run a hook and it accrues cost); its health is
    Slurm's to say, not EC2's ("?").
    """
    filters = [{"Name": f"tag:{STACK_TAG}", "Values": [stack]},
               {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
    members: dict[str, list[Member]] = {}
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                tags = {t["Key"]: t.get("Value", "") for t in instance.get("Tags", [])}
                group = tags.get(NODE_GROUP_TAG)
                if tags.get(STACK_TAG) != stack or not group or group == SLURM_LOGIN_GROUP:
                    continue
                state = instance.get("State", {}).get("Name")
                members.setdefault(group, []).append(Member(
                    instance["InstanceId"], IN_SERVICE if state == "running" else "Pending",
                    instance_type=instance.get("InstanceType"),
                    zone=instance.get("Placement", {}).get("AvailabilityZone")))
    return {g: tuple(sorted(m, key=lambda x: x.instance_id)) for g, m in members.items()}


class PcsCapacity:
    """`Capacity` of the compute node groups of PCS cluster `cluster_id`, which belongs to `stack`.

    With `ec2`, each group carries its live instances as members (what the spend guard prices and
    the lifetime limit dates); without, none. A stop needs no members: when EC2 refuses the lookup
    the groups come without them (logged as an error), so a throttled or denied DescribeInstances
    never blocks a budget stop; with `strict_members` (the spend guard, the lifetime check, which
    would price or date nothing) the error is raised instead. `deadline` (a `RUNTIME.clock()` value):
    how long an update that meets ConflictException may wait for the group; None: not at all.
    `wait_seconds` (the CLI's, which has no handler's deadline): without a deadline, how long after
    meeting ConflictException each update may wait the same way; None: not at all.
    """

    stop_zeroes_max = True

    def __init__(self, pcs: Any, cluster_id: str, stack: str, ec2: Any = None, *,
                 strict_members: bool = False, deadline: float | None = None,
                 wait_seconds: float | None = None) -> None:
        self.pcs = pcs
        self.cluster_id = cluster_id
        self.stack = stack
        self.ec2 = ec2
        self.strict_members = strict_members
        self.deadline = deadline
        self.wait_seconds = wait_seconds
        self._ids: dict[str, str] = {}

    def _with_members(self, groups: list[NodeGroup]) -> list[NodeGroup]:
        if self.ec2 is None or not groups:
            return groups
        try:
            members = group_members(self.ec2, self.stack)
        except AWS_ERRORS as exc:
            if self.strict_members:
                raise
            log_event("node group members unknown: EC2 refused the lookup", logging.ERROR,
                      stack=self.stack, error=str(exc))
            return groups
        return [dataclasses.replace(g, members=members.get(g.name, ())) for g in groups]

    def _summaries(self) -> dict[str, str]:
        """Name -> id of the cluster's node groups (not the login group, not those being deleted)."""
        ids: dict[str, str] = {}
        kwargs: dict[str, Any] = {"clusterIdentifier": self.cluster_id}
        while True:
            page = self.pcs.list_compute_node_groups(**kwargs)
            for summary in page.get("computeNodeGroups", []):
                if summary.get("status") in GONE_STATUSES or summary.get("name") == SLURM_LOGIN_GROUP:
                    continue
                ids[summary["name"]] = summary["id"]
            if not page.get("nextToken"):
                break
            kwargs["nextToken"] = page["nextToken"]
        self._ids = ids
        return ids

    def _describe(self, name: str, group_id: str) -> NodeGroup | None:
        try:
            answer = self.pcs.get_compute_node_group(clusterIdentifier=self.cluster_id,
                                                     computeNodeGroupIdentifier=group_id)
        except AWS_ERRORS as exc:
            if error_code(exc) == NOT_FOUND:
                return None  # deleted between the list and the read
            raise
        description = answer["computeNodeGroup"]
        if description.get("status") in GONE_STATUSES:
            return None
        return pcs_node_group({**description, "name": description.get("name", name)}, self.stack)

    def describe_stack(self, stack: str) -> list[NodeGroup]:
        if stack != self.stack:
            return []  # the cluster is this stack's alone
        ids = self._summaries()
        described = [self._describe(name, ids[name]) for name in sorted(ids)]
        return self._with_members([g for g in described if g is not None])

    def describe(self, names: Iterable[str]) -> list[NodeGroup]:
        wanted = sorted(set(names))
        if not wanted:
            return []
        ids = self._summaries()
        return self._with_members([g for name in wanted
                                   if name in ids and (g := self._describe(name, ids[name])) is not None])

    def resize(self, name: str, min_size: int, desired: int, *, closing: bool = True) -> None:
        """min and max (`desired` is the maximum on PCS, so zero closes it whatever `closing` says); a
        stop is set(name, 0, 0)."""
        group_id = self._ids.get(name) or self._summaries().get(name)
        if group_id is None:
            # Gone (deleted meanwhile): a stop reads again and finds nothing to stop.
            raise StateConflict(f"PCS cluster {self.cluster_id} has no compute node group {name!r}")
        delay, deadline = BACKOFF_FIRST_SECONDS, self.deadline
        while True:
            try:
                self.pcs.update_compute_node_group(
                    clusterIdentifier=self.cluster_id, computeNodeGroupIdentifier=group_id,
                    scalingConfiguration={"minInstanceCount": min(min_size, desired),
                                          "maxInstanceCount": desired})
                return
            except AWS_ERRORS as exc:
                if error_code(exc) != CONFLICT:
                    raise
                if deadline is None and self.wait_seconds:
                    deadline = RUNTIME.clock() + self.wait_seconds
                delay = self._wait_out(name, group_id, delay, exc, deadline)

    def _wait_out(self, name: str, group_id: str, delay: float, conflict: Exception,
                  deadline: float | None) -> float:
        """Sleep with backoff until the group leaves WAIT_STATUSES (read after each sleep); the next
        delay. Raises `conflict` when the next sleep would pass `deadline` (None: at once),
        StateConflict when the group is gone meanwhile."""
        while True:
            if deadline is None or RUNTIME.clock() + delay > deadline:
                log_event("node group still busy: update refused", logging.ERROR, cluster=self.cluster_id,
                          group=name, error=str(conflict))
                raise conflict
            log_event("node group busy: waiting to update", cluster=self.cluster_id, group=name,
                      seconds=delay)
            RUNTIME.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_SECONDS)
            try:
                answer = self.pcs.get_compute_node_group(clusterIdentifier=self.cluster_id,
                                                         computeNodeGroupIdentifier=group_id)
            except AWS_ERRORS as exc:
                if error_code(exc) == NOT_FOUND:
                    raise StateConflict(f"PCS compute node group {name!r} is gone") from exc
                raise
            status = answer["computeNodeGroup"].get("status")
            if status in GONE_STATUSES:
                raise StateConflict(f"PCS compute node group {name!r} is {status}")
            if status not in WAIT_STATUSES:
                return delay  # ACTIVE (or a failed update): try the update again

    def mirror(self, name: str, stopped_by: str, previous: StopState) -> None:
        """Nothing: the guard-state table is the one record on PCS (tags would need pcs:TagResource)."""

    def unmirror(self, name: str) -> None:
        """Nothing was mirrored."""
