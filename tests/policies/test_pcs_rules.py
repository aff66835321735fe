"""The AWS PCS rules on synthetic stacks written with the engine's input names (aws-native camelCase).

Each rule gets a stack that passes and stacks that fail, asserting the message and the resource named;
the stacks are built here, not by the PCS components, so the rules stand on the AWS facts they cite.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpucluster.policy.records import UNKNOWN, Resource, Stack
from gpucluster.policy.rules import RULES, rules_by_name

BY_NAME = rules_by_name()
PROD = {"owner": "ml", "cost_center": "cc-1", "environment": "prod"}
DEV = {**PROD, "environment": "dev"}

LT = "aws:ec2/launchTemplate:LaunchTemplate"
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_OUT = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
ROLE = "aws:iam/role:Role"
PROFILE = "aws:iam/instanceProfile:InstanceProfile"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
POLICY = "aws:iam/policy:Policy"
ATTACH = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
CLUSTER = "aws-native:pcs:Cluster"
CNG = "aws-native:pcs:ComputeNodeGroup"


def res(type_: str, resource_name: str, **props: Any) -> Resource:
    """A record as `gpucluster plan` makes one: referenced by `<name>-id` and its name."""
    return Resource(type=type_, name=resource_name, props=props, urn=f"urn:{type_}::{resource_name}",
                    ids=(f"{resource_name}-id", resource_name))


def found(policy: str, resources: list[Resource],
          config: dict[str, Any] | None = None) -> list[tuple[str | None, str]]:
    rule = BY_NAME[policy]
    return [(r.name if r else None, m) for r, m in rule.check(Stack(resources), rule.settings(config))]


def doc(*actions: str) -> str:
    return json.dumps({"Version": "2012-10-17",
                       "Statement": [{"Effect": "Allow", "Action": list(actions), "Resource": "*"}]})


def nic(sg: str = "nodes-id", public: Any = "false", **more: Any) -> dict[str, Any]:
    return {"deviceIndex": 0, "networkCardIndex": 0, "securityGroups": [sg],
            "associatePublicIpAddress": public, **more}


def pcs_stack(*, role: dict[str, Any] | None = None, profile: dict[str, Any] | None = None,
              policy: str | None = None, lt: dict[str, Any] | None = None,
              group: dict[str, Any] | None = None,
              cluster: dict[str, Any] | None = None, sgs: list[Resource] | None = None,
              tags: dict[str, str] = PROD) -> list[Resource]:
    """A PCS stack as the Slurm side builds one: a cluster and a node group sharing a self-referencing
    security group, a launch template with IMDSv2 and no public IP, a /aws-pcs/ role allowed to register."""
    return [
        res(ROLE, "node-role", **(role if role is not None else {"path": "/aws-pcs/"}), tags=tags),
        res(ROLE_POLICY, "node-pcs", role="node-role-id",
            policy=policy if policy is not None else doc("pcs:RegisterComputeNodeGroupInstance")),
        res(PROFILE, "node-profile", **{"role": "node-role", "path": "/aws-pcs/", **(profile or {})},
            tags=tags),
        res(LT, "gpu-lt", **{"metadataOptions": {"httpTokens": "required"}, "networkInterfaces": [nic()],
                             **(lt or {})}),
        *(sgs if sgs is not None else [
            res(SG, "nodes", tags=tags),
            res(SG_IN, "nodes-self-in", securityGroupId="nodes-id", referencedSecurityGroupId="nodes-id",
                ipProtocol="-1"),
            res(SG_OUT, "nodes-self-out", securityGroupId="nodes-id", referencedSecurityGroupId="nodes-id",
                ipProtocol="-1")]),
        res(CLUSTER, "slurm", **{"scheduler": {"type": "SLURM", "version": "25.05"}, "size": "SMALL",
                                 "networking": {"subnetIds": ["subnet-1"], "securityGroupIds": ["nodes-id"]},
                                 "slurmConfiguration": {"accounting": {"mode": "STANDARD"}},
                                 **(cluster or {})}, tags=tags),
        res(CNG, "gpu-cng", **{"clusterId": "slurm-id", "name": "gpu",
                               "customLaunchTemplate": {"templateId": "gpu-lt-id", "version": "1"},
                               "iamInstanceProfileArn": "node-profile-id",
                               "instanceConfigs": [{"instanceType": "p5.48xlarge"}],
                               "scalingConfiguration": {"minInstanceCount": 0, "maxInstanceCount": 2},
                               **(group or {})}, tags=tags),
    ]


PCS_RULES = ("pcs-node-instance-profile", "pcs-launch-template", "pcs-slurm-traffic", "pcs-login-no-gpu",
             "pcs-accounting")


def test_the_rules_are_registered_after_the_existing_ones() -> None:
    assert [r.name for r in RULES][-5:] == list(PCS_RULES)


@pytest.mark.parametrize("policy", PCS_RULES)
def test_a_well_built_pcs_stack_passes(policy: str) -> None:
    assert found(policy, pcs_stack()) == []


@pytest.mark.parametrize("policy", PCS_RULES)
def test_a_stack_without_pcs_passes(policy: str) -> None:
    stack = [r for r in pcs_stack() if not r.type.startswith("aws-native:pcs")]
    assert found(policy, stack) == []


# ------------------------------------------------------------------ pcs-node-instance-profile


@pytest.mark.parametrize(("case", "kwargs", "expected"), [
    ("role named AWSPCS", {"role": {"name": "AWSPCS-gpu-nodes"}}, []),
    ("role named otherwise, no path", {"role": {"name": "gpu-nodes"}},
     ["role node-role of instance profile node-profile is neither named AWSPCS... nor under the path "
      "/aws-pcs/: AWS PCS refuses it"]),
    ("role auto-named, default path", {"role": {}},
     ["role node-role of instance profile node-profile is neither named AWSPCS... nor under the path "
      "/aws-pcs/: AWS PCS refuses it"]),
    ("profile outside /aws-pcs/", {"profile": {"path": "/"}},
     ["instance profile node-profile is neither named AWSPCS... nor under the path /aws-pcs/: AWS PCS "
      "refuses it"]),
    ("no register permission", {"policy": doc("ssm:UpdateInstanceInformation")},
     ["role node-role of instance profile node-profile is not allowed pcs:RegisterComputeNodeGroupInstance: "
      "its nodes cannot join the cluster"]),
    ("pcs:* is enough", {"policy": doc("pcs:*")}, []),
    ("no profile at all", {"group": {"iamInstanceProfileArn": None}},
     ["no iamInstanceProfileArn: AWS PCS nodes need an instance profile to register"]),
    ("unknown path cannot be judged", {"role": {"path": UNKNOWN}}, []),
    ("unknown policy cannot be judged", {"policy": UNKNOWN}, []),
])
def test_pcs_node_instance_profile(case: str, kwargs: dict[str, Any], expected: list[str]) -> None:
    assert found("pcs-node-instance-profile", pcs_stack(**kwargs)) == [("gpu-cng", m) for m in expected]


def test_register_permission_through_an_attached_stack_policy() -> None:
    stack = [r for r in pcs_stack() if r.type != ROLE_POLICY]
    assert [m for _, m in found("pcs-node-instance-profile", stack)] == [
        "role node-role of instance profile node-profile is not allowed "
        "pcs:RegisterComputeNodeGroupInstance: "
        "its nodes cannot join the cluster"]
    stack += [res(POLICY, "pcs-register", policy=doc("pcs:RegisterComputeNodeGroupInstance")),
              res(ATTACH, "attach", role="node-role", policyArn="pcs-register-id")]
    assert found("pcs-node-instance-profile", stack) == []


# ------------------------------------------------------------------ pcs-launch-template


@pytest.mark.parametrize(("case", "kwargs", "expected"), [
    ("no custom launch template", {"group": {"customLaunchTemplate": None}},
     "no customLaunchTemplate.templateId: the nodes would launch without our launch template"),
    ("IMDSv1 allowed", {"lt": {"metadataOptions": {"httpTokens": "optional"}}},
     "launch template gpu-lt has metadataOptions.httpTokens 'optional', not 'required' (IMDSv2)"),
    ("IMDS tokens unset", {"lt": {"metadataOptions": {}}},
     "launch template gpu-lt has metadataOptions.httpTokens None, not 'required' (IMDSv2)"),
    ("public IP", {"lt": {"networkInterfaces": [nic(public="true")]}},
     "launch template gpu-lt gives its nodes a public IP (associatePublicIpAddress)"),
    ("public IP left to the subnet", {"lt": {"networkInterfaces": [nic(public=None)]}},
     "launch template gpu-lt does not pin associatePublicIpAddress = false on its primary interface: the "
     "subnet's auto-assign setting would decide"),
    ("no interfaces at all", {"lt": {"networkInterfaces": []}},
     "launch template gpu-lt does not pin associatePublicIpAddress = false on its primary interface: the "
     "subnet's auto-assign setting would decide"),
])
def test_pcs_launch_template_faults(case: str, kwargs: dict[str, Any], expected: str) -> None:
    assert found("pcs-launch-template", pcs_stack(**kwargs)) == [("gpu-cng", expected)]


def test_pcs_launch_template_unknowns_pass() -> None:
    assert found("pcs-launch-template", pcs_stack(group={"customLaunchTemplate": UNKNOWN})) == []
    assert found("pcs-launch-template", pcs_stack(lt={"metadataOptions": {"httpTokens": UNKNOWN},
                                                      "networkInterfaces": UNKNOWN})) == []


# ------------------------------------------------------------------ pcs-slurm-traffic


def _port_rules(*, ctld: bool = True, slurmd: bool = True, egress: bool = True,
                peers: bool = True) -> list[Resource]:
    """A controller group and a node group with the restrictive Slurm ports (PCS's second example); the
    nodes' group lets them reach each other (all traffic to and from itself) unless `peers` is False."""
    rules = [res(SG, "ctl", tags=PROD), res(SG, "nodes", tags=PROD)]
    if peers:
        rules += [res(SG_IN, "nodes-self-in", securityGroupId="nodes-id",
                      referencedSecurityGroupId="nodes-id", ipProtocol="-1"),
                  res(SG_OUT, "nodes-self-out", securityGroupId="nodes-id",
                      referencedSecurityGroupId="nodes-id", ipProtocol="-1")]
    if ctld:
        rules.append(res(SG_IN, "ctl-6817", securityGroupId="ctl-id", referencedSecurityGroupId="nodes-id",
                         ipProtocol="tcp", fromPort=6817, toPort=6817))
    if slurmd:
        rules.append(res(SG_IN, "nodes-6818", securityGroupId="nodes-id", referencedSecurityGroupId="ctl-id",
                         ipProtocol="tcp", fromPort=6818, toPort=6818))
    if egress:
        rules += [res(SG_OUT, f"{g}-out", securityGroupId=f"{g}-id", cidrIpv4="10.0.0.0/16", ipProtocol="-1")
                  for g in ("ctl", "nodes")]
    return rules


SPLIT = {"networking": {"subnetIds": ["subnet-1"], "securityGroupIds": ["ctl-id"]}}


def test_pcs_slurm_traffic_passes_with_the_slurm_ports() -> None:
    assert found("pcs-slurm-traffic", pcs_stack(cluster=SPLIT, sgs=_port_rules())) == []


def test_pcs_slurm_traffic_passes_with_a_port_range_inline() -> None:
    sgs = [res(SG, "ctl", ingress=[{"protocol": "tcp", "fromPort": 6817, "toPort": 6819,
                                    "securityGroups": ["nodes-id"]}],
               egress=[{"protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"]}]),
           res(SG, "nodes", ingress=[{"protocol": "tcp", "fromPort": 6818, "toPort": 6818,
                                      "securityGroups": ["ctl-id"]},
                                     {"protocol": "-1", "fromPort": 0, "toPort": 0, "self": True}],
               egress=[{"protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"]},
                       {"protocol": "-1", "fromPort": 0, "toPort": 0, "self": True}])]
    assert found("pcs-slurm-traffic", pcs_stack(cluster=SPLIT, sgs=sgs)) == []


