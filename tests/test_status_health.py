"""`gpucluster status` health columns against moto: healthy nodes, GPU utilisation over 15 minutes,
the last health replacement and its reason, the dashboard URL, and `--json`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from cli_text import joined_lines
from gpucluster.cli import app, common
from gpucluster.ops.status import Replacement, last_replacement, replacement_reason, stack_status
from gpucluster.plan import load_stack
from moto_groups import create_stack_groups, fleet_of
from test_operations import ACTIVE, cost_explorer

runner = CliRunner()
# The identities the stack files give (<org>/<project>/<stack>/<cluster>): what `status dev` selects by.
DEV, PROD = (load_stack(name)[2].identity for name in ("dev", "prod"))
GROUPS = {"dev-train": (DEV, 2, 2, 4), "dev-idle": (DEV, 0, 1, 2), "prod-train": (PROD, 1, 1, 2)}
URL = ("https://us-east-1.console.aws.amazon.com/cloudwatch/home?region=us-east-1"
       "#dashboards/dashboard/gpu-dev-us-east-1")

# Scaling activities as Auto Scaling words them (EC2 Auto Scaling user guide, "View the reason for
# health check failures"; AWS knowledge center, "lifecycle-actions-code-deploy").
UNHEALTHY = {"Description": "Terminating EC2 instance: i-0aaa111122223333a",
             "Cause": "At 2026-11-20T10:00:00Z an instance was taken out of service in response to a user "
                      "health-check.", "StatusCode": "Successful",
             "StartTime": datetime(2026, 11, 20, 10, 0, 5, tzinfo=UTC)}
ABANDON_MESSAGE = ("Instance failed to complete user's Lifecycle Action: Lifecycle Action with token "
                   "0fc62a4b was abandoned: Lifecycle Action Completed with ABANDON Result")
ABANDONED = {"Description": f"Launching a new EC2 instance: i-0bbb111122223333b.  Status Reason: "
                            f"{ABANDON_MESSAGE}",
             "StatusMessage": ABANDON_MESSAGE,
             "Cause": "At 2026-11-21T08:00:00Z an instance was started in response to a difference between "
                      "desired and actual capacity, increasing the capacity from 1 to 2.",
             "StatusCode": "Cancelled", "StartTime": datetime(2026, 11, 21, 8, 0, 1, tzinfo=UTC)}
TIMED_OUT = {**ABANDONED, "StatusMessage": "Instance failed to complete user's Lifecycle Action: "
                                           "Lifecycle Action with token 95c60857 was abandoned: "
                                           "Heartbeat Timeout",
             "Description": "Launching a new EC2 instance: i-0ccc111122223333c"}
SCALED = {"Description": "Launching a new EC2 instance: i-0ddd111122223333d",
          "Cause": "At 2026-11-21T09:00:00Z a user request update of AutoScalingGroup constraints to min: 1, "
                   "max: 4, desired: 2 changing the desired capacity from 1 to 2.",
          "StatusCode": "Successful", "StartTime": datetime(2026, 11, 21, 9, 0, tzinfo=UTC)}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """A moto account with two groups of the dev stack and one of prod; the cost tag is active
    (moto has no ListCostAllocationTags: a Stubber answers it)."""
    monkeypatch.setattr(common, "cost_explorer", lambda spec: cost_explorer(ACTIVE))
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        boto3.client("ec2").create_launch_template(
            LaunchTemplateName="nodes",
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"})
        autoscaling = boto3.client("autoscaling")
        create_stack_groups(autoscaling, GROUPS, launch_template="nodes")
        yield autoscaling, boto3.client("cloudwatch")


def put_utilization(cloudwatch: Any, group: str, samples: list[tuple[float, float]]) -> None:
    """(minutes ago, percent) on the agent's per-group series."""
    now = datetime.now(UTC)
    dimensions = [{"Name": "AutoScalingGroupName", "Value": group}]
    cloudwatch.put_metric_data(Namespace="gpucluster/gpu-dev", MetricData=[
        {"MetricName": "nvidia_smi_utilization_gpu", "Dimensions": dimensions,
         "Timestamp": now - timedelta(minutes=ago), "Value": value, "Unit": "Percent"}
        for ago, value in samples])


