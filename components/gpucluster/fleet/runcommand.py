"""The one SSM Run Command runner: send (batched), poll with backoff, output tails, cancel.

Every SSM Run Command the package makes goes through here: the guardrail hooks and the
Slurm hold (`run_command`), `gpucluster run`, `jobs`, `logs`, `cancel` (`ops.run`) and the
Slurm login-node scripts (`ops.slurmjobs`). One policy per AWS error, applied by `call`
(one request) and `wait` (the one polling loop):

- Refused: AccessDenied, InvalidInstanceId, ValidationException, UnsupportedPlatformType,
  InvalidCommandId, InvalidDocument, ... and any error not named below (no credentials, a
  bad parameter): asking again gets the same answer, so it fails at once, never retried.
  `call` raises the botocore error as it came; `wait` marks that one invocation
  AccessDenied (or Unreadable) with one line saying why, and goes on with the others.
- Throttled or failing on AWS's side (throttling codes, HTTP 5xx, InternalServerError) and a
  connection that never reached AWS (EndpointConnectionError, ConnectTimeoutError):
  retried after an exponential backoff (BACKOFF_FIRST doubling to BACKOFF_MAX, never past
  the deadline); at the deadline the last error is raised. A throttled poll lengthens the
  loop's next sleep the same way instead of blocking the other invocations.
- InvocationDoesNotExist from GetCommandInvocation: SSM has not made the invocation visible
  yet right after the send; `wait` keeps asking (status Pending) until the deadline.
- A timeout after the request went out (ReadTimeoutError, ConnectionClosedError): reads and
  CancelCommand are asked again (asking twice changes nothing). SendCommand may have
  reached SSM: botocore's SSM model gives it no idempotency token (no ClientToken member,
  no idempotent trait), so every send carries a unique marker at the end of its Comment
  (the one free-text field ListCommands returns; Parameters would change what the node
  runs). After such a timeout ListCommands (InstanceId: the batch's first instance,
  InvokedAfter: the first attempt less CLOCK_SKEW, DocumentName) is read for that exact
  Comment: found, its CommandId is the send's; not found, it is sent again with the same
  marker. When ListCommands cannot answer either, the send is reported as `SendUnknown`
  and not repeated: a job started twice is worse than a send reported failed.

ListCommands needs ssm:ListCommands: where the caller's role lacks it (the guardrail roles
and the operator policy do not grant it today; granting it changes the deployed policies),
the lookup is refused and the send is `SendUnknown`: at most once holds either way.

botocore's own retry layer (standard or legacy mode, as the client was built) runs inside
each request first; what reaches the runner is what it gave up on. That layer would send a
SendCommand again after a read timeout, blind (standard mode: three sends): `send_command`
registers `no_blind_resend` on the client's needs-retry event for SendCommand, so such a
timeout comes straight to the lookup; botocore still retries throttling and 5xx there (SSM
refused the request: nothing ran).

The deadline is the caller's: a hook's timeout (bounded by the Lambda's remaining time), a
login-node script's execution timeout plus a minute, RETRY_SECONDS for `run`'s sends and
cancels. The hooks never raise for an AWS error and never wait past their deadline (a hook
that fails or hangs must not keep a guardrail from acting). Never imports Pulumi: it is
carried into the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

import logging
import secrets
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from .awsapi import AWS_ERRORS, batches, error_code, log_event
from .runtime import RUNTIME

# SSM Run Command: terminal invocation states (API reference, GetCommandInvocation.Status).
TERMINAL_STATUSES = frozenset({"Success", "Cancelled", "TimedOut", "Failed"})
# Statuses the runner gives an invocation itself, beyond SSM's: never sent; its status cannot be
# read (AccessDenied on a poll is not "still running"; another refusal is Unreadable); a cancel AWS
# refused. Each ends the wait for that invocation.
NOT_SENT, ACCESS_DENIED, UNREADABLE, CANCEL_FAILED = "NotSent", "AccessDenied", "Unreadable", "CancelFailed"
ENDED_HERE = frozenset({NOT_SENT, ACCESS_DENIED, UNREADABLE, CANCEL_FAILED})
FINAL_STATUSES = TERMINAL_STATUSES | ENDED_HERE
# SendCommand accepts at most 50 instance ids per call (API reference, InstanceIds).
MAX_INSTANCES_PER_COMMAND = 50
# SendCommand refuses the whole call when one instance cannot take it: InvalidInstanceId covers
# "not a managed node, SSM Agent not running or not registered, no permission on the node, or
# shutting down" (SSM API reference, SendCommand errors). The batch is then sent again one
# instance at a time, so every node that can run the hook still runs it.
PER_INSTANCE_RETRY_ERRORS = frozenset(
    {"InvalidInstanceId", "AccessDeniedException", "UnsupportedPlatformType"}
)
RUN_SHELL_DOCUMENT = "AWS-RunShellScript"
COMMENT_LIMIT = 100  # SendCommand.Comment: at most 100 characters (service model)

DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})
THROTTLING_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "TooManyRequestsException",
    "RequestLimitExceeded", "RequestThrottled", "RequestThrottledException", "SlowDown",
})
SERVER_CODES = frozenset({"InternalServerError", "InternalFailure", "InternalError", "ServiceUnavailable"})
NOT_YET_CODE = "InvocationDoesNotExist"
# The kinds of failure `classify` tells apart (the policy in the module docstring).
REFUSED, TRANSIENT, NOT_YET, MAYBE_LANDED = "refused", "transient", "not-yet", "maybe-landed"
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 20.0
RETRY_SECONDS = 60.0
"""How long a send or a cancel keeps being retried when the caller gives no deadline."""
CLOCK_SKEW = timedelta(minutes=5)
"""ListCommands' InvokedAfter is AWS's clock: look that far before our own first attempt."""


class SendUnknown(BotoCoreError):  # type: ignore[misc]  # botocore ships no types: its base is Any
    """SendCommand timed out after the request went out, and ListCommands could not tell whether
    the command landed: it is not sent again (at most once)."""

    fmt = ("SendCommand timed out after the request went out and ListCommands could not tell whether it "
           "reached SSM ({error}); not sent again")


def classify(exc: BaseException) -> str:
    """Which policy applies to an error from an SSM request (module docstring)."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == NOT_YET_CODE:
            return NOT_YET
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in THROTTLING_CODES or code in SERVER_CODES or (isinstance(status, int) and status >= 500):
            return TRANSIENT
        return REFUSED
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return TRANSIENT  # the request never left: sending again cannot run anything twice
    if isinstance(exc, (ReadTimeoutError, ConnectionClosedError)):
        return MAYBE_LANDED
    return REFUSED


