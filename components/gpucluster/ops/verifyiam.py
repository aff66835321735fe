"""What a guardrail handler calls, on which of the stack's resources; IAM's policy simulator asked about it.

It owns, for `ops.verify`: each handler's calls as (action, resource ARN, context) triples, from the
handler's action table (`fleet.deployment.IAM_ACTIONS`, `PCS_IAM_ACTIONS` on a Slurm stack) and its
deployed environment (topic, guard-state table, run log group, PCS cluster), plus the calls AWS makes
on its behalf with its credentials (writing its log stream; KMS for the encrypted topic and table);
and `simulate`, which asks `iam:SimulatePrincipalPolicy` about them, grouped by resource and context.
The simulator evaluates the role's identity policies, its permissions boundary and the Organization's
SCPs (IAM API reference, SimulatePrincipalPolicy); it does not evaluate resource policies unless given
one, so a KMS key policy that does not delegate to IAM is not seen (the stack's keys do delegate).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucluster.fleet.deployment import IAM_ACTIONS, PCS_CLUSTER_ENV, PCS_IAM_ACTIONS, STATE_TABLE_ENV
from gpucluster.fleet.jobnames import jobs_parameter_path
from gpucluster.fleet.runcommand import RUN_SHELL_DOCUMENT
from gpucluster.fleet.tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP, STACK_TAG, STATE_TAGS

Context = Mapping[str, str | Sequence[str]]
Call = tuple[str, str, Context]
"""(IAM action, resource ARN or "*", the request's condition keys)."""

# Auto Scaling writes, authorised on a group while it carries the stack's tag (aws/guardrail_lambda.py).
SCALING_WRITES = ("autoscaling:UpdateAutoScalingGroup", "autoscaling:CreateOrUpdateTags",
                  "autoscaling:DeleteTags")
TAG_WRITES = ("autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags")
# What the Lambda service does with the function's role: write its log stream (Lambda developer guide,
# "Using CloudWatch Logs with Lambda").
LOG_ACTIONS = ("logs:CreateLogStream", "logs:PutLogEvents")
# Publishing to a KMS-encrypted topic (SNS developer guide, "Key management": the publisher needs
# kms:GenerateDataKey* and kms:Decrypt on the key).
TOPIC_KEY_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")
# What DynamoDB calls on the caller's behalf for a table under a customer managed key (DynamoDB developer
# guide, "How Amazon DynamoDB uses AWS KMS"; ledger: dynamodb-kms-calls):
# kms:Decrypt to use the table key, kms:GenerateDataKey for new data keys, through dynamodb.<region>.
TABLE_KEY_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey")
# The hook a handler runs only when the stack names its command (its environment then holds it).
HOOK_ENV = {"autostop": "PRE_STOP_COMMAND", "capacity_block": "PRE_STOP_COMMAND",
            "spot_interruption": "INTERRUPTION_COMMAND"}
HOOK_ACTIONS = ("ssm:SendCommand", "ssm:GetCommandInvocation")
# A placeholder instance: SendCommand's grant is by tag on instance/*, the id does not matter.
ANY_INSTANCE = "i-00000000000000000"
# Simulator answers: at most 1000 results a page (IAM API reference, MaxItems).
MAX_ITEMS = 1000


@dataclass(frozen=True)
class Account:
    """Where the stack is: what every ARN is built from, and who asks."""

    partition: str
    region: str
    account: str
    caller: str

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        return (f"arn:{self.partition}:{service}:{self.region if region else ''}:"
                f"{self.account if account else ''}:{resource}")


@dataclass(frozen=True)
class Denied:
    """A call the simulator refuses, and why (no Allow, an explicit Deny, an SCP, the boundary)."""

    action: str
    resource: str
    why: str

    def __str__(self) -> str:
        where = "" if self.resource == "*" else f" on {self.resource}"
        return f"{self.action}{where} ({self.why})"


def handler_actions(module: str, environment: Mapping[str, str], *, starts_groups: bool) -> list[str]:
    """The actions `module` calls as this stack deployed it: `IAM_ACTIONS` less what only some stacks ask
    for (a hook command, a maximum lifetime, a start schedule: aws/guardrail_events.py grants them only
    then), with the PCS actions instead of Auto Scaling's on a Slurm stack (PCS_CLUSTER_ID set)."""
    actions = list(IAM_ACTIONS[module])
    if module in HOOK_ENV and not environment.get(HOOK_ENV[module]):
        actions = [a for a in actions if a not in HOOK_ACTIONS]
    if module == "autostop":
        if not environment.get("MAX_LIFETIME_HOURS"):
            actions.remove("ec2:DescribeInstances")
        if not starts_groups:
            actions.remove("autoscaling:DeleteTags")
    if environment.get(PCS_CLUSTER_ENV):
        actions = [a for a in actions if not a.startswith("autoscaling:")]
        actions += [a for a in PCS_IAM_ACTIONS.get(module, ()) if a not in actions]
    return actions


def guardrail_calls(module: str, function: str, environment: Mapping[str, str], account: Account,
                    identity: str, clients: Callable[[str], Any], asg_arns: Callable[[], list[str]],
                    *, starts_groups: bool) -> tuple[list[Call], list[str]]:
    """Every call handler `module` (Lambda function `function`) makes with its role, and what could not
    be turned into a call (caveats).

    `environment` is the deployed function's: it names the topic, the guard-state table, the run log
    group and, on a Slurm stack, the PCS cluster (then the handler acts on PCS groups, not Auto Scaling).
    `asg_arns`: the groups it scales; `starts_groups`: the stack has a start schedule (autostop).
    """
    pcs_cluster = environment.get(PCS_CLUSTER_ENV)
    actions = handler_actions(module, environment, starts_groups=starts_groups)
    calls: list[Call] = []
    caveats: list[str] = []
    calls += function_log_calls(account, function)
    for action in actions:
        targets = _targets(action, environment, account, identity, clients, asg_arns, pcs_cluster)
        if isinstance(targets, str):
            caveats.append(targets)
            continue
        calls += targets
    topic = environment.get("NOTIFY_TOPIC_ARN")
    if topic and "sns:Publish" in actions:
        key = _topic_key(clients, topic)
        calls += [(a, key, {}) for a in TOPIC_KEY_ACTIONS] if key else []
    table = environment.get(STATE_TABLE_ENV)
    if table and any(a.startswith("dynamodb:") for a in actions):
        key = clients("dynamodb").describe_table(TableName=table)["Table"].get(
            "SSEDescription", {}).get("KMSMasterKeyArn")
        via = {"kms:ViaService": f"dynamodb.{account.region}.amazonaws.com"}
        calls += [(a, str(key), via) for a in TABLE_KEY_ACTIONS] if key else []
    unique = sorted({(a, r, _frozen(c)) for a, r, c in calls}, key=lambda c: (c[1], c[0]))
    return unique, sorted(set(caveats))


def function_log_calls(account: Account, function: str) -> list[Call]:
    """Writing the function's own log stream, which Lambda does with the function's role."""
    stream = account.arn("logs", f"log-group:/aws/lambda/{function}:log-stream:verify")
    return [(a, stream, {}) for a in LOG_ACTIONS]


def _frozen(context: Context) -> Any:
    return tuple(sorted((k, tuple(v) if isinstance(v, list | tuple) else v) for k, v in context.items()))


def _topic_key(clients: Callable[[str], Any], topic: str) -> str | None:
    """The ARN of the key the topic is encrypted with (None: not encrypted)."""
    key = clients("sns").get_topic_attributes(TopicArn=topic)["Attributes"].get("KmsMasterKeyId")
    if not key:
        return None
    return str(clients("kms").describe_key(KeyId=key)["KeyMetadata"]["Arn"])


def _targets(action: str, environment: Mapping[str, str], account: Account, identity: str,
             clients: Callable[[str], Any], asg_arns: Callable[[], list[str]],
             pcs_cluster: str | None) -> list[Call] | str:
    """The (resource, context) pairs `action` is made on, or why they are not known (a caveat)."""
    if action in SCALING_WRITES:
        groups = asg_arns()
        if not groups:
            return (f"no Auto Scaling group tagged {STACK_TAG}={identity} was found, so {action} was "
                    "not simulated")
        context: dict[str, str | list[str]] = {f"autoscaling:ResourceTag/{STACK_TAG}": identity}
        if action in TAG_WRITES:
            context["aws:TagKeys"] = list(STATE_TAGS)
        return [(action, arn, context) for arn in groups]
    if action == "ssm:SendCommand":
        tags: dict[str, str | list[str]] = {f"ssm:resourceTag/{STACK_TAG}": identity}
        if pcs_cluster:  # the Slurm commands go to the login node only
            tags[f"ssm:resourceTag/{NODE_GROUP_TAG}"] = SLURM_LOGIN_GROUP
        return [(action, account.arn("ssm", f"document/{RUN_SHELL_DOCUMENT}", account=False), {}),
                (action, account.arn("ec2", f"instance/{ANY_INSTANCE}"), tags)]
    if action == "sns:Publish":
        topic = environment.get("NOTIFY_TOPIC_ARN")
        if not topic:
            return "the function has no NOTIFY_TOPIC_ARN: sns:Publish not simulated"
        return [(action, topic, {})]
    if action.startswith("dynamodb:"):
        table = environment.get(STATE_TABLE_ENV)
        if not table:
            return f"the function has no {STATE_TABLE_ENV}: the guard-state calls were not simulated"
        return [(action, account.arn("dynamodb", f"table/{table}"), {"dynamodb:LeadingKeys": [identity]})]
    if action == "ssm:GetParametersByPath":
        return [(action, account.arn("ssm", f"parameter{jobs_parameter_path(identity)}"), {})]
    if action == "ssm:PutParameter":
        return [(action, account.arn("ssm", f"parameter{jobs_parameter_path(identity)}/verify"), {})]
    if action == "logs:FilterLogEvents":
        group = environment.get("RUN_LOG_GROUP")
        if not group:
            return "the function has no RUN_LOG_GROUP: logs:FilterLogEvents not simulated"
        return [(action, account.arn("logs", f"log-group:{group}:*"), {})]
    if action.startswith("pcs:") and pcs_cluster:
        cluster = account.arn("pcs", f"cluster/{pcs_cluster}")
        if action == "pcs:ListComputeNodeGroups":
            return [(action, cluster, {})]
        pages = clients("pcs").get_paginator("list_compute_node_groups").paginate(
            clusterIdentifier=pcs_cluster)
        groups = [str(g["arn"]) for page in pages for g in page.get("computeNodeGroups", [])
                  if g.get("name") != SLURM_LOGIN_GROUP]
        if not groups:
            return f"the PCS cluster has no compute node group: {action} not simulated"
        return [(action, arn, {}) for arn in groups]
    return [(action, "*", {})]  # reads with no resource type (fleet.deployment's comment)


def simulate(iam: Any, role_arn: str, calls: Sequence[tuple[str, str, Any]]) -> list[Denied]:
    """The calls IAM's policy simulator refuses `role_arn`; one request per resource and context."""
    grouped: dict[tuple[str, Any], list[str]] = defaultdict(list)
    for action, resource, context in calls:
        frozen = context if isinstance(context, tuple) else _frozen(context)
        grouped[(resource, frozen)].append(action)
    denied: list[Denied] = []
    for (resource, frozen), actions in grouped.items():
        request: dict[str, Any] = {"PolicySourceArn": role_arn, "ActionNames": sorted(set(actions)),
                                   "ResourceArns": [resource], "MaxItems": MAX_ITEMS}
        if frozen:
            request["ContextEntries"] = [_entry(key, value) for key, value in frozen]
        while True:
            answer = iam.simulate_principal_policy(**request)
            denied += [Denied(r["EvalActionName"], resource, _why(r))
                       for r in answer.get("EvaluationResults", []) if r.get("EvalDecision") != "allowed"]
            if not answer.get("IsTruncated"):
                break
            request["Marker"] = answer["Marker"]
    return denied


def _entry(key: str, value: Any) -> dict[str, Any]:
    values = list(value) if isinstance(value, tuple) else [value]
    kind = "stringList" if isinstance(value, tuple) else "string"
    return {"ContextKeyName": key, "ContextKeyValues": values, "ContextKeyType": kind}


def _why(result: Mapping[str, Any]) -> str:
    if result.get("OrganizationsDecisionDetail", {}).get("AllowedByOrganizations") is False:
        return "an SCP of the Organization"
    if result.get("PermissionsBoundaryDecisionDetail", {}).get("AllowedByPermissionsBoundary") is False:
        return "the permissions boundary"
    decision = str(result.get("EvalDecision", "implicitDeny"))
    missing = result.get("MissingContextValues") or []
    more = f"; the simulator lacked {', '.join(missing)}" if missing else ""
    return ("an explicit Deny" if decision == "explicitDeny" else "no statement allows it") + more
