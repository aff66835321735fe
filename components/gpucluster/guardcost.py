"""What the spend guard's own API calls cost a month: the `cost`/`plan` line "Spend guard API calls".

The spend guard (lambdas/spend_guard.py) runs every `budget.check_minutes`. It reads Cost Explorer at
most GUARD_CE_READS_PER_DAY times a day (fleet/settledcache.py keeps the settled figure in the
guard-state table; a test holds the two equal) and, on every check while compute runs, the
guard-state table: the groups (Query), the kept figure and the instance ledger (GetItem), the ledger
written back (PutItem). No GetMetricData any more: the ledger prices the instances that are gone. Its EC2
reads (DescribeInstances, DescribeSpotPriceHistory, and DescribeCapacityReservations on a stack with a
Capacity Block) are not counted: the model charges no EC2 request, as it never did for DescribeInstances.
The prices are us-east-1 list prices from memory (ledger: guard-api-prices), Cost Explorer's
included (ledger: ce-request-price). Pure: no AWS call; `pricing` wraps the figure in its OtherCost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpucluster.spec import StackSpec

GUARD_CE_USD_PER_REQUEST = 0.01  # ledger: ce-request-price
GUARD_CE_READS_PER_DAY = 4
SCHEDULER_USD_PER_MILLION_INVOCATIONS = 1.00  # ledger: guard-api-prices
DYNAMODB_USD_PER_MILLION_READS, DYNAMODB_USD_PER_MILLION_WRITES = 0.125, 0.625  # ledger: guard-api-prices
GUARD_READS_PER_CHECK, GUARD_WRITES_PER_CHECK = 3, 1
LEDGER_BYTES_PER_INSTANCE = 160  # one instance's entry in the ledger item (id, type, purchase, zone, times)
SOURCE = ("AWS Cost Management, EventBridge Scheduler and DynamoDB pricing pages "
          "(ledger: guard-api-prices, ce-request-price)")


@dataclass(frozen=True)
class GuardApiCost:
    """The month's guard API cost at desired and at max nodes (the ledger item grows with the nodes)."""

    desired_usd_per_month: float
    max_usd_per_month: float
    basis: str


def guard_api_cost(spec: StackSpec, hours_per_month: float) -> GuardApiCost | None:
    """The spend guard's API calls a month (None without a spend guard): an upper bound, as if compute
    ran at every check (while nothing runs it reads only the groups)."""
    budget = spec.budget
    if budget is None or budget.action_threshold_percent is None:
        return None
    checks = hours_per_month * 60 / budget.check_minutes
    ce = GUARD_CE_READS_PER_DAY * hours_per_month / 24 * GUARD_CE_USD_PER_REQUEST
    schedule = checks * SCHEDULER_USD_PER_MILLION_INVOCATIONS / 1e6

    def table(nodes: int) -> float:
        # DynamoDB bills a strongly consistent read per 4 KB and a write per 1 KB of the item.
        kb = nodes * LEDGER_BYTES_PER_INSTANCE / 1024
        reads = GUARD_READS_PER_CHECK - 1 + max(1, math.ceil(kb / 4))
        writes = GUARD_WRITES_PER_CHECK * max(1, math.ceil(kb))
        usd = reads * DYNAMODB_USD_PER_MILLION_READS + writes * DYNAMODB_USD_PER_MILLION_WRITES
        return checks * usd / 1e6

    desired = sum(g.desired_nodes for g in spec.node_groups)
    top = sum(g.max_nodes for g in spec.node_groups)
    basis = (f"Cost Explorer <= {GUARD_CE_READS_PER_DAY} reads/day x ${GUARD_CE_USD_PER_REQUEST} (settled "
             f"figure kept in the guard-state table) + {checks:,.0f} checks (every {budget.check_minutes:g} "
             f"min) x ${SCHEDULER_USD_PER_MILLION_INVOCATIONS:g}/M schedule invocations + DynamoDB "
             f"{GUARD_READS_PER_CHECK} reads, {GUARD_WRITES_PER_CHECK} write a check x "
             f"${DYNAMODB_USD_PER_MILLION_READS}/${DYNAMODB_USD_PER_MILLION_WRITES} per M; "
             "GetMetricData: none")
    return GuardApiCost(ce + schedule + table(desired), ce + schedule + table(top), basis)