def test_healthy_nodes_and_gpu_use_of_the_last_15_minutes(aws: tuple[Any, Any]) -> None:
    autoscaling, cloudwatch = aws
    put_utilization(cloudwatch, "dev-train", [(1, 90.0), (2, 100.0), (3, 20.0), (40, 0.0)])  # 40 min: too old
    [train] = autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=["dev-train"])["AutoScalingGroups"]
    autoscaling.set_instance_health(InstanceId=train["Instances"][0]["InstanceId"], HealthStatus="Unhealthy")
    rows = {r.name: r
            for r in stack_status(fleet_of(DEV), health=True, metric_namespace="gpucluster/gpu-dev")}
    assert set(rows) == {"dev-train", "dev-idle"}
    train_row = rows["dev-train"]
    assert (train_row.in_service, train_row.healthy) == (2, 1)
    assert train_row.gpu_utilization_avg == pytest.approx(70.0)
    assert train_row.gpu_utilization_max == 100.0
    idle = rows["dev-idle"]
    assert (idle.healthy, idle.gpu_utilization_avg, idle.gpu_utilization_max) == (1, None, None)  # no metric


def test_without_health_status_reads_nothing_more(aws: tuple[Any, Any]) -> None:
    class NoCloudWatch:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"status without health called CloudWatch {name}")

    rows = stack_status(fleet_of(DEV, cloudwatch=NoCloudWatch()))
    assert len(rows) == 2 and all(r.healthy is None and r.last_replacement is None for r in rows)


@pytest.mark.parametrize(("activity", "reason"), [
    (UNHEALTHY, "replaced: its health check marked it Unhealthy"),
    (ABANDONED, "abandoned at launch: failed its health check"),
    (TIMED_OUT, "abandoned at launch: its health check did not answer in time"),
    (SCALED, None),
])
def test_replacement_reasons_from_scaling_activities(activity: dict[str, Any], reason: str | None) -> None:
    assert replacement_reason(activity) == reason


