"""Shared guardrail logic: stop/resume rules, the bounded SSM wait, notifications, settings."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpucluster.lambdas import asg, awsapi, nodegroups, runcommand, runtime, stops
from gpucluster.lambdas.tags import PREVIOUS_DESIRED_TAG, STATE_TAGS, STOPPED_BY_TAG


def test_handler_table_points_at_real_handlers() -> None:
    import importlib

    assert set(runtime.HANDLERS) == set(runtime.IAM_ACTIONS) == set(runtime.ENVIRONMENT)
    for name, target in runtime.HANDLERS.items():
        package, module, function = target.split(".")
        assert (package, module, function) == ("lambdas", name, "handler")
        assert callable(getattr(importlib.import_module(f"gpucluster.lambdas.{module}"), function))


def test_no_pulumi_import_in_the_lambda_package() -> None:
    import ast
    from pathlib import Path

    for path in Path(runtime.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] in {"pulumi", "pulumi_aws"} for n in names), path


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


class ScriptedSSM:
    """Invocation statuses per poll, then the last one forever."""

    def __init__(self, statuses: list[str], fail_first_polls: int = 0) -> None:
        self.statuses = statuses
        self.polls = 0
        self.answered = 0
        self.fail_first_polls = fail_first_polls
        self.sent: list[dict[str, Any]] = []

    def send_command(self, **kwargs: Any) -> dict[str, Any]:
        self.sent.append(kwargs)
        return {"Command": {"CommandId": f"c{len(self.sent)}"}}

    def get_command_invocation(self, **kwargs: Any) -> dict[str, Any]:
        self.polls += 1
        if self.polls <= self.fail_first_polls:
            error = {"Error": {"Code": "InvocationDoesNotExist", "Message": "not yet"}}
            raise ClientError(error, "GetCommandInvocation")
        self.answered += 1
        return {"Status": self.statuses[min(self.answered, len(self.statuses)) - 1]}


def _run(ssm: Any, instances: list[str], timeout: float, clock: Any) -> runcommand.CommandResult:
    return runcommand.run_command(
        ssm, instances, "true", timeout_seconds=timeout, sleep=clock.sleep, clock=clock.clock
    )


def test_run_command_waits_until_success(recorded) -> None:
    ssm = ScriptedSSM(["Pending", "InProgress", "Success"], fail_first_polls=1)

    result = _run(ssm, ["i-0123456789abcdef0"], 300, recorded.clock)

    assert result.ok and not result.timed_out
    assert result.statuses == {"i-0123456789abcdef0": "Success"}
    assert ssm.polls == 4


def test_run_command_reports_failure_without_raising(recorded) -> None:
    result = _run(ScriptedSSM(["Failed"]), ["i-0123456789abcdef0"], 300, recorded.clock)

    assert not result.ok and not result.timed_out


def test_run_command_splits_into_batches_of_fifty(recorded) -> None:
    ssm = ScriptedSSM(["Success"])
    instances = [f"i-{n:017x}" for n in range(120)]

    result = _run(ssm, instances, 60, recorded.clock)

    assert [len(s["InstanceIds"]) for s in ssm.sent] == [50, 50, 20]
    assert len(result.statuses) == 120 and result.ok


def test_run_command_with_no_instances_sends_nothing(recorded) -> None:
    ssm = ScriptedSSM(["Success"])

    assert _run(ssm, [], 60, recorded.clock).ok
    assert ssm.sent == []


def test_run_command_with_zero_timeout_does_not_wait(recorded) -> None:
    result = _run(ScriptedSSM(["InProgress"]), ["i-0123456789abcdef0"], 0, recorded.clock)

    assert result.timed_out
    assert recorded.clock.sleeps == []


def test_exported_values_are_shell_quoted(recorded) -> None:
    ssm = ScriptedSSM(["Success"])
    runcommand.run_command(
        ssm,
        ["i-0123456789abcdef0"],
        "true",
        timeout_seconds=10,
        environment={"GPUCLUSTER_INSTANCE_ACTION": "a b;c"},
        sleep=recorded.clock.sleep,
        clock=recorded.clock.clock,
    )

    assert ssm.sent[0]["Parameters"]["commands"][0] == "export GPUCLUSTER_INSTANCE_ACTION='a b;c'"


def test_notify_failure_is_swallowed() -> None:
    class DownSNS:
        def publish(self, **kwargs: Any) -> None:
            raise ClientError({"Error": {"Code": "NotFound", "Message": "gone"}}, "Publish")

    assert runtime.notify(DownSNS(), "arn:aws:sns:us-east-1:1:t", "s\nubject", {}) is False
    assert runtime.notify(DownSNS(), None, "s", {}) is False


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 300.0), ("", 300.0), ("45", 45.0), ("x", 300.0), ("-3", 300.0)]
)
def test_env_number_falls_back_on_bad_values(monkeypatch, raw, expected) -> None:
    if raw is not None:
        monkeypatch.setenv("PRE_STOP_TIMEOUT_SECONDS", raw)

    assert runtime.env_number("PRE_STOP_TIMEOUT_SECONDS", 300.0) == expected


def test_bounded_timeout_keeps_a_reserve() -> None:
    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 20_000

    assert runtime.bounded_timeout(300, Context()) == 5.0
    assert runtime.bounded_timeout(300, None) == 300
    assert runtime.bounded_timeout(3, Context()) == 3


def test_one_unregistered_instance_does_not_cancel_the_batch(recorded) -> None:
    """SendCommand refuses the whole batch for one bad node: the others still get the hook."""
    import boto3
    from botocore.stub import ANY, Stubber

    good, bad, other = "i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c"
    cmd_good, cmd_other = "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"
    ssm = boto3.client("ssm", region_name="us-east-1")
    rest = {"DocumentName": ANY, "Comment": ANY, "TimeoutSeconds": ANY, "Parameters": ANY}
    not_managed = "Instances [[i-0000000000000000b]] not in a valid state for account 123456789012"
    with Stubber(ssm) as stub:
        stub.add_client_error("send_command", "InvalidInstanceId", not_managed,
                              expected_params={"InstanceIds": [good, bad, other], **rest})
        stub.add_response("send_command", {"Command": {"CommandId": cmd_good}},
                          {"InstanceIds": [good], **rest})
        stub.add_client_error("send_command", "InvalidInstanceId", not_managed,
                              expected_params={"InstanceIds": [bad], **rest})
        stub.add_response("send_command", {"Command": {"CommandId": cmd_other}},
                          {"InstanceIds": [other], **rest})
        stub.add_response("get_command_invocation", {"Status": "Success"},
                          {"CommandId": cmd_good, "InstanceId": good})
        stub.add_response("get_command_invocation", {"Status": "Success"},
                          {"CommandId": cmd_other, "InstanceId": other})

        result = _run(ssm, [good, bad, other], 60, recorded.clock)

        stub.assert_no_pending_responses()
    assert result.statuses == {good: "Success", bad: "NotSent", other: "Success"}
    assert not result.ok
    assert result.failed == {bad: "NotSent"}
    assert list(result.errors) == [bad] and "InvalidInstanceId" in result.errors[bad]
    assert result.summary()["not_sent"] == result.errors


def test_a_batch_error_that_is_not_about_instances_is_not_retried_per_instance(recorded) -> None:
    class Throttled(ScriptedSSM):
        def send_command(self, **kwargs: Any) -> dict[str, Any]:
            self.sent.append(kwargs)
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow"}}, "Send")

    ssm = Throttled(["Success"])
    result = _run(ssm, ["i-0000000000000000a", "i-0000000000000000b"], 60, recorded.clock)

    assert len(ssm.sent) == 1
    assert set(result.errors) == {"i-0000000000000000a", "i-0000000000000000b"}


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


def test_batches_keep_the_order_and_the_per_call_limit() -> None:
    assert awsapi.batches(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert awsapi.batches(["a", "b"], 100) == [["a", "b"]]
    assert awsapi.batches([], 50) == []
