"""The EFA rule: interfaces, security groups and placement as EFA needs them.

Owns `efa-wiring`: a primary interface on card 0, EFA interfaces within the
instance type's limits (the catalog's), a security group open to itself in
both directions (EC2 user guide, "Get started with EFA"), one subnet and a
cluster placement group, except for Capacity Blocks and capacity
reservations. Pure: reads resource records and the catalog, never Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster import catalog
from gpucluster.policy.records import EXTERNAL, UNKNOWN, Resource, Stack, dig, items, known_str, number
from gpucluster.policy.rules.groups import node_groups
from gpucluster.policy.rules.network import SelfRules, security_groups_of
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import LAUNCH_TEMPLATE, PLACEMENT_GROUP


@rule("efa-wiring",
      "EFA launch templates: a primary interface on card 0, EFA interfaces within the instance "
      "type's limits, a security group allowing all traffic to and from itself in both "
      "directions, one subnet and a cluster placement group (none for a Capacity Block, optional "
      "for a group targeting a capacity reservation).",
      "stack")
def efa_wiring(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    groups = node_groups(stack)
    verdicts = SelfRules(stack)  # each security group judged once, however many interfaces name it
    for lt in stack.of_type(LAUNCH_TEMPLATE):
        nics = items(lt.props.get("networkInterfaces"))
        if nics is UNKNOWN:
            continue
        efa = [n for n in nics if dig(n, "interfaceType") in ("efa", "efa-only")]
        if not efa:
            continue
        users = [g for g in groups if g.launch_template is lt]
        types = {t for g in users for t in g.instance_types}
        if known_str(lt.props.get("instanceType")):
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


def _efa_security_groups(stack: Stack, lt: Resource, efa: list[Any],
                         self_rules: SelfRules) -> Iterable[str]:
    """At least one security group on the EFA interfaces allows all traffic to and from itself."""
    resolved = security_groups_of(stack, lt, efa)
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


def _efa_placement(stack: Stack, asg: Resource, lt: Resource) -> Iterable[str]:
    subnets = items(asg.props.get("vpcZoneIdentifiers"))
    zones = items(asg.props.get("availabilityZones"))
    if subnets is not UNKNOWN and subnets and len(set(map(str, subnets))) != 1:
        yield f"an EFA group must use one subnet; vpcZoneIdentifiers has {len(subnets)}"
    elif not subnets and zones is not UNKNOWN and len(zones) != 1:
        yield f"an EFA group must use one availability zone and subnet; it has {len(zones) or 'none'}"
    nics = items(lt.props.get("networkInterfaces"))
    nic_subnets = {s for n in (nics if nics is not UNKNOWN else []) if known_str(s := dig(n, "subnetId"))}
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
