"""AWS PCS (managed Slurm) rules: what a PCS cluster and its compute node groups need to work and stay safe.

Owns `pcs-node-instance-profile` (the node role AWS PCS accepts, allowed to
register its instances), `pcs-launch-template` (a custom launch template with
IMDSv2 and no public IP), `pcs-slurm-traffic` (the security groups between the
PCS controller's interface and the nodes), `pcs-login-no-gpu` (the login
group buys no GPU) and `pcs-accounting` (Slurm accounting on where the policy
config asks for it, prod by default). A stack without PCS resources passes
every one. Pure: reads resource records only, never Pulumi or AWS.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.fleet.tags import SLURM_LOGIN_GROUP
from gpucluster.policy.records import (
    EXTERNAL,
    UNKNOWN,
    Resource,
    Stack,
    dig,
    effective_tags,
    items,
    number,
    truthy,
)
from gpucluster.policy.rules.groups import is_gpu_type
from gpucluster.policy.rules.iam import statements_of
from gpucluster.policy.rules.network import OPEN_IPV4, OPEN_IPV6, SelfRules, security_groups_of
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import (
    IAM_ATTACHMENTS,
    IAM_INSTANCE_PROFILE,
    IAM_MANAGED_POLICY,
    IAM_ROLE,
    IAM_ROLE_POLICY,
    LAUNCH_TEMPLATE,
    PCS_CLUSTER,
    PCS_NODE_GROUP,
    SECURITY_GROUP,
    SG_EGRESS_RULE,
    SG_INGRESS_RULE,
    SG_RULE,
)

# "IAM instance profiles for AWS Parallel Computing Service",
# https://docs.aws.amazon.com/pcs/latest/userguide/security-instance-profiles.html: the role's name starts
# with AWSPCS or its path contains /aws-pcs/, and it may call pcs:RegisterComputeNodeGroupInstance.
PCS_NAME_PREFIX, PCS_PATH = "AWSPCS", "/aws-pcs/"
REGISTER_ACTION = "pcs:RegisterComputeNodeGroupInstance"
# "Security groups in AWS PCS", https://docs.aws.amazon.com/pcs/latest/userguide/working-with_networking_sg.html:
# slurmctld listens on 6817 (the nodes call it), slurmd on 6818 (the controller calls it).
SLURMCTLD_PORT, SLURMD_PORT = 6817, 6818


def _node_groups(stack: Stack) -> list[Resource]:
    return stack.of_type(PCS_NODE_GROUP)


def _group_name(group: Resource) -> str:
    name = group.props.get("name")
    return name if isinstance(name, str) else group.name


# ---------------------------------------------------------------- the instance profile


@rule("pcs-node-instance-profile",
      "AWS PCS compute node groups launch with an instance profile whose role (and profile) are named "
      "AWSPCS... or sit under the path /aws-pcs/, and whose role may call "
      "pcs:RegisterComputeNodeGroupInstance.",
      "stack")
def pcs_node_instance_profile(stack: Stack,
                              config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for group in _node_groups(stack):
        arn = group.props.get("iamInstanceProfileArn")
        if arn is None:
            yield group, "no iamInstanceProfileArn: AWS PCS nodes need an instance profile to register"
            continue
        profile = stack.resolve(group, "iamInstanceProfileArn", arn, [IAM_INSTANCE_PROFILE])
        if not isinstance(profile, Resource):
            continue  # unknown yet, or a profile this stack does not own: nothing to judge
        if _pcs_named(profile) is False:
            yield group, (f"instance profile {profile.name} is neither named {PCS_NAME_PREFIX}... nor under "
                          f"the path {PCS_PATH}: AWS PCS refuses it")
        role = stack.resolve(profile, "role", profile.props.get("role"), [IAM_ROLE])
        if not isinstance(role, Resource):
            continue
        if _pcs_named(role) is False:
            yield group, (f"role {role.name} of instance profile {profile.name} is neither named "
                          f"{PCS_NAME_PREFIX}... nor under the path {PCS_PATH}: AWS PCS refuses it")
        if _may_register(stack, role) is False:
            yield group, (f"role {role.name} of instance profile {profile.name} is not allowed "
                          f"{REGISTER_ACTION}: its nodes cannot join the cluster")


def _pcs_named(resource: Resource) -> bool | None:
    """The resource's name starts with AWSPCS or its path contains /aws-pcs/ (None: not known yet)."""
    path, name = resource.props.get("path"), resource.props.get("name", resource.props.get("namePrefix"))
    if path is UNKNOWN or name is UNKNOWN:
        return None
    return (isinstance(path, str) and PCS_PATH in path) or (
        isinstance(name, str) and name.startswith(PCS_NAME_PREFIX))


