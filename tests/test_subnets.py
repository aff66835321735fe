"""Subnet CIDR plan of a created VPC, pure."""

from __future__ import annotations

import ipaddress

import pytest

from gpucluster.subnets import plan_subnets


def test_three_zones_in_a_16() -> None:
    plan = plan_subnets("10.30.0.0/16", ["us-west-2a", "us-west-2b", "us-west-2c"])
    assert plan.private == {"us-west-2a": "10.30.0.0/19", "us-west-2b": "10.30.32.0/19",
                            "us-west-2c": "10.30.64.0/19"}
    assert plan.public == "10.30.224.0/22"


@pytest.mark.parametrize("cidr", ["10.0.0.0/16", "172.16.0.0/20", "192.168.4.0/22"])
def test_subnets_fit_the_vpc_and_never_overlap(cidr: str) -> None:
    zones = [f"us-east-1{c}" for c in "abcdef"]
    plan = plan_subnets(cidr, zones)
    nets = [ipaddress.IPv4Network(c) for c in [*plan.private.values(), plan.public]]
    vpc = ipaddress.IPv4Network(cidr)
    assert all(n.subnet_of(vpc) for n in nets)
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    assert ipaddress.IPv4Network(plan.public).prefixlen <= 28  # AWS's smallest subnet is a /28


def test_zone_count_is_bounded() -> None:
    with pytest.raises(ValueError, match=r"1\.\.6"):
        plan_subnets("10.0.0.0/16", [f"us-east-1{c}" for c in "abcdefg"])
