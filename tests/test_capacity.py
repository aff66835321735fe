"""`gpucluster capacity search/buy` with botocore's Stubber (moto implements neither call).

Stubber checks every request against the EC2 API model and fails on a call nobody queued: a
purchase made without confirmation would fail the test rather than pass silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import Stubber
from typer.testing import CliRunner

from base_config import base, plan_config
from cli_text import joined_lines
from gpucluster.cli import app
from gpucluster.ops.capacity import (
    Block,
    CapacityError,
    OfferingCache,
    duration_hours,
    node_group_snippet,
    search_offerings,
)
from gpucluster.policy.offline import check_plan
from gpucluster.preflight import parse_stack_config

runner = CliRunner()
START = datetime(2026, 12, 3, 11, 30, tzinfo=UTC)
OFFERING = "cb-0123456789abcdef0"
CR = "cr-0fedcba9876543210"


def offering(offering_id: str = OFFERING, zone: str = "us-east-1a", fee: str = "35232.00",
             start: datetime = START, hours: int = 168) -> dict[str, Any]:
    """A CapacityBlockOffering as the EC2 API returns it: 4 x p5.48xlarge for a week."""
    return {"CapacityBlockOfferingId": offering_id, "InstanceType": "p5.48xlarge", "AvailabilityZone": zone,
            "InstanceCount": 4, "StartDate": start, "EndDate": start + timedelta(hours=hours),
            "CapacityBlockDurationHours": hours, "UpfrontFee": fee, "CurrencyCode": "USD",
            "Tenancy": "default"}


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Stubber]:
    """The CLI's EC2 client, stubbed; the offerings cache in a temporary directory."""
    client = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(client)
    stub.activate()
    asked: list[str | None] = []

    def make(region: str | None) -> Any:
        asked.append(region)
        return client

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr("gpucluster.cli.capacity.ec2_client", make)
    yield stub
    stub.assert_no_pending_responses()


def searched(ec2: Stubber, *offerings: dict[str, Any], **expected: Any) -> Any:
    ec2.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": list(offerings)},
                     {"InstanceType": "p5.48xlarge", "InstanceCount": 4, "CapacityDurationHours": 168,
                      **expected})
    return runner.invoke(app, ["capacity", "search", "--type", "p5.48xlarge", "--count", "4", "--days", "7",
                               *(["--start", "2026-12-01"] if "StartDateRange" in expected else [])])


# ------------------------------------------------------------------------ search


def test_search_lists_offerings_with_total_and_hourly_price(ec2: Stubber) -> None:
    later = offering("cb-0aaaaaaaaaaaaaaaa", zone="us-east-1d", fee="36000.00",
                     start=START + timedelta(days=1))
    result = searched(ec2, later, offering(), StartDateRange=datetime(2026, 12, 1, tzinfo=UTC))
    assert result.exit_code == 0, result.output
    rows = [" ".join(line.split()) for line in joined_lines(result.output)]  # folded at 100 columns
    # 35,232 over 168 hours = $209.71/h, over 4 instances $52.43 per instance-hour; earliest first
    assert ("cb-0123456789abcdef0 us-east-1a 2026-12-03 11:30 -> 2026-12-10 11:30 UTC 168 35,232.00 "
            "$/h: 209.71 $/instance-h: 52.43") in rows
    assert max(len(line) for line in result.output.splitlines()) <= 100
    assert rows.index(next(r for r in rows if r.startswith(OFFERING))) < rows.index(
        next(r for r in rows if r.startswith("cb-0aaaaaaaaaaaaaaaa")))
    assert "paid up front, not refundable" in " ".join(result.output.split())
    assert f"gpucluster capacity buy {OFFERING}" in result.output


