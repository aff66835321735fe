"""Shared guardrail logic: find a stack's Auto Scaling groups, stop and resume them, run hooks.

Every guardrail (budget, idle, schedule, lifetime) stops compute the same way:
MinSize and DesiredCapacity go to 0 and the group carries tags saying who
stopped it and what to restore (`STOPPED_BY_TAG`, `PREVIOUS_DESIRED_TAG`,
`PREVIOUS_MIN_TAG`). Stopping is idempotent and a budget stop outranks the
others, so a schedule "start" never undoes a budget breach. The Auto Scaling
API has no compare-and-set, and the handlers run concurrently: every write is
decided on a group described right before it (never on a snapshot taken before
a hook wait), a resume checks after its write that no budget stop landed
meanwhile, and the budget handler checks its own stops once more after a short
settle time (`confirm_budget_stops`). This module must never delete anything in
AWS and must never import Pulumi: it is zipped with the handlers as the package
``lambdas`` (see `HANDLERS`).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from .tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STACK_TAG, STATE_TAGS, STOPPED_BY_TAG

T = TypeVar("T")


BUDGET, IDLE, SCHEDULE, LIFETIME = "budget", "idle", "schedule", "lifetime"
MANUAL = "manual"  # `gpucluster stop`: a person, through the same tags as every guardrail
CAPACITY_BLOCK = "capacity-block"  # the group's Capacity Block is about to end
STOP_REASONS = (BUDGET, IDLE, SCHEDULE, LIFETIME, MANUAL, CAPACITY_BLOCK)

# Lambda handler strings: the deploy zips `components/gpucluster/lambdas` as package `lambdas`.
HANDLERS: dict[str, str] = {
    "budget_action": "lambdas.budget_action.handler",
    "autostop": "lambdas.autostop.handler",
    "spot_interruption": "lambdas.spot_interruption.handler",
    "report": "lambdas.report.handler",
    "capacity_block": "lambdas.capacity_block.handler",
    "job_restart": "lambdas.job_restart.handler",
}

# Environment each handler reads (GPUCLUSTER_STACK is required, the rest optional).
ENVIRONMENT: dict[str, tuple[str, ...]] = {
    "budget_action": ("GPUCLUSTER_STACK", "NOTIFY_TOPIC_ARN"),
    "autostop": (
        "GPUCLUSTER_STACK",
        "PRE_STOP_COMMAND",
        "PRE_STOP_TIMEOUT_SECONDS",
        "MAX_LIFETIME_HOURS",
        "NOTIFY_TOPIC_ARN",
    ),
    "spot_interruption": (
        "GPUCLUSTER_STACK",
        "INTERRUPTION_COMMAND",
        "INTERRUPTION_TIMEOUT_SECONDS",
        "NOTIFY_TOPIC_ARN",
    ),
    "report": (
        "GPUCLUSTER_STACK",
        "NOTIFY_TOPIC_ARN",
        "REPORT_PERIOD",
        "MONTHLY_LIMIT_USD",
        "IDLE_THRESHOLD_PERCENT",
        "GPU_METRIC_NAMESPACE",
    ),
    "capacity_block": (
        "GPUCLUSTER_STACK",
        "CAPACITY_BLOCK_GROUPS",
        "PRE_STOP_COMMAND",
        "PRE_STOP_TIMEOUT_SECONDS",
        "NOTIFY_TOPIC_ARN",
    ),
    "job_restart": ("GPUCLUSTER_STACK", "RUN_LOG_GROUP", "NOTIFY_TOPIC_ARN"),
}

# Least-privilege actions per handler, beyond CloudWatch Logs (AWSLambdaBasicExecutionRole).
# Describe* and ssm:GetCommandInvocation need Resource "*"; the mutating autoscaling
# actions can be limited with the condition aws:ResourceTag/gpucluster:stack = <stack>;
# ssm:SendCommand needs the AWS-RunShellScript document ARN and the instance ARNs
# (condition ssm:resourceTag/gpucluster:stack, the tag propagates at launch);
# sns:Publish needs only the notify topic.
IAM_ACTIONS: dict[str, tuple[str, ...]] = {
    "budget_action": (
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:CreateOrUpdateTags",
        "sns:Publish",
    ),
    "autostop": (
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:CreateOrUpdateTags",
        "autoscaling:DeleteTags",
        "ec2:DescribeInstances",
        "ssm:SendCommand",
        "ssm:GetCommandInvocation",
        "sns:Publish",
    ),
    "spot_interruption": (
        "autoscaling:DescribeAutoScalingInstances",
        "autoscaling:DescribeAutoScalingGroups",
        "ssm:SendCommand",
        "ssm:GetCommandInvocation",
        "sns:Publish",
    ),
    "report": (
        "autoscaling:DescribeAutoScalingGroups",
        "ce:GetCostAndUsage",
        "ce:GetCostForecast",
        "cloudwatch:GetMetricData",
    ),
    "capacity_block": (
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:CreateOrUpdateTags",
        "ssm:SendCommand",
        "ssm:GetCommandInvocation",
        "sns:Publish",
    ),
    "job_restart": (
        "autoscaling:DescribeAutoScalingGroups",
        "ec2:DescribeInstances",
        "ssm:GetParametersByPath",
        "ssm:PutParameter",
        "ssm:SendCommand",
        "logs:FilterLogEvents",
        "sns:Publish",
    ),
}

# SSM Run Command: terminal invocation states (API reference, GetCommandInvocation.Status).
TERMINAL_STATUSES = frozenset({"Success", "Cancelled", "TimedOut", "Failed"})
# SendCommand accepts at most 50 instance ids per call (API reference, InstanceIds).
MAX_INSTANCES_PER_COMMAND = 50
# SendCommand refuses the whole call when one instance cannot take it: InvalidInstanceId covers
# "not a managed node, SSM Agent not running or not registered, no permission on the node, or
# shutting down" (SSM API reference, SendCommand errors). The batch is then sent again one
# instance at a time, so every node that can run the hook still runs it.
PER_INSTANCE_RETRY_ERRORS = frozenset(
    {"InvalidInstanceId", "AccessDeniedException", "UnsupportedPlatformType"}
)
NOT_SENT = "NotSent"
RUN_SHELL_DOCUMENT = "AWS-RunShellScript"

AWS_ERRORS = (ClientError, BotoCoreError)

LOG = logging.getLogger("gpucluster.guardrails")
LOG.setLevel(logging.INFO)
# Lambda's root handler still receives every line; a CLI reusing these functions never prints
# raw JSON through logging's last-resort handler.
LOG.addHandler(logging.NullHandler())


class ConfigError(RuntimeError):
    """The Lambda is deployed without a setting it cannot work without."""


class GuardrailError(RuntimeError):
    """AWS refused part of an action; raised after the rest is done so Lambda retries."""


def log_event(msg: str, level: int = logging.INFO, /, **fields: Any) -> None:
    """Log one JSON line, so CloudWatch Logs Insights can filter on the fields."""
    LOG.log(level, json.dumps({"msg": msg, **fields}, default=str, sort_keys=True))


def make_client(service: str) -> Any:
    """Build a plain boto3 client: honours AWS_REGION and AWS_ENDPOINT_URL."""
    return boto3.client(service)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Runtime:
    """The handlers' seams to the outside world; tests swap these attributes."""

    client: Callable[[str], Any] = make_client
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = _utcnow


