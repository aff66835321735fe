"""`run` under faults (issue 24, item 5): a detached launch that fails half-way stops the ranks that
started through the job's own stop, a refused cancel is reported as refused, and AccessDenied on
every status poll is AccessDenied, not "still running". botocore Stubber: the calls are the contract."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ReadTimeoutError
from botocore.stub import ANY, Stubber

from gpucluster.cli.jobs import cancelled_note
from gpucluster.fleet import runtime
from gpucluster.fleet.nodepaths import JOB_TOOL
from gpucluster.ops.nodes import Node, ranked
from gpucluster.ops.run import plan_job, send_job, wait_job

CMD_A, CMD_B, STOP_A = "a" * 36, "b" * 36, "s" * 36


def node(instance_id: str, ip: str, launched: int) -> Node:
    return Node(instance_id, "g", "asg", "p5.48xlarge", "us-east-1a", ip, "on-demand", "running",
                "InService", "Healthy", datetime(2025, 1, 1, tzinfo=UTC) + timedelta(minutes=launched),
                "Online")


NODES = ranked([node("i-0a", "10.0.0.5", 0), node("i-0b", "10.0.0.6", 1), node("i-0c", "10.0.0.7", 2)])


def test_a_detached_launch_that_fails_on_a_node_stops_the_job_where_it_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Sends retry throttling for RETRY_SECONDS (issue 32): a clock that jumps past it at the first backoff.
    now = [0.0]
    monkeypatch.setattr(runtime.RUNTIME, "clock", lambda: now[0])
    monkeypatch.setattr(runtime.RUNTIME, "sleep", lambda s: now.__setitem__(0, now[0] + 1000.0))
    plan = plan_job(NODES, "python train.py", log_group="/x", detach="train")
    ssm = boto3.client("ssm", region_name="us-east-1")
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": CMD_A}})
        stub.add_response("send_command", {"Command": {"CommandId": CMD_B}})
        stub.add_client_error("send_command", "InvalidInstanceId", "not a managed node")
        stub.add_response("cancel_command", {}, {"CommandId": CMD_A, "InstanceIds": ["i-0a"]})
        # rank 1's cancel is refused: it is reported, not called cancelled
        stub.add_client_error("cancel_command", "AccessDeniedException", "not allowed",
                              expected_params={"CommandId": CMD_B, "InstanceIds": ["i-0b"]})
        # the job's own stop, on both nodes the command reached (its unit may have started)
        stub.add_response("send_command", {"Command": {"CommandId": STOP_A}},
                          {"InstanceIds": ["i-0a"], "DocumentName": "AWS-RunShellScript", "Comment": ANY,
                           "TimeoutSeconds": ANY, "Parameters": {"commands": [f"{JOB_TOOL} cancel train"]}})
        stub.add_client_error("send_command", "ThrottlingException", "slow down")
        stub.add_client_error("send_command", "ThrottlingException", "slow down")  # still, at the deadline
        # the stop's own result: only a stop the node confirms counts as stopped
        stub.add_response("get_command_invocation", {"Status": "Success", "ResponseCode": 0},
                          {"CommandId": STOP_A, "InstanceId": "i-0a"})
        job = send_job(ssm, plan)
        stub.assert_no_pending_responses()
    assert job.cancelled
    assert [r.status for r in job.results] == ["Cancelled", "CancelFailed", "NotSent"]
    assert f"job stop sent ({JOB_TOOL} cancel, command {STOP_A})" in job.results[0].error
    assert "cancel failed: AccessDeniedException" in job.results[1].error
    assert "job stop not sent: ThrottlingException" in job.results[1].error
    note = cancelled_note(job.results)
    assert "the job's stop sent to rank(s) 0" in note
    assert "NOT cancelled on rank(s) 1: it may still run there" in note


def test_a_run_that_cannot_read_its_status_says_access_denied_not_still_running() -> None:
    plan = plan_job(NODES[:2], "true", log_group="/x")
    ssm = boto3.client("ssm", region_name="us-east-1")
    seen = []
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": CMD_A}})
        stub.add_response("send_command", {"Command": {"CommandId": CMD_B}})
        job = send_job(ssm, plan)
        stub.add_client_error("get_command_invocation", "AccessDeniedException", "no GetCommandInvocation")
        stub.add_response("get_command_invocation", {"Status": "Success", "ResponseCode": 0,
                                                     "StandardOutputContent": "", "StandardErrorContent": ""})
        job = wait_job(ssm, job, timeout_seconds=60, sleep=lambda s: None, clock=lambda: 0.0,
                       on_change=lambda r: seen.append((r.rank, r.status)))
        stub.assert_no_pending_responses()
    assert [(r.status, r.done) for r in job.results] == [("AccessDenied", True), ("Success", True)]
    assert job.results[0].error.startswith("cannot read the command's status: AccessDeniedException")
    assert "still running" not in job.results[0].error
    assert seen == [(0, "AccessDenied"), (1, "Success")]


def test_run_retries_throttled_and_failing_calls_and_keeps_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32: `run` follows the runner's policy: throttling and a 5xx are asked again, not failures."""
    now, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(runtime.RUNTIME, "clock", lambda: now[0])
    monkeypatch.setattr(runtime.RUNTIME, "sleep", sleep)
    plan = plan_job(NODES[:1], "true", log_group="/x")
    ssm = boto3.client("ssm", region_name="us-east-1")
    with Stubber(ssm) as stub:
        stub.add_client_error("send_command", "ThrottlingException", "slow down")
        stub.add_response("send_command", {"Command": {"CommandId": CMD_A}})
        stub.add_client_error("get_command_invocation", "ThrottlingException", "slow down")
        stub.add_client_error("get_command_invocation", "InternalServerError", "oops", http_status_code=500)
        stub.add_response("get_command_invocation", {"Status": "Success", "ResponseCode": 0,
                                                     "StandardOutputContent": "ok\n"})
        job = wait_job(ssm, send_job(ssm, plan), timeout_seconds=600, sleep=sleep, clock=lambda: now[0])
        stub.assert_no_pending_responses()
    assert job.ok and job.results[0].tail() == ["ok"]
    assert slept == [1.0, 20.0, 20.0]  # the send's backoff, then the poll's (10 s doubled, capped)


