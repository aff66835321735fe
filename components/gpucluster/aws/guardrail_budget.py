"""The guardrails' spend side: the encrypted notify topic (`Notifications`), the monthly budget with
its alerts and scale-to-zero action (`Budget`), and the periodic spend report (`SpendReport`).

Budgets counts only costs carrying the stack's activated cost-allocation tag, so the budget filters
on the identity. It must never delete anything: the budget Lambda scales groups to zero.
"""

from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import GuardrailsModel, component_options, owned_tags, type_token
from gpucluster.aws.guardrail_lambda import (
    BASE_TIMEOUT_SECONDS,
    GuardrailContext,
    GuardrailFunction,
    describe_statement,
    old_type,
    policy_document,
    publish_statements,
    rule_invokes,
    scaling_statements,
)
from gpucluster.aws.guardrail_state import with_state
from gpucluster.fleet.tags import STACK_TAG
from gpucluster.noderole import gpu_metric_namespace
from gpucluster.spec import BudgetConfig

# budget.report: Mondays, or the month's last day (EventBridge cron `L`), 08:00 UTC; the days
# before are in Cost Explorer by then.
REPORT_EXPRESSIONS = {"weekly": "cron(0 8 ? * MON *)", "monthly": "cron(0 8 L * ? *)"}
# Cost Explorer's GetCostAndUsage / GetCostForecast and CloudWatch's GetMetricData list no
# resource types (Service Authorization Reference): "*" only, like the describe calls.
SPEND_READ_ACTIONS = ("ce:GetCostAndUsage", "ce:GetCostForecast", "cloudwatch:GetMetricData")
REPORT_TIMEOUT_SECONDS = 300


def usd(amount: float) -> str:
    """A budget limit as AWS Budgets takes it: 500.0 -> '500', 2.5 -> '2.50'."""
    return str(int(amount)) if float(amount).is_integer() else f"{amount:.2f}"


def tag_cost_filter(stack: str) -> "aws.budgets.BudgetCostFilterArgsDict":
    """Cost filter on the stack's cost-allocation tag: `user:<key>$<value>` (AWS Budgets API)."""
    return {"name": "TagKeyValue", "values": [f"user:{STACK_TAG}${stack}"]}


def budget_notifications(
        budget: BudgetConfig, notify_topic_arn: pulumi.Input[str],
        action_topic_arn: pulumi.Input[str] | None) -> "list[aws.budgets.BudgetNotificationArgsDict]":
    """One ACTUAL notification per distinct threshold and a FORECASTED one at 100 %.

    Every notification e-mails `budget.emails`. A notification has one SNS
    subscriber at most (Budgets API, "NotificationWithSubscribers"): the action
    threshold's goes to the action topic, which only the budget Lambda listens
    to, so lower thresholds never stop anything; the rest go to the notify topic.
    """
    action = budget.action_threshold_percent if action_topic_arn is not None else None
    thresholds = sorted(set(budget.alert_thresholds_percent) | ({action} if action else set()))

    def notification(kind: str, threshold: float,
                     topic: pulumi.Input[str]) -> "aws.budgets.BudgetNotificationArgsDict":
        entry: aws.budgets.BudgetNotificationArgsDict = {
            "notification_type": kind, "comparison_operator": "GREATER_THAN",
            "threshold": threshold, "threshold_type": "PERCENTAGE",
            "subscriber_sns_topic_arns": [topic],
        }
        if budget.emails:
            entry["subscriber_email_addresses"] = list(budget.emails)
        return entry

    # `action` is set only with an action topic: its threshold notifies that topic.
    notes = [notification("ACTUAL", t, action_topic_arn
                          if t == action and action_topic_arn is not None else notify_topic_arn)
             for t in thresholds]
    notes.append(notification("FORECASTED", 100, notify_topic_arn))
    return notes



def topic_key_policy(partition: str, account: str) -> str:
    """Key policy for the guardrail topics' KMS key.

    The AWS-managed key alias/aws/sns cannot be used: its policy cannot be changed,
    and AWS Budgets and CloudWatch alarms publish to an encrypted topic only when
    the key policy lets their service principals use the key (SNS developer
    guide, "Enable compatibility between event sources from AWS services and
    encrypted topics"). Only on this account's behalf (aws:SourceAccount: the SNS
    guide's confused-deputy guidance), like the topic policy's publish statements.
    """
    return policy_document([
        {"Sid": "AccountAdministersThroughIam", "Effect": "Allow",
         "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"}, "Action": "kms:*", "Resource": "*"},
        {"Sid": "ServicesPublishToEncryptedTopics", "Effect": "Allow",
         "Principal": {"Service": ["budgets.amazonaws.com", "cloudwatch.amazonaws.com"]},
         "Action": ["kms:GenerateDataKey*", "kms:Decrypt"], "Resource": "*",
         "Condition": {"StringEquals": {"aws:SourceAccount": account}}},
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



class Notifications(pulumi.ComponentResource):
    """The stack's guardrail topic (KMS-encrypted), e-mail subscriptions: notify_emails, then budget.emails.

    Guardrail Lambdas report what they stopped here, idle alarms report missing
    data here, and budget alerts below the action threshold arrive here.
    """

    def __init__(self, name: str, args: GuardrailsModel, prefix: str, partition: pulumi.Output[str],
                 account: pulumi.Output[str], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("Notifications"), name, None,
                         component_options(opts, old_type("Notifications")))
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
        emails = dict.fromkeys([*args.notify_emails, *(args.budget.emails if args.budget else [])])
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

    def __init__(self, name: str, ctx: GuardrailContext, depends_on: Sequence[pulumi.Resource],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("Budget"), name, None, component_options(opts, old_type("Budget")))
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
            environment = ctx.environment()
            self.function = GuardrailFunction(
                f"{name}-handler", ctx, module="budget_action", function_name=f"{ctx.prefix}-budget-action",
                timeout=BASE_TIMEOUT_SECONDS,
                environment=environment,
                statements=[
                    describe_statement(["autoscaling:DescribeAutoScalingGroups"]),
                    *scaling_statements(ctx.asg_arns, ctx.identity, delete_tags=False),
                    *with_state(ctx, environment),
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



class SpendReport(pulumi.ComponentResource):
    """budget.report: a weekly or monthly rule invoking the read-only spend report Lambda.

    The Lambda reads Cost Explorer (the stack's tag) and the GPU metrics, and publishes
    spend so far, the forecast against the budget, idle waste and the top group to the
    notify topic. Its role can read and publish, nothing else.
    """

    def __init__(self, name: str, ctx: GuardrailContext, opts: pulumi.ResourceOptions | None = None) -> None:
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
        rule_invokes(name, self.rule, self.function.function, child)
        self.register_outputs({"function_name": self.function.function_name, "rule_name": self.rule.name})