RUNTIME = Runtime()


# --- configuration ---------------------------------------------------------------------------


def stack_from_env() -> str:
    """The stack this Lambda guards; without it the handler cannot tell its groups apart."""
    stack = os.environ.get("GPUCLUSTER_STACK", "").strip()
    if not stack:
        raise ConfigError("GPUCLUSTER_STACK is not set: the guardrail does not know its stack")
    return stack


def env_number(name: str, default: float) -> float:
    """A positive number from the environment; a bad value falls back to the default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        log_event("invalid setting, using default", logging.WARNING, name=name, value=raw)
        return default
    return value


def env_text(name: str) -> str | None:
    """An optional string setting; blank means unset."""
    value = os.environ.get(name, "").strip()
    return value or None


def bounded_timeout(requested: float, context: Any, reserve_seconds: float = 15.0) -> float:
    """Cap a wait so the Lambda still has time to scale and log before it is killed."""
    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    if callable(remaining_ms):
        return max(0.0, min(requested, remaining_ms() / 1000.0 - reserve_seconds))
    return requested


def ignored(reason: str, **fields: Any) -> dict[str, Any]:
    """Log an event we do not act on and return the handler's summary for it."""
    log_event("event ignored", reason=reason, **fields)
    return {"action": "ignored", "reason": reason}


