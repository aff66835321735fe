"""The cost model: what a stack costs per hour and per month, and how its capacity mix compares.

It owns pricing a validated StackSpec: per node group the on-demand base (at the Savings
Plan rate when the base is committed, at the Capacity Block rate for capacity blocks), the
on-demand nodes above the base and the spot nodes, at desired and at max nodes, next to the
same capacity all on-demand and all spot; the stack's other costs (EBS root volumes, the NAT
gateway and its public IPv4 address, the VPC interface endpoints, FSx for Lustre, S3
storage); each month priced twice, 24 x 7 and as scheduled (the hours the stop/start
schedules and the lifetime leave the nodes running, gpucluster.schedule; a Capacity Block for
its duration); the budget warning (the Markdown difference between two priced stacks is
`gpucluster.costdiff`'s; the spend guard's own API calls `gpucluster.guardcost`'s).
GPU figures come from gpucluster.catalog, the rest from
data/service_prices.yaml, each rate carrying its source and date. It is pure: no Pulumi, no
AWS calls (live spot prices are fetched by gpucluster.ops.doctor and handed in as rates), and it
never guesses a price for a region it has no figures for: that is a PricingError.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from gpucluster import catalog, guardcost, schedule
from gpucluster.catalog import eks as eks_catalog
from gpucluster.node.metrics import DCGM_FIELDS
from gpucluster.spec import NodeGroupConfig, StackSpec, baked_image
from gpucluster.warmpool import warm_pool_basis, warm_pool_nodes

PRICES_FILE = Path(__file__).parent / "catalog" / "data" / "service_prices.yaml"
PCS_PRICES_FILE = Path(__file__).parent / "catalog" / "data" / "pcs_prices.yaml"
HOURS_PER_MONTH = 730  # the month of the AWS Pricing Calculator and the EC2 pricing pages
# The interface endpoints a created VPC gets (gpucluster.aws.network SSM_ENDPOINTS, NO_NAT_ENDPOINTS,
# AMP_ENDPOINT, PCS_ENDPOINT and EKS_ENDPOINTS, not imported: that module loads Pulumi; tests keep them
# and the planned endpoints equal), each with one network interface in every zone's private subnet.
SSM_ENDPOINTS = ("ssm", "ssmmessages", "ec2messages")
NO_NAT_ENDPOINTS = ("monitoring", "ec2", "autoscaling", "sns")  # the last two: GPU health checks
AMP_ENDPOINT = "aps-workspaces"  # without NAT, when nodes remote-write to AMP
PCS_ENDPOINT = "pcs"  # without NAT, on a Slurm stack: nodes register with PCS
# without NAT, on an EKS stack: image pulls, STS, logs, the EKS API, Pod Identity, the termination queue
EKS_ENDPOINTS = ("ecr.api", "ecr.dkr", "sts", "logs", "eks", "eks-auth", "sqs")

At = Literal["desired", "max"]
Strategy = Literal["mix", "all_on_demand", "all_spot"]
AT: tuple[At, ...] = ("desired", "max")
STRATEGIES: tuple[Strategy, ...] = ("all_on_demand", "mix", "all_spot")
STRATEGY_LABELS: dict[Strategy, str] = {
    "all_on_demand": "all on-demand", "mix": "stack's mix", "all_spot": "all spot"}


# One image build: the build instance installs, pre-pulls (a 10 GB container image) and snapshots,
# then Image Builder launches a test instance from the new image. EC2 Image Builder user guide,
# "Image Builder pricing": no charge for Image Builder itself, only the resources it runs (the
# instances, billed per second as EC2 on-demand, and the AMI's EBS snapshots). 1.5 instance-hours
# is a modelled figure for both instances, not a measured one.
IMAGE_BUILD_HOURS = 1.5
SCHEDULED_BUILDS_PER_MONTH = 4.35  # a weekly schedule: 52/12 builds (any schedule is priced so)


class PricingError(ValueError):
    """The stack cannot be priced, e.g. its region has no figures in the catalog."""


# ------------------------------------------------------------------------ rates


@dataclass(frozen=True)
class Rate:
    """A price per node-hour with where it comes from."""

    usd_per_hour: float
    basis: str
    """How the figure is derived, e.g. "on-demand less the 30 % Savings Plan discount"."""
    source: str
    as_of: str

    def as_json(self) -> dict[str, Any]:
        return {"usd_per_hour": round(self.usd_per_hour, 5), "basis": self.basis,
                "source": self.source, "as_of": self.as_of}


@dataclass(frozen=True)
class ServicePrices:
    """The non-GPU unit prices of one region (data/service_prices.yaml)."""

    region: str
    ebs_gp3_usd_per_gb_month: float
    nat_gateway_usd_per_hour: float
    nat_gateway_usd_per_gb: float
    public_ipv4_usd_per_hour: float
    interface_endpoint_usd_per_hour: float
    s3_standard_usd_per_gb_month: float
    amp_ingest_usd_per_10m_samples: float
    amp_ingest_usd_per_10m_samples_over_2b: float
    amp_storage_usd_per_gb_month: float
    amg_editor_usd_per_month: float
    amg_viewer_usd_per_month: float
    vended_logs_usd_per_gb: float
    logs_storage_usd_per_gb_month: float
    kms_key_usd_per_month: float
    fsx_lustre_usd_per_gb_month: dict[str, float]
    sources: dict[str, str]
    as_of: str
    # None where a project's price file (`catalog prices`) carries none: only a baked group with a volume
    # initialization rate needs it, and then its stack cannot be priced.
    ebs_volume_initialization_usd_per_gib: float | None = None


def _service_price_file(path: Path) -> dict[str, Any]:
    return catalog.read_data_file(path)


def service_prices(region: str, path: Path = PRICES_FILE) -> ServicePrices:
    """The region's EBS, NAT, FSx and S3 prices; PricingError names the regions we carry."""
    raw = _service_price_file(path)
    rates = raw["regions"].get(region)
    sources, as_of = dict(raw["sources"]), str(raw["as_of"])
    if rates is None:
        local = catalog.project_prices().get(region, {})
        if "services" not in local:
            raise PricingError(f"no EBS/NAT/FSx/S3 prices for region {region}: {catalog.fetch_hint(region)}")
        rates, (origin, as_of) = local["services"], catalog.project_price_source(region) or ("", "")
        sources = dict.fromkeys(sources, origin)
    return ServicePrices(region=region, sources=sources, as_of=as_of,
                         fsx_lustre_usd_per_gb_month=dict(rates["fsx_lustre_usd_per_gb_month"]),
                         **{k: float(v) for k, v in rates.items() if k != "fsx_lustre_usd_per_gb_month"})


