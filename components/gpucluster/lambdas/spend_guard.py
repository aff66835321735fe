"""Spend guard handler: every few minutes, month-to-date spend against the limit; over it, compute to zero.

Invoked by an EventBridge Scheduler schedule every CHECK_MINUTES (1-15). It
reads the last settled Cost Explorer figure for the stack's identity tag
(GetCostAndUsage through the day before yesterday, UTC: yesterday may still
be filling in), the stack's in-service instances (type, zone, purchase option,
launch time), the current spot prices of the spot ones
(DescribeSpotPriceHistory; the on-demand price when that fails: spot never
costs more, so the fallback errs towards stopping early), the groups'
GroupInServiceInstances metric (instances that ran since the settled point but
are gone), and accrues the hours since the settled point at the prices
rendered at deploy (PRICES_JSON, `accrual.Prices`). It stops every group of
the stack exactly as the budget action does (`stops.stop_groups` with reason
budget, confirmed after a settle time) when the spend has reached LIMIT_USD,
will reach it before the next check at the current burn rate, or the burn
rate exceeds MAX_USD_PER_HOUR. AWS Budgets stays as the backstop.

A read that fails (throttled, denied, a 5xx) fails the invocation after
anything decidable is done: the schedule's retry or the next tick runs it
again, and the on-failure destination tells the topic. A retry is one run:
stopping is idempotent and a stopped group is left as it is. Never deletes
anything; acts only on groups tagged with GPUCLUSTER_STACK.

Environment: GPUCLUSTER_STACK, LIMIT_USD, PRICES_JSON (required), CHECK_MINUTES,
MAX_USD_PER_HOUR, NOTIFY_TOPIC_ARN (optional), GUARD_STATE_TABLE (where prices fetched from the AWS
Price List are cached).

A type the rendered table lacks (a region gpucluster carries no prices for) is priced from the AWS
Price List API (`fleet.pricelist`: pricing:GetProducts, cached in the guard-state table); a type the
Price List has no price for either is a configuration error, as before.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpucluster.fleet.accrual import Decision, PriceError, Prices, decide, when_limit
from gpucluster.fleet.awsapi import AWS_ERRORS, log_event
from gpucluster.fleet.deployment import STATE_TABLE_ENV
from gpucluster.fleet.nodegroups import BUDGET, NodeGroup, NodeGroups
from gpucluster.fleet.pricelist import FallbackPrices, PriceCache, PriceListError, cached_lookup
from gpucluster.fleet.runtime import (
    RUNTIME,
    ConfigError,
    GuardrailError,
    env_number,
    env_text,
    invocation_deadline,
    notify_from_env,
    stack_from_env,
)
from gpucluster.fleet.spendguard import DEFAULT_CHECK_MINUTES, measure
from gpucluster.fleet.stops import (
    budget_stop,
    mark_told,
    raise_if_failed,
    stack_node_groups,
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


def _stop(stack: str, backend: NodeGroups, groups: list[NodeGroup], decision: Decision) -> dict[str, Any]:
    report = budget_stop(backend, groups)
    summary = {"stack": stack, **report.summary(BUDGET), "spend": decision.as_json()}
    if report.to_tell or report.errors:
        sent = notify_from_env(f"gpucluster {stack}: spend guard stopped compute ({decision.reason})"[:100],
                               summary)
        mark_told(backend, report, sent)
    log_event("spend guard done", **summary)
    raise_if_failed(report, stack)
    return summary


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point for the spend guard's schedule (the event's content is not used)."""
    stack = stack_from_env()
    limit, prices, check_minutes, cap = settings()
    now = RUNTIME.now()
    prices = with_price_list(prices, stack, now)
    # It prices the members: none known is an error.
    backend = stack_node_groups(strict_members=True, deadline=invocation_deadline(context))
    try:
        groups, spend = measure(stack, backend, RUNTIME.client("ec2"), RUNTIME.client("ce"),
                                RUNTIME.client("cloudwatch"), prices, now)
    except (*AWS_ERRORS, PriceListError) as exc:
        # Without the figures nothing can be decided: fail, so the retry or the next tick
        # runs again and the on-failure destination tells the topic.
        raise GuardrailError(f"stack {stack}: spend guard could not read spend: {exc}") from exc
    except PriceError as exc:
        raise ConfigError(f"stack {stack}: {exc}") from None
    decision = decide(spend, limit, check_minutes, cap, compute_running=any(g.running for g in groups))
    hit = when_limit(now, decision)
    log_event("spend measured", stack=stack, **decision.as_json(),
              settled_usd=round(spend.settled_usd, 2), accrued_usd=round(spend.accrued_usd, 2),
              limit_at=hit.isoformat() if hit else None)
    if not decision.stop:
        return {"action": "unchanged", "stack": stack, "spend": decision.as_json()}
    return _stop(stack, backend, groups, decision)
