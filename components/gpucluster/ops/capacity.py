"""Capacity Blocks for ML: find offerings, buy one, and the node group that runs on it.

It owns the two EC2 calls that get scarce GPU capacity for a fixed window:
DescribeCapacityBlockOfferings (`search_offerings`, read-only) and PurchaseCapacityBlock
(`purchase`, which spends money at once: the whole block is paid up front and cannot be
cancelled). It never purchases on its own: `purchase` is called by `gpucluster capacity buy`
only after the user confirmed the total price (or passed --yes). It remembers the offerings a
search listed (`OfferingCache`, a JSON file in the user's cache directory), because AWS has no
call that describes one offering by id, and `buy OFFERING_ID` must show that offering's price
before it spends it. Clients are passed in (tests hand a Stubber's; moto lacks both calls).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpucluster import catalog
from gpucluster.ops import OpsError

# EC2 user guide, "Find and purchase Capacity Blocks": durations in 1-day steps up to 14 days, then in
# 7-day steps up to 182 days; up to 64 instances a block.
MAX_DAILY_DAYS, MAX_DAYS, MAX_INSTANCES = 14, 182, 64
PLATFORM = "Linux/UNIX"  # the Deep Learning AMI the node groups launch
# EC2 user guide, "Monitor Capacity Blocks using EventBridge": the expiration warning comes 40 minutes
# before the end; instances start terminating 10 minutes later (30 minutes before the end).
WARNING_BEFORE_END = timedelta(minutes=40)


class CapacityError(OpsError):
    """Bad input to a capacity command; `option` names the option at fault."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")


def duration_hours(days: int) -> int:
    """`--days` as the CapacityDurationHours AWS accepts."""
    if not (1 <= days <= MAX_DAILY_DAYS or (days % 7 == 0 and 0 < days <= MAX_DAYS)):
        raise CapacityError("--days", f"Capacity Blocks last 1-{MAX_DAILY_DAYS} days, or whole weeks up to "
                            f"{MAX_DAYS} days; got {days}")
    return days * 24


def check_request(instance_type: str, count: int) -> catalog.InstanceType:
    """The type can be bought as a Capacity Block, in a count AWS sells."""
    t = catalog.get(instance_type)
    if t is None:
        raise CapacityError("--type", f"unknown instance type {instance_type!r} (see `gpucluster recommend`)")
    if not t.family.capacity_blocks:
        blocks = sorted({catalog.family_of(n) for n in catalog.names()
                         if (c := catalog.get(n)) and c.family.capacity_blocks})
        raise CapacityError("--type", f"{instance_type} is not sold as Capacity Blocks for ML "
                            f"(families that are: {', '.join(blocks)})")
    if not 1 <= count <= MAX_INSTANCES:
        raise CapacityError("--count", f"a Capacity Block holds 1-{MAX_INSTANCES} instances, got {count}")
    return t


@dataclass(frozen=True)
class Offering:
    """One Capacity Block offering (DescribeCapacityBlockOfferings' CapacityBlockOffering)."""

    offering_id: str
    instance_type: str
    availability_zone: str
    instance_count: int
    start: datetime
    end: datetime
    duration_hours: int
    upfront_usd: float
    """The whole block's price, paid at purchase."""
    currency: str

    @property
    def usd_per_hour(self) -> float:
        return self.upfront_usd / self.duration_hours if self.duration_hours else 0.0

    @property
    def usd_per_instance_hour(self) -> float:
        return self.usd_per_hour / self.instance_count if self.instance_count else 0.0

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.update(start=self.start.isoformat(), end=self.end.isoformat(),
                   usd_per_hour=round(self.usd_per_hour, 4),
                   usd_per_instance_hour=round(self.usd_per_instance_hour, 4))
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Offering:
        return cls(doc["offering_id"], doc["instance_type"], doc["availability_zone"],
                   int(doc["instance_count"]), datetime.fromisoformat(doc["start"]),
                   datetime.fromisoformat(doc["end"]), int(doc["duration_hours"]),
                   float(doc["upfront_usd"]), doc["currency"])


def _offering(raw: Mapping[str, Any]) -> Offering:
    return Offering(offering_id=raw["CapacityBlockOfferingId"], instance_type=raw["InstanceType"],
                    availability_zone=raw["AvailabilityZone"], instance_count=int(raw["InstanceCount"]),
                    start=raw["StartDate"], end=raw["EndDate"],
                    duration_hours=int(raw["CapacityBlockDurationHours"]),
                    upfront_usd=float(raw["UpfrontFee"]), currency=raw.get("CurrencyCode", "USD"))


