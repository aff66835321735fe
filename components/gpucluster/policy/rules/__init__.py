"""The policy rules: pure checks over resource records, shared by CrossGuard and `gpucluster plan`.

A resource rule looks at one `Resource` (its type and engine inputs); a stack
rule looks at the whole `Stack`. Each returns the problems it finds as
messages. The rules live in one module per concern (tagging, nodes, network,
efa, iam, capacity, guardrails, buckets, pcs, eks; `groups` reads node groups for them,
`registry` says what a rule is, `tokens` names the resource types); this
module owns `RULES`, the pack's rules in the pack's order, and `evaluate`,
which runs them all offline. Rules read engine input names (camelCase, as
`pulumi preview` and the mock engine see them), treat UNKNOWN values as
"cannot judge" (pass), and must never import Pulumi, pulumi_policy or call AWS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.policy.records import Resource, Stack, Violation
from gpucluster.policy.rules import (
    buckets,
    capacity,
    efa,
    eks,
    guardrails,
    iam,
    network,
    nodes,
    pcs,
    tagging,
)
from gpucluster.policy.rules.registry import Rule

# Re-exported for tests/test_speed.py, which builds EFA stacks from `rules.<TOKEN>` and patches
# `rules.Stack`; new code imports them from `tokens` and `gpucluster.policy.records`.
from gpucluster.policy.rules.tokens import (
    ASG,
    LAUNCH_TEMPLATE,
    PLACEMENT_GROUP,
    SECURITY_GROUP,
    SG_EGRESS_RULE,
    SG_INGRESS_RULE,
)

__all__ = [
    "ASG",
    "LAUNCH_TEMPLATE",
    "PLACEMENT_GROUP",
    "RULES",
    "SECURITY_GROUP",
    "SG_EGRESS_RULE",
    "SG_INGRESS_RULE",
    "Rule",
    "Stack",
    "evaluate",
    "rules_by_name",
]

RULES: list[Rule] = [
    # resource rules: one resource at a time
    tagging.required_cost_tags,
    nodes.imdsv2_required,
    nodes.no_public_ip,
    nodes.encrypted_volumes,
    network.no_open_ingress,
    iam.iam_no_wildcard_admin,
    # stack rules: the whole stack at once
    capacity.environment_limits,
    guardrails.gpu_budget_with_action,
    guardrails.nonprod_autostop,
    efa.efa_wiring,
    network.intra_group_traffic,
    buckets.s3_encryption,
    buckets.s3_public_access_blocked,
    buckets.s3_tls_only,
    buckets.s3_data_buckets_protected,
    buckets.s3_lifecycle_keeps_data,
    eks.eks_private_endpoint,
    eks.eks_control_plane_logging,
    eks.eks_secrets_encrypted,
    eks.eks_system_nodes_no_gpu,
    pcs.pcs_node_instance_profile,
    pcs.pcs_launch_template,
    pcs.pcs_slurm_traffic,
    pcs.pcs_login_no_gpu,
    pcs.pcs_accounting,
]
"""Every rule, in the order CrossGuard lists the policies and `gpucluster plan` reports violations."""


def rules_by_name() -> dict[str, Rule]:
    return {r.name: r for r in RULES}


def evaluate(resources: Iterable[Resource], levels: Mapping[str, str] | None = None,
             settings: Mapping[str, Mapping[str, Any]] | None = None) -> list[Violation]:
    """Run every rule over `resources`, the way CrossGuard would; disabled rules are skipped.

    `levels` and `settings` map policy names to an enforcement level and to the
    rule's config (see `gpucluster.policy.settings.resolve`); missing names get the defaults.
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
                                       resource.urn or None)
                             for message in r.resource_messages(resource, config))
        else:
            for subject, message in r.stack_findings(stack, config):
                found.append(Violation(r.name, level, message, subject.type if subject else None,
                                       subject.name if subject else None,
                                       (subject.urn or None) if subject else None))
    return found