def describe(exc: BaseException) -> str:
    """One line: the AWS error code (or the error's type) and its message."""
    return f"{error_code(exc) or type(exc).__name__}: {exc}"


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (0-based): doubling, capped."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2.0 ** min(attempt, 16))


@dataclass(frozen=True)
class Deadline:
    """When to stop retrying and waiting, with the clock and sleep it is measured by (tests fake both)."""

    at: float
    sleep: Callable[[float], None]
    clock: Callable[[], float]

    @classmethod
    def after(cls, seconds: float, *, sleep: Callable[[float], None] | None = None,
              clock: Callable[[], float] | None = None) -> Deadline:
        clock = clock or RUNTIME.clock
        return cls(clock() + max(0.0, seconds), sleep or RUNTIME.sleep, clock)

    def left(self) -> float:
        return self.at - self.clock()


def call(ssm: Any, operation: str, deadline: Deadline, **kwargs: Any) -> Any:
    """One SSM request under the policy: refusals raised at once, transient errors and timeouts
    retried with backoff until the deadline (then raised). Not for SendCommand (`send_command`)."""
    attempt = 0
    while True:
        try:
            return getattr(ssm, operation)(**kwargs)
        except AWS_ERRORS as exc:
            if classify(exc) not in (TRANSIENT, MAYBE_LANDED):
                raise
            pause = min(backoff(attempt), deadline.left())
            if pause <= 0:
                raise
            log_event("SSM request retried", logging.WARNING, operation=operation, error=describe(exc))
            deadline.sleep(pause)
            attempt += 1


