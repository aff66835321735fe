"""The guardrails that act on events: idle alarms and stop/start/lifetime schedules (`AutoStop`), spot
interruption warnings (`SpotInterruption`), Capacity Block expiry (`CapacityBlockExpiry`) and launch
events that re-launch recorded jobs (`JobRestart`), each driving its Lambda.

It must never delete anything and never build or change a node group: it is handed the groups'
names and ARNs, and its Lambdas scale them to zero, run hooks on them, or re-launch jobs.
"""

import functools
import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import GuardedGroupModel, component_options, type_token
from gpucluster.aws.guardrail_lambda import (
    AUTOSTOP_MARGIN_SECONDS,
    BASE_TIMEOUT_SECONDS,
    LAMBDA_MAX_TIMEOUT_SECONDS,
    SPOT_MARGIN_SECONDS,
    SPOT_NO_HOOK_TIMEOUT_SECONDS,
    GuardrailContext,
    GuardrailFunction,
    describe_statement,
    hook_statements,
    json_output,
    old_type,
    publish_statements,
    rule_invokes,
    run_command_statements,
    scaling_statements,
    scheduler_invoker,
)
from gpucluster.aws.guardrail_state import with_state
from gpucluster.fleet.jobnames import LAUNCH_SUCCESSFUL, jobs_parameter_path  # not job_restart: boto3
from gpucluster.fleet.nodepaths import CAPACITY_BLOCK_HOOK_SECONDS
from gpucluster.node.userdata import (
    ACTIVITY_METRIC,
    GPU_METRIC_DIMENSION,
    GPU_UTILIZATION_METRIC,
    SLURM_GPU_METRIC,
)
from gpucluster.noderole import gpu_metric_namespace, run_log_group_name
from gpucluster.spec import AutoStopConfig, SpotConfig

# A spot warning gives 2 minutes (EC2 user guide, "Spot Instance interruption notices"): an older
# event is moot, so Lambda's async retry gives up after that.
SPOT_MAX_EVENT_AGE_SECONDS = 120
JOB_RESTART_MAX_EVENT_AGE_SECONDS = 3600
# Schedules retry for at most one lifetime tick.
SCHEDULE_MAX_EVENT_AGE_SECONDS = 900
SCHEDULE_MAX_RETRIES = 3
LIFETIME_CHECK_EXPRESSION = "rate(15 minutes)"

# GPU utilisation from the CloudWatch agent's nvidia_gpu plugin (CloudWatch user guide, "Collect
# NVIDIA GPU metrics"), aggregated per Auto Scaling group by the node bootstrap's agent config:
# the alarms watch exactly the series components/gpucluster/node publishes (its constants, imported).
# Maximum, not Average: a group is idle only when even its busiest GPU is. An 8-GPU node
# training on one GPU at 30 % averages 3.75 % and would be stopped mid-job by an average.
GPU_STATISTIC = "Maximum"
# The autostop handler's fallback: an idle alarm is named after its group plus this suffix. The
# idle alarm is a composite (no metric dimension in its events), so the handler always uses it.
IDLE_ALARM_SUFFIX = "-idle"
ACTIVITY_ALARM_SUFFIX, UTILISATION_ALARM_SUFFIX = "-no-jobs", "-gpu-idle"
# Low utilisation is the second signal (a process that holds GPUs and does nothing): a job loading
# data or compiling looks the same for a while, so it never stops a group in less than an hour.
UTILISATION_MIN_MINUTES = 60
# The autostop handler reads a schedule's purpose from the rule name's suffix.
SCHEDULE_SUFFIXES = {"stop": "-stop", "start": "-start", "lifetime": "-lifetime"}

# EC2 user guide, "Monitor Capacity Blocks using EventBridge": sent 40 minutes before a block ends;
# its instances start terminating 10 minutes later. The guide's examples spell the detail-type
# both ways, so the rule matches both.
CAPACITY_BLOCK_WARNINGS = ("Capacity Block Reservation Expiration Warning",
                           "Capacity Block Expiration Warning")
