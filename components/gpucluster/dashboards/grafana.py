"""The Grafana dashboards of a stack, as code: cluster overview, node group, node, and MIG instances.

Each panel is a `Panel` (title, unit, its PromQL targets and the labels every series it returns must
carry) rendered to Grafana dashboard JSON (schema of Grafana 10, which Amazon Managed Grafana runs);
the tests evaluate every target against a real Prometheus and hold each panel to its `per` labels.
Layout follows Grafana dashboard 12239 (NVIDIA DCGM Exporter): one time series per GPU, legend
`<instance> GPU <index>`. Pure: no Pulumi, no AWS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucluster.dashboards.promql import (
    GPU_LABEL,
    GPU_UTIL,
    GROUP_IDLE,
    GROUP_IDLE_GPUS,
    GROUP_LABEL,
    INSTANCE_LABEL,
    MIG_ID_LABEL,
    MIG_PROFILE_LABEL,
    NODE,
    PER_GPU,
    PER_MIG,
    STACK_LABEL,
    MetricsSettings,
    idle_cost_expr,
    idle_gpu_hours_expr,
)

SCHEMA_VERSION = 39
# The Amazon Managed Grafana version these dashboards are written for, pinned on the stack's workspace
# (aws/prometheus.py) so it never takes whatever AWS defaults to: Grafana 10 (the module's schema), of which
# AMG offers 10.4 (pulumi-aws `grafana.Workspace.grafana_version`: 9.4, 10.4, 12.4, 13.2). That schema 39 is
# what Grafana 10.4 writes is unverified (ledger: grafana-dashboard-schema). AMG updates a workspace's version
# upward only: a workspace already made on a newer default cannot be pinned back (a new workspace can).
GRAFANA_VERSION = "10.4"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RANGE, RATE = "$__range", "$__rate_interval"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """One panel: what it shows and what every series it returns must be labelled with."""

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"
    per: tuple[str, ...] = ()
    """Labels each returned series carries: () a single number, (gpu, ...) one series per GPU."""
    mig: bool = False
    """Returns series of MIG instances only (empty on a stack without a MIG group)."""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[str, ...]
    panels: tuple[Panel, ...]


GPU_LEGEND = "{{instance_id}} GPU {{gpu}}"
MIG_LEGEND = "{{instance_id}} GPU {{gpu}} MIG {{GPU_I_ID}} ({{GPU_I_PROFILE}})"
GPU_KEYS = (INSTANCE_LABEL, GPU_LABEL)
MIG_KEYS = (INSTANCE_LABEL, GPU_LABEL, MIG_ID_LABEL, MIG_PROFILE_LABEL)


def _per_gpu(s: MetricsSettings, filt: str, aggregate: str, metric: str, scale: str = "") -> str:
    """`metric` per GPU: device-level fields repeat per MIG instance (max dedups them); per-instance
    fields (framebuffer, activity) add up (sum) or average (avg) to the GPU."""
    return f"{aggregate} by ({PER_GPU}) ({scale}{metric}{{{s.stack_selector}{filt}}})"


def gpu_panels(s: MetricsSettings, filt: str) -> tuple[Panel, ...]:
    """The per-GPU panels of the node-group and node dashboards, `filt` selecting the GPUs."""
    def gpu(expr: str) -> tuple[Target, ...]:
        return (Target(expr, GPU_LEGEND),)

    return (
        Panel("GPU utilisation", "Percent of time a kernel ran (DCGM_FI_DEV_GPU_UTIL); a MIG GPU: its "
              "busiest instance's graphics-engine activity. The idle stop reads the same figure.",
              gpu(f"{GPU_UTIL}{{{s.stack_selector}{filt}}}"), unit="percent", per=GPU_KEYS),
        Panel("SM activity", "Share of time at least one warp was resident on an SM, averaged over SMs "
              "(DCGM_FI_PROF_SM_ACTIVE). Low with high utilisation: too few blocks to fill the GPU.",
              gpu(_per_gpu(s, filt, "avg", "DCGM_FI_PROF_SM_ACTIVE", "100 * ")), unit="percent",
              per=GPU_KEYS),
        Panel("Tensor core activity", "Share of cycles the tensor (HMMA) pipe was busy "
              "(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE): near zero in training means no mixed precision.",
              gpu(_per_gpu(s, filt, "avg", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "100 * ")), unit="percent",
              per=GPU_KEYS),
        Panel("Framebuffer memory used", "GPU memory in use (DCGM_FI_DEV_FB_USED, MiB; a MIG GPU: the sum "
              "of its instances).", gpu(_per_gpu(s, filt, "sum", "DCGM_FI_DEV_FB_USED")), unit="decmbytes",
              per=GPU_KEYS),
        Panel("Temperature", "GPU die temperature (DCGM_FI_DEV_GPU_TEMP).",
              gpu(_per_gpu(s, filt, "max", "DCGM_FI_DEV_GPU_TEMP")), unit="celsius", per=GPU_KEYS),
        Panel("Power draw", "Board power (DCGM_FI_DEV_POWER_USAGE, W).",
              gpu(_per_gpu(s, filt, "max", "DCGM_FI_DEV_POWER_USAGE")), unit="watt", per=GPU_KEYS),
        Panel("XID errors", "The last XID a GPU raised (DCGM_FI_DEV_XID_ERRORS; 0: none). XIDs 13, 31, "
              "43, 45, 68, 109 are an application's fault; others mean a GPU to replace.",
              gpu(_per_gpu(s, filt, "max", "DCGM_FI_DEV_XID_ERRORS")), per=GPU_KEYS),
        Panel("ECC errors (since driver load)", "Single-bit (corrected) and double-bit (uncorrectable) "
              "ECC errors (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL).",
              (Target(_per_gpu(s, filt, "max", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), f"{GPU_LEGEND} corrected"),
               Target(_per_gpu(s, filt, "max", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                      f"{GPU_LEGEND} uncorrectable")), per=GPU_KEYS),
        Panel("NVLink bandwidth", "NVLink traffic of all lanes (rate of DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL).",
              gpu(f"max by ({PER_GPU}) (rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{s.stack_selector}{filt}}}"
                  f"[{RATE}]))"), unit="Bps", per=GPU_KEYS),
        Panel("NVLink errors", "CRC flit errors on NVLink (DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL): "
              "rising means a bad link.",
              gpu(_per_gpu(s, filt, "max", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")), per=GPU_KEYS),
        Panel("PCIe throughput", "Bytes over PCIe (rates of DCGM_FI_PROF_PCIE_TX_BYTES / RX_BYTES).",
              (Target(f"max by ({PER_GPU}) (rate(DCGM_FI_PROF_PCIE_TX_BYTES{{{s.stack_selector}{filt}}}"
                      f"[{RATE}]))", f"{GPU_LEGEND} tx"),
               Target(f"max by ({PER_GPU}) (rate(DCGM_FI_PROF_PCIE_RX_BYTES{{{s.stack_selector}{filt}}}"
                      f"[{RATE}]))", f"{GPU_LEGEND} rx")), unit="Bps", per=GPU_KEYS),
        Panel("PCIe replays", "PCIe retries (DCGM_FI_DEV_PCIE_REPLAY_COUNTER): rising means a bad link.",
              gpu(_per_gpu(s, filt, "max", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")), per=GPU_KEYS),
    )


def mig_panels(s: MetricsSettings, filt: str) -> tuple[Panel, ...]:
    sel = f'{s.stack_selector}{filt}, {MIG_ID_LABEL}!=""'

    def mig(expr: str) -> tuple[Target, ...]:
        return (Target(expr, MIG_LEGEND),)

    return (
        Panel("MIG instance graphics activity", "Share of time the instance's graphics engine was busy "
              "(DCGM_FI_PROF_GR_ENGINE_ACTIVE): a MIG instance's utilisation.",
              mig(f"max by ({PER_MIG}) (100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{sel}}})"), unit="percent",
              per=MIG_KEYS, mig=True),
        Panel("MIG instance SM activity", "DCGM_FI_PROF_SM_ACTIVE of each instance.",
              mig(f"max by ({PER_MIG}) (100 * DCGM_FI_PROF_SM_ACTIVE{{{sel}}})"), unit="percent",
              per=MIG_KEYS, mig=True),
        Panel("MIG instance tensor activity", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE of each instance.",
              mig(f"max by ({PER_MIG}) (100 * DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{sel}}})"), unit="percent",
              per=MIG_KEYS, mig=True),
        Panel("MIG instance memory used", "DCGM_FI_DEV_FB_USED of each instance (MiB).",
              mig(f"max by ({PER_MIG}) (DCGM_FI_DEV_FB_USED{{{sel}}})"), unit="decmbytes",
              per=MIG_KEYS, mig=True),
    )


def overview_panels(s: MetricsSettings) -> tuple[Panel, ...]:
    sel = s.stack_selector
    threshold = f"{s.idle_threshold_percent:g}"
    node_util = f"max by ({NODE}) ({GPU_UTIL}{{{sel}}})"
    return (
        Panel("GPUs busy", f"GPUs at or above the idle threshold ({threshold} %) now.",
              (Target(f"count({GPU_UTIL}{{{sel}}} >= {threshold}) or vector(0)"),), kind="stat"),
        Panel("GPUs", "GPUs reporting metrics.", (Target(f"count({GPU_UTIL}{{{sel}}}) or vector(0)"),),
              kind="stat"),
        Panel("Idle GPU-hours", f"GPU-hours of node groups whose busiest GPU stayed below {threshold} % for "
              f"{s.idle_minutes:g} min (the idle stop's definition), over the dashboard's time range.",
              (Target(idle_gpu_hours_expr(s, RANGE)),), kind="stat"),
        Panel("Idle GPU cost", "Those GPU-hours at the on-demand list price per GPU-hour (catalog).",
              (Target(idle_cost_expr(s, RANGE)),), unit="currencyUSD", kind="stat"),
        Panel("Nodes by state", "Nodes with a GPU at or above the threshold (busy), all below it (idle), "
              "and whose dcgm-exporter answers no scrape (no GPU metrics).",
              (Target(f"count({node_util} >= {threshold}) or vector(0)", "busy"),
               Target(f"count({node_util} < {threshold}) or vector(0)", "idle"),
               Target(f'count(up{{{sel}, job="dcgm-exporter"}} == 0) or vector(0)', "no GPU metrics")),
              kind="bargauge"),
        Panel("GPU utilisation by node group", "Average and busiest GPU of each node group.",
              (Target(f"avg by ({STACK_LABEL}, {GROUP_LABEL}) ({GPU_UTIL}{{{sel}}})", "{{node_group}} avg"),
               Target(f"max by ({STACK_LABEL}, {GROUP_LABEL}) ({GPU_UTIL}{{{sel}}})", "{{node_group}} max")),
              unit="percent", per=(GROUP_LABEL,)),
        Panel("Idle node groups", "1 while a node group counts as idle (the recording rule "
              f"{GROUP_IDLE}).", (Target(f"{GROUP_IDLE}{{{sel}}}", "{{node_group}}"),), per=(GROUP_LABEL,)),
        Panel("Idle GPUs by node group", "GPUs of idle node groups, by instance type.",
              (Target(f"{GROUP_IDLE_GPUS}{{{sel}}}", "{{node_group}} {{instance_type}}"),),
              per=(GROUP_LABEL, "instance_type")),
    )


def dashboards(s: MetricsSettings) -> tuple[Dashboard, ...]:
    group = f', {GROUP_LABEL}=~"$node_group"'
    node = f', {INSTANCE_LABEL}=~"$instance_id"'
    return (
        Dashboard("gpucluster-overview", "GPU cluster overview", "GPUs busy, idle GPU-hours and their cost, "
                  "nodes by state.", ("datasource",), overview_panels(s)),
        Dashboard("gpucluster-node-group", "GPU node group", "Every GPU of the chosen node groups.",
                  ("datasource", "node_group"), gpu_panels(s, group)),
        Dashboard("gpucluster-node", "GPU node", "Every GPU of the chosen nodes.",
                  ("datasource", "node_group", "instance_id"), gpu_panels(s, group + node)),
        Dashboard("gpucluster-mig", "MIG instances", "Each MIG instance of the chosen node groups.",
                  ("datasource", "node_group"), mig_panels(s, group)),
    )


def _variable(name: str, s: MetricsSettings) -> dict[str, Any]:
    if name == "datasource":
        return {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
    query = {"node_group": f"label_values(DCGM_FI_DEV_GPU_TEMP{{{s.stack_selector}}}, {GROUP_LABEL})",
             "instance_id": f"label_values(DCGM_FI_DEV_GPU_TEMP{{{s.stack_selector}, "
                            f'{GROUP_LABEL}=~"$node_group"}}, {INSTANCE_LABEL})'}[name]
    return {"name": name, "label": name.replace("_", " "), "type": "query", "datasource": DATASOURCE,
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "multi": True,
            "includeAll": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"}}


def render(d: Dashboard, s: MetricsSettings) -> dict[str, Any]:
    """A dashboard as Grafana JSON (what the HTTP API's /api/dashboards/db and the import take)."""
    panels: list[dict[str, Any]] = []
    x = y = 0
    for i, p in enumerate(d.panels):
        width, height = (6, 4) if p.kind == "stat" else (12, 8)
        if x + width > 24:
            x, y = 0, y + height
        panels.append({
            "id": i + 1, "type": p.kind, "title": p.title, "description": p.description,
            "datasource": DATASOURCE, "gridPos": {"x": x, "y": y, "w": width, "h": height},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + j), "datasource": DATASOURCE, "expr": t.expr,
                         "legendFormat": t.legend} for j, t in enumerate(p.targets)]})
        x += width
    return {"uid": d.uid, "title": d.title, "description": d.description, "tags": ["gpucluster"],
            "schemaVersion": SCHEMA_VERSION, "editable": True, "time": {"from": "now-6h", "to": "now"},
            "refresh": "1m", "templating": {"list": [_variable(v, s) for v in d.variables]},
            "panels": panels}


def rendered(s: MetricsSettings) -> dict[str, dict[str, Any]]:
    """uid -> dashboard JSON, every dashboard of the stack (a stack without MIG still gets the MIG one
    empty: no group, no series)."""
    return {d.uid: render(d, s) for d in dashboards(s)}


__all__ = ["PER_MIG", "Dashboard", "Panel", "Target", "dashboards", "render", "rendered"]