def marked(comment: str) -> str:
    """The comment with a marker no other send has, so a send that timed out can be found."""
    tag = f"#{secrets.token_hex(4)}"
    return f"{comment[: COMMENT_LIMIT - len(tag) - 1]} {tag}"


def _landed(ssm: Any, instance_id: str, document: str, comment: str, since: str,
            deadline: Deadline) -> str | None:
    """The CommandId of the send marked `comment`, if SSM has it (ListCommands, every page)."""
    request: dict[str, Any] = {
        "InstanceId": instance_id, "MaxResults": 50,
        "Filters": [{"key": "InvokedAfter", "value": since}, {"key": "DocumentName", "value": document}]}
    while True:
        page = call(ssm, "list_commands", deadline, **request)
        for command in page.get("Commands", []):
            if command.get("Comment") == comment:
                return str(command["CommandId"])
        if not page.get("NextToken"):
            return None
        request["NextToken"] = page["NextToken"]


AT_MOST_ONCE = "gpucluster-send-command-at-most-once"


def no_blind_resend(caught_exception: BaseException | None = None, **_: Any) -> None:
    """botocore's needs-retry hook for SendCommand: a timeout after the request went out is
    raised to the runner (which looks the command up) instead of being sent again unseen."""
    if caught_exception is not None and classify(caught_exception) == MAYBE_LANDED:
        raise caught_exception


def _at_most_once(ssm: Any) -> None:
    """Put `no_blind_resend` on a botocore client once (fakes without `meta.events` have no retry layer)."""
    events = getattr(getattr(ssm, "meta", None), "events", None)
    if events is not None:
        events.register_first("needs-retry.ssm.SendCommand", no_blind_resend, unique_id=AT_MOST_ONCE)


def send_command(ssm: Any, instance_ids: Sequence[str], commands: Sequence[str], *, comment: str,
                 delivery_timeout: int, deadline: Deadline, execution_timeout: int | None = None,
                 log_group: str | None = None) -> str:
    """One AWS-RunShellScript SendCommand under the policy, sent at most once; its CommandId.

    Raises the botocore error of a refusal at once, the last transient one at the deadline, and
    `SendUnknown` when a timeout after the request went out cannot be resolved.
    """
    parameters: dict[str, list[str]] = {"commands": list(commands)}
    if execution_timeout is not None:
        # The agent kills the script at this point (document parameter, 1..172800 s).
        parameters["executionTimeout"] = [str(execution_timeout)]
    request: dict[str, Any] = {
        "InstanceIds": list(instance_ids), "DocumentName": RUN_SHELL_DOCUMENT,
        "Comment": marked(comment), "TimeoutSeconds": delivery_timeout, "Parameters": parameters}
    if log_group:
        request["CloudWatchOutputConfig"] = {"CloudWatchOutputEnabled": True,
                                             "CloudWatchLogGroupName": log_group}
    since = (RUNTIME.now() - CLOCK_SKEW).strftime("%Y-%m-%dT%H:%M:%SZ")
    _at_most_once(ssm)
    attempt = 0
    while True:
        try:
            return str(ssm.send_command(**request)["Command"]["CommandId"])
        except AWS_ERRORS as exc:
            kind = classify(exc)
            if kind not in (TRANSIENT, MAYBE_LANDED):
                raise
            if kind == MAYBE_LANDED:
                try:
                    found = _landed(ssm, request["InstanceIds"][0], RUN_SHELL_DOCUMENT, request["Comment"],
                                    since, deadline)
                except AWS_ERRORS as lookup:
                    raise SendUnknown(error=describe(lookup)) from exc
                if found is not None:
                    log_event("send timed out but landed", command_id=found, instances=request["InstanceIds"])
                    return found
            pause = min(backoff(attempt), deadline.left())
            if pause <= 0:
                raise
            log_event("SendCommand retried", logging.WARNING, instances=request["InstanceIds"],
                      error=describe(exc))
            deadline.sleep(pause)
            attempt += 1


