"""Month-to-date spend between Cost Explorer's settled figure and now: the spend guard's pure maths.

Cost Explorer settles a day's costs hours after the day ends, and AWS Budgets
refreshes "up to three times a day" (Budgets user guide, "Best practices for
AWS Budgets"): both see GPU spend hours late. The spend guard therefore adds
to the last settled figure (through the day before yesterday, UTC) what
accrued since: every in-service instance's hours since then x its price for
how it was bought, plus the stack's fixed costs pro rata. The decision
functions here (`accrue`, `decide`) are what the handler and the month-replay
benchmark both call. No AWS call and no boto3 import: carried into the
Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

# Purchase options, from EC2 DescribeInstances InstanceLifecycle ("spot", "capacity-block",
# absent = on-demand; EC2 API reference, "Instance").
ON_DEMAND, SPOT, CAPACITY_BLOCK, COMMITTED = "on-demand", "spot", "capacity-block", "committed"
PURCHASE_OPTIONS = (ON_DEMAND, SPOT, CAPACITY_BLOCK, COMMITTED)
SETTLED_LAG_DAYS = 1
# EC2 API reference (botocore's ec2 model), CapacityReservation State: "payment-pending - (Capacity
# Blocks) The upfront payment has not been processed yet"; "payment-failed - (Capacity Blocks) The
# upfront payment was not processed in the 12-hour time frame. Your Capacity Block was released."
# So a block is paid within 12 hours of its purchase (CreateDate), or never.
BLOCK_PAYMENT_WINDOW = timedelta(hours=12)
BLOCK_UNPAID = "payment-failed"


class PriceError(ValueError):
    """The rendered price table is unusable or lacks an instance type the stack runs."""


@dataclass(frozen=True)
class Prices:
    """What the guard prices with, rendered at deploy (gpucluster.pricing.guard_prices).

    on_demand: instance type -> USD/h (the catalog's on-demand price for the region);
    capacity_block: instance type -> USD/h (Capacity Block rate);
    committed: node group -> (nodes of its on-demand base, USD/h each) for a Savings Plan or
    reserved base; fixed_usd_per_hour: NAT, endpoints, FSx, flow logs... pro rata.
    """

    on_demand: Mapping[str, float]
    capacity_block: Mapping[str, float] = field(default_factory=dict)
    committed: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    fixed_usd_per_hour: float = 0.0
    group_max: Mapping[str, float] = field(default_factory=dict)
    """node group -> the highest USD/h among its instance types: what an instance that already
    left the group is priced at (its type is no longer known)."""
    reservations: tuple[str, ...] = ()
    """The Capacity Block reservations the stack's groups launch into (capacity_reservation_id): read
    for their upfront fee even before an instance runs in them."""

    def gone_rate(self, node_group: str) -> float:
        return self.group_max.get(node_group) or max(self.on_demand.values(), default=0.0)

    def block_rate(self, instance_type: str) -> float:
        """USD per instance-hour of a Capacity Block of `instance_type`: the rendered block rate, else
        the on-demand price (a block of a type no group of the stack buys as a block)."""
        rate = self.capacity_block.get(instance_type)
        if rate is None:
            rate = self.on_demand.get(instance_type)
        if rate is None:
            raise PriceError(f"no Capacity Block or on-demand price for {instance_type}")
        return rate

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Prices:
        try:
            on_demand = {str(k): float(v) for k, v in raw["on_demand"].items()}
            blocks = {str(k): float(v) for k, v in raw.get("capacity_block", {}).items()}
            committed = {str(k): (int(v[0]), float(v[1])) for k, v in raw.get("committed", {}).items()}
            fixed = float(raw.get("fixed_usd_per_hour", 0.0))
            group_max = {str(k): float(v) for k, v in raw.get("group_max", {}).items()}
            reservations = raw.get("reservations", [])
            if not isinstance(reservations, list):
                raise TypeError("reservations is not a list")
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise PriceError(f"price table is malformed: {exc!r}") from None
        values = [*on_demand.values(), *blocks.values(), *(c[1] for c in committed.values()), fixed,
                  *group_max.values()]
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise PriceError("price table holds a negative or non-finite price")
        return cls(on_demand, blocks, committed, fixed, group_max, tuple(str(r) for r in reservations))


@dataclass(frozen=True)
class Instance:
    """One in-service instance of the stack: what it is, how it was bought, since when."""

    instance_id: str
    instance_type: str
    purchase: str
    launched: datetime
    node_group: str = ""
    zone: str | None = None
    reservation: str | None = None
    """The Capacity Reservation it runs in (DescribeInstances CapacityReservationId), if any."""


@dataclass(frozen=True)
class Block:
    """A Capacity Block reservation of the stack (DescribeCapacityReservations, ReservationType
    capacity-block): its whole fee is paid up front, so its instances cost nothing by the hour."""

    reservation_id: str
    instance_type: str
    instance_count: int
    start: datetime
    end: datetime
    created: datetime
    """When it was purchased (CreateDate): it is paid within BLOCK_PAYMENT_WINDOW of it."""
    state: str
    tagged: bool
    """It carries the stack tag: Cost Explorer's tag filter, so the settled figure, sees its fee."""

    @property
    def hours(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds() / 3600)

    def fee_usd(self, prices: Prices) -> float:
        """The upfront fee: the block rate x instances x the block's hours.

        The offering's UpfrontFee is not readable once bought (DescribeCapacityReservations has no
        price member, and no call describes an offering by id), so the catalog's block rate rendered
        at deploy prices it; that AWS charges that rate is unverified (ledger: capacity-block-fee-rate).
        """
        return prices.block_rate(self.instance_type) * self.instance_count * self.hours

    def counted(self, now: datetime) -> bool:
        """Whether its fee is this month's and not in the settled figure: the accrual counts it.

        Paid by `created` + BLOCK_PAYMENT_WINDOW (never when the payment failed). The settled figure
        holds it only when the block carries the stack tag and was paid before the settled point
        (that Cost Explorer dates the fee on its payment day under the reservation's tags is
        unverified: ledger: capacity-block-fee-in-cost-explorer); a fee that may have been paid this
        month is counted, so a doubt counts it twice rather than not at all.
        """
        if self.state == BLOCK_UNPAID:
            return False
        paid_by = self.created + BLOCK_PAYMENT_WINDOW
        if paid_by < month_start(now):
            return False
        return not (self.tagged and paid_by < settled_through(now))


@dataclass(frozen=True)
class Spend:
    """Month-to-date spend: the settled figure, what accrued since, and the burn rate now."""

    settled_usd: float
    settled_through: datetime
    accrued_usd: float
    usd_per_hour: float
    priced: Mapping[str, float] = field(default_factory=dict)
    """instance id -> USD/h it is priced at."""
    gone_hours: Mapping[str, float] = field(default_factory=dict)
    """node group -> instance-hours since the settled point of instances no longer in service."""
    block_fees: Mapping[str, float] = field(default_factory=dict)
    """Capacity Block reservation -> its upfront fee in the accrued figure (0: in the settled figure,
    or not this month's)."""
    notes: tuple[str, ...] = ()
    """What the figure may miss or count by an estimate, in words (empty: nothing known)."""

    @property
    def total_usd(self) -> float:
        return self.settled_usd + self.accrued_usd


@dataclass(frozen=True)
class Decision:
    """Stop or not, and why; `hours_to_limit` is None when nothing burns."""

    stop: bool
    reason: str
    spend_usd: float
    usd_per_hour: float
    limit_usd: float
    hours_to_limit: float | None

    def to_limit_hours(self) -> float | None:
        return None if self.hours_to_limit is None else round(self.hours_to_limit, 2)

    def as_json(self) -> dict[str, Any]:
        return {"stop": self.stop, "reason": self.reason, "spend_usd": round(self.spend_usd, 2),
                "usd_per_hour": round(self.usd_per_hour, 2), "limit_usd": round(self.limit_usd, 2),
                "hours_to_limit": None if self.hours_to_limit is None else round(self.hours_to_limit, 2)}


def month_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def settled_through(now: datetime) -> datetime:
    """Where the settled figure ends: yesterday 00:00 UTC (never before the month's start).

    Cost Explorer updates "at least once every 24 hours" (Cost Management user guide,
    "Analyzing your costs with AWS Cost Explorer"): yesterday may still be filling in at any
    hour of today, so the guard takes the days before it as settled and accrues yesterday and
    today itself. An instance stopped since that point is no longer seen: that gap (at most
    two days of stopped instances) is what AWS Budgets, the backstop, still catches.
    """
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(month_start(now), midnight - timedelta(days=SETTLED_LAG_DAYS))


def cost_period(now: datetime) -> dict[str, str] | None:
    """GetCostAndUsage TimePeriod for the settled part of the month; None on the month's first day."""
    start, end = month_start(now), settled_through(now)
    if end <= start:
        return None
    return {"Start": start.date().isoformat(), "End": end.date().isoformat()}


def instance_rates(instances: Iterable[Instance], prices: Prices,
                   spot: Mapping[tuple[str, str | None], float],
                   prepaid: Collection[str] = ()) -> dict[str, float]:
    """USD/h of each instance by how it was bought.

    Spot is priced at the current spot price of its type and zone (then of its type in any
    zone, the highest), falling back to the on-demand price: spot never costs more than
    on-demand, so the fallback can only stop early, never late. A committed base (Savings
    Plan or reserved) covers the oldest on-demand instances of its group, up to the base size.
    An instance in a Capacity Block whose reservation is in `prepaid` costs nothing by the hour
    (its block's fee is counted once, `Block`); in a block not read, at the block rate.
    """
    rates: dict[str, float] = {}
    base_left = {g: n for g, (n, _) in prices.committed.items()}
    for inst in sorted(instances, key=lambda i: (i.launched, i.instance_id)):
        od = prices.on_demand.get(inst.instance_type)
        if od is None:
            raise PriceError(f"no on-demand price for {inst.instance_type} ({inst.instance_id})")
        if inst.purchase == SPOT:
            by_type = [p for (t, _z), p in spot.items() if t == inst.instance_type]
            rate = spot.get((inst.instance_type, inst.zone), max(by_type, default=od))
        elif inst.purchase == CAPACITY_BLOCK and inst.reservation in prepaid:
            rate = 0.0
        elif inst.purchase == CAPACITY_BLOCK:
            rate = prices.capacity_block.get(inst.instance_type, od)
        elif base_left.get(inst.node_group, 0) > 0:
            base_left[inst.node_group] -= 1
            rate = prices.committed[inst.node_group][1]
        else:
            rate = od
        rates[inst.instance_id] = rate
    return rates


def accrue(settled_usd: float, instances: Iterable[Instance], prices: Prices, now: datetime,
           spot: Mapping[tuple[str, str | None], float] | None = None,
           group_hours: Mapping[str, float] | None = None,
           gone_instances: Iterable[tuple[Instance, float]] = (),
           blocks: Iterable[Block] = ()) -> Spend:
    """Settled figure + each instance's hours since the settled point x its rate + fixed costs.

    `gone_instances` (instance, hours since the settled point), from the instance ledger
    (`instanceledger`, every backend), adds the instances that ran since then but are gone now
    (stopped, replaced, scaled in), each at its own type's rate for how it was bought (spot at
    its type's spot price or on-demand; a committed base is left to the instances in service).
    Without a ledger, `group_hours` (node group -> in-service instance-hours since the settled
    point, from the Auto Scaling groups' GroupInServiceInstances metric) does: the hours the
    metric counts beyond those of the instances still in service, at the group's highest rate.

    `blocks` (the stack's Capacity Blocks, `capacityblocks`) add each block's upfront fee once when
    it is this month's and not settled (`Block.counted`); their instances cost nothing by the hour.
    An instance in a block that was not read is priced at the block rate by the hour, said in `notes`.
    """
    since = settled_through(now)
    items = list(instances)
    known = list(blocks)
    prepaid = {b.reservation_id for b in known}
    fees = {b.reservation_id: b.fee_usd(prices) if b.counted(now) else 0.0 for b in known}
    rates = instance_rates(items, prices, spot or {}, prepaid)
    accrued = 0.0
    seen: dict[str, float] = {}
    for inst in items:
        hours = max(0.0, (now - max(inst.launched, since)).total_seconds() / 3600)
        accrued += hours * rates[inst.instance_id]
        seen[inst.node_group] = seen.get(inst.node_group, 0.0) + hours
    gone = {g: h - seen.get(g, 0.0) for g, h in (group_hours or {}).items() if h - seen.get(g, 0.0) > 0}
    accrued += sum(h * prices.gone_rate(g) for g, h in gone.items())
    left = list(gone_instances)
    uncommitted = Prices(prices.on_demand, prices.capacity_block, {}, 0.0, prices.group_max)
    gone_rates = instance_rates([i for i, _ in left], uncommitted, spot or {}, prepaid)
    for inst, hours in left:
        accrued += hours * gone_rates[inst.instance_id]
        gone[inst.node_group] = gone.get(inst.node_group, 0.0) + hours
    fixed_hours = (now - since).total_seconds() / 3600
    accrued += fixed_hours * prices.fixed_usd_per_hour + sum(fees.values())
    unread = sorted({i.reservation or "(none named)" for i in [*items, *(i for i, _ in left)]
                     if i.purchase == CAPACITY_BLOCK and i.reservation not in prepaid})
    notes = (f"Capacity Block instances of reservation {', '.join(unread)} priced by the hour at the "
             "block rate: the reservation was not read, so its upfront fee is not counted",) if unread else ()
    return Spend(settled_usd, since, accrued, sum(rates.values()) + prices.fixed_usd_per_hour, rates,
                 gone, fees, notes)


def decide(spend: Spend, limit_usd: float, check_minutes: float,
           max_usd_per_hour: float | None = None, compute_running: bool = True) -> Decision:
    """Stop when spend has crossed the limit, will cross it before the next check, or burns too fast.

    `compute_running` False (every group already at zero) never stops: fixed costs alone keep
    accruing and a stop could not save them.
    """
    total, rate = spend.total_usd, spend.usd_per_hour
    left = limit_usd - total
    hours = None if rate <= 0 else max(0.0, left / rate)
    reason = ""
    if total >= limit_usd:
        reason = f"spend ${total:,.2f} has reached the limit ${limit_usd:,.2f}"
    elif hours is not None and hours * 60 <= check_minutes:
        reason = (f"spend ${total:,.2f} at ${rate:,.2f}/h reaches the limit ${limit_usd:,.2f} "
                  f"in {hours * 60:.0f} min, before the next check ({check_minutes:g} min)")
    elif max_usd_per_hour is not None and rate > max_usd_per_hour:
        reason = f"burn rate ${rate:,.2f}/h exceeds max_usd_per_hour ${max_usd_per_hour:,.2f}"
    stop = bool(reason) and compute_running
    if reason and not compute_running:
        reason += " (compute already at zero)"
    return Decision(stop, reason or "within budget", total, rate, limit_usd, hours)


def when_limit(now: datetime, decision: Decision) -> datetime | None:
    """The moment the limit will be hit at the current burn rate (None if nothing burns)."""
    if decision.hours_to_limit is None:
        return None
    return now + timedelta(hours=decision.hours_to_limit)
