"""The guard-state machine under random interleavings and faults: seeded scenarios, both backends.

Each scenario runs a few actors (the budget stop, an idle stop, the schedule's stop and start, the
user's stop, start and resume) one after another; at every AWS call one of them makes (DynamoDB's
GetItem/Query/PutItem, the capacity service's describe/resize/mirror) the harness may first run
another actor (an interleaving), or inject a fault: throttling past retries, AccessDenied, a 5xx,
a 5xx after the call landed (its answer lost), or a kill after the call landed (the Lambda
runtime ending the invocation). Time may jump past `TRANSITION_TIMEOUT_SECONDS` between actors.
After each run, with the faults gone, the invariants of the state table
(docs/guides/guard-state.md) are checked:

- a budget stop that completed holds (capacity zero, labelled budget) unless `resume` ran since;
- no record is lost and no state is one a user cannot leave: `gpucluster resume` (every label),
  run once the clock is past the transition timeout, brings every group back to the capacity it
  started with, its record `running`;
- each stop and start told once: every telling actor (budget action, spend guard, idle, schedule
  stop and start, lifetime) publishes through `Chaos` and marks what it told; after Lambda's retry
  of each failed telling invocation (faults gone) no record a guardrail wrote is left untold, and
  none was told again once marked unless a fault hit that tell (a lost answer, a kill before the
  mark) or another invocation ran inside the telling one (docs/guides/guard-state.md, "Told once").

Auto Scaling and DynamoDB are moto's (conditional writes as in AWS); PCS is `FakePcs`, answered
through a real boto3 client as in `test_pcs_capacity`. SCENARIOS per backend keeps the suite
bounded; `GUARD_PROPERTY_SCENARIOS` raises it for a long run.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError
from test_guardstate import create_table
from test_pcs_capacity import CLUSTER, FakePcs, Killed
from test_pcs_capacity import GROUPS as PCS_GROUPS

from conftest import GROUPS, STACK, shared_client
from gpucluster.aws import guardrail_lambda
from gpucluster.fleet import guardstate, runtime, stops
from gpucluster.fleet.asg import AutoScalingCapacity
from gpucluster.fleet.nodegroups import BUDGET, IDLE, LIFETIME, MANUAL, SCHEDULE, Capacity, NodeGroup
from gpucluster.fleet.pcsgroups import PcsCapacity
from gpucluster.fleet.runtime import GuardrailError
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STOPPED_BY_TAG

# 34 a backend keeps the suite's run where 40 was before the tells were added (each scenario makes more
# calls now); `GUARD_PROPERTY_SCENARIOS=250` is the long mode (both backends, about 10 min here).
SCENARIOS = int(os.environ.get("GUARD_PROPERTY_SCENARIOS", "34"))
P_FAULT, P_INTERLEAVE = 0.12, 0.12
FAULTS = ("throttled", "denied", "5xx", "landed-5xx", "killed")
NOT_BUDGET = (IDLE, SCHEDULE, LIFETIME, MANUAL)


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "Call")


@dataclass
class Chaos:
    """At each call: maybe let another actor run first, then maybe fail it (before or after it lands)."""

    rng: random.Random
    actors: list[Callable[[], None]] = field(default_factory=list)
    on: bool = True
    depth: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    interleaved: int = 0
    faulted: int = 0
    """Interleavings and faults so far: a tell that saw one may tell twice (`World.excused`)."""

    def call(self, name: str, do: Callable[[], Any]) -> Any:
        if not self.on:
            return do()
        if self.depth == 0 and self.actors and self.rng.random() < P_INTERLEAVE:
            self.interleaved += 1
            self.depth += 1
            try:
                self.rng.choice(self.actors)()
            finally:
                self.depth -= 1
        if self.rng.random() >= P_FAULT:
            return do()
        fault = self.rng.choice(FAULTS)
        self.faulted += 1
        self.faults[fault] = self.faults.get(fault, 0) + 1
        if fault == "throttled":
            raise client_error("ThrottlingException", 400)
        if fault == "denied":
            raise client_error("AccessDeniedException", 403)
        if fault == "5xx":
            raise client_error("InternalServerError", 500)
        do()
        if fault == "killed":
            raise Killed(name)
        raise client_error("ServiceUnavailable", 503)


class ChaosDynamoDB:
    """The DynamoDB client, each call through `Chaos`."""

    def __init__(self, real: Any, chaos: Chaos) -> None:
        self.real, self.chaos = real, chaos

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        return lambda **kwargs: self.chaos.call(f"dynamodb.{name}", lambda: attr(**kwargs))


class ChaosCapacity:
    """A `Capacity`, each call through `Chaos`."""

    def __init__(self, real: Capacity, chaos: Chaos) -> None:
        self.real, self.chaos = real, chaos
        self.stop_zeroes_max = real.stop_zeroes_max

    def describe_stack(self, stack: str) -> list[NodeGroup]:
        return self.chaos.call("describe_stack", lambda: self.real.describe_stack(stack))  # type: ignore[no-any-return]

    def describe(self, names: Any) -> list[NodeGroup]:
        names = list(names)
        return self.chaos.call("describe", lambda: self.real.describe(names))  # type: ignore[no-any-return]

    def resize(self, name: str, min_size: int, desired: int, *, closing: bool = True) -> None:
        self.chaos.call("resize", lambda: self.real.resize(name, min_size, desired, closing=closing))

    def mirror(self, name: str, stopped_by: str, previous: Any) -> None:
        self.chaos.call("mirror", lambda: self.real.mirror(name, stopped_by, previous))

    def unmirror(self, name: str) -> None:
        self.chaos.call("unmirror", lambda: self.real.unmirror(name))


@dataclass
class World:
    """One scenario's account: a fresh table, groups at their starting capacity, a settable clock."""

    capacity: Capacity
    original: dict[str, tuple[int, int]]
    now: datetime = datetime(2026, 11, 2, 8, tzinfo=UTC)
    budget_held: bool = False
    log: list[str] = field(default_factory=list)
    told: list[tuple[str, str]] = field(default_factory=list)
    """(group, label) of every publish that went out."""
    twice: list[str] = field(default_factory=list)
    """Tells of a transition already marked told (checked at publish time, on the clean table)."""
    excused: int = 0
    """Faults inside a tell (publish to mark) and other invocations running inside a telling one: a
    transition told twice is then allowed (at-least-once: docs/guides/guard-state.md)."""
    chaos: Chaos | None = None
    failed: set[str] = field(default_factory=set)
    """Telling actors with an invocation that failed or was killed: Lambda retries each (another
    invocation of the same rule succeeding does not cancel that retry)."""


