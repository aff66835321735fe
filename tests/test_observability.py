"""The stack's dashboard and alarms under the mock engine: what they show, and that every metric
they read is one some part of the stack publishes, with the same dimensions."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import logging
from typing import Any

import pytest

from base_config import BASE_CONFIG, plan_config
from gpucluster.aws.args import ArgsError
from gpucluster.aws.observability import GUARDRAIL_STOPS_METRIC, STOP_LOG_PHRASE, ClusterDashboard
from gpucluster.fleet import asg, nodegroups
from gpucluster.names import dashboard_url, physical_name
from gpucluster.node.userdata import HEALTH_METRICS, cloudwatch_agent_config
from gpucluster.noderole import gpu_metric_namespace
from gpucluster.plan import Plan, PlannedResource, record_resources
from shipped import planned_config, shipped_plan

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
COMPOSITE = "aws:cloudwatch/compositeAlarm:CompositeAlarm"
ASG = "aws:autoscaling/group:Group"
DASHBOARD = "aws:cloudwatch/dashboard:Dashboard"
FILTER = "aws:cloudwatch/logMetricFilter:LogMetricFilter"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
AGENT_CONFIG = "/opt/aws/amazon-cloudwatch-agent/etc/gpucluster.json"


def stuck_config(minutes: int = 30) -> dict[str, Any]:
    config = copy.deepcopy(BASE_CONFIG)
    config["gpucluster:node_groups"][0]["health_checks"] = {"stuck_alarm_minutes": minutes}
    config["gpucluster:budget"] = {"monthly_limit_usd": 2500, "action_threshold_percent": 100}
    config["gpucluster:autostop"] = {"idle_minutes": 30}
    return config


@pytest.fixture(scope="module")
def prod() -> Plan:
    return shipped_plan("prod")


@pytest.fixture(scope="module")
def stuck() -> Plan:
    return plan_config(stuck_config())


def body(plan: Plan) -> dict[str, Any]:
    [dashboard] = plan.of_type(DASHBOARD)
    return json.loads(dashboard.inputs["dashboardBody"])


def widget(plan: Plan, title: str) -> dict[str, Any]:
    [found] = [w for w in body(plan)["widgets"] if w["properties"].get("title", "").startswith(title)]
    return found


def asg_name(plan: Plan, group: str) -> str:
    """The physical name of a node group's Auto Scaling group, as the plan gives it."""
    [asg] = [a for a in plan.of_type(ASG) if a.name == f"{plan.spec.cluster.name}-{group}-asg"]
    return physical(asg)


def physical(r: PlannedResource) -> str:
    found = physical_name(r.type, r.name, r.inputs)
    assert found is not None
    return found.name


def series(plan: Plan, title: str) -> list[tuple[str, str, dict[str, str], str]]:
    """(namespace, metric, dimensions, stat) of each line of a metric widget."""
    lines = []
    for m in widget(plan, title)["properties"]["metrics"]:
        options = m[-1] if isinstance(m[-1], dict) else {}
        names = [x for x in m if not isinstance(x, dict)]
        lines.append((names[0], names[1], dict(zip(names[2::2], names[3::2], strict=True)),
                      options.get("stat", "")))
    return lines


# ------------------------------------------------------------------------------ the dashboard


def test_one_dashboard_per_stack_with_its_url_exported(prod: Plan) -> None:
    [dashboard] = prod.of_type(DASHBOARD)
    assert dashboard.inputs["dashboardName"] == "gpu-prod-us-east-1"
    assert prod.outputs["dashboard_name"] == "gpu-prod-us-east-1"
    assert prod.outputs["dashboard_url"] == (
        "https://us-east-1.console.aws.amazon.com/cloudwatch/home?region=us-east-1"
        "#dashboards/dashboard/gpu-prod-us-east-1")


def test_gpu_widgets_show_every_group_average_and_busiest(prod: Plan) -> None:
    assert [g.name for g in prod.spec.node_groups] == ["h100-train", "eval"]
    asgs = [asg_name(prod, "h100-train"), asg_name(prod, "eval")]
    assert all(a.startswith("gpu-prod-") for a in asgs)  # physical names: Pulumi's suffix included
    for title, metric in [("GPU utilisation", "nvidia_smi_utilization_gpu"),
                          ("GPU memory used", "nvidia_smi_memory_used"),
                          ("GPU temperature", "nvidia_smi_temperature_gpu"),
                          ("GPU power", "nvidia_smi_power_draw")]:
        # The cluster's own namespace, where its agents publish (not CWAgent).
        assert series(prod, title) == [("gpucluster/gpu-prod", metric, {"AutoScalingGroupName": asg}, stat)
                                       for asg in asgs for stat in ("Average", "Maximum")]
    axis = widget(prod, "GPU utilisation")["properties"]["yAxis"]["left"]
    assert axis == {"min": 0, "max": 100, "label": "%"}


