"""Spend report handler: the stack's spend and idle GPU waste on the guardrail topic, weekly or monthly.

The handler is invoked by a weekly or monthly EventBridge rule (`budget.report`) and
publishes to the guardrail topic: spend so far this month, the forecast to the month's
end against the budget, the period's idle waste and its top group. It only reads;
it never changes or deletes anything. The arithmetic is `gpucluster.fleet.spendreport`'s.

Environment: GPUCLUSTER_STACK (required), NOTIFY_TOPIC_ARN, REPORT_PERIOD (weekly or
monthly), MONTHLY_LIMIT_USD, IDLE_THRESHOLD_PERCENT.
"""

from __future__ import annotations

from typing import Any

from gpucluster.fleet.awsapi import log_event
from gpucluster.fleet.runtime import RUNTIME, env_number, env_text, ignored, notify_from_env, stack_from_env
from gpucluster.fleet.spendreport import DEFAULT_IDLE_THRESHOLD_PERCENT, REPORT_PERIODS, build_report


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point: a scheduled event in, the spend report on the guardrail topic out."""
    stack = stack_from_env()
    if not isinstance(event, dict) or event.get("detail-type") != "Scheduled Event":
        return ignored("not a scheduled event", stack=stack)
    period = env_text("REPORT_PERIOD") or "weekly"
    if period not in REPORT_PERIODS:
        return ignored("REPORT_PERIOD is not weekly or monthly", period=period)
    limit = env_number("MONTHLY_LIMIT_USD", 0.0) or None
    threshold = env_number("IDLE_THRESHOLD_PERCENT", DEFAULT_IDLE_THRESHOLD_PERCENT)
    report = build_report(stack, period, RUNTIME.now(), limit, threshold)
    summary = report.as_json()
    notify_from_env(report.subject(), summary)
    log_event("spend report", **summary)
    return summary
