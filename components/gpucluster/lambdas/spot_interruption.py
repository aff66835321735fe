"""Spot interruption handler: run the checkpoint hook on the one instance AWS is reclaiming.

EventBridge delivers ``EC2 Spot Instance Interruption Warning`` (two minutes
before the instance is reclaimed; detail ``instance-id``, ``instance-action``)
and ``EC2 Instance Rebalance Recommendation`` (earlier; detail ``instance-id``),
both from source aws.ec2 (EC2 user guide, "Spot Instance interruption notices"
and "EC2 instance rebalance recommendations"). The handler acts only if the
instance belongs to an Auto Scaling group tagged with this stack.

The node's own IMDS watcher may see the same notice and run the same hook, so
this handler never sends the checkpoint command itself: it runs the node's
once-per-boot wrapper (`INTERRUPTION_HOOK`, written by the node bootstrap),
which runs the stack's spot.interruption_command from the node's env file at
most once per boot and reports the one run's exit status to every caller. It
exports GPUCLUSTER_EVENT (``spot-interruption-warning`` or
``rebalance-recommendation``) and GPUCLUSTER_INSTANCE_ACTION, waits at most
INTERRUPTION_TIMEOUT_SECONDS (default 90, inside the two-minute warning), then
notifies SNS with the hook's outcome. INTERRUPTION_COMMAND only says that a
hook is configured. It never scales or deletes anything; the Auto Scaling
group replaces the instance itself.

On a Slurm stack (PCS_CLUSTER_ID set) the instance is in no Auto Scaling group: it is the
stack's when its own tags say so (our launch template's STACK_TAG, not the login group), and
the job is Slurm's: the login node drains the instance's Slurm node, signals its jobs and
requeues them (`slurmhold.requeue_node_script`), within INTERRUPTION_TIMEOUT_SECONDS.

Environment: GPUCLUSTER_STACK (required), INTERRUPTION_COMMAND,
INTERRUPTION_TIMEOUT_SECONDS, NOTIFY_TOPIC_ARN, PCS_CLUSTER_ID (optional).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from gpucluster.fleet.awsapi import describe_groups, group_tags, log_event
from gpucluster.fleet.deployment import PCS_CLUSTER_ENV
from gpucluster.fleet.nodepaths import INTERRUPTION_HOOK
from gpucluster.fleet.runcommand import run_command
from gpucluster.fleet.runtime import (
    RUNTIME,
    bounded_timeout,
    env_number,
    env_text,
    ignored,
    notify_from_env,
    stack_from_env,
)
from gpucluster.fleet.slurmhold import on_login_node, requeue_node_script
from gpucluster.fleet.tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP, STACK_TAG

EVENT_KINDS = {
    "EC2 Spot Instance Interruption Warning": "spot-interruption-warning",
    "EC2 Instance Rebalance Recommendation": "rebalance-recommendation",
}
DEFAULT_INTERRUPTION_TIMEOUT_SECONDS = 90.0
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
# The node's once-per-boot wrapper around spot.interruption_command; the same path as


def hook_command(kind: str, action: object) -> str:
    """The shell line sent to the node: the wrapper, with a reason for its log."""
    reason = f"{kind} via EventBridge and SSM (instance-action {action or 'none'})"
    return f"{INTERRUPTION_HOOK} {shlex.quote(reason)}"


def instance_group(autoscaling: Any, instance_id: str, stack: str) -> str | None:
    """The name of the instance's Auto Scaling group, if that group belongs to the stack."""
    found = autoscaling.describe_auto_scaling_instances(InstanceIds=[instance_id])
    names = [i["AutoScalingGroupName"] for i in found.get("AutoScalingInstances", [])]
    for group in describe_groups(autoscaling, names):
        if group_tags(group).get(STACK_TAG) == stack:
            name: str = group["AutoScalingGroupName"]
            return name
    return None


def slurm_instance(ec2: Any, instance_id: str, stack: str) -> dict[str, Any] | None:
    """The instance, if it is one of this stack's compute nodes (its own tags; not the login node)."""
    reservations = ec2.describe_instances(InstanceIds=[instance_id]).get("Reservations", [])
    for reservation in reservations:
        for instance in reservation.get("Instances", []):
            tags = {t["Key"]: t.get("Value", "") for t in instance.get("Tags", [])}
            group = tags.get(NODE_GROUP_TAG, SLURM_LOGIN_GROUP)
            if tags.get(STACK_TAG) == stack and group != SLURM_LOGIN_GROUP:
                return {**instance, "Tags": tags}
    return None