@pytest.mark.parametrize(("case", "sgs", "expected"), [
    ("no 6817 into the controller", _port_rules(ctld=False),
     "node group gpu: no security group admits TCP 6817 (slurmctld) from the nodes to the controller; allow "
     "it, or share one group that allows all traffic to and from itself"),
    ("no 6818 into the nodes", _port_rules(slurmd=False),
     "node group gpu: no security group admits TCP 6818 (slurmd) from the controller to the nodes; allow "
     "it, or share one group that allows all traffic to and from itself"),
])
def test_pcs_slurm_traffic_missing_port(case: str, sgs: list[Resource], expected: str) -> None:
    assert found("pcs-slurm-traffic", pcs_stack(cluster=SPLIT, sgs=sgs)) == [("gpu-cng", expected)]


def test_pcs_slurm_traffic_without_egress_says_so_both_ways() -> None:
    stack = pcs_stack(cluster=SPLIT, sgs=_port_rules(egress=False))
    assert [m for _, m in found("pcs-slurm-traffic", stack)] == [
        "node group gpu: no security group lets TCP 6817 (slurmctld) out from the nodes to the controller; "
        "allow it, or share one group that allows all traffic to and from itself",
        "node group gpu: no security group lets TCP 6818 (slurmd) out from the controller to the nodes; "
        "allow it, or share one group that allows all traffic to and from itself"]


