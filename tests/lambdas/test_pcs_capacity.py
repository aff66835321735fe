"""The PCS capacity backend (`lambdas.pcs`) under the stored guard state, and the handlers on a Slurm stack.

moto has no AWS PCS. The exact calls are pinned with botocore's Stubber; the stateful tests
(faults, a kill and Lambda's retry, two actors) run a real boto3 `pcs` client whose calls are
answered from a dict of compute node groups by a `before-call` hook, the way Stubber answers
them, each response checked against the operation's output shape in botocore's PCS model (as
Stubber does), so a wrong field name fails here as it would against AWS. DynamoDB is moto's
(conditional writes as in AWS).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.stub import Stubber
from botocore.validate import validate_parameters
from test_guardstate import create_table

from conftest import FakeClock, shared_client
from gpucluster.aws.guardrail_lambda import BASE_TIMEOUT_SECONDS
from gpucluster.fleet import guardstate, nodegroups, runtime, stops
from gpucluster.fleet.deployment import PCS_ACTIVE_WAIT_SECONDS
from gpucluster.fleet.nodegroups import BUDGET, IDLE, SCHEDULE
from gpucluster.fleet.pcsgroups import BACKOFF_FIRST_SECONDS, BACKOFF_MAX_SECONDS, PcsCapacity
from gpucluster.fleet.runtime import GuardrailError, invocation_deadline
from gpucluster.fleet.slurmhold import hold_script, release_script
from gpucluster.lambdas import budget_action
from gpucluster.ops import Clients
from gpucluster.ops.nodegroups import Fleet, deployment_node_groups

CLUSTER = "pcs_abc123"
STACK = "dev"
# name -> (id, min, max); `login` is the login group (never stopped)
GROUPS = {
    "train": ("pcs_cng_train", 1, 4),
    "infer": ("pcs_cng_infer", 0, 2),
    "login": ("pcs_cng_login", 1, 1),
}
LOGIN_INSTANCE = "i-0123456789abcdef0"
BUDGET_EVENT = {
    "Records": [
        {
            "EventSource": "aws:sns",
            "Sns": {
                "Type": "Notification",
                "Subject": "AWS Budgets: exceeded",
                "Message": "ACTUAL Amount: $104.17",
                "TopicArn": "arn:aws:sns:us-east-1:123456789012:gpucluster-dev-budget-action",
            },
        }
    ]
}
START_EVENT = {
    "source": "aws.events",
    "detail-type": "Scheduled Event",
    "resources": ["arn:aws:events:us-east-1:123456789012:rule/gpucluster-dev-start"],
}


def pcs_client() -> Any:
    return boto3.client("pcs", region_name="us-east-1")


class Killed(BaseException):
    """The Lambda runtime ending an invocation mid-way (not an Exception: nothing catches it)."""


class FakePcs:
    """Compute node groups in a dict, answered through a real client's event hooks (like Stubber)."""

    def __init__(self, groups: dict[str, tuple[str, int, int]] | None = None) -> None:
        self.groups = {
            name: {"id": gid, "min": lo, "max": hi, "status": "ACTIVE"}
            for name, (gid, lo, hi) in (groups or GROUPS).items()
        }
        self.client = pcs_client()
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.faults: list[tuple[str, Callable[[str, dict[str, Any]], None]]] = []
        self.meanwhile: dict[str, Callable[[], Any]] = {}
        self._params: dict[str, Any] = {}
        self.client.meta.events.register("before-parameter-build.pcs", self._capture)
        self.client.meta.events.register_first("before-call.pcs", self._answer)

    def _capture(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self._params = dict(params)

    def fail(self, operation: str, fault: Callable[[str, dict[str, Any]], None]) -> None:
        self.faults.append((operation, fault))

    def by_id(self, gid: str) -> tuple[str, dict[str, Any]]:
        for name, g in self.groups.items():
            if gid in (g["id"], name):
                return name, g
        raise error("ResourceNotFoundException", 404)

    def scaling(self, name: str) -> tuple[int, int]:
        return self.groups[name]["min"], self.groups[name]["max"]

    def describe(self, name: str) -> dict[str, Any]:
        g = self.groups[name]
        return {
            "name": name,
            "id": g["id"],
            "clusterId": CLUSTER,
            "status": g["status"],
            "arn": f"arn:aws:pcs:us-east-1:123456789012:cluster/{CLUSTER}/computenodegroup/{g['id']}",
            "createdAt": "2026-01-01T00:00:00Z",
            "modifiedAt": "2026-01-01T00:00:00Z",
            "subnetIds": ["subnet-1"],
            "iamInstanceProfileArn": "arn:aws:iam::123456789012:instance-profile/aws-pcs/p",
            "customLaunchTemplate": {"id": "lt-1", "version": "1"},
            "instanceConfigs": [{"instanceType": "p5.48xlarge"}],
            "scalingConfiguration": {"minInstanceCount": g["min"], "maxInstanceCount": g["max"]},
        }

    def _answer(self, model: Any, **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        operation, params = model.name, self._params
        self.calls.append((operation, params))
        if operation in self.meanwhile:
            self.meanwhile.pop(operation)()
        for i, (op, fault) in enumerate(self.faults):
            if op == operation:
                del self.faults[i]
                fault(operation, params)  # raises, or lands the call first
                break
        try:
            body = self._result(operation, params)
        except ClientError as exc:
            return AWSResponse(
                "https://pcs", exc.response["ResponseMetadata"]["HTTPStatusCode"], {}, None
            ), exc.response
        validate_parameters(body, model.output_shape)  # as Stubber checks its responses
        return AWSResponse("https://pcs", 200, {}, None), {
            **body,
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }

    def _result(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        if operation == "ListComputeNodeGroups":
            return {
                "computeNodeGroups": [
                    {
                        k: v
                        for k, v in self.describe(n).items()
                        if k in ("name", "id", "arn", "clusterId", "createdAt", "modifiedAt", "status")
                    }
                    for n in self.groups
                ]
            }
        name, g = self.by_id(params["computeNodeGroupIdentifier"])
        if operation == "GetComputeNodeGroup":
            return {"computeNodeGroup": self.describe(name)}
        if operation == "UpdateComputeNodeGroup":
            if g["status"] != "ACTIVE":
                raise error("ConflictException", 409)
            g["min"] = params["scalingConfiguration"]["minInstanceCount"]
            g["max"] = params["scalingConfiguration"]["maxInstanceCount"]
            return {"computeNodeGroup": self.describe(name)}
        raise AssertionError(f"unexpected PCS call {operation}")

    def apply(self, operation: str, params: dict[str, Any]) -> None:
        """Land a call without answering it (a timeout after the call landed)."""
        self._result(operation, params)


def error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PCS"
    )


def raising(code: str, status: int) -> Callable[[str, dict[str, Any]], None]:
    def fault(operation: str, params: dict[str, Any]) -> None:
        raise error(code, status)

    return fault


def timeout(after_landing: bool, fake: FakePcs) -> Callable[[str, dict[str, Any]], None]:
    def fault(operation: str, params: dict[str, Any]) -> None:
        if after_landing:
            fake.apply(operation, params)
        raise ReadTimeoutError(endpoint_url="https://pcs.us-east-1.amazonaws.com")

    return fault


class FakeSsm:
    """SSM Run Command on the login node: records each script, every command succeeds."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[str], str]] = []
        self.status = "Success"

    def send_command(self, **kwargs: Any) -> dict[str, Any]:
        self.sent.append((kwargs["InstanceIds"], kwargs["Parameters"]["commands"][-1]))
        return {"Command": {"CommandId": f"c-{len(self.sent)}"}}

    def get_command_invocation(self, **kwargs: Any) -> dict[str, Any]:
        return {"Status": self.status}


def instance(iid: str, stack: str, group: str, state: str = "running") -> dict[str, Any]:
    return {
        "InstanceId": iid,
        "InstanceType": "p5.48xlarge",
        "State": {"Name": state},
        "Placement": {"AvailabilityZone": "us-east-1a"},
        "PrivateIpAddress": "10.0.1.42",
        "PrivateDnsName": "ip-10-0-1-42.ec2.internal",
        "Tags": [
            {"Key": "gpucluster:stack", "Value": stack},
            {"Key": "gpucluster:node-group", "Value": group},
        ],
    }


class FakeEc2:
    """DescribeInstances over a list of instances, applying the tag and state filters EC2 applies."""

    def __init__(self) -> None:
        self.filters: list[Any] = []
        self.instances: dict[str, dict[str, Any]] = {
            i["InstanceId"]: i
            for i in (
                instance(LOGIN_INSTANCE, STACK, "login"),
                instance("i-0ther", "prod", "login"),
                instance("i-0train00000000001", STACK, "train"),
                instance("i-0train00000000002", STACK, "train", state="pending"),
                instance("i-0gone000000000001", STACK, "train", state="terminated"),
                instance("i-0prod000000000001", "prod", "train"),
            )
        }

    def describe_instances(self, InstanceIds: list[str]) -> dict[str, Any]:
        return {
            "Reservations": [{"Instances": [self.instances[i] for i in InstanceIds if i in self.instances]}]
        }

    def matching(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        def ok(inst: dict[str, Any], f: dict[str, Any]) -> bool:
            if f["Name"] == "instance-state-name":
                return inst["State"]["Name"] in f["Values"]
            key = f["Name"].removeprefix("tag:")
            return any(t["Key"] == key and t["Value"] in f["Values"] for t in inst["Tags"])

        return [i for i in self.instances.values() if all(ok(i, f) for f in filters)]

    def get_paginator(self, name: str) -> Any:
        assert name == "describe_instances"
        outer = self

        class Pages:
            def paginate(self, Filters: list[Any]) -> Iterator[dict[str, Any]]:
                outer.filters.append(Filters)
                yield {"Reservations": [{"Instances": outer.matching(Filters)}]}

        return Pages()


@pytest.fixture
def table(moto_account: str) -> str:
    return create_table(shared_client("dynamodb"))


@pytest.fixture
def slurm_stack(monkeypatch: pytest.MonkeyPatch, table: str) -> Iterator[dict[str, Any]]:
    """A Slurm stack's handler environment: PCS fake, moto DynamoDB, fake SSM and EC2."""
    fake, ssm, ec2 = FakePcs(), FakeSsm(), FakeEc2()
    clients = {"pcs": fake.client, "ssm": ssm, "ec2": ec2}
    monkeypatch.setenv("PCS_CLUSTER_ID", CLUSTER)
    monkeypatch.setenv("GUARD_STATE_TABLE", table)
    monkeypatch.setenv("GPUCLUSTER_STACK", STACK)
    monkeypatch.setattr(runtime.RUNTIME, "client", lambda s: clients.get(s) or shared_client(s))
    # Fake time: a retry loop waits out its deadline in fake seconds (with the real clock and no
    # sleep, a throttled login-node call spun a CPU until the real deadline, a minute a test).
    clock = FakeClock()
    monkeypatch.setattr(runtime.RUNTIME, "sleep", clock.sleep)
    monkeypatch.setattr(runtime.RUNTIME, "clock", clock.clock)
    yield {"pcs": fake, "ssm": ssm, "ec2": ec2, "table": table}


def record(table: str, name: str) -> dict[str, Any] | None:
    item = (
        shared_client("dynamodb")
        .get_item(TableName=table, Key={"stack": {"S": STACK}, "group": {"S": name}}, ConsistentRead=True)
        .get("Item")
    )
    return None if item is None else {k: next(iter(v.values())) for k, v in item.items()}


def assert_budget_stopped(env: dict[str, Any]) -> None:
    fake, table = env["pcs"], env["table"]
    assert fake.scaling("train") == (0, 0) and fake.scaling("infer") == (0, 0)
    assert fake.scaling("login") == (1, 1)  # the login group is never stopped
    for name, (_, lo, hi) in GROUPS.items():
        if name == "login":
            assert record(table, name) is None
            continue
        rec = record(table, name)
        assert rec is not None
        assert (rec["state"], rec["stopped_by"], rec["previous_min"], rec["previous_desired"]) == (
            "stopped",
            BUDGET,
            str(lo),
            str(hi),
        ), rec


# --- the exact calls ----------------------------------------------------------------------------


def test_the_capacity_calls_are_exactly_these() -> None:
    client = pcs_client()
    capacity = PcsCapacity(client, CLUSTER, STACK)
    summary = {
        "name": "train",
        "id": "pcs_cng_train",
        "arn": "arn:aws:pcs:us-east-1:1:cluster/x/computenodegroup/y",
        "clusterId": CLUSTER,
        "createdAt": "2026-01-01T00:00:00Z",
        "modifiedAt": "2026-01-01T00:00:00Z",
        "status": "ACTIVE",
    }
    login = {**summary, "name": "login", "id": "pcs_cng_login"}
    group = {
        **summary,
        "subnetIds": ["s"],
        "iamInstanceProfileArn": "arn:aws:iam::1:instance-profile/aws-pcs/p",
        "customLaunchTemplate": {"id": "lt-1", "version": "1"},
        "instanceConfigs": [{"instanceType": "p5.48xlarge"}],
        "scalingConfiguration": {"minInstanceCount": 1, "maxInstanceCount": 4},
    }
    with Stubber(client) as stub:
        stub.add_response(
            "list_compute_node_groups",
            {"computeNodeGroups": [summary, login]},
            {"clusterIdentifier": CLUSTER},
        )
        stub.add_response(
            "get_compute_node_group",
            {"computeNodeGroup": group},
            {"clusterIdentifier": CLUSTER, "computeNodeGroupIdentifier": "pcs_cng_train"},
        )
        stub.add_response(
            "update_compute_node_group",
            {"computeNodeGroup": group},
            {
                "clusterIdentifier": CLUSTER,
                "computeNodeGroupIdentifier": "pcs_cng_train",
                "scalingConfiguration": {"minInstanceCount": 0, "maxInstanceCount": 0},
            },
        )
        listed = capacity.describe_stack(STACK)
        capacity.resize("train", 0, 0)
        stub.assert_no_pending_responses()
    assert [(g.name, g.min_size, g.desired, g.max_size, g.stack) for g in listed] == [
        ("train", 1, 4, 4, STACK)
    ]
    assert capacity.describe_stack("prod") == []  # another stack's identity: not this cluster's groups


def test_boto3_has_the_pcs_model_offline() -> None:
    ops = pcs_client().meta.service_model.operation_names
    assert {"GetComputeNodeGroup", "UpdateComputeNodeGroup", "ListComputeNodeGroups"} <= set(ops)


# --- stop and restore through the stored state --------------------------------------------------


def test_a_stop_zeroes_min_and_max_records_both_and_a_restore_puts_both_back(table: str) -> None:
    fake = FakePcs()
    b = guardstate.StoredNodeGroups(
        None, shared_client("dynamodb"), table, actor="t", capacity=PcsCapacity(fake.client, CLUSTER, STACK)
    )
    train = b.read_groups(["train"])[0]
    assert (train.min_size, train.desired, train.max_size, train.running) == (1, 4, 4, True)
    assert b.stop(train, IDLE) == nodegroups.STOPPED
    assert fake.scaling("train") == (0, 0)
    stopped = b.read_groups(["train"])[0]
    assert (stopped.stopped_by, stopped.stop.previous_min, stopped.stop.previous_desired) == (IDLE, "1", "4")
    assert stopped.max_size == 4  # the recorded maximum is the ceiling while stopped
    assert b.stop(stopped, IDLE) == nodegroups.ALREADY_STOPPED
    result = b.restore(stopped)
    assert (result.action, result.min_size, result.desired_capacity) == ("resumed", 1, 4)
    assert fake.scaling("train") == (1, 4)
    assert record(table, "train")["state"] == "running"
    assert [g.name for g in b.list_groups(STACK)] == ["infer", "train"]  # never the login group


def test_a_group_updating_refuses_the_stop_which_is_recorded_failed_and_the_retry_stops_it(
    table: str,
) -> None:
    fake = FakePcs()
    b = guardstate.StoredNodeGroups(
        None, shared_client("dynamodb"), table, actor="t", capacity=PcsCapacity(fake.client, CLUSTER, STACK)
    )
    fake.groups["train"]["status"] = "UPDATING"
    with pytest.raises(ClientError, match="ConflictException"):
        b.stop(b.read_groups(["train"])[0], BUDGET)
    assert record(table, "train")["state"] == "stop-failed"
    assert fake.scaling("train") == (1, 4)
    fake.groups["train"]["status"] = "ACTIVE"
    assert b.stop(b.read_groups(["train"])[0], BUDGET) == nodegroups.STOPPED
    rec = record(table, "train")
    assert (rec["state"], rec["previous_min"], rec["previous_desired"]) == ("stopped", "1", "4")


# --- the budget handler on a Slurm stack --------------------------------------------------------


def test_a_budget_stop_holds_the_partitions_on_the_login_node_then_zeroes_every_group(slurm_stack) -> None:
    summary = budget_action.handler(BUDGET_EVENT, None)
    assert summary["groups"] == ["infer", "train"]
    assert_budget_stopped(slurm_stack)
    [(instances, script)] = slurm_stack["ssm"].sent
    assert instances == [LOGIN_INSTANCE]  # the login node of this stack only
    assert script == hold_script(["infer", "train"], grace_seconds=30)
    ops = [op for op, _ in slurm_stack["pcs"].calls]
    assert "UpdateComputeNodeGroup" in ops
    updated = [
        p["computeNodeGroupIdentifier"]
        for op, p in slurm_stack["pcs"].calls
        if op == "UpdateComputeNodeGroup"
    ]
    assert "pcs_cng_login" not in updated


def test_a_schedule_start_restores_min_and_max_then_releases_the_partitions(slurm_stack) -> None:
    from gpucluster.lambdas import autostop

    backend = stops.stack_node_groups()
    for g in backend.list_groups(STACK):
        backend.stop(g, SCHEDULE)
    summary = autostop.handler(START_EVENT, None)
    assert summary["groups"] == ["infer", "train"]
    assert slurm_stack["pcs"].scaling("train") == (1, 4) and slurm_stack["pcs"].scaling("infer") == (0, 2)
    assert slurm_stack["ssm"].sent[-1] == ([LOGIN_INSTANCE], release_script(["infer", "train"]))


def test_a_start_that_cannot_release_the_partitions_fails_and_its_retry_releases_them(slurm_stack) -> None:
    from gpucluster.lambdas import autostop

    backend = stops.stack_node_groups()
    for g in backend.list_groups(STACK):
        backend.stop(g, SCHEDULE)
    slurm_stack["ssm"].status = "Failed"
    with pytest.raises(GuardrailError, match="partitions not released"):
        autostop.handler(START_EVENT, None)
    slurm_stack["ssm"].status = "Success"
    summary = autostop.handler(START_EVENT, None)  # Lambda's retry: capacity already back
    assert summary["groups"] == [] and summary["slurm_release"]["ok"]
    assert slurm_stack["ssm"].sent[-1][1] == release_script(["infer", "train"])


FAULTS = [
    ("Throttling", 400),
    ("ThrottlingException", 400),
    ("InternalServerException", 500),
    ("AccessDeniedException", 403),
    ("ConflictException", 409),
]


@pytest.mark.parametrize(
    "operation", ["ListComputeNodeGroups", "GetComputeNodeGroup", "UpdateComputeNodeGroup"]
)
@pytest.mark.parametrize(("code", "status"), FAULTS)
def test_a_fault_on_any_pcs_call_fails_the_invocation_and_the_retry_equals_one_run(
    slurm_stack, operation: str, code: str, status: int
) -> None:
    slurm_stack["pcs"].fail(operation, raising(code, status))
    with pytest.raises((GuardrailError, ClientError)):
        budget_action.handler(BUDGET_EVENT, None)
    budget_action.handler(BUDGET_EVENT, None)  # Lambda's retry
    assert_budget_stopped(slurm_stack)


@pytest.mark.parametrize(
    "operation", ["ListComputeNodeGroups", "GetComputeNodeGroup", "UpdateComputeNodeGroup"]
)
@pytest.mark.parametrize("after_landing", [False, True])
def test_a_timeout_before_or_after_the_call_lands_and_the_retry_equals_one_run(
    slurm_stack, operation: str, after_landing: bool
) -> None:
    slurm_stack["pcs"].fail(operation, timeout(after_landing, slurm_stack["pcs"]))
    with pytest.raises((GuardrailError, ReadTimeoutError)):
        budget_action.handler(BUDGET_EVENT, None)
    budget_action.handler(BUDGET_EVENT, None)
    assert_budget_stopped(slurm_stack)


KILL_POINTS = 11
"""At least the PCS calls of one budget stop on a fresh stack (checked below): every one is a kill point."""


def test_every_pcs_call_of_a_budget_stop_is_a_kill_point(slurm_stack) -> None:
    budget_action.handler(BUDGET_EVENT, None)
    assert len(slurm_stack["pcs"].calls) <= KILL_POINTS


@pytest.mark.parametrize("kill_at", range(1, KILL_POINTS + 1))
def test_a_kill_at_any_pcs_call_then_lambdas_retry_equals_one_run(slurm_stack, kill_at: int) -> None:
    fake = slurm_stack["pcs"]
    count = {"n": 0}
    original = fake._result

    def counting(operation: str, params: dict[str, Any]) -> dict[str, Any]:
        count["n"] += 1
        if count["n"] == kill_at:
            raise Killed(f"killed at PCS call {kill_at} ({operation})")
        return original(operation, params)

    fake._result = counting  # type: ignore[method-assign]
    with contextlib.suppress(Killed):
        budget_action.handler(BUDGET_EVENT, None)
    fake._result = original  # type: ignore[method-assign]
    if count["n"] < kill_at:
        pytest.skip(f"a budget stop makes {count['n']} PCS calls: no call {kill_at} to kill")
    budget_action.handler(BUDGET_EVENT, None)
    assert_budget_stopped(slurm_stack)


def test_a_budget_stop_landing_during_a_schedule_start_wins(slurm_stack) -> None:
    from gpucluster.lambdas import autostop

    fake = slurm_stack["pcs"]
    backend = stops.stack_node_groups()
    for g in backend.list_groups(STACK):
        backend.stop(g, SCHEDULE)
    # The budget's whole stop runs inside the start's first capacity update (between its
    # `starting` write and its capacity change).
    fake.meanwhile["UpdateComputeNodeGroup"] = lambda: budget_action.handler(BUDGET_EVENT, None)
    autostop.handler(START_EVENT, None)
    assert_budget_stopped(slurm_stack)


def test_two_budget_stops_at_once_record_the_capacity_once(slurm_stack) -> None:
    fake = slurm_stack["pcs"]
    fake.meanwhile["UpdateComputeNodeGroup"] = lambda: budget_action.handler(BUDGET_EVENT, None)
    budget_action.handler(BUDGET_EVENT, None)
    assert_budget_stopped(slurm_stack)


def test_no_login_node_is_reported_and_the_stop_still_happens(slurm_stack, monkeypatch) -> None:
    no_login = FakeEc2()
    no_login.instances = {k: v for k, v in no_login.instances.items() if "login" not in json.dumps(v["Tags"])}
    clients = {"pcs": slurm_stack["pcs"].client, "ssm": slurm_stack["ssm"], "ec2": no_login}
    monkeypatch.setattr(runtime.RUNTIME, "client", lambda s: clients.get(s) or shared_client(s))
    summary = budget_action.handler(BUDGET_EVENT, None)
    assert summary["hook"]["ok"] is False and summary["hook"]["not_sent"] == {
        "login": "no running login node"
    }
    assert_budget_stopped(slurm_stack)


# --- the one place each side picks the backend --------------------------------------------------


def test_handlers_and_ops_pick_the_pcs_backend_for_a_slurm_stack(slurm_stack, monkeypatch) -> None:
    chosen = stops.stack_node_groups()
    assert isinstance(chosen, guardstate.StoredNodeGroups) and isinstance(chosen.capacity, PcsCapacity)
    assert chosen.capacity.cluster_id == CLUSTER and chosen.capacity.stack == STACK
    monkeypatch.delenv("PCS_CLUSTER_ID")
    monkeypatch.delenv("GUARD_STATE_TABLE")
    from gpucluster.fleet.deployment import state_table_name

    create_table(shared_client("dynamodb"), state_table_name(STACK))
    ops_backend = deployment_node_groups(STACK, "slurm", ops_clients(slurm_stack), cluster_id=CLUSTER)
    assert isinstance(ops_backend, guardstate.StoredNodeGroups)
    assert [g.name for g in ops_backend.list_groups(STACK)] == ["infer", "train"]


def test_a_slurm_stack_without_a_guard_state_table_is_a_config_error(slurm_stack, monkeypatch) -> None:
    monkeypatch.delenv("GUARD_STATE_TABLE")
    with pytest.raises(runtime.ConfigError, match="guard-state table"):
        stops.stack_node_groups()


def test_the_pcs_calls_carry_only_this_clusters_ids(slurm_stack) -> None:
    budget_action.handler(BUDGET_EVENT, None)
    assert {p["clusterIdentifier"] for _, p in slurm_stack["pcs"].calls} == {CLUSTER}
    login_lookup = next(f for f in slurm_stack["ec2"].filters if "login" in json.dumps(f))
    assert {"Name": "tag:gpucluster:stack", "Values": [STACK]} in login_lookup


# --- a spot warning on a Slurm stack -----------------------------------------------------------

SPOT_EVENT = {
    "source": "aws.ec2",
    "detail-type": "EC2 Spot Instance Interruption Warning",
    "detail": {"instance-id": "i-0aaaaaaaaaaaaaaa1", "instance-action": "terminate"},
}


def compute_node(stack: str = STACK, group: str = "train") -> dict[str, Any]:
    return {
        "InstanceId": "i-0aaaaaaaaaaaaaaa1",
        "PrivateIpAddress": "10.0.1.42",
        "PrivateDnsName": "ip-10-0-1-42.ec2.internal",
        "Tags": [
            {"Key": "gpucluster:stack", "Value": stack},
            {"Key": "gpucluster:node-group", "Value": group},
        ],
    }


def test_a_spot_warning_requeues_the_nodes_jobs_from_the_login_node(slurm_stack, monkeypatch) -> None:
    from gpucluster.fleet.slurmhold import requeue_node_script
    from gpucluster.lambdas import spot_interruption

    monkeypatch.setenv("INTERRUPTION_TIMEOUT_SECONDS", "90")
    slurm_stack["ec2"].instances["i-0aaaaaaaaaaaaaaa1"] = compute_node()
    summary = spot_interruption.handler(SPOT_EVENT, None)
    assert (summary["action"], summary["group"]) == ("requeued", "train")
    [(instances, script)] = slurm_stack["ssm"].sent
    assert instances == [LOGIN_INSTANCE]
    assert script == requeue_node_script(
        "10.0.1.42", "ip-10-0-1-42", grace_seconds=60, reason="spot-interruption-warning"
    )
    assert slurm_stack["pcs"].calls == []  # no capacity change: PCS replaces the instance


@pytest.mark.parametrize("node", [compute_node(stack="prod"), compute_node(group="login")])
def test_a_spot_warning_for_another_stacks_node_or_the_login_node_is_ignored(slurm_stack, node) -> None:
    from gpucluster.lambdas import spot_interruption

    slurm_stack["ec2"].instances["i-0aaaaaaaaaaaaaaa1"] = node
    summary = spot_interruption.handler(SPOT_EVENT, None)
    assert summary["action"] == "ignored" and slurm_stack["ssm"].sent == []


def test_a_failed_requeue_is_notified_as_failed(slurm_stack, monkeypatch) -> None:
    from gpucluster.lambdas import spot_interruption

    sent: list[str] = []
    monkeypatch.setattr(
        spot_interruption, "notify_from_env", lambda subject, message: sent.append(subject) or True
    )
    slurm_stack["ec2"].instances["i-0aaaaaaaaaaaaaaa1"] = compute_node()
    slurm_stack["ssm"].status = "Failed"
    summary = spot_interruption.handler(SPOT_EVENT, None)
    assert summary["action"] == "requeue-failed" and sent[0].endswith("requeue failed")


# --- the idle fallback alarm on a Slurm stack ---------------------------------------------------


def test_the_autostop_handler_stops_the_pcs_group_its_alarm_names(slurm_stack: dict[str, Any]) -> None:
    from gpucluster.lambdas import autostop

    event = {
        "source": "aws.cloudwatch",
        "detail-type": "CloudWatch Alarm State Change",
        "detail": {
            "alarmName": "gpu-dev-train-gpu-idle",
            "state": {"value": "ALARM"},
            "configuration": {
                "metrics": [
                    {
                        "metricStat": {
                            "metric": {
                                "namespace": "gpucluster/gpu-dev",
                                "name": "GpuUtilizationMax",
                                "dimensions": {"Stack": "dev", "NodeGroup": "train"},
                            }
                        }
                    }
                ]
            },
        },
    }
    summary = autostop.handler(event, None)
    assert summary["groups"] == ["train"]
    fake = slurm_stack["pcs"]
    assert fake.scaling("train") == (0, 0) and fake.scaling("infer") == (0, 2)
    [(_, script)] = slurm_stack["ssm"].sent
    assert "scontrol update PartitionName=train State=DOWN" in script and "infer" not in script


# --- the CLI's operations on a Slurm stack (ops.scale / ops.status) ----------------------------


@pytest.fixture
def ops_stack(slurm_stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The Slurm stack as the CLI sees it: the table found by the identity, clients handed in."""
    from gpucluster.fleet.deployment import state_table_name

    monkeypatch.delenv("PCS_CLUSTER_ID")
    monkeypatch.delenv("GUARD_STATE_TABLE")
    name = state_table_name(STACK)
    if name not in shared_client("dynamodb").list_tables()["TableNames"]:
        create_table(shared_client("dynamodb"), name)
    slurm_stack["state_table"] = name
    return slurm_stack


def ops_clients(slurm_stack: dict[str, Any]) -> Clients:
    """The stack's clients as the CLI hands them to ops: fakes for PCS, SSM and EC2, moto's for the rest."""
    fakes = {"pcs": slurm_stack["pcs"].client, "ssm": slurm_stack["ssm"], "ec2": slurm_stack["ec2"]}
    return Clients("us-east-1", make=lambda service: fakes.get(service) or shared_client(service))


def ops_fleet(slurm_stack: dict[str, Any]) -> Fleet:
    """The Slurm stack's `Fleet` as `ops.nodegroups.stack_fleet` builds it, its PCS cluster already found."""
    clients = ops_clients(slurm_stack)
    groups = deployment_node_groups(STACK, "slurm", clients, cluster_id=CLUSTER)
    return Fleet(STACK, clients, groups, slurm=True)


def test_gpucluster_stop_then_start_hold_and_release_the_partitions(ops_stack: dict[str, Any]) -> None:
    from gpucluster.ops.stopstart import apply_start, apply_stop, plan_start_on, plan_stop_on

    fake, ssm = ops_stack["pcs"], ops_stack["ssm"]
    plan = plan_stop_on(ops_fleet(ops_stack), hook_timeout_seconds=45)
    candidates = plan.candidates
    assert [(c.group, c.desired_now) for c in candidates] == [("infer", 2), ("train", 4)]
    report = apply_stop(plan).report
    assert sorted(report.changed) == ["infer", "train"]
    assert ssm.sent[-1] == ([LOGIN_INSTANCE], hold_script(["infer", "train"], grace_seconds=45))
    assert fake.scaling("train") == (0, 0) and fake.scaling("infer") == (0, 0)
    to_start = plan_start_on(ops_fleet(ops_stack))
    shown = {c.decision.group: c.decision.stopped_by for c in to_start.candidates}
    assert shown == {"infer": "manual", "train": "manual"}
    results = apply_start(to_start).results
    assert [r.action for r in results] == ["resumed", "resumed"]
    assert fake.scaling("train") == (1, 4) and fake.scaling("infer") == (0, 2)
    assert ssm.sent[-1] == ([LOGIN_INSTANCE], release_script(["infer", "train"]))


def test_a_resume_whose_release_fails_says_so_and_running_it_again_releases(
    ops_stack: dict[str, Any],
) -> None:
    from gpucluster.ops.resume import SlurmReleaseError, resume_stack

    ssm = ops_stack["ssm"]
    fleet = ops_fleet(ops_stack)
    backend = fleet.groups
    for g in backend.list_groups(STACK):
        backend.stop(g, BUDGET)
    ssm.status = "Failed"
    with pytest.raises(SlurmReleaseError, match="partitions infer, train still held"):
        resume_stack(fleet)
    assert ops_stack["pcs"].scaling("train") == (1, 4)  # the capacity is back
    ssm.status = "Success"
    results = resume_stack(fleet)
    assert {r.action for r in results} == {"skipped"}
    assert ssm.sent[-1][1] == release_script(["infer", "train"])


def test_a_pcs_group_carries_its_live_instances_as_members(slurm_stack: dict[str, Any]) -> None:
    """What the spend guard prices and the lifetime limit dates: the stack's instances of the group."""
    groups = {g.name: g for g in stops.stack_node_groups().list_groups(STACK)}
    assert [(m.instance_id, m.lifecycle_state) for m in groups["train"].members] == [
        ("i-0train00000000001", "InService"),
        ("i-0train00000000002", "Pending"),
    ]
    assert groups["train"].in_service_ids == ["i-0train00000000001"]
    assert groups["infer"].members == ()


class CountingSns:
    """SNS that records each published subject; fails (or kills) the first publish when asked."""

    def __init__(self, first: BaseException | None = None) -> None:
        self.subjects: list[str] = []
        self.first = first

    def publish(self, **kwargs: Any) -> dict[str, Any]:
        if self.first is not None:
            first, self.first = self.first, None
            raise first
        self.subjects.append(kwargs["Subject"])
        return {"MessageId": "m-1"}


@pytest.mark.parametrize("fault", [Killed("killed at the publish"), error("InternalError", 500)])
def test_a_stop_whose_notification_was_lost_is_told_once_by_the_retry(
    slurm_stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch, fault: BaseException
) -> None:
    sns = CountingSns(first=fault)
    clients = {
        "pcs": slurm_stack["pcs"].client,
        "ssm": slurm_stack["ssm"],
        "ec2": slurm_stack["ec2"],
        "sns": sns,
    }
    monkeypatch.setattr(runtime.RUNTIME, "client", lambda s: clients.get(s) or shared_client(s))
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", "arn:aws:sns:us-east-1:123456789012:gpu-dev-guardrails")
    with pytest.raises((Killed, GuardrailError)):
        budget_action.handler(BUDGET_EVENT, None)
    assert_budget_stopped(slurm_stack)
    assert sns.subjects == []
    summary = budget_action.handler(
        BUDGET_EVENT, None
    )  # Lambda's retry: the work is done, the telling is not
    assert summary["untold"] == ["infer", "train"]
    assert len(sns.subjects) == 1 and "budget breached" in sns.subjects[0]
    budget_action.handler(BUDGET_EVENT, None)  # a third delivery: already told, says nothing more
    assert len(sns.subjects) == 1
    assert (
        len(slurm_stack["ssm"].sent) == 1
    )  # the partitions were held once (the retry found nothing running)


class FailingSsm(FakeSsm):
    def __init__(self, code: str, status: int) -> None:
        super().__init__()
        self.code, self.status_code = code, status

    def send_command(self, **kwargs: Any) -> dict[str, Any]:
        raise error(self.code, self.status_code)


class FailingEc2(FakeEc2):
    def __init__(self, code: str, status: int) -> None:
        super().__init__()
        self.code, self.status_code = code, status

    def get_paginator(self, name: str) -> Any:
        raise error(self.code, self.status_code)


@pytest.mark.parametrize("service", ["ssm", "ec2"])
@pytest.mark.parametrize(
    ("code", "status"),
    [("ThrottlingException", 400), ("AccessDeniedException", 403), ("InternalServerError", 500)],
)
def test_a_login_node_call_that_fails_is_reported_and_the_budget_stop_still_lands(
    slurm_stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch, service: str, code: str, status: int
) -> None:
    broken = FailingSsm(code, status) if service == "ssm" else FailingEc2(code, status)
    clients = {
        "pcs": slurm_stack["pcs"].client,
        "ssm": slurm_stack["ssm"],
        "ec2": slurm_stack["ec2"],
        service: broken,
    }
    monkeypatch.setattr(runtime.RUNTIME, "client", lambda s: clients.get(s) or shared_client(s))
    summary = budget_action.handler(BUDGET_EVENT, None)
    assert summary["hook"]["ok"] is False and code in json.dumps(summary["hook"])
    assert_budget_stopped(slurm_stack)  # EC2 refusing even the members' lookup does not block it


def test_the_spend_guard_and_the_lifetime_check_fail_when_ec2_hides_the_members(
    slurm_stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    clients = {
        "pcs": slurm_stack["pcs"].client,
        "ssm": slurm_stack["ssm"],
        "ec2": FailingEc2("AccessDeniedException", 403),
    }
    monkeypatch.setattr(runtime.RUNTIME, "client", lambda s: clients.get(s) or shared_client(s))
    strict = stops.stack_node_groups(strict_members=True)
    with pytest.raises(ClientError, match="AccessDenied"):
        strict.list_groups(STACK)  # pricing or dating no instance would pass for "nothing runs"
    assert [g.members for g in stops.stack_node_groups().list_groups(STACK)] == [(), ()]


# --- a stop while the node groups are UPDATING (right after a schedule start) --------------------

SLURM_BUDGET_TIMEOUT = BASE_TIMEOUT_SECONDS + PCS_ACTIVE_WAIT_SECONDS
"""The budget Lambda's timeout on a Slurm stack (`aws.guardrail_lambda`): base plus the wait for ACTIVE."""


class FakeTime:
    """RUNTIME's clock and sleep in fake seconds; the groups UPDATING turn ACTIVE `busy_seconds` in."""

    def __init__(self, fake: FakePcs, busy_seconds: float) -> None:
        self.fake, self.start, self.now = fake, 1000.0, 1000.0
        self.until = self.start + busy_seconds
        self.slept: list[float] = []
        for name in ("train", "infer"):
            fake.groups[name]["status"] = "UPDATING"

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.now >= self.until:
            for g in self.fake.groups.values():
                g["status"] = "ACTIVE" if g["status"] == "UPDATING" else g["status"]


class LambdaContext:
    """The Lambda context's remaining time, on the fake clock."""

    def __init__(self, t: FakeTime, timeout_seconds: float) -> None:
        self.t, self.end = t, t.now + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return int((self.end - self.t.now) * 1000)


def updating_for(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch, seconds: float) -> FakeTime:
    t = FakeTime(env["pcs"], seconds)
    monkeypatch.setattr(runtime.RUNTIME, "clock", t.clock)
    monkeypatch.setattr(runtime.RUNTIME, "sleep", t.sleep)
    return t


@pytest.mark.parametrize("minutes", [1, 3])
def test_a_budget_stop_meeting_a_group_updating_waits_for_active_then_stops(
    slurm_stack, monkeypatch, minutes: int
) -> None:
    t = updating_for(slurm_stack, monkeypatch, minutes * 60)
    summary = budget_action.handler(BUDGET_EVENT, LambdaContext(t, SLURM_BUDGET_TIMEOUT))
    assert summary["groups"] == ["infer", "train"]
    assert_budget_stopped(slurm_stack)
    assert minutes * 60 <= t.now - t.start < SLURM_BUDGET_TIMEOUT  # it waited, inside the handler's time
    waits = [s for s in t.slept if s >= BACKOFF_FIRST_SECONDS]
    assert waits[0] == BACKOFF_FIRST_SECONDS and max(waits) <= BACKOFF_MAX_SECONDS  # backoff, capped
    ops = [op for op, _ in slurm_stack["pcs"].calls]
    first_update = ops.index("UpdateComputeNodeGroup")
    assert "GetComputeNodeGroup" in ops[first_update:]  # it read the group's status while waiting


def test_a_group_updating_past_the_handlers_time_fails_the_invocation_and_the_retry_stops_it(
    slurm_stack, monkeypatch
) -> None:
    t = updating_for(slurm_stack, monkeypatch, 10 * 60)
    with pytest.raises(GuardrailError):
        budget_action.handler(BUDGET_EVENT, LambdaContext(t, SLURM_BUDGET_TIMEOUT))
    assert t.now - t.start <= SLURM_BUDGET_TIMEOUT  # it gave up before Lambda would kill it
    fake, table = slurm_stack["pcs"], slurm_stack["table"]
    assert fake.scaling("train") == (1, 4)  # not stopped, and the invocation failed: never "stopped"
    assert record(table, "train")["state"] == "stop-failed"
    t.sleep(t.until - t.now)  # the group turns ACTIVE; the schedule's retry (or the next tick) runs
    budget_action.handler(BUDGET_EVENT, LambdaContext(t, SLURM_BUDGET_TIMEOUT))
    assert_budget_stopped(slurm_stack)


def test_without_a_handlers_time_a_conflict_is_raised_at_once_and_a_deleted_group_is_a_state_conflict(
    table: str, monkeypatch
) -> None:
    fake = FakePcs()
    t = FakeTime(fake, 60)
    monkeypatch.setattr(runtime.RUNTIME, "clock", t.clock)
    monkeypatch.setattr(runtime.RUNTIME, "sleep", t.sleep)
    with pytest.raises(ClientError, match="ConflictException"):
        PcsCapacity(fake.client, CLUSTER, STACK).resize("train", 0, 0)
    assert t.slept == []
    capacity = PcsCapacity(fake.client, CLUSTER, STACK, deadline=t.now + 600)
    fake.meanwhile["GetComputeNodeGroup"] = lambda: fake.groups["train"].update(status="DELETING")
    with pytest.raises(nodegroups.StateConflict, match="DELETING"):
        capacity.resize("train", 0, 0)
    assert fake.scaling("train") == (1, 4)


def test_the_handlers_deadline_keeps_its_reserve(monkeypatch) -> None:
    assert invocation_deadline(None) is None  # outside Lambda (the CLI): no wait
    t = FakeTime(FakePcs(), 0)
    monkeypatch.setattr(runtime.RUNTIME, "clock", t.clock)
    assert invocation_deadline(LambdaContext(t, 120)) == t.now + 120 - 15


# --- `gpucluster stop` meeting a node group UPDATING: it waits as the Lambdas do (#34 item 9) -------


@pytest.mark.parametrize("minutes", [1, 3])
def test_the_cli_stop_meeting_a_group_updating_waits_for_active_then_stops(
    ops_stack, monkeypatch, minutes: int
) -> None:
    from gpucluster.ops.stopstart import apply_stop, plan_stop_on

    plan = plan_stop_on(ops_fleet(ops_stack), hook_timeout_seconds=45)
    t = updating_for(ops_stack, monkeypatch, minutes * 60)
    report = apply_stop(plan).report
    assert sorted(report.changed) == ["infer", "train"] and report.errors == {}
    fake = ops_stack["pcs"]
    assert fake.scaling("train") == (0, 0) and fake.scaling("infer") == (0, 0)
    assert minutes * 60 <= t.now - t.start <= 2 * PCS_ACTIVE_WAIT_SECONDS
    waits = [s for s in t.slept if s >= BACKOFF_FIRST_SECONDS]
    assert waits[0] == BACKOFF_FIRST_SECONDS and max(waits) <= BACKOFF_MAX_SECONDS


def test_the_cli_stop_gives_up_past_its_wait_and_reports_the_group_not_stopped(
    ops_stack, monkeypatch
) -> None:
    from gpucluster.ops.stopstart import apply_stop, plan_stop_on

    plan = plan_stop_on(ops_fleet(ops_stack), hook_timeout_seconds=45)
    t = updating_for(ops_stack, monkeypatch, 10 * 60)
    report = apply_stop(plan).report
    assert set(report.errors) == {"infer", "train"}
    assert all("ConflictException" in e for e in report.errors.values())
    assert ops_stack["pcs"].scaling("train") == (1, 4)  # never said stopped while it runs
    # each group waits its own 300 s
    assert t.now - t.start <= 2 * PCS_ACTIVE_WAIT_SECONDS + BACKOFF_MAX_SECONDS
    assert record(ops_stack["state_table"], "train")["state"] == "stop-failed"
