"""The bounded SSM wait: batches, per-instance retry, quoting, deadlines."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpucluster.fleet import runcommand


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
    # Throttling is retried as a whole batch since issue 32 (tests/lambdas/test_ssm_faults.py):
    # a refusal about the document, not an instance, is what must not be split.
    class Refused(ScriptedSSM):
        def send_command(self, **kwargs: Any) -> dict[str, Any]:
            self.sent.append(kwargs)
            raise ClientError({"Error": {"Code": "InvalidDocument", "Message": "no such document"}}, "Send")

    ssm = Refused(["Success"])
    result = _run(ssm, ["i-0000000000000000a", "i-0000000000000000b"], 60, recorded.clock)

    assert len(ssm.sent) == 1
    assert set(result.errors) == {"i-0000000000000000a", "i-0000000000000000b"}
