"""The rules as CrossGuard policies: pulumi_policy's arguments mapped onto rule records.

`build_policies()` returns one ResourceValidationPolicy or StackValidationPolicy
per rule, with its description, default enforcement level and config schema;
`policies/__main__.py` hands them to `PolicyPack`. Values unknown during
preview become `UNKNOWN` (rules then pass), so no policy fails for want of a
value only a deployment knows. Never construct a PolicyPack here: that starts
a gRPC server and blocks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy import proxy as policy_proxy

from gpucluster.policy.cloudcontrol import native_view
from gpucluster.policy.records import UNKNOWN, Resource, Stack, dig
from gpucluster.policy.rules import RULES
from gpucluster.policy.rules.registry import Rule

PACK_NAME = "gpucluster"
PACK_DESCRIPTION = ("gpucluster guardrails: cost tags, IMDSv2, private encrypted GPU nodes, closed "
                    "security groups, EFA wiring, safe S3 data buckets, budgets and auto-stop, "
                    "per-environment GPU limits, no IAM admin wildcards.")

_UNKNOWN_SENTINELS = frozenset({
    policy_proxy.UNKNOWN_BOOLEAN_VALUE, policy_proxy.UNKNOWN_NUMBER_VALUE,
    policy_proxy.UNKNOWN_STRING_VALUE, policy_proxy.UNKNOWN_ARRAY_VALUE,
    policy_proxy.UNKNOWN_ASSET_VALUE, policy_proxy.UNKNOWN_ARCHIVE_VALUE,
    policy_proxy.UNKNOWN_OBJECT_VALUE,
})


def plain(value: Any) -> Any:
    """CrossGuard's unknown-checking proxies -> plain dicts and lists, unknown values -> UNKNOWN."""
    if isinstance(value, str):
        return UNKNOWN if value in _UNKNOWN_SENTINELS else value
    if isinstance(value, Mapping):
        out = {}
        for key in value:
            try:
                out[key] = plain(value[key])
            except policy_proxy.UnknownValueError:
                out[key] = UNKNOWN
        return out
    if isinstance(value, Sequence):
        elements = []
        for i in range(len(value)):
            try:
                elements.append(plain(value[i]))
            except policy_proxy.UnknownValueError:
                elements.append(UNKNOWN)
        return elements
    return value


def _default_tags(provider: Any) -> Mapping[str, Any]:
    """The AWS provider's `defaultTags.tags` (provider inputs may arrive JSON-encoded)."""
    if provider is None or not str(getattr(provider, "resource_type", "")).startswith("pulumi:providers:aws"):
        return {}
    default_tags = plain(provider.props).get("defaultTags")
    if isinstance(default_tags, str):
        try:
            default_tags = json.loads(default_tags)
        except json.JSONDecodeError:
            return {}
    tags = dig(default_tags, "tags")
    return tags if isinstance(tags, Mapping) else {}


def resource_from_args(args: ResourceValidationArgs) -> Resource:
    """A resource under validation (its inputs) as a rule record."""
    return native_view(Resource(type=args.resource_type, name=args.name, props=plain(args.props),
                                urn=args.urn, parent=args.opts.parent, protect=bool(args.opts.protect),
                                default_tags=_default_tags(args.provider)))


def resource_from_stack(resource: PolicyResource) -> Resource:
    """One resource of a stack validation (its outputs: id and ARN once deployed) as a rule record."""
    props = plain(resource.props)
    ids = tuple(v for v in (props.get("id"), props.get("arn"), props.get("name"), props.get("bucket"))
                if isinstance(v, str))
    deps = {key: tuple(d.urn for d in found) for key, found in resource.property_dependencies.items()}
    return native_view(Resource(type=resource.resource_type, name=resource.name, props=props,
                                urn=resource.urn,
                                parent=resource.parent.urn if resource.parent else resource.opts.parent,
                                protect=bool(resource.opts.protect), ids=ids, deps=deps,
                                default_tags=_default_tags(resource.provider)))


def resource_policy(rule: Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        config = rule.settings(args.get_config())
        for message in rule.resource_messages(resource_from_args(args), config):
            report_violation(message, None)

    return ResourceValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                    enforcement_level=EnforcementLevel(rule.level),
                                    config_schema=_schema(rule))


def stack_policy(rule: Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        config = rule.settings(args.get_config())
        stack = Stack(resource_from_stack(r) for r in args.resources)
        for resource, message in rule.stack_findings(stack, config):
            report_violation(message, resource.urn if resource is not None and resource.urn else None)

    return StackValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                 enforcement_level=EnforcementLevel(rule.level),
                                 config_schema=_schema(rule))


def _schema(rule: Rule) -> PolicyConfigSchema | None:
    if not rule.schema:
        return None
    return PolicyConfigSchema(properties={k: dict(v) for k, v in rule.schema.items()})


def build_policies() -> list[Policy]:
    """Every rule as a CrossGuard policy, in RULES order."""
    return [resource_policy(r) if r.kind == "resource" else stack_policy(r) for r in RULES]
