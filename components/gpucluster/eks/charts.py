"""The Helm charts an EKS stack installs, each with its repository, a pinned version and its values
from the spec, as plain data (`aws/eks_software.py` registers each as a `helm.v3.Release`).

Every pin and every values key below was written without the chart's own values.yaml at hand: each
chart names its ledger entry (`ledger`), which says so and how `verify` or a person checks it.

- GPUs: NVIDIA's k8s-device-plugin, or, when a group has MIG, the NVIDIA GPU Operator with driver and
  container toolkit off (the EKS-optimised AL2023 NVIDIA AMI carries both) and mig-manager applying our
  MIG layouts: a node takes the layout its `nvidia.com/mig.config` label names (`mig_node_labels`).
- EFA: the aws-efa-k8s-device-plugin on the EFA groups' nodes, tolerating the GPU taint.
- Scaling: the cluster-autoscaler, discovering the cluster's Auto Scaling groups by the cluster tag,
  the priority expander trying reserved and Capacity Block groups, then on-demand, then spot.
- Draining: the AWS Node Termination Handler in queue mode (its SQS queue fed by EventBridge).
- Queueing: Kueue (its Configuration from `queues.kueue_configuration`) and JobSet.
- Metrics (observability on): dcgm-exporter with pod labels, and a Prometheus in agent mode that
  scrapes it and remote-writes to the stack's AMP workspace with SigV4, as the launcher nodes' own
  Prometheus does (node/metrics.sh).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpucluster.eks import queues
from gpucluster.eks.labels import GROUP_LABEL, gpu_toleration, on_groups
from gpucluster.node.metrics import DCGM_FIELDS
from gpucluster.spec import NodeGroupConfig, StackSpec, can_run_spot

SYSTEM = "kube-system"
MONITORING = "gpucluster-monitoring"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_MAP = "gpucluster-mig-parted-config"
MIG_DISABLED = "all-disabled"
AUTOSCALER_SA = (SYSTEM, "cluster-autoscaler")
TERMINATION_HANDLER_SA = (SYSTEM, "aws-node-termination-handler")
METRICS_AGENT_SA = (MONITORING, "gpucluster-prometheus-agent")
"""(namespace, service account) of the pods that call AWS: each gets its role by EKS Pod Identity."""
PRIORITY = {"reserved": 30, "on-demand": 20, "spot": 10}
"""The priority expander's tiers: capacity already paid for first, spot last."""
SCALE_DOWN_UNNEEDED_MINUTES = 10


@dataclass(frozen=True)
class Context:
    """What the charts' values take from other resources, resolved (plain strings)."""

    cluster_name: str
    kubernetes_version: str
    termination_queue_url: str
    asg_names: Mapping[str, str]
    """Node group name -> its Auto Scaling group's name (the priority expander matches ASG names)."""
    remote_write_url: str | None = None

    @classmethod
    def placeholder(cls, spec: StackSpec, kubernetes_version: str, metrics: bool) -> Context:
        """Stand-ins of the right shape: the chart list and static fields are known before deploying
        (`metrics`: a remote-write URL will be given)."""
        return cls("cluster", kubernetes_version, "https://sqs.invalid/queue",
                   {g.name: g.name for g in spec.node_groups},
                   "https://aps.invalid/remote_write" if metrics else None)


@dataclass(frozen=True)
class Chart:
    """One Helm release: where its chart comes from, the pinned version, and its values."""

    release: str
    namespace: str
    repo: str
    """An https chart repository, or `oci://registry/path` (the chart is then `<repo>/<chart>`)."""
    chart: str
    version: str
    ledger_id: str
    """The ledger entry of the pin and the values keys used."""
    values: dict[str, Any] = field(default_factory=dict)
    service_account: tuple[str, str] | None = None
    """(namespace, name) of the service account its pods call AWS as (bound by EKS Pod Identity)."""

    @property
    def oci(self) -> bool:
        return self.repo.startswith("oci://")


# ------------------------------------------------------------------- GPUs: device plugin or operator