def _boot_costs(spec: StackSpec, prices: ServicePrices, assume: Assumptions,
                groups: Mapping[str, GroupCost]) -> Iterable[OtherCost]:
    """Warm pools (root volumes of stopped instances, all month: no instance hours, weighed against the
    boot minutes they save), provisioned volume initialization of baked groups, and image builds."""
    src, as_of = prices.sources, prices.as_of
    gp3 = prices.ebs_gp3_usd_per_gb_month
    for g in spec.node_groups:
        if g.warm_pool is None:
            continue
        size, priced = g.root_volume_size_gib, groups.get(g.name)
        nodes = [warm_pool_nodes(g, n) for n in (g.desired_nodes, g.max_nodes)]
        yield OtherCost(f"Warm pool {g.name}", "warm_pool", nodes[0] * size * gp3, nodes[1] * size * gp3,
                        warm_pool_basis(g, gp3, node_hour_price(priced).usd_per_hour if priced else None),
                        src["ebs"], as_of)
    init, launches = prices.ebs_volume_initialization_usd_per_gib, assume.launches_per_node_month
    for g in spec.node_groups:
        image = baked_image(spec.images, g)
        if image is not None and image.ami_id is not None and image.volume_initialization_mibps:
            if init is None:
                raise PricingError(f"no EBS volume initialization price for region {spec.region}: "
                                   f"node_groups {g.name} sets images.groups.{g.name}.volume_initialization"
                                   "_mibps; add ebs_volume_initialization_usd_per_gib to the project's "
                                   "price file, or set it to 0")
            per_node = launches * g.root_volume_size_gib * init
            yield OtherCost(f"Volume initialization {g.name}", "volume_init", g.desired_nodes * per_node,
                            g.max_nodes * per_node, f"nodes x {launches:g} launches/month (assumed) x "
                            f"{g.root_volume_size_gib} GiB root x ${init}/GiB initialized at "
                            f"{image.volume_initialization_mibps} MiB/s "
                            "(ledger: ebs-volume-initialization-price, unverified)", src["ebs_init"], as_of)
    images = spec.images
    baked = [g for g in spec.node_groups if baked_image(images, g) is not None]
    if not baked:
        return
    build = catalog.get(images.build_instance_type)
    if build is None:
        return
    rate = on_demand_rate(build, spec.region)
    builds = SCHEDULED_BUILDS_PER_MONTH if images.schedule else 1.0
    usd = len(baked) * builds * assume.image_build_hours * rate.usd_per_hour
    yield OtherCost("Image builds", "images", usd, usd,
                    f"{len(baked)} group(s) x {builds:g} build(s)/month x {assume.image_build_hours:g} h "
                    f"{build.name} x ${rate.usd_per_hour:.3f}/h "
                    f"({'a weekly schedule' if images.schedule else 'one build on demand'}); "
                    "Image Builder itself is free", rate.source, rate.as_of)


def on_demand_rate(instance: catalog.InstanceType, region: str) -> Rate:
    try:  # the catalog's rate, else the project's price file's (`gpucluster catalog prices`)
        price = instance.on_demand_price(region)
    except KeyError as err:
        known = instance.capacity_block_only or region in {*catalog.project_prices(), *catalog.carried()}
        raise PricingError(str(err.args[0]) + ("" if known else f": {catalog.fetch_hint(region)}")) from None
    src = catalog.price_sources()
    local = None if region in instance.on_demand_usd_per_hour else catalog.project_price_source(region)
    return Rate(price, "on-demand", *(local or (src["on_demand"], src["as_of"])))


def savings_plan_rate(instance: catalog.InstanceType, region: str) -> Rate:
    od, src = on_demand_rate(instance, region), catalog.price_sources()
    discount = instance.family.savings_plan_discount_percent
    return Rate(od.usd_per_hour * (1 - discount / 100),
                f"on-demand less the {discount:g} % Savings Plan discount of {instance.family.name}",
                src["savings_plan"], src["as_of"])


def typical_spot_rate(instance: catalog.InstanceType, region: str) -> Rate:
    od, src = on_demand_rate(instance, region), catalog.price_sources()
    discount = instance.family.spot_discount_percent
    return Rate(od.usd_per_hour * (1 - discount / 100),
                f"on-demand less the typical {discount:g} % spot discount of {instance.family.name}",
                src["spot"], src["as_of"])


def capacity_block_rate(instance: catalog.InstanceType) -> Rate:
    price = instance.family.capacity_block_usd_per_hour
    if price is None:
        raise PricingError(f"{instance.name} cannot be bought as a Capacity Block (no block price)")
    src = catalog.price_sources()
    return Rate(float(price), "Capacity Block for ML", src["capacity_block"], src["as_of"])


# ------------------------------------------------------------------ node groups


@dataclass(frozen=True)
class NodeSplit:
    """How many of a group's nodes are base, on-demand above the base, and spot."""

    nodes: int
    base: int
    on_demand: int
    spot: int


def split_nodes(group: NodeGroupConfig, nodes: int) -> NodeSplit:
    """The ASG's split of `nodes`: the base first, then spot_percent of the rest as spot.

    A fractional on-demand share is rounded up (Auto Scaling rounds in favour of on-demand,
    and it is the dearer, so the budget-safe, reading). A capacity block is all base.
    """
    cap = group.capacity
    if cap.market == "capacity_block":
        return NodeSplit(nodes, nodes, 0, 0)
    base = min(nodes, cap.on_demand_base)
    above = nodes - base
    on_demand = math.ceil(above * (100 - Fraction(str(cap.spot_percent))) / 100)
    return NodeSplit(nodes, base, on_demand, above - on_demand)


