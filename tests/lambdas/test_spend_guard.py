"""Spend guard handler against a moto account (Auto Scaling, EC2) with a stubbed Cost Explorer.

Cost Explorer is a botocore Stubber so every test pins the settled figure and checks the
exact query (tag filter, period); faults are injected per call: throttling, AccessDenied,
5xx on each AWS call the handler makes, and a retry of a failed invocation.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from gpucluster.fleet import runtime, spendguard
from gpucluster.fleet.accrual import cost_period, settled_through
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, STOPPED_BY_TAG
from gpucluster.lambdas import spend_guard

G5 = 1.006  # test price per hour of the launch template's g5.xlarge
PRICES = {"on_demand": {"g5.xlarge": G5}, "fixed_usd_per_hour": 0.5}


class Faulty:
    """A client whose `method` raises `code` the first `times` calls, then behaves."""

    def __init__(self, client: Any, method: str, code: str, times: int = 1_000) -> None:
        self.client, self.method, self.code, self.left = client, method, code, times
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if name != self.method:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.left > 0:
                self.left -= 1
                self.failed += 1
                raise ClientError({"Error": {"Code": self.code, "Message": "injected"},
                                   "ResponseMetadata": {"HTTPStatusCode": 500 if self.code ==
                                                        "InternalError" else 400}}, name)
            return attr(*args, **kwargs)

        return call


def cost_explorer(*amounts: float | str, stack: str = "dev", now: datetime | None = None) -> Any:
    """A Cost Explorer client answering each call with the next amount (a str is an error code)."""
    client = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(client)
    now = now or datetime.now(UTC)
    period = cost_period(now)
    if period is None:
        pytest.skip("the first two days of a month have no settled figure to stub")
    start, end = period["Start"], period["End"]
    expected = {"TimePeriod": {"Start": start, "End": end}, "Granularity": "MONTHLY",
                "Metrics": ["UnblendedCost"],
                "Filter": {"Tags": {"Key": "gpucluster:stack", "Values": [stack],
                                    "MatchOptions": ["EQUALS"]}}}
    for amount in amounts:
        if isinstance(amount, str):
            stub.add_client_error("get_cost_and_usage", amount, "injected",
                                  http_status_code=500 if amount == "InternalError" else 400)
        else:
            stub.add_response("get_cost_and_usage", {"ResultsByTime": [{
                "TimePeriod": {"Start": start, "End": end},
                "Total": {"UnblendedCost": {"Amount": f"{amount:.4f}", "Unit": "USD"}},
                "Groups": [], "Estimated": True}]}, expected)
    stub.activate()
    return client


@pytest.fixture
def guard(cluster, recorded, monkeypatch) -> Any:
    """The guard's environment; `now` two hours after the instances launched (not past midnight)."""
    monkeypatch.setenv("LIMIT_USD", "100")
    monkeypatch.setenv("PRICES_JSON", json.dumps(PRICES))
    monkeypatch.setenv("CHECK_MINUTES", "5")
    monkeypatch.delenv("MAX_USD_PER_HOUR", raising=False)
    real_now = datetime.now(UTC)
    now = min(real_now + timedelta(hours=2), real_now.replace(hour=23, minute=59))
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: now)
    return now


def launched(cluster, now: datetime) -> list[tuple[str, float]]:
    """(instance id, hours since the later of launch and the settled point) of the dev groups."""
    ec2 = boto3.client("ec2", region_name="us-east-1")
    ids = cluster.instances("dev-train") + cluster.instances("dev-infer")
    out = []
    for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]:
        for i in r["Instances"]:
            start = max(i["LaunchTime"], settled_through(now))
            out.append((i["InstanceId"], (now - start).total_seconds() / 3600))
    return out


def test_under_the_limit_changes_nothing(cluster, recorded, guard) -> None:
    recorded.fakes["ce"] = cost_explorer(10.0, now=guard)
    result = spend_guard.handler({}, None)
    assert result["action"] == "unchanged"
    assert cluster.capacity("dev-train") == (1, 2)
    hours = launched(cluster, guard)
    day_hours = (guard - settled_through(guard)).total_seconds() / 3600
    expected = 10.0 + sum(h for _, h in hours) * G5 + day_hours * 0.5
    assert result["spend"]["spend_usd"] == pytest.approx(expected, abs=0.01)
    assert result["spend"]["usd_per_hour"] == pytest.approx(3 * G5 + 0.5, abs=0.01)
    assert recorded.of("autoscaling", "update_auto_scaling_group") == []


