"""The PromQL of a stack: the labels every node's samples carry, the recording rules (per-GPU busy
percentage, idle node groups, idle GPUs and their cost) and the alert rules for the health findings
the node agent detects. Pure: no Pulumi, no AWS; the same text goes to Amazon Managed Prometheus (a
rule groups namespace), into a team's own Prometheus (`gpucluster dashboards export`), and into the
real Prometheus the tests start.

Metric and label names are NVIDIA dcgm-exporter's: the DCGM field name is the metric name
(`etc/default-counters.csv` of github.com/NVIDIA/dcgm-exporter), each series labelled `gpu` (index),
`UUID`, `device`, `modelName`, `Hostname`, and for a MIG instance `GPU_I_ID` and `GPU_I_PROFILE`
(dcgm-exporter README, "Quickstart" output and "MIG support"). The node collector adds the stack's
identity, node group, instance id and instance type (`TARGET_LABELS`, written by
node/metrics-config.sh).

Idle is the guardrails' definition (gpucluster.aws.guardrails: the idle alarm on the CloudWatch
Maximum of the group's GPU utilisation): a node group is idle when even its busiest GPU stayed below
`autostop.gpu_utilization_threshold_percent` for `autostop.idle_minutes`. A GPU in MIG mode reports no
utilisation (NVML), so its busy percentage here is its busiest MIG instance's graphics-engine
activity (DCGM_FI_PROF_GR_ENGINE_ACTIVE); the CloudWatch idle stop does not see MIG groups at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from gpucluster.spec import StackSpec
from gpucluster.spec.models import APPLICATION_XIDS

# The labels the collector puts on every sample (node/metrics-config.sh writes them per target).
STACK_LABEL = "gpucluster_stack"
GROUP_LABEL = "node_group"
INSTANCE_LABEL = "instance_id"
TYPE_LABEL = "instance_type"
TARGET_LABELS = (STACK_LABEL, GROUP_LABEL, INSTANCE_LABEL, TYPE_LABEL)
# dcgm-exporter's own labels (README, sample output): GPU index, its UUID, and the MIG instance.
GPU_LABEL, UUID_LABEL, MIG_ID_LABEL, MIG_PROFILE_LABEL = "gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE"
DCGM_JOB, NODE_JOB = "dcgm-exporter", "node-exporter"
DEFAULT_EVALUATION_SECONDS = 60

NODE = ", ".join(TARGET_LABELS)
PER_GPU = f"{NODE}, {GPU_LABEL}, {UUID_LABEL}"
PER_MIG = f"{PER_GPU}, {MIG_ID_LABEL}, {MIG_PROFILE_LABEL}"

# Recorded series (rule names follow Prometheus's level:metric:operations convention).
GPU_UTIL = "gpucluster:gpu_util:percent"
TYPE_GPUS = "gpucluster:instance_type:gpus"
TYPE_PRICE = "gpucluster:instance_type:gpu_hour_usd"
GROUP_UTIL_NOW = "gpucluster:node_group:gpu_util_max"
GROUP_UTIL_MAX = "gpucluster:node_group:gpu_util_max_over_idle_window"
# Missing data is never idle (the idle alarm's treat_missing_data "missing", every one of its
# datapoints below the threshold): a group is idle only once this share of the window's evaluations
# recorded it (the rest: evaluations a restart or a slow rule group missed).
IDLE_WINDOW_COVERAGE = 0.9
GROUP_IDLE = "gpucluster:node_group:idle"
GROUP_IDLE_GPUS = "gpucluster:node_group:idle_gpus"
GROUP_IDLE_COST = "gpucluster:node_group:idle_cost_usd_per_hour"


@dataclass(frozen=True)
class GroupMetrics:
    """What the rules need of one node group."""

    name: str
    ignored_xids: tuple[int, ...] = APPLICATION_XIDS
    mig_instances_per_gpu: int = 0
    """0: not a MIG group."""


@dataclass(frozen=True)
class MetricsSettings:
    """A stack's metrics in the terms of its stack file (`from_spec`), or set by hand for a test."""

    identity: str
    groups: tuple[GroupMetrics, ...]
    idle_threshold_percent: float = 5
    idle_minutes: float = 60
    gpus_by_type: Mapping[str, int] = field(default_factory=dict)
    gpu_hour_usd_by_type: Mapping[str, float] = field(default_factory=dict)
    evaluation_seconds: int = DEFAULT_EVALUATION_SECONDS
    exporter_down_minutes: int = 5

    @property
    def stack_selector(self) -> str:
        return f'{STACK_LABEL}="{_escape(self.identity)}"'