def test_nodes_health_and_stops_widgets(prod: Plan) -> None:
    asgs = [asg_name(prod, g.name) for g in prod.spec.node_groups]
    assert len(asgs) == 2
    assert {(ns, m, d["AutoScalingGroupName"]) for ns, m, d, _ in series(prod, "Nodes")} == {
        ("AWS/AutoScaling", m, asg) for asg in asgs for m in
        ("GroupDesiredCapacity", "GroupInServiceInstances", "GroupPendingInstances")}
    assert series(prod, "Health") == [("gpucluster/gpu-prod", m, {"AutoScalingGroupName": asg}, "Sum")
                                      for asg in asgs for m in HEALTH_METRICS]
    assert series(prod, "Guardrail stops") == [("gpucluster/gpu-prod", GUARDRAIL_STOPS_METRIC, {}, "Sum")]


def test_budget_and_alarms_are_on_the_dashboard(prod: Plan) -> None:
    texts = [w["properties"]["markdown"] for w in body(prod)["widgets"] if w["type"] == "text"]
    budget = next(t for t in texts if t.startswith("## Budget"))
    assert prod.spec.budget is not None and prod.spec.budget.monthly_limit_usd == 650_000
    assert "$650,000 a month" in budget and "Alerts at 50 %, 75 %, 90 %, 100 %." in budget
    assert "At 110 % every group is scaled to zero." in budget
    idle = [a for g in ("h100-train", "eval") for a in prod.of_type(COMPOSITE)
            if a.name.endswith(f"-idle-composite-{g}")]
    assert len(idle) == 2  # one idle alarm per group, each on the dashboard
    alarms = next(w for w in body(prod)["widgets"] if w["type"] == "alarm")["properties"]["alarms"]
    assert alarms == [f"arn:aws:cloudwatch:us-east-1:123456789012:{a.name}" for a in idle]


def test_a_stack_without_guardrails_still_gets_its_dashboard() -> None:
    config = copy.deepcopy(BASE_CONFIG)
    config["gpucluster:node_groups"][0]["capacity"] = {"spot_percent": 0}
    plan = planned_config(config)
    titles = [w["properties"].get("title") for w in body(plan)["widgets"]]
    assert "GPU utilisation" in titles and not any(t and t.startswith("Guardrail") for t in titles)
    assert plan.of_type(FILTER) == [] and not any(w["type"] == "alarm" for w in body(plan)["widgets"])


# ------------------------------------------------------ every metric read is a metric published


def rendered_agent_config(plan: Plan, group: str) -> dict[str, Any]:
    """The CloudWatch agent config a group's nodes get: the file its launch template's user data writes."""
    [lt] = [t for t in plan.of_type(LT) if t.name == f"{plan.spec.cluster.name}-{group}-lt"]
    script = gzip.decompress(base64.b64decode(lt.inputs["userData"])).decode()
    text = script.split(f"cat > {AGENT_CONFIG} <<'GPUCLUSTER_FILE_EOF'\n", 1)[1]
    return json.loads(text.split("\nGPUCLUSTER_FILE_EOF\n", 1)[0])


def rendered_node_env(plan: Plan, group: str) -> dict[str, str]:
    """/etc/gpucluster/node.env as a group's user data writes it (shell assignments, quoted)."""
    import shlex

    [lt] = [t for t in plan.of_type(LT) if t.name == f"{plan.spec.cluster.name}-{group}-lt"]
    script = gzip.decompress(base64.b64decode(lt.inputs["userData"])).decode()
    text = script.split("cat > /etc/gpucluster/node.env <<'GPUCLUSTER_FILE_EOF'\n", 1)[1]
    lines = text.split("\nGPUCLUSTER_FILE_EOF\n", 1)[0].splitlines()
    pairs = (line.partition("=") for line in lines if "=" in line)
    return {k: shlex.split(v)[0] if v else "" for k, _, v in pairs}


