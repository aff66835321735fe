"""A deployed stack at a glance: its node groups' capacity, stops, GPU health and use, its dashboard,
and its spend so far as the spend guard sees it.

This is `gpucluster status` without the command line: one call reads the stack's node
groups and GPU metrics (`gpucluster.ops.status`), names its CloudWatch dashboard,
checks that the budget's cost-allocation tag is active, and measures month-to-date spend,
burn rate and when the limit will be hit with the spend guard's own functions
(`gpucluster.fleet.spendguard.measure`, `accrual.decide`). Read-only; it prints nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpucluster.ops import Clients, Spinner, no_spinner

if TYPE_CHECKING:
    from gpucluster.fleet.asg import MaxChange
    from gpucluster.ops.boottimes import GroupBootTimes
    from gpucluster.ops.nodegroups import Fleet
    from gpucluster.ops.status import GroupStatus
    from gpucluster.spec import StackSpec


@dataclass
class StackOverview:
    groups: list[GroupStatus]
    """Empty: no Auto Scaling group carries the stack's identity tag (not deployed, elsewhere)."""
    dashboard_url: str
    cost_tag_warning: str | None
    """Why the budget may see $0 of the stack's spend (None: its tag is active)."""
    grafana_url: str | None = None
    """The stack's Amazon Managed Grafana workspace (observability.grafana; None: none found)."""
    spend: dict[str, Any] | None = None
    """Month-to-date spend, burn rate and when the limit is hit (`spend_now`; None: no budget)."""
    spend_error: str | None = None
    """Why the spend could not be read (Cost Explorer denied, throttled...)."""
    boot_times: list[GroupBootTimes] = field(default_factory=list)
    """Each node group's time to ready and to its first job, as its nodes measured it (ops.boottimes)."""
    boot_times_error: str | None = None
    """Why they could not be read from CloudWatch."""
    maxima: list[MaxChange] = field(default_factory=list)
    """An EKS stack's groups that run with a maximum that is not their configured one (a `pulumi up`
    changed max_nodes; `gpucluster start` sets it: `ops.stopstart.start_maxima`)."""


def spend_now(spec: StackSpec, fleet: Fleet, *, ce: Any,
              now: datetime | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(spend document, error): what the spend guard would compute now, read-only.

    The limit is the budget's action threshold (the guard's stop), or the monthly limit when the
    stack has no action. None, None without a budget.
    """
    from gpucluster.fleet.accrual import PriceError, Prices, decide, when_limit
    from gpucluster.fleet.capacityblocks import BlockAnswerError
    from gpucluster.fleet.spendguard import CostAnswerError, measure
    from gpucluster.ops.awserrors import AWS_ERRORS, describe
    from gpucluster.pricing import guard_prices

    budget = spec.budget
    if budget is None:
        return None, None
    now = now or datetime.now(UTC)
    limit = budget.monthly_limit_usd * (budget.action_threshold_percent or 100) / 100
    try:
        groups, spend = measure(spec.identity, fleet.groups, fleet.clients("ec2"), ce,
                                fleet.clients("cloudwatch"), Prices.from_json(guard_prices(spec)), now)
    except AWS_ERRORS as exc:
        return None, f"spend not read: {describe(exc)}"  # never an HTML body
    except (CostAnswerError, BlockAnswerError) as exc:  # an answer that is not a figure is never $0
        return None, f"spend not read: {exc}"
    except PriceError as exc:
        return None, f"spend not priced: {exc}"
    decision = decide(spend, limit, budget.check_minutes, budget.max_usd_per_hour,
                      compute_running=any(g.running for g in groups))
    hit = when_limit(now, decision)
    return {"month_to_date_usd": round(spend.total_usd, 2), "settled_usd": round(spend.settled_usd, 2),
            "settled_through": spend.settled_through.date().isoformat(),
            "accrued_usd": round(spend.accrued_usd, 2), "usd_per_hour": round(spend.usd_per_hour, 2),
            "limit_usd": round(limit, 2), "hours_to_limit": decision.to_limit_hours(),
            "limit_at": hit.isoformat(timespec="minutes") if hit else None,
            "over_limit": spend.total_usd >= limit,
            "guard": "on" if budget.action_threshold_percent is not None else "off",
            **({"notes": list(spend.notes)} if spend.notes else {})}, None


def stack_overview(spec: StackSpec, *, clients: Clients, ce: Any,
                   progress: Spinner = no_spinner) -> StackOverview:
    """The stack's groups with their health, its dashboard, the cost-tag check (`ce`: Cost Explorer).

    The node-group backend is chosen once (`ops.nodegroups.stack_fleet`) for the status and the spend."""
    from gpucluster.names import dashboard_name, dashboard_url
    from gpucluster.noderole import gpu_metric_namespace
    from gpucluster.ops.boottimes import stack_boot_times
    from gpucluster.ops.doctor import cost_tag_warning
    from gpucluster.ops.nodegroups import stack_fleet
    from gpucluster.ops.status import stack_status
    from gpucluster.ops.stopstart import start_maxima

    url = dashboard_url(spec.region, dashboard_name(spec.cluster.name, spec.region))
    with progress(f"reading {spec.stack}'s Auto Scaling groups and GPU metrics in {spec.region}"):
        fleet = stack_fleet(spec, clients)
        groups = stack_status(fleet, health=True, metric_namespace=gpu_metric_namespace(spec.cluster.name))
        maxima = start_maxima(fleet)
    with progress("checking the budget's cost-allocation tag"):
        warning = cost_tag_warning(spec, ce)
    grafana = None
    if spec.observability.grafana.enabled:
        from gpucluster.ops.dashboards import grafana_url

        with progress("finding the stack's Grafana workspace"):
            grafana = grafana_url(spec, clients("grafana"))
    with progress("measuring spend so far (Cost Explorer + running instances)"):
        spend, error = spend_now(spec, fleet, ce=ce)
    with progress("reading the nodes' boot times (CloudWatch)"):
        boots, boots_error = stack_boot_times(spec, clients("cloudwatch"))
    return StackOverview(groups, url, warning, grafana_url=grafana, spend=spend, spend_error=error,
                         boot_times=boots, boot_times_error=boots_error, maxima=maxima)
