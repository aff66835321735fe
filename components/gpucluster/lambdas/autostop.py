"""Auto-stop handler: idle alarms and schedules stop GPU groups; a schedule may start them again.

Two EventBridge event kinds arrive here, passed through raw (no target `input`):

* ``CloudWatch Alarm State Change`` (source aws.cloudwatch). Acts only when
  ``detail.state.value`` is ``ALARM``. The group comes from the alarm's metric
  dimension ``AutoScalingGroupName`` in
  ``detail.configuration.metrics[].metricStat.metric.dimensions`` (a name->value
  map, as in the CloudWatch user guide, "Alarm events and EventBridge"); every
  metric of a metric-math alarm is read. When no metric carries that
  dimension (composite alarms, math over instances) an alarm named
  ``<group-name>-idle`` names its group: gpucluster's idle alarm is such a
  composite (nothing runs on the group's nodes, OR its GPUs idle; see
  ``gpucluster.aws.guardrail_events.AutoStop``). Only groups tagged with this
  stack are stopped, with stopped-by=idle, and only while the alarm still says
  ALARM when read again (DescribeAlarms): a retried event whose alarm went back
  to OK stops nothing.
* ``Scheduled Event`` (source aws.events). The purpose is the suffix of the rule
  name, taken from the rule ARN in ``resources``
  (``arn:aws:events:<region>:<account>:rule/[<bus>/]<name>``):
  ``-stop`` stops every group of the stack (stopped-by=schedule);
  ``-start`` resumes only groups whose stopped-by is ``schedule`` (never a budget,
  idle or lifetime stop, even one that lands while the start runs); ``-lifetime``
  stops groups whose oldest InService instance is older than MAX_LIFETIME_HOURS
  (stopped-by=lifetime). Every stop and start is recorded untold until its
  notification went out (`stops.mark_told`): a retry, or the next run of the
  same rule, tells what an earlier attempt could not (`stops.untold`).

Before a stop, PRE_STOP_COMMAND (if set) runs through SSM on the InService
instances of the groups about to stop, with GPUCLUSTER_STOP_REASON exported,
and is awaited at most PRE_STOP_TIMEOUT_SECONDS (default 300; give the Lambda a
timeout of that plus a minute). A failed or timed-out hook, or a node SSM
cannot reach, is logged and notified, and the stop proceeds on the others. The
groups are described again after the hook and every write is decided on that
fresh state, so a budget stop that landed during the wait is never relabelled.
Anything else is logged and ignored. Never deletes anything.

Environment: GPUCLUSTER_STACK (required), PRE_STOP_COMMAND,
PRE_STOP_TIMEOUT_SECONDS, MAX_LIFETIME_HOURS, NOTIFY_TOPIC_ARN (optional).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpucluster.fleet.awsapi import AWS_ERRORS, batches, log_event
from gpucluster.fleet.nodegroups import IDLE, LIFETIME, SCHEDULE, NodeGroup, NodeGroups
from gpucluster.fleet.pcsgroups import PCS_CLUSTER_ENV
from gpucluster.fleet.runcommand import CommandResult
from gpucluster.fleet.runtime import (
    RUNTIME,
    GuardrailError,
    bounded_timeout,
    env_number,
    env_text,
    ignored,
    invocation_deadline,
    notify_from_env,
    stack_from_env,
)
from gpucluster.fleet.slurmhold import release_partitions
from gpucluster.fleet.stops import mark_told, raise_if_failed, stack_node_groups, stop_groups, untold

ALARM_DETAIL_TYPE = "CloudWatch Alarm State Change"
SCHEDULE_DETAIL_TYPE = "Scheduled Event"
GROUP_DIMENSION = "AutoScalingGroupName"
SLURM_GROUP_DIMENSION = "NodeGroup"
# Fallback convention: the Pulumi side names an idle alarm after its group plus this suffix.
IDLE_ALARM_SUFFIX = "-idle"
# Schedule purposes, from the rule name's suffix.
STOP_SUFFIX, START_SUFFIX, LIFETIME_SUFFIX = "-stop", "-start", "-lifetime"
DEFAULT_PRE_STOP_TIMEOUT_SECONDS = 300.0


def alarm_group_names(detail: dict[str, Any]) -> list[str]:
    """Group names an alarm event refers to: metric dimensions first, then the name convention."""
    names: list[str] = []
    configuration = detail.get("configuration")
    metrics = configuration.get("metrics") if isinstance(configuration, dict) else None
    for metric in metrics if isinstance(metrics, list) else []:
        stat = metric.get("metricStat") if isinstance(metric, dict) else None
        inner = stat.get("metric") if isinstance(stat, dict) else None
        dimensions = inner.get("dimensions") if isinstance(inner, dict) else None
        # A Slurm stack's fallback alarm names the PCS group (named as the node group) by NodeGroup.
        key = SLURM_GROUP_DIMENSION if env_text(PCS_CLUSTER_ENV) else GROUP_DIMENSION
        value = dimensions.get(key) if isinstance(dimensions, dict) else None
        if isinstance(value, str) and value and value not in names:
            names.append(value)
    alarm_name = detail.get("alarmName")
    if not names and isinstance(alarm_name, str) and alarm_name.endswith(IDLE_ALARM_SUFFIX):
        base = alarm_name[: -len(IDLE_ALARM_SUFFIX)]
        if base:
            names.append(base)
    return names


def schedule_rule_name(event: dict[str, Any]) -> str | None:
    """The name of the EventBridge rule that fired, from the rule ARN in `resources`."""
    resources = event.get("resources")
    for arn in resources if isinstance(resources, list) else []:
        if not isinstance(arn, str) or not arn.startswith("arn:"):
            continue
        parts = arn.split(":", 5)
        if len(parts) == 6 and parts[2] == "events" and parts[5].startswith("rule/"):
            return parts[5].rsplit("/", 1)[-1] or None
    return None


def _stop(stack: str, groups: list[NodeGroup], reason: str, context: Any) -> dict[str, Any]:
    """Hook then scale to zero, notify, and fail the invocation only on AWS errors."""
    backend = stack_node_groups(deadline=invocation_deadline(context))
    command = env_text("PRE_STOP_COMMAND")
    report = stop_groups(
        backend,
        groups,
        reason,
        ssm=RUNTIME.client("ssm") if command else None,
        pre_stop_command=command,
        hook_timeout_seconds=bounded_timeout(
            env_number("PRE_STOP_TIMEOUT_SECONDS", DEFAULT_PRE_STOP_TIMEOUT_SECONDS), context
        ),
    )
    summary = {"stack": stack, **report.summary(reason)}
    hook_failed = report.hook is not None and not report.hook.ok
    if report.to_tell or report.errors or hook_failed:
        subject = f"gpucluster {stack}: {reason} stop of {len(report.to_tell)} group(s)"
        if hook_failed and report.hook is not None:
            subject += f"; pre-stop hook failed on {len(report.hook.failed)} node(s)"
        mark_told(backend, report.told, notify_from_env(subject, summary))
    log_event("autostop done", **summary)
    raise_if_failed(report, stack)
    return summary


def on_alarm(stack: str, event: dict[str, Any], context: Any) -> dict[str, Any]:
    """An idle alarm went to ALARM: stop the group(s) it watches, if they are ours."""
    if event.get("source") != "aws.cloudwatch":
        return ignored("alarm event not from aws.cloudwatch", source=event.get("source"))
    detail = event.get("detail")
    if not isinstance(detail, dict):
        return ignored("alarm event without detail", stack=stack)
    state = detail.get("state")
    value = state.get("value") if isinstance(state, dict) else None
    if value != "ALARM":
        return ignored(f"alarm state is {value!r}, not 'ALARM'", alarm=detail.get("alarmName"))
    names = alarm_group_names(detail)
    if not names:
        return ignored("alarm names no Auto Scaling group", alarm=detail.get("alarmName"))
    groups = [g for g in stack_node_groups().read_groups(names) if g.stack == stack]
    if not groups:
        return ignored("alarm's groups are not in this stack", stack=stack, groups=names)
    alarm = detail.get("alarmName")
    now = alarm_state_now(alarm) if isinstance(alarm, str) and alarm else None
    if now is not None and now != "ALARM":
        # A retried (or late) event whose idle already ended: the group is busy again, leave it.
        return ignored(f"alarm is {now} now, no longer idle", alarm=alarm, groups=names)
    return _stop(stack, groups, IDLE, context)


def alarm_state_now(name: str) -> str | None:
    """The alarm's state as CloudWatch holds it now (metric or composite); None when it is not found.

    The event is a moment's state: Lambda retries an event that failed, and a retry minutes later
    must not stop a group whose idle alarm went back to OK. A read refused (throttled, denied, a 5xx)
    fails the invocation: its retry reads again. An alarm not found (deleted since) leaves the event's
    word standing.
    """
    try:
        answer = RUNTIME.client("cloudwatch").describe_alarms(
            AlarmNames=[name], AlarmTypes=["CompositeAlarm", "MetricAlarm"])
    except AWS_ERRORS as exc:
        raise GuardrailError(f"idle alarm {name} not read again before the stop: {exc}") from exc
    for alarm in [*answer.get("CompositeAlarms", []), *answer.get("MetricAlarms", [])]:
        if alarm.get("AlarmName") == name and isinstance(alarm.get("StateValue"), str):
            return str(alarm["StateValue"])
    return None


def _older_than(groups: list[NodeGroup], max_age: timedelta) -> list[NodeGroup]:
    """Groups whose oldest InService instance has run longer than max_age."""
    by_instance = {i: g.name for g in groups for i in g.in_service_ids}
    if not by_instance:
        return []
    ec2 = RUNTIME.client("ec2")
    oldest: dict[str, Any] = {}
    ids = sorted(by_instance)
    # DescribeInstances accepts up to 1000 ids per call; pages cover the rest.
    for batch in batches(ids, 1000):
        paginator = ec2.get_paginator("describe_instances")
        for page in paginator.paginate(InstanceIds=batch):
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    group = by_instance.get(instance["InstanceId"])
                    launched = instance.get("LaunchTime")
                    if group and launched and (group not in oldest or launched < oldest[group]):
                        oldest[group] = launched
    cutoff = RUNTIME.now() - max_age
    return [g for g in groups if g.name in oldest and oldest[g.name] < cutoff]


def release_running_partitions(backend: NodeGroups, stack: str) -> CommandResult | None:
    """On a Slurm stack, set UP the partitions of every group running and not stopped (None elsewhere).

    Every group, not only those this start restored: a retried start (its restores already
    done) still releases what the first attempt could not.
    """
    if not env_text(PCS_CLUSTER_ENV):
        return None
    partitions = [g.label for g in backend.list_groups(stack) if g.running and not g.stopped_by]
    if not partitions:
        return None
    return release_partitions(RUNTIME.client("ssm"), RUNTIME.client("ec2"), stack, partitions)


def on_schedule(stack: str, event: dict[str, Any], context: Any) -> dict[str, Any]:
    """A scheduled rule fired: its name suffix says stop, start or enforce the lifetime."""
    if event.get("source") != "aws.events":
        return ignored("scheduled event not from aws.events", source=event.get("source"))
    rule = schedule_rule_name(event)
    if rule is None:
        return ignored("scheduled event without a rule ARN", resources=event.get("resources"))
    backend = stack_node_groups(deadline=invocation_deadline(context))
    if rule.endswith(STOP_SUFFIX):
        return _stop(stack, backend.list_groups(stack), SCHEDULE, context)
    if rule.endswith(START_SUFFIX):
        # Each group is described again right before its write: an earlier resume in this loop
        # takes time, and a budget stop may land meanwhile.
        names = [g.name for g in backend.list_groups(stack)]
        results = [
            backend.restore(g, only_stopped_by={SCHEDULE}, started_by=SCHEDULE)
            for name in names
            for g in backend.read_groups([name])
        ]
        resumed = [r.group for r in results if r.action == "resumed"]
        summary = {
            "action": "started" if resumed else "unchanged",
            "stack": stack,
            "groups": resumed,
            "skipped": {r.group: r.reason for r in results if r.action != "resumed"},
        }
        # A start an earlier attempt made but could not tell (killed, publish refused) is told now.
        late = [n for n in untold(backend.list_groups(stack), starts=(SCHEDULE,)) if n not in resumed]
        if late:
            summary["untold"] = late
        told = sorted({*resumed, *late})
        released = release_running_partitions(backend, stack)
        if released is not None:
            summary["slurm_release"] = released.summary()
        if told or (released is not None and not released.ok):
            sent = notify_from_env(
                f"gpucluster {stack}: schedule started {len(told)} group(s)", summary
            )
            mark_told(backend, dict.fromkeys(told, SCHEDULE), sent)
        log_event("autostop done", **summary)
        if released is not None and not released.ok:
            # Capacity is back but the partitions are held: the retry releases them (idempotent).
            raise GuardrailError(f"stack {stack}: partitions not released: {released.summary()}")
        return summary
    if rule.endswith(LIFETIME_SUFFIX):
        hours = env_number("MAX_LIFETIME_HOURS", 0.0)
        if hours <= 0:
            return ignored("lifetime rule but MAX_LIFETIME_HOURS is not set", rule=rule)
        # It dates the members: none known (EC2 refused the lookup) must fail, not pass as "young".
        dated = stack_node_groups(strict_members=True)
        groups = dated.list_groups(stack)
        expired = _older_than(groups, timedelta(hours=hours))
        # A lifetime stop an earlier attempt made but could not tell: passed on, so it is told now.
        untold_stops = [g for g in groups if g.name in untold(groups, stops=(LIFETIME,))]
        if not expired and not untold_stops:
            log_event("no group over its lifetime", stack=stack, max_hours=hours)
            return {"action": "unchanged", "stack": stack, "groups": []}
        return _stop(stack, [*expired, *untold_stops], LIFETIME, context)
    return ignored("rule name has no -stop/-start/-lifetime suffix", rule=rule)


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point for the idle alarm rule and the schedule rules."""
    stack = stack_from_env()
    if not isinstance(event, dict):
        return ignored("event is not an object", stack=stack)
    detail_type = event.get("detail-type")
    if detail_type == ALARM_DETAIL_TYPE:
        return on_alarm(stack, event, context)
    if detail_type == SCHEDULE_DETAIL_TYPE:
        return on_schedule(stack, event, context)
    return ignored("unexpected detail-type", detail_type=detail_type, stack=stack)