def published(plan: Plan) -> set[tuple[str, str, frozenset[tuple[str, str]]]]:
    """(namespace, metric, dimensions) of every series some part of the stack publishes."""
    namespace = gpu_metric_namespace(plan.spec.cluster.name)
    out: set[tuple[str, str, frozenset[tuple[str, str]]]] = set()
    for group in plan.spec.node_groups:
        agent = rendered_agent_config(plan, group.name)["metrics"]
        measurements = agent["metrics_collected"]["nvidia_gpu"]["measurement"]
        # The agent's AutoScalingGroupName is the group's real (physical) name: its
        # aws:autoscaling:groupName tag (append_dimensions "${aws:AutoScalingGroupName}").
        assert agent["append_dimensions"]["AutoScalingGroupName"] == "${aws:AutoScalingGroupName}"
        [asg] = [a for a in plan.of_type(ASG) if a.name == f"{plan.spec.cluster.name}-{group.name}-asg"]
        name = physical(asg)
        for keys in agent["aggregation_dimensions"]:  # the per-group series the agent aggregates
            assert keys == ["AutoScalingGroupName"]
            out |= {(agent["namespace"], f"nvidia_smi_{m}", frozenset({("AutoScalingGroupName", name)}))
                    for m in measurements}
        out |= {("AWS/AutoScaling", m, frozenset({("AutoScalingGroupName", name)}))
                for m in asg.inputs.get("enabledMetrics", [])}
        # health-check.sh: `put-metric-data --namespace gpucluster/<cluster> --dimensions
        # AutoScalingGroupName=<its group>` (asserted call by call in test_node_health.py).
        out |= {(namespace, m, frozenset({("AutoScalingGroupName", name)})) for m in HEALTH_METRICS}
        # report.sh activity: `put-metric-data --metric-name NodeActive --dimensions
        # Stack=$GPUCLUSTER_STACK,NodeGroup=$GPUCLUSTER_NODE_GROUP` (run under bash in test_node_activity.py),
        # with the values the group's rendered node.env gives them.
        env = rendered_node_env(plan, group.name)
        out.add((env["GPUCLUSTER_METRIC_NAMESPACE"], "NodeActive", frozenset(
            {("Stack", env["GPUCLUSTER_STACK"]), ("NodeGroup", env["GPUCLUSTER_NODE_GROUP"])})))
    for f in plan.of_type(FILTER):
        t = f.inputs["metricTransformation"]
        out.add((t["namespace"], t["name"], frozenset((t.get("dimensions") or {}).items())))
    # Lambda publishes each function's invocation metrics itself (Lambda developer guide, "Types of
    # metrics for Lambda functions"): what the guardrail functions' own alarms read.
    for fn in plan.of_type("aws:lambda/function:Function"):
        out |= {("AWS/Lambda", m, frozenset({("FunctionName", fn.inputs["name"])}))
                for m in ("Errors", "Throttles", "DestinationDeliveryFailures")}
    return out


def read(plan: Plan) -> list[tuple[str, str, frozenset[tuple[str, str]]]]:
    """(namespace, metric, dimensions) of every series the dashboard and the alarms read."""
    found = []
    for w in body(plan)["widgets"]:
        for m in w["properties"].get("metrics", []):
            names = [x for x in m if not isinstance(x, dict)]
            found.append((names[0], names[1], frozenset(zip(names[2::2], names[3::2], strict=True))))
    for alarm in plan.of_type(ALARM):
        a = alarm.inputs
        if "metricName" in a:
            found.append((a["namespace"], a["metricName"], frozenset(a.get("dimensions", {}).items())))
        for q in a.get("metricQueries", []):
            if "metric" in q:
                m = q["metric"]
                found.append((m["namespace"], m["metricName"], frozenset(m.get("dimensions", {}).items())))
    return found


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "stuck"])
def test_every_metric_the_dashboard_or_an_alarm_reads_is_published(stack: str, stuck: Plan) -> None:
    plan = stuck if stack == "stuck" else shipped_plan(stack)
    reads = read(plan)
    assert len(reads) >= 13  # GPU, nodes and health widgets at least, and the idle alarm where there is one
    missing = [r for r in reads if r not in published(plan)]
    assert missing == []


def test_the_agent_publishes_what_the_dashboard_needs() -> None:
    metrics = cloudwatch_agent_config("c")["metrics"]
    assert metrics["namespace"] == "gpucluster/c"  # the cluster's own: the only one its nodes may use
    measurements = metrics["metrics_collected"]["nvidia_gpu"]["measurement"]
    assert {"utilization_gpu", "memory_used", "temperature_gpu", "power_draw"} <= set(measurements)


