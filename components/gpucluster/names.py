"""AWS name limits, and the physical names Pulumi gives a cluster's resources: pure, no Pulumi import.

It owns three things. `NAME_RULES`: for each resource type the input that holds
its physical name, AWS's length limit for it and whether Pulumi fills it in
when the program does not. `physical_name`: the name a planned resource gets
(its own input, or Pulumi's auto-name: the logical name, `-` and 7 random hex
characters; a bucket prefix plus Terraform's 26-character unique suffix).
And `expected_names` / `name_findings`: the names the gpucluster program
gives a stack's resources, derived from the stack file alone, so the spec
rejects a config whose names AWS would refuse before anything is created.
`tests/test_names.py` plans the longest accepted names and keeps
`expected_names` equal to what the program registers.

It must never import Pulumi or call AWS; it computes lengths, it does not name
resources itself (the components do).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpucluster.fleet.deployment import state_table_name
from gpucluster.node.userdata import LAUNCH_HOOK_NAME
from gpucluster.noderole import run_log_group_name
from gpucluster.spec import Finding, StackSpec, can_run_spot, generated_bucket_prefix

# pulumi-terraform-bridge AutoName / resource.NewUniqueHex: `<logical name>-<7 random hex>`.
AUTONAME_SEPARATOR = "-"
AUTONAME_RANDOM = 7
# terraform-plugin-sdk helper/id PrefixedUniqueId: an 18-digit timestamp and an 8-hex counter.
UNIQUE_SUFFIX_LENGTH = 26


@dataclass(frozen=True)
class NameRule:
    """Where a resource type keeps its physical name and how long AWS lets it be."""

    what: str
    """The name as AWS's documentation calls it."""
    prop: str
    """The engine input holding the name (camelCase)."""
    limit: int
    """AWS's maximum length."""
    autonamed: bool = True
    """Pulumi names it `<logical>-<7 hex>` when the program does not."""
    prefix_prop: str | None = None
    """An input that asks the provider for `<prefix><unique suffix>` instead."""
    lowercase: bool = False
    """Pulumi lowercases its auto-name (S3)."""