def test_settled_spend_over_the_limit_stops_the_stack_only(cluster, recorded, guard) -> None:
    recorded.fakes["ce"] = cost_explorer(150.0, now=guard)
    result = spend_guard.handler({}, None)
    assert result["action"] == "stopped" and sorted(result["groups"]) == ["dev-infer", "dev-train"]
    assert cluster.capacity("dev-train") == (0, 0) and cluster.capacity("dev-infer") == (0, 0)
    assert cluster.tags("dev-train")[STOPPED_BY_TAG] == "budget"
    assert cluster.tags("dev-train")[PREVIOUS_DESIRED_TAG] == "2"
    assert cluster.capacity("prod-train") == (1, 1)


def test_stops_when_the_limit_falls_before_the_next_check(cluster, recorded, guard, monkeypatch) -> None:
    # Spend sits just under the limit; 3 x $1/h + $0.5/h crosses the rest within 5 minutes.
    recorded.fakes["ce"] = cost_explorer(0.0, now=guard)
    spent = spend_guard.handler({}, None)["spend"]["spend_usd"]
    monkeypatch.setenv("LIMIT_USD", str(spent + 0.25))  # 0.25 / 3.5 $/h = 4.3 min
    recorded.fakes["ce"] = cost_explorer(0.0, now=guard)
    result = spend_guard.handler({}, None)
    assert result["action"] == "stopped"
    assert "before the next check" in result["spend"]["reason"]
    assert cluster.capacity("dev-train") == (0, 0)


def test_projection_waits_when_the_limit_is_further_than_one_check(cluster, recorded, guard,
                                                                   monkeypatch) -> None:
    recorded.fakes["ce"] = cost_explorer(0.0, 0.0, now=guard)
    spent = spend_guard.handler({}, None)["spend"]["spend_usd"]
    monkeypatch.setenv("LIMIT_USD", str(spent + 1.0))  # $1 at $3.5/h: 17 minutes away
    result = spend_guard.handler({}, None)
    assert result["action"] == "unchanged"
    assert result["spend"]["hours_to_limit"] == pytest.approx(1.0 / (3 * G5 + 0.5), abs=0.01)


def test_burn_rate_cap_stops_even_under_the_limit(cluster, recorded, guard, monkeypatch) -> None:
    monkeypatch.setenv("MAX_USD_PER_HOUR", "3")
    recorded.fakes["ce"] = cost_explorer(0.0, now=guard)
    result = spend_guard.handler({}, None)
    assert result["action"] == "stopped"
    assert "max_usd_per_hour" in result["spend"]["reason"]


def test_a_retry_is_one_run(cluster, recorded, guard) -> None:
    recorded.fakes["ce"] = cost_explorer(150.0, 150.0, now=guard)
    spend_guard.handler({}, None)
    writes = len(recorded.of("autoscaling", "update_auto_scaling_group"))
    again = spend_guard.handler({}, None)
    assert again["action"] == "unchanged"
    assert len(recorded.of("autoscaling", "update_auto_scaling_group")) == writes
    assert cluster.tags("dev-train")[PREVIOUS_DESIRED_TAG] == "2"  # the first stop's record kept