class Activities:
    """An Auto Scaling client that answers DescribeScalingActivities (newest first), and records the call."""

    def __init__(self, activities: list[dict[str, Any]]) -> None:
        self.activities, self.calls = activities, []

    def describe_scaling_activities(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return {"Activities": self.activities}


def test_last_replacement_is_the_newest_health_activity() -> None:
    client = Activities([SCALED, ABANDONED, UNHEALTHY])
    assert last_replacement(client, "dev-train") == Replacement(
        time="2026-11-21T08:00:01+00:00", instance_id="i-0bbb111122223333b",
        reason="abandoned at launch: failed its health check")
    assert client.calls == [{"AutoScalingGroupName": "dev-train", "MaxRecords": 100}]
    assert last_replacement(Activities([SCALED]), "dev-train") is None


def test_cli_status_prints_health_and_the_dashboard(aws: tuple[Any, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _, cloudwatch = aws
    put_utilization(cloudwatch, "dev-train", [(1, 50.0), (2, 70.0)])
    from gpucluster.ops import status as ops

    monkeypatch.setattr(ops, "last_replacement", lambda _client, name: Replacement(
        "2026-11-21T08:00:01+00:00", "i-0bbb111122223333b", "abandoned at launch: failed its health check")
        if name == "dev-train" else None)
    result = runner.invoke(app, ["status", "dev"])
    assert result.exit_code == 0, result.output
    _, health, dashboard = result.output.strip().split("\n\n")
    lines = {line.split()[0]: line for line in joined_lines(health)[2:]}  # a long reason wraps
    assert max(len(line) for line in health.splitlines()) <= 100
    assert lines["dev-train"].split()[:4] == ["dev-train", "2/2", "60%", "70%"]
    assert lines["dev-train"].endswith("2026-11-21T08:00:01+00:00 i-0bbb111122223333b: abandoned at launch: "
                                       "failed its health check")
    assert lines["dev-idle"].split() == ["dev-idle", "1/1", "-", "-", "-"]
    # The spend line comes first (here unread: this Cost Explorer stub answers only the tag check).
    *spend_lines, dashboard_line = dashboard.splitlines()
    assert spend_lines[0].startswith("spend: spend not read:")
    assert dashboard_line == f"dashboard: {URL}"

    result = runner.invoke(app, ["status", "dev", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["stack"], data["region"], data["dashboard_url"]) == ("dev", "us-east-1", URL)
    train = next(g for g in data["groups"] if g["name"] == "dev-train")
    assert train == {"name": "dev-train", "min_size": 2, "desired_capacity": 2, "max_size": 4,
                     "in_service": 2, "stopped_by": None, "previous_desired": None, "node_group": None,
                     "healthy": 2,
                     "gpu_utilization_avg": 60.0, "gpu_utilization_max": 70.0,
                     "last_replacement": {"time": "2026-11-21T08:00:01+00:00",
                                          "instance_id": "i-0bbb111122223333b",
                                          "reason": "abandoned at launch: failed its health check"},
                     "getting_ready": 0, "getting_ready_seconds": None, "state": None}


def spend_explorer(settled: float) -> Any:
    """Cost Explorer: the cost tag is active, then the settled month-to-date figure."""
    from botocore.stub import ANY, Stubber

    client = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(client)
    stub.add_response("list_cost_allocation_tags", ACTIVE,
                      {"TagKeys": ["gpucluster:stack"], "Type": "UserDefined"})
    stub.add_response("get_cost_and_usage", {"ResultsByTime": [
        {"Total": {"UnblendedCost": {"Amount": str(settled), "Unit": "USD"}}}]},
        {"TimePeriod": ANY, "Granularity": "MONTHLY", "Metrics": ["UnblendedCost"],
         "Filter": {"Tags": {"Key": "gpucluster:stack", "Values": [DEV], "MatchOptions": ["EQUALS"]}}})
    stub.activate()
    return client


def test_status_shows_spend_burn_rate_and_when_the_limit_is_hit(aws: tuple[Any, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucluster.fleet.accrual import cost_period

    if cost_period(datetime.now(UTC)) is None:
        pytest.skip("the first two days of a month have no settled figure to stub")
    monkeypatch.setattr(common, "cost_explorer", lambda spec: spend_explorer(120.0))
    result = runner.invoke(app, ["status", "dev", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    spend, spec = data["spend"], load_stack("dev")[2]
    assert data["spend_error"] is None and data["groups"]  # the old keys stay
    # 3 g5.xlarge in service (moto launches them now) at the dev stack's rendered on-demand price,
    # plus its fixed costs an hour: the spend guard's own price table.
    from gpucluster.pricing import guard_prices

    table = guard_prices(spec)
    assert spend["usd_per_hour"] == pytest.approx(3 * table["on_demand"]["g5.xlarge"]
                                                  + table["fixed_usd_per_hour"], abs=0.01)
    assert spend["settled_usd"] == 120.0 and spend["month_to_date_usd"] > 120.0
    assert spend["limit_usd"] == 700.0 and spend["guard"] == "on"  # 700 x 100 %
    assert spend["hours_to_limit"] == pytest.approx(
        (700.0 - spend["month_to_date_usd"]) / spend["usd_per_hour"], rel=0.01)  # rounded cents
    monkeypatch.setattr(common, "cost_explorer", lambda spec: spend_explorer(120.0))
    text = runner.invoke(app, ["status", "dev"]).output
    assert "spend: $" in text and "burning $" in text and "limit $700.00: limit in" in " ".join(text.split())


def test_status_says_what_the_spend_figure_may_miss() -> None:
    """A figure with notes (a block priced by the hour, instances before the record) is never shown bare."""
    from gpucluster.cli.fleet import render_spend

    spend = {"month_to_date_usd": 10.0, "settled_usd": 5.0, "settled_through": "2026-11-19",
             "accrued_usd": 5.0, "usd_per_hour": 1.0, "limit_usd": 100.0, "hours_to_limit": 90.0,
             "limit_at": "2026-11-24T04:00+00:00", "over_limit": False, "guard": "on"}
    plain = render_spend(spend, None)
    noted = render_spend({**spend, "notes": ["instances that stopped before the record are not counted"]},
                         None)
    assert noted[:len(plain)] == plain
    said = " ".join(line.strip() for line in noted[len(plain):])
    assert said == "note: instances that stopped before the record are not counted"
