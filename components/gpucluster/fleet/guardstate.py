"""The stored backend of the node-group seam: guard state in DynamoDB, capacity in Auto Scaling or PCS.

One item per node group, keyed (stack identity, the group's name: the Auto Scaling
group's, or the PCS compute node group's):
its state (running / starting / stopping / stopped / stop-failed), who stopped
it, the capacity it had (previous min/desired/max, recorded once by the stop
that found it), whether that stop was told (notified) and a version number.
Every transition is a conditional PutItem on the version it read (DynamoDB
developer guide, "Condition expressions": the write fails with
ConditionalCheckFailedException when the item changed), so two actors can no
longer both win: the loser re-reads and decides again (a stop) or gives up
and says so (a start, a scale). Capacity goes through a `Capacity` (the Auto
Scaling API, `asg.AutoScalingCapacity`, or AWS PCS's compute node groups,
`pcs.PcsCapacity`, whose stop zeroes the maximum too); a start or a scale
first writes `starting`, so a stop landing before its
capacity change sees a group to stop, and the start checks its own record
again afterwards and puts capacity back to zero if a stop won. The stop-state
tags on the group are written after the record, for a person reading the
console: they never decide. A group stopped by tags before the table existed
has no item: its tags are read once and the first write records them (a
migration). It never deletes an item nor anything in AWS but its own mirror
tags, never changes MaxSize, and never imports Pulumi: it is carried into
the Lambda archive as ``gpucluster.fleet``.

The state table (docs/guides/guard-state.md, "The state table"). A record
`running` or `starting` next to zero capacity has its capacity read again after
the record (a start may have landed between the reads); every write is conditional on the version read, and
one that finds only the version bumped (a `told` mark: same state and label) is
made again on the new version. Stale: written over TRANSITION_TIMEOUT_SECONDS ago.

  running      any stop -> stopping; scale -> starting (no label).
               Way out: it runs.
  stopping     any stop -> stopping (redone); a start refuses it while fresh, takes it over
               once stale. A lost final write leaves it here. Way out: `gpucluster stop`,
               or `start`/`resume` once stale.
  stopped      a budget stop -> stopped by budget; a start allowed for its label -> starting,
               the label kept. Way out: `gpucluster start` (`resume --only budget`).
  stop-failed  (the stop's capacity call failed) any stop -> stopping; a start as from stopped.
  starting     any stop -> stopping (the start's `running` write then fails: capacity back to
               zero); a start refuses it while fresh, takes it over once stale; scale only an
               unlabelled stale one. A failed capacity call or `running` write puts it back to
               stopped with its label (a scale: running); a kill leaves it here, label kept,
               until stale. Way out: `gpucluster stop`, or `start`/`resume` once stale.

Told (`notified`, docs/guides/guard-state.md "Told once"): each stop's records and a guardrail
start's `running` (`started_by`) are written untold; the actor marks them after its publish, only
while the record shows the label it told. A mark is a version-only bump; a new transition never
inherits it (only `stopping` -> `stopped`/`stop-failed` and `starting` back to `stopped` keep it).
A retry finding an untold record tells it (`stops.untold`); told twice only when a publish's answer
was lost, a kill fell between publish and mark, or two invocations told at once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from .asg import AutoScalingCapacity
from .awsapi import AWS_ERRORS, error_code, log_event
from .nodegroups import (
    ALREADY_AT_ZERO,
    ALREADY_STOPPED,
    BUDGET,
    ESCALATED,
    GONE,
    MANUAL,
    RUNNING,
    STARTING,
    STATE_STOPPED,
    STOP_FAILED,
    STOP_REASONS,
    STOPPED,
    STOPPING,
    Capacity,
    NodeGroup,
    ResumeResult,
    StateConflict,
    StopState,
    resume_decision,
    stop_label,
)
from .runtime import RUNTIME

# A `stopping` or `starting` record older than this was left by an actor that can no longer be
# running: every guardrail Lambda's timeout is at most Lambda's 900 s quota
# (`gpucluster.aws.guardrail_lambda.LAMBDA_MAX_TIMEOUT_SECONDS`, kept equal by a test), and a CLI
# transition is a read and three calls. The next actor takes it over instead of refusing forever.
TRANSITION_TIMEOUT_SECONDS = 900

# A stop that loses a conditional write reads again and decides again; more than a few losses in a
# row means something writes the item in a loop: give up loudly.
CONFLICT_RETRIES = 5
CONDITION_FAILED = "ConditionalCheckFailedException"


def _number(value: str | None) -> dict[str, str] | None:
    return {"N": value} if value is not None and value.isdigit() else None


class StoredNodeGroups:
    """`NodeGroups` keeping the guard state in DynamoDB table `table`; capacity through `capacity`.

    `capacity` defaults to the Auto Scaling groups of client `autoscaling`.
    """

    def __init__(self, autoscaling: Any, dynamodb: Any, table: str, actor: str = "gpucluster", *,
                 capacity: Capacity | None = None) -> None:
        self.autoscaling = autoscaling
        self.capacity: Capacity = capacity if capacity is not None else AutoScalingCapacity(autoscaling)
        self.dynamodb = dynamodb
        self.table = table
        self.actor = actor

    # --- reads -------------------------------------------------------------------------------

    def _item(self, stack: str, name: str) -> dict[str, Any] | None:
        # Strongly consistent: a decision is only as fresh as its read (conditions catch the rest).
        key = {"stack": {"S": stack}, "group": {"S": name}}
        answer = self.dynamodb.get_item(TableName=self.table, Key=key, ConsistentRead=True)
        item = answer.get("Item")
        return item if isinstance(item, dict) else None

    def _items(self, stack: str) -> dict[str, dict[str, Any]]:
        items: dict[str, dict[str, Any]] = {}
        kwargs: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True,
                                  "KeyConditionExpression": "#s = :s",
                                  "ExpressionAttributeNames": {"#s": "stack"},
                                  "ExpressionAttributeValues": {":s": {"S": stack}}}
        while True:
            page = self.dynamodb.query(**kwargs)
            for item in page.get("Items", []):
                items[item["group"]["S"]] = item
            if not page.get("LastEvaluatedKey"):
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _merge(self, group: NodeGroup, item: Mapping[str, Any] | None) -> NodeGroup:
        """The group as its capacity service describes it, with its stop state from the item (else tags)."""
        if item is None:
            # Not recorded yet (stopped before the table existed, or never stopped): the tags, once.
            state = STATE_STOPPED if group.stopped_by else None
            stop = StopState(group.stop.stopped_by, group.stop.previous_desired, group.stop.previous_min,
                             state=state)
        else:
            def text(key: str) -> str | None:
                value = item.get(key)
                return next(iter(value.values())) if isinstance(value, dict) and value else None

            state = text("state") or RUNNING
            stop = StopState(None if state == RUNNING else text("stopped_by"), text("previous_desired"),
                             text("previous_min"), state=state, version=int(text("version") or 0),
                             notified=bool(item.get("notified", {}).get("BOOL", False)),
                             written_at=float(text("at") or 0),
                             started_by=text("started_by") if state == RUNNING else None)
        max_size = group.max_size
        if self.capacity.stop_zeroes_max and stop.state not in (None, RUNNING):
            # A PCS stop zeroed the maximum: while stopped, the maximum it recorded is the ceiling.
            recorded = (stop.previous_desired or "").isdigit() and int(stop.previous_desired or 0)
            max_size = max(max_size, int(recorded or 0))
        return replace(group, max_size=max_size, stop=stop)

    def list_groups(self, stack: str) -> list[NodeGroup]:
        described = self.capacity.describe_stack(stack)
        items = self._items(stack) if described else {}
        return self._after_record(described, items)

    def read_groups(self, names: Iterable[str]) -> list[NodeGroup]:
        described = self.capacity.describe(names)
        items = {g.name: self._item(g.stack, g.name) if g.stack else None for g in described}
        return self._after_record(described, items)

    def _after_record(self, described: list[NodeGroup], items: Mapping[str, Mapping[str, Any] | None]
                      ) -> list[NodeGroup]:
        """Merge, deciding on a capacity read after the record wherever the order matters.

        A record `running` (or `starting`) next to a capacity of zero may be a start that landed
        between the two reads: that capacity predates the record, so it is read again (a stop would
        otherwise answer "already at zero" with no write, and no condition could catch the race).
        Everywhere else the record's version guards the decision: a start writes `starting` first.
        """
        merged = [self._merge(g, items.get(g.name)) for g in described]
        again = [g.name for g in merged if not g.running and g.stop.state in (RUNNING, STARTING)]
        if not again:
            return merged
        fresh = {g.name: g for g in self.capacity.describe(again)}
        return [self._merge(fresh[g.name], items.get(g.name)) if g.name in fresh else g
                for g in merged if g.name in fresh or g.name not in again]

    def _read(self, name: str) -> NodeGroup | None:
        now = self.read_groups([name])
        return now[0] if now else None

    # --- the one write -----------------------------------------------------------------------

    def _put(self, group: NodeGroup, expected: int | None, state: str, *, stopped_by: str | None = None,
             previous: StopState | None = None, notified: bool = False,
             seen: tuple[str, str | None] | None = None, started_by: str | None = None) -> int:
        """Write the group's whole record if its version is still `expected` (None: no record); new version.

        `seen`: the (state, stopped-by) the record had at `expected`. A writer that only bumped the
        version since (a `told` mark) left them as they were: that is no conflict, the write is made
        again on the new version. The mark is kept only where this write finishes the transition
        that was told (`stopping` -> `stopped`/`stop-failed`, `starting` back to `stopped`): a new
        transition (an escalation, a stop, a start's `running`) is untold until its own tell.
        Raises `StateConflict` when another transition landed since the read.
        """
        try:
            return self._put_once(group, expected, state, stopped_by=stopped_by, previous=previous,
                                  notified=notified, started_by=started_by)
        except StateConflict:
            if seen is None or expected is None:
                raise
            item = self._item(group.stack or "", group.name)
            now = self._merge(group, item).stop if item is not None else None
            if now is None or (now.state, now.stopped_by) != seen or now.version is None:
                raise
            log_event("record only re-marked since read: writing again", group=group.name,
                      version=now.version)
            finishes = ((seen[0] == STOPPING and state in (STATE_STOPPED, STOP_FAILED))
                        or (seen[0] == STARTING and state == STATE_STOPPED))
            return self._put_once(group, now.version, state, stopped_by=stopped_by, previous=previous,
                                  notified=notified or (finishes and bool(now.notified)),
                                  started_by=started_by)

    def _put_once(self, group: NodeGroup, expected: int | None, state: str, *, stopped_by: str | None,
                  previous: StopState | None, notified: bool, started_by: str | None = None) -> int:
        if not group.stack:
            raise StateConflict(f"{group.name} carries no stack identity: its state cannot be stored")
        version = (expected or 0) + 1
        item: dict[str, Any] = {"stack": {"S": group.stack}, "group": {"S": group.name},
                                "state": {"S": state}, "version": {"N": str(version)},
                                "notified": {"BOOL": notified}, "by": {"S": self.actor},
                                "max_size": {"N": str(group.max_size)},
                                "at": {"N": str(int(RUNTIME.now().timestamp()))}}
        if stopped_by is not None:
            item["stopped_by"] = {"S": stopped_by}
        if started_by is not None:
            item["started_by"] = {"S": started_by}
        for key, value in (("previous_desired", previous.previous_desired if previous else None),
                           ("previous_min", previous.previous_min if previous else None)):
            number = _number(value)
            if number is not None:
                item[key] = number
        kwargs: dict[str, Any] = {"TableName": self.table, "Item": item,
                                  "ExpressionAttributeNames": {"#v": "version"}}
        if expected is None:
            kwargs["ConditionExpression"] = "attribute_not_exists(#v)"
        else:
            kwargs["ConditionExpression"] = "#v = :v"
            kwargs["ExpressionAttributeValues"] = {":v": {"N": str(expected)}}
        try:
            self.dynamodb.put_item(**kwargs)
        except AWS_ERRORS as exc:
            if error_code(exc) == CONDITION_FAILED:
                raise StateConflict(f"{group.name}: changed since read (version {expected})") from exc
            raise
        log_event("guard state written", group=group.name, state=state, stopped_by=stopped_by,
                  version=version, by=self.actor)
        return version

    def _capacity(self, name: str, min_size: int, desired: int, *, closing: bool = True) -> None:
        self.capacity.resize(name, min_size, desired, closing=closing)

    # --- stop --------------------------------------------------------------------------------

    def stop(self, group: NodeGroup, reason: str) -> str:
        if reason not in STOP_REASONS:
            raise ValueError(f"unknown stop reason {reason!r}; expected one of {STOP_REASONS}")
        current: NodeGroup | None = group
        for _ in range(CONFLICT_RETRIES):
            if current is None:
                return GONE
            try:
                return self._stop_once(current, reason)
            except StateConflict:
                log_event("stop lost a race: reading again", logging.WARNING, group=group.name, reason=reason)
                current = self._read(group.name)
        raise StateConflict(f"{group.name}: the state changed {CONFLICT_RETRIES} times while stopping")

    def _stop_once(self, group: NodeGroup, reason: str) -> str:
        stop = group.stop
        state = stop.state or RUNNING
        if state == RUNNING and not group.running:
            log_event("group already at zero", group=group.name, reason=reason)
            return ALREADY_AT_ZERO
        if state == STATE_STOPPED and not group.running:
            if reason == BUDGET and stop.stopped_by != BUDGET:
                self._put(group, stop.version, STATE_STOPPED, stopped_by=BUDGET, previous=stop,
                          seen=(state, stop.stopped_by))
                self._mirror(group.name, BUDGET, stop)
                log_event("stop escalated to budget", group=group.name, previous_stopped_by=stop.stopped_by)
                return ESCALATED
            if stop.version is None:  # stopped by tags before the table: record it now, once
                self._put(group, None, STATE_STOPPED, stopped_by=stop.stopped_by, previous=stop,
                          notified=True)
            log_event("group already stopped", group=group.name, stopped_by=stop.stopped_by, reason=reason)
            return ALREADY_STOPPED
        # Running, starting, half-stopped, stop-failed, or stopped but running again: stop it now.
        # The capacity is recorded once: what an earlier stop or a start's target recorded stands.
        label = stop_label(group, reason) if state != STARTING else reason
        if stop.previous_desired is not None and state != RUNNING:
            previous = StopState(None, stop.previous_desired, stop.previous_min)
        else:
            previous = StopState(None, str(group.desired), str(group.min_size))
        version = self._put(group, stop.version, STOPPING, stopped_by=label, previous=previous,
                            seen=(state, stop.stopped_by))
        try:
            self._capacity(group.name, 0, 0)
        except AWS_ERRORS as exc:
            log_event("stop failed", logging.ERROR, group=group.name, stopped_by=label, error=str(exc))
            try:
                self._put(group, version, STOP_FAILED, stopped_by=label, previous=previous,
                          seen=(STOPPING, label))
            except (StateConflict, *AWS_ERRORS) as again:
                log_event("stop failure not recorded", logging.ERROR, group=group.name, error=str(again))
            raise
        try:
            self._put(group, version, STATE_STOPPED, stopped_by=label, previous=previous,
                      seen=(STOPPING, label))
        except StateConflict:
            # Another stop moved the record on after ours (an escalation, a retry): its record stands.
            log_event("stop recorded by another writer", logging.WARNING, group=group.name)
        self._mirror(group.name, label, previous)
        log_event("group scaled to zero", group=group.name, stopped_by=label,
                  previous_desired=previous.previous_desired, previous_min=previous.previous_min)
        return STOPPED

    def _mirror(self, name: str, stopped_by: str, previous: StopState) -> None:
        """The stop state as tags on the group, for a person reading the console (never read to decide)."""
        self.capacity.mirror(name, stopped_by, previous)

    def relabel(self, group: NodeGroup, stopped_by: str, previous: StopState) -> None:
        kept = StopState(None, previous.previous_desired or group.stop.previous_desired,
                         previous.previous_min or group.stop.previous_min)
        state = group.stop.state if group.stop.state not in (None, RUNNING) else STATE_STOPPED
        self._put(group, group.stop.version, state, stopped_by=stopped_by, previous=kept,
                  seen=(group.stop.state or RUNNING, group.stopped_by))
        self._mirror(group.name, stopped_by, kept)

    def mark_notified(self, group: NodeGroup) -> None:
        """Mark the transition `group` was read in as told: a stop, or the start a `running` record names.

        Conditional on the version read: a transition landed since is not marked (it is told by its own
        actor). A version-only bump since (another tell of the same transition) is no conflict.
        """
        stop = group.stop
        if stop.notified or stop.state is None or (stop.state == RUNNING and not stop.started_by):
            return
        previous = StopState(None, stop.previous_desired, stop.previous_min)
        try:
            self._put(group, stop.version, stop.state, stopped_by=stop.stopped_by, previous=previous,
                      notified=True, started_by=stop.started_by, seen=(stop.state, stop.stopped_by))
        except StateConflict:
            # Another transition landed since the tell: it is its own actor's to tell, not marked here.
            log_event("told transition superseded: not marked", logging.WARNING, group=group.name)

    # --- start -------------------------------------------------------------------------------

    def stale(self, stop: StopState) -> bool:
        """A `stopping` or `starting` record its writer can no longer finish (TRANSITION_TIMEOUT_SECONDS)."""
        if stop.state not in (STOPPING, STARTING):
            return False
        return RUNTIME.now().timestamp() - (stop.written_at or 0) > TRANSITION_TIMEOUT_SECONDS

    def restore(self, group: NodeGroup, only_stopped_by: Collection[str] | None = None, *,
                started_by: str | None = None) -> ResumeResult:
        decision = resume_decision(group, only_stopped_by)
        name = decision.group
        if decision.action != "resume":
            return decision
        stop = group.stop
        if stop.state in (STOPPING, STARTING) and not self.stale(stop):
            doing = "a stop" if stop.state == STOPPING else "a start"
            return ResumeResult(name, "skipped", decision.stopped_by, reason=f"{doing} is in progress; retry")
        # A stale `stopping` (its stop's capacity change landed or never will) or `starting` (its start
        # died half-way) is taken over: started from here, on its version, like a stopped record.
        target = StopState(None, str(decision.desired_capacity), str(decision.min_size))
        # The stop's label stays until `running` is written: a start that fails leaves a group that
        # the schedule's retry, `start` and `resume` still see as stopped by its guardrail.
        label = decision.stopped_by
        try:
            # Only from the state it read: a stop landing since makes this write fail.
            version = self._put(group, stop.version, STARTING, stopped_by=label, previous=target,
                                notified=bool(stop.notified), seen=(stop.state or RUNNING, label))
        except StateConflict:
            now = self._read(name)
            now_label = now.stopped_by if now else None
            now_text = f"stopped by {now_label}" if now_label else "running"
            return ResumeResult(name, "skipped", now_label, reason=f"changed since read: now {now_text}")
        kept = StopState(None, stop.previous_desired, stop.previous_min)
        try:
            self._capacity(name, decision.min_size or 0, decision.desired_capacity or 0, closing=False)
        except AWS_ERRORS:
            self._unstart(group, version, label, kept, undo_capacity=False)
            raise
        try:
            # A guardrail's start is told by its notification (then marked); a person's by the command.
            self._put(group, version, RUNNING, seen=(STARTING, label), started_by=started_by or MANUAL,
                      notified=started_by is None)
        except StateConflict:
            # A stop read our `starting` and won: its capacity (zero) must be the last word.
            self._capacity(name, 0, 0)
            now = self._read(name)
            now_label = now.stopped_by if now else None
            log_event("resume undone: stopped again meanwhile", logging.WARNING, group=name,
                      stopped_by=now_label)
            return ResumeResult(name, "skipped", now_label,
                                reason=f"stopped by {now_label} while resuming; left stopped")
        except AWS_ERRORS:
            if not self._landed(group, version + 1, RUNNING):
                self._unstart(group, version, label, kept, undo_capacity=True)
                raise
            log_event("running write landed, its answer lost", logging.WARNING, group=name)
        self._unmirror(name)
        log_event("group resumed", group=name, stopped_by=decision.stopped_by, min=decision.min_size,
                  desired=decision.desired_capacity)
        return ResumeResult(name, "resumed", decision.stopped_by, decision.min_size,
                            decision.desired_capacity)

    def _landed(self, group: NodeGroup, version: int, state: str) -> bool:
        """Whether our own write of `state` at `version` landed although its answer was lost."""
        try:
            item = self._item(group.stack or "", group.name)
        except AWS_ERRORS:
            return False
        stop = self._merge(group, item).stop if item is not None else None
        return (stop is not None and stop.version == version and stop.state == state
                and (item or {}).get("by", {}).get("S") == self.actor)

    def _unstart(self, group: NodeGroup, version: int, label: str | None, kept: StopState, *,
                 undo_capacity: bool) -> None:
        """Put a start that failed half-way back to `stopped` by `label`: resumable by the next start.

        Best effort (the call that failed may fail again): what it cannot undo stays `starting` with
        the label, which the next actor takes over once stale.
        """
        try:
            if undo_capacity:
                self._capacity(group.name, 0, 0)
            self._put(group, version, STATE_STOPPED, stopped_by=label, previous=kept,
                      notified=bool(group.stop.notified), seen=(STARTING, label))
            log_event("start failed: left stopped", logging.ERROR, group=group.name, stopped_by=label)
        except (StateConflict, *AWS_ERRORS) as again:
            log_event("failed start not undone", logging.ERROR, group=group.name, error=str(again))

    def _unmirror(self, name: str) -> None:
        self.capacity.unmirror(name)

    def set_capacity(self, name: str, min_size: int, desired: int) -> None:
        """Scale a running group; raises `StateConflict` for a stopped one or when a stop wins meanwhile."""
        if desired == 0:
            self._capacity(name, min_size, 0, closing=False)  # down to zero never undoes a stop
            return
        group = self._read(name)
        if group is None:
            raise StateConflict(f"{name}: the group no longer exists")
        # A stale unlabelled `starting` is a scale that died half-way: taken over as running.
        abandoned = group.stop.state == STARTING and not group.stopped_by and self.stale(group.stop)
        if group.stopped_by or (group.stop.state not in (None, RUNNING) and not abandoned):
            state = group.stop.state or STATE_STOPPED
            raise StateConflict(f"{name}: {state} by {group.stopped_by}; left as it is")
        target = StopState(None, str(desired), str(min_size))
        seen = (group.stop.state or RUNNING, None)
        version = self._put(group, group.stop.version, STARTING, previous=target, seen=seen)
        try:
            self._capacity(name, min_size, desired)
        except AWS_ERRORS:
            try:  # the group runs as it did: its record says so again
                self._put(group, version, RUNNING, seen=(STARTING, None))
            except (StateConflict, *AWS_ERRORS) as again:
                log_event("failed scale not undone", logging.ERROR, group=name, error=str(again))
            raise
        try:
            self._put(group, version, RUNNING, seen=(STARTING, None))
        except StateConflict:
            self._capacity(name, 0, 0)
            raise StateConflict(f"{name}: stopped while scaling; left stopped") from None