CAPACITY_BLOCK_MAX_EVENT_AGE_SECONDS = 600  # past the first terminations a retry is moot
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"


def idle_window(idle_minutes: int) -> tuple[int, int]:
    """(alarm period in seconds, evaluation periods) whose product is exactly `idle_minutes`.

    5-minute periods when the idle time allows it (fewer datapoints to fill),
    1-minute periods otherwise; never more than a day in all (CloudWatch limit).
    """
    period = 300 if idle_minutes >= 15 and idle_minutes % 5 == 0 else 60
    return period, idle_minutes * 60 // period


def activity_window(idle_minutes: int) -> tuple[int, int]:
    """(period, evaluation periods) of the activity alarm: 1-minute periods, one per idle minute.

    Nodes report every minute, so 1-minute periods let the alarm fire within a minute or two of
    `idle_minutes` after the last job ends (a 5-minute period holding a job's last minute is not
    idle: up to 5 minutes more). 1440 periods of 60 s is CloudWatch's one-day maximum.
    """
    return 60, idle_minutes


def utilisation_minutes(idle_minutes: int) -> int:
    """How long the busiest GPU must stay under the threshold: idle_minutes, at least an hour."""
    return max(idle_minutes, UTILISATION_MIN_MINUTES)



def uses_spot(groups: Sequence[GuardedGroupModel]) -> bool:
    """Spot handling is built only where a spot interruption can happen at all."""
    return any(g.can_run_spot for g in groups)


def capacity_block_groups(groups: Sequence[GuardedGroupModel]) -> dict[str, list[pulumi.Input[str]]]:
    """Capacity Block reservation id -> the Auto Scaling groups that launch into it."""
    blocks: dict[str, list[pulumi.Input[str]]] = {}
    for g in groups:
        if g.capacity_block_reservation_id:
            blocks.setdefault(g.capacity_block_reservation_id, []).append(g.asg_name)
    return blocks


def capacity_block_timeout(a: AutoStopConfig) -> int:
    """Lambda timeout: the pre-stop hook (capped to fit before the block's instances go) plus the stop."""
    if not a.pre_stop_command:
        return BASE_TIMEOUT_SECONDS
    return min(a.pre_stop_timeout_seconds, CAPACITY_BLOCK_HOOK_SECONDS) + AUTOSTOP_MARGIN_SECONDS


def autostop_timeout(a: AutoStopConfig) -> int:
    """Lambda timeout that covers the pre-stop hook's bounded wait plus the stop itself."""
    if not a.pre_stop_command:
        return BASE_TIMEOUT_SECONDS
    return min(a.pre_stop_timeout_seconds + AUTOSTOP_MARGIN_SECONDS, LAMBDA_MAX_TIMEOUT_SECONDS)


def spot_timeout(s: SpotConfig) -> int:
    """Lambda timeout that covers the interruption hook's bounded wait plus notifying."""
    return s.interruption_timeout_seconds + SPOT_MARGIN_SECONDS if s.interruption_command \
        else SPOT_NO_HOOK_TIMEOUT_SECONDS



def scheduled_event_input(schedule_name: str, partition: str, region: str, account: str) -> str:
    """The target input of a schedule: an EventBridge `Scheduled Event`, as the autostop handler reads.

    EventBridge Scheduler (chosen over EventBridge rules because rules run in UTC
    only and the spec's schedule_timezone needs a time zone, DST included)
    delivers a constant input rather than an event. The autostop handler takes the
    schedule's purpose from an EventBridge rule ARN's name suffix in `resources`,
    so the input carries the schedule's real ARN first (Scheduler context
    attribute) and then the rule-form ARN `arn:...:events:...:rule/<schedule name>`
    that the handler parses. No EventBridge rule of that name exists.
    """
    return json.dumps({
        "version": "0",
        "id": "<aws.scheduler.execution-id>",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account,
        "time": "<aws.scheduler.scheduled-time>",
        "region": region,
        "resources": ["<aws.scheduler.schedule-arn>",
                      f"arn:{partition}:events:{region}:{account}:rule/{schedule_name}"],
        "detail": {},
    }, sort_keys=True)


