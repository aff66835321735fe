"""Guardrails racing each other in one moto account: a budget stop always wins.

Each test drives one interleaving by running a second handler from inside the
first one: during the pre-stop hook's wait, or between a handler's read of a
group and its write. The Auto Scaling API has no compare-and-set, so what is
checked is the end state: a budget-stopped group stays at zero, labelled
`budget`, with the capacity it ran before recorded, and the morning start
leaves it alone.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from test_autostop import alarm_event, schedule_event

from gpucluster.fleet import nodegroups, runtime, stops
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STOPPED_BY_TAG
from gpucluster.lambdas import autostop, budget_action

HOOK = "/opt/gpucluster/checkpoint.sh"
BUDGET_EVENT = {
    "Records": [{
        "EventSource": "aws:sns",
        "Sns": {"Type": "Notification", "Subject": "AWS Budgets: gpucluster-dev has exceeded",
                "Message": "ACTUAL Amount: $104.17",
                "TopicArn": "arn:aws:sns:us-east-1:123456789012:gpucluster-dev-budget-action"},
    }]
}


def budget_breach() -> dict[str, Any]:
    return budget_action.handler(BUDGET_EVENT, None)


def schedule_start() -> dict[str, Any]:
    return autostop.handler(schedule_event("gpucluster-dev-start"), None)


def schedule_stop() -> dict[str, Any]:
    return autostop.handler(schedule_event("gpucluster-dev-stop"), None)


class SlowHook:
    """The moto SSM client, except that the hook is still running at the first poll.

    At that first poll (inside the autostop handler's wait) `meanwhile` runs.
    """

    def __init__(self, meanwhile: Callable[[], Any]) -> None:
        self.real = boto3.client("ssm", region_name="us-east-1")
        self.meanwhile: Callable[[], Any] | None = meanwhile
        self.results: list[Any] = []

    def get_command_invocation(self, **kwargs: Any) -> dict[str, Any]:
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            self.results.append(meanwhile())
            return {"Status": "InProgress"}
        return self.real.get_command_invocation(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def moto_autoscaling() -> Any:
    return boto3.client("autoscaling", region_name="us-east-1")


class Interposed:
    """An Auto Scaling client whose first call to `method` (matching `when`) runs `meanwhile` first.

    `meanwhile` sees the plain client: only the outer handler's call is interposed.
    """

    def __init__(self, real: Any, method: str, meanwhile: Callable[[], Any],
                 when: Callable[[dict[str, Any]], bool] = lambda kwargs: True) -> None:
        self.real, self.method, self.when = real, method, when
        self.meanwhile: Callable[[], Any] | None = meanwhile
        self.results: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if name != self.method:
            return attr

        def call(**kwargs: Any) -> Any:
            if self.meanwhile is not None and self.when(kwargs):
                meanwhile, self.meanwhile = self.meanwhile, None
                self.results.append(meanwhile())
            return attr(**kwargs)

        return call


def assert_budget_stopped(cluster: Any, name: str, desired: int, min_size: int) -> None:
    assert cluster.capacity(name) == (0, 0)
    tags = cluster.tags(name)
    assert tags[STOPPED_BY_TAG] == "budget"
    assert (tags[PREVIOUS_DESIRED_TAG], tags[PREVIOUS_MIN_TAG]) == (
        str(desired), str(min_size))


def _lifetime(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("MAX_LIFETIME_HOURS", "12")
    monkeypatch.setattr(runtime.RUNTIME, "now", lambda: datetime.now(UTC) + timedelta(hours=13))
    return schedule_event("gpucluster-dev-lifetime")


STOPS: dict[str, Callable[[pytest.MonkeyPatch], dict[str, Any]]] = {
    "idle": lambda _: alarm_event(),
    "schedule": lambda _: schedule_event("gpucluster-dev-stop"),
    "lifetime": _lifetime,
}


@pytest.mark.parametrize("reason", list(STOPS))
def test_budget_stop_during_the_pre_stop_hook_is_not_relabelled(
    cluster, recorded, monkeypatch, reason
) -> None:
    """Budget lands while an idle/schedule/lifetime stop waits for its hook."""
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)
    ssm = SlowHook(budget_breach)
    recorded.fakes["ssm"] = ssm

    result = autostop.handler(STOPS[reason](monkeypatch), None)

    assert ssm.results[0]["groups"] == ["dev-infer", "dev-train"]  # the budget stopped both
    assert result["outcomes"]["dev-train"] == nodegroups.ALREADY_STOPPED
    assert result["groups"] == []
    assert_budget_stopped(cluster, "dev-train", desired=2, min_size=1)
    # The morning start must not undo the budget stop.
    start = schedule_start()
    assert start["groups"] == []
    assert_budget_stopped(cluster, "dev-train", desired=2, min_size=1)
    assert_budget_stopped(cluster, "dev-infer", desired=1, min_size=0)
    assert cluster.capacity("prod-train") == (1, 1)


def test_group_restarted_during_the_hook_is_stopped_with_its_new_capacity(
    cluster, recorded, monkeypatch
) -> None:
    """A person scaled the group up while the idle hook ran: the stop records what runs now."""
    monkeypatch.setenv("PRE_STOP_COMMAND", HOOK)

    def scale_up() -> None:
        cluster.autoscaling.update_auto_scaling_group(
            AutoScalingGroupName="dev-train", MinSize=2, DesiredCapacity=3)

    recorded.fakes["ssm"] = SlowHook(scale_up)

    autostop.handler(alarm_event(), None)

    tags = cluster.tags("dev-train")
    assert (tags[PREVIOUS_DESIRED_TAG], tags[PREVIOUS_MIN_TAG]) == ("3", "2")


def test_schedule_start_between_the_budgets_read_and_write_is_undone(cluster, recorded) -> None:
    """Budget read the groups at zero (schedule stop) and escalates; the start restarts them first.

    Without the budget's confirmation the groups run on, labelled budget.
    """
    schedule_stop()
    interposed = Interposed(moto_autoscaling(), "create_or_update_tags", schedule_start)
    recorded.fakes["autoscaling"] = interposed

    result = budget_breach()

    assert interposed.results[0]["groups"] == ["dev-infer", "dev-train"]  # the start ran
    assert_budget_stopped(cluster, "dev-train", desired=2, min_size=1)
    assert_budget_stopped(cluster, "dev-infer", desired=1, min_size=0)
    assert set(result["corrections"]) == {"dev-infer", "dev-train"}
    assert recorded.clock.sleeps == [stops.SETTLE_SECONDS]
    assert schedule_start()["groups"] == []
    assert cluster.capacity("dev-train") == (0, 0)


def test_budget_between_the_starts_read_and_write_keeps_the_group_stopped(
    cluster, recorded
) -> None:
    """The start read `schedule`, the budget relabels, then the start writes its capacity."""
    schedule_stop()
    interposed = Interposed(moto_autoscaling(), "update_auto_scaling_group", budget_breach)
    recorded.fakes["autoscaling"] = interposed

    result = schedule_start()

    assert interposed.results[0]["outcomes"] == {
        "dev-infer": nodegroups.ESCALATED, "dev-train": nodegroups.ESCALATED}
    assert result["groups"] == []
    assert "budget" in result["skipped"]["dev-infer"]
    assert_budget_stopped(cluster, "dev-train", desired=2, min_size=1)
    assert_budget_stopped(cluster, "dev-infer", desired=1, min_size=0)


def test_resume_deleting_the_tags_under_a_budget_stop_is_repaired(cluster, recorded) -> None:
    """The start read `schedule`, restored capacity and read again; the budget stopped it and
    then the start deleted the state tags: the budget's confirmation puts them back."""
    schedule_stop()
    client = boto3.client("autoscaling", region_name="us-east-1")
    calls = {"delete_tags": 0}

    class DeleteLate:
        """Run the budget handler right before the start deletes its tags."""

        def __getattr__(self, name: str) -> Any:
            attr = getattr(client, name)
            if name != "delete_tags":
                return attr

            def call(**kwargs: Any) -> Any:
                calls["delete_tags"] += 1
                if calls["delete_tags"] == 1:
                    recorded.fakes.pop("autoscaling")
                    results.append(budget_with_late_delete(kwargs))
                    return None
                return attr(**kwargs)

            return call

    results: list[Any] = []

    def budget_with_late_delete(delete_kwargs: dict[str, Any]) -> Any:
        # The budget stops what the start restarted; the start's delete lands during the settle.
        def settle(seconds: float) -> None:
            recorded.clock.sleep(seconds)
            client.delete_tags(**delete_kwargs)

        original = runtime.RUNTIME.sleep
        runtime.RUNTIME.sleep = settle
        try:
            return budget_breach()
        finally:
            runtime.RUNTIME.sleep = original

    recorded.fakes["autoscaling"] = DeleteLate()

    schedule_start()

    summary = results[0]
    assert "dev-infer" in summary["corrections"]
    assert_budget_stopped(cluster, "dev-infer", desired=1, min_size=0)
