"""The nodes of a deployed stack: which instances its groups run, where, and whether SSM reaches them.

This backs `gpucluster nodes`, and gives `run`, `hostfile`, `scale` and
`stop`/`start` their view of the cluster. Nodes are found through the stack's
node groups (read through the `lambdas.nodegroups` seam, selected by the
`gpucluster:stack` identity tag, never by name), then described in EC2
(address, market, launch time) and in Systems Manager (is the agent
online). Read-only: it never changes anything, and it never looks at an
instance that is not a member of one of the stack's groups.
The rank order (`ranked`) is the one contract every multi-node command shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpucluster import catalog
from gpucluster.fleet.asg import AutoScalingGroups
from gpucluster.fleet.awsapi import AWS_ERRORS, batches
from gpucluster.fleet.nodegroups import NodeGroup
from gpucluster.ops import OpsError

# EC2 API reference, Instance.InstanceLifecycle: "spot", "scheduled" or "capacity-block"; absent
# for on-demand instances (reservations included).
LIFECYCLES = {"spot": "spot", "capacity-block": "capacity-block", "scheduled": "scheduled"}
ON_DEMAND = "on-demand"
# SSM API reference, InstanceInformation.PingStatus: Online, ConnectionLost, Inactive.
SSM_ONLINE = "Online"
SSM_UNREGISTERED = "not registered"
SSM_UNKNOWN = "unknown"
IN_SERVICE = "InService"
# Auto Scaling lifecycle states of a node launched but not yet in service: the launch hook holds it
# in Pending:Wait until it is ready (gpucluster-ready), so `run` never targets it.
GETTING_READY = frozenset({"Pending", "Pending:Wait", "Pending:Proceed"})
ACTIVITY_RECORDS = 100  # the group's newest scaling activities (DescribeScalingActivities' maximum)
# DescribeInstances takes up to 1000 ids per call; DescribeInstanceInformation's InstanceIds
# filter up to 50 values (API references).
EC2_IDS_PER_CALL = 1000
SSM_IDS_PER_CALL = 50


class NodesError(OpsError):
    """A request the stack cannot answer (an unknown node group): one line for the operator."""


@dataclass(frozen=True)
class Node:
    """One instance of a stack's group, as an operator (and `run`) needs it."""

    instance_id: str
    node_group: str
    """The group's gpucluster:node-group tag (its Auto Scaling group's name when the tag is missing)."""
    asg: str
    instance_type: str
    zone: str
    private_ip: str | None
    lifecycle: str
    """on-demand, spot or capacity-block (EC2's InstanceLifecycle)."""
    state: str
    """EC2 state: pending, running, stopping, shutting-down..."""
    asg_state: str
    """Auto Scaling lifecycle state: Pending, InService, Terminating..."""
    health: str
    """Auto Scaling health: Healthy or Unhealthy."""
    launch_time: datetime | None
    ssm: str
    """Systems Manager ping status (Online, ConnectionLost, Inactive), `not registered` or `unknown`."""
    mig_per_gpu: int = 0
    """MIG instances each GPU is split into (its node group's `mig` layout); 0: whole GPUs."""
    metrics: str | None = None
    """With observability.prometheus: writing, exporter down, not writing or unknown (ops.metrics)."""
    ready_seconds: float | None = None
    """In service: from its launch activity's start to in service (the hook completed); None: unknown."""
    getting_ready_seconds: float | None = None
    """Not yet in service: how long it has been getting ready so far."""

    @property
    def getting_ready(self) -> bool:
        """Launched, not yet in service (held by the launch hook until it can run work)."""
        return self.asg_state in GETTING_READY

    @property
    def readiness(self) -> str:
        """`ready in 3m12s`, `getting ready 5m02s`, or `-`."""
        if self.getting_ready_seconds is not None:
            return f"getting ready {minutes(self.getting_ready_seconds)}"
        if self.ready_seconds is not None:
            return f"ready in {minutes(self.ready_seconds)}"
        return "-"

    @property
    def gpus(self) -> int:
        """GPUs of the instance type, from the catalog (0 for a type we do not carry)."""
        record = catalog.get(self.instance_type)
        return record.gpus if record else 0

    @property
    def slots(self) -> int:
        """Devices a job runs one process on each: the GPUs' MIG instances, or the GPUs."""
        return self.gpus * (self.mig_per_gpu or 1)

    @property
    def in_service(self) -> bool:
        """Ready for work: InService in its group and running in EC2."""
        return self.asg_state == IN_SERVICE and self.state == "running"

    @property
    def unreachable(self) -> bool:
        """SSM says it cannot reach the node (False when SSM could not be asked)."""
        return self.ssm not in (SSM_ONLINE, SSM_UNKNOWN)

    def as_json(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "node_group": self.node_group, "asg": self.asg,
                "instance_type": self.instance_type, "gpus": self.gpus, "slots": self.slots,
                "mig_per_gpu": self.mig_per_gpu, "zone": self.zone,
                "private_ip": self.private_ip, "lifecycle": self.lifecycle, "state": self.state,
                "asg_state": self.asg_state, "health": self.health,
                "launch_time": self.launch_time.isoformat() if self.launch_time else None,
                "ssm": self.ssm, "ready_seconds": self.ready_seconds,
                "getting_ready_seconds": self.getting_ready_seconds,
                **({"metrics": self.metrics} if self.metrics is not None else {})}