def test_guardrail_stops_are_counted_from_what_the_lambdas_log(stuck: Plan, caplog: Any) -> None:
    filters = stuck.of_type(FILTER)
    groups = {f.inputs["logGroupName"] for f in filters}
    assert groups == {"/aws/lambda/test-autostop", "/aws/lambda/test-budget-action",
                      "/aws/lambda/test-spend-guard"}
    for f in filters:
        assert f.inputs["pattern"] == f'"{STOP_LOG_PHRASE}"'
        assert f.inputs["metricTransformation"] == {
            "name": GUARDRAIL_STOPS_METRIC, "namespace": "gpucluster/test", "value": "1", "unit": "Count"}
        [log_group] = [g for g in stuck.of_type(LOG_GROUP) if g.inputs["name"] == f.inputs["logGroupName"]]
        assert stuck.depends_on(f, log_group)

    class Autoscaling:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def create_or_update_tags(self, **_: Any) -> None:
            self.calls.append("tags")

        def update_auto_scaling_group(self, **_: Any) -> None:
            self.calls.append("update")

    group = {"AutoScalingGroupName": "g", "DesiredCapacity": 2, "MinSize": 1, "MaxSize": 2, "Tags": []}
    with caplog.at_level(logging.INFO, logger="gpucluster.guardrails"):
        assert asg.scale_to_zero(Autoscaling(), group, "idle") == nodegroups.STOPPED
        asg.scale_to_zero(Autoscaling(), {**group, "DesiredCapacity": 0}, "idle")  # no stop: no count
    matches = [r.getMessage() for r in caplog.records if STOP_LOG_PHRASE in r.getMessage()]
    assert len(matches) == 1 and json.loads(matches[0])["group"] == "g"


# --------------------------------------------------------------------------- stuck-job alarm


def test_stuck_job_alarm_notifies_after_n_minutes_of_busy_flat_or_silent_gpus(stuck: Plan) -> None:
    [alarm] = [a for a in stuck.of_type(ALARM) if a.name.endswith("-stuck-gpu")]
    a = alarm.inputs
    [topic] = [t for t in stuck.of_type("aws:sns/topic:Topic") if t.name.endswith("-notify-topic")]
    assert a["alarmActions"] == [f"arn:aws:sns:us-east-1:123456789012:{topic.name}"]
    assert "okActions" not in a and a["treatMissingData"] == "notBreaching"
    assert (a["evaluationPeriods"], a["datapointsToAlarm"], a["threshold"]) == (30, 30, 1)
    assert a["comparisonOperator"] == "GreaterThanOrEqualToThreshold"
    queries = {q["id"]: q for q in a["metricQueries"]}
    assert [q["id"] for q in a["metricQueries"] if q.get("returnData")] == ["stuck"]
    assert queries["stuck"]["expression"] == "MAX([busyflat, silent])"
    assert queries["busyflat"]["expression"] == "IF(low >= 95 AND high - low <= 2, 1, 0)"
    assert queries["silent"]["expression"] == "IF(inservice > 0 AND FILL(samples, 0) == 0, 1, 0)"
    assert {k: (q["metric"]["metricName"], q["metric"]["stat"], q["metric"]["period"])
            for k, q in queries.items() if "metric" in q} == {
        "low": ("nvidia_smi_utilization_gpu", "Minimum", 60),
        "high": ("nvidia_smi_utilization_gpu", "Maximum", 60),
        "samples": ("nvidia_smi_temperature_gpu", "SampleCount", 60),  # reported in MIG mode too
        "inservice": ("GroupInServiceInstances", "Maximum", 60)}
    # Named after the group's physical ASG name, as the idle alarm is.
    assert stuck.outputs["stuck_alarm_names"] == {"gpu": f"{asg_name(stuck, 'gpu')}-stuck"}
    assert {q["metric"]["dimensions"]["AutoScalingGroupName"] for q in queries.values() if "metric" in q} == {
        asg_name(stuck, "gpu")}
    assert {q["metric"]["namespace"] for k, q in queries.items() if "metric" in q and k != "inservice"} == {
        "gpucluster/test"}
    alarms = next(w for w in body(stuck)["widgets"] if w["type"] == "alarm")["properties"]["alarms"]
    assert f"arn:aws:cloudwatch:us-east-1:123456789012:{alarm.name}" in alarms


def test_no_stuck_alarm_unless_asked(prod: Plan) -> None:
    assert not any(a.name.endswith("-stuck-h100-train") for a in prod.of_type(ALARM))
    assert prod.outputs["stuck_alarm_names"] == {}


def test_the_component_alone_refuses_a_stuck_alarm_without_a_topic() -> None:
    args: Any = {"cluster_name": "team", "identity": "s", "region": "us-east-1",
                 "groups": [{"name": "train", "asg_name": "train-asg", "stuck_alarm_minutes": 15}]}
    with pytest.raises(ArgsError) as info:
        record_resources(lambda: ClusterDashboard("team", args))
    assert str(info.value) == ("ClusterDashboard team: groups[0].stuck_alarm_minutes: "
                               "needs notify_topic_arn: the alarm only notifies")


@pytest.mark.parametrize(("region", "domain"), [("us-east-1", "console.aws.amazon.com"),
                                                ("cn-north-1", "console.amazonaws.cn"),
                                                ("us-gov-west-1", "console.amazonaws-us-gov.com")])
def test_dashboard_url_per_partition(region: str, domain: str) -> None:
    assert dashboard_url(region, "d") == f"https://{region}.{domain}/cloudwatch/home?region={region}" \
        "#dashboards/dashboard/d"