# Limits: IAM user guide "IAM and AWS STS quotas" (role 64, instance profile / policy / inline policy
# name 128); Lambda "quotas" (function 64) and AddPermission StatementId (100); EventBridge PutRule
# Name (64) and PutTargets Target.Id (64); EventBridge Scheduler CreateSchedule Name (64); S3 bucket
# naming rules (63); SNS CreateTopic (256); CloudWatch Logs CreateLogGroup (512), PutMetricAlarm
# AlarmName (255); KMS CreateAlias (256, "alias/" included); EC2 CreateLaunchTemplate (128),
# CreateSecurityGroup GroupName (255), CreatePlacementGroup (255); Auto Scaling group name (255);
# AWS Budgets BudgetName (100); Auto Scaling PutLifecycleHook LifecycleHookName (255), CloudWatch
# PutDashboard DashboardName (255), CloudWatch Logs PutMetricFilter filterName (512). Which input
# Pulumi auto-names: pulumi-aws provider/resources.go
# (EventTarget `targetId` with maxlen 255, above AWS's 64: only this table catches it).
NAME_RULES: dict[str, NameRule] = {
    "aws:iam/role:Role": NameRule("IAM role name", "name", 64),
    "aws:iam/instanceProfile:InstanceProfile": NameRule("IAM instance profile name", "name", 128),
    "aws:iam/policy:Policy": NameRule("IAM policy name", "name", 128),
    "aws:iam/rolePolicy:RolePolicy": NameRule("IAM inline policy name", "name", 128),
    "aws:lambda/function:Function": NameRule("Lambda function name", "name", 64),
    "aws:lambda/permission:Permission": NameRule("Lambda permission statement id", "statementId", 100),
    "aws:cloudwatch/eventRule:EventRule": NameRule("EventBridge rule name", "name", 64),
    "aws:cloudwatch/eventTarget:EventTarget": NameRule("EventBridge target id", "targetId", 64),
    "aws:scheduler/schedule:Schedule": NameRule("EventBridge Scheduler schedule name", "name", 64),
    "aws:s3/bucket:Bucket": NameRule("S3 bucket name", "bucket", 63, prefix_prop="bucketPrefix",
                                     lowercase=True),
    "aws:s3/bucketV2:BucketV2": NameRule("S3 bucket name", "bucket", 63, prefix_prop="bucketPrefix",
                                         lowercase=True),
    "aws:sns/topic:Topic": NameRule("SNS topic name", "name", 256),
    "aws:cloudwatch/logGroup:LogGroup": NameRule("CloudWatch log group name", "name", 512),
    "aws:cloudwatch/metricAlarm:MetricAlarm": NameRule("CloudWatch alarm name", "name", 255),
    # PutCompositeAlarm AlarmName (255); required, never auto-named
    "aws:cloudwatch/compositeAlarm:CompositeAlarm": NameRule("CloudWatch alarm name", "alarmName", 255,
                                                             autonamed=False),
    "aws:kms/alias:Alias": NameRule("KMS alias name", "name", 256),
    "aws:ec2/launchTemplate:LaunchTemplate": NameRule("launch template name", "name", 128),
    "aws:ec2/securityGroup:SecurityGroup": NameRule("security group name", "name", 255),
    "aws:ec2/placementGroup:PlacementGroup": NameRule("placement group name", "name", 255),
    "aws:autoscaling/group:Group": NameRule("Auto Scaling group name", "name", 255),
    "aws:budgets/budget:Budget": NameRule("budget name", "name", 100),
    "aws:autoscaling/lifecycleHook:LifecycleHook": NameRule("lifecycle hook name", "name", 255),
    "aws:cloudwatch/dashboard:Dashboard": NameRule("CloudWatch dashboard name", "dashboardName", 255,
                                                   autonamed=False),
    "aws:cloudwatch/logMetricFilter:LogMetricFilter": NameRule("metric filter name", "name", 512),
    # DynamoDB CreateTable TableName (255; DynamoDB developer guide, "Supported data types and naming
    # rules"): the guard-state table, named from the identity (lambdas.handlers.state_table_name).
    "aws:dynamodb/table:Table": NameRule("DynamoDB table name", "name", 255),
}


@dataclass(frozen=True)
class PhysicalName:
    """The name one resource gets in AWS, and the rule it must keep."""

    type: str
    logical: str
    name: str
    rule: NameRule

    @property
    def fits(self) -> bool:
        return len(self.name) <= self.rule.limit


def autoname(logical: str, lowercase: bool = False) -> str:
    """Pulumi's auto-name: `<logical>-<7 hex>` (random in a real deploy; derived from the name here)."""
    name = logical + AUTONAME_SEPARATOR + hashlib.sha256(logical.encode()).hexdigest()[:AUTONAME_RANDOM]
    return name.lower() if lowercase else name


def prefixed_name(prefix: str) -> str:
    """A provider-made unique name: `<prefix>` plus 26 digits (the length Terraform's suffix has)."""
    return prefix + str(int(hashlib.sha256(prefix.encode()).hexdigest(), 16))[:UNIQUE_SUFFIX_LENGTH]


def physical_name(type_: str, logical: str, inputs: Mapping[str, Any]) -> PhysicalName | None:
    """The physical name a resource of `type_` gets from these inputs; None for types without a rule."""
    rule = NAME_RULES.get(type_)
    if rule is None:
        return None
    given = inputs.get(rule.prop)
    prefix = inputs.get(rule.prefix_prop) if rule.prefix_prop else None
    if isinstance(given, str) and given:
        name = given
    elif isinstance(prefix, str) and prefix:
        name = prefixed_name(prefix)
    elif rule.autonamed:
        name = autoname(logical, rule.lowercase)
    else:
        return None
    return PhysicalName(type_, logical, name, rule)


