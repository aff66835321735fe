"""Stopping several node groups the way every guardrail does: one hook, fresh reads, budget last.

Every guardrail (budget, idle, schedule, lifetime, Capacity Block) and
`gpucluster stop` stop compute through `stop_groups`: the pre-stop hook runs
once on all nodes about to stop, the groups are read again after it, and each
goes to zero through its `NodeGroups` backend. The budget handler checks its
own stops once more after a short settle time (`confirm_budget_stops`), since
a backend without compare-and-set can lose a race. It also picks the backend a
deployment's handlers act through (`stack_node_groups`, from `backends`). It must never delete
anything in AWS and never import Pulumi: it is carried into the Lambda archive
as ``gpucluster.fleet``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .awsapi import AWS_ERRORS, log_event
from .backends import choose_node_groups
from .deployment import STATE_TABLE_ENV
from .nodegroups import (
    ALREADY_STOPPED,
    BUDGET,
    CHANGED,
    GONE,
    RUNNING,
    STARTING,
    STATE_STOPPED,
    NodeGroup,
    NodeGroups,
    StateConflict,
    StopState,
    previous_capacity,
    stop_label,
)
from .pcsgroups import PCS_CLUSTER_ENV
from .runcommand import CommandResult, run_command
from .runtime import RUNTIME, ConfigError, GuardrailError, env_number, env_text
from .slurmhold import DEFAULT_GRACE_SECONDS, hold_partitions

# What a stop can fail with and still let the other groups be stopped.
STOP_ERRORS = (*AWS_ERRORS, StateConflict)

SlurmHold = Callable[[list[str]], CommandResult]
"""Holds the named partitions and requeues their running jobs (on a Slurm stack), returning the result."""


def slurm_hold_from_env(timeout_seconds: float | None = None) -> SlurmHold | None:
    """On a Slurm stack (PCS_CLUSTER_ID), what a handler's stop runs first: `slurmhold.hold_partitions`.

    The grace between the signal and the requeue is PRE_STOP_TIMEOUT_SECONDS (default 30 s),
    and the wait for the login node's command is that plus 30 s, or `timeout_seconds` when given
    (the budget action's 120 s Lambda fits the default: 30 s grace, 60 s wait, then the stop).
    """
    if not env_text(PCS_CLUSTER_ENV):
        return None
    stack = env_text("GPUCLUSTER_STACK") or ""
    grace = env_number("PRE_STOP_TIMEOUT_SECONDS", DEFAULT_GRACE_SECONDS)
    wait = timeout_seconds if timeout_seconds is not None else grace + 30.0
    grace = max(0.0, min(grace, wait - 30.0))

    def hold(partitions: list[str]) -> CommandResult:
        return hold_partitions(RUNTIME.client("ssm"), RUNTIME.client("ec2"), stack, partitions,
                               grace_seconds=grace, timeout_seconds=wait)

    return hold


def stack_node_groups(client: Callable[[str], Any] | None = None, table: str | None = None,
                      actor: str = "gpucluster", *, pcs_cluster_id: str | None = None,
                      stack: str | None = None, strict_members: bool = False,
                      deadline: float | None = None) -> NodeGroups:
    """The backend a handler's deployment's node groups are run by, read from its environment.

    On a Slurm stack (`pcs_cluster_id`, or the handler's PCS_CLUSTER_ID) the node groups are the
    PCS cluster's compute node groups, for the deployment identity `stack` (or GPUCLUSTER_STACK);
    otherwise Auto Scaling groups. The guard-state table is `table`, or the handler's
    GUARD_STATE_TABLE. The backend itself is `backends.choose_node_groups`', as `gpucluster.ops`
    picks it. `strict_members`: on PCS, fail rather than read groups without their instances.
    `deadline` (`runtime.invocation_deadline`): on PCS, how long a stop may wait for a busy group.
    """
    make = client or RUNTIME.client
    table = table or env_text(STATE_TABLE_ENV)
    actor = env_text("AWS_LAMBDA_FUNCTION_NAME") or actor
    cluster = pcs_cluster_id or env_text(PCS_CLUSTER_ENV)
    stack = stack or env_text("GPUCLUSTER_STACK")
    if cluster and not stack:
        raise ConfigError(f"PCS cluster {cluster}: its node groups are stopped and started only through "
                          "the stack's guard-state table (a stack with a budget action, autostop or a "
                          "Capacity Block has one); none found")
    return choose_node_groups("slurm" if cluster else "none", make, stack or "", table=table, actor=actor,
                              cluster_id=cluster, strict_members=strict_members, deadline=deadline)


@dataclass
class StopReport:
    """Outcome per group, errors per group, the pre-stop hook's result, and budget corrections.

    `recorded` holds, per group this stop changed, the previous capacity as it
    stood after the stop (what a later correction restores).
    """

    outcomes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    hook: CommandResult | None = None
    recorded: dict[str, StopState] = field(default_factory=dict)
    corrections: dict[str, str] = field(default_factory=dict)
    untold: list[str] = field(default_factory=list)
    """Groups found already stopped by this reason whose stop was never told (a retried invocation)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Group -> the stopped-by its stop left (changed now or untold): what `told` says was told."""

    @property
    def changed(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome in CHANGED]

    @property
    def to_tell(self) -> list[str]:
        """What a notification must cover: the groups changed now and the stops not yet told."""
        return sorted({*self.changed, *self.untold})

    @property
    def told(self) -> dict[str, str]:
        """What a notification of this report tells: group -> its stop's label (`mark_told`)."""
        return {name: self.labels[name] for name in self.to_tell if name in self.labels}

    def summary(self, reason: str) -> dict[str, Any]:
        """The handler's return value: small, JSON-serialisable."""
        summary: dict[str, Any] = {
            "action": "stopped" if self.changed else "unchanged",
            "stopped_by": reason,
            "groups": self.changed,
            "outcomes": self.outcomes,
        }
        if self.errors:
            summary["errors"] = self.errors
        if self.untold:
            summary["untold"] = self.untold  # stopped by an earlier attempt that could not say so
        if self.hook is not None:
            summary["hook"] = self.hook.summary()
        if self.corrections:
            summary["corrections"] = self.corrections
        return summary


def stop_groups(
    backend: NodeGroups,
    groups: Sequence[NodeGroup],
    reason: str,
    *,
    ssm: Any = None,
    pre_stop_command: str | None = None,
    hook_timeout_seconds: float = 300.0,
    slurm_hold: SlurmHold | None = None,
) -> StopReport:
    """Run the pre-stop hook once on all groups about to stop, then scale each to zero.

    One SSM command with one deadline for all groups keeps the total wait bounded
    by the timeout, whatever the number of groups. A failed or timed-out hook is
    logged and the stop goes on. The hook can take minutes, during which a budget
    stop or a person may act: the groups are read again after it, and each
    write is decided on that fresh state. AWS errors on one group do not spare
    the others. On a Slurm stack (`slurm_hold`, by default `slurm_hold_from_env`) the
    hook is Slurm's: the running groups' partitions are held and their jobs signalled
    and requeued from the login node (`slurmhold`), then the groups stop; a hold that
    fails is reported (`hook`) and the stop goes on.
    """
    report = StopReport()
    instances = [i for g in groups if g.running for i in g.in_service_ids]
    slurm_hold = slurm_hold if slurm_hold is not None else slurm_hold_from_env()
    partitions = sorted(g.label for g in groups if g.running)
    hooked = False
    if slurm_hold is not None and partitions:
        report.hook = slurm_hold(partitions)
        hooked = True
    elif pre_stop_command and ssm is not None and instances:
        report.hook = run_command(
            ssm,
            instances,
            pre_stop_command,
            timeout_seconds=hook_timeout_seconds,
            environment={"GPUCLUSTER_STOP_REASON": reason},
            comment=f"gpucluster pre-stop hook ({reason})",
        )
        hooked = True
    if hooked:
        names = [g.name for g in groups]
        try:
            fresh = {g.name: g for g in backend.read_groups(names)}
        except STOP_ERRORS as exc:
            log_event("cannot read groups after the hook", logging.ERROR, error=str(exc))
            report.errors.update(dict.fromkeys(names, f"not described after the hook: {exc}"))
            return report
        for name in names:
            if name not in fresh:
                log_event("group gone while the hook ran", logging.WARNING, group=name)
                report.outcomes[name] = GONE
        groups = list(fresh.values())
    for group in groups:
        try:
            previous = previous_capacity(group)
            report.outcomes[group.name] = backend.stop(group, reason)
        except STOP_ERRORS as exc:
            log_event("stop failed", logging.ERROR, group=group.name, error=str(exc))
            report.errors[group.name] = str(exc)
            continue
        if report.outcomes[group.name] in CHANGED:
            report.recorded[group.name] = previous
            # The label `NodeGroups.stop` records (a `starting` record takes the reason as it is).
            report.labels[group.name] = reason if group.stop.state == STARTING else stop_label(group, reason)
        elif (report.outcomes[group.name] == ALREADY_STOPPED and group.stop.notified is False
              and group.stopped_by in (reason, BUDGET)):
            report.untold.append(group.name)
            report.labels[group.name] = group.stopped_by or reason
    return report


def untold(groups: Sequence[NodeGroup], stops: Collection[str] = (),
           starts: Collection[str] = ()) -> list[str]:
    """Groups whose last transition was never told: a stop labelled in `stops` still at zero, or a
    start by a guardrail in `starts` (`StopState.started_by`) still running; sorted.

    What a retry (or the next run of the same guardrail) tells when an earlier attempt stopped or
    started the group but could not say so: killed, or its publish refused. A backend without a
    store (tags) knows no told flag (None): nothing is found.
    """
    found = []
    for g in groups:
        if g.stop.notified is not False:
            continue
        stop = g.stop.state == STATE_STOPPED and not g.running and g.stopped_by in stops
        if stop or (g.stop.state == RUNNING and g.stop.started_by in starts):
            found.append(g.name)
    return sorted(found)


def mark_told(backend: NodeGroups, told: Mapping[str, str], sent: bool) -> None:
    """Record, once the notification went out (`sent`), that each transition it covered was told.

    `told`: group -> the label the notification said (the stop's stopped-by, or the guardrail that
    started it). A group read now with another label had a new transition land since the tell:
    that one is its own actor's to tell and stays unmarked. A failure here raises (the invocation
    is retried and tells again: told twice, never never).
    """
    if not sent or not told:
        return
    for group in backend.read_groups(sorted(told)):
        now = group.stop.started_by if group.stop.state == RUNNING else group.stopped_by
        if now == told.get(group.name):
            backend.mark_notified(group)


# Long enough for a schedule start or stop that read a group just before our write to land its
# own write (a describe and two updates, well under a second), short next to the Lambda timeout.
SETTLE_SECONDS = 5.0


def confirm_budget_stops(backend: NodeGroups, report: StopReport) -> dict[str, str]:
    """Read the groups a budget stop changed once more and put back what a concurrent write undid.

    A backend without compare-and-set (Auto Scaling) lets a schedule start or
    another stop that read a group just before the budget wrote it write just
    after. Run after a short settle time, this makes the budget's state the
    last word: a group running again is stopped again (its capacity now
    recorded), a relabelled one gets the budget label back, and previous
    capacity cleared meanwhile is restored from `report.recorded`. Returns the
    corrections made (also kept in `report.corrections`); AWS errors go to
    `report.errors`.
    """
    names = report.changed
    if not names:
        return {}
    try:
        groups = backend.read_groups(names)
    except STOP_ERRORS as exc:
        report.errors.update(dict.fromkeys(names, f"budget stop not confirmed: {exc}"))
        return {}
    for group in groups:
        name = group.name
        try:
            if group.running:
                backend.stop(group, BUDGET)
                fix = f"running again ({group.desired} desired): stopped again"
            elif group.stopped_by != BUDGET:
                recorded = report.recorded.get(name, StopState())
                missing = StopState(
                    None,
                    recorded.previous_desired if group.stop.previous_desired is None else None,
                    recorded.previous_min if group.stop.previous_min is None else None,
                )
                backend.relabel(group, BUDGET, missing)
                fix = f"label {group.stopped_by or 'removed'}: set back to budget"
            else:
                continue
        except STOP_ERRORS as exc:
            report.errors[name] = f"budget stop not confirmed: {exc}"
            continue
        log_event("budget stop restored", logging.WARNING, group=name, correction=fix)
        report.corrections[name] = fix
    return report.corrections


def budget_stop(backend: NodeGroups, groups: Sequence[NodeGroup]) -> StopReport:
    """Stop `groups` for the budget and, after a settle time, confirm it (`confirm_budget_stops`).

    What the budget action and the spend guard both do: a budget stop is the last word even over a
    schedule or a person's start that read a group just before it.
    """
    report = stop_groups(backend, groups, BUDGET)
    if report.changed:
        RUNTIME.sleep(SETTLE_SECONDS)
        confirm_budget_stops(backend, report)
    return report


def raise_if_failed(report: StopReport, stack: str) -> None:
    """Fail the invocation after partial AWS errors so Lambda's async retry runs it again.

    Safe because stopping is idempotent.
    """
    if report.errors:
        raise GuardrailError(f"stack {stack}: could not stop {sorted(report.errors)}")
