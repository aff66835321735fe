"""`gpucluster catalog prices --region R`: a region's prices from the AWS Price List API, into the project.

The catalog carries list prices for us-east-1 and us-west-2 only. For any other region this asks the
Price List (pricing:GetProducts, the query `fleet.pricelist` runs for the spend guard) for the
on-demand price of every catalog type offered there and for the stack's other unit prices (EBS,
NAT, endpoints, S3, AMP, Grafana, logs, KMS, FSx for Lustre), and writes them into the project's
price file (catalog.PRICE_FILE_NAME), which `plan`, `cost` and `recommend` read. A unit price the
Price List does not answer is named in the outcome and left out: `cost` then says which is missing.

The product attributes of the other unit prices (service codes, usage types, units) are written from
memory of the Price List's documents (ledger: price-list-service-query); each query is one line of
SERVICE_QUERIES, so a wrong one is fixed there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from gpucluster import catalog
from gpucluster.fleet.awsapi import pricing_region
from gpucluster.fleet.pricelist import PriceListError, documents, instance_usd_per_hour
from gpucluster.ops import OpsError, make_client

SOURCE = "AWS Price List API (pricing:GetProducts)"


@dataclass(frozen=True)
class Query:
    """One unit price: the products of `service` whose attributes match, the first tier in `unit`."""

    service: str
    attributes: Mapping[str, str]
    unit: str
    usage_contains: str = ""
    scale: float = 1.0
    """Multiplies the listed price into the file's unit (per 10 million samples, per GB...)."""
    tier: int = 0
    """Which tier of a tiered price, by its beginRange order (0: the first)."""


# key in catalog/data/service_prices.yaml -> its query (ledger: price-list-service-query).
SERVICE_QUERIES: dict[str, Query] = {
    "ebs_gp3_usd_per_gb_month": Query("AmazonEC2", {"productFamily": "Storage", "volumeApiName": "gp3"},
                                      "GB-Mo"),
    "nat_gateway_usd_per_hour": Query("AmazonEC2", {"productFamily": "NAT Gateway"}, "Hrs",
                                      "NatGateway-Hours"),
    "nat_gateway_usd_per_gb": Query("AmazonEC2", {"productFamily": "NAT Gateway"}, "GB", "NatGateway-Bytes"),
    "public_ipv4_usd_per_hour": Query("AmazonVPC", {}, "Hrs", "PublicIPv4:InUseAddress"),
    "interface_endpoint_usd_per_hour": Query("AmazonVPC", {}, "Hrs", "VpcEndpoint-Hours"),
    "s3_standard_usd_per_gb_month": Query("AmazonS3", {"storageClass": "General Purpose",
                                                       "volumeType": "Standard"}, "GB-Mo", "TimedStorage"),
    "amp_ingest_usd_per_10m_samples": Query("AmazonPrometheus", {}, "Samples", "MetricSampleCount",
                                            scale=1e7),
    "amp_ingest_usd_per_10m_samples_over_2b": Query("AmazonPrometheus", {}, "Samples", "MetricSampleCount",
                                                    scale=1e7, tier=1),
    "amp_storage_usd_per_gb_month": Query("AmazonPrometheus", {}, "GB-Mo", "MetricStorage"),
    "amg_editor_usd_per_month": Query("AmazonGrafana", {}, "User", "Editor"),
    "amg_viewer_usd_per_month": Query("AmazonGrafana", {}, "User", "Viewer"),
    "vended_logs_usd_per_gb": Query("AmazonCloudWatch", {}, "GB", "VendedLog-Bytes"),
    "logs_storage_usd_per_gb_month": Query("AmazonCloudWatch", {}, "GB-Mo", "TimedStorage-ByteHrs"),
    "kms_key_usd_per_month": Query("awskms", {}, "Keys", "KMS-Keys"),
}
FSX_QUERIES: dict[str, Query] = {
    "SCRATCH_2": Query("AmazonFSx", {"fileSystemType": "Lustre", "deploymentOption": "Scratch_2"}, "GB-Mo"),
    **{f"PERSISTENT_2_{mbps}": Query("AmazonFSx", {"fileSystemType": "Lustre",
                                                   "deploymentOption": "Persistent_2",
                                                   "throughputCapacity": str(mbps)}, "GB-Mo")
       for mbps in (125, 250, 500, 1000)},
}