@dataclass(frozen=True)
class GroupCost:
    """One node group priced at desired and at max nodes."""

    name: str
    instance_type: str
    note: str
    """Which type is priced and why (the first of several is priced; fallbacks differ)."""
    on_demand: Rate
    base: Rate
    spot: Rate
    desired: NodeSplit
    max: NodeSplit
    region: str
    types: int = 1
    """How many instance types the group lists (the first is priced)."""
    hours_per_month: float = HOURS_PER_MONTH
    """Hours a month the group is paid for 24 x 7: all of them, or a Capacity Block's duration."""
    scheduled_hours_per_month: float = HOURS_PER_MONTH
    """Hours a month as scheduled; a Capacity Block is paid up front: its duration, whatever the schedule."""
    block_hours: int | None = None
    """A Capacity Block's duration (capacity.duration_hours); None: not a block, or not given."""
    capacity_block: bool = False

    def hours(self, scheduled: bool = False) -> float:
        return self.scheduled_hours_per_month if scheduled else self.hours_per_month

    def usd_per_month(self, at: At, strategy: Strategy = "mix", scheduled: bool = False) -> float:
        return self.usd_per_hour(at, strategy) * self.hours(scheduled)

    def split(self, at: At) -> NodeSplit:
        return self.desired if at == "desired" else self.max

    def parts(self, at: At) -> dict[str, float]:
        """USD/hour of the base, the on-demand nodes above it and the spot nodes."""
        s = self.split(at)
        return {"base": s.base * self.base.usd_per_hour,
                "on_demand": s.on_demand * self.on_demand.usd_per_hour,
                "spot": s.spot * self.spot.usd_per_hour}

    def usd_per_hour(self, at: At, strategy: Strategy = "mix") -> float:
        nodes = self.split(at).nodes
        if strategy == "all_on_demand":
            return nodes * self.on_demand.usd_per_hour
        if strategy == "all_spot":
            return nodes * self.spot.usd_per_hour
        return sum(self.parts(at).values())

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name, "instance_type": self.instance_type, "note": self.note,
            "rates": {"on_demand": self.on_demand.as_json(), "base": self.base.as_json(),
                      "spot": self.spot.as_json()},
            "hours_per_month": round(self.hours_per_month, 2),
            "scheduled_hours_per_month": round(self.scheduled_hours_per_month, 2),
            "capacity_block_hours": self.block_hours,
        }
        for at in AT:
            s = self.split(at)
            doc[at] = {"nodes": s.nodes, "base": s.base, "on_demand": s.on_demand, "spot": s.spot,
                       "usd_per_hour": {**{k: round(v, 4) for k, v in self.parts(at).items()},
                                        **{k: round(self.usd_per_hour(at, k), 4) for k in STRATEGIES}}}
        return doc


def _fallback_price(instance: catalog.InstanceType, region: str) -> str:
    if instance.capacity_block_only:
        return f"{instance.name} no on-demand price (Capacity Blocks only)"
    return f"{instance.name} ${on_demand_rate(instance, region).usd_per_hour:,.2f}/h"


def price_group(spec: StackSpec, group: NodeGroupConfig, spot: Rate | None = None,
                scheduled_hours: float = HOURS_PER_MONTH) -> GroupCost:
    """Price `group` as its first (preferred) instance type; `spot` overrides the catalog figure.

    `scheduled_hours`: the hours a month the schedules leave the stack running. A Capacity
    Block is paid up front for its duration (capacity.duration_hours; a month when not given),
    so it is priced for that, at most a month in a month, whatever the schedule.
    """
    first = group.types[0]
    cap = group.capacity
    if first.capacity_block_only:
        if cap.market != "capacity_block":
            raise PricingError(f"node group {group.name}: {first.name} has no on-demand list price "
                               "(AWS sells it as Capacity Blocks for ML only); buy a block "
                               "(gpucluster capacity search) and set capacity.market: capacity_block")
        block_rate = capacity_block_rate(first)
        od = Rate(block_rate.usd_per_hour, f"{block_rate.basis} (the type has no on-demand or spot price)",
                  block_rate.source, block_rate.as_of)
    else:
        od = on_demand_rate(first, spec.region)
    if cap.market == "capacity_block":
        base = capacity_block_rate(first)
    elif cap.base_commitment == "savings_plan":
        base = savings_plan_rate(first, spec.region)
    elif cap.base_commitment == "reserved_instances":
        sp = savings_plan_rate(first, spec.region)
        # We carry no separate RI figure; a 1-year standard RI is at least this cheap.
        base = Rate(sp.usd_per_hour, f"reserved instances, priced at the Savings Plan rate ({sp.basis})",
                    sp.source, sp.as_of)
    else:
        base = od
    note = f"priced as {first.name}"
    others = group.types[1:]
    if others:
        listed = ", ".join(_fallback_price(t, spec.region) for t in others)
        note += (f", the first of {len(group.types)} instance types; fallbacks cost differently "
                 f"(on-demand: {listed})")
    if first.capacity_block_only:
        spot = od
    block = cap.duration_hours if cap.market == "capacity_block" else None
    if cap.market == "capacity_block":
        hours = scheduled = float(min(block or HOURS_PER_MONTH, HOURS_PER_MONTH))
    else:
        hours, scheduled = HOURS_PER_MONTH, min(scheduled_hours, HOURS_PER_MONTH)
    return GroupCost(name=group.name, instance_type=first.name, note=note, on_demand=od, base=base,
                     spot=spot or typical_spot_rate(first, spec.region),
                     desired=split_nodes(group, group.desired_nodes),
                     max=split_nodes(group, group.max_nodes), region=spec.region, types=len(group.types),
                     hours_per_month=hours, scheduled_hours_per_month=scheduled, block_hours=block,
                     capacity_block=cap.market == "capacity_block")


