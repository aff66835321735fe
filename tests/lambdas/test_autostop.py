"""Auto-stop handler: idle alarms and schedules, against a moto account with two stacks."""

from __future__ import annotations

import copy
import shlex
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpucluster.fleet import asg, nodegroups, runtime
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STATE_TAGS, STOPPED_BY_TAG
from gpucluster.lambdas import autostop

HOOK = "/opt/gpucluster/checkpoint.sh --reason stop"


def alarm_event(
    state: str = "ALARM",
    alarm_name: str = "dev-train-idle",
    dimensions: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A single-metric alarm event (CloudWatch user guide, "Alarm events and EventBridge")."""
    if dimensions is None:
        dimensions = {"AutoScalingGroupName": "dev-train"}
    return {
        "version": "0",
        "id": "c4c1c1c9-6542-e61b-6ef0-8c4d36933a92",
        "detail-type": "CloudWatch Alarm State Change",
        "source": "aws.cloudwatch",
        "account": "123456789012",
        "time": "2026-11-21T17:04:40Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{alarm_name}"],
        "detail": {
            "alarmName": alarm_name,
            "configuration": {
                "description": "GPU utilisation under 5% for 30 minutes",
                "metrics": [
                    {
                        "id": "30b6c6b2-a864-43a2-4877-c09a1afc3b87",
                        "metricStat": {
                            "metric": {
                                "dimensions": dimensions,
                                "name": "nvidia_smi_utilization_gpu",
                                "namespace": "CWAgent",
                            },
                            "period": 300,
                            "stat": "Maximum",
                        },
                        "returnData": True,
                    }
                ],
            },
            "previousState": {
                "reason": "Threshold Crossed: 1 datapoint [41.0] was not less than the threshold.",
                "timestamp": "2026-11-21T16:04:40.985+0000",
                "value": "OK" if state == "ALARM" else "ALARM",
            },
            "state": {
                "reason": "Threshold Crossed: 6 datapoints were less than the threshold (5.0).",
                "timestamp": "2026-11-21T17:04:40.989+0000",
                "value": state,
            },
        },
    }


def metric_math_alarm_event() -> dict[str, Any]:
    """A metric-math alarm: an expression entry plus the metric it reads (same guide)."""
    event = alarm_event(alarm_name="gpu-idle-math")
    metric = event["detail"]["configuration"]["metrics"][0]
    metric.update(id="m1", returnData=False)
    metric["metricStat"]["metric"]["dimensions"] = {"AutoScalingGroupName": "dev-infer"}
    event["detail"]["configuration"]["metrics"] = [
        {"id": "e1", "expression": "MAX(METRICS())", "label": "gpu max", "returnData": True},
        metric,
    ]
    return event


def schedule_event(rule: str, bus: str | None = None) -> dict[str, Any]:
    """A scheduled rule's event (EventBridge user guide, "Scheduled Event")."""
    path = f"rule/{bus}/{rule}" if bus else f"rule/{rule}"
    return {
        "version": "0",
        "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": "2026-11-21T19:00:00Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:events:us-east-1:123456789012:{path}"],
        "detail": {},
    }