TELLING = ("budget", "spend", "idle", "schedule-stop", "lifetime", "schedule-start")
TOLD_STOPS = (BUDGET, IDLE, SCHEDULE, LIFETIME)


def actors(b: guardstate.StoredNodeGroups, world: World, chaos: Chaos,
           clean: guardstate.StoredNodeGroups) -> dict[str, Callable[[], None]]:
    """Each actor as its handler runs it: stop or start, then tell (SNS through `Chaos`) and mark."""

    def publish(told: dict[str, str]) -> None:
        records = {g.name: g for g in clean.read_groups(sorted(told))}
        for name, label in told.items():
            g = records.get(name)
            now = g and (g.stop.started_by if g.stop.state == "running" else g.stopped_by)
            if g is not None and g.stop.notified and now == label:
                world.twice.append(f"{name} ({label}) told again")
            world.told.append((name, label))

    def tell(told: dict[str, str]) -> None:
        if not told:
            return
        before = chaos.faulted
        try:
            chaos.call("sns.publish", lambda: publish(told))
            stops.mark_told(b, told, True)
        finally:
            world.excused += chaos.faulted - before  # a lost answer, a kill before the mark

    def stopping(reason: str, pick: Callable[[list[NodeGroup]], list[NodeGroup]] = list,
                 budget: bool = False) -> Callable[[], None]:
        def run() -> None:
            groups = pick(b.list_groups(STACK))
            report = stops.budget_stop(b, groups) if budget else stops.stop_groups(b, groups, reason)
            if budget and not report.errors:
                world.budget_held = True  # before the tell: a `resume` landing during it undoes it
            if reason != MANUAL:  # `gpucluster stop` is told by its own output, not the topic
                tell(report.told)
            stops.raise_if_failed(report, STACK)
        return run

    def spend() -> None:
        groups = b.list_groups(STACK)
        if any(g.running for g in groups):
            stopping(BUDGET, budget=True)()
            return
        tell(dict.fromkeys(stops.untold(groups, stops=(BUDGET,)), BUDGET))  # at zero: told late

    def lifetime(groups: list[NodeGroup]) -> list[NodeGroup]:
        late = stops.untold(groups, stops=(LIFETIME,))
        return [g for g in groups if g.running or g.name in late]

    def restore(only: tuple[str, ...] | None, started_by: str | None = None) -> Callable[[], None]:
        def run() -> None:
            try:
                resumed = [r.group for g in b.list_groups(STACK)
                           for r in [b.restore(g, only, started_by=started_by)] if r.action == "resumed"]
                if started_by is not None:
                    late = stops.untold(b.list_groups(STACK), starts=(started_by,))
                    tell(dict.fromkeys({*resumed, *late}, started_by))
            finally:
                if only is None:
                    world.budget_held = False  # `resume` may undo a budget stop: a person's choice
        return run

    return {"budget": stopping(BUDGET, budget=True), "spend": spend, "idle": stopping(IDLE),
            "schedule-stop": stopping(SCHEDULE), "lifetime": stopping(LIFETIME, lifetime),
            "schedule-start": restore((SCHEDULE,), SCHEDULE), "user-stop": stopping(MANUAL),
            "user-start": restore(NOT_BUDGET), "user-resume": restore(None)}


