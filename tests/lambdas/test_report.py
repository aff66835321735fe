"""Spend report handler: Cost Explorer (Stubber), GPU metrics and groups (moto), one message on the topic."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from conftest import Cluster, Recorded, shared_client
from gpucluster.fleet import spendreport
from gpucluster.lambdas import report

NOW = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)  # a Monday: the weekly rule's time
FILTER = {"Tags": {"Key": "gpucluster:stack", "Values": ["dev"]}}

# Scheduled Event as EventBridge delivers it (EventBridge user guide, "Events from scheduled rules").
SCHEDULED = {"version": "0", "id": "89d1a02d-5ec7-412e-82f5-13505f849b41", "detail-type": "Scheduled Event",
             "source": "aws.events", "account": "123456789012", "time": "2026-11-23T08:00:00Z",
             "region": "us-east-1",
             "resources": ["arn:aws:events:us-east-1:123456789012:rule/dev-spend-report"],
             "detail": {}}


def group(key: str, purchase: str, usd: float) -> dict[str, Any]:
    return {"Keys": [f"gpucluster:node-group${key}", purchase],
            "Metrics": {"AmortizedCost": {"Amount": str(usd), "Unit": "USD"}}}


def period(start: date, end: date, groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {"TimePeriod": {"Start": start.isoformat(), "End": end.isoformat()}, "Total": {},
            "Groups": groups, "Estimated": False}


def ce_request(start: str, end: str, granularity: str) -> dict[str, Any]:
    return {"TimePeriod": {"Start": start, "End": end}, "Granularity": granularity,
            "Metrics": ["AmortizedCost"], "Filter": FILTER, "GroupBy": spendreport.GROUP_BY}


def stubbed_ce(forecast: float | None) -> Any:
    ce = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(ce)
    stub.add_response("get_cost_and_usage", {"ResultsByTime": [period(
        date(2026, 11, 1), date(2026, 11, 23),
        [group("", "On Demand Instances", 60.0), group("", "Spot Instances", 240.0)])]},
        ce_request("2026-11-01", "2026-11-23", "MONTHLY"))
    forecast_request = {"TimePeriod": {"Start": "2026-11-23", "End": "2026-12-01"},
                        "Metric": "AMORTIZED_COST", "Granularity": "MONTHLY", "Filter": FILTER}
    if forecast is None:
        stub.add_client_error("get_cost_forecast", "DataUnavailableException",
                              "Insufficient amount of historical data", expected_params=forecast_request)
    else:
        stub.add_response("get_cost_forecast", {"Total": {"Amount": str(forecast), "Unit": "USD"},
                                                "ForecastResultsByTime": []}, forecast_request)
    # The week: dev-train (untagged by node group here: the group's own name) and the remainder.
    monday = date(2026, 11, 16)
    stub.add_response("get_cost_and_usage", {"ResultsByTime": [
        period(monday, monday + timedelta(days=1), [group("dev-train", "Spot Instances", 24.0),
                                                    group("dev-infer", "Spot Instances", 6.0),
                                                    group("", "On Demand Instances", 3.0)]),
    ]}, ce_request("2026-11-16", "2026-11-23", "DAILY"))
    stub.activate()
    return ce, stub


def publish(asg: str, busy_minutes: int, idle_minutes: int) -> None:
    """Two GPUs, a sample each a minute from Monday 09:00 UTC: busy first, then idle."""
    start = datetime(2026, 11, 16, 9, tzinfo=UTC)
    data = [{"MetricName": spendreport.GPU_UTILIZATION_METRIC,
             "Dimensions": [{"Name": spendreport.GPU_METRIC_DIMENSION, "Value": asg}],
             "Timestamp": start + timedelta(minutes=m),
             "Values": [40.0, 10.0] if m < busy_minutes else [1.0, 0.0]}
            for m in range(busy_minutes + idle_minutes)]
    shared_client("cloudwatch").put_metric_data(Namespace=NAMESPACE, MetricData=data)


# The cluster's own namespace (gpucluster.noderole.gpu_metric_namespace), as the wiring sets it.
NAMESPACE = "gpucluster/test"


@pytest.fixture
def reporting(cluster: Cluster, recorded: Recorded, monkeypatch: pytest.MonkeyPatch) -> Recorded:
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    monkeypatch.setenv("REPORT_PERIOD", "weekly")
    monkeypatch.setenv("MONTHLY_LIMIT_USD", "700")
    monkeypatch.setenv("IDLE_THRESHOLD_PERCENT", "5")
    monkeypatch.setenv("GPU_METRIC_NAMESPACE", NAMESPACE)
    monkeypatch.setattr(spendreport.RUNTIME, "now", lambda: NOW)
    # Hourly periods: moto's GetMetricData scans every datapoint for every period it returns.
    monkeypatch.setattr(spendreport, "metric_period", lambda start, now: 3600)
    return recorded


def test_weekly_report_publishes_spend_forecast_waste_and_top_group(reporting: Recorded) -> None:
    publish("dev-train", busy_minutes=120, idle_minutes=120)   # 8 GPU-hours, 4 of them idle
    ce, stub = stubbed_ce(forecast=150.0)
    reporting.fakes["ce"] = ce
    summary = report.handler(SCHEDULED, None)
    stub.assert_no_pending_responses()
    assert summary["month_to_date_usd"] == 300.0
    assert summary["forecast_month_usd"] == 450.0
    assert summary["forecast_of_budget_percent"] == pytest.approx(64.3)
    assert summary["period"] == {"start": "2026-11-16", "end": "2026-11-23"}
    assert summary["period_spend_usd"] == 33.0
    assert summary["top_group"] == {"name": "dev-train", "usd": 24.0}
    waste = summary["idle_waste"]
    train = next(g for g in waste["groups"] if g["group"] == "dev-train")
    assert (train["gpu_hours"], train["idle_gpu_hours"]) == (8.0, 4.0)
    assert train["idle_usd"] == 12.0                       # half of $24, at $3 per GPU-hour paid
    assert waste["idle_usd"] == 12.0
    assert waste["share_of_gpu_spend_percent"] == 40.0     # 12 of the $30 the node groups cost
    [published] = reporting.of("sns", "publish")
    assert published["Subject"] == ("gpucluster dev: weekly spend $300 this month, forecast $450 of $700, "
                                    "idle $12")
    assert json.loads(published["Message"]) == summary
    # read-only: Cost Explorer and CloudWatch reads and the one message (describes go through paginators)
    assert set(reporting.timeline) == {"ce.get_cost_and_usage", "ce.get_cost_forecast",
                                       "cloudwatch.get_metric_data", "sns.publish"}


def test_without_a_forecast_the_report_still_goes_out(reporting: Recorded) -> None:
    ce, _ = stubbed_ce(forecast=None)
    reporting.fakes["ce"] = ce
    summary = report.handler(SCHEDULED, None)
    assert summary["forecast_month_usd"] is None and summary["forecast_of_budget_percent"] is None
    [published] = reporting.of("sns", "publish")
    assert published["Subject"].startswith("gpucluster dev: weekly spend $300 this month, idle $")


def test_other_events_are_ignored(reporting: Recorded) -> None:
    assert report.handler({"detail-type": "CloudWatch Alarm State Change"}, None)["action"] == "ignored"
    assert reporting.calls == {}


@pytest.mark.parametrize(("period_name", "today", "window"), [
    ("weekly", date(2026, 11, 23), (date(2026, 11, 16), date(2026, 11, 23))),
    ("monthly", date(2026, 11, 30), (date(2026, 11, 1), date(2026, 11, 30))),   # the rule's L: last day
])
def test_report_windows(period_name: str, today: date, window: tuple[date, date]) -> None:
    assert spendreport.report_window(period_name, today) == window
    assert spendreport.next_month(today) == date(2026, 12, 1)


@pytest.mark.parametrize(("value", "option"), [
    ("On Demand Instances", "on_demand"), ("Spot Instances", "spot"), ("Savings Plans", "savings_plan"),
    ("Standard Reserved Instances", "reserved"), ("Capacity Block", "capacity_block"),
    ("Dedicated Host", "Dedicated Host"),   # unknown: kept as AWS wrote it
])
def test_purchase_options(value: str, option: str) -> None:
    assert spendreport.purchase_option(value) == option
