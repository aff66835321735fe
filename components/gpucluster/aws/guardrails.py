"""Spend guardrails: a budget that scales compute to zero, idle auto-stop and schedules, spot hooks.

It owns the AWS wiring around the guardrail Lambdas of `components/gpucluster/lambdas`:
the budget and its notifications, the encrypted SNS topics, one CloudWatch
alarm per node group, the EventBridge rules and Scheduler schedules that invoke
the Lambdas, the Lambdas themselves (packaged from `components/gpucluster/lambdas`) and one
least-privilege role per Lambda. It must never delete anything and never grant
a delete: every action it wires scales Auto Scaling groups of this stack to
zero, and data is never touched. It must not build or change the node groups:
it is handed their names and ARNs (`GuardedGroup`), and may be handed Auto
Scaling groups gpucluster did not create (an EKS managed node group's, say);
for those it only adds the `gpucluster:stack` tag (`tag_groups`), which the
Lambdas' lookups and IAM conditions select groups and instances by.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import (
    STACK_TAG,
    AutoStopSettings,
    BudgetSettings,
    GuardedGroupModel,
    GuardrailsModel,
    SpotSettings,
    component_options,
    guardrails_checks,
    owned_tags,
    type_token,
    validate,
)
from gpucluster.aws.iam import boundary_arn
from gpucluster.lambdas.handlers import HANDLERS
from gpucluster.lambdas.jobnames import LAUNCH_SUCCESSFUL, jobs_parameter_path  # not job_restart: boto3
from gpucluster.lambdas.tags import STATE_TAGS
from gpucluster.node.userdata import GPU_METRIC_DIMENSION, GPU_UTILIZATION_METRIC
from gpucluster.noderole import gpu_metric_namespace, run_log_group_name
from gpucluster.spec import AutoStopConfig, BudgetConfig, NodeGroupConfig, SpotConfig

# ------------------------------------------------------------------- contracts

__all__ = ["STACK_TAG", "GuardedGroup", "Guardrails", "GuardrailsArgs"]
# Tags the Lambdas write on a group they stop (components/gpucluster/lambdas/tags.py STATE_TAGS).

LAMBDA_DIR = Path(__file__).resolve().parent.parent / "lambdas"
# Zipped as the package `lambdas` (its modules import each other relatively).
LAMBDA_PACKAGE = "lambdas"
# pulumi-aws 7 lambda Runtime enum; python3.13 runs on Amazon Linux 2023 and ships boto3.
LAMBDA_RUNTIME = "python3.13"
LAMBDA_ARCHITECTURE = "arm64"
LAMBDA_MEMORY_MB = 256
LAMBDA_MAX_TIMEOUT_SECONDS = 900  # Lambda quota: 15 minutes per invocation
LOG_RETENTION_DAYS = 30

# Time each Lambda needs besides waiting for a hook: describe, scale, tag, notify.
AUTOSTOP_MARGIN_SECONDS = 60
SPOT_MARGIN_SECONDS = 30
BASE_TIMEOUT_SECONDS = 120
SPOT_NO_HOOK_TIMEOUT_SECONDS = 60
# A spot warning gives 2 minutes (EC2 user guide, "Spot Instance interruption notices"): an older
# event is moot, so Lambda's async retry gives up after that.
SPOT_MAX_EVENT_AGE_SECONDS = 120
JOB_RESTART_MAX_EVENT_AGE_SECONDS = 3600
# Schedules retry for at most one lifetime tick.
SCHEDULE_MAX_EVENT_AGE_SECONDS = 900
SCHEDULE_MAX_RETRIES = 3
LIFETIME_CHECK_EXPRESSION = "rate(15 minutes)"
# budget.report: Mondays, or the month's last day (EventBridge cron `L`), 08:00 UTC; the days
# before are in Cost Explorer by then.
REPORT_EXPRESSIONS = {"weekly": "cron(0 8 ? * MON *)", "monthly": "cron(0 8 L * ? *)"}
# Cost Explorer's GetCostAndUsage / GetCostForecast and CloudWatch's GetMetricData list no
# resource types (Service Authorization Reference): "*" only, like the describe calls.
SPEND_READ_ACTIONS = ("ce:GetCostAndUsage", "ce:GetCostForecast", "cloudwatch:GetMetricData")
REPORT_TIMEOUT_SECONDS = 300

# GPU utilisation from the CloudWatch agent's nvidia_gpu plugin (CloudWatch user guide, "Collect
# NVIDIA GPU metrics"), aggregated per Auto Scaling group by the node bootstrap's agent config:
# the alarms watch exactly the series components/gpucluster/node publishes (its constants, imported).
# Maximum, not Average: a group is idle only when even its busiest GPU is. An 8-GPU node
# training on one GPU at 30 % averages 3.75 % and would be stopped mid-job by an average.
GPU_STATISTIC = "Maximum"
# The autostop handler's fallback: an idle alarm is named after its group plus this suffix.
IDLE_ALARM_SUFFIX = "-idle"
# The autostop handler reads a schedule's purpose from the rule name's suffix.
SCHEDULE_SUFFIXES = {"stop": "-stop", "start": "-start", "lifetime": "-lifetime"}

# EC2 user guide, "Monitor Capacity Blocks using EventBridge": sent 40 minutes before a block ends;
# its instances start terminating 10 minutes later. The guide's examples spell the detail-type
# both ways, so the rule matches both.
CAPACITY_BLOCK_WARNINGS = ("Capacity Block Reservation Expiration Warning",
                           "Capacity Block Expiration Warning")
CAPACITY_BLOCK_HOOK_SECONDS = 480  # of the 10 minutes: the hook's share (lambdas/capacity_block.py)
CAPACITY_BLOCK_MAX_EVENT_AGE_SECONDS = 600  # past the first terminations a retry is moot
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"
RUN_SHELL_DOCUMENT = "AWS-RunShellScript"


def _old(component: str) -> str:
    """A guardrail component's type token before 0.2 (aliased, so existing stacks keep their URNs)."""
    return f"gpucluster:guardrails:{component}"


