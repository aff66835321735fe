"""Budget breach handler: scale every Auto Scaling group of the stack to zero.

Subscribed (by the Pulumi side) only to the SNS topic of the budget's action
threshold, so any SNS notification record is a breach. AWS Budgets publishes
plain text, not JSON: the message is logged and forwarded, never parsed for a
decision. Malformed events are logged and ignored. No pre-stop hook runs here:
a breach stops spending at once. A budget stop always wins: after a short
settle time the handler reads its groups again and undoes whatever a
concurrent schedule start or stop wrote over it (`stops.budget_stop`).
Never deletes anything; data in S3 is untouched.

Environment: GPUCLUSTER_STACK (required), NOTIFY_TOPIC_ARN (optional).
"""

from __future__ import annotations

from typing import Any

from gpucluster.fleet.awsapi import log_event
from gpucluster.fleet.nodegroups import BUDGET
from gpucluster.fleet.runtime import ignored, invocation_deadline, notify_from_env, stack_from_env
from gpucluster.fleet.stops import (
    budget_stop,
    mark_told,
    raise_if_failed,
    stack_node_groups,
)


def breach_records(event: Any) -> list[dict[str, Any]]:
    """SNS notification records of the event (Lambda developer guide, "Using Lambda with SNS")."""
    if not isinstance(event, dict) or not isinstance(event.get("Records"), list):
        return []
    records = []
    for record in event["Records"]:
        if not isinstance(record, dict) or record.get("EventSource") != "aws:sns":
            continue
        sns = record.get("Sns")
        if not isinstance(sns, dict) or not isinstance(sns.get("Message"), str):
            continue
        if not sns["Message"].strip() or sns.get("Type", "Notification") != "Notification":
            continue
        records.append(sns)
    return records


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point: an SNS budget alert in, the stack's compute at zero out."""
    stack = stack_from_env()
    records = breach_records(event)
    if not records:
        return ignored("not an SNS notification", stack=stack)
    subjects = [r.get("Subject") or "" for r in records]
    log_event(
        "budget breach",
        stack=stack,
        subjects=subjects,
        topics=[r.get("TopicArn") for r in records],
        budget_message=records[0]["Message"][:2000],
    )
    backend = stack_node_groups(deadline=invocation_deadline(context))
    report = budget_stop(backend, backend.list_groups(stack))
    summary = {"stack": stack, **report.summary(BUDGET)}
    if report.to_tell or report.errors:
        sent = notify_from_env(
            f"gpucluster {stack}: budget breached, compute scaled to zero",
            {**summary, "budget_subjects": subjects},
        )
        mark_told(backend, report.told, sent)
    log_event("budget action done", **summary)
    raise_if_failed(report, stack)
    return summary