def test_a_stop_notifies_the_topic(cluster, recorded, guard, monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    recorded.fakes["ce"] = cost_explorer(150.0, now=guard)
    spend_guard.handler({}, None)
    (published,) = recorded.of("sns", "publish")
    assert "spend guard stopped compute" in published["Subject"]
    assert json.loads(published["Message"])["spend"]["spend_usd"] > 150


@pytest.mark.parametrize("code", ["ThrottlingException", "AccessDeniedException", "InternalError"])
def test_cost_explorer_failure_is_raised_and_stops_nothing(cluster, recorded, guard, code) -> None:
    recorded.fakes["ce"] = cost_explorer(code, now=guard)
    with pytest.raises(runtime.GuardrailError, match="could not read spend"):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train") == (1, 2)


@pytest.mark.parametrize("method", ["describe_auto_scaling_groups"])
@pytest.mark.parametrize("code", ["Throttling", "AccessDenied", "InternalError"])
def test_autoscaling_read_failure_is_raised(cluster, recorded, guard, method, code) -> None:
    recorded.fakes["autoscaling"] = Faulty(boto3.client("autoscaling", region_name="us-east-1"),
                                           method, code)
    recorded.fakes["ce"] = cost_explorer(now=guard)
    with pytest.raises(runtime.GuardrailError):
        spend_guard.handler({}, None)


@pytest.mark.parametrize("code", ["RequestLimitExceeded", "UnauthorizedOperation"])
def test_instance_read_failure_is_raised(cluster, recorded, guard, code) -> None:
    class FaultyEc2:
        def get_paginator(self, name: str) -> Any:
            raise ClientError({"Error": {"Code": code, "Message": "injected"}}, "DescribeInstances")

    recorded.fakes["ec2"] = FaultyEc2()
    recorded.fakes["ce"] = cost_explorer(now=guard)
    with pytest.raises(runtime.GuardrailError):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train") == (1, 2)


def test_a_failed_stop_is_raised_and_the_retry_finishes_it(cluster, recorded, guard) -> None:
    faulty = Faulty(boto3.client("autoscaling", region_name="us-east-1"), "update_auto_scaling_group",
                    "Throttling", times=10)
    recorded.fakes["autoscaling"] = faulty
    recorded.fakes["ce"] = cost_explorer(150.0, 150.0, now=guard)
    with pytest.raises(runtime.GuardrailError, match="could not stop"):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train")[1] == 2  # still running: nothing claims otherwise
    faulty.left = 0  # Lambda's retry (or the next tick) with the API back
    result = spend_guard.handler({}, None)
    assert sorted(result["groups"]) == ["dev-infer", "dev-train"]
    assert cluster.capacity("dev-train") == (0, 0)
    assert cluster.tags("dev-train")[STOPPED_BY_TAG] == "budget"
    assert cluster.tags("dev-train")[PREVIOUS_DESIRED_TAG] == "2"


def test_killed_after_the_stop_and_retried_changes_nothing_more(cluster, recorded, guard,
                                                                monkeypatch) -> None:
    """Killed during the settle time (after the writes landed): the retry finds the work done."""
    recorded.fakes["ce"] = cost_explorer(150.0, 150.0, now=guard)

    def killed(seconds: float) -> None:
        raise TimeoutError("Task timed out")

    monkeypatch.setattr(runtime.RUNTIME, "sleep", killed)
    with pytest.raises(TimeoutError):
        spend_guard.handler({}, None)
    monkeypatch.setattr(runtime.RUNTIME, "sleep", recorded.clock.sleep)
    writes = len(recorded.of("autoscaling", "update_auto_scaling_group"))
    assert spend_guard.handler({}, None)["action"] == "unchanged"
    assert len(recorded.of("autoscaling", "update_auto_scaling_group")) == writes
    assert cluster.tags("dev-infer")[STOPPED_BY_TAG] == "budget"


def test_spot_price_failure_falls_back_to_on_demand() -> None:
    from gpucluster.fleet.accrual import SPOT, Instance

    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    stub.add_client_error("describe_spot_price_history", "RequestLimitExceeded", "slow down")
    stub.activate()
    now = datetime(2026, 11, 20, 12, tzinfo=UTC)
    spot = [Instance("i-1", "p5.48xlarge", SPOT, now - timedelta(hours=1), "train", "us-east-1a")]
    assert spendguard.spot_prices(ec2, spot, now) == {}


def test_spot_prices_take_the_latest_per_zone() -> None:
    from gpucluster.fleet.accrual import SPOT, Instance

    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    now = datetime(2026, 11, 20, 12, tzinfo=UTC)
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "40.0",
         "Timestamp": now - timedelta(minutes=50), "ProductDescription": "Linux/UNIX"},
        {"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "42.5",
         "Timestamp": now - timedelta(minutes=5), "ProductDescription": "Linux/UNIX"},
    ]}, {"InstanceTypes": ["p5.48xlarge"], "ProductDescriptions": ["Linux/UNIX"],
         "StartTime": now - timedelta(hours=1)})
    stub.activate()
    spot = [Instance("i-1", "p5.48xlarge", SPOT, now, "train", "us-east-1a")]
    assert spendguard.spot_prices(ec2, spot, now) == {("p5.48xlarge", "us-east-1a"): 42.5}


def test_first_day_of_the_month_skips_cost_explorer() -> None:
    assert spendguard.settled_cost(object(), "dev", datetime(2026, 12, 1, 3, tzinfo=UTC)) == 0.0


def test_cost_explorer_pages_are_summed() -> None:
    ce = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(ce)
    for amount, token in ((10.0, "next"), (2.5, None)):
        answer: dict[str, Any] = {"ResultsByTime": [{"Total": {"UnblendedCost": {"Amount": str(amount),
                                                                                "Unit": "USD"}}}]}
        if token:
            answer["NextPageToken"] = token
        stub.add_response("get_cost_and_usage", answer)
    stub.activate()
    assert spendguard.settled_cost(ce, "dev", datetime(2026, 11, 20, 9, tzinfo=UTC)) == 12.5


