"""Budget breach handler against a moto account: stops the stack, nothing else, once."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpucluster.fleet import asg, nodegroups, runtime
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STOPPED_BY_TAG
from gpucluster.lambdas import budget_action

BUDGET_MESSAGE = """AWS Budget Notification November 21, 2026
AWS Account 123456789012

Dear AWS Customer,

You requested that we alert you when the ACTUAL Cost associated with your gpucluster-dev budget \
is greater than $100.00 for the current month. The ACTUAL Cost associated with this budget is \
$104.17. You can find additional details below and by accessing the AWS Budgets dashboard.

Budget Name: gpucluster-dev
Budget Type: Cost
Budgeted Amount: $100.00
Alert Type: ACTUAL
Alert Threshold: > $100.00
ACTUAL Amount: $104.17
"""

# Shape: Lambda developer guide, "Using AWS Lambda with Amazon SNS" (example event).
SNS_EVENT: dict[str, Any] = {
    "Records": [
        {
            "EventVersion": "1.0",
            "EventSubscriptionArn": (
                "arn:aws:sns:us-east-1:123456789012:gpucluster-dev-budget-action:"
                "21be56ed-a058-49f5-8c98-aedd2564c486"
            ),
            "EventSource": "aws:sns",
            "Sns": {
                "SignatureVersion": "1",
                "Timestamp": "2026-11-21T12:45:07.000Z",
                "Signature": "tcc6faL2yUC6dgZdmrwh1Y4cGa/ebXEkAi6RibDsvpi+tE/1+82j...65r==",
                "SigningCertUrl": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService.pem",
                "MessageId": "95df01b4-ee98-5cb9-9903-4c221d41eb5e",
                "Message": BUDGET_MESSAGE,
                "MessageAttributes": {},
                "Type": "Notification",
                "UnsubscribeUrl": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
                "TopicArn": "arn:aws:sns:us-east-1:123456789012:gpucluster-dev-budget-action",
                "Subject": "AWS Budgets: gpucluster-dev has exceeded your alert threshold",
            },
        }
    ]
}


def test_breach_scales_every_group_of_the_stack_to_zero(cluster, recorded) -> None:
    result = budget_action.handler(copy.deepcopy(SNS_EVENT), None)

    assert result["action"] == "stopped"
    assert result["groups"] == ["dev-infer", "dev-train"]
    assert cluster.capacity("dev-train") == (0, 0)
    assert cluster.capacity("dev-infer") == (0, 0)
    train = cluster.tags("dev-train")
    assert train[STOPPED_BY_TAG] == "budget"
    assert train[PREVIOUS_DESIRED_TAG] == "2"
    assert train[PREVIOUS_MIN_TAG] == "1"
    infer = cluster.tags("dev-infer")
    assert (infer[PREVIOUS_DESIRED_TAG], infer[PREVIOUS_MIN_TAG]) == ("1", "0")


def test_breach_leaves_other_stacks_alone(cluster, recorded) -> None:
    budget_action.handler(copy.deepcopy(SNS_EVENT), None)

    assert cluster.capacity("prod-train") == (1, 1)
    assert STOPPED_BY_TAG not in cluster.tags("prod-train")
    updated = {
        c["AutoScalingGroupName"] for c in recorded.of("autoscaling", "update_auto_scaling_group")
    }
    assert updated == {"dev-train", "dev-infer"}


def test_second_breach_changes_nothing(cluster, recorded) -> None:
    budget_action.handler(copy.deepcopy(SNS_EVENT), None)
    tags_before = {name: cluster.tags(name) for name in ("dev-train", "dev-infer")}
    writes = len(recorded.of("autoscaling", "update_auto_scaling_group"))

    result = budget_action.handler(copy.deepcopy(SNS_EVENT), None)

    assert result["action"] == "unchanged"
    assert result["groups"] == []
    assert {name: cluster.tags(name) for name in tags_before} == tags_before
    assert len(recorded.of("autoscaling", "update_auto_scaling_group")) == writes
    assert recorded.of("autoscaling", "create_or_update_tags")[2:] == []


def test_budget_outranks_an_earlier_schedule_stop(cluster, recorded) -> None:
    asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "schedule")

    result = budget_action.handler(copy.deepcopy(SNS_EVENT), None)

    assert result["outcomes"]["dev-train"] == nodegroups.ESCALATED
    tags = cluster.tags("dev-train")
    assert tags[STOPPED_BY_TAG] == "budget"
    assert tags[PREVIOUS_DESIRED_TAG] == "2"  # the capacity before the first stop


def test_breach_notifies_the_topic(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)

    budget_action.handler(copy.deepcopy(SNS_EVENT), None)

    published = recorded.of("sns", "publish")
    assert len(published) == 1
    assert published[0]["TopicArn"] == cluster.topic_arn
    assert "dev-train" in published[0]["Message"]
    assert len(published[0]["Subject"]) <= 100


def test_budget_stop_runs_no_hook(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", "/opt/checkpoint.sh")

    budget_action.handler(copy.deepcopy(SNS_EVENT), None)

    assert "ssm" not in recorded.calls
    assert "sns" not in recorded.calls  # no NOTIFY_TOPIC_ARN: no client built


def _sns_record(**sns: Any) -> dict[str, Any]:
    return {"Records": [{"EventSource": "aws:sns", "Sns": sns}]}


@pytest.mark.parametrize(
    "event",
    [
        {},
        None,
        "AWS Budgets: gpucluster-dev has exceeded your alert threshold",
        [SNS_EVENT],
        {"Records": []},
        {"Records": "garbage"},
        {"Records": [None, 3, "x"]},
        {"Records": [{"EventSource": "aws:sqs", "body": BUDGET_MESSAGE}]},
        {"Records": [{"EventSource": "aws:sns", "Sns": "garbage"}]},
        {"Records": [{"EventSource": "aws:sns"}]},
        _sns_record(Message=""),
        _sns_record(Message={"not": "text"}),
        _sns_record(Message="hi", Type="SubscriptionConfirmation"),
        {"detail-type": "Scheduled Event", "source": "aws.events", "detail": {}},
    ],
)
def test_malformed_events_are_ignored(cluster, recorded, event) -> None:
    result = budget_action.handler(event, None)

    assert result["action"] == "ignored"
    assert cluster.capacity("dev-train") == (1, 2)
    assert STOPPED_BY_TAG not in cluster.tags("dev-train")
    assert recorded.of("autoscaling", "update_auto_scaling_group") == []


def test_missing_stack_setting_is_a_config_error(cluster, recorded, monkeypatch) -> None:
    monkeypatch.delenv("GPUCLUSTER_STACK")

    with pytest.raises(runtime.ConfigError):
        budget_action.handler(copy.deepcopy(SNS_EVENT), None)
    assert cluster.capacity("dev-train") == (1, 2)