class PriceListUnavailable(OpsError):
    """The Price List has no price for any type in the region (a region AWS does not sell them in)."""


@dataclass(frozen=True)
class RegionPrices:
    """What `catalog prices` found for one region, and what it did not."""

    region: str
    as_of: str
    on_demand_usd_per_hour: dict[str, float]
    services: dict[str, Any]
    unpriced_types: list[str] = field(default_factory=list)
    missing_services: list[str] = field(default_factory=list)

    def entry(self) -> dict[str, Any]:
        """The region's entry of the price file."""
        doc: dict[str, Any] = {"source": SOURCE, "as_of": self.as_of,
                               "on_demand_usd_per_hour": dict(sorted(self.on_demand_usd_per_hour.items()))}
        if not self.missing_services:
            doc["services"] = self.services
        return doc


def _unit_price(pricing: Any, region: str, query: Query) -> float | None:
    filters = [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
               *({"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in query.attributes.items())]
    if query.usage_contains:
        filters.append({"Type": "CONTAINS", "Field": "usagetype", "Value": query.usage_contains})
    tiers: list[tuple[float, float]] = []
    for doc in documents(pricing, query.service, filters):
        for term in (doc.get("terms", {}).get("OnDemand") or {}).values():
            for dim in term.get("priceDimensions", {}).values():
                if dim.get("unit") == query.unit:
                    try:
                        start = float(dim.get("beginRange", 0) or 0)
                        tiers.append((start, float(dim["pricePerUnit"]["USD"])))
                    except (KeyError, TypeError, ValueError) as exc:
                        raise PriceListError(f"a {query.service} price is malformed: {exc!r}") from None
    firsts = sorted(tiers)
    starts = sorted({start for start, _ in firsts})
    if query.tier >= len(starts):
        return None
    at = [price for start, price in firsts if start == starts[query.tier] and price > 0]
    return round(max(at) * query.scale, 6) if at else None


def fetch_region_prices(pricing: Any, region: str, now: datetime) -> RegionPrices:
    """Every offered catalog type's on-demand price and the other unit prices of `region`."""
    offered = [n for n in catalog.names() if catalog.is_offered(n, region)
               and (t := catalog.get(n)) is not None and not t.capacity_block_only]
    prices: dict[str, float] = {}
    for name in offered:
        price = instance_usd_per_hour(pricing, region, name)
        if price is not None:
            prices[name] = round(price, 5)
    if offered and not prices:
        raise PriceListUnavailable(f"the AWS Price List has no on-demand price in {region} for any of "
                                   f"{len(offered)} GPU types offered there")
    services: dict[str, Any] = {}
    missing: list[str] = []
    for key, query in SERVICE_QUERIES.items():
        value = _unit_price(pricing, region, query)
        if value is None:
            missing.append(key)
        else:
            services[key] = value
    fsx: dict[str, float] = {}
    for option, query in FSX_QUERIES.items():
        value = _unit_price(pricing, region, query)
        if value is None:
            missing.append(f"fsx_lustre_usd_per_gb_month.{option}")
        else:
            fsx[option] = value
    services["fsx_lustre_usd_per_gb_month"] = fsx
    return RegionPrices(region, now.date().isoformat(), prices, services,
                        sorted(set(offered) - set(prices)), missing)


def pricing_client(region: str) -> Any:
    """A Price List client at the endpoint nearest `region` (fleet.awsapi.pricing_region)."""
    return make_client("pricing", pricing_region(region))


HEADER = (f"# Prices for regions gpucluster's catalog carries none for, written by `gpucluster catalog "
          f"prices --region R`\n# from the {SOURCE}. `plan`, `cost` and `recommend` read it; run the "
          "command again to refresh a region.\n")


def write_price_file(path: Path, found: RegionPrices) -> Path:
    """Merge `found` into the price file at `path` (other regions kept) and write it."""
    regions: dict[str, Any] = {}
    if path.is_file():
        try:
            regions = dict((yaml.safe_load(path.read_text()) or {}).get("regions") or {})
        except (yaml.YAMLError, AttributeError, TypeError, ValueError):
            raise OpsError(f"{path} is not a price file: move it away and run the command again") from None
    regions[found.region] = found.entry()
    path.write_text(HEADER + yaml.safe_dump({"regions": dict(sorted(regions.items()))}, sort_keys=False))
    return path
