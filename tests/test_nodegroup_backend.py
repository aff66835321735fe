"""A third kind of node group is one `Capacity` plus one line in `fleet.backends.BACKENDS`.

The test registers node groups held in memory (what an EKS node group would be next) for a scheduler kind
gpucluster does not ship, gives the dev stack that kind, and drives the real `gpucluster stop` and `start`
through it: the choice is made once (`ops.nodegroups.node_groups` -> `fleet.backends.choose_node_groups`),
the stop state lives in the guard-state table (moto's DynamoDB), and no command knows the kind.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from gpucluster.cli import app, common
from gpucluster.fleet.backends import BACKENDS, Backend, Placement
from gpucluster.fleet.deployment import state_table_name
from gpucluster.fleet.nodegroups import MANUAL, NodeGroup, StopState
from gpucluster.plan import load_stack

runner = CliRunner()
SPEC = load_stack("dev")[2]
KIND = "memory"


class MemoryCapacity:
    """`Capacity` of node groups held in a dict: name -> (node group, min, desired, max)."""

    stop_zeroes_max = False

    def __init__(self, stack: str, groups: dict[str, tuple[str, int, int, int]]) -> None:
        self.stack = stack
        self.groups = dict(groups)
        self.mirrored: dict[str, str] = {}
        self.resized: list[tuple[str, int, int]] = []

    def _value(self, name: str) -> NodeGroup:
        label, min_size, desired, max_size = self.groups[name]
        return NodeGroup(name, label, self.stack, min_size, desired, max_size, StopState())

    def describe_stack(self, stack: str) -> list[NodeGroup]:
        return [self._value(n) for n in sorted(self.groups)] if stack == self.stack else []

    def describe(self, names: Iterable[str]) -> list[NodeGroup]:
        return [self._value(n) for n in sorted(set(names)) if n in self.groups]

    def resize(self, name: str, min_size: int, desired: int, *, closing: bool = True) -> None:
        label, _, _, max_size = self.groups[name]
        self.groups[name] = (label, min_size, desired, max_size)
        self.resized.append((name, min_size, desired))

    def mirror(self, name: str, stopped_by: str, previous: StopState) -> None:
        self.mirrored[name] = stopped_by

    def unmirror(self, name: str) -> None:
        self.mirrored.pop(name, None)


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MemoryCapacity, list[Placement]]]:
    """The memory backend registered for KIND, the dev stack of that kind, its guard-state table in moto."""
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", SPEC.region)
    capacity = MemoryCapacity(SPEC.identity, {"mem-dev-a10": ("dev-a10", 1, 2, 3),
                                              "mem-extra": ("extra", 0, 0, 2)})
    placed: list[Placement] = []

    def build(where: Placement) -> MemoryCapacity:
        placed.append(where)
        return capacity

    monkeypatch.setitem(BACKENDS, KIND, Backend(capacity=build))  # the one registry line
    real_load = common.load_stack

    def load(stack: str) -> Any:
        name, config, spec = real_load(stack)
        scheduler = spec.scheduler.model_copy(update={"type": KIND})
        return name, config, spec.model_copy(update={"scheduler": scheduler})

    monkeypatch.setattr(common, "load_stack", load)
    with mock_aws():
        boto3.client("dynamodb", region_name=SPEC.region).create_table(
            TableName=state_table_name(SPEC.identity), BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "stack", "KeyType": "HASH"},
                       {"AttributeName": "group", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "stack", "AttributeType": "S"},
                                  {"AttributeName": "group", "AttributeType": "S"}])
        yield capacity, placed


def _stored(name: str) -> dict[str, Any]:
    item = boto3.client("dynamodb", region_name=SPEC.region).get_item(
        TableName=state_table_name(SPEC.identity), Key={"stack": {"S": SPEC.identity}, "group": {"S": name}},
        ConsistentRead=True)["Item"]
    return {key: next(iter(value.values())) for key, value in item.items()}


def test_stop_and_start_run_through_a_registered_third_backend(
        memory: tuple[MemoryCapacity, list[Placement]]) -> None:
    capacity, placed = memory

    stopped = runner.invoke(app, ["stop", "dev", "--yes"])

    assert stopped.exit_code == 0, stopped.output
    assert "stop 1 group(s), 2 node(s):" in stopped.output
    assert "mem-dev-a10: stopped" in stopped.output
    assert capacity.groups["mem-dev-a10"] == ("dev-a10", 0, 0, 3)
    assert capacity.mirrored == {"mem-dev-a10": MANUAL}
    record = _stored("mem-dev-a10")
    assert (record["stopped_by"], record["previous_desired"], record["previous_min"]) == (MANUAL, "2", "1")
    assert [p.stack for p in placed] == [SPEC.identity]  # chosen once per command, for the stack's identity

    started = runner.invoke(app, ["start", "dev", "--yes", "--json"])

    assert started.exit_code == 0, started.output
    document = json.loads(started.stdout)
    assert [(g["group"], g["action"], g["stopped_by"]) for g in document["groups"]] == [
        ("mem-dev-a10", "resume", MANUAL), ("mem-extra", "skipped", None)]
    assert [(r["group"], r["action"], r["desired_capacity"]) for r in document["started"]] == [
        ("mem-dev-a10", "resumed", 2)]
    assert capacity.groups["mem-dev-a10"] == ("dev-a10", 1, 2, 3)
    assert capacity.mirrored == {}
    assert capacity.groups["mem-extra"] == ("extra", 0, 0, 2)  # at 0 by its own settings: left alone
    assert len(placed) == 2


def test_a_kind_nothing_is_registered_for_is_one_line_exit_2(
        memory: tuple[MemoryCapacity, list[Placement]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(BACKENDS, KIND)
    result = runner.invoke(app, ["stop", "dev", "--dry-run"])
    assert result.exit_code == 2
    assert result.output == (f"stop: no node-group backend for scheduler type {KIND!r} "
                             f"(known: {', '.join(sorted(BACKENDS))})\n")
