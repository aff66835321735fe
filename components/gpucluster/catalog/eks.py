"""Kubernetes versions Amazon EKS runs and what each costs (data/eks_versions.yaml, data/eks_prices.yaml).

Pure: the stack file's check (`spec/scheduler.py`), the cost model and the EKS component read them. A
version's support on a day is `standard`, `extended` (charged more per cluster-hour) or `ended`; a version
the file does not list is unknown. Each file's header names the sources of its dates
(ledger: eks-kubernetes-versions) and prices (ledger: eks-prices) and says how to refresh them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from gpucluster.catalog import read_data_file

VERSIONS_FILE = Path(__file__).parent / "data" / "eks_versions.yaml"
PRICES_FILE = Path(__file__).parent / "data" / "eks_prices.yaml"
HOURS_PER_MONTH = 730  # gpucluster.pricing's month (the AWS Pricing Calculator's), which imports this module
Support = Literal["standard", "extended", "ended"]


@dataclass(frozen=True)
class EksVersion:
    """One Kubernetes version on EKS and the last days of its standard and extended support."""

    version: str
    standard_end: dt.date
    extended_end: dt.date

    def support(self, today: dt.date) -> Support:
        if today <= self.standard_end:
            return "standard"
        return "extended" if today <= self.extended_end else "ended"


@cache
def _versions_file(path: Path = VERSIONS_FILE) -> dict[str, Any]:
    return dict(read_data_file(path))


def versions(path: Path = VERSIONS_FILE) -> tuple[EksVersion, ...]:
    """Every listed version, newest first."""
    raw = _versions_file(path)
    found = [EksVersion(str(v["version"]), dt.date.fromisoformat(str(v["standard_end"])),
                        dt.date.fromisoformat(str(v["extended_end"]))) for v in raw["versions"]]
    return tuple(sorted(found, key=lambda v: tuple(int(p) for p in v.version.split(".")), reverse=True))


def version(name: str) -> EksVersion | None:
    """The listed version `name` (like "1.33"), or None."""
    return next((v for v in versions() if v.version == name), None)


def default_version(today: dt.date) -> EksVersion:
    """The newest version in standard support on `today`; when none is (a stale file), the newest listed."""
    listed = versions()
    return next((v for v in listed if v.support(today) == "standard"), listed[0])


def resolved_version(configured: str | None, today: dt.date) -> str:
    """The version a stack runs: the one it names, else the default on `today`."""
    return configured or default_version(today).version


def ami_parameter(kubernetes_version: str) -> str:
    """The public SSM parameter of the EKS-optimised AL2023 NVIDIA AMI for the version (x86_64)."""
    return str(_versions_file()["ami_parameter"]).replace("{version}", kubernetes_version)


def source() -> tuple[str, str]:
    """(source, as_of) of the versions file."""
    raw = _versions_file()
    return str(raw["source"]), str(raw["as_of"])


@dataclass(frozen=True)
class EksPrices:
    """A region's EKS fees: the control plane per cluster-hour by support, the system nodes per hour."""

    control_plane_usd_per_hour: dict[str, float]
    system_instance_usd_per_hour: dict[str, float]
    source: str
    system_source: str
    as_of: str


def prices(region: str, path: Path = PRICES_FILE) -> EksPrices | None:
    """The region's EKS prices, or None where the file carries none."""
    raw = read_data_file(path)
    rates = raw["regions"].get(region)
    if rates is None:
        return None
    return EksPrices({k: float(v) for k, v in rates["control_plane_usd_per_hour"].items()},
                     {k: float(v) for k, v in rates["system_instance_usd_per_hour"].items()},
                     str(raw["source"]), str(raw["system_source"]), str(raw["as_of"]))


def price_regions(path: Path = PRICES_FILE) -> list[str]:
    return sorted(read_data_file(path)["regions"])


@dataclass(frozen=True)
class Fee:
    """One EKS cost line of a stack, per month (the cost model makes it an `OtherCost`)."""

    name: str
    usd_per_month: float
    basis: str
    source: str
    as_of: str


def fees(region: str, scheduler: Any, today: dt.date) -> list[Fee]:
    """An EKS stack's fees (none on another stack; `scheduler` is the spec's SchedulerConfig): the control
    plane all month, at the extended-support rate when the version is past standard support on `today`,
    and the system nodes' EC2 hours (their root volumes not counted). Neither stops with the GPU groups.
    LookupError where the region or the system instance type has no price."""
    if not scheduler.eks:
        return []
    rates = prices(region)
    if rates is None:
        raise LookupError(f"no Amazon EKS prices for region {region} (have: {', '.join(price_regions())})")
    name = resolved_version(scheduler.kubernetes_version, today)
    found = version(name)
    support = "extended" if found is not None and found.support(today) != "standard" else "standard"
    hourly = rates.control_plane_usd_per_hour[support]
    system = scheduler.system_nodes
    rate = rates.system_instance_usd_per_hour.get(system.instance_type)
    if rate is None:
        raise LookupError(f"scheduler.system_nodes.instance_type: no price for {system.instance_type} in "
                          f"{region} (have: {', '.join(sorted(rates.system_instance_usd_per_hour))})")
    return [Fee(f"EKS control plane (Kubernetes {name}, {support} support)", hourly * HOURS_PER_MONTH,
                f"1 cluster x ${hourly:g}/h ({support} support), all month", rates.source, rates.as_of),
            Fee("EKS system nodes", system.count * rate * HOURS_PER_MONTH,
                f"{system.count} x {system.instance_type} x ${rate}/h on-demand, all month; root volumes "
                "not counted", rates.system_source, rates.as_of)]


def today() -> dt.date:
    """The day support is judged on (UTC)."""
    return dt.datetime.now(dt.UTC).date()
