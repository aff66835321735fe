"""Named checks of the `budget` section: thresholds ascending, within AWS Budgets' notification limit,
and a burn-rate cap only with a stop to enforce it.

Small functions returning findings; never imports Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from gpucluster.spec.checks import check
from gpucluster.spec.fields import number_text
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import BudgetConfig, StackSpec

MAX_BUDGET_NOTIFICATIONS = 10


@check
def budget_rules(spec: StackSpec) -> Iterable[Finding]:
    if spec.budget is not None:
        yield from budget_findings(spec.budget)


def budget_findings(b: BudgetConfig, path: str = "budget") -> Iterable[Finding]:
    if b.max_usd_per_hour is not None and b.action_threshold_percent is None:
        yield Finding(f"{path}.max_usd_per_hour",
                      "needs action_threshold_percent: the spend guard that enforces it stops compute")
    t = b.alert_thresholds_percent
    if any(later <= earlier for earlier, later in pairwise(t)):
        yield Finding(f"{path}.alert_thresholds_percent",
                      f"must be strictly ascending, got {', '.join(number_text(x) for x in t)}")
    # One ACTUAL notification per distinct threshold plus the FORECASTED one at 100 %;
    # a budget holds at most 10 notifications (Budgets API reference, "Notification").
    actual = set(t) | ({b.action_threshold_percent} if b.action_threshold_percent else set())
    if len(actual) + 1 > MAX_BUDGET_NOTIFICATIONS:
        yield Finding(f"{path}.alert_thresholds_percent",
                      f"AWS Budgets allows {MAX_BUDGET_NOTIFICATIONS} notifications per budget: "
                      f"{len(actual)} actual-spend thresholds (with action_threshold_percent) and the "
                      f"forecast alert make {len(actual) + 1}")
