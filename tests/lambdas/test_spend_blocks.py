"""Issue 35 item 3, the rest: a Capacity Block's fee counted once, and the first days after an upgrade.

- A block's instances cost nothing by the hour; its upfront fee counts once, from the reservation
  (DescribeCapacityReservations), and not at all when the settled figure already holds it (tagged
  with the stack, paid before the settled point) or when it was paid before this month.
- A failed reservation read (throttling, 5xx, AccessDenied, a timeout; a retry) fails the invocation:
  pricing the block's instances by the hour instead could miss a fee paid since the settled point.
- Instances that stopped before the guard began recording them are not in the record: the guard
  says so in every tick's result while the gap lasts, and tells the topic once.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError
from botocore.stub import Stubber
from test_guardstate import DownSNS, create_table, record
from test_spend_guard import G5, PRICES, cost_explorer, launched
from test_spend_guard import guard as guard_clock  # noqa: F401 (the `guard` fixture, named here)

from conftest import STACK, shared_client
from gpucluster import pricing
from gpucluster.fleet import capacityblocks, runtime
from gpucluster.fleet.accrual import (
    CAPACITY_BLOCK,
    ON_DEMAND,
    Block,
    Instance,
    Prices,
    accrue,
    settled_through,
)
from gpucluster.fleet.deployment import IAM_ACTIONS, STATE_TABLE_ENV
from gpucluster.fleet.instanceledger import LEDGER_KEY, InstanceLedger, settles_on, unrecorded_since
from gpucluster.fleet.tags import STACK_TAG
from gpucluster.lambdas import spend_guard

NOW = datetime(2026, 11, 20, 10, tzinfo=UTC)  # settled through 19 Nov 00:00
SINCE = settled_through(NOW)
P5, P5_BLOCK = 98.32, 31.464
TABLE = Prices({"p5.48xlarge": P5}, capacity_block={"p5.48xlarge": P5_BLOCK})
FEE = P5_BLOCK * 2 * 48  # 2 x p5 for two days


def block(created: datetime, *, tagged: bool = True, state: str = "active", rid: str = "cr-0blk") -> Block:
    return Block(rid, "p5.48xlarge", 2, created, created + timedelta(hours=48), created, state, tagged)


def in_block(iid: str, launched: datetime, rid: str | None = "cr-0blk") -> Instance:
    return Instance(iid, "p5.48xlarge", CAPACITY_BLOCK, launched, "train", "us-east-1a", rid)


# --- the pure rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("created", "tagged", "state", "counted"), [
    (NOW - timedelta(hours=3), True, "active", True),             # bought today: not settled yet
    (SINCE - timedelta(days=3), True, "active", False),           # tagged, paid before the settled point
    (SINCE - timedelta(hours=6), True, "active", True),           # may be paid after it (12 h window)
    (SINCE - timedelta(days=3), False, "active", True),           # untagged: Cost Explorer never sees it
    (datetime(2026, 10, 30, tzinfo=UTC), False, "expired", False),  # paid last month
    (NOW - timedelta(hours=3), True, "payment-failed", False),    # never paid
    (NOW - timedelta(hours=3), True, "payment-pending", True),    # paid within 12 h
])
def test_a_blocks_fee_counts_once(created, tagged, state, counted) -> None:
    b = block(created, tagged=tagged, state=state)
    spend = accrue(1000.0, [in_block("i-1", NOW - timedelta(hours=2))], TABLE, NOW, blocks=[b])
    assert spend.block_fees == {"cr-0blk": pytest.approx(FEE if counted else 0.0)}
    assert spend.accrued_usd == pytest.approx(FEE if counted else 0.0)  # never the hours on top
    assert spend.priced == {"i-1": 0.0} and spend.usd_per_hour == 0.0
    assert spend.notes == ()


def test_the_issues_double_count_is_gone() -> None:
    """A tagged block bought three days ago: its fee is in the settled figure; its instances ran 30 h
    since the settled point. The guard counted 30 h x 2 x $31.46 on top ($1,888): now nothing."""
    b = block(SINCE - timedelta(days=2))
    nodes = [in_block(f"i-{n}", SINCE - timedelta(days=1)) for n in range(2)]
    spend = accrue(FEE, nodes, TABLE, NOW, blocks=[b])
    assert spend.total_usd == pytest.approx(FEE)


def test_instances_of_a_block_not_read_are_priced_by_the_hour_and_said() -> None:
    spend = accrue(0.0, [in_block("i-1", NOW - timedelta(hours=2), rid="cr-0other")], TABLE, NOW,
                   blocks=[block(NOW - timedelta(hours=3))])
    assert spend.priced == {"i-1": P5_BLOCK}
    assert spend.accrued_usd == pytest.approx(FEE + 2 * P5_BLOCK)
    assert len(spend.notes) == 1 and "cr-0other" in spend.notes[0] and "by the hour" in spend.notes[0]


def test_gone_instances_of_a_read_block_cost_nothing_more() -> None:
    gone = [(in_block("i-gone", SINCE), 20.0)]
    spend = accrue(0.0, [], TABLE, NOW, gone_instances=gone, blocks=[block(SINCE - timedelta(days=2))])
    assert spend.accrued_usd == 0.0 and spend.gone_hours == {"train": 20.0}


def test_a_block_of_a_type_without_a_block_rate_is_priced_at_on_demand() -> None:
    b = Block("cr-0x", "p5.48xlarge", 1, NOW, NOW + timedelta(hours=24), NOW, "active", True)
    spend = accrue(0.0, [], Prices({"p5.48xlarge": P5}), NOW, blocks=[b])
    assert spend.block_fees == {"cr-0x": pytest.approx(P5 * 24)}


# --- the read ----------------------------------------------------------------------------------------


def reservation(rid: str, *, tags: dict[str, str] | None = None, kind: str = "capacity-block",
                created: datetime = NOW - timedelta(hours=3), **over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "CapacityReservationId": rid, "InstanceType": "p5.48xlarge", "TotalInstanceCount": 2,
        "StartDate": created, "EndDate": created + timedelta(hours=48), "CreateDate": created,
        "State": "active", "ReservationType": kind,
        "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()]}
    raw.update(over)
    return {k: v for k, v in raw.items() if v is not None}


def stubbed(*reservations: dict[str, Any]) -> Any:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": list(reservations)},
                      {"MaxResults": capacityblocks.MAX_RESULTS})
    stub.activate()
    return ec2


def test_the_stacks_blocks_are_the_tagged_and_the_named_ones() -> None:
    ec2 = stubbed(reservation("cr-0tagged", tags={STACK_TAG: STACK}),
                  reservation("cr-0named"),
                  reservation("cr-0other", tags={STACK_TAG: "prod"}),
                  reservation("cr-0odcr", kind="default", tags={STACK_TAG: STACK}))
    blocks = capacityblocks.stack_blocks(ec2, STACK, {"cr-0named"})
    assert [(b.reservation_id, b.tagged) for b in blocks] == [("cr-0named", False), ("cr-0tagged", True)]


@pytest.mark.parametrize("missing", ["InstanceType", "TotalInstanceCount", "StartDate", "EndDate"])
def test_a_reservation_whose_fee_cannot_be_priced_is_an_error_never_zero(missing) -> None:
    ec2 = stubbed(reservation("cr-0tagged", tags={STACK_TAG: STACK}, **{missing: None}))
    with pytest.raises(capacityblocks.BlockAnswerError, match="cr-0tagged"):
        capacityblocks.stack_blocks(ec2, STACK, set())


def test_the_read_is_made_only_when_the_stack_may_have_a_block() -> None:
    on_demand = Instance("i-1", "p5.48xlarge", ON_DEMAND, NOW)
    assert not capacityblocks.needed(Prices({"p5.48xlarge": P5}), [on_demand])
    assert capacityblocks.needed(Prices({"p5.48xlarge": P5}), [in_block("i-2", NOW)])
    assert capacityblocks.needed(TABLE, [])
    assert capacityblocks.needed(Prices({"p5.48xlarge": P5}, reservations=("cr-0a",)), [])


def test_the_guards_price_table_names_the_groups_blocks() -> None:
    from test_pricing_guard import base, spec_of

    config = base()
    group = config["gpucluster:node_groups"][0]
    group.update(instance_types=["p5.48xlarge"], max_nodes=2, desired_nodes=2, min_nodes=0,
                 availability_zones=None)
    group["capacity"] = {"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0",
                         "duration_hours": 48, "instance_count": 2}
    group.pop("availability_zones")
    table = pricing.guard_prices(spec_of(config))
    assert table["reservations"] == ["cr-0123456789abcdef0"]
    assert Prices.from_json(table).reservations == ("cr-0123456789abcdef0",)
    assert "reservations" not in pricing.guard_prices(spec_of(base()))  # no block: the table as before


def test_the_guards_role_may_read_reservations_on_any_resource() -> None:
    """DescribeCapacityReservations lists no resource types (cfn-lint's copy of the Service
    Authorization Reference), so Resource "*" is all a grant can name."""
    from cfnlint_data import service_authorization
    from gpucluster.aws.guardrail_spend import SPEND_GUARD_READS

    actions = service_authorization()["ec2"]["Actions"]
    assert actions["describecapacityreservations"] == {}
    assert actions["purchasecapacityblock"] != {}  # the control: an action with a resource type
    assert "ec2:DescribeCapacityReservations" in SPEND_GUARD_READS
    assert "ec2:DescribeCapacityReservations" in IAM_ACTIONS["spend_guard"]


# --- the handler: a stack whose train group runs in a block -------------------------------------


class BlockEc2:
    """The moto EC2 client, with dev-train's instances in Capacity Block `rid` and the reservations
    answered from `reservations` (or `error` raised, `times` times)."""

    def __init__(self, cluster: Any, reservations: list[dict[str, Any]], rid: str = "cr-0blk",
                 error: BaseException | None = None, times: int = 1_000) -> None:
        self.real, self.reservations, self.error, self.left = shared_client("ec2"), reservations, error, times
        self.in_block = set(cluster.instances("dev-train"))
        self.rid, self.reads = rid, 0

    def get_paginator(self, name: str) -> Any:
        outer = self
        if name == "describe_capacity_reservations":
            class Reservations:
                def paginate(self, **kwargs: Any) -> Any:
                    outer.reads += 1
                    if outer.error is not None and outer.left > 0:
                        outer.left -= 1
                        raise outer.error
                    yield {"CapacityReservations": outer.reservations}
            return Reservations()
        real = self.real.get_paginator(name)
        if name != "describe_instances":
            return real

        class Instances:
            def paginate(self, **kwargs: Any) -> Any:
                for page in real.paginate(**kwargs):
                    for r in page["Reservations"]:
                        for i in r["Instances"]:
                            if i["InstanceId"] in outer.in_block:
                                i.update(InstanceLifecycle="capacity-block", CapacityReservationId=outer.rid,
                                         InstanceType="p5.48xlarge")
                    yield page
        return Instances()


BLOCK_PRICES = {**PRICES, "on_demand": {**PRICES["on_demand"], "p5.48xlarge": P5},
                "capacity_block": {"p5.48xlarge": P5_BLOCK}}


@pytest.fixture
def block_guard(guard_clock, monkeypatch) -> datetime:  # noqa: F811 (a fixture argument)
    """test_spend_guard's guard (its clock and environment) with a limit and prices for a p5 block."""
    monkeypatch.setenv("LIMIT_USD", "5000")
    monkeypatch.setenv("PRICES_JSON", json.dumps(BLOCK_PRICES))
    return guard_clock


