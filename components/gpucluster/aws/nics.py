"""Network interface layout of a node group's launch template: pure, from catalog facts.

It owns which interfaces a GPU node gets (network card, device index,
interface type) for a given instance type and EFA setting. It must never
import Pulumi or call AWS: `nodes.py` turns this list into launch template
arguments, and the tests check it without any engine.

Layout (AWS EC2 user guide, "Maximize network bandwidth on Amazon EC2 instances
with multiple network cards", efa-acc-inst-types): one interface per network
card, up to the type's EFA maximum. Card 0 / device 0 is the primary and must
carry IP traffic, so it is `efa` (EFA with ENA; an `efa-only` interface cannot
be the primary). Every further card gets an `efa-only` interface at device
index 0: EFA-only interfaces take no IP address, so a p5.48xlarge uses one
private IPv4 address instead of 32 and Linux sees one routed interface.
Non-EFA groups get one plain ENA interface, declared so that
`associate_public_ip_address` can be pinned to false.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpucluster.catalog import InstanceType

InterfaceType = Literal["efa", "efa-only", "interface"]


@dataclass(frozen=True)
class Nic:
    """One launch-template network interface."""

    network_card_index: int
    device_index: int
    interface_type: InterfaceType


def network_interfaces(instance_type: InstanceType, efa: bool) -> list[Nic]:
    """The interfaces a node of `instance_type` gets, primary first.

    Raises ValueError for EFA on a type without EFA (the spec rejects that
    earlier; this guards direct callers).
    """
    if not efa:
        return [Nic(network_card_index=0, device_index=0, interface_type="interface")]
    if not instance_type.supports_efa:
        raise ValueError(f"{instance_type.name} has no EFA interfaces")
    primary = Nic(network_card_index=0, device_index=0, interface_type="efa")
    return [primary] + [Nic(network_card_index=card, device_index=0, interface_type="efa-only")
                        for card in range(1, instance_type.efa_interface_count)]