def node_hour_price(group: GroupCost) -> Rate:
    """USD a node-hour of a priced node group, with its basis: the one node-hour price of the package.

    The group's purchase mix exactly as `cost` prices it (GroupCost.usd_per_hour: the base, on-demand
    above it, spot, or a Capacity Block) at desired nodes, or at max nodes for a group that scales
    from zero, divided by those nodes. `spend`, `spend --by`, `scale`, `start` and `resume` multiply
    it by node-hours or nodes, so a group's figure is the same in every command.
    """
    at: At = "desired" if group.desired.nodes else "max"
    split = group.split(at)
    if group.capacity_block:
        parts = [(split.base, group.base, "in a Capacity Block")]
    else:
        base = "on-demand base" if group.base == group.on_demand else f"base ({group.base.basis})"
        above = "on-demand above the base" if split.base else "on-demand"
        parts = [(split.base, group.base, base), (split.on_demand, group.on_demand, above),
                 (split.spot, group.spot, f"spot ({group.spot.basis})")]
    used = [(n, rate, label) for n, rate, label in parts if n]
    mix = " + ".join(f"{n} {label}" for n, _, label in used)
    first = f"the first of {group.types} types" if group.types > 1 else ""
    basis = (f"purchase mix at {split.nodes} {at} node{'s' if split.nodes > 1 else ''}: {mix}; "
             f"{group.instance_type}{f' ({first})' if first else ''}, {group.region} list prices")
    sources = "; ".join(dict.fromkeys(rate.source for _, rate, _ in used))
    return Rate(group.usd_per_hour(at) / split.nodes, basis, sources, used[0][1].as_of)


# ------------------------------------------------------------------------ stacks


@dataclass(frozen=True)
class OtherCost:
    """A non-GPU cost of the stack, per month at desired and at max nodes."""

    name: str
    kind: Literal["ebs", "nat", "ipv4", "endpoints", "fsx", "s3", "amp", "amg", "warm_pool", "images",
                  "flow_logs", "pcs", "volume_init", "eks", "guard"]
    desired_usd_per_month: float
    max_usd_per_month: float
    basis: str
    source: str
    as_of: str
    scheduled_share: float = 1.0
    """Share of the 24 x 7 figure paid as scheduled: root volumes live only while their node runs."""

    def usd_per_month(self, at: At, scheduled: bool = False) -> float:
        value = self.desired_usd_per_month if at == "desired" else self.max_usd_per_month
        return value * (self.scheduled_share if scheduled else 1.0)


@dataclass(frozen=True)
class Assumptions:
    """Figures the stack file does not say but the cost depends on."""

    dataset_gib: float = 1024
    """S3 size of a created bucket that has no FSx file system to size it by."""
    nat_gb_per_month: float = 100
    """Data through the NAT gateway (package and image downloads; S3 goes through its endpoint)."""
    flow_log_gb_per_month: float = 5
    """VPC flow-log records a month with network.flow_logs: reject (ten times this with all)."""
    schedule_year: int | None = None
    """The year whose 52 weeks from 1 January give the scheduled share; None: this year."""
    image_build_hours: float = IMAGE_BUILD_HOURS
    """Instance-hours one image build takes (the build instance, then the test instance)."""
    launches_per_node_month: float = 30
    """Launches a node slot sees a month (a group stopped nightly and started each morning: 30), each
    initializing a fresh root volume."""


@dataclass(frozen=True)
class Schedule:
    """How many hours a month the stack's schedules leave it running."""

    scheduled: bool
    """False: no start schedule bounds the hours, so as scheduled is 24 x 7."""
    hours_per_month: float
    share: float
    basis: str

    def as_json(self) -> dict[str, Any]:
        return {"scheduled": self.scheduled, "hours_per_month": round(self.hours_per_month, 2),
                "share_percent": round(100 * self.share, 2), "basis": self.basis}


def stack_schedule(spec: StackSpec, year: int | None = None) -> Schedule:
    """The stack's scheduled hours a month: 730 x the share of a reference year it runs."""
    a = spec.autostop
    if not schedule.is_scheduled(a):
        stops = a.enabled and (a.stop_schedule or a.max_lifetime_hours)
        why = ("no start_schedule: a stop lasts until someone resumes the stack, so the upper bound "
               "is 24 x 7") if stops else "no stop/start schedule or lifetime"
        return Schedule(False, HOURS_PER_MONTH, 1.0, f"24 x 7 ({why})")
    year = year or datetime.now(UTC).year
    share = schedule.scheduled_share(a, year)
    parts = [f"stop {a.stop_schedule}" if a.stop_schedule else None, f"start {a.start_schedule}",
             f"max lifetime {a.max_lifetime_hours} h" if a.max_lifetime_hours else None]
    basis = (f"{', '.join(p for p in parts if p)} in {a.schedule_timezone}: "
             f"{share.running_hours:,.0f} of the {share.window_hours:,.0f} hours of the "
             f"{schedule.REFERENCE_WEEKS} weeks from {year}-01-01 = {100 * share.share:.2f} %, "
             f"x {HOURS_PER_MONTH} h")
    return Schedule(True, HOURS_PER_MONTH * share.share, share.share, basis)


