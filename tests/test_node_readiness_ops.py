"""`nodes` and `status` show nodes still getting ready and how long; `run` targets none of them.

Auto Scaling holds a launched node in Pending:Wait until gpucluster-ready completes its launch hook;
its launch activity ends then. DescribeAutoScalingGroups and DescribeScalingActivities are stubbed
(botocore Stubber: moto does not hold instances in Pending:Wait), EC2 and SSM too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from gpucluster.cli.fleet import render_getting_ready, render_nodes
from gpucluster.fleet.tags import NODE_GROUP_TAG, STACK_TAG
from gpucluster.ops.nodes import launch_activities, readiness, stack_nodes
from gpucluster.ops.status import stack_status
from moto_groups import tags_fleet

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_guard_state_table() -> Any:
    """`status` looks the stack's guard-state table up (DynamoDB, moto here): this stack has none."""
    with mock_aws():
        yield

STACK = "organization/gpucluster/prod/gpu-prod"
ASG = "gpu-prod-h100-train-asg-5c65739"
READY, WAITING = "i-0aaaaaaaaaaaaaaa1", "i-0bbbbbbbbbbbbbbb2"
ACTIVITIES = [
    {"ActivityId": "2", "AutoScalingGroupName": ASG, "Cause": "scale out",
     "StatusCode": "MidLifecycleAction", "Description": f"Launching a new EC2 instance: {WAITING}",
     "StartTime": NOW - timedelta(minutes=6, seconds=5)},
    {"ActivityId": "1", "AutoScalingGroupName": ASG, "Cause": "scale out", "StatusCode": "Successful",
     "Description": f"Launching a new EC2 instance: {READY}", "StartTime": NOW - timedelta(hours=1),
     "EndTime": NOW - timedelta(hours=1) + timedelta(minutes=3, seconds=40)},
    {"ActivityId": "0", "AutoScalingGroupName": ASG, "Cause": "health", "StatusCode": "Successful",
     "Description": "Terminating EC2 instance: i-0ccccccccccccccc3", "StartTime": NOW - timedelta(hours=2)},
]


def group() -> dict[str, Any]:
    return {"AutoScalingGroupName": ASG, "MinSize": 0, "MaxSize": 4, "DesiredCapacity": 2,
            "DefaultCooldown": 300, "AvailabilityZones": ["us-east-1d"], "HealthCheckType": "EC2",
            "CreatedTime": NOW, "Tags": [{"Key": STACK_TAG, "Value": STACK}, {"Key": NODE_GROUP_TAG,
                                                                                 "Value": "h100-train"}],
            "Instances": [
                {"InstanceId": READY, "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1d",
                 "LifecycleState": "InService", "HealthStatus": "Healthy", "ProtectedFromScaleIn": False},
                {"InstanceId": WAITING, "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1d",
                 "LifecycleState": "Pending:Wait", "HealthStatus": "Healthy", "ProtectedFromScaleIn": False}]}


def client(service: str) -> tuple[Any, Stubber]:
    c = boto3.client(service, region_name="us-east-1", aws_access_key_id="x",
                     aws_secret_access_key="x")
    return c, Stubber(c)


def test_launch_activities_give_each_node_its_launch_start_and_end() -> None:
    found = launch_activities(ACTIVITIES)
    assert set(found) == {READY, WAITING}
    assert found[WAITING][1] is None  # still held: no end
    assert readiness("Pending:Wait", found[WAITING], None, NOW) == (None, 365.0)
    assert readiness("InService", found[READY], None, NOW) == (220.0, None)
    assert readiness("Pending", None, NOW - timedelta(seconds=30), NOW) == (None, 30.0)  # no activity yet
    assert readiness("InService", None, None, NOW) == (None, None)


def test_nodes_show_time_to_ready_and_run_would_target_only_the_ready_one() -> None:
    autoscaling, asg_stub = client("autoscaling")
    ec2, ec2_stub = client("ec2")
    ssm, ssm_stub = client("ssm")
    asg_stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [group()]}, {"Filters": ANY})
    ec2_stub.add_response("describe_instances", {"Reservations": [{"Instances": [
        {"InstanceId": i, "InstanceType": "p5.48xlarge", "State": {"Name": "running"},
         "LaunchTime": NOW - timedelta(hours=1)} for i in (READY, WAITING)]}]}, {"InstanceIds": ANY})
    ssm_stub.add_response("describe_instance_information", {"InstanceInformationList": []}, {"Filters": ANY})
    asg_stub.add_response("describe_scaling_activities", {"Activities": ACTIVITIES},
                          {"AutoScalingGroupName": ASG, "MaxRecords": 100})
    with asg_stub, ec2_stub, ssm_stub:
        nodes = stack_nodes(STACK, autoscaling_client=autoscaling, ec2_client=ec2, ssm_client=ssm,
                            now=NOW)
    by_id = {n.instance_id: n for n in nodes}
    assert by_id[READY].readiness == "ready in 3m40s" and by_id[READY].in_service
    assert by_id[WAITING].readiness == "getting ready 6m05s"
    assert not by_id[WAITING].in_service  # what `run`, `hostfile` and `jobs` select on
    assert by_id[WAITING].as_json()["getting_ready_seconds"] == 365.0
    table = "\n".join(render_nodes(nodes))
    assert "getting ready 6m05s" in table and "ready in 3m40s" in table


def test_status_counts_nodes_getting_ready_and_the_longest_wait() -> None:
    autoscaling, stub = client("autoscaling")
    stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [group()]}, {"Filters": ANY})
    stub.add_response("describe_scaling_activities", {"Activities": ACTIVITIES},
                      {"AutoScalingGroupName": ASG, "MaxRecords": 100})
    with stub:
        [row] = stack_status(tags_fleet(STACK, autoscaling), now=NOW)
    assert (row.in_service, row.getting_ready, row.getting_ready_seconds) == (1, 1, 365.0)
    assert render_getting_ready([row]) == [f"{ASG}: 1 node(s) getting ready, the longest for 6m05s"]


def test_a_group_with_every_node_in_service_asks_for_no_activities() -> None:
    autoscaling, stub = client("autoscaling")
    g = group()
    g["Instances"] = g["Instances"][:1]
    stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [g]}, {"Filters": ANY})
    with stub:
        [row] = stack_status(tags_fleet(STACK, autoscaling), now=NOW)
    stub.assert_no_pending_responses()
    assert (row.getting_ready, row.getting_ready_seconds) == (0, None)