def test_a_settled_blocks_hours_are_not_added_again(cluster, recorded, block_guard) -> None:
    now = block_guard
    bought = settled_through(now) - timedelta(days=1)
    if bought < now.replace(day=1, hour=0, minute=0):
        pytest.skip("the block must be bought this month, before the settled point")
    recorded.fakes["ec2"] = BlockEc2(cluster, [reservation("cr-0blk", tags={STACK_TAG: STACK},
                                                           created=bought)])
    recorded.fakes["ce"] = cost_explorer(4900.0, now=now)  # holds the fee
    result = spend_guard.handler({}, None)
    # The settled figure + the fixed costs + dev-infer's on-demand hours: dev-train's two block nodes
    # add nothing (they added 2 x their hours x $31.46 before: the fee counted twice).
    train = set(cluster.instances("dev-train"))
    infer_hours = sum(h for i, h in launched(cluster, now) if i not in train)
    fixed = (now - settled_through(now)).total_seconds() / 3600 * PRICES["fixed_usd_per_hour"]
    assert result["action"] == "unchanged"
    assert result["spend"]["spend_usd"] == pytest.approx(4900 + fixed + infer_hours * G5, abs=0.01)
    assert result["spend"]["usd_per_hour"] == pytest.approx(len(cluster.instances("dev-infer")) * G5 + 0.5,
                                                             abs=0.01)
    assert "notes" not in result