# ------------------------------------------------------------------ pure logic


def idle_window(idle_minutes: int) -> tuple[int, int]:
    """(alarm period in seconds, evaluation periods) whose product is exactly `idle_minutes`.

    5-minute periods when the idle time allows it (fewer datapoints to fill),
    1-minute periods otherwise; never more than a day in all (CloudWatch limit).
    """
    period = 300 if idle_minutes >= 15 and idle_minutes % 5 == 0 else 60
    return period, idle_minutes * 60 // period


def can_run_spot(group: NodeGroupConfig) -> bool:
    """True when the group may hold spot nodes: a spot share and room above the on-demand base."""
    cap = group.capacity
    return cap.market == "mixed" and cap.spot_percent > 0 and group.max_nodes > cap.on_demand_base


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


def usd(amount: float) -> str:
    """A budget limit as AWS Budgets takes it: 500.0 -> '500', 2.5 -> '2.50'."""
    return str(int(amount)) if float(amount).is_integer() else f"{amount:.2f}"


def tag_cost_filter(stack: str) -> dict[str, Any]:
    """Cost filter on the stack's cost-allocation tag: `user:<key>$<value>` (AWS Budgets API)."""
    return {"name": "TagKeyValue", "values": [f"user:{STACK_TAG}${stack}"]}


def budget_notifications(budget: BudgetConfig, notify_topic_arn: pulumi.Input[str],
                         action_topic_arn: pulumi.Input[str] | None) -> list[dict[str, Any]]:
    """One ACTUAL notification per distinct threshold and a FORECASTED one at 100 %.

    Every notification e-mails `budget.emails`. A notification has one SNS
    subscriber at most (Budgets API, "NotificationWithSubscribers"): the action
    threshold's goes to the action topic, which only the budget Lambda listens
    to, so lower thresholds never stop anything; the rest go to the notify topic.
    """
    action = budget.action_threshold_percent if action_topic_arn is not None else None
    thresholds = sorted(set(budget.alert_thresholds_percent) | ({action} if action else set()))

    def notification(kind: str, threshold: float, topic: pulumi.Input[str]) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "notification_type": kind, "comparison_operator": "GREATER_THAN",
            "threshold": threshold, "threshold_type": "PERCENTAGE",
            "subscriber_sns_topic_arns": [topic],
        }
        if budget.emails:
            entry["subscriber_email_addresses"] = list(budget.emails)
        return entry

    notes = [notification("ACTUAL", t, action_topic_arn if t == action else notify_topic_arn)
             for t in thresholds]
    notes.append(notification("FORECASTED", 100, notify_topic_arn))
    return notes


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


# ------------------------------------------------------------ policy documents


def policy_document(statements: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)}, sort_keys=True)


def service_trust(service: str, account: pulumi.Input[str] | None = None) -> pulumi.Output[str]:
    """Assume-role policy for an AWS service, optionally only on behalf of this account."""
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": {"Service": service},
                                 "Action": "sts:AssumeRole"}
    if account is not None:
        statement["Condition"] = {"StringEquals": {"aws:SourceAccount": account}}
    return pulumi.Output.from_input([statement]).apply(policy_document)


def logs_statements(partition: pulumi.Input[str], region: str, account: pulumi.Input[str],
                    log_group_name: str) -> list[dict[str, Any]]:
    """Write to the function's own log group only (created here: no logs:CreateLogGroup).

    Streams are `arn:...:log-group:<name>:log-stream:<stream>`, hence the `:*`
    (CloudWatch Logs, "Actions, resources, and condition keys").
    """
    arn = pulumi.Output.concat("arn:", partition, ":logs:", region, ":", account, ":log-group:",
                               log_group_name, ":*")
    return [{"Sid": "WriteOwnLogs", "Effect": "Allow",
             "Action": ["logs:CreateLogStream", "logs:PutLogEvents"], "Resource": [arn]}]


def describe_statement(actions: Sequence[str]) -> dict[str, Any]:
    """Read-only calls that support no resource-level permissions and no condition keys.

    DescribeAutoScalingGroups / DescribeAutoScalingInstances (Service Authorization
    Reference, "Amazon EC2 Auto Scaling"), ec2:DescribeInstances ("Amazon EC2"),
    ssm:GetCommandInvocation ("AWS Systems Manager") and the spend report's reads
    (SPEND_READ_ACTIONS) list no resource types, so Resource "*" is the only form AWS
    accepts. This is the one "*" a guardrail role holds.
    """
    return {"Sid": "DescribeOnlyStar", "Effect": "Allow", "Action": sorted(actions), "Resource": "*"}


def scaling_statements(asg_arns: Sequence[pulumi.Input[str]], stack: str,
                       *, delete_tags: bool) -> list[dict[str, Any]]:
    """Scale and tag this stack's groups only: their ARNs, and only while tagged with the stack.

    Tag writes are limited to the stop-state tags (aws:TagKeys), so a role can
    never re-tag a group into or out of a stack.
    """
    owned = {"StringEquals": {f"autoscaling:ResourceTag/{STACK_TAG}": stack}}
    tag_actions = ["autoscaling:CreateOrUpdateTags"] + (["autoscaling:DeleteTags"] if delete_tags else [])
    return [
        {"Sid": "ScaleThisStacksGroups", "Effect": "Allow",
         "Action": ["autoscaling:UpdateAutoScalingGroup"], "Resource": list(asg_arns),
         "Condition": owned},
        {"Sid": "TagStopState", "Effect": "Allow", "Action": tag_actions, "Resource": list(asg_arns),
         "Condition": {**owned, "ForAllValues:StringEquals": {"aws:TagKeys": list(STATE_TAGS)}}},
    ]