def test_pcs_slurm_traffic_shared_group_without_a_self_rule_fails() -> None:
    sgs = [res(SG, "nodes", tags=PROD)]
    assert [m for _, m in found("pcs-slurm-traffic", pcs_stack(sgs=sgs))] == [
        PEERS,
        "node group gpu: no security group admits TCP 6817 (slurmctld) from the nodes to the controller; "
        "allow it, or share one group that allows all traffic to and from itself",
        "node group gpu: no security group admits TCP 6818 (slurmd) from the controller to the nodes; "
        "allow it, or share one group that allows all traffic to and from itself"]


def test_pcs_slurm_traffic_wrong_port_and_protocol() -> None:
    sgs = [*_port_rules(ctld=False),
           res(SG_IN, "ctl-udp", securityGroupId="ctl-id", referencedSecurityGroupId="nodes-id",
               ipProtocol="udp", fromPort=6817, toPort=6817),
           res(SG_IN, "ctl-22", securityGroupId="ctl-id", referencedSecurityGroupId="nodes-id",
               ipProtocol="tcp", fromPort=22, toPort=22)]
    assert [m.split(";")[0] for _, m in found("pcs-slurm-traffic", pcs_stack(cluster=SPLIT, sgs=sgs))] == [
        "node group gpu: no security group admits TCP 6817 (slurmctld) from the nodes to the controller"]


