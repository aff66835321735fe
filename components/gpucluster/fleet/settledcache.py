"""The settled Cost Explorer figure kept in the guard-state table: read at most four times a day.

The spend guard's settled figure runs through `accrual.settled_through` (yesterday 00:00 UTC), so
it changes at most when the UTC date does, plus late charges Cost Explorer adds to settled days as
it refreshes ("at least once every 24 hours", Cost Management user guide). Each GetCostAndUsage
request costs $0.01 (`COST_EXPLORER_USD_PER_REQUEST`; ledger: ce-request-price): read every
5-minute tick that was 8,640 requests ($86) a month per stack. The figure read is kept in one item
of the stack's guard-state table (sort key `SETTLED_KEY`, in the stack's own partition, so the
handler's `dynamodb:LeadingKeys` grant covers it) with the UTC date it was read on and when; it is
read again when the date changes or the kept read is older than `MAX_AGE_SECONDS` (6 h): at most
four reads a day. A kept figure that cannot be read (throttled, denied, malformed) is read from
Cost Explorer instead, and one that cannot be written is logged: the guard decides on the figure
either way. Never imports Pulumi: carried into the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from .awsapi import AWS_ERRORS, log_event

SETTLED_KEY = "#settled"
"""The item's sort key: '#' sorts before every node-group name gpucluster gives (letters, digits, -)."""
MAX_AGE_SECONDS = 6 * 3600
COST_EXPLORER_USD_PER_REQUEST = 0.01  # ledger: ce-request-price
READS_PER_DAY_MAX = 24 * 3600 // MAX_AGE_SECONDS
"""The most Cost Explorer reads a day the cache allows (one per 6 h window, the date change included)."""


class SettledCache:
    """The stack's kept settled figure in guard-state table `table` (client `dynamodb`)."""

    def __init__(self, dynamodb: Any, table: str, stack: str) -> None:
        self.dynamodb, self.table, self.stack = dynamodb, table, stack

    def _key(self) -> dict[str, Any]:
        return {"stack": {"S": self.stack}, "group": {"S": SETTLED_KEY}}

    def get(self, now: datetime) -> float | None:
        """The kept figure when it was read today (UTC) less than MAX_AGE_SECONDS ago; else None."""
        try:
            item = self.dynamodb.get_item(TableName=self.table, Key=self._key(),
                                          ConsistentRead=True).get("Item")
        except AWS_ERRORS as exc:
            log_event("kept settled figure unreadable: reading Cost Explorer", logging.WARNING,
                      error=str(exc))
            return None
        if not isinstance(item, dict):
            return None
        try:
            date = item["date"]["S"]
            read_at = float(item["read_at"]["N"])
            usd = float(item["usd"]["N"])
        except (KeyError, TypeError, ValueError):
            log_event("kept settled figure malformed: reading Cost Explorer", logging.WARNING)
            return None
        age = now.timestamp() - read_at
        if date != now.date().isoformat() or not 0 <= age <= MAX_AGE_SECONDS or not math.isfinite(usd):
            return None
        return usd

    def put(self, now: datetime, usd: float) -> None:
        """Keep `usd`, read now (last writer wins: two reads of the same figure are both right)."""
        item = {**self._key(), "date": {"S": now.date().isoformat()},
                "read_at": {"N": str(int(now.timestamp()))}, "usd": {"N": f"{float(usd):.6f}"}}
        try:
            self.dynamodb.put_item(TableName=self.table, Item=item)
        except AWS_ERRORS as exc:
            log_event("settled figure not kept: the next tick reads Cost Explorer again", logging.WARNING,
                      error=str(exc))


def settled_figure(read: Any, cache: SettledCache | None, now: datetime) -> tuple[float, bool]:
    """(the settled figure, whether Cost Explorer was read): the kept one when fresh, else `read()`.

    `read` is the Cost Explorer read (`spendguard.settled_cost` bound to its client and stack);
    its errors propagate, and a figure it could not produce is never kept.
    """
    if cache is not None:
        kept = cache.get(now)
        if kept is not None:
            return kept, False
    usd = float(read())
    if cache is not None:
        cache.put(now, usd)
    return usd, True
