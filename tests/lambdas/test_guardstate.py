"""The stored backend (`guardstate`) in one moto account: each race of issue 24 as an explicit interleaving.

moto's DynamoDB honours ConditionExpression, so a write decided on a stale read
fails as it would in AWS. Each race runs a second actor from inside the first
one, at the point named (between its read and its write, between its state
write and its capacity change), then checks the end state: the budget stop
holds (capacity zero, stopped by budget, the capacity before recorded), no stop
record is lost, and the other stack's group is untouched.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from test_races import Interposed

from conftest import Cluster, Recorded, shared_client
from gpucluster.fleet import guardstate, nodegroups, runtime, stops
from gpucluster.fleet.asg import AutoScalingGroups
from gpucluster.fleet.deployment import STATE_TABLE_ENV
from gpucluster.fleet.nodegroups import BUDGET, IDLE, MANUAL, SCHEDULE, StateConflict
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, STOPPED_BY_TAG
from gpucluster.lambdas import budget_action

BUDGET_EVENT = {"Records": [{"EventSource": "aws:sns", "Sns": {
    "Type": "Notification", "Subject": "AWS Budgets: exceeded", "Message": "ACTUAL Amount: $104.17",
    "TopicArn": "arn:aws:sns:us-east-1:123456789012:gpucluster-dev-budget-action"}}]}


def create_table(dynamodb: Any, name: str | None = None) -> str:
    """The table as the stack builds it (key schema: stack, group), under a fresh name per test."""
    name = name or f"guard-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "stack", "KeyType": "HASH"},
                   {"AttributeName": "group", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "stack", "AttributeType": "S"},
                              {"AttributeName": "group", "AttributeType": "S"}])
    return name


@pytest.fixture
def table(cluster: Cluster) -> Iterator[str]:
    yield create_table(shared_client("dynamodb"))


def backend(table: str, autoscaling: Any = None, actor: str = "test") -> guardstate.StoredNodeGroups:
    return guardstate.StoredNodeGroups(autoscaling or shared_client("autoscaling"), shared_client("dynamodb"),
                                       table, actor=actor)


def record(table: str, name: str, stack: str = "dev") -> dict[str, Any] | None:
    key = {"stack": {"S": stack}, "group": {"S": name}}
    item = shared_client("dynamodb").get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
    if item is None:
        return None
    return {k: next(iter(v.values())) for k, v in item.items()}


def read(table: str, name: str) -> nodegroups.NodeGroup:
    return backend(table).read_groups([name])[0]


def assert_budget_stop_holds(cluster: Cluster, table: str, name: str, desired_before: int) -> None:
    assert cluster.capacity(name)[1] == 0
    rec = record(table, name)
    assert rec is not None and rec["state"] == "stopped" and rec["stopped_by"] == BUDGET
    assert rec["previous_desired"] == str(desired_before)
    assert cluster.capacity("prod-train") == (1, 1) and record(table, "prod-train", "prod") is None


def test_stop_records_the_capacity_once_and_restore_puts_it_back(cluster: Cluster, table: str) -> None:
    b = backend(table)
    assert b.stop(read(table, "dev-train"), IDLE) == nodegroups.STOPPED
    rec = record(table, "dev-train")
    assert rec is not None
    assert (rec["state"], rec["stopped_by"], rec["previous_desired"], rec["previous_min"], rec["version"],
            rec["notified"]) == ("stopped", IDLE, "2", "1", "2", False)
    assert cluster.capacity("dev-train") == (0, 0)
    assert cluster.tags("dev-train")[STOPPED_BY_TAG] == IDLE  # mirrored for a person
    # A second stop finds it stopped: the recorded capacity (2) is never overwritten with 0.
    assert b.stop(read(table, "dev-train"), SCHEDULE) == nodegroups.ALREADY_STOPPED
    assert record(table, "dev-train")["previous_desired"] == "2"
    result = b.restore(read(table, "dev-train"))
    assert (result.action, result.min_size, result.desired_capacity) == ("resumed", 1, 2)
    assert cluster.capacity("dev-train") == (1, 2)
    assert record(table, "dev-train")["state"] == "running"
    assert STOPPED_BY_TAG not in cluster.tags("dev-train")
    assert read(table, "dev-train").stopped_by is None


def test_the_tags_only_mirror_the_record(cluster: Cluster, table: str) -> None:
    b = backend(table)
    b.stop(read(table, "dev-train"), BUDGET)
    # Someone edits the mirror tag in the console: the record decides, the budget stop holds.
    AutoScalingGroups(cluster.autoscaling).relabel(read(table, "dev-train"), SCHEDULE, nodegroups.StopState())
    assert cluster.tags("dev-train")[STOPPED_BY_TAG] == SCHEDULE
    assert read(table, "dev-train").stopped_by == BUDGET
    assert b.restore(read(table, "dev-train"), only_stopped_by=[SCHEDULE]).action == "skipped"
    assert cluster.capacity("dev-train") == (0, 0)


def test_a_start_that_read_an_idle_stop_does_not_undo_a_budget_stop_landing_before_its_write(
        cluster: Cluster, table: str) -> None:
    b = backend(table)
    b.stop(read(table, "dev-train"), IDLE)
    stale = read(table, "dev-train")  # the schedule start reads: stopped by idle
    assert b.stop(read(table, "dev-train"), BUDGET) == nodegroups.ESCALATED  # budget lands now
    result = b.restore(stale, only_stopped_by=[IDLE, SCHEDULE])
    assert result.action == "skipped" and "now stopped by budget" in result.reason
    assert_budget_stop_holds(cluster, table, "dev-train", 2)


def test_a_budget_stop_landing_between_a_starts_record_and_its_capacity_change_wins(
        cluster: Cluster, table: str) -> None:
    b = backend(table)
    b.stop(read(table, "dev-train"), SCHEDULE)
    stale = read(table, "dev-train")
    outcomes: list[str] = []
    # The start wrote `starting`; before its UpdateAutoScalingGroup lands, the budget stops the group.
    client = Interposed(cluster.autoscaling, "update_auto_scaling_group",
                        lambda: outcomes.append(backend(table).stop(read(table, "dev-train"), BUDGET)),
                        when=lambda kwargs: kwargs["DesiredCapacity"] > 0)
    result = backend(table, client).restore(stale)
    assert outcomes == [nodegroups.STOPPED]
    assert result.action == "skipped" and result.stopped_by == BUDGET
    # The start's capacity change landed after the budget's, and was taken back.
    assert_budget_stop_holds(cluster, table, "dev-train", 2)


def test_a_stale_read_never_turns_a_budget_stop_into_an_idle_stop(cluster: Cluster, table: str) -> None:
    b = backend(table)
    stale = read(table, "dev-train")  # the idle handler reads: running, nothing recorded
    assert b.stop(read(table, "dev-train"), BUDGET) == nodegroups.STOPPED  # the budget lands first
    assert b.stop(stale, IDLE) == nodegroups.ALREADY_STOPPED  # its write loses, it reads again
    assert_budget_stop_holds(cluster, table, "dev-train", 2)


def test_an_idle_stop_in_flight_is_escalated_by_a_budget_stop_and_keeps_its_capacity(
        cluster: Cluster, table: str) -> None:
    # Budget reads `stopping` (idle wrote its record, its capacity change not landed yet).
    client = Interposed(cluster.autoscaling, "update_auto_scaling_group",
                        lambda: backend(table).stop(read(table, "dev-train"), BUDGET))
    assert backend(table, client).stop(read(table, "dev-train"), IDLE) == nodegroups.STOPPED
    assert_budget_stop_holds(cluster, table, "dev-train", 2)


def test_scale_cannot_undo_a_budget_stop_landing_after_its_read(cluster: Cluster, table: str) -> None:
    b = backend(table)
    with pytest.raises(StateConflict, match="stopped"):
        b.stop(read(table, "dev-train"), BUDGET)
        b.set_capacity("dev-train", 1, 3)  # scale read "running" before; now refused
    assert_budget_stop_holds(cluster, table, "dev-train", 2)
    b.restore(read(table, "dev-train"))
    # Now between scale's `starting` record and its capacity change.
    client = Interposed(cluster.autoscaling, "update_auto_scaling_group",
                        lambda: backend(table).stop(read(table, "dev-train"), BUDGET),
                        when=lambda kwargs: kwargs["DesiredCapacity"] == 3)
    with pytest.raises(StateConflict, match="stopped while scaling"):
        backend(table, client).set_capacity("dev-train", 1, 3)
    assert cluster.capacity("dev-train") == (0, 0)
    rec = record(table, "dev-train")
    assert rec is not None and (rec["state"], rec["stopped_by"]) == ("stopped", BUDGET)
    assert rec["previous_desired"] == "3"  # the start's target, recorded once: resume gives back 3


def test_a_group_stopped_by_tags_before_the_table_still_resumes(cluster: Cluster, table: str) -> None:
    tags = AutoScalingGroups(cluster.autoscaling)
    tags.stop(tags.read_groups(["dev-train"])[0], MANUAL)
    group = read(table, "dev-train")
    assert (group.stopped_by, group.stop.version) == (MANUAL, None)  # read from the tags, once
    result = backend(table).restore(group)
    assert (result.action, result.desired_capacity) == ("resumed", 2)
    assert cluster.capacity("dev-train") == (1, 2)
    assert record(table, "dev-train")["state"] == "running"
    assert PREVIOUS_DESIRED_TAG not in cluster.tags("dev-train")


def test_a_budget_stop_records_a_tag_stop_and_escalates_it(cluster: Cluster, table: str) -> None:
    tags = AutoScalingGroups(cluster.autoscaling)
    tags.stop(tags.read_groups(["dev-train"])[0], IDLE)
    assert backend(table).stop(read(table, "dev-train"), BUDGET) == nodegroups.ESCALATED
    assert_budget_stop_holds(cluster, table, "dev-train", 2)


class Failing:
    """An Auto Scaling client whose UpdateAutoScalingGroup fails with `code` `times` times."""

    def __init__(self, real: Any, code: str, times: int) -> None:
        self.real, self.code, self.times = real, code, times

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if name != "update_auto_scaling_group":
            return attr

        def call(**kwargs: Any) -> Any:
            if self.times > 0:
                self.times -= 1
                raise ClientError({"Error": {"Code": self.code, "Message": "injected"}}, name)
            return attr(**kwargs)

        return call


@pytest.mark.parametrize("code", ["Throttling", "InternalFailure", "AccessDenied"])
def test_a_stop_whose_capacity_change_fails_says_stop_failed_then_a_retry_stops(
        cluster: Cluster, table: str, code: str) -> None:
    failing = backend(table, Failing(cluster.autoscaling, code, 1))
    report = stops.stop_groups(failing, [read(table, "dev-train")], BUDGET)
    assert code in report.errors["dev-train"]
    assert cluster.capacity("dev-train") == (1, 2)
    group = read(table, "dev-train")
    assert (group.stop.state, group.stopped_by, group.stop.previous_desired) == ("stop-failed", BUDGET, "2")
    # The retry (Lambda's, or the next check) finds stop-failed and stops it, capacity recorded once.
    assert failing.stop(read(table, "dev-train"), BUDGET) == nodegroups.STOPPED
    assert_budget_stop_holds(cluster, table, "dev-train", 2)


# --- the budget handler on the stored backend: told once, retried, two at once -----------------


@pytest.fixture
def stored_env(monkeypatch: pytest.MonkeyPatch, table: str, cluster: Cluster, recorded: Recorded) -> str:
    monkeypatch.setenv(STATE_TABLE_ENV, table)
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    return table


class DownSNS:
    """SNS that fails its first `times` publishes, then records."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.published: list[dict[str, Any]] = []

    def publish(self, **kwargs: Any) -> dict[str, str]:
        if self.times > 0:
            self.times -= 1
            raise ClientError({"Error": {"Code": "InternalError", "Message": "injected 5xx"}}, "Publish")
        self.published.append(kwargs)
        return {"MessageId": "m"}