@dataclass(frozen=True)
class StackCost:
    """A priced stack: node groups, other costs, totals per strategy, budget check."""

    stack: str
    region: str
    groups: tuple[GroupCost, ...]
    other: tuple[OtherCost, ...]
    budget_usd_per_month: float | None
    assumptions: tuple[str, ...] = field(default=())
    schedule: Schedule = Schedule(False, HOURS_PER_MONTH, 1.0, "24 x 7")

    def compute_usd_per_hour(self, at: At, strategy: Strategy = "mix") -> float:
        return sum(g.usd_per_hour(at, strategy) for g in self.groups)

    def other_usd_per_month(self, at: At, scheduled: bool = False) -> float:
        return sum(o.usd_per_month(at, scheduled) for o in self.other)

    def compute_usd_per_month(self, at: At, strategy: Strategy = "mix", scheduled: bool = False) -> float:
        return sum(g.usd_per_month(at, strategy, scheduled) for g in self.groups)

    def usd_per_month(self, at: At, strategy: Strategy = "mix", scheduled: bool = False) -> float:
        return self.compute_usd_per_month(at, strategy, scheduled) + self.other_usd_per_month(at, scheduled)

    def usd_per_hour(self, at: At, strategy: Strategy = "mix") -> float:
        return self.usd_per_month(at, strategy) / HOURS_PER_MONTH

    def saving_percent(self, at: At) -> float:
        """How far the stack's mix is below the same capacity all on-demand (whole stack)."""
        on_demand = self.usd_per_month(at, "all_on_demand")
        return 100 * (1 - self.usd_per_month(at, "mix") / on_demand) if on_demand else 0.0

    def components(self, at: At, strategy: Strategy = "mix",
                   scheduled: bool = False) -> list[tuple[str, float]]:
        """(component, USD/month): each node group, then each other cost."""
        return ([(f"node group {g.name}", g.usd_per_month(at, strategy, scheduled)) for g in self.groups]
                + [(o.name, o.usd_per_month(at, scheduled)) for o in self.other])

    @property
    def warnings(self) -> list[str]:
        budget = self.budget_usd_per_month
        if budget is None:
            return ["no budget (gpucluster:budget): nothing alerts on or caps this stack's spend"]
        out = []
        for at in AT:
            cost = self.usd_per_month(at)
            if cost > budget:
                out.append(f"at {at} nodes the stack's mix costs ${cost:,.0f}/month, "
                           f"{100 * (cost / budget - 1):.0f} % over the ${budget:,.0f} budget "
                           "(budget.monthly_limit_usd)")
        return out

    def budget_below_an_hour(self) -> str | None:
        """Why the monthly limit stops the stack within its first hour at desired nodes, or None.

        A limit below one hour of the desired burn is spent before the spend guard's first checks
        settle (and AWS Budgets, hours late, cannot catch it): almost surely a typo in the limit.
        """
        budget, burn = self.budget_usd_per_month, self.usd_per_hour("desired")
        if budget is None or burn <= 0 or budget >= burn:
            return None
        return (f"${budget:,.2f} is below one hour of the stack's burn at desired nodes (${burn:,.2f}/h): "
                "the budget stops it within the first hour; raise budget.monthly_limit_usd "
                "(or lower the desired nodes)")

    def as_json(self) -> dict[str, Any]:
        parts = {at: dict(self.components(at)) for at in AT}
        scheduled = {at: dict(self.components(at, scheduled=True)) for at in AT}
        return {
            "stack": self.stack, "region": self.region, "currency": "USD",
            "hours_per_month": HOURS_PER_MONTH,
            "schedule": self.schedule.as_json(),
            "node_groups": [g.as_json() for g in self.groups],
            "other": [{"name": o.name, "kind": o.kind, "basis": o.basis, "source": o.source,
                       "as_of": o.as_of, "usd_per_month": {at: round(o.usd_per_month(at), 2) for at in AT}}
                      for o in self.other],
            "components": [{"name": name, "usd_per_month": {at: round(parts[at][name], 2) for at in AT}}
                           for name in parts["desired"]],
            "totals": {at: {s: {"usd_per_hour": round(self.usd_per_hour(at, s), 2),
                                "usd_per_month": round(self.usd_per_month(at, s), 2)}
                            for s in STRATEGIES} for at in AT},
            "scheduled_components": [{"name": name, "usd_per_month": {at: round(scheduled[at][name], 2)
                                                                      for at in AT}}
                                     for name in scheduled["desired"]],
            "scheduled_totals": {at: {s: {"usd_per_month": round(self.usd_per_month(at, s, True), 2)}
                                      for s in STRATEGIES} for at in AT},
            "saving_vs_on_demand_percent": {at: round(self.saving_percent(at), 1) for at in AT},
            "budget_usd_per_month": self.budget_usd_per_month,
            "warnings": self.warnings,
            "assumptions": list(self.assumptions),
        }


def _other_costs(spec: StackSpec, prices: ServicePrices, assume: Assumptions,
                 groups: Mapping[str, GroupCost]) -> Iterable[OtherCost]:
    src, as_of = prices.sources, prices.as_of
    gp3 = prices.ebs_gp3_usd_per_gb_month
    yield from _observability_costs(spec, prices, groups)
    for g in spec.node_groups:
        size, priced = g.root_volume_size_gib, groups[g.name]
        # A root volume is deleted with its node: it is paid for the hours the node runs.
        share = priced.hours_per_month / HOURS_PER_MONTH
        yield OtherCost(f"EBS root volumes {g.name}", "ebs", g.desired_nodes * size * gp3 * share,
                        g.max_nodes * size * gp3 * share, f"nodes x {size} GiB gp3 x ${gp3}/GB-month"
                        + (f" x {share:.3f} of the month" if share != 1 else ""),
                        src["ebs"], as_of,
                        scheduled_share=priced.scheduled_hours_per_month / priced.hours_per_month)
    yield from _boot_costs(spec, prices, assume, groups)
    yield from _pcs_costs(spec, groups)
    try:  # an EKS stack's control plane and system nodes (catalog/eks.py; ledger: eks-prices)
        yield from (OtherCost(f.name, "eks", f.usd_per_month, f.usd_per_month, f.basis, f.source, f.as_of)
                    for f in eks_catalog.fees(spec.region, spec.scheduler, eks_catalog.today()))
    except LookupError as err:
        raise PricingError(str(err)) from None
    yield from filter(None, [guard_api_line(spec, as_of)])
    if spec.network.vpc_cidr is None:
        return  # an existing VPC: its NAT and endpoints are paid for already
    if spec.network.nat_gateway:
        nat = (prices.nat_gateway_usd_per_hour * HOURS_PER_MONTH
               + prices.nat_gateway_usd_per_gb * assume.nat_gb_per_month)
        yield OtherCost("NAT gateway", "nat", nat, nat,
                        f"1 x ${prices.nat_gateway_usd_per_hour}/h + {assume.nat_gb_per_month:g} GB x "
                        f"${prices.nat_gateway_usd_per_gb}/GB", src["nat"], as_of)
        ipv4 = prices.public_ipv4_usd_per_hour * HOURS_PER_MONTH
        yield OtherCost("NAT gateway public IPv4", "ipv4", ipv4, ipv4,
                        f"1 Elastic IP x ${prices.public_ipv4_usd_per_hour}/h", src["ipv4"], as_of)
    services = interface_endpoints(spec)
    zones = len(spec.network.availability_zones)
    endpoints = len(services) * zones * prices.interface_endpoint_usd_per_hour * HOURS_PER_MONTH
    yield OtherCost("VPC interface endpoints", "endpoints", endpoints, endpoints,
                    f"{len(services)} endpoints ({', '.join(services)}) x {zones} zones x "
                    f"${prices.interface_endpoint_usd_per_hour}/h", src["endpoints"], as_of)
    s3 = prices.s3_standard_usd_per_gb_month
    for d in spec.datasets:
        if d.fsx is not None:
            key = d.fsx.deployment_type + (f"_{d.fsx.throughput_per_unit_mib}"
                                           if d.fsx.deployment_type == "PERSISTENT_2" else "")
            rate = prices.fsx_lustre_usd_per_gb_month[key]
            fsx = d.fsx.storage_capacity_gib * rate
            yield OtherCost(f"FSx for Lustre {d.name}", "fsx", fsx, fsx,
                            f"{d.fsx.storage_capacity_gib} GiB {key} x ${rate}/GB-month", src["fsx"], as_of)
        if d.existing:
            continue  # an existing bucket is paid for already; the stack adds nothing to it
        gib = d.fsx.storage_capacity_gib if d.fsx is not None else assume.dataset_gib
        why = "the FSx capacity" if d.fsx is not None else "assumed, --dataset-gib"
        yield OtherCost(f"S3 {d.name}", "s3", gib * s3, gib * s3,
                        f"{gib:g} GiB ({why}) x ${s3}/GB-month", src["s3"], as_of)


