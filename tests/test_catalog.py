"""The embedded catalog against the DescribeInstanceTypes data moto carries."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from gpucluster import catalog

REQUIRED_FAMILIES = {"p6-b200", "p5", "p5e", "p5en", "p4d", "p4de", "g6e", "g6", "g5", "g4dn"}


@pytest.fixture(scope="module")
def moto_types() -> dict[str, dict]:
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=catalog.names())
        return {t["InstanceType"]: t for page in pages for t in page["InstanceTypes"]}


def test_catalog_covers_required_families() -> None:
    assert {catalog.family_of(n) for n in catalog.names()} >= REQUIRED_FAMILIES


def test_moto_knows_most_catalog_types(moto_types: dict[str, dict]) -> None:
    assert len(moto_types) == len(catalog.names())


@pytest.mark.parametrize("name", catalog.names())
def test_catalog_matches_describe_instance_types(name: str, moto_types: dict[str, dict]) -> None:
    if name not in moto_types:
        pytest.skip(f"moto does not know {name}")
    entry, aws = catalog.get(name), moto_types[name]
    assert entry is not None
    gpus = aws["GpuInfo"]["Gpus"][0]
    assert entry.gpus == gpus["Count"]
    assert entry.gpu_memory_mib == gpus["MemoryInfo"]["SizeInMiB"]
    assert entry.vcpus == aws["VCpuInfo"]["DefaultVCpus"]
    assert entry.max_efa_interfaces == aws["NetworkInfo"].get("EfaInfo", {}).get("MaximumEfaInterfaces", 0)
    assert entry.network_cards == aws["NetworkInfo"]["MaximumNetworkCards"]
    assert entry.nvme_total_gb == aws.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0)


@pytest.mark.parametrize(("name", "efa", "nvme_total_gb"), [
    # DESIGN.md facts: p4d 4 EFA / 8 x 1000 GB, p5 32 / 8 x 3800 GB, p5en 16, p6-b200 8,
    # g6e.48xlarge 4, g6e.24xlarge 2, single-GPU g5 none.
    ("p4d.24xlarge", 4, 8000), ("p5.48xlarge", 32, 30400), ("p5en.48xlarge", 16, 30400),
    ("p6-b200.48xlarge", 8, 30400), ("g6e.48xlarge", 4, 7600), ("g6e.24xlarge", 2, 3800),
    ("g5.xlarge", 0, 250),
])
def test_known_efa_and_nvme_facts(name: str, efa: int, nvme_total_gb: int) -> None:
    entry = catalog.get(name)
    assert entry is not None
    assert (entry.max_efa_interfaces, entry.nvme_total_gb) == (efa, nvme_total_gb)


@pytest.mark.parametrize("name", catalog.names())
def test_every_type_has_prices_in_both_regions(name: str) -> None:
    entry = catalog.get(name)
    assert entry is not None
    for region in ("us-east-1", "us-west-2"):
        assert entry.on_demand_price(region) > 0


def test_unknown_region_price_names_known_regions() -> None:
    entry = catalog.get("p5.48xlarge")
    assert entry is not None
    with pytest.raises(KeyError, match="us-east-1, us-west-2"):
        entry.on_demand_price("eu-west-9")


def test_family_of_handles_hyphenated_families() -> None:
    assert catalog.family_of("p6-b200.48xlarge") == "p6-b200"
    assert catalog.family_of("g6e.xlarge") == "g6e"
