"""Capacity Block expiry handler: checkpoint and scale to zero the groups on a block before it ends.

EC2 sends an EventBridge event 40 minutes before a Capacity Block ends and starts terminating
the block's instances 10 minutes later (EC2 user guide, "Monitor Capacity Blocks using
EventBridge"). The rule (built by the Pulumi side) passes only this stack's reservations:
source ``aws.ec2``, detail-type ``Capacity Block Reservation Expiration Warning`` (the guide's
examples also spell it ``Capacity Block Expiration Warning``; both are accepted), and
``detail.capacity-reservation-id``. The groups a reservation feeds come from
CAPACITY_BLOCK_GROUPS ({"cr-...": ["<asg name>", ...]}, written at deploy time); only groups
tagged with this stack are touched. PRE_STOP_COMMAND (the checkpoint hook) runs first on their
InService instances, awaited at most PRE_STOP_TIMEOUT_SECONDS and never past CAPACITY_BLOCK_HOOK_SECONDS
(the instances are reclaimed then anyway), then each group goes to zero with stopped-by
``capacity-block`` (a budget stop keeps its label), and the topic is told. Never deletes anything.

Environment: GPUCLUSTER_STACK, CAPACITY_BLOCK_GROUPS (required), PRE_STOP_COMMAND,
PRE_STOP_TIMEOUT_SECONDS, NOTIFY_TOPIC_ARN (optional).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from gpucluster.fleet.awsapi import log_event
from gpucluster.fleet.nodegroups import CAPACITY_BLOCK
from gpucluster.fleet.nodepaths import CAPACITY_BLOCK_HOOK_SECONDS
from gpucluster.fleet.runtime import (
    RUNTIME,
    ConfigError,
    bounded_timeout,
    env_number,
    env_text,
    ignored,
    invocation_deadline,
    notify_from_env,
    stack_from_env,
)
from gpucluster.fleet.stops import mark_told, raise_if_failed, stack_node_groups, stop_groups

DETAIL_TYPES = ("Capacity Block Reservation Expiration Warning", "Capacity Block Expiration Warning")
DEFAULT_PRE_STOP_TIMEOUT_SECONDS = 300.0


def groups_from_env() -> dict[str, list[str]]:
    """Reservation id -> the Auto Scaling groups launching into it."""
    raw = os.environ.get("CAPACITY_BLOCK_GROUPS", "")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v)
            for k, v in doc.items()):
        raise ConfigError(f"CAPACITY_BLOCK_GROUPS must be a JSON object of reservation id -> group names, "
                          f"got {raw[:200]!r}")
    return doc


def expiring_reservation(event: Any) -> tuple[str, str | None] | None:
    """(reservation id, end date) of an expiration warning; None for any other event."""
    if not isinstance(event, dict) or event.get("source") != "aws.ec2":
        return None
    if event.get("detail-type") not in DETAIL_TYPES:
        return None
    detail = event.get("detail")
    if not isinstance(detail, dict):
        return None
    cr = detail.get("capacity-reservation-id")
    if not isinstance(cr, str) or not cr.startswith("cr-"):
        return None
    end = detail.get("end-date")
    return cr, end if isinstance(end, str) else None


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point: a block's expiration warning in, its groups checkpointed and at zero out."""
    stack = stack_from_env()
    found = expiring_reservation(event)
    if found is None:
        return ignored("not a Capacity Block expiration warning", stack=stack,
                       detail_type=event.get("detail-type") if isinstance(event, dict) else None)
    reservation, end = found
    names = groups_from_env().get(reservation)
    if not names:
        return ignored("reservation feeds no group of this stack", stack=stack, reservation=reservation)
    backend = stack_node_groups(deadline=invocation_deadline(context))
    groups = [g for g in backend.read_groups(names) if g.stack == stack]
    if not groups:
        return ignored("the reservation's groups are not in this stack", stack=stack, groups=names)
    command = env_text("PRE_STOP_COMMAND")
    wait = min(env_number("PRE_STOP_TIMEOUT_SECONDS", DEFAULT_PRE_STOP_TIMEOUT_SECONDS),
               CAPACITY_BLOCK_HOOK_SECONDS)
    report = stop_groups(backend, groups, CAPACITY_BLOCK, ssm=RUNTIME.client("ssm") if command else None,
                         pre_stop_command=command, hook_timeout_seconds=bounded_timeout(wait, context))
    summary = {"stack": stack, "capacity_reservation_id": reservation, "ends": end,
               **report.summary(CAPACITY_BLOCK)}
    # SNS subjects stop at 100 characters: the end date is in the message.
    subject = f"gpucluster {stack}: block {reservation} ends, {len(report.changed)} group(s) stopped"
    if report.hook is not None and not report.hook.ok:
        subject += f"; hook failed on {len(report.hook.failed)} node(s)"
    mark_told(backend, report.told, notify_from_env(subject, summary))
    log_event("capacity block expiry done", logging.INFO, **summary)
    raise_if_failed(report, stack)
    return summary