def test_a_block_bought_since_the_settled_point_counts_its_fee_and_stops(cluster, recorded,
                                                                          block_guard) -> None:
    now = block_guard
    recorded.fakes["ec2"] = BlockEc2(cluster, [reservation("cr-0blk", created=now - timedelta(hours=1))])
    recorded.fakes["ce"] = cost_explorer(2000.0, now=now)
    train = set(cluster.instances("dev-train"))
    infer_hours = sum(h for i, h in launched(cluster, now) if i not in train)  # before the stop
    fixed = (now - settled_through(now)).total_seconds() / 3600 * PRICES["fixed_usd_per_hour"]
    result = spend_guard.handler({}, None)
    assert result["action"] == "stopped"  # $2,000 + the $3,020 fee > $5,000
    assert result["spend"]["spend_usd"] == pytest.approx(2000 + FEE + fixed + infer_hours * G5, abs=0.01)
    assert cluster.capacity("dev-train") == (0, 0)


def test_a_stack_without_a_block_never_reads_reservations(cluster, recorded, guard_env) -> None:
    class NoReads(BlockEc2):
        def get_paginator(self, name: str) -> Any:
            assert name != "describe_capacity_reservations"
            return self.real.get_paginator(name)

    ec2 = NoReads(cluster, [])
    recorded.fakes["ec2"] = ec2
    recorded.fakes["ce"] = cost_explorer(10.0, now=guard_env)
    assert spend_guard.handler({}, None)["action"] == "unchanged"
    assert ec2.reads == 0


