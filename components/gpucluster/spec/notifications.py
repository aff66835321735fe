"""Named check of the `notifications` section: the guardrails' reports reach someone.

Every gpucluster stack builds guardrails (at least the job-restart handler; budget, auto-stop, spot
and Capacity Block handlers as configured), and each reports what it stopped or started, and every
failure after Lambda's retries, to the stack's guardrail topic. A topic without a subscriber drops
those reports, so a stack without one is refused. Never imports Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpucluster.spec.checks import check
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import StackSpec


@check
def notification_rules(spec: StackSpec) -> Iterable[Finding]:
    if not spec.subscribers:
        yield Finding("notifications.emails", "the guardrails report every stop, start and failure to the "
                      "stack's topic, which has no subscriber: add an e-mail address here (or budget.emails)")