def run_command_statements(partition: pulumi.Input[str], region: str, account: pulumi.Input[str],
                           stack: str) -> list[dict[str, Any]]:
    """Run AWS-RunShellScript, and only on instances tagged with this stack.

    SendCommand is authorised on the document and on every target instance
    (Systems Manager user guide, "Restricting Run Command access based on tags").
    """
    document = pulumi.Output.concat("arn:", partition, ":ssm:", region, "::document/", RUN_SHELL_DOCUMENT)
    instances = pulumi.Output.concat("arn:", partition, ":ec2:", region, ":", account, ":instance/*")
    return [
        {"Sid": "RunShellDocument", "Effect": "Allow", "Action": ["ssm:SendCommand"],
         "Resource": [document]},
        {"Sid": "OnThisStacksInstances", "Effect": "Allow", "Action": ["ssm:SendCommand"],
         "Resource": [instances],
         "Condition": {"StringEquals": {f"ssm:resourceTag/{STACK_TAG}": stack}}},
    ]


def publish_statements(topic_arn: pulumi.Input[str], key_arn: pulumi.Input[str]) -> list[dict[str, Any]]:
    """Publish to the notify topic; the topic is KMS-encrypted, so the publisher needs the key."""
    return [
        {"Sid": "Notify", "Effect": "Allow", "Action": ["sns:Publish"], "Resource": [topic_arn]},
        # Publishers to an encrypted topic (SNS developer guide, "Key management").
        {"Sid": "EncryptForTopic", "Effect": "Allow", "Action": ["kms:GenerateDataKey*", "kms:Decrypt"],
         "Resource": [key_arn]},
    ]


def topic_key_policy(partition: str, account: str) -> str:
    """Key policy for the guardrail topics' KMS key.

    The AWS-managed key alias/aws/sns cannot be used: its policy cannot be changed,
    and AWS Budgets and CloudWatch alarms publish to an encrypted topic only when
    the key policy lets their service principals use the key (SNS developer
    guide, "Enable compatibility between event sources from AWS services and
    encrypted topics").
    """
    return policy_document([
        {"Sid": "AccountAdministersThroughIam", "Effect": "Allow",
         "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"}, "Action": "kms:*", "Resource": "*"},
        {"Sid": "ServicesPublishToEncryptedTopics", "Effect": "Allow",
         "Principal": {"Service": ["budgets.amazonaws.com", "cloudwatch.amazonaws.com"]},
         "Action": ["kms:GenerateDataKey*", "kms:Decrypt"], "Resource": "*"},
    ])


def topic_policy(topic_arn: str, partition: str, region: str, account: str, *, alarms: bool) -> str:
    """Who may publish besides this account's IAM principals: AWS Budgets (and CloudWatch alarms).

    Budgets statement as in the AWS Cost Management user guide, "Creating an
    Amazon SNS topic for budget notifications".
    """
    statements: list[dict[str, Any]] = [
        {"Sid": "AWSBudgetsPublish", "Effect": "Allow", "Principal": {"Service": "budgets.amazonaws.com"},
         "Action": "SNS:Publish", "Resource": topic_arn,
         "Condition": {"StringEquals": {"aws:SourceAccount": account},
                       "ArnLike": {"aws:SourceArn": f"arn:{partition}:budgets::{account}:*"}}},
    ]
    if alarms:
        alarm_arns = f"arn:{partition}:cloudwatch:{region}:{account}:alarm:*"
        statements.append(
            {"Sid": "CloudWatchAlarmsPublish", "Effect": "Allow",
             "Principal": {"Service": "cloudwatch.amazonaws.com"}, "Action": "SNS:Publish",
             "Resource": topic_arn,
             "Condition": {"StringEquals": {"aws:SourceAccount": account},
                           "ArnLike": {"aws:SourceArn": alarm_arns}}})
    return policy_document(statements)


def _json(value: Any) -> pulumi.Output[str]:
    """JSON text of a structure that may hold Outputs anywhere inside."""
    return pulumi.Output.from_input(value).apply(lambda v: json.dumps(v, sort_keys=True))


def _policy(statements: Sequence[Mapping[str, Any]]) -> pulumi.Output[str]:
    return pulumi.Output.from_input(list(statements)).apply(policy_document)


def lambda_sources() -> list[Path]:
    """The handlers' modules: every `*.py` of the package, by name, and nothing else.

    Listed file by file rather than zipping the directory, so `__pycache__`, `*.pyc` and other
    build noise left by a local test run never change the archive: the same sources give the same
    archive, and a second `pulumi up` with nothing changed updates no function.
    """
    return sorted(LAMBDA_DIR.glob("*.py"))


def lambda_code() -> pulumi.AssetArchive:
    """The handlers zipped as the package `lambdas` (handler `lambdas.<module>.handler`)."""
    return pulumi.AssetArchive({f"{LAMBDA_PACKAGE}/{path.name}": pulumi.FileAsset(str(path))
                                for path in lambda_sources()})


# --------------------------------------------------------------------- context


@dataclass(frozen=True)
class _Context:
    """What every guardrail part needs: the checked args, names, identity and the notify topic."""

    args: GuardrailsModel
    prefix: str
    partition: pulumi.Output[str]
    account: pulumi.Output[str]
    notify_topic_arn: pulumi.Output[str]
    key_arn: pulumi.Output[str]
    permissions_boundary: pulumi.Output[str] | None = None
    """ARN of the boundary every guardrail role carries (GuardrailsArgs.permissions_boundary)."""

    @property
    def identity(self) -> str:
        return self.args.identity

    @property
    def region(self) -> str:
        return self.args.region

    @property
    def asg_arns(self) -> list[pulumi.Input[str]]:
        return [g.asg_arn for g in self.args.groups]

    @property
    def tags(self) -> dict[str, str]:
        return owned_tags(self.args.tags, self.args.identity, self.args.cluster_name)

    def environment(self) -> dict[str, pulumi.Input[str]]:
        """What every handler reads: its stack identity (required) and where to report."""
        return {"GPUCLUSTER_STACK": self.identity, "NOTIFY_TOPIC_ARN": self.notify_topic_arn}