def minutes(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s"


def launch_activities(activities: Iterable[Mapping[str, Any]]) -> dict[str, tuple[Any, Any]]:
    """Instance id -> (start, end) of its launch activity ("Launching a new EC2 instance: i-..."):
    the end is set once the activity succeeded, i.e. the launch hook completed and the node went in
    service (EC2 Auto Scaling user guide, "Verify a scaling activity"); None while it is held."""
    found: dict[str, tuple[Any, Any]] = {}
    for activity in activities:
        text = str(activity.get("Description", ""))
        if not text.startswith("Launching a new EC2 instance"):
            continue
        instance = next((w for w in text.replace(".", " ").replace(":", " ").split() if w.startswith("i-")),
                        None)
        if instance is None or instance in found:
            continue
        done = activity.get("StatusCode") == "Successful"
        found[instance] = (activity.get("StartTime"), activity.get("EndTime") if done else None)
    return found


def group_launches(autoscaling: Any, asg_name: str) -> dict[str, tuple[Any, Any]]:
    """`launch_activities` of one group's newest activities; empty when they cannot be read (the
    listing is still worth having without readiness times)."""
    try:
        page = autoscaling.describe_scaling_activities(AutoScalingGroupName=asg_name,
                                                       MaxRecords=ACTIVITY_RECORDS)
    except AWS_ERRORS:
        return {}
    return launch_activities(page.get("Activities", []))


def readiness(state: str, launch: tuple[Any, Any] | None, launch_time: datetime | None,
              now: datetime) -> tuple[float | None, float | None]:
    """(ready_seconds, getting_ready_seconds) of one member, from its launch activity or EC2 launch time."""
    start, end = launch if launch else (None, None)
    if state in GETTING_READY:
        since = start if isinstance(start, datetime) else launch_time
        return None, (now - since).total_seconds() if since else None
    if state == IN_SERVICE and isinstance(start, datetime) and isinstance(end, datetime):
        return (end - start).total_seconds(), None
    return None, None


def select_groups(groups: Sequence[NodeGroup], node_group: str | None) -> list[NodeGroup]:
    """The groups of one node group (by its stack-file name, or the group's own name); all for None."""
    if node_group is None:
        return list(groups)
    chosen = [g for g in groups if node_group in (g.label, g.name)]
    if not chosen:
        known = ", ".join(sorted({g.label for g in groups})) or "none deployed"
        raise NodesError(f"no node group {node_group!r} in this stack (node groups: {known})")
    return chosen


def describe_instances(ec2: Any, instance_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """EC2's view of the instances, by id (instances EC2 no longer knows are absent)."""
    found: dict[str, dict[str, Any]] = {}
    for batch in batches(sorted(set(instance_ids)), EC2_IDS_PER_CALL):
        for page in ec2.get_paginator("describe_instances").paginate(InstanceIds=batch):
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    found[instance["InstanceId"]] = instance
    return found


def ssm_ping(ssm: Any, instance_ids: Sequence[str]) -> dict[str, str]:
    """Systems Manager ping status by instance id (ssm:DescribeInstanceInformation).

    Every id gets a status: an instance SSM does not list is `not registered`; when
    SSM cannot be asked (no permission, an API error) every status is `unknown`, since
    the listing is still worth having without it.
    """
    ids = sorted(set(instance_ids))
    status = dict.fromkeys(ids, SSM_UNREGISTERED)
    try:
        for batch in batches(ids, SSM_IDS_PER_CALL):
            paginator = ssm.get_paginator("describe_instance_information")
            for page in paginator.paginate(Filters=[{"Key": "InstanceIds", "Values": batch}]):
                for info in page["InstanceInformationList"]:
                    status[info["InstanceId"]] = info.get("PingStatus", SSM_UNKNOWN)
    except AWS_ERRORS:
        return dict.fromkeys(ids, SSM_UNKNOWN)
    return status


def stack_nodes(identity: str, *, node_group: str | None = None, autoscaling_client: Any,
                ec2_client: Any, ssm_client: Any,
                mig_per_gpu: Mapping[str, int] | None = None, now: datetime | None = None) -> list[Node]:
    """Every instance of the stack's groups (of one node group when given), in rank order.

    `mig_per_gpu`: node group -> the MIG instances of each of its GPUs (the stack file's `mig`),
    so that their nodes count MIG devices as slots.
    """
    # The stack's Auto Scaling groups' members: the tags' view of the stop state suffices.
    backend = AutoScalingGroups(autoscaling_client)
    groups = select_groups(backend.list_groups(identity), node_group)
    members = [(g, m) for g in groups for m in g.members]
    if not members:
        return []
    ids = [m.instance_id for _, m in members]
    described = describe_instances(ec2_client, ids)
    ping = ssm_ping(ssm_client, ids)
    launches = {g.name: group_launches(autoscaling_client, g.name) for g in groups if g.members}
    now = now or datetime.now(UTC)
    nodes = []
    for group, member in members:
        instance = described.get(member.instance_id, {})
        ready, getting_ready = readiness(member.lifecycle_state, launches[group.name].get(member.instance_id),
                                         instance.get("LaunchTime"), now)
        nodes.append(Node(
            instance_id=member.instance_id,
            node_group=group.label,
            asg=group.name,
            instance_type=instance.get("InstanceType") or member.instance_type or "?",
            zone=member.zone or instance.get("Placement", {}).get("AvailabilityZone", "?"),
            private_ip=instance.get("PrivateIpAddress"),
            lifecycle=LIFECYCLES.get(instance.get("InstanceLifecycle", ""), ON_DEMAND),
            state=instance.get("State", {}).get("Name", "unknown"),
            asg_state=member.lifecycle_state,
            health=member.health,
            launch_time=instance.get("LaunchTime"),
            ssm=ping[member.instance_id],
            mig_per_gpu=(mig_per_gpu or {}).get(group.label, 0),
            ready_seconds=ready, getting_ready_seconds=getting_ready,
        ))
    return ranked(nodes)


def ranked(nodes: Iterable[Node]) -> list[Node]:
    """Rank order: node group, then launch time, then instance id.

    Launch time first so that a replaced node joins at the end and every other
    node keeps its rank (rank 0, the MASTER_ADDR, stays the oldest node); the
    instance id breaks ties between nodes launched in the same second.
    """
    def key(n: Node) -> tuple[str, float, str]:
        when = n.launch_time.timestamp() if n.launch_time else float("inf")
        return (n.node_group, when, n.instance_id)

    return sorted(nodes, key=key)