def mig_config_name(group: NodeGroupConfig) -> str:
    return f"gpucluster-{group.name}"


def mig_node_labels(group: NodeGroupConfig) -> dict[str, str]:
    """The kubelet label a MIG group's nodes need: which mig-parted config mig-manager applies."""
    return {MIG_CONFIG_LABEL: mig_config_name(group)} if group.mig_layout else {}


def mig_parted_config(spec: StackSpec) -> dict[str, Any]:
    """mig-parted's config (`version: v1`, `mig-configs`): each MIG group's layout, every GPU alike
    (NVIDIA mig-parted README, "config file"; ledger: eks-chart-gpu-operator)."""
    configs: dict[str, Any] = {MIG_DISABLED: [{"devices": "all", "mig-enabled": False}]}
    for g in spec.node_groups:
        if g.mig_layout:
            configs[mig_config_name(g)] = [{"devices": "all", "mig-enabled": True,
                                            "mig-devices": dict(Counter(g.mig_layout))}]
    return {"version": "v1", "mig-configs": configs}


def gpu_chart(spec: StackSpec) -> Chart:
    gpu_groups = [g.name for g in spec.node_groups]
    strategy = queues.mig_strategy(spec)
    if strategy is None:
        # The pin and the values keys are from memory (ledger: eks-chart-nvidia-device-plugin).
        return Chart("nvidia-device-plugin", SYSTEM, "https://nvidia.github.io/k8s-device-plugin",
                     "nvidia-device-plugin", "0.17.1", "eks-chart-nvidia-device-plugin", {
                         # Its default affinity wants node-feature-discovery's labels; our nodes carry ours.
                         "affinity": on_groups(gpu_groups), "tolerations": [gpu_toleration()],
                         "failOnInitError": True})
    # The pin and the values keys are from memory (ledger: eks-chart-gpu-operator).
    return Chart("gpu-operator", "gpu-operator", "https://helm.ngc.nvidia.com/nvidia", "gpu-operator",
                 "v25.3.0", "eks-chart-gpu-operator", {
                     "driver": {"enabled": False}, "toolkit": {"enabled": False},
                     "mig": {"strategy": strategy},
                     "migManager": {"enabled": True, "config": {
                         "create": True, "name": MIG_CONFIG_MAP, "default": MIG_DISABLED,
                         "data": {"config.yaml": yaml.safe_dump(mig_parted_config(spec), sort_keys=False)}}},
                     "devicePlugin": {"enabled": True}, "dcgmExporter": {"enabled": False},
                     "daemonsets": {"tolerations": [gpu_toleration()]}})


def efa_chart(spec: StackSpec) -> Chart | None:
    groups = [g.name for g in spec.node_groups if g.efa_enabled]
    if not groups:
        return None
    # The pin and the values keys are from memory (ledger: eks-chart-efa-device-plugin).
    return Chart("aws-efa-k8s-device-plugin", SYSTEM, "https://aws.github.io/eks-charts",
                 "aws-efa-k8s-device-plugin", "v0.5.6", "eks-chart-efa-device-plugin", {
                     "tolerations": [gpu_toleration()],
                     # The chart's node affinity: any of these labels' keys with one of the values.
                     "supportedInstanceLabels": {"keys": [GROUP_LABEL], "values": sorted(groups)}})


# ------------------------------------------------------------------- scaling and draining


def purchase_tier(group: NodeGroupConfig) -> str:
    """`reserved` (a Capacity Block or a targeted reservation), `spot` (may hold spot) or `on-demand`."""
    cap = group.capacity
    if cap.market == "capacity_block" or cap.capacity_reservation_id is not None:
        return "reserved"
    return "spot" if can_run_spot(group) else "on-demand"


def expander_priorities(spec: StackSpec, asg_names: Mapping[str, str]) -> str:
    """The priority expander's ConfigMap text: priority -> regexes of ASG names (cluster-autoscaler
    expander/priority/readme.md; the chart takes it as a string, ledger: eks-chart-cluster-autoscaler)."""
    tiers: dict[int, list[str]] = {}
    for g in spec.node_groups:
        tiers.setdefault(PRIORITY[purchase_tier(g)], []).append(f"^{_regex(asg_names[g.name])}$")
    return yaml.safe_dump({p: sorted(tiers[p]) for p in sorted(tiers, reverse=True)}, sort_keys=False)