def from_spec(spec: StackSpec, evaluation_seconds: int = DEFAULT_EVALUATION_SECONDS) -> MetricsSettings:
    """The rules' settings of a stack: the autostop idle definition, each group's ignored XIDs and MIG
    layout, GPUs per instance type, and the on-demand GPU-hour list price (catalog) where it is known."""
    gpus: dict[str, int] = {}
    prices: dict[str, float] = {}
    for g in spec.node_groups:
        for t in g.types:
            gpus[t.name] = t.gpus
            # A Capacity-Block-only type, or a region without list prices: no cost.
            with suppress(KeyError):
                prices[t.name] = round(t.on_demand_price(spec.region) / t.gpus, 6)
    a = spec.autostop
    return MetricsSettings(
        identity=spec.identity,
        groups=tuple(GroupMetrics(g.name, tuple(g.health_checks.ignored_xids), len(g.mig_layout))
                     for g in spec.node_groups),
        idle_threshold_percent=a.gpu_utilization_threshold_percent, idle_minutes=a.idle_minutes,
        gpus_by_type=gpus, gpu_hour_usd_by_type=prices, evaluation_seconds=evaluation_seconds)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _number(value: float) -> str:
    return f"{value:g}"


def _static(by_type: Mapping[str, float]) -> str:
    """A constant per instance type as a labelled series (`label_replace` of a `vector`)."""
    parts = [f'label_replace(vector({_number(v)}), "{TYPE_LABEL}", "{_escape(k)}", "", "")'
             for k, v in sorted(by_type.items())]
    return " or ".join(parts) if parts else "vector(0) < 0"  # an empty vector: no prices known


def recording_rules(s: MetricsSettings) -> list[dict[str, Any]]:
    sel = s.stack_selector
    seconds = round(s.idle_minutes * 60)
    window = f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"
    needed = max(1, math.ceil(IDLE_WINDOW_COVERAGE * seconds / s.evaluation_seconds))
    return [
        {"record": GPU_UTIL, "expr": (
            f"max by ({PER_GPU}) (DCGM_FI_DEV_GPU_UTIL{{{sel}}})\nor\n"
            f"max by ({PER_GPU}) (100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{sel}, {MIG_ID_LABEL}!=\"\"}})")},
        {"record": TYPE_GPUS, "expr": _static(s.gpus_by_type)},
        {"record": TYPE_PRICE, "expr": _static(s.gpu_hour_usd_by_type)},
        {"record": GROUP_UTIL_NOW, "expr": f"max by ({STACK_LABEL}, {GROUP_LABEL}) ({GPU_UTIL}{{{sel}}})"},
        {"record": GROUP_UTIL_MAX, "expr": f"max_over_time({GROUP_UTIL_NOW}{{{sel}}}[{window}])"},
        {"record": GROUP_IDLE, "expr": (
            f"({GROUP_UTIL_MAX} < bool {_number(s.idle_threshold_percent)})\n"
            f"* (count_over_time({GROUP_UTIL_NOW}{{{sel}}}[{window}]) >= bool {needed})")},
        {"record": GROUP_IDLE_GPUS, "expr": (
            f"count by ({STACK_LABEL}, {GROUP_LABEL}, {TYPE_LABEL}) ({GPU_UTIL}{{{sel}}})\n"
            f"* on ({STACK_LABEL}, {GROUP_LABEL}) group_left {GROUP_IDLE}")},
        {"record": GROUP_IDLE_COST, "expr": f"{GROUP_IDLE_GPUS} * on ({TYPE_LABEL}) group_left {TYPE_PRICE}"},
    ]


@dataclass(frozen=True)
class Alert:
    """An alert rule, the health finding it stands for, and the dcgm-exporter metrics it reads."""

    name: str
    finding: str
    expr: str
    summary: str
    for_minutes: int = 0

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr,
                                "labels": {"severity": "critical", "finding": self.finding},
                                "annotations": {"summary": self.summary}}
        if self.for_minutes:
            rule["for"] = f"{self.for_minutes}m"
        return rule