def test_search_json_and_the_cache_buy_reads(ec2: Stubber) -> None:
    ec2.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering()]})
    result = runner.invoke(app, ["capacity", "search", "--type", "p5.48xlarge", "--count", "4", "--days", "7",
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["region"] == "us-east-1"
    assert doc["offerings"][0] | {"start": None, "end": None} == {
        "offering_id": OFFERING, "instance_type": "p5.48xlarge", "availability_zone": "us-east-1a",
        "instance_count": 4, "start": None, "end": None, "duration_hours": 168, "upfront_usd": 35232.0,
        "currency": "USD", "usd_per_hour": 209.7143, "usd_per_instance_hour": 52.4286}
    cached = OfferingCache().get(OFFERING)
    assert cached is not None and cached.region == "us-east-1" and cached.offering.upfront_usd == 35232.0


def test_search_without_offerings_says_what_to_try(ec2: Stubber) -> None:
    result = searched(ec2)
    assert result.exit_code == 0
    assert "no Capacity Block offering for 4 x p5.48xlarge for 7 day(s) in us-east-1" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--type", "p5.48xlarge", "--count", "4", "--days", "15"],
     "capacity search: --days: Capacity Blocks last 1-14 days, or whole weeks up to 182 days; got 15"),
    (["--type", "p5.48xlarge", "--count", "4", "--days", "189"],
     "capacity search: --days: Capacity Blocks last 1-14 days, or whole weeks up to 182 days; got 189"),
    (["--type", "p5.48xlarge", "--count", "65", "--days", "7"],
     "capacity search: --count: a Capacity Block holds 1-64 instances, got 65"),
    (["--type", "g5.xlarge", "--count", "1", "--days", "1"],
     "capacity search: --type: g5.xlarge is not sold as Capacity Blocks for ML (families that are: p4d, "
     "p4de, p5, p5e, p5en, p6-b200)"),
    (["--type", "p5.48xlarge", "--count", "4", "--days", "7", "--start", "next week"],
     "capacity search: --start: must be a date like 2026-12-01 or 2026-12-01T11:30, got 'next week'"),
])
def test_bad_search_is_one_line_exit_2(ec2: Stubber, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["capacity", "search", *args])
    assert result.exit_code == 2
    assert result.output.strip() == message


def test_durations_aws_accepts() -> None:
    assert [duration_hours(d) for d in (1, 14, 21, 182)] == [24, 336, 504, 4368]
    with pytest.raises(CapacityError):
        duration_hours(0)


def test_search_pages_through_every_offering() -> None:
    client = boto3.client("ec2", region_name="us-west-2")
    with Stubber(client) as stub:
        stub.add_response("describe_capacity_block_offerings",
                          {"CapacityBlockOfferings": [offering("cb-0bbbbbbbbbbbbbbbb", fee="36000.00")],
                           "NextToken": "t"})
        stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering()]},
                          {"InstanceType": "p5.48xlarge", "InstanceCount": 4, "CapacityDurationHours": 168,
                           "NextToken": "t"})
        found = search_offerings(client, "p5.48xlarge", 4, 7)
    assert [o.offering_id for o in found] == [OFFERING, "cb-0bbbbbbbbbbbbbbbb"]  # sorted, same start: price


# --------------------------------------------------------------------------- buy


def test_buy_refuses_without_confirmation(ec2: Stubber) -> None:
    searched(ec2, offering())
    result = runner.invoke(app, ["capacity", "buy", OFFERING], input="n\n")
    assert result.exit_code == 1
    assert "total price: $35,232.00 USD, paid up front and not refundable ($209.71/hour" in result.output
    assert "Buy it for $35,232.00? [y/N]" in result.output and "nothing bought" in result.output
    # no purchase_capacity_block response was queued: a call would have failed the Stubber


def test_buy_without_an_answer_buys_nothing(ec2: Stubber) -> None:
    searched(ec2, offering())
    result = runner.invoke(app, ["capacity", "buy", OFFERING])  # stdin closed
    assert result.exit_code == 1
    assert "no answer: pass --yes to buy without asking" in result.output
    assert "nothing bought" in result.output