def _hook(ctx: _Context, environment: dict[str, pulumi.Input[str]], describe: list[str], var: str,
          command: str | None, timeout_seconds: int) -> list[dict[str, Any]]:
    """Hand a hook command to a handler (`<var>_COMMAND`, `<var>_TIMEOUT_SECONDS`) and let it run it."""
    if not command:
        return []
    environment[f"{var}_COMMAND"] = command
    environment[f"{var}_TIMEOUT_SECONDS"] = str(timeout_seconds)
    describe.append("ssm:GetCommandInvocation")
    return run_command_statements(ctx.partition, ctx.region, ctx.account, ctx.identity)


# ------------------------------------------------------------------ components


class GuardrailFunction(pulumi.ComponentResource):
    """One guardrail Lambda with its own log group (with retention) and least-privilege role.

    The role may write only to the function's log group and do what
    `statements` allow; failed async invocations (after Lambda's retries) are
    published to the notify topic, so a guardrail that could not act is never silent.
    """

    function: aws.lambda_.Function

    def __init__(self, name: str, ctx: _Context, *, module: str, function_name: str, timeout: int,
                 environment: Mapping[str, pulumi.Input[str]], statements: Sequence[Mapping[str, Any]],
                 max_event_age_seconds: int | None = None, retries: int | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("GuardrailFunction"), name, None,
                         component_options(opts, _old("GuardrailFunction")))
        if timeout > LAMBDA_MAX_TIMEOUT_SECONDS:
            raise ValueError(f"{function_name}: timeout {timeout}s exceeds Lambda's 900 s")
        child = pulumi.ResourceOptions(parent=self)
        self.function_name = function_name
        log_group_name = f"/aws/lambda/{function_name}"
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", name=log_group_name, retention_in_days=LOG_RETENTION_DAYS,
            tags=ctx.tags, opts=child)
        self.role = aws.iam.Role(
            f"{name}-role", assume_role_policy=service_trust("lambda.amazonaws.com"),
            description=f"{function_name}: gpucluster guardrail for stack {ctx.identity}",
            permissions_boundary=ctx.permissions_boundary, tags=ctx.tags, opts=child)
        self.role_policy = aws.iam.RolePolicy(
            f"{name}-policy", role=self.role.id,
            policy=_policy([*logs_statements(ctx.partition, ctx.region, ctx.account, log_group_name),
                            *statements]),
            opts=child)
        self.function = aws.lambda_.Function(
            f"{name}-function", name=function_name, role=self.role.arn, runtime=LAMBDA_RUNTIME,
            architectures=[LAMBDA_ARCHITECTURE], handler=HANDLERS[module], code=lambda_code(),
            timeout=timeout, memory_size=LAMBDA_MEMORY_MB,
            environment={"variables": dict(environment)},
            logging_config={"log_format": "Text", "log_group": self.log_group.name},
            tags=ctx.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.log_group, self.role_policy]))
        invoke_args: dict[str, Any] = {}
        if max_event_age_seconds is not None:
            invoke_args["maximum_event_age_in_seconds"] = max_event_age_seconds
        if retries is not None:
            invoke_args["maximum_retry_attempts"] = retries
        # Lambda checks the role can publish to the destination when the config is created.
        self.invoke_config = aws.lambda_.FunctionEventInvokeConfig(
            f"{name}-on-failure", function_name=self.function.name,
            destination_config={"on_failure": {"destination": ctx.notify_topic_arn}},
            **invoke_args, opts=pulumi.ResourceOptions(parent=self, depends_on=[self.role_policy]))
        self.register_outputs({"function_name": function_name, "function_arn": self.function.arn,
                               "log_group": self.log_group.name, "role_arn": self.role.arn})


class Notifications(pulumi.ComponentResource):
    """The stack's guardrail topic (KMS-encrypted) with e-mail subscriptions from budget.emails.

    Guardrail Lambdas report what they stopped here, idle alarms report missing
    data here, and budget alerts below the action threshold arrive here.
    """

    def __init__(self, name: str, args: GuardrailsModel, prefix: str, partition: pulumi.Output[str],
                 account: pulumi.Output[str], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("Notifications"), name, None,
                         component_options(opts, _old("Notifications")))
        child = pulumi.ResourceOptions(parent=self)
        tags = owned_tags(args.tags, args.identity, args.cluster_name)
        self.key = aws.kms.Key(
            f"{name}-key", description=f"gpucluster {args.identity}: guardrail SNS topics",
            enable_key_rotation=True, deletion_window_in_days=30,
            policy=pulumi.Output.all(partition, account).apply(lambda v: topic_key_policy(*v)),
            tags=tags, opts=child)
        self.key_alias = aws.kms.Alias(
            f"{name}-key-alias", name=f"alias/{prefix}-guardrails", target_key_id=self.key.key_id, opts=child)
        self.topic = aws.sns.Topic(
            f"{name}-topic", name=f"{prefix}-guardrails", kms_master_key_id=self.key.arn,
            tags=tags, opts=child)
        self.topic_policy = aws.sns.TopicPolicy(
            f"{name}-topic-policy", arn=self.topic.arn,
            policy=pulumi.Output.all(self.topic.arn, partition, account).apply(
                lambda v: topic_policy(v[0], v[1], args.region, v[2], alarms=True)),
            opts=child)
        emails = list(args.budget.emails) if args.budget else []
        self.subscriptions = [
            aws.sns.TopicSubscription(f"{name}-email-{email}", topic=self.topic.arn,
                                      protocol="email", endpoint=email, opts=child)
            for email in emails]
        self.register_outputs({"topic_arn": self.topic.arn, "key_arn": self.key.arn})


