"""The IAM rule: no policy grants every action on every resource, no AdministratorAccess attachment.

Owns `iam-no-wildcard-admin` and the reading of IAM policy documents
(`statements_of`, `has_wildcard`), which the S3 bucket-policy rules share.
Pure: reads resource records only, never Pulumi or AWS.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.policy.records import UNKNOWN, Resource, dig, items
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import IAM_ATTACHMENTS, IAM_POLICY_DOCS, IAM_ROLE

ADMIN_POLICY = re.compile(r"arn:aws[\w-]*:iam::aws:policy/AdministratorAccess")


def statements_of(document: Any) -> list[Mapping[str, Any]] | Any:
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


def has_wildcard(value: Any, *wild: str) -> bool:
    """A statement's Action, Resource or Principal (one value or a list) names one of `wild`."""
    found = items(value)
    return found is not UNKNOWN and any(v in wild for v in found)


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
        statements = statements_of(document)
        if statements is UNKNOWN:
            continue
        for i, s in enumerate(statements):
            if s.get("Effect") != "Allow" or not has_wildcard(s.get("Resource"), "*"):
                continue
            if has_wildcard(s.get("Action"), "*", "*:*"):
                yield f"{where} Statement[{i}] allows Action '*' on Resource '*'"
            elif "NotAction" in s:
                yield f"{where} Statement[{i}] allows NotAction on Resource '*' (nearly every action)"
