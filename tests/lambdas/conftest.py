"""Fixtures for the guardrail handlers: a moto account with two stacks, and recorded clients.

moto 5.2 records `ssm.send_command(InstanceIds=...)` as sent to every instance,
so tests assert on the calls the handlers make (through `Recorder`), never on
moto's command list. The wait loop's sleep and clock are faked: no test sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpucluster.fleet import awsapi, runtime
from moto_groups import create_stack_groups

STACK = "dev"
OTHER_STACK = "prod"
# name -> (stack, min, desired, max)
GROUPS = {
    "dev-train": (STACK, 1, 2, 4),
    "dev-infer": (STACK, 0, 1, 2),
    "prod-train": (OTHER_STACK, 1, 1, 2),
}
HOOK_ENV = (
    "PRE_STOP_COMMAND",
    "PRE_STOP_TIMEOUT_SECONDS",
    "INTERRUPTION_COMMAND",
    "INTERRUPTION_TIMEOUT_SECONDS",
    "MAX_LIFETIME_HOURS",
    "NOTIFY_TOPIC_ARN",
    "AWS_ENDPOINT_URL",
    "AWS_PROFILE",
)


class Recorder:
    """Wraps a boto3 client and records every API call made through it."""

    def __init__(
        self,
        client: Any,
        calls: list[tuple[str, dict[str, Any]]],
        timeline: list[str],
        service: str,
    ) -> None:
        self._client = client
        self._calls = calls
        self._timeline = timeline
        self._service = service

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name.startswith("_") or name in {"get_paginator", "meta", "exceptions"}:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.append((name, kwargs))
            self._timeline.append(f"{self._service}.{name}")
            return attr(*args, **kwargs)

        return call


class FakeClock:
    """monotonic() and sleep() in one: sleeping advances time instantly."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds
        # A wait loop that ignores its deadline fails here instead of hanging the suite.
        assert self.now - 1000.0 < 3600, "waited over an hour of fake time"
        assert len(self.sleeps) < 1000, "the wait loop keeps polling"


_CLIENTS: dict[str, Any] = {}


def shared_client(service: str) -> Any:
    """One boto3 client per service for the session: building clients costs ~50 ms each."""
    if service not in _CLIENTS:
        _CLIENTS[service] = boto3.client(service, region_name="us-east-1")
    return _CLIENTS[service]


@dataclass
class Recorded:
    """What the handlers did through `runtime.RUNTIME`."""

    clock: FakeClock
    calls: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    # "service.method" of every call, across services, in order
    timeline: list[str] = field(default_factory=list)
    # service -> object used instead of a real moto-backed client
    fakes: dict[str, Any] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        calls = self.calls.setdefault(service, [])
        client = self.fakes.get(service) or shared_client(service)
        return Recorder(client, calls, self.timeline, service)

    def of(self, service: str, method: str) -> list[dict[str, Any]]:
        """Keyword arguments of each call to service.method, in order."""
        return [kwargs for name, kwargs in self.calls.get(service, []) if name == method]


FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a clean guardrail environment for every test."""
    for name in HOOK_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GPUCLUSTER_STACK", STACK)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    """Route the handlers' clients through recorders and fake their clock."""
    rec = Recorded(clock=FakeClock())
    monkeypatch.setattr(runtime.RUNTIME, "client", rec.client)
    monkeypatch.setattr(runtime.RUNTIME, "sleep", rec.clock.sleep)
    monkeypatch.setattr(runtime.RUNTIME, "clock", rec.clock.clock)
    return rec


@dataclass
class Cluster:
    """Handles on the fake account: the raw (unrecorded) client and the alert topic."""

    autoscaling: Any
    topic_arn: str

    def group(self, name: str) -> dict[str, Any]:
        found = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
        return found["AutoScalingGroups"][0]

    def tags(self, name: str) -> dict[str, str]:
        return awsapi.group_tags(self.group(name))

    def capacity(self, name: str) -> tuple[int, int]:
        group = self.group(name)
        return group["MinSize"], group["DesiredCapacity"]

    def instances(self, name: str) -> list[str]:
        return sorted(awsapi.in_service_instance_ids(self.group(name)))


@pytest.fixture(scope="module")
def moto_account() -> Iterator[str]:
    """One moto account per test module (resetting moto costs ~0.3 s a test).

    Tests stay isolated because `cluster` creates its groups afresh and removes
    them afterwards; yields the alert topic ARN.
    """
    with pytest.MonkeyPatch.context() as patch:
        for name, value in FAKE_ENV.items():
            patch.setenv(name, value)
        with mock_aws():
            shared_client("ec2").create_launch_template(
                LaunchTemplateName="gpu-nodes",
                LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"},
            )
            yield shared_client("sns").create_topic(Name="gpucluster-dev-alerts")["TopicArn"]


@pytest.fixture
def cluster(moto_account: str) -> Iterator[Cluster]:
    """Two stacks: `dev` (two groups) and `prod` (one, never touched), created per test."""
    autoscaling = shared_client("autoscaling")
    create_stack_groups(autoscaling, GROUPS, launch_template="gpu-nodes")
    yield Cluster(autoscaling=autoscaling, topic_arn=moto_account)
    # Test cleanup in the fake account only; the guardrails themselves never delete.
    for name in GROUPS:
        autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)


class StuckSSM:
    """An SSM client whose commands never finish: the wait must still end."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_command(self, **kwargs: Any) -> dict[str, Any]:
        self.sent.append(kwargs)
        return {"Command": {"CommandId": f"cmd-{len(self.sent)}", "Status": "Pending"}}

    def get_command_invocation(self, **kwargs: Any) -> dict[str, Any]:
        return {"CommandId": kwargs["CommandId"], "Status": "InProgress"}


@pytest.fixture
def stuck_ssm(recorded: Recorded) -> StuckSSM:
    """Make the handlers' SSM client one whose commands hang forever."""
    fake = StuckSSM()
    recorded.fakes["ssm"] = fake
    return fake