class Budget(pulumi.ComponentResource):
    """Monthly cost budget on the stack's tag, its alerts, and the scale-to-zero action.

    The action threshold's notification publishes to a topic of its own that
    only the budget Lambda subscribes to; it scales every group of the stack to
    zero (never deletes) and reports to the notify topic.
    """

    def __init__(self, name: str, ctx: _Context, depends_on: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("Budget"), name, None, component_options(opts, _old("Budget")))
        budget = ctx.args.budget
        if budget is None:
            raise ValueError(f"guardrails of {ctx.identity} have no budget settings")
        child = pulumi.ResourceOptions(parent=self)
        self.action_topic: aws.sns.Topic | None = None
        self.function: GuardrailFunction | None = None
        ready: list[pulumi.Resource] = list(depends_on)
        if budget.action_threshold_percent is not None:
            self.action_topic = aws.sns.Topic(
                f"{name}-action-topic", name=f"{ctx.prefix}-budget-action", kms_master_key_id=ctx.key_arn,
                tags=ctx.tags, opts=child)
            action_policy = aws.sns.TopicPolicy(
                f"{name}-action-topic-policy", arn=self.action_topic.arn,
                policy=pulumi.Output.all(self.action_topic.arn, ctx.partition, ctx.account).apply(
                    lambda v: topic_policy(v[0], v[1], ctx.region, v[2], alarms=False)),
                opts=child)
            ready.append(action_policy)
            self.function = GuardrailFunction(
                f"{name}-handler", ctx, module="budget_action", function_name=f"{ctx.prefix}-budget-action",
                timeout=BASE_TIMEOUT_SECONDS,
                environment=ctx.environment(),
                statements=[
                    describe_statement(["autoscaling:DescribeAutoScalingGroups"]),
                    *scaling_statements(ctx.asg_arns, ctx.identity, delete_tags=False),
                    *publish_statements(ctx.notify_topic_arn, ctx.key_arn),
                ],
                opts=child)
            self.permission = aws.lambda_.Permission(
                f"{name}-action-permission", action="lambda:InvokeFunction",
                function=self.function.function.name, principal="sns.amazonaws.com",
                source_arn=self.action_topic.arn, opts=child)
            self.subscription = aws.sns.TopicSubscription(
                f"{name}-action-subscription", topic=self.action_topic.arn, protocol="lambda",
                endpoint=self.function.function.arn,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.permission]))
        self.budget_name = f"{ctx.prefix}-monthly"
        # Budgets checks it may publish to the topics when notifications are created.
        self.budget = aws.budgets.Budget(
            f"{name}-monthly", name=self.budget_name, budget_type="COST", time_unit="MONTHLY",
            limit_amount=usd(budget.monthly_limit_usd), limit_unit="USD",
            cost_filters=[tag_cost_filter(ctx.identity)],
            notifications=budget_notifications(
                budget, ctx.notify_topic_arn, self.action_topic.arn if self.action_topic else None),
            tags=ctx.tags, opts=pulumi.ResourceOptions(parent=self, depends_on=ready))
        self.register_outputs({
            "budget_name": self.budget_name,
            "action_topic_arn": self.action_topic.arn if self.action_topic else None,
            "function_name": self.function.function_name if self.function else None,
        })