def _regex(name: str) -> str:
    return "".join(f"\\{c}" if c in ".^$*+?()[]{}|\\" else c for c in name)


def autoscaler_chart(spec: StackSpec, ctx: Context) -> Chart:
    """Discovers the Auto Scaling groups tagged `kubernetes.io/cluster/<name>` (the cluster tag every
    node group carries); a group scales from zero by its node-template tags."""
    launch = max(g.launch_timeout_minutes for g in spec.node_groups)
    # The pin and the values keys are from memory (ledger: eks-chart-cluster-autoscaler).
    return Chart("cluster-autoscaler", SYSTEM, "https://kubernetes.github.io/autoscaler",
                 "cluster-autoscaler", "9.46.6", "eks-chart-cluster-autoscaler", {
                     "cloudProvider": "aws", "awsRegion": spec.region,
                     "autoDiscovery": {"clusterName": ctx.cluster_name,
                                       "tags": [f"kubernetes.io/cluster/{ctx.cluster_name}"]},
                     # The autoscaler's minor follows the cluster's (its README, "Releases").
                     "image": {"tag": f"v{ctx.kubernetes_version}.0"},
                     "rbac": {"serviceAccount": {"create": True, "name": AUTOSCALER_SA[1]}},
                     "extraArgs": {
                         "expander": "priority", "balance-similar-node-groups": True,
                         "skip-nodes-with-local-storage": False,
                         "scale-down-unneeded-time": f"{SCALE_DOWN_UNNEEDED_MINUTES}m",
                         "scale-down-delay-after-add": f"{SCALE_DOWN_UNNEEDED_MINUTES}m",
                         # A GPU node boots and passes its launch check within the group's launch timeout.
                         "max-node-provision-time": f"{launch}m"},
                     "expanderPriorities": expander_priorities(spec, ctx.asg_names)}, AUTOSCALER_SA)


def termination_handler_chart(spec: StackSpec, ctx: Context) -> Chart:
    """Queue mode: spot interruptions, rebalance recommendations, scheduled events and the Auto Scaling
    termination lifecycle hook arrive on the SQS queue; the node is cordoned and drained before the
    hook is completed (so a guard's scale-in drains first)."""
    # The pin and the values keys are from memory (ledger: eks-chart-termination-handler).
    return Chart("aws-node-termination-handler", SYSTEM, "oci://public.ecr.aws/aws-ec2/helm",
                 "aws-node-termination-handler", "0.27.2", "eks-chart-termination-handler", {
                     "enableSqsTerminationDraining": True, "queueURL": ctx.termination_queue_url,
                     "awsRegion": spec.region, "enableRebalanceDraining": True,
                     # The queue carries only this account's events for the rules' sources; a node not in
                     # this cluster is not found and its message dropped.
                     "checkTagBeforeDraining": False, "deleteSqsMsgIfNodeNotFound": True,
                     "serviceAccount": {"create": True, "name": TERMINATION_HANDLER_SA[1]}},
                 TERMINATION_HANDLER_SA)


# ------------------------------------------------------------------- queueing


def kueue_chart(spec: StackSpec) -> Chart:
    # The pin and the values keys are from memory (ledger: eks-chart-kueue).
    return Chart("kueue", "kueue-system", "oci://registry.k8s.io/kueue/charts", "kueue", "0.13.4",
                 "eks-chart-kueue", {"managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(
                     queues.kueue_configuration(spec), sort_keys=False)}})


def jobset_chart() -> Chart:
    # The pin and the values keys are from memory (ledger: eks-chart-jobset).
    return Chart("jobset", "jobset-system", "oci://registry.k8s.io/jobset/charts", "jobset", "0.10.1",
                 "eks-chart-jobset", {})


# ------------------------------------------------------------------- metrics


