"""Dashboards and rules as code: a stack's Grafana dashboards (`grafana`) and its Prometheus recording
and alert rules (`promql`), rendered from the stack file. Pure: no Pulumi, no AWS; the Prometheus
workspace component, `gpucluster dashboards export` and the tests use the same functions.
"""

from __future__ import annotations

from gpucluster.dashboards.grafana import Dashboard, Panel, dashboards, rendered
from gpucluster.dashboards.promql import MetricsSettings, alerts, from_spec, rules_document

__all__ = ["Dashboard", "MetricsSettings", "Panel", "alerts", "dashboards", "from_spec", "rendered",
           "rules_document"]