def cancel_command(ssm: Any, command_id: str, instance_ids: Sequence[str], deadline: Deadline) -> None:
    """CancelCommand under the policy (asked again after a timeout: a second cancel changes nothing)."""
    call(ssm, "cancel_command", deadline, CommandId=command_id, InstanceIds=list(instance_ids))


class Watched(Protocol):
    """What `wait` reads and updates: one command on one instance (ops' results have this shape)."""

    instance_id: str
    command_id: str | None
    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    error: str


@dataclass
class Invocation:
    """One command on one instance, as last seen; `failure`: the refusal that ended its wait."""

    instance_id: str
    command_id: str | None = None
    status: str = "Pending"
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    failure: BaseException | None = None


def wait(ssm: Any, invocations: Sequence[Watched], deadline: Deadline, *, poll_seconds: float,
         on_change: Callable[[Any], None] | None = None) -> bool:
    """Poll each sent invocation (GetCommandInvocation) until all are final or the deadline; True: all are.

    The one SSM polling loop. Output tails: GetCommandInvocation returns the first 24,000
    characters of stdout and 8,000 of stderr (ListCommandInvocations only 2,500), kept on each
    invocation as they grow. `on_change` gets an invocation each time its status changes.
    """
    interval = poll_seconds
    while True:
        slowed = False
        for invocation in invocations:
            if invocation.status in FINAL_STATUSES or not invocation.command_id:
                continue
            try:
                answer = ssm.get_command_invocation(CommandId=invocation.command_id,
                                                    InstanceId=invocation.instance_id)
            except AWS_ERRORS as exc:
                kind = classify(exc)
                if kind == REFUSED:
                    refused(invocation, exc)
                    if on_change is not None:
                        on_change(invocation)
                slowed = slowed or kind in (TRANSIENT, MAYBE_LANDED)
                continue  # not visible yet, throttled, or a timeout: ask again next round
            status = str(answer.get("Status", "Pending"))
            changed = status != invocation.status
            invocation.status = status
            code = answer.get("ResponseCode")
            invocation.exit_code = code if isinstance(code, int) and code >= 0 else None
            invocation.stdout = answer.get("StandardOutputContent", "") or ""
            invocation.stderr = answer.get("StandardErrorContent", "") or ""
            if changed and on_change is not None:
                on_change(invocation)
        if all(i.status in FINAL_STATUSES or not i.command_id for i in invocations):
            return True
        left = deadline.left()
        if left <= 0:
            return False
        interval = min(BACKOFF_MAX, interval * 2) if slowed else poll_seconds
        deadline.sleep(min(interval, left))


def refused(invocation: Watched, exc: BaseException) -> None:
    """A poll AWS refused: the invocation's wait ends now, with one line saying why."""
    invocation.status = ACCESS_DENIED if error_code(exc) in DENIED_CODES else UNREADABLE
    invocation.error = f"cannot read the command's status: {describe(exc)}"
    if isinstance(invocation, Invocation):
        invocation.failure = exc
    log_event("command status unreadable", logging.WARNING, instance=invocation.instance_id,
              command_id=invocation.command_id, error=describe(exc))


# ------------------------------------------------------------------------ the hooks


