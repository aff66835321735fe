"""The stack's instances as the spend guard saw them, in the guard-state table: every backend, no metrics.

The settled Cost Explorer figure ends at `accrual.settled_through`; an instance that ran since then
and is gone now (stopped, scaled in, replaced) is in neither the settled figure nor the groups'
members. Auto Scaling's GroupInServiceInstances metric counted such hours on Auto Scaling stacks
only: a PCS compute node group launches through EC2 Fleet and has no Auto Scaling metrics, so a
Slurm stack's nodes that stopped yesterday were priced at $0 until Cost Explorer caught up. Each
tick therefore records every in-service instance of the stack (id, type, purchase, zone, node
group, launch time, last seen) in one item of the stack's guard-state table (sort key
`LEDGER_KEY`, the stack's partition: the handler's `dynamodb:LeadingKeys` grant covers it); an
instance recorded and no longer in service is priced from its launch (or the settled point) to
its last sighting plus one check interval (it stopped at most then), by its own type and purchase.
Sightings last seen before the settled point are in the settled figure and dropped.

The item keeps when it was first written (`started`): an instance that stopped before then (the first
ticks after an upgrade to a guard with a ledger) was never recorded, so until the settled point passes
`started` (at most two days) the figure may miss it. The guard says so (`Spend.notes`) and tells it
once (`gap_told`, kept in the item); counting them instead would take CloudTrail or the Auto Scaling
metrics a PCS group does not have.

The record is one conditional PutItem on the version read (two ticks at once: the loser reads
again and merges; `CONFLICT_RETRIES`). One item of at most 400 KB holds about 2,000 instances
(DynamoDB developer guide, "Service, account, and table quotas": item size), well above a stack's
20 groups. Never imports Pulumi: carried into the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .accrual import Instance
from .awsapi import AWS_ERRORS, error_code, log_event

LEDGER_KEY = "#instances"
"""The item's sort key: '#' sorts before every node-group name gpucluster gives (letters, digits, -)."""
CONFLICT_RETRIES = 3
CONDITION_FAILED = "ConditionalCheckFailedException"


class LedgerConflict(RuntimeError):
    """The ledger changed under every retry: something writes it in a loop."""


@dataclass(frozen=True)
class Sighting:
    """One instance as last seen in service (`seen`: epoch seconds)."""

    instance: Instance
    seen: float


def _to_item(s: Sighting) -> dict[str, Any]:
    i = s.instance
    fields: dict[str, Any] = {"type": {"S": i.instance_type}, "purchase": {"S": i.purchase},
                              "group": {"S": i.node_group},
                              "launched": {"N": str(int(i.launched.timestamp()))},
                              "seen": {"N": str(int(s.seen))}}
    if i.zone:
        fields["zone"] = {"S": i.zone}
    if i.reservation:
        fields["reservation"] = {"S": i.reservation}
    return {"M": fields}


def _from_item(instance_id: str, raw: Any) -> Sighting | None:
    try:
        f = raw["M"]
        launched = datetime.fromtimestamp(int(f["launched"]["N"]), UTC)
        return Sighting(Instance(instance_id, f["type"]["S"], f["purchase"]["S"], launched,
                                 f.get("group", {}).get("S", ""), f.get("zone", {}).get("S"),
                                 f.get("reservation", {}).get("S")),
                        float(f["seen"]["N"]))
    except (KeyError, TypeError, ValueError):
        log_event("instance ledger entry malformed: skipped", logging.WARNING, instance=instance_id)
        return None


