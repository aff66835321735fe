"""Security-group rules: nothing open to the world, and the nodes of a group reach each other only.

Owns `no-open-ingress` and `intra-group-traffic`, and the reading of security
groups they share with the EFA rule: the groups a launch template's
interfaces name (`security_groups_of`) and whether a group allows all traffic
to and from itself (`SelfRules`). Pure: reads resource records only, never
Pulumi or AWS.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpucluster.policy.records import EXTERNAL, UNKNOWN, Resource, Stack, dig, items, truthy
from gpucluster.policy.rules.groups import node_groups
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import (
    SECURITY_GROUP,
    SG_EGRESS_RULE,
    SG_INGRESS_RULE,
    SG_RULE,
)

OPEN_IPV4, OPEN_IPV6 = "0.0.0.0/0", "::/0"
# EC2 API, IpPermission.IpProtocol: "-1" means all protocols (the provider also accepts "all").
ALL_TRAFFIC = ("-1", "all")


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


def security_groups_of(stack: Stack, lt: Resource, nics: Sequence[Any]) -> list[Any]:
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


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


class SelfRules:
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
    self_rules = SelfRules(stack)  # rules filed by group once: linear in node groups, as efa-wiring
    ingress = _all_traffic_ingress(stack)
    for g in node_groups(stack):
        lt = g.launch_template
        if not isinstance(lt, Resource) or g.max_nodes is None:
            continue
        nics = items(lt.props.get("networkInterfaces"))
        if nics is UNKNOWN:
            continue
        resolved = security_groups_of(stack, lt, nics)
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