def test_the_handler_picks_the_stored_backend_from_its_environment(stored_env: str) -> None:
    assert isinstance(stops.stack_node_groups(), guardstate.StoredNodeGroups)


def test_a_failed_publish_fails_the_invocation_and_the_retry_tells_once(
        stored_env: str, cluster: Cluster, recorded: Recorded) -> None:
    sns = DownSNS(times=1)
    recorded.fakes["sns"] = sns
    with pytest.raises(runtime.NotifyError):
        budget_action.handler(BUDGET_EVENT, None)
    assert_budget_stop_holds(cluster, stored_env, "dev-train", 2)
    assert record(stored_env, "dev-train")["notified"] is False
    retried = budget_action.handler(BUDGET_EVENT, None)  # Lambda's retry: the work is done already
    assert retried["action"] == "unchanged" and retried["untold"] == ["dev-infer", "dev-train"]
    assert len(sns.published) == 1
    assert record(stored_env, "dev-train")["notified"] is True
    budget_action.handler(BUDGET_EVENT, None)  # a third run has nothing left to tell
    assert len(sns.published) == 1


@pytest.mark.parametrize("kill_before", range(1, 8))
def test_a_kill_before_call_n_then_a_retry_equals_one_run(
        stored_env: str, cluster: Cluster, recorded: Recorded, kill_before: int) -> None:
    """The invocation dies right before its n-th DynamoDB or Auto Scaling write; Lambda runs it again."""
    writes = {"put_item", "update_auto_scaling_group", "create_or_update_tags"}
    count = {"n": 0}

    class Killed(BaseException):
        pass

    def dying(service: str) -> Any:
        real = shared_client(service)

        class Client:
            def __getattr__(self, name: str) -> Any:
                attr = getattr(real, name)
                if name not in writes:
                    return attr

                def call(**kwargs: Any) -> Any:
                    count["n"] += 1
                    if count["n"] == kill_before:
                        raise Killed
                    return attr(**kwargs)

                return call

        return Client()

    sns = DownSNS(times=0)
    recorded.fakes.update({"autoscaling": dying("autoscaling"), "dynamodb": dying("dynamodb"), "sns": sns})
    with pytest.raises(Killed):
        budget_action.handler(BUDGET_EVENT, None)
    recorded.fakes.update({service: shared_client(service) for service in ("autoscaling", "dynamodb")})
    budget_action.handler(BUDGET_EVENT, None)
    assert_budget_stop_holds(cluster, stored_env, "dev-train", 2)
    rec = record(stored_env, "dev-infer")
    assert rec is not None and (rec["state"], rec["stopped_by"], rec["previous_desired"]) == (
        "stopped", BUDGET, "1")
    assert len(sns.published) == 1  # told exactly once across the killed run and the retry
    assert record(stored_env, "dev-train")["notified"] is True