@pytest.fixture
def guard_env(cluster, recorded, monkeypatch) -> datetime:
    monkeypatch.setenv("LIMIT_USD", "100")
    monkeypatch.setenv("PRICES_JSON", json.dumps(PRICES))
    monkeypatch.delenv("MAX_USD_PER_HOUR", raising=False)
    now = min(datetime.now(UTC) + timedelta(hours=2), datetime.now(UTC).replace(hour=23, minute=59))
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: now)
    return now


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "injected"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "DescribeCapacityReservations")


READ_FAULTS = {
    "throttled": client_error("RequestLimitExceeded", 503),
    "5xx": client_error("InternalError", 500),
    "denied": client_error("UnauthorizedOperation", 403),
    "timeout before": ConnectTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com"),
    "timeout after": ReadTimeoutError(endpoint_url="https://ec2.us-east-1.amazonaws.com"),
}


@pytest.mark.parametrize("error", READ_FAULTS.values(), ids=READ_FAULTS.keys())
def test_a_reservation_read_that_fails_fails_the_invocation_and_its_retry_counts(cluster, recorded,
                                                                                 block_guard, error) -> None:
    """Never the hours instead: 2 h x 2 x $31.46 would miss the $3,020 fee paid an hour ago."""
    now = block_guard
    ec2 = BlockEc2(cluster, [reservation("cr-0blk", created=now - timedelta(hours=1))], error=error, times=1)
    recorded.fakes["ec2"] = ec2
    recorded.fakes["ce"] = cost_explorer(2000.0, 2000.0, now=now)
    with pytest.raises(runtime.GuardrailError, match="could not read spend"):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train") == (1, 2)  # nothing decided on a figure without the fee
    assert spend_guard.handler({}, None)["action"] == "stopped"  # the retry reads it and counts it
    assert ec2.reads == 2


def test_a_malformed_reservation_fails_the_invocation(cluster, recorded, block_guard) -> None:
    recorded.fakes["ec2"] = BlockEc2(cluster, [reservation("cr-0blk", EndDate=None)])
    recorded.fakes["ce"] = cost_explorer(10.0, now=block_guard)
    with pytest.raises(runtime.GuardrailError, match="lacks what prices its fee"):
        spend_guard.handler({}, None)


# --- item 3: the first days after an upgrade -------------------------------------------------------


