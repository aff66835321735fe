"""The one SSM runner under fault injection (issue 32, item 3): one policy per AWS error.

For each of send (SendCommand), poll (GetCommandInvocation) and cancel (CancelCommand):
throttling and a 5xx are retried with backoff, AccessDenied fails at once (one call, no sleep,
one line), a timeout before the request left is retried, one after it landed is recognised
(SendCommand is never sent twice), and the deadline holds. `FaultySSM` keeps the commands it
accepted, so a send that landed and then timed out is really there to be found; the clock is
conftest's `FakeClock`: no test sleeps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

from gpucluster.fleet import runcommand
from gpucluster.fleet.runcommand import (
    BACKOFF_FIRST,
    Deadline,
    Invocation,
    SendUnknown,
    cancel_command,
    run_command,
    send_command,
    wait,
)

ENDPOINT = "https://ssm.us-east-1.amazonaws.com"
LANDED = object()
"""A SendCommand fault: the command is accepted, then the response times out."""


def aws_error(code: str, http: int, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} from fault injection"},
                        "ResponseMetadata": {"HTTPStatusCode": http}}, operation)


def throttled(op: str) -> ClientError:
    return aws_error("ThrottlingException", 400, op)


def server_error(op: str) -> ClientError:
    return aws_error("ServiceUnavailableException", 503, op)  # known by its status, not its code


def denied(op: str) -> ClientError:
    return aws_error("AccessDeniedException", 400, op)


def timeout_before(op: str) -> ConnectTimeoutError:
    return ConnectTimeoutError(endpoint_url=ENDPOINT)


def timeout_after(op: str) -> ReadTimeoutError:
    return ReadTimeoutError(endpoint_url=ENDPOINT)


class FaultySSM:
    """An in-memory SSM whose next calls of an operation fail as scripted in `faults[operation]`."""

    def __init__(self, faults: dict[str, list[Any]] | None = None, status: str = "Success") -> None:
        self.faults = {op: list(queue) for op, queue in (faults or {}).items()}
        self.status = status
        self.calls: list[str] = []
        self.commands: list[dict[str, Any]] = []
        self.cancelled: list[dict[str, Any]] = []

    def _fault(self, operation: str) -> Any:
        self.calls.append(operation)
        queue = self.faults.get(operation, [])
        fault = queue.pop(0) if queue else None
        if fault is not None and fault is not LANDED and not isinstance(fault, BaseException):
            queue.insert(0, fault)  # a callable: fails every call from here on
            return fault()
        return fault

    def send_command(self, **kwargs: Any) -> dict[str, Any]:
        fault = self._fault("send_command")
        if isinstance(fault, BaseException):
            raise fault
        command = {"CommandId": f"cmd-{len(self.commands)}", "Comment": kwargs["Comment"],
                   "InstanceIds": kwargs["InstanceIds"], "DocumentName": kwargs["DocumentName"]}
        self.commands.append(command)
        if fault is LANDED:
            raise timeout_after("SendCommand")
        return {"Command": command}

    def list_commands(self, **kwargs: Any) -> dict[str, Any]:
        fault = self._fault("list_commands")
        if isinstance(fault, BaseException):
            raise fault
        assert {f["key"] for f in kwargs["Filters"]} == {"InvokedAfter", "DocumentName"}
        return {"Commands": [c for c in self.commands if kwargs["InstanceId"] in c["InstanceIds"]]}

    def get_command_invocation(self, **kwargs: Any) -> dict[str, Any]:
        fault = self._fault("get_command_invocation")
        if isinstance(fault, BaseException):
            raise fault
        return {"Status": self.status, "ResponseCode": 0 if self.status == "Success" else -1,
                "StandardOutputContent": "done\n", "StandardErrorContent": ""}

    def cancel_command(self, **kwargs: Any) -> dict[str, Any]:
        fault = self._fault("cancel_command")
        if isinstance(fault, BaseException):
            raise fault
        self.cancelled.append(kwargs)
        return {}

    def count(self, operation: str) -> int:
        return self.calls.count(operation)


def _send(ssm: FaultySSM, deadline: Deadline) -> str:
    return send_command(ssm, ["i-0a"], ["true"], comment="gpucluster test", delivery_timeout=30,
                        deadline=deadline)


def _poll(ssm: FaultySSM, deadline: Deadline) -> Invocation:
    invocation = Invocation("i-0a", "cmd-0")
    assert wait(ssm, [invocation], deadline, poll_seconds=5.0)
    return invocation


def _cancel(ssm: FaultySSM, deadline: Deadline) -> None:
    cancel_command(ssm, "cmd-0", ["i-0a"], deadline)


OPERATIONS: dict[str, tuple[str, Callable[[FaultySSM, Deadline], Any]]] = {
    "send": ("send_command", _send),
    "poll": ("get_command_invocation", _poll),
    "cancel": ("cancel_command", _cancel),
}


def _deadline(recorded: Any, seconds: float = 60.0) -> Deadline:
    return Deadline.after(seconds, sleep=recorded.clock.sleep, clock=recorded.clock.clock)


@pytest.mark.parametrize("kind", list(OPERATIONS))
@pytest.mark.parametrize("fault", [throttled, server_error, timeout_before], ids=["throttled", "5xx",
                                                                                  "timeout-before"])
def test_transient_errors_are_retried_with_backoff(recorded: Any, kind: str, fault: Any) -> None:
    operation, act = OPERATIONS[kind]
    ssm = FaultySSM({operation: [fault(operation), fault(operation)]})

    act(ssm, _deadline(recorded))

    assert ssm.count(operation) == 3
    if kind == "poll":  # the loop's own sleep lengthens: poll_seconds doubled, twice
        assert recorded.clock.sleeps == [10.0, 20.0]
    else:
        assert recorded.clock.sleeps == [BACKOFF_FIRST, 2 * BACKOFF_FIRST]
    if kind == "send":
        assert len(ssm.commands) == 1


@pytest.mark.parametrize("kind", ["send", "cancel"])
def test_access_denied_fails_at_once_with_one_line(recorded: Any, kind: str) -> None:
    operation, act = OPERATIONS[kind]
    ssm = FaultySSM({operation: [denied(operation)]})

    with pytest.raises(ClientError) as raised:
        act(ssm, _deadline(recorded))

    assert ssm.count(operation) == 1 and recorded.clock.sleeps == []
    line = runcommand.describe(raised.value)
    assert line.startswith("AccessDeniedException: ") and "\n" not in line
    assert ssm.commands == [] and ssm.cancelled == []


def test_access_denied_on_a_poll_ends_that_invocation_at_once(recorded: Any) -> None:
    ssm = FaultySSM({"get_command_invocation": [denied("GetCommandInvocation")]})
    seen: list[str] = []

    invocation = Invocation("i-0a", "cmd-0")
    assert wait(ssm, [invocation], _deadline(recorded), poll_seconds=5.0,
                on_change=lambda i: seen.append(i.status))

    assert ssm.count("get_command_invocation") == 1 and recorded.clock.sleeps == []
    assert (invocation.status, seen) == ("AccessDenied", ["AccessDenied"])
    assert invocation.error.startswith("cannot read the command's status: AccessDeniedException: ")
    assert "\n" not in invocation.error and isinstance(invocation.failure, ClientError)


def test_another_refusal_on_a_poll_is_unreadable_not_waited_on(recorded: Any) -> None:
    ssm = FaultySSM({"get_command_invocation": [aws_error("InvalidInstanceId", 400, "GetCommandInvocation")]})

    invocation = _poll(ssm, _deadline(recorded))

    assert invocation.status == "Unreadable" and recorded.clock.sleeps == []


def test_a_send_that_landed_then_timed_out_is_found_not_sent_twice(recorded: Any) -> None:
    ssm = FaultySSM({"send_command": [LANDED]})

    command_id = _send(ssm, _deadline(recorded))

    assert command_id == "cmd-0" and len(ssm.commands) == 1
    assert ssm.calls == ["send_command", "list_commands"] and recorded.clock.sleeps == []
    assert ssm.commands[0]["Comment"].startswith("gpucluster test #")


def test_a_send_that_timed_out_before_landing_is_sent_again_with_the_same_marker(recorded: Any) -> None:
    ssm = FaultySSM({"send_command": [timeout_after("SendCommand")]})  # timed out, SSM has nothing

    command_id = _send(ssm, _deadline(recorded))

    assert ssm.calls == ["send_command", "list_commands", "send_command"]
    assert command_id == "cmd-0" and len(ssm.commands) == 1


def test_every_send_has_its_own_marker_within_the_comment_limit(recorded: Any) -> None:
    ssm = FaultySSM()
    for _ in range(2):
        send_command(ssm, ["i-0a"], ["true"], comment="x" * 150, delivery_timeout=30,
                     deadline=_deadline(recorded))
    comments = [c["Comment"] for c in ssm.commands]
    assert len(set(comments)) == 2 and all(len(c) == 100 for c in comments)


def test_a_landed_send_that_cannot_be_looked_up_is_not_sent_again(recorded: Any) -> None:
    ssm = FaultySSM({"send_command": [LANDED], "list_commands": [denied("ListCommands")]})

    with pytest.raises(SendUnknown, match="not sent again") as raised:
        _send(ssm, _deadline(recorded))

    assert ssm.calls == ["send_command", "list_commands"] and len(ssm.commands) == 1
    assert "AccessDeniedException" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("kind", ["poll", "cancel"])
def test_a_read_timeout_on_a_read_or_a_cancel_is_asked_again(recorded: Any, kind: str) -> None:
    operation, act = OPERATIONS[kind]
    ssm = FaultySSM({operation: [timeout_after(operation)]})

    act(ssm, _deadline(recorded))

    assert ssm.count(operation) == 2 and "list_commands" not in ssm.calls


@pytest.mark.parametrize("kind", ["send", "cancel"])
def test_throttled_to_the_deadline_raises_the_last_error_at_the_deadline(recorded: Any, kind: str) -> None:
    operation, act = OPERATIONS[kind]
    ssm = FaultySSM({operation: [lambda: throttled(operation)]})
    start = recorded.clock.now

    with pytest.raises(ClientError, match="ThrottlingException"):
        act(ssm, _deadline(recorded, 60.0))

    assert recorded.clock.now - start == 60.0  # retried up to the deadline, never past it
    assert max(recorded.clock.sleeps) <= runcommand.BACKOFF_MAX and ssm.count(operation) > 3
    assert ssm.commands == []


def test_a_poll_throttled_to_the_deadline_stops_waiting_at_the_deadline(recorded: Any) -> None:
    ssm = FaultySSM({"get_command_invocation": [lambda: throttled("GetCommandInvocation")]})
    invocation = Invocation("i-0a", "cmd-0")
    start = recorded.clock.now

    assert not wait(ssm, [invocation], _deadline(recorded, 60.0), poll_seconds=5.0)

    assert recorded.clock.now - start == 60.0 and invocation.status == "Pending"
    assert recorded.clock.sleeps[:3] == [10.0, 20.0, 20.0]  # backoff, capped


def test_invocation_does_not_exist_right_after_a_send_is_polled_again_without_backoff(recorded: Any) -> None:
    not_yet = aws_error("InvocationDoesNotExist", 400, "GetCommandInvocation")
    ssm = FaultySSM({"get_command_invocation": [not_yet, not_yet]})

    invocation = _poll(ssm, _deadline(recorded))

    assert invocation.status == "Success" and invocation.stdout == "done\n"
    assert recorded.clock.sleeps == [5.0, 5.0]


# --- the hooks: a guardrail's run_command never raises and never waits on a refusal -------------


def test_a_hook_whose_status_is_denied_is_that_nodes_failure_at_once(recorded: Any) -> None:
    ssm = FaultySSM({"get_command_invocation": [denied("GetCommandInvocation")]})

    result = run_command(ssm, ["i-0a", "i-0b"], "true", timeout_seconds=300, sleep=recorded.clock.sleep,
                         clock=recorded.clock.clock)

    assert result.statuses == {"i-0a": "AccessDenied", "i-0b": "Success"}
    assert not result.ok and not result.timed_out and result.failed == {"i-0a": "AccessDenied"}
    assert recorded.clock.sleeps == []  # never waited on to the deadline


def test_a_hook_whose_send_is_throttled_past_its_deadline_returns_at_the_deadline(recorded: Any) -> None:
    ssm = FaultySSM({"send_command": [lambda: throttled("SendCommand")]})
    start = recorded.clock.now

    result = run_command(ssm, ["i-0a", "i-0b"], "true", timeout_seconds=45, sleep=recorded.clock.sleep,
                         clock=recorded.clock.clock)

    assert recorded.clock.now - start == 45
    assert result.statuses == {"i-0a": "NotSent", "i-0b": "NotSent"} and not result.ok
    assert "ThrottlingException" in result.errors["i-0a"]
    assert ssm.count("send_command") > 2  # retried as the whole batch, not split per instance


def test_a_hook_whose_send_landed_then_timed_out_runs_once(recorded: Any) -> None:
    ssm = FaultySSM({"send_command": [LANDED]})

    result = run_command(ssm, ["i-0a", "i-0b"], "true", timeout_seconds=60, sleep=recorded.clock.sleep,
                         clock=recorded.clock.clock)

    assert result.ok and len(ssm.commands) == 1 and ssm.commands[0]["InstanceIds"] == ["i-0a", "i-0b"]


def test_a_throttled_batch_is_retried_whole_never_split(recorded: Any) -> None:
    ssm = FaultySSM({"send_command": [throttled("SendCommand")]})

    result = run_command(ssm, ["i-0a", "i-0b"], "true", timeout_seconds=60, sleep=recorded.clock.sleep,
                         clock=recorded.clock.clock)

    assert result.ok and [c["InstanceIds"] for c in ssm.commands] == [["i-0a", "i-0b"]]


class _Raw:
    """The urllib3 response botocore reads a body from."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def test_botocores_own_retry_does_not_send_a_timed_out_command_again() -> None:
    """A real client (standard retry mode re-sends a read timeout twice): one SendCommand on the wire."""
    import json

    import boto3
    from botocore.awsrequest import AWSResponse

    ssm = boto3.client("ssm", region_name="us-east-1")
    wire: list[str] = []
    comments: list[str] = []

    def on_the_wire(request: Any, **_: Any) -> Any:
        operation = request.headers["X-Amz-Target"].decode().split(".")[-1]
        wire.append(operation)
        if operation == "SendCommand":
            comments.append(json.loads(request.body)["Comment"])
            raise ReadTimeoutError(endpoint_url=request.url)  # SSM took it; the answer is lost
        body = {"Commands": [{"CommandId": "c" * 36, "Comment": comments[0]}]}
        return AWSResponse(request.url, 200, {}, _Raw(json.dumps(body).encode()))

    ssm.meta.events.register("before-send.ssm", on_the_wire)
    clock = [0.0]
    command_id = send_command(ssm, ["i-0a"], ["true"], comment="gpucluster test", delivery_timeout=30,
                              deadline=Deadline.after(60, sleep=lambda s: None, clock=lambda: clock[0]))

    assert command_id == "c" * 36
    assert wire == ["SendCommand", "ListCommands"]