class InstanceLedger:
    """The stack's instance sightings in guard-state table `table` (client `dynamodb`)."""

    def __init__(self, dynamodb: Any, table: str, stack: str) -> None:
        self.dynamodb, self.table, self.stack = dynamodb, table, stack
        self.started: float | None = None
        """When the item was first written (epoch seconds), as the last `read` found it; None: not yet."""
        self.gap_told: bool = False
        """Whether the instances it may miss (stopped before `started`) were told, as last read."""

    def _key(self) -> dict[str, Any]:
        return {"stack": {"S": self.stack}, "group": {"S": LEDGER_KEY}}

    def read(self) -> tuple[dict[str, Sighting], int | None]:
        """(instance id -> sighting, the item's version; None when there is none). AWS errors propagate.

        It also sets `started` and `gap_told` from the item."""
        item = self.dynamodb.get_item(TableName=self.table, Key=self._key(), ConsistentRead=True).get("Item")
        self.started, self.gap_told = None, False
        if not isinstance(item, dict):
            return {}, None
        try:
            self.started = float(item["started"]["N"])
        except (KeyError, TypeError, ValueError):
            self.started = None  # an item older than the field: the next write starts it now
        self.gap_told = item.get("gap_told", {}).get("BOOL") is True
        entries = item.get("instances", {}).get("M", {})
        found = {k: s for k, v in entries.items() if (s := _from_item(k, v)) is not None}
        return found, int(item.get("version", {}).get("N", "0"))

    def record(self, seen: Iterable[Instance], now: datetime, since: datetime,
               read: tuple[dict[str, Sighting], int | None] | None = None,
               gap_told: bool = False) -> dict[str, Sighting]:
        """Add `seen` (in service now) to the ledger, drop sightings older than `since`; the result.

        `read`: what `read()` answered this tick (saves a call); a lost conditional write reads again.
        `gap_told`: the instances the ledger may miss were told this tick (kept once true).
        """
        current = list(seen)
        for _ in range(CONFLICT_RETRIES):
            known, version = read if read is not None else self.read()
            merged = {k: s for k, s in known.items() if s.seen >= since.timestamp()}
            merged.update({i.instance_id: Sighting(i, now.timestamp()) for i in current})
            started = self.started if self.started is not None else now.timestamp()
            try:
                self._put(merged, version, started, gap_told or self.gap_told)
                return merged
            except LedgerConflict:
                log_event("instance ledger changed since read: merging again", logging.WARNING)
                read = None
        raise LedgerConflict(f"instance ledger of {self.stack} changed {CONFLICT_RETRIES} times while "
                             "writing")

    def _put(self, sightings: Mapping[str, Sighting], version: int | None, started: float,
             gap_told: bool) -> None:
        item: dict[str, Any] = {**self._key(), "version": {"N": str((version or 0) + 1)},
                                "started": {"N": str(int(started))}, "gap_told": {"BOOL": gap_told},
                                "instances": {"M": {k: _to_item(s) for k, s in sorted(sightings.items())}}}
        kwargs: dict[str, Any] = {"TableName": self.table, "Item": item,
                                  "ExpressionAttributeNames": {"#v": "version"}}
        if version is None:
            kwargs["ConditionExpression"] = "attribute_not_exists(#v)"
        else:
            kwargs["ConditionExpression"] = "#v = :v"
            kwargs["ExpressionAttributeValues"] = {":v": {"N": str(version)}}
        try:
            self.dynamodb.put_item(**kwargs)
        except AWS_ERRORS as exc:
            if error_code(exc) == CONDITION_FAILED:
                raise LedgerConflict(str(exc)) from exc
            raise


def gone_hours(sightings: Mapping[str, Sighting], in_service: Iterable[str], since: datetime,
               now: datetime, check_seconds: float) -> list[tuple[Instance, float]]:
    """Each recorded instance no longer in service with its hours since `since`.

    It ran from its launch (or `since`) until at most one check after it was last seen (`now` at
    the latest): the upper bound, so the guard errs towards stopping early, never late.
    """
    live = set(in_service)
    out: list[tuple[Instance, float]] = []
    for instance_id, s in sorted(sightings.items()):
        if instance_id in live:
            continue
        start = max(s.instance.launched, since).timestamp()
        end = min(s.seen + check_seconds, now.timestamp())
        if end > start:
            out.append((s.instance, (end - start) / 3600))
    return out


def unrecorded_since(started: float | None, since: datetime, now: datetime) -> datetime | None:
    """When the ledger began, if instances that stopped between the settled point `since` and then may be
    missing from the figure (None: the settled figure covers everything before the ledger).

    `started` None: the ledger is written for the first time this tick (`now`).
    """
    begun = datetime.fromtimestamp(started, UTC) if started is not None else now
    return begun if begun > since else None


def settles_on(begun: datetime) -> datetime:
    """When the settled point (`accrual.settled_through`) passes `begun`: midnight UTC two days after
    the day it falls in, or the first midnight after it for a start exactly at midnight."""
    midnight = begun.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight + timedelta(days=1 + (begun > midnight))
