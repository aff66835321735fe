"""ClusterDashboard: one CloudWatch dashboard per stack, the stuck-job alarms, and the guardrail-stop count.

It owns what people look at: a dashboard with each group's GPU utilisation,
GPU memory used, temperature and power (the CloudWatch agent's nvidia_gpu
series per Auto Scaling group), nodes desired / in service / held by the
launch check (the group metrics), health replacements and abandoned launches
(counted by the nodes' health check), guardrail stops (a metric filter on the
guardrail Lambdas' logs) and the budget; and, where asked, an alarm per group
whose GPUs stay busy-but-flat or whose nodes in service publish no GPU metric.
Every metric it reads is one another part publishes with the same dimensions
(tests hold it to that). It must not change a group or stop anything: its
alarms only notify.
"""

import functools
import json
from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import ClusterDashboardModel, dashboard_checks, owned_tags, type_token, validate
from gpucluster.aws.health import GROUP_METRICS
from gpucluster.aws.settings import BudgetSettings
from gpucluster.names import dashboard_name, dashboard_url
from gpucluster.node.userdata import (
    GPU_METRIC_DIMENSION,
    GPU_METRIC_PERIOD_SECONDS,
    HEALTH_METRICS,
)
from gpucluster.noderole import gpu_metric_namespace

AUTOSCALING_NAMESPACE = "AWS/AutoScaling"
GUARDRAIL_STOPS_METRIC = "GuardrailStops"
# What the guardrail Lambdas log, once per group they scale to zero
# (gpucluster.fleet.asg.scale_to_zero: log_event("group scaled to zero", ...)). A quoted term
# matches the exact phrase anywhere in the event (CloudWatch Logs, "Filter pattern syntax").
STOP_LOG_PHRASE = "group scaled to zero"
# The stuck-job alarm: every GPU of the group at or above BUSY percent, within FLAT points of each
# other, minute after minute; or nodes in service and not one GPU datapoint.
STUCK_BUSY_PERCENT = 95
STUCK_FLAT_POINTS = 2
# The series whose absence means a silent node: reported by every GPU, in MIG mode too (NVML gives a
# MIG-mode GPU no utilisation; the agent skips what it cannot read).
SILENCE_MEASUREMENT = "temperature_gpu"
WIDGET_WIDTH, WIDGET_HEIGHT = 12, 6


def gpu_metric(measurement: str) -> str:
    """The agent's name of an nvidia_gpu measurement (CloudWatch user guide, "Collect NVIDIA GPU metrics")."""
    return f"nvidia_smi_{measurement}"


# ------------------------------------------------------------------- the dashboard body (pure)


def _per_group(namespace: str, metric: str, groups: Sequence[tuple[str, str]], stats: Sequence[str],
               ) -> list[list[Any]]:
    """One line per group and statistic, on the one-dimension (Auto Scaling group) series."""
    return [[namespace, metric, GPU_METRIC_DIMENSION, asg, {"stat": stat, "label": f"{group} {stat.lower()}"}]
            for group, asg in groups for stat in stats]


def _metric_widget(title: str, metrics: list[list[Any]], region: str, *, unit: str = "",
                   y_max: float | None = None) -> dict[str, Any]:
    left: dict[str, Any] = {"min": 0, "label": unit}
    if y_max is not None:
        left["max"] = y_max
    return {"type": "metric", "width": WIDGET_WIDTH, "height": WIDGET_HEIGHT, "properties": {
        "title": title, "region": region, "view": "timeSeries", "stacked": False,
        "period": GPU_METRIC_PERIOD_SECONDS, "metrics": metrics, "yAxis": {"left": left}}}