def run_scenario(seed: int, world: World, table: str) -> list[str]:
    """Run scenario `seed`; the invariants it broke (empty: none)."""
    rng = random.Random(seed)
    chaos = Chaos(rng)
    world.chaos = chaos
    b = guardstate.StoredNodeGroups(None, ChaosDynamoDB(shared_client("dynamodb"), chaos), table,
                                    actor=f"s{seed}", capacity=ChaosCapacity(world.capacity, chaos))
    clean = guardstate.StoredNodeGroups(None, shared_client("dynamodb"), table, actor="check",
                                        capacity=world.capacity)
    named = actors(b, world, chaos, clean)
    chaos.actors = [
        (lambda n=n, a=a: attempt(world, f"  {n}", a)) for n, a in named.items()  # type: ignore[misc]
    ]
    for _ in range(rng.randint(2, 5)):
        if rng.random() < 0.25:
            world.now += timedelta(seconds=guardstate.TRANSITION_TIMEOUT_SECONDS + 60)
        name = rng.choice(list(named))
        attempt(world, name, named[name])
        world.now += timedelta(seconds=1)
    chaos.on = False
    # Lambda's retry of every telling invocation that failed, with the faults gone: it tells what
    # the earlier attempt could not.
    for name in sorted(world.failed):
        attempt(world, f"retry {name}", named[name])
    broken = []
    if world.budget_held:
        for g in clean.list_groups(STACK):
            if g.desired != 0 or g.stopped_by != BUDGET:
                broken.append(f"budget stop lost on {g.name}: desired {g.desired}, {g.stop.state} "
                              f"by {g.stopped_by}")
    # Each stop and start told once: none left untold (the latest transition of each group a
    # guardrail made), none told twice unless a fault or another invocation hit a tell.
    for g in clean.list_groups(STACK):
        if stops.untold([g], stops=TOLD_STOPS, starts=(SCHEDULE,)):
            label = g.stop.started_by if g.stop.state == "running" else g.stopped_by
            broken.append(f"{g.name}: {g.stop.state} by {label} never told")
    if world.twice and not world.excused:
        broken += [f"told twice without a fault or a concurrent tell: {t}" for t in world.twice]
    # The way out, with the faults gone and any half-done transition stale: `resume`.
    world.now += timedelta(seconds=guardstate.TRANSITION_TIMEOUT_SECONDS + 60)
    for g in clean.list_groups(STACK):
        result = clean.restore(g)
        if result.action != "resumed" and g.desired == 0:
            broken.append(f"{g.name}: resume skipped ({result.reason}), {g.stop.state} by {g.stopped_by}")
    for g in clean.list_groups(STACK):
        if (g.min_size, g.desired) != world.original[g.name] or g.stop.state not in (None, "running"):
            broken.append(f"{g.name}: after resume {g.min_size}/{g.desired}, {g.stop.state}, "
                          f"expected {world.original[g.name]}")
    return [f"seed {seed}: {b}; ran {world.log}" for b in broken]