@pytest.mark.parametrize(("env", "value", "message"), [
    ("LIMIT_USD", "", "LIMIT_USD"),
    ("LIMIT_USD", "-5", "LIMIT_USD"),
    ("PRICES_JSON", "{", "PRICES_JSON"),
    ("PRICES_JSON", '{"on_demand": {"g5.xlarge": -1}}', "PRICES_JSON"),
    ("PRICES_JSON", '{"fixed_usd_per_hour": 1}', "PRICES_JSON"),
])
def test_bad_settings_are_config_errors(cluster, recorded, guard, monkeypatch, env, value, message) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(runtime.ConfigError, match=message):
        spend_guard.handler({}, None)
    assert recorded.of("autoscaling", "describe_auto_scaling_groups") == []


def test_an_unpriced_instance_type_is_a_config_error(cluster, recorded, guard, monkeypatch) -> None:
    """A type neither the rendered table nor the AWS Price List prices (issue 35 item 4: the Price List
    is asked first, and answers no product here)."""
    monkeypatch.setenv("PRICES_JSON", json.dumps({"on_demand": {"p5.48xlarge": 98.32}}))
    recorded.fakes["ce"] = cost_explorer(0.0, now=guard)
    pricing = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(pricing)
    stub.add_response("get_products", {"PriceList": []})
    stub.activate()
    recorded.fakes["pricing"] = pricing
    with pytest.raises(runtime.ConfigError, match=r"g5\.xlarge"):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train") == (1, 2)


def test_group_hours_come_from_group_in_service_instances() -> None:
    from gpucluster.fleet.nodegroups import NodeGroup

    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    stub = Stubber(cloudwatch)
    since, now = datetime(2026, 11, 19, tzinfo=UTC), datetime(2026, 11, 20, 6, tzinfo=UTC)
    stub.add_response("get_metric_data", {"MetricDataResults": [
        {"Id": "g0", "Values": [4.0] * 12 + [2.0] * 6, "StatusCode": "Complete"},  # 1 h at 4, 0.5 h at 2
        {"Id": "g1", "Values": [], "StatusCode": "Complete"}]}, {
        "MetricDataQueries": [{"Id": f"g{i}", "MetricStat": {
            "Metric": {"Namespace": "AWS/AutoScaling", "MetricName": "GroupInServiceInstances",
                       "Dimensions": [{"Name": "AutoScalingGroupName", "Value": name}]},
            "Period": 300, "Stat": "Average"}, "ReturnData": True}
            for i, name in enumerate(("gpu-train-asg", "gpu-eval-asg"))],
        "StartTime": since, "EndTime": now})
    stub.activate()
    groups = [NodeGroup("gpu-train-asg", "train", "dev", 0, 4, 4),
              NodeGroup("gpu-eval-asg", None, "dev", 0, 0, 1)]
    assert spendguard.group_instance_hours(cloudwatch, groups, since, now) == {
        "train": pytest.approx(5.0), "gpu-eval-asg": 0.0}


@pytest.mark.parametrize("code", ["Throttling", "AccessDenied", "InternalServiceError"])
def test_metric_read_failure_is_raised(cluster, recorded, guard, code) -> None:
    class Paginated:
        """GetMetricData fails (the handler reads it through a paginator)."""

        def get_paginator(self, name: str) -> Any:
            raise ClientError({"Error": {"Code": code, "Message": "injected"}}, "GetMetricData")

    recorded.fakes["cloudwatch"] = Paginated()
    recorded.fakes["ce"] = cost_explorer(150.0, now=guard)
    with pytest.raises(runtime.GuardrailError, match="could not read spend"):
        spend_guard.handler({}, None)
    assert cluster.capacity("dev-train") == (1, 2)


def test_two_checks_at_once_stop_once_and_keep_one_record(cluster, recorded, guard, monkeypatch) -> None:
    """A schedule retry overlapping the check it retries: the second runs inside the first's settle."""
    recorded.fakes["ce"] = cost_explorer(150.0, 150.0, now=guard)
    inner: list[dict[str, Any]] = []

    def settle(seconds: float) -> None:
        if not inner:
            inner.append(spend_guard.handler({}, None))

    monkeypatch.setattr(runtime.RUNTIME, "sleep", settle)
    outer = spend_guard.handler({}, None)
    assert sorted(outer["groups"]) == ["dev-infer", "dev-train"]
    assert inner[0]["action"] == "unchanged"  # the groups were already at zero, labelled budget
    for name, desired in (("dev-train", "2"), ("dev-infer", "1")):
        assert cluster.capacity(name) == (0, 0)
        assert cluster.tags(name)[STOPPED_BY_TAG] == "budget"
        assert cluster.tags(name)[PREVIOUS_DESIRED_TAG] == desired  # the capacity it ran, not 0