def test_pcs_slurm_traffic_empty_cluster_groups_name_the_cluster() -> None:
    stack = pcs_stack(cluster={"networking": {"subnetIds": ["subnet-1"], "securityGroupIds": []}})
    assert found("pcs-slurm-traffic", stack) == [
        ("slurm", "networking.securityGroupIds is empty: the controller cannot reach the nodes")]


def test_pcs_slurm_traffic_unknown_groups_pass() -> None:
    assert found("pcs-slurm-traffic", pcs_stack(cluster={"networking": UNKNOWN})) == []
    unknown_rule = [*_port_rules(ctld=False),
                    res(SG_IN, "ctl-later", securityGroupId="ctl-id", referencedSecurityGroupId="nodes-id",
                        ipProtocol="tcp", fromPort=UNKNOWN, toPort=UNKNOWN)]
    assert found("pcs-slurm-traffic", pcs_stack(cluster=SPLIT, sgs=unknown_rule)) == []


# ------------------------------------------------------------------ pcs-login-no-gpu


def _login(instance_type: str) -> Resource:
    return res(CNG, "login-cng", clusterId="slurm-id", name="login",
               instanceConfigs=[{"instanceType": instance_type}],
               scalingConfiguration={"minInstanceCount": 1, "maxInstanceCount": 1})


def test_pcs_login_no_gpu() -> None:
    assert found("pcs-login-no-gpu", [*pcs_stack(), _login("m7i.large")]) == []
    assert found("pcs-login-no-gpu", [*pcs_stack(), _login("g5.xlarge")]) == [
        ("login-cng", "the login group's instanceConfigs[0].instanceType is g5.xlarge, a GPU type: pick a "
                      "small CPU type (m7i.large)")]


# ------------------------------------------------------------------ pcs-accounting


