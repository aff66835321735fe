"""The guardrails' state and watch: the guard-state table (`GuardState`) and the alarms on the guardrail
Lambdas themselves (`GuardrailAlarms`).

The table holds one item per node group (`lambdas.guardstate`): the stop and start decisions are
conditional writes to it, so it is protected like data (deletion protection, point-in-time recovery,
`protect=True`, encrypted with the stack's own KMS key). Its name is derived from the identity
(`lambdas.handlers.state_table_name`), so `gpucluster` finds it without reading stack outputs. The
alarms make a guardrail that fails reach a person: Errors and Throttles of each function, and
DestinationDeliveryFailures (the on-failure destination could not be reached), to the notify topic.
It must never delete anything and never grant a delete.
"""

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import type_token
from gpucluster.aws.guardrail_lambda import GuardrailContext

# STATE_ACTIONS: the calls `lambdas.guardstate` makes (no DeleteItem, no Scan, no UpdateItem: a
# transition is a conditional PutItem of the whole record).
from gpucluster.fleet.deployment import STATE_ACTIONS, STATE_TABLE_ENV, state_table_name

# A customer managed key on a DynamoDB table: the principals reading and writing the table use the key
# through DynamoDB only (DynamoDB developer guide, "How Amazon DynamoDB uses AWS KMS", "Authorizing use
# of your customer managed key", kms:ViaService dynamodb.<region>.amazonaws.com). kms:CreateGrant and
# kms:ReEncrypt* are for whoever creates the table or changes its key (the deploy role), not for these.
STATE_KEY_ACTIONS = ("kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey*")
# The Lambda metrics a failing guardrail shows in (Lambda developer guide, "Types of metrics for
# Lambda functions": Errors, Throttles; DestinationDeliveryFailures for asynchronous invocation).
FUNCTION_ALARM_METRICS = ("Errors", "Throttles", "DestinationDeliveryFailures")


def state_statements(ctx: GuardrailContext, table_arn: pulumi.Input[str]) -> list[dict[str, Any]]:
    """Read and conditionally write this stack's items of the guard-state table, nothing else.

    dynamodb:LeadingKeys limits the partition key to the stack's identity (DynamoDB developer
    guide, "Using IAM policy conditions for fine-grained access control"): even a table shared
    by mistake would not let a role touch another stack's items.
    """
    return [
        {"Sid": "GuardStateOfThisStack", "Effect": "Allow", "Action": list(STATE_ACTIONS),
         "Resource": [table_arn],
         "Condition": {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [ctx.identity]}}},
        {"Sid": "GuardStateKeyThroughDynamoDB", "Effect": "Allow", "Action": list(STATE_KEY_ACTIONS),
         "Resource": [ctx.key_arn],
         "Condition": {"StringEquals": {"kms:ViaService": f"dynamodb.{ctx.region}.amazonaws.com"}}},
    ]


def with_state(ctx: GuardrailContext, environment: dict[str, pulumi.Input[str]]) -> list[dict[str, Any]]:
    """Name the table to a stopping handler (GUARD_STATE_TABLE) and give it the statements to use it."""
    if ctx.state_table_arn is None:
        return []
    environment[STATE_TABLE_ENV] = state_table_name(ctx.identity)
    return state_statements(ctx, ctx.state_table_arn)


class GuardState(pulumi.ComponentResource):
    """The guard-state table: one item per node group (key: stack identity, Auto Scaling group name)."""

    def __init__(self, name: str, *, identity: str, key_arn: pulumi.Input[str], tags: Mapping[str, str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("GuardState"), name, None, opts)
        self.table_name = state_table_name(identity)
        self.table = aws.dynamodb.Table(
            f"{name}-table", name=self.table_name, billing_mode="PAY_PER_REQUEST",
            hash_key="stack", range_key="group",
            attributes=[{"name": "stack", "type": "S"}, {"name": "group", "type": "S"}],
            server_side_encryption={"enabled": True, "kms_key_arn": key_arn},
            point_in_time_recovery={"enabled": True},
            deletion_protection_enabled=True, tags=dict(tags),
            # The record of who stopped what and the capacity to give back: never deleted by a deploy.
            opts=pulumi.ResourceOptions(parent=self, protect=True))
        self.register_outputs({"table_name": self.table_name, "table_arn": self.table.arn})


class GuardrailAlarms(pulumi.ComponentResource):
    """Errors, Throttles and DestinationDeliveryFailures of each guardrail function -> the notify topic.

    Any one in a minute alarms (treat missing data as not breaching: a function that did not run
    did not fail). A failed invocation also reaches the topic through its on-failure destination;
    these reach a person when that destination itself fails, or when Lambda throttles the function.
    """

    def __init__(self, name: str, ctx: GuardrailContext, functions: Mapping[str, str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("GuardrailAlarms"), name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.alarms: dict[str, aws.cloudwatch.MetricAlarm] = {}
        for module, function_name in sorted(functions.items()):
            for metric in FUNCTION_ALARM_METRICS:
                key = f"{module}-{metric}"
                self.alarms[key] = aws.cloudwatch.MetricAlarm(
                    f"{name}-{module.replace('_', '-')}-{metric.lower()}",
                    name=f"{function_name}-{metric}",
                    alarm_description=f"gpucluster {ctx.identity}: guardrail {module} {metric}: it may not "
                                      "have stopped, started or told what it should (see its log group)",
                    namespace="AWS/Lambda", metric_name=metric, dimensions={"FunctionName": function_name},
                    statistic="Sum", period=60, evaluation_periods=1, threshold=0,
                    comparison_operator="GreaterThanThreshold", treat_missing_data="notBreaching",
                    alarm_actions=[ctx.notify_topic_arn], tags=ctx.tags, opts=child)
        self.register_outputs({"alarm_names": {k: a.name for k, a in self.alarms.items()}})
