"""CIDR plan of a created VPC: pure address arithmetic, no Pulumi, no AWS.

It owns how a VPC CIDR is cut: the VPC is split into eight equal blocks;
the private subnet of the n-th availability zone is block n (at most six
zones, so blocks 6 and 7 stay free for growth), and the one public subnet
that holds the NAT gateway is a small slice (1/64 of the VPC) at the start
of block 7. GPU nodes only ever live in the private subnets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

MAX_ZONES = 6


@dataclass(frozen=True)
class SubnetPlan:
    """Private subnet CIDR per zone (in the given zone order) and the NAT subnet CIDR."""

    private: dict[str, str]
    public: str


def plan_subnets(vpc_cidr: str, zones: Sequence[str]) -> SubnetPlan:
    """Cut `vpc_cidr` (a /16../22, validated by the spec) into the subnets of `zones`."""
    if not 1 <= len(zones) <= MAX_ZONES:
        raise ValueError(f"need 1..{MAX_ZONES} availability zones, got {len(zones)}")
    vpc = ipaddress.IPv4Network(vpc_cidr)
    blocks = list(vpc.subnets(prefixlen_diff=3))
    public = next(blocks[7].subnets(prefixlen_diff=3))
    return SubnetPlan(private={zone: str(blocks[i]) for i, zone in enumerate(zones)}, public=str(public))
