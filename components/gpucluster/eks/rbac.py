"""The RBAC grants gpucluster's own node software needs on an EKS cluster (pure).

The node agent decides idle by the GPU pods running on its node, read from the kubelet's own pod list
(`GET /pods` on its authenticated port, node/report.sh). The kubelet authorises that request through the
API server (webhook mode) as `get` on the `nodes/pods` subresource for the caller, the node's own
identity (group `system:nodes`), which Kubernetes' default roles do not grant (kubelet authorization,
"fine-grained" subresources since 1.33; ledger: eks-kubelet-pods). Only `get` on `nodes/pods`: not
`nodes/proxy`, which would also let a node's identity reach every other kubelet's exec and logs.
"""

from __future__ import annotations

from typing import Any

NODE_POD_READER = "gpucluster-node-pod-reader"
RBAC_API = "rbac.authorization.k8s.io/v1"


def objects() -> list[dict[str, Any]]:
    """The ClusterRole, then its binding to the nodes' group."""
    role = {"apiVersion": RBAC_API, "kind": "ClusterRole", "metadata": {"name": NODE_POD_READER},
            "rules": [{"apiGroups": [""], "resources": ["nodes/pods"], "verbs": ["get"]}]}
    binding = {"apiVersion": RBAC_API, "kind": "ClusterRoleBinding", "metadata": {"name": NODE_POD_READER},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": NODE_POD_READER},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                             "name": "system:nodes"}]}
    return [role, binding]