def test_the_gap_lasts_until_the_settled_point_passes_the_ledgers_start() -> None:
    begun = datetime(2026, 11, 20, 10, tzinfo=UTC)
    assert settles_on(begun) == datetime(2026, 11, 22, tzinfo=UTC)
    assert settles_on(datetime(2026, 11, 20, tzinfo=UTC)) == datetime(2026, 11, 21, tzinfo=UTC)
    for now, gap in [(begun, True), (datetime(2026, 11, 21, 23, 59, tzinfo=UTC), True),
                     (datetime(2026, 11, 22, 0, 1, tzinfo=UTC), False)]:
        assert (unrecorded_since(begun.timestamp(), settled_through(now), now) is not None) is gap
    assert unrecorded_since(None, SINCE, NOW) == NOW  # written for the first time now


@pytest.fixture
def upgraded(cluster, recorded, monkeypatch) -> dict[str, Any]:
    table = create_table(shared_client("dynamodb"))
    monkeypatch.setenv(STATE_TABLE_ENV, table)
    monkeypatch.setenv("LIMIT_USD", "100000")
    monkeypatch.setenv("PRICES_JSON", json.dumps(PRICES))
    monkeypatch.setenv("CHECK_MINUTES", "5")
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    monkeypatch.delenv("MAX_USD_PER_HOUR", raising=False)
    clock = {"now": datetime(2026, 11, 20, 10, tzinfo=UTC)}
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: clock["now"])

    class Ce:
        def get_cost_and_usage(self, **kwargs: Any) -> dict[str, Any]:
            return {"ResultsByTime": [{"Total": {"UnblendedCost": {"Amount": "10", "Unit": "USD"}}}]}

    recorded.fakes["ce"] = Ce()
    return {"table": table, "clock": clock}


def test_the_first_tick_after_an_upgrade_says_what_the_figure_may_miss_and_tells_it_once(
        upgraded, recorded) -> None:
    first = spend_guard.handler({}, None)
    [note] = first["notes"]
    assert "2026-11-19 00:00 and 2026-11-20 10:00" in note and "2026-11-22 00:00" in note
    [told] = recorded.of("sns", "publish")
    assert "may be low" in told["Subject"] and json.loads(told["Message"])["note"] == note
    assert record(upgraded["table"], LEDGER_KEY)["gap_told"] is True
    upgraded["clock"]["now"] += timedelta(hours=20)
    assert spend_guard.handler({}, None)["notes"] == [note.replace(  # still said, with the same start
        "2026-11-19 00:00", "2026-11-20 00:00")]
    assert len(recorded.of("sns", "publish")) == 1  # told once
    upgraded["clock"]["now"] = datetime(2026, 11, 22, 0, 5, tzinfo=UTC)
    assert "notes" not in spend_guard.handler({}, None)  # Cost Explorer holds the gap now


def test_a_ledger_from_before_the_field_starts_its_gap_at_the_next_write(upgraded) -> None:
    # the item as the ledger's first version wrote it: no `started`, no `gap_told`
    shared_client("dynamodb").put_item(TableName=upgraded["table"], Item={
        "stack": {"S": STACK}, "group": {"S": LEDGER_KEY}, "version": {"N": "1"}, "instances": {"M": {}}})
    result = spend_guard.handler({}, None)
    assert "2026-11-20 10:00" in result["notes"][0]
    assert record(upgraded["table"], LEDGER_KEY)["started"] == str(int(upgraded["clock"]["now"].timestamp()))


def test_a_refused_tell_is_retried_next_tick_and_never_fails_the_check(upgraded, recorded) -> None:
    sns = DownSNS(times=1)
    recorded.fakes["sns"] = sns
    assert spend_guard.handler({}, None)["action"] == "unchanged"
    assert record(upgraded["table"], LEDGER_KEY)["gap_told"] is False
    spend_guard.handler({}, None)
    assert len(sns.published) == 1 and record(upgraded["table"], LEDGER_KEY)["gap_told"] is True


def test_a_ledger_older_than_the_settled_point_says_nothing(upgraded, recorded) -> None:
    ledger = InstanceLedger(shared_client("dynamodb"), upgraded["table"], STACK)
    ledger.record([], datetime(2026, 11, 17, tzinfo=UTC), datetime(2026, 11, 16, tzinfo=UTC))
    assert "notes" not in spend_guard.handler({}, None)
    assert recorded.of("sns", "publish") == []