def _event_input(schedule_name: str, region: str, partition_and_account: list[str]) -> str:
    """`scheduled_event_input` from the resolved [partition, account] of `Output.all`."""
    partition, account = partition_and_account
    return scheduled_event_input(schedule_name, partition, region, account)



class AutoStop(pulumi.ComponentResource):
    """Idle alarms per node group and stop/start/lifetime schedules, all driving the autostop Lambda.

    A group is idle when nothing runs on any of its nodes for `idle_minutes` (the node reporter's
    NodeActive, Maximum over the group, stays 0: the `-no-jobs` alarm), or when its busiest GPU
    stays under the utilisation threshold for `utilisation_minutes` (a process holding GPUs and
    doing nothing: the `-gpu-idle` alarm). The composite `<group>-idle` alarm is their OR and is
    what EventBridge passes to the Lambda. Missing data is never idle (treat_missing_data
    "missing"): the utilisation alarm goes to INSUFFICIENT_DATA and notifies instead. The Lambda
    runs the pre-stop hook through SSM, waits a bounded time, then scales to zero.

    On a Slurm stack (`ctx.pcs`) idle means no running job, and PCS's idle scale-down (the
    cluster's scale_down_idle_time from idle_minutes) stops idle nodes itself: a stop of ours
    would also hold the partition. So only the fallback is built there, as a plain metric alarm
    routed to the Lambda: `<prefix>-<group>-gpu-idle` on the busiest GPU's utilisation while a
    process holds one (SLURM_GPU_METRIC by Stack and NodeGroup, from `gpucluster-report activity`;
    no Auto Scaling group name exists there). No data (no node, or no process on a GPU) is the
    normal state of a queue-driven group: it neither stops nor notifies.
    """

    def __init__(self, name: str, ctx: GuardrailContext, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("AutoStop"), name, None, component_options(opts, old_type("AutoStop")))
        a = ctx.args.autostop
        child = pulumi.ResourceOptions(parent=self)
        environment = ctx.environment()
        # The idle alarm is read again before a stop (lambdas.autostop.alarm_state_now). Granted on "*"
        # with the other reads: whether DescribeAlarms takes an alarm ARN as its resource is not
        # checked here (ledger: cloudwatch-describe-alarms-resource).
        describe = ["autoscaling:DescribeAutoScalingGroups", "cloudwatch:DescribeAlarms"]
        statements = hook_statements(ctx, environment, describe, "PRE_STOP", a.pre_stop_command,
                           a.pre_stop_timeout_seconds)
        if a.max_lifetime_hours:
            environment["MAX_LIFETIME_HOURS"] = str(a.max_lifetime_hours)
            describe.append("ec2:DescribeInstances")  # instance launch times
        statements = [describe_statement(describe),
                      *scaling_statements(ctx.asg_arns, ctx.identity, delete_tags=bool(a.start_schedule)),
                      *statements, *with_state(ctx, environment),
                      *publish_statements(ctx.notify_topic_arn, ctx.key_arn)]
        self.function = GuardrailFunction(
            f"{name}-handler", ctx, module="autostop", function_name=f"{ctx.prefix}-autostop",
            timeout=autostop_timeout(a), environment=environment, statements=statements, opts=child)
        fn = self.function.function

        minutes = utilisation_minutes(a.idle_minutes)
        period, evaluations = idle_window(minutes)
        active_period, active_evaluations = activity_window(a.idle_minutes)
        namespace = gpu_metric_namespace(ctx.args.cluster_name)
        self.alarms: dict[str, aws.cloudwatch.CompositeAlarm] = {}
        self.utilisation_alarms: dict[str, aws.cloudwatch.MetricAlarm] = {}
        self.activity_alarms: dict[str, aws.cloudwatch.MetricAlarm] = {}
        self.routed: list[pulumi.Output[str]] = []
        """The alarms EventBridge passes to the Lambda: the composites (the Slurm fallbacks on Slurm)."""
        self.alarm_names: dict[str, pulumi.Output[str]] = {}
        for group in ctx.args.groups:
            if ctx.pcs is not None:
                self.utilisation_alarms[group.name] = slurm_alarm = aws.cloudwatch.MetricAlarm(
                    f"{name}-idle-{group.name}",
                    name=f"{ctx.prefix}-{group.name}{UTILISATION_ALARM_SUFFIX}",
                    alarm_description=(
                        f"gpucluster {ctx.identity}/{group.name}: a job holds GPUs and the busiest stays "
                        f"under {a.gpu_utilization_threshold_percent:g}% for {minutes} min -> hold the "
                        "partition, requeue, scale to zero (idle nodes: PCS's idle scale-down)"),
                    namespace=namespace, metric_name=SLURM_GPU_METRIC,
                    dimensions={"Stack": ctx.identity, "NodeGroup": group.name}, statistic=GPU_STATISTIC,
                    comparison_operator="LessThanThreshold", threshold=a.gpu_utilization_threshold_percent,
                    period=period, evaluation_periods=evaluations, datapoints_to_alarm=evaluations,
                    treat_missing_data="missing", tags=ctx.tags, opts=child)
                self.alarm_names[group.name] = slurm_alarm.name
                self.routed.append(slurm_alarm.arn)
                continue
            activity = aws.cloudwatch.MetricAlarm(
                f"{name}-no-jobs-{group.name}",
                name=pulumi.Output.concat(group.asg_name, ACTIVITY_ALARM_SUFFIX),
                alarm_description=(
                    f"gpucluster {ctx.identity}/{group.name}: no GPU process and no gpucluster job on any "
                    f"node for {a.idle_minutes} min (NodeActive, gpucluster-report activity)"),
                namespace=namespace, metric_name=ACTIVITY_METRIC,
                dimensions={"Stack": ctx.identity, "NodeGroup": group.name}, statistic="Maximum",
                comparison_operator="LessThanThreshold", threshold=1,
                period=active_period, evaluation_periods=active_evaluations,
                datapoints_to_alarm=active_evaluations, treat_missing_data="missing",
                tags=ctx.tags, opts=child)
            self.activity_alarms[group.name] = activity
            self.utilisation_alarms[group.name] = utilisation = aws.cloudwatch.MetricAlarm(
                f"{name}-idle-{group.name}",
                name=pulumi.Output.concat(group.asg_name, UTILISATION_ALARM_SUFFIX),
                alarm_description=(
                    f"gpucluster {ctx.identity}/{group.name}: busiest GPU under "
                    f"{a.gpu_utilization_threshold_percent:g}% for {minutes} min "
                    "(missing data notifies, never stops)"),
                namespace=gpu_metric_namespace(ctx.args.cluster_name), metric_name=GPU_UTILIZATION_METRIC,
                dimensions={GPU_METRIC_DIMENSION: group.asg_name}, statistic=GPU_STATISTIC,
                comparison_operator="LessThanThreshold", threshold=a.gpu_utilization_threshold_percent,
                period=period, evaluation_periods=evaluations, datapoints_to_alarm=evaluations,
                treat_missing_data="missing", insufficient_data_actions=[ctx.notify_topic_arn],
                tags=ctx.tags, opts=child)
            self.alarms[group.name] = aws.cloudwatch.CompositeAlarm(
                f"{name}-idle-composite-{group.name}",
                alarm_name=pulumi.Output.concat(group.asg_name, IDLE_ALARM_SUFFIX),
                alarm_description=(
                    f"gpucluster {ctx.identity}/{group.name}: nothing runs for {a.idle_minutes} min, or the "
                    f"GPUs idle for {minutes} min -> scale to zero"),
                alarm_rule=pulumi.Output.all(activity.name, utilisation.name).apply(
                    lambda names: f'ALARM("{names[0]}") OR ALARM("{names[1]}")'),
                tags=ctx.tags, opts=child)
            self.alarm_names[group.name] = self.alarms[group.name].alarm_name
            self.routed.append(self.alarms[group.name].arn)
        # CloudWatch sends every alarm state change to EventBridge; the rule passes ALARM only.
        self.idle_rule = aws.cloudwatch.EventRule(
            f"{name}-idle-rule", name=f"{ctx.prefix}-idle",
            description=f"gpucluster {ctx.identity}: idle alarms -> autostop",
            event_pattern=json_output({
                "source": ["aws.cloudwatch"], "detail-type": [ALARM_STATE_CHANGE],
                "resources": self.routed,
                "detail": {"state": {"value": ["ALARM"]}},
            }),
            tags=ctx.tags, opts=child)
        rule_invokes(f"{name}-idle", self.idle_rule, fn, child)

        self.schedules: dict[str, aws.scheduler.Schedule] = {}
        expressions = {"stop": a.stop_schedule, "start": a.start_schedule,
                       "lifetime": LIFETIME_CHECK_EXPRESSION if a.max_lifetime_hours else None}
        if any(expressions.values()):
            self.scheduler_role, invoke_policy = scheduler_invoker(name, ctx, self.function,
                                                                   "InvokeAutostopOnly", child)
            for purpose, expression in expressions.items():
                if expression is None:
                    continue
                schedule_name = f"{ctx.prefix}{SCHEDULE_SUFFIXES[purpose]}"
                args: dict[str, Any] = {}
                if purpose != "lifetime":
                    args["schedule_expression_timezone"] = a.schedule_timezone
                self.schedules[purpose] = aws.scheduler.Schedule(
                    f"{name}-{purpose}-schedule", name=schedule_name, group_name="default",
                    description=f"gpucluster {ctx.identity}: {purpose} -> autostop",
                    schedule_expression=expression, flexible_time_window={"mode": "OFF"}, state="ENABLED",
                    target={
                        "arn": fn.arn, "role_arn": self.scheduler_role.arn,
                        "input": pulumi.Output.all(ctx.partition, ctx.account).apply(
                            functools.partial(_event_input, schedule_name, ctx.region)),
                        "retry_policy": {"maximum_event_age_in_seconds": SCHEDULE_MAX_EVENT_AGE_SECONDS,
                                         "maximum_retry_attempts": SCHEDULE_MAX_RETRIES},
                    },
                    **args, opts=pulumi.ResourceOptions(parent=self, depends_on=[invoke_policy]))
        self.register_outputs({
            "function_name": self.function.function_name,
            "alarm_names": dict(self.alarm_names),
            "schedule_names": {p: s.name for p, s in self.schedules.items()},
        })