# --- groups ----------------------------------------------------------------------------------


def group_tags(group: Mapping[str, Any]) -> dict[str, str]:
    """Tags of a DescribeAutoScalingGroups entry as a plain dict."""
    return {t["Key"]: t.get("Value", "") for t in group.get("Tags", [])}


def in_service_instance_ids(group: Mapping[str, Any]) -> list[str]:
    """Instances that can run a hook: only InService ones have a live SSM agent."""
    return [
        i["InstanceId"]
        for i in group.get("Instances", [])
        if i.get("LifecycleState") == "InService"
    ]


def stack_groups(autoscaling: Any, stack: str) -> list[dict[str, Any]]:
    """All Auto Scaling groups tagged with this stack, sorted by name."""
    paginator = autoscaling.get_paginator("describe_auto_scaling_groups")
    groups: list[dict[str, Any]] = []
    filters = [{"Name": f"tag:{STACK_TAG}", "Values": [stack]}]
    for page in paginator.paginate(Filters=filters):
        # Check again client-side: the filter is a server feature we do not want to trust blindly.
        groups.extend(g for g in page["AutoScalingGroups"] if group_tags(g).get(STACK_TAG) == stack)
    return sorted(groups, key=lambda g: g["AutoScalingGroupName"])


def batches(items: Sequence[T], size: int) -> list[list[T]]:
    """`items` in order, in runs of at most `size`: what one call of an API with a per-call limit takes."""
    return [list(items[start : start + size]) for start in range(0, len(items), size)]


def describe_groups(autoscaling: Any, names: Iterable[str]) -> list[dict[str, Any]]:
    """Groups by name (missing names are simply absent)."""
    wanted = sorted(set(names))
    groups: list[dict[str, Any]] = []
    # DescribeAutoScalingGroups takes at most 100 names per call.
    for batch in batches(wanted, 100):
        paginator = autoscaling.get_paginator("describe_auto_scaling_groups")
        for page in paginator.paginate(AutoScalingGroupNames=batch):
            groups.extend(page["AutoScalingGroups"])
    return sorted(groups, key=lambda g: g["AutoScalingGroupName"])


def _set_tags(autoscaling: Any, group_name: str, tags: Mapping[str, str]) -> None:
    autoscaling.create_or_update_tags(
        Tags=[
            {
                "ResourceId": group_name,
                "ResourceType": "auto-scaling-group",
                "Key": key,
                "Value": value,
                # State of the group, not of its instances.
                "PropagateAtLaunch": False,
            }
            for key, value in tags.items()
        ]
    )


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ("" for other errors)."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return str(error.get("Code", "")) if isinstance(error, dict) else ""


def _parse_count(value: str | None) -> int | None:
    try:
        count = int(value) if value is not None else None
    except ValueError:
        return None
    return count if count is not None and count >= 0 else None


# Outcomes of scale_to_zero.
STOPPED = "stopped"  # capacity went to zero now
ESCALATED = "escalated"  # already at zero, stopped-by upgraded to budget
ALREADY_STOPPED = "already-stopped"  # at zero with our tags: nothing to do
ALREADY_AT_ZERO = "already-at-zero"  # at zero by its own config: nothing to stop or restore
CHANGED = frozenset({STOPPED, ESCALATED})


def needs_stop(group: Mapping[str, Any]) -> bool:
    """True when the group has capacity that a stop would remove."""
    return int(group.get("DesiredCapacity", 0)) > 0


