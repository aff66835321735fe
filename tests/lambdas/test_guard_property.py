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
  started with, its record `running`.

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
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STOPPED_BY_TAG

SCENARIOS = int(os.environ.get("GUARD_PROPERTY_SCENARIOS", "40"))
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

    def call(self, name: str, do: Callable[[], Any]) -> Any:
        if not self.on:
            return do()
        if self.depth == 0 and self.actors and self.rng.random() < P_INTERLEAVE:
            self.depth += 1
            try:
                self.rng.choice(self.actors)()
            finally:
                self.depth -= 1
        if self.rng.random() >= P_FAULT:
            return do()
        fault = self.rng.choice(FAULTS)
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

    def resize(self, name: str, min_size: int, desired: int) -> None:
        self.chaos.call("resize", lambda: self.real.resize(name, min_size, desired))

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


def actors(b: guardstate.StoredNodeGroups, world: World) -> dict[str, Callable[[], None]]:
    def budget() -> None:
        report = stops.budget_stop(b, b.list_groups(STACK))
        if not report.errors:
            world.budget_held = True

    def idle() -> None:
        for g in b.list_groups(STACK):
            if g.running:
                b.stop(g, IDLE)

    def stop(reason: str) -> Callable[[], None]:
        def run() -> None:
            stops.stop_groups(b, b.list_groups(STACK), reason)
        return run

    def restore(only: tuple[str, ...] | None) -> Callable[[], None]:
        def run() -> None:
            try:
                for g in b.list_groups(STACK):
                    b.restore(g, only)
            finally:
                if only is None:
                    world.budget_held = False  # `resume` may undo a budget stop: a person's choice
        return run

    return {"budget": budget, "idle": idle, "schedule-stop": stop(SCHEDULE), "lifetime": stop(LIFETIME),
            "schedule-start": restore((SCHEDULE,)), "user-stop": stop(MANUAL),
            "user-start": restore(NOT_BUDGET), "user-resume": restore(None)}


def run_scenario(seed: int, world: World, table: str) -> list[str]:
    """Run scenario `seed`; the invariants it broke (empty: none)."""
    rng = random.Random(seed)
    chaos = Chaos(rng)
    b = guardstate.StoredNodeGroups(None, ChaosDynamoDB(shared_client("dynamodb"), chaos), table,
                                    actor=f"s{seed}", capacity=ChaosCapacity(world.capacity, chaos))
    named = actors(b, world)
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
    clean = guardstate.StoredNodeGroups(None, shared_client("dynamodb"), table, actor="check",
                                        capacity=world.capacity)
    broken = []
    if world.budget_held:
        for g in clean.list_groups(STACK):
            if g.desired != 0 or g.stopped_by != BUDGET:
                broken.append(f"budget stop lost on {g.name}: desired {g.desired}, {g.stop.state} "
                              f"by {g.stopped_by}")
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
    try:
        actor()
        world.log.append(name)
    except (*stops.STOP_ERRORS, Killed) as exc:
        world.log.append(f"{name}!{type(exc).__name__}")


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
