"""Spend guard handler: every few minutes, month-to-date spend against the limit; over it, compute to zero.

Invoked by an EventBridge Scheduler schedule every CHECK_MINUTES (1-15). While
no group runs it reads nothing else (no Cost Explorer call): it only tells a
budget stop an earlier attempt could not tell. Otherwise it takes the settled
Cost Explorer figure for the stack's identity tag (GetCostAndUsage through the
day before yesterday, UTC), kept in the guard-state table and read again only
when the UTC date changes or the kept read is over 6 hours old
(`settledcache`: at most four reads a day); an answer that is not a figure
fails the invocation, never reads as $0. It reads the stack's in-service
instances (type, zone, purchase option, launch time), the current spot prices
of the spot ones (DescribeSpotPriceHistory; the on-demand price when that
fails: spot never costs more, so the fallback errs towards stopping early),
the instances it recorded on earlier ticks that are gone now
(`instanceledger`, on every backend: a PCS group has no Auto Scaling metrics;
without a table, the groups' GroupInServiceInstances metric), and accrues the
hours since the settled point at the prices rendered at deploy (PRICES_JSON,
`accrual.Prices`). A Capacity Block's instances cost nothing by the hour: the block's upfront fee
is counted once, from its reservation (`capacityblocks`: DescribeCapacityReservations), unless the
settled figure holds it already. It stops every group of the stack exactly as the budget
action does (`stops.stop_groups` with reason budget, confirmed after a settle
time) when the spend has reached LIMIT_USD, will reach it before the next
check at the current burn rate, or the burn rate exceeds MAX_USD_PER_HOUR,
then records this tick's instances. AWS Budgets stays as the backstop. What the figure may miss
(instances that stopped before the guard began recording them, for up to two days after an upgrade;
a block whose reservation was not read) is in the result's `notes`; the first is told once.

A read that fails (throttled, denied, a 5xx) fails the invocation after
anything decidable is done: the schedule's retry or the next tick runs it
again, and the on-failure destination tells the topic. A retry is one run:
stopping is idempotent and a stopped group is left as it is. Never deletes
anything; acts only on groups tagged with GPUCLUSTER_STACK.

Environment: GPUCLUSTER_STACK, LIMIT_USD, PRICES_JSON (required), CHECK_MINUTES,
MAX_USD_PER_HOUR, NOTIFY_TOPIC_ARN, GUARD_STATE_TABLE (optional; also where prices fetched from
the AWS Price List are cached).

A type the rendered table lacks (a region gpucluster carries no prices for) is priced from the AWS
Price List API (`fleet.pricelist`: pricing:GetProducts, cached in the guard-state table); a type the
Price List has no price for either is a configuration error, as before.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpucluster.fleet.accrual import Decision, PriceError, Prices, decide, settled_through, when_limit
from gpucluster.fleet.awsapi import AWS_ERRORS, log_event
from gpucluster.fleet.capacityblocks import BlockAnswerError
from gpucluster.fleet.deployment import STATE_TABLE_ENV
from gpucluster.fleet.instanceledger import LedgerConflict
from gpucluster.fleet.nodegroups import BUDGET, NodeGroup, NodeGroups
from gpucluster.fleet.pricelist import FallbackPrices, PriceCache, PriceListError, cached_lookup
from gpucluster.fleet.runtime import (
    RUNTIME,
    ConfigError,
    GuardrailError,
    NotifyError,
    env_number,
    env_text,
    invocation_deadline,
    notify_from_env,
    stack_from_env,
)
from gpucluster.fleet.spendguard import (
    DEFAULT_CHECK_MINUTES,
    CostAnswerError,
    Memory,
    measure_groups,
    unrecorded_note,
)
from gpucluster.fleet.stops import (
    StopReport,
    budget_stop,
    mark_told,
    raise_if_failed,
    stack_node_groups,
    untold,
)


def settings() -> tuple[float, Prices, float, float | None]:
    """(limit, prices, check minutes, max USD/h) from the environment; ConfigError when unusable."""
    limit = env_number("LIMIT_USD", 0.0)
    if limit <= 0:
        raise ConfigError("LIMIT_USD is not set to a positive number: the spend guard has no limit")
    raw = os.environ.get("PRICES_JSON", "")
    try:
        prices = Prices.from_json(json.loads(raw))
    except (ValueError, PriceError) as exc:
        raise ConfigError(f"PRICES_JSON is not a usable price table: {exc}") from None
    cap = env_number("MAX_USD_PER_HOUR", 0.0)
    return limit, prices, env_number("CHECK_MINUTES", DEFAULT_CHECK_MINUTES), cap or None


def with_price_list(prices: Prices, stack: str, now: datetime) -> Prices:
    """`prices` with its on-demand table falling back to the AWS Price List (cached in the guard-state
    table) for a type it lacks; the clients are made only when one is missing."""
    region = os.environ.get("AWS_REGION", "")

    def lookup(instance_type: str) -> float | None:
        table = env_text(STATE_TABLE_ENV)
        cache = PriceCache(RUNTIME.client("dynamodb"), table, stack) if table else None
        return cached_lookup(RUNTIME.client("pricing"), cache, region, now)(instance_type)

    return replace(prices, on_demand=FallbackPrices(prices.on_demand, lookup))


def _tell(stack: str, backend: NodeGroups, report: StopReport, subject: str, summary: dict[str, Any]) -> None:
    """Notify what `report` changed, failed or found untold, then mark it told (`stops.mark_told`)."""
    if report.to_tell or report.errors:
        mark_told(backend, report.told, notify_from_env(f"gpucluster {stack}: {subject}"[:100], summary))


def _stop(stack: str, backend: NodeGroups, groups: list[NodeGroup], decision: Decision,
          notes: tuple[str, ...]) -> dict[str, Any]:
    report = budget_stop(backend, groups)
    summary = {"stack": stack, **report.summary(BUDGET), "spend": decision.as_json(),
               **({"notes": list(notes)} if notes else {})}
    _tell(stack, backend, report, f"spend guard stopped compute ({decision.reason})", summary)
    log_event("spend guard done", **summary)
    raise_if_failed(report, stack)
    return summary


def _at_zero(stack: str, backend: NodeGroups, groups: list[NodeGroup]) -> dict[str, Any]:
    """No compute runs: nothing to measure (no Cost Explorer read); a budget stop never told is told now.

    An earlier attempt (this guard's or the budget action's) that stopped the groups and was killed,
    or whose publish was refused, left them `notified: false`: its retry finds compute at zero and
    must still say so.
    """
    names = untold(groups, stops=(BUDGET,))
    report = StopReport(untold=names, labels=dict.fromkeys(names, BUDGET))
    summary: dict[str, Any] = {"action": "unchanged", "stack": stack, "spend": None,
                               "reason": "compute at zero: spend not read"}
    if names:
        summary["untold"] = names
        _tell(stack, backend, report, "spend guard stopped compute (told late)",
              {**summary, **report.summary(BUDGET)})
    log_event("spend guard done", **summary)
    return summary


def _tell_unrecorded(stack: str, memory: Memory, now: datetime) -> bool:
    """Tell once that the figure may miss instances stopped before the ledger began; whether told.

    A refused publish is logged, not raised: the note is in every tick's result and log, and the
    next tick tells it again (the flag is kept only once a publish went through)."""
    if not memory.gap_untold or memory.unrecorded is None:
        return False
    note = unrecorded_note(memory.unrecorded, settled_through(now))
    try:
        return notify_from_env(f"gpucluster {stack}: spend figure may be low for two days",
                               {"stack": stack, "note": note})
    except NotifyError as exc:
        log_event("figure's gap not told: the next tick tells it", logging.WARNING, error=str(exc))
        return False


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point for the spend guard's schedule (the event's content is not used)."""
    stack = stack_from_env()
    limit, prices, check_minutes, cap = settings()
    now = RUNTIME.now()
    prices = with_price_list(prices, stack, now)
    # It prices the members: none known is an error.
    backend = stack_node_groups(strict_members=True, deadline=invocation_deadline(context))
    table = env_text(STATE_TABLE_ENV)
    memory = Memory.in_table(RUNTIME.client("dynamodb") if table else None, table, stack, check_minutes)
    try:
        groups = backend.list_groups(stack)
        if not any(g.running for g in groups):
            return _at_zero(stack, backend, groups)
        spend = measure_groups(stack, groups, RUNTIME.client("ec2"), RUNTIME.client("ce"),
                               RUNTIME.client("cloudwatch"), prices, now, memory)
    except (*AWS_ERRORS, CostAnswerError, PriceListError, BlockAnswerError) as exc:
        # Without the figures nothing can be decided: fail, so the retry or the next tick
        # runs again and the on-failure destination tells the topic.
        raise GuardrailError(f"stack {stack}: spend guard could not read spend: {exc}") from exc
    except PriceError as exc:
        raise ConfigError(f"stack {stack}: {exc}") from None
    decision = decide(spend, limit, check_minutes, cap, compute_running=True)
    hit = when_limit(now, decision)
    log_event("spend measured", stack=stack, **decision.as_json(),
              settled_usd=round(spend.settled_usd, 2), accrued_usd=round(spend.accrued_usd, 2),
              limit_at=hit.isoformat() if hit else None, cost_explorer_reads=memory.cost_explorer_reads,
              block_fees_usd={k: round(v, 2) for k, v in spend.block_fees.items()}, notes=list(spend.notes))
    if decision.stop:
        summary = _stop(stack, backend, groups, decision, spend.notes)
    else:
        summary = {"action": "unchanged", "stack": stack, "spend": decision.as_json(),
                   **({"notes": list(spend.notes)} if spend.notes else {})}
    told = _tell_unrecorded(stack, memory, now)
    try:
        memory.remember(now, told)  # after the decision: a refused write never delays a stop
    except (*AWS_ERRORS, LedgerConflict) as exc:
        raise GuardrailError(f"stack {stack}: instances not recorded (the retry records them): "
                             f"{exc}") from exc
    return summary