class AutoStop(pulumi.ComponentResource):
    """Idle alarms per node group and stop/start/lifetime schedules, all driving the autostop Lambda.

    An alarm goes to ALARM only on datapoints below the threshold for the whole
    idle time; missing data is never idle (treat_missing_data "missing"): the
    alarm goes to INSUFFICIENT_DATA and notifies instead. The Lambda runs the
    pre-stop hook through SSM, waits a bounded time, then scales to zero.
    """

    def __init__(self, name: str, ctx: _Context, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("AutoStop"), name, None, component_options(opts, _old("AutoStop")))
        a = ctx.args.autostop
        child = pulumi.ResourceOptions(parent=self)
        environment = ctx.environment()
        describe = ["autoscaling:DescribeAutoScalingGroups"]
        statements = _hook(ctx, environment, describe, "PRE_STOP", a.pre_stop_command,
                           a.pre_stop_timeout_seconds)
        if a.max_lifetime_hours:
            environment["MAX_LIFETIME_HOURS"] = str(a.max_lifetime_hours)
            describe.append("ec2:DescribeInstances")  # instance launch times
        statements = [describe_statement(describe),
                      *scaling_statements(ctx.asg_arns, ctx.identity, delete_tags=bool(a.start_schedule)),
                      *statements, *publish_statements(ctx.notify_topic_arn, ctx.key_arn)]
        self.function = GuardrailFunction(
            f"{name}-handler", ctx, module="autostop", function_name=f"{ctx.prefix}-autostop",
            timeout=autostop_timeout(a), environment=environment, statements=statements, opts=child)
        fn = self.function.function

        period, evaluations = idle_window(a.idle_minutes)
        self.alarms: dict[str, aws.cloudwatch.MetricAlarm] = {}
        for group in ctx.args.groups:
            self.alarms[group.name] = aws.cloudwatch.MetricAlarm(
                f"{name}-idle-{group.name}",
                name=pulumi.Output.concat(group.asg_name, IDLE_ALARM_SUFFIX),
                alarm_description=(
                    f"gpucluster {ctx.identity}/{group.name}: busiest GPU under "
                    f"{a.gpu_utilization_threshold_percent:g}% for {a.idle_minutes} min -> scale to zero "
                    "(missing data notifies, never stops)"),
                namespace=gpu_metric_namespace(ctx.args.cluster_name), metric_name=GPU_UTILIZATION_METRIC,
                dimensions={GPU_METRIC_DIMENSION: group.asg_name}, statistic=GPU_STATISTIC,
                comparison_operator="LessThanThreshold", threshold=a.gpu_utilization_threshold_percent,
                period=period, evaluation_periods=evaluations, datapoints_to_alarm=evaluations,
                treat_missing_data="missing", insufficient_data_actions=[ctx.notify_topic_arn],
                tags=ctx.tags, opts=child)
        # CloudWatch sends every alarm state change to EventBridge; the rule passes ALARM only.
        self.idle_rule = aws.cloudwatch.EventRule(
            f"{name}-idle-rule", name=f"{ctx.prefix}-idle",
            description=f"gpucluster {ctx.identity}: idle alarms -> autostop",
            event_pattern=_json({
                "source": ["aws.cloudwatch"], "detail-type": [ALARM_STATE_CHANGE],
                "resources": [alarm.arn for alarm in self.alarms.values()],
                "detail": {"state": {"value": ["ALARM"]}},
            }),
            tags=ctx.tags, opts=child)
        _rule_invokes(f"{name}-idle", self.idle_rule, fn, child)

        self.schedules: dict[str, aws.scheduler.Schedule] = {}
        expressions = {"stop": a.stop_schedule, "start": a.start_schedule,
                       "lifetime": LIFETIME_CHECK_EXPRESSION if a.max_lifetime_hours else None}
        if any(expressions.values()):
            self.scheduler_role = aws.iam.Role(
                f"{name}-scheduler-role",
                assume_role_policy=service_trust("scheduler.amazonaws.com", ctx.account),
                description=f"EventBridge Scheduler invokes {self.function.function_name} only",
                permissions_boundary=ctx.permissions_boundary, tags=ctx.tags, opts=child)
            invoke_policy = aws.iam.RolePolicy(
                f"{name}-scheduler-policy", role=self.scheduler_role.id,
                policy=_policy([{"Sid": "InvokeAutostopOnly", "Effect": "Allow",
                                 "Action": ["lambda:InvokeFunction"], "Resource": [fn.arn]}]),
                opts=child)
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
                            lambda v, n=schedule_name: scheduled_event_input(n, v[0], ctx.region, v[1])),
                        "retry_policy": {"maximum_event_age_in_seconds": SCHEDULE_MAX_EVENT_AGE_SECONDS,
                                         "maximum_retry_attempts": SCHEDULE_MAX_RETRIES},
                    },
                    **args, opts=pulumi.ResourceOptions(parent=self, depends_on=[invoke_policy]))
        self.register_outputs({
            "function_name": self.function.function_name,
            "alarm_names": {g: alarm.name for g, alarm in self.alarms.items()},
            "schedule_names": {p: s.name for p, s in self.schedules.items()},
        })


def _rule_invokes(name: str, rule: aws.cloudwatch.EventRule,
                  fn: aws.lambda_.Function, child: pulumi.ResourceOptions) -> None:
    """Target a rule at a Lambda and let exactly that rule invoke it."""
    aws.lambda_.Permission(f"{name}-permission", action="lambda:InvokeFunction", function=fn.name,
                           principal="events.amazonaws.com", source_arn=rule.arn, opts=child)
    aws.cloudwatch.EventTarget(f"{name}-target", rule=rule.name, arn=fn.arn, opts=child)


class SpendReport(pulumi.ComponentResource):
    """budget.report: a weekly or monthly rule invoking the read-only spend report Lambda.

    The Lambda reads Cost Explorer (the stack's tag) and the GPU metrics, and publishes
    spend so far, the forecast against the budget, idle waste and the top group to the
    notify topic. Its role can read and publish, nothing else.
    """

    def __init__(self, name: str, ctx: _Context, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("SpendReport"), name, None, opts)
        budget = ctx.args.budget
        if budget is None or budget.report is None:
            raise ValueError(f"guardrails of {ctx.identity} have no budget.report")
        child = pulumi.ResourceOptions(parent=self)
        environment = {**ctx.environment(), "REPORT_PERIOD": budget.report,
                       "MONTHLY_LIMIT_USD": usd(budget.monthly_limit_usd),
                       "IDLE_THRESHOLD_PERCENT": f"{ctx.args.autostop.gpu_utilization_threshold_percent:g}",
                       "GPU_METRIC_NAMESPACE": gpu_metric_namespace(ctx.args.cluster_name)}
        self.function = GuardrailFunction(
            f"{name}-handler", ctx, module="report", function_name=f"{ctx.prefix}-spend-report",
            timeout=REPORT_TIMEOUT_SECONDS, environment=environment,
            statements=[describe_statement(["autoscaling:DescribeAutoScalingGroups", *SPEND_READ_ACTIONS]),
                        *publish_statements(ctx.notify_topic_arn, ctx.key_arn)],
            opts=child)
        self.rule = aws.cloudwatch.EventRule(
            f"{name}-rule", name=f"{ctx.prefix}-spend-report",
            description=f"gpucluster {ctx.identity}: {budget.report} spend report",
            schedule_expression=REPORT_EXPRESSIONS[budget.report], tags=ctx.tags, opts=child)
        _rule_invokes(name, self.rule, self.function.function, child)
        self.register_outputs({"function_name": self.function.function_name, "rule_name": self.rule.name})