def physical_names(resources: Iterable[Any]) -> list[PhysicalName]:
    """Every named resource of a plan (anything with `type`, `name` and `inputs`), in order."""
    found = (physical_name(r.type, r.name, r.inputs) for r in resources)
    return [p for p in found if p is not None]


def generated_state(type_: str, logical: str, inputs: Mapping[str, Any]) -> dict[str, str]:
    """The name output a provider fills in when the inputs leave it out (what the mock engine answers)."""
    found = physical_name(type_, logical, inputs)
    if found is None or inputs.get(found.rule.prop):
        return {}
    return {found.rule.prop: found.name}


# ------------------------------------------------------------- the program's names


@dataclass(frozen=True)
class ExpectedName:
    """A name the program gives, and the stack-file key that makes it long."""

    key: str
    physical: PhysicalName


def _entry(key: str, type_: str, logical: str, explicit: str | None = None,
           prefix: str | None = None) -> ExpectedName:
    rule = NAME_RULES[type_]
    inputs: dict[str, str] = {}
    if explicit is not None:
        inputs[rule.prop] = explicit
    if prefix is not None and rule.prefix_prop:
        inputs[rule.prefix_prop] = prefix
    found = physical_name(type_, logical, inputs)
    assert found is not None  # every type here has a rule
    return ExpectedName(key, found)


def expected_names(spec: StackSpec) -> list[ExpectedName]:
    """Every physical name the gpucluster program gives this stack's resources (program.run).

    Mirrors the components' naming (`GpuCluster(<cluster.name>)` and its children); a test keeps
    it equal to a plan's names, so a resource added to a component must be added here.
    """
    c = spec.cluster.name
    names: list[ExpectedName] = []

    def add(key: str, type_: str, logical: str, explicit: str | None = None,
            prefix: str | None = None) -> None:
        names.append(_entry(key, type_, logical, explicit, prefix))

    sg, role = "aws:ec2/securityGroup:SecurityGroup", "aws:iam/role:Role"
    policy = "aws:iam/rolePolicy:RolePolicy"
    if spec.network.vpc_cidr is not None:
        add("cluster.name", sg, f"{c}-network-endpoints")
    if spec.network.flow_logs != "off":  # aws/network.py: the flow log's group and delivery role
        add("cluster.name", "aws:cloudwatch/logGroup:LogGroup", f"{c}-network-flow-logs",
            f"/gpucluster/vpc-flow-logs/{c}")
        add("cluster.name", role, f"{c}-network-flow-logs-role")
        add("cluster.name", policy, f"{c}-network-flow-logs-policy")
    for i, g in enumerate(spec.node_groups):
        key = f"node_groups[{i}].name"
        add(key, sg, f"{c}-network-{g.name}-nodes")
        if g.uses_placement_group:
            add(key, "aws:ec2/placementGroup:PlacementGroup", f"{c}-network-{g.name}-placement")
        add(key, "aws:ec2/launchTemplate:LaunchTemplate", f"{c}-{g.name}-lt")
        add(key, "aws:autoscaling/group:Group", f"{c}-{g.name}-asg")
        if g.health_checks.enabled:  # aws/nodes.py: the launch check's hook, the group's health policy
            add(key, "aws:autoscaling/lifecycleHook:LifecycleHook", f"{c}-{g.name}-launch-check",
                explicit=LAUNCH_HOOK_NAME)
            add(key, policy, f"{c}-{g.name}-health")
        # aws/cluster.py: a node identity per group, the first under the stack's former shared name
        identity = node_identity_name(c, g.name, first=i == 0)
        identity_key = "cluster.name" if i == 0 else key
        add(identity_key, role, f"{identity}-role")
        add(identity_key, "aws:iam/instanceProfile:InstanceProfile", f"{identity}-profile")
        add(identity_key, policy, f"{identity}-agent")
        if spec.datasets:
            add(identity_key, policy, f"{identity}-s3")
        add(identity_key, policy, f"{identity}-jobs")  # the run log group, the groups' ECR images
        add(identity_key, policy, f"{identity}-scripts")  # the node scripts bundle (aws/nodescripts.py)
    for i, d in enumerate(spec.datasets):
        if not d.existing:
            if d.bucket_name:
                add(f"datasets[{i}].bucket_name", "aws:s3/bucket:Bucket", f"{c}-datasets-{d.name}-bucket",
                    explicit=d.bucket_name)
            else:
                add(f"datasets[{i}].name", "aws:s3/bucket:Bucket", f"{c}-datasets-{d.name}-bucket",
                    prefix=generated_bucket_prefix(c, d.name))
        if d.access == "fsx" and d.fsx is not None:
            add(f"datasets[{i}].name", sg, f"{c}-datasets-{d.name}-fsx-sg")
    add("cluster.name", "aws:cloudwatch/logGroup:LogGroup", f"{c}-run-logs",
        run_log_group_name(spec.identity))
    # aws/nodescripts.py: the stack's node-scripts bucket
    add("cluster.name", "aws:s3/bucket:Bucket", f"{c}-node-scripts-bucket",
        prefix=generated_bucket_prefix(c, "node-scripts"))
    names += _guardrail_names(spec)
    names += _dashboard_names(spec)
    return names


