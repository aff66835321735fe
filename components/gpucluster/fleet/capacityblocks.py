"""The stack's Capacity Blocks as the spend guard prices them: one DescribeCapacityReservations read.

A Capacity Block is paid up front, within 12 hours of its purchase (EC2 API reference,
CapacityReservation State `payment-pending` / `payment-failed`), so its instances cost nothing by the
hour: the guard counts the block's fee once (`accrual.Block.counted`) instead of the hours. The
blocks of the stack are the capacity-block reservations that carry the stack tag (Cost Explorer
attributes their fee to the stack) or that the stack's instances or groups name (an untagged block
`gpucluster capacity buy` bought: Cost Explorer's tag filter never sees its fee, the guard does).

One paginated call per measure, made only when the stack has or may have a block (`needed`);
DescribeCapacityReservations has no resource-level permissions, so it reads the account's
reservations in the region and keeps the stack's. An answer the fee cannot be read from (no type,
count or dates) is `BlockAnswerError`: the guard fails the invocation rather than price the block's
instances at $0. AWS errors propagate (the caller fails the invocation: counting the hours instead
could miss a fee paid since the settled point, an under-count). Never imports Pulumi: carried into
the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any

from .accrual import CAPACITY_BLOCK, Block, Instance, Prices
from .tags import STACK_TAG

BLOCK_RESERVATION_TYPE = "capacity-block"
"""A Capacity Block's ReservationType (EC2 API reference, CapacityReservationType: default or this)."""
MAX_RESULTS = 1000  # DescribeCapacityReservations MaxResults: 1-1000 (botocore's ec2 model)


class BlockAnswerError(RuntimeError):
    """A capacity-block reservation of the stack whose fee cannot be priced from the answer."""


def needed(prices: Prices, instances: Iterable[Instance]) -> bool:
    """Whether the stack has or may have a block: a group buys blocks, or an instance runs (ran) in one."""
    return bool(prices.capacity_block or prices.reservations) or any(
        i.purchase == CAPACITY_BLOCK for i in instances)


def _tagged(reservation: Mapping[str, Any], stack: str) -> bool:
    return any(t.get("Key") == STACK_TAG and t.get("Value") == stack for t in reservation.get("Tags") or [])


def _block(raw: Mapping[str, Any], tagged: bool) -> Block:
    rid = raw.get("CapacityReservationId", "?")
    try:
        start, end = raw["StartDate"], raw["EndDate"]
        # CreateDate is the purchase; absent, the start is the latest it can be (a later payment is
        # counted longer, never dropped).
        created = raw.get("CreateDate") or start
        if not all(isinstance(d, datetime) for d in (start, end, created)):
            raise TypeError("dates are not timestamps")
        return Block(str(rid), str(raw["InstanceType"]), int(raw["TotalInstanceCount"]), start, end, created,
                     str(raw.get("State", "")), tagged)
    except (KeyError, TypeError, ValueError) as exc:
        raise BlockAnswerError(f"Capacity Block {rid}: the answer lacks what prices its fee "
                               f"({exc!r})") from None


def stack_blocks(ec2: Any, stack: str, named: Collection[str]) -> list[Block]:
    """The capacity-block reservations tagged with `stack` or named in `named`, sorted by id."""
    found: list[Block] = []
    pages = ec2.get_paginator("describe_capacity_reservations").paginate(
        PaginationConfig={"PageSize": MAX_RESULTS})
    for page in pages:
        for raw in page.get("CapacityReservations") or []:
            if raw.get("ReservationType") != BLOCK_RESERVATION_TYPE:
                continue
            tagged = _tagged(raw, stack)
            if tagged or raw.get("CapacityReservationId") in named:
                found.append(_block(raw, tagged))
    return sorted(found, key=lambda b: b.reservation_id)


def named_reservations(prices: Prices, instances: Iterable[Instance]) -> set[str]:
    """The reservations the stack's groups launch into and its block instances run (ran) in."""
    return {*prices.reservations, *(i.reservation for i in instances
                                    if i.purchase == CAPACITY_BLOCK and i.reservation)}
