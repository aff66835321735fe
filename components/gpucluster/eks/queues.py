"""Kueue's objects for an EKS stack, as plain dicts: a ResourceFlavor per node group, the one GPU
ClusterQueue whose quota is what the groups can hold at their maximum size, a Namespace and
LocalQueue per team, and Kueue's own Configuration (all-or-nothing admission for multi-node jobs).

Fields follow kueue.x-k8s.io/v1beta1 (the pinned schema in `gpucluster/eks/schemas/`, with its
source, is what the tests hold every object to). A group's flavor selects its nodes by
`gpucluster.io/group` and adds the GPU taint's toleration to every pod Kueue admits to it (Kueue
docs, "Resource Flavor": `spec.tolerations` are added to admitted workloads' pods).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpucluster.eks.labels import EFA_RESOURCE, GPU_RESOURCE, GROUP_LABEL, TEAM_LABEL, gpu_toleration
from gpucluster.spec import NodeGroupConfig, StackSpec

API = "kueue.x-k8s.io/v1beta1"
CONFIG_API = "config.kueue.x-k8s.io/v1beta1"
CLUSTER_QUEUE = "gpu"
"""The one ClusterQueue every team's LocalQueue feeds."""
LOCAL_QUEUE = "gpu"
"""Each team namespace's LocalQueue (what a job's `kueue.x-k8s.io/queue-name` label names)."""
DEFAULT_NAMESPACE = "default"
NODE_READY_SLACK_MINUTES = 5
"""waitForPodsReady waits a group's launch timeout (boot, health check) and this much more."""


def mig_resource(profile: str) -> str:
    """The device plugin's resource of one MIG profile under the `mixed` strategy."""
    return f"nvidia.com/mig-{profile}"


def mig_strategy(spec: StackSpec) -> str | None:
    """`single` when every MIG group splits its GPUs into one profile (each instance is then an
    `nvidia.com/gpu`), `mixed` when a group mixes profiles (`nvidia.com/mig-<profile>` resources),
    None without MIG (NVIDIA GPU Operator docs, "GPU Operator with MIG": strategies)."""
    layouts = [g.mig_layout for g in spec.node_groups if g.mig_layout]
    if not layouts:
        return None
    return "single" if all(len(set(layout)) == 1 for layout in layouts) else "mixed"


def node_gpu_resources(gpus: int, layout: tuple[str, ...], strategy: str | None) -> dict[str, int]:
    """What a node with `gpus` GPUs, each split into `layout` (empty: MIG off), advertises under the GPU
    Operator's `strategy` (ledger: eks-mig-advertised-resources): whole GPUs as `nvidia.com/gpu`; under
    `single` one `nvidia.com/gpu` per MIG instance; under `mixed` one `nvidia.com/mig-<profile>` per
    instance of each profile and no `nvidia.com/gpu`. Kueue's quota and the autoscaler's node-template
    tags both come from here, so what Kueue admits is what a node from zero will have."""
    if layout and strategy == "single":
        return {GPU_RESOURCE: gpus * len(layout)}
    if layout and strategy == "mixed":
        return {GPU_RESOURCE: 0, **{mig_resource(p): gpus * count for p, count in Counter(layout).items()}}
    return {GPU_RESOURCE: gpus}


def group_quota(group: NodeGroupConfig, strategy: str | None) -> dict[str, int]:
    """What one group holds at max_nodes, by resource: its largest type's vCPUs, memory (MiB), GPUs
    (or MIG instances: `node_gpu_resources`) and EFA interfaces (catalog figures x max_nodes)."""
    types = group.types
    n = group.max_nodes
    gpus = max((t.gpus for t in types), default=0)
    quota = {"cpu": max((t.vcpus for t in types), default=0) * n,
             "memory": max((t.memory_mib for t in types), default=0) * n,
             GPU_RESOURCE: gpus * n,
             EFA_RESOURCE: max((t.efa_interface_count for t in types), default=0) * n
             if group.efa_enabled else 0}
    quota |= {r: count * n for r, count in node_gpu_resources(gpus, group.mig_layout, strategy).items()}
    return quota


def _quantity(resource: str, value: int) -> str | int:
    return f"{value}Mi" if resource == "memory" else value


def resource_flavor(group: NodeGroupConfig) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": group.name},
            "spec": {"nodeLabels": {GROUP_LABEL: group.name}, "tolerations": [gpu_toleration()]}}


def cluster_queue(spec: StackSpec) -> dict[str, Any]:
    """One resource group covering every resource, each group's flavor with its own quota (a flavor
    may sit in one resource group only, and each flavor must list every covered resource)."""
    strategy = mig_strategy(spec)
    quotas = {g.name: group_quota(g, strategy) for g in spec.node_groups}
    covered = list(dict.fromkeys(r for q in quotas.values() for r in q))
    flavors = [{"name": g.name, "resources": [
        {"name": r, "nominalQuota": _quantity(r, quotas[g.name].get(r, 0))} for r in covered]}
        for g in spec.node_groups]
    teams = list(spec.scheduler.teams)
    selector: dict[str, Any] = ({"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}
                                if teams else {})
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
            "spec": {"namespaceSelector": selector, "queueingStrategy": "BestEffortFIFO",
                     "resourceGroups": [{"coveredResources": covered, "flavors": flavors}]}}


def team_namespace(team: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team, "labels": {TEAM_LABEL: team}}}


def local_queue(team: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE, "namespace": team},
            "spec": {"clusterQueue": CLUSTER_QUEUE}}


def queue_namespaces(spec: StackSpec) -> list[str]:
    """Where a LocalQueue is: each team's namespace, or `default` on a stack without teams."""
    return list(spec.scheduler.teams) or [DEFAULT_NAMESPACE]


def max_exec_seconds(spec: StackSpec) -> int:
    """The longest a job may run (`max_run_minutes`): the value of its max-exec-time label."""
    return spec.scheduler.max_run_minutes * 60


def pods_ready_timeout_minutes(spec: StackSpec) -> int:
    """How long Kueue waits for an admitted job's pods to all run: the slowest group's launch timeout
    (a node from zero boots and passes its health check within it) and a margin."""
    return max(g.launch_timeout_minutes for g in spec.node_groups) + NODE_READY_SLACK_MINUTES


def kueue_configuration(spec: StackSpec) -> dict[str, Any]:
    """Kueue's manager Configuration: jobs without a queue left alone (the admission policy refuses
    GPU ones), batch Jobs and JobSets integrated, and waitForPodsReady with blockAdmission: a job is
    admitted whole and, until all its pods run, nothing else is (all-or-nothing, so two multi-node jobs
    never each hold half the nodes); one whose pods are not all ready in time is evicted and requeued
    (Kueue docs, "All-or-nothing with ready Pods")."""
    return {
        "apiVersion": CONFIG_API, "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {"enable": True, "blockAdmission": True,
                             "timeout": f"{pods_ready_timeout_minutes(spec)}m",
                             "requeuingStrategy": {"timestamp": "Eviction", "backoffLimitCount": 5}},
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
    }


def objects(spec: StackSpec) -> list[dict[str, Any]]:
    """Every Kueue object and team namespace, in the order they must be created."""
    return [*(resource_flavor(g) for g in spec.node_groups), cluster_queue(spec),
            *(team_namespace(t) for t in spec.scheduler.teams),
            *(local_queue(n) for n in queue_namespaces(spec))]