class SpotInterruption(pulumi.ComponentResource):
    """EventBridge rules for spot warnings (and rebalance advice) -> the interruption hook on that node.

    The Lambda acts only on instances of this stack's groups: it runs the hook
    through SSM on the warned instance, waits a bounded time, and notifies.
    Built only when a group can hold spot nodes; the rebalance rule only when
    there is a hook to run early (a rebalance recommendation alone is advice,
    and notifying on each would be noise).
    """

    def __init__(self, name: str, ctx: GuardrailContext, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("SpotInterruption"), name, None,
                         component_options(opts, old_type("SpotInterruption")))
        s = ctx.args.spot
        child = pulumi.ResourceOptions(parent=self)
        environment = ctx.environment()
        describe = ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances"]
        statements = hook_statements(ctx, environment, describe, "INTERRUPTION", s.interruption_command,
                           s.interruption_timeout_seconds)
        self.function = GuardrailFunction(
            f"{name}-handler", ctx, module="spot_interruption",
            function_name=f"{ctx.prefix}-spot-interruption",
            timeout=spot_timeout(s), environment=environment,
            statements=[describe_statement(describe), *statements,
                        *publish_statements(ctx.notify_topic_arn, ctx.key_arn)],
            max_event_age_seconds=SPOT_MAX_EVENT_AGE_SECONDS, retries=1, opts=child)
        kinds = {"interruption": SPOT_WARNING}
        if s.handle_rebalance and s.interruption_command:
            kinds["rebalance"] = REBALANCE_RECOMMENDATION
        self.rules: dict[str, aws.cloudwatch.EventRule] = {}
        for kind, detail_type in kinds.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{kind}-rule", name=f"{ctx.prefix}-spot-{kind}",
                description=f"gpucluster {ctx.identity}: {detail_type} -> interruption hook",
                event_pattern=json.dumps({"source": ["aws.ec2"], "detail-type": [detail_type]}),
                tags=ctx.tags, opts=child)
            rule_invokes(f"{name}-{kind}", rule, self.function.function, child)
            self.rules[kind] = rule
        self.register_outputs({"function_name": self.function.function_name,
                               "rule_names": {k: r.name for k, r in self.rules.items()}})