def _dashboard_names(spec: StackSpec) -> list[ExpectedName]:
    """The names under `<cluster>-dashboard` (aws/observability.py): the dashboard, a metric filter per
    guardrail Lambda that stops groups (auto-stop, budget action, Capacity Block expiry), the stuck-job
    alarms."""
    c, key = spec.cluster.name, "cluster.name"
    d = f"{c}-dashboard"
    out = [_entry(key, "aws:cloudwatch/dashboard:Dashboard", f"{d}-dashboard",
                  dashboard_name(c, spec.region))]
    guarded = spec.budget is not None and spec.budget.action_threshold_percent is not None
    stoppers = [spec.autostop.enabled, guarded, guarded,  # the budget action and the spend guard
                any(group.capacity.market == "capacity_block" for group in spec.node_groups)]
    out += [_entry(key, "aws:cloudwatch/logMetricFilter:LogMetricFilter", f"{d}-stops-{i}")
            for i in range(sum(stoppers))]
    for i, group in enumerate(spec.node_groups):
        if group.health_checks.stuck_alarm_minutes is not None:
            asg = autoname(f"{c}-{group.name}-asg")
            out.append(_entry(f"node_groups[{i}].name", "aws:cloudwatch/metricAlarm:MetricAlarm",
                              f"{d}-stuck-{group.name}", f"{asg}-stuck"))
    return out


