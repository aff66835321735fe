"""The policy rules: pure functions over resource records, shared by CrossGuard and `gpucluster plan`.

A resource rule looks at one `Resource` (its type and engine inputs); a stack
rule looks at the whole `Stack`. Each returns the problems it finds as
messages; `RULES` names every rule with its description, default enforcement
level and config schema, and `evaluate` runs them all offline. Rules read
engine input names (camelCase, as `pulumi preview` and the mock engine see
them), treat UNKNOWN values as "cannot judge" (pass), and must never import
Pulumi, pulumi_policy or call AWS.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal

from gpucluster import catalog
from gpucluster.policy.records import (
    EXTERNAL,
    UNKNOWN,
    Resource,
    Stack,
    Violation,
    dig,
    effective_tags,
    items,
    number,
    truthy,
)

# ----------------------------------------------------------------- type tokens

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
EBS_VOLUME = "aws:ebs/volume:Volume"
ASG = "aws:autoscaling/group:Group"
ASG_SCHEDULE = "aws:autoscaling/schedule:Schedule"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SG_INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_SSE = ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
              "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2")
BUCKET_PAB = ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",)
BUCKET_POLICY = ("aws:s3/bucketPolicy:BucketPolicy",)
BUCKET_ACL = ("aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")
BUCKET_VERSIONING = ("aws:s3/bucketVersioning:BucketVersioning",
                     "aws:s3/bucketVersioningV2:BucketVersioningV2")
BUCKET_LIFECYCLE = ("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
                    "aws:s3/bucketLifecycleConfigurationV2:BucketLifecycleConfigurationV2")
BUDGET = "aws:budgets/budget:Budget"
BUDGET_ACTION = "aws:budgets/budgetAction:BudgetAction"
SNS_TOPIC = "aws:sns/topic:Topic"
SNS_SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
METRIC_ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
SCHEDULER_SCHEDULE = "aws:scheduler/schedule:Schedule"
IAM_POLICY_DOCS: dict[str, str] = {
    "aws:iam/policy:Policy": "policy",
    "aws:iam/rolePolicy:RolePolicy": "policy",
    "aws:iam/userPolicy:UserPolicy": "policy",
    "aws:iam/groupPolicy:GroupPolicy": "policy",
}
IAM_ROLE = "aws:iam/role:Role"
IAM_ATTACHMENTS = ("aws:iam/rolePolicyAttachment:RolePolicyAttachment",
                   "aws:iam/policyAttachment:PolicyAttachment",
                   "aws:iam/userPolicyAttachment:UserPolicyAttachment",
                   "aws:iam/groupPolicyAttachment:GroupPolicyAttachment")
"""A node group as the stack spec describes it, for `gpucluster plan` when the plan has no ASG yet.

