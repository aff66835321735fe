"""The node labels, taint and tolerations every EKS object of gpucluster agrees on.

The GPU node groups carry `gpucluster.io/group=<group>` and `gpucluster.io/purchase=<...>` labels and
the `nvidia.com/gpu=true:NoSchedule` taint (their nodeadm NodeConfig); the charts, Kueue's flavors and
the admission policy select and tolerate by these names, so they live in one place.
"""

from __future__ import annotations

from typing import Any

GROUP_LABEL = "gpucluster.io/group"
PURCHASE_LABEL = "gpucluster.io/purchase"
TEAM_LABEL = "gpucluster.io/team"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label that hands a Job or JobSet to Kueue (Kueue docs, "Run a Kubernetes Job")."""
MAX_EXEC_TIME_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"  # ledger: eks-kueue-max-exec-time
"""Kueue's per-workload maximum execution time: evicted and deactivated when it runs longer."""


def gpu_toleration() -> dict[str, Any]:
    """Tolerates the GPU nodes' taint (whatever its value): what a pod on a GPU node needs."""
    return {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}


def on_groups(groups: list[str]) -> dict[str, Any]:
    """A node affinity requiring one of `groups` (a DaemonSet's pods only on those groups' nodes)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": GROUP_LABEL, "operator": "In", "values": sorted(groups)}]}]}}}