class SpotInterruption(pulumi.ComponentResource):
    """EventBridge rules for spot warnings (and rebalance advice) -> the interruption hook on that node.

    The Lambda acts only on instances of this stack's groups: it runs the hook
    through SSM on the warned instance, waits a bounded time, and notifies.
    Built only when a group can hold spot nodes; the rebalance rule only when
    there is a hook to run early (a rebalance recommendation alone is advice,
    and notifying on each would be noise).
    """

    def __init__(self, name: str, ctx: _Context, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("SpotInterruption"), name, None,
                         component_options(opts, _old("SpotInterruption")))
        s = ctx.args.spot
        child = pulumi.ResourceOptions(parent=self)
        environment = ctx.environment()
        describe = ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances"]
        statements = _hook(ctx, environment, describe, "INTERRUPTION", s.interruption_command,
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
            _rule_invokes(f"{name}-{kind}", rule, self.function.function, child)
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

    def __init__(self, name: str, ctx: _Context, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("CapacityBlockExpiry"), name, None, opts)
        a = ctx.args.autostop
        child = pulumi.ResourceOptions(parent=self)
        blocks = capacity_block_groups(ctx.args.groups)
        environment = ctx.environment()
        environment["CAPACITY_BLOCK_GROUPS"] = _json(blocks)
        describe = ["autoscaling:DescribeAutoScalingGroups"]
        hook = _hook(ctx, environment, describe, "PRE_STOP", a.pre_stop_command,
                     min(a.pre_stop_timeout_seconds, CAPACITY_BLOCK_HOOK_SECONDS))
        arns = [g.asg_arn for g in ctx.args.groups if g.capacity_block_reservation_id]
        self.function = GuardrailFunction(
            f"{name}-handler", ctx, module="capacity_block", function_name=f"{ctx.prefix}-capacity-block",
            timeout=capacity_block_timeout(a), environment=environment,
            statements=[describe_statement(describe),
                        *scaling_statements(arns, ctx.identity, delete_tags=False), *hook,
                        *publish_statements(ctx.notify_topic_arn, ctx.key_arn)],
            max_event_age_seconds=CAPACITY_BLOCK_MAX_EVENT_AGE_SECONDS, retries=2, opts=child)
        self.rule = aws.cloudwatch.EventRule(
            f"{name}-rule", name=f"{ctx.prefix}-capacity-block-expiry",
            description=f"gpucluster {ctx.identity}: Capacity Block expiration warning -> stop its groups",
            event_pattern=json.dumps({"source": ["aws.ec2"], "detail-type": list(CAPACITY_BLOCK_WARNINGS),
                                      "detail": {"capacity-reservation-id": sorted(blocks)}}),
            tags=ctx.tags, opts=child)
        _rule_invokes(name, self.rule, self.function.function, child)
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

    def __init__(self, name: str, ctx: _Context, opts: pulumi.ResourceOptions | None = None) -> None:
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
            event_pattern=_json({"source": ["aws.autoscaling"], "detail-type": [LAUNCH_SUCCESSFUL],
                                 "detail": {"AutoScalingGroupName": [g.asg_name for g in ctx.args.groups]}}),
            tags=ctx.tags, opts=child)
        _rule_invokes(name, self.rule, self.function.function, child)
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


def _log_group_arns(ctx: _Context, log_group: str) -> list[pulumi.Output[str]]:
    arn = pulumi.Output.concat("arn:", ctx.partition, ":logs:", ctx.region, ":", ctx.account,
                               ":log-group:", log_group)
    return [arn, pulumi.Output.concat(arn, ":*")]


class GuardedGroup(TypedDict):
    """An Auto Scaling group the guardrails stop, start and watch (any group, gpucluster's or not)."""

    name: str
    """Label in resource names and alarm texts (2-24 characters a-z, 0-9, '-'); unique."""
    asg_name: pulumi.Input[str]
    """The Auto Scaling group's name."""
    asg_arn: pulumi.Input[str]
    """The Auto Scaling group's ARN: the guardrail roles may change only the groups listed."""
    can_run_spot: bool
    """The group may hold spot instances: the spot-interruption hook is built for it."""
    capacity_block_reservation_id: NotRequired[str]
    """The Capacity Block (cr-...) the group launches into: it is stopped before the block ends."""


class GuardrailsArgs(TypedDict):
    """Budget, idle auto-stop, schedules and spot hooks for Auto Scaling groups of GPU nodes."""

    groups: list[GuardedGroup]
    """The groups to guard (1-20)."""
    cluster_name: str
    """Prefix of every name (Lambdas, topics, rules, schedules, the budget): 2-24 characters."""
    identity: str
    """The gpucluster:stack tag value: the budget counts costs, the Lambdas act on groups, carrying it."""
    region: str
    """AWS region of the groups, e.g. us-east-1."""
    tags: NotRequired[dict[str, str]]
    """Tags of every resource."""
    budget: NotRequired[BudgetSettings]
    """Monthly budget, alerts and the scale-to-zero action, as a stack file's budget section."""
    autostop: NotRequired[AutoStopSettings]
    """Idle stop, schedules, maximum lifetime and the pre-stop hook, as a stack file's autostop section."""
    spot: NotRequired[SpotSettings]
    """The spot-interruption hook, as a stack file's spot section."""
    tag_groups: NotRequired[bool]
    """Give each group the gpucluster:stack tag (for groups gpucluster did not create; default false)."""
    permissions_boundary: NotRequired[str]
    """Name of a customer managed policy every guardrail role (Lambdas, Scheduler) carries as its boundary."""
    restart_jobs: NotRequired[bool]
    """Re-launch `gpucluster run --restart-on-replace` jobs when a replacement brings their group back to
    size (the groups' nodes must run gpucluster's node bootstrap; default false)."""


