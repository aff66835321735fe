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
    # "3200 Gigabit", "4x 100 Gigabit", "Up to 25 Gigabit"
    performance = aws["NetworkInfo"]["NetworkPerformance"]
    count, _, per = performance.removeprefix("Up to ").removesuffix(" Gigabit").rpartition("x ")
    assert entry.network_gbps == float(per) * int(count or 1), performance
    assert entry.network_up_to == performance.startswith("Up to "), performance


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
    if entry.capacity_block_only:
        assert entry.on_demand_usd_per_hour == {}  # nothing to invent a price from
        assert entry.family.capacity_block_usd_per_hour
        return
    for region in ("us-east-1", "us-west-2"):
        assert entry.on_demand_price(region) > 0


def test_capacity_block_only_types_have_no_on_demand_price() -> None:
    p5e = catalog.get("p5e.48xlarge")
    assert p5e is not None and p5e.capacity_block_only
    assert [n for n in catalog.names() if catalog.get(n).capacity_block_only] == ["p5e.48xlarge"]  # type: ignore[union-attr]
    with pytest.raises(KeyError, match="no on-demand list price: AWS sells it as Capacity Blocks"):
        p5e.on_demand_price("us-west-2")


# -------------------------------------------------------------------- offerings


def test_shipped_offerings_are_exactly_motos() -> None:
    """data/offerings.yaml is what refresh_offerings generates from the installed moto, byte for byte."""
    from gpucluster.catalog import refresh_offerings

    assert catalog.OFFERINGS_FILE.read_text() == refresh_offerings.moto_text()
    assert refresh_offerings.main(["--check"]) == 0


def test_offerings_header_names_source_and_date() -> None:
    source, as_of = catalog.offerings_source()
    assert source.startswith("moto 5.2.5 ec2/resources/instance_type_offerings/availability-zone")
    assert "DescribeInstanceTypeOfferings" in source and as_of == catalog.MOTO_OFFERINGS_AS_OF
    head = catalog.OFFERINGS_FILE.read_text().split("\nsource:")[0]
    assert f"as of {as_of}" in head and "refresh_offerings" in head


def test_p5e_is_not_offered_in_us_east_1() -> None:
    assert catalog.offered_zones("p5e.48xlarge", "us-east-1") == []
    assert not catalog.is_offered("p5e.48xlarge", "us-east-1")
    assert catalog.offered_zones("p5e.48xlarge", "us-west-2") == ["us-west-2c"]
    assert catalog.offered_anywhere("p5e.48xlarge")["us-east-2"] == ["us-east-2a", "us-east-2b", "us-east-2c"]
    assert catalog.is_offered("p5.48xlarge", "us-east-1", "us-east-1d")
    assert not catalog.is_offered("p4de.24xlarge", "us-east-1", "us-east-1a")
    assert catalog.offered_zones("p5.48xlarge", "xx-nowhere-1") is None  # not covered: unknown


def test_offerings_hold_only_catalog_types_and_each_is_offered_somewhere() -> None:
    names = set(catalog.names())
    assert all(catalog.offered_anywhere(n) for n in names)
    raw = catalog._offerings()["regions"]
    assert {t for types in raw.values() if types for t in types} <= names
    assert all(zone.startswith(region) for region, types in raw.items() if types
               for zones in types.values() for zone in zones)


def test_refresh_from_aws_asks_describe_instance_type_offerings() -> None:
    """The --from-aws path, against moto (which answers from the same data): the same zones."""
    from gpucluster.catalog import refresh_offerings

    with mock_aws():
        asked = refresh_offerings.from_aws(catalog.names(), ["us-east-1", "us-west-2"],
                                           boto3.Session(region_name="us-east-1"))
    shipped = refresh_offerings.from_moto(catalog.names())
    assert asked == {r: shipped[r] for r in ("us-east-1", "us-west-2")}


# ------------------------------------------------------------------- GPU peaks


def test_every_gpu_has_cited_dense_peaks() -> None:
    for name in catalog.names():
        entry = catalog.get(name)
        assert entry is not None
        gpu = catalog.gpu_model(entry.gpu_model)
        assert gpu is not None, f"{entry.gpu_model} has no peaks"
        assert gpu.peak_tflops("fp16") and gpu.peak_tflops("fp32") and gpu.source
    h100 = catalog.gpu_model("H100")
    assert h100 is not None and (h100.peak_tflops("bf16"), h100.peak_tflops("fp8")) == (989, 1979)
    assert "data sheet" in h100.source
    t4 = catalog.gpu_model("T4")
    assert t4 is not None and t4.peak_tflops("bf16") is None  # Turing: no BF16


def test_unknown_region_price_names_known_regions() -> None:
    entry = catalog.get("p5.48xlarge")
    assert entry is not None
    with pytest.raises(KeyError, match="us-east-1, us-west-2"):
        entry.on_demand_price("eu-west-9")


def test_family_of_handles_hyphenated_families() -> None:
    assert catalog.family_of("p6-b200.48xlarge") == "p6-b200"
    assert catalog.family_of("g6e.xlarge") == "g6e"


@pytest.mark.parametrize(("name", "gbps", "up_to"), [
    # EC2 user guide, "Network specifications" (accelerated computing): EFA bandwidth per instance
    ("p5.48xlarge", 3200, False), ("p5en.48xlarge", 3200, False), ("p6-b200.48xlarge", 3200, False),
    ("p4d.24xlarge", 400, False), ("g6e.48xlarge", 400, False), ("g6e.12xlarge", 100, False),
    ("g5.xlarge", 10, True),
])
def test_known_network_bandwidth(name: str, gbps: float, up_to: bool) -> None:
    entry = catalog.get(name)
    assert entry is not None and (entry.network_gbps, entry.network_up_to) == (gbps, up_to)