def attempt(world: World, name: str, actor: Callable[[], None]) -> None:
    """One invocation: an AWS error or a conflict fails it, a kill ends it; either way the run goes on."""
    key = name.strip().removeprefix("retry ")
    before = world.chaos.interleaved if world.chaos else 0
    try:
        actor()
        world.log.append(name)
        if name.startswith("retry "):
            world.failed.discard(key)
    except (*stops.STOP_ERRORS, GuardrailError, Killed) as exc:
        world.log.append(f"{name}!{type(exc).__name__}")
        if key in TELLING:
            world.failed.add(key)
    finally:
        if key in TELLING and world.chaos is not None:
            world.excused += world.chaos.interleaved - before  # two invocations at once


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[World]]:
    """RUNTIME.now reads the current world's clock; sleeps are instant."""
    current: list[World] = []
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: current[0].now)
    monkeypatch.setattr(runtime.RUNTIME, "sleep", lambda seconds: None)
    yield current


def test_transition_timeout_covers_every_guardrail_lambda() -> None:
    # The longest a guardrail Lambda may run is Lambda's quota, which every guardrail timeout is
    # checked against: a record older than that was left by an invocation that is over.
    assert guardstate.TRANSITION_TIMEOUT_SECONDS == guardrail_lambda.LAMBDA_MAX_TIMEOUT_SECONDS


def test_random_interleavings_with_faults_on_auto_scaling(cluster: Any, clock: list[World]) -> None:
    autoscaling = shared_client("autoscaling")
    dev = {n: (lo, want) for n, (stack, lo, want, _) in GROUPS.items() if stack == STACK}
    broken: list[str] = []
    for seed in range(SCENARIOS):
        for name, (lo, want) in dev.items():
            autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=lo, DesiredCapacity=want)
            autoscaling.delete_tags(Tags=[{"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": k}
                                          for k in (STOPPED_BY_TAG, PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG)])
        world = World(AutoScalingCapacity(autoscaling), dict(dev))
        clock[:] = [world]
        broken += run_scenario(seed, world, create_table(shared_client("dynamodb")))
    assert cluster.capacity("prod-train") == (1, 1)  # another stack's group: never touched
    assert not broken, f"{len(broken)} broken of {SCENARIOS} scenarios:\n" + "\n".join(broken[:10])


def test_random_interleavings_with_faults_on_pcs(moto_account: str, clock: list[World]) -> None:
    fake = FakePcs()
    capacity = PcsCapacity(fake.client, CLUSTER, STACK)
    # On PCS the capacity a group may run is its maximum (desired reads as it).
    original = {n: (lo, hi) for n, (_, lo, hi) in PCS_GROUPS.items() if n != "login"}
    broken: list[str] = []
    for seed in range(SCENARIOS):
        for name, (gid, lo, hi) in PCS_GROUPS.items():
            fake.groups[name] = {"id": gid, "min": lo, "max": hi, "status": "ACTIVE"}
        world = World(capacity, dict(original))
        clock[:] = [world]
        broken += run_scenario(10_000 + seed, world, create_table(shared_client("dynamodb")))
    assert fake.scaling("login") == (1, 1)
    assert not broken, f"{len(broken)} broken of {SCENARIOS} scenarios:\n" + "\n".join(broken[:10])