def test_two_budget_invocations_at_once_stop_once_and_record_once(
        stored_env: str, cluster: Cluster, recorded: Recorded) -> None:
    sns = DownSNS(times=0)
    recorded.fakes["sns"] = sns
    inner: list[Any] = []
    recorded.fakes["autoscaling"] = Interposed(
        shared_client("autoscaling"), "update_auto_scaling_group",
        lambda: inner.append(budget_action.handler(BUDGET_EVENT, None)))
    # The inner invocation runs with the same interposed client, already spent: a plain second actor.
    outer = budget_action.handler(BUDGET_EVENT, None)
    assert_budget_stop_holds(cluster, stored_env, "dev-train", 2)
    assert record(stored_env, "dev-infer")["previous_desired"] == "1"
    # The inner one found dev-infer `stopping` (the outer's record, its capacity change not landed)
    # and finished that stop itself, as it must for an actor that may have died; the capacity
    # recorded is still the one the first stop found, and each group's stop was told.
    assert set(outer["groups"]) | set(inner[0]["groups"]) == {"dev-infer", "dev-train"}
    assert outer["outcomes"]["dev-train"] in (nodegroups.STOPPED, nodegroups.ALREADY_STOPPED)
    assert all(record(stored_env, g)["notified"] is True for g in ("dev-infer", "dev-train"))