def alerts(s: MetricsSettings) -> list[Alert]:
    """One alert per finding of node/health-check.sh that DCGM exposes (gpu_count, xid, ecc,
    page_retirement, mig, dcgm); `efa` has no DCGM field and stays with the node agent."""
    sel = s.stack_selector
    found: list[Alert] = []
    by_ignored: dict[tuple[int, ...], list[str]] = {}
    for g in s.groups:
        by_ignored.setdefault(tuple(sorted(g.ignored_xids)), []).append(g.name)
    for ignored, names in sorted(by_ignored.items()):
        # DCGM_FI_DEV_XID_ERRORS is the value of the last XID (a gauge); in MIG mode it repeats per
        # instance, hence the max per GPU. `!= n` filters out the application XIDs the group ignores.
        groups = "|".join(names)
        expr = f'max by ({PER_GPU}) (DCGM_FI_DEV_XID_ERRORS{{{sel}, {GROUP_LABEL}=~"{groups}"}}) > 0'
        for xid in ignored:
            expr = f"({expr}) != {xid}"
        found.append(Alert("GpuXidError", "xid", expr,
                           "GPU {{ $labels.gpu }} of {{ $labels.instance_id }} ({{ $labels.node_group }}) "
                           "reported XID {{ $value }}"))
    found += [
        Alert("GpuUncorrectableEcc", "ecc",
              f"max by ({PER_GPU}) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{sel}}}) > 0",
              "GPU {{ $labels.gpu }} of {{ $labels.instance_id }}: {{ $value }} uncorrectable ECC errors"),
        Alert("GpuMemoryRemapPending", "page_retirement",
              f"max by ({PER_GPU}) (DCGM_FI_DEV_RETIRED_PENDING{{{sel}}}) > 0\nor\n"
              f"max by ({PER_GPU}) (DCGM_FI_DEV_ROW_REMAP_FAILURE{{{sel}}}) > 0",
              "GPU {{ $labels.gpu }} of {{ $labels.instance_id }}: a page retirement is pending or a row "
              "remap failed"),
        Alert("GpuMissing", "gpu_count",
              f"count by ({NODE}) (count by ({NODE}, {GPU_LABEL}) (DCGM_FI_DEV_GPU_TEMP{{{sel}}}))\n"
              f"< on ({TYPE_LABEL}) group_left {TYPE_GPUS}",
              "{{ $labels.instance_id }} ({{ $labels.instance_type }}) shows {{ $value }} GPUs, fewer "
              "than the type has"),
        Alert("DcgmExporterDown", "dcgm", f'up{{{sel}, job="{DCGM_JOB}"}} == 0',
              "dcgm-exporter on {{ $labels.instance_id }} answers no scrape: its GPUs are unmeasured",
              for_minutes=s.exporter_down_minutes),
    ]
    for g in s.groups:
        if g.mig_instances_per_gpu:
            found.append(Alert(
                "MigLayoutWrong", "mig",
                f"count by ({NODE}) (max by ({PER_MIG}) "
                f"(DCGM_FI_DEV_FB_USED{{{sel}, {GROUP_LABEL}=\"{g.name}\", "
                f"{MIG_ID_LABEL}!=\"\"}}))\n!= on ({TYPE_LABEL}) group_left() "
                f"({g.mig_instances_per_gpu} * {TYPE_GPUS})",
                "{{ $labels.instance_id }} shows {{ $value }} MIG instances, not the group's layout"))
    return found


def rules_document(s: MetricsSettings) -> dict[str, Any]:
    """A Prometheus rule file (and an AMP rule groups namespace's data): recording, then alerts."""
    interval = f"{s.evaluation_seconds}s"
    return {"groups": [
        {"name": "gpucluster-recording", "interval": interval, "rules": recording_rules(s)},
        {"name": "gpucluster-health", "interval": interval, "rules": [a.rule() for a in alerts(s)]},
    ]}


def idle_gpu_hours_expr(s: MetricsSettings, range_: str, selector: str = "") -> str:
    """Idle GPU-hours over `range_`: the recorded idle-GPU count summed over its evaluations."""
    per_hour = 3600 / s.evaluation_seconds
    return (f"sum(sum_over_time({GROUP_IDLE_GPUS}{{{s.stack_selector}{selector}}}[{range_}])) "
            f"/ {_number(per_hour)}")


def idle_cost_expr(s: MetricsSettings, range_: str, selector: str = "") -> str:
    per_hour = 3600 / s.evaluation_seconds
    return (f"sum(sum_over_time({GROUP_IDLE_COST}{{{s.stack_selector}{selector}}}[{range_}])) "
            f"/ {_number(per_hour)}")


def group_names(s: MetricsSettings) -> Sequence[str]:
    return [g.name for g in s.groups]
