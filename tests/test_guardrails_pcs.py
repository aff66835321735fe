"""The guardrails on a Slurm stack under the mock engine: PCS_CLUSTER_ID and the PCS-scoped policy.

`Guardrails(..., pcs=PcsGuard(...))` takes the PCS ids as plain args (GpuCluster.pcs hands them in
once pcsa's side is merged); without `pcs` nothing changes (the type-none stacks' plans are
compared byte for byte by the snapshot, and test_guardrails covers them).
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

from gpucluster.aws.children import guardrails_args
from gpucluster.aws.guardrails import Guardrails, PcsGuard
from gpucluster.fleet.deployment import (
    HANDLERS,
    PCS_ACTIVE_WAIT_SECONDS,
    PCS_CLUSTER_ENV,
    PCS_IAM_ACTIONS,
    PCS_UPDATE_DESCRIBES,
)
from gpucluster.plan import MOCK_ACCOUNT, record_resources
from iam_eval import allowed
from test_guardrails import FUNCTION, Built, actions_of, build, spec_of, targets

CLUSTER_ARN = "arn:aws:pcs:us-east-1:123456789012:cluster/pcs_abc123"
PCS = PcsGuard(
    cluster_id="pcs_abc123",
    cluster_arn=CLUSTER_ARN,
    node_group_ids={"train": "pcs_cng_train", "login": "pcs_cng_login"},
)


def build_pcs(spec: Any) -> Built:
    args = guardrails_args(spec, targets(spec))
    resources, _ = record_resources(
        lambda: Guardrails(f"{spec.cluster.name}-guardrails", args, pcs=PCS),
        stack=spec.stack,
        region=spec.region,
    )
    return Built(spec, resources)


def everything(base_config: dict[str, Any]) -> Any:
    spot = {**base_config["gpucluster:node_groups"][0], "capacity": {"spot_percent": 100}}
    return spec_of(
        base_config,
        node_groups=[spot],
        spot={"interruption_command": "/hook"},
        budget={"monthly_limit_usd": 100, "action_threshold_percent": 100},
        autostop={
            "enabled": True,
            "stop_schedule": "cron(0 19 ? * * *)",
            "start_schedule": "cron(0 8 ? * MON-FRI *)",
        },
    )


def test_the_stopping_functions_get_the_cluster_id_and_may_scale_only_its_node_groups(
    base_config: dict[str, Any],
) -> None:
    built = build_pcs(everything(base_config))
    seen = set()
    for fn in built.all(FUNCTION):
        module = next(m for m, h in HANDLERS.items() if h == fn.inputs["handler"])
        env = fn.inputs["environment"]["variables"]
        statements = built.policy(fn.inputs["name"])
        if module not in PCS_IAM_ACTIONS:
            assert PCS_CLUSTER_ENV not in env and not any(
                a.startswith("pcs:") for a in actions_of(statements)
            )
            continue
        seen.add(module)
        assert env[PCS_CLUSTER_ENV] == "pcs_abc123"
        assert actions_of(statements) >= set(PCS_IAM_ACTIONS[module])
        by_sid = {s["Sid"]: s for s in statements}
        assert by_sid["PcsOnThisStacksLoginNode"]["Condition"] == {
            "StringEquals": {
                "ssm:resourceTag/gpucluster:stack": built.spec.identity,
                "ssm:resourceTag/gpucluster:node-group": "login",
            }
        }
        assert len(by_sid) == len(statements)  # Sids stay unique in each policy
        if module == "spot_interruption":  # requeues from the login node, changes no capacity
            assert not any(a.startswith("pcs:") for a in actions_of(statements))
            continue
        assert by_sid["PcsListThisCluster"]["Resource"] == [CLUSTER_ARN]
        assert by_sid["PcsScaleThisClustersGroups"]["Resource"] == [
            CLUSTER_ARN,
            f"{CLUSTER_ARN}/computenodegroup/pcs_cng_train",
        ]  # never the login group
        assert sorted(by_sid["PcsScaleThisClustersGroups"]["Action"]) == [
            "pcs:GetComputeNodeGroup",
            "pcs:UpdateComputeNodeGroup",
        ]
        # the PCS guide's minimum permissions for UpdateComputeNodeGroup (issue 34), each scoped: PassRole
        # only of the stack's /aws-pcs/ roles and only to PCS
        passes = [s for s in statements if "iam:PassRole" in json.dumps(s)]
        assert passes == [{
            "Sid": "PcsPassThisStacksNodeRoles", "Effect": "Allow", "Action": ["iam:PassRole"],
            "Resource": [f"arn:aws:iam::{MOCK_ACCOUNT}:role/aws-pcs/{built.spec.cluster.name}-*"],
            "Condition": {"StringEquals": {"iam:PassedToService": "pcs.amazonaws.com"}}}]
    assert seen == {"budget_action", "autostop", "spend_guard", "spot_interruption"}


def test_a_stop_may_make_what_pcs_checks_of_an_update_and_only_for_this_stack(
    base_config: dict[str, Any],
) -> None:
    """What PCS's minimum permissions list for UpdateComputeNodeGroup (issue 34; whether PCS checks them on
    a scaling-only update is unverified), evaluated on the budget stop's role policy."""
    built = build_pcs(everything(base_config))
    spec = built.spec
    fn = next(f for f in built.all(FUNCTION) if f.inputs["handler"] == HANDLERS["budget_action"])
    policy = {"Statement": built.policy(fn.inputs["name"])}

    def can(action: str, resource: str, **context: str) -> bool:
        return allowed([policy], None, action, resource, **context)

    iam, ec2 = f"arn:aws:iam::{MOCK_ACCOUNT}", f"arn:aws:ec2:{spec.region}:{MOCK_ACCOUNT}"
    node_role = f"{iam}:role/aws-pcs/{spec.cluster.name}-node-identity-role-abc1234"
    assert can("pcs:UpdateComputeNodeGroup", f"{CLUSTER_ARN}/computenodegroup/pcs_cng_train")
    assert can("iam:PassRole", node_role, **{"iam:PassedToService": "pcs.amazonaws.com"})
    assert not can("iam:PassRole", node_role, **{"iam:PassedToService": "ec2.amazonaws.com"})
    assert not can("iam:PassRole", f"{iam}:role/aws-pcs/gpu-other-node-role",
                   **{"iam:PassedToService": "pcs.amazonaws.com"})
    assert can("iam:GetInstanceProfile", f"{iam}:instance-profile/aws-pcs/{spec.cluster.name}-node-profile")
    assert not can("iam:GetInstanceProfile", f"{iam}:instance-profile/aws-pcs/gpu-other-profile")
    ours, theirs = ({"aws:RequestTag/gpucluster:stack": spec.identity},
                    {"aws:RequestTag/gpucluster:stack": "someone-else"})
    for action in ("ec2:RunInstances", "ec2:CreateFleet"):
        assert can(action, f"{ec2}:instance/*", **ours) and not can(action, f"{ec2}:instance/*", **theirs)
        assert not can(action, f"{ec2}:instance/*"), action
        template = f"{ec2}:launch-template/lt-1"
        assert can(action, template, **{"aws:ResourceTag/gpucluster:stack": spec.identity}), action
        assert not can(action, f"{ec2}:launch-template/lt-1"), action
        assert can(action, f"arn:aws:ec2:{spec.region}::image/ami-0abc"), action
    assert can("ec2:CreateTags", f"{ec2}:instance/i-1", **ours, **{"ec2:CreateAction": "RunInstances"})
    assert not can("ec2:CreateTags", f"{ec2}:instance/i-1", **ours)  # never an existing instance
    for action in PCS_UPDATE_DESCRIBES:
        assert can(action, "*"), action
    # the spot handler changes no capacity: none of it
    spot = next(f for f in built.all(FUNCTION) if f.inputs["handler"] == HANDLERS["spot_interruption"])
    assert not {"iam:PassRole", "ec2:RunInstances"} & actions_of(built.policy(spot.inputs["name"]))


