"""The guardrail Lambdas: their code (packaged from `components/gpucluster/lambdas`), one function
each with its own log group and least-privilege role (`GuardrailFunction`), the IAM statements those
roles are built from, and what every guardrail part is handed (`GuardrailContext`).

It must never grant a delete: every statement here scales, tags the stop state, runs a hook on
this stack's instances, reads, or publishes. It builds no trigger (rules, alarms, schedules live
with the part they drive, in `guardrail_budget` and `guardrail_events`).
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import GuardrailsModel, component_options, owned_tags, type_token
from gpucluster.fleet.deployment import (
    HANDLERS,
    PCS_ACTIONS,
    PCS_ACTIVE_WAIT_SECONDS,
    PCS_CLUSTER_ENV,
    PCS_IAM_ACTIONS,
    PCS_UPDATE_DESCRIBES,
)

# STATE_TAGS: what the Lambdas write on a group they stop; the others select a Slurm stack's login node.
from gpucluster.fleet.tags import NODE_GROUP_TAG, SLURM_LOGIN_GROUP, STACK_TAG, STATE_TAGS
from gpucluster.noderole import PCS_IAM_PATH

LAMBDA_DIR = Path(__file__).resolve().parent.parent / "lambdas"
FLEET_DIR = Path(__file__).resolve().parent.parent / "fleet"
# The handlers are zipped as the package `lambdas`; the core they call as `gpucluster/fleet/` (its
# modules import each other relatively, the handlers import it as `gpucluster.fleet`).
LAMBDA_PACKAGE = "lambdas"
FLEET_PACKAGE = "gpucluster/fleet"
# The archive's own `gpucluster/__init__.py`: the installed one lists the Pulumi components, which a
# Lambda has no use for (they load lazily, but the archive carries nothing of gpucluster but the core).
ARCHIVE_PACKAGE_INIT = '"""gpucluster in a guardrail Lambda: only its fleet core (gpucluster.fleet)."""\n'
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
RUN_SHELL_DOCUMENT = "AWS-RunShellScript"
# AWS PCS's service principal: node roles are passed only to it ("Using service-linked roles for AWS PCS").
PCS_SERVICE = "pcs.amazonaws.com"
# What PCS launches for a node group, so what the launch and tag grants name (EC2 resource types of
# RunInstances and CreateFleet, Service Authorization Reference; cfn-lint's bundled IAM data): created in
# the request, so scoped by the stack tag the request carries...
PCS_LAUNCHED = ("instance", "volume", "network-interface", "fleet")
# ...what a launch uses that the stack always makes and tags (its launch templates, security groups,
# placement groups), scoped by the tag they carry...
PCS_LAUNCH_FROM = ("launch-template", "security-group", "placement-group")
# ...and what it uses that may not be the stack's: the AMI (AWS's or a baked one) and its snapshots, and
# the subnets (an existing VPC's carry no stack tag). Using one changes nothing of it.
PCS_LAUNCH_UNTAGGED = ("image", "snapshot", "subnet")


def old_type(component: str) -> str:
    """A guardrail component's type token before 0.2 (aliased, so existing stacks keep their URNs)."""
    return f"gpucluster:guardrails:{component}"



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




@dataclass(frozen=True)
class PcsGuard:
    """A Slurm stack's PCS cluster, as the guardrails need it (from `GpuCluster.pcs`)."""

    cluster_id: pulumi.Input[str]
    cluster_arn: pulumi.Input[str]
    node_group_ids: Mapping[str, pulumi.Input[str]]
    """gpucluster node group -> PCS compute node group id; the login group's is left out (never stopped)."""


