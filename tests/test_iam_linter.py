"""An external IAM linter over the bootstrap's roles (issue 33: "the external validators report no true
finding on the bootstrap roles").

parliament (duo-labs, offline, its own copy of the Service Authorization Reference) reads every policy
the bootstrap attaches: the CI roles' identity policies, the deploy boundary and the workload boundary.
Each finding it reports today is triaged below with the reason it is not a defect, or the ledger entry
that tracks it until an account can settle it. A finding not in the table fails: a new grant is triaged
(or fixed) when it is written, not found by a scanner later.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from test_bootstrap_state import DEPLOY, WORKLOAD, Role, made, managed_document, roles  # noqa: F401

# (policy, issue, the statement's Sid or the finding's detail) -> why it stays.
TRIAGED: dict[tuple[str, str, str], str] = {
    ("preview", "RESOURCE_MISMATCH", "PublicAmiParameters"):
        "AWS's public parameters have no account in their ARN (arn:aws:ssm:<region>::parameter/aws/service/"
        "...; Systems Manager user guide, 'Working with public parameters'); parliament's pattern wants one",
    ("deploy", "RESOURCE_MISMATCH", "PublicAmiParameters"):
        "as for preview: public parameters' ARNs have an empty account field",
    ("preview", "RESOURCE_STAR", "PcsLists"):
        "pcs:ListComputeNodeGroups and pcs:ListQueues are authorised on the cluster in the Service "
        "Authorization Reference, but `pulumi preview` reads clusters it has no id for yet; read-only",
    ("deploy", "RESOURCE_STAR", "ReadsWithoutResourceScope"):
        "Describe/List reads (read-only, no data) that the deploy and its doctor gate make before any id "
        "is known",
    ("deploy", "RESOURCE_STAR", "StackEc2"):
        "EC2 creates, associations and rule edits on '*': which resources each create tags is unverified "
        "(ledger: ec2-deploy-creates-unscoped); deletes and rewrites are tag-scoped "
        "(Ec2ChangesOnlyOnStackResources)",
    ("deploy", "RESOURCE_STAR", "StackFsx"):
        "FSx ids are AWS's; the deploy boundary denies DeleteFileSystem/DeleteBackup (data is protected), "
        "and the FSx link's service-linked role is FSx's own",
    ("deploy", "RESOURCE_MISMATCH", "StackS3"):
        "s3:GetObjectAttributes on arn:aws:s3:::<prefix>* matches the stacks' objects too (the wildcard "
        "spans '/'); parliament compares the pattern's shape with the access-point form only",
    ("deploy", "UNKNOWN_ACTION", "Unknown action pcs:UpdateCluster"):
        "parliament 1.6.4's action list predates pcs:UpdateCluster; cfn-lint's Service Authorization data "
        "(tests/test_bootstrap_state.py) lists it with the cluster resource type",
    ("deploy", "MISMATCHED_TYPE_BUT_USABLE",
     "Type mismatch: StringEquals requires a value of type String but given Arn"):
        "iam:PermissionsBoundary compared with StringEquals, as the IAM user guide's own examples do "
        "('Permissions boundaries for IAM entities'); an ARN is a string to StringEquals",
    ("deploy-boundary", "MISMATCHED_TYPE_BUT_USABLE",
     "Type mismatch: StringNotEquals requires a value of type String but given Arn"):
        "the boundary's StringNotEquals on iam:PermissionsBoundary / aws:PrincipalArn, the same form",
    ("workload-boundary", "RESOURCE_STAR", "ClusterWorkloads"):
        "a permissions boundary caps actions; each role's own policy names the resources (a boundary "
        "with '*' grants nothing by itself)",
    ("workload-boundary", "RESOURCE_STAR", "EksClusterRole"):
        "a boundary caps: AmazonEKSClusterPolicy itself grants these on '*' (EC2 and load balancer ids are "
        "AWS's), and the boundary allows them only to a principal named as the EKS cluster role "
        "(aws:PrincipalArn; infra/bootstrap-state EKS_CLUSTER_ROLE_ACTIONS)",
    ("workload-boundary", "RESOURCE_STAR", "EksClusterRoleElb"):
        "AmazonEKSClusterPolicy's own form: iam:CreateServiceLinkedRole on '*' with iam:AWSServiceName "
        "elasticloadbalancing.amazonaws.com; here also only to the EKS cluster role (aws:PrincipalArn)",
    ("workload-boundary", "RESOURCE_MISMATCH",
     "LaunchFromAStacksResources|LaunchOnlyWithAStackTag|LaunchWithImagesAndSubnets"):
        "three statements that together cover every resource type of RunInstances/CreateFleet (the "
        "launch's own resources with the request tag, the stack's templates and groups, images and "
        "subnets); parliament reads each statement alone",
    ("workload-boundary", "RESOURCE_MISMATCH", "OnStackInstances|RunShellDocument"):
        "ssm:SendCommand is authorised on the document and on the instances: one statement each (the "
        "shell document; instances with a stack's tag)",
}


def _actions(statement: dict[str, Any]) -> set[str]:
    action = statement.get("Action", [])
    return {a.lower() for a in ([action] if isinstance(action, str) else action)}


def _finding_actions(detail: Any) -> set[str]:
    if isinstance(detail, list):
        return {(d["action"] if isinstance(d, dict) else d).lower() for d in detail}
    return set()


def _key(policy: str, document: dict[str, Any], finding: Any) -> tuple[str, str, str]:
    """The triage key: the statements a finding is about (by its actions and issue), else its detail."""
    actions = _finding_actions(finding.detail)
    if not actions:
        return policy, finding.issue, str(finding.detail)
    candidates = [s for s in document["Statement"] if actions & _actions(s)]
    if finding.issue == "RESOURCE_STAR":
        candidates = [s for s in candidates if s.get("Resource") in ("*", ["*"])]
    sids = sorted({str(s.get("Sid")) for s in candidates})
    return policy, finding.issue, sids[0] if len(sids) == 1 else "|".join(sids)


def _documents(by_name: dict[str, Role], account: Any) -> list[tuple[str, dict[str, Any]]]:
    iam = account[0].client("iam")
    docs = [("preview", d) for d in by_name["preview"].identity]
    docs += [("deploy", d) for name in ("deploy-dev", "deploy-prod") for d in by_name[name].identity]
    return [*docs, ("deploy-boundary", managed_document(iam, DEPLOY)),
            ("workload-boundary", managed_document(iam, WORKLOAD))]


@pytest.fixture(scope="module")
def findings(roles: dict[str, Role], made: Any) -> dict[tuple[str, str, str], list[Any]]:  # noqa: F811
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament imports pkg_resources, which warns of its removal
        from parliament import analyze_policy_string
    found: dict[tuple[str, str, str], list[Any]] = {}
    for policy, document in _documents(roles, made):
        analysed = analyze_policy_string(json.dumps(document), include_community_auditors=False)
        for finding in analysed.findings:
            found.setdefault(_key(policy, document, finding), []).append(finding.detail)
    return found


def test_parliament_finds_nothing_untriaged(findings: dict[tuple[str, str, str], list[Any]]) -> None:
    untriaged = {key: details for key, details in findings.items() if key not in TRIAGED}
    assert untriaged == {}, "new linter findings: fix the grant or triage it in TRIAGED with the reason"


def test_every_triaged_finding_still_occurs(findings: dict[tuple[str, str, str], list[Any]]) -> None:
    """A triage entry whose finding went away is removed, so the table stays what the linter says."""
    assert sorted(set(TRIAGED) - set(findings)) == []


def test_the_linter_reads_the_grants_it_is_shown() -> None:
    """The check can fail: parliament reports an unknown action and a '*' grant of a scoped one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from parliament import analyze_policy_string
    bad = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObjekt", "Resource": "*"},
        {"Effect": "Allow", "Action": "ec2:DeleteVpc", "Resource": "*"}]}
    analysed = analyze_policy_string(json.dumps(bad), include_community_auditors=False)
    issues = {f.issue for f in analysed.findings}
    assert {"UNKNOWN_ACTION", "RESOURCE_STAR"} <= issues