def search_offerings(ec2: Any, instance_type: str, count: int, days: int, start: datetime | None = None,
                     end: datetime | None = None) -> list[Offering]:
    """Every offering for `count` x `instance_type` for `days`, earliest start first (read-only)."""
    check_request(instance_type, count)
    query: dict[str, Any] = {"InstanceType": instance_type, "InstanceCount": count,
                             "CapacityDurationHours": duration_hours(days)}
    if start is not None:
        query["StartDateRange"] = start
    if end is not None:
        query["EndDateRange"] = end
    pages = ec2.get_paginator("describe_capacity_block_offerings").paginate(**query)
    found = [_offering(o) for page in pages for o in page.get("CapacityBlockOfferings", [])]
    return sorted(found, key=lambda o: (o.start, o.upfront_usd, o.availability_zone))


@dataclass(frozen=True)
class Block:
    """A purchased Capacity Block: the reservation a node group launches into."""

    reservation_id: str
    instance_type: str
    availability_zone: str
    instance_count: int
    start: datetime | None
    end: datetime | None
    state: str


def purchase(ec2: Any, offering: Offering, tags: Mapping[str, str] | None = None) -> Block:
    """Buy `offering` (PurchaseCapacityBlock): spends offering.upfront_usd at once. Confirm first."""
    request: dict[str, Any] = {"CapacityBlockOfferingId": offering.offering_id, "InstancePlatform": PLATFORM}
    if tags:
        request["TagSpecifications"] = [{"ResourceType": "capacity-reservation",
                                         "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    cr = ec2.purchase_capacity_block(**request)["CapacityReservation"]
    return Block(reservation_id=cr["CapacityReservationId"],
                 instance_type=cr.get("InstanceType", offering.instance_type),
                 availability_zone=cr.get("AvailabilityZone", offering.availability_zone),
                 instance_count=int(cr.get("TotalInstanceCount", offering.instance_count)),
                 start=cr.get("StartDate", offering.start), end=cr.get("EndDate", offering.end),
                 state=cr.get("State", "payment-pending"))


def node_group_snippet(block: Block, name: str | None = None) -> str:
    """A `gpucluster:node_groups` entry that launches into `block`, valid under gpucluster.spec.

    One type in the block's zone, capacity.market capacity_block with the reservation id, all
    nodes at once; EFA for a multi-node block of a multi-node type, but no placement group: a
    block is already placed in an EC2 UltraCluster.
    """
    t = catalog.get(block.instance_type)
    family = catalog.family_of(block.instance_type)
    name = name or f"block-{family}"
    from gpucluster.sizing import multi_node_capable  # only here: `gpucluster plan` never loads sizing

    efa = block.instance_count > 1 and t is not None and multi_node_capable(t)
    window = ""
    if block.start and block.end:
        window = (f", {block.start:%Y-%m-%d %H:%M} -> {block.end:%Y-%m-%d %H:%M} UTC (the block-expiry "
                  f"guardrail stops the group {int(WARNING_BEFORE_END.total_seconds() // 60)} minutes before "
                  "the end)")
    return (
        f"# Capacity Block {block.reservation_id}: {block.instance_count} x {block.instance_type} in "
        f"{block.availability_zone}{window}\n"
        f"# network.availability_zones must list {block.availability_zone}\n"
        "gpucluster:node_groups:\n"
        f"  - name: {name}\n"
        f"    instance_types: [{block.instance_type}]\n"
        "    min_nodes: 0\n"
        f"    desired_nodes: {block.instance_count}\n"
        f"    max_nodes: {block.instance_count}\n"
        f"    availability_zones: [{block.availability_zone}]\n"
        "    capacity:\n"
        "      market: capacity_block\n"
        f"      capacity_reservation_id: {block.reservation_id}\n"
        f"      instance_count: {block.instance_count}   # the block's size: max_nodes stays within it\n"
        f"    efa: {'on' if efa else 'off'}\n"
        "    placement_group: false   # a Capacity Block is already placed in an UltraCluster\n"
    )


# ------------------------------------------------------------------------ cache


def cache_file() -> Path:
    """Where searches remember their offerings: $XDG_CACHE_HOME (or ~/.cache)/gpucluster/."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpucluster" / "capacity-offerings.json"


@dataclass(frozen=True)
class CachedOffering:
    offering: Offering
    region: str
    listed_at: datetime


class OfferingCache:
    """The offerings the last searches listed, by id (AWS cannot describe one offering by id)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_file()

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def remember(self, offerings: Iterable[Offering], region: str, now: datetime | None = None) -> None:
        doc = self._read()
        stamp = (now or datetime.now(UTC)).isoformat()
        for o in offerings:
            doc[o.offering_id] = {"region": region, "listed_at": stamp, "offering": o.as_json()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(doc, indent=2, sort_keys=True))

    def get(self, offering_id: str) -> CachedOffering | None:
        entry = self._read().get(offering_id)
        if entry is None:
            return None
        try:
            return CachedOffering(Offering.from_json(entry["offering"]), entry["region"],
                                  datetime.fromisoformat(entry["listed_at"]))
        except (TypeError, KeyError, ValueError):
            return None