def without_auto_scaling(statements: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """`statements` less those granting only Auto Scaling actions (on a Slurm stack, PCS runs the nodes)."""
    def actions(st: Mapping[str, Any]) -> list[str]:
        a = st.get("Action", [])
        return [a] if isinstance(a, str) else list(a)
    return [st for st in statements if not all(a.startswith("autoscaling:") for a in actions(st))]


def pcs_statements(ctx: "GuardrailContext", pcs: PcsGuard, *, scale: bool = True) -> list[dict[str, Any]]:
    """Read and scale only this stack's PCS node groups; hold and release partitions on its login node.

    PCS resource ARNs (Service Authorization Reference, AWS PCS; ledger: pcs-arn-formats:
    cluster `arn:${Partition}:pcs:${Region}:${Account}:cluster/${ClusterId}`, compute node group
    `.../cluster/${ClusterId}/computenodegroup/${ComputeNodeGroupId}`): ListComputeNodeGroups is
    on the cluster, Get/UpdateComputeNodeGroup on the node group (the cluster ARN is listed with
    them too, in case the service also authorises them on the cluster). The login group's ARN is
    not listed: no guardrail can change it. With `scale`, also what PCS may check of the caller on an
    update (`pcs_update_statements`); without it (the spot handler) only the login-node statements.
    """
    groups = [pulumi.Output.concat(pcs.cluster_arn, "/computenodegroup/", gid)
              for name, gid in sorted(pcs.node_group_ids.items()) if name != SLURM_LOGIN_GROUP]
    document = pulumi.Output.concat("arn:", ctx.partition, ":ssm:", ctx.region, "::document/",
                                    RUN_SHELL_DOCUMENT)
    instances = pulumi.Output.concat("arn:", ctx.partition, ":ec2:", ctx.region, ":", ctx.account,
                                     ":instance/*")
    login = {"StringEquals": {f"ssm:resourceTag/{STACK_TAG}": ctx.identity,
                              f"ssm:resourceTag/{NODE_GROUP_TAG}": SLURM_LOGIN_GROUP}}
    scaling = [
        {"Sid": "PcsListThisCluster", "Effect": "Allow", "Action": ["pcs:ListComputeNodeGroups"],
         "Resource": [pcs.cluster_arn]},
        {"Sid": "PcsScaleThisClustersGroups", "Effect": "Allow",
         "Action": sorted(a for a in PCS_ACTIONS if a != "pcs:ListComputeNodeGroups"),
         "Resource": [pcs.cluster_arn, *groups]},
    ]
    return [
        *([*scaling, *pcs_update_statements(ctx)] if scale else []),
        # The login node: found by its tags (DescribeInstances lists no resource types), sent the
        # Slurm commands only while it carries this stack's tag and the login group's.
        {"Sid": "PcsFindLoginNode", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "ssm:GetCommandInvocation"], "Resource": "*"},
        {"Sid": "PcsLoginShellDocument", "Effect": "Allow", "Action": ["ssm:SendCommand"],
         "Resource": [document]},
        {"Sid": "PcsOnThisStacksLoginNode", "Effect": "Allow", "Action": ["ssm:SendCommand"],
         "Resource": [instances], "Condition": login},
    ]