def scale_to_zero(autoscaling: Any, group: Mapping[str, Any], reason: str) -> str:
    """Set MinSize and DesiredCapacity to 0 and record why and what to restore.

    `group` must have been described right before the call: the decision is
    only as fresh as it is. Idempotent: a group already at zero is left alone,
    so previous-desired is never overwritten with 0. The one exception is
    escalation: a budget stop relabels a group that another guardrail stopped,
    so the morning schedule cannot restart what the budget shut down. No other
    reason ever replaces a budget label.
    """
    if reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {reason!r}; expected one of {STOP_REASONS}")
    name = group["AutoScalingGroupName"]
    tags = group_tags(group)
    stopped_by = tags.get(STOPPED_BY_TAG)
    desired, min_size = int(group["DesiredCapacity"]), int(group["MinSize"])
    if not needs_stop(group):
        if stopped_by is None:
            log_event("group already at zero", group=name, reason=reason)
            return ALREADY_AT_ZERO
        if reason == BUDGET and stopped_by != BUDGET:
            _set_tags(autoscaling, name, {STOPPED_BY_TAG: BUDGET})
            log_event("stop escalated to budget", group=name, previous_stopped_by=stopped_by)
            return ESCALATED
        log_event("group already stopped", group=name, stopped_by=stopped_by, reason=reason)
        return ALREADY_STOPPED
    # Capacity is back although tags remain (restarted by hand): a budget label still holds.
    label = BUDGET if BUDGET in (reason, stopped_by) else reason
    # Tags first: if the update then fails, a retry still sees capacity and records it again.
    _set_tags(
        autoscaling,
        name,
        {
            STOPPED_BY_TAG: label,
            PREVIOUS_DESIRED_TAG: str(desired),
            PREVIOUS_MIN_TAG: str(min_size),
        },
    )
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, DesiredCapacity=0)
    log_event(
        "group scaled to zero",
        group=name,
        stopped_by=label,
        previous_desired=desired,
        previous_min=min_size,
    )
    return STOPPED


@dataclass(frozen=True)
class ResumeResult:
    """What resuming one group did; `action` is "resumed" or "skipped"."""

    group: str
    action: str
    stopped_by: str | None = None
    min_size: int | None = None
    desired_capacity: int | None = None
    reason: str = ""


def resume_decision(
    group: Mapping[str, Any], only_stopped_by: Collection[str] | None = None
) -> ResumeResult:
    """What resuming `group` would do, without doing it: action "resume" or "skipped".

    Desired never goes below what the group runs now nor above MaxSize.
    """
    name = group["AutoScalingGroupName"]
    tags = group_tags(group)
    stopped_by = tags.get(STOPPED_BY_TAG)
    if stopped_by is None:
        return ResumeResult(name, "skipped", reason="not stopped by a guardrail")
    if only_stopped_by is not None and stopped_by not in only_stopped_by:
        return ResumeResult(name, "skipped", stopped_by, reason=f"stopped by {stopped_by}")
    previous_desired = _parse_count(tags.get(PREVIOUS_DESIRED_TAG))
    if previous_desired is None:
        return ResumeResult(
            name, "skipped", stopped_by, reason=f"tag {PREVIOUS_DESIRED_TAG} missing or invalid"
        )
    previous_min = _parse_count(tags.get(PREVIOUS_MIN_TAG)) or 0
    desired = min(max(previous_desired, int(group["DesiredCapacity"])), int(group["MaxSize"]))
    return ResumeResult(name, "resume", stopped_by, min(previous_min, desired), desired)