@dataclass
class CommandResult:
    """Last seen SSM status per instance; `timed_out` when we stopped waiting.

    `errors` holds why the command could not be sent to an instance (status NotSent).
    """

    statuses: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(s == "Success" for s in self.statuses.values())

    @property
    def failed(self) -> dict[str, str]:
        """Instances whose hook did not succeed (or was not sent), with their last status."""
        return {i: s for i, s in sorted(self.statuses.items()) if s != "Success"}

    def summary(self) -> dict[str, Any]:
        """For the handler's result and its notification: what did not run, and why."""
        doc: dict[str, Any] = {"ok": self.ok, "timed_out": self.timed_out}
        if self.failed:
            doc["failed"] = self.failed
        if self.errors:
            doc["not_sent"] = dict(sorted(self.errors.items()))
        return doc


def send_batches(ssm: Any, instance_ids: Sequence[str], commands: Sequence[str], *, comment: str,
                 delivery_timeout: int, execution_timeout: int, deadline: Deadline) -> list[Invocation]:
    """The same command to many instances, 50 a call; never raises for AWS.

    A batch refused for one instance is sent again instance by instance, so one node SSM
    cannot reach does not cancel the others; an instance it could not reach is NotSent, with why.
    """
    invocations: list[Invocation] = []
    todo = batches(list(dict.fromkeys(instance_ids)), MAX_INSTANCES_PER_COMMAND)
    while todo:
        batch = todo.pop(0)
        try:
            command_id = send_command(ssm, batch, commands, comment=comment, deadline=deadline,
                                      delivery_timeout=delivery_timeout, execution_timeout=execution_timeout)
        except AWS_ERRORS as exc:
            if len(batch) > 1 and error_code(exc) in PER_INSTANCE_RETRY_ERRORS:
                log_event("hook refused for the batch, sending per instance", logging.WARNING,
                          instances=batch, error=str(exc))
                todo[:0] = [[instance] for instance in batch]
                continue
            log_event("hook not sent", logging.WARNING, instances=batch, error=str(exc))
            invocations += [Invocation(i, status=NOT_SENT, error=str(exc), failure=exc) for i in batch]
            continue
        log_event("hook sent", command_id=command_id, instances=batch)
        invocations += [Invocation(i, command_id) for i in batch]
    return invocations


def run_command(
    ssm: Any,
    instance_ids: Sequence[str],
    command: str,
    *,
    timeout_seconds: float,
    environment: Mapping[str, str] | None = None,
    comment: str = "gpucluster guardrail hook",
    poll_seconds: float = 5.0,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> CommandResult:
    """Run a shell command on instances with AWS-RunShellScript and wait, at most timeout_seconds.

    Never raises for AWS errors and never waits past the deadline: a hook that fails or hangs
    must not keep a guardrail from acting. A node SSM refuses (to send to, or to read) is
    that node's failure at once (NotSent with `errors`, or AccessDenied/Unreadable), never
    waited on; throttling is retried within the same deadline.
    """
    deadline = Deadline.after(timeout_seconds, sleep=sleep, clock=clock)
    result = CommandResult()
    if not instance_ids:
        return result
    exports = [f"export {k}={shlex.quote(v)}" for k, v in (environment or {}).items()]
    invocations = send_batches(
        ssm, instance_ids, [*exports, command], comment=comment,
        # Delivery timeout: minimum 30 s (API reference, SendCommand.TimeoutSeconds).
        delivery_timeout=max(30, int(timeout_seconds)),
        execution_timeout=min(172800, max(1, int(timeout_seconds))), deadline=deadline)
    result.errors.update({i.instance_id: i.error for i in invocations if i.status == NOT_SENT})
    result.timed_out = not wait(ssm, invocations, deadline, poll_seconds=poll_seconds)
    result.statuses.update({i.instance_id: i.status for i in invocations})
    level = logging.INFO if result.ok else logging.WARNING
    log_event("hook finished", level, statuses=result.statuses, timed_out=result.timed_out)
    return result
