"""Capacity Block expiry handler, against the moto account with two stacks (tests/lambdas/conftest.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpucluster.fleet import asg, nodegroups, runtime
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, STOPPED_BY_TAG
from gpucluster.lambdas import capacity_block

HOOK = "/opt/gpucluster/hooks/checkpoint.sh"
CR = "cr-0123456789abcdef0"


def expiry_event(reservation: str = CR, detail_type: str = "Capacity Block Reservation Expiration Warning",
                 source: str = "aws.ec2") -> dict[str, Any]:
    """The warning EC2 sends 40 minutes before a block ends (EC2 user guide, "Monitor Capacity Blocks
    using EventBridge"; the guide's example writes detail_type, EventBridge events carry detail-type)."""
    return {
        "version": "0", "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718", "detail-type": detail_type,
        "source": source, "account": "123456789012", "time": "2026-12-10T10:50:00Z", "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1:123456789012:capacity-reservation/{reservation}"],
        "detail": {"capacity-reservation-id": reservation, "end-date": "2026-12-10T11:30:00Z"},
    }


@pytest.fixture
def blocks(monkeypatch: pytest.MonkeyPatch, cluster: Any) -> Any:
    """dev-train runs on the block; prod-train is another stack's group listed by mistake."""
    monkeypatch.setenv("CAPACITY_BLOCK_GROUPS", json.dumps({CR: ["dev-train", "prod-train"]}))
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    return cluster


def test_the_hook_runs_then_the_blocks_groups_go_to_zero(blocks, recorded, monkeypatch) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    train = blocks.instances("dev-train")

    result = capacity_block.handler(expiry_event(), None)

    sent = recorded.of("ssm", "send_command")
    assert len(sent) == 1 and sorted(sent[0]["InstanceIds"]) == train
    assert sent[0]["Parameters"]["commands"][-1] == HOOK
    assert "export GPUCLUSTER_STOP_REASON=capacity-block" in sent[0]["Parameters"]["commands"]
    timeline = recorded.timeline
    last_poll = max(i for i, c in enumerate(timeline) if c == "ssm.get_command_invocation")
    assert last_poll < timeline.index("autoscaling.update_auto_scaling_group")  # checkpoint first
    assert blocks.capacity("dev-train") == (0, 0)
    tags = blocks.tags("dev-train")
    assert tags[STOPPED_BY_TAG] == "capacity-block" and tags[PREVIOUS_DESIRED_TAG] == "2"
    assert blocks.capacity("prod-train") == (1, 1)          # another stack: never touched
    assert blocks.capacity("dev-infer") == (0, 1)           # same stack, not on the block
    assert result["groups"] == ["dev-train"] and result["capacity_reservation_id"] == CR
    [published] = recorded.of("sns", "publish")
    assert published["Subject"] == f"gpucluster dev: block {CR} ends, 1 group(s) stopped"
    message = json.loads(published["Message"])
    assert (message["ends"], message["stopped_by"]) == ("2026-12-10T11:30:00Z", "capacity-block")


def test_the_hook_wait_fits_before_ec2_reclaims_the_instances(blocks, recorded, monkeypatch,
                                                              stuck_ssm) -> None:
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    monkeypatch.setenv("PRE_STOP_TIMEOUT_SECONDS", "840")   # the autostop maximum: too long here

    result = capacity_block.handler(expiry_event(), None)

    assert stuck_ssm.sent[0]["Parameters"]["executionTimeout"] == ["480"]
    assert sum(recorded.clock.sleeps) == pytest.approx(480)  # waited 8 minutes, then stopped anyway
    assert result["hook"]["timed_out"] is True
    assert blocks.capacity("dev-train") == (0, 0)
    assert recorded.of("sns", "publish")[0]["Subject"].endswith("; hook failed on 2 node(s)")


def test_the_guides_other_spelling_of_the_event_works_too(blocks, recorded) -> None:
    capacity_block.handler(expiry_event(detail_type="Capacity Block Expiration Warning"), None)
    assert blocks.capacity("dev-train") == (0, 0)


def test_a_budget_stop_keeps_its_label(blocks, recorded) -> None:
    asg.scale_to_zero(blocks.autoscaling, blocks.group("dev-train"), nodegroups.BUDGET)

    result = capacity_block.handler(expiry_event(), None)

    assert result["outcomes"] == {"dev-train": nodegroups.ALREADY_STOPPED}
    assert blocks.tags("dev-train")[STOPPED_BY_TAG] == "budget"


@pytest.mark.parametrize("event", [
    expiry_event(detail_type="Capacity Block Reservation Delivered"),
    expiry_event(source="custom.app"),
    expiry_event(reservation="cr-0ffffffffffffffff"),       # another block
    {"detail-type": "Capacity Block Reservation Expiration Warning", "source": "aws.ec2", "detail": {}},
    "not an event",
])
def test_other_events_change_nothing(blocks, recorded, event: Any) -> None:
    result = capacity_block.handler(event, None)
    assert result["action"] == "ignored"
    assert recorded.of("autoscaling", "update_auto_scaling_group") == []
    assert blocks.capacity("dev-train") == (1, 2)


def test_without_the_group_map_the_handler_refuses_to_guess(monkeypatch, recorded) -> None:
    monkeypatch.setenv("CAPACITY_BLOCK_GROUPS", "dev-train")
    with pytest.raises(runtime.ConfigError, match="CAPACITY_BLOCK_GROUPS must be a JSON object"):
        capacity_block.handler(expiry_event(), None)