Its props use the Auto Scaling group's engine names (maxSize, onDemandBaseCapacity,
onDemandPercentageAboveBaseCapacity) plus instanceTypes, marketType and tags.
"""

# Resources whose pulumi-aws 7 inputs take `tags` (tests/policies/test_records.py checks each
# against the installed pulumi_aws). Any other resource that carries a `tags` input is checked too.
TAGGABLE: frozenset[str] = frozenset({
    "aws:autoscaling/group:Group",
    "aws:budgets/budget:Budget",
    "aws:budgets/budgetAction:BudgetAction",
    "aws:cloudwatch/compositeAlarm:CompositeAlarm",
    "aws:cloudwatch/eventRule:EventRule",
    "aws:cloudwatch/logGroup:LogGroup",
    "aws:cloudwatch/metricAlarm:MetricAlarm",
    "aws:ebs/volume:Volume",
    "aws:ec2/capacityReservation:CapacityReservation",
    "aws:ec2/eip:Eip",
    "aws:ec2/flowLog:FlowLog",
    "aws:ec2/instance:Instance",
    "aws:ec2/internetGateway:InternetGateway",
    "aws:ec2/launchTemplate:LaunchTemplate",
    "aws:ec2/natGateway:NatGateway",
    "aws:ec2/networkInterface:NetworkInterface",
    "aws:ec2/placementGroup:PlacementGroup",
    "aws:ec2/routeTable:RouteTable",
    "aws:ec2/securityGroup:SecurityGroup",
    "aws:ec2/subnet:Subnet",
    "aws:ec2/vpc:Vpc",
    "aws:ec2/vpcEndpoint:VpcEndpoint",
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation",
    "aws:fsx/lustreFileSystem:LustreFileSystem",
    "aws:iam/instanceProfile:InstanceProfile",
    "aws:iam/openIdConnectProvider:OpenIdConnectProvider",
    "aws:iam/policy:Policy",
    "aws:iam/role:Role",
    "aws:kms/key:Key",
    "aws:lambda/function:Function",
    "aws:s3/bucket:Bucket",
    "aws:s3/bucketV2:BucketV2",
    "aws:scheduler/scheduleGroup:ScheduleGroup",
    "aws:sns/topic:Topic",
    "aws:sqs/queue:Queue",
    "aws:ssm/document:Document",
    "aws:ssm/parameter:Parameter",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
})

OPEN_IPV4, OPEN_IPV6 = "0.0.0.0/0", "::/0"
# EC2 API, IpPermission.IpProtocol: "-1" means all protocols (the provider also accepts "all").
ALL_TRAFFIC = ("-1", "all")
# S3 API, ServerSideEncryptionByDefault.SSEAlgorithm: the values S3 accepts.
SSE_ALGORITHMS = ("aws:kms", "aws:kms:dsse", "AES256")
# S3 user guide, "Canned ACL": the ones that grant access outside the account.
PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read")
ADMIN_POLICY = re.compile(r"arn:aws[\w-]*:iam::aws:policy/AdministratorAccess")

# ------------------------------------------------------------------- the registry

ResourceCheck = Callable[[Resource, Mapping[str, Any]], Iterable[str]]
StackCheck = Callable[[Stack, Mapping[str, Any]], Iterable[tuple[Resource | None, str]]]


@dataclass(frozen=True)
class Rule:
    """One policy: its check and what CrossGuard and `gpucluster plan` need to know about it."""

    name: str
    description: str
    kind: Literal["resource", "stack"]
    check: ResourceCheck | StackCheck
    level: str = "mandatory"
    schema: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """JSON-schema `properties` of the policy's config (Pulumi's `configSchema`)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def settings(self, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The rule's config: defaults, overridden key by key (environments: one by one)."""
        merged = dict(self.defaults)
        for key, value in (given or {}).items():
            if key == "environments" and isinstance(value, Mapping):
                merged[key] = {**merged.get(key, {}), **value}
            else:
                merged[key] = value
        return merged


RULES: list[Rule] = []


def rule(name: str, description: str, kind: Literal["resource", "stack"], level: str = "mandatory",
         schema: Mapping[str, Mapping[str, Any]] | None = None,
         defaults: Mapping[str, Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a rule under its policy name."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        RULES.append(Rule(name, description, kind, fn, level, schema or {}, defaults or {}))
        return fn

    return register


def rules_by_name() -> dict[str, Rule]:
    return {r.name: r for r in RULES}


def evaluate(resources: Iterable[Resource], levels: Mapping[str, str] | None = None,
             settings: Mapping[str, Mapping[str, Any]] | None = None) -> list[Violation]:
    """Run every rule over `resources`, the way CrossGuard would; disabled rules are skipped.

    `levels` and `settings` map policy names to an enforcement level and to the
    rule's config (see `policies.config.resolve`); missing names get the defaults.
    """
    stack = Stack(resources)
    levels, settings = levels or {}, settings or {}
    found: list[Violation] = []
    for r in RULES:
        level = levels.get(r.name, r.level)
        if level == "disabled":
            continue
        config = r.settings(settings.get(r.name))
        if r.kind == "resource":
            for resource in stack.resources:
                found.extend(Violation(r.name, level, message, resource.type, resource.name,
                                       resource.urn or None) for message in r.check(resource, config))
        else:
            for resource, message in r.check(stack, config):
                found.append(Violation(r.name, level, message, resource.type if resource else None,
                                       resource.name if resource else None,
                                       (resource.urn or None) if resource else None))
    return found


# ------------------------------------------------------------------------ helpers


def _known_str(value: Any) -> bool:
    return isinstance(value, str)


def _present(value: Any) -> bool:
    """A tag value counts when it is a non-empty string, or not known yet."""
    return value is UNKNOWN or (isinstance(value, str) and value.strip() != "")


def is_gpu_type(instance_type: str) -> bool:
    """GPU instance types: the catalog's, plus any other p*/g* family (p3, g4ad ...)."""
    return catalog.get(instance_type) is not None or re.match(r"[pg]\d", instance_type) is not None


def _gpus(instance_type: str) -> int:
    t = catalog.get(instance_type)
    return t.gpus if t else 0


def _statements(document: Any) -> list[Mapping[str, Any]] | Any:
    """The statements of an IAM policy document given as JSON text or a mapping."""
    if document is UNKNOWN:
        return UNKNOWN
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except json.JSONDecodeError:
            return []
    statements = dig(document, "Statement")
    if statements is UNKNOWN:
        return UNKNOWN
    return [s for s in items(statements) if isinstance(s, Mapping)]


def _wildcard(value: Any, *wild: str) -> bool:
    found = items(value)
    return found is not UNKNOWN and any(v in wild for v in found)


# ============================================================ resource rules


@rule("required-cost-tags",
      "Every taggable resource carries the cost tags owner, cost_center and environment; launch "
      "templates also tag the instances and volumes they launch.",
      "resource",
      schema={"required_tags": {"type": "array", "items": {"type": "string"},
                                "description": "Tag keys every taggable resource must carry."}},
      defaults={"required_tags": ["owner", "cost_center", "environment"]})
def required_cost_tags(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    if resource.type.startswith(("pulumi:", "gpucluster:")):
        return
    if resource.type not in TAGGABLE and "tags" not in resource.props:
        return
    required = list(config["required_tags"])
    tags = effective_tags(resource)
    if tags is not UNKNOWN:
        missing = [k for k in required if not _present(tags.get(k))]
        if missing:
            yield f"missing cost tags: {', '.join(missing)}"
    if resource.type == LAUNCH_TEMPLATE:
        specs = items(resource.props.get("tagSpecifications"))
        if specs is UNKNOWN:
            return
        for kind in ("instance", "volume"):
            tagged = [s for s in specs if dig(s, "resourceType") in (kind, UNKNOWN)]
            if not tagged:
                yield f"tagSpecifications has no `{kind}` entry, so launched {kind}s carry no cost tags"
                continue
            given = dig(tagged[0], "tags")
            if given is UNKNOWN or not isinstance(given, Mapping):
                continue
            missing = [k for k in required if not _present(given.get(k))]
            if missing:
                yield f"tagSpecifications `{kind}` is missing cost tags: {', '.join(missing)}"


@rule("imdsv2-required",
      "Instances and launch templates require IMDSv2 (metadataOptions.httpTokens = required).",
      "resource")
def imdsv2_required(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    # EC2 user guide, "Configure the instance metadata options": httpTokens required = IMDSv2 only.
    if resource.type not in (LAUNCH_TEMPLATE, INSTANCE):
        return
    tokens = dig(resource.props, "metadataOptions", "httpTokens")
    if tokens is UNKNOWN or tokens == "required":
        return
    yield (f"metadataOptions.httpTokens is {tokens!r}, not 'required': IMDSv1 lets any SSRF read "
           "the node's credentials" if tokens else
           "metadataOptions.httpTokens is not set, so IMDSv1 stays on; set it to 'required'")


@rule("no-public-ip-on-gpu-nodes",
      "GPU nodes (launch templates and instances) get no public IP: they live in private subnets "
      "and are reached through SSM.",
      "resource")
def no_public_ip(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    if resource.type == LAUNCH_TEMPLATE:
        nics = items(resource.props.get("networkInterfaces"))
        if nics is UNKNOWN:
            return
        for i, nic in enumerate(nics):
            if truthy(dig(nic, "associatePublicIpAddress")):
                yield f"networkInterfaces[{i}].associatePublicIpAddress is true"
    elif resource.type == INSTANCE and truthy(resource.props.get("associatePublicIpAddress")):
        yield "associatePublicIpAddress is true"


@rule("encrypted-volumes",
      "EBS volumes are encrypted: launch-template block devices, instance volumes and EBS volumes.",
      "resource")
def encrypted_volumes(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    props = resource.props
    if resource.type == LAUNCH_TEMPLATE:
        mappings = items(props.get("blockDeviceMappings"))
        if mappings is UNKNOWN:
            return
        if not mappings:
            yield ("no blockDeviceMappings: the root volume is the AMI's, unencrypted unless the "
                   "account turns on EBS encryption by default; map it with ebs.encrypted = true")
        for i, mapping in enumerate(mappings):
            ebs = dig(mapping, "ebs")
            if isinstance(ebs, Mapping) and not _true_or_unknown(ebs.get("encrypted")):
                yield (f"blockDeviceMappings[{i}] ({dig(mapping, 'deviceName') or '?'}) has "
                       "ebs.encrypted unset or false")
    elif resource.type == INSTANCE:
        root = props.get("rootBlockDevice")
        encrypted = dig(root, "encrypted")
        if root is not UNKNOWN and not (isinstance(root, Mapping) and _true_or_unknown(encrypted)):
            yield "rootBlockDevice.encrypted is unset or false"
        disks = items(props.get("ebsBlockDevices"))
        for i, disk in enumerate(disks if disks is not UNKNOWN else []):
            if not _true_or_unknown(dig(disk, "encrypted")):
                yield f"ebsBlockDevices[{i}].encrypted is unset or false"
    elif resource.type == EBS_VOLUME and not _true_or_unknown(props.get("encrypted")):
        yield "encrypted is unset or false"


def _true_or_unknown(value: Any) -> bool:
    return value is UNKNOWN or truthy(value)


@rule("no-open-ingress",
      "No security group admits traffic from anywhere (0.0.0.0/0 or ::/0).",
      "resource")
def no_open_ingress(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    props = resource.props
    if resource.type == SECURITY_GROUP:
        rules = items(props.get("ingress"))
        for i, r in enumerate(rules if rules is not UNKNOWN else []):
            for what in _open(r, "cidrBlocks", "ipv6CidrBlocks"):
                yield f"ingress[{i}] admits {what}"
    elif resource.type == SG_INGRESS_RULE:
        for key, open_cidr in (("cidrIpv4", OPEN_IPV4), ("cidrIpv6", OPEN_IPV6)):
            if props.get(key) == open_cidr:
                yield f"{key} is {open_cidr}"
    elif resource.type == SG_RULE and props.get("type") == "ingress":
        for what in _open(props, "cidrBlocks", "ipv6CidrBlocks"):
            yield f"ingress rule admits {what}"


def _open(rule_props: Any, v4_key: str, v6_key: str) -> list[str]:
    found = []
    for key, open_cidr in ((v4_key, OPEN_IPV4), (v6_key, OPEN_IPV6)):
        cidrs = items(dig(rule_props, key))
        if cidrs is not UNKNOWN and open_cidr in cidrs:
            found.append(f"{open_cidr} ({key})")
    return found


@rule("iam-no-wildcard-admin",
      "No IAM policy allows every action on every resource (Action * on Resource *), and no "
      "AdministratorAccess attachment.",
      "resource")
def iam_no_wildcard_admin(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    props = resource.props
    documents: list[tuple[str, Any]] = []
    if resource.type in IAM_POLICY_DOCS:
        key = IAM_POLICY_DOCS[resource.type]
        documents.append((key, props.get(key)))
    if resource.type == IAM_ROLE:
        inline = items(props.get("inlinePolicies"))
        for i, policy in enumerate(inline if inline is not UNKNOWN else []):
            documents.append((f"inlinePolicies[{i}].policy", dig(policy, "policy")))
        managed = items(props.get("managedPolicyArns"))
        for arn in managed if managed is not UNKNOWN else []:
            if isinstance(arn, str) and ADMIN_POLICY.fullmatch(arn):
                yield f"managedPolicyArns attaches {arn}"
    if resource.type in IAM_ATTACHMENTS:
        arn = props.get("policyArn")
        if isinstance(arn, str) and ADMIN_POLICY.fullmatch(arn):
            yield f"attaches {arn}"
    for where, document in documents:
        statements = _statements(document)
        if statements is UNKNOWN:
            continue
        for i, s in enumerate(statements):
            if s.get("Effect") != "Allow" or not _wildcard(s.get("Resource"), "*"):
                continue
            if _wildcard(s.get("Action"), "*", "*:*"):
                yield f"{where} Statement[{i}] allows Action '*' on Resource '*'"
            elif "NotAction" in s:
                yield f"{where} Statement[{i}] allows NotAction on Resource '*' (nearly every action)"


# =============================================================== node groups


@dataclass(frozen=True)
class NodeGroup:
    """What an Auto Scaling group (or the spec's node group) can buy at its maximum size."""

    resource: Resource
    instance_types: tuple[str, ...]
    max_nodes: float | None
    on_demand: str | None
    """Why the group may run on-demand (or capacity-block) nodes; None when it is spot only."""
    launch_template: Any = None
    """The launch template's Resource, EXTERNAL, UNKNOWN or None."""


def node_groups(stack: Stack) -> list[NodeGroup]:
    """Every Auto Scaling group's instance types, maximum size and market."""
    groups = []
    for asg in stack.of_type(ASG):
        props = asg.props
        policy = props.get("mixedInstancesPolicy")
        types: list[str] = []
        distribution: Any
        if isinstance(policy, Mapping):
            spec = dig(policy, "launchTemplate", "launchTemplateSpecification")
            ref = dig(spec, "launchTemplateId") or dig(spec, "launchTemplateName")
            lt = stack.resolve(asg, "mixedInstancesPolicy", ref, [LAUNCH_TEMPLATE])
            overrides = items(dig(policy, "launchTemplate", "overrides"))
            types = [t for o in (overrides if overrides is not UNKNOWN else [])
                     if _known_str(t := dig(o, "instanceType"))]
            distribution = dig(policy, "instancesDistribution") or {}
        else:
            spec = props.get("launchTemplate")
            ref = dig(spec, "id") or dig(spec, "name")
            lt = stack.resolve(asg, "launchTemplate", ref, [LAUNCH_TEMPLATE])
            distribution = None
        lt_props = lt.props if isinstance(lt, Resource) else {}
        lt_type = lt_props.get("instanceType")
        market = dig(lt_props, "instanceMarketOptions", "marketType")
        if not types and _known_str(lt_type):
            types = [lt_type]
        max_size = props.get("maxSize")
        max_nodes = number(max_size, 0) if max_size is not None and max_size is not UNKNOWN else None
        groups.append(NodeGroup(asg, tuple(types), max_nodes,
                                _on_demand_reason(distribution, market, max_nodes, lt), lt))
    return groups


def _on_demand_reason(distribution: Any, market: Any, max_nodes: float | None, lt: Any) -> str | None:
    if market == "spot":
        return None
    if market == "capacity-block":
        return "it buys a Capacity Block (on-demand capacity)"
    if distribution is None:
        if lt is UNKNOWN or lt is EXTERNAL:
            return None
        return "it has no mixed-instances policy and no spot market options, so every node is on-demand"
    if distribution is UNKNOWN:
        return None
    base = number(dig(distribution, "onDemandBaseCapacity"), 0)
    # AWS default for onDemandPercentageAboveBaseCapacity is 100 (Auto Scaling API reference).
    above = number(dig(distribution, "onDemandPercentageAboveBaseCapacity"), 100)
    if base > 0:
        return f"onDemandBaseCapacity is {base:g}"
    if above > 0 and (max_nodes is None or max_nodes > base):
        return f"onDemandPercentageAboveBaseCapacity is {above:g}"
    return None


def _gpu_groups(stack: Stack) -> list[str]:
    """Names of the stack's GPU Auto Scaling groups and GPU instances (resources only)."""
    names = [g.resource.name for g in node_groups(stack)
             if g.resource.type == ASG and any(is_gpu_type(t) for t in g.instance_types)]
    names += [r.name for r in stack.of_type(INSTANCE)
              if _known_str(t := r.props.get("instanceType")) and is_gpu_type(t)]
    return names


# ================================================================ stack rules

ENVIRONMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "allowed_instance_types": {"type": "array", "items": {"type": "string"},
                                   "description": "Instance types allowed, as globs (g5.*, p5.48xlarge)."},
        "max_gpus": {"type": "integer", "minimum": 0,
                     "description": "GPUs the whole stack may run at its groups' maximum sizes."},
        "spot_only": {"type": "boolean", "description": "Every GPU node must be spot."},
    },
    "additionalProperties": False,
}

DEFAULT_ENVIRONMENTS: dict[str, dict[str, Any]] = {
    "dev": {"allowed_instance_types": ["g4dn.*", "g5.*", "g6.*", "g6e.*"], "max_gpus": 8,
            "spot_only": True},
    "staging": {"allowed_instance_types": ["g4dn.*", "g5.*", "g6.*", "g6e.*", "p4d.*", "p4de.*",
                                           "p5.*", "p5e.*"], "max_gpus": 64, "spot_only": False},
    "prod": {"allowed_instance_types": ["g4dn.*", "g5.*", "g6.*", "g6e.*", "p4d.*", "p4de.*", "p5.*",
                                        "p5e.*", "p5en.*", "p6-b200.*"], "max_gpus": 512,
             "spot_only": False},
}


@rule("environment-limits",
      "Per-environment limits from the policy config: allowed instance types, the most GPUs a "
      "stack may run, and spot-only environments (dev).",
      "stack",
      schema={
          "environments": {"type": "object", "additionalProperties": ENVIRONMENT_SCHEMA,
                           "description": "Limits per environment tag value (dev, staging, prod ...)."},
          "fallback_environment": {"type": "string",
                                   "description": "Whose limits apply to an environment not listed."},
      },
      defaults={"environments": DEFAULT_ENVIRONMENTS, "fallback_environment": "dev"})
def environment_limits(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    env = stack.environment()
    if env is None:
        return  # no environment tag anywhere: required-cost-tags reports that
    whose, limits = limits_of(env, config)
    allowed = list(limits.get("allowed_instance_types", ["*"]))
    where = env if whose == env else f"{env} (no limits of its own in the policy config: {whose}'s apply)"
    total, parts = 0, []
    for group in node_groups(stack):
        for t in group.instance_types:
            if not any(fnmatchcase(t, pattern) for pattern in allowed):
                yield group.resource, (f"{t} is not allowed in {where} (allowed: {', '.join(allowed)}; "
                                       "see the environment-limits policy config)")
        if limits.get("spot_only") and group.on_demand:
            yield group.resource, f"{where} is spot-only, but {group.on_demand}"
        gpus = max((_gpus(t) for t in group.instance_types), default=0)
        if group.max_nodes and gpus:
            total += int(group.max_nodes) * gpus
            parts.append(f"{group.resource.name} {int(group.max_nodes)} x {gpus}")
    max_gpus = limits.get("max_gpus")
    if max_gpus is not None and total > max_gpus:
        yield None, (f"at maximum size the stack runs {total} GPUs ({', '.join(parts)}), over the "
                     f"{where} limit of {max_gpus:g}")


def limits_of(env: str, config: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """(whose limits apply, the limits) for environment `env`: its own, else the fallback's."""
    environments = config["environments"]
    if env in environments:
        return env, environments[env]
    fallback = config["fallback_environment"]
    return fallback, environments.get(fallback) or {}


def fallback_note(env: str, config: Mapping[str, Any]) -> str | None:
    """For an environment without limits of its own: which limits apply instead, spelled out."""
    whose, limits = limits_of(env, config)
    if whose == env:
        return None
    spelled = [f"allowed instance types {', '.join(limits.get('allowed_instance_types', ['*']))}"]
    if limits.get("max_gpus") is not None:
        spelled.append(f"at most {limits['max_gpus']:g} GPUs")
    spelled.append("spot only" if limits.get("spot_only") else "on-demand allowed")
    return (f"environment {env} has no limits in the environment-limits policy config, so the {whose} "
            f"limits apply: {'; '.join(spelled)}. Add \"{env}\" under environments in "
            f"policies/config/<stack>.json to set its own.")


@rule("gpu-budget-with-action",
      "A stack with GPU groups has an AWS budget with an action: a BudgetAction, or a notification "
      "to an SNS topic a Lambda subscribes to (scale to zero).",
      "stack")
def gpu_budget_with_action(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    gpu = _gpu_groups(stack)
    if not gpu:
        return
    budgets = stack.of_type(BUDGET)
    if not budgets:
        yield None, f"GPU groups ({', '.join(gpu)}) but no aws:budgets/budget:Budget"
    elif not any(_budget_acts(stack, b) for b in budgets):
        for b in budgets:
            yield b, ("the budget only notifies: add a BudgetAction or a notification to an SNS "
                      "topic with a Lambda subscription that scales the GPU groups to zero")


def _budget_acts(stack: Stack, budget: Resource) -> bool:
    for action in stack.of_type(BUDGET_ACTION):
        target = stack.resolve(action, "budgetName", action.props.get("budgetName"), [BUDGET])
        if target is budget or target is UNKNOWN:
            return True
    notifications = items(budget.props.get("notifications"))
    if notifications is UNKNOWN:
        return True
    for notification in notifications:
        topics = items(dig(notification, "subscriberSnsTopicArns"))
        if topics is UNKNOWN:
            return True
        for arn in topics:
            topic = stack.resolve(budget, "notifications", arn, [SNS_TOPIC])
            if topic is UNKNOWN or topic is EXTERNAL or _has_lambda_subscriber(stack, topic):
                return True
    return False


def _has_lambda_subscriber(stack: Stack, topic: Any) -> bool:
    for sub in stack.of_type(SNS_SUBSCRIPTION):
        if sub.props.get("protocol") not in ("lambda", UNKNOWN):
            continue
        target = stack.resolve(sub, "topic", sub.props.get("topic"), [SNS_TOPIC])
        if target is topic or target is UNKNOWN:
            return True
    return False


@rule("nonprod-autostop",
      "A non-prod stack with GPU groups has auto-stop: an idle alarm with an action (its own, or an "
      "EventBridge rule with a target that receives its ALARM state), or a stop schedule.",
      "stack",
      schema={"exempt_environments": {"type": "array", "items": {"type": "string"},
                                      "description": "Environments that need no auto-stop."}},
      defaults={"exempt_environments": ["prod"]})
def nonprod_autostop(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    env = stack.environment()
    if env is None or env in config["exempt_environments"]:
        return
    gpu = _gpu_groups(stack)
    if not gpu or _has_autostop(stack):
        return
    yield None, (f"{env} stack with GPU groups ({', '.join(gpu)}) has no auto-stop: no idle alarm "
                 "(a MetricAlarm below a threshold, with an action) and no stop schedule")


def _has_autostop(stack: Stack) -> bool:
    routed = _alarms_routed_by_eventbridge(stack)
    for alarm in stack.of_type(METRIC_ALARM):
        operator = alarm.props.get("comparisonOperator")
        actions = items(alarm.props.get("alarmActions"))
        acted_on = actions is UNKNOWN or bool(actions) or routed is UNKNOWN or bool(routed & set(alarm.ids))
        below = operator is UNKNOWN or (isinstance(operator, str) and operator.startswith("LessThan"))
        if below and acted_on:
            return True
    for schedule in stack.of_type(EVENT_RULE, SCHEDULER_SCHEDULE):
        if schedule.props.get("scheduleExpression"):
            return True
    for action in stack.of_type(ASG_SCHEDULE):
        size = action.props.get("desiredCapacity", action.props.get("maxSize"))
        if size is UNKNOWN or (size is not None and number(size, 1) == 0):
            return True
    return False


def _alarms_routed_by_eventbridge(stack: Stack) -> set[str] | Any:
    """Alarm ids whose ALARM state an EventBridge rule with a target delivers (UNKNOWN: can't tell).

    Guardrails act on idle alarms this way (a `CloudWatch Alarm State Change` rule targeting the
    auto-stop Lambda) rather than through the alarm's own alarmActions.
    """
    targeted = set()
    for target in stack.of_type(EVENT_TARGET):
        rule = stack.resolve(target, "rule", target.props.get("rule"), [EVENT_RULE])
        if rule is UNKNOWN:
            return UNKNOWN
        if isinstance(rule, Resource):
            targeted.add(rule.urn)
    routed: set[str] = set()
    for rule in stack.of_type(EVENT_RULE):
        if rule.urn not in targeted:
            continue
        pattern = rule.props.get("eventPattern")
        if pattern is UNKNOWN:
            return UNKNOWN
        try:
            pattern = json.loads(pattern) if isinstance(pattern, str) else pattern
        except json.JSONDecodeError:
            continue
        if not isinstance(pattern, Mapping) or "CloudWatch Alarm State Change" not in items(
                pattern.get("detail-type")):
            continue
        resources = pattern.get("resources")
        if resources is UNKNOWN or any(r is UNKNOWN for r in items(resources)):
            return UNKNOWN
        routed |= {r for r in items(resources) if isinstance(r, str)}
    return routed


# ------------------------------------------------------------------------- EFA


@rule("efa-wiring",
      "EFA launch templates: a primary interface on card 0, EFA interfaces within the instance "
      "type's limits, a security group allowing all traffic to and from itself in both "
      "directions, one subnet and a cluster placement group (none for a Capacity Block, optional "
      "for a group targeting a capacity reservation).",
      "stack")
def efa_wiring(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    groups = node_groups(stack)
    verdicts = _SelfRules(stack)  # each security group judged once, however many interfaces name it
    for lt in stack.of_type(LAUNCH_TEMPLATE):
        nics = items(lt.props.get("networkInterfaces"))
        if nics is UNKNOWN:
            continue
        efa = [n for n in nics if dig(n, "interfaceType") in ("efa", "efa-only")]
        if not efa:
            continue
        users = [g for g in groups if g.launch_template is lt]
        types = {t for g in users for t in g.instance_types}
        if _known_str(lt.props.get("instanceType")):
            types.add(lt.props["instanceType"])
        for message in _nic_layout(nics, efa, sorted(types)):
            yield lt, message
        yield from ((lt, m) for m in _efa_security_groups(stack, lt, efa, verdicts))
        for g in users:
            yield from ((g.resource, m) for m in _efa_placement(stack, g.resource, lt))


def _nic_layout(nics: list[Any], efa: list[Any], types: list[str]) -> Iterable[str]:
    slots: dict[tuple[float, float], Any] = {}
    for nic in nics:
        card, device = dig(nic, "networkCardIndex"), dig(nic, "deviceIndex")
        if card is UNKNOWN or device is UNKNOWN:
            return
        slot = (number(card, 0), number(device, 0))
        if slot in slots:
            yield f"two interfaces on network card {slot[0]:g}, device index {slot[1]:g}"
        slots[slot] = nic
    primary = slots.get((0, 0))
    if primary is None:
        yield "no primary interface (network card 0, device index 0)"
    elif dig(primary, "interfaceType") == "efa-only":
        yield "the primary interface (card 0, device 0) is efa-only; it must be efa or ENA"
    highest_card = max(int(card) for card, _ in slots)
    for t in types:
        record = catalog.get(t)
        if record is None:
            continue
        if record.max_efa_interfaces == 0:
            yield f"{t} does not support EFA"
        elif len(efa) > record.max_efa_interfaces:
            yield f"{len(efa)} EFA interfaces, but {t} supports at most {record.max_efa_interfaces}"
        if highest_card >= record.network_cards:
            yield (f"an interface on network card {highest_card}, but {t} has "
                   f"{record.network_cards} network card(s)")


def _security_groups(stack: Stack, lt: Resource, nics: Sequence[Any]) -> list[Any]:
    """The security groups of a launch template's interfaces (and vpcSecurityGroupIds), resolved.

    Each distinct reference once: a p5 template names the same group on all 32 interfaces.
    """
    refs: list[tuple[str, Any]] = []
    for nic in nics:
        groups = items(dig(nic, "securityGroups"))
        if groups is UNKNOWN:
            refs.append(("networkInterfaces", UNKNOWN))
        else:
            refs.extend(("networkInterfaces", g) for g in groups)
    extra = items(lt.props.get("vpcSecurityGroupIds"))
    refs.extend(("vpcSecurityGroupIds", g) for g in (extra if extra is not UNKNOWN else [UNKNOWN]))
    distinct = list({(prop, ref if _hashable(ref) else id(ref)): (prop, ref) for prop, ref in refs}.values())
    return [stack.resolve(lt, prop, ref, [SECURITY_GROUP]) for prop, ref in distinct]


def _efa_security_groups(stack: Stack, lt: Resource, efa: list[Any],
                         self_rules: _SelfRules) -> Iterable[str]:
    """At least one security group on the EFA interfaces allows all traffic to and from itself."""
    resolved = _security_groups(stack, lt, efa)
    groups = list({id(g): g for g in resolved if isinstance(g, Resource)}.values())
    if not resolved or all(g is None for g in resolved):
        yield "the EFA interfaces have no security group"
        return
    if any(g is UNKNOWN or g is EXTERNAL for g in resolved) and not groups:
        return  # only security groups this stack cannot see: nothing to judge
    verdicts = {g.name: self_rules.verdict(g) for g in groups}
    if any(i is True and e is True for i, e in verdicts.values()):
        return
    if any(v is None for pair in verdicts.values() for v in pair) or any(
            g is UNKNOWN or g is EXTERNAL for g in resolved):
        return
    for name, (inbound, outbound) in verdicts.items():
        for direction, ok in (("inbound from", inbound), ("outbound to", outbound)):
            if not ok:
                yield (f"security group {name} has no all-traffic rule {direction} itself; EFA needs "
                       "both directions (EC2 user guide, EFA security group)")


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


class _SelfRules:
    """Whether each security group allows all traffic to and from itself, inbound and outbound.

    The standalone rules are resolved once per stack and filed under the group they belong to
    (rules whose group is not known yet apply to every group), and each group's verdict is
    kept: with one group per node group, the rule stays linear in the number of node groups.
    """

    def __init__(self, stack: Stack) -> None:
        # direction -> owner (id of the group, or None: not known yet) -> (owner, peer, all traffic)
        self._rules: dict[str, dict[int | None, list[tuple[Any, Any, bool | None]]]] = {
            "ingress": defaultdict(list), "egress": defaultdict(list)}
        for r in stack.of_type(SG_INGRESS_RULE, SG_EGRESS_RULE, SG_RULE):
            if r.type == SG_RULE:
                directions = [d for d in ("ingress", "egress") if r.props.get("type") in (d, UNKNOWN)]
                peer_key, protocol = "sourceSecurityGroupId", r.props.get("protocol")
            else:
                directions = ["ingress" if r.type == SG_INGRESS_RULE else "egress"]
                peer_key, protocol = "referencedSecurityGroupId", r.props.get("ipProtocol")
            owner = stack.resolve(r, "securityGroupId", r.props.get("securityGroupId"), [SECURITY_GROUP])
            if r.type == SG_RULE and truthy(r.props.get("self")):
                peer: Any = _ITSELF
            else:
                value = r.props.get(peer_key)
                peer = None if value is None else stack.resolve(r, peer_key, value, [SECURITY_GROUP])
            key = None if owner is UNKNOWN else id(owner)
            for direction in directions:
                self._rules[direction][key].append((owner, peer, _all_traffic(protocol)))
        self._verdicts: dict[int, tuple[bool | None, bool | None]] = {}

    def verdict(self, sg: Resource) -> tuple[bool | None, bool | None]:
        """(inbound, outbound): True has an all-traffic self rule, None cannot tell yet."""
        if id(sg) not in self._verdicts:
            self._verdicts[id(sg)] = (self._self_rule(sg, "ingress"), self._self_rule(sg, "egress"))
        return self._verdicts[id(sg)]

    def _self_rule(self, sg: Resource, direction: str) -> bool | None:
        """True: `sg` has an all-traffic rule to/from itself in `direction`; None: cannot tell yet."""
        candidates: list[tuple[bool | None, bool | None, bool | None]] = []  # (sg's, to itself, all)
        inline = items(sg.props.get(direction))
        if inline is UNKNOWN:
            candidates.append((True, None, None))
        else:
            candidates.extend((True, truthy(dig(r, "self")), _all_traffic(dig(r, "protocol")))
                              for r in inline)
        filed = self._rules[direction]
        for owner, peer, all_traffic in (*filed.get(id(sg), ()), *filed.get(None, ())):
            to_itself = True if peer is _ITSELF else (False if peer is None else _same(peer, sg))
            candidates.append((_same(owner, sg), to_itself, all_traffic))
        if any(all(v is True for v in c) for c in candidates):
            return True
        if any(False not in c and None in c for c in candidates):
            return None
        return False


_ITSELF = object()  # an aws.ec2.SecurityGroupRule with self = true: its peer is its own group


def _same(found: Any, sg: Resource) -> bool | None:
    return None if found is UNKNOWN else found is sg


def _all_traffic(protocol: Any) -> bool | None:
    return None if protocol is UNKNOWN else protocol in ALL_TRAFFIC


@rule("intra-group-traffic",
      "Node groups that can hold more than one node: a security group allowing all traffic to and "
      "from itself in both directions (NCCL picks its ports at run time), and no all-traffic "
      "ingress from outside the group.",
      "stack")
def intra_group_traffic(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    self_rules = _SelfRules(stack)  # rules filed by group once: linear in node groups, as efa-wiring
    ingress = _all_traffic_ingress(stack)
    for g in node_groups(stack):
        lt = g.launch_template
        if not isinstance(lt, Resource) or g.max_nodes is None:
            continue
        nics = items(lt.props.get("networkInterfaces"))
        if nics is UNKNOWN:
            continue
        resolved = _security_groups(stack, lt, nics)
        groups = [sg for sg in resolved if isinstance(sg, Resource)]
        for sg in list({id(sg): sg for sg in groups}.values()):
            for message in _outside_all_traffic(stack, sg, ingress.get(id(sg), [])):
                yield g.resource, message
        efa = any(dig(n, "interfaceType") in ("efa", "efa-only") for n in nics)
        if g.max_nodes <= 1 or efa:  # one node needs no peer; efa-wiring judges EFA groups
            continue
        if not groups or any(sg is UNKNOWN or sg is EXTERNAL for sg in resolved):
            continue  # security groups this stack cannot see (or none: no-security-group is AWS's)
        verdicts = [self_rules.verdict(sg) for sg in groups]
        if any(i is True and e is True for i, e in verdicts) or any(
                v is None for pair in verdicts for v in pair):
            continue
        yield g.resource, (f"up to {g.max_nodes:g} nodes, but no security group of its launch template "
                           "allows all traffic to and from itself in both directions: its nodes "
                           "cannot reach each other (NCCL, MPI)")


def _all_traffic_ingress(stack: Stack) -> dict[int, list[Resource]]:
    """Standalone all-traffic ingress rules filed under the security group they belong to (by id);
    rules whose group or protocol is not known yet are left out (nothing to judge)."""
    filed: dict[int, list[Resource]] = defaultdict(list)
    for r in stack.of_type(SG_INGRESS_RULE, SG_RULE):
        if r.type == SG_RULE and r.props.get("type") != "ingress":
            continue
        owner = stack.resolve(r, "securityGroupId", r.props.get("securityGroupId"), [SECURITY_GROUP])
        protocol = r.props.get("protocol" if r.type == SG_RULE else "ipProtocol")
        if isinstance(owner, Resource) and _all_traffic(protocol) is True:
            filed[id(owner)].append(r)
    return filed


def _outside_all_traffic(stack: Stack, sg: Resource, rules: list[Resource]) -> Iterable[str]:
    """All-traffic ingress of `sg` (inline, or its standalone `rules`) from anything but `sg` itself."""
    inline = items(sg.props.get("ingress"))
    for i, r in enumerate(inline if inline is not UNKNOWN else []):
        if _all_traffic(dig(r, "protocol")) and (
                _given(dig(r, "cidrBlocks")) or _given(dig(r, "ipv6CidrBlocks"))
                or _given(dig(r, "securityGroups")) or _given(dig(r, "prefixListIds"))):
            yield f"security group {sg.name} ingress[{i}] admits all traffic from outside the group"
    for r in rules:
        peer_key = "sourceSecurityGroupId" if r.type == SG_RULE else "referencedSecurityGroupId"
        if r.type == SG_RULE and truthy(r.props.get("self")):
            continue
        cidrs = [r.props.get(k) for k in ("cidrIpv4", "cidrIpv6", "prefixListId", "cidrBlocks",
                                          "ipv6CidrBlocks", "prefixListIds")]
        peer = r.props.get(peer_key)
        other_group = peer is not None and _same(stack.resolve(r, peer_key, peer, [SECURITY_GROUP]), sg) \
            is False
        if any(_given(c) for c in cidrs) or other_group:
            yield f"{r.name} admits all traffic into security group {sg.name} from outside the group"


def _given(value: Any) -> bool:
    """A peer is set: a non-empty string or list (UNKNOWN: cannot judge, so not counted)."""
    if value is UNKNOWN or value is None:
        return False
    return any(v is UNKNOWN or (v is not None and str(v).strip()) for v in items(value))


def _efa_placement(stack: Stack, asg: Resource, lt: Resource) -> Iterable[str]:
    subnets = items(asg.props.get("vpcZoneIdentifiers"))
    zones = items(asg.props.get("availabilityZones"))
    if subnets is not UNKNOWN and subnets and len(set(map(str, subnets))) != 1:
        yield f"an EFA group must use one subnet; vpcZoneIdentifiers has {len(subnets)}"
    elif not subnets and zones is not UNKNOWN and len(zones) != 1:
        yield f"an EFA group must use one availability zone and subnet; it has {len(zones) or 'none'}"
    nics = items(lt.props.get("networkInterfaces"))
    nic_subnets = {s for n in (nics if nics is not UNKNOWN else []) if _known_str(s := dig(n, "subnetId"))}
    if len(nic_subnets) > 1:
        yield f"the EFA interfaces name {len(nic_subnets)} different subnets"
    group = asg.props.get("placementGroup")
    prop: str = "placementGroup"
    source = asg
    if group is None:
        group, prop, source = dig(lt.props, "placement", "groupName"), "placement", lt
    market = dig(lt.props, "instanceMarketOptions", "marketType")
    if market is UNKNOWN:
        return
    if market == "capacity-block":
        # Already placed in an EC2 UltraCluster; AWS ParallelCluster rejects a placement group here.
        if group is not None:
            yield ("a Capacity Block group must not use a placement group: its instances are already "
                   "placed together in an EC2 UltraCluster")
        return
    if group is None:
        reserved = _targets_reservation(asg, lt)
        if reserved is False:
            yield "an EFA group needs a cluster placement group (placementGroup is not set)"
        return
    found = stack.resolve(source, prop, group, [PLACEMENT_GROUP])
    if isinstance(found, Resource) and found.props.get("strategy") not in ("cluster", UNKNOWN):
        yield (f"placement group {found.name} has strategy {found.props.get('strategy')!r}; EFA "
               "needs 'cluster'")


def _targets_reservation(asg: Resource, lt: Resource) -> bool | Any:
    """Whether the group launches into a capacity reservation (UNKNOWN: cannot tell yet).

    A reservation's instances sit where it was made: a placement group it was not made in
    leaves launches short (eksctl #7949), so such a group needs none.
    """
    found = [dig(asg.props, "capacityReservationSpecification", "capacityReservationTarget",
                 "capacityReservationIds"),
             dig(lt.props, "capacityReservationSpecification", "capacityReservationTarget",
                 "capacityReservationId")]
    if any(f is UNKNOWN for f in found):
        return UNKNOWN
    return any(bool(f) for f in found)


# -------------------------------------------------------------------------- S3


def _bucket_parts(stack: Stack, bucket: Resource, types: Sequence[str]) -> tuple[list[Resource], bool]:
    """The resources of `types` configuring `bucket`, and whether some could not be placed."""
    mine, unsure = [], False
    for part in stack.of_type(*types):
        target = stack.resolve(part, "bucket", part.props.get("bucket"), BUCKETS)
        if target is bucket:
            mine.append(part)
        elif target is UNKNOWN or target is None:
            unsure = True
    return mine, unsure


@rule("s3-encryption",
      "S3 buckets have default encryption (SSE-KMS, DSSE-KMS or SSE-S3) configured.",
      "stack")
def s3_encryption(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for bucket in stack.of_type(*BUCKETS):
        inline = dig(bucket.props, "serverSideEncryptionConfiguration", "rule",
                     "applyServerSideEncryptionByDefault", "sseAlgorithm")
        if inline in SSE_ALGORITHMS or inline is UNKNOWN:
            continue
        parts, unsure = _bucket_parts(stack, bucket, BUCKET_SSE)
        algorithms = [dig(r, "applyServerSideEncryptionByDefault", "sseAlgorithm")
                      for p in parts for r in (items(p.props.get("rules")) or [])]
        if any(a in SSE_ALGORITHMS or a is UNKNOWN for a in algorithms) or (unsure and not parts):
            continue
        yield bucket, ("no default encryption: add a BucketServerSideEncryptionConfiguration "
                       f"with sseAlgorithm one of {', '.join(SSE_ALGORITHMS)}")


@rule("s3-public-access-blocked",
      "S3 buckets block all public access (all four public-access-block settings), and no bucket "
      "policy or ACL makes them public.",
      "stack")
def s3_public_access_blocked(stack: Stack,
                             config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    settings = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for bucket in stack.of_type(*BUCKETS):
        blocks, unsure = _bucket_parts(stack, bucket, BUCKET_PAB)
        if blocks:
            off = [s for s in settings if not any(_true_or_unknown(b.props.get(s)) for b in blocks)]
            if off:
                yield bucket, f"public access block leaves {', '.join(off)} off"
        elif not unsure:
            yield bucket, "no BucketPublicAccessBlock (all four settings true)"
        acls = [bucket.props.get("acl")] + [a.props.get("acl") for a in _bucket_parts(stack, bucket,
                                                                                          BUCKET_ACL)[0]]
        for acl in acls:
            if acl in PUBLIC_ACLS:
                yield bucket, f"ACL {acl!r} makes the bucket public"
        for policy in _bucket_policies(stack, bucket):
            for i, s in enumerate(policy):
                if s.get("Effect") == "Allow" and _public_principal(s.get("Principal")) and not s.get(
                        "Condition"):
                    yield bucket, f"bucket policy Statement[{i}] allows everyone (Principal '*')"


def _bucket_policies(stack: Stack, bucket: Resource) -> list[list[Mapping[str, Any]]]:
    """Known statement lists of the bucket's own `policy` input and its BucketPolicy resources."""
    documents = [bucket.props.get("policy")] + [p.props.get("policy")
                                                for p in _bucket_parts(stack, bucket, BUCKET_POLICY)[0]]
    found = []
    for document in documents:
        statements = _statements(document) if document is not None else []
        if statements is not UNKNOWN and statements:
            found.append(statements)
    return found


def _public_principal(principal: Any) -> bool:
    if principal == "*":
        return True
    return isinstance(principal, Mapping) and _wildcard(principal.get("AWS"), "*")


@rule("s3-tls-only",
      "S3 bucket policies deny every request not made over TLS (aws:SecureTransport = false).",
      "stack")
def s3_tls_only(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for bucket in stack.of_type(*BUCKETS):
        parts, unsure = _bucket_parts(stack, bucket, BUCKET_POLICY)
        policy = bucket.props.get("policy")
        if policy is UNKNOWN or any(p.props.get("policy") is UNKNOWN for p in parts):
            continue
        if any(_denies_plain_http(s) for statements in _bucket_policies(stack, bucket) for s in statements):
            continue
        if unsure and not parts:
            continue
        yield bucket, ("no bucket policy statement denies requests without TLS (Effect Deny, "
                       "Condition Bool aws:SecureTransport false)")


def _denies_plain_http(statement: Mapping[str, Any]) -> bool:
    # S3 user guide, "Enforce encryption in transit": Deny s3:* when aws:SecureTransport is false.
    if statement.get("Effect") != "Deny" or not _wildcard(statement.get("Action"), "s3:*", "*"):
        return False
    secure = dig(statement, "Condition", "Bool", "aws:SecureTransport")
    return any(str(v).lower() == "false" for v in (items(secure) or []))


@rule("s3-data-buckets-protected",
      "Data buckets survive a `pulumi destroy`: protected (or retained on delete), no forceDestroy, "
      "versioning on.",
      "stack")
def s3_data_buckets_protected(stack: Stack,
                              config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for bucket in stack.of_type(*BUCKETS):
        if not (bucket.protect or bucket.retain_on_delete):
            yield bucket, "not protected: set protect=True (and retain_on_delete=True) on the bucket"
        if truthy(bucket.props.get("forceDestroy")):
            yield bucket, "forceDestroy is true: a delete would empty the bucket first"
        inline = dig(bucket.props, "versioning", "enabled")
        if truthy(inline) or inline is UNKNOWN:
            continue
        parts, unsure = _bucket_parts(stack, bucket, BUCKET_VERSIONING)
        statuses = [dig(p.props, "versioningConfiguration", "status") for p in parts]
        if any(s in ("Enabled", UNKNOWN) for s in statuses) or (unsure and not parts):
            continue
        yield bucket, "versioning is not enabled (a BucketVersioning with status Enabled)"


@rule("s3-lifecycle-keeps-data",
      "S3 lifecycle rules never expire current objects, and expire old versions no sooner than "
      "min_noncurrent_days and no later than max_noncurrent_days (config).",
      "stack",
      schema={"min_noncurrent_days": {"type": "integer", "minimum": 1,
                                      "description": "Old versions stay at least this long (to restore)."},
              "max_noncurrent_days": {"type": "integer", "minimum": 1,
                                      "description": "Old versions go after this at the latest (cost)."}},
      defaults={"min_noncurrent_days": 1, "max_noncurrent_days": 3650})
def s3_lifecycle_keeps_data(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    """Versioning keeps what is overwritten or deleted; a lifecycle rule is the one way left to lose it
    without deleting a version (S3 user guide, "Lifecycle configuration elements": an expiration on a
    versioned bucket turns current objects into old versions, which noncurrent expiry then removes).
    The defaults are the stack file's bounds (datasets[].noncurrent_version_expiration_days)."""
    low, high = config["min_noncurrent_days"], config["max_noncurrent_days"]
    found: list[tuple[Resource, Any, str]] = []
    for lifecycle in stack.of_type(*BUCKET_LIFECYCLE):
        rules = items(lifecycle.props.get("rules"))
        for i, r in enumerate(rules if rules is not UNKNOWN else []):
            if isinstance(r, Mapping) and r.get("status") != "Disabled":
                found.append((lifecycle, r, f"rule {r.get('id') or i!r}"))
    for bucket in stack.of_type(*BUCKETS):  # the deprecated inline form
        rules = items(bucket.props.get("lifecycleRules"))
        for i, r in enumerate(rules if rules is not UNKNOWN else []):
            if isinstance(r, Mapping) and r.get("enabled") is not False:
                inline = {**r, "noncurrentVersionExpiration": {
                    "noncurrentDays": dig(r, "noncurrentVersionExpiration", "days")}}
                found.append((bucket, inline, f"lifecycleRules[{i}]"))
    for resource, r, where in found:
        expiration = r.get("expiration")
        if isinstance(expiration, Mapping) and any(expiration.get(k) not in (None, 0, "")
                                                   for k in ("days", "date")):
            yield resource, f"{where} expires current objects: only old versions may expire"
        days = dig(r, "noncurrentVersionExpiration", "noncurrentDays")
        if days is not None and days is not UNKNOWN and not low <= number(days, low) <= high:
            yield resource, (f"{where} expires old versions after {number(days, low):g} days, outside "
                             f"{low}..{high} (min_noncurrent_days, max_noncurrent_days)")