def pcs_update_statements(ctx: "GuardrailContext") -> list[dict[str, Any]]:
    """What the PCS guide's minimum permissions list for UpdateComputeNodeGroup besides the pcs: action
    (`deployment.PCS_UPDATE_CHECKS`), each scoped to this stack.

    Pass only the stack's node roles (under /aws-pcs/, named from the cluster: `noderole.PCS_IAM_PATH`) and
    only to PCS; read only their instance profiles; launch and tag only with this stack's tag in the request
    (tags only as the launch creates them: ec2:CreateAction), from the stack's own tagged launch templates,
    security groups and placement groups, with any image, snapshot and subnet of the account
    (PCS_LAUNCH_UNTAGGED); the describes on "*" (no resource types). Whether PCS checks any of these on a
    scaling-only update is unverified (ledger: pcs-update-permissions): if it does not, they go unused.
    """
    iam = pulumi.Output.concat("arn:", ctx.partition, ":iam::", ctx.account)
    ec2 = pulumi.Output.concat("arn:", ctx.partition, ":ec2:", ctx.region, ":", ctx.account)
    images = pulumi.Output.concat("arn:", ctx.partition, ":ec2:", ctx.region, ":")  # AMIs: no account
    path, named = PCS_IAM_PATH.strip("/"), f"{ctx.args.cluster_name}-*"
    requested = {f"aws:RequestTag/{STACK_TAG}": ctx.identity}
    launch = ["ec2:CreateFleet", "ec2:RunInstances"]
    return [
        {"Sid": "PcsPassThisStacksNodeRoles", "Effect": "Allow", "Action": ["iam:PassRole"],
         "Resource": [pulumi.Output.concat(iam, f":role/{path}/{named}")],
         "Condition": {"StringEquals": {"iam:PassedToService": PCS_SERVICE}}},
        {"Sid": "PcsReadThisStacksNodeProfiles", "Effect": "Allow", "Action": ["iam:GetInstanceProfile"],
         "Resource": [pulumi.Output.concat(iam, f":instance-profile/{path}/{named}")]},
        {"Sid": "PcsLaunchTaggedWithThisStack", "Effect": "Allow", "Action": launch,
         "Resource": [pulumi.Output.concat(ec2, f":{kind}/*") for kind in PCS_LAUNCHED],
         "Condition": {"StringEquals": requested}},
        {"Sid": "PcsTagOnlyAtLaunch", "Effect": "Allow", "Action": ["ec2:CreateTags"],
         "Resource": [pulumi.Output.concat(ec2, f":{kind}/*") for kind in PCS_LAUNCHED],
         "Condition": {"StringEquals": {**requested, "ec2:CreateAction": ["CreateFleet", "RunInstances"]}}},
        {"Sid": "PcsLaunchFromThisStacks", "Effect": "Allow", "Action": launch,
         "Resource": [pulumi.Output.concat(ec2, f":{kind}/*") for kind in PCS_LAUNCH_FROM],
         "Condition": {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": ctx.identity}}},
        {"Sid": "PcsLaunchWithImagesAndSubnets", "Effect": "Allow", "Action": launch,
         "Resource": [pulumi.Output.concat(ec2 if kind == "subnet" else images, f":{kind}/*")
                      for kind in PCS_LAUNCH_UNTAGGED]},
        {"Sid": "PcsUpdateDescribes", "Effect": "Allow", "Action": sorted(PCS_UPDATE_DESCRIBES),
         "Resource": "*"},
    ]


def json_output(value: Any) -> pulumi.Output[str]:
    """JSON text of a structure that may hold Outputs anywhere inside."""
    return pulumi.Output.from_input(value).apply(lambda v: json.dumps(v, sort_keys=True))


def policy_output(statements: Sequence[Mapping[str, Any]]) -> pulumi.Output[str]:
    return pulumi.Output.from_input(list(statements)).apply(policy_document)


def lambda_sources() -> dict[str, Path]:
    """Every `*.py` of the handlers and of the fleet core, by its path in the archive, and nothing else.

    Listed file by file rather than zipping the directories, so `__pycache__`, `*.pyc` and other
    build noise left by a local test run never change the archive: the same sources give the same
    archive, and a second `pulumi up` with nothing changed updates no function.
    """
    return {f"{package}/{path.name}": path
            for package, folder in ((LAMBDA_PACKAGE, LAMBDA_DIR), (FLEET_PACKAGE, FLEET_DIR))
            for path in sorted(folder.glob("*.py"))}


def lambda_code() -> pulumi.AssetArchive:
    """The handlers as package `lambdas` (handler `lambdas.<module>.handler`) beside `gpucluster.fleet`."""
    assets: dict[str, pulumi.Asset | pulumi.Archive] = {
        name: pulumi.FileAsset(str(path)) for name, path in lambda_sources().items()}
    assets["gpucluster/__init__.py"] = pulumi.StringAsset(ARCHIVE_PACKAGE_INIT)
    return pulumi.AssetArchive(dict(sorted(assets.items())))


@dataclass(frozen=True)
class GuardrailContext:
    """What every guardrail part needs: the checked args, names, identity and the notify topic."""

    args: GuardrailsModel
    prefix: str
    partition: pulumi.Output[str]
    account: pulumi.Output[str]
    notify_topic_arn: pulumi.Output[str]
    key_arn: pulumi.Output[str]
    permissions_boundary: pulumi.Output[str] | None = None
    """ARN of the boundary every guardrail role carries (GuardrailsArgs.permissions_boundary)."""
    state_table_arn: pulumi.Output[str] | None = None
    """The guard-state table (`guardrail_state.GuardState`) the stopping handlers keep their state in."""
    pcs: PcsGuard | None = None
    """A Slurm stack's PCS cluster: the stopping handlers act on its node groups (None: Auto Scaling)."""

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


def hook_statements(ctx: GuardrailContext, environment: dict[str, pulumi.Input[str]], describe: list[str],
                    var: str, command: str | None, timeout_seconds: int) -> list[dict[str, Any]]:
    """Hand a hook command to a handler (`<var>_COMMAND`, `<var>_TIMEOUT_SECONDS`) and let it run it."""
    if not command:
        return []
    environment[f"{var}_COMMAND"] = command
    environment[f"{var}_TIMEOUT_SECONDS"] = str(timeout_seconds)
    describe.append("ssm:GetCommandInvocation")
    return run_command_statements(ctx.partition, ctx.region, ctx.account, ctx.identity)


class GuardrailFunction(pulumi.ComponentResource):
    """One guardrail Lambda with its own log group (with retention) and least-privilege role.

    The role may write only to the function's log group and do what
    `statements` allow; failed async invocations (after Lambda's retries) are
    published to the notify topic, so a guardrail that could not act is never silent.
    """

    function: aws.lambda_.Function

    def __init__(self, name: str, ctx: GuardrailContext, *, module: str, function_name: str, timeout: int,
                 environment: Mapping[str, pulumi.Input[str]], statements: Sequence[Mapping[str, Any]],
                 max_event_age_seconds: int | None = None, retries: int | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("GuardrailFunction"), name, None,
                         component_options(opts, old_type("GuardrailFunction")))
        if timeout > LAMBDA_MAX_TIMEOUT_SECONDS:
            raise ValueError(f"{function_name}: timeout {timeout}s exceeds Lambda's 900 s")
        child = pulumi.ResourceOptions(parent=self)
        self.function_name = function_name
        if ctx.pcs is not None and module in PCS_IAM_ACTIONS:
            environment = {**environment, PCS_CLUSTER_ENV: ctx.pcs.cluster_id}
            scale = any(a.startswith("pcs:") for a in PCS_IAM_ACTIONS[module])
            if scale:  # time to wait out a node group UPDATING (`pcsgroups.PcsCapacity`)
                timeout = min(timeout + PCS_ACTIVE_WAIT_SECONDS, LAMBDA_MAX_TIMEOUT_SECONDS)
            # A Slurm stack has no Auto Scaling group: its statements would name PCS ARNs for nothing.
            statements = [*without_auto_scaling(statements), *pcs_statements(ctx, ctx.pcs, scale=scale)]
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
            policy=policy_output([*logs_statements(ctx.partition, ctx.region, ctx.account, log_group_name),
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


def rule_invokes(name: str, rule: aws.cloudwatch.EventRule,
                  fn: aws.lambda_.Function, child: pulumi.ResourceOptions) -> None:
    """Target a rule at a Lambda and let exactly that rule invoke it."""
    aws.lambda_.Permission(f"{name}-permission", action="lambda:InvokeFunction", function=fn.name,
                           principal="events.amazonaws.com", source_arn=rule.arn, opts=child)
    aws.cloudwatch.EventTarget(f"{name}-target", rule=rule.name, arn=fn.arn, opts=child)


def scheduler_invoker(name: str, ctx: GuardrailContext, function: GuardrailFunction, sid: str,
                      opts: pulumi.ResourceOptions) -> tuple[aws.iam.Role, aws.iam.RolePolicy]:
    """The role EventBridge Scheduler assumes to invoke `function`, and nothing else (its policy)."""
    role = aws.iam.Role(
        f"{name}-scheduler-role",
        assume_role_policy=service_trust("scheduler.amazonaws.com", ctx.account),
        description=f"EventBridge Scheduler invokes {function.function_name} only",
        permissions_boundary=ctx.permissions_boundary, tags=ctx.tags, opts=opts)
    policy = aws.iam.RolePolicy(
        f"{name}-scheduler-policy", role=role.id,
        policy=policy_output([{"Sid": sid, "Effect": "Allow", "Action": ["lambda:InvokeFunction"],
                               "Resource": [function.function.arn]}]),
        opts=opts)
    return role, policy