def test_a_send_whose_answer_was_lost_after_ssm_took_it_is_not_sent_twice() -> None:
    """A read timeout on SendCommand: ListCommands finds the command by its marked comment."""

    class LandedThenTimedOut:
        def __init__(self, real: Any) -> None:
            self.real, self.comments = real, []

        def send_command(self, **kwargs: Any) -> Any:
            answer = self.real.send_command(**kwargs)
            self.comments.append(kwargs["Comment"])
            if len(self.comments) == 1:
                raise ReadTimeoutError(endpoint_url="https://ssm.us-east-1.amazonaws.com")
            return answer

        def list_commands(self, **kwargs: Any) -> Any:
            self.real.list_commands(**kwargs)  # the stub checks the request
            return {"Commands": [{"CommandId": CMD_A, "Comment": self.comments[0]}]}

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

    plan = plan_job(NODES[:2], "python train.py", log_group="/x", detach="train")
    real = boto3.client("ssm", region_name="us-east-1")
    with Stubber(real) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": CMD_A}})
        stub.add_response("list_commands", {"Commands": []},
                          {"InstanceId": "i-0a", "MaxResults": 50, "Filters": ANY})
        stub.add_response("send_command", {"Command": {"CommandId": CMD_B}})
        job = send_job(LandedThenTimedOut(real), plan)
        stub.assert_no_pending_responses()  # two SendCommands for two ranks: none twice
    assert not job.cancelled and [r.command_id for r in job.results] == [CMD_A, CMD_B]


def test_a_detached_stop_that_the_node_does_not_confirm_is_not_called_cancelled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's stop reached rank 0 but failed there (or never answered): rank 0 may still run."""
    now = [0.0]
    monkeypatch.setattr(runtime.RUNTIME, "clock", lambda: now[0])
    monkeypatch.setattr(runtime.RUNTIME, "sleep", lambda s: now.__setitem__(0, now[0] + 1000.0))
    plan = plan_job(NODES[:2], "python train.py", log_group="/x", detach="train")
    ssm = boto3.client("ssm", region_name="us-east-1")
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": CMD_A}})
        stub.add_client_error("send_command", "InvalidInstanceId", "not a managed node")
        stub.add_response("cancel_command", {}, {"CommandId": CMD_A, "InstanceIds": ["i-0a"]})
        stub.add_response("send_command", {"Command": {"CommandId": STOP_A}})
        stub.add_response("get_command_invocation", {"Status": "Failed", "ResponseCode": 5},
                          {"CommandId": STOP_A, "InstanceId": "i-0a"})
        job = send_job(ssm, plan)
        stub.assert_no_pending_responses()
    assert "job stop not confirmed: Failed, exit 5" in job.results[0].error
    note = cancelled_note(job.results)
    assert "the job's stop sent" not in note
    assert "NOT cancelled on rank(s) 0: it may still run there" in note