# The sample rate that drives AMP's bill: every node writes, each scrape, one sample per series.
# Series per GPU are dcgm-exporter's fields (gpucluster.node.metrics.DCGM_FIELDS; a MIG GPU: per
# instance); the node exporter's are kept to a few families by the collector (metrics.sh:
# load, memory, filesystems, network interfaces: a p5's 32 EFA interfaces make most of them),
# estimated per node; Prometheus adds 5 per target (up, scrape_*).
NODE_EXPORTER_SERIES = 150
SCRAPE_SERIES_PER_TARGET = 5
AMP_FIRST_TIER_SAMPLES = 2_000_000_000
AMP_BYTES_PER_SAMPLE = 2.0  # compressed bytes a sample AMP bills (~1-2; ledger: amp-bytes-per-sample)
# AMP's default retention (AMP user guide, "Amazon Managed Service for Prometheus service quotas").
AMP_RETENTION_DAYS = 150


def metric_series_per_node(group: NodeGroupConfig) -> int:
    """Series one node of `group` writes: its GPUs' dcgm-exporter fields, the node exporter, `up` & co."""
    gpus = max((t.gpus for t in group.types), default=0)
    return gpus * group.slots_per_gpu * len(DCGM_FIELDS) + NODE_EXPORTER_SERIES + 2 * SCRAPE_SERIES_PER_TARGET


def amp_ingest_usd(samples: float, prices: ServicePrices) -> float:
    first = min(samples, AMP_FIRST_TIER_SAMPLES)
    return (first * prices.amp_ingest_usd_per_10m_samples
            + max(samples - first, 0) * prices.amp_ingest_usd_per_10m_samples_over_2b) / 1e7


def _observability_costs(spec: StackSpec, prices: ServicePrices,
                         groups: Mapping[str, GroupCost]) -> Iterable[OtherCost]:
    o, src, as_of = spec.observability, prices.sources, prices.as_of
    if o.prometheus.active:
        per_hour = 3600 / o.prometheus.scrape_interval_seconds
        samples = {at: sum(metric_series_per_node(g) * per_hour * groups[g.name].hours_per_month
                           * (g.desired_nodes if at == "desired" else g.max_nodes) for g in spec.node_groups)
                   for at in ("desired", "max")}
        series = ", ".join(f"{g.name} {metric_series_per_node(g)}" for g in spec.node_groups)
        stored = {at: s * AMP_BYTES_PER_SAMPLE * AMP_RETENTION_DAYS / (HOURS_PER_MONTH / 24) / 1e9
                  for at, s in samples.items()}
        storage = prices.amp_storage_usd_per_gb_month
        own = "" if o.prometheus.enabled else " (an existing workspace: billed to its account)"
        yield OtherCost(
            "Amazon Managed Prometheus" + own, "amp",
            amp_ingest_usd(samples["desired"], prices) + stored["desired"] * storage,
            amp_ingest_usd(samples["max"], prices) + stored["max"] * storage,
            f"series per node ({series}) x {per_hour:g} scrapes/h (every "
            f"{o.prometheus.scrape_interval_seconds} s) x node-hours = "
            f"{samples['desired'] / 1e6:,.0f}M samples at desired: "
            f"${prices.amp_ingest_usd_per_10m_samples}/10M (first 2B), "
            f"${prices.amp_ingest_usd_per_10m_samples_over_2b}/10M after; storage {AMP_RETENTION_DAYS} days "
            f"x {AMP_BYTES_PER_SAMPLE:g} B/sample x ${storage}/GB-month", src["amp"], as_of)
    if o.grafana.enabled:
        g = o.grafana
        amg = g.editors * prices.amg_editor_usd_per_month + g.viewers * prices.amg_viewer_usd_per_month
        yield OtherCost("Amazon Managed Grafana", "amg", amg, amg,
                        f"{g.editors} editors x ${prices.amg_editor_usd_per_month:g} + {g.viewers} viewers x "
                        f"${prices.amg_viewer_usd_per_month:g} a month (active users)", src["amg"], as_of)