def test_ops_pick_the_stored_backend_when_the_stack_has_its_table(cluster: Cluster) -> None:
    from gpucluster.fleet.deployment import state_table_name
    from gpucluster.ops import Clients
    from gpucluster.ops.nodegroups import deployment_node_groups

    dynamodb = shared_client("dynamodb")
    clients = Clients("us-east-1",
                      make=lambda s: cluster.autoscaling if s == "autoscaling" else shared_client(s))
    assert isinstance(deployment_node_groups("dev", "none", clients), AutoScalingGroups)
    name = state_table_name("dev")
    create_table(dynamodb, name)
    try:
        chosen = deployment_node_groups("dev", "none", clients)
        assert isinstance(chosen, guardstate.StoredNodeGroups) and chosen.table == name
    finally:
        dynamodb.delete_table(TableName=name)  # test cleanup in the fake account


def test_state_table_names_are_valid_and_apart() -> None:
    from gpucluster.fleet.deployment import state_table_name

    a = state_table_name("organization/gpucluster/dev/gpu-dev")
    b = state_table_name("organization-gpucluster-dev-gpu-dev")
    assert a != b and a.startswith("gpucluster-guard-organization-gpucluster-dev-gpu-dev-")
    assert all(c.isalnum() or c in "_.-" for c in a) and 3 <= len(a) <= 255
    assert len(state_table_name("x" * 400)) <= 255