def test_without_pcs_the_guardrails_are_as_before(base_config: dict[str, Any]) -> None:
    spec = everything(base_config)
    plain = build(spec, restart_jobs=False)
    for fn in plain.all(FUNCTION):
        assert PCS_CLUSTER_ENV not in fn.inputs["environment"]["variables"]
        assert not any(a.startswith("pcs:") for a in actions_of(plain.policy(fn.inputs["name"])))


def test_the_workload_boundary_lets_the_guardrails_act_on_pcs() -> None:
    """Guardrail roles carry the workload boundary (infra/bootstrap-state): it must allow what they need."""
    from test_bootstrap_state import bootstrap_state

    boundary = bootstrap_state.workload_boundary("aws", "123456789012", "break-glass")
    allowed = {a for s in boundary["Statement"] if s["Effect"] == "Allow"
               for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    needed = {a for actions in PCS_IAM_ACTIONS.values() for a in actions}
    # as IAM matches actions: case-insensitive, with wildcards (the boundary lists EC2's describes as
    # ec2:Describe*, to fit its 6,144 characters)
    assert {a for a in needed if not any(fnmatch.fnmatchcase(a.lower(), p.lower()) for p in allowed)} == set()


def test_an_update_s_launch_uses_any_image_and_subnet_but_only_the_stack_s_templates(
    base_config: dict[str, Any],
) -> None:
    built = build_pcs(everything(base_config))
    fn = next(f for f in built.all(FUNCTION) if f.inputs["handler"] == HANDLERS["autostop"])
    policy = {"Statement": built.policy(fn.inputs["name"])}
    ec2 = f"arn:aws:ec2:{built.spec.region}:{MOCK_ACCOUNT}"
    for resource in (f"arn:aws:ec2:{built.spec.region}::snapshot/snap-1", f"{ec2}:subnet/subnet-existing"):
        assert allowed([policy], None, "ec2:RunInstances", resource), resource
    for resource in (f"{ec2}:security-group/sg-1", f"{ec2}:placement-group/pg-1"):
        assert not allowed([policy], None, "ec2:RunInstances", resource), resource
        assert allowed([policy], None, "ec2:RunInstances", resource,
                       **{"aws:ResourceTag/gpucluster:stack": built.spec.identity}), resource
    other_region = "arn:aws:ec2:us-west-2::image/ami-1"
    assert not allowed([policy], None, "ec2:RunInstances", other_region)


def test_the_stopping_functions_of_a_slurm_stack_have_time_to_wait_for_a_group_updating(
    base_config: dict[str, Any],
) -> None:
    spec = everything(base_config)
    plain = {f.inputs["handler"]: f.inputs["timeout"] for f in build(spec, restart_jobs=False).all(FUNCTION)}
    slurm = {f.inputs["handler"]: f.inputs["timeout"] for f in build_pcs(spec).all(FUNCTION)}
    for module, handler in HANDLERS.items():
        if handler not in slurm or handler not in plain:
            continue
        scales = any(a.startswith("pcs:") for a in PCS_IAM_ACTIONS.get(module, ()))
        wait = PCS_ACTIVE_WAIT_SECONDS if scales else 0
        assert slurm[handler] == min(plain[handler] + wait, 900), module
    assert slurm[HANDLERS["budget_action"]] == 120 + PCS_ACTIVE_WAIT_SECONDS