def _allows_register(document: Any) -> bool | None:
    statements = statements_of(document)
    if statements is UNKNOWN:
        return None
    for s in statements:
        actions = items(s.get("Action"))
        if s.get("Effect") == "Allow" and actions is not UNKNOWN and any(
                isinstance(a, str) and re.fullmatch(a.replace("*", ".*"), REGISTER_ACTION, re.IGNORECASE)
                for a in actions):
            return True
    return False


def _may_register(stack: Stack, role: Resource) -> bool | None:
    """Whether a policy on `role` (inline, a RolePolicy or an attached stack policy) allows the action."""
    verdicts: list[bool | None] = []
    inline = items(role.props.get("inlinePolicies"))
    for policy in inline if inline is not UNKNOWN else [{"policy": UNKNOWN}]:
        verdicts.append(_allows_register(dig(policy, "policy")))
    for rp in stack.of_type(IAM_ROLE_POLICY):
        owner = stack.resolve(rp, "role", rp.props.get("role"), [IAM_ROLE])
        if owner is role or owner is UNKNOWN:
            verdicts.append(_allows_register(rp.props.get("policy")))
    for attachment in stack.of_type(*IAM_ATTACHMENTS):
        owner = stack.resolve(attachment, "role", attachment.props.get("role"), [IAM_ROLE])
        if owner is not role and owner is not UNKNOWN:
            continue
        arn = attachment.props.get("policyArn")
        policy = stack.resolve(attachment, "policyArn", arn, [IAM_MANAGED_POLICY])
        if isinstance(policy, Resource):
            verdicts.append(_allows_register(policy.props.get("policy")))
        elif policy is UNKNOWN:
            verdicts.append(None)
    if True in verdicts:
        return True
    return None if None in verdicts else False


# ---------------------------------------------------------------- the launch template


@rule("pcs-launch-template",
      "AWS PCS compute node groups launch from a custom launch template that requires IMDSv2 and "
      "pins the primary interface to no public IP.",
      "stack")