def dashboard_body(*, cluster_name: str, identity: str, region: str, groups: Sequence[tuple[str, str]],
                   guardrail_stops: bool, alarm_arns: Sequence[str] = (),
                   budget: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dashboard's widgets; `groups` are (node group, Auto Scaling group name) pairs."""
    health = gpu_metric_namespace(cluster_name)
    intro = (f"# gpucluster {cluster_name}\nStack `{identity}` in {region}. GPU series are the CloudWatch "
             "agent's, per Auto Scaling group (average and busiest GPU); health events are counted by "
             "the nodes' own checks. `gpucluster status` prints the same per group.")
    widgets: list[dict[str, Any]] = [
        {"type": "text", "width": 24, "height": 2, "properties": {"markdown": intro}},
        _metric_widget("GPU utilisation", _per_group(
            health, gpu_metric("utilization_gpu"), groups, ["Average", "Maximum"]),
            region, unit="%", y_max=100),
        _metric_widget("GPU memory used", _per_group(
            health, gpu_metric("memory_used"), groups, ["Average", "Maximum"]),
            region, unit="MiB per GPU"),
        _metric_widget("GPU temperature", _per_group(
            health, gpu_metric("temperature_gpu"), groups, ["Average", "Maximum"]),
            region, unit="°C"),
        _metric_widget("GPU power draw", _per_group(
            health, gpu_metric("power_draw"), groups, ["Average", "Maximum"]),
            region, unit="W per GPU"),
        _metric_widget("Nodes: desired, in service, held by the launch check", [
            [AUTOSCALING_NAMESPACE, metric, GPU_METRIC_DIMENSION, asg,
             {"stat": "Maximum", "label": f"{group} {metric.removeprefix('Group')}"}]
            for group, asg in groups for metric in GROUP_METRICS], region, unit="nodes"),
        _metric_widget("Health: replaced, abandoned at launch, findings", [
            [health, metric, GPU_METRIC_DIMENSION, asg, {"stat": "Sum", "label": f"{group} {metric}"}]
            for group, asg in groups for metric in HEALTH_METRICS], region, unit="events"),
    ]
    if guardrail_stops:
        widgets.append(_metric_widget("Guardrail stops (groups scaled to zero)", [
            [health, GUARDRAIL_STOPS_METRIC, {"stat": "Sum", "label": "groups stopped"}]], region,
            unit="stops"))
    if alarm_arns:
        widgets.append({"type": "alarm", "width": WIDGET_WIDTH, "height": WIDGET_HEIGHT, "properties": {
            "title": "Alarms: idle stop, stuck jobs", "alarms": list(alarm_arns)}})
    if budget is not None:
        # AWS Budgets publishes no CloudWatch metric: the limit is shown, the spend is one command away.
        action = budget.get("action_threshold_percent")
        alerts = ", ".join(f"{t:g} %" for t in budget.get("alert_thresholds_percent", []))
        lines = [f"## Budget: ${budget['monthly_limit_usd']:,.0f} a month", f"Alerts at {alerts}.",
                 f"At {action:g} % every group is scaled to zero." if action else "No automatic stop.",
                 f"Spend so far: `gpucluster spend {identity}`, or the AWS Budgets console."]
        widgets.append({"type": "text", "width": WIDGET_WIDTH, "height": WIDGET_HEIGHT,
                        "properties": {"markdown": "\n\n".join(lines)}})
    # No x/y: CloudWatch lays the widgets out in this order (dashboard body structure reference).
    return {"widgets": widgets}


def stuck_alarm_queries(asg_name: str, namespace: str,
                        mig: bool = False) -> "list[aws.cloudwatch.MetricAlarmMetricQueryArgsDict]":
    """Metric-math queries of a group's stuck-job alarm (CloudWatch user guide, "Metric math": IF, FILL).

    busy_flat: every GPU busy and all within a few points of each other this minute (a
    hung collective pins them all); silent: nodes in service, and not one GPU temperature
    datapoint (the agent is dead: the idle stop cannot see such a node either). Silence is
    read from the temperature, which every GPU reports, MIG mode or not; a GPU in MIG mode
    reports no utilisation (NVML N/A), so a MIG group's alarm is the silent one alone.
    """
    def metric(query_id: str, namespace: str, name: str,
               stat: str) -> "aws.cloudwatch.MetricAlarmMetricQueryArgsDict":
        return {"id": query_id, "return_data": False, "metric": {
            "namespace": namespace, "metric_name": name, "dimensions": {GPU_METRIC_DIMENSION: asg_name},
            "period": GPU_METRIC_PERIOD_SECONDS, "stat": stat}}

    silent: list[aws.cloudwatch.MetricAlarmMetricQueryArgsDict] = [
        metric("samples", namespace, gpu_metric(SILENCE_MEASUREMENT), "SampleCount"),
        metric("inservice", AUTOSCALING_NAMESPACE, "GroupInServiceInstances", "Maximum"),
        {"id": "silent", "return_data": mig, "label": "in service, no GPU metric",
         "expression": "IF(inservice > 0 AND FILL(samples, 0) == 0, 1, 0)"},
    ]
    if mig:
        return silent
    util = gpu_metric("utilization_gpu")
    return [
        metric("low", namespace, util, "Minimum"),
        metric("high", namespace, util, "Maximum"),
        *silent,
        {"id": "busyflat", "return_data": False, "label": "GPUs busy and flat",
         "expression": f"IF(low >= {STUCK_BUSY_PERCENT} AND high - low <= {STUCK_FLAT_POINTS}, 1, 0)"},
        {"id": "stuck", "return_data": True, "label": "stuck", "expression": "MAX([busyflat, silent])"},
    ]


# ---------------------------------------------------------------------------------- component


class DashboardGroup(TypedDict):
    """One node group on the dashboard."""

    name: str
    """Node group name (2-24 characters a-z, 0-9, '-'): labels and alarm names."""
    asg_name: pulumi.Input[str]
    """Its Auto Scaling group (the dimension of every per-group series)."""
    stuck_alarm_minutes: NotRequired[int]
    """Alarm when the group's GPUs stay busy-but-flat, or publish nothing while in service, this long."""
    mig: NotRequired[bool]
    """Its GPUs are in MIG mode and report no utilisation: the stuck alarm watches for silence only."""


class ClusterDashboardArgs(TypedDict):
    """A stack's dashboard, stuck-job alarms and guardrail-stop count."""

    cluster_name: str
    """The cluster's name (dashboard name, metric namespace gpucluster/<name>)."""
    identity: str
    """The gpucluster:stack tag value."""
    region: str
    """AWS region of the groups and metrics, e.g. us-east-1."""
    groups: list[DashboardGroup]
    """The node groups to show (1-20)."""
    notify_topic_arn: NotRequired[pulumi.Input[str]]
    """Where stuck-job alarms notify (required with any stuck_alarm_minutes)."""
    guardrail_log_groups: NotRequired[list[pulumi.Input[str]]]
    """Log groups of the guardrail Lambdas that stop groups: their stops are counted."""
    alarm_arns: NotRequired[list[pulumi.Input[str]]]
    """Alarms to show besides the stuck-job ones (the idle alarms)."""
    budget: NotRequired[BudgetSettings]
    """The stack's budget section, shown as text (AWS Budgets publishes no metric)."""
    tags: NotRequired[dict[str, str]]
    """Tags of the alarms."""


class ClusterDashboard(pulumi.ComponentResource):
    """The stack's CloudWatch dashboard, its stuck-job alarms and the guardrail-stop metric filters."""

    dashboard_name: pulumi.Output[str]
    """The dashboard's name."""
    dashboard_url: pulumi.Output[str]
    """The dashboard in the CloudWatch console."""
    stuck_alarm_names: pulumi.Output[dict[str, str]]
    """Node group name -> its stuck-job alarm (groups with stuck_alarm_minutes)."""

    def __init__(self, name: str, args: ClusterDashboardArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("ClusterDashboard", name, ClusterDashboardModel, args, dashboard_checks)
        # New in 0.2: no older type token to alias.
        super().__init__(type_token("ClusterDashboard"), name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = owned_tags(m.tags, m.identity, m.cluster_name)
        namespace = gpu_metric_namespace(m.cluster_name)
        self.stop_filters = [
            aws.cloudwatch.LogMetricFilter(
                f"{name}-stops-{i}", log_group_name=log_group, pattern=f'"{STOP_LOG_PHRASE}"',
                metric_transformation={"name": GUARDRAIL_STOPS_METRIC, "namespace": namespace,
                                       "value": "1", "unit": "Count"}, opts=child)
            for i, log_group in enumerate(m.guardrail_log_groups)]
        self.stuck_alarms: dict[str, aws.cloudwatch.MetricAlarm] = {}
        for group in m.groups:
            if group.stuck_alarm_minutes is None:
                continue
            minutes, mig = group.stuck_alarm_minutes, group.mig
            busy = "" if mig else f"every GPU busy (>= {STUCK_BUSY_PERCENT} %) and flat, or "
            self.stuck_alarms[group.name] = aws.cloudwatch.MetricAlarm(
                f"{name}-stuck-{group.name}",
                name=pulumi.Output.concat(group.asg_name, "-stuck"),
                alarm_description=(
                    f"gpucluster {m.identity}/{group.name}: for {minutes} min {busy}nodes in service "
                    "publishing no GPU metric. " + ("A dead agent" if mig else "A hung job or a dead agent")
                    + ": look at the nodes. Notifies only."),
                metric_queries=pulumi.Output.from_input(group.asg_name).apply(
                    functools.partial(stuck_alarm_queries, namespace=namespace, mig=mig)),
                comparison_operator="GreaterThanOrEqualToThreshold", threshold=1,
                evaluation_periods=minutes, datapoints_to_alarm=minutes, treat_missing_data="notBreaching",
                alarm_actions=[m.notify_topic_arn], tags=tags, opts=child)
        name_of_dashboard = dashboard_name(m.cluster_name, m.region)
        alarms = [*m.alarm_arns, *(a.arn for a in self.stuck_alarms.values())]
        body = pulumi.Output.all(
            [g.asg_name for g in m.groups], alarms,
        ).apply(lambda v: json.dumps(dashboard_body(
            cluster_name=m.cluster_name, identity=m.identity, region=m.region,
            groups=list(zip([g.name for g in m.groups], v[0], strict=True)),
            guardrail_stops=bool(m.guardrail_log_groups), alarm_arns=v[1],
            budget=m.budget.model_dump() if m.budget else None), sort_keys=True))
        self.dashboard = aws.cloudwatch.Dashboard(
            f"{name}-dashboard", dashboard_name=name_of_dashboard, dashboard_body=body, opts=child)
        self.dashboard_name = self.dashboard.dashboard_name
        self.dashboard_url = pulumi.Output.from_input(dashboard_url(m.region, name_of_dashboard))
        # from_input resolves the Outputs inside the dict; its annotation takes a plain Input[T] only.
        self.stuck_alarm_names = pulumi.Output.from_input(
            {g: a.name for g, a in self.stuck_alarms.items()})  # type: ignore[misc]
        self.register_outputs({"dashboard_name": self.dashboard_name, "dashboard_url": self.dashboard_url,
                               "stuck_alarm_names": self.stuck_alarm_names})