def interface_endpoints(spec: StackSpec) -> tuple[str, ...]:
    """The interface endpoints a created VPC of this stack gets (as gpucluster.aws.network plans them)."""
    if spec.network.nat_gateway:
        return SSM_ENDPOINTS
    metrics = (AMP_ENDPOINT,) if spec.observability.prometheus.active else ()
    return (SSM_ENDPOINTS + NO_NAT_ENDPOINTS + metrics + ((PCS_ENDPOINT,) if spec.scheduler.slurm else ())
            + (EKS_ENDPOINTS if spec.scheduler.eks else ()))


def stopped_slurm_costs(spec: StackSpec, path: Path = PCS_PRICES_FILE) -> list[OtherCost]:
    """What a Slurm stack still costs a month with every compute node group stopped (`stop` says it): the
    PCS controller and accounting, the login nodes' EC2 hours and their PCS node management, which no stop
    touches; [] on a type-none stack. PricingError where the region has no PCS prices."""
    return list(_pcs_costs(spec, None, path))


def _pcs_costs(spec: StackSpec, groups: Mapping[str, GroupCost] | None,
               path: Path = PCS_PRICES_FILE) -> Iterable[OtherCost]:
    """AWS PCS fees of a Slurm stack (data/pcs_prices.yaml, ledger: pcs-prices: see its header), each
    its own line: the controller and accounting by cluster size all month, node management per node-hour
    (compute nodes as their groups run, none when `groups` is None: all stopped; the login nodes all
    month) and the login nodes' EC2 hours."""
    s = spec.scheduler
    if not s.slurm:
        return
    raw = catalog.read_data_file(path)
    rates = raw["regions"].get(spec.region)
    if rates is None:
        raise PricingError(f"no AWS PCS prices for region {spec.region} (have: "
                           f"{', '.join(sorted(raw['regions']))}; the AWS PCS pricing page lists the rest)")
    source, as_of = str(raw["source"]), str(raw["as_of"])
    hourly = rates["controller_usd_per_hour"][s.size]
    controller = hourly * HOURS_PER_MONTH
    yield OtherCost(f"AWS PCS Slurm controller ({s.size})", "pcs", controller, controller,
                    f"1 cluster x ${hourly}/h ({s.size}), all month", source, as_of)
    fee, login = rates["node_management_usd_per_instance_hour"], s.login
    compute = spec.node_groups if groups is not None else ()
    node_hours = {at: sum((g.desired_nodes if at == "desired" else g.max_nodes)
                          * groups[g.name].hours_per_month for g in compute if groups is not None)
                  + login.count * HOURS_PER_MONTH for at in AT}
    scheduled_hours = sum(g.desired_nodes * groups[g.name].scheduled_hours_per_month
                          for g in compute if groups is not None)
    yield OtherCost("AWS PCS node management", "pcs", node_hours["desired"] * fee, node_hours["max"] * fee,
                    f"{node_hours['desired']:,.0f} node-hours at desired ({node_hours['max']:,.0f} at max; "
                    f"{login.count} login node(s) all month) x ${fee}/instance-hour", source, as_of,
                    scheduled_share=(scheduled_hours + login.count * HOURS_PER_MONTH) / node_hours["desired"]
                    if node_hours["desired"] else 1.0)
    if s.accounting:
        accounting = rates["accounting_usd_per_hour"][s.size] * HOURS_PER_MONTH
        yield OtherCost("AWS PCS Slurm accounting", "pcs", accounting, accounting,
                        f"1 cluster x ${rates['accounting_usd_per_hour'][s.size]}/h ({s.size}), all month; "
                        "accounting storage not counted", source, as_of)
    login_rate = rates["login_instance_usd_per_hour"].get(login.instance_type)
    if login_rate is None:
        raise PricingError(f"scheduler.login.instance_type: no price for {login.instance_type} in "
                           f"{spec.region} (have: {', '.join(sorted(rates['login_instance_usd_per_hour']))})")
    hosts = login.count * login_rate * HOURS_PER_MONTH
    yield OtherCost("AWS PCS login nodes", "pcs", hosts, hosts,
                    f"{login.count} x {login.instance_type} x ${login_rate}/h on-demand, all month",
                    str(raw["login_source"]), as_of)


def _flow_log_cost(spec: StackSpec, prices: ServicePrices, assume: Assumptions) -> Iterable[OtherCost]:
    """VPC flow logs (gpucluster.aws.network), on by default for created and existing VPCs alike."""
    src, as_of = prices.sources, prices.as_of
    if spec.network.flow_logs != "off":
        gb = assume.flow_log_gb_per_month * (10 if spec.network.flow_logs == "all" else 1)
        # Kept 90 days (gpucluster.aws.network): about three months of records stored at a time.
        logs = (gb * prices.vended_logs_usd_per_gb + 3 * gb * prices.logs_storage_usd_per_gb_month
                + prices.kms_key_usd_per_month)
        yield OtherCost("VPC flow logs", "flow_logs", logs, logs,
                        f"{gb:g} GB/month ({spec.network.flow_logs}) x ${prices.vended_logs_usd_per_gb}/GB "
                        f"ingested + 3 months stored x ${prices.logs_storage_usd_per_gb_month}/GB-month + "
                        f"1 KMS key x ${prices.kms_key_usd_per_month:g}/month", src["flow_logs"], as_of)


def guard_api_line(spec: StackSpec, as_of: str) -> OtherCost | None:
    """The spend guard's API calls as an "other cost" line (`guardcost`); None without a spend guard.

    Its figures are not in the price file (`guardcost`, ledger: guard-api-prices); the line carries
    the price file's date like every other line.
    """
    cost = guardcost.guard_api_cost(spec, HOURS_PER_MONTH)
    if cost is None:
        return None
    return OtherCost("Spend guard API calls", "guard", cost.desired_usd_per_month, cost.max_usd_per_month,
                     cost.basis, guardcost.SOURCE, as_of)