def pcs_launch_template(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    # "Using Amazon EC2 launch templates with AWS PCS": without customLaunchTemplate PCS has no template of
    # ours, so none of the hardening (IMDSv2, interfaces, tags) reaches the nodes.
    for group in _node_groups(stack):
        spec = group.props.get("customLaunchTemplate")
        if spec is UNKNOWN:
            continue
        ref = dig(spec, "templateId")
        if ref is None:
            yield group, ("no customLaunchTemplate.templateId: the nodes would launch without our launch "
                          "template")
            continue
        lt = stack.resolve(group, "customLaunchTemplate", ref, [LAUNCH_TEMPLATE])
        if not isinstance(lt, Resource):
            continue  # unknown yet, or a template this stack does not own
        tokens = dig(lt.props, "metadataOptions", "httpTokens")
        if tokens is not UNKNOWN and tokens != "required":
            yield group, (f"launch template {lt.name} has metadataOptions.httpTokens {tokens!r}, not "
                          "'required' (IMDSv2)")
        nics = items(lt.props.get("networkInterfaces"))
        if nics is UNKNOWN:
            continue
        if any(truthy(dig(n, "associatePublicIpAddress")) for n in nics):
            yield group, f"launch template {lt.name} gives its nodes a public IP (associatePublicIpAddress)"
            continue
        primary = next((n for n in nics if number(dig(n, "deviceIndex"), 0) == 0
                        and number(dig(n, "networkCardIndex"), 0) == 0), None)
        pinned = dig(primary, "associatePublicIpAddress")
        if pinned is not UNKNOWN and pinned not in (False, "false"):
            yield group, (f"launch template {lt.name} does not pin associatePublicIpAddress = false on its "
                          "primary interface: the subnet's auto-assign setting would decide")


# ---------------------------------------------------------------- the security groups


@rule("pcs-slurm-traffic",
      "The AWS PCS cluster's security groups and each compute node group's allow Slurm both ways: the "
      "nodes to slurmctld (TCP 6817) and the controller to slurmd (TCP 6818), or one group shared by "
      "both that allows all traffic to and from itself; a group of more than one node also has a group "
      "allowing all traffic to and from itself (srun, NCCL).",
      "stack")
def pcs_slurm_traffic(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    clusters = stack.of_type(PCS_CLUSTER)
    if not clusters:
        return
    self_rules = SelfRules(stack)
    for group in _node_groups(stack):
        cluster = stack.resolve(group, "clusterId", group.props.get("clusterId"), [PCS_CLUSTER])
        if not isinstance(cluster, Resource):
            cluster = clusters[0] if len(clusters) == 1 and group.props.get("clusterId") is UNKNOWN else None
        if cluster is None:
            continue
        controller = _cluster_groups(stack, cluster)
        nodes = _node_security_groups(stack, group)
        if controller is None or nodes is None:
            continue  # not known yet
        if not controller:
            yield cluster, "networking.securityGroupIds is empty: the controller cannot reach the nodes"
            continue
        if not nodes:
            continue  # pcs-launch-template reports a group without a launch template
        yield from ((group, m) for m in _peer_traffic(stack, group, nodes, self_rules))
        shared = [sg for sg in controller if any(sg is n for n in nodes)]
        verdicts = [self_rules.verdict(sg) for sg in shared]
        if any(v == (True, True) for v in verdicts) or any(None in v for v in verdicts):
            continue
        name = _group_name(group)
        for port, daemon, sources, targets, where in (
                (SLURMCTLD_PORT, "slurmctld", nodes, controller, "from the nodes to the controller"),
                (SLURMD_PORT, "slurmd", controller, nodes, "from the controller to the nodes")):
            inbound = _any_allows(stack, "ingress", targets, sources, port)
            outbound = _any_allows(stack, "egress", sources, targets, port)
            if inbound is False:
                yield group, (f"node group {name}: no security group admits TCP {port} ({daemon}) {where}; "
                              "allow it, or share one group that allows all traffic to and from itself")
            elif outbound is False:
                yield group, (f"node group {name}: no security group lets TCP {port} ({daemon}) out {where}; "
                              "allow it, or share one group that allows all traffic to and from itself")


def _peer_traffic(stack: Stack, group: Resource, nodes: list[Resource],
                  self_rules: SelfRules) -> Iterable[str]:
    """A node group that can hold two nodes needs them to reach each other on any port: srun's port range
    and NCCL's are picked at run time ("Security groups in AWS PCS": the all-traffic self-referencing
    group). On an Auto Scaling stack intra-group-traffic judges this; it does not see PCS groups. EFA
    launch templates are efa-wiring's to judge, on either kind of stack."""
    most = dig(group.props, "scalingConfiguration", "maxInstanceCount")
    if most is UNKNOWN or number(most, 0) <= 1:
        return
    ref = dig(group.props, "customLaunchTemplate", "templateId")
    lt = stack.resolve(group, "customLaunchTemplate", ref, [LAUNCH_TEMPLATE])
    nics = items(lt.props.get("networkInterfaces")) if isinstance(lt, Resource) else UNKNOWN
    if nics is UNKNOWN or any(dig(n, "interfaceType") in ("efa", "efa-only") for n in nics):
        return
    verdicts = [self_rules.verdict(sg) for sg in nodes]
    if any(v == (True, True) for v in verdicts) or any(None in v for v in verdicts):
        return
    yield (f"node group {_group_name(group)}: up to {number(most, 0):g} nodes, but no security group of its "
           "launch template allows all traffic to and from itself: its nodes cannot reach each other (srun, "
           "NCCL)")


def _cluster_groups(stack: Stack, cluster: Resource) -> list[Resource] | None:
    refs = items(dig(cluster.props, "networking", "securityGroupIds"))
    if refs is UNKNOWN:
        return None
    resolved = [stack.resolve(cluster, "networking", r, [SECURITY_GROUP]) for r in refs]
    if any(sg is UNKNOWN or sg is EXTERNAL for sg in resolved):
        return None  # a group this stack cannot read: nothing to judge
    return [sg for sg in resolved if isinstance(sg, Resource)]


def _node_security_groups(stack: Stack, group: Resource) -> list[Resource] | None:
    ref = dig(group.props, "customLaunchTemplate", "templateId")
    lt = UNKNOWN if ref is UNKNOWN else stack.resolve(group, "customLaunchTemplate", ref, [LAUNCH_TEMPLATE])
    if lt is None:
        return []
    if not isinstance(lt, Resource):
        return None
    nics = items(lt.props.get("networkInterfaces"))
    if nics is UNKNOWN:
        return None
    resolved = security_groups_of(stack, lt, nics)
    if any(sg is UNKNOWN or sg is EXTERNAL for sg in resolved):
        return None
    return list({id(sg): sg for sg in resolved if isinstance(sg, Resource)}.values())


def _any_allows(stack: Stack, direction: str, owners: list[Resource], peers: list[Resource],
                port: int) -> bool | None:
    """Some group of `owners` lets TCP `port` in from (or out to) some group of `peers`; None: not known."""
    verdicts = [_allows(stack, direction, owner, peers, port) for owner in owners]
    if True in verdicts:
        return True
    return None if None in verdicts else False


def _allows(stack: Stack, direction: str, owner: Resource, peers: list[Resource], port: int) -> bool | None:
    candidates: list[bool | None] = []
    inline = items(owner.props.get(direction))
    if inline is UNKNOWN:
        return None
    for r in inline:
        peer_refs = items(dig(r, "securityGroups"))
        to_peer: bool | None = truthy(dig(r, "self")) and any(p is owner for p in peers)
        if peer_refs is UNKNOWN:
            to_peer = None
        elif not to_peer:
            resolved = [stack.resolve(owner, direction, p, [SECURITY_GROUP]) for p in peer_refs]
            to_peer = True if any(any(p is x for x in peers) for p in resolved) else (
                None if UNKNOWN in resolved else False)
        if not to_peer:
            to_peer = _cidr_peer(direction, dig(r, "cidrBlocks"), dig(r, "ipv6CidrBlocks")) or to_peer
        ports = _covers(dig(r, "protocol"), dig(r, "fromPort"), dig(r, "toPort"), port)
        candidates.append(_and(to_peer, ports))
    for r in stack.of_type(SG_INGRESS_RULE if direction == "ingress" else SG_EGRESS_RULE, SG_RULE):
        if r.type == SG_RULE and r.props.get("type") not in (direction, UNKNOWN):
            continue
        sg = stack.resolve(r, "securityGroupId", r.props.get("securityGroupId"), [SECURITY_GROUP])
        if sg is not owner and sg is not UNKNOWN:
            continue
        if r.type == SG_RULE:
            peer_key, protocol, cidrs = "sourceSecurityGroupId", r.props.get("protocol"), (
                r.props.get("cidrBlocks"), r.props.get("ipv6CidrBlocks"))
        else:
            peer_key, protocol, cidrs = "referencedSecurityGroupId", r.props.get("ipProtocol"), (
                r.props.get("cidrIpv4"), r.props.get("cidrIpv6"))
        if r.type == SG_RULE and truthy(r.props.get("self")):
            to_peer = any(p is owner for p in peers)
        else:
            value = r.props.get(peer_key)
            peer = None if value is None else stack.resolve(r, peer_key, value, [SECURITY_GROUP])
            to_peer = None if peer is UNKNOWN else any(peer is p for p in peers)
            to_peer = _cidr_peer(direction, *cidrs) or to_peer
        found = _and(to_peer, _covers(protocol, r.props.get("fromPort"), r.props.get("toPort"), port))
        candidates.append(None if sg is UNKNOWN and found else found)
    if True in candidates:
        return True
    return None if None in candidates else False


def _cidr_peer(direction: str, *cidrs: Any) -> bool:
    """Outbound to an address range reaches the peer's interfaces; inbound from one only if it is not the
    world (no-open-ingress faults that): the PCS controller's interface address is not known offline."""
    given = [c for value in cidrs for c in (items(value) if items(value) is not UNKNOWN else [])
             if isinstance(c, str) and c]
    if direction == "egress":
        return bool(given)
    return any(c not in (OPEN_IPV4, OPEN_IPV6) for c in given)


def _covers(protocol: Any, from_port: Any, to_port: Any, port: int) -> bool | None:
    if UNKNOWN in (protocol, from_port, to_port):
        return None
    if str(protocol) in ("-1", "all"):
        return True
    if str(protocol).lower() not in ("tcp", "6"):
        return False
    return number(from_port, -1) <= port <= number(to_port, -1)


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


# ---------------------------------------------------------------- login and accounting


@rule("pcs-login-no-gpu",
      "The AWS PCS login node group (named login) runs no GPU instance type: users submit jobs there, "
      "they do not compute there.",
      "stack")
def pcs_login_no_gpu(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for group in _node_groups(stack):
        if group.props.get("name") != SLURM_LOGIN_GROUP:
            continue
        configs = items(group.props.get("instanceConfigs"))
        for i, c in enumerate(configs if configs is not UNKNOWN else []):
            t = dig(c, "instanceType")
            if isinstance(t, str) and is_gpu_type(t):
                yield group, (f"the login group's instanceConfigs[{i}].instanceType is {t}, a GPU type: "
                              "pick a small CPU type (m7i.large)")


@rule("pcs-accounting",
      "AWS PCS clusters in the environments the policy config lists (prod by default) keep Slurm "
      "accounting on (slurmConfiguration.accounting.mode STANDARD): who ran what is the record "
      "spend and chargeback read.",
      "stack",
      schema={"required_environments": {"type": "array", "items": {"type": "string"},
                                        "description": "Environments whose PCS clusters need accounting."}},
      defaults={"required_environments": ["prod"]})
def pcs_accounting(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    # Per environment as nonprod-autostop's exempt_environments: a list in the rule's config, prod by default.
    # "Slurm accounting in AWS PCS": mode STANDARD turns it on; it cannot be turned on or off later without
    # replacing the cluster (AWS::PCS::Cluster SlurmConfiguration: update requires replacement).
    for cluster in stack.of_type(PCS_CLUSTER):
        tags = effective_tags(cluster)
        own = tags.get("environment") if isinstance(tags, Mapping) else None
        env = own if isinstance(own, str) and own else stack.environment()  # the cluster's tag, else stack's
        if env is None or env not in config["required_environments"]:
            continue
        mode = dig(cluster.props, "slurmConfiguration", "accounting", "mode")
        if mode is UNKNOWN or mode == "STANDARD":
            continue
        yield cluster, (f"{env} cluster without Slurm accounting (slurmConfiguration.accounting.mode is "
                        f"{mode!r}, not 'STANDARD'): set scheduler.accounting: true")