def on_slurm_stack(stack: str, kind: str, instance_id: str, action: object, context: Any) -> dict[str, Any]:
    """Drain the instance's Slurm node and requeue its jobs from the login node; notify the outcome."""
    instance = slurm_instance(RUNTIME.client("ec2"), instance_id, stack)
    if instance is None:
        return ignored("instance is not a compute node of this stack", instance=instance_id, stack=stack)
    group = instance["Tags"].get(NODE_GROUP_TAG)
    host = str(instance.get("PrivateDnsName") or "").split(".")[0] or instance_id
    requested = env_number("INTERRUPTION_TIMEOUT_SECONDS", DEFAULT_INTERRUPTION_TIMEOUT_SECONDS)
    timeout = bounded_timeout(requested, context, reserve_seconds=5.0)
    script = requeue_node_script(str(instance.get("PrivateIpAddress") or "none"), host,
                                 grace_seconds=max(0.0, timeout - 30.0), reason=kind)
    result = on_login_node(RUNTIME.client("ssm"), RUNTIME.client("ec2"), stack, script,
                           timeout_seconds=timeout, comment=f"gpucluster {kind}: requeue the node's jobs")
    summary: dict[str, Any] = {"action": "requeued" if result.ok else "requeue-failed", "stack": stack,
                               "event": kind, "instance": instance_id, "instance_action": action,
                               "group": group, "slurm": result.summary()}
    subject = f"gpucluster {stack}: {kind} for {instance_id} ({group})"
    if not result.ok:
        subject += ": requeue failed"
    notify_from_env(subject, summary)
    log_event("spot event handled", **summary)
    return summary


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point for the spot warning and rebalance rules."""
    stack = stack_from_env()
    if not isinstance(event, dict):
        return ignored("event is not an object", stack=stack)
    detail_type = event.get("detail-type")
    kind = EVENT_KINDS.get(detail_type) if isinstance(detail_type, str) else None
    if kind is None or event.get("source") != "aws.ec2":
        return ignored(
            "not a spot interruption or rebalance event",
            detail_type=detail_type,
            source=event.get("source"),
        )
    detail = event.get("detail")
    instance_id = detail.get("instance-id") if isinstance(detail, dict) else None
    if not isinstance(instance_id, str) or not INSTANCE_ID.match(instance_id):
        return ignored("event has no valid instance-id", kind=kind, instance=instance_id)
    action = detail.get("instance-action") if isinstance(detail, dict) else None
    if env_text(PCS_CLUSTER_ENV):
        return on_slurm_stack(stack, kind, instance_id, action, context)
    group = instance_group(RUNTIME.client("autoscaling"), instance_id, stack)
    if group is None:
        return ignored(
            "instance is not in a group of this stack", instance=instance_id, stack=stack
        )
    summary: dict[str, Any] = {
        "action": "notified",
        "stack": stack,
        "event": kind,
        "instance": instance_id,
        "instance_action": action,
        "group": group,
    }
    if env_text("INTERRUPTION_COMMAND"):
        result = run_command(
            RUNTIME.client("ssm"),
            [instance_id],
            hook_command(kind, action),
            timeout_seconds=bounded_timeout(
                env_number("INTERRUPTION_TIMEOUT_SECONDS", DEFAULT_INTERRUPTION_TIMEOUT_SECONDS),
                context,
                reserve_seconds=5.0,
            ),
            environment={"GPUCLUSTER_EVENT": kind, "GPUCLUSTER_INSTANCE_ACTION": str(action or "")},
            comment=f"gpucluster {kind} hook",
            poll_seconds=2.0,
        )
        summary.update(
            action="hook-run", hook={**result.summary(), "statuses": result.statuses}
        )
    subject = f"gpucluster {stack}: {kind} for {instance_id} ({group})"
    if "hook" in summary and not summary["hook"]["ok"]:
        subject += ": hook failed"
    notify_from_env(subject, summary)
    log_event("spot event handled", **summary)
    return summary
