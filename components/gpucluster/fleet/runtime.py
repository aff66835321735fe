"""What a guardrail handler needs from its deployment: its settings, its clients, its errors, its topic.

It owns the environment readers (what `handlers.ENVIRONMENT` lists), the
swappable seams to the outside world (`RUNTIME`: clients, sleep, clocks) and
the SNS notification. It must never act on a node group itself (that is
`nodegroups` and its backends) and never import Pulumi: it is carried into
the Lambda archive as ``gpucluster.fleet``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .awsapi import AWS_ERRORS, log_event, make_client


class ConfigError(RuntimeError):
    """The Lambda is deployed without a setting it cannot work without."""


class GuardrailError(RuntimeError):
    """AWS refused part of an action; raised after the rest is done so Lambda retries."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Runtime:
    """The handlers' seams to the outside world; tests swap these attributes."""

    client: Callable[[str], Any] = make_client
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = _utcnow


RUNTIME = Runtime()


# --- configuration ---------------------------------------------------------------------------


def stack_from_env() -> str:
    """The stack this Lambda guards; without it the handler cannot tell its groups apart."""
    stack = os.environ.get("GPUCLUSTER_STACK", "").strip()
    if not stack:
        raise ConfigError("GPUCLUSTER_STACK is not set: the guardrail does not know its stack")
    return stack


def env_number(name: str, default: float) -> float:
    """A positive number from the environment; a bad value falls back to the default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        log_event("invalid setting, using default", logging.WARNING, name=name, value=raw)
        return default
    return value


def env_text(name: str) -> str | None:
    """An optional string setting; blank means unset."""
    value = os.environ.get(name, "").strip()
    return value or None


def bounded_timeout(requested: float, context: Any, reserve_seconds: float = 15.0) -> float:
    """Cap a wait so the Lambda still has time to scale and log before it is killed."""
    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    if callable(remaining_ms):
        return max(0.0, min(requested, float(remaining_ms()) / 1000.0 - reserve_seconds))
    return requested


def invocation_deadline(context: Any, reserve_seconds: float = 15.0) -> float | None:
    """The `RUNTIME.clock()` value by which a wait must end so the Lambda still has `reserve_seconds`
    to record, notify and log before it is killed; None without a Lambda context (no wait)."""
    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(remaining_ms):
        return None
    return RUNTIME.clock() + float(remaining_ms()) / 1000.0 - reserve_seconds


def ignored(reason: str, **fields: Any) -> dict[str, Any]:
    """Log an event we do not act on and return the handler's summary for it."""
    log_event("event ignored", reason=reason, **fields)
    return {"action": "ignored", "reason": reason}


# --- notifications ---------------------------------------------------------------------------


class NotifyError(GuardrailError):
    """SNS refused a notification: raised after the work, so Lambda retries and the on-failure
    destination (or, past the retries, the function's Errors alarm) gets it."""


def notify(sns: Any, topic_arn: str | None, subject: str, message: Mapping[str, Any]) -> bool:
    """Publish a summary to SNS if a topic is configured; a failed publish raises `NotifyError`.

    A guardrail that acted and could not say so must not return success: nobody would know.
    """
    if not topic_arn or sns is None:
        return False
    # SNS subject: ASCII, no line breaks, at most 100 characters (API reference, Publish).
    clean_subject = "".join(c if 32 <= ord(c) < 127 else " " for c in subject)[:100]
    try:
        sns.publish(
            TopicArn=topic_arn,
            Subject=clean_subject,
            Message=json.dumps(message, indent=2, sort_keys=True, default=str),
        )
    except AWS_ERRORS as exc:
        log_event("notification failed", logging.ERROR, topic=topic_arn, error=str(exc))
        raise NotifyError(f"notification to {topic_arn} failed: {exc}") from exc
    return True


def notify_from_env(subject: str, message: Mapping[str, Any]) -> bool:
    """Publish to NOTIFY_TOPIC_ARN when it is set; build the SNS client only then."""
    topic_arn = env_text("NOTIFY_TOPIC_ARN")
    if not topic_arn:
        return False
    return notify(RUNTIME.client("sns"), topic_arn, subject, message)