class CapacityBlockExpiry(pulumi.ComponentResource):
    """A Capacity Block's expiration warning -> the checkpoint hook, then its groups scaled to zero.

    EC2 reclaims a block's instances when it ends; 40 minutes before, it sends an EventBridge
    event. The rule passes only this stack's reservations; the Lambda runs
    autostop.pre_stop_command on the block's nodes (at most 8 minutes), scales their groups to
    zero (stopped-by capacity-block) and notifies. Built only when a group runs on a block.
    """

    def __init__(self, name: str, ctx: GuardrailContext, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("CapacityBlockExpiry"), name, None, opts)
        a = ctx.args.autostop
        child = pulumi.ResourceOptions(parent=self)
        blocks = capacity_block_groups(ctx.args.groups)
        environment = ctx.environment()
        environment["CAPACITY_BLOCK_GROUPS"] = json_output(blocks)
        describe = ["autoscaling:DescribeAutoScalingGroups"]
        hook = hook_statements(ctx, environment, describe, "PRE_STOP", a.pre_stop_command,
                     min(a.pre_stop_timeout_seconds, CAPACITY_BLOCK_HOOK_SECONDS))
        arns = [g.asg_arn for g in ctx.args.groups if g.capacity_block_reservation_id]
        self.function = GuardrailFunction(
            f"{name}-handler", ctx, module="capacity_block", function_name=f"{ctx.prefix}-capacity-block",
            timeout=capacity_block_timeout(a), environment=environment,
            statements=[describe_statement(describe),
                        *scaling_statements(arns, ctx.identity, delete_tags=False), *hook,
                        *with_state(ctx, environment),
                        *publish_statements(ctx.notify_topic_arn, ctx.key_arn)],
            max_event_age_seconds=CAPACITY_BLOCK_MAX_EVENT_AGE_SECONDS, retries=2, opts=child)
        self.rule = aws.cloudwatch.EventRule(
            f"{name}-rule", name=f"{ctx.prefix}-capacity-block-expiry",
            description=f"gpucluster {ctx.identity}: Capacity Block expiration warning -> stop its groups",
            event_pattern=json.dumps({"source": ["aws.ec2"], "detail-type": list(CAPACITY_BLOCK_WARNINGS),
                                      "detail": {"capacity-reservation-id": sorted(blocks)}}),
            tags=ctx.tags, opts=child)
        rule_invokes(name, self.rule, self.function.function, child)
        self.register_outputs({"function_name": self.function.function_name, "rule_name": self.rule.name})