def purchased(ec2: Stubber) -> None:
    ec2.add_response("purchase_capacity_block", {"CapacityReservation": {
        "CapacityReservationId": CR, "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 4, "StartDate": START, "EndDate": START + timedelta(hours=168),
        "State": "payment-pending", "ReservationType": "capacity-block"}},
        {"CapacityBlockOfferingId": OFFERING, "InstancePlatform": "Linux/UNIX"})


@pytest.mark.parametrize(("args", "stdin"), [([], "y\n"), (["--yes"], None)])
def test_buy_after_confirmation_prints_the_node_group(ec2: Stubber, args: list[str],
                                                     stdin: str | None) -> None:
    searched(ec2, offering())
    purchased(ec2)
    result = runner.invoke(app, ["capacity", "buy", OFFERING, *args], input=stdin)
    assert result.exit_code == 0, result.output
    before, after = result.output.split("bought Capacity Block", 1)
    assert "total price: $35,232.00" in before                      # shown before anything was bought
    assert after.startswith(f" {CR} (payment-pending) for $35,232.00")
    snippet = result.output.split("stacks/Pulumi.<env>.yaml):\n\n", 1)[1].split("\n\nthen:", 1)[0]
    config = base()
    config["gpucluster:network"]["availability_zones"] = ["us-east-1a"]
    config.update(yaml.safe_load(snippet))
    group = parse_stack_config(config, stack="t").node_groups[0]
    assert (group.capacity.market, group.capacity.capacity_reservation_id) == ("capacity_block", CR)
    assert group.instance_types == ["p5.48xlarge"] and group.max_nodes == group.desired_nodes == 4
    assert group.efa_enabled and not group.uses_placement_group


def test_buy_an_offering_no_search_listed(ec2: Stubber) -> None:
    result = runner.invoke(app, ["capacity", "buy", "cb-0999999999999999a", "--yes"])
    assert result.exit_code == 2
    assert result.output.startswith("capacity buy: offering cb-0999999999999999a is not among those "
                                    "`gpucluster capacity search` listed")


def test_aws_refusing_the_purchase_is_one_line(ec2: Stubber) -> None:
    searched(ec2, offering())
    ec2.add_client_error("purchase_capacity_block", "InvalidCapacityBlockOfferingId.Expired",
                         "The offering has expired")
    result = runner.invoke(app, ["capacity", "buy", OFFERING, "--yes"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1].startswith("capacity buy: AWS said: An error occurred "
                                                     "(InvalidCapacityBlockOfferingId.Expired)")


# ------------------------------------------------------- from the block to a running group


def test_the_bought_node_group_plans_without_a_blocking_policy() -> None:
    """The snippet's group builds a capacity-block launch template and passes the EFA policy (no PG)."""
    block = Block(CR, "p5.48xlarge", "us-east-1a", 4, START, START + timedelta(days=7), "scheduled")
    config = base()
    config["gpucluster:cluster"]["tags"]["environment"] = "prod"
    config["gpucluster:network"]["availability_zones"] = ["us-east-1a"]
    config.update(yaml.safe_load(node_group_snippet(block)))
    config["gpucluster:budget"] = {"monthly_limit_usd": 100000, "action_threshold_percent": 100}
    plan = plan_config(config, stack="prod")
    [lt] = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert lt.inputs["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert lt.inputs["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": CR}}
    assert not plan.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert [str(v) for v in check_plan(plan) if v.mandatory] == []
    # the block's size travels with it: a Slurm stack requires it, and max_nodes stays within it
    assert yaml.safe_load(node_group_snippet(block))["gpucluster:node_groups"][0]["capacity"][
        "instance_count"] == 4


def test_no_region_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    result = runner.invoke(app, ["capacity", "search", "--type", "p5.48xlarge", "--count", "4",
                                 "--days", "7"])
    assert result.exit_code == 2
    assert result.output.strip() == "capacity: no region: pass --region or set AWS_REGION"
