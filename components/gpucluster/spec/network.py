"""Named checks of the `network` section: zones inside the region, a created or an existing VPC.

Each check is a small function returning findings; never imports Pulumi, AWS or the renderers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpucluster.spec.checks import check, join_path
from gpucluster.spec.fields import REGION_KEY
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import NetworkConfig, StackSpec


@check
def zones_in_region(spec: StackSpec) -> Iterable[Finding]:
    yield from zone_region_findings(spec.network.availability_zones, spec.region)


def zone_region_findings(zones: Sequence[str], region: str, path: str = "network.availability_zones",
                         region_key: str = REGION_KEY) -> Iterable[Finding]:
    """Every zone lies in the region."""
    for i, az in enumerate(zones):
        if not az.startswith(region) or len(az) != len(region) + 1:
            yield Finding(f"{path}[{i}]", f"{az!r} is not a zone of region {region!r} ({region_key})")


@check
def network_source(spec: StackSpec) -> Iterable[Finding]:
    yield from network_findings(spec.network)


def network_findings(net: NetworkConfig, path: str = "network",
                     subnets_key: str = "existing_subnets") -> Iterable[Finding]:
    """A created or an existing VPC, and for an existing one a subnet in each zone, no more."""
    subnets = join_path(path, subnets_key)
    zones = join_path(path, "availability_zones")
    if (net.vpc_cidr is None) == (net.existing_vpc_id is None):
        yield Finding(path or "existing_vpc_id",
                      "set exactly one of vpc_cidr (create a VPC) or existing_vpc_id")
    if net.existing_vpc_id:
        for az in net.availability_zones:
            if az not in net.existing_subnets:
                yield Finding(subnets, f"no subnet given for availability zone {az!r}")
        for az in net.existing_subnets:
            if az not in net.availability_zones:
                yield Finding(f"{subnets}.{az}", f"zone is not listed in {zones}")
    elif net.existing_subnets:
        yield Finding(subnets, "only used with existing_vpc_id")