class JobRestart(pulumi.ComponentResource):
    """Auto Scaling launch events of this stack's groups -> re-launch `--restart-on-replace` jobs.

    `gpucluster run --detach --restart-on-replace` records the job in an SSM parameter under
    /gpucluster/<identity>/jobs/ (`lambdas.jobnames.jobs_parameter_path`); when a replacement brings
    the job's group back to its node count, the Lambda starts the job again on the new node set through
    SSM (new ranks, new MASTER_ADDR) and the node hands it the newest checkpoint. Its role reads and
    updates only those parameters, reads only the run log group (a job that ended well is finished),
    and runs commands only on this stack's instances.
    """

    def __init__(self, name: str, ctx: GuardrailContext, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("JobRestart"), name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        path, log_group = jobs_parameter_path(ctx.identity), run_log_group_name(ctx.identity)
        environment = {**ctx.environment(), "RUN_LOG_GROUP": log_group}
        self.function = GuardrailFunction(
            f"{name}-handler", ctx, module="job_restart", function_name=f"{ctx.prefix}-job-restart",
            timeout=BASE_TIMEOUT_SECONDS, environment=environment,
            statements=[describe_statement(["autoscaling:DescribeAutoScalingGroups",
                                            "ec2:DescribeInstances"]),
                        *job_record_statements(ctx.partition, ctx.region, ctx.account, path),
                        *run_command_statements(ctx.partition, ctx.region, ctx.account, ctx.identity),
                        {"Sid": "ReadJobEndLines", "Effect": "Allow", "Action": ["logs:FilterLogEvents"],
                         "Resource": _log_group_arns(ctx, log_group)},
                        *publish_statements(ctx.notify_topic_arn, ctx.key_arn)],
            # Launch events keep their meaning for a while (a group can take long to fill): retry
            # within the hour (Lambda asynchronous invocation, maximum event age up to 6 hours).
            max_event_age_seconds=JOB_RESTART_MAX_EVENT_AGE_SECONDS, retries=2, opts=child)
        self.rule = aws.cloudwatch.EventRule(
            f"{name}-rule", name=f"{ctx.prefix}-job-restart",
            description=f"gpucluster {ctx.identity}: instance launched in a group -> re-launch its jobs",
            event_pattern=json_output({"source": ["aws.autoscaling"], "detail-type": [LAUNCH_SUCCESSFUL],
                                 "detail": {"AutoScalingGroupName": [g.asg_name for g in ctx.args.groups]}}),
            tags=ctx.tags, opts=child)
        rule_invokes(name, self.rule, self.function.function, child)
        self.register_outputs({"function_name": self.function.function_name, "rule_name": self.rule.name})


def job_record_statements(partition: pulumi.Input[str], region: str, account: pulumi.Input[str],
                          path: str) -> list[dict[str, Any]]:
    """Read and overwrite the stack's job records only (never delete: `gpucluster cancel` does that).

    GetParametersByPath is authorised on the path itself, PutParameter on each parameter
    (Systems Manager user guide, "Restricting access to Parameter Store parameters using IAM policies").
    """
    base = pulumi.Output.concat("arn:", partition, ":ssm:", region, ":", account, ":parameter", path)
    return [{"Sid": "JobRecordsOnly", "Effect": "Allow",
             "Action": ["ssm:GetParametersByPath", "ssm:PutParameter"],
             "Resource": [base, pulumi.Output.concat(base, "/*")]}]


def _log_group_arns(ctx: GuardrailContext, log_group: str) -> list[pulumi.Output[str]]:
    arn = pulumi.Output.concat("arn:", ctx.partition, ":logs:", ctx.region, ":", ctx.account,
                               ":log-group:", log_group)
    return [arn, pulumi.Output.concat(arn, ":*")]