def _guardrail_names(spec: StackSpec) -> list[ExpectedName]:
    """The names under `<cluster>-guardrails` (aws/guardrails.py and its guardrail_* parts), for the
    parts the stack asks for."""
    c, key = spec.cluster.name, "cluster.name"
    g = f"{c}-guardrails"
    spot = any(can_run_spot(group) for group in spec.node_groups)
    autostop, budget = spec.autostop, spec.budget
    blocks = any(group.capacity.market == "capacity_block" for group in spec.node_groups)
    # GpuCluster always asks for the job restart handler (stack.guardrails_args restart_jobs).
    out = [_entry(key, "aws:kms/alias:Alias", f"{g}-notify-key-alias", f"alias/{c}-guardrails"),
           _entry(key, "aws:sns/topic:Topic", f"{g}-notify-topic", f"{c}-guardrails")]

    functions: list[tuple[str, str]] = []  # (module, function name): each gets its own alarms

    def function(name: str, function_name: str) -> None:
        functions.append((name.removeprefix(f"{g}-").removesuffix("-handler"), function_name))
        out.extend([
            _entry(key, "aws:cloudwatch/logGroup:LogGroup", f"{name}-logs", f"/aws/lambda/{function_name}"),
            _entry(key, "aws:iam/role:Role", f"{name}-role"),
            _entry(key, "aws:iam/rolePolicy:RolePolicy", f"{name}-policy"),
            _entry(key, "aws:lambda/function:Function", f"{name}-function", function_name)])

    def invoked_by_rule(name: str, rule_name: str) -> None:
        out.extend([_entry(key, "aws:cloudwatch/eventRule:EventRule", f"{name}-rule", rule_name),
                    _entry(key, "aws:lambda/permission:Permission", f"{name}-permission"),
                    _entry(key, "aws:cloudwatch/eventTarget:EventTarget", f"{name}-target")])

    if budget is not None:
        out.append(_entry(key, "aws:budgets/budget:Budget", f"{g}-budget-monthly", f"{c}-monthly"))
        if budget.action_threshold_percent is not None:
            out.append(_entry(key, "aws:sns/topic:Topic", f"{g}-budget-action-topic", f"{c}-budget-action"))
            function(f"{g}-budget-handler", f"{c}-budget-action")
            out.append(_entry(key, "aws:lambda/permission:Permission", f"{g}-budget-action-permission"))
            # aws/guardrail_spend.py: the spend guard and its schedule
            function(f"{g}-spend-handler", f"{c}-spend-guard")
            out += [_entry(key, "aws:iam/role:Role", f"{g}-spend-scheduler-role"),
                    _entry(key, "aws:iam/rolePolicy:RolePolicy", f"{g}-spend-scheduler-policy"),
                    _entry(key, "aws:scheduler/schedule:Schedule", f"{g}-spend-schedule", f"{c}-spend-guard")]
        if budget.report is not None:
            function(f"{g}-report-handler", f"{c}-spend-report")
            invoked_by_rule(f"{g}-report", f"{c}-spend-report")
    if autostop.enabled:
        function(f"{g}-autostop-handler", f"{c}-autostop")
        for i, group in enumerate(spec.node_groups):
            asg = autoname(f"{c}-{group.name}-asg")
            gkey = f"node_groups[{i}].name"
            alarm = "aws:cloudwatch/metricAlarm:MetricAlarm"
            out += [_entry(gkey, alarm, f"{g}-autostop-idle-{group.name}", f"{asg}-gpu-idle"),
                    _entry(gkey, alarm, f"{g}-autostop-no-jobs-{group.name}", f"{asg}-no-jobs"),
                    _entry(gkey, "aws:cloudwatch/compositeAlarm:CompositeAlarm",
                           f"{g}-autostop-idle-composite-{group.name}", f"{asg}-idle")]
        invoked_by_rule(f"{g}-autostop-idle", f"{c}-idle")
        schedules = {"stop": autostop.stop_schedule, "start": autostop.start_schedule,
                     "lifetime": autostop.max_lifetime_hours}
        if any(schedules.values()):
            out += [_entry(key, "aws:iam/role:Role", f"{g}-autostop-scheduler-role"),
                    _entry(key, "aws:iam/rolePolicy:RolePolicy", f"{g}-autostop-scheduler-policy")]
            out += [_entry(key, "aws:scheduler/schedule:Schedule", f"{g}-autostop-{purpose}-schedule",
                           f"{c}-{purpose}") for purpose, on in schedules.items() if on]
    if blocks:
        function(f"{g}-blocks-handler", f"{c}-capacity-block")
        invoked_by_rule(f"{g}-blocks", f"{c}-capacity-block-expiry")
    function(f"{g}-jobs-handler", f"{c}-job-restart")
    invoked_by_rule(f"{g}-jobs", f"{c}-job-restart")
    if spot:
        function(f"{g}-spot-handler", f"{c}-spot-interruption")
        kinds = ["interruption"]
        if spec.spot.handle_rebalance and spec.spot.interruption_command:
            kinds.append("rebalance")
        for kind in kinds:
            invoked_by_rule(f"{g}-spot-{kind}", f"{c}-spot-{kind}")
    stoppers = (autostop.enabled or blocks
                or (budget is not None and budget.action_threshold_percent is not None))
    if stoppers:  # aws/guardrail_state.py: the guard-state table
        out.append(_entry(key, "aws:dynamodb/table:Table", f"{g}-state-table",
                          state_table_name(spec.identity)))
    # aws/guardrail_state.py GuardrailAlarms: each function's Errors, Throttles, DestinationDeliveryFailures
    modules = {"budget": "budget-action", "report": "report", "autostop": "autostop",
               "blocks": "capacity-block", "jobs": "job-restart", "spot": "spot-interruption",
               "spend": "spend-guard"}
    for part, function_name in functions:
        for metric in ("Errors", "Throttles", "DestinationDeliveryFailures"):
            out.append(_entry(key, "aws:cloudwatch/metricAlarm:MetricAlarm",
                              f"{g}-watch-{modules[part]}-{metric.lower()}", f"{function_name}-{metric}"))
    return out


