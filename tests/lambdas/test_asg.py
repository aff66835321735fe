"""The Auto Scaling backend's stop and resume rules, on a moto account."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpucluster.fleet import asg, nodegroups, runtime, stops
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, STATE_TAGS, STOPPED_BY_TAG


def test_stop_records_capacity_then_zeroes_it(cluster, recorded) -> None:
    outcome = asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "idle")

    assert outcome == nodegroups.STOPPED
    assert cluster.capacity("dev-train") == (0, 0)
    assert cluster.group("dev-train")["MaxSize"] == 4
    tags = cluster.tags("dev-train")
    assert [tags[k] for k in STATE_TAGS] == ["idle", "2", "1"]


def test_group_at_zero_by_its_own_config_is_not_tagged(cluster, recorded) -> None:
    cluster.autoscaling.update_auto_scaling_group(
        AutoScalingGroupName="dev-infer", MinSize=0, DesiredCapacity=0
    )

    outcome = asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-infer"), "budget")

    assert outcome == nodegroups.ALREADY_AT_ZERO
    assert not set(STATE_TAGS) & set(cluster.tags("dev-infer"))


def test_restarted_by_hand_then_stopped_again_keeps_the_budget_label(cluster, recorded) -> None:
    asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "budget")
    cluster.autoscaling.update_auto_scaling_group(
        AutoScalingGroupName="dev-train", MinSize=0, DesiredCapacity=3
    )

    outcome = asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "idle")

    assert outcome == nodegroups.STOPPED
    tags = cluster.tags("dev-train")
    assert (tags[STOPPED_BY_TAG], tags[PREVIOUS_DESIRED_TAG]) == ("budget", "3")


def test_unknown_reason_is_a_programming_error(cluster, recorded) -> None:
    with pytest.raises(ValueError):
        asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "bored")


def test_stop_errors_do_not_spare_the_other_groups(cluster, recorded) -> None:
    class Flaky:
        """Refuses to touch dev-infer, like a throttled or denied call would."""

        def __init__(self, real: Any) -> None:
            self.real = real

        def create_or_update_tags(self, Tags: list[dict[str, Any]]) -> Any:
            if Tags[0]["ResourceId"] == "dev-infer":
                raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "Tag")
            return self.real.create_or_update_tags(Tags=Tags)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

    backend = asg.AutoScalingGroups(Flaky(cluster.autoscaling))
    report = stops.stop_groups(backend, backend.list_groups("dev"), "budget")

    assert report.changed == ["dev-train"]
    assert list(report.errors) == ["dev-infer"]
    with pytest.raises(runtime.GuardrailError):
        stops.raise_if_failed(report, "dev")


def test_resume_clamps_to_max_size_and_clears_tags(cluster, recorded) -> None:
    asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "idle")
    cluster.autoscaling.update_auto_scaling_group(AutoScalingGroupName="dev-train", MaxSize=1)

    result = asg.resume_group(cluster.autoscaling, cluster.group("dev-train"))

    assert (result.action, result.min_size, result.desired_capacity) == ("resumed", 1, 1)
    assert cluster.capacity("dev-train") == (1, 1)
    assert not set(STATE_TAGS) & set(cluster.tags("dev-train"))


def test_resume_without_recorded_capacity_is_skipped(cluster, recorded) -> None:
    asg.set_tags(cluster.autoscaling, "dev-train", {STOPPED_BY_TAG: "idle"})

    result = asg.resume_group(cluster.autoscaling, cluster.group("dev-train"))

    assert result.action == "skipped"
    assert PREVIOUS_DESIRED_TAG in result.reason


def test_resume_keeps_the_tags_of_a_stop_that_landed_after_its_write(cluster, recorded) -> None:
    """Restored, then stopped again (same reason) before the tags were cleared: keep them."""
    asg.scale_to_zero(cluster.autoscaling, cluster.group("dev-train"), "idle")
    real = cluster.autoscaling

    class StopAfterUpdate:
        def __init__(self) -> None:
            self.updates = 0

        def update_auto_scaling_group(self, **kwargs: Any) -> Any:
            self.updates += 1
            answer = real.update_auto_scaling_group(**kwargs)
            if self.updates == 1:  # another idle stop sees the group running and stops it
                asg.scale_to_zero(real, cluster.group("dev-train"), "idle")
            return answer

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    result = asg.resume_group(StopAfterUpdate(), cluster.group("dev-train"))

    assert result.action == "skipped" and "while resuming" in result.reason
    assert cluster.capacity("dev-train") == (0, 0)
    tags = cluster.tags("dev-train")
    assert (tags[STOPPED_BY_TAG], tags[PREVIOUS_DESIRED_TAG]) == ("idle", "2")
