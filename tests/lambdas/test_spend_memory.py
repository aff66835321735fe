"""The spend guard's memory in the guard-state table and its told flags (issue 35 items 1.4, 1.5, 2, 3).

- Cost Explorer answers that are not figures fail the invocation, never read as $0.
- The settled figure is kept per UTC date: at most four Cost Explorer reads a day, none while no
  compute runs; the kept figure's own reads and writes under throttling, AccessDenied, 5xx, a
  timeout (a failed read falls back to Cost Explorer, a failed write is logged).
- The instance ledger: every tick records the stack's instances; instances gone since the settled
  point are priced without Auto Scaling metrics, on a Slurm stack too; two ticks at once, a kill
  and retry, and faults on its calls.
- Each stop and start told once: the spend guard's retry at zero re-sends an untold budget stop, the
  schedule's start and the lifetime stop keep the flag and their retries tell what was not told.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.stub import Stubber
from test_guardstate import DownSNS, backend, create_table, record
from test_pcs_capacity import CLUSTER, FakeEc2, FakePcs, FakeSsm
from test_spend_guard import PRICES

from conftest import STACK, Cluster, Recorded, shared_client
from gpucluster import guardcost
from gpucluster.fleet import guardstate, runtime, settledcache, spendguard, stops
from gpucluster.fleet.accrual import ON_DEMAND, Instance, Prices
from gpucluster.fleet.deployment import STATE_TABLE_ENV
from gpucluster.fleet.instanceledger import InstanceLedger, gone_hours
from gpucluster.fleet.nodegroups import BUDGET, LIFETIME, SCHEDULE
from gpucluster.lambdas import autostop, spend_guard

FAULTS = [("ThrottlingException", 400), ("AccessDeniedException", 403), ("InternalServerError", 500)]


def client_error(code: str, status: int, op: str = "Call") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "injected"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, op)


def timeout() -> ReadTimeoutError:
    return ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")


class CountingCe:
    """Cost Explorer answering `usd` to every GetCostAndUsage, counting the calls."""

    def __init__(self, usd: float = 10.0) -> None:
        self.usd, self.calls = usd, 0

    def get_cost_and_usage(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        return {"ResultsByTime": [{"Total": {"UnblendedCost": {"Amount": f"{self.usd:.4f}", "Unit": "USD"}}}]}


class KeyFaults:
    """DynamoDB whose calls on the item with sort key `key` fail with `error` (`times` times)."""

    def __init__(self, key: str, methods: tuple[str, ...], error: BaseException, times: int = 1_000) -> None:
        self.real, self.key, self.methods = shared_client("dynamodb"), key, methods
        self.error, self.left = error, times

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if name not in self.methods:
            return attr

        def call(**kwargs: Any) -> Any:
            group = (kwargs.get("Key") or kwargs.get("Item") or {}).get("group", {}).get("S")
            if group == self.key and self.left > 0:
                self.left -= 1
                raise self.error
            return attr(**kwargs)

        return call


# --- class 5: answers that are not figures ------------------------------------------------------

NOT_FIGURES = {
    "no rows": {"ResultsByTime": []},
    "no Total": {"ResultsByTime": [{"TimePeriod": {"Start": "2026-11-01", "End": "2026-11-19"}}]},
    "empty Total": {"ResultsByTime": [{"Total": {}}]},
    "empty Amount": {"ResultsByTime": [{"Total": {"UnblendedCost": {"Amount": "", "Unit": "USD"}}}]},
    "no Amount": {"ResultsByTime": [{"Total": {"UnblendedCost": {"Unit": "USD"}}}]},
    "another metric": {"ResultsByTime": [{"Total": {"BlendedCost": {"Amount": "5.0", "Unit": "USD"}}}]},
    "not a number": {"ResultsByTime": [{"Total": {"UnblendedCost": {"Amount": "n/a", "Unit": "USD"}}}]},
    "NaN": {"ResultsByTime": [{"Total": {"UnblendedCost": {"Amount": "NaN", "Unit": "USD"}}}]},
}


@pytest.mark.parametrize("answer", NOT_FIGURES.values(), ids=NOT_FIGURES.keys())
def test_an_answer_that_is_not_a_figure_is_an_error_never_zero(answer: dict[str, Any]) -> None:
    ce = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(ce)
    stub.add_response("get_cost_and_usage", answer)
    stub.activate()
    with pytest.raises(spendguard.CostAnswerError):
        spendguard.settled_cost(ce, "dev", datetime(2026, 11, 20, 9, tzinfo=UTC))


def test_a_zero_figure_is_a_figure() -> None:
    ce = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(ce)
    stub.add_response("get_cost_and_usage", {"ResultsByTime": [{"Total": {"UnblendedCost": {
        "Amount": "0", "Unit": "USD"}}}]})
    stub.activate()
    assert spendguard.settled_cost(ce, "dev", datetime(2026, 11, 20, 9, tzinfo=UTC)) == 0.0


@pytest.mark.parametrize("answer", [NOT_FIGURES["no Total"], NOT_FIGURES["another metric"]],
                         ids=["no Total", "another metric"])
def test_the_handler_fails_on_a_non_figure_and_changes_nothing(cluster, recorded, monkeypatch,
                                                               answer) -> None:
    class Answers:
        def get_cost_and_usage(self, **kwargs: Any) -> dict[str, Any]:
            return answer

    monkeypatch.setenv("LIMIT_USD", "100")
    monkeypatch.setenv("PRICES_JSON", json.dumps(PRICES))
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: datetime(2026, 11, 20, 9, tzinfo=UTC))
    recorded.fakes["ce"] = Answers()
    with pytest.raises(runtime.GuardrailError, match=r"could not read spend: Cost Explorer"):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train") == (1, 2)


# --- item 2: the settled figure kept per UTC date ------------------------------------------------


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch, cluster: Cluster, recorded: Recorded) -> str:
    table = create_table(shared_client("dynamodb"))
    monkeypatch.setenv(STATE_TABLE_ENV, table)
    monkeypatch.setenv("LIMIT_USD", "100000")
    monkeypatch.setenv("PRICES_JSON", json.dumps(PRICES))
    monkeypatch.setenv("CHECK_MINUTES", "5")
    monkeypatch.delenv("MAX_USD_PER_HOUR", raising=False)
    return table


def test_cost_explorer_is_read_at_most_four_times_a_day(stored, recorded, monkeypatch) -> None:
    ce = CountingCe()
    recorded.fakes["ce"] = ce
    start = datetime(2026, 11, 20, 20, 2, tzinfo=UTC)
    now = [start]
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: now[0])
    per_day: dict[str, int] = {}
    for _ in range(30 * 2):  # 30 hours, a check every 30 minutes (the cache sees any cadence alike)
        before = ce.calls
        assert spend_guard.handler({}, None)["action"] == "unchanged"
        day = now[0].date().isoformat()
        per_day[day] = per_day.get(day, 0) + ce.calls - before
        now[0] += timedelta(minutes=30)
    # 20:02 -> read; the new date at 00:02 -> read; then 06:32, 13:02, 19:32, each past the 6 h mark.
    assert per_day == {"2026-11-20": 1, "2026-11-21": settledcache.READS_PER_DAY_MAX, "2026-11-22": 1}


def test_no_cost_explorer_read_while_no_compute_runs(stored, cluster, recorded) -> None:
    for name in ("dev-train", "dev-infer"):
        cluster.autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, DesiredCapacity=0)
    ce = CountingCe()
    recorded.fakes["ce"] = ce
    result = spend_guard.handler({}, None)
    assert result["action"] == "unchanged" and result["spend"] is None
    assert ce.calls == 0


@pytest.mark.parametrize(("code", "status"), FAULTS)
def test_a_kept_figure_that_cannot_be_read_is_read_from_cost_explorer(stored, recorded, code,
                                                                      status) -> None:
    ce = CountingCe()
    recorded.fakes["ce"] = ce
    spend_guard.handler({}, None)
    assert ce.calls == 1
    error = client_error(code, status)
    recorded.fakes["dynamodb"] = KeyFaults(settledcache.SETTLED_KEY, ("get_item",), error)
    assert spend_guard.handler({}, None)["action"] == "unchanged"
    assert ce.calls == 2  # the figure is what matters: read again, never taken as $0


def test_a_kept_figure_read_that_times_out_is_read_from_cost_explorer() -> None:
    faulty = KeyFaults(settledcache.SETTLED_KEY, ("get_item",), timeout())
    cache = settledcache.SettledCache(faulty, "t", "dev")
    ce = CountingCe(42.0)
    now = datetime(2026, 11, 20, 9, tzinfo=UTC)
    read = lambda: spendguard.settled_cost(ce, "dev", now)  # noqa: E731
    assert settledcache.settled_figure(read, cache, now) == (42.0, True)


@pytest.mark.parametrize(("code", "status"), FAULTS)
def test_a_kept_figure_that_cannot_be_written_still_decides(stored, cluster, recorded, monkeypatch,
                                                            code, status) -> None:
    monkeypatch.setenv("LIMIT_USD", "100")
    recorded.fakes["ce"] = CountingCe(150.0)
    error = client_error(code, status)
    recorded.fakes["dynamodb"] = KeyFaults(settledcache.SETTLED_KEY, ("put_item",), error)
    assert spend_guard.handler({}, None)["action"] == "stopped"
    assert cluster.capacity("dev-train") == (0, 0)


def test_a_kept_figure_expires_with_the_date_and_after_six_hours(moto_account) -> None:
    table = create_table(shared_client("dynamodb"))
    cache = settledcache.SettledCache(shared_client("dynamodb"), table, "dev")
    t = datetime(2026, 11, 20, 1, tzinfo=UTC)
    cache.put(t, 12.5)
    assert cache.get(t + timedelta(hours=5, minutes=59)) == 12.5
    assert cache.get(t + timedelta(hours=6, minutes=1)) is None
    late = datetime(2026, 11, 20, 23, 50, tzinfo=UTC)
    cache.put(late, 7.0)
    assert cache.get(late + timedelta(minutes=5)) == 7.0
    assert cache.get(late + timedelta(minutes=15)) is None  # a new UTC date: a new settled period
    assert cache.get(t - timedelta(hours=1)) is None  # a clock before the read: not trusted


# --- item 3: the instance ledger ------------------------------------------------------------------


def inst(iid: str, launched: datetime, group: str = "train", kind: str = "p5.48xlarge") -> Instance:
    return Instance(iid, kind, ON_DEMAND, launched, group, "us-east-1a")


def test_instances_gone_since_the_settled_point_are_priced_from_the_ledger(moto_account) -> None:
    table = create_table(shared_client("dynamodb"))
    ledger = InstanceLedger(shared_client("dynamodb"), table, "dev")
    since = datetime(2026, 11, 19, tzinfo=UTC)
    yesterday = datetime(2026, 11, 19, 8, tzinfo=UTC)
    nodes = [inst(f"i-{n}", yesterday) for n in range(4)]
    ledger.record(nodes, yesterday, since)
    ledger.record(nodes, yesterday + timedelta(hours=12), since)  # last seen 20:00
    ledger.record([], datetime(2026, 11, 20, 10, tzinfo=UTC), since)
    known, _ = ledger.read()
    gone = gone_hours(known, [], since, datetime(2026, 11, 20, 10, tzinfo=UTC), 300)
    assert [round(h, 3) for _, h in gone] == [12.083] * 4  # to the last sighting plus one check
    # An instance last seen before the settled point is in the settled figure: dropped.
    ledger.record([], datetime(2026, 11, 21, 10, tzinfo=UTC), datetime(2026, 11, 20, tzinfo=UTC))
    assert ledger.read()[0] == {}


def test_two_ticks_at_once_keep_both_sightings(moto_account) -> None:
    table = create_table(shared_client("dynamodb"))
    a = InstanceLedger(shared_client("dynamodb"), table, "dev")
    b = InstanceLedger(shared_client("dynamodb"), table, "dev")
    now, since = datetime(2026, 11, 20, 10, tzinfo=UTC), datetime(2026, 11, 19, tzinfo=UTC)
    read_by_a = a.read()
    b.record([inst("i-b", now)], now, since)
    a.record([inst("i-a", now)], now, since, read_by_a)  # its conditional write loses: merged again
    assert sorted(a.read()[0]) == ["i-a", "i-b"]


@pytest.mark.parametrize("error", [client_error(c, s) for c, s in FAULTS] + [timeout()],
                         ids=[c for c, _ in FAULTS] + ["timeout"])
def test_a_ledger_write_refused_fails_the_invocation_after_the_stop(stored, cluster, recorded, monkeypatch,
                                                                     error) -> None:
    from gpucluster.fleet.instanceledger import LEDGER_KEY

    monkeypatch.setenv("LIMIT_USD", "100")
    recorded.fakes["ce"] = CountingCe(150.0)
    recorded.fakes["dynamodb"] = KeyFaults(LEDGER_KEY, ("put_item",), error)
    with pytest.raises(runtime.GuardrailError, match="instances not recorded"):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train") == (0, 0)  # the decision came first


@pytest.mark.parametrize("error", [client_error(c, s) for c, s in FAULTS] + [timeout()],
                         ids=[c for c, _ in FAULTS] + ["timeout"])
def test_a_ledger_read_refused_fails_the_invocation(stored, cluster, recorded, error) -> None:
    from gpucluster.fleet.instanceledger import LEDGER_KEY

    recorded.fakes["ce"] = CountingCe(150.0)
    recorded.fakes["dynamodb"] = KeyFaults(LEDGER_KEY, ("get_item",), error)
    with pytest.raises(runtime.GuardrailError, match="could not read spend"):
        spend_guard.handler({}, None)


def test_a_ledger_write_killed_after_it_landed_is_retried_cleanly(stored, cluster, recorded) -> None:
    from gpucluster.fleet.instanceledger import LEDGER_KEY

    class KilledAfter(KeyFaults):
        def __getattr__(self, name: str) -> Any:
            attr = getattr(self.real, name)
            if name != "put_item":
                return attr

            def call(**kwargs: Any) -> Any:
                answer = attr(**kwargs)
                if kwargs["Item"]["group"]["S"] == LEDGER_KEY and self.left > 0:
                    self.left -= 1
                    raise TimeoutError("Task timed out")
                return answer
            return call

    recorded.fakes["ce"] = CountingCe()
    recorded.fakes["dynamodb"] = KilledAfter(LEDGER_KEY, ("put_item",), timeout(), times=1)
    with pytest.raises(TimeoutError):
        spend_guard.handler({}, None)
    assert spend_guard.handler({}, None)["action"] == "unchanged"  # the retry: same version read, merged
    item = record(stored, LEDGER_KEY)
    assert item is not None and item["version"] == "2" and len(item["instances"]) == 3


# --- item 3 on a Slurm stack: nodes that stopped yesterday -----------------------------------------

P5 = 98.32


class SlurmEc2(FakeEc2):
    """FakeEc2 that also answers DescribeInstances by id through its paginator (the spend guard's read)."""

    def __init__(self, launched: datetime) -> None:
        super().__init__()
        for i in self.instances.values():
            i["LaunchTime"] = launched

    def get_paginator(self, name: str) -> Any:
        if name == "describe_spot_price_history":
            raise AssertionError("no spot instance here")
        outer, base = self, super().get_paginator(name)

        class Pages:
            def paginate(self, **kwargs: Any) -> Any:
                if "InstanceIds" in kwargs:
                    yield outer.describe_instances(kwargs["InstanceIds"])
                else:
                    yield from base.paginate(**kwargs)

        return Pages()


@pytest.fixture
def slurm_guard(moto_account: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    now = datetime(2026, 11, 20, 10, tzinfo=UTC)
    table = create_table(shared_client("dynamodb"))
    fake = FakePcs()
    ec2 = SlurmEc2(now - timedelta(hours=1))
    clients = {"pcs": fake.client, "ssm": FakeSsm(), "ec2": ec2, "ce": CountingCe(100.0)}
    monkeypatch.setenv("PCS_CLUSTER_ID", CLUSTER)
    monkeypatch.setenv(STATE_TABLE_ENV, table)
    monkeypatch.setenv("LIMIT_USD", "3000")
    monkeypatch.setenv("PRICES_JSON", json.dumps({"on_demand": {"p5.48xlarge": P5}}))
    monkeypatch.setenv("CHECK_MINUTES", "5")
    monkeypatch.setattr(runtime.RUNTIME, "client", lambda s: clients.get(s) or shared_client(s))
    monkeypatch.setattr(runtime.RUNTIME, "sleep", lambda s: None)
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: now)
    return {"pcs": fake, "table": table, "now": now}


def test_a_slurm_stack_whose_nodes_stopped_yesterday_is_stopped_on_the_breach(slurm_guard) -> None:
    """4 x p5 ran 08:00-20:00 yesterday and stopped; Cost Explorer holds only the day before: $100.
    Without the ledger the guard saw $100 + one node's hour; with it, +$4,700: over the $3,000 limit."""
    ledger = InstanceLedger(shared_client("dynamodb"), slurm_guard["table"], STACK)
    since, morning = datetime(2026, 11, 19, tzinfo=UTC), datetime(2026, 11, 19, 8, tzinfo=UTC)
    nodes = [inst(f"i-0old{n}", morning) for n in range(4)]
    for hour in range(0, 13, 4):
        ledger.record(nodes, morning + timedelta(hours=hour), since)
    result = spend_guard.handler({}, None)
    assert result["action"] == "stopped"
    assert result["spend"]["spend_usd"] > 3000
    fake = slurm_guard["pcs"]
    assert fake.scaling("train") == (0, 0) and fake.scaling("infer") == (0, 0)
    assert fake.scaling("login") == (1, 1)


def test_the_same_slurm_stack_without_yesterdays_nodes_runs_on(slurm_guard) -> None:
    result = spend_guard.handler({}, None)  # the control: the figure the guard saw before
    assert result["action"] == "unchanged" and result["spend"]["spend_usd"] < 3000
    assert slurm_guard["pcs"].scaling("train") != (0, 0)


# --- class 4: each stop and start told once --------------------------------------------------------


def test_the_spend_guards_retry_at_zero_tells_the_untold_stop_once(stored, cluster, recorded,
                                                                    monkeypatch) -> None:
    monkeypatch.setenv("LIMIT_USD", "100")
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    recorded.fakes["ce"] = CountingCe(150.0)
    sns = DownSNS(times=1)
    recorded.fakes["sns"] = sns
    with pytest.raises(runtime.NotifyError):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train") == (0, 0)
    assert record(stored, "dev-train")["notified"] is False
    again = spend_guard.handler({}, None)  # compute at zero: no Cost Explorer read, but the tell
    assert again["untold"] == ["dev-infer", "dev-train"]
    assert len(sns.published) == 1 and record(stored, "dev-train")["notified"] is True
    spend_guard.handler({}, None)
    assert len(sns.published) == 1  # told once


def test_a_schedule_start_records_its_tell_and_its_retry_tells_what_was_not_told(
        stored, cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    b = backend(stored)
    for g in b.list_groups(STACK):
        b.stop(g, SCHEDULE)
    sns = DownSNS(times=1)
    recorded.fakes["sns"] = sns
    start = {"source": "aws.events", "detail-type": "Scheduled Event",
             "resources": ["arn:aws:events:us-east-1:123456789012:rule/gpucluster-dev-start"]}
    with pytest.raises(runtime.NotifyError):
        autostop.handler(start, None)
    rec = record(stored, "dev-train")
    assert (rec["state"], rec["started_by"], rec["notified"]) == ("running", SCHEDULE, False)
    result = autostop.handler(start, None)  # Lambda's retry: nothing to start, the start told
    assert result["untold"] == ["dev-infer", "dev-train"] and len(sns.published) == 1
    assert record(stored, "dev-train")["notified"] is True
    autostop.handler(start, None)
    assert len(sns.published) == 1


def test_a_persons_start_is_told_by_the_command(stored) -> None:
    b = backend(stored)
    group = b.read_groups(["dev-train"])[0]
    b.stop(group, SCHEDULE)
    b.restore(b.read_groups(["dev-train"])[0])
    rec = record(stored, "dev-train")
    assert (rec["state"], rec["started_by"], rec["notified"]) == ("running", "manual", True)
    assert stops.untold(b.list_groups(STACK), stops=(SCHEDULE,), starts=(SCHEDULE,)) == []


def test_a_lifetime_stop_not_told_is_told_by_the_next_run(stored, cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    monkeypatch.setenv("MAX_LIFETIME_HOURS", "1")
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: datetime.now(UTC) + timedelta(hours=2))
    sns = DownSNS(times=1)
    recorded.fakes["sns"] = sns
    rule = {"source": "aws.events", "detail-type": "Scheduled Event",
            "resources": ["arn:aws:events:us-east-1:123456789012:rule/gpucluster-dev-lifetime"]}
    with pytest.raises(runtime.NotifyError):
        autostop.handler(rule, None)
    assert record(stored, "dev-train")["stopped_by"] == LIFETIME
    result = autostop.handler(rule, None)
    assert result["untold"] == ["dev-infer", "dev-train"] and len(sns.published) == 1
    assert autostop.handler(rule, None)["action"] == "unchanged" and len(sns.published) == 1


def test_a_told_mark_does_not_carry_over_to_a_new_transition(stored) -> None:
    """An idle stop told and marked between a budget stop's read and its write: the escalation is untold."""
    b = backend(stored)
    b.stop(b.read_groups(["dev-train"])[0], "idle")
    stale = b.read_groups(["dev-train"])[0]
    b.mark_notified(b.read_groups(["dev-train"])[0])  # the idle tell: a version-only bump
    assert b.stop(stale, BUDGET) == "escalated"
    rec = record(stored, "dev-train")
    assert (rec["stopped_by"], rec["notified"]) == (BUDGET, False)
    assert stops.untold(b.list_groups(STACK), stops=(BUDGET,)) == ["dev-train"]


def test_a_mark_after_a_new_transition_is_left_to_that_transitions_actor(stored) -> None:
    b = backend(stored)
    b.stop(b.read_groups(["dev-train"])[0], SCHEDULE)
    stops.mark_told(b, {"dev-train": SCHEDULE}, True)
    assert record(stored, "dev-train")["notified"] is True
    b.stop(b.read_groups(["dev-train"])[0], BUDGET)  # escalated after that tell
    stops.mark_told(b, {"dev-train": SCHEDULE}, True)  # a late mark of the schedule's tell
    assert record(stored, "dev-train")["notified"] is False


# --- the idle handler reads its alarm again -------------------------------------------------------


def idle_event(name: str = "dev-train-idle") -> dict[str, Any]:
    return {"source": "aws.cloudwatch", "detail-type": "CloudWatch Alarm State Change",
            "detail": {"alarmName": name, "state": {"value": "ALARM"}, "configuration": {}}}


class Alarms:
    def __init__(self, state: str | None = None, error: BaseException | None = None) -> None:
        self.state, self.error, self.calls = state, error, 0

    def describe_alarms(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        found = [{"AlarmName": kwargs["AlarmNames"][0], "StateValue": self.state}] if self.state else []
        return {"CompositeAlarms": found, "MetricAlarms": []}


def test_an_idle_retry_after_the_alarm_went_back_to_ok_stops_nothing(cluster, recorded) -> None:
    recorded.fakes["cloudwatch"] = Alarms("OK")
    result = autostop.handler(idle_event(), None)
    assert result["action"] == "ignored" and "OK now" in result["reason"]
    assert cluster.capacity("dev-train") == (1, 2)


def test_an_idle_alarm_still_in_alarm_stops(cluster, recorded) -> None:
    recorded.fakes["cloudwatch"] = Alarms("ALARM")
    assert autostop.handler(idle_event(), None)["action"] == "stopped"
    assert cluster.capacity("dev-train") == (0, 0)


@pytest.mark.parametrize("error", [client_error(c, s, "DescribeAlarms") for c, s in FAULTS] + [timeout()],
                         ids=[c for c, _ in FAULTS] + ["timeout"])
def test_an_alarm_that_cannot_be_read_again_fails_the_invocation(cluster, recorded, error) -> None:
    recorded.fakes["cloudwatch"] = Alarms(error=error)
    with pytest.raises(runtime.GuardrailError, match="not read again"):
        autostop.handler(idle_event(), None)
    assert cluster.capacity("dev-train") == (1, 2)


# --- the guard's API cost --------------------------------------------------------------------------


def test_the_cache_and_the_cost_model_agree_on_reads_a_day() -> None:
    assert guardcost.GUARD_CE_READS_PER_DAY == settledcache.READS_PER_DAY_MAX
    assert guardcost.GUARD_CE_USD_PER_REQUEST == settledcache.COST_EXPLORER_USD_PER_REQUEST


def test_accrue_prices_gone_instances_by_their_own_type() -> None:
    from gpucluster.fleet.accrual import accrue

    now = datetime(2026, 11, 20, 10, tzinfo=UTC)
    prices = Prices({"p5.48xlarge": P5, "g5.xlarge": 1.0}, group_max={"train": P5})
    spend = accrue(0.0, [], prices, now, gone_instances=[(inst("i-g", now, kind="g5.xlarge"), 3.0)])
    assert spend.accrued_usd == pytest.approx(3.0)  # its own type, not the group's highest rate
    assert spend.gone_hours == {"train": 3.0}


def test_guardstate_ignores_the_memory_items(stored, recorded) -> None:
    recorded.fakes["ce"] = CountingCe()
    spend_guard.handler({}, None)
    assert [g.name for g in backend(stored).list_groups(STACK)] == ["dev-infer", "dev-train"]
    assert guardstate.TRANSITION_TIMEOUT_SECONDS == 900