def test_status_says_stop_failed_never_stopped(cluster: Cluster) -> None:
    from gpucluster.cli.fleet import render_status
    from gpucluster.fleet.deployment import state_table_name
    from gpucluster.ops import Clients
    from gpucluster.ops.nodegroups import Fleet, deployment_node_groups
    from gpucluster.ops.status import stack_status

    dynamodb = shared_client("dynamodb")
    name = state_table_name("dev")
    create_table(dynamodb, name)
    try:
        failing = backend(name, Failing(cluster.autoscaling, "Throttling", 1))
        stops.stop_groups(failing, [read(name, "dev-train")], BUDGET)
        clients = Clients("us-east-1",
                      make=lambda s: cluster.autoscaling if s == "autoscaling" else shared_client(s))
        fleet = Fleet("dev", clients, deployment_node_groups("dev", "none", clients))
        rows = {r.name: r for r in stack_status(fleet)}
        assert rows["dev-train"].state == "stop-failed" and rows["dev-train"].desired_capacity == 2
        text = "\n".join(render_status(list(rows.values())))
        assert "budget (stop failed)" in text
        assert "stop failed on dev-train: still running" in text
    finally:
        dynamodb.delete_table(TableName=name)  # test cleanup in the fake account


# --- every call of a budget stop, failing before or after it lands, then Lambda's retries ----------

FAULTS = [("before", "Throttling"), ("before", "InternalError"), ("before", "AccessDeniedException"),
          ("after", "ReadTimeout")]


class Faulty:
    """botocore event hooks on the Auto Scaling, DynamoDB and SNS clients: every call is counted
    (paginated describes too); call number `at` fails as `fault` says.

    "before": an AWS error and the call never lands; "after": the call lands, then the answer is
    lost (a read timeout), as when Lambda's network drops the response.
    """

    SERVICES = ("autoscaling", "dynamodb", "sns")

    def __init__(self, at: int, fault: tuple[str, str]) -> None:
        self.at, self.fault, self.n = at, fault, 0
        self.published = 0

    def before(self, model: Any, **_: Any) -> None:
        self.n += 1
        when, code = self.fault
        if self.n == self.at and when == "before":
            raise ClientError({"Error": {"Code": code, "Message": "injected"}}, model.name)

    def after(self, model: Any, **_: Any) -> None:
        if model.name == "Publish":
            self.published += 1
        if self.n == self.at and self.fault[0] == "after":
            raise ReadTimeoutError(endpoint_url=f"https://{model.service_model.service_name}")

    def __enter__(self) -> Faulty:
        for service in self.SERVICES:
            events = shared_client(service).meta.events
            events.register("before-call", self.before, unique_id=f"faulty-before-{service}")
            events.register("after-call", self.after, unique_id=f"faulty-after-{service}")
        return self

    def __exit__(self, *_: Any) -> None:
        for service in self.SERVICES:
            events = shared_client(service).meta.events
            events.unregister("before-call", unique_id=f"faulty-before-{service}")
            events.unregister("after-call", unique_id=f"faulty-after-{service}")


def test_a_clean_budget_run_makes_the_calls_the_fault_matrix_covers(
        stored_env: str, cluster: Cluster, recorded: Recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    with Faulty(at=0, fault=("before", "none")) as faulty:
        budget_action.handler(BUDGET_EVENT, None)
    assert faulty.n == CLEAN_RUN_CALLS  # if this moves, move the matrix below with it
    assert faulty.published == 1


# list: a describe and a query (2); per group: put stopping, update, put stopped, mirror tags (8);
# confirm: a describe and a get per group (3); publish (1); told: a describe, a get and a put per
# group (5).
CLEAN_RUN_CALLS = 19


@pytest.mark.parametrize("fault", FAULTS, ids=[f"{w}-{c}" for w, c in FAULTS])
@pytest.mark.parametrize("at", range(1, CLEAN_RUN_CALLS + 1))
def test_any_call_failing_then_lambdas_retries_leave_the_budget_stop_whole_and_told(
        stored_env: str, cluster: Cluster, recorded: Recorded, monkeypatch: pytest.MonkeyPatch,
        at: int, fault: tuple[str, str]) -> None:
    failures = 0
    with Faulty(at, fault) as faulty:
        for _ in range(3):  # the invocation and Lambda's two asynchronous retries
            try:
                budget_action.handler(BUDGET_EVENT, None)
                break
            except Exception:
                failures += 1
        else:
            pytest.fail("three invocations did not finish the budget stop")
    assert failures <= 1  # one injected fault costs at most one invocation
    assert_budget_stop_holds(cluster, stored_env, "dev-train", 2)
    rec = record(stored_env, "dev-infer")
    assert rec is not None and (rec["state"], rec["stopped_by"], rec["previous_desired"]) == (
        "stopped", BUDGET, "1")
    # Told at least once and recorded as told; at most once per invocation (a retry after a partial
    # failure tells what it finished, which the failed invocation's message listed as an error).
    assert 1 <= faulty.published <= failures + 1
    assert all(record(stored_env, g)["notified"] is True for g in ("dev-infer", "dev-train"))