def name_findings(spec: StackSpec) -> list[Finding]:
    """One finding per stack-file key whose value makes a name longer than AWS allows (its worst)."""
    worst: dict[str, ExpectedName] = {}
    for entry in expected_names(spec):
        excess = len(entry.physical.name) - entry.physical.rule.limit
        if excess > 0 and (entry.key not in worst or excess > _excess(worst[entry.key])):
            worst[entry.key] = entry
    findings = []
    for key, entry in worst.items():
        p = entry.physical
        value = _value_at(spec, key)
        findings.append(Finding(key, (
            f"{value!r} makes the {p.rule.what} {p.name!r} {len(p.name)} characters long; AWS allows "
            f"{p.rule.limit}: use at most {len(value) - _excess(entry)} characters")))
    return findings


def _excess(entry: ExpectedName) -> int:
    return len(entry.physical.name) - entry.physical.rule.limit


def _value_at(spec: StackSpec, key: str) -> str:
    """The stack-file value at `cluster.name`, `node_groups[i].name`, `datasets[i].name|bucket_name`."""
    if key == "cluster.name":
        return spec.cluster.name
    section, _, rest = key.partition("[")
    index, _, field = rest.partition("].")
    item = getattr(spec, section)[int(index)]
    return str(getattr(item, field))


def node_identity_name(cluster: str, group: str, first: bool) -> str:
    """The NodeIdentity (role, profile, policies) of one node group under `GpuCluster(cluster)`.

    One per group: IAM scopes SetInstanceHealth to a group, not to an instance. The first
    group's keeps the name the stack's one shared identity had, so existing stacks keep that
    role (and running nodes their credentials); the others are `<cluster>-<group>-node`, short
    enough that the role (`-role` and Pulumi's 8-character suffix) fits IAM's 64 characters with
    the longest cluster and group names the spec accepts (`gpucluster.names`).
    """
    return f"{cluster}-node-identity" if first else f"{cluster}-{group}-node"


def dashboard_name(cluster_name: str, region: str) -> str:
    """The stack's dashboard. Dashboards are global to an account (their ARN has no region) while
    cluster names are unique per region, hence both; the cluster name leads, as in every name the
    deploy role may touch (infra/bootstrap-state scopes)."""
    return f"{cluster_name}-{region}"


def dashboard_url(region: str, name: str) -> str:
    """Where the console shows a dashboard (CloudWatch user guide, "Share dashboards": the URL form)."""
    domain = ("console.amazonaws.cn" if region.startswith("cn-") else
              "console.amazonaws-us-gov.com" if region.startswith("us-gov-") else "console.aws.amazon.com")
    return f"https://{region}.{domain}/cloudwatch/home?region={region}#dashboards/dashboard/{name}"

