"""`gpucluster spend`: Cost Explorer pages (botocore Stubber), GPU metrics and groups (moto), the estimate.

The stack: two node groups (train: 2 x g5.12xlarge, one on a Savings Plan and one spot;
infer: 1 spot g5.xlarge) that run 08:00-18:00 UTC on weekdays. The window is the week
of Monday 2026-11-16. Cost Explorer answers in two pages; train was billed on Monday
only, when its four GPUs reported for ten hours, busy the first five and idle the last
five: its idle waste is half its cost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from typer.testing import CliRunner

from base_config import base
from gpucluster import pricing
from gpucluster.cli import app, common
from gpucluster.fleet import spendreport
from gpucluster.node import userdata
from gpucluster.noderole import gpu_metric_namespace
from gpucluster.ops import spend as ops
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec

runner = CliRunner()
MONDAY = date(2026, 11, 16)
WINDOW = ops.Window(MONDAY, MONDAY + timedelta(days=7))
# Two months later: CloudWatch has hourly data for the window (5-minute data is gone by then).
LATER = datetime(2027, 1, 20, tzinfo=UTC)

CLUSTER_NAME = "test"  # base_config's cluster.name: nodes publish into gpucluster/test
SP_12XL, SPOT_12XL, SPOT_XL = 5.672 * (1 - 0.28), 5.672 * (1 - 0.65), 1.006 * (1 - 0.65)
GP3, NAT_MONTH, IPV4_HOUR, ENDPOINT_HOUR = 0.08, 0.045 * 730 + 0.045 * 100, 0.005, 0.01
FLOW_LOGS_MONTH = 5 * 0.50 + 15 * 0.03 + 1.0  # VPC flow logs: 5 GB ingested, 3 months stored, the key


def training_spec(base_config: dict[str, Any]) -> StackSpec:
    base_config["gpucluster:node_groups"] = [
        {"name": "train", "instance_types": ["g5.12xlarge"], "desired_nodes": 2, "max_nodes": 4,
         "efa": "off", "capacity": {"on_demand_base": 1, "base_commitment": "savings_plan",
                                    "spot_percent": 100}},
        {"name": "infer", "instance_types": ["g5.xlarge"], "desired_nodes": 1, "max_nodes": 2,
         "capacity": {"spot_percent": 100}},
    ]
    base_config["gpucluster:autostop"] = {"stop_schedule": "cron(0 18 ? * * *)",
                                          "start_schedule": "cron(0 8 ? * MON-FRI *)"}
    return parse_stack_config(base_config, stack="team")


def group(key: str, purchase: str, usd: float) -> dict[str, Any]:
    return {"Keys": [f"gpucluster:node-group${key}", purchase],
            "Metrics": {"AmortizedCost": {"Amount": f"{usd:.2f}", "Unit": "USD"}}}


def day(d: date, groups: list[dict[str, Any]], estimated: bool = False) -> dict[str, Any]:
    return {"TimePeriod": {"Start": d.isoformat(), "End": (d + timedelta(days=1)).isoformat()},
            "Total": {}, "Groups": groups, "Estimated": estimated}


REMAINDER = ("", "On Demand Instances", 2.79)   # NAT, IPv4, endpoints: no node-group tag
INFER = ("infer", "Spot Instances", 3.52)
D = [MONDAY + timedelta(days=i) for i in range(7)]
PAGE_1 = {
    "GroupDefinitions": [{"Type": "TAG", "Key": "gpucluster:node-group"},
                         {"Type": "DIMENSION", "Key": "PURCHASE_TYPE"}],
    "ResultsByTime": [
        day(D[0], [group("train", "Savings Plans", 40.84), group("train", "Spot Instances", 19.85),
                   group("train", "On Demand Instances", 5.67), group(*INFER), group(*REMAINDER)]),
        day(D[1], [group(*INFER), group(*REMAINDER)]),
        day(D[2], [group(*INFER)]),
    ],
    "NextPageToken": "page-2", "DimensionValueAttributes": [],
}
PAGE_2 = {  # a page may continue a day the previous one began
    "ResultsByTime": [
        day(D[2], [group(*REMAINDER)]),
        day(D[3], [group(*INFER), group(*REMAINDER)]),
        day(D[4], [group(*INFER), group(*REMAINDER)]),
        day(D[5], [group(*REMAINDER)]),
        day(D[6], [group(*REMAINDER)], estimated=True),
    ],
    "DimensionValueAttributes": [],
}
TRAIN_USD = 40.84 + 19.85 + 5.67
INFER_USD = 5 * 3.52
REMAINDER_USD = 7 * 2.79


def request(ident: str, token: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {
        "TimePeriod": {"Start": "2026-11-16", "End": "2026-11-23"}, "Granularity": "DAILY",
        "Metrics": ["AmortizedCost"], "Filter": {"Tags": {"Key": "gpucluster:stack", "Values": [ident]}},
        "GroupBy": [{"Type": "TAG", "Key": "gpucluster:node-group"},
                    {"Type": "DIMENSION", "Key": "PURCHASE_TYPE"}]}
    if token:
        params["NextPageToken"] = token
    return params


def stubbed_ce(ident: str, tags: dict[str, str] | None = None,
               pages: tuple[dict[str, Any], ...] = (PAGE_1, PAGE_2)) -> tuple[Any, Stubber]:
    ce = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(ce)
    tokens = [None, *[p.get("NextPageToken") for p in pages[:-1]]]
    for page, token in zip(pages, tokens, strict=True):
        stub.add_response("get_cost_and_usage", page, request(ident, token))
    tags = tags or {"gpucluster:stack": "Active", "gpucluster:node-group": "Active"}
    stub.add_response("list_cost_allocation_tags",
                      {"CostAllocationTags": [{"TagKey": k, "Type": "UserDefined", "Status": v}
                                              for k, v in tags.items()]},
                      {"TagKeys": ["gpucluster:stack", "gpucluster:node-group"]})
    stub.activate()
    return ce, stub


BUSY = [12.0, 0.0, 0.0, 0.0]   # one GPU at 12 %: the busiest is above 5 % (an average, 3 %, is not)
IDLE = [3.0, 1.0, 0.0, 0.0]


def publish_train_day(cloudwatch: Any, asg: str, d: date = MONDAY) -> None:
    """Four GPUs, one sample each a minute, 07:00-17:00 UTC: busy until 12:00, idle after."""
    start = datetime(d.year, d.month, d.day, 7, tzinfo=UTC)
    data = [{"MetricName": userdata.GPU_UTILIZATION_METRIC,
             "Dimensions": [{"Name": userdata.GPU_METRIC_DIMENSION, "Value": asg}],
             "Timestamp": start + timedelta(minutes=m), "Values": BUSY if m < 300 else IDLE,
             "Unit": "Percent"} for m in range(600)]
    for first in range(0, len(data), 500):
        cloudwatch.put_metric_data(Namespace=gpu_metric_namespace(CLUSTER_NAME),
                                   MetricData=data[first:first + 500])


@pytest.fixture(scope="module")
def account() -> Iterator[dict[str, Any]]:
    """moto, once per module (the tests only read): the stack's two groups, tagged, and train's metrics."""
    spec = training_spec(base())
    with pytest.MonkeyPatch.context() as env, mock_aws():
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env.setenv(name, "testing")
        ec2 = boto3.client("ec2", region_name="us-east-1")
        template = {"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"}
        ec2.create_launch_template(LaunchTemplateName="gpu", LaunchTemplateData=template)
        autoscaling = boto3.client("autoscaling", region_name="us-east-1")
        for name, desired in (("train", 2), ("infer", 1)):
            asg = f"test-{name}-asg"
            autoscaling.create_auto_scaling_group(
                AutoScalingGroupName=asg, LaunchTemplate={"LaunchTemplateName": "gpu"}, MinSize=0,
                MaxSize=4, DesiredCapacity=desired, AvailabilityZones=["us-east-1a"],
                Tags=[{"ResourceId": asg, "ResourceType": "auto-scaling-group", "Key": key, "Value": value,
                       "PropagateAtLaunch": True}
                      for key, value in (("gpucluster:stack", spec.identity),
                                         ("gpucluster:node-group", name))])
        cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
        publish_train_day(cloudwatch, "test-train-asg")
        yield {"spec": spec, "cloudwatch": cloudwatch, "autoscaling": autoscaling}


def estimate_by_hand() -> float:
    hours = 5 * 10                                            # weekdays 08:00-18:00 UTC
    train = (SP_12XL + SPOT_12XL) * hours + 2 * 200 * GP3 * hours / 730
    infer = SPOT_XL * hours + 200 * GP3 * hours / 730
    other = (NAT_MONTH + IPV4_HOUR * 730 + 3 * 2 * ENDPOINT_HOUR * 730 + FLOW_LOGS_MONTH) * 7 * 24 / 730
    return train + infer + other                              # 344.77


def test_spend_reads_every_page_and_groups_by_node_group_and_purchase_option(account: dict[str, Any]) -> None:
    spec = account["spec"]
    ce, stub = stubbed_ce(spec.identity)
    result = ops.stack_spend(spec, WINDOW, ce=ce, cloudwatch=account["cloudwatch"],
                             autoscaling=account["autoscaling"], now=LATER)
    stub.assert_no_pending_responses()
    assert result.actual == pytest.approx(TRAIN_USD + INFER_USD + REMAINDER_USD)      # 103.49
    assert result.by_group_and_purchase() == {
        "train": {"savings_plan": pytest.approx(40.84), "spot": pytest.approx(19.85),
                  "on_demand": pytest.approx(5.67)},
        "infer": {"spot": pytest.approx(INFER_USD)},
        None: {"on_demand": pytest.approx(REMAINDER_USD)},
    }
    assert result.estimated_days
    assert result.estimate.running_hours == 50
    assert result.estimate.total == pytest.approx(estimate_by_hand())
    assert result.estimate.by_day[D[5]] == pytest.approx(result.estimate.by_day[D[6]])  # weekend: no nodes
    assert result.gap == pytest.approx(103.49 - estimate_by_hand())
    assert result.gap_is_large
    assert result.reasons == ("idle, schedule, lifetime and budget stops only remove hours: the estimate "
                              "is an upper bound; and Cost Explorer's last day can lag up to 24 hours",)


def test_idle_waste_of_a_group_idle_half_the_time_is_half_its_cost(account: dict[str, Any]) -> None:
    spec = account["spec"]
    ce, _ = stubbed_ce(spec.identity)
    waste = ops.stack_spend(spec, WINDOW, ce=ce, cloudwatch=account["cloudwatch"],
                            autoscaling=account["autoscaling"], now=LATER).waste
    train, infer = {g.group: g for g in waste.groups}["train"], {g.group: g for g in waste.groups}["infer"]
    assert (train.usage.gpu_hours, train.usage.idle_gpu_hours) == (40, 20)   # 4 GPUs x 10 h, 5 of them idle
    assert train.usd_per_gpu_hour == pytest.approx(TRAIN_USD / 40)           # what train paid per GPU-hour
    assert train.idle_usd == pytest.approx(TRAIN_USD / 2)                    # 33.18
    # infer reported no GPU metrics: nothing idle, priced at the estimate's rate
    assert (infer.usage.gpu_hours, infer.idle_usd, infer.usd_per_gpu_hour) == (0, 0, pytest.approx(SPOT_XL))
    assert waste.idle_usd == pytest.approx(TRAIN_USD / 2)
    assert waste.share_percent == pytest.approx(100 * (TRAIN_USD / 2) / (TRAIN_USD + INFER_USD))  # 39.5 %


def test_gpu_usage_at_one_minute_and_five_minute_periods(account: dict[str, Any]) -> None:
    start = datetime(2026, 11, 16, 7, tzinfo=UTC)
    for period in (60, 300):
        usage = spendreport.gpu_usage(account["cloudwatch"], gpu_metric_namespace(CLUSTER_NAME),
                                 ["test-train-asg", "test-infer-asg"], start,
                                 start + timedelta(hours=10), 5.0, period)
        assert usage["test-train-asg"] == {MONDAY: spendreport.Usage(40, 20)}
        assert usage["test-infer-asg"] == {}


def test_the_metric_contract_is_the_node_bootstraps() -> None:
    assert (spendreport.GPU_UTILIZATION_METRIC, spendreport.GPU_METRIC_DIMENSION,
            spendreport.GPU_SAMPLE_SECONDS) == (
        userdata.GPU_UTILIZATION_METRIC, userdata.GPU_METRIC_DIMENSION, userdata.GPU_METRIC_PERIOD_SECONDS)
    from gpucluster.aws import nodes

    assert spendreport.NODE_GROUP_TAG == nodes.NODE_GROUP_TAG == "gpucluster:node-group"


def test_the_gap_names_inactive_tags_and_short_spot(account: dict[str, Any]) -> None:
    spec = account["spec"]
    short = {"ResultsByTime": [day(D[0], [group("train", "On Demand Instances", 120.0),
                                          group("train", "Spot Instances", 5.0)])],
             "DimensionValueAttributes": []}
    ce, _ = stubbed_ce(spec.identity, {"gpucluster:stack": "Active", "gpucluster:node-group": "Inactive"},
                       pages=(short,))
    result = ops.stack_spend(spec, WINDOW, ce=ce, cloudwatch=account["cloudwatch"],
                             autoscaling=account["autoscaling"], now=LATER)
    assert result.reasons[0] == ("the cost allocation tag gpucluster:node-group is Inactive: node costs land "
                                 "in the non-GPU remainder instead of their group")
    expected = 100 * SPOT_12XL / (SP_12XL + SPOT_12XL)                      # 33 %
    assert result.reasons[1] == (f"node group train: spot was 4 % of its cost, the configured mix makes it "
                                 f"{expected:.0f} %: spot capacity was short and nodes ran on-demand")


def test_no_cost_data_because_the_stack_tag_is_not_active(account: dict[str, Any]) -> None:
    spec = account["spec"]
    empty = {"ResultsByTime": [day(d, []) for d in D], "DimensionValueAttributes": []}
    ce, _ = stubbed_ce(spec.identity, {"gpucluster:stack": "Inactive"}, pages=(empty,))
    result = ops.stack_spend(spec, WINDOW, ce=ce, cloudwatch=account["cloudwatch"],
                             autoscaling=account["autoscaling"], now=LATER)
    assert result.actual == 0 and result.gap_is_large
    assert result.reasons[0].startswith("the cost allocation tag gpucluster:stack is Inactive, not Active")
    assert result.reasons[1].startswith("the cost allocation tag gpucluster:node-group is not seen")
    assert result.tag_status == {"gpucluster:stack": "Inactive", "gpucluster:node-group": "not seen"}
    # no billed cost for train: its idle hours are priced at the estimate's rate per GPU-hour
    train = next(g for g in result.waste.groups if g.group == "train")
    assert train.usd_per_gpu_hour == pytest.approx((SP_12XL + SPOT_12XL) / 2 / 4)
    assert train.basis.startswith("estimate")


def test_nodes_above_desired_explain_a_gap(account: dict[str, Any], base_config: dict[str, Any]) -> None:
    spec = account["spec"]
    one = spec.model_copy(update={"node_groups": [spec.node_groups[0].model_copy(update={"desired_nodes": 0}),
                                                  spec.node_groups[1]]})
    ce, _ = stubbed_ce(spec.identity)
    result = ops.stack_spend(one, WINDOW, ce=ce, cloudwatch=account["cloudwatch"],
                             autoscaling=account["autoscaling"], now=LATER)
    assert ("node group train ran 10.0 node-hours, the estimate counts 0.0 (desired_nodes x the scheduled "
            "hours): nodes above desired, or running outside the schedule") in result.reasons
    assert "node group train is at 2 desired nodes now, the stack file says 0" in result.reasons


@pytest.mark.parametrize(("days", "month", "window"), [
    (None, None, (date(2026, 11, 16), date(2026, 11, 23))),
    (30, None, (date(2026, 10, 24), date(2026, 11, 23))),
    (None, "2026-10", (date(2026, 10, 1), date(2026, 11, 1))),
    (None, "2026-11", (date(2026, 11, 1), date(2026, 11, 23))),   # this month: up to today
])
def test_windows(days: int | None, month: str | None, window: tuple[date, date]) -> None:
    got = ops.window_for(date(2026, 11, 23), days, month)
    assert (got.start, got.end) == window


@pytest.mark.parametrize(("args", "message"), [
    (["--days", "0"], "spend: --days: must be 1..366, got 0"),
    (["--month", "2026-13"], "spend: --month: expected YYYY-MM, got '2026-13'"),
    (["--month", "2099-01"], "spend: --month 2099-01 has no finished day yet"),
    (["--days", "3", "--month", "2026-10"], "spend: give --days or --month, not both"),
])
def test_bad_windows_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["spend", "dev", *args])
    assert result.exit_code == 2
    assert result.output.strip().startswith(message)


@pytest.fixture
def cli_clients(account: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                tmp_path: Path) -> dict[str, Any]:
    """`gpucluster spend` on the fake account: the stack file written out, today fixed."""
    from gpucluster.cli import spend as cli

    spec = account["spec"]
    ce, _ = stubbed_ce(spec.identity)
    by_service = {"ce": ce, "cloudwatch": account["cloudwatch"], "autoscaling": account["autoscaling"]}
    monkeypatch.setattr(common, "client", lambda spec, service: by_service[service])
    monkeypatch.setattr(cli, "datetime", _FixedNow)
    monkeypatch.setattr(ops, "datetime", _FixedNow)
    # Hourly periods, as two months later: moto's GetMetricData scans every datapoint per period.
    monkeypatch.setattr(ops, "metric_period", lambda start, now: 3600)
    return {"spec": spec}


class _FixedNow(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return datetime(2026, 11, 23, 9, tzinfo=UTC) if tz is None else datetime(2026, 11, 23, 9, tzinfo=tz)


def write_stack(spec: StackSpec, base_config: dict[str, Any], tmp_path: Path) -> Path:
    import yaml

    training_spec(base_config)  # the same stack file as the account's
    path = tmp_path / "Pulumi.team.yaml"
    path.write_text(yaml.safe_dump({"config": base_config}))
    return path


def test_spend_cli_table_and_chart(cli_clients: dict[str, Any], base_config: dict[str, Any],
                                        tmp_path: Path) -> None:
    stack = write_stack(cli_clients["spec"], base_config, tmp_path)
    chart = tmp_path / "spend.png"
    result = runner.invoke(app, ["spend", str(stack), "--chart", str(chart)])
    assert result.exit_code == 0, result.output
    out, flat = result.output, " ".join(result.output.split())  # prose wraps at 100 columns
    assert "2026-11-16 .. 2026-11-23 (exclusive), 7 day(s), UTC" in flat
    assert (f"actual $103.49 (Cost Explorer, amortized) against the estimate "
            f"${estimate_by_hand():,.2f}") in flat
    assert "actual $  estimate $  on-demand $  Savings Plan covered $  spot $" in out
    train_estimate = (SP_12XL + SPOT_12XL) * 50 + 32 * 50 / 730
    row = f"  node group train      66.36      {train_estimate:.2f}         5.67{' ' * 19}40.84   19.85"
    assert row in out
    assert "  non-GPU remainder     19.53       20.42        19.53" in out  # estimate: flow logs too
    share = 100 * 33.18 / (TRAIN_USD + INFER_USD)
    assert f"idle waste: $33.18, {share:.1f} % of the GPU spend ($83.96)" in flat
    assert "why the gap is large (most likely first):" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spend_cli_json(cli_clients: dict[str, Any], base_config: dict[str, Any], tmp_path: Path) -> None:
    stack = write_stack(cli_clients["spec"], base_config, tmp_path)
    result = runner.invoke(app, ["spend", str(stack), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["actual_usd"] == 103.49 and doc["estimate_usd"] == round(estimate_by_hand(), 2)
    assert doc["node_groups"][0] == {"name": "train", "actual_usd": 66.36,
                                     "estimate_usd": round((SP_12XL + SPOT_12XL) * 50 + 32 * 50 / 730, 2),
                                     "by_purchase_option_usd": {"on-demand": 5.67, "spot": 19.85,
                                                                "Savings Plan covered": 40.84}}
    assert doc["non_gpu"]["actual_usd"] == 19.53
    assert [d["day"] for d in doc["daily"]] == [d.isoformat() for d in D]
    assert doc["daily"][0]["actual_usd"] == round(TRAIN_USD + 3.52 + 2.79, 2)
    assert [(g["group"], g["idle_gpu_hours"]) for g in doc["idle_waste"]["groups"]] == [("infer", 0),
                                                                                        ("train", 20)]
    assert doc["cost_allocation_tags"] == {"gpucluster:stack": "Active", "gpucluster:node-group": "Active"}


def test_spend_chart_series_are_the_report(account: dict[str, Any]) -> None:
    from gpucluster.chart import spend_series

    spec = account["spec"]
    ce, _ = stubbed_ce(spec.identity)
    result = ops.stack_spend(spec, WINDOW, ce=ce, cloudwatch=account["cloudwatch"],
                             autoscaling=account["autoscaling"], now=LATER)
    series = spend_series(result)
    assert [name for name, _ in series["actual"]] == ["node group infer", "node group train",
                                                      "non-GPU remainder"]
    assert sum(sum(values) for _, values in series["actual"]) == pytest.approx(result.actual)
    assert series["estimate"] == [result.estimate.by_day[d] for d in D]


def test_an_aws_error_is_one_line_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    ce = boto3.client("ce", region_name="us-east-1")
    stub = Stubber(ce)
    stub.add_client_error("get_cost_and_usage", "AccessDeniedException",
                          "not authorized to ce:GetCostAndUsage")
    stub.activate()
    monkeypatch.setattr(common, "client", lambda spec, service: {"ce": ce}.get(service))
    result = runner.invoke(app, ["spend", "dev"])
    assert result.exit_code == 2
    assert result.output.startswith("spend: AWS said: An error occurred (AccessDeniedException)")
    assert "Traceback" not in result.output


def test_estimate_prices_the_same_days_with_pricing(account: dict[str, Any]) -> None:
    cost = pricing.price_stack(account["spec"])
    est = ops.estimate_window(cost, account["spec"], WINDOW)
    assert est.node_hours == {"train": 2 * 50, "infer": 1 * 50}
    assert est.by_day[D[0]] == pytest.approx((SP_12XL + SPOT_12XL + SPOT_XL) * 10 + 3 * 200 * GP3 * 10 / 730
                                             + (NAT_MONTH + 3.65 + 43.8 + FLOW_LOGS_MONTH) * 24 / 730)


def test_a_capacity_block_is_spread_over_the_days_whatever_the_schedule(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1a"]
    base_config["gpucluster:node_groups"] = [{
        "name": "block", "instance_types": ["p5.48xlarge"], "desired_nodes": 2, "max_nodes": 2,
        "root_volume_size_gib": 100,
        "capacity": {"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0",
                     "duration_hours": 72}}]
    base_config["gpucluster:autostop"] = {"stop_schedule": "cron(0 18 ? * * *)",
                                          "start_schedule": "cron(0 8 ? * MON-FRI *)"}
    spec = parse_stack_config(base_config, stack="block")
    est = ops.estimate_window(pricing.price_stack(spec), spec, WINDOW)
    # 2 nodes x $31.46 x 72 h and their volumes for 72 h, a month's worth spread over 730 hours
    block_month = 2 * 31.46 * 72 + 2 * 100 * GP3 * 72 / 730
    assert est.by_group["block"] == pytest.approx(block_month * 7 * 24 / 730)
    assert est.by_day[D[0]] == pytest.approx(est.by_day[D[6]])   # the weekend too: it is paid for