@pytest.mark.parametrize(("case", "stack", "config", "expected"), [
    ("prod with accounting", pcs_stack(), None, []),
    ("prod without accounting", pcs_stack(cluster={"slurmConfiguration": {"accounting": {"mode": "NONE"}}}),
     None, [("slurm", "prod cluster without Slurm accounting (slurmConfiguration.accounting.mode is 'NONE', "
                      "not 'STANDARD'): set scheduler.accounting: true")]),
    ("prod with no slurmConfiguration", pcs_stack(cluster={"slurmConfiguration": None}), None,
     [("slurm", "prod cluster without Slurm accounting (slurmConfiguration.accounting.mode is None, not "
                "'STANDARD'): set scheduler.accounting: true")]),
    ("dev without accounting", pcs_stack(tags=DEV, cluster={"slurmConfiguration": {}}), None, []),
    ("dev required by config", pcs_stack(tags=DEV, cluster={"slurmConfiguration": {}}),
     {"required_environments": ["dev", "prod"]},
     [("slurm", "dev cluster without Slurm accounting (slurmConfiguration.accounting.mode is None, not "
                "'STANDARD'): set scheduler.accounting: true")]),
    ("unknown mode", pcs_stack(cluster={"slurmConfiguration": {"accounting": {"mode": UNKNOWN}}}), None, []),
])
def test_pcs_accounting(case: str, stack: list[Resource], config: dict[str, Any] | None,
                        expected: list[tuple[str, str]]) -> None:
    assert found("pcs-accounting", stack, config) == expected


def test_pcs_accounting_reads_the_clusters_own_environment_tag() -> None:
    stack = [r for r in pcs_stack(tags=DEV) if r.type != CLUSTER]
    stack.append(res(CLUSTER, "slurm", tags=PROD, slurmConfiguration={"accounting": {"mode": "NONE"}}))
    assert [name for name, _ in found("pcs-accounting", stack)] == ["slurm"]


PEERS = ("node group gpu: up to 2 nodes, but no security group of its launch template allows all traffic "
         "to and from itself: its nodes cannot reach each other (srun, NCCL)")


def test_pcs_slurm_traffic_multi_node_group_needs_a_self_referencing_group() -> None:
    stack = pcs_stack(cluster=SPLIT, sgs=_port_rules(peers=False))
    assert found("pcs-slurm-traffic", stack) == [("gpu-cng", PEERS)]
    one_node = pcs_stack(cluster=SPLIT, sgs=_port_rules(peers=False),
                         group={"scalingConfiguration": {"minInstanceCount": 0, "maxInstanceCount": 1}})
    assert found("pcs-slurm-traffic", one_node) == []
    efa = pcs_stack(cluster=SPLIT, sgs=_port_rules(peers=False),
                    lt={"networkInterfaces": [nic(interfaceType="efa")]})
    assert found("pcs-slurm-traffic", efa) == []  # efa-wiring judges EFA templates


# ------------------------------------------------------------------ the existing stack rules see PCS groups


def _cng(name: str, instance_type: str, most: int, option: str | None,
         tags: dict[str, str] = DEV) -> Resource:
    props: dict[str, Any] = {"clusterId": "slurm-id", "name": name,
                             "instanceConfigs": [{"instanceType": instance_type}],
                             "scalingConfiguration": {"minInstanceCount": 0, "maxInstanceCount": most}}
    if option is not None:
        props["purchaseOption"] = option
    return res(CNG, f"{name}-cng", tags=tags, **props)


def test_environment_limits_apply_to_pcs_node_groups() -> None:
    stack = [_cng("train", "p5.48xlarge", 2, None), _cng("login", "m7i.large", 1, None)]
    assert found("environment-limits", stack) == [
        ("train-cng", "p5.48xlarge is not allowed in dev (allowed: g4dn.*, g5.*, g6.*, g6e.*; see the "
                      "environment-limits policy config)"),
        ("train-cng", "dev is spot-only, but its purchaseOption is ONDEMAND (the default)"),
        (None, "at maximum size the stack runs 16 GPUs (train-cng 2 x 8), over the dev limit of 8")]
    assert found("environment-limits", [_cng("train", "g5.xlarge", 2, "SPOT"),
                                        _cng("login", "m7i.large", 1, None)]) == []
    assert [m for _, m in found("environment-limits", [_cng("train", "g5.xlarge", 2, "CAPACITY_BLOCK")])] == [
        "dev is spot-only, but it buys a Capacity Block (on-demand capacity)"]


def test_a_pcs_gpu_group_needs_a_budget_that_acts_and_nonprod_autostop() -> None:
    stack = [_cng("train", "g5.xlarge", 2, "SPOT"), _cng("login", "m7i.large", 1, None)]
    assert found("gpu-budget-with-action", stack) == [
        (None, "GPU groups (train-cng) but no aws:budgets/budget:Budget")]
    assert [m.split(" has ")[0] for _, m in found("nonprod-autostop", stack)] == [
        "dev stack with GPU groups (train-cng)"]
    assert found("gpu-budget-with-action", [_cng("login", "m7i.large", 1, None)]) == []
