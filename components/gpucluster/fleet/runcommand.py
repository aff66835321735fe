"""Hooks on nodes through SSM Run Command: send one shell command to many instances and wait, bounded.

It owns `run_command` and its result, used by the pre-stop and interruption
hooks of the handlers and by `gpucluster run`. It must never raise for an AWS
error nor wait past its deadline (a hook that fails or hangs must not keep a
guardrail from acting), and never import Pulumi: it is carried into
the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .awsapi import AWS_ERRORS, batches, error_code, log_event
from .runtime import RUNTIME

# SSM Run Command: terminal invocation states (API reference, GetCommandInvocation.Status).
TERMINAL_STATUSES = frozenset({"Success", "Cancelled", "TimedOut", "Failed"})
# SendCommand accepts at most 50 instance ids per call (API reference, InstanceIds).
MAX_INSTANCES_PER_COMMAND = 50
# SendCommand refuses the whole call when one instance cannot take it: InvalidInstanceId covers
# "not a managed node, SSM Agent not running or not registered, no permission on the node, or
# shutting down" (SSM API reference, SendCommand errors). The batch is then sent again one
# instance at a time, so every node that can run the hook still runs it.
PER_INSTANCE_RETRY_ERRORS = frozenset(
    {"InvalidInstanceId", "AccessDeniedException", "UnsupportedPlatformType"}
)
NOT_SENT = "NotSent"
RUN_SHELL_DOCUMENT = "AWS-RunShellScript"


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

    Never raises for AWS errors and never waits past the deadline: a hook that
    fails or hangs must not keep a guardrail from acting. One instance that SSM
    cannot reach does not cancel the others: a batch refused for it is sent
    again instance by instance, and the unreachable ones are reported in
    `CommandResult.errors`.
    """
    sleep = sleep or RUNTIME.sleep
    clock = clock or RUNTIME.clock
    deadline = clock() + max(0.0, timeout_seconds)
    result = CommandResult()
    if not instance_ids:
        return result
    exports = [f"export {k}={shlex.quote(v)}" for k, v in (environment or {}).items()]
    parameters = {
        "commands": [*exports, command],
        # The agent kills the script at this point (document parameter, 1..172800 s).
        "executionTimeout": [str(min(172800, max(1, int(timeout_seconds))))],
    }
    pending: dict[str, str] = {}
    ids = list(dict.fromkeys(instance_ids))
    todo = batches(ids, MAX_INSTANCES_PER_COMMAND)
    while todo:
        batch = todo.pop(0)
        try:
            response = ssm.send_command(
                InstanceIds=batch,
                DocumentName=RUN_SHELL_DOCUMENT,
                Comment=comment[:100],
                # Delivery timeout: minimum 30 s (API reference, SendCommand.TimeoutSeconds).
                TimeoutSeconds=max(30, int(timeout_seconds)),
                Parameters=parameters,
            )
        except AWS_ERRORS as exc:
            if len(batch) > 1 and error_code(exc) in PER_INSTANCE_RETRY_ERRORS:
                log_event("hook refused for the batch, sending per instance", logging.WARNING,
                          instances=batch, error=str(exc))
                todo[:0] = [[instance] for instance in batch]
                continue
            log_event("hook not sent", logging.WARNING, instances=batch, error=str(exc))
            result.statuses.update(dict.fromkeys(batch, NOT_SENT))
            result.errors.update(dict.fromkeys(batch, str(exc)))
            continue
        command_id = response["Command"]["CommandId"]
        log_event("hook sent", command_id=command_id, instances=batch)
        pending.update(dict.fromkeys(batch, command_id))
    while pending:
        for instance_id, command_id in list(pending.items()):
            try:
                status = ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)[
                    "Status"
                ]
            except AWS_ERRORS:
                # InvocationDoesNotExist right after sending, or throttling: ask again later.
                status = "Pending"
            result.statuses[instance_id] = status
            if status in TERMINAL_STATUSES:
                del pending[instance_id]
        remaining = deadline - clock()
        if pending and remaining <= 0:
            result.timed_out = True
            break
        if pending:
            sleep(min(poll_seconds, remaining))
    level = logging.INFO if result.ok else logging.WARNING
    log_event("hook finished", level, statuses=result.statuses, timed_out=result.timed_out)
    return result