def price_stack(spec: StackSpec, assumptions: Assumptions | None = None,
                spot_rates: Mapping[str, Rate] | None = None) -> StackCost:
    """Price every node group and the other costs of `spec`.

    `spot_rates` (node group name -> Rate) replaces the catalog's typical spot discount,
    e.g. with live prices. Raises PricingError when the region has no figures.
    """
    assume = assumptions or Assumptions()
    spot_rates = spot_rates or {}
    plan = stack_schedule(spec, assume.schedule_year)
    groups = tuple(price_group(spec, g, spot_rates.get(g.name), plan.hours_per_month)
                   for g in spec.node_groups)
    prices = service_prices(spec.region)
    other = (*_other_costs(spec, prices, assume, {g.name: g for g in groups}),
             *_flow_log_cost(spec, prices, assume))
    notes = (
        f"a month is {HOURS_PER_MONTH} hours; 24 x 7: every node running all month",
        f"as scheduled: {plan.basis}; an upper bound (idle and budget stops only remove hours); "
        "EBS root volumes follow their nodes, the rest runs all month",
        "on-demand nodes above the base and spot nodes follow spot_percent; a fractional "
        "on-demand share is rounded up",
        "a committed base (savings_plan or reserved_instances) is priced at the family's Savings "
        "Plan rate; nodes above the base at on-demand",
        "a capacity block is priced at its block rate for capacity.duration_hours (at most a month "
        "in a month; a whole month when not given), whatever the schedule: it is paid up front",
        f"S3 holds the FSx capacity for FSx datasets, else {assume.dataset_gib:g} GiB per created "
        "bucket; existing buckets are not counted",
        f"{assume.nat_gb_per_month:g} GB/month through the NAT gateway; S3 traffic uses the free "
        "gateway endpoint; interface endpoints by the hour, their data (cents a GB) not counted",
        f"VPC flow logs: {assume.flow_log_gb_per_month:g} GB/month of rejected-traffic records "
        "(ten times that with flow_logs: all)",
        "not counted: data transfer out, requests, CloudWatch, Lambda, snapshots (small next to GPUs)",
    ) + ((f"AWS PCS fees ({PCS_PRICES_FILE.name}) are from memory of "  # ledger: pcs-prices
          "https://aws.amazon.com/pcs/pricing/, not re-checked: "  # ledger: pcs-prices
          "each is its own 'AWS PCS' line; node management follows the nodes",)
         if spec.scheduler.slurm else ())
    budget = spec.budget.monthly_limit_usd if spec.budget else None
    return StackCost(spec.stack, spec.region, groups, other, budget, notes, plan)


# ------------------------------------------------------------------ spend guard


def guard_prices(spec: StackSpec, assumptions: Assumptions | None = None) -> dict[str, Any]:
    """The price table the spend guard Lambda accrues with (gpucluster.fleet.accrual.Prices).

    Rendered at deploy into the Lambda's environment, so it carries only what the stack's
    groups can launch: on-demand per instance type, the Capacity Block rate where a group
    buys blocks (and the blocks' reservations: their fee counts once, `fleet.capacityblocks`), the
    Savings Plan rate of a committed base, and the other costs an hour (their 24 x 7 month at desired
    nodes / 730, root volumes excluded: they follow nodes).
    Types with no price for the region are left out: the guard then reports them as a
    configuration error instead of guessing.
    """
    on_demand: dict[str, float] = {}
    blocks: dict[str, float] = {}
    committed: dict[str, list[float]] = {}
    group_max: dict[str, float] = {}
    for g in spec.node_groups:
        for name in g.instance_types:
            instance = catalog.get(name)
            if instance is None:
                continue
            try:
                if g.capacity.market == "capacity_block":
                    blocks[name] = round(capacity_block_rate(instance).usd_per_hour, 4)
                    # Some types are sold only as blocks (no on-demand list price).
                    on_demand.setdefault(name, blocks[name])
                on_demand[name] = round(on_demand_rate(instance, spec.region).usd_per_hour, 4)
                if (g.capacity.base_commitment != "none" and g.capacity.on_demand_base
                        and g.name not in committed):
                    rate = savings_plan_rate(instance, spec.region).usd_per_hour
                    committed[g.name] = [g.capacity.on_demand_base, round(rate, 4)]
            except PricingError:
                continue
        rates = [blocks.get(t, on_demand.get(t, 0.0)) for t in g.instance_types]
        if any(rates):
            group_max[g.name] = max(rates)
    try:
        prices, assume = service_prices(spec.region), assumptions or Assumptions()
        other = [*_other_costs(spec, prices, assume,
                               {p.name: p for p in (price_group(spec, g) for g in spec.node_groups)}),
                 *_flow_log_cost(spec, prices, assume)]
        # Root volumes follow nodes; the guard's own API calls (Cost Explorer's carry no stack tag)
        # are not what the settled figure will show for the stack.
        kept = [o for o in other if o.kind not in ("ebs", "guard")]
        fixed = sum(o.desired_usd_per_month for o in kept) / HOURS_PER_MONTH
    except PricingError:
        fixed = 0.0
    table: dict[str, Any] = {"on_demand": on_demand, "capacity_block": blocks, "committed": committed,
                             "group_max": group_max, "fixed_usd_per_hour": round(fixed, 4)}
    # The blocks the groups launch into: the guard reads their upfront fee before an instance runs there.
    reservations = sorted({g.capacity.capacity_reservation_id for g in spec.node_groups
                           if g.capacity.market == "capacity_block" and g.capacity.capacity_reservation_id})
    if reservations:
        table["reservations"] = reservations
    return table


def region_guard_prices(region: str) -> dict[str, Any]:
    """A price table for groups gpucluster did not describe: every catalog type's on-demand rate.

    What `Guardrails` renders when it is not handed `spend_prices` (~800 bytes: fits the
    Lambda's 4 KB environment); no fixed costs, no spot or block rates beyond on-demand.
    """
    on_demand: dict[str, float] = {}
    for name in catalog.names():
        instance = catalog.get(name)
        try:
            if instance is not None:
                on_demand[name] = round(on_demand_rate(instance, region).usd_per_hour, 4)
        except PricingError:
            continue
    return {"on_demand": on_demand, "fixed_usd_per_hour": 0.0}