def resume_group(
    autoscaling: Any,
    group: Mapping[str, Any],
    *,
    only_stopped_by: Collection[str] | None = None,
) -> ResumeResult:
    """Restore min/desired recorded by `scale_to_zero` and remove our state tags.

    `group` must have been described right before the call. `only_stopped_by`
    limits which stops may be undone (the schedule start only undoes schedule
    stops). After restoring capacity the group is read again: if another stop
    (a budget breach) relabelled it meanwhile, capacity goes back to zero and
    that stop's tags stay, so a start never undoes a stop it did not see.
    """
    decision = resume_decision(group, only_stopped_by)
    name = decision.group
    if decision.action != "resume":
        if decision.stopped_by is not None and PREVIOUS_DESIRED_TAG in decision.reason:
            log_event("cannot resume: no previous capacity", logging.WARNING, group=name)
        return decision
    autoscaling.update_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=decision.min_size,
        DesiredCapacity=decision.desired_capacity,
    )
    now = describe_groups(autoscaling, [name])
    label = group_tags(now[0]).get(STOPPED_BY_TAG) if now else None
    # Relabelled (a budget stop escalated it), or stopped again after our update (back at zero):
    # either way another stop's tags are on the group now, and they must stay.
    zeroed = bool(now) and int(now[0]["DesiredCapacity"]) == 0 < (decision.desired_capacity or 0)
    if label is not None and (label != decision.stopped_by or zeroed):
        autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, DesiredCapacity=0)
        log_event("resume undone: stopped again meanwhile", logging.WARNING, group=name,
                  resumed=decision.stopped_by, stopped_by=label)
        return ResumeResult(name, "skipped", label,
                            reason=f"stopped by {label} while resuming; left stopped")
    tags = group_tags(now[0]) if now else {}
    present = [key for key in STATE_TAGS if key in tags]
    if present:
        autoscaling.delete_tags(
            Tags=[
                {"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": key}
                for key in present
            ]
        )
    log_event(
        "group resumed",
        group=name,
        stopped_by=decision.stopped_by,
        min=decision.min_size,
        desired=decision.desired_capacity,
    )
    return ResumeResult(
        name, "resumed", decision.stopped_by, decision.min_size, decision.desired_capacity
    )


# --- hooks through SSM Run Command ----------------------------------------------------------


@dataclass
class CommandResult:
    """Last seen SSM status per instance; `timed_out` when we stopped waiting.

    `errors` holds why the command could not be sent to an instance (status NotSent).
    """

    statuses: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(s == "Success" for s in self.statuses.values())

    @property
    def failed(self) -> dict[str, str]:
        """Instances whose hook did not succeed (or was not sent), with their last status."""
        return {i: s for i, s in sorted(self.statuses.items()) if s != "Success"}

    def summary(self) -> dict[str, Any]:
        """For the handler's result and its notification: what did not run, and why."""
        doc: dict[str, Any] = {"ok": self.ok, "timed_out": self.timed_out}
        if self.failed:
            doc["failed"] = self.failed
        if self.errors:
            doc["not_sent"] = dict(sorted(self.errors.items()))
        return doc


def run_command(
    ssm: Any,
    instance_ids: Sequence[str],
    command: str,
    *,
    timeout_seconds: float,
    environment: Mapping[str, str] | None = None,
    comment: str = "gpucluster guardrail hook",
    poll_seconds: float = 5.0,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> CommandResult:
    """Run a shell command on instances with AWS-RunShellScript and wait, at most timeout_seconds.

    Never raises for AWS errors and never waits past the deadline: a hook that
    fails or hangs must not keep a guardrail from acting. One instance that SSM
    cannot reach does not cancel the others: a batch refused for it is sent
    again instance by instance, and the unreachable ones are reported in
    `CommandResult.errors`.
    """
    sleep = sleep or RUNTIME.sleep
    clock = clock or RUNTIME.clock
    deadline = clock() + max(0.0, timeout_seconds)
    result = CommandResult()
    if not instance_ids:
        return result
    exports = [f"export {k}={shlex.quote(v)}" for k, v in (environment or {}).items()]
    parameters = {
        "commands": [*exports, command],
        # The agent kills the script at this point (document parameter, 1..172800 s).
        "executionTimeout": [str(min(172800, max(1, int(timeout_seconds))))],
    }
    pending: dict[str, str] = {}
    ids = list(dict.fromkeys(instance_ids))
    todo = batches(ids, MAX_INSTANCES_PER_COMMAND)
    while todo:
        batch = todo.pop(0)
        try:
            response = ssm.send_command(
                InstanceIds=batch,
                DocumentName=RUN_SHELL_DOCUMENT,
                Comment=comment[:100],
                # Delivery timeout: minimum 30 s (API reference, SendCommand.TimeoutSeconds).
                TimeoutSeconds=max(30, int(timeout_seconds)),
                Parameters=parameters,
            )
        except AWS_ERRORS as exc:
            if len(batch) > 1 and error_code(exc) in PER_INSTANCE_RETRY_ERRORS:
                log_event("hook refused for the batch, sending per instance", logging.WARNING,
                          instances=batch, error=str(exc))
                todo[:0] = [[instance] for instance in batch]
                continue
            log_event("hook not sent", logging.WARNING, instances=batch, error=str(exc))
            result.statuses.update(dict.fromkeys(batch, NOT_SENT))
            result.errors.update(dict.fromkeys(batch, str(exc)))
            continue
        command_id = response["Command"]["CommandId"]
        log_event("hook sent", command_id=command_id, instances=batch)
        pending.update(dict.fromkeys(batch, command_id))
    while pending:
        for instance_id, command_id in list(pending.items()):
            try:
                status = ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)[
                    "Status"
                ]
            except AWS_ERRORS:
                # InvocationDoesNotExist right after sending, or throttling: ask again later.
                status = "Pending"
            result.statuses[instance_id] = status
            if status in TERMINAL_STATUSES:
                del pending[instance_id]
        remaining = deadline - clock()
        if pending and remaining <= 0:
            result.timed_out = True
            break
        if pending:
            sleep(min(poll_seconds, remaining))
    level = logging.INFO if result.ok else logging.WARNING
    log_event("hook finished", level, statuses=result.statuses, timed_out=result.timed_out)
    return result