class LambdaContext:
    """The one context method the handlers use."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


# --- idle alarm -------------------------------------------------------------------------------


def test_idle_alarm_stops_only_its_group(cluster, recorded) -> None:
    result = autostop.handler(alarm_event(), None)

    assert result["action"] == "stopped"
    assert result["groups"] == ["dev-train"]
    assert cluster.capacity("dev-train") == (0, 0)
    tags = cluster.tags("dev-train")
    assert tags[STOPPED_BY_TAG] == "idle"
    assert tags[PREVIOUS_DESIRED_TAG] == "2"
    assert tags[PREVIOUS_MIN_TAG] == "1"
    assert cluster.capacity("dev-infer") == (0, 1)
    assert cluster.capacity("prod-train") == (1, 1)
    assert STOPPED_BY_TAG not in cluster.tags("dev-infer")


def test_idle_hook_goes_to_exactly_the_groups_instances(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    train_instances = cluster.instances("dev-train")
    assert len(train_instances) == 2

    result = autostop.handler(alarm_event(), None)

    sent = recorded.of("ssm", "send_command")
    assert len(sent) == 1
    assert sorted(sent[0]["InstanceIds"]) == train_instances
    assert sent[0]["DocumentName"] == "AWS-RunShellScript"
    commands = sent[0]["Parameters"]["commands"]
    assert commands[-1] == HOOK
    assert "export GPUCLUSTER_STOP_REASON=idle" in commands
    assert sent[0]["Parameters"]["executionTimeout"] == ["300"]
    polled = {c["InstanceId"] for c in recorded.of("ssm", "get_command_invocation")}
    assert polled == set(train_instances)
    assert result["hook"] == {"ok": True, "timed_out": False}
    # The hook finished before the stop began.
    timeline = recorded.timeline
    last_poll = max(i for i, c in enumerate(timeline) if c == "ssm.get_command_invocation")
    assert last_poll < timeline.index("autoscaling.update_auto_scaling_group")
    assert cluster.capacity("dev-train") == (0, 0)


def test_second_alarm_is_a_no_op(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    autostop.handler(alarm_event(), None)
    tags = cluster.tags("dev-train")

    result = autostop.handler(alarm_event(), None)

    assert result["action"] == "unchanged"
    assert result["outcomes"] == {"dev-train": nodegroups.ALREADY_STOPPED}
    assert cluster.tags("dev-train") == tags
    assert tags[PREVIOUS_DESIRED_TAG] == "2"
    assert len(recorded.of("ssm", "send_command")) == 1
    assert len(recorded.of("autoscaling", "update_auto_scaling_group")) == 1


def test_metric_math_alarm_finds_the_group_in_any_metric(cluster, recorded) -> None:
    result = autostop.handler(metric_math_alarm_event(), None)

    assert result["groups"] == ["dev-infer"]
    assert cluster.capacity("dev-infer") == (0, 0)
    assert cluster.capacity("dev-train") == (1, 2)


def test_alarm_without_group_dimension_falls_back_to_its_name(cluster, recorded) -> None:
    event = alarm_event(
        alarm_name="dev-infer-idle", dimensions={"InstanceId": "i-0123456789abcdef0"}
    )

    result = autostop.handler(event, None)

    assert result["groups"] == ["dev-infer"]
    assert cluster.tags("dev-infer")[STOPPED_BY_TAG] == "idle"


@pytest.mark.parametrize("state", ["OK", "INSUFFICIENT_DATA"])
def test_alarm_not_in_alarm_state_is_ignored(cluster, recorded, state) -> None:
    result = autostop.handler(alarm_event(state=state), None)

    assert result["action"] == "ignored"
    assert cluster.capacity("dev-train") == (1, 2)


def test_alarm_for_another_stacks_group_is_ignored(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    event = alarm_event(
        alarm_name="prod-train-idle", dimensions={"AutoScalingGroupName": "prod-train"}
    )

    result = autostop.handler(event, None)

    assert result["action"] == "ignored"
    assert cluster.capacity("prod-train") == (1, 1)
    assert STOPPED_BY_TAG not in cluster.tags("prod-train")
    assert recorded.of("ssm", "send_command") == []


def test_alarm_for_unknown_group_is_ignored(cluster, recorded) -> None:
    event = alarm_event(alarm_name="x", dimensions={"AutoScalingGroupName": "no-such-group"})

    assert autostop.handler(event, None)["action"] == "ignored"


def test_stuck_hook_is_abandoned_at_the_timeout_and_the_stop_proceeds(
    cluster, recorded, stuck_ssm, monkeypatch
) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    monkeypatch.setenv("PRE_STOP_TIMEOUT_SECONDS", "40")
    instances = cluster.instances("dev-train")
    start = recorded.clock.now

    result = autostop.handler(alarm_event(), None)

    waited = recorded.clock.now - start
    assert 40 <= waited <= 40 + 5
    assert result["hook"] == {
        "ok": False,
        "timed_out": True,
        "failed": dict.fromkeys(instances, "InProgress"),
    }
    assert cluster.capacity("dev-train") == (0, 0)
    assert len(stuck_ssm.sent) == 1


def test_hook_wait_is_capped_by_the_lambdas_remaining_time(
    cluster, recorded, stuck_ssm, monkeypatch
) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)  # default timeout 300 s
    start = recorded.clock.now

    autostop.handler(alarm_event(), LambdaContext(remaining_ms=60_000))

    assert recorded.clock.now - start <= 60 - 15
    assert cluster.capacity("dev-train") == (0, 0)


def test_hook_that_cannot_be_sent_does_not_block_the_stop(cluster, recorded, monkeypatch) -> None:
    class BrokenSSM:
        def send_command(self, **kwargs: Any) -> dict[str, Any]:
            from botocore.exceptions import ClientError

            error = {"Error": {"Code": "InvalidInstanceId", "Message": "not managed"}}
            raise ClientError(error, "SendCommand")

    recorded.fakes["ssm"] = BrokenSSM()
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)

    result = autostop.handler(alarm_event(), None)

    assert result["hook"]["ok"] is False
    assert cluster.capacity("dev-train") == (0, 0)


# --- schedule ---------------------------------------------------------------------------------


def test_schedule_stop_stops_every_group_of_the_stack(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    dev_instances = cluster.instances("dev-train") + cluster.instances("dev-infer")

    result = autostop.handler(schedule_event("gpucluster-dev-stop"), None)

    assert result["groups"] == ["dev-infer", "dev-train"]
    for name in ("dev-train", "dev-infer"):
        assert cluster.capacity(name) == (0, 0)
        assert cluster.tags(name)[STOPPED_BY_TAG] == "schedule"
    assert cluster.capacity("prod-train") == (1, 1)
    sent = recorded.of("ssm", "send_command")
    assert len(sent) == 1
    assert sorted(sent[0]["InstanceIds"]) == sorted(dev_instances)
    assert (
        f"export GPUCLUSTER_STOP_REASON={shlex.quote('schedule')}"
        in sent[0]["Parameters"]["commands"]
    )


def test_schedule_start_resumes_what_the_schedule_stopped(cluster, recorded) -> None:
    autostop.handler(schedule_event("gpucluster-dev-stop"), None)

    result = autostop.handler(schedule_event("gpucluster-dev-start"), None)

    assert result["action"] == "started"
    assert result["groups"] == ["dev-infer", "dev-train"]
    assert cluster.capacity("dev-train") == (1, 2)
    assert cluster.capacity("dev-infer") == (0, 1)
    for name in ("dev-train", "dev-infer"):
        assert not set(STATE_TAGS) & set(cluster.tags(name))


def test_schedule_start_never_undoes_a_budget_or_idle_stop(cluster, recorded) -> None:
    asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "budget")
    asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-infer"), "idle")

    result = autostop.handler(schedule_event("gpucluster-dev-start"), None)

    assert result["action"] == "unchanged"
    assert cluster.capacity("dev-train") == (0, 0)
    assert cluster.tags("dev-train")[STOPPED_BY_TAG] == "budget"
    assert cluster.capacity("dev-infer") == (0, 0)
    assert cluster.tags("dev-infer")[STOPPED_BY_TAG] == "idle"


def test_schedule_start_after_stop_and_budget_keeps_the_budget_stop(cluster, recorded) -> None:
    autostop.handler(schedule_event("gpucluster-dev-stop"), None)
    asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "budget")

    result = autostop.handler(schedule_event("gpucluster-dev-start"), None)

    assert result["groups"] == ["dev-infer"]
    assert cluster.capacity("dev-train") == (0, 0)
    assert cluster.capacity("dev-infer") == (0, 1)


def test_schedule_rule_on_a_custom_bus_is_understood(cluster, recorded) -> None:
    result = autostop.handler(schedule_event("gpucluster-dev-stop", bus="ops-bus"), None)

    assert result["action"] == "stopped"


def test_lifetime_stops_groups_running_too_long(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("MAX_LIFETIME_HOURS", "12")
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: datetime.now(UTC) + timedelta(hours=13))

    result = autostop.handler(schedule_event("gpucluster-dev-lifetime"), None)

    assert result["groups"] == ["dev-infer", "dev-train"]
    assert cluster.tags("dev-train")[STOPPED_BY_TAG] == "lifetime"
    assert cluster.capacity("prod-train") == (1, 1)


def test_lifetime_leaves_young_groups_running(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("MAX_LIFETIME_HOURS", "12")
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: datetime.now(UTC) + timedelta(hours=11))

    result = autostop.handler(schedule_event("gpucluster-dev-lifetime"), None)

    assert result["action"] == "unchanged"
    assert cluster.capacity("dev-train") == (1, 2)


def test_lifetime_without_a_limit_is_ignored(cluster, recorded) -> None:
    result = autostop.handler(schedule_event("gpucluster-dev-lifetime"), None)

    assert result["action"] == "ignored"
    assert cluster.capacity("dev-train") == (1, 2)


def _without(event: dict[str, Any], *path: str) -> dict[str, Any]:
    event = copy.deepcopy(event)
    target = event
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return event


@pytest.mark.parametrize(
    "event",
    [
        {},
        None,
        "Scheduled Event",
        [alarm_event()],
        {"detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2"},
        {"detail-type": "CloudWatch Alarm State Change"},
        {**alarm_event(), "source": "aws.ec2"},
        {**alarm_event(), "detail": "ALARM"},
        _without(alarm_event(), "detail", "state"),
        _without(alarm_event(alarm_name="nameless"), "detail", "configuration"),
        {**alarm_event(), "detail": {"state": {"value": "ALARM"}, "configuration": {"metrics": 7}}},
        schedule_event("gpucluster-dev-nightly"),
        {**schedule_event("x-stop"), "resources": []},
        {**schedule_event("x-stop"), "resources": 5},
        {**schedule_event("x-stop"), "resources": ["arn:aws:sns:us-east-1:1:topic-stop"]},
        {**schedule_event("x-stop"), "source": "my.app"},
    ],
)
def test_malformed_or_foreign_events_are_ignored(cluster, recorded, event) -> None:
    result = autostop.handler(event, None)

    assert result["action"] == "ignored"
    assert cluster.capacity("dev-train") == (1, 2)
    assert cluster.capacity("dev-infer") == (0, 1)
    assert recorded.of("autoscaling", "update_auto_scaling_group") == []


class UnregisteredNode:
    """The moto SSM client, except that one instance is not a managed node.

    Like SendCommand in AWS, a call naming that instance fails as a whole with
    InvalidInstanceId (moto does not model SSM registration).
    """

    def __init__(self, real: Any, bad: str) -> None:
        self.real, self.bad = real, bad

    def send_command(self, **kwargs: Any) -> dict[str, Any]:
        if self.bad in kwargs["InstanceIds"]:
            from botocore.exceptions import ClientError

            message = f"Instances [[{self.bad}]] not in a valid state for account 123456789012"
            raise ClientError({"Error": {"Code": "InvalidInstanceId", "Message": message}},
                              "SendCommand")
        return self.real.send_command(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_one_unreachable_node_does_not_cancel_the_others_checkpoint(
    cluster, recorded, monkeypatch
) -> None:
    import boto3

    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    train = cluster.instances("dev-train")
    infer = cluster.instances("dev-infer")
    bad = infer[0]
    recorded.fakes["ssm"] = UnregisteredNode(boto3.client("ssm", region_name="us-east-1"), bad)

    result = autostop.handler(schedule_event("gpucluster-dev-stop"), None)

    sent = [sorted(c["InstanceIds"]) for c in recorded.of("ssm", "send_command")]
    assert sent[0] == sorted(train + infer)  # the batch, refused for the one bad node
    assert sorted(sent[1:]) == sorted([i] for i in train + infer)  # then each node alone
    polled = {c["InstanceId"] for c in recorded.of("ssm", "get_command_invocation")}
    assert polled == set(train)
    assert result["hook"]["ok"] is False
    assert list(result["hook"]["not_sent"]) == [bad]
    assert result["hook"]["failed"] == {bad: "NotSent"}
    assert result["groups"] == ["dev-infer", "dev-train"]  # the stop itself went on
    published = recorded.of("sns", "publish")
    assert len(published) == 1
    assert "pre-stop hook failed on 1 node(s)" in published[0]["Subject"]
    assert bad in published[0]["Message"] and "InvalidInstanceId" in published[0]["Message"]


def composite_event(alarm_name: str = "dev-train-idle", state: str = "ALARM") -> dict[str, Any]:
    """A composite alarm's state change: its rule, no metrics (CloudWatch user guide, "Alarm events and
    EventBridge", composite alarm example)."""
    return {
        "version": "0", "id": "2dde0eb1-528b-d2d5-9ca6-6d590caf2329",
        "detail-type": "CloudWatch Alarm State Change", "source": "aws.cloudwatch",
        "account": "123456789012", "time": "2026-11-26T20:03:00Z", "region": "us-east-1",
        "resources": [f"arn:aws:cloudwatch:us-east-1:123456789012:alarm:{alarm_name}"],
        "detail": {
            "alarmName": alarm_name,
            "state": {"value": state, "reason": "arn:...:alarm:dev-train-no-jobs transitioned to ALARM",
                      "timestamp": "2026-11-26T20:03:00.000+0000"},
            "previousState": {"value": "OK", "timestamp": "2026-11-26T19:00:00.000+0000"},
            "configuration": {"alarmRule": 'ALARM("dev-train-no-jobs") OR ALARM("dev-train-gpu-idle")',
                              "actionsSuppressor": "", "description": "nothing runs for 15 min"},
        },
    }


def test_the_composite_idle_alarm_stops_the_group_it_is_named_after(cluster, recorded) -> None:
    result = autostop.handler(composite_event(), None)
    assert result["action"] == "stopped" and result["groups"] == ["dev-train"]
    assert cluster.capacity("dev-train") == (0, 0)
    assert cluster.capacity("dev-infer") == (0, 1)  # only the group the alarm names


def test_a_composite_alarm_of_another_stack_or_back_to_ok_stops_nothing(cluster, recorded) -> None:
    assert autostop.handler(composite_event("prod-train-idle"), None)["action"] == "ignored"
    assert autostop.handler(composite_event(state="OK"), None)["action"] == "ignored"
    assert cluster.capacity("prod-train") == (1, 1) and cluster.capacity("dev-train") == (1, 2)
