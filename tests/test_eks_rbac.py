"""The node agent's one RBAC grant on an EKS cluster: valid objects, the least the kubelet asks for,
registered by ClusterSoftware."""

from __future__ import annotations

from gpucluster.eks import rbac
from test_eks_objects import strict
from test_eks_software import one


def test_the_grant_is_get_on_nodes_pods_for_the_nodes_group_only() -> None:
    role, binding = rbac.objects()
    for obj in (role, binding):
        strict(obj)  # kubernetes-validate, the cluster's version
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/pods"], "verbs": ["get"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                    "name": "system:nodes"}]


def test_cluster_software_registers_both() -> None:
    role = one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
               "sw-clusterrole-gpucluster-node-pod-reader")
    assert role.inputs["rules"][0]["resources"] == ["nodes/pods"]
    binding = one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
                  "sw-clusterrolebinding-gpucluster-node-pod-reader")
    assert binding.inputs["subjects"][0]["name"] == "system:nodes"
