"""A deployed stack at a glance: its node groups' capacity, stops, GPU health and use, its dashboard.

This is `gpucluster status` without the command line: one call reads the stack's Auto
Scaling groups and GPU metrics (`gpucluster.ops.status`), names its CloudWatch dashboard and
checks that the budget's cost-allocation tag is active. Read-only; it prints nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucluster.ops import Clients, Spinner, no_spinner

if TYPE_CHECKING:
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


def stack_overview(spec: StackSpec, *, clients: Clients, ce: Any,
                   progress: Spinner = no_spinner) -> StackOverview:
    """The stack's groups with their health, its dashboard, the cost-tag check (`ce`: Cost Explorer)."""
    from gpucluster.names import dashboard_name, dashboard_url
    from gpucluster.noderole import gpu_metric_namespace
    from gpucluster.ops.doctor import cost_tag_warning
    from gpucluster.ops.status import stack_status

    url = dashboard_url(spec.region, dashboard_name(spec.cluster.name, spec.region))
    with progress(f"reading {spec.stack}'s Auto Scaling groups and GPU metrics in {spec.region}"):
        groups = stack_status(spec.identity, autoscaling_client=clients("autoscaling"),
                              cloudwatch_client=clients("cloudwatch"), health=True,
                              metric_namespace=gpu_metric_namespace(spec.cluster.name))
    with progress("checking the budget's cost-allocation tag"):
        warning = cost_tag_warning(spec, ce)
    grafana = None
    if spec.observability.grafana.enabled:
        from gpucluster.ops.dashboards import grafana_url

        with progress("finding the stack's Grafana workspace"):
            grafana = grafana_url(spec, clients("grafana"))
    return StackOverview(groups, url, warning, grafana)