# --- stopping several groups -----------------------------------------------------------------

GONE = "gone"  # the group disappeared while the hook ran: nothing to stop


@dataclass
class StopReport:
    """Outcome per group, errors per group, the pre-stop hook's result, and budget corrections.

    `recorded` holds, per group this stop changed, the previous-capacity tags
    as they stood after the stop (what a later correction restores).
    """

    outcomes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    hook: CommandResult | None = None
    recorded: dict[str, dict[str, str]] = field(default_factory=dict)
    corrections: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome in CHANGED]

    def summary(self, reason: str) -> dict[str, Any]:
        """The handler's return value: small, JSON-serialisable."""
        summary: dict[str, Any] = {
            "action": "stopped" if self.changed else "unchanged",
            "stopped_by": reason,
            "groups": self.changed,
            "outcomes": self.outcomes,
        }
        if self.errors:
            summary["errors"] = self.errors
        if self.hook is not None:
            summary["hook"] = self.hook.summary()
        if self.corrections:
            summary["corrections"] = self.corrections
        return summary


def _previous_tags(group: Mapping[str, Any]) -> dict[str, str]:
    """The previous-capacity tags a stop of `group` (as described now) leaves on it."""
    if needs_stop(group):
        return {
            PREVIOUS_DESIRED_TAG: str(int(group["DesiredCapacity"])),
            PREVIOUS_MIN_TAG: str(int(group["MinSize"])),
        }
    tags = group_tags(group)
    return {key: tags[key] for key in (PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG) if key in tags}


def stop_groups(
    autoscaling: Any,
    groups: Sequence[Mapping[str, Any]],
    reason: str,
    *,
    ssm: Any = None,
    pre_stop_command: str | None = None,
    hook_timeout_seconds: float = 300.0,
) -> StopReport:
    """Run the pre-stop hook once on all groups about to stop, then scale each to zero.

    One SSM command with one deadline for all groups keeps the total wait bounded
    by the timeout, whatever the number of groups. A failed or timed-out hook is
    logged and the stop goes on. The hook can take minutes, during which a budget
    stop or a person may act: the groups are described again after it, and each
    write is decided on that fresh state. AWS errors on one group do not spare
    the others.
    """
    report = StopReport()
    to_stop = [g for g in groups if needs_stop(g)]
    instances = [i for g in to_stop for i in in_service_instance_ids(g)]
    if pre_stop_command and ssm is not None and instances:
        report.hook = run_command(
            ssm,
            instances,
            pre_stop_command,
            timeout_seconds=hook_timeout_seconds,
            environment={"GPUCLUSTER_STOP_REASON": reason},
            comment=f"gpucluster pre-stop hook ({reason})",
        )
        names = [g["AutoScalingGroupName"] for g in groups]
        try:
            fresh = {g["AutoScalingGroupName"]: g for g in describe_groups(autoscaling, names)}
        except AWS_ERRORS as exc:
            log_event("cannot read groups after the hook", logging.ERROR, error=str(exc))
            report.errors.update(dict.fromkeys(names, f"not described after the hook: {exc}"))
            return report
        for name in names:
            if name not in fresh:
                log_event("group gone while the hook ran", logging.WARNING, group=name)
                report.outcomes[name] = GONE
        groups = list(fresh.values())
    for group in groups:
        name = group["AutoScalingGroupName"]
        try:
            previous = _previous_tags(group)
            report.outcomes[name] = scale_to_zero(autoscaling, group, reason)
        except AWS_ERRORS as exc:
            log_event("stop failed", logging.ERROR, group=name, error=str(exc))
            report.errors[name] = str(exc)
            continue
        if report.outcomes[name] in CHANGED:
            report.recorded[name] = previous
    return report