class Guardrails(pulumi.ComponentResource):
    """Every spend guardrail of a set of Auto Scaling groups: budget, auto-stop, spot hooks, their topic.

    Guardrail roles may change only the listed groups, and only while they carry the
    `gpucluster:stack` tag with `identity`. Parts not asked for are not built: no budget
    without `budget`, no auto-stop unless `autostop.enabled`, no spot handling unless a
    group can run spot, no block-expiry stop unless a group runs on a Capacity Block.

    Groups gpucluster did not create (an EKS managed node group's ASG): set `tag_groups`, so an
    `aws.autoscaling.Tag` gives each the identity tag (the Lambdas' lookups and IAM conditions
    need it; instances launched from then on carry it, which the pre-stop and spot hooks' SSM
    permission needs). Idle auto-stop watches the GPU metric the gpucluster node bootstrap
    publishes (`nvidia_smi_utilization_gpu` by `AutoScalingGroupName` in the namespace
    `gpucluster/<cluster_name>`, the only one the node role may publish into): on nodes that do
    not publish it the alarm only notifies (missing data never stops). Python users also get
    `outputs` (what a stack exports) and the parts (`budget`, `autostop`, `spot`, `notifications`,
    `group_tags`).
    """

    notify_topic_arn: pulumi.Output[str] | None
    """The guardrail topic: what the guardrails did, budget alerts, missing GPU metrics."""
    budget_name: pulumi.Output[str] | None
    """The AWS Budgets budget (with budget)."""
    budget_action_topic_arn: pulumi.Output[str] | None
    """The topic the budget's scale-to-zero notification goes to (with budget.action_threshold_percent)."""
    function_names: pulumi.Output[dict[str, str]] | None
    """Guardrail Lambda function names: budget_action, autostop, spot_interruption, capacity_block,
    job_restart (those built)."""
    idle_alarm_names: pulumi.Output[dict[str, str]] | None
    """Group label -> its idle alarm (with autostop)."""
    schedule_names: pulumi.Output[dict[str, str]] | None
    """stop / start / lifetime -> its EventBridge Scheduler schedule (those configured)."""

    def __init__(self, name: str, args: GuardrailsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("Guardrails", name, GuardrailsModel, args, guardrails_checks)
        super().__init__(type_token("Guardrails"), name, None, component_options(opts, _old("Guardrails")))
        child = pulumi.ResourceOptions(parent=self)
        self.budget: Budget | None = None
        self.autostop: AutoStop | None = None
        self.spot: SpotInterruption | None = None
        self.report: SpendReport | None = None
        self.capacity_block: CapacityBlockExpiry | None = None
        self.job_restart: JobRestart | None = None
        self.notifications: Notifications | None = None
        self.notify_topic_arn = self.budget_name = self.budget_action_topic_arn = None
        self.function_names = self.idle_alarm_names = self.schedule_names = None
        self.group_tags: dict[str, aws.autoscaling.Tag] = {}
        if m.tag_groups:
            # pulumi-aws autoscaling.Tag docs: tags an ASG managed elsewhere (their example is an EKS
            # managed node group's). Do not use it on a group whose own program sets its tags.
            self.group_tags = {
                g.name: aws.autoscaling.Tag(
                    f"{name}-tag-{g.name}", autoscaling_group_name=g.asg_name,
                    tag={"key": STACK_TAG, "value": m.identity, "propagate_at_launch": True}, opts=child)
                for g in m.groups}
        self.outputs: dict[str, Any] = {}
        blocks = capacity_block_groups(m.groups)
        wanted = (m.budget is not None or m.autostop.enabled or uses_spot(m.groups) or bool(blocks)
                  or m.restart_jobs)
        if not wanted:
            self.register_outputs(self.outputs)
            return
        invoke = pulumi.InvokeOutputOptions(parent=self)
        account = aws.get_caller_identity_output(opts=invoke).account_id
        partition = aws.get_partition_output(opts=invoke).partition
        prefix = m.cluster_name
        self.notifications = Notifications(f"{name}-notify", m, prefix, partition, account, opts=child)
        ctx = _Context(args=m, prefix=prefix, partition=partition, account=account,
                       notify_topic_arn=self.notifications.topic.arn, key_arn=self.notifications.key.arn,
                       permissions_boundary=boundary_arn(partition, account, m.permissions_boundary)
                       if m.permissions_boundary else None)
        self.outputs["notify_topic_arn"] = self.notify_topic_arn = ctx.notify_topic_arn
        functions: dict[str, str] = {}
        if m.budget is not None:
            self.budget = Budget(f"{name}-budget", ctx, depends_on=[self.notifications.topic_policy],
                                 opts=child)
            self.budget_name = pulumi.Output.from_input(self.budget.budget_name)
            self.outputs["budget_name"] = self.budget.budget_name
            if self.budget.action_topic is not None and self.budget.function is not None:
                self.outputs["budget_action_topic_arn"] = self.budget_action_topic_arn = \
                    self.budget.action_topic.arn
                functions["budget_action"] = self.budget.function.function_name
        if m.budget is not None and m.budget.report is not None:
            self.report = SpendReport(f"{name}-report", ctx, opts=child)
            functions["report"] = self.report.function.function_name
        if m.autostop.enabled:
            self.autostop = AutoStop(f"{name}-autostop", ctx, opts=child)
            functions["autostop"] = self.autostop.function.function_name
            self.outputs["idle_alarm_names"] = {g: a.name for g, a in self.autostop.alarms.items()}
            self.outputs["schedule_names"] = {p: s.name for p, s in self.autostop.schedules.items()}
            self.idle_alarm_names = pulumi.Output.from_input(self.outputs["idle_alarm_names"])
            self.schedule_names = pulumi.Output.from_input(self.outputs["schedule_names"])
        if uses_spot(m.groups):
            self.spot = SpotInterruption(f"{name}-spot", ctx, opts=child)
            functions["spot_interruption"] = self.spot.function.function_name
        if blocks:
            # "-blocks": the handler role's auto-name fits IAM's 64 with the longest cluster name.
            self.capacity_block = CapacityBlockExpiry(f"{name}-blocks", ctx, opts=child)
            functions["capacity_block"] = self.capacity_block.function.function_name
        if m.restart_jobs:
            self.job_restart = JobRestart(f"{name}-jobs", ctx, opts=child)
            functions["job_restart"] = self.job_restart.function.function_name
        self.outputs["function_names"] = functions
        self.function_names = pulumi.Output.from_input(functions)
        self.register_outputs(self.outputs)
