"""The CI roles and boundaries (infra/bootstrap-state) fit a stack with observability on: every resource
type it creates is granted to the deploy role, least privilege, and the workload boundary keeps what
the node and Grafana roles are granted."""

from __future__ import annotations

import json
from typing import Any

from iam_eval import allowed
from test_bootstrap_state import (  # noqa: F401 - the module's fixtures, used by name
    ACCOUNT,
    IAM,
    SSM_CORE,
    WORKLOAD,
    Role,
    bootstrap_state,
    made,
    managed_document,
    roles,
)
from test_prometheus_stack import planned


def test_every_observability_resource_type_is_granted_to_the_deploy_role(
        roles: dict[str, Role]) -> None:  # noqa: F811
    plan = planned("own")
    types = {r.type for r in plan.resources if r.custom and not r.type.startswith("pulumi:providers:")}
    assert types - set(bootstrap_state.DEPLOY_ACTIONS) == set(), "add the new type to DEPLOY_ACTIONS"
    deploy = roles["deploy-prod"]
    scope = bootstrap_state.scopes("aws", ACCOUNT, "gpu-", [])
    context = {"iam:PermissionsBoundary": WORKLOAD, "iam:PolicyARN": SSM_CORE,
               "iam:PassedToService": "grafana.amazonaws.com", "aws:ResourceTag/gpucluster:stack": "prod"}
    samples = {**{s: r[0].replace("*", "x") for s, r in scope.items()},
               "iam": f"{IAM}:role/gpu-prod-x", "kms": f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k"}
    for token in ("aws:amp/workspace:Workspace", "aws:amp/ruleGroupNamespace:RuleGroupNamespace",
                  "aws:grafana/workspace:Workspace",
                  "aws:grafana/workspaceSamlConfiguration:WorkspaceSamlConfiguration"):
        for action in bootstrap_state.DEPLOY_ACTIONS[token]:
            if action in bootstrap_state.CREATES_WITHOUT_RESOURCE_TYPE:  # no ARN: "*", the tag in the request
                tagged = {**context, "aws:RequestTag/gpucluster:stack": "prod"}
                assert deploy.can(action, "*", **tagged), action
                assert not deploy.can(action, "*"), action
                continue
            assert deploy.can(action, samples[action.split(":")[0]], **context), (token, action)
    assert deploy.can("iam:PassRole", f"{IAM}:role/gpu-prod-grafana", **context)
    # AMP may use the stack's keys for the deploy role; nothing else may, and no other key is granted.
    key = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k"
    assert deploy.can("kms:GenerateDataKey", key, **{"kms:ViaService": "aps.us-east-1.amazonaws.com"})
    assert not deploy.can("kms:GenerateDataKey", key, **{"kms:ViaService": "s3.us-east-1.amazonaws.com"})
    assert not deploy.can("kms:CreateGrant", key)  # a key without the stack's tag: the boundary denies it
    assert not deploy.can("aps:CreateWorkspace", "arn:aws:aps:us-east-1:999999999999:workspace/ws-x")


def test_the_workload_boundary_keeps_the_metrics_roles_grants(made: Any) -> None:  # noqa: F811
    plan = planned("own")
    boundary = managed_document(made[0].client("iam"), WORKLOAD)
    everything = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    checked = 0
    for r in plan.of_type("aws:iam/rolePolicy:RolePolicy"):
        if "-metrics-" not in r.name:
            continue
        for statement in json.loads(r.inputs["policy"])["Statement"]:
            resources = statement["Resource"]
            resources = resources if isinstance(resources, list) else [resources]
            for action in statement["Action"]:
                for resource in resources:
                    assert allowed([everything], boundary, action, resource), (r.name, action)
                    checked += 1
    assert checked >= 6  # two groups' RemoteWrite, Grafana's four queries and the workspace listing