def confirm_budget_stops(autoscaling: Any, report: StopReport) -> dict[str, str]:
    """Read the groups a budget stop changed once more and put back what a concurrent write undid.

    The Auto Scaling API has no compare-and-set: a schedule start or another
    stop that read a group just before the budget wrote it can write just
    after. Run after a short settle time, this makes the budget's state the
    last word: a group running again is stopped again (its capacity now
    recorded), a relabelled one gets the budget label back, and previous-capacity
    tags deleted meanwhile are restored from `report.recorded`. Returns the
    corrections made (also kept in `report.corrections`); AWS errors go to
    `report.errors`.
    """
    names = report.changed
    if not names:
        return {}
    try:
        groups = describe_groups(autoscaling, names)
    except AWS_ERRORS as exc:
        report.errors.update(dict.fromkeys(names, f"budget stop not confirmed: {exc}"))
        return {}
    for group in groups:
        name = group["AutoScalingGroupName"]
        tags = group_tags(group)
        try:
            if needs_stop(group):
                scale_to_zero(autoscaling, group, BUDGET)
                fix = f"running again ({group['DesiredCapacity']} desired): stopped again"
            elif tags.get(STOPPED_BY_TAG) != BUDGET:
                missing = {k: v for k, v in report.recorded.get(name, {}).items() if k not in tags}
                _set_tags(autoscaling, name, {STOPPED_BY_TAG: BUDGET, **missing})
                fix = f"label {tags.get(STOPPED_BY_TAG) or 'removed'}: set back to budget"
            else:
                continue
        except AWS_ERRORS as exc:
            report.errors[name] = f"budget stop not confirmed: {exc}"
            continue
        log_event("budget stop restored", logging.WARNING, group=name, correction=fix)
        report.corrections[name] = fix
    return report.corrections


# --- notifications ---------------------------------------------------------------------------


def notify(sns: Any, topic_arn: str | None, subject: str, message: Mapping[str, Any]) -> bool:
    """Publish a summary to SNS if a topic is configured; failures are logged, not raised."""
    if not topic_arn or sns is None:
        return False
    # SNS subject: ASCII, no line breaks, at most 100 characters (API reference, Publish).
    clean_subject = "".join(c if 32 <= ord(c) < 127 else " " for c in subject)[:100]
    try:
        sns.publish(
            TopicArn=topic_arn,
            Subject=clean_subject,
            Message=json.dumps(message, indent=2, sort_keys=True, default=str),
        )
    except AWS_ERRORS as exc:
        log_event("notification failed", logging.WARNING, topic=topic_arn, error=str(exc))
        return False
    return True


def notify_from_env(subject: str, message: Mapping[str, Any]) -> bool:
    """Publish to NOTIFY_TOPIC_ARN when it is set; build the SNS client only then."""
    topic_arn = env_text("NOTIFY_TOPIC_ARN")
    if not topic_arn:
        return False
    return notify(RUNTIME.client("sns"), topic_arn, subject, message)


def raise_if_failed(report: StopReport, stack: str) -> None:
    """Fail the invocation after partial AWS errors so Lambda's async retry runs it again.

    Safe because stopping is idempotent.
    """
    if report.errors:
        raise GuardrailError(f"stack {stack}: could not stop {sorted(report.errors)}")