def dcgm_exporter_chart(spec: StackSpec) -> Chart:
    """On every GPU node; pod labels on, so each GPU series names the namespace and pod holding it."""
    values: dict[str, Any] = {
        "kubernetes": {"enablePodLabels": True, "enablePodUID": True},
        "serviceMonitor": {"enabled": False},
        "tolerations": [gpu_toleration()], "affinity": on_groups([g.name for g in spec.node_groups]),
        # The profiling counters (DCGM_FI_PROF_*) need SYS_ADMIN (dcgm-exporter README, "Quickstart").
        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
        "customMetrics": "".join(f"{name}, {kind}, {name}\n" for name, kind in DCGM_FIELDS),
        "arguments": ["-f", "/etc/dcgm-exporter/custom-collectors.csv"]}
    image = spec.observability.prometheus.dcgm_exporter_image
    if image is not None:
        values["image"] = image_values(image)
    # The pin and the values keys are from memory (ledger: eks-chart-dcgm-exporter).
    return Chart("dcgm-exporter", MONITORING, "https://nvidia.github.io/dcgm-exporter/helm-charts",
                 "dcgm-exporter", "4.1.1", "eks-chart-dcgm-exporter", values)


def image_values(image: str) -> dict[str, str]:
    """`repository` and `tag` such that the chart's `repository:tag` is `image`, digest included (the
    stack file pins it by digest). A registry's port is not a tag; an image without a tag keeps its
    digest under the tag `latest`, which the runtime ignores when a digest is given."""
    name, at, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    repository, tag = (name[:colon], name[colon + 1:]) if colon > slash else (name, "latest")
    return {"repository": repository, "tag": f"{tag}{at}{digest}"}


def metrics_agent_chart(spec: StackSpec, ctx: Context) -> Chart:
    """Prometheus in agent mode: scrapes the dcgm-exporter pods and remote-writes to AMP with SigV4
    as its Pod Identity role; every series labelled with the stack (as node/metrics.sh does)."""
    p = spec.observability.prometheus
    scrape = {"job_name": "dcgm-exporter",
              "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [MONITORING]}}],
              "relabel_configs": [
                  {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                   "regex": "dcgm-exporter", "action": "keep"},
                  {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
                  {"target_label": "gpucluster_stack", "replacement": spec.identity}]}
    # The pin and the values keys are from memory (ledger: eks-chart-prometheus-agent).
    return Chart("prometheus-agent", MONITORING, "https://prometheus-community.github.io/helm-charts",
                 "prometheus", "27.20.0", "eks-chart-prometheus-agent", {
                     "alertmanager": {"enabled": False}, "kube-state-metrics": {"enabled": False},
                     "prometheus-node-exporter": {"enabled": False},
                     "prometheus-pushgateway": {"enabled": False},
                     "serviceAccounts": {"server": {"create": True, "name": METRICS_AGENT_SA[1]}},
                     "server": {"agentMode": True, "persistentVolume": {"enabled": False},
                                "global": {"scrape_interval": f"{p.scrape_interval_seconds}s"},
                                "remoteWrite": [{"url": ctx.remote_write_url,
                                                 "sigv4": {"region": p.region or spec.region},
                                                 "queue_config": {"max_samples_per_send": 1000,
                                                                  "max_shards": 20}}]},
                     "serverFiles": {"prometheus.yml": {"scrape_configs": [scrape]}}}, METRICS_AGENT_SA)


# ------------------------------------------------------------------- all of them


def charts(spec: StackSpec, ctx: Context) -> list[Chart]:
    """Every chart of the stack, in install order (JobSet before Kueue: Kueue's JobSet integration
    needs JobSet's CRD)."""
    found = [gpu_chart(spec), efa_chart(spec), autoscaler_chart(spec, ctx),
             termination_handler_chart(spec, ctx), jobset_chart(), kueue_chart(spec)]
    if spec.observability.prometheus.active and ctx.remote_write_url is not None:
        found += [dcgm_exporter_chart(spec), metrics_agent_chart(spec, ctx)]
    return [c for c in found if c is not None]
